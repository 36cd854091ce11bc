// The plain-bytes job of resample.h (one image through its window), kept apart from that
// header so that resample.cu, which nvcc compiles without abseil, reads the same definition
// as the launcher and the code that builds jobs on the host.
#ifndef FERRY_SERVER_KERNELS_INTERNAL_RESAMPLE_JOB_H_
#define FERRY_SERVER_KERNELS_INTERNAL_RESAMPLE_JOB_H_

#include <cstdint>

namespace ferry {

// One image resampled through its window (server/decode/image_transform.h's SourceWindow),
// all in plain bytes: jobs may be written on the host and copied to the device in one go.
struct ResampleJob {
  uint64_t src = 0;  // device address of RGB HWC uint8, `pitch` bytes per row
  uint64_t dst = 0;  // device address of size x size x 3 uint8 HWC, tightly packed
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;  // SourceWindow's continuous interval
  int32_t width = 0, height = 0, pitch = 0;
  int32_t clamp_x0 = 0, clamp_x1 = 0, clamp_y0 = 0, clamp_y1 = 0;  // SourceWindow's clamps
  int32_t mirror = 0;                                              // nonzero: flip
};
static_assert(sizeof(ResampleJob) == 80, "ResampleJob is 80 plain bytes");

}  // namespace ferry

#endif  // FERRY_SERVER_KERNELS_INTERNAL_RESAMPLE_JOB_H_
