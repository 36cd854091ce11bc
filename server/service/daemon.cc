#include "server/service/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/session_protocol.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "common/unique_fd.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#if FERRY_HAVE_CUDA
#include "server/gpu/cuda_gpu_provider.h"
#endif

namespace ferry {
namespace {

// gRPC bounds (see the builder below).
constexpr int kMaxRequestBytes = 4 << 20;
constexpr int kMaxStreamsPerConnection = 256;
constexpr int kMaxConnectionIdleMs = 10 * 60 * 1000;
constexpr int kKeepaliveMs = 60 * 1000;
constexpr int kKeepaliveTimeoutMs = 20 * 1000;
constexpr int kMaxRpcThreads = 256;
constexpr size_t kRpcMemoryBytes = size_t{512} << 20;  // buffers of all gRPC connections

// Raises the soft RLIMIT_NOFILE to the hard one (a daemon serving many trainers needs more
// than the usual 1024) and returns the soft limit in effect.
size_t RaiseDescriptorLimit() {
  struct rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  if (limit.rlim_cur < limit.rlim_max) {
    struct rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur == RLIM_INFINITY ? size_t{1} << 20 : static_cast<size_t>(limit.rlim_cur);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->start_time_ = absl::Now();
  FERRY_ASSIGN_OR_RETURN(
      d->config_,
      LoadConfig(options.config_path, ImplicitConfigPath(!options.listen.empty(), geteuid())));
  ferry::v1::DaemonConfig& config = d->config_.config;
  if (!options.listen.empty()) config.set_unix_socket(options.listen);
  if (options.workers >= 0) config.set_workers_per_node(static_cast<uint32_t>(options.workers));
  if (!options.log_level.empty()) config.set_log_level(options.log_level);
  FERRY_ASSIGN_OR_RETURN(LogSeverity log_level, ParseLogSeverity(config.log_level()));
  SetLogLevel(log_level);
  // The system daemon serves every member of group `ferry`; any other daemon its user only.
  if (config.unix_socket_mode() == 0) {
    config.set_unix_socket_mode(config.unix_socket() == kSystemSocketPath ? 0660 : 0600);
  }

  FERRY_ASSIGN_OR_RETURN(d->topology_, Topology::Read(config.sysfs_root()));
  constexpr int kDefaultWorkerNice = 10;
  FERRY_ASSIGN_OR_RETURN(
      d->pool_,
      WorkerPool::Create(d->topology_, static_cast<int>(config.workers_per_node()),
                         config.has_worker_nice() ? config.worker_nice() : kDefaultWorkerNice,
                         config.worker_sched_idle()));
  d->host_budget_ =
      std::make_unique<MemoryBudget>("host memory budget", "host_memory_budget_bytes",
                                     config.host_memory_budget_bytes(), d->config_.path);
  JobManager::Options job_options;
  job_options.dataset_roots.assign(config.dataset_roots().begin(), config.dataset_roots().end());
  // A per-user or private daemon reads only what its user can read anyway; the system daemon
  // (the one on /run/ferry/ferryd.sock, serving every user) must be told which trees it may
  // serve.
  job_options.allow_any_dataset =
      job_options.dataset_roots.empty() && config.unix_socket() != kSystemSocketPath;
  job_options.follow_symlinks_within_roots = config.follow_symlinks_within_roots();
  job_options.transient_retry_limit = absl::Seconds(config.read_retry_seconds());
  job_options.config_path = d->config_.path;
  const ferry::v1::DecodeLimits& limits = config.decode_limits();
  if (limits.max_image_pixels() != 0) {
    job_options.decode_limits.max_image_pixels = limits.max_image_pixels();
  }
  if (limits.max_progressive_scans() != 0) {
    job_options.decode_limits.max_progressive_scans =
        static_cast<int>(std::min<uint32_t>(limits.max_progressive_scans(), 1 << 20));
  }
  if (limits.max_sample_bytes() != 0) {
    job_options.decode_limits.max_sample_bytes = limits.max_sample_bytes();
  }
  job_options.widen_tokens_on_host = config.widen_tokens_on_host();
  job_options.gpu_decode = config.gpu_decode() == "cpu"   ? GpuDecodeMode::kCpu
                           : config.gpu_decode() == "gpu" ? GpuDecodeMode::kGpu
                                                          : GpuDecodeMode::kAuto;
  job_options.default_prefetch_depth = config.default_prefetch_depth();
  job_options.default_prefetch_bytes = config.default_prefetch_bytes();
  job_options.job_idle_timeout = absl::Seconds(config.job_idle_timeout_seconds());
  job_options.release_grace = absl::Seconds(config.drain_timeout_seconds());
  job_options.max_jobs_per_uid = config.max_jobs_per_uid();
  if (config.has_remote()) {
    const ferry::v1::RemoteStorage& remote = config.remote();
    const std::string where = absl::StrCat("config file '", d->config_.path, "': remote");
    if (remote.cache_dir().empty() || remote.cache_bytes() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       " needs cache_dir and cache_bytes (the node cache of remote "
                       "objects)"));
    }
    absl::StatusOr<std::unique_ptr<ObjectCache>> cache =
        ObjectCache::Open({.dir = remote.cache_dir(), .capacity_bytes = remote.cache_bytes()});
    if (!cache.ok()) {
      return absl::Status(cache.status().code(),
                          absl::StrCat(where, ".cache_dir: ", cache.status().message()));
    }
    job_options.remote_cache = std::shared_ptr<ObjectCache>(*std::move(cache));
    StoreOptions store;
    store.endpoint = remote.s3_endpoint();
    store.region = remote.s3_region();
    for (const char* name : {"AWS_REGION", "AWS_DEFAULT_REGION"}) {
      const char* value = std::getenv(name);
      if (store.region.empty() && value != nullptr && *value != '\0') store.region = value;
    }
    if (store.region.empty()) store.region = "us-east-1";
    const char* id = std::getenv("AWS_ACCESS_KEY_ID");
    const char* secret = std::getenv("AWS_SECRET_ACCESS_KEY");
    const char* token = std::getenv("AWS_SESSION_TOKEN");
    if (id != nullptr && secret != nullptr && *id != '\0') {
      store.credentials = AwsCredentials{id, secret, token != nullptr ? token : ""};
    }
    job_options.remote_store = std::make_shared<const StoreClient>(std::move(store));
    job_options.remote_allowed_prefixes.assign(remote.allowed_prefixes().begin(),
                                               remote.allowed_prefixes().end());
    if (remote.fetch_connections() > 0) {
      job_options.remote_fetch_connections =
          static_cast<int>(std::min<uint32_t>(remote.fetch_connections(), 256));
    }
    job_options.remote_blocks.part_connections = job_options.remote_fetch_connections;
    if (remote.has_part_bytes()) job_options.remote_blocks.part_bytes = remote.part_bytes();
    if (remote.has_read_ahead_objects()) {
      job_options.remote_read_ahead_objects = remote.read_ahead_objects();
    }
    if (remote.read_ahead_bytes() > 0) {
      job_options.remote_read_ahead_bytes = remote.read_ahead_bytes();
    }
    if (remote.whole_object_max_bytes() > 0) {
      job_options.remote_blocks.whole_object_max_bytes = remote.whole_object_max_bytes();
    }
    if (remote.block_bytes() > 0) {
      const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
      if (remote.block_bytes() % page != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ".block_bytes ", remote.block_bytes(), " is not a multiple of the page size (",
            page, " bytes); use, say, 16777216 (16 MiB)"));
      }
      job_options.remote_blocks.block_bytes = remote.block_bytes();
    }
  }
  d->pinned_budget_ =
      std::make_unique<MemoryBudget>("pinned memory budget", "pinned_memory_budget_bytes",
                                     config.pinned_memory_budget_bytes(), d->config_.path);
