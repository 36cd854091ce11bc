// GuardMappedRead: a read of a mapped file that someone truncated is an error, not the end
// of the process; reads of a whole file and faults outside the guard are untouched.
#include "common/mapped_read.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

class MappedReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/ferry-mapped-read-XXXXXX";
    fd_ = mkstemp(path);
    ASSERT_GE(fd_, 0);
    path_ = path;
    std::vector<uint8_t> bytes(kBytes, 7);
    ASSERT_EQ(write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    map_ = static_cast<uint8_t*>(mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd_, 0));
    ASSERT_NE(map_, MAP_FAILED);
  }
  void TearDown() override {
    munmap(map_, kBytes);
    close(fd_);
    unlink(path_.c_str());
  }

  static constexpr size_t kBytes = 16 * 4096;
  int fd_ = -1;
  std::string path_;
  uint8_t* map_ = nullptr;
};

TEST_F(MappedReadTest, AWholeFileReadsAsUsual) {
  std::vector<uint8_t> out(kBytes);
  EXPECT_TRUE(GuardMappedRead({map_, kBytes}, [&] { memcpy(out.data(), map_, kBytes); }).ok());
  EXPECT_EQ(out[kBytes - 1], 7);
}

TEST_F(MappedReadTest, AReadPastATruncatedEndIsDataLoss) {
  ASSERT_EQ(ftruncate(fd_, 4096), 0);  // the file's owner cuts it short
  std::vector<uint8_t> out(kBytes);
  absl::Status s = GuardMappedRead({map_, kBytes}, [&] { memcpy(out.data(), map_ + 8192, 4096); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("shrank"), absl::string_view::npos);
  // The first page is still there, and the guard works again after a fault, on every thread.
  EXPECT_TRUE(GuardMappedRead({map_, kBytes}, [&] { memcpy(out.data(), map_, 4096); }).ok());
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      uint8_t local[64];
      for (int i = 0; i < 100; ++i) {
        results[t] = GuardMappedRead({map_, kBytes}, [&] { memcpy(local, map_ + 12288, 64); });
        if (results[t].ok()) return;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& r : results) EXPECT_EQ(r.code(), absl::StatusCode::kDataLoss) << r;
}

// A SIGBUS outside any guarded mapping still ends the process, as before (killed by the
// signal, or reported by a sanitizer's handler, which the guard's handler passes it to).
TEST_F(MappedReadTest, AnUnguardedFaultStillKillsTheProcess) {
  ASSERT_EQ(ftruncate(fd_, 4096), 0);
  std::vector<uint8_t> out(64);
  // Installs the handler, for the unguarded read below to pass through it.
  ASSERT_TRUE(GuardMappedRead({map_, 4096}, [&] { memcpy(out.data(), map_, 64); }).ok());
  EXPECT_DEATH(
      {
        volatile uint8_t v = map_[8192];
        (void)v;
        std::exit(0);
      },
      "");
}

}  // namespace
}  // namespace ferry
