#include "server/dataset/megatron_gpt_source.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/dataset/token_convert.h"

namespace ferry {
namespace {

using ferry::v1::DType;
using ferry::v1::MegatronGptDataset;

// Megatron-LM's --split default.
constexpr char kDefaultSplit[] = "969, 30, 1";
// Megatron's mid_level_dataset_surplus default.
constexpr double kDefaultSurplus = 0.005;

class MegatronScratch final : public SampleSource::Scratch {
 public:
  std::vector<int64_t> text;
  std::vector<int64_t> tokens, labels, positions;
  std::vector<float> loss_mask;
  std::unique_ptr<bool[]> mask;
  std::vector<uint8_t> staging;
};

const char* SplitName(MegatronGptDataset::Split split) {
  switch (split) {
    case MegatronGptDataset::VALID:
      return "valid";
    case MegatronGptDataset::TEST:
      return "test";
    default:
      return "train";
  }
}

// Writes `n` int64 values as `dtype` (INT64 or INT32) at `out`.
void WriteIds(const int64_t* values, int64_t n, DType dtype, uint8_t* out) {
  if (dtype == ferry::v1::INT64) {
    std::memcpy(out, values, static_cast<size_t>(n) * 8);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = static_cast<int32_t>(values[i]);
    std::memcpy(out + i * 4, &v, 4);
  }
}

// One prefix's GPTDataset before its index is built.
struct Planned {
  IndexedFiles files;
  std::vector<int32_t> sizes;
  std::vector<int32_t> documents;
  megatron::GptIndexOptions options;
  double bytes = 0;  // its index arrays, estimated before they are built
};

}  // namespace

absl::StatusOr<std::unique_ptr<MegatronGptSource>> MegatronGptSource::Create(
    const MegatronGptDataset& spec, const DatasetFs& fs, const SourceOptions& options) {
  const int n = spec.path_prefixes_size();
  if (n == 0) {
    return absl::InvalidArgumentError(
        "dataset.megatron_gpt.path_prefixes must list at least one Megatron dataset (the "
        ".bin/.idx path without its extension)");
  }
  const bool blend = spec.weights_size() > 0;
  if (blend && spec.weights_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.megatron_gpt.weights has ",
                                                   spec.weights_size(), " entries for ", n,
                                                   " path_prefixes; give one weight per prefix"));
  }
  if (!blend && n > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.megatron_gpt has ", n,
        " path_prefixes and no weights; give one weight per prefix (Megatron's blend)"));
  }
  std::vector<double> weights;
  for (int d = 0; d < spec.weights_size(); ++d) {
    const double w = spec.weights(d);
    if (!(w > 0) || !std::isfinite(w)) {
      return absl::InvalidArgumentError(absl::StrCat("dataset.megatron_gpt.weights[", d, "] is ", w,
                                                     "; every weight must be > 0"));
    }
    weights.push_back(w);
  }
  if (spec.sequence_length() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.megatron_gpt.sequence_length is ", spec.sequence_length(),
        "; it must be at least 2 (Megatron-Core's build_sample_idx asserts seq_length > 1)"));
  }
  if (spec.sequence_length() > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.megatron_gpt.sequence_length is ",
                                                   spec.sequence_length(), "; at most 1048576"));
  }
  if (spec.random_seed() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.megatron_gpt.random_seed is ", spec.random_seed(),
                     "; numpy.random.RandomState takes seeds up to 2^32 - 1"));
  }
  const double surplus =
      spec.has_mid_level_dataset_surplus() ? spec.mid_level_dataset_surplus() : kDefaultSurplus;
  if (!(surplus >= 0) || !std::isfinite(surplus)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.megatron_gpt.mid_level_dataset_surplus is ", surplus, "; it must be >= 0"));
  }
  if (blend && spec.num_samples() == 0) {
    return absl::InvalidArgumentError(
        "dataset.megatron_gpt.num_samples must be set for a blend (weights): Megatron's "
        "builder needs a size to share out by weight");
  }
  if (spec.num_samples() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / 64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.megatron_gpt.num_samples is ", spec.num_samples(), ", too large"));
  }
  DType output = spec.output_dtype();
  if (output == ferry::v1::DTYPE_UNSPECIFIED) output = ferry::v1::INT64;
  if (output != ferry::v1::INT64 && output != ferry::v1::INT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.megatron_gpt.output_dtype must be INT64 (the default) or INT32 (got ",
                     ferry::v1::DType_Name(output), ")"));
  }
  const std::string split = spec.split().empty() ? kDefaultSplit : spec.split();
  const int which = static_cast<int>(spec.split_name());
  const char* split_name = SplitName(spec.split_name());
  const int32_t seq_len = static_cast<int32_t>(spec.sequence_length());
  const bool extra = !spec.no_extra_token();
  const int64_t size = static_cast<int64_t>(spec.num_samples());

  // The builder normalizes a blend's weights; BlendedDataset normalizes them again.
  const std::vector<double> once = blend ? megatron::Normalize(weights) : std::vector<double>();
  const std::vector<double> twice = blend ? megatron::Normalize(once) : std::vector<double>();
  const std::vector<int64_t> built =
      blend ? megatron::BlendSourceSamples(once, size, surplus) : std::vector<int64_t>();
  const std::vector<int64_t> targets =
      blend ? megatron::BlendSourceSamples(once, size, 0.0) : std::vector<int64_t>();

  std::vector<Planned> planned;
  double bytes = 0;
  for (int d = 0; d < n; ++d) {
    const std::string& prefix = spec.path_prefixes(d);
    if (prefix.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("dataset.megatron_gpt.path_prefixes[", d,
                                                     "] is empty; give the .bin/.idx path "
                                                     "without its extension"));
    }
    FERRY_ASSIGN_OR_RETURN(IndexedFiles files, IndexedFiles::Open(prefix, fs));
    FERRY_ASSIGN_OR_RETURN(std::vector<int32_t> sizes, files.SequenceLengths());
    absl::StatusOr<std::array<megatron::SplitRange, 3>> ranges =
        megatron::SplitRanges(split, files.num_sequences());
    if (!ranges.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.megatron_gpt.split: ", ranges.status().message()));
    }
    const megatron::SplitRange& range = (*ranges)[static_cast<size_t>(which)];
    if (!range.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.megatron_gpt.split \"", split, "\" gives the ", split_name,
                       " split weight 0, so Megatron builds no ", split_name,
                       " dataset; choose another split_name or split"));
    }
    if (files.num_sequences() > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Megatron dataset '", prefix, "' holds ", files.num_sequences(),
                       " sequences; Megatron-Core's document index is int32 (at most 2^31 - 1)"));
    }
    Planned p{std::move(files), std::move(sizes), {}, {}, 0};
    int64_t tokens = 0;
    for (int64_t s = range->first; s < range->second; ++s) {
      p.documents.push_back(static_cast<int32_t>(s));
      tokens += p.sizes[static_cast<size_t>(s)];
    }
    if (tokens < 2) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the ", split_name, " split of Megatron dataset '", prefix, "' (sequences [",
          range->first, ", ", range->second, ")) holds ", tokens,
          " tokens; Megatron needs at least 2 a sample: use a larger corpus or another split"));
    }
    p.options.sequence_length = seq_len;
    if (blend) {
      p.options.num_samples = built[static_cast<size_t>(d)];
    } else if (size > 0) {
      p.options.num_samples = size;
    }
    p.options.seed = static_cast<uint32_t>(spec.random_seed());
    p.options.add_extra_token_to_sequence = extra;
    p.options.drop_last_partial_sequence = !(spec.split_name() == MegatronGptDataset::VALID &&
                                             spec.keep_partial_validation_sequence());
    // The arrays of its index: the documents once an epoch (int32), the sample pairs and
    // the shuffle (int64 each).
    const double samples = p.options.num_samples.has_value()
                               ? static_cast<double>(*p.options.num_samples)
                               : static_cast<double>(tokens) / seq_len;
    const double epochs = std::ceil((samples * seq_len + 1) / static_cast<double>(tokens));
    p.bytes = epochs * static_cast<double>(p.documents.size()) * 4 + (samples + 2) * 24;
    bytes += p.bytes;
    planned.push_back(std::move(p));
  }
  if (blend) bytes += static_cast<double>(size) * 10;

  std::unique_ptr<MegatronGptSource> source(new MegatronGptSource());
  if (bytes > 0x1p62) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.megatron_gpt.num_samples ", size,
                     " would need an index larger than any machine's memory"));
  }
  if (options.host_budget != nullptr) {
    // Reserved before it is built: an index of billions of samples is refused at once.
    FERRY_ASSIGN_OR_RETURN(
        source->index_memory_,
        options.host_budget->Reserve(
            static_cast<uint64_t>(bytes),
            absl::StrCat("the index of a Megatron GPT dataset (", blend ? "a blend of " : "", n,
                         blend ? " datasets, " : " dataset, ", "dataset.megatron_gpt.num_samples ",
                         size, ")")));
  }
  for (Planned& p : planned) {
    absl::StatusOr<megatron::GptIndex> index =
        megatron::BuildGptIndex(p.sizes, p.documents, p.options);
    if (!index.ok()) {
      return absl::Status(index.status().code(),
                          absl::StrCat("Megatron dataset '", p.files.prefix(), "' (", split_name,
                                       " split): ", index.status().message()));
    }
    source->gpts_.push_back(Gpt{std::move(p.files), *std::move(index)});
  }
  if (blend) {
    int64_t blend_size = 0;
    for (int64_t t : targets) blend_size += t;
    megatron::BuildBlendingIndices(twice, blend_size, &source->dataset_index_,
                                   &source->dataset_sample_index_);
    source->size_ = blend_size;
  } else {
    source->size_ = source->gpts_[0].index.samples();
  }
  if (source->size_ <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset.megatron_gpt gives no sample for the ", split_name,
                     " split; raise num_samples or use a larger corpus"));
  }

  source->split_name_ = split_name;
  source->output_dtype_ = output;
  source->row_stores_ = options.row_stores;
  megatron::GptSampleOptions& o = source->sample_;
  o.sequence_length = seq_len;
  o.add_extra_token_to_sequence = extra;
  o.eod_token = spec.eod_token();
  o.pad_token = spec.has_pad_token() ? spec.pad_token() : -1;
  o.reset_position_ids = spec.reset_position_ids();
  o.reset_attention_mask = spec.reset_attention_mask();
  o.eod_mask_loss = spec.eod_mask_loss();

  const size_t s = static_cast<size_t>(seq_len);
  const size_t id_bytes = DTypeSize(output);
  auto add = [&](const char* name, DType dtype, std::vector<int64_t> shape, size_t row_bytes) {
    source->fields_.push_back(FieldLayout{
        .name = name, .dtype = dtype, .shape = std::move(shape), .row_bytes = row_bytes});
    return static_cast<int>(source->fields_.size()) - 1;
  };
  add("tokens", output, {seq_len}, s * id_bytes);
  add("labels", output, {seq_len}, s * id_bytes);
  add("loss_mask", ferry::v1::FLOAT32, {seq_len}, s * 4);
  add("position_ids", output, {seq_len}, s * id_bytes);
  if (spec.create_attention_mask()) {
    source->mask_field_ = add("attention_mask", ferry::v1::BOOL, {1, seq_len, seq_len}, s * s);
  }
  if (spec.cu_seqlens()) {
    source->cu_field_ = add("cu_seqlens", ferry::v1::INT32, {seq_len + 1}, (s + 1) * 4);
    add("num_seqs", ferry::v1::INT32, {}, 4);
  }
  add("index", ferry::v1::INT64, {}, 8);
  return source;
}

