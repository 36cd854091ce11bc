#include "common/epoch_layout.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct RunShape {
  int64_t world_size;
  int64_t batch_size;
  bool drop_last;
  bool contiguous;
  bool micro_batches = false;
};

EpochLayout MustMake(int64_t n, const RunShape& run, std::vector<PositionRange> consumed) {
  absl::StatusOr<EpochLayout> layout = EpochLayout::Make({.num_positions = n,
                                                          .world_size = run.world_size,
                                                          .batch_size = run.batch_size,
                                                          .drop_last = run.drop_last,
                                                          .contiguous = run.contiguous,
                                                          .micro_batches = run.micro_batches,
                                                          .consumed = std::move(consumed)});
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

// torch.utils.data.DistributedSampler + BatchSampler over an explicit list of what is left,
// written the way torch writes it: result[rank][batch] = entries of `left`. Entries past
// the list's size are padding; `real` gets those that are not.
// Megatron-LM's MegatronPretrainingSampler over the list of what is left, written the way it
// is written: global batches of W * B entries, rank r taking entries [r * B, (r + 1) * B) of
// each. The short last global batch (g entries) is dropped with drop_last; without it ferry
// pads it by repeating the list's head to W * ceil(g / W) entries, dealt in runs of
// ceil(g / W) (Megatron would hand out unequal slices, which DDP cannot take).
std::vector<std::vector<std::vector<int64_t>>> MegatronReference(const std::vector<int64_t>& left,
                                                                 const RunShape& run) {
  const int64_t w = run.world_size, b = run.batch_size;
  const int64_t r = static_cast<int64_t>(left.size());
  std::vector<std::vector<std::vector<int64_t>>> out(static_cast<size_t>(w));
  std::vector<int64_t> batch;
  for (int64_t i = 0; i < r; ++i) {
    batch.push_back(left[static_cast<size_t>(i)]);
    if (static_cast<int64_t>(batch.size()) == w * b) {
      for (int64_t rank = 0; rank < w; ++rank) {
        out[static_cast<size_t>(rank)].emplace_back(batch.begin() + rank * b,
                                                    batch.begin() + (rank + 1) * b);
      }
      batch.clear();
    }
  }
  if (!batch.empty() && !run.drop_last) {
    const int64_t g = static_cast<int64_t>(batch.size());
    const int64_t each = (g + w - 1) / w;
    for (int64_t i = g; i < each * w; ++i) batch.push_back(left[static_cast<size_t>((i - g) % r)]);
    for (int64_t rank = 0; rank < w; ++rank) {
      out[static_cast<size_t>(rank)].emplace_back(batch.begin() + rank * each,
                                                  batch.begin() + (rank + 1) * each);
    }
  }
  return out;
}

std::vector<std::vector<std::vector<int64_t>>> Reference(const std::vector<int64_t>& left,
                                                         const RunShape& run) {
  if (run.micro_batches) return MegatronReference(left, run);
  const int64_t w = run.world_size;
  std::vector<int64_t> indices = left;
  const int64_t r = static_cast<int64_t>(left.size());
  int64_t total;
  if (run.drop_last) {
    total = r / w * w;
    indices.resize(static_cast<size_t>(total));
  } else {
    total = (r + w - 1) / w * w;
    for (int64_t i = r; i < total; ++i) indices.push_back(left[static_cast<size_t>(i % r)]);
  }
  const int64_t per_rank = total / w;
  std::vector<std::vector<std::vector<int64_t>>> out(static_cast<size_t>(w));
  for (int64_t rank = 0; rank < w; ++rank) {
    std::vector<int64_t> share;
    for (int64_t j = 0; j < per_rank; ++j) {
      share.push_back(
          indices[static_cast<size_t>(run.contiguous ? rank * per_rank + j : rank + j * w)]);
    }
    for (size_t b = 0; b < share.size(); b += static_cast<size_t>(run.batch_size)) {
      const size_t e = std::min(share.size(), b + static_cast<size_t>(run.batch_size));
      if (run.drop_last && e - b < static_cast<size_t>(run.batch_size)) break;
      out[static_cast<size_t>(rank)].emplace_back(share.begin() + b, share.begin() + e);
    }
  }
  return out;
}

std::vector<int64_t> Left(int64_t n, const std::vector<PositionRange>& consumed) {
  std::vector<bool> used(static_cast<size_t>(n), false);
  for (const PositionRange& r : consumed) {
    for (int64_t p = r.begin; p < r.end; ++p) used[static_cast<size_t>(p)] = true;
  }
  std::vector<int64_t> left;
  for (int64_t p = 0; p < n; ++p) {
    if (!used[static_cast<size_t>(p)]) left.push_back(p);
  }
  return left;
}

TEST(EpochLayoutTest, AFreshEpochIsDistributedSamplersDeal) {
  const EpochLayout layout = MustMake(10, {3, 2, false, false}, {});
  EXPECT_EQ(layout.remaining(), 10);
  EXPECT_EQ(layout.per_rank(), 4);  // 12 entries: two padding
  EXPECT_EQ(layout.batches(), 2);
  std::vector<int64_t> out;
  layout.BatchPositions(2, 1, &out);
  EXPECT_THAT(out, ElementsAre(8, 1));  // entries 8 and 11 (padding: position 1)
  EXPECT_THAT(layout.ConsumedAfter(1), ElementsAre(PositionRange{0, 6}));
  EXPECT_THAT(layout.ConsumedAfter(2), ElementsAre(PositionRange{0, 10}));
}

TEST(EpochLayoutTest, AResumedEpochDealsWhatIsLeft) {
  // 4 ranks took 5 batches of 16 of a 3,001-position epoch: positions [0, 320).
  const EpochLayout before = MustMake(3001, {4, 16, false, false}, {});
  ASSERT_THAT(before.ConsumedAfter(5), ElementsAre(PositionRange{0, 320}));
  const EpochLayout after = MustMake(3001, {3, 32, false, false}, before.ConsumedAfter(5));
  EXPECT_EQ(after.remaining(), 2681);
  EXPECT_EQ(after.per_rank(), 894);
  std::vector<int64_t> out;
  after.BatchPositions(1, 0, &out);
  EXPECT_EQ(out.front(), 321);
  EXPECT_EQ(out[1], 324);
}

TEST(EpochLayoutTest, MicroBatchesAreMegatronsPretrainingSamplersDeal) {
  // 2 ranks, micro-batch 2: global batches [0, 4), [4, 8); the short tail [8, 9) padded.
  const EpochLayout layout = MustMake(9, {2, 2, false, false, /*micro_batches=*/true}, {});
  EXPECT_EQ(layout.batches(), 3);
  std::vector<int64_t> out;
  layout.BatchPositions(0, 0, &out);
  EXPECT_THAT(out, ElementsAre(0, 1));
  layout.BatchPositions(1, 0, &out);
  EXPECT_THAT(out, ElementsAre(2, 3));
  layout.BatchPositions(1, 1, &out);
  EXPECT_THAT(out, ElementsAre(6, 7));
  layout.BatchPositions(0, 2, &out);
  EXPECT_THAT(out, ElementsAre(8));
  layout.BatchPositions(1, 2, &out);
  EXPECT_THAT(out, ElementsAre(0));  // padding
  EXPECT_THAT(layout.ConsumedAfter(1), ElementsAre(PositionRange{0, 4}));
  const EpochLayout dropped = MustMake(9, {2, 2, true, false, true}, {});
  EXPECT_EQ(dropped.batches(), 2);
  EXPECT_FALSE(
      EpochLayout::Make({.num_positions = 9, .contiguous = true, .micro_batches = true}).ok());
}

TEST(EpochLayoutTest, RefusesRangesThatAreNotSortedDisjointAndInside) {
  for (std::vector<PositionRange> bad : std::vector<std::vector<PositionRange>>{
           {{5, 3}}, {{0, 0}}, {{-1, 2}}, {{0, 11}}, {{4, 6}, {5, 7}}, {{6, 8}, {0, 2}}}) {
    absl::StatusOr<EpochLayout> layout =
        EpochLayout::Make({.num_positions = 10, .world_size = 1, .batch_size = 1, .consumed = bad});
    EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument) << FormatRanges(bad);
    EXPECT_THAT(layout.status().message(), HasSubstr("sorted, disjoint, non-empty ranges"));
  }
  EXPECT_FALSE(EpochLayout::Make({.num_positions = 0}).ok());
  EXPECT_FALSE(EpochLayout::Make({.num_positions = 5, .world_size = 0}).ok());
  EXPECT_FALSE(EpochLayout::Make({.num_positions = 5, .batch_size = 0}).ok());
}

