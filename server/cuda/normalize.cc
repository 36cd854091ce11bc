// The launchers of normalize.h: argument checks, the stream's device, and statuses. The
// kernels are in normalize.cu.
#include "server/cuda/normalize.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/cuda/cuda_status.h"
#include "server/cuda/internal/kernels.h"
#include "server/cuda/internal/scoped_device.h"

namespace ferry {
namespace {

using cuda_internal::ScopedDevice;

// Kernels launch on the current device, which must be the stream's: enter it, so a copy
// thread serving several GPUs need not track which device it touched last.
absl::StatusOr<int> StreamDevice(void* stream) {
  int device = 0;
  const cudaError_t error = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(error, "cudaStreamGetDevice");
  }
  return device;
}

}  // namespace

absl::Status LaunchNormalizeImages(const uint8_t* src_hwc, void* dst_chw, OutputDType dtype,
                                   int batch, int height, int width, const float mean[3],
                                   const float std[3], void* stream) {
  if (batch < 0 || height < 0 || width < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot normalise a batch of ", batch,
                                                   " images of ", height, "x", width));
  }
  if (batch == 0 || height == 0 || width == 0) return absl::OkStatus();
  if (src_hwc == nullptr || dst_chw == nullptr || mean == nullptr || std == nullptr) {
    return absl::InvalidArgumentError("LaunchNormalizeImages: null source, destination, mean or std");
  }
  cuda_internal::NormalizeParams params;
  for (int c = 0; c < 3; ++c) {
    if (!std::isfinite(mean[c]) || !std::isfinite(std[c]) || std[c] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "normalisation channel ", c, " has mean ", mean[c], " and std ", std[c],
          "; both must be finite and std non-zero"));
    }
    // Folded in double, rounded once: y = x * scale + bias.
    params.scale[c] = static_cast<float>(1.0 / (255.0 * static_cast<double>(std[c])));
    params.bias[c] = static_cast<float>(-static_cast<double>(mean[c]) / std[c]);
  }
  cuda_internal::NormalizeOut out = cuda_internal::NormalizeOut::kFloat32;
  switch (dtype) {
    case OutputDType::kFloat32: out = cuda_internal::NormalizeOut::kFloat32; break;
    case OutputDType::kFloat16: out = cuda_internal::NormalizeOut::kFloat16; break;
    case OutputDType::kBFloat16: out = cuda_internal::NormalizeOut::kBFloat16; break;
  }
  FERRY_ASSIGN_OR_RETURN(const int device, StreamDevice(stream));
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  const int64_t pixels = static_cast<int64_t>(height) * width;
  const cudaError_t error = cuda_internal::EnqueueNormalizeImages(
      src_hwc, dst_chw, out, batch, pixels, params, static_cast<cudaStream_t>(stream));
  if (error == cudaSuccess) return absl::OkStatus();  // per batch: no message to format
  return CudaStatus(error, "normalize kernel launch",
                    absl::StrCat(batch, "x", height, "x", width, " on device ", device));
}

absl::Status LaunchWidenTokens(const void* src, TokenInput src_dtype, void* dst,
                               TokenOutput dst_dtype, int64_t count, void* stream) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("cannot widen ", count, " tokens"));
  if (count == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError("LaunchWidenTokens: null source or destination");
  }
  const bool wide_in = src_dtype == TokenInput::kUint32;
  const bool wide_out = dst_dtype == TokenOutput::kInt64;
  const cuda_internal::WidenKind kind =
      wide_in ? (wide_out ? cuda_internal::WidenKind::kU32ToI64 : cuda_internal::WidenKind::kU32ToI32)
              : (wide_out ? cuda_internal::WidenKind::kU16ToI64 : cuda_internal::WidenKind::kU16ToI32);
  FERRY_ASSIGN_OR_RETURN(const int device, StreamDevice(stream));
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  const cudaError_t error =
      cuda_internal::EnqueueWidenTokens(src, dst, kind, count, static_cast<cudaStream_t>(stream));
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaStatus(error, "widen-tokens kernel launch",
                    absl::StrCat(count, " tokens on device ", device));
}

}  // namespace ferry
