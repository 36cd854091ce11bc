#include "cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace ferry {

absl::StatusCode CudaErrorCode(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return absl::StatusCode::kOk;
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidPitchValue:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorHostMemoryNotRegistered:
      return absl::StatusCode::kInvalidArgument;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNotSupported:
    case cudaErrorNotPermitted:
    case cudaErrorSystemNotReady:
    case cudaErrorMapBufferObjectFailed:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInitializationError:
      return absl::StatusCode::kFailedPrecondition;
    case cudaErrorHostMemoryAlreadyRegistered:
      return absl::StatusCode::kAlreadyExists;
    case cudaErrorNotReady:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status CudaStatus(cudaError_t error, const char* call, absl::string_view detail) {
  if (error == cudaSuccess) return absl::OkStatus();
  // Both return static strings, also for codes this runtime does not know.
  const char* name = cudaGetErrorName(error);
  const char* description = cudaGetErrorString(error);
  std::string message = call;
  if (!detail.empty()) absl::StrAppend(&message, "(", detail, ")");
  absl::StrAppend(&message, ": ", name != nullptr ? name : "unknown CUDA error", " (",
                  description != nullptr ? description : "no description", ")");
  return absl::Status(CudaErrorCode(error), message);
}

}  // namespace ferry
