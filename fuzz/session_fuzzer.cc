// libFuzzer harness: ferryd's session socket with a hostile client. One SessionServer runs
// for the whole fuzzing process; each input is one session whose requests are the input's
// packets (a length byte, then that many bytes). Every answer is read; the server must
// answer or close the session, never crash, and keep greeting the next client.
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/service/session_server.h"

namespace {

ferry::SessionServer* Server() {
  static ferry::SessionServer* server = [] {
    static std::string dir = "/tmp/ferry-fuzz-session-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) abort();
    auto started = ferry::SessionServer::Start(
        dir + "/ferryd.session.sock", 0600,
        [](const ferry::PeerCredentials&,
           const std::string& attach_id) -> absl::StatusOr<std::pair<int, uint64_t>> {
          if (attach_id == "ok") return std::make_pair(STDERR_FILENO, uint64_t{4096});
          return absl::NotFoundError(absl::StrCat("no attachment '", attach_id, "'"));
        },
        [](const ferry::PeerCredentials&, const std::string&) {
          return ferry::BatchChannel::Create(8);
        });
    if (!started.ok()) abort();
    return started->release();  // lives until exit
  }();
  return server;
}

// libFuzzer's -timeout interrupts with SIGALRM every second: poll again on EINTR.
bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int n;
  do {
    n = poll(&p, 1, timeout_ms);
  } while (n < 0 && errno == EINTR);
  return n == 1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto fd = ferry::ConnectUnix(Server()->path(), SOCK_SEQPACKET);
  if (!fd.ok()) abort();
  if (!Readable(fd->get(), 5000)) abort();  // no greeting: the server is stuck
  auto hello = ferry::RecvPacket(fd->get());
  if (!hello.ok() || !absl::StartsWith(*hello, "HELLO ")) abort();
  while (size > 0) {
    const size_t n = std::min<size_t>(data[0], size - 1);
    const std::string request(reinterpret_cast<const char*>(data + 1), n);
    data += n + 1;
    size -= n + 1;
    if (!ferry::SendPacket(fd->get(), request).ok()) break;
    if (!Readable(fd->get(), 5000)) abort();  // every request is answered (or the end seen)
    std::vector<ferry::UniqueFd> fds;
    if (!ferry::RecvPacket(fd->get(), &fds).ok()) break;  // the server closed the session
  }
  return 0;
}
