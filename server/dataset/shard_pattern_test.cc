#include "server/dataset/shard_pattern.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ShardPatternTest, PlainPathIsItself) {
  EXPECT_THAT(*ExpandShardPattern("/d/a.tar"), ElementsAre("/d/a.tar"));
}

TEST(ShardPatternTest, ZeroPaddedRangeKeepsWidth) {
  EXPECT_THAT(*ExpandShardPattern("/d/train-{000008..000011}.tar"),
              ElementsAre("/d/train-000008.tar", "/d/train-000009.tar", "/d/train-000010.tar",
                          "/d/train-000011.tar"));
  EXPECT_THAT(*ExpandShardPattern("s{8..10}"), ElementsAre("s8", "s9", "s10"));
}

TEST(ShardPatternTest, ListsAndSeveralGroupsExpandLeftToRight) {
  EXPECT_THAT(*ExpandShardPattern("{a,b}-{0..1}.tar"),
              ElementsAre("a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"));
  EXPECT_THAT(*ExpandShardPatterns({"x.tar", "{y,z}.tar"}), ElementsAre("x.tar", "y.tar", "z.tar"));
}

TEST(ShardPatternTest, MalformedPatternsNameThePattern) {
  for (const char* bad : {"a{0..2", "a}0", "a{}", "a{3..1}", "a{x..y}", "a{{0..1}}",
                          "a{0..99999999999}"}) {
    auto r = ExpandShardPattern(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr(bad));
  }
}

}  // namespace
}  // namespace ferry
