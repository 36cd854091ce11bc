#include "server/decode/gpu_decode_split.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(GpuDecodeSplitTest, ModesCpuAndGpuAreFixed) {
  GpuDecodeSplit cpu(GpuDecodeMode::kCpu, 4), gpu(GpuDecodeMode::kGpu, 4);
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(cpu.Route(GpuJpegReject::kNone));
    EXPECT_TRUE(gpu.Route(GpuJpegReject::kNone));
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
  EXPECT_FALSE(split.Route(GpuJpegReject::kProgressive));
  EXPECT_FALSE(split.Route(GpuJpegReject::kCmyk));
  EXPECT_FALSE(split.Route(GpuJpegReject::kCmyk));
  EXPECT_TRUE(split.Route(GpuJpegReject::kNone));
  split.CountFallback(GpuJpegReject::kDecoderRefused);  // the GPU batch failed after all
  const GpuDecodeSplit::Counts c = split.counts();
  EXPECT_EQ(c.fallbacks[static_cast<int>(GpuJpegReject::kProgressive)], 1);
  EXPECT_EQ(c.fallbacks[static_cast<int>(GpuJpegReject::kCmyk)], 2);
  EXPECT_EQ(c.fallbacks[static_cast<int>(GpuJpegReject::kDecoderRefused)], 1);
  EXPECT_EQ(c.gpu_images, 0);
  EXPECT_EQ(c.cpu_images, 4);
}

TEST(GpuDecodeSplitTest, AutoBalancesTheMeasuredCosts) {
  GpuDecodeSplit split(GpuDecodeMode::kAuto, 16);
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
  // A GPU much faster than the workers takes everything.
  GpuDecodeSplit fast(GpuDecodeMode::kAuto, 4);
  fast.ReportCpuDecode(0.002);
  fast.ReportCpuRoute(0.0025);  // routing costs more than decoding: still all to the GPU
  fast.ReportGpuBatch(1000, 0.000001);
  EXPECT_EQ(fast.share(), 1.0);
}

TEST(GpuDecodeSplitTest, RouteHandsOutTheShareEvenlyFromManyThreads) {
  GpuDecodeSplit split(GpuDecodeMode::kAuto, 8);
  split.ReportCpuDecode(0.003);
  split.ReportCpuRoute(0.0);
  split.ReportGpuBatch(8, 0.003);  // f = 0.003 / (0.003 + 8 * 0.000375) = 0.5
  ASSERT_NEAR(split.share(), 0.5, 1e-9);
  std::vector<std::thread> threads;
  std::atomic<int> routed{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) routed += split.Route(GpuJpegReject::kNone) ? 1 : 0;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(routed.load(), 4000);  // exactly half: error diffusion keeps no remainder
  // Every window of consecutive decisions follows the share too (no bursts).
  GpuDecodeSplit single(GpuDecodeMode::kAuto, 8);
  single.ReportCpuDecode(0.003);
  single.ReportGpuBatch(8, 0.003);
  int in_window = 0;
  for (int i = 0; i < 10; ++i) in_window += single.Route(GpuJpegReject::kNone) ? 1 : 0;
  EXPECT_EQ(in_window, 5);
}

}  // namespace
}  // namespace ferry
