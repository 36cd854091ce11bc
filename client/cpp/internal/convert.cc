#include "client/cpp/internal/convert.h"

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "google/protobuf/util/json_util.h"
#include "proto/ferry/v1/words.h"

namespace ferry {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
    case DType::kBool:
      return 1;
    case DType::kUint16:
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUint32:
    case DType::kInt32:
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
      return 8;
    default:
      return 0;
  }
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return "uint8";
    case DType::kUint16:
      return "uint16";
    case DType::kUint32:
      return "uint32";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kBool:
      return "bool";
    default:
      return "unspecified";
  }
}

std::string JobOptionsToJson(const JobOptions& options) {
  return internal::ToJson(internal::ToProto(options));
}

absl::StatusOr<JobOptions> JobOptionsFromJson(std::string_view json) {
  v1::JobSpec spec;
  absl::Status status = internal::FromJson(json, "job spec (ferry.v1.JobSpec)", &spec);
  if (!status.ok()) return status;
  // The parser refuses an op it does not know by name; an op with no field would become a
  // std::monostate, which stands for an unknown op from ferryd, not for a mistake.
  const v1::Compose& compose = spec.transform().compose();
  for (int i = 0; i < compose.ops_size(); ++i) {
    if (compose.ops(i).op_case() == v1::TransformOp::OP_NOT_SET) {
      return absl::InvalidArgumentError(absl::StrCat(
          "transform.compose.ops[", i,
          "] sets no op: give it one of random_resized_crop, resize, center_crop, random_crop, "
          "random_horizontal_flip, random_vertical_flip, color_jitter, random_grayscale, "
          "trivial_augment_wide, normalize, random_erasing"));
    }
  }
  return internal::FromProto(spec);
}

