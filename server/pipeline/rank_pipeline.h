// The producer side of one (job, rank): a ring of host slots in one shared-memory slab,
// filled by the worker pool in batch order, and delivered in that order through a
// DeliveryRing (server/transport/delivery_ring.h) to at most one bound consumer.
//
// Host slot life cycle: FREE -> FILLING (workers write rows) -> RING (complete, handed to
// the delivery ring) -> FREE (the ring gives it back: once the consumer released it, for
// the host ring; once its bytes are on the device, for a device ring). Only FREE slots are
// filled, so the prefetch depth is the slot count and nothing upstream queues without
// bound. Batches are delivered in order; the ring may let a filled batch overtake earlier
// ones still filling on its way to the consumer's slot, never at delivery.
//
// Position: the consumer asks for (epoch, first_batch) with StartEpoch; the pipeline fills
// that epoch in order and, once it has scheduled the epoch's last batch, goes on into the
// next epoch speculatively, so the first batches of epoch e+1 are ready when the trainer
// asks. A StartEpoch that does not match what was prefetched discards it (a generation
// counter invalidates rows still being written).
//
// Thread-safety: all methods are thread-safe. Consumer callbacks are made from worker threads
// or from the thread calling StartEpoch/Release, never concurrently with each other and
// never with the pipeline's lock held; after Unbind returns no callback is running or will
// run for that consumer. The ring is called under the pipeline's lock (lock order: the
// pipeline's, then the ring's), but for DeliveryRing::Flush.
//
// Data stall (RankStatus.stall_ratio, limiting_stage): over a RecentWindow of the last
// 10 s, the time the trainer waited for a batch. Exact when the client reports, with each
// Release, how long its Next blocked for that batch (`waited`); otherwise ferryd's own
// estimate, the time it had no batch to send while the consumer held fewer than all its
// slots (an upper bound: a client that prefetches may still hold batches the trainer has
// not asked for). Either way, ferryd splits its own starved time by what the batch next in
// order was doing (still filling, or filled and copying to the GPU), and each worker task
// adds its time and the part of it spent in dataset reads (ReadTally); DecideLimitingStage
// (server/stats/limiting_stage.h) names the limiting stage from those figures.
#ifndef FERRY_SERVER_PIPELINE_RANK_PIPELINE_H_
#define FERRY_SERVER_PIPELINE_RANK_PIPELINE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/dataset_fs.h"
#include "server/memory/memory_budget.h"
#include "server/memory/shared_slab.h"
#include "server/pipeline/job.h"
#include "server/pipeline/read_ahead.h"
#include "server/pipeline/worker_pool.h"
#include "server/stats/latency_histogram.h"
#include "server/stats/recent_window.h"
#include "server/transport/delivery_ring.h"

namespace ferry {

class BatchConsumer {
 public:
  virtual ~BatchConsumer() = default;
  virtual void OnBatchReady(const ferry::v1::BatchReady& batch) = 0;
  virtual void OnEpochEnd(int64_t epoch) = 0;
  // The pipeline stops (job deleted, ferryd draining) and the consumer holds no batch any
  // more, or was given the time to give them back (EndStreamIfStoppedBefore): end the
  // stream with `reason`. Called once per binding.
  virtual void OnShutdown(const absl::Status& reason) = 0;
  // For status: whether the consumer's batches travel through a shared-memory channel.
  virtual bool via_channel() const { return false; }
};

// FAILED_PRECONDITION with reason kReasonRankHeld: rank `rank` of job `job_id` is consumed
// by process `pid` (0: not known) now. Clients take a rank over on the reason.
absl::Status RankHeldError(const std::string& job_id, int rank, int pid);

class RankPipeline final : public std::enable_shared_from_this<RankPipeline> {
 public:
  // Makes the delivery ring for a slab, once the slab exists (a device ring registers it).
  // The slab's memory stays put for the pipeline's life, but the SharedSlab object itself
  // is moved: keep slab.data(), not the reference.
  using RingFactory =
      std::function<absl::StatusOr<std::unique_ptr<DeliveryRing>>(const SharedSlab& slab)>;
  // Reserves slots x slot_bytes from `budget`, allocates the slab on `numa_node`
  // (WorkerPool::MemoryNodeFor) and makes its ring with `ring` (a HostRing over the slab,
  // or a DeviceRing). The pool's workers of `numa_node` fill its batches (all, for -1).
  static absl::StatusOr<std::shared_ptr<RankPipeline>> Create(std::shared_ptr<Job> job, int rank,
                                                              int num_slots, int numa_node,
                                                              WorkerPool* pool,
                                                              MemoryBudget* budget,
                                                              const RingFactory& ring);
  ~RankPipeline();