std::unique_ptr<SampleSource::Scratch> MegatronGptSource::NewScratch() const {
  auto scratch = std::make_unique<MegatronScratch>();
  const size_t s = static_cast<size_t>(sample_.sequence_length);
  scratch->tokens.resize(s);
  scratch->labels.resize(s);
  scratch->positions.resize(s);
  scratch->loss_mask.resize(s);
  if (mask_field_ >= 0) scratch->mask.reset(new bool[s * s]);
  return scratch;
}

std::pair<const MegatronGptSource::Gpt*, int64_t> MegatronGptSource::Locate(int64_t index) const {
  if (dataset_index_.empty()) return {&gpts_[0], index};
  const size_t i = static_cast<size_t>(index);
  return {&gpts_[static_cast<size_t>(dataset_index_[i])], dataset_sample_index_[i]};
}

void MegatronGptSource::ReadTokens(const Gpt& gpt, int32_t sequence, int64_t offset, int64_t length,
                                   std::vector<int64_t>* out, absl::Status* status) const {
  if (!status->ok()) return;
  const IndexedFiles& files = gpt.files;
  bool fits = false;
  int64_t pointer = 0, sequence_length = 0;
  absl::Status read = files.idx().Read([&] {
    fits = files.SequenceFits(sequence);
    pointer = files.SequencePointer(sequence);
    sequence_length = files.SequenceLength(sequence);
  });
  if (!read.ok()) {
    *status = read;
    return;
  }
  if (length < 0) length = sequence_length - offset;
  if (!fits || offset < 0 || length < 0 || offset + length > sequence_length) {
    *status = absl::DataLossError(absl::StrCat(
        "Megatron index '", files.idx().path(), "' is corrupt at sequence ", sequence, " (pointer ",
        pointer, ", length ", sequence_length,
        "): sequences must follow each other in the .bin, as Megatron-LM's builder writes "
        "them, and keep the lengths the dataset's index was built from; rebuild the index"));
    return;
  }
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(length));
  const size_t width = files.token_bytes();
  const uint8_t* src = files.bin().bytes().data() + pointer + offset * static_cast<int64_t>(width);
  int64_t* dst = out->data() + at;
  int64_t negative = -1;
  read = files.bin().Read(src, static_cast<size_t>(length) * width, [&] {
    for (int64_t i = 0; i < length; ++i) {
      dst[i] = width == 2 ? LoadLittleEndian<uint16_t>(src + i * 2)
                          : LoadLittleEndian<int32_t>(src + i * 4);
      if (dst[i] < 0 && negative < 0) negative = i;
    }
  });
  if (!read.ok()) {
    *status = read;
  } else if (negative >= 0) {
    *status = absl::DataLossError(
        absl::StrCat("token ", offset + negative, " of sequence ", sequence, " of Megatron data '",
                     files.bin().path(), "' is ", dst[negative], "; token ids are never negative"));
  }
}

