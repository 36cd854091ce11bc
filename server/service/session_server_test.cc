// ferryd's session socket against misbehaving clients: one that never reads its answers,
// and one user's sessions hoarding batch channels. Neither may cost another client its
// service.
#include "server/service/session_server.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

class SessionServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = "/tmp/ferry-sessions-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);  // for the other user's client below
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartServer() {
    auto server = SessionServer::Start(
        dir_ + "/ferryd.session.sock", 0666,
        [](const PeerCredentials&, const std::string& attach_id)
            -> absl::StatusOr<std::pair<int, uint64_t>> {
          return absl::NotFoundError(absl::StrCat("no attachment '", attach_id, "'"));
        },
        [](const PeerCredentials&, const std::string&) { return BatchChannel::Create(8); });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // A connected session whose HELLO was read, or an invalid fd.
  UniqueFd Connect() {
    auto fd = ConnectUnix(server_->path(), SOCK_SEQPACKET);
    if (!fd.ok()) return UniqueFd();
    if (!Readable(fd->get())) return UniqueFd();
    auto hello = RecvPacket(fd->get());
    if (!hello.ok() || !absl::StartsWith(*hello, "HELLO ")) return UniqueFd();
    return *std::move(fd);
  }

  static bool Readable(int fd, int timeout_ms = 10000) {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, timeout_ms) == 1;
  }

  // Sends `request` and returns the answer ("" when none came within 10 s).
  static std::string Ask(int fd, const std::string& request) {
    std::vector<UniqueFd> fds;
    if (!SendPacket(fd, request).ok() || !Readable(fd)) return "";
    auto answer = RecvPacket(fd, &fds);
    return answer.ok() ? *answer : "";
  }

  std::string dir_;
  std::unique_ptr<SessionServer> server_;
};

TEST_F(SessionServerTest, AClientThatDoesNotReadItsAnswersIsClosedAndOthersAreServed) {
  StartServer();
  UniqueFd hoarder = Connect();
  ASSERT_TRUE(hoarder.valid());
  // Requests without reading a single answer, until ferryd's answers fill this socket
  // and it gives up on the session (the send fails: the peer is gone).
  int sent = 0;
  for (int tries = 0; tries < 20000; ++tries) {
    if (send(hoarder.get(), "FD x", 4, MSG_DONTWAIT | MSG_NOSIGNAL) == 4) {
      ++sent;
    } else if (errno == EAGAIN) {
      usleep(500);  // ferryd has not read the earlier ones yet
    } else {
      break;
    }
  }
  ASSERT_GT(sent, 0);
  // ferryd's one session thread is not stuck on it: a new client is greeted and answered.
  UniqueFd other = Connect();
  ASSERT_TRUE(other.valid()) << "no HELLO while a client sat on " << sent << " answers";
  EXPECT_EQ(Ask(other.get(), "FD y"), "ERR NOT_FOUND: no attachment 'y'");
  // The hoarder's session was closed: after the answers that fit, its socket ends.
  bool ended = false;
  for (int i = 0; i < 200000 && Readable(hoarder.get()); ++i) {
    char buf[256];
    if (recv(hoarder.get(), buf, sizeof(buf), 0) <= 0) {
      ended = true;
      break;
    }
  }
  EXPECT_TRUE(ended);
}

TEST_F(SessionServerTest, WaitingChannelsAreCappedPerUidSoOneUserCannotLockOutAnother) {
  StartServer();
  const size_t per_session = SessionServer::kMaxWaitingChannelsPerSession;
  const size_t sessions = SessionServer::kMaxWaitingChannelsPerUid / per_session;
  std::vector<UniqueFd> mine;
  for (size_t s = 0; s < sessions; ++s) {
    mine.push_back(Connect());
    ASSERT_TRUE(mine.back().valid());
    for (size_t c = 0; c < per_session; ++c) {
      ASSERT_TRUE(absl::StartsWith(Ask(mine.back().get(), absl::StrCat("CHANNEL a", s, "-", c)),
                                   "OK "));
    }
  }
  UniqueFd one_more = Connect();
  ASSERT_TRUE(one_more.valid());
  const std::string refused = Ask(one_more.get(), "CHANNEL b");
  EXPECT_TRUE(absl::StrContains(refused, absl::StrCat("the sessions of uid ", getuid(), " hold ",
                                                      SessionServer::kMaxWaitingChannelsPerUid,
                                                      " batch channels that no Consume stream "
                                                      "opened")))
      << refused;
  // A session that closes takes its channels with it, and its uid may fetch again.
  mine.pop_back();
  bool fetched = false;
  for (int i = 0; i < 1000 && !fetched; ++i) {  // ferryd notices the close on its own time
    fetched = absl::StartsWith(Ask(one_more.get(), "CHANNEL b"), "OK ");
    if (!fetched) usleep(10000);
  }
  ASSERT_TRUE(fetched);
  // Back at the cap: the new session takes the closed one's place in full.
  for (size_t c = 1; c < per_session; ++c) {
    ASSERT_TRUE(absl::StartsWith(Ask(one_more.get(), absl::StrCat("CHANNEL b", c)), "OK "));
  }
  UniqueFd last = Connect();
  ASSERT_TRUE(last.valid());
  ASSERT_TRUE(absl::StrContains(Ask(last.get(), "CHANNEL d"), "batch channels that no Consume"));

  // Another user is not affected by this uid's channels (needs root to be someone else).
  if (geteuid() != 0) GTEST_SKIP() << "not root: cannot connect as another uid";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    UniqueFd fd = Connect();
    if (!fd.valid()) _exit(3);
    _exit(absl::StartsWith(Ask(fd.get(), "CHANNEL c"), "OK ") ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: uid 65534 was refused a channel; 2: setuid; "
                                       "3: no session";
}

}  // namespace
}  // namespace ferry
