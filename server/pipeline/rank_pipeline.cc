#include "server/pipeline/rank_pipeline.h"

#include <string.h>

#include <algorithm>
#include <array>
#include <new>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "server/stats/limiting_stage.h"
#include "server/stats/run_delay.h"

namespace ferry {
namespace {

// SampleSource::Fill, with a failed allocation (std::bad_alloc) turned into
// RESOURCE_EXHAUSTED: a condition of the machine, not of the sample, retried as one
// (RetryTransient) until the job stops saying so. ferryd itself goes on.
absl::Status FillOrOutOfMemory(const SampleSource& source, int64_t index, uint64_t sample_seed,
                               absl::Span<uint8_t* const> rows, SampleSource::Scratch* scratch) {
  try {
    return source.Fill(index, sample_seed, rows, scratch);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory while making sample ", index,
                                                     " (", source.Describe(index), ")"));
  }
}

// Bytes a task of a copy-only source copies at least: below this, handing the task to a
// worker (queue lock, wake-up) costs more than the copy, and with small rows (token
// windows of a few KiB) the pool's queue rather than the copies would bound the batch rate.
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

// What a filled row of a copy-only source (a mapped dataset) copies out of the mapping:
// every field but the one the ring gathers. 0 for other sources (their reads are counted by
// ReadTally).
uint64_t CopiedRowBytes(const Job& job, int gathered_field) {
  if (!job.source().FillIsCopy()) return 0;
  uint64_t bytes = 0;
  const std::vector<FieldLayout>& fields = job.layout().fields;
  for (size_t f = 0; f < fields.size(); ++f) {
    if (static_cast<int>(f) != gathered_field) bytes += fields[f].row_bytes;
  }
  return bytes;
}

int WorkerThreads(const WorkerPool& pool, int group) {
  if (group < 0 || group >= static_cast<int>(pool.groups().size())) return pool.total_threads();
  return pool.groups()[group].threads;
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
    MemoryBudget* budget, const RingFactory& ring_factory) {
  if (num_slots < 1) return absl::InvalidArgumentError("prefetch_depth must be at least 1");
  const uint64_t bytes = job->layout().slab_bytes(static_cast<uint32_t>(num_slots));
  const std::string what = absl::StrCat("job ", job->identity().id, " rank ", rank, " (", num_slots,
                                        " slots of ", job->layout().slot_bytes, " bytes)");
  FERRY_ASSIGN_OR_RETURN(MemoryBudget::Reservation reservation, budget->Reserve(bytes, what));
  FERRY_ASSIGN_OR_RETURN(SharedSlab slab,
                         SharedSlab::Create(absl::StrCat(job->identity().id, "-rank", rank), bytes,
                                            pool->MemoryNodeFor(numa_node)));
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<DeliveryRing> ring, ring_factory(slab));
  const int group = pool->GroupForNode(numa_node);
  std::shared_ptr<RankPipeline> pipeline(new RankPipeline(std::move(job), rank, std::move(slab),
                                                          std::move(reservation), num_slots, pool,
                                                          group, std::move(ring)));
  std::weak_ptr<RankPipeline> weak = pipeline;
  DeliveryRing::Listener listener;
  listener.host_slot_free = [weak](int host_slot) {
    if (auto p = weak.lock()) p->OnHostSlotFree(host_slot);
  };
  listener.progress = [weak] {
    if (auto p = weak.lock()) p->Deliver({});
  };
  pipeline->ring_->SetListener(std::move(listener));
  return pipeline;
}

RankPipeline::RankPipeline(std::shared_ptr<Job> job, int rank, SharedSlab slab,
                           MemoryBudget::Reservation reservation, int num_slots, WorkerPool* pool,
                           int group, std::unique_ptr<DeliveryRing> ring)
    : job_(std::move(job)),
      clock_(job_->clock()),
      rank_(rank),
      slab_(std::move(slab)),
      reservation_(std::move(reservation)),
      pool_(pool),
      group_(group),
      ring_(std::move(ring)),
      batches_per_epoch_(job_->sampler().batches_per_epoch()),
      gathered_field_(ring_->gathered_field()),
      index_field_(IndexField(*job_)),
      copy_rows_per_task_gathered_(CopyRowsPerTask(*job_, gathered_field_)),
      copy_rows_per_task_(CopyRowsPerTask(*job_, -1)),
      copied_row_bytes_gathered_(CopiedRowBytes(*job_, gathered_field_)),
      copied_row_bytes_(CopiedRowBytes(*job_, -1)),
      worker_threads_(WorkerThreads(*pool, group)),
      fill_counters_(new FillCounters[static_cast<size_t>(num_slots)]),
      slots_(static_cast<size_t>(num_slots)) {}

