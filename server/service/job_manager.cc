#include "server/service/job_manager.h"

#include <sys/random.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/quote.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "server/remote/remote_dataset_fs.h"
#include "server/transport/device_ring.h"
#include "server/transport/host_ring.h"

namespace ferry {
namespace {

constexpr int kHost = -1;  // a rank's device when its batches go to the host

std::string DeviceName(int gpu) { return gpu == kHost ? "cpu" : absl::StrCat("cuda:", gpu); }

std::string SpecKey(uint32_t uid, const std::string& name, const ferry::v1::JobSpec& spec) {
  std::string bytes;
  google::protobuf::io::StringOutputStream out(&bytes);
  google::protobuf::io::CodedOutputStream coded(&out);
  coded.SetSerializationDeterministic(true);
  spec.SerializeToCodedStream(&coded);
  coded.Trim();
  return absl::StrCat(uid, "/", name, "/", absl::BytesToHexString(bytes));
}

// Without a name, identical specs share a job: the default name is a digest of the spec.
std::string DefaultJobName(const ferry::v1::JobSpec& spec) {
  return absl::StrCat("job-",
                      absl::Hex(Mix64(std::hash<std::string>{}(SpecKey(0, "", spec))) & 0xffffffffu,
                                absl::kZeroPad8));
}

}  // namespace

std::string RandomHex(int bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < raw.size()) {
    ssize_t n = getrandom(raw.data() + got, raw.size() - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

JobManager::JobManager(Options options, WorkerPool* pool, MemoryBudget* host_budget,
                       GpuProvider* gpus)
    : options_(std::move(options)), pool_(pool), host_budget_(host_budget), gpus_(gpus) {
  if (options_.allow_any_dataset) {
    dataset_fs_ = StoppableDatasetFs(UnconfinedDatasetFs(), stopping_);
  } else if (!options_.dataset_roots.empty()) {  // a system daemon without roots reads nothing
    DatasetAccess access;
    access.roots = options_.dataset_roots;
    access.follow_symlinks_within_roots = options_.follow_symlinks_within_roots;
    access.config_path = options_.config_path;
    absl::StatusOr<std::shared_ptr<const DatasetFs>> fs = MakeDatasetFs(access);
    if (fs.ok()) {
      dataset_fs_ = StoppableDatasetFs(*std::move(fs), stopping_);
    } else {
      dataset_fs_error_ = fs.status();
    }
  }
}

std::shared_ptr<const DatasetFs> JobManager::JobDatasetFs(
    const std::optional<AwsCredentials>& store_credentials) const {
  if (options_.remote_cache == nullptr) return dataset_fs_;
  std::shared_ptr<const StoreClient> store = options_.remote_store;
  if (store_credentials.has_value()) {
    StoreOptions own = store->options();
    own.credentials = store_credentials;
    store = std::make_shared<const StoreClient>(std::move(own));
  }
  return StoppableDatasetFs(
      MakeRemoteDatasetFs(dataset_fs_, options_.remote_cache, store, options_.remote_blocks),
      stopping_);
}

JobManager::~JobManager() { BeginDrain(); }

void JobManager::FillRemoteStatus(ferry::v1::DaemonStatus* status) const {
  if (options_.remote_cache == nullptr) return;
  ferry::v1::RemoteStatus* remote = status->mutable_remote();
  const ObjectCache::Stats cache = options_.remote_cache->stats();
  remote->set_cache_bytes(cache.bytes);
  remote->set_cache_capacity_bytes(cache.capacity_bytes);
  remote->set_cache_entries(cache.entries);
  remote->set_cache_pinned_entries(cache.pinned_entries);
  remote->set_cache_hits(cache.hits);
  remote->set_cache_misses(cache.misses);
  remote->set_cache_evictions(cache.evictions);
  const StoreCounters& store = options_.remote_store->counters();
  auto read = [](const auto& counter) { return counter.load(std::memory_order_relaxed); };
  remote->set_downloaded_bytes(read(store.downloaded_bytes));
  remote->set_requests(read(store.requests));
  remote->set_requests_in_flight(
      static_cast<uint32_t>(std::max<int64_t>(0, read(store.in_flight))));
  remote->set_failures(read(store.failures));
  for (const auto& [reason, counter] : {std::pair<const char*, const std::atomic<uint64_t>*>{
                                            "connection", &store.retried_connection},
                                        {"throttled", &store.retried_throttled},
                                        {"server", &store.retried_server},
                                        {"short", &store.retried_short}}) {
    ferry::v1::ReasonCount* retries = remote->add_retries();
    retries->set_reason(reason);
    retries->set_count(static_cast<int64_t>(read(*counter)));
  }
}

namespace {

// Whether any path the dataset names (a file, shard or folder) is a remote object's.
bool DatasetReadsRemote(const ferry::v1::DatasetSpec& dataset) {
  absl::StatusOr<std::vector<std::string>> paths = DatasetPaths(dataset);
  return paths.ok() && absl::c_any_of(*paths, [](const std::string& path) {
           return ObjectLocation::IsRemote(path);
         });
}

}  // namespace

absl::Status JobManager::CheckDataset(const ferry::v1::JobSpec& spec) const {
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> paths, DatasetPaths(spec.dataset()));
  for (const std::string& path : paths) FERRY_RETURN_IF_ERROR(CheckDatasetPath(path));
  return absl::OkStatus();
}

absl::Status JobManager::CheckDatasetPath(const std::string& path) const {
  if (ObjectLocation::IsRemote(path) && options_.remote_cache == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset path '", path.substr(0, 512),
        "' is remote, and this ferryd reads no remote datasets: give it a `remote` section "
        "(cache_dir, cache_bytes) in ",
        options_.config_path.empty() ? std::string("its config file") : options_.config_path));
  }
  if (ObjectLocation::IsRemote(path)) {
    bool allowed = options_.remote_allowed_prefixes.empty() && options_.allow_any_dataset;
    for (const std::string& prefix : options_.remote_allowed_prefixes) {
      allowed = allowed || absl::StartsWith(path, prefix);
    }
    if (!allowed) {
      return absl::PermissionDeniedError(
          absl::StrCat("dataset path '", path.substr(0, 512),
                       "' is not under any of remote.allowed_prefixes; add its prefix there in ",
                       options_.config_path));
    }
    return ObjectLocation::Parse(path).status();
  }
  if (dataset_fs_ == nullptr) {
    if (!dataset_fs_error_.ok()) return dataset_fs_error_;
    return absl::PermissionDeniedError(
        absl::StrCat("dataset path '", path.substr(0, 512),
                     "' is not under any configured dataset_roots "
                     "(none configured); add its directory to dataset_roots in ",
                     options_.config_path));
  }
  // The name's check, before any disk access; each open is checked again as it happens.
  return dataset_fs_->CheckPath(path);
}

