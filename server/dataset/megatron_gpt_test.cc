#include "server/dataset/megatron_gpt.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::megatron {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Expected values below are numpy 1.24's own output (numpy.random.RandomState, numpy.sum),
// printed with repr so that they round-trip exactly.

TEST(NumpyRandomStateTest, DrawsWhatNumpyDraws) {
  // numpy.frombuffer(numpy.random.RandomState(1234).bytes(20), "<u4")
  NumpyRandomState rng(1234);
  std::vector<uint32_t> got;
  for (int i = 0; i < 5; ++i) got.push_back(rng.NextUint32());
  EXPECT_THAT(got, ElementsAre(822569775u, 2137449171u, 2671936806u, 3512589365u, 1880026316u));
}

TEST(NumpyRandomStateTest, ShufflesAsNumpyShuffles) {
  // a = numpy.arange(10, dtype=numpy.int32); numpy.random.RandomState(1234).shuffle(a)
  std::vector<int32_t> a(10);
  std::iota(a.begin(), a.end(), 0);
  NumpyRandomState rng(1234);
  rng.Shuffle(&a);
  EXPECT_THAT(a, ElementsAre(7, 2, 9, 1, 0, 8, 4, 5, 6, 3));
  // numpy.arange(1000, dtype=numpy.uint32) shuffled by RandomState(7): head and tail.
  std::vector<int64_t> b(1000);
  std::iota(b.begin(), b.end(), 0);
  NumpyRandomState seven(7);
  seven.Shuffle(&b);
  EXPECT_THAT(std::vector<int64_t>(b.begin(), b.begin() + 8),
              ElementsAre(778, 334, 271, 802, 216, 408, 812, 94));
  EXPECT_THAT(std::vector<int64_t>(b.end() - 4, b.end()), ElementsAre(502, 537, 196, 175));
}

TEST(NumpySumTest, AddsInNumpysPairwiseOrder) {
  EXPECT_EQ(NumpySum({0.7, 0.2, 0.1}), 0.9999999999999999);
  EXPECT_EQ(NumpySum(std::vector<double>(9, 0.1)), 0.9);  // sequential: 0.8999999999999999
  EXPECT_EQ(NumpySum({0.3, 0.1, 0.7, 0.9, 0.11, 0.13, 0.17, 0.19, 0.23, 0.29, 0.31}), 3.43);
  EXPECT_EQ(NumpySum(std::vector<double>(20, 1 / 3.0)), 6.666666666666665);
  // numpy.linspace(0.01, 1.7, 130) (i * step + start, the last one exact): over 128
  // values, so the blocks are halved first.
  std::vector<double> ramp(130);
  for (int i = 0; i < 130; ++i) ramp[i] = i * ((1.7 - 0.01) / 129) + 0.01;
  ramp[129] = 1.7;
  EXPECT_EQ(NumpySum(ramp), 111.15);
  EXPECT_EQ(NumpySum({}), 0.0);
}

TEST(NormalizeTest, MegatronsTwoNormalisationsOfABlend) {
  // The builder normalises the blend's weights, then BlendedDataset normalises them again.
  const std::vector<double> once = Normalize({0.7, 0.2, 0.1});
  EXPECT_THAT(once, ElementsAre(0.7000000000000001, 0.20000000000000004, 0.10000000000000002));
  EXPECT_THAT(Normalize(once), ElementsAre(0.7, 0.19999999999999998, 0.09999999999999999));
}

TEST(BuildSampleIndexTest, RefusesWhatMegatronAssertsAgainst) {
  const std::vector<int32_t> sizes = {5, 7};
  const std::vector<int32_t> documents = {0, 1};
  auto one = BuildSampleIndex(sizes, documents, 1, 1, 12, true, true);
  EXPECT_EQ(one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(one.status().message(), HasSubstr("seq_length > 1"));
}

TEST(BuildSampleIndexTest, PacksDocumentsIntoWindowsSharingTheirBoundaryToken) {
  // Two documents of 5 and 7 tokens, windows of 4 plus the extra (label) token: 11 tokens
  // make 2 samples, starting at (doc 0, 0) and (0, 4); the end marker is (1, 3).
  const std::vector<int32_t> sizes = {5, 7};
  const std::vector<int32_t> documents = {0, 1};
  auto index = BuildSampleIndex(sizes, documents, 4, 1, 12, true, true);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(*index, ElementsAre(0, 0, 0, 4, 1, 3));
}

TEST(BuildBlendingIndicesTest, FollowsTheWeightsTheFirstSourceWinningTies) {
  std::vector<int16_t> source;
  std::vector<int64_t> sample;
  BuildBlendingIndices({0.5, 0.25, 0.25}, 8, &source, &sample);
  EXPECT_THAT(source, ElementsAre(0, 1, 2, 0, 0, 1, 2, 0));
  EXPECT_THAT(sample, ElementsAre(0, 0, 0, 1, 2, 1, 1, 3));
}

}  // namespace
}  // namespace ferry::megatron