RankPipeline::~RankPipeline() = default;

absl::Status RankPipeline::Bind(BatchConsumer* consumer, int pid,
                                const std::vector<std::string>& released_events) {
  absl::Status bound = TryBind(consumer, pid, released_events);
  if (bound.ok()) {
    FERRY_LOG(INFO) << "job " << job_->identity().id << " rank " << rank_ << ": consumer pid "
                    << pid << " attached (" << ring_->num_slots() << " slots"
                    << (consumer->via_channel() ? ", batch channel" : "") << ")";
  }
  return bound;
}

absl::Status RankPipeline::TryBind(BatchConsumer* consumer, int pid,
                                   const std::vector<std::string>& released_events) {
  absl::MutexLock lock(&mutex_);
  if (shutting_down_) {
    return absl::UnavailableError(
        absl::StrCat("job ", job_->identity().id, " is being deleted or ferryd is stopping"));
  }
  if (consumer_ != nullptr) return RankHeldError(job_->identity().id, rank_, consumer_pid_);
  FERRY_RETURN_IF_ERROR(ring_->OpenConsumer(released_events));
  consumer_ = consumer;
  recent_deliveries_.clear();  // rates are of this consumer
  consumer_pid_ = pid;
  consumer_started_ = false;
  consumer_via_channel_ = consumer->via_channel();
  next_seq_ = 0;
  starved_since_ = absl::InfiniteFuture();
  consumer_since_ = clock_.Now();
  last_release_ = absl::InfinitePast();
  wait_reported_ = false;
  cpu_wait_sample_.reset();
  cpu_wait_known_ = true;
  window_.Clear();  // the window is this consumer's
  return absl::OkStatus();
}

bool RankPipeline::bound() const {
  absl::MutexLock lock(&mutex_);
  return consumer_ != nullptr;
}

int RankPipeline::consumer_pid() const {
  absl::MutexLock lock(&mutex_);
  return consumer_ != nullptr ? consumer_pid_ : 0;
}

void RankPipeline::Unbind(BatchConsumer* consumer) {
  std::vector<WorkerPool::Task> tasks;
  int pid = -1;
  {
    absl::MutexLock lock(&mutex_);
    if (consumer_ != consumer) return;
    // Wait out a delivery in progress so no callback reaches the consumer after we return.
    mutex_.Await(absl::Condition(
        +[](bool* delivering) { return !*delivering; }, &delivering_));
    pid = consumer_pid_;
    consumer_ = nullptr;
    consumer_pid_ = 0;
    std::vector<int> freed;
    ring_->CloseConsumer(&freed);
    FreeHostSlotsLocked(freed);
    NoteStarvationLocked(clock_.Now());
    ScheduleLocked(&tasks);
  }
  if (pid < 0) return;  // not bound
  FERRY_LOG(INFO) << "job " << job_->identity().id << " rank " << rank_ << ": consumer pid " << pid
                  << " detached; its slots are reclaimed";
  pool_->Submit(group_, {job_->identity().serial, rank_}, std::move(tasks));
  absl::Status flushed = ring_->Flush();
  if (!flushed.ok()) {
    // Nobody is bound to be told: the next consumer hears it when it binds and starts.
    absl::MutexLock lock(&mutex_);
    FERRY_LOG(ERROR) << "job " << job_->identity().id << " rank " << rank_ << ": " << flushed;
    StopLocked(flushed);
  }
}

void RankPipeline::Shutdown(const absl::Status& reason) {
  {
    absl::MutexLock lock(&mutex_);
    if (shutting_down_) return;
    if (consumer_ != nullptr) {
      FERRY_LOG(INFO) << "job " << job_->identity().id << " rank " << rank_
                      << ": stopping, consumer pid " << consumer_pid_
                      << " is told once it has released its batches, or when its time to "
                         "release them is up: "
                      << reason;
    }
    StopLocked(reason);
    ++generation_;
    live_generation_.store(generation_, std::memory_order_relaxed);
    // Device work ordered before now may be being started by another thread: the ring
    // waits for it, so that none starts once Shutdown has returned.
    ring_->StopDeviceWork();
  }
  Deliver({});
}

absl::Status RankHeldError(const std::string& job_id, int rank, int pid) {
  return WithReason(absl::FailedPreconditionError(absl::StrCat(
                        "rank ", rank, " of job ", job_id, " already has a live consumer",
                        pid != 0 ? absl::StrCat(" (pid ", pid, ")") : "",
                        "; each rank is consumed by one process at a time")),
                    kReasonRankHeld);
}

