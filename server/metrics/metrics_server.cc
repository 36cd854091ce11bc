#include "server/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/session_protocol.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "server/metrics/prometheus_text.h"

namespace ferry {
namespace {

constexpr char kHeadEnd[] = "\r\n\r\n";  // ends a request head (4 bytes)
constexpr absl::Duration kOutOfDescriptorsRest = absl::Milliseconds(100);
constexpr absl::Duration kWarningEvery = absl::Seconds(10);

// A request head read to its end, as httplib's parser reads it; what the parser writes
// goes to `out`. Never touches the socket: the loop does.
class BufferedStream final : public httplib::Stream {
 public:
  BufferedStream(absl::string_view in, std::string* out) : in_(in), out_(out) {}
  bool is_readable() const override { return !in_.empty(); }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, in_.size());
    std::memcpy(ptr, in_.data(), n);
    in_.remove_prefix(n);
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    out_->append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { port = 0; }
  void get_local_ip_and_port(std::string& ip, int& port) const override { port = 0; }
  // No socket: httplib only compares it with FD_SETSIZE.
  socket_t socket() const override { return INVALID_SOCKET; }

 private:
  absl::string_view in_;
  std::string* out_;
};

// httplib's routing and response writing, driven by the loop one request at a time.
class Responder final : public httplib::Server {
 public:
  // Writes the answer to `head` (a request line and headers) into `out`.
  void Answer(absl::string_view head, std::string* out) {
    BufferedStream stream(head, out);
    bool closed = true;
    process_request(stream, /*close_connection=*/true, closed, [](httplib::Request&) {});
  }
};

absl::Status SystemError(const char* call) {
  return absl::Status(absl::ErrnoToStatusCode(errno), absl::StrCat(call, ": ", strerror(errno)));
}

absl::StatusOr<UniqueFd> ListenTcp(const MetricsAddress& address, int* bound_port) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_INET;
  if (address.host.find(':') != std::string::npos) {
    family = AF_INET6;
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(address.port));
    if (inet_pton(AF_INET6, address.host.c_str(), &in6->sin6_addr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("'", address.host, "' is not an address"));
    }
    length = sizeof(sockaddr_in6);
  } else {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&storage);
    in4->sin_family = AF_INET;
    in4->sin_port = htons(static_cast<uint16_t>(address.port));
    if (inet_pton(AF_INET, address.host.c_str(), &in4->sin_addr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("'", address.host, "' is not an address"));
    }
    length = sizeof(sockaddr_in);
  }
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return SystemError("socket");
  // SO_REUSEADDR only (a restart may bind at once): with SO_REUSEPORT a second ferryd would
  // share the port and answer half the scrapes.
  int yes = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  if (family == AF_INET6) setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &yes, sizeof(yes));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&storage), length) != 0 ||
      ::listen(fd.get(), SOMAXCONN) != 0) {
    return SystemError("bind");
  }
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&storage), &length) != 0) {
    return SystemError("getsockname");
  }
  *bound_port = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&storage)->sin_port);
  return fd;
}

}  // namespace

