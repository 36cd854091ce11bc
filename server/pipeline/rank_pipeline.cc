#include "server/pipeline/rank_pipeline.h"

#include <string.h>

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace ferry {
namespace {

// Bytes a task of a copy-only source copies at least: below this, handing the task to a
// worker (queue lock, wake-up) costs more than the copy (64 rows of 4 KiB token windows
// were 32 tasks a batch, and at 1 MiB batches the pool's queue bounded the batch rate).
constexpr size_t kCopyTaskBytes = 128 << 10;

size_t CopyRowsPerTask(const Job& job, int gathered_field) {
  if (!job.source().FillIsCopy()) return 1;
  size_t row_bytes = 0;
  const std::vector<FieldLayout>& fields = job.layout().fields;
  for (size_t f = 0; f < fields.size(); ++f) {
    if (static_cast<int>(f) != gathered_field) row_bytes += fields[f].row_bytes;
  }
  return std::max<size_t>(1, (kCopyTaskBytes + row_bytes - 1) / std::max<size_t>(1, row_bytes));
}

// The field named "index" (int64 []), or -1.
int IndexField(const Job& job) {
  const std::vector<FieldLayout>& fields = job.layout().fields;
  for (size_t f = 0; f < fields.size(); ++f) {
    if (fields[f].name == "index" && fields[f].dtype == ferry::v1::INT64 &&
        fields[f].row_bytes == sizeof(int64_t)) {
      return static_cast<int>(f);
    }
  }
  return -1;
}

// How many other samples a failed one may be replaced by before its row is zeroed.
constexpr int kSubstituteAttempts = 8;
// A read that failed for the machine is tried again after these waits, doubling.
constexpr absl::Duration kFirstRetryWait = absl::Milliseconds(10);
constexpr absl::Duration kLastRetryWait = absl::Seconds(1);
constexpr size_t kRateWindow = 64;

}  // namespace

absl::StatusOr<std::shared_ptr<RankPipeline>> RankPipeline::Create(
    std::shared_ptr<Job> job, int rank, int num_slots, int numa_node, WorkerPool* pool,
    MemoryBudget* budget) {
  return Create(std::move(job), rank, num_slots, numa_node, pool, budget, nullptr);
}

absl::StatusOr<std::shared_ptr<RankPipeline>> RankPipeline::Create(
    std::shared_ptr<Job> job, int rank, int num_slots, int numa_node, WorkerPool* pool,
    MemoryBudget* budget, const StageFactory& stage_factory) {
  if (num_slots < 1) return absl::InvalidArgumentError("prefetch_depth must be at least 1");
  const size_t bytes = job->layout().slot_bytes * static_cast<size_t>(num_slots);
  const std::string what =
      absl::StrCat("job ", job->identity().id, " rank ", rank, " (", num_slots, " slots of ",
                   job->layout().slot_bytes, " bytes)");
  FERRY_ASSIGN_OR_RETURN(MemoryBudget::Reservation reservation, budget->Reserve(bytes, what));
  FERRY_ASSIGN_OR_RETURN(
      SharedSlab slab,
      SharedSlab::Create(absl::StrCat(job->identity().id, "-rank", rank), bytes, numa_node));
  std::unique_ptr<DeviceStage> stage;
  if (stage_factory) {
    FERRY_ASSIGN_OR_RETURN(stage, stage_factory(slab));
  }
  const int group = pool->GroupForNode(numa_node);
  const int gathered_field = stage != nullptr ? stage->gathered_field() : -1;
  std::shared_ptr<RankPipeline> pipeline(new RankPipeline(std::move(job), rank, std::move(slab),
                                                          std::move(reservation), num_slots,
                                                          pool, group, gathered_field));
  if (stage != nullptr) {
    std::weak_ptr<RankPipeline> weak = pipeline;
    DeviceStage::Callbacks callbacks;
    callbacks.host_slot_free = [weak](int host_slot) {
      if (auto p = weak.lock()) p->OnHostSlotCopied(host_slot);
    };
    callbacks.device_slot_ready = [weak](int device_slot, uint64_t token) {
      if (auto p = weak.lock()) p->OnDeviceSlotReady(device_slot, token);
    };
    callbacks.device_slot_released = [weak](int device_slot, uint64_t token) {
      if (auto p = weak.lock()) p->OnDeviceSlotReleased(device_slot, token);
    };
    stage->SetCallbacks(std::move(callbacks));
    absl::MutexLock lock(&pipeline->mutex_);
    pipeline->device_slots_.resize(static_cast<size_t>(stage->num_device_slots()));
    pipeline->gather_policy_ = GatherPolicy(stage->num_device_slots());
    for (DeviceSlot& d : pipeline->device_slots_) d.Free(absl::Now());
    pipeline->stage_ = std::move(stage);
  }
  return pipeline;
}

RankPipeline::RankPipeline(std::shared_ptr<Job> job, int rank, SharedSlab slab,
                           MemoryBudget::Reservation reservation, int num_slots,
                           WorkerPool* pool, int group, int gathered_field)
    : job_(std::move(job)),
      rank_(rank),
      slab_(std::move(slab)),
      reservation_(std::move(reservation)),
      pool_(pool),
      group_(group),
      batches_per_epoch_(job_->sampler().batches_per_epoch()),
      gathered_field_(gathered_field),
      index_field_(IndexField(*job_)),
      copy_rows_per_task_gathered_(CopyRowsPerTask(*job_, gathered_field)),
      copy_rows_per_task_(CopyRowsPerTask(*job_, -1)),
      num_host_slots_(num_slots),
      fill_counters_(new FillCounters[static_cast<size_t>(num_slots)]),
      slots_(static_cast<size_t>(num_slots)) {}

RankPipeline::~RankPipeline() = default;

int RankPipeline::num_slots() const {
  return stage_ != nullptr ? stage_->num_device_slots() : num_host_slots_;
}

absl::Status RankPipeline::Bind(BatchConsumer* consumer, int pid,
                                const std::vector<std::string>& released_events) {
  absl::MutexLock lock(&mutex_);
  if (shutting_down_) {
    return absl::UnavailableError(
        absl::StrCat("job ", job_->identity().id, " is being deleted or ferryd is stopping"));
  }
  if (consumer_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, " of job ", job_->identity().id, " already has a consumer (pid ",
        consumer_pid_, "); each rank is consumed by one process at a time"));
  }
  if (stage_ != nullptr) {
    FERRY_RETURN_IF_ERROR(stage_->OpenConsumer(released_events));
  } else if (!released_events.empty()) {
    return absl::InvalidArgumentError(
        "released_events sent to a host-transport attach; they belong to GPU attaches only");
  }
  consumer_ = consumer;
  recent_deliveries_.clear();  // rates are of this consumer
  consumer_pid_ = pid;
  consumer_started_ = false;
  consumer_via_channel_ = consumer->via_channel();
  next_seq_ = 0;
  starved_since_ = absl::InfiniteFuture();
  return absl::OkStatus();
}