void RankPipeline::StopLocked(const absl::Status& reason) {
  if (shutting_down_) return;
  shutting_down_ = true;
  shutdown_reason_ = reason;
  stopped_at_ = clock_.Now();
}

void RankPipeline::EndStreamIfStoppedBefore(absl::Time cutoff) {
  {
    absl::MutexLock lock(&mutex_);
    if (!shutting_down_ || shutdown_sent_ || stop_overdue_ || consumer_ == nullptr ||
        stopped_at_ > cutoff) {
      return;
    }
    stop_overdue_ = true;
    FERRY_LOG(WARNING) << "job " << job_->identity().id << " rank " << rank_ << ": consumer pid "
                       << consumer_pid_ << " still holds " << ring_->leased() << " batch(es) "
                       << absl::FormatDuration(clock_.Now() - stopped_at_)
                       << " after the job stopped; ending its stream (" << shutdown_reason_ << ")";
  }
  Deliver({});
}

absl::Status RankPipeline::StartEpoch(BatchConsumer* consumer, int64_t epoch, int64_t first_batch) {
  if (epoch < 0)
    return absl::InvalidArgumentError(absl::StrCat("epoch must be >= 0 (got ", epoch, ")"));
  if (job_->failed()) {
    Shutdown(job_->failure());
    return absl::OkStatus();  // the consumer hears the failure through OnShutdown
  }
  std::vector<WorkerPool::Task> tasks;
  {
    absl::MutexLock lock(&mutex_);
    if (consumer_ != consumer) return absl::FailedPreconditionError("consumer is not bound");
    const int64_t batches = BatchesLocked(epoch);
    if (first_batch < 0 || first_batch > batches) {
      return absl::InvalidArgumentError(
          absl::StrCat("first_batch must be in [0, ", batches, "] (got ", first_batch, ")"));
    }
    // Is (epoch, first_batch) exactly what comes next in the prefetched order?
    bool matches;
    if (!pending_.empty()) {
      matches = pending_.front().epoch == epoch && pending_.front().batch == first_batch;
    } else {
      matches = active_ && next_epoch_ == epoch && next_batch_ == first_batch;
    }
    if (!matches) {
      DropPrefetchLocked();
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

void RankPipeline::DropPrefetchLocked() {
  ++generation_;
  live_generation_.store(generation_, std::memory_order_relaxed);
  // Filling slots are freed by OnSlotFilled when their generation turns out stale.
  std::vector<int> freed;
  ring_->DropQueued(&freed);
  FreeHostSlotsLocked(freed);
  pending_.clear();
  active_ = false;  // nothing is scheduled until the next StartEpoch
}

int64_t RankPipeline::ResumeEpoch(int64_t epoch, std::shared_ptr<const EpochLayout> layout) {
  if (layout != nullptr && layout->consumed().empty()) layout = nullptr;  // a whole epoch
  absl::MutexLock lock(&mutex_);
  SetResumeLocked(epoch, std::move(layout));
  return BatchesLocked(epoch);
}

void RankPipeline::ForgetResume() {
  absl::MutexLock lock(&mutex_);
  SetResumeLocked(-1, nullptr);
}

void RankPipeline::SetResumeLocked(int64_t epoch, std::shared_ptr<const EpochLayout> layout) {
  // A null layout undoes whatever resume was set, for any epoch.
  const bool changes = layout == nullptr ? resume_layout_ != nullptr
                                         : resume_epoch_ != epoch || resume_layout_ == nullptr ||
                                               resume_layout_->consumed() != layout->consumed();
  if (!changes) return;
  // Batches prefetched under the old layout may not be what the consumer asks for.
  if (active_) DropPrefetchLocked();
  resume_epoch_ = layout == nullptr ? -1 : epoch;
  resume_layout_ = std::move(layout);
}

std::shared_ptr<const EpochLayout> RankPipeline::ResumeLayout(int64_t epoch) const {
  absl::MutexLock lock(&mutex_);
  return epoch == resume_epoch_ ? resume_layout_ : nullptr;
}

const EpochLayout* RankPipeline::LayoutLocked(int64_t epoch) const {
  return epoch == resume_epoch_ ? resume_layout_.get() : nullptr;
}

int64_t RankPipeline::BatchesLocked(int64_t epoch) const {
  const EpochLayout* layout = LayoutLocked(epoch);
  return layout == nullptr ? batches_per_epoch_ : layout->batches();
}

absl::Status RankPipeline::Release(BatchConsumer* consumer, uint32_t slot, int64_t seq,
                                   bool complete, std::optional<absl::Duration> waited) {
  std::vector<WorkerPool::Task> tasks;
  {
    absl::MutexLock lock(&mutex_);
    if (consumer_ != consumer) return absl::FailedPreconditionError("consumer is not bound");
    std::vector<int> freed;
    FERRY_RETURN_IF_ERROR(ring_->Release(slot, seq, complete, &freed));
    const absl::Time now = clock_.Now();
    if (waited.has_value()) {
      // The wait ended when the batch reached the trainer, before this release; counted as
      // ending now, which shifts it by one step of the trainer at most.
      wait_reported_ = true;
      window_.AddInterval(kWaitReported, now - std::max(absl::ZeroDuration(), *waited), now);
      if (last_release_ != absl::InfinitePast()) {
        ring_->ReportConsumerWait(*waited, now - last_release_);
      }
    }
    last_release_ = now;
    SampleConsumerCpuWaitLocked(now);
    FreeHostSlotsLocked(freed);
    ScheduleLocked(&tasks);
  }
  Deliver(std::move(tasks));
  return absl::OkStatus();
}

void RankPipeline::FreeHostSlotsLocked(const std::vector<int>& freed) {
  for (const int slot : freed) slots_[slot].state = SlotState::kFree;
}

void RankPipeline::ScheduleLocked(std::vector<WorkerPool::Task>* tasks) {
  ScheduleSlotsLocked(tasks);
  ReadAheadLocked();
}

void RankPipeline::ScheduleSlotsLocked(std::vector<WorkerPool::Task>* tasks) {
  if (!active_ || shutting_down_) return;
  std::vector<int64_t> indices;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].state != SlotState::kFree) continue;
    if (next_batch_ >= BatchesLocked(next_epoch_)) {
      // Run ahead into the next epoch only; further would fill slots the trainer may never
      // ask for.
      if (next_epoch_ > deliver_epoch_) return;
      ++next_epoch_;
      next_batch_ = 0;
      if (BatchesLocked(next_epoch_) == 0) return;
    }
    // Positions only: each task maps its own (a blend's mapping runs on the workers).
    job_->sampler().BatchPositions(next_epoch_, rank_, next_batch_, &indices,
                                   LayoutLocked(next_epoch_));
    Slot& slot = slots_[s];
    const DeliveryRing::BatchPlan plan = ring_->PlanBatch();
    slot.gather = plan.gather;
    slot.gpu_decode = plan.gpu_decode;
    if (slot.gpu_decode) ++gpu_decode_batches_;
    slot.state = SlotState::kFilling;
    slot.since = clock_.Now();
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
    const uint64_t ticket = next_ticket_++;
    pending_.push_back(
        Pending{ticket, static_cast<int>(s), slot.epoch, slot.batch, slot.num_samples});
    ring_->Enqueue(DeliveryRing::Batch{ticket, static_cast<int>(s), slot.num_samples, slot.gather});
    ++next_batch_;
    std::shared_ptr<RankPipeline> self = shared_from_this();
    for (size_t begin = 0; begin < n; begin += per_task) {
      const size_t end = std::min(n, begin + per_task);
      tasks->push_back(
          [self, s = static_cast<int>(s), gen = generation_, begin, epoch = slot.epoch,
           gather = slot.gather, gpu_decode = slot.gpu_decode,
           rows = std::vector<int64_t>(indices.begin() + begin, indices.begin() + end)](
              WorkerContext& context) mutable {
            const absl::Time start = self->clock_.Now();
            self->job_->sampler().MapPositions(epoch, absl::MakeSpan(rows));
            const ReadTally reads_before = ThisThreadReadTally();
            int64_t filled = 0;
            for (size_t i = 0; i < rows.size(); ++i) {
              filled += self->FillRow(s, gen, static_cast<int>(begin + i), rows[i], epoch, gather,
                                      gpu_decode, context);
            }
            self->NoteTask(start, self->clock_.Now(), reads_before, filled, gather);
            self->OnTaskDone(s, gen);
          });
    }
  }
}

