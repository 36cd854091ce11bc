// Per-GPU totals over every CudaStage on that GPU, reported in DaemonStatus.gpus. The
// CudaGpuProvider makes one per GPU and shares it with each stage it makes and with that
// stage's EventWatcher (shared ownership, so no owner has to outlive another).
//
// Thread safety: lock-free; every field is updated and read with relaxed atomics (they are
// totals for status, ordering nothing).
#ifndef FERRY_SERVER_TRANSPORT_CUDA_GPU_COUNTERS_H_
#define FERRY_SERVER_TRANSPORT_CUDA_GPU_COUNTERS_H_

#include <atomic>
#include <cstdint>

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
};

}  // namespace ferry

#endif  // FERRY_SERVER_TRANSPORT_CUDA_GPU_COUNTERS_H_
