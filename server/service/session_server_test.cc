// ferryd's session socket against misbehaving clients: one that never reads its answers,
// and one user's sessions hoarding batch channels. Neither may cost another client its
// service.
#include "server/service/session_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

  void StartServer(SessionLimits limits = SessionLimits(), SessionServer::InUse in_use = nullptr) {
    auto server = SessionServer::Start(
        dir_ + "/ferryd.session.sock", 0666,
        [](const PeerCredentials&,
           const std::string& attach_id) -> absl::StatusOr<std::pair<int, uint64_t>> {
          return absl::NotFoundError(absl::StrCat("no attachment '", attach_id, "'"));
        },
        [](const PeerCredentials&, const std::string&) { return BatchChannel::Create(8); }, limits,
        std::move(in_use));
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

// What a forked child of this test does between fork and _exit, with async-signal-safe calls
// only: the server's threads may hold the allocator's or the logger's lock at the instant of
// the fork, and a child that allocates would wait for that lock forever.
class ForkedClient {
 public:
  explicit ForkedClient(const std::string& socket_path) {
    address_.sun_family = AF_UNIX;
    socket_path.copy(address_.sun_path, sizeof(address_.sun_path) - 1);
  }

  // A connected session and the first packet it received (NUL-terminated in `packet`, empty
  // when none came within 10 s); -1 when it could not connect.
  int Open(char (&packet)[512]) const {
    packet[0] = '\0';
    const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, reinterpret_cast<const sockaddr*>(&address_), sizeof(address_)) != 0) {
      close(fd);
      return -1;
    }
    Receive(fd, packet);
    return fd;
  }

  // Sends `request` on `fd` and receives the answer into `packet` (empty when none came).
  static void Ask(int fd, const char* request, char (&packet)[512]) {
    packet[0] = '\0';
    if (send(fd, request, strlen(request), MSG_NOSIGNAL) < 0) return;
    Receive(fd, packet);
  }

  static bool StartsWith(const char* text, const char* prefix) {
    return strncmp(text, prefix, strlen(prefix)) == 0;
  }

 private:
  static void Receive(int fd, char (&packet)[512]) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) return;
    const ssize_t n = recv(fd, packet, sizeof(packet) - 1, 0);  // passed fds are dropped
    packet[n > 0 ? n : 0] = '\0';
  }

  sockaddr_un address_{};
};

// A child process of uid `uid` that opens `count` sessions, reports each greeting ("HELLO"
// or the refusal) and holds them open until Release kills it.
class OtherUser {
 public:
  OtherUser(const std::string& socket_path, unsigned uid, int count) {
    const ForkedClient client(socket_path);
    int results[2];
    if (pipe(results) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(results[0]);
      if (setgid(uid) != 0 || setuid(uid) != 0) _exit(2);
      for (int i = 0; i < count; ++i) {
        char packet[512];
        const int fd = client.Open(packet);  // held open until the process is killed
        const char* greeting = fd < 0 || packet[0] == '\0'                  ? "no answer"
                               : ForkedClient::StartsWith(packet, "HELLO ") ? "HELLO"
                                                                            : packet;
        if (write(results[1], greeting, strlen(greeting)) < 0 || write(results[1], "\n", 1) < 0) {
          _exit(3);
        }
      }
      if (write(results[1], "DONE\n", 5) < 0) _exit(3);
      for (;;) pause();
    }
    close(results[1]);
    std::string got;
    char buffer[4096];
    ssize_t n = 0;
    pollfd p{results[0], POLLIN, 0};
    while (!absl::EndsWith(got, "DONE\n") && poll(&p, 1, 30000) == 1 &&
           (n = read(results[0], buffer, sizeof(buffer))) > 0) {
      got.append(buffer, static_cast<size_t>(n));
    }
    close(results[0]);
    for (absl::string_view line : absl::StrSplit(got, '\n', absl::SkipEmpty())) {
      if (line != "DONE") greetings_.emplace_back(line);
    }
  }
  ~OtherUser() { Release(); }
  void Release() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
  }
  const std::vector<std::string>& greetings() const { return greetings_; }

 private:
  pid_t pid_ = -1;
  std::vector<std::string> greetings_;
};