TEST(EpochLayoutTest, AdjacentRangesMergeAndAWholeEpochLeavesNoBatch) {
  const EpochLayout layout = MustMake(10, {2, 3, false, false}, {{0, 4}, {4, 10}});
  EXPECT_THAT(layout.consumed(), ElementsAre(PositionRange{0, 10}));
  EXPECT_EQ(layout.remaining(), 0);
  EXPECT_EQ(layout.batches(), 0);
  EXPECT_THAT(layout.ConsumedAfter(0), ElementsAre(PositionRange{0, 10}));
}

// Random chains of runs over one epoch, each on its own world size, batch size, drop_last
// and dealing, from 1 to 9 ranks: every run's batches are DistributedSampler's over what is
// left, and across the chain every position is delivered exactly once besides padding
// (without drop_last) or at most once (with it, in the run that finishes the epoch).
TEST(EpochLayoutTest, ChainsOfResumesDeliverEveryPositionOnce) {
  Rng rng(20261129);
  const int64_t sizes[] = {1, 2, 3, 7, 13, 27, 64, 101};
  for (int trial = 0; trial < 4000; ++trial) {
    const int64_t n = sizes[rng.Below(std::size(sizes))];
    const uint64_t dealing = rng.Below(4);  // one dealing per dataset, as in ferry
    const bool contiguous = dealing == 0;
    const bool micro_batches = dealing == 1;
    const int runs = 1 + static_cast<int>(rng.Below(4));
    std::vector<PositionRange> consumed;
    std::map<int64_t, int> delivered;
    int64_t padding = 0;
    bool dropped = false;
    std::string trace;
    for (int i = 0; i < runs; ++i) {
      const RunShape run{1 + static_cast<int64_t>(rng.Below(9)),
                         1 + static_cast<int64_t>(rng.Below(8)), rng.Below(3) == 0, contiguous,
                         micro_batches};
      const EpochLayout layout = MustMake(n, run, consumed);
      const std::vector<int64_t> left = Left(n, consumed);
      const auto reference = Reference(left, run);
      const bool last = i + 1 == runs;
      const int64_t k =
          last ? layout.batches()
               : static_cast<int64_t>(rng.Below(static_cast<uint64_t>(layout.batches()) + 1));
      absl::StrAppend(&trace, " run(W=", run.world_size, " B=", run.batch_size,
                      " drop=", run.drop_last, " contiguous=", contiguous, " micro=", micro_batches,
                      " k=", k, ")");
      SCOPED_TRACE("n=" + std::to_string(n) + trace);
      std::vector<int64_t> out;
      for (int64_t rank = 0; rank < run.world_size; ++rank) {
        ASSERT_EQ(static_cast<int64_t>(reference[static_cast<size_t>(rank)].size()),
                  layout.batches());
        for (int64_t b = 0; b < layout.batches(); ++b) {
          layout.BatchPositions(rank, b, &out);
          ASSERT_EQ(out, reference[static_cast<size_t>(rank)][static_cast<size_t>(b)]);
          if (b < k) {
            for (int64_t p : out) ++delivered[p];
          }
        }
      }
      const int64_t dealt = layout.per_rank() * run.world_size;
      if (dealt > layout.remaining()) padding += dealt - layout.remaining();
      if (last && run.drop_last) dropped = true;
      consumed = layout.ConsumedAfter(k);
    }
    SCOPED_TRACE("n=" + std::to_string(n) + trace);
    int64_t extra = 0;
    for (int64_t p = 0; p < n; ++p) {
      const int count = delivered.count(p) ? delivered[p] : 0;
      if (count == 0) {
        ASSERT_TRUE(dropped) << "position " << p << " was never delivered";
      }
      extra += std::max(0, count - 1);
    }
    ASSERT_LE(extra, padding) << "positions were delivered twice beyond the padding";
    if (!dropped) {
      ASSERT_THAT(consumed, ElementsAre(PositionRange{0, n}));
    }
  }
}

}  // namespace
}  // namespace ferry
