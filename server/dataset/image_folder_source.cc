#include "server/dataset/image_folder_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "server/dataset/compose_spec.h"
#include "server/decode/gpu_decode_plan.h"
#include "server/decode/jpeg_header.h"
#include "server/kernels/photometric.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

class ImageScratch final : public SampleSource::Scratch {
 public:
  ImageDecoder decoder;
  ComposeScratch compose;
  std::vector<uint8_t> file;  // grows to the largest file seen, never shrinks
  std::string path;
};

// Larger crops than this are a configuration mistake (16384^2 * 3 bytes = 768 MiB per row).
constexpr uint32_t kMaxCropSize = 16384;

// The name only selects the file; the decoder tells JPEG from PNG by the content.
bool IsImageName(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot == 0) return false;
  const std::string ext = absl::AsciiStrToLower(absl::string_view(name).substr(dot));
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

absl::Status CheckSize(uint32_t size, const char* field) {
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be at least 1 (got 0); it is the output's side in pixels"));
  }
  if (size > kMaxCropSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be at most ", kMaxCropSize, " (got ", size, ")"));
  }
  return absl::OkStatus();
}

// Applies `fallback` for a field left at 0 and checks 0 < lo <= hi, both finite.
absl::Status ResolveRange(float lo_in, float hi_in, double lo_default, double hi_default,
                          const char* lo_field, const char* hi_field, double* lo, double* hi) {
  *lo = lo_in == 0.0f ? lo_default : lo_in;
  *hi = hi_in == 0.0f ? hi_default : hi_in;
  if (!std::isfinite(*lo) || *lo <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(lo_field, " must be a positive number (got ", lo_in, ")"));
  }
  if (!std::isfinite(*hi) || *hi <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(hi_field, " must be a positive number (got ", hi_in, ")"));
  }
  if (*lo > *hi) {
    return absl::InvalidArgumentError(absl::StrCat(lo_field, " (", *lo, ") must not exceed ",
                                                   hi_field, " (", *hi,
                                                   "; fields left at 0 take their defaults)"));
  }
  return absl::OkStatus();
}

// Reads the whole file at `path` (opened through `fs`) into the front of *buffer, growing it
// only when the file is larger than any before; returns the file's length. A file that
// ends before the size it had when opened is being rewritten: UNAVAILABLE, so the read is
// tried again (and then sees the file as it is), never a decode of part of it.
absl::StatusOr<size_t> ReadWholeFile(const DatasetFs& fs, const std::string& path,
                                     uint64_t max_bytes, std::vector<uint8_t>* buffer) {
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = fs.OpenFile(path);
  if (!file.ok()) return file.status();
  const size_t size = static_cast<size_t>((*file)->size());
  if (max_bytes > 0 && size > max_bytes) {
    return absl::DataLossError(absl::StrCat("refused '", path, "': ", size,
                                            " bytes, over decode_limits.max_sample_bytes (",
                                            max_bytes, ")"));
  }
  if (buffer->size() < size) buffer->resize(size);
  absl::StatusOr<size_t> read = ReadUpTo(**file, 0, absl::MakeSpan(buffer->data(), size));
  if (!read.ok()) return read.status();
  if (*read < size) {
    return absl::UnavailableError(absl::StrCat(
        "'", path, "' shrank from ", size, " to ", *read,
        " bytes while ferryd read it (it is being rewritten); the read is tried again"));
  }
  return size;
}

// A link `fs` refused to follow, found while listing: the job is refused (serving the tree
// without it would silently drop samples).
absl::Status RefusedLink(const DatasetFs& fs, const std::string& path) {
  absl::Status s = fs.OpenFile(path).status();
  if (s.code() == absl::StatusCode::kPermissionDenied) return s;
  return absl::PermissionDeniedError(
      absl::StrCat("dataset path '", path, "' is a symbolic link ferryd does not follow"));
}

}  // namespace

