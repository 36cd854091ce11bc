#include "client/cpp/internal/session.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/session_protocol.h"
#include "common/status_macros.h"

namespace ferry::internal {
namespace {

absl::Status Annotate(const absl::Status& status, const std::string& path,
                      const std::string& what) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(what, " on session socket ", path, ": ", status.message()));
}

// RecvPacket by `deadline` (`timeout` after the request), so a wedged daemon yields an
// error instead of a hang.
absl::StatusOr<std::string> RecvWithTimeout(int sock, const std::string& path,
                                            const std::string& what, absl::Duration timeout,
                                            absl::Time deadline,
                                            std::vector<UniqueFd>* fds = nullptr) {
  pollfd p{sock, POLLIN, 0};
  int n;
  do {
    const int64_t left_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    n = ::poll(&p, 1, static_cast<int>(left_ms));
  } while (n < 0 && errno == EINTR);
  if (n < 0) return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
  if (n == 0) {
    return absl::DeadlineExceededError(absl::StrCat("ferryd did not answer ", what, " within ",
                                                    absl::FormatDuration(timeout), " on ", path,
                                                    "; is it wedged? 'ferryctl status' asks it"));
  }
  absl::StatusOr<std::string> packet = RecvPacket(sock, fds);
  if (!packet.ok()) return Annotate(packet.status(), path, what);
  return packet;
}

}  // namespace

absl::Status NoDaemonError(const std::string& grpc_socket, const absl::Status& connect_error) {
  if (connect_error.code() == absl::StatusCode::kPermissionDenied) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot use ferryd at ", grpc_socket, " (", connect_error.message(),
        "); ask to be added to the group 'ferry', or pass the address of a ferryd you may use"));
  }
  return absl::Status(connect_error.code(),
                      absl::StrCat("no ferryd at ", grpc_socket, " (", connect_error.message(),
                                   "); start one with 'ferryd' (per-user) or 'systemctl start "
                                   "ferryd', or pass the address"));
}

Session::Session(Greeted greeted, std::string grpc_socket, std::string path,
                 absl::Duration answer_timeout)
    : grpc_socket_(std::move(grpc_socket)),
      path_(std::move(path)),
      daemon_pid_(greeted.daemon_pid),
      answer_timeout_(answer_timeout),
      fd_(std::move(greeted.fd)),
      token_(std::move(greeted.token)),
      polled_fd_(fd_.get()) {}

absl::StatusOr<Session::Greeted> Session::Connect(const std::string& grpc_socket,
                                                  const std::string& path,
                                                  absl::Duration answer_timeout) {
  absl::StatusOr<UniqueFd> fd = ConnectUnix(path, SOCK_SEQPACKET);
  if (!fd.ok()) {
    const absl::StatusCode code = fd.status().code();
    if (code == absl::StatusCode::kNotFound || code == absl::StatusCode::kUnavailable ||
        code == absl::StatusCode::kPermissionDenied) {
      return NoDaemonError(grpc_socket, fd.status());
    }
    return fd.status();
  }
  // Before anything is sent: the daemon is trusted, and so is the directory its sockets
  // live in (the gRPC socket beside this one cannot have been swapped).
  absl::Status trusted = CheckDaemonPeer(fd->get(), path);
  if (trusted.ok()) trusted = CheckSocketDirectory(path);
  if (!trusted.ok()) return trusted;
  absl::StatusOr<std::string> hello =
      RecvWithTimeout(fd->get(), path, "HELLO", answer_timeout, absl::Now() + answer_timeout);
  if (!hello.ok()) return hello.status();
  if (absl::StartsWith(*hello, "ERR ")) {  // refused: too many sessions, out of descriptors
    return absl::ResourceExhaustedError(
        absl::StrCat("ferryd at ", grpc_socket, " refused the session: ", hello->substr(4)));
  }
  std::vector<std::string> parts = absl::StrSplit(*hello, ' ');
  Greeted greeted;
  if (parts.size() != 3 || parts[0] != "HELLO" || parts[1].empty() ||
      !absl::SimpleAtoi(parts[2], &greeted.daemon_pid)) {
    return absl::InternalError(absl::StrCat("unexpected greeting '", hello->substr(0, 100), "' on ",
                                            path, "; is it a ferryd of another version?"));
  }
  greeted.fd = *std::move(fd);
  greeted.token = parts[1];
  return greeted;
}

absl::StatusOr<std::unique_ptr<Session>> Session::Open(const std::string& grpc_socket,
                                                       absl::Duration answer_timeout) {
  const std::string path = SessionSocketPath(grpc_socket);
  absl::StatusOr<Greeted> greeted = Connect(grpc_socket, path, answer_timeout);
  if (!greeted.ok()) return greeted.status();
  return std::unique_ptr<Session>(
      new Session(*std::move(greeted), grpc_socket, path, answer_timeout));
}

namespace {

// True when the next packet on `fd` is ferryd's "BYE" (left unread).
bool ByeIsWaiting(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) != 1 || (p.revents & POLLIN) == 0) return false;
  char head[4];
  const ssize_t n = recv(fd, head, sizeof(head), MSG_PEEK | MSG_DONTWAIT);
  return n == 4 && std::memcmp(head, "BYE ", 4) == 0;
}

}  // namespace