bool MegatronGptSource::ReadsInRanges() const {
  for (const Gpt& gpt : gpts_) {
    if (gpt.files.bin().read_in_ranges()) return true;
  }
  return false;
}

void MegatronGptSource::RangesOf(int64_t index, std::vector<MappedRange>* ranges) const {
  if (index < 0 || index >= size_) return;
  const std::pair<const Gpt*, int64_t> located = Locate(index);
  const IndexedFiles& files = located.first->files;
  // An .idx read in ranges too (over whole_object_max_bytes) would be read here, remotely:
  // then the workers fetch the pieces themselves.
  if (!files.bin().read_in_ranges() || files.idx().read_in_ranges()) return;
  const int64_t width = static_cast<int64_t>(files.token_bytes());
  // The pieces as Fill reads them (GptSampleText), their ids left as zeros: only their
  // places in the .bin matter here. A piece the .idx cannot place is left out; Fill meets
  // it and says what is wrong.
  std::vector<int64_t> text;
  megatron::GptSampleText(
      located.first->index, located.second, sample_.sequence_length,
      sample_.add_extra_token_to_sequence, sample_.pad_token,
      [&](int32_t sequence, int64_t offset, int64_t length, std::vector<int64_t>* out) {
        bool fits = false;
        int64_t pointer = 0, sequence_length = 0;
        const absl::Status read = files.idx().Read([&] {
          fits = files.SequenceFits(sequence);
          pointer = files.SequencePointer(sequence);
          sequence_length = files.SequenceLength(sequence);
        });
        if (length < 0) length = sequence_length - offset;
        if (!read.ok() || !fits || offset < 0 || length <= 0 || offset + length > sequence_length) {
          return;
        }
        out->resize(out->size() + static_cast<size_t>(length));
        ranges->push_back(MappedRange{.file = files.shared_bin(),
                                      .offset = static_cast<uint64_t>(pointer + offset * width),
                                      .length = static_cast<uint64_t>(length * width)});
      },
      &text);
}