#if FERRY_HAVE_CUDA
  GatherOptions gather;  // ApplyDefaults filled in every unset setting
  gather.enabled = !config.disable_page_cache_gather();
  gather.every_batch = config.gather_every_batch();
  gather.thread_blocks =
      static_cast<int>(std::min<uint32_t>(config.gather_thread_blocks(), 1 << 16));
  gather.streams = static_cast<int>(config.gather_streams());  // LoadConfig checked it
  gather.registration_wait = absl::Milliseconds(std::max(0, config.gather_registration_wait_ms()));
  d->gpus_ = MakeCudaGpuProvider(d->topology_, d->pinned_budget_.get(),
                                 config.device_memory_budget_bytes(), d->config_.path, gather);
#endif
  d->jobs_ = std::make_unique<JobManager>(job_options, d->pool_.get(), d->host_budget_.get(),
                                          d->gpus_.get());

  // Every session holds a descriptor, and so does each of its batch channels: sessions are
  // kept under half the descriptor limit, the rest left for datasets, slabs and gRPC.
  SessionLimits session_limits;
  session_limits.max_sessions =
      std::min<size_t>(config.max_sessions(), std::max<size_t>(16, RaiseDescriptorLimit() / 2));
  session_limits.max_sessions_per_uid =
      std::min<size_t>(config.max_sessions_per_uid(), session_limits.max_sessions);
  session_limits.idle_timeout = absl::Seconds(config.session_idle_timeout_seconds());
  JobManager* jobs = d->jobs_.get();
  FERRY_ASSIGN_OR_RETURN(
      d->sessions_,
      SessionServer::Start(
          SessionSocketPath(config.unix_socket()), config.unix_socket_mode(),
          [jobs](const PeerCredentials& peer,
                 const std::string& attach_id) -> absl::StatusOr<std::pair<int, uint64_t>> {
            FERRY_ASSIGN_OR_RETURN(auto pipeline,
                                   jobs->FindAttachment(Caller{peer.uid, peer.pid}, attach_id));
            return std::make_pair(pipeline->slab().fd(),
                                  static_cast<uint64_t>(pipeline->slab().size()));
          },
          [jobs](const PeerCredentials& peer,
                 const std::string& attach_id) -> absl::StatusOr<std::unique_ptr<BatchChannel>> {
            FERRY_ASSIGN_OR_RETURN(auto pipeline,
                                   jobs->FindAttachment(Caller{peer.uid, peer.pid}, attach_id));
            // Never full: at most one BatchReady per slot and an EpochEnd
            // are unread at a time, and one Release per slot comes back.
            return BatchChannel::Create(2 * static_cast<uint32_t>(pipeline->num_slots()) + 8);
          },
          session_limits,
          [jobs](const PeerCredentials& peer) { return jobs->HasConsumer(peer.pid); }));
  FERRY_ASSIGN_OR_RETURN(d->channels_, ChannelPoller::Start());
  Daemon* raw = d.get();
  d->service_ = std::make_unique<FerryService>(
      d->jobs_.get(), d->sessions_.get(), d->channels_.get(),
      [raw](ferry::v1::DaemonStatus* status) { raw->FillDaemonStatus(status); },
      [raw](const Caller& caller) { return raw->BeginGracefulDrain(caller); });

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // The Unix socket is ferryd's own (ListenUnix replaces a stale socket file, refuses to
  // steal a live daemon's socket and sets the mode), and so is its accept loop
  // (GrpcAcceptor: gRPC's own stops after one EMFILE); gRPC serves what it accepts.
  FERRY_ASSIGN_OR_RETURN(UniqueFd listener,
                         ListenUnix(config.unix_socket(), SOCK_STREAM, config.unix_socket_mode()));
  if (!config.tcp_listen().empty()) {
    builder.AddListeningPort(config.tcp_listen(), grpc::InsecureServerCredentials());
  }
  // Bounds on what gRPC callers may hold (docs/operations.md, "Limits"): request size, streams
  // per connection, and connections that stay open doing nothing.
  builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, kMaxConnectionIdleMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  grpc::ResourceQuota quota("ferryd");
  quota.SetMaxThreads(kMaxRpcThreads);
  quota.Resize(kRpcMemoryBytes);
  builder.SetResourceQuota(quota);
  builder.RegisterService(d->service_.get());
  d->server_ = builder.BuildAndStart();
  if (d->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot start the gRPC server",
                                               config.tcp_listen().empty() ? "" : " on ",
                                               config.tcp_listen(), "; see the log above"));
  }
  FERRY_ASSIGN_OR_RETURN(d->acceptor_, GrpcAcceptor::Start(std::move(listener), d->server_.get()));
  d->server_->GetHealthCheckService()->SetServingStatus(true);
  if (!config.metrics_listen().empty()) {
    // LoadConfig parsed it and refused a non-loopback address without
    // metrics_allow_non_loopback.
    FERRY_ASSIGN_OR_RETURN(MetricsAddress address, ParseMetricsAddress(config.metrics_listen()));
    FERRY_ASSIGN_OR_RETURN(d->metrics_, MetricsServer::Start(address, config.unix_socket_mode(),
                                                             [raw] { return raw->FullStatus(); }));
  }

  FERRY_LOG(INFO) << "ferryd " << kFerryVersion << " listening on " << config.unix_socket()
                  << " (session socket " << d->sessions_->path() << "), "
                  << d->pool_->total_threads() << " workers on " << d->topology_.nodes().size()
                  << " NUMA node(s), config "
                  << (d->config_.from_file ? d->config_.path : std::string("built-in defaults"));
  sd_notify(0, "READY=1\nSTATUS=serving");
  d->notify_thread_ = std::thread([raw] { raw->NotifyLoop(); });
  return d;
}