void RankPipeline::ReadAheadLocked() {
  ReadAhead* ahead = job_->read_ahead();
  if (ahead == nullptr || !active_ || shutting_down_) return;
  // The first batch the workers have not started: files of earlier ones leave the window.
  const ReadAhead::BatchKey next{next_epoch_, next_batch_};
  if (ahead_generation_ != generation_) {  // another deal, or another position in it
    ahead->Reset(rank_);
    ahead_generation_ = generation_;
    ahead_ = next;
  }
  ahead->Reached(rank_, next);
  if (ahead_ < next) ahead_ = next;
  std::vector<int64_t> positions;
  std::vector<std::string> files;
  std::vector<MappedRange> ranges;
  const bool reads_in_ranges = job_->source().ReadsInRanges();
  while (ahead->HasRoom(rank_)) {
    if (ahead_.batch >= BatchesLocked(ahead_.epoch)) {
      if (ahead_.epoch > next_epoch_) return;  // no further than the epoch after
      ahead_ = ReadAhead::BatchKey{ahead_.epoch + 1, 0};
      if (BatchesLocked(ahead_.epoch) == 0) return;
    }
    job_->sampler().BatchPositions(ahead_.epoch, rank_, ahead_.batch, &positions,
                                   LayoutLocked(ahead_.epoch));
    job_->sampler().MapPositions(ahead_.epoch, absl::MakeSpan(positions));
    files.clear();
    ranges.clear();
    for (const int64_t index : positions) {
      if (job_->IsQuarantined(index)) continue;
      std::string file = job_->source().FileOf(index);
      if (!file.empty()) files.push_back(std::move(file));
      if (reads_in_ranges) job_->source().RangesOf(index, &ranges);
    }
    if (!ahead->Add(rank_, ahead_, files, ranges)) return;  // again once the lane has room
    ++ahead_.batch;
  }
}

