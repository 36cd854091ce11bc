#include "server/decode/gpu_decode_split.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(GpuDecodeSplitTest, ModesCpuAndGpuAreFixed) {
  GpuDecodeSplit cpu(GpuDecodeMode::kCpu, 4), gpu(GpuDecodeMode::kGpu, 4);
  GpuDecodeSplit::Rank cpu_rank(&cpu), gpu_rank(&gpu);
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(cpu.Route(GpuJpegReject::kNone, cpu_rank.RouteBatch()));
    EXPECT_TRUE(gpu.Route(GpuJpegReject::kNone, gpu_rank.RouteBatch()));
  }
  // Measurements do not move a fixed mode.
  gpu.ReportCpuDecode(0.002);
  gpu.ReportGpuBatch(128, 0.5);
  EXPECT_EQ(gpu.share(), 1.0);
  EXPECT_EQ(cpu.counts().cpu_images, 100);
  EXPECT_EQ(gpu.counts().gpu_images, 100);
}

TEST(GpuDecodeSplitTest, FilesTheGpuCannotTakeGoToTheCpuCountedByReason) {
  GpuDecodeSplit split(GpuDecodeMode::kGpu, 4);
  EXPECT_FALSE(split.Route(GpuJpegReject::kProgressive, true));
  EXPECT_FALSE(split.Route(GpuJpegReject::kCmyk, true));
  EXPECT_FALSE(split.Route(GpuJpegReject::kCmyk, true));
  EXPECT_TRUE(split.Route(GpuJpegReject::kNone, true));
  split.CountFallback(GpuJpegReject::kDecoderRefused);  // the GPU batch failed after all
  const GpuDecodeSplit::Counts c = split.counts();
  EXPECT_EQ(c.fallbacks[static_cast<int>(GpuJpegReject::kProgressive)], 1);
  EXPECT_EQ(c.fallbacks[static_cast<int>(GpuJpegReject::kCmyk)], 2);
  EXPECT_EQ(c.fallbacks[static_cast<int>(GpuJpegReject::kDecoderRefused)], 1);
  EXPECT_EQ(c.gpu_images, 0);
  EXPECT_EQ(c.cpu_images, 4);
}

// A trainer that waited for every one of `batches` batches (steps of 100 ms, waits of 10).
void InputBound(GpuDecodeSplit::Rank& rank, int batches = 20) {
  for (int i = 0; i < batches; ++i) rank.ReportConsumerWait(0.010, 0.100);
}

TEST(GpuDecodeSplitTest, AutoBalancesTheMeasuredCosts) {
  GpuDecodeSplit split(GpuDecodeMode::kAuto, 16);
  GpuDecodeSplit::Rank rank(&split);
  InputBound(rank);
  EXPECT_EQ(split.share(), GpuDecodeSplit::kInitialShare);
  // Only one side measured: the share stays where it was.
  split.ReportCpuDecode(0.002);
  EXPECT_EQ(split.share(), GpuDecodeSplit::kInitialShare);
  // c = 2 ms, r = 0.05 ms, g = 0.039 ms with 16 workers: f = c / (c - r + W g).
  split.ReportCpuRoute(0.00005);
  split.ReportGpuBatch(100, 0.0039);
  EXPECT_NEAR(split.share(), 0.002 / (0.002 - 0.00005 + 16 * 0.000039), 1e-6);
  // A GPU that turns slow (another job's kernels) takes a smaller share, smoothly.
  double last = split.share();
  for (int i = 0; i < 200; ++i) {
    split.ReportGpuBatch(100, 0.05);
    EXPECT_LE(split.share(), last + 1e-9);
    last = split.share();
  }
  EXPECT_NEAR(split.share(), 0.002 / (0.002 - 0.00005 + 16 * 0.0005), 1e-3);
  // Files the GPU cannot take load the workers: with a fifth of all files such, the GPU
  // takes a larger share of the rest, f = c / ((1 - p)(c - r + W g)).
  for (int i = 0; i < 25; ++i) split.Route(GpuJpegReject::kProgressive, true);  // p = 25 / 125
  for (int i = 0; i < 100; ++i) split.Route(GpuJpegReject::kNone, true);
  split.ReportGpuBatch(100, 0.05);  // recomputes
  EXPECT_NEAR(split.share(), 0.002 / (0.8 * (0.002 - 0.00005 + 16 * 0.0005)), 1e-3);
  // A GPU much faster than the workers takes everything.
  GpuDecodeSplit fast(GpuDecodeMode::kAuto, 4);
  GpuDecodeSplit::Rank fast_rank(&fast);
  InputBound(fast_rank);
  fast.ReportCpuDecode(0.002);
  fast.ReportCpuRoute(0.0025);  // routing costs more than decoding: still all to the GPU
  fast.ReportGpuBatch(1000, 0.000001);
  EXPECT_EQ(fast.share(), 1.0);
}

