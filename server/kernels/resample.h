// The GPU half of the geometric transform: a batch of whole decoded images (nvJPEG's
// output: RGB HWC uint8 in device memory) resampled through their windows to size x size,
// byte for byte what the CPU path writes (ResampleWindow in server/decode/image_transform.h:
// PIL BILINEAR in 14-bit fixed point, horizontal pass rounded to uint8, then vertical).
// The windows come from PlanSourceWindow, with the CPU path's random draws, so a sample's
// pixels do not depend on which decoder took it.
//
//   std::vector<ResampleJob> jobs(batch);  // on the host, from each image's SourceWindow
//   for (...) FERRY_RETURN_IF_ERROR(CheckResampleJob(jobs[i]));
//   ... copy jobs to `device_jobs` on the stream ...
//   FERRY_RETURN_IF_ERROR(LaunchResampleWindows(device_jobs, batch, 224, stream.get()));
//
// Needs no scratch memory and allocates nothing: each thread block recomputes the filters
// of its output tile (resample.cu says how). This header includes no CUDA header.
#ifndef FERRY_SERVER_KERNELS_RESAMPLE_H_
#define FERRY_SERVER_KERNELS_RESAMPLE_H_

#include "absl/status/status.h"
// ResampleJob: plain bytes, apart so that nvcc reads it without abseil.
#include "server/kernels/internal/resample_job.h"

namespace ferry {

// Largest output side (ImageTransform's limit).
inline constexpr int kMaxResampleSize = 16384;

// OK when the kernel resamples `job` as ResampleWindow does: src and dst non-null, width
// and height >= 1, pitch >= 3 * width, 0 <= clamp_x0 < clamp_x1 <= width, 0 <= clamp_y0 <
// clamp_y1 <= height, and x0 < x1, y0 < y1, all four finite (PlanSourceWindow's windows
// always are). Otherwise INVALID_ARGUMENT naming the field and its value. The kernel makes
// the same checks on the device and writes zeros for a job that fails them (nothing at all
// when dst is null), never reading outside [src, src + height * pitch).
absl::Status CheckResampleJob(const ResampleJob& job);

// Enqueues on `stream` (a cudaStream_t) the resampling of jobs[0, count) (device memory of
// the stream's device) to size x size each: dst = ResampleWindow(src through the window),
// mirrored when job.mirror, equal byte for byte. Sources may be shared between jobs;
// destinations must not overlap each other or any source. Returns once the kernel is
// queued. INVALID_ARGUMENT for count < 0, size outside [1, kMaxResampleSize], or null jobs
// (unless count is 0); an empty batch enqueues nothing.
//
// Speed: a vertical downscale of up to about 5x keeps the horizontal pass in shared memory
// and one of up to about 31x per axis keeps the filters' weights there; larger ones (a huge
// image to a small size) take slower paths with the same result (resample.cu).
absl::Status LaunchResampleWindows(const ResampleJob* jobs, int count, int size, void* stream);

}  // namespace ferry

#endif  // FERRY_SERVER_KERNELS_RESAMPLE_H_