absl::StatusOr<ImageTransform> ImageTransformFromSpec(const ferry::v1::TransformSpec& spec,
                                                      const ComposedTransform::Target& target) {
  ImageTransform t;
  switch (spec.kind_case()) {
    case ferry::v1::TransformSpec::kCompose: {
      FERRY_ASSIGN_OR_RETURN(std::vector<ComposeStep> steps, ComposeStepsFromSpec(spec.compose()));
      absl::StatusOr<ComposedTransform> compose =
          ComposedTransform::Create(std::move(steps), target);
      if (!compose.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("transform.compose.", compose.status().message()));
      }
      t.size = compose->size();
      t.exif_orientation = target.exif_orientation;
      t.compose = std::make_shared<const ComposedTransform>(*std::move(compose));
      return t;
    }
    case ferry::v1::TransformSpec::kRandomResizedCrop: {
      const ferry::v1::RandomResizedCrop& rrc = spec.random_resized_crop();
      absl::Status s = CheckSize(rrc.size(), "transform.random_resized_crop.size");
      if (!s.ok()) return s;
      t = ImageTransform::RandomResizedCrop(static_cast<int>(rrc.size()), rrc.flip());
      s = ResolveRange(rrc.scale_min(), rrc.scale_max(), kDefaultCropScale[0], kDefaultCropScale[1],
                       "transform.random_resized_crop.scale_min",
                       "transform.random_resized_crop.scale_max", &t.scale_min, &t.scale_max);
      if (!s.ok()) return s;
      s = ResolveRange(rrc.ratio_min(), rrc.ratio_max(), kDefaultCropRatio[0], kDefaultCropRatio[1],
                       "transform.random_resized_crop.ratio_min",
                       "transform.random_resized_crop.ratio_max", &t.ratio_min, &t.ratio_max);
      if (!s.ok()) return s;
      t.full_decode = rrc.full_decode();
      break;
    }
    case ferry::v1::TransformSpec::kCenterCrop: {
      const ferry::v1::CenterCrop& cc = spec.center_crop();
      absl::Status s = CheckSize(cc.size(), "transform.center_crop.size");
      if (!s.ok()) return s;
      const uint32_t resize = cc.resize() != 0 ? cc.resize() : cc.size() * 256 / 224;
      if (resize < cc.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("transform.center_crop.resize (", resize,
                         ") must be at least transform.center_crop.size (", cc.size(), ")"));
      }
      if (resize > kMaxCropSize) {
        return absl::InvalidArgumentError(absl::StrCat(
            "transform.center_crop.resize must be at most ", kMaxCropSize, " (got ", resize, ")"));
      }
      t = ImageTransform::ResizeCenterCrop(static_cast<int>(cc.size()), static_cast<int>(resize));
      t.full_decode = cc.full_decode();
      break;
    }
    case ferry::v1::TransformSpec::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "transform must be set for image datasets: set transform.random_resized_crop "
          "(training), transform.center_crop (evaluation) or transform.compose");
  }
  // The decoder's own check: keeps the two in agreement if either side tightens its rules.
  absl::Status valid = ValidateTransform(t);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("transform: ", valid.message()));
  }
  return t;
}