bool RankPipeline::bound() const {
  absl::MutexLock lock(&mutex_);
  return consumer_ != nullptr;
}

void RankPipeline::Unbind(BatchConsumer* consumer) {
  std::vector<WorkerPool::Task> tasks;
  {
    absl::MutexLock lock(&mutex_);
    if (consumer_ != consumer) return;
    // Wait out a delivery in progress so no callback reaches the consumer after we return.
    mutex_.Await(absl::Condition(
        +[](bool* delivering) { return !*delivering; }, &delivering_));
    consumer_ = nullptr;
    consumer_pid_ = 0;
    if (stage_ != nullptr) {
      stage_->CloseConsumer();
      // What the policy learned was about this consumer's GPU.
      gather_policy_ = GatherPolicy(static_cast<int>(device_slots_.size()));
      for (DeviceSlot& d : device_slots_) {
        // A dead consumer's work on its slots is gone with its context.
        if (d.state == SlotState::kLeased || d.state == SlotState::kReleasing) {
          d.Free(absl::Now());
          d.seq = -1;
        }
      }
      StartCopiesLocked();
    } else {
      for (Slot& s : slots_) {
        if (s.state == SlotState::kLeased) {
          s.state = SlotState::kFree;
          s.seq = -1;
        }
      }
    }
    NoteStarvationLocked();
    starved_since_ = absl::InfiniteFuture();
    ScheduleLocked(&tasks);
  }
  pool_->Submit(group_, job_->identity().serial, std::move(tasks));
  EnqueueCopies();
}

