// Image operations on decoded RGB uint8 HWC images, with torchvision.transforms.v2's meaning
// on uint8 tensors (each op rounds its result back to uint8 as torchvision does), and the
// parameter draws of torchvision's random ops taken from ferry's Rng. These are the ops that
// a composed transform (compose.h) runs on the CPU workers after decode and crop.
//
// Parameters are explicit: an op's `Sample...` function draws its random parameters (the
// same distributions and the same order of draws as torchvision's get_params / the v2
// transform's _get_params), and the `Apply...`/`Adjust...` functions apply fixed parameters.
// So a test can compare an Apply with torchvision's functional op on the same parameters,
// and (seed, epoch, index, op position) fixes every draw.
//
//   RgbImage image = ...;                        // after decode + crop
//   Rng rng(MixSeed(sample_seed, op_position));
//   ColorJitterParams p = SampleColorJitter(jitter, rng);
//   ApplyColorJitter(p, image);
#ifndef FERRY_SERVER_DECODE_IMAGE_OPS_H_
#define FERRY_SERVER_DECODE_IMAGE_OPS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/random.h"

namespace ferry {

// A tightly packed RGB uint8 HWC image that owns its pixels: row y starts at y * width * 3.
struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // width * height * 3

  void Resize(int w, int h) {
    width = w;
    height = h;
    pixels.resize(static_cast<size_t>(w) * h * 3);
  }
  uint8_t* row(int y) { return pixels.data() + static_cast<size_t>(y) * width * 3; }
  const uint8_t* row(int y) const { return pixels.data() + static_cast<size_t>(y) * width * 3; }
};

// ---- Geometry ------------------------------------------------------------------------

void HorizontalFlip(RgbImage& image);  // v2.functional.horizontal_flip
void VerticalFlip(RgbImage& image);    // v2.functional.vertical_flip

// torchvision's padding_mode.
enum class PaddingMode { kConstant, kEdge, kReflect, kSymmetric };

// v2.functional.pad(image, [left, top, right, bottom], fill, padding_mode) into `out`
// (resized). All four amounts >= 0. kReflect needs each amount smaller than the side it
// reflects (as torch requires); callers validate that.
void Pad(const RgbImage& image, int left, int top, int right, int bottom, PaddingMode mode,
         const std::array<uint8_t, 3>& fill, RgbImage* out);

// v2.functional.crop(image, top, left, height, width) into `out` (resized); the box must lie
// inside the image.
void Crop(const RgbImage& image, int top, int left, int height, int width, RgbImage* out);

// v2.functional.resize(image, [height, width], antialias=True), bilinear.
void ResizeBilinear(const RgbImage& image, int height, int width, RgbImage* out);

// ---- Colour --------------------------------------------------------------------------

// v2.functional.adjust_brightness / adjust_contrast / adjust_saturation / adjust_hue on uint8
// (factor >= 0; hue_factor in [-0.5, 0.5]). Contrast and saturation blend with the float32
// grayscale floored to an integer (contrast: its mean over the image, not rounded), as v2 does;
// every result is clamped to [0, 255] and truncated to uint8.
void AdjustBrightness(RgbImage& image, float factor);
void AdjustContrast(RgbImage& image, float factor);
void AdjustSaturation(RgbImage& image, float factor);
void AdjustHue(RgbImage& image, float hue_factor);
// v2.functional.rgb_to_grayscale(image, num_output_channels=3).
void RgbToGrayscale(RgbImage& image);

// ColorJitter(brightness, contrast, saturation, hue) after torchvision's argument parsing:
// a factor range [min, max] (brightness = b means [max(0, 1 - b), 1 + b]; hue = h means
// [-h, h]); an op whose range is unset (`has_*` false) is skipped and draws nothing.
struct ColorJitterOptions {
  bool has_brightness = false, has_contrast = false, has_saturation = false, has_hue = false;
  float brightness[2] = {1, 1};
  float contrast[2] = {1, 1};
  float saturation[2] = {1, 1};
  float hue[2] = {0, 0};
};