Daemon::~Daemon() { Drain(); }

absl::StatusOr<uint32_t> Daemon::BeginGracefulDrain(const Caller& caller) {
  if (!caller.is_root() && caller.uid != geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("only root or uid ", geteuid(),
                     " (ferryd's user) may drain this ferryd; you are uid ", caller.uid));
  }
  jobs_->StopTakingWork(
      "ferryd is draining (ferryctl drain): it takes no new jobs or attaches and exits once "
      "the trainers attached now are done; start this one when ferryd is back");
  const int consumers = jobs_->Consumers();
  if (!drain_requested_.exchange(true)) {
    FERRY_LOG(INFO) << "drain requested by uid " << caller.uid << " (pid " << caller.pid
                    << "): " << consumers << " consumer(s) attached; exiting once none is";
  }
  return static_cast<uint32_t>(consumers);
}

void Daemon::NotifyLoop() {
  NameThisThread("ferry-notify");
  uint64_t watchdog_usec = 0;
  const bool watchdog = sd_watchdog_enabled(0, &watchdog_usec) > 0;
  // Housekeeping every second (idle jobs, drain, exit when idle); systemd hears from us at
  // least every half watchdog period.
  absl::Duration period = absl::Seconds(1);
  if (watchdog) {
    period = std::min(period, absl::Microseconds(static_cast<int64_t>(watchdog_usec / 2)));
  }
  const absl::Duration exit_when_idle = absl::Seconds(config_.config.exit_when_idle_seconds());
  absl::Time idle_since = absl::Now();
  bool exiting = false;
  while (!stop_notify_.WaitForNotificationWithTimeout(period)) {
    const absl::Time now = absl::Now();
    jobs_->DeleteIdleJobs();
    jobs_->EndOverdueStreams();
    const int consumers = jobs_->Consumers();
    if (consumers > 0 || sessions_->live_sessions() > 0) idle_since = now;
    if (!exiting && drain_requested_.load() && consumers == 0) {
      FERRY_LOG(INFO) << "drained: no consumer left; stopping";
      exiting = true;
    } else if (!exiting && exit_when_idle > absl::ZeroDuration() &&
               now - idle_since >= exit_when_idle) {
      FERRY_LOG(INFO) << "no client for " << absl::FormatDuration(exit_when_idle)
                      << " (exit_when_idle_seconds); stopping";
      exiting = true;
    }
    if (exiting) {
      // The main thread waits for this signal (ferryd_main.cc) and stops as on SIGTERM.
      kill(getpid(), SIGTERM);
      period = absl::Seconds(1);
    }
    ferry::v1::DaemonStatus status;
    FillDaemonStatus(&status);
    const std::string line =
        absl::StrCat("STATUS=", jobs_->ListJobs(Caller{0, 0}).size(), " job(s), ", consumers,
                     " consumer(s), ", status.host_memory_in_use_bytes() >> 20, " MiB of ",
                     status.host_memory_budget_bytes() >> 20, " MiB host memory in use",
                     status.draining() ? ", draining" : "", watchdog ? "\nWATCHDOG=1" : "");
    sd_notify(0, line.c_str());
  }
}

