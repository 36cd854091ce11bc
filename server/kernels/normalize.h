// GPU kernels that turn a batch as the host pipeline writes it into what a trainer feeds
// its model, run on ferry's copy stream right after the H2D copy of a slot:
//   - images: uint8 HWC (decoded pixels, 3 channels) -> normalised CHW float32 / float16 /
//     bfloat16, (x / 255 - mean[c]) / std[c]. Shipping uint8 over PCIe and widening on the
//     GPU moves 2x (16-bit) to 4x (float32) fewer bytes through the copy engines.
//   - tokens: uint16 / uint32 (as stored on disk) -> int32 / int64 (what embedding layers
//     index with);
//   - records: a batch's rows gathered by the SMs straight from a registered file mapping
//     (the page cache), given the batch's sample indices: no host copy of the rows at all.
// The launchers only enqueue: they return once the kernel is queued on `stream` (a
// cudaStream_t, e.g. CudaStream::get()), with the launch's status. Errors raised while the
// kernel runs surface at the stream's next synchronisation or event query.
//
//   FERRY_RETURN_IF_ERROR(LaunchNormalizeImages(staging, slot, OutputDType::kBFloat16, batch,
//                                               224, 224, kImageNetMean.data(),
//                                               kImageNetStd.data(), copy_stream.get()));
//
// ferryd's alone (library ferry_kernels, over cuda/'s owners): the client libraries never
// link it, so they carry no device code. This header includes no CUDA header: its users
// build with the host compiler.
#ifndef FERRY_SERVER_KERNELS_NORMALIZE_H_
#define FERRY_SERVER_KERNELS_NORMALIZE_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/imagenet.h"

namespace ferry {

enum class OutputDType { kFloat32, kFloat16, kBFloat16 };
constexpr size_t OutputDTypeSize(OutputDType dtype) {
  return dtype == OutputDType::kFloat32 ? 4 : 2;
}

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

enum class TokenInput { kUint16, kUint32, kInt32 };
enum class TokenOutput { kInt32, kInt64 };

// dst[i] = src[i] for `count` tokens, widened (zero-extended from unsigned, sign-extended
// from int32: Megatron's int32 token files). uint32 -> int32 keeps the bits: ids of 2^31 or
// more turn negative, which no vocabulary reaches. int32 -> int32 is no widening:
// INVALID_ARGUMENT. Device pointers of the stream's device, not overlapping; fastest when
// both are 16-byte aligned.
absl::Status LaunchWidenTokens(const void* src, TokenInput src_dtype, void* dst,
                               TokenOutput dst_dtype, int64_t count, void* stream);

// The records of a file mapping that the device reads directly: record i is `row_bytes`
// bytes at records + i * row_bytes, for i in [0, num_records). `records` is a device
// pointer to host memory registered with the driver (HostRegistration::device_data), so
// the kernel reads it across PCIe with no host copy in between.
struct GatherSource {
  const uint8_t* records = nullptr;
  int64_t num_records = 0;
  size_t row_bytes = 0;
};

// Writes dst[r * row_bytes, +row_bytes) = record indices[r] of `source` for r in [0, count),
// on `blocks` thread blocks (a few keep PCIe busy: see bench/h2d_bench, which measures
// them; each uses one SM's worth of threads). `indices` (int64) and `dst` are device
// memory of the stream's device. A row whose index is outside [0, num_records) is written
// as zeros (index -1 marks a row with no readable sample): the kernel never reads outside
// the records. 16-byte loads when the records, dst
// and row_bytes allow, narrower ones otherwise. INVALID_ARGUMENT for a negative count,
// null pointers (unless count is 0), row_bytes 0, blocks < 1, or a batch of 4 GiB or more.
absl::Status LaunchGatherRows(const GatherSource& source, const int64_t* indices, int64_t count,
                              void* dst, int blocks, void* stream);

// The most rows LaunchGatherRowsIndexedFromHost takes in one launch.
constexpr int64_t kMaxGatherRowsPerLaunch = 4000;

// LaunchGatherRows with `indices` in host memory, read during this call and handed to the
// kernel in its launch parameters: nothing is copied to the device before the kernel, and
// `indices` may be reused as soon as this returns. With `index_out` (device memory of the
// stream's device; may be null) the kernel also writes the indices there, as int64.
// INVALID_ARGUMENT as LaunchGatherRows, and for more than kMaxGatherRowsPerLaunch rows.
absl::Status LaunchGatherRowsIndexedFromHost(const GatherSource& source,
                                             absl::Span<const int64_t> indices, void* dst,
                                             int64_t* index_out, int blocks, void* stream);

}  // namespace ferry

#endif  // FERRY_SERVER_KERNELS_NORMALIZE_H_
