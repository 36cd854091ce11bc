// GPU kernels that turn a batch as the host pipeline writes it into what a trainer feeds
// its model, run on ferry's copy stream right after the H2D copy of a slot:
//   - images: uint8 HWC (decoded pixels, 3 channels) -> normalised CHW float32 / float16 /
//     bfloat16, (x / 255 - mean[c]) / std[c]. Shipping uint8 over PCIe and widening on the
//     GPU moves 2x (16-bit) to 4x (float32) fewer bytes through the copy engines.
//   - tokens: uint16 / uint32 (as stored on disk) -> int32 / int64 (what embedding layers
//     index with).
// The launchers only enqueue: they return once the kernel is queued on `stream` (a
// cudaStream_t, e.g. CudaStream::get()), with the launch's status. Errors raised while the
// kernel runs surface at the stream's next synchronisation or event query.
//
//   FERRY_RETURN_IF_ERROR(LaunchNormalizeImages(staging, slot, OutputDType::kBFloat16, batch,
//                                               224, 224, ImageNetMean().data(),
//                                               ImageNetStd().data(), copy_stream.get()));
//
// This header includes no CUDA header: ferry_cuda's users build with the host compiler.
#ifndef FERRY_SERVER_CUDA_NORMALIZE_H_
#define FERRY_SERVER_CUDA_NORMALIZE_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace ferry {

enum class OutputDType { kFloat32, kFloat16, kBFloat16 };
constexpr size_t OutputDTypeSize(OutputDType dtype) {
  return dtype == OutputDType::kFloat32 ? 4 : 2;
}

// torchvision's ImageNet normalisation (RGB order).
constexpr std::array<float, 3> ImageNetMean() { return {0.485f, 0.456f, 0.406f}; }
constexpr std::array<float, 3> ImageNetStd() { return {0.229f, 0.224f, 0.225f}; }

// Writes dst[b][c][y][x] = (src[b][y][x][c] / 255 - mean[c]) / std[c] for a batch of
// `batch` images of height x width x 3 uint8 (HWC, images back to back) into `dst`
// (batch x 3 x height x width elements of `dtype`, planes back to back). Computed in
// float32 as x * (1 / (255 std)) + (-mean / std), then rounded to nearest for 16-bit types.
// Both pointers are device memory of the stream's device and must not overlap. Fastest
// when both are 16-byte aligned and height * width is a multiple of 16 (224 x 224 is);
// any other shape takes a slower path with the same results.
// INVALID_ARGUMENT for negative sizes, null pointers (unless the batch is empty), or a std
// that is zero or not finite; an empty batch enqueues nothing.
absl::Status LaunchNormalizeImages(const uint8_t* src_hwc, void* dst_chw, OutputDType dtype,
                                   int batch, int height, int width, const float mean[3],
                                   const float std[3], void* stream);

enum class TokenInput { kUint16, kUint32 };
enum class TokenOutput { kInt32, kInt64 };

// dst[i] = src[i] for `count` tokens, widened (zero-extended). uint32 -> int32 keeps the
// bits: ids of 2^31 or more turn negative, which no vocabulary reaches. Device pointers of
// the stream's device, not overlapping; fastest when both are 16-byte aligned.
absl::Status LaunchWidenTokens(const void* src, TokenInput src_dtype, void* dst,
                               TokenOutput dst_dtype, int64_t count, void* stream);

}  // namespace ferry

#endif  // FERRY_SERVER_CUDA_NORMALIZE_H_