namespace internal {
namespace {

v1::DType ToProto(DType dtype) { return static_cast<v1::DType>(static_cast<int>(dtype)); }
DType FromProto(v1::DType dtype) { return static_cast<DType>(static_cast<int>(dtype)); }

void SetDataset(std::monostate, v1::DatasetSpec*) {}
void SetDataset(const ImageFolderOptions& folder, v1::DatasetSpec* d) {
  d->mutable_image_folder()->set_root(folder.root);
  d->mutable_image_folder()->set_exif_orientation(folder.exif_orientation);
}
void SetDataset(const TokensOptions& tokens, v1::DatasetSpec* d) {
  v1::TokensDataset* t = d->mutable_tokens();
  t->set_path(tokens.path);
  t->set_token_dtype(ToProto(tokens.token_dtype));
  t->set_seq_len(tokens.seq_len);
  t->set_output_dtype(ToProto(tokens.output_dtype));
  t->set_widen_on_host(tokens.widen_on_host);
}
void SetDataset(const WebDatasetOptions& wds, v1::DatasetSpec* d) {
  v1::WebDataset* w = d->mutable_webdataset();
  for (const std::string& s : wds.shards) w->add_shards(s);
  if (wds.image_key != "jpg") w->set_image_key(wds.image_key);
  if (wds.label_key != "cls") w->set_label_key(wds.label_key);
  w->set_shuffle_buffer(wds.shuffle_buffer);
  w->set_exif_orientation(wds.exif_orientation);
}
void SetDataset(const RecordsOptions& records, v1::DatasetSpec* d) {
  v1::RecordsDataset* r = d->mutable_records();
  r->set_path(records.path);
  r->set_dtype(ToProto(records.dtype));
  for (int64_t dim : records.shape) r->add_shape(dim);
  r->set_header_bytes(records.header_bytes);
}
void SetDataset(const NpyOptions& npy, v1::DatasetSpec* d) { d->mutable_npy()->set_path(npy.path); }
void SetDataset(const TokenShardsOptions& shards, v1::DatasetSpec* d) {
  v1::TokenShardsDataset* t = d->mutable_token_shards();
  for (const std::string& s : shards.shards) t->add_shards(s);
  t->set_token_dtype(ToProto(shards.token_dtype));
  t->set_seq_len(shards.seq_len);
  t->set_output_dtype(ToProto(shards.output_dtype));
  t->set_windows_cross_files(shards.windows_cross_files);
  t->set_widen_on_host(shards.widen_on_host);
}
void SetDataset(const IndexedOptions& indexed, v1::DatasetSpec* d) {
  v1::IndexedDataset* i = d->mutable_indexed();
  i->set_path_prefix(indexed.path_prefix);
  i->set_seq_len(indexed.seq_len);
  i->set_output_dtype(ToProto(indexed.output_dtype));
  i->set_position_ids(indexed.position_ids);
  i->set_cu_seqlens(indexed.cu_seqlens);
  i->set_widen_on_host(indexed.widen_on_host);
}
void SetDataset(const MegatronGptOptions& megatron, v1::DatasetSpec* d) {
  v1::MegatronGptDataset* m = d->mutable_megatron_gpt();
  for (const std::string& prefix : megatron.path_prefixes) m->add_path_prefixes(prefix);
  for (double w : megatron.weights) m->add_weights(w);
  m->set_sequence_length(megatron.sequence_length);
  m->set_split(megatron.split);
  m->set_split_name(static_cast<v1::MegatronGptDataset::Split>(megatron.split_name));
  m->set_num_samples(megatron.num_samples);
  m->set_random_seed(megatron.random_seed);
  m->set_eod_token(megatron.eod_token);
  if (megatron.pad_token.has_value()) m->set_pad_token(*megatron.pad_token);
  m->set_reset_position_ids(megatron.reset_position_ids);
  m->set_reset_attention_mask(megatron.reset_attention_mask);
  m->set_eod_mask_loss(megatron.eod_mask_loss);
  m->set_create_attention_mask(megatron.create_attention_mask);
  m->set_no_extra_token(megatron.no_extra_token);
  m->set_keep_partial_validation_sequence(megatron.keep_partial_validation_sequence);
  if (megatron.mid_level_dataset_surplus.has_value()) {
    m->set_mid_level_dataset_surplus(*megatron.mid_level_dataset_surplus);
  }
  m->set_cu_seqlens(megatron.cu_seqlens);
  m->set_output_dtype(ToProto(megatron.output_dtype));
}
void SetDataset(const BlendOptions& blend, v1::DatasetSpec* d) {
  v1::BlendDataset* b = d->mutable_blend();
  for (const BlendSourceOptions& source : blend.sources) {
    v1::BlendSource* s = b->add_sources();
    std::visit([s](const auto& one) { SetDataset(one, s->mutable_dataset()); }, source.dataset);
    s->set_weight(source.weight);
    s->set_name(source.name);
  }
  b->set_samples_per_epoch(blend.samples_per_epoch);
}

// A composed transform's ops, field for field: lists, strings and unset p's travel as they
// are (an empty one means ferryd's default), so specs round-trip exactly.
template <typename T, typename Repeated>
void Append(const std::vector<T>& values, Repeated* out) {
  out->Add(values.begin(), values.end());
}
template <typename Repeated>
auto ToVector(const Repeated& values) {
  return std::vector<typename Repeated::value_type>(values.begin(), values.end());
}
// An `optional float p`: unset stays unset.
template <typename Message>
std::optional<float> OptionalP(const Message& m) {
  return m.has_p() ? std::optional<float>(m.p()) : std::nullopt;
}
template <typename Message>
void SetOptionalP(const std::optional<float>& p, Message* m) {
  if (p.has_value()) m->set_p(*p);
}

void SetOp(std::monostate, v1::TransformOp*) {}
void SetOp(const transforms::RandomResizedCrop& op, v1::TransformOp* out) {
  v1::TransformOp::RandomResizedCrop* m = out->mutable_random_resized_crop();
  m->set_size(op.size);
  Append(op.scale, m->mutable_scale());
  Append(op.ratio, m->mutable_ratio());
  m->set_full_decode(op.full_decode);
}
void SetOp(const transforms::Resize& op, v1::TransformOp* out) {
  out->mutable_resize()->set_size(op.size);
  out->mutable_resize()->set_full_decode(op.full_decode);
}
void SetOp(const transforms::CenterCrop& op, v1::TransformOp* out) {
  out->mutable_center_crop()->set_size(op.size);
}
void SetOp(const transforms::RandomCrop& op, v1::TransformOp* out) {
  v1::TransformOp::RandomCrop* m = out->mutable_random_crop();
  m->set_size(op.size);
  Append(op.padding, m->mutable_padding());
  m->set_pad_if_needed(op.pad_if_needed);
  Append(op.fill, m->mutable_fill());
  m->set_padding_mode(op.padding_mode);
}
void SetOp(const transforms::RandomHorizontalFlip& op, v1::TransformOp* out) {
  SetOptionalP(op.p, out->mutable_random_horizontal_flip());
}
void SetOp(const transforms::RandomVerticalFlip& op, v1::TransformOp* out) {
  SetOptionalP(op.p, out->mutable_random_vertical_flip());
}
void SetOp(const transforms::ColorJitter& op, v1::TransformOp* out) {
  v1::TransformOp::ColorJitter* m = out->mutable_color_jitter();
  Append(op.brightness, m->mutable_brightness());
  Append(op.contrast, m->mutable_contrast());
  Append(op.saturation, m->mutable_saturation());
  Append(op.hue, m->mutable_hue());
}
void SetOp(const transforms::RandomGrayscale& op, v1::TransformOp* out) {
  SetOptionalP(op.p, out->mutable_random_grayscale());
}
void SetOp(const transforms::TrivialAugmentWide& op, v1::TransformOp* out) {
  v1::TransformOp::TrivialAugmentWide* m = out->mutable_trivial_augment_wide();
  m->set_num_magnitude_bins(op.num_magnitude_bins);
  Append(op.fill, m->mutable_fill());
}
void SetOp(const transforms::Normalize& op, v1::TransformOp* out) {
  Append(op.mean, out->mutable_normalize()->mutable_mean());
  Append(op.std, out->mutable_normalize()->mutable_std());
}
void SetOp(const transforms::RandomErasing& op, v1::TransformOp* out) {
  v1::TransformOp::RandomErasing* m = out->mutable_random_erasing();
  SetOptionalP(op.p, m);
  Append(op.scale, m->mutable_scale());
  Append(op.ratio, m->mutable_ratio());
  Append(op.value, m->mutable_value());
}

// monostate for an op this client does not know (unset in a newer ferryd's answer).
TransformOpOptions OpFromProto(const v1::TransformOp& op) {
  switch (op.op_case()) {
    case v1::TransformOp::kRandomResizedCrop: {
      const v1::TransformOp::RandomResizedCrop& m = op.random_resized_crop();
      return transforms::RandomResizedCrop{.size = m.size(),
                                           .scale = ToVector(m.scale()),
                                           .ratio = ToVector(m.ratio()),
                                           .full_decode = m.full_decode()};
    }
    case v1::TransformOp::kResize:
      return transforms::Resize{.size = op.resize().size(),
                                .full_decode = op.resize().full_decode()};
    case v1::TransformOp::kCenterCrop:
      return transforms::CenterCrop{.size = op.center_crop().size()};
    case v1::TransformOp::kRandomCrop: {
      const v1::TransformOp::RandomCrop& m = op.random_crop();
      return transforms::RandomCrop{.size = m.size(),
                                    .padding = ToVector(m.padding()),
                                    .pad_if_needed = m.pad_if_needed(),
                                    .fill = ToVector(m.fill()),
                                    .padding_mode = m.padding_mode()};
    }
    case v1::TransformOp::kRandomHorizontalFlip: {
      const v1::TransformOp::RandomFlip& m = op.random_horizontal_flip();
      return transforms::RandomHorizontalFlip{.p = OptionalP(m)};
    }
    case v1::TransformOp::kRandomVerticalFlip: {
      const v1::TransformOp::RandomFlip& m = op.random_vertical_flip();
      return transforms::RandomVerticalFlip{.p = OptionalP(m)};
    }
    case v1::TransformOp::kColorJitter: {
      const v1::TransformOp::ColorJitter& m = op.color_jitter();
      return transforms::ColorJitter{.brightness = ToVector(m.brightness()),
                                     .contrast = ToVector(m.contrast()),
                                     .saturation = ToVector(m.saturation()),
                                     .hue = ToVector(m.hue())};
    }
    case v1::TransformOp::kRandomGrayscale: {
      const v1::TransformOp::RandomGrayscale& m = op.random_grayscale();
      return transforms::RandomGrayscale{.p = OptionalP(m)};
    }
    case v1::TransformOp::kTrivialAugmentWide: {
      const v1::TransformOp::TrivialAugmentWide& m = op.trivial_augment_wide();
      return transforms::TrivialAugmentWide{.num_magnitude_bins = m.num_magnitude_bins(),
                                            .fill = ToVector(m.fill())};
    }
    case v1::TransformOp::kNormalize:
      return transforms::Normalize{.mean = ToVector(op.normalize().mean()),
                                   .std = ToVector(op.normalize().std())};
    case v1::TransformOp::kRandomErasing: {
      const v1::TransformOp::RandomErasing& m = op.random_erasing();
      return transforms::RandomErasing{.p = OptionalP(m),
                                       .scale = ToVector(m.scale()),
                                       .ratio = ToVector(m.ratio()),
                                       .value = ToVector(m.value())};
    }
    default:
      return std::monostate();
  }
}

// The kinds a DatasetOptions holds (not a blend): monostate for an unset or unknown kind.
DatasetOptions DatasetFromProto(const v1::DatasetSpec& d) {
  switch (d.kind_case()) {
    case v1::DatasetSpec::kImageFolder:
      return ImageFolderOptions{d.image_folder().root(), d.image_folder().exif_orientation()};
    case v1::DatasetSpec::kTokens: {
      const v1::TokensDataset& t = d.tokens();
      TokensOptions tokens;
      tokens.path = t.path();
      tokens.token_dtype = FromProto(t.token_dtype());
      tokens.seq_len = t.seq_len();
      tokens.output_dtype = FromProto(t.output_dtype());
      tokens.widen_on_host = t.widen_on_host();
      return tokens;
    }
    case v1::DatasetSpec::kWebdataset: {
      const v1::WebDataset& w = d.webdataset();
      WebDatasetOptions wds;
      wds.shards.assign(w.shards().begin(), w.shards().end());
      if (!w.image_key().empty()) wds.image_key = w.image_key();
      if (!w.label_key().empty()) wds.label_key = w.label_key();
      wds.shuffle_buffer = w.shuffle_buffer();
      wds.exif_orientation = w.exif_orientation();
      return wds;
    }
    case v1::DatasetSpec::kRecords: {
      const v1::RecordsDataset& r = d.records();
      RecordsOptions records;
      records.path = r.path();
      records.dtype = FromProto(r.dtype());
      records.shape.assign(r.shape().begin(), r.shape().end());
      records.header_bytes = r.header_bytes();
      return records;
    }
    case v1::DatasetSpec::kNpy:
      return NpyOptions{d.npy().path()};
    case v1::DatasetSpec::kTokenShards: {
      const v1::TokenShardsDataset& t = d.token_shards();
      TokenShardsOptions shards;
      shards.shards.assign(t.shards().begin(), t.shards().end());
      shards.token_dtype = FromProto(t.token_dtype());
      shards.seq_len = t.seq_len();
      shards.output_dtype = FromProto(t.output_dtype());
      shards.windows_cross_files = t.windows_cross_files();
      shards.widen_on_host = t.widen_on_host();
      return shards;
    }
    case v1::DatasetSpec::kIndexed: {
      const v1::IndexedDataset& i = d.indexed();
      IndexedOptions indexed;
      indexed.path_prefix = i.path_prefix();
      indexed.seq_len = i.seq_len();
      indexed.output_dtype = FromProto(i.output_dtype());
      indexed.position_ids = i.position_ids();
      indexed.cu_seqlens = i.cu_seqlens();
      indexed.widen_on_host = i.widen_on_host();
      return indexed;
    }
    default:
      return std::monostate();
  }
}

}  // namespace

v1::JobSpec ToProto(const JobOptions& options) {
  v1::JobSpec spec;
  std::visit([&spec](const auto& one) { SetDataset(one, spec.mutable_dataset()); },
             options.dataset);
  if (options.on_corrupt_sample == CorruptSamplePolicy::kFail) {
    spec.set_on_corrupt_sample(v1::FAIL);
  }
  if (const auto* rrc = std::get_if<RandomResizedCropOptions>(&options.transform)) {
    v1::RandomResizedCrop* r = spec.mutable_transform()->mutable_random_resized_crop();
    r->set_size(rrc->size);
    r->set_scale_min(rrc->scale_min);
    r->set_scale_max(rrc->scale_max);
    r->set_ratio_min(rrc->ratio_min);
    r->set_ratio_max(rrc->ratio_max);
    r->set_flip(rrc->flip);
    r->set_full_decode(rrc->full_decode);
  } else if (const auto* cc = std::get_if<CenterCropOptions>(&options.transform)) {
    v1::CenterCrop* c = spec.mutable_transform()->mutable_center_crop();
    c->set_size(cc->size);
    c->set_resize(cc->resize);
    c->set_full_decode(cc->full_decode);
  } else if (const auto* compose = std::get_if<ComposeOptions>(&options.transform)) {
    v1::Compose* c = spec.mutable_transform()->mutable_compose();
    for (const TransformOpOptions& op : compose->ops) {
      std::visit([out = c->add_ops()](const auto& one) { SetOp(one, out); }, op);
    }
  }
  spec.set_batch_size(options.batch_size);
  spec.set_shuffle(options.shuffle);
  spec.set_seed(options.seed);
  spec.set_drop_last(options.drop_last);
  spec.set_world_size(options.world_size);
  spec.set_device(options.device);
  spec.set_prefetch_depth(options.prefetch_depth);
  if (options.image_output.dtype != DType::kUnspecified || !options.image_output.mean.empty() ||
      !options.image_output.std.empty()) {
    v1::ImageOutput* out = spec.mutable_image_output();
    out->set_dtype(static_cast<v1::DType>(options.image_output.dtype));
    for (float m : options.image_output.mean) out->add_mean(m);
    for (float s : options.image_output.std) out->add_std(s);
  }
  return spec;
}

JobOptions FromProto(const v1::JobSpec& spec) {
  JobOptions options;
  if (spec.dataset().has_blend()) {
    BlendOptions blend;
    for (const v1::BlendSource& s : spec.dataset().blend().sources()) {
      blend.sources.push_back(BlendSourceOptions{
          .dataset = DatasetFromProto(s.dataset()), .weight = s.weight(), .name = s.name()});
    }
    blend.samples_per_epoch = spec.dataset().blend().samples_per_epoch();
    options.dataset = std::move(blend);
  } else if (spec.dataset().has_megatron_gpt()) {
    const v1::MegatronGptDataset& m = spec.dataset().megatron_gpt();
    MegatronGptOptions megatron;
    megatron.path_prefixes.assign(m.path_prefixes().begin(), m.path_prefixes().end());
    megatron.weights.assign(m.weights().begin(), m.weights().end());
    megatron.sequence_length = m.sequence_length();
    megatron.split = m.split();
    megatron.split_name = static_cast<MegatronGptOptions::Split>(m.split_name());
    megatron.num_samples = m.num_samples();
    megatron.random_seed = m.random_seed();
    megatron.eod_token = m.eod_token();
    if (m.has_pad_token()) megatron.pad_token = m.pad_token();
    megatron.reset_position_ids = m.reset_position_ids();
    megatron.reset_attention_mask = m.reset_attention_mask();
    megatron.eod_mask_loss = m.eod_mask_loss();
    megatron.create_attention_mask = m.create_attention_mask();
    megatron.no_extra_token = m.no_extra_token();
    megatron.keep_partial_validation_sequence = m.keep_partial_validation_sequence();
    if (m.has_mid_level_dataset_surplus()) {
      megatron.mid_level_dataset_surplus = m.mid_level_dataset_surplus();
    }
    megatron.cu_seqlens = m.cu_seqlens();
    megatron.output_dtype = FromProto(m.output_dtype());
    options.dataset = std::move(megatron);
  } else {
    std::visit([&options](auto&& one) { options.dataset = std::move(one); },
               DatasetFromProto(spec.dataset()));
  }
  options.on_corrupt_sample = spec.on_corrupt_sample() == v1::FAIL ? CorruptSamplePolicy::kFail
                                                                   : CorruptSamplePolicy::kSkip;
  switch (spec.transform().kind_case()) {
    case v1::TransformSpec::kRandomResizedCrop: {
      const v1::RandomResizedCrop& r = spec.transform().random_resized_crop();
      RandomResizedCropOptions rrc;
      rrc.size = r.size();
      rrc.scale_min = r.scale_min();
      rrc.scale_max = r.scale_max();
      rrc.ratio_min = r.ratio_min();
      rrc.ratio_max = r.ratio_max();
      rrc.flip = r.flip();
      rrc.full_decode = r.full_decode();
      options.transform = rrc;
      break;
    }
    case v1::TransformSpec::kCenterCrop:
      options.transform = CenterCropOptions{spec.transform().center_crop().size(),
                                            spec.transform().center_crop().resize(),
                                            spec.transform().center_crop().full_decode()};
      break;
    case v1::TransformSpec::kCompose: {
      ComposeOptions compose;
      for (const v1::TransformOp& op : spec.transform().compose().ops()) {
        compose.ops.push_back(OpFromProto(op));
      }
      options.transform = std::move(compose);
      break;
    }
    default:
      break;
  }
  options.batch_size = spec.batch_size();
  options.shuffle = spec.shuffle();
  options.seed = spec.seed();
  options.drop_last = spec.drop_last();
  options.world_size = spec.world_size();
  options.device = spec.device();
  options.prefetch_depth = spec.prefetch_depth();
  if (spec.has_image_output()) {
    options.image_output.dtype = static_cast<DType>(spec.image_output().dtype());
    options.image_output.mean.assign(spec.image_output().mean().begin(),
                                     spec.image_output().mean().end());
    options.image_output.std.assign(spec.image_output().std().begin(),
                                    spec.image_output().std().end());
  }
  return options;
}

FieldInfo FromProto(const v1::Field& f) {
  FieldInfo field;
  field.name = f.name();
  field.dtype = FromProto(f.dtype());
  field.shape.assign(f.shape().begin(), f.shape().end());
  field.offset = f.offset();
  field.row_bytes = f.row_bytes();
  return field;
}

JobInfo FromProto(const v1::Job& job) {
  JobInfo info;
  info.id = job.id();
  info.name = job.name();
  info.spec = FromProto(job.spec());
  info.owner_uid = job.owner_uid();
  info.num_samples = job.num_samples();
  info.samples_per_epoch = job.samples_per_epoch();
  info.contiguous_ranks = job.contiguous_ranks();
  info.batches_per_epoch = job.batches_per_epoch();
  for (const v1::Field& f : job.fields()) info.fields.push_back(FromProto(f));
  info.slot_bytes = job.slot_bytes();
  info.create_time_unix_ms = job.create_time_unix_ms();
  return info;
}

JobStatus FromProto(const v1::JobStatus& status) {
  JobStatus out;
  out.job = FromProto(status.job());
  for (const v1::RankStatus& r : status.ranks()) {
    RankStatus rank;
    rank.rank = r.rank();
    rank.attached = r.attached();
    rank.batches_delivered = r.batches_delivered();
    rank.samples_delivered = r.samples_delivered();
    rank.batches_per_second = r.batches_per_second();
    rank.samples_per_second = r.samples_per_second();
    rank.queue_depth = r.queue_depth();
    rank.slots_leased = r.slots_leased();
    rank.slots = r.slots();
    rank.batch_channel = r.batch_channel();
    rank.device = r.device();
    switch (r.copy_path()) {
      case ferry::v1::SLOT_COPY:
        rank.copy_path = "slot copy";
        break;
      case ferry::v1::PAGE_CACHE_GATHER:
        rank.copy_path = "page-cache gather";
        break;
      default:
        break;
    }
    rank.copy_path_note = r.copy_path_note();
    rank.pinned_dataset_bytes = r.pinned_dataset_bytes();
    rank.batches_copied = r.batches_copied();
    rank.batches_gathered = r.batches_gathered();
    rank.consumer_wait_seconds = r.consumer_wait_seconds();
    rank.stall_ratio = r.stall_ratio();
    rank.stall_window_seconds = r.stall_window_seconds();
    rank.limiting_stage = v1::LimitingStageWord(r.limiting_stage());
    rank.limiting_stage_note = r.limiting_stage_note();
    rank.consumer_cpu_wait_ratio = r.consumer_cpu_wait_ratio();
    rank.gpu_decode_demand = r.gpu_decode_demand();
    rank.gpu_decode_batches = r.gpu_decode_batches();
    rank.epoch = r.epoch();
    rank.next_batch = r.next_batch();
    rank.epoch_batches = r.epoch_batches();
    rank.resumed_after_positions = r.resumed_after_positions();
    out.ranks.push_back(rank);
  }
  out.errors = status.errors();
  for (const v1::SampleError& e : status.recent_errors()) {
    out.recent_errors.push_back(SampleError{e.index(), e.path(), e.message()});
  }
  out.quarantined = status.quarantined();
  out.substituted = status.substituted();
  out.failure = status.failure();
  out.paused = status.paused();
  out.transient_errors = status.transient_errors();
  out.samples_decoded = status.samples_decoded();
  out.bytes_read = status.bytes_read();
  out.idle_seconds = status.idle_seconds();
  out.deleted_in_seconds = status.deleted_in_seconds();
  out.quarantined_indices.assign(status.quarantined_indices().begin(),
                                 status.quarantined_indices().end());
  for (const v1::BlendSourceStatus& b : status.blend_sources()) {
    out.blend_sources.push_back(JobStatus::BlendSource{.name = b.name(),
                                                       .weight = b.weight(),
                                                       .num_samples = b.num_samples(),
                                                       .samples_per_epoch = b.samples_per_epoch(),
                                                       .samples_drawn = b.samples_drawn()});
  }
  if (status.has_gpu_decode()) {
    const v1::GpuDecodeStatus& g = status.gpu_decode();
    JobStatus::GpuDecode& gpu = out.gpu_decode.emplace();
    gpu.mode = g.mode();
    gpu.off = g.off();
    gpu.gpu_images = g.gpu_images();
    gpu.cpu_images = g.cpu_images();
    for (const v1::ReasonCount& f : g.fallbacks()) {
      gpu.fallbacks.push_back(JobStatus::GpuDecode::Fallback{f.reason(), f.count()});
    }
    gpu.gpu_share = g.gpu_share();
    gpu.cpu_ms_per_image = g.cpu_ms_per_image();
    gpu.gpu_ms_per_image = g.gpu_ms_per_image();
    gpu.demand = g.demand();
    gpu.decoders = g.decoders();
  }
  if (status.has_read_ahead()) {
    const v1::ReadAheadStatus& r = status.read_ahead();
    out.read_ahead = ReadAheadStatus{.opened = r.opened(),
                                     .failed = r.failed(),
                                     .skipped = r.skipped(),
                                     .files_in_window = r.files_in_window(),
                                     .bytes_in_window = r.bytes_in_window()};
  }
  return out;
}

StatusReport FromProto(const v1::GetStatusResponse& response) {
  StatusReport report;
  const v1::DaemonStatus& d = response.daemon();
  report.daemon.version = d.version();
  report.daemon.uptime_seconds = d.uptime_seconds();
  report.daemon.pid = d.pid();
  for (const v1::NumaNodeStatus& n : d.numa_nodes()) {
    report.daemon.numa_nodes.push_back(
        NumaNodeStatus{n.id(), {n.cpus().begin(), n.cpus().end()}, n.workers()});
  }
  report.daemon.host_memory_in_use_bytes = d.host_memory_in_use_bytes();
  report.daemon.host_memory_budget_bytes = d.host_memory_budget_bytes();
  report.daemon.cuda_available = d.cuda_available();
  report.daemon.config_path = d.config_path();
  report.daemon.dataset_roots.assign(d.dataset_roots().begin(), d.dataset_roots().end());
  report.daemon.pinned_memory_in_use_bytes = d.pinned_memory_in_use_bytes();
  report.daemon.pinned_memory_budget_bytes = d.pinned_memory_budget_bytes();
  report.daemon.draining = d.draining();
  report.daemon.job_idle_timeout_seconds = d.job_idle_timeout_seconds();
  report.daemon.consumers = d.consumers();
  report.daemon.workers_busy_fraction = d.workers_busy_fraction();
  report.daemon.cpu_seconds = d.cpu_seconds();
  report.daemon.workers = d.workers();
  if (d.has_remote()) {
    const v1::RemoteStatus& r = d.remote();
    RemoteStatus& remote = report.daemon.remote.emplace();
    remote.cache_bytes = r.cache_bytes();
    remote.cache_capacity_bytes = r.cache_capacity_bytes();
    remote.cache_entries = r.cache_entries();
    remote.cache_pinned_entries = r.cache_pinned_entries();
    remote.cache_hits = r.cache_hits();
    remote.cache_misses = r.cache_misses();
    remote.cache_evictions = r.cache_evictions();
    remote.downloaded_bytes = r.downloaded_bytes();
    remote.requests = r.requests();
    remote.requests_in_flight = r.requests_in_flight();
    for (const v1::ReasonCount& c : r.retries()) {
      remote.retries.push_back(RemoteStatus::Retries{c.reason(), c.count()});
    }
    remote.failures = r.failures();
  }
  for (const v1::GpuStatus& g : d.gpus()) {
    GpuStatus gpu;
    gpu.ordinal = g.ordinal();
    gpu.name = g.name();
    gpu.pci_bus_id = g.pci_bus_id();
    gpu.numa_node = g.numa_node();
    gpu.local_cpus.assign(g.local_cpus().begin(), g.local_cpus().end());
    gpu.device_memory_in_use_bytes = g.device_memory_in_use_bytes();
    gpu.device_memory_budget_bytes = g.device_memory_budget_bytes();
    gpu.pinned_memory_in_use_bytes = g.pinned_memory_in_use_bytes();
    gpu.bytes_to_device = g.bytes_to_device();
    gpu.h2d_bytes_per_second = g.h2d_bytes_per_second();
    gpu.batches_in_flight = g.batches_in_flight();
    gpu.ranks = g.ranks();
    gpu.jpeg_gpu_images = g.jpeg_gpu_images();
    gpu.jpeg_cpu_images = g.jpeg_cpu_images();
    for (const v1::ReasonCount& f : g.jpeg_fallbacks()) {
      gpu.jpeg_fallbacks.push_back(GpuDecodeStatus::Fallback{f.reason(), f.count()});
    }
    report.daemon.gpus.push_back(std::move(gpu));
  }
  for (const v1::JobStatus& j : response.jobs()) report.jobs.push_back(FromProto(j));
  return report;
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Printing a well-formed message cannot fail (no Any fields in ferry's protos).
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

absl::Status FromJson(std::string_view json, std::string_view what,
                      google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse ", std::string(what),
                     " from JSON: ", std::string(status.message()), "; input: ",
                     json.size() > 200 ? absl::StrCat(std::string(json.substr(0, 200)), "...")
                                       : std::string(json)));
  }
  return absl::OkStatus();
}