uint32_t JobManager::SlotsPerRank(const Job& job) const {
  if (job.spec().prefetch_depth() != 0) return job.spec().prefetch_depth();
  const uint64_t slot_bytes = std::max<uint64_t>(1, job.layout().slot_bytes);
  const uint64_t for_bytes = (options_.default_prefetch_bytes + slot_bytes - 1) / slot_bytes;
  return static_cast<uint32_t>(std::max<uint64_t>(
      options_.default_prefetch_depth, std::min<uint64_t>(for_bytes, kMaxDefaultPrefetch)));
}

absl::StatusOr<JobManager::Created> JobManager::CreateJob(
    const Caller& caller, const std::string& name, ferry::v1::JobSpec requested,
    const std::optional<AwsCredentials>& store_credentials) {
  FERRY_RETURN_IF_ERROR(CheckJobName(name));
  FERRY_ASSIGN_OR_RETURN(
      ferry::v1::JobSpec spec,
      NormalizeJobSpec(std::move(requested),
                       SpecDefaults{.widen_tokens_on_host = options_.widen_tokens_on_host}));
  FERRY_RETURN_IF_ERROR(CheckTransport(spec));
  // A shard index is read (and checked) before the paths it lists are.
  if (std::shared_ptr<const DatasetFs> fs = JobDatasetFs(store_credentials); fs != nullptr) {
    FERRY_RETURN_IF_ERROR(ResolveDatasetIndexes(
        spec.mutable_dataset(), [this](const std::string& path) { return CheckDatasetPath(path); },
        *fs));
  }
  FERRY_RETURN_IF_ERROR(CheckDataset(spec));
  const std::string job_name = name.empty() ? DefaultJobName(spec) : name;
  const std::string key = SpecKey(caller.uid, job_name, spec);
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Job> existing, FindOrStartCreating(caller, job_name, key));
  if (existing != nullptr) return Created{std::move(existing), false};
  // Until this call returns, the job counts against its user's bound.
  absl::Cleanup created_or_not = [this, uid = caller.uid] {
    absl::MutexLock lock(&mutex_);
    auto it = creating_per_uid_.find(uid);
    if (--it->second == 0) creating_per_uid_.erase(it);
  };
  // Opening the dataset (listing directories) happens without the lock.
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Job> job,
                         OpenJob(caller, job_name, spec, store_credentials));
  // What the dataset's index holds (file names, tar members) counts against the budget for
  // the job's life.
  FERRY_ASSIGN_OR_RETURN(
      MemoryBudget::Reservation index_memory,
      host_budget_->Reserve(job->source().index_bytes(),
                            absl::StrCat("the index of job '", job_name, "''s ",
                                         job->source().size(), " samples (file names)")));
  absl::MutexLock lock(&mutex_);
  FERRY_RETURN_IF_ERROR(CheckARankFitsLocked(caller, *job));
  if (auto it = id_by_key_.find(key); it != id_by_key_.end()) {
    return Created{jobs_.at(it->second).job, false};  // another rank won the race
  }
  const std::string& id = job->identity().id;
  jobs_[id] = JobEntry{job, key, {}, {}, options_.clock->Now(), std::move(index_memory)};
  id_by_key_[key] = id;
  FERRY_LOG(INFO) << "created job " << id << " '" << job_name << "' for uid " << caller.uid << ": "
                  << job->source().size() << " samples, " << job->sampler().batches_per_epoch()
                  << " batches per epoch and rank";
  return Created{job, true};
}