void RankPipeline::NoteTask(absl::Time start, absl::Time end, const ReadTally& reads_before,
                            int64_t filled, bool gather) {
  const ReadTally reads = ThisThreadReadTally();
  const uint64_t bytes =
      reads.bytes - reads_before.bytes +
      static_cast<uint64_t>(filled) * (gather ? copied_row_bytes_gathered_ : copied_row_bytes_);
  job_->CountDecoded(filled, bytes);
  window_.AddInterval(kTaskSeconds, start, end);
  const absl::Duration read = absl::Nanoseconds(reads.nanos - reads_before.nanos);
  // Spread like the task: the reads happened somewhere inside it.
  if (read > absl::ZeroDuration()) window_.AddInterval(kReadSeconds, end - read, end);
  const absl::Duration remote = absl::Nanoseconds(reads.remote_nanos - reads_before.remote_nanos);
  if (remote > absl::ZeroDuration()) window_.AddInterval(kRemoteSeconds, end - remote, end);
}

bool RankPipeline::FillRow(int slot, uint64_t generation, int row, int64_t index, int64_t epoch,
                           bool gather, bool gpu_decode, WorkerContext& context) {
  if (live_generation_.load(std::memory_order_relaxed) == generation) {
    const SlotLayout& layout = job_->layout();
    const SampleSource& source = job_->source();
    uint8_t* base = slab_.data() + static_cast<size_t>(slot) * layout.slot_bytes;
    // Every field (no fixed cap: a layout of more fields than the inline size spills to
    // the heap instead of losing fields).
    absl::InlinedVector<uint8_t*, 8> rows(layout.fields.size());
    const size_t nfields = rows.size();
    for (size_t f = 0; f < nfields; ++f) {
      rows[f] =
          gather && static_cast<int>(f) == gathered_field_
              ? nullptr  // the stage reads these rows from the dataset itself
              : base + layout.offsets[f] + static_cast<size_t>(row) * layout.fields[f].row_bytes;
    }
    SampleSource::Scratch* scratch = context.ScratchFor(job_->identity().serial, source);
    scratch->gpu_batch = gpu_decode;
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
        absl::Status s = FillOrOutOfMemory(
            source, candidate,
            MixSeed(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(candidate)),
            absl::MakeConstSpan(rows), scratch);
        if (IsTransientReadError(s)) {
          s = RetryTransient(source, candidate, epoch, absl::MakeConstSpan(rows), scratch,
                             generation, s);
          if (IsTransientReadError(s)) return false;  // the job failed, or the row is stale
        }
        if (s.ok()) {
          job_->NoteReadOk();
          filled = true;
          break;
        }
        if (IsDatasetChanged(s)) {
          // Not a bad sample: the file under every later sample changed. The job stops.
          job_->Fail(s);
          return false;
        }
        const std::string path = source.Describe(candidate);
        if (!job_->RecordSampleError(candidate, path, s)) {
          job_->Fail(absl::DataLossError(absl::StrCat(
              "job ", job_->identity().id, " stopped: more than ", job_->max_quarantined(),
              " of its ", source.size(), " samples are bad (half of them, at most ",
              Job::kMaxQuarantined, "); the last, sample ", candidate, " '", path,
              "': ", s.message(),
              ". The dataset is damaged or not what the job's spec says (its kind, paths, "
              "dtype); fix it and create the job again")));
          return false;
        }
        if (job_->fail_on_corrupt_sample()) {
          job_->Fail(absl::DataLossError(absl::StrCat(
              "job ", job_->identity().id,
              " stopped at a bad sample (on_corrupt_sample=FAIL): "
              "sample ",
              candidate, " '", path, "': ", s.message(),
              ". Fix or remove the file, or create the job with on_corrupt_sample=SKIP")));
          return false;
        }
      }
      candidate = static_cast<int64_t>(
          (static_cast<uint64_t>(candidate) + 1 +
           Mix64(static_cast<uint64_t>(candidate) ^ seed) % static_cast<uint64_t>(source.size())) %
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
      FERRY_LOG_EVERY_N_SEC(ERROR, 10)
          << "job " << job_->identity().id << " rank " << rank_
          << ": no readable substitute for sample " << index << "; row " << row
          << " of the batch is zeroed, its index -1 (logged at most every 10 s)";
    }
    return filled;
  }
  return false;
}

