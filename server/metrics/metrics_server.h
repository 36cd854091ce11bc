// The HTTP endpoint that serves ferryd's metrics: GET /metrics answers the Prometheus text
// format of the status `source` returns at that moment (StatusToPrometheus); every other
// path is 404. Built on cpp-httplib (Debian's libcpp-httplib, which listens on TCP and on
// Unix sockets alike); docs/operations.md ("Metrics") says why that library.
//
//   FERRY_ASSIGN_OR_RETURN(auto metrics,
//                          MetricsServer::Start(address, 0660, [&] { return Status(); }));
//   ... metrics->bound_port() ...
//   metrics.reset();  // stops serving, removes a Unix socket
//
// Threads: one that accepts and a small pool that answers (kMetricsThreads); a scrape
// runs `source` on a pool thread, so `source` must be thread-safe and should not hold a
// daemon-wide lock for long. The destructor stops both and waits for them.
#ifndef FERRY_SERVER_METRICS_METRICS_SERVER_H_
#define FERRY_SERVER_METRICS_METRICS_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/metrics/metrics_address.h"

namespace httplib {
class Server;
}

namespace ferry {

// Threads answering scrapes (a Prometheus server scrapes one at a time).
inline constexpr int kMetricsThreads = 2;

class MetricsServer final {
 public:
  using StatusSource = std::function<ferry::v1::GetStatusResponse()>;

  // Binds `address` (a Unix socket with `unix_mode`, after the checks ListenUnix makes:
  // a stale socket file is replaced, a live one is refused) and starts serving.
  // UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const MetricsAddress& address,
                                                              unsigned unix_mode,
                                                              StatusSource source);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The TCP port bound (the one chosen when the address said port 0); 0 for a Unix socket.
  int bound_port() const { return bound_port_; }

 private:
  MetricsServer() = default;

  // Constant after construction
  MetricsAddress address_;
  int bound_port_ = 0;
  StatusSource source_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};  // set by thread_ when it stops serving
};

}  // namespace ferry

#endif  // FERRY_SERVER_METRICS_METRICS_SERVER_H_