absl::Status JobManager::CheckTransport(const ferry::v1::JobSpec& spec) const {
  if (ParseJobDevice(spec.device()) != JobDevice::kCuda) return absl::OkStatus();
  if (gpus_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device '", spec.device(),
        "' needs the GPU transport, but this ferryd was built "
        "without CUDA; use device=\"cpu\" (host transport) or a ferryd built with CUDA"));
  }
  // "cuda" leaves the GPU to each rank's attach; "cuda:N" names one that must exist.
  if (spec.device() != "cuda") FERRY_RETURN_IF_ERROR(gpus_->Resolve(spec.device()).status());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Job>> JobManager::FindOrStartCreating(const Caller& caller,
                                                                     const std::string& job_name,
                                                                     const std::string& key) {
  std::map<int, std::shared_ptr<RankPipeline>> dropped;  // released after the lock
  absl::MutexLock lock(&mutex_);
  if (!refusing_.empty()) return absl::UnavailableError(refusing_);
  if (auto it = id_by_key_.find(key); it != id_by_key_.end()) {
    JobEntry& existing = jobs_.at(it->second);
    if (!existing.job->failed()) return existing.job;
    // A job stopped by the FAIL policy is replaced by a fresh one: the trainer that creates
    // it again (after the file was fixed) starts clean. Its pipelines already ended with the
    // failure; dropping them here frees their slabs once unbound.
    const std::string failed = it->second;
    FERRY_LOG(INFO) << "replacing failed job " << failed;
    dropped = EraseLocked(failed);
    for (const auto& [rank, pipeline] : dropped) {
      if (pipeline->bound()) deleted_ranks_.push_back(pipeline);
    }
  }
  int mine = 0;
  for (const auto& [id, entry] : jobs_) {
    if (entry.job->identity().owner_uid != caller.uid) continue;
    ++mine;
    if (entry.job->identity().name == job_name) {
      return absl::AlreadyExistsError(
          absl::StrCat("a job named '", job_name, "' already exists (", id,
                       ") with a different spec; choose another name or delete that job"));
    }
  }
  const auto creating = creating_per_uid_.find(caller.uid);
  const int being_created = creating == creating_per_uid_.end() ? 0 : creating->second;
  if (!caller.is_root() &&
      mine + being_created >= static_cast<int64_t>(options_.max_jobs_per_uid)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", caller.uid, " has ", mine, " jobs", being_created > 0 ? " and " : "",
        being_created > 0 ? absl::StrCat(being_created, " being created") : "",
        ", the most ferryd allows one user (max_jobs_per_uid, ", options_.max_jobs_per_uid, " in ",
        options_.config_path.empty() ? "the built-in defaults" : options_.config_path,
        "); delete jobs that are done (ferryctl delete JOB)"));
  }
  ++creating_per_uid_[caller.uid];
  return nullptr;
}

absl::StatusOr<std::shared_ptr<Job>> JobManager::OpenJob(
    const Caller& caller, const std::string& job_name, const ferry::v1::JobSpec& spec,
    const std::optional<AwsCredentials>& store_credentials) {
  JobIdentity identity;
  identity.id = absl::StrCat("j", RandomHex(6));
  identity.name = job_name;
  identity.owner_uid = caller.uid;
  {
    absl::MutexLock lock(&mutex_);
    identity.serial = next_serial_++;
  }
  // How the dataset is read follows from where its batches go: a GPU's copy engine reads
  // the slots (streaming stores) and its kernel widens tokens.
  const bool cuda = ParseJobDevice(spec.device()) == JobDevice::kCuda;
  SourceOptions source_options;
  source_options.row_stores = cuda ? RowStores::kStreaming : RowStores::kOrdinary;
  source_options.device_widens_tokens = cuda;
  source_options.device_images = cuda;
  source_options.limits = options_.decode_limits;
  source_options.host_budget = host_budget_;
  // JPEGs of a GPU image job may be decoded by the GPU (GpuDecodeSplit), when nvJPEG loads.
  std::string gpu_decode_note;
  if (cuda && options_.gpu_decode == GpuDecodeMode::kCpu) {
    gpu_decode_note =
        "GPU JPEG decode is off: the daemon's gpu_decode is \"cpu\" (\"auto\", the default, or "
        "\"gpu\" turn it on)";
  } else if (cuda) {
    if (absl::Status available = gpus_->GpuDecodeAvailable(); available.ok()) {
      source_options.gpu_decode = std::make_shared<GpuDecodeSplit>(
          options_.gpu_decode, pool_->total_threads(),
          GpuJpegLimits{.max_pixels = options_.decode_limits.max_image_pixels});
    } else {
      gpu_decode_note = std::string(available.message());
    }
  }
  std::shared_ptr<const DatasetFs> fs = JobDatasetFs(store_credentials);
  if (options_.remote_cache != nullptr) {
    // Remote objects come into the cache in parallel, before indexing opens them in turn
    // (an image folder's images are fetched as workers read them).
    absl::StatusOr<std::vector<std::string>> paths = DatasetFilePaths(spec.dataset());
    if (paths.ok()) {
      FetchAhead(*fs, *paths, options_.remote_fetch_connections,
                 options_.remote_cache->stats().capacity_bytes / 2);
    }
  }
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Job> job, Job::Create(identity, spec, fs, source_options));
  if (options_.remote_cache != nullptr && options_.remote_read_ahead_objects > 0 &&
      DatasetReadsRemote(spec.dataset())) {
    job->StartReadAhead(
        std::move(fs),
        ReadAhead::Options{.connections = options_.remote_fetch_connections,
                           .max_files = options_.remote_read_ahead_objects,
                           .max_bytes = std::min(options_.remote_read_ahead_bytes,
                                                 options_.remote_cache->stats().capacity_bytes / 4),
                           .ranks = static_cast<int>(std::max<uint32_t>(1, spec.world_size()))});
  }
  if (DatasetHasImages(spec.dataset())) {
    if (cuda && job->gpu_decode() == nullptr && gpu_decode_note.empty()) {
      gpu_decode_note =
          "GPU JPEG decode is off for this job: its transform runs ops on the workers after "
          "the crop (or turns images by EXIF); only a leading RandomResizedCrop or Resize + "
          "CenterCrop, with the rest on the GPU, can be decoded there";
    }
    job->set_gpu_decode_note(gpu_decode_note);
  }
  job->set_transient_retry_limit(options_.transient_retry_limit);
  job->set_clock(options_.clock);
  if (cuda) FERRY_RETURN_IF_ERROR(gpus_->CheckJob(*job));
  return job;
}