void RankPipeline::Shutdown(const absl::Status& reason) {
  {
    absl::MutexLock lock(&mutex_);
    if (shutting_down_) return;
    shutting_down_ = true;
    shutdown_reason_ = reason;
    ++generation_;
    live_generation_.store(generation_, std::memory_order_relaxed);
    // A copy ordered before now may be being started by another thread: wait for it, so
    // that the stage is never asked for a copy once Shutdown has returned.
    copy_orders_.clear();
    copies_stopped_.store(true, std::memory_order_relaxed);
    mutex_.Await(absl::Condition(
        +[](bool* enqueuing) { return !*enqueuing; }, &enqueuing_));
  }
  Deliver({});
}

absl::Status RankPipeline::StartEpoch(BatchConsumer* consumer, int64_t epoch,
                                      int64_t first_batch) {
  if (epoch < 0) return absl::InvalidArgumentError(absl::StrCat("epoch must be >= 0 (got ", epoch, ")"));
  if (first_batch < 0 || first_batch > batches_per_epoch_) {
    return absl::InvalidArgumentError(absl::StrCat("first_batch must be in [0, ",
                                                   batches_per_epoch_, "] (got ", first_batch,
                                                   ")"));
  }
  if (job_->failed()) {
    Shutdown(job_->failure());
    return absl::OkStatus();  // the consumer hears the failure through OnShutdown
  }
  std::vector<WorkerPool::Task> tasks;
  {
    absl::MutexLock lock(&mutex_);
    if (consumer_ != consumer) return absl::FailedPreconditionError("consumer is not bound");
    // Is (epoch, first_batch) exactly what comes next in the prefetched order?
    bool matches;
    if (!pending_.empty()) {
      matches = pending_.front().epoch == epoch && pending_.front().batch == first_batch;
    } else {
      matches = active_ && next_epoch_ == epoch && next_batch_ == first_batch;
    }
    if (!matches) {
      ++generation_;
      live_generation_.store(generation_, std::memory_order_relaxed);
      for (const Pending& p : pending_) {
        if (p.device_slot >= 0) {
          // Copied (or being copied) already: the device slot is simply reused; the host
          // slot comes back through OnHostSlotCopied.
          device_slots_[p.device_slot].Free(absl::Now());
        } else if (slots_[p.slot].state == SlotState::kQueued) {
          slots_[p.slot].state = SlotState::kFree;
        }
        // Filling slots are freed by OnSlotFilled when their generation turns out stale.
      }
      pending_.clear();
      next_epoch_ = epoch;
      next_batch_ = first_batch;
    }
    active_ = true;
    consumer_started_ = true;
    deliver_epoch_ = epoch;
    deliver_batch_ = first_batch;
    epoch_end_sent_ = false;
    ScheduleLocked(&tasks);
  }
  Deliver(std::move(tasks));
  return absl::OkStatus();
}

absl::Status RankPipeline::Release(BatchConsumer* consumer, uint32_t slot, int64_t seq,
                                   bool complete) {
  std::vector<WorkerPool::Task> tasks;
  {
    absl::MutexLock lock(&mutex_);
    if (consumer_ != consumer) return absl::FailedPreconditionError("consumer is not bound");
    SlotState* state;
    int64_t* leased_seq;
    if (stage_ != nullptr) {
      if (slot >= device_slots_.size()) state = nullptr;
      else {
        state = &device_slots_[slot].state;
        leased_seq = &device_slots_[slot].seq;
      }
    } else {
      if (slot >= slots_.size()) state = nullptr;
      else {
        state = &slots_[slot].state;
        leased_seq = &slots_[slot].seq;
      }
    }
    if (state == nullptr || *state != SlotState::kLeased || *leased_seq != seq) {
      return absl::InvalidArgumentError(absl::StrCat(
          "release of slot ", slot, " seq ", seq, ", which is not leased to this consumer"));
    }
    *leased_seq = -1;
    const absl::Time now = absl::Now();
    if (stage_ != nullptr) {
      // Written again only once the consumer's last use of it is over on the GPU.
      DeviceSlot& dev = device_slots_[slot];
      lease_time_ += now - dev.since;
      dev.since = now;
      dev.token = ++device_tokens_;
      ++releases_;
      if (complete) {
        dev.state = SlotState::kFree;
        ++releases_complete_;
        StartCopiesLocked();
      } else {
        dev.state = SlotState::kReleasing;
        stage_->WatchReleased(static_cast<int>(slot), dev.token);
      }
    } else {
      lease_time_ += now - slots_[slot].since;
      *state = SlotState::kFree;
    }
    ScheduleLocked(&tasks);
  }
  Deliver(std::move(tasks));
  return absl::OkStatus();
}

