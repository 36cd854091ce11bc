// The CUDA DeviceStage: per (job, rank) a ring of cudaMalloc'ed device slots on the rank's
// GPU, exported once with cudaIpcGetMemHandle, two interprocess events per slot ("ready",
// recorded here after the copy and any kernel; "released", recorded by the trainer), the
// job's host slab registered once as pinned memory, and one copy stream. Per batch, once the
// ring has seen released[d] complete: H2D (only uint8 crosses PCIe for images), optionally
// normalize to CHW floats or widen tokens, record ready[d]. A job that decodes JPEGs on
// the GPU has its GpuJpegStage decode the routed rows between the copy and the conversion. Records
// may instead be gathered from the dataset's pinned page cache (GatherOptions), on several streams
// in turn. The host never waits on the device but on the EventWatcher's thread, which reports
// progress.
//
//   FERRY_ASSIGN_OR_RETURN(std::unique_ptr<CudaStage> stage,
//                          CudaStage::Create(ordinal, pci_bus_id, job, slab, num_slots,
//                                            &pinned, &device, counters, &mappings, gather));
//   auto ring = std::make_unique<DeviceRing>(std::move(stage));
//
// Ownership: the Job and `slab` must outlive the stage (the pipeline holds both), and so
// must the budgets and the PinnedMappings (the provider's). Thread safety: as DeviceStage
// (server/transport/device_stage.h) requires; Callbacks run on the watcher's thread.
#ifndef FERRY_SERVER_GPU_CUDA_STAGE_H_
#define FERRY_SERVER_GPU_CUDA_STAGE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cuda/cuda_resources.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/sample_source.h"
#include "server/gpu/device_slot_layout.h"
#include "server/gpu/event_watcher.h"
#include "server/gpu/gpu_counters.h"
#include "server/gpu/gpu_jpeg_stage.h"
#include "server/gpu/pinned_mappings.h"
#include "server/kernels/normalize.h"
#include "server/kernels/photometric.h"
#include "server/memory/memory_budget.h"
#include "server/memory/shared_slab.h"
#include "server/pipeline/job.h"
#include "server/transport/device_stage.h"
#include "server/transport/gather_options.h"

namespace ferry {

class CudaStage final : public DeviceStage {
 public:
  // Allocates everything the stage will use on `device` (whose PCI bus id is `pci_bus_id`):
  // `num_slots` device slots within `device_budget`, their events, the copy stream, and
  // `slab` registered as pinned memory within `pinned_budget`. When the job's source can
  // be gathered and `gather` allows it, leases its mapping from `mappings` (the
  // registration may finish later: gather_ready). RESOURCE_EXHAUSTED naming the budget;
  // INVALID_ARGUMENT for what the job asks of the device side (DeviceSlotLayout::Make);
  // the CUDA error of a failed allocation.
  static absl::StatusOr<std::unique_ptr<CudaStage>> Create(
      int device, std::string pci_bus_id, const Job& job, const SharedSlab& slab, int num_slots,
      MemoryBudget* pinned_budget, MemoryBudget* device_budget,
      std::shared_ptr<GpuCounters> counters, PinnedMappings* mappings, const GatherOptions& gather);

  // Stops the watcher (no callback runs after), then waits for the streams to drain.
  ~CudaStage() override;

  int num_device_slots() const override { return static_cast<int>(slots_.size()); }
  int gathered_field() const override { return gathered_field_; }
  bool gathers_every_batch() const override { return gather_every_batch_; }
  // True once the dataset's registration is done and its device address known; from then
  // on gather_source_ is set and constant. A failed registration leaves the rank on the
  // workers' copy for good, with the reason in status and the log.
  bool gather_ready() const override;
  // With GPU JPEG decode, StartCopy waits for nvJPEG: the ring gives the stage a copy thread
  // of its own, so each GPU decodes on its own thread beside the others.
  bool start_copy_waits() const override { return jpeg_ != nullptr; }
  bool PlanGpuDecode() override { return jpeg_ != nullptr && jpeg_->RouteBatch(); }
  void ReportConsumerWait(absl::Duration waited, absl::Duration interval) override {
    if (jpeg_ != nullptr) jpeg_->ReportConsumerWait(waited, interval);
  }
  void SetCallbacks(Callbacks callbacks) override { callbacks_ = std::move(callbacks); }
  // A GPU-decoding stage probes the filled batch's routed JPEGs ahead of its StartCopy.
  void BatchFilled(int host_slot, uint32_t num_samples) override {
    if (jpeg_ != nullptr) jpeg_->ProbeAhead(host_slot, num_samples);
  }
  void BatchDropped(int host_slot) override {
    if (jpeg_ != nullptr) jpeg_->ForgetProbe(host_slot);
  }
  absl::Status StartCopy(int host_slot, int device_slot, uint32_t num_samples, bool gather,
                         uint64_t token) override;
  void WatchReleased(int device_slot, uint64_t token) override;
  bool ReleasedSignalPending(int device_slot) const override;
  // Fills AttachResponse.slot_bytes and .cuda (the slots' IPC handles, the device layout).
  void Describe(ferry::v1::AttachResponse* response) const override;
  // Refuses released events: the stage exports its own (CudaSlot.released_event).
  absl::Status OpenConsumer(const std::vector<std::string>& released_events) override;
  void CloseConsumer() override;
  void FillStatus(ferry::v1::RankStatus* status) const override;