absl::Status JobManager::CheckARankFitsLocked(const Caller& caller, const Job& job) {
  // Refuse now a job whose rank slab can never fit, rather than at every rank's attach: one
  // with its own prefetch_depth needs that many slots, one without at least kMinSlots.
  const uint32_t slots =
      job.spec().prefetch_depth() != 0 ? SlotsPerRank(job) : std::min(SlotsPerRank(job), kMinSlots);
  const uint64_t rank_bytes = job.layout().slab_bytes(slots);
  const uint64_t free_bytes =
      host_budget_->limit() - std::min(host_budget_->limit(), host_budget_->in_use());
  if (rank_bytes <= free_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "job '", job.identity().name, "' needs ", rank_bytes, " bytes per rank (", slots,
      " slots of ", job.layout().slot_bytes, " bytes) but the host memory budget has ", free_bytes,
      " of ", host_budget_->limit(), " bytes free",
      DescribeMemoryHoldersLocked(caller, options_.clock->Now()),
      ". Lower batch_size or prefetch_depth, delete jobs that are done (ferryctl delete JOB), "
      "or raise host_memory_budget_bytes in ",
      options_.config_path));
}

absl::StatusOr<JobManager::JobEntry*> JobManager::FindOwnedLocked(const Caller& caller,
                                                                  const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no job ", QuoteForMessage(id, 64), "; list jobs with 'ferryctl jobs'"));
  }
  if (!caller.is_root() && it->second.job->identity().owner_uid != caller.uid) {
    return absl::PermissionDeniedError(
        absl::StrCat("job '", id, "' belongs to uid ", it->second.job->identity().owner_uid,
                     ", not to uid ", caller.uid, "; create your own job"));
  }
  return &it->second;
}

absl::StatusOr<std::shared_ptr<Job>> JobManager::GetJob(const Caller& caller,
                                                        const std::string& id) {
  absl::MutexLock lock(&mutex_);
  FERRY_ASSIGN_OR_RETURN(JobEntry * entry, FindOwnedLocked(caller, id));
  return entry->job;
}

std::vector<std::shared_ptr<Job>> JobManager::ListJobs(const Caller& caller) {
  absl::MutexLock lock(&mutex_);
  std::vector<std::shared_ptr<Job>> out;
  for (const auto& [id, entry] : jobs_) {
    if (caller.is_root() || entry.job->identity().owner_uid == caller.uid) out.push_back(entry.job);
  }
  return out;
}

std::map<int, std::shared_ptr<RankPipeline>> JobManager::EraseLocked(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return {};
  std::map<int, std::shared_ptr<RankPipeline>> ranks = std::move(it->second.ranks);
  id_by_key_.erase(it->second.key);
  jobs_.erase(it);
  for (auto a = attachments_.begin(); a != attachments_.end();) {
    if (a->second.job_id == id) {
      attachments_.erase(a++);
    } else {
      ++a;
    }
  }
  return ranks;
}

absl::Status JobManager::DeleteJob(const Caller& caller, const std::string& id) {
  std::map<int, std::shared_ptr<RankPipeline>> ranks;
  {
    absl::MutexLock lock(&mutex_);
    FERRY_RETURN_IF_ERROR(FindOwnedLocked(caller, id).status());
    ranks = EraseLocked(id);
    for (const auto& [rank, pipeline] : ranks) {
      if (pipeline->bound()) deleted_ranks_.push_back(pipeline);
    }
  }
  // ABORTED, not UNAVAILABLE: a client that takes UNAVAILABLE for a lost ferryd and creates
  // the job again would undo the delete.
  for (auto& [rank, pipeline] : ranks) {
    pipeline->Shutdown(
        absl::AbortedError(absl::StrCat("job ", id, " was deleted (ferryctl delete, by uid ",
                                        caller.uid, "); create it again to go on")));
  }
  FERRY_LOG(INFO) << "deleted job " << id << " (uid " << caller.uid << ")";
  return absl::OkStatus();
}

absl::StatusOr<int> JobManager::Quarantine(const Caller& caller, const std::string& id,
                                           const std::vector<int64_t>& indices) {
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&mutex_);
    FERRY_ASSIGN_OR_RETURN(JobEntry * entry, FindOwnedLocked(caller, id));
    job = entry->job;
  }
  const int64_t n = job->source().size();
  for (int64_t index : indices) {
    if (index < 0 || index >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("quarantined sample ", index, " is outside job ", id, "'s samples [0, ", n,
                       "): the resume state is of another dataset or spec"));
    }
  }
  FERRY_ASSIGN_OR_RETURN(const int added, job->AddToQuarantine(indices));
  if (added > 0) {
    FERRY_LOG(INFO) << "job " << id << ": " << added
                    << " sample(s) quarantined from a client's resume state";
  }
  return added;
}

