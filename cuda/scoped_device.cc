#include "cuda/scoped_device.h"

#include <cuda.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_status.h"

namespace ferry {
namespace {

using GetContext = CUresult (*)(CUcontext*);
using SetContext = CUresult (*)(CUcontext);

// cuCtxGetCurrent and cuCtxSetCurrent from the driver, looked up once; null where the
// runtime cannot reach them (no driver).
struct DriverContextCalls {
  GetContext get = nullptr;
  SetContext set = nullptr;
};

const DriverContextCalls& Driver() {
  static const DriverContextCalls calls = [] {
    DriverContextCalls c;
    void* get = nullptr;
    void* set = nullptr;
    cudaDriverEntryPointQueryResult found_get = cudaDriverEntryPointSymbolNotFound;
    cudaDriverEntryPointQueryResult found_set = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault,
                                         &found_get) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault,
                                         &found_set) == cudaSuccess &&
        found_get == cudaDriverEntryPointSuccess && found_set == cudaDriverEntryPointSuccess) {
      c.get = reinterpret_cast<GetContext>(get);
      c.set = reinterpret_cast<SetContext>(set);
    }
    (void)cudaGetLastError();
    return c;
  }();
  return calls;
}

bool RealGetContext(void** context) {
  const GetContext get = Driver().get;
  CUcontext current = nullptr;
  if (get == nullptr || get(&current) != CUDA_SUCCESS) return false;
  *context = current;
  return true;
}

bool RealSetContext(void* context) {
  const SetContext set = Driver().set;
  return set != nullptr && set(static_cast<CUcontext>(context)) == CUDA_SUCCESS;
}

constexpr DeviceCalls kRealCalls = {RealGetContext, RealSetContext, cudaGetDevice, cudaSetDevice};

std::atomic<const DeviceCalls*> active_calls{&kRealCalls};

}  // namespace

void SetDeviceCallsForTesting(const DeviceCalls* calls) {
  active_calls.store(calls != nullptr ? calls : &kRealCalls, std::memory_order_release);
}

ScopedDevice::ScopedDevice(int device) : calls_(*active_calls.load(std::memory_order_acquire)) {
  void* previous = nullptr;
  const bool exact = calls_.get_context(&previous);
  if (!exact || previous != nullptr) {
    // A context is current (or the driver's calls are unavailable): is it `device`'s?
    error_ = calls_.get_device(&previous_device_);
    if (error_ != cudaSuccess) {
      (void)cudaGetLastError();
      status_ = CudaStatus(error_, "cudaGetDevice");
      return;
    }
    if (previous_device_ == device) return;
  }
  error_ = calls_.set_device(device);
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
    calls_.set_context(previous_context_);  // a context that was current, or none
  } else if (calls_.set_device(previous_device_) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

}  // namespace ferry
