// Accepts the connections of ferryd's gRPC Unix socket itself and hands each to the gRPC
// server (grpc::AddInsecureChannelFromFd), instead of letting gRPC listen: gRPC's own
// listener stops for good after one accept4 fails with EMFILE (grpc/grpc#16058, #20418),
// so a user who opens enough idle connections would leave every other user's `ferryctl`
// and trainers unanswered even after closing them. This one keeps accepting: out of
// descriptors, it sheds the oldest waiting connection through a spare descriptor (the
// client sees the connection closed and may retry), backs off, and serves again as soon as
// descriptors come back.
//
//   FERRY_ASSIGN_OR_RETURN(auto acceptor, GrpcAcceptor::Start(std::move(listener), server));
//   ...
//   acceptor.reset();  // stops accepting (before the server shuts down)
//
// Thread-safe; one thread of its own.
#ifndef FERRY_SERVER_SERVICE_GRPC_ACCEPTOR_H_
#define FERRY_SERVER_SERVICE_GRPC_ACCEPTOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace grpc {
class Server;
}

namespace ferry {

class GrpcAcceptor final {
 public:
  // `listener`: a listening SOCK_STREAM socket (ListenUnix). `server` must outlive the
  // acceptor and be started (BuildAndStart) with no listening port of this socket.
  static absl::StatusOr<std::unique_ptr<GrpcAcceptor>> Start(UniqueFd listener,
                                                             grpc::Server* server);
  ~GrpcAcceptor();
  GrpcAcceptor(const GrpcAcceptor&) = delete;
  GrpcAcceptor& operator=(const GrpcAcceptor&) = delete;

  // Connections handed to gRPC, and those shed for want of descriptors, since Start.
  uint64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  uint64_t shed() const { return shed_.load(std::memory_order_relaxed); }

 private:
  GrpcAcceptor(UniqueFd listener, UniqueFd wake, grpc::Server* server);
  void Run();
  // One accept; false when the listener is out of descriptors and nothing could be shed.
  bool AcceptOne();

  const UniqueFd listener_;
  const UniqueFd wake_;  // eventfd: written by the destructor
  grpc::Server* const server_;
  UniqueFd spare_;  // /dev/null, given up to shed a connection when out of descriptors
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> shed_{0};
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_SERVICE_GRPC_ACCEPTOR_H_