// The event loop: accepts, reads request heads, answers and writes, all without blocking.
// Owned and run by MetricsServer's thread only.
class MetricsServer::Loop {
 public:
  Loop(UniqueFd listener, int wake, MetricsLimits limits, StatusSource source,
       MetricsServer* counters)
      : listener_(std::move(listener)),
        wake_(wake),
        limits_(limits),
        source_(std::move(source)),
        counters_(counters),
        spare_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {
    responder_.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
      response.set_content(StatusToPrometheus(source_()), kPrometheusContentType);
    });
  }

  void Run() {
    NameThisThread("ferry-metrics");
    std::vector<pollfd> fds;
    std::vector<std::list<Connection>::iterator> polled;
    for (;;) {
      const absl::Time now = absl::Now();
      ExpireConnections(now);
      fds.clear();
      polled.clear();
      fds.push_back({wake_, POLLIN, 0});
      const bool resting = now < listener_rests_until_;
      fds.push_back({listener_.get(), static_cast<short>(resting ? 0 : POLLIN), 0});
      absl::Time next = resting ? listener_rests_until_ : absl::InfiniteFuture();
      for (auto it = connections_.begin(); it != connections_.end(); ++it) {
        fds.push_back({it->fd.get(), static_cast<short>(it->answered ? POLLOUT : POLLIN), 0});
        polled.push_back(it);
        next = std::min(next, it->deadline);
      }
      int timeout_ms = -1;
      if (next != absl::InfiniteFuture()) {
        timeout_ms = static_cast<int>(
            std::clamp<int64_t>(absl::ToInt64Milliseconds(next - now) + 1, 0, 60'000));
      }
      if (poll(fds.data(), fds.size(), timeout_ms) < 0) {
        if (errno == EINTR) continue;
        FERRY_LOG(ERROR) << "metrics: poll failed: " << strerror(errno) << "; stopping";
        return;
      }
      if (fds[0].revents != 0) return;  // the destructor asks us to stop
      for (size_t i = 0; i < polled.size(); ++i) {
        const short events = fds[i + 2].revents;
        if (events == 0) continue;
        Connection& c = *polled[i];
        const bool keep = c.answered ? Write(c) : Read(c);
        if (!keep) Drop(polled[i]);
      }
      if (fds[1].revents != 0) AcceptAll();
    }
  }

 private:
  struct Connection {
    UniqueFd fd;
    absl::Time deadline;    // the head must have come (reading), the answer gone (writing)
    std::string in;         // the request as read so far
    std::string out;        // the answer not yet written
    bool answered = false;  // `out` holds the whole answer
    bool refused = false;   // the answer is a refusal (431), counted as dropped
    bool finished = false;  // the whole answer went out
  };

  // Closes connections past their deadline.
  void ExpireConnections(absl::Time now) {
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (it->deadline <= now) Drop(it);
      it = next;
    }
  }

  void Drop(std::list<Connection>::iterator it) {
    if (!it->finished && !it->refused) counters_->dropped_.fetch_add(1, std::memory_order_relaxed);
    connections_.erase(it);
  }

  void AcceptAll() {
    for (;;) {
      UniqueFd fd(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!fd.valid()) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) ShedForWantOfDescriptors();
        return;  // EAGAIN: nothing more waiting
      }
      if (connections_.size() >= limits_.max_connections) {
        // The oldest that is still reading goes first; a client that sent its request is
        // answered.
        auto oldest = std::find_if(connections_.begin(), connections_.end(),
                                   [](const Connection& c) { return !c.answered; });
        if (oldest == connections_.end()) {
          counters_->dropped_.fetch_add(1, std::memory_order_relaxed);
          continue;  // `fd` closes: every slot is writing an answer
        }
        Drop(oldest);
      }
      Connection c;
      c.fd = std::move(fd);
      c.deadline = absl::Now() + limits_.request_timeout;
      connections_.push_back(std::move(c));
    }
  }

  // Out of descriptors: accept one waiting connection through the spare descriptor and
  // close it, so the listener does not stay readable forever; with no spare (or still out),
  // rest the listener a while.
  void ShedForWantOfDescriptors() {
    const absl::Time now = absl::Now();
    if (now - last_warning_ >= kWarningEvery) {
      FERRY_LOG(WARNING) << "metrics: out of file descriptors (" << strerror(errno)
                         << "); closing connections that wait to be accepted";
      last_warning_ = now;
    }
    if (spare_.valid()) {
      spare_.Reset();
      UniqueFd shed(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (shed.valid()) counters_->dropped_.fetch_add(1, std::memory_order_relaxed);
      shed.Reset();
      spare_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    }
    listener_rests_until_ = now + kOutOfDescriptorsRest;
  }

  // Reads what arrived; answers once the head is complete. False to close.
  bool Read(Connection& c) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = recv(c.fd.get(), buffer, sizeof(buffer), 0);
      if (n == 0) return false;  // closed before its request was complete
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      const size_t searched_from = c.in.size() < 4 ? 0 : c.in.size() - 3;
      c.in.append(buffer, static_cast<size_t>(n));
      const size_t end = c.in.find(kHeadEnd, searched_from);
      if (end != std::string::npos && end + 4 <= limits_.max_request_head_bytes) {
        c.in.resize(end + 4);  // a body, if any, is never read
        responder_.Answer(c.in, &c.out);
        return StartWriting(c);
      }
      if (c.in.size() > limits_.max_request_head_bytes) {
        c.out = absl::StrCat(
            "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain\r\n"
            "Connection: close\r\nContent-Length: ",
            kTooLargeBody.size(), "\r\n\r\n", kTooLargeBody);
        counters_->dropped_.fetch_add(1, std::memory_order_relaxed);
        c.refused = true;
        return StartWriting(c);
      }
    }
  }

  bool StartWriting(Connection& c) {
    c.in.clear();
    c.in.shrink_to_fit();
    c.answered = true;
    c.deadline = absl::Now() + limits_.request_timeout;
    return Write(c);
  }

  // Writes what the socket takes. False once all is written (the connection closes) or the
  // client is gone.
  bool Write(Connection& c) {
    while (!c.out.empty()) {
      const ssize_t n = send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        break;  // gone
      }
      c.out.erase(0, static_cast<size_t>(n));
    }
    if (c.out.empty()) {
      c.finished = true;
      if (!c.refused) counters_->answered_.fetch_add(1, std::memory_order_relaxed);
    }
    return false;
  }

  static constexpr absl::string_view kTooLargeBody =
      "request head too large: ferryd's metrics endpoint takes GET /metrics\n";

  const UniqueFd listener_;
  const int wake_;
  const MetricsLimits limits_;
  const StatusSource source_;
  MetricsServer* const counters_;
  Responder responder_;
  UniqueFd spare_;
  std::list<Connection> connections_;  // in accept order
  absl::Time listener_rests_until_ = absl::InfinitePast();
  absl::Time last_warning_ = absl::InfinitePast();
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsAddress& address,
                                                                    unsigned unix_mode,
                                                                    StatusSource source,
                                                                    MetricsLimits limits) {
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->address_ = address;
  std::string where = FormatMetricsAddress(address);
  UniqueFd listener;
  if (address.unix_socket) {
    // ListenUnix replaces a stale socket file and refuses one a live process serves.
    FERRY_ASSIGN_OR_RETURN(listener, ListenUnix(address.path, SOCK_STREAM, unix_mode));
    const int flags = fcntl(listener.get(), F_GETFL);
    fcntl(listener.get(), F_SETFL, flags | O_NONBLOCK);
  } else {
    absl::StatusOr<UniqueFd> tcp = ListenTcp(address, &m->bound_port_);
    if (!tcp.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot serve metrics on ", where, " (metrics_listen): ", tcp.status().message(),
          "; the address is in use or not this machine's: pick another or leave "
          "metrics_listen empty"));
    }
    listener = *std::move(tcp);
    MetricsAddress actual = address;
    actual.port = m->bound_port_;
    where = FormatMetricsAddress(actual);
  }
  m->wake_ = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!m->wake_.valid()) return SystemError("eventfd");
  m->loop_ = std::make_unique<Loop>(std::move(listener), m->wake_.get(), limits, std::move(source),
                                    m.get());
  m->thread_ = std::thread([loop = m->loop_.get()] { loop->Run(); });
  FERRY_LOG(INFO) << "serving metrics on http://" << where << "/metrics";
  return m;
}

MetricsServer::~MetricsServer() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    ssize_t unused = write(wake_.get(), &one, sizeof(one));
    (void)unused;
    thread_.join();
  }
  loop_.reset();  // closes the listener and every connection
  if (address_.unix_socket) unlink(address_.path.c_str());
}

}  // namespace ferry