bool JobManager::InUse(const JobEntry& entry) {
  for (const auto& [rank, pipeline] : entry.ranks) {
    if (pipeline->bound()) return true;
  }
  return false;
}

std::vector<std::string> JobManager::DeleteIdleJobs(absl::Time now) {
  std::vector<std::string> deleted;
  std::vector<std::shared_ptr<RankPipeline>> stopped;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& [id, entry] : jobs_) {
      if (InUse(entry)) {
        entry.active_at = now;
        continue;
      }
      if (options_.job_idle_timeout > absl::ZeroDuration() &&
          now - entry.active_at >= options_.job_idle_timeout) {
        deleted.push_back(id);
      }
    }
    for (const std::string& id : deleted) {
      for (auto& [rank, pipeline] : EraseLocked(id)) stopped.push_back(std::move(pipeline));
    }
  }
  for (auto& pipeline : stopped) {
    pipeline->Shutdown(absl::UnavailableError(
        "the job was deleted after job_idle_timeout_seconds without a consumer; create it "
        "again to go on"));
  }
  for (const std::string& id : deleted) {
    FERRY_LOG(INFO) << "deleted job " << id << ": no consumer for "
                    << absl::FormatDuration(options_.job_idle_timeout)
                    << " (job_idle_timeout_seconds)";
  }
  return deleted;
}

void JobManager::EndOverdueStreams(absl::Time now) {
  std::vector<std::shared_ptr<RankPipeline>> ranks;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& [id, entry] : jobs_) {
      if (!entry.job->failed()) continue;
      for (const auto& [rank, pipeline] : entry.ranks) ranks.push_back(pipeline);
    }
    std::erase_if(deleted_ranks_, [&](const std::weak_ptr<RankPipeline>& weak) {
      std::shared_ptr<RankPipeline> pipeline = weak.lock();
      if (pipeline == nullptr || !pipeline->bound()) return true;
      ranks.push_back(std::move(pipeline));
      return false;
    });
  }
  for (const auto& pipeline : ranks) {
    pipeline->EndStreamIfStoppedBefore(now - options_.release_grace);
  }
}

std::string JobManager::DescribeMemoryHoldersLocked(const Caller& caller, absl::Time now) {
  struct Holder {
    uint64_t bytes = 0;
    std::string text;
  };
  std::vector<Holder> holders;
  for (auto& [id, entry] : jobs_) {
    uint64_t bytes = 0;
    for (const auto& [rank, pipeline] : entry.ranks) bytes += pipeline->slab().size();
    if (bytes == 0) continue;
    const JobIdentity& who = entry.job->identity();
    std::string text = caller.is_root() || who.owner_uid == caller.uid
                           ? absl::StrCat("job ", id, " '", who.name, "'")
                           : absl::StrCat("a job of uid ", who.owner_uid);
    absl::StrAppend(&text, " (", entry.ranks.size(),
                    entry.ranks.size() == 1 ? " rank, " : " ranks, ", bytes >> 20, " MiB, ");
    if (InUse(entry)) {
      absl::StrAppend(&text, "in use)");
    } else {
      absl::StrAppend(&text, "idle ",
                      absl::FormatDuration(absl::Trunc(now - entry.active_at, absl::Seconds(1))),
                      ")");
    }
    holders.push_back({bytes, std::move(text)});
  }
  if (holders.empty()) return "";
  std::sort(holders.begin(), holders.end(),
            [](const Holder& a, const Holder& b) { return a.bytes > b.bytes; });
  std::string out = "; it is held by ";
  constexpr size_t kNamed = 5;
  for (size_t i = 0; i < holders.size() && i < kNamed; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", holders[i].text);
  }
  if (holders.size() > kNamed) absl::StrAppend(&out, " and ", holders.size() - kNamed, " more");
  return out;
}

absl::StatusOr<int> JobManager::RankDeviceLocked(const Job& job, int rank,
                                                 const std::string& device) const {
  const ferry::v1::JobSpec& spec = job.spec();
  if (ParseJobDevice(spec.device()) != JobDevice::kCuda || gpus_ == nullptr) {
    if (!device.empty() && device != "cpu") {
      return absl::InvalidArgumentError(absl::StrCat(
          "job ", job.identity().id, " delivers to the host (device \"cpu\"), but rank ", rank,
          " asked for ", QuoteForMessage(device, 64),
          ": GPU ranks need a job made with device \"cuda\""));
    }
    return kHost;
  }
  const std::string& gpu = device.empty() ? spec.device() : device;
  if (gpu == "cuda") {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job.identity().id,
        " serves GPUs (device \"cuda\"), and each rank names its own when it attaches "
        "(AttachRequest.device \"cuda:N\"); rank ",
        rank, " named none: its ferry client library is older than the job's, upgrade it"));
  }
  if (ParseJobDevice(gpu) != JobDevice::kCuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " of GPU job ", job.identity().id, " asked for device ",
        QuoteForMessage(gpu, 64), "; name its GPU: \"cuda:N\" or \"cuda:<PCI bus id>\""));
  }
  return gpus_->Resolve(gpu);
}

