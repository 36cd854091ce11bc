// The launcher of resample.h and its job check: argument checks, the stream's device, and
// the status. The kernel is in resample.cu.
#include "server/kernels/resample.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "cuda/cuda_status.h"
#include "cuda/scoped_device.h"
#include "server/kernels/internal/kernels.h"
#include "server/kernels/internal/stream_device.h"

namespace ferry {
namespace {

// 0 <= lo < hi <= extent, for the clamp range of one axis.
absl::Status CheckClamp(const char* axis, int lo, int hi, int extent) {
  if (0 <= lo && lo < hi && hi <= extent) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("resample job: clamp_", axis, " range [", lo, ", ",
                                                 hi, ") is empty or not inside [0, ", extent, ")"));
}

absl::Status CheckInterval(const char* axis, double v0, double v1) {
  if (std::isfinite(v0) && std::isfinite(v1) && v0 < v1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("resample job: window ", axis, "0 = ", v0, ", ",
                                                 axis, "1 = ", v1,
                                                 "; both must be finite, the first below the "
                                                 "second"));
}

}  // namespace

absl::Status CheckResampleJob(const ResampleJob& job) {
  if (job.src == 0 || job.dst == 0) {
    return absl::InvalidArgumentError("resample job: null source or destination");
  }
  if (job.width < 1 || job.height < 1 ||
      static_cast<int64_t>(job.pitch) < 3 * static_cast<int64_t>(job.width)) {
    return absl::InvalidArgumentError(absl::StrCat("resample job: a ", job.width, "x", job.height,
                                                   " source with a pitch of ", job.pitch,
                                                   " bytes; the pitch must be at least 3 x width"));
  }
  FERRY_RETURN_IF_ERROR(CheckClamp("x", job.clamp_x0, job.clamp_x1, job.width));
  FERRY_RETURN_IF_ERROR(CheckClamp("y", job.clamp_y0, job.clamp_y1, job.height));
  FERRY_RETURN_IF_ERROR(CheckInterval("x", job.x0, job.x1));
  return CheckInterval("y", job.y0, job.y1);
}

absl::Status LaunchResampleWindows(const ResampleJob* jobs, int count, int size, void* stream) {
  if (count < 0 || size < 1 || size > kMaxResampleSize) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resample ", count,
                                                   " windows to an output side of ", size,
                                                   " (from 1 to ", kMaxResampleSize, ")"));
  }
  if (count == 0) return absl::OkStatus();
  if (jobs == nullptr) return absl::InvalidArgumentError("LaunchResampleWindows: null jobs");
  FERRY_ASSIGN_OR_RETURN(const int device, cuda_internal::StreamDevice(stream));
  ScopedDevice scope(device);
  FERRY_RETURN_IF_ERROR(scope.status());
  const cudaError_t error =
      cuda_internal::EnqueueResampleWindows(jobs, count, size, static_cast<cudaStream_t>(stream));
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaStatus(error, "resample kernel launch",
                    absl::StrCat(count, " windows to ", size, "x", size, " on device ", device));
}

}  // namespace ferry
