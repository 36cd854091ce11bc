// The CUDA GpuProvider (server/transport/gpu_provider.h): lists the GPUs this ferryd can
// use, resolves a job's device string to one of them, makes each rank's CudaStage within
// the daemon-wide pinned budget and the GPU's device budget, and reports per-GPU status.
// The dataset mappings registered for the page-cache gather are shared by every stage it
// makes (PinnedMappings).
//
//   std::unique_ptr<GpuProvider> gpus = MakeCudaGpuProvider(topology, &pinned_budget,
//                                                           config.device_memory_budget_bytes,
//                                                           config_path, gather_options);
//
// Thread safety: thread-safe (the GpuProvider contract); the list of GPUs is constant after
// construction. Every stage it made must go before it.
#ifndef FERRY_SERVER_GPU_CUDA_GPU_PROVIDER_H_
#define FERRY_SERVER_GPU_CUDA_GPU_PROVIDER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/v1/ferry.pb.h"
#include "server/gpu/gpu_counters.h"
#include "server/gpu/pinned_mappings.h"
#include "server/memory/memory_budget.h"
#include "server/memory/shared_slab.h"
#include "server/pipeline/job.h"
#include "server/topology/topology.h"
#include "server/transport/device_stage.h"
#include "server/transport/gather_options.h"
#include "server/transport/gpu_provider.h"

namespace ferry {

class CudaGpuProvider final : public GpuProvider {
 public:
  // Lists the GPUs (CUDA ordinals with their PCI bus ids and NUMA nodes from `topology`).
  // `pinned` (daemon-wide, must outlive this) bounds the slabs and dataset mappings
  // registered; each GPU gets a device budget of `device_budget_bytes`, or a quarter of its
  // memory when 0. `config_path` is named in budget errors. With no usable GPU it still
  // answers, refusing cuda devices with the reason.
  CudaGpuProvider(const Topology& topology, MemoryBudget* pinned, uint64_t device_budget_bytes,
                  const std::string& config_path, GatherOptions gather);

  absl::StatusOr<int> Resolve(const std::string& device) const override;
  absl::Status CheckJob(const Job& job) const override;
  // nvJPEG loads (NvJpegLibrary::Load), or its message.
  absl::Status GpuDecodeAvailable() const override;
  int NumaNode(int ordinal) const override { return gpus_.at(ordinal).numa_node; }
  absl::StatusOr<std::unique_ptr<DeviceStage>> MakeStage(const Job& job, int ordinal,
                                                         const SharedSlab& slab,
                                                         int num_slots) override;
  void FillStatus(ferry::v1::DaemonStatus* status) const override;

 private:
  struct Gpu {
    int ordinal = 0;
    std::string name;
    std::string pci_bus_id;
    int numa_node = -1;
    std::vector<int> worker_cpus;
    std::unique_ptr<MemoryBudget> device_budget;
    std::shared_ptr<GpuCounters> counters = std::make_shared<GpuCounters>();
  };

  // H2D rate per GPU from the byte counter: the change since the oldest sample of the last
  // ~10 s (samples are taken when status is read), or since ferryd started. Thread-safe.
  class RateTracker {
   public:
    double Rate(int ordinal, uint64_t bytes) ABSL_LOCKS_EXCLUDED(mutex_);

   private:
    struct Sample {
      absl::Time time;
      uint64_t bytes;
    };
    absl::Mutex mutex_;
    const absl::Time start_ = absl::Now();
    absl::flat_hash_map<int, std::deque<Sample>> samples_ ABSL_GUARDED_BY(mutex_);
  };

  // "cuda:0 = <name> at <bus id>, ...", or "no GPU (<why>)", for errors.
  std::string Describe() const;

  // Constant after construction, but for the thread-safe mappings_ and rates_.
  MemoryBudget* const pinned_;
  PinnedMappings mappings_;
  const GatherOptions gather_;
  std::vector<Gpu> gpus_;
  std::string unavailable_;  // why there is no GPU, when there is none
  mutable RateTracker rates_;
};

// Creates the CudaGpuProvider (see its constructor).
std::unique_ptr<GpuProvider> MakeCudaGpuProvider(const Topology& topology,
                                                 MemoryBudget* pinned_budget,
                                                 uint64_t device_budget_bytes,
                                                 const std::string& config_path,
                                                 GatherOptions gather = {});

}  // namespace ferry

#endif  // FERRY_SERVER_GPU_CUDA_GPU_PROVIDER_H_