void RankPipeline::ScheduleLocked(std::vector<WorkerPool::Task>* tasks) {
  if (!active_ || shutting_down_) return;
  std::vector<int64_t> indices;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].state != SlotState::kFree) continue;
    if (next_batch_ >= batches_per_epoch_) {
      // Run ahead into the next epoch only; further would fill slots the trainer may never
      // ask for.
      if (next_epoch_ > deliver_epoch_) return;
      ++next_epoch_;
      next_batch_ = 0;
      if (batches_per_epoch_ == 0) return;
    }
    job_->sampler().BatchIndices(next_epoch_, rank_, next_batch_, &indices);
    Slot& slot = slots_[s];
    slot.gather = GatherNextBatchLocked();
    slot.state = SlotState::kFilling;
    slot.since = absl::Now();
    slot.generation = generation_;
    slot.epoch = next_epoch_;
    slot.batch = next_batch_;
    slot.num_samples = static_cast<uint32_t>(indices.size());
    // A task fills a run of rows: a few per worker and batch keeps every worker busy while
    // small samples (token windows) do not pay a queue round trip each; rows that are only
    // copied go at least kCopyTaskBytes to a task.
    const size_t n = indices.size();
    size_t per_task = std::max<size_t>(1, n / (2 * static_cast<size_t>(pool_->total_threads())));
    const size_t copy_rows = slot.gather ? copy_rows_per_task_gathered_ : copy_rows_per_task_;
    if (copy_rows > per_task) per_task = copy_rows;
    const size_t num_tasks = (n + per_task - 1) / per_task;
    fill_counters_[s].rows_left.store(static_cast<int>(num_tasks), std::memory_order_relaxed);
    fill_counters_[s].substitutes.store(0, std::memory_order_relaxed);
    pending_.push_back(Pending{static_cast<int>(s), -1, slot.epoch, slot.batch, slot.num_samples});
    ++next_batch_;
    std::shared_ptr<RankPipeline> self = shared_from_this();
    for (size_t begin = 0; begin < n; begin += per_task) {
      const size_t end = std::min(n, begin + per_task);
      tasks->push_back([self, s = static_cast<int>(s), gen = generation_, begin, epoch = slot.epoch,
                        gather = slot.gather,
                        rows = std::vector<int64_t>(indices.begin() + begin, indices.begin() + end)](
                           WorkerContext& context) {
        for (size_t i = 0; i < rows.size(); ++i) {
          self->FillRow(s, gen, static_cast<int>(begin + i), rows[i], epoch, gather, context);
        }
        self->OnTaskDone(s, gen);
      });
    }
  }
}

bool RankPipeline::GatherNextBatchLocked() {
  if (gathered_field_ < 0 || !stage_->gather_ready()) return false;
  if (stage_->gathers_every_batch()) return true;
  int leased = 0;
  // The latest releases (their tokens grow with each Release), newest first.
  std::array<int, GatherPolicy::kGpuBehind> latest;
  latest.fill(-1);
  for (size_t i = 0; i < device_slots_.size(); ++i) {
    const DeviceSlot& d = device_slots_[i];
    leased += d.state == SlotState::kLeased;
    if (d.state != SlotState::kReleasing) continue;
    int slot = static_cast<int>(i);
    for (int& l : latest) {
      if (l < 0 || device_slots_[l].token < device_slots_[slot].token) std::swap(l, slot);
      if (slot < 0) break;
    }
  }
  // Whether their released signals are pending is asked now, not taken from the stage's
  // reports (CudaStage's event watcher reports completions up to 100 us late, longer than
  // a 1 MiB batch lasts). Only the latest few are asked, newest first, and only until one
  // is complete: a trainer's stream completes its releases in order, so the ones before
  // a complete one are complete too. At most kGpuBehind queries under the lock.
  int pending = 0;
  for (const int slot : latest) {
    if (slot < 0 || !stage_->ReleasedSignalPending(slot)) break;
    ++pending;
  }
  return gather_policy_.GatherNext(leased, pending);
}

