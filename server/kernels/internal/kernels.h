// The raw enqueue functions of normalize.cu, photometric.cu and resample.cu, for their
// launchers (normalize.cc, photometric.cc, resample.cc), which check arguments, enter the
// stream's device and turn the launch's cudaError_t into a status. Kept apart so that the .cu files
// hold only kernels and their launch arithmetic, and nvcc never sees abseil.
#ifndef FERRY_SERVER_KERNELS_INTERNAL_KERNELS_H_
#define FERRY_SERVER_KERNELS_INTERNAL_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "server/kernels/internal/photometric_program.h"
#include "server/kernels/internal/resample_job.h"

namespace ferry {
namespace cuda_internal {

enum class NormalizeOut { kFloat32, kFloat16, kBFloat16 };

// y = x * scale[c] + bias[c], in float32.
struct NormalizeParams {
  float scale[3];
  float bias[3];
};

// `batch` >= 1 images of `pixels` (height * width, >= 1) HWC uint8 pixels -> CHW planes.
// Enqueues on the current device, which must be `stream`'s.
cudaError_t EnqueueNormalizeImages(const uint8_t* src, void* dst, NormalizeOut out, int64_t batch,
                                   int64_t pixels, const NormalizeParams& params,
                                   cudaStream_t stream);

enum class WidenKind { kU16ToI32, kU16ToI64, kU32ToI32, kU32ToI64, kI32ToI64 };

// `count` >= 1 elements; same device rule.
cudaError_t EnqueueWidenTokens(const void* src, void* dst, WidenKind kind, int64_t count,
                               cudaStream_t stream);

// `count` >= 1 rows of `row_bytes` >= 1 bytes, count * row_bytes < 2^32; `blocks` >= 1
// (capped at what the batch needs). Same device rule.
cudaError_t EnqueueGatherRows(const uint8_t* records, int64_t num_records, size_t row_bytes,
                              const int64_t* indices, int64_t count, void* dst, int blocks,
                              cudaStream_t stream);

// The same with the indices read from host memory now and passed in the launch's
// parameters (count <= kMaxGatherParamRows); with `index_out` (device memory, may be null)
// the kernel also writes them there.
constexpr int64_t kMaxGatherParamRows = 4000;  // 32,000 bytes of the 32,764 CUDA 12.1+ allow
cudaError_t EnqueueGatherRowsIndexedFromHost(const uint8_t* records, int64_t num_records,
                                             size_t row_bytes, const int64_t* host_indices,
                                             int64_t count, void* dst, int64_t* index_out,
                                             int blocks, cudaStream_t stream);

// photometric.h's stage: `batch` >= 1 images of height x width (>= 1 each, 3 * height *
// width < 2^31) HWC uint8 pixels, each with its program, -> CHW planes. Same device rule.
cudaError_t EnqueuePhotometric(const uint8_t* src, const PhotometricProgram* programs, void* dst,
                               NormalizeOut out, int64_t batch, int height, int width,
                               cudaStream_t stream);

// resample.h's kernel: jobs[0, count) (device memory, count >= 1) to size x size each
// (1 <= size <= kMaxResampleSize). Same device rule.
cudaError_t EnqueueResampleWindows(const ResampleJob* jobs, int count, int size,
                                   cudaStream_t stream);

}  // namespace cuda_internal
}  // namespace ferry

#endif  // FERRY_SERVER_KERNELS_INTERNAL_KERNELS_H_
