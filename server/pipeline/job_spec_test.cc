#include "server/pipeline/job_spec.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

ferry::v1::JobSpec Tokens(uint32_t batch_size) {
  ferry::v1::JobSpec spec;
  spec.set_batch_size(batch_size);
  spec.mutable_dataset()->mutable_tokens()->set_path("/data/t.bin");
  return spec;
}

// The message of a refused spec (INVALID_ARGUMENT), or "" when it was taken.
std::string Refusal(const ferry::v1::JobSpec& spec) {
  absl::StatusOr<ferry::v1::JobSpec> normalized = NormalizeJobSpec(spec, SpecDefaults());
  if (normalized.ok()) return "";
  EXPECT_EQ(normalized.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(normalized.status().message());
}

TEST(NormalizeJobSpecTest, FillsTheDefaults) {
  absl::StatusOr<ferry::v1::JobSpec> spec = NormalizeJobSpec(Tokens(8), SpecDefaults());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->device(), "cpu");
  EXPECT_EQ(spec->world_size(), 1u);
  EXPECT_FALSE(spec->dataset().tokens().widen_on_host());
  EXPECT_EQ(spec->dataset().tokens().token_dtype(), ferry::v1::UINT16);
}

// A client that sets only what a dataset requires gets the kind's defaults; what it set stays.
TEST(NormalizeJobSpecTest, TokenDatasetsDefaultToUint16TokensInBlendsToo) {
  ferry::v1::JobSpec spec = Tokens(8);
  spec.mutable_dataset()->mutable_tokens()->set_token_dtype(ferry::v1::UINT32);
  EXPECT_EQ(NormalizeJobSpec(spec, SpecDefaults())->dataset().tokens().token_dtype(),
            ferry::v1::UINT32);
  spec.mutable_dataset()->mutable_token_shards()->add_shards("/data/s-{0..3}.bin");
  EXPECT_EQ(NormalizeJobSpec(spec, SpecDefaults())->dataset().token_shards().token_dtype(),
            ferry::v1::UINT16);
  ferry::v1::BlendDataset* blend = spec.mutable_dataset()->mutable_blend();
  blend->add_sources()->mutable_dataset()->mutable_tokens()->set_path("/data/a.bin");
  blend->add_sources()->mutable_dataset()->mutable_records()->set_path("/data/r.bin");
  absl::StatusOr<ferry::v1::JobSpec> normalized = NormalizeJobSpec(spec, SpecDefaults());
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_EQ(normalized->dataset().blend().sources(0).dataset().tokens().token_dtype(),
            ferry::v1::UINT16);
  EXPECT_EQ(normalized->dataset().blend().sources(1).dataset().records().dtype(),
            ferry::v1::DTYPE_UNSPECIFIED);
}

TEST(NormalizeJobSpecTest, RefusesWhatIsOutOfBoundsNamingTheField) {
  EXPECT_EQ(Refusal(Tokens(0)), "batch_size must be in [1, 1048576] (got 0)");
  EXPECT_EQ(Refusal(Tokens(kMaxBatchSize + 1)), "batch_size must be in [1, 1048576] (got 1048577)");
  EXPECT_EQ(Refusal(Tokens(kMaxBatchSize)), "");
  ferry::v1::JobSpec spec = Tokens(8);
  spec.set_world_size(kMaxWorldSize + 1);
  EXPECT_EQ(Refusal(spec), "world_size must be at most 1048576 (got 1048577)");
  spec = Tokens(8);
  spec.set_prefetch_depth(kMaxPrefetchDepth + 1);
  EXPECT_EQ(Refusal(spec), "prefetch_depth must be at most 64 (got 65)");
  spec = Tokens(8);
  spec.set_device("tpu:0");
  EXPECT_THAT(Refusal(spec), HasSubstr("device must be \"cpu\", \"cuda\" or \"cuda:N\""));
  spec = Tokens(8);
  spec.mutable_image_output()->set_dtype(ferry::v1::BFLOAT16);
  EXPECT_THAT(Refusal(spec), HasSubstr("image_output converts images on the GPU"));
  spec.set_device("cuda:0");
  EXPECT_EQ(Refusal(spec), "");
}

TEST(NormalizeJobSpecTest, TheDaemonsWidenOnHostReachesGpuTokenJobsOnly) {
  const SpecDefaults widen{.widen_tokens_on_host = true};
  ferry::v1::JobSpec spec = Tokens(8);
  EXPECT_FALSE(NormalizeJobSpec(spec, widen)->dataset().tokens().widen_on_host());
  spec.set_device("cuda");
  EXPECT_TRUE(NormalizeJobSpec(spec, widen)->dataset().tokens().widen_on_host());
  EXPECT_FALSE(NormalizeJobSpec(spec, SpecDefaults())->dataset().tokens().widen_on_host());
}

TEST(JobDeviceTest, CpuCudaOrUnknown) {
  EXPECT_EQ(ParseJobDevice("cpu"), JobDevice::kCpu);
  EXPECT_EQ(ParseJobDevice("cuda"), JobDevice::kCuda);
  EXPECT_EQ(ParseJobDevice("cuda:1"), JobDevice::kCuda);
  EXPECT_EQ(ParseJobDevice("cuda:0000:3b:00.0"), JobDevice::kCuda);
  EXPECT_EQ(ParseJobDevice("cudaX"), JobDevice::kUnknown);
  EXPECT_EQ(ParseJobDevice(""), JobDevice::kUnknown);
}

TEST(CheckJobNameTest, PrintableAsciiUpToTheBound) {
  EXPECT_TRUE(CheckJobName("").ok());
  EXPECT_TRUE(CheckJobName(std::string(kMaxJobNameBytes, 'a')).ok());
  EXPECT_FALSE(CheckJobName(std::string(kMaxJobNameBytes + 1, 'a')).ok());
  const absl::Status tab = CheckJobName("a\tb");
  EXPECT_EQ(tab.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tab.message(), HasSubstr("printable ASCII"));
}

}  // namespace
}  // namespace ferry