void RankPipeline::FillRow(int slot, uint64_t generation, int row, int64_t index, int64_t epoch,
                           bool gather, WorkerContext& context) {
  if (live_generation_.load(std::memory_order_relaxed) == generation) {
    const SlotLayout& layout = job_->layout();
    const SampleSource& source = job_->source();
    uint8_t* base = slab_.data() + static_cast<size_t>(slot) * layout.slot_bytes;
    uint8_t* rows[16];
    const size_t nfields = std::min<size_t>(layout.fields.size(), 16);
    for (size_t f = 0; f < nfields; ++f) {
      rows[f] = gather && static_cast<int>(f) == gathered_field_
                    ? nullptr  // the stage reads these rows from the dataset itself
                    : base + layout.offsets[f] + static_cast<size_t>(row) * layout.fields[f].row_bytes;
    }
    SampleSource::Scratch* scratch = context.ScratchFor(job_->identity().serial, source);
    const uint64_t seed = job_->spec().seed();
    int64_t candidate = index;
    bool filled = false;
    // SKIP policy: a sample that cannot be read is replaced by a deterministic substitute
    // (a chain of candidates drawn from (seed, index) alone), so the batch keeps its size
    // and every rank its batch count (DDP must not hang). The "index" field tells the
    // trainer which sample it really got. A bad sample is quarantined: later passes skip it
    // without reading it, and still land on the same substitute.
    for (int attempt = 0; attempt < kSubstituteAttempts && !filled; ++attempt) {
      if (!job_->IsQuarantined(candidate)) {
        absl::Status s = source.Fill(candidate, MixSeed(seed, static_cast<uint64_t>(epoch),
                                                        static_cast<uint64_t>(candidate)),
                                     absl::MakeConstSpan(rows, nfields), scratch);
        if (IsTransientReadError(s)) {
          s = RetryTransient(source, candidate, epoch, absl::MakeConstSpan(rows, nfields),
                             scratch, generation, s);
          if (IsTransientReadError(s)) return;  // the job failed, or the row is stale
        }
        if (s.ok()) {
          job_->NoteReadOk();
          filled = true;
          break;
        }
        const std::string path = source.Describe(candidate);
        job_->RecordSampleError(candidate, path, std::string(s.message()));
        if (job_->fail_on_corrupt_sample()) {
          job_->Fail(absl::DataLossError(absl::StrCat(
              "job ", job_->identity().id, " stopped at a bad sample (on_corrupt_sample=FAIL): "
              "sample ", candidate, " '", path, "': ", s.message(),
              ". Fix or remove the file, or create the job with on_corrupt_sample=SKIP")));
          return;
        }
      }
      candidate = static_cast<int64_t>(
          (static_cast<uint64_t>(candidate) + 1 + Mix64(static_cast<uint64_t>(candidate) ^ seed) %
                                                      static_cast<uint64_t>(source.size())) %
          static_cast<uint64_t>(source.size()));
    }
    if (filled && candidate != index) {
      fill_counters_[slot].substitutes.fetch_add(1, std::memory_order_relaxed);
    }
    if (!filled) {
      // Zeros, and index -1: no sample. A gathering stage reads index -1 as "write zeros"
      // (LaunchGatherRows), so the row is the same whichever path carries the batch.
      for (size_t f = 0; f < nfields; ++f) {
        if (rows[f] != nullptr) memset(rows[f], 0, layout.fields[f].row_bytes);
      }
      if (index_field_ >= 0 && static_cast<size_t>(index_field_) < nfields &&
          rows[index_field_] != nullptr) {
        const int64_t no_sample = -1;
        memcpy(rows[index_field_], &no_sample, sizeof(no_sample));
      }
      FERRY_LOG(ERROR) << "job " << job_->identity().id << ": no readable substitute for sample "
                       << index << "; row " << row << " of the batch is zeroed, its index -1";
    }
  }
}