  // FAILED_PRECONDITION when another consumer is bound (a rank has one consumer at a time).
  // `released_events`: the consumer's per-slot signals, for its ring (OpenConsumer).
  absl::Status Bind(BatchConsumer* consumer, int pid,
                    const std::vector<std::string>& released_events = {});
  // Unbinds `consumer` (no-op if not bound): every slot it leased is reclaimed.
  void Unbind(BatchConsumer* consumer);
  // Stops filling and delivering (queued rows are skipped); the bound consumer is told
  // `reason` through OnShutdown as soon as it has released every batch it holds. Called
  // when the job is deleted or ferryd drains. Idempotent. Once it returns, the ring starts
  // no more device work (DeliveryRing::StopDeviceWork).
  void Shutdown(const absl::Status& reason);
  // A consumer that keeps its batches does not keep the stream of a stopped pipeline open
  // for ever: when the pipeline stopped (Shutdown, or a failure) before `cutoff` and its
  // consumer still holds batches, it is told now. The batches stay valid in the consumer
  // (its mappings hold the memory); the slots are reclaimed once the stream ends.
  void EndStreamIfStoppedBefore(absl::Time cutoff);
  bool bound() const;
  // The process bound to this rank; 0 when none is.
  int consumer_pid() const;

  // INVALID_ARGUMENT for an epoch < 0 or first_batch outside [0, batches of the epoch].
  absl::Status StartEpoch(BatchConsumer* consumer, int64_t epoch, int64_t first_batch);

  // Deals `epoch` by `layout` (the rest of an epoch an earlier run began) until the next
  // call or ForgetResume; every other epoch is dealt whole. Null: every epoch is dealt whole.
  // Returns the epoch's batches (per rank). Batches prefetched under another layout are
  // dropped. Requires epoch >= 0.
  int64_t ResumeEpoch(int64_t epoch, std::shared_ptr<const EpochLayout> layout);
  // A new attach of the rank: forgets the last consumer's ResumeEpoch.
  void ForgetResume();
  // The layout the rank deals `epoch` by when it resumes that epoch, else null.
  std::shared_ptr<const EpochLayout> ResumeLayout(int64_t epoch) const;
  // INVALID_ARGUMENT unless `slot` is leased to the consumer under `seq`. `complete`: see
  // DeliveryRing::Release. `waited`: how long the trainer's Next blocked before this batch
  // was handed to it, when the client measured it (ConsumeRequest.Release.wait_us); from
  // the first such report on, the consumer's stall ratio is its own figure.
  absl::Status Release(BatchConsumer* consumer, uint32_t slot, int64_t seq, bool complete = false,
                       std::optional<absl::Duration> waited = std::nullopt);

  const SharedSlab& slab() const { return slab_; }
  // Slots the consumer leases (the ring's).
  int num_slots() const { return ring_->num_slots(); }
  const DeliveryRing& ring() const { return *ring_; }
  const Job& job() const { return *job_; }
  int rank() const { return rank_; }

  void FillStatus(ferry::v1::RankStatus* status) const;

