// A composed image transform: torchvision.transforms.v2.Compose of ferry's ops (the
// TransformOp messages of ferry.proto), validated once and run per sample on a worker.
//
// Where each op runs:
//   - Geometric ops (RandomResizedCrop, Resize, CenterCrop, RandomCrop, flips) and
//     TrivialAugmentWide run on the worker. A leading RandomResizedCrop, or Resize + CenterCrop,
//     is fused with the decode (image_transform.h: only the kept region is decoded, at a
//     reduced DCT scale unless full_decode); any other start decodes the whole image.
//   - For a job whose images a GPU turns into floats (Target::device_program), the trailing
//     run of ColorJitter / RandomGrayscale / Normalize / RandomErasing is not applied here:
//     the worker draws its parameters and writes them as a PhotometricProgram
//     (server/kernels/photometric.h) next to the uint8 image, and the GPU applies it in
//     float32. A Normalize is appended when the ops have none (the job's image_output).
//   - Otherwise every op runs here on uint8 pixels, as torchvision does on uint8 tensors, and
//     a Normalize turns the image into CHW float32; only RandomErasing may follow it.
//
// Randomness: op i draws from Rng(MixSeed(sample_seed, i)) and from nothing else, so the
// same (seed, epoch, index) gives the same parameters on any rank count, after a resume, and
// whichever side (CPU or GPU) applies them.
//
//   FERRY_ASSIGN_OR_RETURN(ComposedTransform t, ComposedTransform::Create(steps, target));
//   ComposeScratch scratch;  // one per worker thread
//   FERRY_RETURN_IF_ERROR(t.Run(decoder, bytes, exif, sample_seed, scratch, image_row,
//                               program_row));
#ifndef FERRY_SERVER_DECODE_COMPOSE_H_
#define FERRY_SERVER_DECODE_COMPOSE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/imagenet.h"
#include "server/decode/image_ops.h"
#include "server/decode/image_transform.h"

namespace ferry {

// One op with torchvision's arguments, already parsed (defaults filled, ranges resolved).
struct ComposeStep {
  enum class Kind {
    kRandomResizedCrop,
    kResize,
    kCenterCrop,
    kRandomCrop,
    kHorizontalFlip,
    kVerticalFlip,
    kColorJitter,
    kRandomGrayscale,
    kTrivialAugmentWide,
    kNormalize,
    kRandomErasing,
  };
  Kind kind = Kind::kHorizontalFlip;
  int size = 0;  // RandomResizedCrop, Resize (shorter side), CenterCrop, RandomCrop
  // RandomResizedCrop.
  double scale[2] = {kDefaultCropScale[0], kDefaultCropScale[1]};
  double ratio[2] = {kDefaultCropRatio[0], kDefaultCropRatio[1]};
  bool full_decode = false;  // also Resize
  // RandomCrop: padding (left, top, right, bottom), pad_if_needed, fill, padding_mode.
  int padding[4] = {0, 0, 0, 0};
  bool pad_if_needed = false;
  PaddingMode padding_mode = PaddingMode::kConstant;
  std::array<uint8_t, 3> fill = {0, 0, 0};  // also TrivialAugmentWide
  float p = 0.5f;                           // flips, RandomGrayscale, RandomErasing
  ColorJitterOptions jitter;
  int num_magnitude_bins = 31;
  float mean[3] = {0, 0, 0};  // Normalize
  float std[3] = {1, 1, 1};
  RandomErasingOptions erasing;
  float value[3] = {0, 0, 0};  // RandomErasing
};

// torchvision's class name of a step ("RandomResizedCrop", ...), for messages.
const char* ComposeStepName(ComposeStep::Kind kind);

// Per-thread buffers of Run (images between ops). Reused across samples.
struct ComposeScratch {
  RgbImage image;
  RgbImage other;
  std::vector<uint8_t> bytes;
};

class ComposedTransform {
 public:
  // Where the job's images go.
  struct Target {
    // A GPU converts the images to floats: the trailing photometric ops run there.
    bool device_program = false;
    // The device's normalisation when the ops have no Normalize (image_output's).
    std::array<float, 3> device_mean = kImageNetMean;
    std::array<float, 3> device_std = kImageNetStd;
    // Turn each image upright by its EXIF orientation first (the dataset's option).
    bool exif_orientation = false;
  };

  // INVALID_ARGUMENT "ops[i] (Name): ..." for an op that cannot run where it is: no ops; a
  // final size that depends on the image (no crop to a fixed size after the last Resize);
  // an op other than RandomErasing after Normalize; bad arguments (sizes, probabilities,
  // ranges, padding for "reflect" larger than the image it could meet is checked per
  // sample).
  static absl::StatusOr<ComposedTransform> Create(std::vector<ComposeStep> steps,
                                                  const Target& target);

  int size() const { return size_; }                   // output side in pixels
  bool float_output() const { return float_output_; }  // CHW float32 rows (CPU Normalize)
  bool emits_program() const { return device_steps_ >= 0; }
  size_t image_row_bytes() const;
  const std::vector<ComposeStep>& steps() const { return steps_; }
  // Index of the first step the device applies; steps().size() when none (only the
  // appended Normalize), -1 when the workers apply everything.
  int device_steps() const { return device_steps_; }

  // Decodes `bytes` (JPEG or PNG) and applies the steps with `sample_seed`, writing the
  // image into `image_row` (image_row_bytes()) and, when emits_program(), the device's
  // PhotometricProgram into `program_row` (sizeof(PhotometricProgram)). INVALID_ARGUMENT
  // for a corrupt image (the decoder's message) or a row of the wrong size.
  absl::Status Run(ImageDecoder& decoder, absl::Span<const uint8_t> bytes, uint64_t sample_seed,
                   ComposeScratch& scratch, absl::Span<uint8_t> image_row,
                   absl::Span<uint8_t> program_row) const;

  // True when the workers' share is only the crop fused with the decode (a leading
  // RandomResizedCrop, or Resize + CenterCrop) and the rest, if any, is the device's: then
  // another decoder may do the workers' share, with FusedTransform()'s geometry (its draws:
  // Rng(MixSeed(sample_seed, 0))), and WriteProgram the device's.
  bool DecodeOnly() const;
  ImageTransform FusedTransform() const;
  // Run's program part alone: the device's PhotometricProgram for `sample_seed`.
  absl::Status WriteProgram(uint64_t sample_seed, absl::Span<uint8_t> program_row) const;

 private:
  std::vector<ComposeStep> steps_;
  Target target_;
  int size_ = 0;
  bool float_output_ = false;
  int device_steps_ = -1;
  // Steps [0, fused_steps_) run inside the decode (0: whole decode first).
  int fused_steps_ = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DECODE_COMPOSE_H_
