// ReadAhead: each rank's lane opened in batch order, lanes in turn, bounded in files and
// bytes, and files the workers reached first left to them; units of mappings read in ranges
// held while their batch is in the window.
#include "server/pipeline/read_ahead.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/recording_fs.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;

// Waits until the read-ahead has opened (or failed) `count` files.
ReadAhead::Stats WaitForOpens(const ReadAhead& ahead, int64_t count) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ReadAhead::Stats stats = ahead.stats();
  while (stats.opened + stats.failed < count && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
    stats = ahead.stats();
  }
  return stats;
}

TEST(ReadAheadTest, OpensALanesFilesInBatchOrderUpToItsShareOfTheWindow) {
  auto fs = std::make_shared<RecordingFs>(RecordingFs::Options{.bytes = 10});
  ReadAhead ahead(fs, {.connections = 1, .max_files = 6, .max_bytes = 1 << 20, .ranks = 2});
  ASSERT_TRUE(ahead.HasRoom(0));
  ahead.Add(0, {0, 0}, {"a", "b"});
  ASSERT_TRUE(ahead.HasRoom(0));  // 2 files of the lane's 3
  ahead.Add(0, {0, 1}, {"c", "d"});
  EXPECT_FALSE(ahead.HasRoom(0));
  EXPECT_TRUE(ahead.HasRoom(1));   // the other rank's share is its own
  EXPECT_FALSE(ahead.HasRoom(2));  // no such rank
  EXPECT_THAT(fs->Opened(4), ElementsAre("a", "b", "c", "d"));
  ReadAhead::Stats stats = WaitForOpens(ahead, 4);
  EXPECT_EQ(stats.opened, 4);
  EXPECT_EQ(stats.in_window, 4);
  EXPECT_EQ(stats.bytes_in_window, 40u);
  ahead.Reached(0, {0, 1});  // the workers start batch 1: batch 0's files leave
  EXPECT_TRUE(ahead.HasRoom(0));
  stats = ahead.stats();
  EXPECT_EQ(stats.in_window, 2);
  EXPECT_EQ(stats.bytes_in_window, 20u);
  EXPECT_EQ(stats.skipped, 0);
}

TEST(ReadAheadTest, ALaneIsFullOnceTheBytesOfItsOpenedFilesReachItsShare) {
  auto fs = std::make_shared<RecordingFs>(RecordingFs::Options{.bytes = 100});
  ReadAhead ahead(fs, {.connections = 2, .max_files = 100, .max_bytes = 500, .ranks = 2});
  for (int64_t batch = 0; batch < 3; ++batch) {
    ASSERT_TRUE(ahead.HasRoom(1));
    ahead.Add(1, {0, batch}, {"f" + std::to_string(batch)});
  }
  WaitForOpens(ahead, 3);
  EXPECT_FALSE(ahead.HasRoom(1));  // 300 bytes open, over the lane's 250
  ahead.Reached(1, {0, 2});
  EXPECT_TRUE(ahead.HasRoom(1));  // 100
  EXPECT_TRUE(ahead.HasRoom(0));
}

TEST(ReadAheadTest, FilesOfBatchesTheWorkersStartedAreLeftToThem) {
  auto fs = std::make_shared<RecordingFs>(RecordingFs::Options{.bytes = 10, .hold_first = true});
  ReadAhead ahead(fs, {.connections = 1, .max_files = 100, .max_bytes = 1 << 20, .ranks = 1});
  ahead.Add(0, {0, 0}, {"a"});
  ASSERT_THAT(fs->Opened(1), ElementsAre("a"));  // held open
  ahead.Add(0, {0, 1}, {"b"});
  ahead.Add(0, {0, 2}, {"c"});
  ahead.Add(0, {1, 0}, {"d"});
  ahead.Reached(0, {0, 2});  // the workers got to batch 2 before "b" was opened here
  fs->Release();
  EXPECT_THAT(fs->Opened(3), ElementsAre("a", "c", "d"));
  const ReadAhead::Stats stats = WaitForOpens(ahead, 3);
  EXPECT_EQ(stats.skipped, 1);
  EXPECT_EQ(stats.in_window, 2);          // c and d
  EXPECT_EQ(stats.bytes_in_window, 20u);  // "a" opened after it left the lane counts nothing
}