TEST_F(SessionServerTest, SessionsAreBoundedPerUidSoOneUserCannotLockOutAnother) {
  if (geteuid() != 0) GTEST_SKIP() << "not root: cannot connect as other uids";
  // 8 in all: one uid may hold at most a quarter of them (2), whatever max_sessions_per_uid
  // says, and root and ferryd's user have 2 more.
  StartServer(SessionLimits{
      .max_sessions = 8, .max_sessions_per_uid = 1000, .reserved_for_administrators = 2});
  const std::string path = server_->path();
  std::vector<std::unique_ptr<OtherUser>> users;
  for (unsigned uid : {65534u, 65533u, 65532u, 65531u}) {
    users.push_back(std::make_unique<OtherUser>(path, uid, 3));
    EXPECT_EQ(users.back()->greetings(),
              (std::vector<std::string>{
                  "HELLO", "HELLO",
                  absl::StrCat("ERR uid ", uid,
                               " has 2 sessions open, the most ferryd allows one user "
                               "(max_sessions_per_uid); close idle clients")}))
        << "uid " << uid;
  }
  // Every session of the users is taken: a fifth user is refused, root is not.
  OtherUser fifth(path, 65530, 1);
  EXPECT_EQ(fifth.greetings(),
            std::vector<std::string>{
                "ERR ferryd has 8 sessions open, the most it allows (max_sessions); try again "
                "later"});
  UniqueFd root_a = Connect();
  UniqueFd root_b = Connect();
  EXPECT_TRUE(root_a.valid());
  EXPECT_TRUE(root_b.valid());
  EXPECT_TRUE(absl::StartsWith(Greeting(), "ERR ferryd has 8 sessions open")) << "reserve used";
  // A user's session that closes gives its place back.
  users[0]->Release();
  bool again = false;
  for (int i = 0; i < 1000 && !again; ++i) {  // ferryd notices the close on its own time
    OtherUser back(path, 65534, 1);
    again = back.greetings() == std::vector<std::string>{"HELLO"};
    if (!again) usleep(10000);
  }
  EXPECT_TRUE(again);
}

TEST_F(SessionServerTest, IdleSessionsAreClosedWithAByeUnlessInUseOrActive) {
  std::atomic<bool> in_use{false};
  StartServer(SessionLimits{.idle_timeout = absl::Seconds(1)},
              [&](const PeerCredentials&) { return in_use.load(); });
  // Silent, nothing in use: closed after a BYE.
  UniqueFd idle = Connect();
  ASSERT_TRUE(idle.valid());
  ASSERT_TRUE(Readable(idle.get(), 10000));
  auto bye = RecvPacket(idle.get());
  ASSERT_TRUE(bye.ok()) << bye.status();
  EXPECT_TRUE(absl::StartsWith(*bye, "BYE idle for 1s")) << *bye;
  ASSERT_TRUE(Readable(idle.get(), 10000));
  EXPECT_FALSE(RecvPacket(idle.get()).ok()) << "closed after the BYE";

  // Requests, or RPCs carrying its token (Lookup), keep a session open.
  std::string token;
  {
    auto fd = ConnectUnix(server_->path(), SOCK_SEQPACKET);
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(Readable(fd->get()));
    auto hello = RecvPacket(fd->get());
    ASSERT_TRUE(hello.ok());
    token = std::vector<std::string>(absl::StrSplit(*hello, ' '))[1];
    UniqueFd asking = Connect();
    const absl::Time until = absl::Now() + absl::Seconds(2.5);
    while (absl::Now() < until) {
      EXPECT_TRUE(server_->Lookup(token).has_value());
      EXPECT_EQ(Ask(asking.get(), "FD y"), "ERR NOT_FOUND: no attachment 'y'");
      absl::SleepFor(absl::Milliseconds(50));
    }
    // Its process consumes a job: kept, however silent.
    in_use = true;
    absl::SleepFor(absl::Seconds(2.5));
    EXPECT_TRUE(server_->Lookup(token).has_value());
    EXPECT_EQ(Ask(asking.get(), "FD y"), "ERR NOT_FOUND: no attachment 'y'");
    EXPECT_FALSE(Readable(fd->get(), 0)) << "no BYE while in use";
    // Not in use, silent: closed after a BYE.
    in_use = false;
    ASSERT_TRUE(Readable(fd->get(), 10000));
    auto later = RecvPacket(fd->get());
    ASSERT_TRUE(later.ok());
    EXPECT_TRUE(absl::StartsWith(*later, "BYE ")) << *later;
    ASSERT_TRUE(Readable(fd->get(), 10000));
    EXPECT_FALSE(RecvPacket(fd->get()).ok()) << "closed after the BYE";
    EXPECT_FALSE(server_->Lookup(token).has_value()) << "forgotten before its socket closed";
  }
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
  const ForkedClient client(server_->path());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    char packet[512];
    const int fd = client.Open(packet);
    if (fd < 0 || !ForkedClient::StartsWith(packet, "HELLO ")) _exit(3);
    ForkedClient::Ask(fd, "CHANNEL c", packet);
    _exit(ForkedClient::StartsWith(packet, "OK ") ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: uid 65534 was refused a channel; 2: setuid; "
                                       "3: no session";
}

}  // namespace
}  // namespace ferry