absl::Status Session::ReconnectLocked() {
  absl::StatusOr<Greeted> greeted = Connect(grpc_socket_, path_, answer_timeout_);
  if (!greeted.ok()) return greeted.status();
  if (greeted->daemon_pid != daemon_pid_) {
    // Another daemon in ferryd's place knows nothing of this client: the closed session
    // stays, and its token fails as the restart made it fail.
    return absl::UnavailableError(absl::StrCat("ferryd (pid ", daemon_pid_, ") at ", path_,
                                               " was replaced by pid ", greeted->daemon_pid));
  }
  fd_ = std::move(greeted->fd);
  token_ = std::move(greeted->token);
  polled_fd_.store(fd_.get());
  unanswered_ = 0;
  return absl::OkStatus();
}

void Session::RenewIfClosedLocked() {
  if (ByeIsWaiting(fd_.get())) (void)ReconnectLocked();
}

std::string Session::token() {
  absl::MutexLock lock(&mu_);
  RenewIfClosedLocked();
  return token_;
}

bool Session::DaemonGone() {
  const int fd = polled_fd_.load();
  pollfd p{fd, POLLRDHUP, 0};
  // POLLHUP and POLLERR are reported whether asked or not.
  if (poll(&p, 1, 0) != 1 || (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) return false;
  return !ByeIsWaiting(fd);
}

absl::StatusOr<std::string> Session::Ask(const std::string& request, const std::string& what,
                                         std::vector<UniqueFd>* fds) {
  absl::MutexLock lock(&mu_);
  RenewIfClosedLocked();
  for (int attempt = 0;; ++attempt) {
    absl::Status sent = SendPacket(fd_.get(), request);
    if (!sent.ok() && !(attempt == 0 && ByeIsWaiting(fd_.get()))) {
      return Annotate(sent, path_, absl::StrCat("sending ", what));
    }
    const absl::Time deadline = absl::Now() + answer_timeout_;
    for (;;) {
      fds->clear();
      absl::StatusOr<std::string> answer =
          RecvWithTimeout(fd_.get(), path_, what, answer_timeout_, deadline, fds);
      if (absl::IsDeadlineExceeded(answer.status())) ++unanswered_;  // this one comes late
      if (answer.ok() && unanswered_ == 0 && attempt == 0 && absl::StartsWith(*answer, "BYE ")) {
        // ferryd closed the session for idleness as the request went out: once more, on a
        // new session.
        FERRY_RETURN_IF_ERROR(ReconnectLocked());
        break;
      }
      if (!answer.ok() || unanswered_ == 0) return answer;
      --unanswered_;  // the late answer to an earlier request: dropped with its fds
    }
  }
}

absl::StatusOr<Session::Slab> Session::FetchSlab(const std::string& attach_id) {
  Slab slab;
  std::vector<UniqueFd> fds;
  absl::StatusOr<std::string> answer =
      Ask(absl::StrCat("FD ", attach_id), "the slab request", &fds);
  if (!answer.ok()) return answer.status();
  if (!fds.empty()) slab.fd = std::move(fds[0]);
  absl::string_view text = *answer;
  if (absl::ConsumePrefix(&text, "ERR ")) {
    return absl::FailedPreconditionError(
        absl::StrCat("ferryd refused the slab of attachment ", attach_id, ": ", text));
  }
  if (!absl::ConsumePrefix(&text, "OK ") || !absl::SimpleAtoi(text, &slab.bytes)) {
    return absl::InternalError(
        absl::StrCat("unexpected answer '", answer->substr(0, 100), "' to FD on ", path_));
  }
  if (!slab.fd.valid()) {
    return absl::InternalError(
        absl::StrCat("ferryd answered OK on ", path_, " but attached no file descriptor"));
  }
  return slab;
}

absl::StatusOr<std::unique_ptr<BatchChannel>> Session::FetchChannel(const std::string& attach_id) {
  std::vector<UniqueFd> fds;
  absl::StatusOr<std::string> answer =
      Ask(absl::StrCat("CHANNEL ", attach_id), "the batch channel request", &fds);

  if (!answer.ok()) return answer.status();
  absl::string_view text = *answer;
  if (absl::ConsumePrefix(&text, "ERR ")) {
    if (absl::StartsWith(text, "unknown request")) {
      return absl::UnimplementedError(
          absl::StrCat("ferryd at ", path_, " has no batch channels: ", text));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("ferryd refused a batch channel for attachment ", attach_id, ": ", text));
  }
  if (!absl::ConsumePrefix(&text, "OK ") || fds.size() != 3) {
    return absl::InternalError(absl::StrCat("unexpected answer '", answer->substr(0, 100),
                                            "' with ", fds.size(), " fds to CHANNEL on ", path_,
                                            " (expected OK and 3 fds)"));
  }
  absl::StatusOr<std::unique_ptr<BatchChannel>> channel =
      BatchChannel::Attach(std::move(fds[0]), std::move(fds[1]), std::move(fds[2]));
  if (!channel.ok()) return Annotate(channel.status(), path_, "mapping the batch channel");
  return channel;
}

absl::StatusOr<std::shared_ptr<const SlabMapping>> SlabMapping::Create(int fd, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot map an empty slab");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat(slab memfd): ", strerror(errno)));
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InternalError(
        absl::StrCat("slab memfd holds ", st.st_size, " bytes, ferryd announced ", bytes));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    return absl::Status(
        err == ENOMEM ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal,
        absl::StrCat("mmap of the ", bytes, "-byte slab: ", strerror(err)));
  }
  return std::shared_ptr<const SlabMapping>(new SlabMapping(static_cast<const uint8_t*>(p), bytes));
}

SlabMapping::~SlabMapping() { ::munmap(const_cast<uint8_t*>(data_), size_); }

}  // namespace ferry::internal
