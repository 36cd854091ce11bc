// Per-GPU totals over every CudaStage on that GPU, reported in DaemonStatus.gpus. The
// CudaGpuProvider makes one per GPU and shares it with each stage it makes and with that
// stage's EventWatcher (shared ownership, so no owner has to outlive another).
//
// Thread safety: lock-free; every field is updated and read with relaxed atomics (they are
// totals for status, ordering nothing).
#ifndef FERRY_SERVER_GPU_GPU_COUNTERS_H_
#define FERRY_SERVER_GPU_GPU_COUNTERS_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "server/decode/jpeg_header.h"

namespace ferry {

struct GpuCounters {
  // Host bytes the stages keep registered (their slabs).
  std::atomic<uint64_t> pinned_bytes{0};
  // Bytes copied to the device since ferryd started.
  std::atomic<uint64_t> bytes_to_device{0};
  // Copies enqueued whose device slot is not reported ready yet: CudaStage adds one per
  // copy, the EventWatcher takes it back when the copy's kDeviceSlotReady watch completes
  // or is dropped by the watcher's destructor.
  std::atomic<int64_t> in_flight{0};
  // Stages (ranks) on the GPU.
  std::atomic<int64_t> stages{0};
  // Images of the jobs whose JPEGs this GPU may decode (gpu_decode_split.h): decoded by its
  // JPEG decoder, and by CPUs (the workers, or the stage when nvJPEG refused), with the
  // fallbacks among the latter by GpuJpegReject, [kNumGpuJpegRejects] for files that are
  // not JPEGs ([kNone]: unused; files the split gave the workers are no fallback).
  std::atomic<int64_t> jpeg_gpu_images{0};
  std::atomic<int64_t> jpeg_cpu_images{0};
  std::array<std::atomic<int64_t>, kNumGpuJpegRejects + 1> jpeg_fallbacks{};
};

}  // namespace ferry

#endif  // FERRY_SERVER_GPU_GPU_COUNTERS_H_