std::vector<FieldLayout> ImageSampleFields(const ImageTransform& transform) {
  std::vector<FieldLayout> fields;
  const int64_t side = transform.size;
  if (transform.compose != nullptr && transform.compose->float_output()) {
    fields.push_back(FieldLayout{.name = "image",
                                 .dtype = ferry::v1::FLOAT32,
                                 .shape = {3, side, side},
                                 .row_bytes = transform.compose->image_row_bytes()});
  } else {
    fields.push_back(FieldLayout{.name = "image",
                                 .dtype = ferry::v1::UINT8,
                                 .shape = {side, side, 3},
                                 .row_bytes = static_cast<size_t>(side * side * 3)});
  }
  fields.push_back(
      FieldLayout{.name = "label", .dtype = ferry::v1::INT64, .shape = {}, .row_bytes = 8});
  fields.push_back(
      FieldLayout{.name = "index", .dtype = ferry::v1::INT64, .shape = {}, .row_bytes = 8});
  if (transform.compose != nullptr && transform.compose->emits_program()) {
    fields.push_back(FieldLayout{.name = kPhotometricField,
                                 .dtype = ferry::v1::UINT8,
                                 .shape = {static_cast<int64_t>(sizeof(PhotometricProgram))},
                                 .row_bytes = sizeof(PhotometricProgram),
                                 .internal = true});
  }
  if (transform.gpu_decode != nullptr) {
    fields.push_back(FieldLayout{.name = kGpuDecodePlanField,
                                 .dtype = ferry::v1::UINT8,
                                 .shape = {static_cast<int64_t>(sizeof(GpuDecodePlan))},
                                 .row_bytes = sizeof(GpuDecodePlan),
                                 .internal = true});
    // Last, so that the copy of a slot to the GPU can end before it.
    fields.push_back(FieldLayout{.name = kGpuDecodeJpegField,
                                 .dtype = ferry::v1::UINT8,
                                 .shape = {static_cast<int64_t>(kGpuDecodeJpegRowBytes)},
                                 .row_bytes = kGpuDecodeJpegRowBytes,
                                 .internal = true});
  }
  return fields;
}

bool GpuDecodable(const ImageTransform& transform) {
  if (transform.exif_orientation) return false;
  return transform.compose == nullptr || transform.compose->DecodeOnly();
}

namespace {

int FieldIndex(const std::vector<FieldLayout>& fields, const char* name) {
  for (size_t f = 0; f < fields.size(); ++f) {
    if (fields[f].name == name) return static_cast<int>(f);
  }
  return -1;
}

// The worker's share of a JPEG the split routes to the GPU: its bytes in the JPEG row, the
// window of the crop (the CPU path's draws), the device's program.
absl::Status RouteToGpu(absl::Span<const uint8_t> bytes, const GpuJpegVerdict& verdict,
                        const ImageTransform& transform, uint64_t sample_seed,
                        absl::Span<uint8_t> jpeg_row, absl::Span<uint8_t> program,
                        GpuDecodePlan* plan) {
  std::memcpy(jpeg_row.data(), bytes.data(), bytes.size());
  const bool composed = transform.compose != nullptr;
  const ImageTransform geometry = composed ? transform.compose->FusedTransform() : transform;
  Rng rng(composed ? MixSeed(sample_seed, 0) : sample_seed);
  const SourceWindow w = PlanSourceWindow(verdict.width, verdict.height, geometry, rng);
  plan->on_gpu = 1;
  plan->jpeg_bytes = static_cast<uint32_t>(bytes.size());
  plan->width = verdict.width;
  plan->height = verdict.height;
  plan->x0 = w.x0, plan->x1 = w.x1, plan->y0 = w.y0, plan->y1 = w.y1;
  plan->clamp_x0 = w.clamp_x0, plan->clamp_x1 = w.clamp_x1;
  plan->clamp_y0 = w.clamp_y0, plan->clamp_y1 = w.clamp_y1;
  plan->mirror = w.mirror ? 1 : 0;
  if (composed && transform.compose->emits_program()) {
    return transform.compose->WriteProgram(sample_seed, program);
  }
  return absl::OkStatus();
}

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

}  // namespace

