// A job: one dataset + transform + sampling spec, shared by all local ranks of a training
// run. Immutable after creation except for its error counters.
#ifndef FERRY_SERVER_PIPELINE_JOB_H_
#define FERRY_SERVER_PIPELINE_JOB_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/job_limits.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/sample_source.h"
#include "server/pipeline/read_ahead.h"
#include "server/sampler/sampler.h"

namespace ferry {

// The largest slot (one batch, all fields): 1 TiB. Anything larger is a mistake in the spec,
// and every product of a slot size with a slot count (at most kMaxPrefetchDepth) then fits
// in 64 bits.
inline constexpr uint64_t kMaxSlotBytes = uint64_t{1} << 40;

// Where each field's rows live inside a slot. Every field block starts on a 256-byte
// boundary (aligned for vector loads and DMA) and the slot size is a multiple of the page
// size, so every slot starts page-aligned in the slab.
struct SlotLayout {
  std::vector<FieldLayout> fields;
  std::vector<size_t> offsets;  // per field, from the slot's start
  int64_t batch_size = 0;
  size_t slot_bytes = 0;

  // Lays out `batch_size` rows of each field. Every size is computed with overflow checks:
  // INVALID_ARGUMENT when batch_size is outside [1, kMaxBatchSize], RESOURCE_EXHAUSTED
  // naming the field when the slot would exceed kMaxSlotBytes.
  static absl::StatusOr<SlotLayout> Make(const std::vector<FieldLayout>& fields,
                                         int64_t batch_size);
  // The bytes of a rank's `slots` slots: the one place a slab's size is computed.
  uint64_t slab_bytes(uint32_t slots) const { return uint64_t{slot_bytes} * slots; }
};

// Why a sample was bad (JobStatus.errors_by_reason), from its reader's status: "corrupt"
// (DATA_LOSS, INVALID_ARGUMENT: the file is not what its format says), "missing"
// (NOT_FOUND), "unreadable" (PERMISSION_DENIED, and reads that failed for the machine),
// "too_large" (refused by DaemonConfig.decode_limits), "other". A small fixed set, so that
// metrics labelled by it stay few.
inline constexpr std::array<std::string_view, 5> kSampleErrorReasons = {
    "corrupt", "missing", "unreadable", "too_large", "other"};
std::string_view SampleErrorReason(const absl::Status& error);

struct JobIdentity {
  std::string id;
  std::string name;
  uint32_t owner_uid = 0;
  uint64_t serial = 0;  // unique per daemon lifetime
};

class Job final {
 public:
  // Opens the dataset through `fs` with `options` (MakeSampleSource) and checks the spec.
  // Errors name the offending field.
  static absl::StatusOr<std::shared_ptr<Job>> Create(
      JobIdentity identity, const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
      const SourceOptions& options = SourceOptions());
  // Same, over an already opened source (tests feed fakes through this); `gpu_decode` is
  // the job's JPEG routing when the source has the kGpuDecodePlanField.
  static absl::StatusOr<std::shared_ptr<Job>> Create(
      JobIdentity identity, const ferry::v1::JobSpec& spec, std::unique_ptr<SampleSource> source,
      std::shared_ptr<GpuDecodeSplit> gpu_decode = nullptr);

  const JobIdentity& identity() const { return identity_; }
  const ferry::v1::JobSpec& spec() const { return spec_; }
  const SampleSource& source() const { return *source_; }
  // The JPEG routing of a job whose device stages decode on the GPU (SourceOptions::
  // gpu_decode, when its source routes); null otherwise.
  GpuDecodeSplit* gpu_decode() const { return gpu_decode_.get(); }
  // Why a GPU image job decodes on the CPU only ("" when it decodes on the GPU or is not a
  // GPU image job), for status. Set once at creation, before other threads see the job.
  const std::string& gpu_decode_note() const { return gpu_decode_note_; }
  void set_gpu_decode_note(std::string note) { gpu_decode_note_ = std::move(note); }
  Sampler& sampler() const { return *sampler_; }
  const SlotLayout& layout() const { return layout_; }
  absl::Time create_time() const { return create_time_; }

  // Fills `job` (the API view) with identity, spec and layout.
  void ToProto(ferry::v1::Job* job) const;

  // ---- Reading files ahead of the workers, for a job whose files are remote: the job's
  // ReadAhead over `fs`, which the ranks feed in their batch order. Call once, before any
  // rank attaches; ignored for a source that neither opens files as it reads (FileOf) nor
  // reads a mapping in ranges (ReadsInRanges).
  void StartReadAhead(std::shared_ptr<const DatasetFs> fs, const ReadAhead::Options& options);
  // Null when the job does not read ahead.
  ReadAhead* read_ahead() const { return read_ahead_.get(); }