absl::Status MegatronGptSource::Fill(int64_t index, uint64_t sample_seed,
                                     absl::Span<uint8_t* const> rows, Scratch* scratch) const {
  if (index < 0 || index >= size_) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " is outside [0, ", size_,
                                              ") of the Megatron GPT dataset"));
  }
  if (rows.size() != fields_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fill needs ", fields_.size(), " rows, got ", rows.size()));
  }
  MegatronScratch& own = *static_cast<MegatronScratch*>(scratch);
  // Not a structured binding: the lambda below captures it (clang 14 refuses bindings).
  const std::pair<const Gpt*, int64_t> located = Locate(index);
  const Gpt* gpt = located.first;
  const int64_t sample = located.second;
  absl::Status status;
  own.text.clear();
  megatron::GptSampleText(
      gpt->index, sample, sample_.sequence_length, sample_.add_extra_token_to_sequence,
      sample_.pad_token,
      [&](int32_t sequence, int64_t offset, int64_t length, std::vector<int64_t>* out) {
        ReadTokens(*gpt, sequence, offset, length, out, &status);
      },
      &own.text);
  FERRY_RETURN_IF_ERROR(status);
  megatron::MakeGptSample(own.text, sample_, own.tokens.data(), own.labels.data(),
                          own.loss_mask.data(), own.positions.data(),
                          mask_field_ >= 0 ? own.mask.get() : nullptr);
  const int64_t n = sample_.sequence_length;
  const int64_t* ids[] = {own.tokens.data(), own.labels.data(), nullptr, own.positions.data()};
  for (int f : {0, 1, 3}) {
    const size_t bytes = fields_[static_cast<size_t>(f)].row_bytes;
    own.staging.resize(bytes);
    WriteIds(ids[f], n, output_dtype_, own.staging.data());
    StoreRow(row_stores_, rows[static_cast<size_t>(f)], own.staging.data(), bytes);
  }
  StoreRow(row_stores_, rows[2], reinterpret_cast<const uint8_t*>(own.loss_mask.data()),
           fields_[2].row_bytes);
  if (mask_field_ >= 0) {
    static_assert(sizeof(bool) == 1, "BOOL rows are one byte a value");
    StoreRow(row_stores_, rows[static_cast<size_t>(mask_field_)],
             reinterpret_cast<const uint8_t*>(own.mask.get()),
             fields_[static_cast<size_t>(mask_field_)].row_bytes);
  }
  if (cu_field_ >= 0) {
    // The segments reset_attention_mask makes: a new one after each EOD among the inputs.
    const size_t bytes = fields_[static_cast<size_t>(cu_field_)].row_bytes;
    own.staging.assign(bytes, 0);
    int32_t count = 0;
    int32_t* cu = reinterpret_cast<int32_t*>(own.staging.data());
    cu[count++] = 0;
    for (int64_t i = 0; i + 1 < n; ++i) {
      if (own.tokens[static_cast<size_t>(i)] == sample_.eod_token) {
        cu[count++] = static_cast<int32_t>(i + 1);
      }
    }
    const int32_t segments = count;
    for (int64_t p = count; p <= n; ++p) cu[p] = static_cast<int32_t>(n);
    StoreRow(row_stores_, rows[static_cast<size_t>(cu_field_)], own.staging.data(), bytes);
    std::memcpy(rows[static_cast<size_t>(cu_field_) + 1], &segments, 4);
  }
  std::memcpy(rows.back(), &index, sizeof(index));
  return absl::OkStatus();
}

std::string MegatronGptSource::Describe(int64_t index) const {
  if (index < 0 || index >= size_) return absl::StrCat("Megatron GPT sample ", index);
  const auto [gpt, sample] = Locate(index);
  return absl::StrCat(gpt->files.prefix(), " (Megatron GPT ", split_name_, " sample ", sample,
                      dataset_index_.empty() ? "" : absl::StrCat(", blend sample ", index), ")");
}

}  // namespace ferry