absl::StatusOr<JobManager::Attachment> JobManager::Attach(const Caller& caller,
                                                          const std::string& job_id,
                                                          uint32_t requested_rank,
                                                          const std::string& device) {
  std::shared_ptr<Job> job;
  int rank = 0;
  int slots = 0;
  int gpu = kHost;
  std::shared_ptr<RankPipeline> replaced;  // shut down after the lock
  absl::Time now;
  {
    absl::MutexLock lock(&mutex_);
    if (!refusing_.empty()) return absl::UnavailableError(refusing_);
    FERRY_ASSIGN_OR_RETURN(JobEntry * entry, FindOwnedLocked(caller, job_id));
    now = options_.clock->Now();
    entry->active_at = now;
    if (entry->job->failed()) return entry->job->failure();
    const ferry::v1::JobSpec& spec = entry->job->spec();
    if (requested_rank >= spec.world_size()) {
      return absl::InvalidArgumentError(absl::StrCat("rank must be in [0, ", spec.world_size(),
                                                     ") for job ", job_id, " (got ", requested_rank,
                                                     ")"));
    }
    rank = static_cast<int>(requested_rank);  // < world_size <= kMaxWorldSize
    // Another attach of this rank may be creating its pipeline (outside the lock): wait.
    const std::pair<std::string, int> key(job_id, rank);
    auto settled = [this, &key]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return !creating_.contains(key); };
    mutex_.Await(absl::Condition(&settled));
    FERRY_ASSIGN_OR_RETURN(entry, FindOwnedLocked(caller, job_id));  // it may be gone
    FERRY_ASSIGN_OR_RETURN(gpu, RankDeviceLocked(*entry->job, rank, device));
    if (auto it = entry->ranks.find(rank); it != entry->ranks.end()) {
      if (it->second->bound()) return RankHeldError(job_id, rank, it->second->consumer_pid());
      if (entry->rank_devices[rank] == gpu) {
        return NewAttachmentLocked(caller, job_id, rank, it->second);
      }
      // The rank moved to another GPU (its trainer restarted there): a new pipeline on that
      // GPU; the old one goes with its slab and ring.
      FERRY_LOG(INFO) << "job " << job_id << " rank " << rank << " moves from "
                      << DeviceName(entry->rank_devices[rank]) << " to " << DeviceName(gpu);
      replaced = std::move(it->second);
      entry->ranks.erase(it);
      entry->rank_devices.erase(rank);
      for (auto a = attachments_.begin(); a != attachments_.end();) {
        if (a->second.job_id == job_id && a->second.rank == rank) {
          attachments_.erase(a++);
        } else {
          ++a;
        }
      }
    }
    // The slab is allocated once, by this first attach, and reused by every later attach of
    // this rank. A job with the default prefetch takes fewer slots when the budget is short
    // (not fewer than kMinSlots: Create then refuses it, naming who holds the memory).
    uint32_t wanted = SlotsPerRank(*entry->job);
    if (spec.prefetch_depth() == 0) {
      const uint64_t slot_bytes = std::max<uint64_t>(1, entry->job->layout().slot_bytes);
      const uint64_t free_bytes =
          host_budget_->limit() - std::min(host_budget_->limit(), host_budget_->in_use());
      const uint64_t fit = free_bytes / slot_bytes;
      if (fit < wanted) {
        const uint32_t fewer = static_cast<uint32_t>(std::max<uint64_t>(fit, kMinSlots));
        FERRY_LOG(INFO) << "job " << job_id << " rank " << rank << ": " << fewer
                        << " slots instead of " << wanted << " (the host memory budget has "
                        << free_bytes << " bytes free)";
        wanted = fewer;
      }
    }
    slots = static_cast<int>(wanted);
    job = entry->job;
    creating_.insert(key);
  }

  if (replaced != nullptr) {
    replaced->Shutdown(absl::UnavailableError("the rank attached on another device"));
    replaced.reset();
  }
  // Allocating the slab and, for a GPU job, registering it and making the device ring take
  // milliseconds to seconds: the daemon-wide lock is not held meanwhile.
  absl::StatusOr<std::shared_ptr<RankPipeline>> created;
  if (gpu != kHost) {
    // The slab sits on the GPU's NUMA node and its workers run there.
    GpuProvider* gpus = gpus_;
    const Job& job_ref = *job;
    created = RankPipeline::Create(
        job, rank, slots, gpus_->NumaNode(gpu), pool_, host_budget_,
        [gpus, &job_ref, gpu,
         slots](const SharedSlab& slab) -> absl::StatusOr<std::unique_ptr<DeliveryRing>> {
          FERRY_ASSIGN_OR_RETURN(std::unique_ptr<DeviceStage> stage,
                                 gpus->MakeStage(job_ref, gpu, slab, slots));
          return std::make_unique<DeviceRing>(std::move(stage), job_ref.clock());
        });
  } else {
    const Clock& clock = job->clock();
    created = RankPipeline::Create(
        job, rank, slots, /*numa_node=*/-1, pool_, host_budget_,
        [&clock, slots](const SharedSlab& slab) -> absl::StatusOr<std::unique_ptr<DeliveryRing>> {
          return std::make_unique<HostRing>(slots, slab.size(), clock);
        });
  }

  std::shared_ptr<RankPipeline> unused;  // released after the lock, if the job went away
  absl::MutexLock lock(&mutex_);
  creating_.erase({job_id, rank});
  if (!created.ok()) {
    if (absl::IsResourceExhausted(created.status())) {
      return absl::ResourceExhaustedError(
          absl::StrCat(created.status().message(), DescribeMemoryHoldersLocked(caller, now)));
    }
    return created.status();
  }
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.job != job || !refusing_.empty()) {
    unused = *std::move(created);
    unused->Shutdown(absl::UnavailableError("the job was deleted"));
    if (!refusing_.empty()) return absl::UnavailableError(refusing_);
    return absl::NotFoundError(absl::StrCat("job ", job_id, " was deleted while rank ", rank,
                                            " attached; create it again"));
  }
  std::shared_ptr<RankPipeline>& pipeline = it->second.ranks[rank];
  pipeline = *std::move(created);
  it->second.rank_devices[rank] = gpu;
  return NewAttachmentLocked(caller, job_id, rank, pipeline);
}