// The draws of v2.ColorJitter._get_params: a permutation of the four ops (0 brightness,
// 1 contrast, 2 saturation, 3 hue), then one uniform factor per op that is set, in that
// fixed order (not the permuted one).
struct ColorJitterParams {
  std::array<int, 4> order = {0, 1, 2, 3};
  bool apply[4] = {false, false, false, false};
  float factor[4] = {1, 1, 0, 0};  // brightness, contrast, saturation, hue
};
ColorJitterParams SampleColorJitter(const ColorJitterOptions& options, Rng& rng);
// The set ops in params.order.
void ApplyColorJitter(const ColorJitterParams& params, RgbImage& image);

// ---- TrivialAugmentWide --------------------------------------------------------------

// torchvision's TrivialAugmentWide(num_magnitude_bins=31, interpolation=NEAREST, fill=None):
// one op drawn uniformly from the 14 below, then a magnitude bin uniformly from
// [0, num_magnitude_bins), then (for signed ops) a sign with probability 0.5; magnitudes as
// torchvision's _AUGMENTATION_SPACE for TrivialAugmentWide.
enum class AugmentOp {
  kIdentity,
  kShearX,
  kShearY,
  kTranslateX,
  kTranslateY,
  kRotate,
  kBrightness,
  kColor,
  kContrast,
  kSharpness,
  kPosterize,
  kSolarize,
  kAutoContrast,
  kEqualize,
};
struct AugmentParams {
  AugmentOp op = AugmentOp::kIdentity;
  // torchvision's magnitude, signed: shear factor, translation in pixels (truncated to an
  // integer when applied), rotation in degrees, factor - 1 for the colour ops; for kPosterize
  // the bit count, for kSolarize the threshold as a fraction of 255. 0 for the ops without one.
  float magnitude = 0;
};
// Draws the op (uniform over the 14), then, only for an op with magnitudes, the bin, then,
// only for a signed op, the sign; Identity, AutoContrast and Equalize draw nothing more.
AugmentParams SampleTrivialAugmentWide(int num_magnitude_bins, Rng& rng);
// The unsigned magnitude of bin `bin` in [0, num_magnitude_bins) as torchvision's
// _AUGMENTATION_SPACE computes it in float32 (torch.linspace; Posterize's rounded arange).
float TrivialAugmentMagnitude(AugmentOp op, int bin, int num_magnitude_bins);
// Geometric ops use nearest interpolation and fill the uncovered pixels with `fill`, as
// v2.functional.affine / rotate do. Rotate and Translate act about the image centre; ShearX and
// ShearY pass center=[0, 0] to affine, so they keep the top-left corner fixed. `scratch` is
// working memory (its contents are overwritten).
void ApplyAugment(const AugmentParams& params, const std::array<uint8_t, 3>& fill, RgbImage& image,
                  RgbImage* scratch);

// ---- RandomErasing -------------------------------------------------------------------

// RandomErasing(p, scale, ratio, value) after parsing.
struct RandomErasingOptions {
  float p = 0.5f;
  float scale[2] = {0.02f, 0.33f};
  float ratio[2] = {0.3f, 3.3f};
};
// The draws of v2.RandomErasing: one uniform against p; when erasing, up to 10 attempts of
// (area fraction, log-ratio) then top and left, as torchvision orders them. `erase` false
// when p's draw said no or no attempt fitted (torchvision then returns the image unchanged).
struct ErasingParams {
  bool erase = false;
  int top = 0, left = 0, height = 0, width = 0;
};
ErasingParams SampleRandomErasing(const RandomErasingOptions& options, int image_height,
                                  int image_width, Rng& rng);
// Sets the box to `value` (per channel) in a uint8 image.
void EraseU8(const ErasingParams& params, const std::array<uint8_t, 3>& value, RgbImage& image);

}  // namespace ferry

#endif  // FERRY_SERVER_DECODE_IMAGE_OPS_H_
