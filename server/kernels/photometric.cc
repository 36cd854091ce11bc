// The launcher of photometric.h: argument checks, the stream's device, and the status. The
// kernel is in photometric.cu, the host reference in photometric_reference.cc.
#include "server/kernels/photometric.h"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "cuda/cuda_status.h"
#include "cuda/scoped_device.h"
#include "server/kernels/internal/kernels.h"
#include "server/kernels/internal/stream_device.h"

namespace ferry {

absl::Status LaunchPhotometric(const uint8_t* src_hwc, const PhotometricProgram* programs,
                               void* dst_chw, OutputDType dtype, int batch, int height, int width,
                               void* stream) {
  if (batch < 0 || height < 0 || width < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot run photometric ops on a batch of ",
                                                   batch, " images of ", height, "x", width));
  }
  if (batch == 0 || height == 0 || width == 0) return absl::OkStatus();
  if (src_hwc == nullptr || programs == nullptr || dst_chw == nullptr) {
    return absl::InvalidArgumentError("LaunchPhotometric: null source, programs or destination");
  }
  // The kernel indexes within an image in 32 bits.
  if (static_cast<int64_t>(height) * width * 3 > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("LaunchPhotometric: an image of ", height, "x",
                                                   width, " is 2 GiB or more of bytes"));
  }
  const cuda_internal::NormalizeOut out = cuda_internal::ToNormalizeOut(dtype);
  FERRY_ASSIGN_OR_RETURN(const int device, cuda_internal::StreamDevice(stream));
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  const cudaError_t error = cuda_internal::EnqueuePhotometric(
      src_hwc, programs, dst_chw, out, batch, height, width, static_cast<cudaStream_t>(stream));
  if (error == cudaSuccess) return absl::OkStatus();  // per batch: no message to format
  return CudaStatus(error, "photometric kernel launch",
                    absl::StrCat(batch, "x", height, "x", width, " on device ", device));
}

}  // namespace ferry
