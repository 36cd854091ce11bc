// What of ferryd's kernels needs no device: the launchers' argument checks, which fail
// before any CUDA call, and the output sizes. Runs in CI.
#include <cstdint>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/kernels/normalize.h"
#include "server/kernels/photometric.h"
#include "server/kernels/resample.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

TEST(Launchers, RejectBadArgumentsBeforeTouchingCuda) {
  const auto mean = kImageNetMean;
  const auto std = kImageNetStd;
  const float zero_std[3] = {0.2f, 0.0f, 0.2f};
  uint8_t byte = 0;
  EXPECT_EQ(LaunchNormalizeImages(&byte, &byte, OutputDType::kFloat32, -1, 2, 2, mean.data(),
                                  std.data(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status bad_std = LaunchNormalizeImages(&byte, &byte, OutputDType::kFloat16, 1, 2, 2,
                                                     mean.data(), zero_std, nullptr);
  EXPECT_EQ(bad_std.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_std.message(), HasSubstr("channel 1"));
  EXPECT_EQ(LaunchNormalizeImages(nullptr, &byte, OutputDType::kBFloat16, 1, 2, 2, mean.data(),
                                  std.data(), nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // An empty batch enqueues nothing, so needs no stream.
  EXPECT_TRUE(LaunchNormalizeImages(nullptr, nullptr, OutputDType::kFloat32, 0, 224, 224,
                                    mean.data(), std.data(), nullptr)
                  .ok());
  EXPECT_EQ(
      LaunchWidenTokens(&byte, TokenInput::kUint16, &byte, TokenOutput::kInt64, -3, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      LaunchWidenTokens(nullptr, TokenInput::kUint32, nullptr, TokenOutput::kInt32, 0, nullptr)
          .ok());
  EXPECT_EQ(
      LaunchWidenTokens(&byte, TokenInput::kInt32, &byte, TokenOutput::kInt32, 4, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(Launchers, PhotometricRejectsBadArgumentsBeforeTouchingCuda) {
  uint8_t byte = 0;
  PhotometricProgram program;
  const absl::Status negative =
      LaunchPhotometric(&byte, &program, &byte, OutputDType::kFloat32, -1, 2, 2, nullptr);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("-1 images of 2x2"));
  EXPECT_EQ(
      LaunchPhotometric(&byte, &program, &byte, OutputDType::kFloat16, 2, -3, 2, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LaunchPhotometric(&byte, &program, &byte, OutputDType::kBFloat16, 2, 2, -5, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  for (int which = 0; which < 3; ++which) {
    const absl::Status null =
        LaunchPhotometric(which == 0 ? nullptr : &byte, which == 1 ? nullptr : &program,
                          which == 2 ? nullptr : &byte, OutputDType::kFloat32, 1, 2, 2, nullptr);
    EXPECT_EQ(null.code(), absl::StatusCode::kInvalidArgument) << which;
    EXPECT_THAT(null.message(), HasSubstr("null")) << which;
  }
  const absl::Status huge =
      LaunchPhotometric(&byte, &program, &byte, OutputDType::kFloat32, 1, 40000, 40000, nullptr);
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.message(), HasSubstr("40000x40000"));
  // An empty batch (or empty images) enqueues nothing, so needs no pointers and no stream.
  EXPECT_TRUE(
      LaunchPhotometric(nullptr, nullptr, nullptr, OutputDType::kFloat32, 0, 224, 224, nullptr)
          .ok());
  EXPECT_TRUE(
      LaunchPhotometric(nullptr, nullptr, nullptr, OutputDType::kBFloat16, 8, 0, 224, nullptr)
          .ok());
}

TEST(OutputDType, Sizes) {
  EXPECT_EQ(OutputDTypeSize(OutputDType::kFloat32), 4u);
  EXPECT_EQ(OutputDTypeSize(OutputDType::kFloat16), 2u);
  EXPECT_EQ(OutputDTypeSize(OutputDType::kBFloat16), 2u);
}

TEST(Launchers, ResampleRejectsBadArgumentsBeforeTouchingCuda) {
  ResampleJob job;
  for (const auto& [count, size] : {std::pair{-1, 224}, {4, 0}, {4, -3}, {4, 16385}}) {
    const absl::Status bad = LaunchResampleWindows(&job, count, size, nullptr);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << count << " " << size;
    EXPECT_THAT(bad.message(),
                HasSubstr(absl::StrCat(count, " windows to an output side of ", size)));
  }
  const absl::Status null = LaunchResampleWindows(nullptr, 3, 224, nullptr);
  EXPECT_EQ(null.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(null.message(), HasSubstr("null jobs"));
  // An empty batch enqueues nothing, so needs no jobs and no stream.
  EXPECT_TRUE(LaunchResampleWindows(nullptr, 0, 224, nullptr).ok());
  EXPECT_TRUE(LaunchResampleWindows(nullptr, 0, kMaxResampleSize, nullptr).ok());
}

ResampleJob GoodJob() {
  ResampleJob job;
  job.src = 0x1000;
  job.dst = 0x2000;
  job.width = 500, job.height = 375, job.pitch = 1504;
  job.x0 = 10.5, job.x1 = 400, job.y0 = 0, job.y1 = 375;
  job.clamp_x0 = 0, job.clamp_x1 = 500, job.clamp_y0 = 0, job.clamp_y1 = 375;
  return job;
}

TEST(Launchers, CheckResampleJobNamesTheFieldAndValue) {
  EXPECT_TRUE(CheckResampleJob(GoodJob()).ok());
  struct Case {
    void (*spoil)(ResampleJob&);
    const char* message;
  };
  const Case cases[] = {
      {[](ResampleJob& j) { j.src = 0; }, "null source or destination"},
      {[](ResampleJob& j) { j.dst = 0; }, "null source or destination"},
      {[](ResampleJob& j) { j.width = 0; }, "a 0x375 source"},
      {[](ResampleJob& j) { j.height = -2; }, "a 500x-2 source"},
      {[](ResampleJob& j) { j.pitch = 1499; }, "pitch of 1499 bytes"},
      {[](ResampleJob& j) { j.clamp_x1 = 501; }, "clamp_x range [0, 501)"},
      {[](ResampleJob& j) { j.clamp_x0 = -1; }, "clamp_x range [-1, 500)"},
      {[](ResampleJob& j) { j.clamp_y0 = j.clamp_y1 = 7; }, "clamp_y range [7, 7)"},
      {[](ResampleJob& j) { j.x1 = j.x0; }, "window x0 = 10.5, x1 = 10.5"},
      {[](ResampleJob& j) { j.y0 = std::numeric_limits<double>::quiet_NaN(); }, "window y0 = nan"},
      {[](ResampleJob& j) { j.y1 = std::numeric_limits<double>::infinity(); }, "y1 = inf"},
  };
  for (const Case& c : cases) {
    ResampleJob job = GoodJob();
    c.spoil(job);
    const absl::Status status = CheckResampleJob(job);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace ferry
