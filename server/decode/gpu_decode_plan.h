// How one image of a batch reaches the GPU when the job decodes JPEGs there
// (gpu_decode_split.h): a worker that routes the image writes the file's bytes into its row
// of the internal field kGpuDecodeJpegField (kGpuDecodeJpegRowBytes a row, whatever the
// crop's size: files are as large for a crop of 64 as for one of 224) and this plan into the
// row of the internal field kGpuDecodePlanField; the device stage decodes those bytes
// (nvJPEG, from the host slot) and resamples the window into the image row, so that what
// follows (normalize, photometric ops) sees the pixels the worker would have written. A plan
// with on_gpu == 0 marks a row the worker decoded itself, and says why (cpu_reason), for the
// GPU's totals in status. Plain bytes: it crosses PCIe with the batch; the JPEG field, the
// slot's last, does not.
#ifndef FERRY_SERVER_DECODE_GPU_DECODE_PLAN_H_
#define FERRY_SERVER_DECODE_GPU_DECODE_PLAN_H_

#include <cstdint>

namespace ferry {

struct GpuDecodePlan {
  uint32_t on_gpu = 0;  // 1: the JPEG row holds `jpeg_bytes` bytes of a JPEG
  uint32_t jpeg_bytes = 0;
  int32_t width = 0;  // the JPEG's size as stored (files EXIF turns stay on the CPU)
  int32_t height = 0;
  double x0 = 0, x1 = 0, y0 = 0, y1 = 0;  // SourceWindow (image_transform.h)
  int32_t clamp_x0 = 0, clamp_x1 = 0, clamp_y0 = 0, clamp_y1 = 0;
  int32_t mirror = 0;
  // on_gpu == 0: a GpuJpegReject (kNone: the split gave the file to the workers) or
  // kPlanNotJpeg.
  int32_t cpu_reason = 0;
};
inline constexpr int32_t kPlanNotJpeg = -1;
static_assert(sizeof(GpuDecodePlan) == 72);

// The largest JPEG the GPU decodes: a row of kGpuDecodeJpegField. Larger files stay on the
// workers (GpuJpegReject::kTooLarge). 256 KiB holds about 97% of an ImageNet-like corpus
// (110 KiB mean).
inline constexpr size_t kGpuDecodeJpegRowBytes = size_t{256} << 10;

}  // namespace ferry

#endif  // FERRY_SERVER_DECODE_GPU_DECODE_PLAN_H_
