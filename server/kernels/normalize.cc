// The launchers of normalize.h: argument checks, the stream's device, and statuses. The
// kernels are in normalize.cu.
#include "server/kernels/normalize.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "cuda/cuda_status.h"
#include "cuda/scoped_device.h"
#include "server/kernels/internal/kernels.h"
#include "server/kernels/internal/stream_device.h"

namespace ferry {
absl::Status LaunchNormalizeImages(const uint8_t* src_hwc, void* dst_chw, OutputDType dtype,
                                   int batch, int height, int width, const float mean[3],
                                   const float std[3], void* stream) {
  if (batch < 0 || height < 0 || width < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot normalise a batch of ", batch, " images of ", height, "x", width));
  }
  if (batch == 0 || height == 0 || width == 0) return absl::OkStatus();
  if (src_hwc == nullptr || dst_chw == nullptr || mean == nullptr || std == nullptr) {
    return absl::InvalidArgumentError(
        "LaunchNormalizeImages: null source, destination, mean or std");
  }
  cuda_internal::NormalizeParams params;
  for (int c = 0; c < 3; ++c) {
    if (!std::isfinite(mean[c]) || !std::isfinite(std[c]) || std[c] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("normalisation channel ", c, " has mean ",
                                                     mean[c], " and std ", std[c],
                                                     "; both must be finite and std non-zero"));
    }
    // Folded in double, rounded once: y = x * scale + bias.
    params.scale[c] = static_cast<float>(1.0 / (255.0 * static_cast<double>(std[c])));
    params.bias[c] = static_cast<float>(-static_cast<double>(mean[c]) / std[c]);
  }
  const cuda_internal::NormalizeOut out = cuda_internal::ToNormalizeOut(dtype);
  FERRY_ASSIGN_OR_RETURN(const int device, cuda_internal::StreamDevice(stream));
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
  const bool wide_out = dst_dtype == TokenOutput::kInt64;
  cuda_internal::WidenKind kind = cuda_internal::WidenKind::kU16ToI32;
  switch (src_dtype) {
    case TokenInput::kUint16:
      kind = wide_out ? cuda_internal::WidenKind::kU16ToI64 : cuda_internal::WidenKind::kU16ToI32;
      break;
    case TokenInput::kUint32:
      kind = wide_out ? cuda_internal::WidenKind::kU32ToI64 : cuda_internal::WidenKind::kU32ToI32;
      break;
    case TokenInput::kInt32:
      if (!wide_out) {
        return absl::InvalidArgumentError("LaunchWidenTokens: int32 -> int32 is no widening");
      }
      kind = cuda_internal::WidenKind::kI32ToI64;
      break;
  }
  FERRY_ASSIGN_OR_RETURN(const int device, cuda_internal::StreamDevice(stream));
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  const cudaError_t error =
      cuda_internal::EnqueueWidenTokens(src, dst, kind, count, static_cast<cudaStream_t>(stream));
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaStatus(error, "widen-tokens kernel launch",
                    absl::StrCat(count, " tokens on device ", device));
}

namespace {

// The checks both gather launchers share; OK for a launch to go ahead.
absl::Status CheckGather(const GatherSource& source, const void* indices, int64_t count,
                         const void* dst, int blocks) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("cannot gather ", count, " rows"));
  if (source.records == nullptr || indices == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError("gather: null records, indices or destination");
  }
  if (source.row_bytes == 0 || blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather: rows of ", source.row_bytes, " bytes on ", blocks, " blocks"));
  }
  if (source.row_bytes >= (uint64_t{1} << 32) ||
      static_cast<uint64_t>(count) * source.row_bytes >= (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat("gather: ", count, " rows of ", source.row_bytes,
                                                   " bytes make a batch of 4 GiB or more"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchGatherRows(const GatherSource& source, const int64_t* indices, int64_t count,
                              void* dst, int blocks, void* stream) {
  if (count == 0) return absl::OkStatus();
  FERRY_RETURN_IF_ERROR(CheckGather(source, indices, count, dst, blocks));
  FERRY_ASSIGN_OR_RETURN(const int device, cuda_internal::StreamDevice(stream));
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  const cudaError_t error = cuda_internal::EnqueueGatherRows(
      source.records, source.num_records, source.row_bytes, indices, count, dst, blocks,
      static_cast<cudaStream_t>(stream));
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaStatus(
      error, "gather-rows kernel launch",
      absl::StrCat(count, " rows of ", source.row_bytes, " bytes on device ", device));
}

absl::Status LaunchGatherRowsIndexedFromHost(const GatherSource& source,
                                             absl::Span<const int64_t> indices, void* dst,
                                             int64_t* index_out, int blocks, void* stream) {
  static_assert(kMaxGatherRowsPerLaunch == cuda_internal::kMaxGatherParamRows);
  const int64_t count = static_cast<int64_t>(indices.size());
  if (count == 0) return absl::OkStatus();
  FERRY_RETURN_IF_ERROR(CheckGather(source, indices.data(), count, dst, blocks));
  if (count > kMaxGatherRowsPerLaunch) {
    return absl::InvalidArgumentError(absl::StrCat("gather: ", count,
                                                   " rows with host indices; at most ",
                                                   kMaxGatherRowsPerLaunch, " per launch"));
  }
  FERRY_ASSIGN_OR_RETURN(const int device, cuda_internal::StreamDevice(stream));
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  const cudaError_t error = cuda_internal::EnqueueGatherRowsIndexedFromHost(
      source.records, source.num_records, source.row_bytes, indices.data(), count, dst, index_out,
      blocks, static_cast<cudaStream_t>(stream));
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaStatus(
      error, "gather-rows kernel launch",
      absl::StrCat(count, " rows of ", source.row_bytes, " bytes on device ", device));
}

}  // namespace ferry
