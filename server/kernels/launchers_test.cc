// What of ferryd's kernels needs no device: the launchers' argument checks, which fail
// before any CUDA call, and the output sizes. Runs in CI.
#include <cstdint>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/kernels/normalize.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

TEST(Launchers, RejectBadArgumentsBeforeTouchingCuda) {
  const auto mean = ImageNetMean();
  const auto std = ImageNetStd();
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

TEST(OutputDType, Sizes) {
  EXPECT_EQ(OutputDTypeSize(OutputDType::kFloat32), 4u);
  EXPECT_EQ(OutputDTypeSize(OutputDType::kFloat16), 2u);
  EXPECT_EQ(OutputDTypeSize(OutputDType::kBFloat16), 2u);
}

}  // namespace
}  // namespace ferry
