// A DeliveryRing whose consumer reads device slots: each filled host slot is copied (or its
// records gathered) into a free device slot by a DeviceStage, and the device slot is
// delivered once the stage reports the copy complete. With a CudaStage this is the CUDA
// ring (server/gpu/cuda_stage.h); the pipeline tests run it over a fake stage.
//
// Device slot life cycle: FREE -> COPYING (copy ordered) -> READY (the stage reported it)
// -> LEASED (sent to the consumer) -> RELEASING (released, its released signal not yet seen
// complete; device_stage.h says why the host waits for it) -> FREE. A release marked
// `complete` skips RELEASING.
//
// Which batches are copied when: a filled batch is copied even while an earlier one still
// fills (a straggling task must not hold the copy engine and every batch behind it), as
// long as enough free device slots stay for the earlier batches still without one: were
// later batches to take them all, an earlier one could never be copied and none behind it
// delivered. Which batches are gathered: PlanBatch asks the stage whether it can gather and
// the GatherPolicy (gather_policy.h) whether this batch should be; whether the device
// decodes a batch's JPEGs, the stage alone (DeviceStage::PlanGpuDecode).
//
//   FERRY_ASSIGN_OR_RETURN(std::unique_ptr<DeviceStage> stage, gpus->MakeStage(...));
//   auto ring = std::make_unique<DeviceRing>(std::move(stage));
//
// Who starts the copies: the thread that calls Flush, or, when the stage's StartCopy may wait
// for the device (DeviceStage::start_copy_waits), the ring's own copy thread, which Flush
// only wakes; a copy that failed there is returned by the next Flush.
//
// Thread-safety: thread-safe; its lock is taken inside the pipeline's (delivery_ring.h).
#ifndef FERRY_SERVER_TRANSPORT_DEVICE_RING_H_
#define FERRY_SERVER_TRANSPORT_DEVICE_RING_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/stats/latency_histogram.h"
#include "server/transport/delivery_ring.h"
#include "server/transport/device_stage.h"
#include "server/transport/gather_policy.h"

namespace ferry {

class DeviceRing final : public DeliveryRing {
 public:
  // Times (leases, copy latency, stalls) are read on `clock`, which must outlive the ring.
  explicit DeviceRing(std::unique_ptr<DeviceStage> stage, const Clock& clock = Clock::Real());
  ~DeviceRing() override;

  void SetListener(Listener listener) override;
  int num_slots() const override { return num_slots_; }
  int gathered_field() const override { return gathered_field_; }
  BatchPlan PlanBatch() override ABSL_LOCKS_EXCLUDED(mutex_);
  void ReportConsumerWait(absl::Duration waited, absl::Duration interval) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  void Enqueue(const Batch& batch) override ABSL_LOCKS_EXCLUDED(mutex_);
  void Filled(uint64_t ticket) override ABSL_LOCKS_EXCLUDED(mutex_);
  std::optional<uint32_t> TakeReady(uint64_t ticket, int64_t seq) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  void DropQueued(std::vector<int>* freed) override ABSL_LOCKS_EXCLUDED(mutex_);
  absl::Status Release(uint32_t slot, int64_t seq, bool complete, std::vector<int>* freed) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  int leased() const override ABSL_LOCKS_EXCLUDED(mutex_);
  absl::Status OpenConsumer(const std::vector<std::string>& released_events) override
      ABSL_LOCKS_EXCLUDED(mutex_);
  void CloseConsumer(std::vector<int>* freed) override ABSL_LOCKS_EXCLUDED(mutex_);
  absl::Status Flush() override ABSL_LOCKS_EXCLUDED(mutex_);
  void StopDeviceWork() override ABSL_LOCKS_EXCLUDED(mutex_);
  void Describe(ferry::v1::AttachResponse* response) const override;
  void FillStatus(ferry::v1::RankStatus* status) const override ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  enum class State { kFree, kCopying, kReady, kLeased, kReleasing };
  struct DeviceSlot {
    State state = State::kFree;
    int64_t seq = -1;    // while leased
    uint64_t token = 0;  // names the copy or release in progress; stale reports differ
    absl::Time since;    // of kFree or kLeased, for the time totals in status
    absl::Time ordered;  // of the copy into it, for copy_latency
  };
  struct Queued {  // a batch enqueued and not taken, in delivery order
    uint64_t ticket;
    int host_slot;
    uint32_t num_samples;
    bool gather;
    bool filled = false;
    int device_slot = -1;  // once its copy is ordered
    absl::Time filled_at;  // for copy_wait_seconds
  };
  struct CopyOrder {  // a copy decided under the lock, started by Flush after it
    int host_slot;
    int device_slot;
    uint32_t num_samples;
    bool gather;
    uint64_t token;
  };

