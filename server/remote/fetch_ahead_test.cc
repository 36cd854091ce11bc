// FetchAhead: a job's remote objects opened in parallel, in the spec's order, bounded in
// connections and bytes.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/remote/remote_dataset_fs.h"
#include "testing/recording_fs.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Shards(int n) {
  std::vector<std::string> paths;
  for (int i = 0; i < n; ++i) paths.push_back("s3://bucket/shard-" + std::to_string(i) + ".tar");
  return paths;
}

TEST(FetchAheadTest, OpensEveryRemoteObjectConnectionsAtOnce) {
  RecordingFs fs({.bytes = 1000, .gather = 4});
  std::vector<std::string> paths = Shards(12);
  paths.insert(paths.begin() + 3, "/local/file.bin");          // local files are the job's to open
  paths.insert(paths.begin() + 5, "s3://bucket/missing.tar");  // fails later, with its error
  FetchAhead(fs, paths, 4, /*max_bytes=*/1 << 30);
  std::vector<std::string> started = fs.Opened();
  EXPECT_EQ(fs.most_at_once(), 4);
  std::sort(started.begin(), started.end());
  paths.erase(paths.begin() + 3);
  std::sort(paths.begin(), paths.end());
  EXPECT_EQ(started, paths) << "each remote object once, no local file";
}

TEST(FetchAheadTest, OneConnectionOpensInTheOrderGiven) {
  RecordingFs fs({.bytes = 1000});
  const std::vector<std::string> paths = Shards(6);
  FetchAhead(fs, paths, 1, /*max_bytes=*/1 << 30);
  EXPECT_EQ(fs.Opened(), paths);
  EXPECT_EQ(fs.most_at_once(), 1);
}

TEST(FetchAheadTest, StopsStartingOnceTheBytesAreReached) {
  RecordingFs fs({.bytes = 1000});
  FetchAhead(fs, Shards(20), 1, /*max_bytes=*/3000);
  EXPECT_THAT(fs.Opened(), ElementsAre("s3://bucket/shard-0.tar", "s3://bucket/shard-1.tar",
                                       "s3://bucket/shard-2.tar"));
  RecordingFs none({.bytes = 1000});
  FetchAhead(none, {"/local/a.bin", "/local/b.bin"}, 8, 1 << 30);
  EXPECT_TRUE(none.Opened().empty());
}

}  // namespace
}  // namespace ferry