absl::Status RankPipeline::RetryTransient(const SampleSource& source, int64_t index,
                                          int64_t epoch, absl::Span<uint8_t* const> rows,
                                          SampleSource::Scratch* scratch, uint64_t generation,
                                          absl::Status status) {
  const std::string path = source.Describe(index);
  const absl::Time give_up = absl::Now() + job_->transient_retry_limit();
  absl::Duration backoff = kFirstRetryWait;
  while (IsTransientReadError(status)) {
    job_->NoteTransientError(path, status);
    if (absl::Now() >= give_up) {
      job_->Fail(absl::Status(
          status.code(),
          absl::StrCat("job ", job_->identity().id, " stopped: reading sample ", index, " '",
                       path, "' failed for ", absl::FormatDuration(job_->transient_retry_limit()),
                       " for a reason of this machine, not of the data: ", status.message(),
                       ". Free the resource (raise ferryd's LimitNOFILE, free memory, check the "
                       "disk) and create the job again")));
      return status;
    }
    // Wait, in steps short enough that a shutdown or a seek is not held up by it.
    const absl::Time wake = absl::Now() + backoff;
    while (absl::Now() < wake) {
      if (live_generation_.load(std::memory_order_relaxed) != generation) return status;
      absl::SleepFor(std::min(absl::Milliseconds(20), wake - absl::Now()));
    }
    backoff = std::min(backoff * 2, kLastRetryWait);
    status = source.Fill(index, MixSeed(job_->spec().seed(), static_cast<uint64_t>(epoch),
                                        static_cast<uint64_t>(index)),
                         rows, scratch);
  }
  return status;
}

void RankPipeline::OnTaskDone(int slot, uint64_t generation) {
  if (fill_counters_[slot].rows_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    OnSlotFilled(slot, generation);
  }
}

void RankPipeline::OnSlotFilled(int slot, uint64_t generation) {
  // FAIL policy: a batch with a bad sample is never delivered, and neither is any batch of
  // any rank after it; the consumer's stream ends with the job's failure.
  if (job_->failed()) {
    Shutdown(job_->failure());
    return;
  }
  std::vector<WorkerPool::Task> tasks;
  {
    absl::MutexLock lock(&mutex_);
    Slot& s = slots_[slot];
    if (s.generation != generation_ || shutting_down_) {
      s.state = SlotState::kFree;  // stale: its pending entry was already dropped
      ScheduleLocked(&tasks);
    } else {
      s.state = SlotState::kQueued;
      for (Pending& p : pending_) {
        if (p.slot == slot && p.device_slot < 0) {
          p.substitutes = fill_counters_[slot].substitutes.load(std::memory_order_relaxed);
          break;
        }
      }
      const absl::Time now = absl::Now();
      fill_time_ += now - s.since;
      ++batches_filled_;
      s.since = now;
      if (stage_ != nullptr) StartCopiesLocked();
    }
  }
  Deliver(std::move(tasks));
}

void RankPipeline::StartCopiesLocked() {
  if (shutting_down_) return;
  int free_slots = 0;
  for (const DeviceSlot& dev : device_slots_) free_slots += dev.state == SlotState::kFree;
  // A filled batch is copied even while an earlier one still fills (a straggling task
  // must not hold the copy engine and every batch behind it), as long as enough free
  // device slots stay for the earlier batches still without one: were later batches to
  // take them all, an earlier one could never be copied and none behind it delivered.
  int earlier_without_slot = 0;
  int d = 0;
  for (Pending& p : pending_) {
    if (p.device_slot >= 0) continue;
    if (free_slots <= earlier_without_slot) return;
    if (slots_[p.slot].state != SlotState::kQueued) {
      ++earlier_without_slot;
      continue;
    }
    while (device_slots_[d].state != SlotState::kFree) ++d;  // free_slots > 0: one exists
    --free_slots;
    const uint64_t token = ++device_tokens_;
    copy_orders_.push_back(CopyOrder{p.slot, d, p.num_samples, slots_[p.slot].gather, token});
    const absl::Time now = absl::Now();
    slots_[p.slot].state = SlotState::kCopying;
    copy_wait_time_ += now - slots_[p.slot].since;
    DeviceSlot& dev = device_slots_[d];
    device_idle_time_ += now - dev.since;
    dev.state = SlotState::kCopying;  // kQueued once the stage reports it ready
    dev.token = token;
    dev.epoch = p.epoch;
    dev.batch = p.batch;
    dev.num_samples = p.num_samples;
    p.device_slot = d;
  }
}