TEST(ReadAheadTest, LanesAreOpenedInTurn) {
  auto fs = std::make_shared<RecordingFs>(RecordingFs::Options{.bytes = 10, .hold_first = true});
  ReadAhead ahead(fs, {.connections = 1, .max_files = 100, .max_bytes = 1 << 20, .ranks = 2});
  ahead.Add(0, {0, 0}, {"a0", "a1", "a2"});
  ASSERT_THAT(fs->Opened(1), ElementsAre("a0"));
  ahead.Add(1, {0, 0}, {"b0", "b1", "b2"});
  fs->Release();
  EXPECT_THAT(fs->Opened(6), ElementsAre("a0", "b0", "a1", "b1", "a2", "b2"));
}

TEST(ReadAheadTest, ASampleInAFileTheLaneHoldsAddsNothing) {
  auto fs = std::make_shared<RecordingFs>(RecordingFs::Options{.bytes = 10});
  ReadAhead ahead(fs, {.connections = 1, .max_files = 100, .max_bytes = 1 << 20, .ranks = 1});
  ahead.Add(0, {0, 0}, {"shard-0", "shard-0", "shard-1", "shard-0"});  // a shuffle buffer
  ahead.Add(0, {0, 1}, {"shard-1", "shard-2", "shard-0"});
  ahead.Add(0, {0, 1}, {"again"});  // not after the last batch added: ignored
  EXPECT_THAT(fs->Opened(3), ElementsAre("shard-0", "shard-1", "shard-2"));
  EXPECT_EQ(WaitForOpens(ahead, 3).in_window, 3);
  EXPECT_EQ(ahead.LastAdded(0), (ReadAhead::BatchKey{0, 1}));
  // Once the batch that brought shard-0 is reached, a later batch brings it again.
  ahead.Reached(0, {0, 1});
  ahead.Add(0, {0, 2}, {"shard-2", "shard-0"});
  EXPECT_THAT(fs->Opened(4), ElementsAre("shard-0", "shard-1", "shard-2", "shard-0"));
}

TEST(ReadAheadTest, FailedOpensAreCountedAndResetEmptiesTheLane) {
  auto fs = std::make_shared<RecordingFs>(RecordingFs::Options{.bytes = 10});
  ReadAhead ahead(fs, {.connections = 1, .max_files = 100, .max_bytes = 1 << 20, .ranks = 1});
  ahead.Add(0, {0, 0}, {"missing", "here"});
  ReadAhead::Stats stats = WaitForOpens(ahead, 2);
  EXPECT_EQ(stats.failed, 1);
  EXPECT_EQ(stats.opened, 1);
  ahead.Reset(0);
  EXPECT_EQ(ahead.stats().in_window, 0);
  EXPECT_FALSE(ahead.LastAdded(0).has_value());
  ahead.Add(0, {0, 0}, {"again"});  // after a reset any batch starts the lane
  EXPECT_THAT(fs->Opened(3), ElementsAre("missing", "here", "again"));
}

TEST(ReadAheadTest, ALaneHoldsAtMostItsShareOfBatchesThoughTheyAddNothing) {
  auto fs = std::make_shared<RecordingFs>(RecordingFs::Options{.bytes = 10});
  ReadAhead ahead(fs, {.connections = 1, .max_files = 6, .max_bytes = 1 << 20, .ranks = 2});
  int64_t batch = 0;
  // Every batch reads the one shard the lane holds: after 3 batches (its share) it is full.
  while (ahead.HasRoom(0) && batch < 100) ahead.Add(0, {0, batch++}, {"shard-0"});
  EXPECT_EQ(batch, 3);
  EXPECT_EQ(ahead.stats().in_window, 1);
  ahead.Reached(0, {0, 1});
  EXPECT_TRUE(ahead.HasRoom(0));
  ahead.Add(0, {0, batch++}, {"shard-0"});
  EXPECT_FALSE(ahead.HasRoom(0));
}