TEST(GpuDecodeSplitTest, AutoCountsEveryGpuThatDecodesForTheJob) {
  GpuDecodeSplit split(GpuDecodeMode::kAuto, 64);
  GpuDecodeSplit::Rank rank(&split);
  InputBound(rank);
  split.ReportCpuDecode(0.004);
  split.ReportCpuRoute(0.0002);
  split.ReportGpuBatch(100, 0.005);  // g = 50 us
  // No decoder yet counts as one.
  const double one = 0.004 / (0.004 - 0.0002 + 64 * 0.00005);
  EXPECT_NEAR(split.share(), one, 1e-6);
  {
    GpuDecodeSplit::Decoder a = split.AddDecoder();
    EXPECT_NEAR(split.share(), one, 1e-6);
    // Four GPUs' engines decode side by side: a larger share goes to them.
    std::vector<GpuDecodeSplit::Decoder> more;
    for (int i = 0; i < 3; ++i) more.push_back(split.AddDecoder());
    EXPECT_EQ(split.decoders(), 4);
    EXPECT_EQ(split.counts().decoders, 4);
    EXPECT_NEAR(split.share(), 0.004 / (0.004 - 0.0002 + 64 * 0.00005 / 4), 1e-6);
    GpuDecodeSplit::Decoder moved = std::move(more[0]);
    more.clear();  // two of the four detach; the moved-from handle counts nothing
    EXPECT_EQ(split.decoders(), 2);
    EXPECT_NEAR(split.share(), 0.004 / (0.004 - 0.0002 + 64 * 0.00005 / 2), 1e-6);
  }
  EXPECT_EQ(split.decoders(), 0);
  EXPECT_NEAR(split.share(), one, 1e-6);
}

TEST(GpuDecodeSplitTest, EveryFileTheGpuCanTakeOfAGpuBatchGoesToIt) {
  GpuDecodeSplit split(GpuDecodeMode::kAuto, 8);
  EXPECT_TRUE(split.Route(GpuJpegReject::kNone, /*gpu_batch=*/true));
  EXPECT_FALSE(split.Route(GpuJpegReject::kCmyk, true));  // never, whatever the batch
  EXPECT_FALSE(split.Route(GpuJpegReject::kNone, false));
  const GpuDecodeSplit::Counts c = split.counts();
  EXPECT_EQ(c.gpu_images, 1);
  EXPECT_EQ(c.cpu_images, 2);
  EXPECT_EQ(c.fallbacks[static_cast<int>(GpuJpegReject::kCmyk)], 1);
}

TEST(GpuDecodeSplitTest, RouteBatchHandsOutTheShareEvenlyFromManyThreads) {
  GpuDecodeSplit split(GpuDecodeMode::kAuto, 8);
  GpuDecodeSplit::Rank rank(&split);
  InputBound(rank);
  split.ReportCpuDecode(0.003);
  split.ReportCpuRoute(0.0);
  split.ReportGpuBatch(8, 0.003);  // f = 0.003 / (0.003 + 8 * 0.000375) = 0.5
  ASSERT_NEAR(split.share(), 0.5, 1e-9);
  std::vector<std::thread> threads;
  std::atomic<int> routed{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) routed += rank.RouteBatch() ? 1 : 0;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(routed.load(), 4000);  // exactly half: error diffusion keeps no remainder
  // Every window of consecutive decisions follows the share too (no bursts).
  GpuDecodeSplit single(GpuDecodeMode::kAuto, 8);
  GpuDecodeSplit::Rank single_rank(&single);
  InputBound(single_rank);
  single.ReportCpuDecode(0.003);
  single.ReportGpuBatch(8, 0.003);
  int in_window = 0;
  for (int i = 0; i < 10; ++i) in_window += single_rank.RouteBatch() ? 1 : 0;
  EXPECT_EQ(in_window, 5);
}