JobManager::Attachment JobManager::NewAttachmentLocked(
    const Caller& caller, const std::string& job_id, int rank,
    const std::shared_ptr<RankPipeline>& pipeline) {
  // One attach_id per rank: a new one supersedes the last, whose consumer is gone or never
  // opened (a bound rank was refused). Trainers of a sweep attach thousands of times; the
  // table stays as large as the ranks.
  for (auto it = attachments_.begin(); it != attachments_.end();) {
    if (it->second.job_id == job_id && it->second.rank == rank) {
      attachments_.erase(it++);
    } else {
      ++it;
    }
  }
  pipeline->ForgetResume();  // a resume is the last consumer's
  Attachment a;
  a.attach_id = RandomHex(16);
  a.pipeline = pipeline;
  attachments_[a.attach_id] = AttachEntry{job_id, rank, caller.uid};
  return a;
}

absl::StatusOr<std::shared_ptr<RankPipeline>> JobManager::FindAttachment(
    const Caller& caller, const std::string& attach_id) {
  absl::MutexLock lock(&mutex_);
  auto it = attachments_.find(attach_id);
  if (it == attachments_.end()) {
    return absl::NotFoundError(
        "unknown attach_id; the job was deleted or ferryd restarted: attach again");
  }
  if (!caller.is_root() && it->second.uid != caller.uid) {
    return absl::PermissionDeniedError("attach_id belongs to another uid");
  }
  FERRY_ASSIGN_OR_RETURN(JobEntry * entry, FindOwnedLocked(caller, it->second.job_id));
  return entry->ranks.at(it->second.rank);
}

absl::StatusOr<int64_t> JobManager::ResumeEpoch(const Caller& caller, const std::string& attach_id,
                                                int64_t epoch,
                                                std::vector<PositionRange> consumed) {
  if (epoch < 0) {
    return absl::InvalidArgumentError(absl::StrCat("epoch must be >= 0 (got ", epoch, ")"));
  }
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<RankPipeline> pipeline, FindAttachment(caller, attach_id));
  const Job& job = pipeline->job();
  std::shared_ptr<const EpochLayout> layout;
  if (!consumed.empty()) {
    absl::StatusOr<std::shared_ptr<const EpochLayout>> made =
        job.sampler().ResumedLayout(std::move(consumed));
    if (!made.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resuming epoch ", epoch, " of job ", job.identity().id, ": ", made.status().message(),
          "; the resume state is of another dataset or spec"));
    }
    layout = *std::move(made);
  }
  if (layout != nullptr) {
    // The ranks of one run resume from one state: another attached rank resuming this
    // epoch from other positions means its trainer loaded another state. (Dealing an epoch
    // whole again is a loop iterating it once more, which ranks do one after another.)
    std::vector<std::shared_ptr<RankPipeline>> others;
    {
      absl::MutexLock lock(&mutex_);
      auto it = jobs_.find(job.identity().id);
      if (it != jobs_.end()) {
        for (const auto& [rank, p] : it->second.ranks) {
          if (p != pipeline) others.push_back(p);
        }
      }
    }
    const std::vector<PositionRange>& mine = layout->consumed();
    for (const std::shared_ptr<RankPipeline>& other : others) {
      std::shared_ptr<const EpochLayout> theirs = other->ResumeLayout(epoch);
      if (theirs == nullptr || !other->bound() || theirs->consumed() == mine) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", pipeline->rank(), " of job ", job.identity().id, " resumes epoch ", epoch,
          " after positions ", FormatRanges(mine), " but rank ", other->rank(),
          " (attached now) resumes it after ", FormatRanges(theirs->consumed()),
          ": every rank of a run must load the same state_dict (the one state a run saved)"));
    }
  }
  return pipeline->ResumeEpoch(epoch, std::move(layout));
}

