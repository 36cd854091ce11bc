// The fused GPU stage of a composed image transform (server/decode/compose.h): a batch of
// uint8 HWC images, each with its own short program of photometric ops (ColorJitter's four
// adjustments, grayscale, normalize, erasing) whose random parameters the CPU workers drew,
// run in float32 in one kernel and written as CHW float32 / float16 / bfloat16.
//
// The image is converted to float x / 255 first (v2.ToDtype(float32, scale=True)), then the
// program's ops run in order with torchvision's meaning on float images (no rounding to
// uint8 between ops, so the result differs from the same ops on uint8 by the CPU path's
// rounding; docs/data.md states the tolerance):
//   kBrightness  x = clamp(a * x, 0, 1)
//   kContrast    x = clamp(a * x + (1 - a) * m, 0, 1), m = mean over the image of
//                gray(x) = 0.2989 r + 0.587 g + 0.114 b, of the image as it is at that op
//   kSaturation  x = clamp(a * x + (1 - a) * gray(x), 0, 1)
//   kHue         v2.functional.adjust_hue(x, a) (RGB -> HSV, h = (h + a) mod 1, -> RGB)
//   kGrayscale   r = g = b = gray(x)
//   kNormalize   x[c] = (x[c] - mean[c]) / std[c]   (params: v[0..2] = mean, w[0..2] = std)
//   kErase       x[c] = v[c] inside the box rows [top, top + height), columns
//                [left, left + width) (v2.functional.erase)
// Every row of `params` is one sample's PhotometricProgram; programs may differ per sample
// (ColorJitter's order and factors, whether grayscale or erasing applies).
//
// This header includes no CUDA header: its users build with the host compiler.
#ifndef FERRY_SERVER_KERNELS_PHOTOMETRIC_H_
#define FERRY_SERVER_KERNELS_PHOTOMETRIC_H_

#include <cstdint>

#include "absl/status/status.h"
// PhotometricKind, PhotometricOp, PhotometricProgram: plain bytes, apart so that nvcc
// reads them without abseil.
#include "server/kernels/internal/photometric_program.h"
#include "server/kernels/normalize.h"

namespace ferry {

// dst[b][c][y][x] = the program programs[b] applied to src[b] (height x width x 3 uint8 HWC,
// images back to back), as `dtype` (16-bit types rounded to nearest). src, programs and
// dst are device memory of the stream's device; dst must not overlap the others. A
// program with num_ops > kMaxPhotometricOps, or an unknown kind, is applied up to that op
// and the rest ignored (the workers never write one). INVALID_ARGUMENT for negative sizes,
// null pointers (unless the batch is empty) or an image of 2 GiB or more (3 * height *
// width > INT32_MAX); an empty batch enqueues nothing. float32 results agree with
// ApplyPhotometricReference to about 1e-5.
absl::Status LaunchPhotometric(const uint8_t* src_hwc, const PhotometricProgram* programs,
                               void* dst_chw, OutputDType dtype, int batch, int height, int width,
                               void* stream);

// The same program on the CPU, in float32 the same way (torchvision v2's expressions op by
// op over the whole image), for tests and for checking the CPU path against the GPU's:
// writes 3 x height x width floats of CHW into dst.
void ApplyPhotometricReference(const uint8_t* src_hwc, const PhotometricProgram& program,
                               int height, int width, float* dst_chw);

}  // namespace ferry

#endif  // FERRY_SERVER_KERNELS_PHOTOMETRIC_H_
