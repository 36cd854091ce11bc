#include "server/service/grpc_acceptor.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/thread_name.h"
#include "grpcpp/server.h"
#include "grpcpp/server_posix.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<GrpcAcceptor>> GrpcAcceptor::Start(UniqueFd listener,
                                                                  grpc::Server* server) {
  UniqueFd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));
  std::unique_ptr<GrpcAcceptor> acceptor(
      new GrpcAcceptor(std::move(listener), std::move(wake), server));
  acceptor->thread_ = std::thread([a = acceptor.get()] { a->Run(); });
  return acceptor;
}

GrpcAcceptor::GrpcAcceptor(UniqueFd listener, UniqueFd wake, grpc::Server* server)
    : listener_(std::move(listener)),
      wake_(std::move(wake)),
      server_(server),
      spare_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

GrpcAcceptor::~GrpcAcceptor() {
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void GrpcAcceptor::Run() {
  NameThisThread("ferry-accept");
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      FERRY_LOG(ERROR) << "gRPC acceptor: poll: " << strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    if (!AcceptOne()) {
      // Out of descriptors with none to spare: wait for some to come back, still waking
      // for the destructor.
      pollfd wake = {wake_.get(), POLLIN, 0};
      if (poll(&wake, 1, 100) > 0) return;
    }
  }
}

bool GrpcAcceptor::AcceptOne() {
  // Non-blocking, as gRPC's endpoints expect of the descriptors they are given.
  const int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd >= 0) {
    accepted_.fetch_add(1, std::memory_order_relaxed);
    grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns the descriptor from here
    return true;
  }
  const int err = errno;
  if (err != EMFILE && err != ENFILE) return true;  // the client left, or a signal
  FERRY_LOG_EVERY_N_SEC(WARNING, 10)
      << "ferryd is out of file descriptors (" << strerror(err)
      << "): closing waiting gRPC connections until some come back; raise LimitNOFILE or "
         "close idle clients";
  if (!spare_.valid()) {
    spare_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    return false;
  }
  // Give up the spare, take the waiting connection with it and close it at once: the
  // listener's backlog drains, so clients learn at once rather than hang.
  spare_.Reset();
  UniqueFd shed(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (shed.valid()) shed_.fetch_add(1, std::memory_order_relaxed);
  shed.Reset();
  spare_.Reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  return spare_.valid();
}

}  // namespace ferry