absl::Status TransformImageSample(ImageDecoder& decoder, ComposeScratch& compose,
                                  absl::Span<const uint8_t> bytes, const ImageTransform& transform,
                                  uint64_t sample_seed, const std::vector<FieldLayout>& fields,
                                  absl::Span<uint8_t* const> rows, bool gpu_batch) {
  const absl::Span<uint8_t> image(rows[0], fields[0].row_bytes);
  const int program_field = FieldIndex(fields, kPhotometricField);
  const absl::Span<uint8_t> program =
      program_field >= 0 ? absl::Span<uint8_t>(rows[program_field], fields[program_field].row_bytes)
                         : absl::Span<uint8_t>();
  GpuDecodeSplit* split = transform.gpu_decode.get();
  const absl::Time start = split != nullptr ? absl::Now() : absl::InfinitePast();
  GpuDecodePlan plan;
  if (split != nullptr) {
    const int jpeg_field = FieldIndex(fields, kGpuDecodeJpegField);
    if (jpeg_field < 0) return absl::InternalError("a GPU-decoding layout without its JPEG field");
    const absl::Span<uint8_t> jpeg_row(rows[jpeg_field], fields[jpeg_field].row_bytes);
    GpuJpegVerdict verdict;
    bool jpeg = SniffImageFormat(bytes) == ImageFormat::kJpeg;
    plan.cpu_reason = kPlanNotJpeg;
    if (jpeg) {
      verdict = ClassifyForGpuDecode(bytes, split->limits());
      // The bytes travel in the JPEG row: a file larger than that stays here.
      if (verdict.reason == GpuJpegReject::kNone && bytes.size() > jpeg_row.size()) {
        verdict.reason = GpuJpegReject::kTooLarge;
      }
    } else {
      split->CountNotJpeg();
    }
    if (jpeg) plan.cpu_reason = static_cast<int32_t>(verdict.reason);
    if (jpeg && split->Route(verdict.reason, gpu_batch)) {
      FERRY_RETURN_IF_ERROR(
          RouteToGpu(bytes, verdict, transform, sample_seed, jpeg_row, program, &plan));
      std::memcpy(rows[FieldIndex(fields, kGpuDecodePlanField)], &plan, sizeof(plan));
      split->ReportCpuRoute(SecondsSince(start));
      return absl::OkStatus();
    }
  }
  absl::Status decoded;
  if (transform.compose == nullptr) {
    Rng rng(sample_seed);
    decoded = DecodeAndTransform(decoder, bytes, transform, rng, image);
  } else {
    decoded = transform.compose->Run(decoder, bytes, sample_seed, compose, image, program);
  }
  if (split != nullptr && decoded.ok()) {
    std::memcpy(rows[FieldIndex(fields, kGpuDecodePlanField)], &plan, sizeof(plan));  // on_gpu 0
    split->ReportCpuDecode(SecondsSince(start));
  }
  return decoded;
}

uint64_t ImageFolderSource::index_bytes() const {
  uint64_t bytes = names_.capacity() + name_offsets_.capacity() * sizeof(uint64_t) +
                   labels_.capacity() * sizeof(int32_t);
  for (const std::string& c : classes_) bytes += sizeof(c) + c.capacity();
  return bytes;
}

absl::StatusOr<std::unique_ptr<ImageFolderSource>> ImageFolderSource::Create(
    const std::string& root, const ImageTransform& transform, const DecodeLimits& limits,
    std::shared_ptr<const DatasetFs> fs) {
  absl::StatusOr<std::vector<DatasetFs::Entry>> top = fs->ListDirectory(root);
  if (!top.ok()) {
    if (top.status().code() == absl::StatusCode::kInvalidArgument) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dataset.image_folder.root '", root,
          "' is not a directory; expected <root>/<class>/<file>.jpg (or .jpeg, .png)"));
    }
    return top.status();
  }
  const fs::path root_path(root);
  std::unique_ptr<ImageFolderSource> source(new ImageFolderSource(root, transform, limits, fs));
  for (const DatasetFs::Entry& e : *top) {
    if (e.type == DatasetFs::EntryType::kDirectory) source->classes_.push_back(e.name);
    if (e.type == DatasetFs::EntryType::kSymlink) {
      return RefusedLink(*fs, (root_path / e.name).string());
    }
  }
  std::sort(source->classes_.begin(), source->classes_.end());

  std::vector<std::string> names;
  source->name_offsets_.push_back(0);
  for (size_t c = 0; c < source->classes_.size(); ++c) {
    const std::string class_dir = (root_path / source->classes_[c]).string();
    absl::StatusOr<std::vector<DatasetFs::Entry>> entries = fs->ListDirectory(class_dir);
    if (!entries.ok()) return entries.status();
    names.clear();
    for (DatasetFs::Entry& e : *entries) {
      if (!IsImageName(e.name)) continue;
      if (e.type == DatasetFs::EntryType::kSymlink) {
        return RefusedLink(*fs, (fs::path(class_dir) / e.name).string());
      }
      if (e.type == DatasetFs::EntryType::kDirectory) continue;
      names.push_back(std::move(e.name));
    }
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      source->names_ += name;
      source->name_offsets_.push_back(source->names_.size());
      source->labels_.push_back(static_cast<int32_t>(c));
    }
  }
  if (source->labels_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset.image_folder.root '", root, "' holds no .jpg, .jpeg or .png files in its ",
        source->classes_.size(), " class directories; expected <root>/<class>/<file>.jpg"));
  }
  source->names_.shrink_to_fit();
  source->name_offsets_.shrink_to_fit();
  source->labels_.shrink_to_fit();
  return source;
}

