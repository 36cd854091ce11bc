// CUDA runtime errors as absl::Status: the one place where ferry turns a cudaError_t into a
// status, so every CUDA failure reads the same way in logs and RPC replies:
//
//   cudaMalloc(1099511627776 bytes on device 0): cudaErrorMemoryAllocation (out of memory)
//
// For code that calls the CUDA runtime itself (ferry_cuda, ferryd's kernel launchers in
// server/kernels/, the client's CUDA ring): this header includes the CUDA runtime's, which
// cuda_resources.h keeps away from its users.
//
//   return CudaStatus(cudaMalloc(&p, n), "cudaMalloc", absl::StrCat(n, " bytes"));
#ifndef FERRY_CUDA_CUDA_STATUS_H_
#define FERRY_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ferry {

// OK for cudaSuccess. Otherwise a status whose message names `call` (with `detail` in
// parentheses when given), the error's name (cudaGetErrorName) and its description.
// Codes: out of memory (device or pinned host) -> RESOURCE_EXHAUSTED; bad arguments or
// device ordinals -> INVALID_ARGUMENT; no device, no or too old a driver, IPC or a feature
// the system does not allow -> FAILED_PRECONDITION; range already registered ->
// ALREADY_EXISTS; cudaErrorNotReady -> UNAVAILABLE; everything else (launch failures,
// illegal addresses: the context is lost) -> INTERNAL.
// Pure: touches no device and does not clear the runtime's last error.
absl::Status CudaStatus(cudaError_t error, const char* call, absl::string_view detail = {});

// The canonical code CudaStatus uses for `error` (kOk for cudaSuccess).
absl::StatusCode CudaErrorCode(cudaError_t error);

}  // namespace ferry

#endif  // FERRY_CUDA_CUDA_STATUS_H_