TEST(GpuDecodeSplitTest, AutoUsesTheGpuOnlyWhileTheTrainerWaits) {
  GpuDecodeSplit split(GpuDecodeMode::kAuto, 16);
  GpuDecodeSplit::Rank rank(&split);
  split.ReportCpuDecode(0.002);
  split.ReportGpuBatch(100, 0.01);
  const double balance = 0.002 / (0.002 + 16 * 0.0001);
  // Before any trainer has waited, nothing goes to the GPU.
  EXPECT_EQ(split.share(), 0.0);
  EXPECT_EQ(split.counts().demand, 0.0);
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(rank.RouteBatch());
  // Waits under kInputBoundWait of the step do not count (a trainer ferry keeps ahead of).
  for (int i = 0; i < 50; ++i) rank.ReportConsumerWait(0.0015, 0.100);
  EXPECT_EQ(split.share(), 0.0);
  // A trainer that waits: the demand rises by kDemandUp per batch, to the balance.
  rank.ReportConsumerWait(0.003, 0.100);
  EXPECT_NEAR(split.counts().demand, GpuDecodeSplit::kDemandUp, 1e-12);
  EXPECT_NEAR(split.share(), GpuDecodeSplit::kDemandUp * balance, 1e-6);
  InputBound(rank);
  EXPECT_EQ(split.counts().demand, 1.0);
  EXPECT_NEAR(split.share(), balance, 1e-6);
  // Once the workers keep ahead again, it falls back to 0 by kDemandDown a batch.
  rank.ReportConsumerWait(0, 0.100);
  EXPECT_NEAR(split.counts().demand, 1 - GpuDecodeSplit::kDemandDown, 1e-12);
  for (int i = 0; i < 40; ++i) rank.ReportConsumerWait(0, 0.100);
  EXPECT_EQ(split.share(), 0.0);
  // A trainer that waits on one batch in three (where up and down cancel) gets a little of
  // the GPU, never the whole balance.
  double most = 0;
  for (int i = 0; i < 300; ++i) {
    rank.ReportConsumerWait(i % 3 == 0 ? 0.05 : 0, 0.100);
    most = std::max(most, split.counts().demand);
  }
  EXPECT_NEAR(most, GpuDecodeSplit::kDemandUp, 1e-12);
  // Fixed modes ignore waits.
  GpuDecodeSplit gpu(GpuDecodeMode::kGpu, 4), cpu(GpuDecodeMode::kCpu, 4);
  GpuDecodeSplit::Rank gpu_rank(&gpu), cpu_rank(&cpu);
  for (int i = 0; i < 30; ++i) {
    gpu_rank.ReportConsumerWait(0, 0.1);
    cpu_rank.ReportConsumerWait(0.1, 0.1);
  }
  EXPECT_EQ(gpu.share(), 1.0);
  EXPECT_EQ(cpu.share(), 0.0);
}

// Steps of a node whose batches take `step(balance)` seconds, each waited for (input-bound):
// what a trainer reports when the split alone sets the pace.
template <typename StepOf>
void Steps(GpuDecodeSplit& split, GpuDecodeSplit::Rank& rank, int n, StepOf step) {
  for (int i = 0; i < n; ++i) {
    const double seconds = step(split.balance());
    rank.ReportConsumerWait(seconds / 2, seconds);
    rank.ObserveStep(seconds / 2, seconds);
  }
}

// The model's balance is 0.5 here; the batches come fastest at another share, because the two
// sides slow each other (which the model cannot see). The search finds it, and holds there.
TEST(GpuDecodeSplitTest, AutoSearchesForTheShareThatDeliversBatchesFastest) {
  for (const double best : {0.8, 1.0, 0.2}) {
    GpuDecodeSplit split(GpuDecodeMode::kAuto, 16);
    split.ReportCpuDecode(0.003);
    split.ReportCpuRoute(0.0);
    split.ReportGpuBatch(16, 0.003);  // f = 0.003 / (0.003 + 16 * 0.003 / 16) = 0.5
    GpuDecodeSplit::Rank rank(&split);
    ASSERT_NEAR(split.balance(), 0.5, 1e-9);
    auto step = [best](double f) { return 0.1 * (1 + 4 * (f - best) * (f - best)); };
    // 25 moves at most are needed (a window measured, a window settling, per move).
    Steps(split, rank, 50 * GpuDecodeSplit::kSearchWindow, step);
    EXPECT_NEAR(split.balance(), best, 2 * GpuDecodeSplit::kSearchStep + 1e-9) << "best " << best;
    EXPECT_NEAR(split.counts().search_offset, split.balance() - 0.5, 1e-9);
    // Once there, it stays within a move or two of it.
    for (int i = 0; i < 20; ++i) {
      Steps(split, rank, GpuDecodeSplit::kSearchWindow, step);
      EXPECT_NEAR(split.balance(), best, 2 * GpuDecodeSplit::kSearchStep + 1e-9) << "best " << best;
    }
    EXPECT_GE(split.balance(), 0.0);
    EXPECT_LE(split.balance(), 1.0);
  }
}

