// JPEG (libjpeg-turbo) and PNG (libspng) decoding and torchvision-compatible crops, writing
// uint8 HWC RGB straight into a caller-owned row (the batch slot). A JPEG is decoded with no
// copy beyond the decoder's own scanline buffer; a PNG is decoded whole, then cropped.
//
// The format comes from the content (the signature), never from a file name: a PNG named
// .JPEG decodes as a PNG. A PNG comes out as PIL's Image.open(f).convert("RGB") gives it
// (internal/png.h lists the rules per PNG type).
//
// Meaning and defaults follow torchvision:
//   RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(3/4, 4/3)): up to 10 attempts to draw
//     area fraction and log-uniform aspect ratio, fallback to a center crop clamped to the
//     ratio range; the box is resized to size x size with antialiased bilinear
//     interpolation (torchvision's default for tensors, equivalent to PIL's BILINEAR).
//   Resize(resize) + CenterCrop(size): shorter side to `resize`, then the central square.
//   RandomHorizontalFlip(p=0.5).
// All randomness comes from the caller's Rng, so (seed, epoch, index) fixes the result.
//
//   ImageDecoder decoder;  // one per worker thread
//   ImageTransform t = ImageTransform::RandomResizedCrop(224, /*flip=*/true);
//   Rng rng(MixSeed(seed, epoch, index));
//   FERRY_RETURN_IF_ERROR(DecodeAndTransform(decoder, bytes, t, rng, row));  // 224*224*3
#ifndef FERRY_SERVER_DECODE_IMAGE_TRANSFORM_H_
#define FERRY_SERVER_DECODE_IMAGE_TRANSFORM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/random.h"

namespace ferry {

class ComposedTransform;  // compose.h
class GpuDecodeSplit;     // gpu_decode_split.h

// torchvision's RandomResizedCrop defaults: the crop's share of the image's area, and its
// aspect ratio, each drawn from [min, max]. A spec that leaves them at 0 gets these.
inline constexpr double kDefaultCropScale[2] = {0.08, 1.0};
inline constexpr double kDefaultCropRatio[2] = {3.0 / 4.0, 4.0 / 3.0};

struct ImageTransform {
  enum class Kind { kRandomResizedCrop, kResizeCenterCrop };
  Kind kind = Kind::kRandomResizedCrop;
  int size = 224;  // output is size x size x 3
  double scale_min = kDefaultCropScale[0];
  double scale_max = kDefaultCropScale[1];
  double ratio_min = kDefaultCropRatio[0];
  double ratio_max = kDefaultCropRatio[1];
  bool flip = false;  // RandomHorizontalFlip(p=0.5)
  int resize = 256;   // kResizeCenterCrop: shorter side before the crop
  // Turn the image upright by its EXIF Orientation first (PIL's ImageOps.exif_transpose;
  // exif.h), so the crop is drawn on the upright image. A dataset option in the JobSpec
  // (ImageFolderDataset / WebDataset .exif_orientation). Default: false.
  bool exif_orientation = false;
  // Decode JPEGs at full resolution (DCT scale 8/8) whatever the crop: pixels as torchvision's
  // full-resolution decode + crop + resize, at more CPU cost. Default: false (the smallest
  // scale, down to smallest_dct_scale, that keeps the crop at least `size` pixels a side).
  bool full_decode = false;
  // The smallest DCT scale, in eighths (1, 2, 4 or 8), a JPEG may be decoded at when its
  // crop allows; 8 decodes at full resolution like full_decode. Default: 4 (1/2): the 1/4
  // and 1/8 scales differ from a full decode several times more than 1/2 followed by an
  // antialiased shrink, for a few percent of speed (docs/data.md, "Reduced-scale decode").
  int smallest_dct_scale = 4;

  // Set for a composed transform (transform.compose): it replaces everything above except
  // `size`, which is its output side; DecodeAndTransform does not take it (compose.h runs it).
  std::shared_ptr<const ComposedTransform> compose;
  // Set for a GPU job that decodes JPEGs on the GPU (SourceOptions::gpu_decode): the image
  // sources route each JPEG through it (server/decode/gpu_decode_plan.h). Not read by
  // DecodeAndTransform.
  std::shared_ptr<GpuDecodeSplit> gpu_decode;