ImageFolderSource::ImageFolderSource(std::string root, const ImageTransform& transform,
                                     const DecodeLimits& limits,
                                     std::shared_ptr<const DatasetFs> fs)
    : root_(std::move(root)),
      transform_(transform),
      limits_(limits),
      fs_(std::move(fs)),
      fields_(ImageSampleFields(transform_)) {}

std::unique_ptr<SampleSource::Scratch> ImageFolderSource::NewScratch() const {
  auto scratch = std::make_unique<ImageScratch>();
  scratch->decoder.set_limits(limits_);
  return scratch;
}

void ImageFolderSource::AppendPath(int64_t index, std::string* out) const {
  const size_t begin = name_offsets_[index];
  const size_t end = name_offsets_[index + 1];
  out->append(root_);
  if (!root_.empty() && root_.back() != '/') out->push_back('/');
  out->append(classes_[labels_[index]]);
  out->push_back('/');
  out->append(names_, begin, end - begin);
}

absl::Status ImageFolderSource::Fill(int64_t index, uint64_t sample_seed,
                                     absl::Span<uint8_t* const> rows, Scratch* scratch) const {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat("sample index ", index, " is outside [0, ", size(), ") of '", root_, "'"));
  }
  if (rows.size() != fields_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Fill needs ", fields_.size(), " rows (image, label, index), got ", rows.size()));
  }
  auto* s = dynamic_cast<ImageScratch*>(scratch);
  if (s == nullptr) {
    return absl::InvalidArgumentError("Fill needs a Scratch from this source's NewScratch()");
  }
  s->path.clear();  // keeps its capacity: no allocation once the longest path was seen
  AppendPath(index, &s->path);
  absl::StatusOr<size_t> length = ReadWholeFile(*fs_, s->path, limits_.max_sample_bytes, &s->file);
  if (!length.ok()) return length.status();
  if (*length == 0) {
    return absl::DataLossError(absl::StrCat("'", s->path, "' is empty"));
  }
  absl::Status decoded =
      TransformImageSample(s->decoder, s->compose, absl::MakeConstSpan(s->file.data(), *length),
                           transform_, sample_seed, fields_, rows, s->gpu_batch);
  if (!decoded.ok()) {
    // The transform and the row size were validated, so what is left is the file's content.
    const absl::StatusCode code = decoded.code() == absl::StatusCode::kInvalidArgument
                                      ? absl::StatusCode::kDataLoss
                                      : decoded.code();
    return absl::Status(code, absl::StrCat("cannot decode '", s->path, "': ", decoded.message()));
  }
  const int64_t label = labels_[index];
  std::memcpy(rows[1], &label, sizeof(label));
  std::memcpy(rows[2], &index, sizeof(index));
  return absl::OkStatus();
}

std::string ImageFolderSource::FileOf(int64_t index) const {
  std::string path;
  if (index >= 0 && index < size()) AppendPath(index, &path);
  return path;
}

std::string ImageFolderSource::Describe(int64_t index) const {
  if (index < 0 || index >= size()) {
    return absl::StrCat(root_, " (sample ", index, " out of range)");
  }
  std::string path;
  AppendPath(index, &path);
  return path;
}

}  // namespace ferry
