#include "cuda/scoped_device.h"

#include <cuda.h>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"

namespace ferry {
namespace {

// The driver's current-context calls, reached through the runtime so that nothing links
// libcuda (a machine without a driver still runs ferry's host-only paths).
struct ContextCalls {
  CUresult (*get)(CUcontext*) = nullptr;
  CUresult (*set)(CUcontext) = nullptr;
};

const ContextCalls& Calls() {
  static const ContextCalls calls = [] {
    ContextCalls c;
    void* get = nullptr;
    void* set = nullptr;
    cudaDriverEntryPointQueryResult found_get = cudaDriverEntryPointSymbolNotFound;
    cudaDriverEntryPointQueryResult found_set = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault,
                                         &found_get) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault,
                                         &found_set) == cudaSuccess &&
        found_get == cudaDriverEntryPointSuccess && found_set == cudaDriverEntryPointSuccess) {
      c.get = reinterpret_cast<CUresult (*)(CUcontext*)>(get);
      c.set = reinterpret_cast<CUresult (*)(CUcontext)>(set);
    }
    (void)cudaGetLastError();
    return c;
  }();
  return calls;
}

}  // namespace

ScopedDevice::ScopedDevice(int device) {
  const ContextCalls& calls = Calls();
  CUcontext previous = nullptr;
  const bool exact = calls.get != nullptr && calls.get(&previous) == CUDA_SUCCESS;
  if (!exact || previous != nullptr) {
    // A context is current (or the driver's calls are unavailable): is it `device`'s?
    error_ = cudaGetDevice(&previous_device_);
    if (error_ != cudaSuccess) {
      (void)cudaGetLastError();
      status_ = CudaStatus(error_, "cudaGetDevice");
      return;
    }
    if (previous_device_ == device) return;
  }
  error_ = cudaSetDevice(device);
  if (error_ != cudaSuccess) {
    (void)cudaGetLastError();
    status_ = CudaStatus(error_, "cudaSetDevice", absl::StrCat("device ", device));
    return;
  }
  restore_ = true;
  exact_ = exact;
  previous_context_ = previous;
}

ScopedDevice::~ScopedDevice() {
  if (!restore_) return;
  if (exact_) {
    Calls().set(static_cast<CUcontext>(previous_context_));  // a context that was valid, or none
  } else if (cudaSetDevice(previous_device_) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

}  // namespace ferry