absl::Status FromGrpc(const grpc::Status& status, std::string_view context,
                      const grpc::ClientContext* call) {
  if (status.ok()) return absl::OkStatus();
  if (call != nullptr) {
    const auto& trailers = call->GetServerTrailingMetadata();
    if (auto it = trailers.find(kReasonMetadataKey); it != trailers.end()) {
      return WithReason(FromGrpc(status, context),
                        absl::string_view(it->second.data(), it->second.size()));
    }
  }
  auto code = static_cast<absl::StatusCode>(status.error_code());
  switch (code) {
    case absl::StatusCode::kCancelled:
      // The client cancels no call whose status it reports: the server ended it, which a
      // ferryd does to the calls in flight when it shuts down.
      return absl::UnavailableError(absl::StrCat(
          std::string(context), ": ferryd ended the call without an answer (",
          status.error_message(), "); it is probably shutting down: try again once it is back"));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return absl::Status(code, absl::StrCat(std::string(context), ": ", status.error_message()));
    default:
      return absl::Status(code, status.error_message());
  }
}

absl::Status ValidateLayout(const JobInfo& job, uint64_t num_slots, uint64_t slot_bytes,
                            uint64_t slab_bytes) {
  auto bad = [&](const std::string& what) {
    return absl::InternalError(absl::StrCat("ferryd sent an inconsistent slot layout for job '",
                                            job.id, "': ", what,
                                            "; client and daemon versions may differ"));
  };
  if (num_slots == 0 || slot_bytes == 0) return bad("no slots");
  if (slot_bytes > slab_bytes / num_slots) {
    return bad(absl::StrCat(num_slots, " slots of ", slot_bytes, " bytes exceed the slab of ",
                            slab_bytes, " bytes"));
  }
  const uint64_t batch_size = job.spec.batch_size;
  for (const FieldInfo& f : job.fields) {
    uint64_t elem = DTypeSize(f.dtype);
    if (elem == 0) return bad(absl::StrCat("field '", f.name, "' has an unknown dtype"));
    uint64_t count = 1;
    for (int64_t d : f.shape) {
      if (d < 0) return bad(absl::StrCat("field '", f.name, "' has a negative dimension"));
      count *= static_cast<uint64_t>(d);
    }
    if (count * elem != f.row_bytes) {
      return bad(absl::StrCat("field '", f.name, "' has row_bytes ", f.row_bytes, ", shape and ",
                              std::string(DTypeName(f.dtype)), " imply ", count * elem));
    }
    if (f.offset > slot_bytes || batch_size * f.row_bytes > slot_bytes - f.offset) {
      return bad(absl::StrCat("field '", f.name, "' (offset ", f.offset, ", ", batch_size,
                              " rows of ", f.row_bytes, " bytes) overruns the slot of ", slot_bytes,
                              " bytes"));
    }
  }
  return absl::OkStatus();
}

std::vector<size_t> PackReleases(std::vector<v1::ConsumeRequest>* requests) {
  std::vector<v1::ConsumeRequest> packed;
  std::vector<size_t> counts;
  for (v1::ConsumeRequest& request : *requests) {
    if (request.has_release() && !packed.empty() && packed.back().has_release()) {
      *packed.back().add_releases() = std::move(*request.mutable_release());
      ++counts.back();
      continue;
    }
    packed.push_back(std::move(request));
    counts.push_back(1);
  }
  *requests = std::move(packed);
  return counts;
}

}  // namespace internal
}  // namespace ferry
