// Jobs, their owners and their ranks' pipelines: the daemon's state, independent of gRPC so
// it can be tested directly. Every method checks the caller: a job belongs to the uid that
// created it, and only that uid (or root) may see, attach to or delete it.
//
// Thread-safe.
#ifndef FERRY_SERVER_SERVICE_JOB_MANAGER_H_
#define FERRY_SERVER_SERVICE_JOB_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "ferry/v1/config.pb.h"
#include "ferry/v1/ferry.pb.h"
#include "server/cache/object_cache.h"
#include "server/memory/memory_budget.h"
#include "server/pipeline/job.h"
#include "server/pipeline/job_spec.h"
#include "server/pipeline/rank_pipeline.h"
#include "server/pipeline/worker_pool.h"
#include "server/remote/remote_dataset_fs.h"
#include "server/remote/store_client.h"
#include "server/transport/gpu_provider.h"

namespace ferry {

// Who is calling, as the session socket's SO_PEERCRED saw it.
struct Caller {
  uint32_t uid = 0;
  int pid = 0;
  bool is_root() const { return uid == 0; }
};

class JobManager final {
 public:
  // The daemon's settings for jobs. The defaults here are DaemonConfig's too: ApplyDefaults
  // (config.cc) takes them from Options{}.
  struct Options {
    std::vector<std::string> dataset_roots;  // empty: see allow_any_dataset
    // DaemonConfig.remote: the node cache and the store client remote dataset paths are read
    // through. Null: remote paths are refused.
    std::shared_ptr<ObjectCache> remote_cache;
    std::shared_ptr<const StoreClient> remote_store;
    // RemoteStorage.allowed_prefixes; empty: every remote path when allow_any_dataset, none
    // otherwise.
    std::vector<std::string> remote_allowed_prefixes;
    // RemoteStorage.fetch_connections: downloads at once when a job fetches its objects
    // ahead of indexing them (FetchAhead).
    int remote_fetch_connections = 16;
    // RemoteStorage.read_ahead_objects and read_ahead_bytes, per job (ReadAhead); 0 objects:
    // no reading ahead.
    int64_t remote_read_ahead_objects = 512;
    uint64_t remote_read_ahead_bytes = 2ull << 30;
    // RemoteStorage.whole_object_max_bytes and block_bytes (RemoteFsOptions).
    RemoteFsOptions remote_blocks;
    bool allow_any_dataset = false;             // per-user daemon with no roots configured
    bool follow_symlinks_within_roots = false;  // DaemonConfig's (DatasetAccess)
    std::string config_path;                    // for error messages
    // Slots per rank of a job that asks for none: default_prefetch_depth, or more for small
    // batches, until default_prefetch_bytes of slots are in flight (see SlotsPerRank).
    // Default: 4.
    uint32_t default_prefetch_depth = 4;
    // Default: 64 MiB.
    uint64_t default_prefetch_bytes = uint64_t{64} << 20;
    DecodeLimits decode_limits;  // DaemonConfig.decode_limits, defaults filled
    // DaemonConfig.read_retry_seconds: how long a job's reads may fail for a reason of the
    // machine (out of descriptors, ...) before the job fails (Job::transient_retry_limit).
    // Default: Job::kDefaultTransientRetryLimit (5 minutes).
    absl::Duration transient_retry_limit = Job::kDefaultTransientRetryLimit;
    // The clock of the manager and its jobs (Job::clock); must outlive the manager.
    // Default: Clock::Real().
    const Clock* clock = &Clock::Real();
    // DaemonConfig.widen_tokens_on_host: sets TokensDataset.widen_on_host of GPU jobs.
    // Default: false.
    bool widen_tokens_on_host = false;
    // DaemonConfig.gpu_decode. Default: GpuDecodeMode::kCpu.
    GpuDecodeMode gpu_decode = GpuDecodeMode::kCpu;
    // DaemonConfig.job_idle_timeout_seconds: DeleteIdleJobs deletes a job that had no
    // consumer for this long. Zero keeps jobs until deleted. Default: 10 minutes.
    absl::Duration job_idle_timeout = absl::Minutes(10);
    // DaemonConfig.max_jobs_per_uid: jobs one uid (other than root) may have, counting
    // those being created. Default: 64.
    uint32_t max_jobs_per_uid = 64;
    // DaemonConfig.drain_timeout_seconds: how long the consumer of a stopped rank (its job
    // deleted or failed) may keep its batches before its stream is ended anyway
    // (EndOverdueStreams). Default: 5 seconds.
    absl::Duration release_grace = absl::Seconds(5);
  };