 private:
  CudaStage() = default;

  // Gathers the source's direct rows from its pinned page cache when it has them, nothing
  // converts them, the daemon allows it, and the file fits the pinned budget; otherwise
  // workers copy them, and copy_path_note_ says why (for status, and logged). The
  // registration may still be running when this returns (gather_ready).
  void ChooseCopyPath(const Job& job, PinnedMappings* mappings, const GatherOptions& gather);

  // StartCopy's steps, in the order they enqueue work; `device_` is current.
  // The device slot is free (the ring saw its released signal complete), so the copy
  // stream never waits for the trainer's context.
  absl::Status EnqueueCopy(int host_slot, int device_slot, uint32_t num_samples, bool gather,
                           uint64_t token);
  // The stream that writes `device_slot` this time, made to wait for the slot's previous
  // write when that was on another stream.
  absl::StatusOr<CudaStream*> TakeStream(int device_slot, bool gather);
  // The batch's rows gathered from the page cache, the other fields copied from `src`.
  absl::Status EnqueueGather(CudaStream& stream, const uint8_t* src, uint8_t* dst,
                             uint32_t num_samples);
  // One copy of the host slot's rows in use, into the slot or its staging area.
  absl::Status EnqueueSlotCopy(CudaStream& stream, const uint8_t* src, uint8_t* dst,
                               uint32_t num_samples);
  // The image normalisation or token widening kernel, if the layout converts.
  absl::Status EnqueueConversion(CudaStream& stream, uint8_t* dst, uint32_t num_samples);
  // The watches that report the host slot free and the device slot ready.
  void WatchCopy(int host_slot, int device_slot, uint64_t token, bool own_copy_event);

  // Set in Create, before any other thread can see the stage, and only read after: no lock
  // guards them (the annotated state is below).
  int device_ = 0;
  std::string pci_bus_id_;
  const SlotLayout* host_ = nullptr;  // owned by the Job, which outlives the pipeline
  const uint8_t* slab_ = nullptr;
  DeviceSlotLayout layout_;
  MemoryBudget::Reservation pinned_;
  MemoryBudget::Reservation device_bytes_;
  std::optional<HostRegistration> registration_;
  std::optional<CudaStream> stream_;
  std::vector<DeviceBuffer> slots_;
  std::vector<CudaEvent> ready_;
  std::vector<MemIpcHandle> mem_handles_;
  std::vector<EventIpcHandle> ready_handles_;
  // Per device slot, exported: every consumer of the rank records them (CudaSlot). Made in
  // Create, read-only after (WatchReleased, ReleasedSignalPending, Describe).
  std::vector<CudaEvent> released_;
  std::vector<EventIpcHandle> released_handles_;
  std::vector<CudaEvent> copy_done_;  // per host slot
  // Written by StartCopy, read by FillStatus (see device_stage.h: they may overlap).
  std::atomic<uint64_t> bytes_copied_{0};
  std::atomic<uint64_t> batches_copied_{0};
  std::atomic<uint64_t> batches_gathered_{0};
  std::atomic<int64_t> enqueue_nanos_{0};
  uint64_t objects_created_ = 0;
  Callbacks callbacks_;
  std::shared_ptr<GpuCounters> counters_;
  size_t counted_pinned_ = 0;  // what this stage added to counters_->pinned_bytes
  // Page-cache gather (ChooseCopyPath): constant after Create, but for the registration's
  // outcome (gather_ready).
  std::optional<PinnedMappings::Lease> gather_lease_;
  std::vector<CudaStream> more_gather_streams_;  // besides stream_
  uint64_t gathers_enqueued_ = 0;                // StartCopy runs on one thread at a time
  // Per device slot, the stream (0: stream_, i: more_gather_streams_[i - 1]) of its last
  // write, -1 before the first; StartCopy's thread only.
  std::vector<int> slot_stream_;
  bool gather_every_batch_ = true;
  int gathered_field_ = -1;
  int index_field_ = -1;
  int gather_blocks_ = 0;
  DirectRows gather_rows_;
  std::string job_id_;
  enum GatherState { kNone, kRegistering, kReady, kFailed };
  mutable std::atomic<int> gather_state_{kNone};
  mutable absl::Mutex gather_mutex_;  // resolves the registration's outcome once
  // Set once, under gather_mutex_, before gather_state_ becomes kReady; read after seeing it.
  mutable GatherSource gather_source_;
  mutable std::string gather_note_ ABSL_GUARDED_BY(gather_mutex_);  // why it failed
  std::string copy_path_note_;  // why a gatherable dataset is not gathered (constant)
  // GPU JPEG decode, when the job routes JPEGs to the GPU; set in Create, then used by
  // StartCopy's thread only.
  std::unique_ptr<GpuJpegStage> jpeg_;
  std::unique_ptr<EventWatcher> watcher_;  // last: destroyed first
};

}  // namespace ferry

#endif  // FERRY_SERVER_GPU_CUDA_STAGE_H_
