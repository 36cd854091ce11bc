// Who may own ferryd's socket directory and who a client trusts as its daemon: a directory
// another user made first (/tmp/ferry-<uid> squatted) and a daemon of another uid are
// refused, on both sides.
#include "common/session_protocol.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr unsigned kOtherUid = 4242;  // nobody's uid on a test machine

class SocketDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = "/tmp/ferry-protocol-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(SocketDirectoryTest, MissingDirectoriesAreMadeForTheOwnerOnly) {
  const std::string sock = dir_ + "/run/ferry-1000/ferryd.sock";
  absl::StatusOr<UniqueFd> fd = ListenUnix(sock, SOCK_STREAM, 0600);
  ASSERT_TRUE(fd.ok()) << fd.status();
  for (const std::string& d : {dir_ + "/run", dir_ + "/run/ferry-1000"}) {
    struct stat st;
    ASSERT_EQ(stat(d.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0700u) << d;
    EXPECT_EQ(st.st_uid, geteuid());
  }
  struct stat st;
  ASSERT_EQ(stat(sock.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(SocketDirectoryTest, ASquattedDirectoryIsRefusedByTheDaemonAndTheClient) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a directory of another uid";
  const std::string squatted = dir_ + "/ferry-1000";
  ASSERT_EQ(mkdir(squatted.c_str(), 0755), 0);
  ASSERT_EQ(chown(squatted.c_str(), kOtherUid, kOtherUid), 0);
  absl::StatusOr<UniqueFd> fd = ListenUnix(squatted + "/ferryd.sock", SOCK_STREAM, 0600);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(fd.status().message(), HasSubstr("'" + squatted + "' belongs to uid 4242"));
  EXPECT_THAT(fd.status().message(), HasSubstr("Remove it"));
  EXPECT_EQ(CheckSocketDirectory(squatted + "/ferryd.sock").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(SocketDirectoryTest, ADirectoryOthersMayWriteIsRefusedUnlessSticky) {
  const std::string open_dir = dir_ + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  absl::Status s = CheckSocketDirectory(open_dir + "/ferryd.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("writable by others (mode 0777)"));
  ASSERT_EQ(chmod(open_dir.c_str(), 01777), 0);  // like /tmp: nobody replaces another's file
  EXPECT_TRUE(CheckSocketDirectory(open_dir + "/ferryd.sock").ok());
  ASSERT_EQ(chmod(open_dir.c_str(), 0755), 0);
  EXPECT_TRUE(CheckSocketDirectory(open_dir + "/ferryd.sock").ok());
}

TEST_F(SocketDirectoryTest, ADaemonOfAnotherUidIsNotTrusted) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a listener as another uid";
  ASSERT_EQ(chmod(dir_.c_str(), 0777), 0);  // the other uid makes its socket here
  const std::string sock = dir_ + "/impostor.sock";
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The impostor: another user's process listening where the victim connects.
    if (setresgid(kOtherUid, kOtherUid, kOtherUid) != 0 ||
        setresuid(kOtherUid, kOtherUid, kOtherUid) != 0) {
      _exit(2);
    }
    UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", sock.c_str());
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd.get(), 4) != 0) {
      _exit(3);
    }
    chmod(sock.c_str(), 0666);
    char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(4);
    UniqueFd conn(accept(fd.get(), nullptr, nullptr));
    char buf;
    while (read(conn.get(), &buf, 1) > 0) {
    }
    _exit(0);
  }
  close(ready[1]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  absl::StatusOr<UniqueFd> fd = ConnectUnix(sock, SOCK_SEQPACKET);
  ASSERT_TRUE(fd.ok()) << fd.status();
  absl::Status s = CheckDaemonPeer(fd->get(), sock);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("runs as uid 4242"));
  EXPECT_THAT(s.message(), HasSubstr("not sending it your jobs"));
  fd->Reset();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(TrustedDaemonUidTest, RootAndSelfAreTrustedOthersAreNot) {
  EXPECT_TRUE(IsTrustedDaemonUid(0));
  EXPECT_TRUE(IsTrustedDaemonUid(geteuid()));
  EXPECT_FALSE(IsTrustedDaemonUid(kOtherUid));
}

}  // namespace
}  // namespace ferry
