// The client's end of the session socket (common/session_protocol.h): the HELLO token that
// identifies this process to ferryd, and the hand-over of slab memfds and batch channels.
#ifndef FERRY_CLIENT_CPP_INTERNAL_SESSION_H_
#define FERRY_CLIENT_CPP_INTERNAL_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/batch_channel.h"
#include "common/unique_fd.h"

namespace ferry::internal {

// The user-facing error for "nothing answers at this address": names the gRPC socket, the
// session socket's connect error, and how to start a daemon. Keeps `connect_error`'s code.
absl::Status NoDaemonError(const std::string& grpc_socket, const absl::Status& connect_error);

// Thread-safe: FetchSlab and FetchChannel serialize their request/answer pairs on the socket.
class Session final {
 public:
  // Connects to SessionSocketPath(grpc_socket) and reads the HELLO. Errors come from
  // NoDaemonError when nothing answers.
  static absl::StatusOr<std::unique_ptr<Session>> Open(const std::string& grpc_socket);

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& token() const { return token_; }
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
  // the kernel closes its sockets before its parent can reap it). One poll(2), no wait;
  // the GPU transport asks before every batch, since a dead ferryd's device memory is gone.
  bool DaemonGone();

 private:
  Session(UniqueFd fd, std::string path, std::string token, int daemon_pid);

  // Constant after construction.
  const std::string path_;
  const std::string token_;
  const int daemon_pid_;

  absl::Mutex mu_;
  UniqueFd fd_ ABSL_GUARDED_BY(mu_);
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
