// Makes a device current for the calling thread for one scope, then puts back exactly what
// the thread had before: another device's context, or none at all. The CUDA runtime's
// current device is per thread; ferry's owners remember their device and enter it around
// every call they make (create, launch, query, synchronise, export, destroy), so no thread
// ever calls CUDA with another device's context, or none, current, and callers never have
// to think about which device a thread last touched. Used by ferry_cuda's owners, ferryd's
// stages and kernel launchers, and the client's CUDA ring (where the trainer's own current
// device must survive every ferry call).
//
// A thread that had no context keeps none: entering device 1 on a fresh thread never binds
// (or creates) device 0's context on the way out, as a cudaGetDevice / cudaSetDevice pair
// would. Entering the device that is already current costs two driver queries and no
// switch.
//
// Thread safety: belongs to the thread that made it (the current context is per thread).
//
//   ScopedDevice scope(device);
//   FERRY_RETURN_IF_ERROR(scope.status());
#ifndef FERRY_CUDA_SCOPED_DEVICE_H_
#define FERRY_CUDA_SCOPED_DEVICE_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace ferry {

// The calls ScopedDevice makes: the driver's current context (cuCtxGetCurrent /
// cuCtxSetCurrent, reached through the runtime so that nothing links libcuda) and the
// runtime's current device. A seam: tests without a GPU install fakes
// (SetDeviceCallsForTesting) to check the scope's contract on many threads at once.
struct DeviceCalls {
  // The calling thread's current context into *context (null: none). False when the
  // driver's calls are unavailable; ScopedDevice then restores by device number.
  bool (*get_context)(void** context);
  // Makes `context` current (null: none). Only called with what get_context returned.
  bool (*set_context)(void* context);
  cudaError_t (*get_device)(int* device);
  cudaError_t (*set_device)(int device);
};

// Replaces the calls every ScopedDevice makes from now on (null: the real ones). For tests;
// not synchronised with scopes alive on other threads.
void SetDeviceCallsForTesting(const DeviceCalls* calls);

class ScopedDevice final {
 public:
  explicit ScopedDevice(int device);
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice();

  // OK, or why `device` could not be made current (naming the CUDA call and the device).
  const absl::Status& status() const { return status_; }
  cudaError_t error() const { return error_; }

 private:
  const DeviceCalls& calls_;
  cudaError_t error_ = cudaSuccess;
  absl::Status status_;
  bool restore_ = false;
  bool exact_ = false;                // the driver's context calls are available
  void* previous_context_ = nullptr;  // with exact_: the thread's context; null: none
  int previous_device_ = 0;           // without exact_: restored with set_device
};

}  // namespace ferry

#endif  // FERRY_CUDA_SCOPED_DEVICE_H_
