// The client's end of the session socket (common/session_protocol.h): the HELLO token that
// identifies this process to ferryd, and the hand-over of slab memfds and batch channels.
#ifndef FERRY_CLIENT_CPP_INTERNAL_SESSION_H_
#define FERRY_CLIENT_CPP_INTERNAL_SESSION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/batch_channel.h"
#include "common/unique_fd.h"

namespace ferry::internal {

// The user-facing error for "nothing answers at this address": names the gRPC socket, the
// session socket's connect error, and how to start a daemon. Keeps `connect_error`'s code.
absl::Status NoDaemonError(const std::string& grpc_socket, const absl::Status& connect_error);

// Thread-safe: FetchSlab and FetchChannel serialize their request/answer pairs on the socket.
class Session final {
 public:
  // How long ferryd may take to answer (HELLO, FD, CHANNEL). It answers from memory, so
  // only a wedged daemon gets near this.
  static constexpr absl::Duration kDefaultAnswerTimeout = absl::Seconds(30);

  // Connects to SessionSocketPath(grpc_socket) and reads the HELLO. Errors come from
  // NoDaemonError when nothing answers; DEADLINE_EXCEEDED when an answer takes longer
  // than `answer_timeout`.
  static absl::StatusOr<std::unique_ptr<Session>> Open(
      const std::string& grpc_socket, absl::Duration answer_timeout = kDefaultAnswerTimeout);

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The token to put on an RPC. When ferryd closed this session for idleness (it said
  // "BYE"), a new session is opened first, with the same daemon; if that fails, the old
  // token is returned and the RPC fails with ferryd's "unknown or closed ferry session".
  std::string token();
  int daemon_pid() const { return daemon_pid_; }

  struct Slab {
    UniqueFd fd;
    uint64_t bytes = 0;
  };
  // Asks for the memfd of attachment `attach_id` ("FD <id>" -> "OK <bytes>" + fd).
  absl::StatusOr<Slab> FetchSlab(const std::string& attach_id);

  // Asks for a batch channel for attachment `attach_id` ("CHANNEL <id>" -> "OK <bytes>" +
  // memfd and two wake sockets) and maps it. UNIMPLEMENTED from a ferryd that predates batch
  // channels (the caller then keeps batches on the gRPC stream).
  absl::StatusOr<std::unique_ptr<BatchChannel>> FetchChannel(const std::string& attach_id);

  // True once ferryd's end of the session socket is closed (ferryd exited or was killed:
  // the kernel closes its sockets before its parent can reap it), and not after a "BYE"
  // (ferryd closed an idle session: the next use opens another). One poll(2), no wait;
  // the GPU transport asks before every batch, since a dead ferryd's device memory is gone.
  bool DaemonGone();

 private:
  struct Greeted {
    UniqueFd fd;
    std::string token;
    int daemon_pid = 0;
  };
  // Connects to the session socket `path` (of `grpc_socket`), checks who serves it and
  // reads the HELLO.
  static absl::StatusOr<Greeted> Connect(const std::string& grpc_socket, const std::string& path,
                                         absl::Duration answer_timeout);

  Session(Greeted greeted, std::string grpc_socket, std::string path,
          absl::Duration answer_timeout);

  // Opens a new session with the same daemon in place of this one. UNAVAILABLE when
  // another daemon answers now.
  absl::Status ReconnectLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When ferryd said "BYE" on the session socket, opens a new session in its place.
  void RenewIfClosedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Sends `request` and returns ferryd's answer to it (with its fds in `fds`).
  // DEADLINE_EXCEEDED after answer_timeout_; `what` names the request in errors.
  absl::StatusOr<std::string> Ask(const std::string& request, const std::string& what,
                                  std::vector<UniqueFd>* fds);

  // Constant after construction.
  const std::string grpc_socket_;
  const std::string path_;
  const int daemon_pid_;
  const absl::Duration answer_timeout_;

  absl::Mutex mu_;  // one request/answer pair at a time
  // The socket is only read and written under mu_; DaemonGone polls `polled_fd_`, its
  // number, without the lock (it must not wait behind a slow request).
  UniqueFd fd_ ABSL_GUARDED_BY(mu_);
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> polled_fd_;
  // Requests whose answer did not come in time. ferryd answers every request, in order, so
  // the next this many packets are those late answers: Ask drops them (and their fds)
  // instead of taking one for the answer to its own request.
  int unanswered_ ABSL_GUARDED_BY(mu_) = 0;
};

// A read-only, shared mapping of a whole file; unmapped on destruction. Thread-compatible
// (immutable after creation).
class SlabMapping final {
 public:
  // Maps `bytes` bytes of `fd` (PROT_READ, MAP_SHARED). The fd may be closed afterwards.
  static absl::StatusOr<std::shared_ptr<const SlabMapping>> Create(int fd, uint64_t bytes);
  ~SlabMapping();
  SlabMapping(const SlabMapping&) = delete;
  SlabMapping& operator=(const SlabMapping&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  SlabMapping(const uint8_t* data, uint64_t size) : data_(data), size_(size) {}
  const uint8_t* const data_;
  const uint64_t size_;
};

}  // namespace ferry::internal

#endif  // FERRY_CLIENT_CPP_INTERNAL_SESSION_H_