void RankPipeline::EnqueueCopies() {
  if (stage_ == nullptr) return;
  std::vector<CopyOrder> orders;
  {
    absl::MutexLock lock(&mutex_);
    if (shutting_down_) copy_orders_.clear();  // nobody will receive the batch
    if (enqueuing_ || copy_orders_.empty()) return;  // the enqueuing thread takes ours too
    enqueuing_ = true;
    orders.swap(copy_orders_);
  }
  for (;;) {
    absl::Status failed;
    for (const CopyOrder& o : orders) {
      if (copies_stopped_.load(std::memory_order_relaxed)) break;
      failed = stage_->StartCopy(o.host_slot, o.device_slot, o.num_samples, o.gather, o.token);
      if (!failed.ok()) break;
    }
    absl::MutexLock lock(&mutex_);
    if (!failed.ok()) {
      // A device that fails a copy will fail the next one too: stop this rank with the
      // reason instead of handing out slots that were never written.
      FERRY_LOG(ERROR) << "job " << job_->identity().id << " rank " << rank_
                       << ": copy to the GPU failed: " << failed;
      if (!shutting_down_) {
        shutting_down_ = true;
        shutdown_reason_ = absl::Status(
            failed.code(), absl::StrCat("copy to the GPU failed: ", failed.message()));
      }
      copy_orders_.clear();
      enqueuing_ = false;
      break;
    }
    if (shutting_down_) copy_orders_.clear();
    if (copy_orders_.empty()) {
      enqueuing_ = false;
      return;
    }
    orders.clear();
    orders.swap(copy_orders_);
  }
  Deliver({});  // tells the consumer why the stream ends
}

void RankPipeline::OnHostSlotCopied(int slot) {
  std::vector<WorkerPool::Task> tasks;
  {
    absl::MutexLock lock(&mutex_);
    slots_[slot].state = SlotState::kFree;
    ScheduleLocked(&tasks);
  }
  Deliver(std::move(tasks));
}

void RankPipeline::OnDeviceSlotReady(int device_slot, uint64_t token) {
  {
    absl::MutexLock lock(&mutex_);
    DeviceSlot& dev = device_slots_[device_slot];
    // A copy abandoned by StartEpoch (the slot was freed, maybe reused) is not delivered.
    if (dev.state != SlotState::kCopying || dev.token != token) return;
    dev.state = SlotState::kQueued;
  }
  Deliver({});
}

void RankPipeline::OnDeviceSlotReleased(int device_slot, uint64_t token) {
  {
    absl::MutexLock lock(&mutex_);
    DeviceSlot& dev = device_slots_[device_slot];
    // After an Unbind the slot was reclaimed already.
    if (dev.state != SlotState::kReleasing || dev.token != token) return;
    dev.Free(absl::Now());
    StartCopiesLocked();
  }
  Deliver({});
}

void RankPipeline::NoteStarvationLocked() {
  if (starved_since_ != absl::InfiniteFuture()) {
    consumer_wait_ += absl::Now() - starved_since_;
    starved_since_ = absl::InfiniteFuture();
  }
}

bool RankPipeline::HeadDeliverableLocked() const {
  if (pending_.empty()) return false;
  const Pending& p = pending_.front();
  if (p.epoch != deliver_epoch_) return false;
  if (stage_ != nullptr) {
    return p.device_slot >= 0 && device_slots_[p.device_slot].state == SlotState::kQueued;
  }
  return slots_[p.slot].state == SlotState::kQueued;
}

