// ferryd's session socket against misbehaving clients: one that never reads its answers,
// and one user's sessions hoarding batch channels. Neither may cost another client its
// service.
#include "server/service/session_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

  void StartServer(SessionLimits limits = SessionLimits()) {
    auto server = SessionServer::Start(
        dir_ + "/ferryd.session.sock", 0666,
        [](const PeerCredentials&,
           const std::string& attach_id) -> absl::StatusOr<std::pair<int, uint64_t>> {
          return absl::NotFoundError(absl::StrCat("no attachment '", attach_id, "'"));
        },
        [](const PeerCredentials&, const std::string&) { return BatchChannel::Create(8); }, limits);
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

  // The first packet a new connection receives ("" when none came within 10 s).
  std::string Greeting(UniqueFd* out = nullptr) {
    auto fd = ConnectUnix(server_->path(), SOCK_SEQPACKET);
    if (!fd.ok() || !Readable(fd->get())) return "";
    auto packet = RecvPacket(fd->get());
    if (out != nullptr) *out = *std::move(fd);
    return packet.ok() ? *packet : "";
  }

  std::string dir_;
  std::unique_ptr<SessionServer> server_;
};

// CPU time of the thread named `name` of this process. Its stat file is opened once, so
// it can be read while the process is out of descriptors.
class ThreadCpu {
 public:
  explicit ThreadCpu(const std::string& name) {
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(task.path() / "comm");
      std::string got;
      std::getline(comm, got);
      if (got == name) stat_.Reset(::open((task.path() / "stat").c_str(), O_RDONLY | O_CLOEXEC));
    }
  }
  bool found() const { return stat_.valid(); }
  double Seconds() const {
    char buf[1024];
    const ssize_t n = ::pread(stat_.get(), buf, sizeof(buf) - 1, 0);
    if (n <= 0) return -1;
    const std::string line(buf, static_cast<size_t>(n));
    std::istringstream fields(line.substr(line.rfind(')') + 2));
    std::string skip;
    for (int i = 3; i < 14; ++i) fields >> skip;  // state .. cmajflt
    double utime = 0, stime = 0;
    fields >> utime >> stime;
    return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }

 private:
  UniqueFd stat_;
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

TEST_F(SessionServerTest, SessionsAreBoundedPerUidSoOneUserCannotLockOutAnother) {
  StartServer(SessionLimits{.max_sessions = 6, .max_sessions_per_uid = 4});
  std::vector<UniqueFd> mine;
  for (int i = 0; i < 4; ++i) {
    mine.push_back(Connect());
    ASSERT_TRUE(mine.back().valid()) << i;
  }
  EXPECT_EQ(Greeting(), absl::StrCat("ERR uid ", geteuid(),
                                     " has 4 sessions open, the most "
                                     "ferryd allows one user (max_sessions_per_uid); close idle "
                                     "clients"));
  // A session that closes gives its place back.
  mine.pop_back();
  bool again = false;
  for (int i = 0; i < 1000 && !again; ++i) {  // ferryd notices the close on its own time
    UniqueFd fd;
    again = absl::StartsWith(Greeting(&fd), "HELLO ");
    if (again) mine.push_back(std::move(fd));
    if (!again) usleep(10000);
  }
  ASSERT_TRUE(again);

  if (geteuid() != 0) GTEST_SKIP() << "not root: cannot connect as another uid";
  // Another uid is greeted while this one is at its bound, up to the bound in all.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    UniqueFd a, b;
    if (!absl::StartsWith(Greeting(&a), "HELLO ")) _exit(3);
    if (!absl::StartsWith(Greeting(&b), "HELLO ")) _exit(4);
    _exit(absl::StrContains(Greeting(), "ferryd has 6 sessions open") ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: setuid; 3, 4: no session for uid 65534; 5: the "
                                       "7th session was not refused";
}

// Out of descriptors, accept fails and the listener stays readable: the session thread spun
// at 100% and new clients waited forever for HELLO. Now each is refused with the reason.
TEST_F(SessionServerTest, OutOfDescriptorsNewClientsAreRefusedWithTheReasonAndNothingSpins) {
  StartServer();
  UniqueFd served = Connect();
  ASSERT_TRUE(served.valid());
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 256);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  const ThreadCpu session_thread("ferry-sessions");
  ASSERT_TRUE(session_thread.found());
  std::vector<UniqueFd> hog;
  for (UniqueFd fd(::dup(0)); fd.valid(); fd = UniqueFd(::dup(0))) hog.push_back(std::move(fd));
  std::vector<std::string> greetings;
  const double cpu_before = session_thread.Seconds();
  const absl::Time start = absl::Now();
  for (int i = 0; i < 3; ++i) {
    hog.pop_back();  // room for this test's end of the connection only
    UniqueFd fd;
    greetings.push_back(Greeting(&fd));
    fd.Reset();
    hog.push_back(UniqueFd(::dup(0)));
  }
  absl::SleepFor(absl::Milliseconds(300));
  const double cpu = session_thread.Seconds() - cpu_before;
  const absl::Duration wall = absl::Now() - start;
  // The established session is still answered.
  const std::string answer = Ask(served.get(), "FD y");
  hog.clear();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  for (const std::string& g : greetings) {
    EXPECT_EQ(g,
              "ERR ferryd is out of file descriptors; try again later, and ask the "
              "administrator to raise its LimitNOFILE");
  }
  EXPECT_LT(cpu, 0.5 * absl::ToDoubleSeconds(wall)) << "the session thread spun";
  EXPECT_EQ(answer, "ERR NOT_FOUND: no attachment 'y'");
  EXPECT_TRUE(Connect().valid()) << "descriptors are back: clients are greeted again";
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
      ASSERT_TRUE(
          absl::StartsWith(Ask(mine.back().get(), absl::StrCat("CHANNEL a", s, "-", c)), "OK "));
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