void JobManager::FillJobStatus(const Job& job, ferry::v1::JobStatus* status) {
  job.ToProto(status->mutable_job());
  std::vector<std::pair<std::shared_ptr<RankPipeline>, int>> ranks;  // and the rank's device
  {
    absl::MutexLock lock(&mutex_);
    auto it = jobs_.find(job.identity().id);
    if (it != jobs_.end()) {
      for (const auto& [rank, p] : it->second.ranks) {
        auto device = it->second.rank_devices.find(rank);
        ranks.emplace_back(p, device == it->second.rank_devices.end() ? kHost : device->second);
      }
    }
  }
  for (const auto& [p, gpu] : ranks) {
    ferry::v1::RankStatus* r = status->add_ranks();
    p->FillStatus(r);
    r->set_device(DeviceName(gpu));
  }
  status->set_errors(job.error_count());
  for (auto& r : job.errors_by_reason()) *status->add_errors_by_reason() = std::move(r);
  status->set_samples_decoded(job.samples_decoded());
  status->set_bytes_read(job.bytes_read());
  for (auto& e : job.recent_errors()) *status->add_recent_errors() = std::move(e);
  status->set_quarantined(job.quarantined_count());
  status->set_substituted(job.substituted_count());
  if (job.failed()) status->set_failure(job.failure().ToString());
  status->set_paused(job.paused_reason());
  status->set_transient_errors(job.transient_error_count());
  if (const ReadAhead* ahead = job.read_ahead(); ahead != nullptr) {
    const ReadAhead::Stats stats = ahead->stats();
    ferry::v1::ReadAheadStatus* r = status->mutable_read_ahead();
    r->set_opened(stats.opened);
    r->set_failed(stats.failed);
    r->set_skipped(stats.skipped);
    r->set_files_in_window(stats.in_window);
    r->set_bytes_in_window(stats.bytes_in_window);
  }
  if (const GpuDecodeSplit* split = job.gpu_decode(); split != nullptr) {
    ferry::v1::GpuDecodeStatus* g = status->mutable_gpu_decode();
    const GpuDecodeSplit::Counts c = split->counts();
    g->set_mode(std::string(GpuDecodeModeName(split->mode())));
    g->set_gpu_images(c.gpu_images);
    g->set_cpu_images(c.cpu_images);
    for (int r = 1; r < kNumGpuJpegRejects; ++r) {
      if (c.fallbacks[r] == 0) continue;
      ferry::v1::ReasonCount* f = g->add_fallbacks();
      f->set_reason(std::string(GpuJpegRejectName(static_cast<GpuJpegReject>(r))));
      f->set_count(c.fallbacks[r]);
    }
    if (c.not_jpeg > 0) {
      ferry::v1::ReasonCount* f = g->add_fallbacks();
      f->set_reason("not_jpeg");
      f->set_count(c.not_jpeg);
    }
    g->set_gpu_share(c.share);
    g->set_demand(c.demand);
    g->set_decoders(c.decoders);
    g->set_search_offset(c.search_offset);
    g->set_cpu_ms_per_image(c.cpu_seconds_per_image * 1e3);
    g->set_gpu_ms_per_image(c.gpu_seconds_per_image * 1e3);
  } else if (!job.gpu_decode_note().empty()) {
    status->mutable_gpu_decode()->set_off(job.gpu_decode_note());
  }
  for (const SampleSource::Part& part : job.source().parts()) {
    ferry::v1::BlendSourceStatus* s = status->add_blend_sources();
    s->set_name(part.name);
    s->set_weight(part.weight);
    s->set_num_samples(part.num_samples);
    s->set_samples_per_epoch(part.samples_per_epoch);
    s->set_samples_drawn(part.samples_drawn);
  }
  absl::MutexLock lock(&mutex_);
  auto it = jobs_.find(job.identity().id);
  if (it == jobs_.end()) return;  // deleted meanwhile
  const absl::Time now = options_.clock->Now();
  if (!InUse(it->second)) {
    const absl::Duration idle = std::max(absl::ZeroDuration(), now - it->second.active_at);
    status->set_idle_seconds(absl::ToDoubleSeconds(idle));
    if (options_.job_idle_timeout > absl::ZeroDuration()) {
      status->set_deleted_in_seconds(
          absl::ToDoubleSeconds(std::max(absl::ZeroDuration(), options_.job_idle_timeout - idle)));
    }
  }
}

void JobManager::BeginDrain() {
  // First, without the lock: a CreateJob indexing a long shard list gives up at its next
  // file instead of holding up the stop.
  stopping_->store(true);
  std::vector<std::shared_ptr<RankPipeline>> all;
  {
    absl::MutexLock lock(&mutex_);
    refusing_ = "ferryd is shutting down";
    for (auto& [id, entry] : jobs_) {
      for (auto& [rank, p] : entry.ranks) all.push_back(p);
    }
  }
  for (auto& p : all) {
    p->Shutdown(
        absl::UnavailableError("ferryd is shutting down (SIGTERM); attach again once it is back"));
  }
}

void JobManager::StopTakingWork(const std::string& why) {
  absl::MutexLock lock(&mutex_);
  if (refusing_.empty()) refusing_ = why;
}

bool JobManager::taking_work() {
  absl::MutexLock lock(&mutex_);
  return refusing_.empty();
}

int JobManager::Consumers() {
  absl::MutexLock lock(&mutex_);
  int consumers = 0;
  for (auto& [id, entry] : jobs_) {
    for (const auto& [rank, pipeline] : entry.ranks) consumers += pipeline->bound() ? 1 : 0;
  }
  return consumers;
}

bool JobManager::HasConsumer(int pid) {
  absl::MutexLock lock(&mutex_);
  for (auto& [id, entry] : jobs_) {
    for (const auto& [rank, pipeline] : entry.ranks) {
      if (pipeline->consumer_pid() == pid) return true;
    }
  }
  return false;
}

int JobManager::LeasedSlots() {
  std::vector<std::shared_ptr<RankPipeline>> all;
  {
    absl::MutexLock lock(&mutex_);
    for (auto& [id, entry] : jobs_) {
      for (auto& [rank, p] : entry.ranks) all.push_back(p);
    }
  }
  int leased = 0;
  for (auto& p : all) {
    ferry::v1::RankStatus s;
    p->FillStatus(&s);
    leased += static_cast<int>(s.slots_leased());
  }
  return leased;
}

}  // namespace ferry