void Daemon::Drain() {
  if (server_ == nullptr) return;
  sd_notify(0, "STOPPING=1\nSTATUS=draining");
  jobs_->BeginDrain();
  const absl::Time deadline = absl::Now() + absl::Seconds(config_.config.drain_timeout_seconds());
  while (jobs_->LeasedSlots() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  acceptor_.reset();             // no new connections; then the server ends those it has
  service_->StopSlowHandlers();  // the server's shutdown waits for every call to finish
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server_->Wait();
  server_.reset();
  metrics_.reset();
  stop_notify_.Notify();
  if (notify_thread_.joinable()) notify_thread_.join();
  sessions_.reset();
  channels_.reset();  // after the server: a stream's end unregisters its channel
  unlink(config_.config.unix_socket().c_str());
  if (config_.config.remove_socket_directory()) RemoveSocketDirectory();
  jobs_.reset();
  gpus_.reset();
  pool_.reset();
  FERRY_LOG(INFO) << "ferryd stopped";
}

void Daemon::RemoveSocketDirectory() {
  const std::string dir = std::filesystem::path(config_.config.unix_socket()).parent_path();
  if (dir.empty()) return;
  UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return;
  // A client holding the lock is starting the next daemon here: leave the directory to it.
  if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return;
  if (rmdir(dir.c_str()) != 0 && errno != ENOTEMPTY && errno != EEXIST) {
    FERRY_LOG(WARNING) << "could not remove socket directory " << dir << ": " << strerror(errno);
  }
}

ferry::v1::GetStatusResponse Daemon::FullStatus() {
  ferry::v1::GetStatusResponse response;
  FillDaemonStatus(response.mutable_daemon());
  // ListJobs and FillJobStatus take the job lock only to copy pointers and a few fields.
  for (const auto& job : jobs_->ListJobs(Caller{0, 0})) {
    jobs_->FillJobStatus(*job, response.add_jobs());
  }
  return response;
}

void Daemon::FillDaemonStatus(ferry::v1::DaemonStatus* status) {
  status->set_version(kFerryVersion);
  status->set_protocol(kDaemonProtocol);
  status->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - start_time_));
  status->set_pid(static_cast<uint32_t>(getpid()));
  for (const auto& group : pool_->groups()) {
    ferry::v1::NumaNodeStatus* node = status->add_numa_nodes();
    node->set_id(group.numa_node);
    for (int cpu : group.cpus) node->add_cpus(cpu);
    node->set_workers(static_cast<uint32_t>(group.threads));
  }
  status->set_host_memory_in_use_bytes(host_budget_->in_use());
  status->set_host_memory_budget_bytes(host_budget_->limit());
  status->set_cuda_available(false);
  if (gpus_ != nullptr) gpus_->FillStatus(status);
  status->set_config_path(config_.from_file ? config_.path : "");
  for (const auto& root : config_.config.dataset_roots()) status->add_dataset_roots(root);
  status->set_draining(drain_requested_.load());
  status->set_job_idle_timeout_seconds(config_.config.job_idle_timeout_seconds());
  status->set_consumers(static_cast<uint32_t>(jobs_->Consumers()));
  status->set_workers_busy_fraction(pool_->busy_fraction());
  status->set_workers(static_cast<uint32_t>(pool_->total_threads()));
  jobs_->FillRemoteStatus(status);
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) == 0) {
    auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
    status->set_cpu_seconds(seconds(usage.ru_utime) + seconds(usage.ru_stime));
  }
}

}  // namespace ferry