  // `gpus` serves "cuda:N" devices; null when ferryd was built without CUDA.
  JobManager(Options options, WorkerPool* pool, MemoryBudget* host_budget,
             GpuProvider* gpus = nullptr);
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  struct Created {
    std::shared_ptr<Job> job;
    bool created = false;
  };
  // Idempotent: the same caller uid, name and spec return the existing job. A new job reads
  // s3:// objects with `store_credentials` (the trainer's), or the daemon's own when unset;
  // they live in memory with the job and nowhere else.
  absl::StatusOr<Created> CreateJob(
      const Caller& caller, const std::string& name, ferry::v1::JobSpec spec,
      const std::optional<AwsCredentials>& store_credentials = std::nullopt);
  absl::StatusOr<std::shared_ptr<Job>> GetJob(const Caller& caller, const std::string& id);
  // The node cache's and the store clients' counters into status->remote; nothing when this
  // ferryd reads no remote datasets.
  void FillRemoteStatus(ferry::v1::DaemonStatus* status) const;
  std::vector<std::shared_ptr<Job>> ListJobs(const Caller& caller);
  absl::Status DeleteJob(const Caller& caller, const std::string& id);
  // Job::AddToQuarantine for the caller's job; INVALID_ARGUMENT naming an index outside
  // [0, num_samples). Returns how many were new.
  absl::StatusOr<int> Quarantine(const Caller& caller, const std::string& id,
                                 const std::vector<int64_t>& indices);

  // RankPipeline::ResumeEpoch for the rank of `attach_id`, dealing the positions of `epoch`
  // not in `consumed`. INVALID_ARGUMENT naming the ranges when they are not sorted disjoint
  // ranges of the epoch; FAILED_PRECONDITION when another rank of the job is attached and
  // resumes the epoch from other positions. Returns the epoch's batches per rank.
  absl::StatusOr<int64_t> ResumeEpoch(const Caller& caller, const std::string& attach_id,
                                      int64_t epoch, std::vector<PositionRange> consumed);

  struct Attachment {
    std::string attach_id;
    std::shared_ptr<RankPipeline> pipeline;
  };
  // Creates the rank's pipeline (slab) on first attach, without holding the daemon-wide lock
  // (other calls go on meanwhile; a concurrent attach of the same rank waits for it).
  // FAILED_PRECONDITION if the rank has a live consumer; INVALID_ARGUMENT for a rank outside
  // [0, world_size); NOT_FOUND when the job was deleted meanwhile. `device` is the rank's
  // GPU for a job of device "cuda" ("cuda:N" or "cuda:<PCI bus id>"; empty: the GPU the
  // spec names), so the ranks of one run on different GPUs share the job; a rank that
  // comes back on another GPU gets a new pipeline there. Host jobs: empty or "cpu".
  absl::StatusOr<Attachment> Attach(const Caller& caller, const std::string& job_id, uint32_t rank,
                                    const std::string& device = "");

  // Slots of each rank's ring: the job's prefetch_depth; without one, the default depth,
  // raised for small batches until default_prefetch_bytes are in flight, up to
  // kMaxDefaultPrefetch. (A slot comes back a few hundred microseconds after its batch is
  // delivered; 4 slots of 1 MiB then keep the GPU's copy engine busy half the time.)
  uint32_t SlotsPerRank(const Job& job) const;
  static constexpr uint64_t kMaxDefaultPrefetch = 32;
  // A job without its own prefetch_depth whose SlotsPerRank do not fit the host budget's
  // free bytes gets as many as fit, down to this (one filling while one is consumed).
  static constexpr uint32_t kMinSlots = 2;
  // The pipeline of an attach_id, for the Consume stream and the memfd handoff.
  absl::StatusOr<std::shared_ptr<RankPipeline>> FindAttachment(const Caller& caller,
                                                               const std::string& attach_id);

  void FillJobStatus(const Job& job, ferry::v1::JobStatus* status);

  // Refuses new jobs and attaches from now on (UNAVAILABLE) and stops every pipeline.
  void BeginDrain();
  // Refuses new jobs and attaches from now on (UNAVAILABLE, naming `who` asked), leaving
  // the pipelines of the consumers attached now running. Idempotent.
  void StopTakingWork(const std::string& why);
  bool taking_work();
  // Slots currently leased to consumers, over all jobs.
  int LeasedSlots();
  // Ranks with a consumer bound, over all jobs and users.
  int Consumers();
  // True while process `pid` consumes some rank of some job (its stream is bound).
  bool HasConsumer(int pid);

  // Deletes the jobs that have had no consumer for job_idle_timeout (none when it is zero),
  // as DeleteJob would; returns their ids. Called every second or so: a job's idle time is
  // measured from the last call that saw a consumer bound to one of its ranks (or from its
  // creation, or its last attach).
  std::vector<std::string> DeleteIdleJobs(absl::Time now);
  std::vector<std::string> DeleteIdleJobs() { return DeleteIdleJobs(options_.clock->Now()); }

  // Ends the streams of stopped ranks (deleted or failed jobs) whose consumers still hold
  // batches release_grace after the stop (RankPipeline::EndStreamIfStoppedBefore). Called
  // every second or so.
  void EndOverdueStreams(absl::Time now);
  void EndOverdueStreams() { EndOverdueStreams(options_.clock->Now()); }

 private:
  struct JobEntry {
    std::shared_ptr<Job> job;
    std::string key;  // uid + name + spec
    std::map<int, std::shared_ptr<RankPipeline>> ranks;
    std::map<int, int> rank_devices;  // rank -> its pipeline's GPU ordinal, -1: the host
    // When a consumer was last seen bound to one of the ranks (DeleteIdleJobs), or the job
    // was created or attached to.
    absl::Time active_at;
    // The dataset's index (SampleSource::index_bytes) in the host memory budget.
    MemoryBudget::Reservation index_memory;
  };
  struct AttachEntry {
    std::string job_id;
    int rank = 0;
    uint32_t uid = 0;
  };