  // ---- Bad samples (JobSpec.on_corrupt_sample).
  bool fail_on_corrupt_sample() const { return spec_.on_corrupt_sample() == ferry::v1::FAIL; }
  // Records a sample that could not be read or decoded (`error`, its reader's status):
  // counted once, by reason (SampleErrorReason), logged with its path, kept among the
  // recent errors and quarantined (IsQuarantined is true from now on). False once more
  // samples are quarantined than max_quarantined(): the caller fails the job.
  bool RecordSampleError(int64_t index, const std::string& path, const absl::Status& error);
  // Quarantines samples known bad elsewhere (an earlier ferryd, through a client's resume
  // state) without counting them as errors here. Returns how many were new; RESOURCE_EXHAUSTED
  // (adding none) when the quarantine would then hold more than max_quarantined().
  absl::StatusOr<int> AddToQuarantine(const std::vector<int64_t>& indices);
  // The most samples the quarantine holds: half of the job's samples (a dataset with more
  // bad samples than good is not what its spec says), and at most kMaxQuarantined, which
  // bounds the memory a job's quarantine (and its GetJob) takes.
  static constexpr int64_t kMaxQuarantined = int64_t{1} << 18;
  int64_t max_quarantined() const;
  // Every quarantined sample, ascending.
  std::vector<int64_t> quarantined_indices() const;
  // True for a sample already known to be bad: callers go straight to its substitute.
  // Lock-free while no sample has gone bad.
  bool IsQuarantined(int64_t index) const;
  // Substitutes were delivered to a trainer in place of bad samples (counted at delivery,
  // so batches prefetched and never delivered count nothing).
  void CountSubstitutes(int n) { substituted_.fetch_add(n, std::memory_order_relaxed); }
  int64_t error_count() const;
  // error_count() by reason, for every reason with a count, in SampleErrorReason's order.
  std::vector<ferry::v1::ReasonCount> errors_by_reason() const;

  // ---- Work done (JobStatus.samples_decoded, bytes_read): samples the workers read and
  // transformed, of every rank (prefetched and abandoned ones too), and the bytes they read
  // from the dataset's files (for mapped files, the bytes copied out of the mapping).
  void CountDecoded(int64_t samples, uint64_t bytes) {
    samples_decoded_.fetch_add(samples, std::memory_order_relaxed);
    bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  }
  int64_t samples_decoded() const { return samples_decoded_.load(std::memory_order_relaxed); }
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }
  int64_t quarantined_count() const;
  int64_t substituted_count() const { return substituted_.load(std::memory_order_relaxed); }
  std::vector<ferry::v1::SampleError> recent_errors() const;

  // ---- Reads that failed because of the machine (IsTransientReadError: out of file
  // descriptors or memory, I/O errors that may pass). Such a sample is not bad: the worker
  // waits and reads it again, and the job is "paused" until a read succeeds. A pause that
  // lasts transient_retry_limit() fails the job with the reason.
  // Notes a transient failure reading `path`; logged once per pause.
  void NoteTransientError(const std::string& path, const absl::Status& status);
  // Notes a successful read: ends a pause (logged). Lock-free while not paused.
  void NoteReadOk() {
    if (paused_.load(std::memory_order_acquire)) EndPause();
  }
  // The error that paused the job; empty when it is not paused.
  std::string paused_reason() const;
  int64_t transient_error_count() const {
    return transient_errors_.load(std::memory_order_relaxed);
  }
  // How long reads may fail for a reason of the machine before the job fails, unless set.
  static constexpr absl::Duration kDefaultTransientRetryLimit = absl::Minutes(5);
  absl::Duration transient_retry_limit() const {
    return absl::Milliseconds(transient_retry_limit_ms_.load(std::memory_order_relaxed));
  }
  void set_transient_retry_limit(absl::Duration limit) {
    transient_retry_limit_ms_.store(absl::ToInt64Milliseconds(limit), std::memory_order_relaxed);
  }

  // The clock the job's rank pipelines read and wait on (stall and rate figures, retry
  // back-off and limit, overdue streams). Default: Clock::Real(). Set before ranks attach;
  // `clock` must outlive the job.
  const Clock& clock() const { return *clock_; }
  void set_clock(const Clock* clock) { clock_ = clock; }

  // FAIL policy: the first bad sample stops the job. Fail keeps the first status; failure()
  // is OK until then. Every rank pipeline checks it before delivering a batch.
  void Fail(const absl::Status& status);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  absl::Status failure() const;

 private:
  Job(JobIdentity identity, ferry::v1::JobSpec spec, std::unique_ptr<SampleSource> source,
      std::unique_ptr<Sampler> sampler, SlotLayout layout);

  const JobIdentity identity_;
  const ferry::v1::JobSpec spec_;
  const std::unique_ptr<SampleSource> source_;
  const std::unique_ptr<Sampler> sampler_;
  const SlotLayout layout_;
  const absl::Time create_time_;

  mutable absl::Mutex errors_mutex_;
  int64_t error_count_ ABSL_GUARDED_BY(errors_mutex_) = 0;
  // Per SampleErrorReason, indexed like kSampleErrorReasons.
  std::array<int64_t, kSampleErrorReasons.size()> errors_by_reason_
      ABSL_GUARDED_BY(errors_mutex_){};
  std::atomic<int64_t> samples_decoded_{0};
  std::atomic<uint64_t> bytes_read_{0};
  std::deque<ferry::v1::SampleError> recent_errors_ ABSL_GUARDED_BY(errors_mutex_);
  absl::flat_hash_set<int64_t> quarantine_ ABSL_GUARDED_BY(errors_mutex_);
  std::atomic<int64_t> quarantined_{0};  // quarantine_.size(), readable without the lock
  std::atomic<int64_t> substituted_{0};
  absl::Status failure_ ABSL_GUARDED_BY(errors_mutex_);
  std::atomic<bool> failed_{false};

  void EndPause();
  std::string paused_reason_ ABSL_GUARDED_BY(errors_mutex_);
  std::atomic<bool> paused_{false};
  std::atomic<int64_t> transient_errors_{0};
  std::shared_ptr<GpuDecodeSplit> gpu_decode_;  // set in Create, constant after
  std::unique_ptr<ReadAhead> read_ahead_;       // set before ranks attach, constant after
  std::string gpu_decode_note_;
  std::atomic<int64_t> transient_retry_limit_ms_{
      absl::ToInt64Milliseconds(kDefaultTransientRetryLimit)};
  const Clock* clock_ = &Clock::Real();
};

}  // namespace ferry

#endif  // FERRY_SERVER_PIPELINE_JOB_H_