 private:
  enum class SlotState { kFree, kFilling, kInRing };
  struct Slot {
    SlotState state = SlotState::kFree;
    uint64_t generation = 0;
    int64_t epoch = 0;
    int64_t batch = 0;
    uint32_t num_samples = 0;
    bool gather = false;  // the ring reads the gathered field's rows (not written here)
    // The device decodes this batch's JPEGs (DeliveryRing::BatchPlan).
    bool gpu_decode = false;
    absl::Time since;  // of the fill, for fill_seconds
  };
  // What the workers filling a host slot count without the pipeline's lock.
  struct FillCounters {
    std::atomic<int> rows_left{0};  // tasks still filling rows; the last one takes the lock
    // Rows of the current fill holding a substitute for a bad sample; counted for the job
    // (Job::CountSubstitutes) only when the batch is delivered, not for a fill abandoned.
    std::atomic<int> substitutes{0};
  };
  struct Pending {    // one scheduled batch, in delivery order
    uint64_t ticket;  // names it to the ring
    int slot;         // host slot (the ring may give it back before delivery)
    int64_t epoch;
    int64_t batch;
    uint32_t num_samples;
    bool filled = false;
    int substitutes = 0;  // rows holding a substitute, known once the slot is filled
  };

  // Bind without the log line.
  absl::Status TryBind(BatchConsumer* consumer, int pid,
                       const std::vector<std::string>& released_events) ABSL_LOCKS_EXCLUDED(mutex_);
  RankPipeline(std::shared_ptr<Job> job, int rank, SharedSlab slab,
               MemoryBudget::Reservation reservation, int num_slots, WorkerPool* pool, int group,
               std::unique_ptr<DeliveryRing> ring);
  // The ring gave host slot `slot` back.
  void OnHostSlotFree(int slot);
  void FreeHostSlotsLocked(const std::vector<int>& freed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The head of pending_'s consumer slot, leased under the next seq, when it can be sent.
  std::optional<uint32_t> TakeHeadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  // The layout `epoch` is dealt by (null: whole), and its batches per rank.
  const EpochLayout* LayoutLocked(int64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  int64_t BatchesLocked(int64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // ResumeEpoch and ForgetResume: deals `epoch` by `layout` from now on (null: every epoch
  // whole), dropping what was prefetched when that changes the deal.
  void SetResumeLocked(int64_t epoch, std::shared_ptr<const EpochLayout> layout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Forgets every batch scheduled and not yet delivered (slots still filling are freed once
  // they finish) and makes the next StartEpoch schedule from its own position.
  void DropPrefetchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  // Takes free slots and hands their rows to the pool (ScheduleSlotsLocked), then reads
  // ahead.
  void ScheduleLocked(std::vector<WorkerPool::Task>* tasks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void ScheduleSlotsLocked(std::vector<WorkerPool::Task>* tasks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Adds the files and the byte ranges of mappings read in ranges (SampleSource::FileOf,
  // RangesOf) of the batches after those scheduled to the job's ReadAhead, while the rank's
  // lane has room, at most into the epoch after the one being scheduled.
  void ReadAheadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // True when the row holds a sample (or a substitute) read now; false for a stale row,
  // a zeroed one or a failed job.
  bool FillRow(int slot, uint64_t generation, int row, int64_t index, int64_t epoch, bool gather,
               bool gpu_decode, WorkerContext& context);
  // A fill task ran from `start` to `end`, filled `filled` rows and read what the thread's
  // ReadTally grew by since `reads_before`: counted for the job and the stall window.
  void NoteTask(absl::Time start, absl::Time end, const ReadTally& reads_before, int64_t filled,
                bool gather);
  // Reads sample `index` again while it fails for a reason of the machine
  // (IsTransientReadError), waiting longer each time, and returns the first other status.
  // Gives up, returning the transient status, when the row goes stale (a seek or shutdown)
  // or when the job's transient_retry_limit() has passed; the job has then failed with the
  // reason.
  absl::Status RetryTransient(const SampleSource& source, int64_t index, int64_t epoch,
                              absl::Span<uint8_t* const> rows, SampleSource::Scratch* scratch,
                              uint64_t generation, absl::Status status);
  // Counts a finished task of `slot`; the last one completes the slot.
  void OnTaskDone(int slot, uint64_t generation);
  void OnSlotFilled(int slot, uint64_t generation);
  // Flushes the ring's device work, then sends what can be sent to the bound consumer; see
  // the class comment for the guarantees.
  void Deliver(std::vector<WorkerPool::Task> tasks) ABSL_LOCKS_EXCLUDED(mutex_);
  // Marks the pipeline stopped for `reason` (the first reason stays).
  void StopLocked(const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Ends the consumer's starvation (if it was starved) at `now`.
  void NoteStarvationLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Nothing could be sent at `now`: starts the starvation, or moves it to the cause the head
  // batch shows now.
  void NoteStarvedLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // While starved: whether the batch next in order is filled (waiting for its copy).
  bool HeadFilledLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  // The figures of window_.
  enum WindowFigure {
    kWaitReported,   // the trainer's waits, as the client reported them (Release's `waited`)
    kWaitEstimated,  // ferryd starved, the consumer holding fewer than all its slots
    kStarvedFill,    // of that, the next batch still filling
    kStarvedCopy,    // of that, the next batch filled, its copy not yet complete
    kTaskSeconds,    // worker time on this rank's fill tasks
    kReadSeconds,    // of that, in dataset file reads
    kRemoteSeconds,  // of those, waiting for remote objects to come into the node cache
    kCpuWait,        // the consumer's main thread waited for a CPU (run_delay.h)
    kNumWindowFigures
  };

  // Constant after construction.
  const std::shared_ptr<Job> job_;
  const Clock& clock_;  // the job's: every time the pipeline reads or waits on
  const int rank_;
  const SharedSlab slab_;
  const MemoryBudget::Reservation reservation_;
  WorkerPool* const pool_;
  const int group_;
  const std::unique_ptr<DeliveryRing> ring_;
  const int64_t batches_per_epoch_;  // of a fresh epoch
  // The field the ring may read from the dataset itself (DeliveryRing::gathered_field):
  // its rows are not written here for the batches it gathers. -1 when none.
  const int gathered_field_;
  // The int64 "index" field every source writes (sample_source.h), or -1: a row with no
  // readable substitute gets -1 there, so the trainer can tell it holds no sample.
  const int index_field_;
  // Rows a task fills: 1 unless the source only copies rows; for batches the ring
  // gathers, and for the others.
  const size_t copy_rows_per_task_gathered_;
  const size_t copy_rows_per_task_;
  // Bytes a filled row copies out of a mapped dataset (0 unless the source's Fill is a
  // copy): what such a row counts in bytes_read; for batches the ring gathers, and others.
  const uint64_t copied_row_bytes_gathered_;
  const uint64_t copied_row_bytes_;
  // Threads that may run this rank's tasks (its NUMA group's, or all for kAnyGroup).
  const int worker_threads_;
  // One per host slot, touched by workers without the lock (atomics).
  const std::unique_ptr<FillCounters[]> fill_counters_;

  // State below is protected by mutex_.
  mutable absl::Mutex mutex_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mutex_);  // one per host slot
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mutex_) = 1;
  bool active_ ABSL_GUARDED_BY(mutex_) = false;  // a StartEpoch was received
  // The bound consumer sent its StartEpoch: until then nothing is delivered to it (the
  // batches pending from before it bound may not be where it starts).
  bool consumer_started_ ABSL_GUARDED_BY(mutex_) = false;
  int64_t next_epoch_ ABSL_GUARDED_BY(mutex_) = 0;  // next batch to schedule
  int64_t next_batch_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t deliver_epoch_ ABSL_GUARDED_BY(mutex_) = 0;  // next batch to deliver
  int64_t deliver_batch_ ABSL_GUARDED_BY(mutex_) = 0;
  bool epoch_end_sent_ ABSL_GUARDED_BY(mutex_) = false;
  // The epoch the consumer resumes (ResumeEpoch) and its layout; -1 and null: none.
  int64_t resume_epoch_ ABSL_GUARDED_BY(mutex_) = -1;
  std::shared_ptr<const EpochLayout> resume_layout_ ABSL_GUARDED_BY(mutex_);
  BatchConsumer* consumer_ ABSL_GUARDED_BY(mutex_) = nullptr;
  int consumer_pid_ ABSL_GUARDED_BY(mutex_) = 0;
  bool consumer_via_channel_ ABSL_GUARDED_BY(mutex_) = false;  // of the last consumer
  bool delivering_ ABSL_GUARDED_BY(mutex_) = false;
  int64_t next_seq_ ABSL_GUARDED_BY(mutex_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mutex_) = false;
  // The next batch whose files go to the job's ReadAhead, for the deal of ahead_generation_.
  ReadAhead::BatchKey ahead_ ABSL_GUARDED_BY(mutex_);
  uint64_t ahead_generation_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status shutdown_reason_ ABSL_GUARDED_BY(mutex_);
  absl::Time stopped_at_ ABSL_GUARDED_BY(mutex_);
  // EndStreamIfStoppedBefore: the consumer is told though it still holds batches.
  bool stop_overdue_ ABSL_GUARDED_BY(mutex_) = false;
  bool shutdown_sent_ ABSL_GUARDED_BY(mutex_) = false;

  // Metrics.
  int64_t batches_delivered_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t samples_delivered_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t gpu_decode_batches_ ABSL_GUARDED_BY(mutex_) = 0;  // routed to the GPU's decoder
  std::deque<std::pair<absl::Time, uint32_t>> recent_deliveries_ ABSL_GUARDED_BY(mutex_);
  absl::Duration consumer_wait_ ABSL_GUARDED_BY(mutex_);
  // Where a batch's time goes (totals; see RankStatus.fill_seconds and the fields after it;
  // the ring adds its own).
  absl::Duration fill_time_ ABSL_GUARDED_BY(mutex_);
  uint64_t batches_filled_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Time starved_since_ ABSL_GUARDED_BY(mutex_) = absl::InfiniteFuture();
  // While starved: whether the head batch was filled (a copy wait), and since when so.
  bool starved_on_copy_ ABSL_GUARDED_BY(mutex_) = false;
  absl::Time starved_cause_since_ ABSL_GUARDED_BY(mutex_);
  // The bound consumer's Bind, and whether it has reported its waits (Release's `waited`).
  absl::Time consumer_since_ ABSL_GUARDED_BY(mutex_);
  // The consumer's last release (its step is the time between two), or InfinitePast.
  absl::Time last_release_ ABSL_GUARDED_BY(mutex_) = absl::InfinitePast();
  // The consumer's run-queue delay (MainThreadRunDelay) as last sampled, at most every
  // kCpuWaitSampleEvery by Release; unknown before the first sample and once a sample fails.
  struct CpuWaitSample {
    absl::Time at;
    absl::Duration delay;
    int count = 0;  // samples taken since Bind
  };
  std::optional<CpuWaitSample> cpu_wait_sample_ ABSL_GUARDED_BY(mutex_);
  bool cpu_wait_known_ ABSL_GUARDED_BY(mutex_) = true;
  // Samples the consumer's run-queue delay into window_ when the last sample is old enough.
  void SampleConsumerCpuWaitLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool wait_reported_ ABSL_GUARDED_BY(mutex_) = false;
  // Figures over the last seconds (WindowFigure); cleared at Bind. Thread-safe itself:
  // workers add to it without mutex_.
  RecentWindow window_{kNumWindowFigures};
  // From the Deliver pass that takes a batch (filled, copied, next in order) to the
  // consumer's OnBatchReady for it returning. Lock-free.
  LatencyHistogram handoff_latency_;
  // Mirror of generation_ that workers read without the lock to skip stale rows early.
  std::atomic<uint64_t> live_generation_{1};
};

}  // namespace ferry

#endif  // FERRY_SERVER_PIPELINE_RANK_PIPELINE_H_
