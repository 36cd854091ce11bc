// ferryd as a whole: configuration, NUMA topology, worker pool, memory budget, jobs, the
// session socket and the gRPC server, with systemd notification (READY, STATUS, WATCHDOG).
//
//   FERRY_ASSIGN_OR_RETURN(auto daemon, Daemon::Start(options));
//   ... wait for SIGTERM ...
//   daemon->Drain();  // stops taking work, waits for consumers, shuts the server down
#ifndef FERRY_SERVER_SERVICE_DAEMON_H_
#define FERRY_SERVER_SERVICE_DAEMON_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "ferry/v1/config.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/memory/memory_budget.h"
#include "server/metrics/metrics_server.h"
#include "server/pipeline/worker_pool.h"
#include "server/service/channel_poller.h"
#include "server/service/config.h"
#include "server/service/ferry_service.h"
#include "server/service/grpc_acceptor.h"
#include "server/service/job_manager.h"
#include "server/service/session_server.h"
#include "server/topology/topology.h"
#include "server/transport/gpu_provider.h"

namespace ferry {

inline constexpr char kFerryVersion[] = "0.1.0";

struct DaemonOptions {
  std::string config_path;  // empty: ImplicitConfigPath (config.h), else defaults
  std::string listen;       // overrides unix_socket
  int workers = -1;         // overrides workers_per_node when >= 0
  std::string log_level;    // overrides log_level when set (ParseLogSeverity checked it)
};

class Daemon final {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();

  // Graceful stop: refuse new work, give consumers up to drain_timeout_seconds to release
  // their batches, then close every stream and the sockets.
  void Drain();
  // How long Drain may take at most: the drain timeout and kStopGrace for the rest (calls
  // still running, the workers' last samples). ferryd_main exits regardless after this.
  static constexpr absl::Duration kStopGrace = absl::Seconds(10);
  absl::Duration stop_limit() const {
    return absl::Seconds(config_.config.drain_timeout_seconds()) + kStopGrace;
  }

  const std::string& socket_path() const { return config_.config.unix_socket(); }

 private:
  Daemon() = default;
  void FillDaemonStatus(ferry::v1::DaemonStatus* status);
  // What a metrics scrape shows: GetStatus as root sees it, every job of every user.
  ferry::v1::GetStatusResponse FullStatus();
  // The Drain RPC: root or ferryd's own uid only.
  absl::StatusOr<uint32_t> BeginGracefulDrain(const Caller& caller);
  // remove_socket_directory: rmdir of the sockets' directory, unless a client holds its lock.
  void RemoveSocketDirectory();
  void NotifyLoop();

  LoadedConfig config_;
  Topology topology_;
  absl::Time start_time_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<MemoryBudget> host_budget_;
  std::unique_ptr<MemoryBudget> pinned_budget_;
  std::unique_ptr<GpuProvider> gpus_;  // null without CUDA
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<SessionServer> sessions_;
  std::unique_ptr<ChannelPoller> channels_;  // reads every Consume stream's batch channel
  std::unique_ptr<FerryService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<GrpcAcceptor> acceptor_;  // feeds server_ the Unix socket's connections
  std::unique_ptr<MetricsServer> metrics_;  // null unless metrics_listen; reads jobs_, pool_
  absl::Notification stop_notify_;
  std::atomic<bool> drain_requested_{false};
  std::thread notify_thread_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_SERVICE_DAEMON_H_