  static ImageTransform RandomResizedCrop(int size, bool flip);
  static ImageTransform ResizeCenterCrop(int size, int resize);
};

struct CropBox {
  int x = 0, y = 0, width = 0, height = 0;
};

// OK when `t` can be applied: size in [1, 16384], 0 < scale_min <= scale_max,
// 0 < ratio_min <= ratio_max (all finite), and for kResizeCenterCrop resize >= size.
// Otherwise INVALID_ARGUMENT naming the field and value. DecodeAndTransform checks this too;
// call it early (e.g. at job creation) to reject a bad pipeline before any decoding.
absl::Status ValidateTransform(const ImageTransform& t);

// Geometry of Resize(t.resize) + CenterCrop(t.size) on a width x height image with
// torchvision's rounding: the shorter side becomes t.resize, the longer one
// int(t.resize * long / short); the crop's offset is round((resized - size) / 2), ties to
// even. Requires width, height > 0.
struct ResizeCenterCropGeometry {
  int resized_width = 0, resized_height = 0;
  int left = 0, top = 0;  // offset of the size x size crop inside the resized image
};
ResizeCenterCropGeometry ComputeResizeCenterCrop(int width, int height, const ImageTransform& t);

// torchvision RandomResizedCrop.get_params on an image of width x height (both > 0): four
// draws from `rng` per attempt (area, log-ratio, then top, then left, as torchvision orders
// them), and none in the fallback. The box always lies inside the image.
CropBox SampleRandomResizedCrop(int width, int height, const ImageTransform& t, Rng& rng);

// Where the output of `t` comes from in a width x height image: the continuous source
// interval [x0, x1) x [y0, y1) (pixel edges) that becomes the size x size output, the source
// pixels the resampling filters may read ([clamp_x0, clamp_x1) x [clamp_y0, clamp_y1): the
// crop for RandomResizedCrop, which torchvision resizes as an image of its own; the whole
// image for Resize + CenterCrop), and whether the output is mirrored (the flip).
struct SourceWindow {
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;
  int clamp_x0 = 0, clamp_x1 = 0, clamp_y0 = 0, clamp_y1 = 0;
  bool mirror = false;
};

// The window DecodeAndTransform uses for a width x height image (after any EXIF turn), with
// the same draws from `rng` in the same order: crop (RandomResizedCrop only), then flip.
// Another decoder (the GPU's) that resamples this window gets DecodeAndTransform's pixels.
SourceWindow PlanSourceWindow(int width, int height, const ImageTransform& t, Rng& rng);

// The DCT scale, in eighths (1, 2, 4 or 8), DecodeAndTransform decodes a JPEG at for `window`:
// the smallest n >= t.smallest_dct_scale at which the window still spans at least t.size
// pixels both ways (8 with full_decode); the resize after it shrinks by less than 2 more (or
// enlarges) unless smallest_dct_scale held n up. For a crop of side c and smallest_dct_scale
// 1 that is n = 1 when c >= 8 * size, 2 when c >= 4 * size, 4 when c >= 2 * size, else 8;
// with the default 4, n = 4 when c >= 2 * size, else 8.
int JpegDctScale(const SourceWindow& window, const ImageTransform& t);

// The resampling of DecodeAndTransform at full resolution (DCT scale 8/8, or a PNG): `rgb`
// (width x height RGB HWC, tightly packed) through `window` to size x size RGB in `out`.
// PIL BILINEAR semantics in 14-bit fixed point (internal/resample.h), the reference for
// other implementations.
void ResampleWindow(const uint8_t* rgb, int width, int height, const SourceWindow& window, int size,
                    uint8_t* out);

// Limits that protect a decoder from hostile or broken files. An image over a limit is
// refused before the allocation or work it would cause (INVALID_ARGUMENT naming the limit and
// its config field), and callers treat the refusal like any corrupt sample.
struct DecodeLimits {
  uint64_t max_image_pixels = 89478485;  // width x height as declared; PIL's default
  int max_progressive_scans = 100;       // scans of a (progressive) JPEG
  uint64_t max_sample_bytes = 64 << 20;  // encoded bytes of one sample
};

enum class ImageFormat { kUnknown, kJpeg, kPng };

// The format by signature: FF D8 FF for JPEG, 89 50 4E 47 0D 0A 1A 0A for PNG.
ImageFormat SniffImageFormat(absl::Span<const uint8_t> bytes);

// One decoder per thread: owns a libjpeg-turbo decompressor and scratch buffers and reuses
// them across images (PNG needs no state of its own beyond scratch). Not thread-safe.
// Movable, not copyable.
//
// Every method takes a JPEG or a PNG (SniffImageFormat). Anything else is INVALID_ARGUMENT
// "not a JPEG or PNG: ..." naming the format when it is a common other one (GIF, WebP, ...);
// messages never quote the file's bytes (a caller may not be allowed to read the file).
class ImageDecoder final {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(ImageDecoder&&) noexcept;
  ImageDecoder& operator=(ImageDecoder&&) noexcept;