absl::Status RankPipeline::RetryTransient(const SampleSource& source, int64_t index, int64_t epoch,
                                          absl::Span<uint8_t* const> rows,
                                          SampleSource::Scratch* scratch, uint64_t generation,
                                          absl::Status status) {
  const std::string path = source.Describe(index);
  const absl::Time give_up = clock_.Now() + job_->transient_retry_limit();
  absl::Duration backoff = kFirstRetryWait;
  while (IsTransientReadError(status)) {
    if (job_->failed()) return status;  // another read gave up: the job is over
    job_->NoteTransientError(path, status);
    if (clock_.Now() >= give_up) {
      job_->Fail(absl::Status(
          status.code(),
          absl::StrCat("job ", job_->identity().id, " stopped: reading sample ", index, " '", path,
                       "' failed for ", absl::FormatDuration(job_->transient_retry_limit()),
                       " for a reason of this machine, not of the data: ", status.message(),
                       ". Free the resource (raise ferryd's LimitNOFILE, free memory, check the "
                       "disk) and create the job again")));
      return status;
    }
    // Wait, in steps short enough that a shutdown or a seek is not held up by it.
    const absl::Time wake = clock_.Now() + backoff;
    while (clock_.Now() < wake) {
      if (live_generation_.load(std::memory_order_relaxed) != generation) return status;
      clock_.SleepFor(std::min(absl::Milliseconds(20), wake - clock_.Now()));
    }
    backoff = std::min(backoff * 2, kLastRetryWait);
    status = FillOrOutOfMemory(
        source, index,
        MixSeed(job_->spec().seed(), static_cast<uint64_t>(epoch), static_cast<uint64_t>(index)),
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
      s.state = SlotState::kInRing;
      for (Pending& p : pending_) {
        if (p.slot == slot && !p.filled) {
          p.filled = true;
          p.substitutes = fill_counters_[slot].substitutes.load(std::memory_order_relaxed);
          ring_->Filled(p.ticket);
          break;
        }
      }
      fill_time_ += clock_.Now() - s.since;
      ++batches_filled_;
    }
  }
  Deliver(std::move(tasks));
}

void RankPipeline::OnHostSlotFree(int slot) {
  std::vector<WorkerPool::Task> tasks;
  {
    absl::MutexLock lock(&mutex_);
    slots_[slot].state = SlotState::kFree;
    ScheduleLocked(&tasks);
  }
  Deliver(std::move(tasks));
}

void RankPipeline::NoteStarvationLocked(absl::Time now) {
  if (starved_since_ == absl::InfiniteFuture()) return;
  consumer_wait_ += now - starved_since_;
  window_.AddInterval(kWaitEstimated, starved_since_, now);
  window_.AddInterval(starved_on_copy_ ? kStarvedCopy : kStarvedFill, starved_cause_since_, now);
  starved_since_ = absl::InfiniteFuture();
}

bool RankPipeline::HeadFilledLocked() const {
  return !pending_.empty() && pending_.front().epoch == deliver_epoch_ && pending_.front().filled;
}