// A mapping of 1,000 bytes read in ranges of 100-byte units that records each Hold and
// counts the holds alive.
class RecordingRanges final : public MappedFile::Ranges {
 public:
  absl::StatusOr<std::shared_ptr<const void>> Hold(uint64_t offset,
                                                   uint64_t length) const override {
    absl::MutexLock lock(&mutex_);
    held_.push_back(offset);
    ++alive_;
    return std::shared_ptr<const void>(this, [this](const void*) {
      absl::MutexLock lock(&mutex_);
      --alive_;
    });
  }
  uint64_t unit_bytes() const override { return 100; }

  std::vector<uint64_t> held() const {
    absl::MutexLock lock(&mutex_);
    return held_;
  }
  int alive() const {
    absl::MutexLock lock(&mutex_);
    return alive_;
  }

 private:
  mutable absl::Mutex mutex_;
  mutable std::vector<uint64_t> held_ ABSL_GUARDED_BY(mutex_);
  mutable int alive_ ABSL_GUARDED_BY(mutex_) = 0;
};

TEST(ReadAheadTest, UnitsOfRangesAreHeldWhileTheirBatchIsInTheWindowAndWholeBatchesFit) {
  static const std::vector<uint8_t> bytes(1000);
  auto ranges = std::make_shared<RecordingRanges>();
  auto file = std::make_shared<const MappedFile>("s3://b/tokens.bin", FileIdentity{.size = 1000},
                                                 absl::MakeConstSpan(bytes), nullptr, ranges);
  auto fs = std::make_shared<RecordingFs>(RecordingFs::Options{.bytes = 10});
  ReadAhead ahead(fs, {.connections = 1, .max_files = 4, .max_bytes = 1 << 20, .ranks = 1});
  auto range = [&](uint64_t offset, uint64_t length) {
    return MappedRange{.file = file, .offset = offset, .length = length};
  };
  // Units 0 and 1 (a range across them), unit 1 again, and unit 9 (cut short by the end).
  EXPECT_TRUE(ahead.Add(0, {0, 0}, {}, {range(50, 100), range(120, 10), range(950, 50)}));
  EXPECT_TRUE(ahead.HasRoom(0));  // 3 units of 4
  // Units 3 and 4 do not both fit: nothing of the batch is taken until there is room.
  EXPECT_FALSE(ahead.Add(0, {0, 1}, {}, {range(300, 150)}));
  ReadAhead::Stats stats = WaitForOpens(ahead, 3);
  EXPECT_THAT(ranges->held(), ElementsAre(0, 100, 900));
  EXPECT_EQ(ranges->alive(), 3);
  EXPECT_EQ(stats.in_window, 3);
  EXPECT_EQ(stats.bytes_in_window, 300u);
  ahead.Reached(0, {0, 1});  // batch 0 leaves: its holds end
  EXPECT_EQ(ranges->alive(), 0);
  EXPECT_TRUE(ahead.Add(0, {0, 1}, {}, {range(300, 150)}));
  EXPECT_EQ(WaitForOpens(ahead, 5).opened, 5);
  // A batch larger than the whole window goes into an empty lane as far as it fits.
  ahead.Reached(0, {0, 2});
  EXPECT_TRUE(ahead.Add(0, {0, 2}, {}, {range(0, 1000)}));
  stats = WaitForOpens(ahead, 3 + 2 + 4);
  EXPECT_THAT(ranges->held(), ElementsAre(0, 100, 900, 300, 400, 0, 100, 200, 300));
  EXPECT_EQ(stats.in_window, 4);
  EXPECT_EQ(stats.added, 9);
  EXPECT_FALSE(ahead.HasRoom(0));
  ahead.Reset(0);
  EXPECT_EQ(ranges->alive(), 0);
  // A mapping whose bytes are all there has nothing to fetch.
  auto whole = std::make_shared<const MappedFile>("/data/tokens.bin", FileIdentity{.size = 1000},
                                                  absl::MakeConstSpan(bytes), nullptr);
  EXPECT_TRUE(ahead.Add(0, {0, 3}, {}, {MappedRange{.file = whole, .offset = 0, .length = 10}}));
  EXPECT_EQ(ahead.stats().in_window, 0);
}

}  // namespace
}  // namespace ferry
