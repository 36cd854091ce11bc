#include "server/metrics/metrics_server.h"

#include <httplib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/session_protocol.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "server/metrics/prometheus_text.h"

namespace ferry {
namespace {

// A scrape is one small GET: bound what a connection may hold.
constexpr time_t kTimeoutSeconds = 5;
constexpr size_t kMaxRequestBodyBytes = 4096;
constexpr size_t kMaxRequestsPerConnection = 100;

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsAddress& address,
                                                                    unsigned unix_mode,
                                                                    StatusSource source) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->address_ = address;
  m->source_ = std::move(source);
  m->server_ = std::make_unique<httplib::Server>();
  httplib::Server& server = *m->server_;
  MetricsServer* raw = m.get();
  server.Get("/metrics", [raw](const httplib::Request&, httplib::Response& response) {
    response.set_content(StatusToPrometheus(raw->source_()), kPrometheusContentType);
  });
  server.new_task_queue = [] { return new httplib::ThreadPool(kMetricsThreads); };
  server.set_read_timeout(kTimeoutSeconds);
  server.set_write_timeout(kTimeoutSeconds);
  server.set_keep_alive_timeout(kTimeoutSeconds);
  server.set_keep_alive_max_count(kMaxRequestsPerConnection);
  server.set_payload_max_length(kMaxRequestBodyBytes);
  // The library's default sets SO_REUSEPORT, with which a second ferryd would share the
  // port and answer half the scrapes: only SO_REUSEADDR (a restart may bind at once).
  server.set_socket_options([](int fd) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });

  std::string where = FormatMetricsAddress(address);
  bool bound = false;
  if (address.unix_socket) {
    // ListenUnix replaces a stale socket file and refuses one a live process serves; the
    // library then binds the same path again.
    {
      FERRY_ASSIGN_OR_RETURN(UniqueFd probe, ListenUnix(address.path, SOCK_STREAM, unix_mode));
      probe.Reset();
      unlink(address.path.c_str());
    }
    server.set_address_family(AF_UNIX);
    bound = server.bind_to_port(address.path, 80);
    if (bound) chmod(address.path.c_str(), unix_mode);
  } else if (address.port == 0) {
    m->bound_port_ = server.bind_to_any_port(address.host);
    bound = m->bound_port_ > 0;
  } else {
    bound = server.bind_to_port(address.host, address.port);
    m->bound_port_ = address.port;
  }
  if (!bound) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", where,
                     " (metrics_listen): the address is in use or not this machine's; pick "
                     "another or leave metrics_listen empty"));
  }
  if (m->bound_port_ != 0) {
    MetricsAddress actual = address;
    actual.port = m->bound_port_;
    where = FormatMetricsAddress(actual);
  }
  m->thread_ = std::thread([raw] {
    NameThisThread("ferry-metrics");  // the answering pool, started from here, inherits it
    raw->server_->listen_after_bind();
    raw->listen_returned_.store(true);
  });
  FERRY_LOG(INFO) << "serving metrics on http://" << where << "/metrics";
  return m;
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    // stop() takes effect only once the thread listens; listen_after_bind returns at once
    // when it fails, and is_running() then never turns true.
    while (!server_->is_running() && !listen_returned_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    server_->stop();
    thread_.join();
  }
  if (address_.unix_socket) unlink(address_.path.c_str());
}

}  // namespace ferry