void RankPipeline::SampleConsumerCpuWaitLocked(absl::Time now) {
  // A read of a small procfs file: a few microseconds, a few times a second at most.
  constexpr absl::Duration kCpuWaitSampleEvery = absl::Milliseconds(100);
  if (!cpu_wait_known_ || consumer_pid_ <= 0) return;
  if (cpu_wait_sample_.has_value() && now - cpu_wait_sample_->at < kCpuWaitSampleEvery) return;
  absl::StatusOr<absl::Duration> delay = MainThreadRunDelay(consumer_pid_);
  if (!delay.ok()) {
    cpu_wait_known_ = false;  // in another PID namespace, gone, or no schedstat
    return;
  }
  if (cpu_wait_sample_.has_value()) {
    // Spread over the interval since the last sample, as the waits were.
    const absl::Duration waited = *delay - cpu_wait_sample_->delay;
    const absl::Duration span = now - cpu_wait_sample_->at;
    if (waited > absl::ZeroDuration() && span > absl::ZeroDuration()) {
      window_.Add(kCpuWait, absl::ToDoubleSeconds(std::min(waited, span)), now);
    }
  }
  const int count = cpu_wait_sample_.has_value() ? cpu_wait_sample_->count + 1 : 1;
  cpu_wait_sample_ = CpuWaitSample{now, *delay, count};
}

void RankPipeline::NoteStarvedLocked(absl::Time now) {
  const bool on_copy = HeadFilledLocked();
  if (starved_since_ == absl::InfiniteFuture()) {
    starved_since_ = now;
  } else if (on_copy != starved_on_copy_) {
    window_.AddInterval(starved_on_copy_ ? kStarvedCopy : kStarvedFill, starved_cause_since_, now);
  } else {
    return;
  }
  starved_on_copy_ = on_copy;
  starved_cause_since_ = now;
}

std::optional<uint32_t> RankPipeline::TakeHeadLocked() {
  if (pending_.empty()) return std::nullopt;
  const Pending& p = pending_.front();
  if (p.epoch != deliver_epoch_ || !p.filled) return std::nullopt;
  return ring_->TakeReady(p.ticket, next_seq_);
}

void RankPipeline::Deliver(std::vector<WorkerPool::Task> tasks) {
  if (!tasks.empty()) pool_->Submit(group_, {job_->identity().serial, rank_}, std::move(tasks));
  if (absl::Status flushed = ring_->Flush(); !flushed.ok()) {
    absl::MutexLock lock(&mutex_);
    FERRY_LOG(ERROR) << "job " << job_->identity().id << " rank " << rank_ << ": " << flushed;
    StopLocked(flushed);
  }
  absl::MutexLock lock(&mutex_);
  if (delivering_) return;  // the thread delivering now will see our changes
  delivering_ = true;
  std::vector<absl::Time> taken;  // per batch in `ready`, for handoff_latency
  while (consumer_ != nullptr) {
    std::vector<ferry::v1::BatchReady> ready;
    taken.clear();
    bool send_end = false;
    const bool producing = active_ && consumer_started_ && !shutting_down_;
    std::optional<uint32_t> slot;
    while (producing && (slot = TakeHeadLocked()).has_value()) {
      const Pending p = pending_.front();
      ferry::v1::BatchReady b;
      b.set_seq(next_seq_++);
      b.set_epoch(p.epoch);
      b.set_batch(p.batch);
      b.set_num_samples(p.num_samples);
      b.set_slot(*slot);
      const absl::Time now = clock_.Now();
      pending_.pop_front();
      if (p.substitutes > 0) job_->CountSubstitutes(p.substitutes);
      ++deliver_batch_;
      ++batches_delivered_;
      samples_delivered_ += p.num_samples;
      recent_deliveries_.emplace_back(now, p.num_samples);
      if (recent_deliveries_.size() > kRateWindow) recent_deliveries_.pop_front();
      ready.push_back(std::move(b));
      taken.push_back(now);
    }
    if (producing && deliver_batch_ >= BatchesLocked(deliver_epoch_) && !epoch_end_sent_) {
      send_end = true;
      epoch_end_sent_ = true;
    }
    const int leased = ring_->leased();
    // A stopping pipeline ends the stream once the consumer has given back every batch it
    // holds, so no batch in use is cut off, or once it had its time (stop_overdue_).
    const bool send_shutdown = shutting_down_ && (leased == 0 || stop_overdue_) && !shutdown_sent_;
    if (send_shutdown) shutdown_sent_ = true;
    if (!ready.empty()) NoteStarvationLocked(taken.front());
    if (ready.empty() && !send_end && !send_shutdown) {
      // Nothing to send: the consumer waits on us if it is mid-epoch and not itself holding
      // every slot.
      if (producing && !epoch_end_sent_ && leased < num_slots()) NoteStarvedLocked(clock_.Now());
      break;
    }
    BatchConsumer* consumer = consumer_;
    const int64_t end_epoch = deliver_epoch_;
    const absl::Status shutdown_reason = shutdown_reason_;
    mutex_.Unlock();
    for (size_t i = 0; i < ready.size(); ++i) {
      consumer->OnBatchReady(ready[i]);
      handoff_latency_.Observe(clock_.Now() - taken[i]);
    }
    if (send_end) consumer->OnEpochEnd(end_epoch);
    if (send_shutdown) consumer->OnShutdown(shutdown_reason);
    mutex_.Lock();
  }
  delivering_ = false;
}

