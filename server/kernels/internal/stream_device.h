// What the launchers of normalize.h and photometric.h share: the device of their stream, and
// the kernels' name for the output dtype.
#ifndef FERRY_SERVER_KERNELS_INTERNAL_STREAM_DEVICE_H_
#define FERRY_SERVER_KERNELS_INTERNAL_STREAM_DEVICE_H_

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"
#include "cuda/cuda_status.h"
#include "server/kernels/internal/kernels.h"
#include "server/kernels/normalize.h"

namespace ferry {
namespace cuda_internal {

// Kernels launch on the current device, which must be the stream's: the launchers enter it
// (ScopedDevice), so a copy thread serving several GPUs need not track which device it
// touched last.
inline absl::StatusOr<int> StreamDevice(void* stream) {
  int device = 0;
  const cudaError_t error = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(error, "cudaStreamGetDevice");
  }
  return device;
}

inline NormalizeOut ToNormalizeOut(OutputDType dtype) {
  switch (dtype) {
    case OutputDType::kFloat16:
      return NormalizeOut::kFloat16;
    case OutputDType::kBFloat16:
      return NormalizeOut::kBFloat16;
    case OutputDType::kFloat32:
      break;
  }
  return NormalizeOut::kFloat32;
}

}  // namespace cuda_internal
}  // namespace ferry

#endif  // FERRY_SERVER_KERNELS_INTERNAL_STREAM_DEVICE_H_
