// Makes a device current for the calling thread for one scope and restores the previous
// one. The CUDA runtime's current device is per thread; ferry's owners remember their
// device and enter it around every call that allocates, creates or launches, so callers
// never have to think about which device a thread last touched. Used by ferry_cuda's owners,
// ferryd's kernel launchers and the client's CUDA ring.
//
// Thread safety: belongs to the thread that made it (the current device is per thread).
//
//   ScopedDevice scope(device);
//   FERRY_RETURN_IF_ERROR(scope.status());
#ifndef FERRY_CUDA_SCOPED_DEVICE_H_
#define FERRY_CUDA_SCOPED_DEVICE_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"

namespace ferry {

class ScopedDevice final {
 public:
  explicit ScopedDevice(int device) {
    error_ = cudaGetDevice(&previous_);
    if (error_ != cudaSuccess) {
      (void)cudaGetLastError();
      status_ = CudaStatus(error_, "cudaGetDevice");
      return;
    }
    if (previous_ == device) return;
    error_ = cudaSetDevice(device);
    if (error_ != cudaSuccess) {
      (void)cudaGetLastError();
      status_ = CudaStatus(error_, "cudaSetDevice", absl::StrCat("device ", device));
      return;
    }
    restore_ = true;
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(previous_);  // cannot fail: previous_ was valid
  }

  const absl::Status& status() const { return status_; }
  cudaError_t error() const { return error_; }

 private:
  cudaError_t error_ = cudaSuccess;
  int previous_ = 0;
  bool restore_ = false;
  absl::Status status_;
};

}  // namespace ferry

#endif  // FERRY_CUDA_SCOPED_DEVICE_H_