void RankPipeline::FillStatus(ferry::v1::RankStatus* status) const {
  absl::MutexLock lock(&mutex_);
  status->set_rank(rank_);
  status->set_numa_node(group_ >= 0 && group_ < static_cast<int>(pool_->groups().size())
                            ? pool_->groups()[group_].numa_node
                            : -1);
  status->set_attached(consumer_ != nullptr);
  status->set_consumer_pid(consumer_pid_);
  status->set_batch_channel(consumer_via_channel_);
  status->set_batches_delivered(batches_delivered_);
  status->set_samples_delivered(samples_delivered_);
  // Rates are of the consumer attached now: none without one (not its predecessor's).
  if (consumer_ != nullptr && recent_deliveries_.size() >= 2) {
    const double seconds = absl::ToDoubleSeconds(clock_.Now() - recent_deliveries_.front().first);
    uint64_t samples = 0;
    for (size_t i = 1; i < recent_deliveries_.size(); ++i) samples += recent_deliveries_[i].second;
    if (seconds > 0) {
      status->set_batches_per_second((recent_deliveries_.size() - 1) / seconds);
      status->set_samples_per_second(samples / seconds);
    }
  }
  ring_->FillStatus(status);
  status->set_slots(static_cast<uint32_t>(slots_.size()));
  absl::Duration wait = consumer_wait_;
  if (starved_since_ != absl::InfiniteFuture()) wait += clock_.Now() - starved_since_;
  status->set_consumer_wait_seconds(absl::ToDoubleSeconds(wait));
  status->set_batches_filled(batches_filled_);
  status->set_fill_seconds(absl::ToDoubleSeconds(fill_time_));
  status->set_epoch(deliver_epoch_);
  status->set_next_batch(deliver_batch_);
  status->set_epoch_batches(BatchesLocked(deliver_epoch_));
  if (const EpochLayout* layout = LayoutLocked(deliver_epoch_); layout != nullptr) {
    status->set_resumed_after_positions(layout->options().num_positions - layout->remaining());
  }
  handoff_latency_.ToProto(status->mutable_handoff_latency());

  // The stall window: figures since the later of the window's start and the Bind, the
  // starvation going on now included.
  LimitingStageFigures f;
  f.consumer = consumer_ != nullptr;
  if (f.consumer) {
    const absl::Time now = clock_.Now();
    std::vector<double> sums;
    const absl::Time start = std::max(window_.Sum(now, &sums), consumer_since_);
    if (starved_since_ != absl::InfiniteFuture()) {
      sums[kWaitEstimated] += absl::ToDoubleSeconds(now - std::max(starved_since_, start));
      sums[starved_on_copy_ ? kStarvedCopy : kStarvedFill] +=
          absl::ToDoubleSeconds(now - std::max(starved_cause_since_, start));
    }
    f.window_seconds = absl::ToDoubleSeconds(now - start);
    f.wait_reported = wait_reported_;
    f.wait_seconds = wait_reported_ ? sums[kWaitReported] : sums[kWaitEstimated];
    f.starved_fill_seconds = sums[kStarvedFill];
    f.starved_copy_seconds = sums[kStarvedCopy];
    f.task_seconds = sums[kTaskSeconds];
    f.read_seconds = sums[kReadSeconds];
    f.remote_read_seconds = sums[kRemoteSeconds];
    f.worker_threads = worker_threads_;
    f.ready_batches = static_cast<int>(status->queue_depth());
    // Known once two samples were taken: the consumer has released batches for a while.
    if (cpu_wait_known_ && cpu_wait_sample_.has_value() && cpu_wait_sample_->count >= 2) {
      f.cpu_wait_seconds = sums[kCpuWait];
    }
  }
  const LimitingStageVerdict verdict = DecideLimitingStage(f);
  status->set_consumer_cpu_wait_ratio(CpuWaitRatio(f));
  status->set_gpu_decode_batches(static_cast<uint64_t>(gpu_decode_batches_));
  status->set_stall_ratio(StallRatio(f));
  status->set_stall_window_seconds(f.window_seconds);
  status->set_limiting_stage(verdict.stage);
  status->set_limiting_stage_note(verdict.note);
}

}  // namespace ferry
