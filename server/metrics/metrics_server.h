// The HTTP endpoint that serves ferryd's metrics: GET /metrics answers the Prometheus text
// format of the status `source` returns at that moment (StatusToPrometheus); every other
// path is 404. cpp-httplib (Debian's libcpp-httplib) parses each request and writes its
// answer; the connections are ferryd's own, so that what one client may hold is bounded
// (docs/operations.md, "Metrics", says why):
//   - at most MetricsLimits::max_connections are open; a new one beyond that closes the
//     oldest that has not sent its request yet (an idle flood cannot keep a scrape out);
//   - a request head (request line and headers) over max_request_head_bytes is answered
//     431 and closed, one not complete within request_timeout is closed; a body is never
//     read; one request per connection (the answer says "Connection: close");
//   - an answer not taken by the client within request_timeout is dropped;
//   - out of file descriptors, a waiting connection is accepted and closed through a spare
//     descriptor, and accepting goes on once descriptors come back.
//
//   FERRY_ASSIGN_OR_RETURN(auto metrics,
//                          MetricsServer::Start(address, 0660, [&] { return Status(); }));
//   ... metrics->bound_port() ...
//   metrics.reset();  // stops serving, removes a Unix socket
//
// One thread (ferry-metrics) polls every connection and runs `source` for each complete
// request, so `source` must be thread-safe and should not hold a daemon-wide lock for long.
// The destructor stops the thread and waits for it.
#ifndef FERRY_SERVER_METRICS_METRICS_SERVER_H_
#define FERRY_SERVER_METRICS_METRICS_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "ferry/v1/ferry.pb.h"
#include "server/metrics/metrics_address.h"

namespace ferry {

struct MetricsLimits {
  size_t max_connections = 64;
  size_t max_request_head_bytes = 16 << 10;
  absl::Duration request_timeout = absl::Seconds(5);
};

class MetricsServer final {
 public:
  using StatusSource = std::function<ferry::v1::GetStatusResponse()>;

  // Binds `address` (a Unix socket with `unix_mode`, after the checks ListenUnix makes:
  // a stale socket file is replaced, a live one is refused) and starts serving.
  // UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsAddress& address, unsigned unix_mode, StatusSource source,
      MetricsLimits limits = MetricsLimits());
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The TCP port bound (the one chosen when the address said port 0); 0 for a Unix socket.
  int bound_port() const { return bound_port_; }

  // Since Start: requests answered (any status), and connections closed unanswered (shed
  // for a newer one or for want of descriptors, too slow, or a head over the bound).
  uint64_t answered() const { return answered_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  class Loop;
  MetricsServer() = default;

  // Constant after Start
  MetricsAddress address_;
  int bound_port_ = 0;
  UniqueFd wake_;  // eventfd: written by the destructor to stop the loop
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  std::atomic<uint64_t> answered_{0};
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace ferry

#endif  // FERRY_SERVER_METRICS_METRICS_SERVER_H_