// Steps the trainer does not wait for are its own compute: they say nothing about the split,
// and the search does not move. Nor does it before both sides' costs are measured, or in the
// fixed modes.
TEST(GpuDecodeSplitTest, AutoSearchesOnlyWhileTheTrainerWaitsForBatches) {
  GpuDecodeSplit split(GpuDecodeMode::kAuto, 16);
  GpuDecodeSplit::Rank rank(&split);
  auto slower_with_more_gpu = [](double f) { return 0.1 + f; };
  Steps(split, rank, 20 * GpuDecodeSplit::kSearchWindow, slower_with_more_gpu);
  EXPECT_EQ(split.balance(), GpuDecodeSplit::kInitialShare);  // no costs yet
  split.ReportCpuDecode(0.003);
  split.ReportGpuBatch(16, 0.003);
  ASSERT_NEAR(split.balance(), 0.5, 1e-9);
  for (int i = 0; i < 20 * GpuDecodeSplit::kSearchWindow; ++i) {
    rank.ObserveStep(0, 0.1 + split.balance());
  }
  EXPECT_NEAR(split.balance(), 0.5, 1e-9);
  EXPECT_EQ(split.counts().search_offset, 0.0);
  // Waited for: the search moves, and away from the GPU here.
  Steps(split, rank, 20 * GpuDecodeSplit::kSearchWindow, slower_with_more_gpu);
  EXPECT_LT(split.balance(), 0.5);
  for (GpuDecodeMode mode : {GpuDecodeMode::kGpu, GpuDecodeMode::kCpu}) {
    GpuDecodeSplit fixed(mode, 16);
    fixed.ReportCpuDecode(0.003);
    fixed.ReportGpuBatch(16, 0.003);
    GpuDecodeSplit::Rank fixed_rank(&fixed);
    const double before = fixed.balance();
    Steps(fixed, fixed_rank, 20 * GpuDecodeSplit::kSearchWindow, slower_with_more_gpu);
    EXPECT_EQ(fixed.balance(), before);
  }
}

// Under DDP the rank short of batches waits for them while the others wait for it in the
// all-reduce: its GPU must get the decode though three ranks report no wait. (One demand for
// the job, raised by 0.1 and lowered by 3 x 0.05 a round, stayed at 0.)
TEST(GpuDecodeSplitTest, EachRankFollowsItsOwnTrainersWaits) {
  GpuDecodeSplit split(GpuDecodeMode::kAuto, 16);
  split.ReportCpuDecode(0.002);
  split.ReportGpuBatch(100, 0.01);
  const double balance = 0.002 / (0.002 + 16 * 0.0001);
  std::vector<std::unique_ptr<GpuDecodeSplit::Rank>> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(std::make_unique<GpuDecodeSplit::Rank>(&split));
  for (int round = 0; round < 30; ++round) {
    for (int r = 0; r < 4; ++r) ranks[r]->ReportConsumerWait(r == 0 ? 0.05 : 0.0, 0.100);
  }
  EXPECT_EQ(ranks[0]->demand(), 1.0);
  EXPECT_NEAR(ranks[0]->share(), balance, 1e-6);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(ranks[r]->share(), 0.0) << "rank " << r;
  int routed[4] = {0, 0, 0, 0};
  for (int b = 0; b < 100; ++b) {
    for (int r = 0; r < 4; ++r) routed[r] += ranks[r]->RouteBatch() ? 1 : 0;
  }
  EXPECT_NEAR(routed[0], 100 * balance, 1.0);
  EXPECT_EQ(routed[1] + routed[2] + routed[3], 0);
  // The job's figures are the ranks' mean; a rank that leaves takes its demand with it.
  EXPECT_NEAR(split.counts().demand, 0.25, 1e-9);
  EXPECT_NEAR(split.share(), 0.25 * balance, 1e-6);
  ranks.erase(ranks.begin());
  EXPECT_EQ(split.counts().demand, 0.0);
  ranks.clear();
  EXPECT_EQ(split.share(), 0.0);
}

// Ranks that schedule in turn each get their share of their own batches, so every GPU's
// decoder works. (One turn order for the job, at share 1/2, handed every GPU batch to the
// second of two ranks that alternate.)
TEST(GpuDecodeSplitTest, RanksSchedulingInTurnEachGetTheirShare) {
  GpuDecodeSplit split(GpuDecodeMode::kAuto, 8);
  split.ReportCpuDecode(0.003);
  split.ReportCpuRoute(0.0);
  split.ReportGpuBatch(8, 0.003);  // f = 0.5
  GpuDecodeSplit::Rank a(&split), b(&split);
  InputBound(a);
  InputBound(b);
  ASSERT_NEAR(a.share(), 0.5, 1e-9);
  int to_a = 0, to_b = 0;
  for (int i = 0; i < 100; ++i) {
    to_a += a.RouteBatch() ? 1 : 0;
    to_b += b.RouteBatch() ? 1 : 0;
  }
  EXPECT_EQ(to_a, 50);
  EXPECT_EQ(to_b, 50);
}

}  // namespace
}  // namespace ferry