  // Whether the batch being planned is gathered (the stage can, and the policy says so).
  bool GatherNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Assigns free device slots to filled batches (see the class comment) and queues their
  // copies in copy_orders_ for Flush.
  void OrderCopiesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void FreeLocked(DeviceSlot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The stage's reports.
  void OnDeviceSlotReady(int device_slot, uint64_t token) ABSL_LOCKS_EXCLUDED(mutex_);
  void OnDeviceSlotReleased(int device_slot, uint64_t token) ABSL_LOCKS_EXCLUDED(mutex_);
  void Progress();
  // Starts the copies in copy_orders_ and any ordered meanwhile, on the calling thread,
  // unless another thread is at it (flushing_). The first failure stops the ring.
  absl::Status StartOrderedCopies() ABSL_LOCKS_EXCLUDED(mutex_);
  // The copy thread's loop (start_copy_waits stages).
  // `alive` turns false when the ring is destroyed (maybe by the listener, on that thread).
  void RunCopyThread(const std::atomic<bool>& alive) ABSL_LOCKS_EXCLUDED(mutex_);

  // Constant after construction (listener_: after SetListener, before any other call).
  const Clock& clock_;
  const int num_slots_;
  const int gathered_field_;
  Listener listener_;

  mutable absl::Mutex mutex_;
  std::deque<Queued> queued_ ABSL_GUARDED_BY(mutex_);
  std::vector<DeviceSlot> slots_ ABSL_GUARDED_BY(mutex_);
  GatherPolicy gather_policy_ ABSL_GUARDED_BY(mutex_);
  uint64_t tokens_ ABSL_GUARDED_BY(mutex_) = 0;
  std::vector<CopyOrder> copy_orders_ ABSL_GUARDED_BY(mutex_);  // in the order decided
  bool flushing_ ABSL_GUARDED_BY(mutex_) = false;  // a thread is starting copies in Flush
  bool stopped_ ABSL_GUARDED_BY(mutex_) = false;   // StopDeviceWork, or a copy failed
  // A copy that failed on the copy thread, for the next Flush to return (then OK again).
  absl::Status copy_failure_ ABSL_GUARDED_BY(mutex_);
  bool quitting_ ABSL_GUARDED_BY(mutex_) = false;  // the destructor stops the copy thread
  // Mirror of stopped_, read by the flushing thread before each StartCopy of the orders it
  // took before a stop.
  std::atomic<bool> copies_stopped_{false};
  // Metrics.
  uint64_t releases_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t releases_complete_ ABSL_GUARDED_BY(mutex_) = 0;  // of those, with `complete`
  absl::Duration lease_time_ ABSL_GUARDED_BY(mutex_);
  absl::Duration copy_wait_time_ ABSL_GUARDED_BY(mutex_);
  absl::Duration device_idle_time_ ABSL_GUARDED_BY(mutex_);
  // From a copy ordered (under the lock; Flush starts it right after) to the stage's report
  // that it is complete (RankStatus.copy_latency). Lock-free.
  LatencyHistogram copy_latency_;

  // Last: destroyed first, so no report of it runs into a ring being destroyed.
  const std::unique_ptr<DeviceStage> stage_;
  const std::shared_ptr<std::atomic<bool>> alive_ = std::make_shared<std::atomic<bool>>(true);
  std::thread copy_thread_;  // start_copy_waits stages only; joined by the destructor
};

}  // namespace ferry

#endif  // FERRY_SERVER_TRANSPORT_DEVICE_RING_H_