  // Applies to every later call. Default: DecodeLimits{}.
  void set_limits(const DecodeLimits& limits);
  const DecodeLimits& limits() const;

  // Reads the header only (JPEG frame header, PNG IHDR): the size as stored, before any EXIF
  // orientation. INVALID_ARGUMENT with the decoder's message for data truncated before it.
  absl::Status ReadSize(absl::Span<const uint8_t> image, int* width, int* height);

  // Full decode to RGB uint8 HWC into `out` (resized to width*height*3). Grayscale, YCbCr,
  // RGB and (Adobe) CMYK/YCCK JPEGs and every PNG type all come out as RGB. EXIF orientation
  // is not applied (neither torchvision's decode_jpeg nor PIL's open does; see exif.h).
  // INVALID_ARGUMENT with the decoder's message for corrupt or truncated data, never a
  // gray-filled image.
  absl::Status DecodeRgb(absl::Span<const uint8_t> image, std::vector<uint8_t>* out, int* width,
                         int* height);

  struct Impl;

 private:
  friend absl::Status DecodeAndTransform(ImageDecoder& decoder, absl::Span<const uint8_t> image,
                                         const ImageTransform& t, Rng& rng,
                                         absl::Span<uint8_t> out);

  // Never null except in a moved-from decoder, which recreates it on next use.
  std::unique_ptr<Impl> impl_;
};

// Decodes `image` (JPEG or PNG), applies `t` drawing randomness from `rng`, and writes
// t.size*t.size*3 bytes of RGB HWC into `out`. A corrupt or truncated file returns
// INVALID_ARGUMENT with the decoder's message; `out` may then hold partial data.
//
// JPEG: only the part of the image the output depends on is decoded, at the DCT scale
// JpegDctScale gives (1/2 when the crop has at least 2 * t.size pixels per side, else 1);
// the result matches a full decode + crop + resize within JPEG/scaling tolerance.
// Consequently damage that lies entirely below or beside the decoded region (e.g. a baseline
// JPEG cut short under a crop near its top) is not detected: the output is then still
// correct. PNG (which has no such scaling), and a JPEG that t.exif_orientation turns, is
// decoded whole, turned, then cropped and resized from the full-resolution pixels.
// Randomness: crop draws first (RandomResizedCrop only, on the size after any EXIF turn),
// then one flip draw when t.flip: the same draws for a JPEG and a PNG of the same size.
// INVALID_ARGUMENT also for an invalid `t` (see ValidateTransform) or an `out` whose size is
// not t.size*t.size*3.
absl::Status DecodeAndTransform(ImageDecoder& decoder, absl::Span<const uint8_t> image,
                                const ImageTransform& t, Rng& rng, absl::Span<uint8_t> out);

// Antialiased bilinear resize of box `box` of an RGB HWC image to out_w x out_h (PIL
// BILINEAR / torchvision antialias=True semantics). Exposed for tests and benchmarks.
// The box is treated as an image of its own (as torchvision's crop-then-resize does): no
// pixel outside it is read. `src_stride` is in bytes; `dst` is tightly packed
// (out_w * 3 bytes per row). Requires a non-empty box inside the image and out_w, out_h > 0.
void ResizeBilinearAntialias(const uint8_t* src, int src_w, int src_h, int src_stride,
                             const CropBox& box, uint8_t* dst, int out_w, int out_h);

}  // namespace ferry

#endif  // FERRY_SERVER_DECODE_IMAGE_TRANSFORM_H_