void RankPipeline::Deliver(std::vector<WorkerPool::Task> tasks) {
  if (!tasks.empty()) pool_->Submit(group_, job_->identity().serial, std::move(tasks));
  EnqueueCopies();
  absl::MutexLock lock(&mutex_);
  if (delivering_) return;  // the thread delivering now will see our changes
  delivering_ = true;
  while (consumer_ != nullptr) {
    std::vector<ferry::v1::BatchReady> ready;
    bool send_end = false;
    const bool producing = active_ && consumer_started_ && !shutting_down_;
    while (producing && HeadDeliverableLocked()) {
      const Pending p = pending_.front();
      ferry::v1::BatchReady b;
      b.set_seq(next_seq_++);
      b.set_epoch(p.epoch);
      b.set_batch(p.batch);
      b.set_num_samples(p.num_samples);
      const absl::Time now = absl::Now();
      if (stage_ != nullptr) {
        b.set_slot(static_cast<uint32_t>(p.device_slot));
        device_slots_[p.device_slot].state = SlotState::kLeased;
        device_slots_[p.device_slot].seq = b.seq();
        device_slots_[p.device_slot].since = now;
      } else {
        b.set_slot(static_cast<uint32_t>(p.slot));
        slots_[p.slot].state = SlotState::kLeased;
        slots_[p.slot].seq = b.seq();
        slots_[p.slot].since = now;
      }
      pending_.pop_front();
      if (p.substitutes > 0) job_->CountSubstitutes(p.substitutes);
      ++deliver_batch_;
      ++batches_delivered_;
      samples_delivered_ += p.num_samples;
      recent_deliveries_.emplace_back(now, p.num_samples);
      if (recent_deliveries_.size() > kRateWindow) recent_deliveries_.pop_front();
      ready.push_back(std::move(b));
    }
    if (producing && deliver_batch_ >= batches_per_epoch_ && !epoch_end_sent_) {
      send_end = true;
      epoch_end_sent_ = true;
    }
    int leased = 0;
    if (stage_ != nullptr) {
      for (const DeviceSlot& d : device_slots_) leased += d.state == SlotState::kLeased;
    } else {
      for (const Slot& s : slots_) leased += s.state == SlotState::kLeased;
    }
    // A stopping pipeline ends the stream once the consumer has given back every batch it
    // holds, so no batch in use is cut off.
    const bool send_shutdown = shutting_down_ && leased == 0 && !shutdown_sent_;
    if (send_shutdown) shutdown_sent_ = true;
    if (!ready.empty()) NoteStarvationLocked();
    if (ready.empty() && !send_end && !send_shutdown) {
      // Nothing to send: the consumer waits on us if it is mid-epoch and not itself holding
      // every slot.
      if (producing && !epoch_end_sent_ && leased < num_slots() &&
          starved_since_ == absl::InfiniteFuture()) {
        starved_since_ = absl::Now();
      }
      break;
    }
    BatchConsumer* consumer = consumer_;
    const int64_t end_epoch = deliver_epoch_;
    const absl::Status shutdown_reason = shutdown_reason_;
    mutex_.Unlock();
    for (const ferry::v1::BatchReady& b : ready) consumer->OnBatchReady(b);
    if (send_end) consumer->OnEpochEnd(end_epoch);
    if (send_shutdown) consumer->OnShutdown(shutdown_reason);
    mutex_.Lock();
  }
  delivering_ = false;
}

void RankPipeline::FillStatus(ferry::v1::RankStatus* status) const {
  absl::MutexLock lock(&mutex_);
  status->set_rank(rank_);
  status->set_attached(consumer_ != nullptr);
  status->set_consumer_pid(consumer_pid_);
  status->set_batch_channel(consumer_via_channel_);
  status->set_batches_delivered(batches_delivered_);
  status->set_samples_delivered(samples_delivered_);
  // Rates are of the consumer attached now: none without one (not its predecessor's).
  if (consumer_ != nullptr && recent_deliveries_.size() >= 2) {
    const double seconds =
        absl::ToDoubleSeconds(absl::Now() - recent_deliveries_.front().first);
    uint64_t samples = 0;
    for (size_t i = 1; i < recent_deliveries_.size(); ++i) samples += recent_deliveries_[i].second;
    if (seconds > 0) {
      status->set_batches_per_second((recent_deliveries_.size() - 1) / seconds);
      status->set_samples_per_second(samples / seconds);
    }
  }
  uint32_t queued = 0, leased = 0;
  if (stage_ != nullptr) {
    for (const DeviceSlot& d : device_slots_) {
      queued += d.state == SlotState::kQueued;
      leased += d.state == SlotState::kLeased;
    }
    stage_->FillStatus(status);
    status->set_releases(releases_);
    status->set_releases_complete(releases_complete_);
  } else {
    for (const Slot& s : slots_) {
      queued += s.state == SlotState::kQueued;
      leased += s.state == SlotState::kLeased;
    }
  }
  status->set_queue_depth(queued);
  status->set_slots_leased(leased);
  status->set_slots(static_cast<uint32_t>(slots_.size()));
  absl::Duration wait = consumer_wait_;
  if (starved_since_ != absl::InfiniteFuture()) wait += absl::Now() - starved_since_;
  status->set_consumer_wait_seconds(absl::ToDoubleSeconds(wait));
  status->set_batches_filled(batches_filled_);
  status->set_fill_seconds(absl::ToDoubleSeconds(fill_time_));
  status->set_copy_wait_seconds(absl::ToDoubleSeconds(copy_wait_time_));
  status->set_lease_seconds(absl::ToDoubleSeconds(lease_time_));
  status->set_device_slot_idle_seconds(absl::ToDoubleSeconds(device_idle_time_));
  status->set_epoch(deliver_epoch_);
  status->set_next_batch(deliver_batch_);
}

}  // namespace ferry