  // CreateJob's steps, in order (the spec normalized, NormalizeJobSpec, before them).
  // A GPU job needs the GPU transport, and the GPU it names must exist.
  absl::Status CheckTransport(const ferry::v1::JobSpec& spec) const;
  // Every path the dataset names is under dataset_roots (before any disk access).
  absl::Status CheckDataset(const ferry::v1::JobSpec& spec) const;
  // The live job of `key`, if there is one; else null, and the caller's job now counts as
  // being created (creating_per_uid_; the caller takes it back). Refuses a name taken by
  // another spec and a user at max_jobs_per_uid; replaces a failed job of `key`.
  absl::StatusOr<std::shared_ptr<Job>> FindOrStartCreating(const Caller& caller,
                                                           const std::string& job_name,
                                                           const std::string& key)
      ABSL_LOCKS_EXCLUDED(mutex_);
  // Opens the dataset and makes the job (its GPU decode, retry limit, GPU checks).
  absl::StatusOr<std::shared_ptr<Job>> OpenJob(
      const Caller& caller, const std::string& job_name, const ferry::v1::JobSpec& spec,
      const std::optional<AwsCredentials>& store_credentials) ABSL_LOCKS_EXCLUDED(mutex_);
  // The filesystem one job reads through: dataset_fs_, and remote objects through the node
  // cache with `store_credentials` (or the daemon's own), each object's HEAD remembered for
  // the job. Null when the job may read nothing.
  std::shared_ptr<const DatasetFs> JobDatasetFs(
      const std::optional<AwsCredentials>& store_credentials) const;
  // RESOURCE_EXHAUSTED, naming what holds the memory, when one rank's slab of `job` cannot
  // fit the host budget's free bytes.
  absl::Status CheckARankFitsLocked(const Caller& caller, const Job& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status CheckDatasetPath(const std::string& path) const;
  absl::StatusOr<JobEntry*> FindOwnedLocked(const Caller& caller, const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The GPU ordinal rank `rank` of `job` attaches to (-1: the host), from the attach's
  // device or the spec's; errors say which of the two is missing or wrong.
  absl::StatusOr<int> RankDeviceLocked(const Job& job, int rank, const std::string& device) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Removes a job from the tables; its pipelines are returned to be shut down after the lock.
  std::map<int, std::shared_ptr<RankPipeline>> EraseLocked(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Records a new attach_id for the rank, superseding the rank's last one.
  Attachment NewAttachmentLocked(const Caller& caller, const std::string& job_id, int rank,
                                 const std::shared_ptr<RankPipeline>& pipeline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Whether a consumer is bound to one of the job's ranks.
  static bool InUse(const JobEntry& entry);
  // "memory is held by job j1 'name' (2 ranks, 128 MiB, idle 3m), ..." for a refusal, the
  // largest holders first; other users' jobs are named by uid only.
  std::string DescribeMemoryHoldersLocked(const Caller& caller, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Options options_;
  // Every local file a job opens goes through it (dataset_roots). Null when no job may read
  // a local file: a system daemon without roots, or roots that are unusable
  // (dataset_fs_error_ says why).
  std::shared_ptr<const DatasetFs> dataset_fs_;
  // Set by BeginDrain; dataset_fs_->Stopping() reports it to dataset indexing.
  const std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
  absl::Status dataset_fs_error_;
  WorkerPool* const pool_;
  MemoryBudget* const host_budget_;
  GpuProvider* const gpus_;

  absl::Mutex mutex_;
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mutex_);  // by id
  absl::flat_hash_map<std::string, std::string> id_by_key_ ABSL_GUARDED_BY(mutex_);
  // uid -> CreateJob calls of that uid opening a dataset now (no zero entries).
  absl::flat_hash_map<unsigned, int> creating_per_uid_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_map<std::string, AttachEntry> attachments_ ABSL_GUARDED_BY(mutex_);
  // (job id, rank) whose pipeline an Attach is creating, without the lock; a concurrent
  // Attach of the same rank waits for it.
  absl::flat_hash_set<std::pair<std::string, int>> creating_ ABSL_GUARDED_BY(mutex_);
  uint64_t next_serial_ ABSL_GUARDED_BY(mutex_) = 1;
  // Ranks of deleted jobs, while a stream still holds them (EndOverdueStreams).
  std::vector<std::weak_ptr<RankPipeline>> deleted_ranks_ ABSL_GUARDED_BY(mutex_);
  // Why new jobs and attaches are refused (BeginDrain, StopTakingWork); empty while taken.
  std::string refusing_ ABSL_GUARDED_BY(mutex_);
};

// 128 random bits as 32 hex characters (getrandom), for tokens and ids.
std::string RandomHex(int bytes);

}  // namespace ferry

#endif  // FERRY_SERVER_SERVICE_JOB_MANAGER_H_
