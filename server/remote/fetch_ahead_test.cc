// FetchAhead: a job's remote objects opened in parallel, in the spec's order, bounded in
// connections and bytes.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/remote/remote_dataset_fs.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;

// Every object is `bytes` long; records the opens and how many ran at once. The first
// opens wait (up to 10 s) until `gather` of them are open together, so that a test sees
// the parallelism whatever the machine's load.
class SlowStoreFs final : public DatasetFs {
 public:
  explicit SlowStoreFs(uint64_t bytes, int gather = 1) : bytes_(bytes), gather_(gather) {}

  absl::Status CheckPath(const std::string&) const override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
      const std::string& path) const override {
    absl::MutexLock lock(&mutex_);
    started_.push_back(path);
    most_at_once_ = std::max(most_at_once_, ++open_now_);
    if (!gathered_) {
      auto all_open = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return open_now_ >= gather_; };
      gathered_ = mutex_.AwaitWithTimeout(absl::Condition(&all_open), absl::Seconds(10));
    }
    --open_now_;
    if (path.find("missing") != std::string::npos) return absl::NotFoundError(path);
    return std::unique_ptr<RandomAccessFile>(new Empty(path, bytes_));
  }
  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFile(const std::string&) const override {
    return absl::UnimplementedError("not here");
  }
  absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string&) const override {
    return absl::UnimplementedError("not here");
  }

  std::vector<std::string> started() const {
    absl::MutexLock lock(&mutex_);
    return started_;
  }
  int most_at_once() const {
    absl::MutexLock lock(&mutex_);
    return most_at_once_;
  }

 private:
  class Empty final : public RandomAccessFile {
   public:
    Empty(std::string path, uint64_t bytes)
        : RandomAccessFile(std::move(path), FileIdentity{.size = bytes}) {}
    absl::StatusOr<size_t> ReadAt(uint64_t, absl::Span<uint8_t>) const override { return 0; }
  };

  const uint64_t bytes_;
  const int gather_;
  mutable absl::Mutex mutex_;
  mutable bool gathered_ ABSL_GUARDED_BY(mutex_) = false;
  mutable std::vector<std::string> started_ ABSL_GUARDED_BY(mutex_);
  mutable int open_now_ ABSL_GUARDED_BY(mutex_) = 0;
  mutable int most_at_once_ ABSL_GUARDED_BY(mutex_) = 0;
};

std::vector<std::string> Shards(int n) {
  std::vector<std::string> paths;
  for (int i = 0; i < n; ++i) paths.push_back("s3://bucket/shard-" + std::to_string(i) + ".tar");
  return paths;
}

TEST(FetchAheadTest, OpensEveryRemoteObjectConnectionsAtOnce) {
  SlowStoreFs fs(1000, /*gather=*/4);
  std::vector<std::string> paths = Shards(12);
  paths.insert(paths.begin() + 3, "/local/file.bin");          // local files are the job's to open
  paths.insert(paths.begin() + 5, "s3://bucket/missing.tar");  // fails later, with its error
  FetchAhead(fs, paths, 4, /*max_bytes=*/1 << 30);
  std::vector<std::string> started = fs.started();
  EXPECT_EQ(fs.most_at_once(), 4);
  std::sort(started.begin(), started.end());
  paths.erase(paths.begin() + 3);
  std::sort(paths.begin(), paths.end());
  EXPECT_EQ(started, paths) << "each remote object once, no local file";
}

TEST(FetchAheadTest, OneConnectionOpensInTheOrderGiven) {
  SlowStoreFs fs(1000);
  const std::vector<std::string> paths = Shards(6);
  FetchAhead(fs, paths, 1, /*max_bytes=*/1 << 30);
  EXPECT_EQ(fs.started(), paths);
  EXPECT_EQ(fs.most_at_once(), 1);
}

TEST(FetchAheadTest, StopsStartingOnceTheBytesAreReached) {
  SlowStoreFs fs(1000);
  FetchAhead(fs, Shards(20), 1, /*max_bytes=*/3000);
  EXPECT_THAT(fs.started(), ElementsAre("s3://bucket/shard-0.tar", "s3://bucket/shard-1.tar",
                                        "s3://bucket/shard-2.tar"));
  SlowStoreFs none(1000);
  FetchAhead(none, {"/local/a.bin", "/local/b.bin"}, 8, 1 << 30);
  EXPECT_TRUE(none.started().empty());
}

}  // namespace
}  // namespace ferry
