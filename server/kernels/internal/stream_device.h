// The device of a launcher's stream, for the launchers of normalize.h and photometric.h.
#ifndef FERRY_SERVER_KERNELS_INTERNAL_STREAM_DEVICE_H_
#define FERRY_SERVER_KERNELS_INTERNAL_STREAM_DEVICE_H_

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"
#include "cuda/cuda_status.h"

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

}  // namespace cuda_internal
}  // namespace ferry

#endif  // FERRY_SERVER_KERNELS_INTERNAL_STREAM_DEVICE_H_
