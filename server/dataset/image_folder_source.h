// The `imagefolder` dataset: root/<class>/<file>.jpg, as torchvision.datasets.ImageFolder
// lays it out, decoded and cropped per sample.
//
// Classes are the immediate subdirectories of root sorted by name (byte order, as Python's
// sorted() does); label = class index. Within a class, the files directly inside it whose
// extension is .jpg, .jpeg or .png (any case) are taken, sorted by name, and each is decoded
// by its content (JPEG or PNG, whatever the extension says). Sample order is class-major,
// then file name. Other files are ignored; a class with no images keeps its label but has no
// samples. The listing happens once, in Create; later changes on disk are not seen.
//
// Memory: file names are packed in one buffer (about name length + 12 bytes per sample, e.g.
// ~45 MB for ImageNet's 1.28M files).
#ifndef FERRY_SERVER_DATASET_IMAGE_FOLDER_SOURCE_H_
#define FERRY_SERVER_DATASET_IMAGE_FOLDER_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/sample_source.h"
#include "server/decode/compose.h"
#include "server/decode/image_transform.h"

namespace ferry {

// Maps a TransformSpec onto an ImageTransform, filling torchvision's defaults for fields left
// at 0 (scale (0.08, 1), ratio (3/4, 4/3), resize = size * 256 / 224). INVALID_ARGUMENT naming
// the proto field ("transform.random_resized_crop.size must be at least 1 (got 0)", an inverted
// or non-positive range, ...) or "transform must be set" when no kind is chosen.
// A Compose (transform.compose) is validated and planned for `target` (compose_spec.h:
// ComposeTargetFor), and lands in ImageTransform::compose.
absl::StatusOr<ImageTransform> ImageTransformFromSpec(
    const ferry::v1::TransformSpec& spec,
    const ComposedTransform::Target& target = ComposedTransform::Target());

// The fields of an image dataset under `transform`: "image" (uint8 HWC, or CHW float32 when
// a composed transform normalizes on the CPU), "label", "index", for a composed transform
// that leaves ops to the device the internal kPhotometricField, and given
// transform.gpu_decode the internal kGpuDecodePlanField and, last, kGpuDecodeJpegField.
std::vector<FieldLayout> ImageSampleFields(const ImageTransform& transform);

// True when a GPU decoder can stand in for the workers under `transform`: their share is
// a crop fused with the decode (RandomResizedCrop, Resize + CenterCrop, alone or leading a
// Compose whose other ops the device runs), with no EXIF turn. Such a job's image sources,
// given SourceOptions::gpu_decode, add the internal kGpuDecodePlanField and route JPEGs.
bool GpuDecodable(const ImageTransform& transform);

// Decodes and transforms one image into rows[0] (and the program into rows[3] when
// `fields` has the internal field), drawing from `sample_seed`; of a batch the GPU decodes
// (`gpu_batch`, a job with SourceOptions::gpu_decode), a JPEG the GPU can take is routed to
// it instead (server/decode/gpu_decode_plan.h). The decoder's status.
absl::Status TransformImageSample(ImageDecoder& decoder, ComposeScratch& compose,
                                  absl::Span<const uint8_t> bytes, const ImageTransform& transform,
                                  uint64_t sample_seed, const std::vector<FieldLayout>& fields,
                                  absl::Span<uint8_t* const> rows, bool gpu_batch);

class ImageFolderSource final : public SampleSource {
 public:
  // Lists `root` through `fs`, which Fill then opens the files through. NOT_FOUND "dataset
  // path '<root>' does not exist"; INVALID_ARGUMENT when it is not a directory;
  // PERMISSION_DENIED naming a class directory or image that is a symbolic link `fs` does not
  // follow; FAILED_PRECONDITION when it holds no image in any class directory.
  static absl::StatusOr<std::unique_ptr<ImageFolderSource>> Create(
      const std::string& root, const ImageTransform& transform,
      const DecodeLimits& limits = DecodeLimits(),
      std::shared_ptr<const DatasetFs> fs = UnconfinedDatasetFs());

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  const std::vector<FieldLayout>& fields() const override { return fields_; }
  uint64_t index_bytes() const override;
  std::unique_ptr<Scratch> NewScratch() const override;
  // Errors name the file: the open/read errno as its canonical code (NOT_FOUND,
  // PERMISSION_DENIED, EIO as UNAVAILABLE, ...), UNAVAILABLE for a file that shrank while
  // it was read (being rewritten: read again later), DATA_LOSS for an empty file or content
  // that does not decode. Each Fill opens the file anew: a file replaced meanwhile is read
  // whole, as it is now.
  absl::Status Fill(int64_t index, uint64_t sample_seed, absl::Span<uint8_t* const> rows,
                    Scratch* scratch) const override;
  std::string Describe(int64_t index) const override;
  std::string FileOf(int64_t index) const override;

  const std::vector<std::string>& classes() const { return classes_; }
  const ImageTransform& transform() const { return transform_; }

 private:
  ImageFolderSource(std::string root, const ImageTransform& transform, const DecodeLimits& limits,
                    std::shared_ptr<const DatasetFs> fs);
  void AppendPath(int64_t index, std::string* out) const;

  // Constant after construction.
  const std::string root_;
  const ImageTransform transform_;
  const DecodeLimits limits_;
  const std::shared_ptr<const DatasetFs> fs_;
  std::vector<std::string> classes_;
  std::vector<int32_t> labels_;         // per sample
  std::vector<uint64_t> name_offsets_;  // per sample + 1: names_[off[i], off[i+1])
  std::string names_;                   // file names, concatenated
  std::vector<FieldLayout> fields_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_IMAGE_FOLDER_SOURCE_H_
