#include "server/dataset/shard_pattern.h"

#include "absl/time/clock.h"
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
  for (const char* bad :
       {"a{0..2", "a}0", "a{}", "a{3..1}", "a{x..y}", "a{{0..1}}", "a{0..99999999999}"}) {
    auto r = ExpandShardPattern(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr(bad));
  }
}

// The request that held 1.65 GB and blocked SIGTERM for 132 s: 10 million names. Every
// bound is checked before the names are made, so a refusal is immediate and costs nothing.
// The whole list's count is taken from its groups' sizes before any name is made, so a
// list of 10^18 names is refused at once, as is one a single name over the bound.
TEST(ShardPatternTest, ExpansionsAreBoundedInNamesAndBytesBeforeAnyIsMade) {
  for (const std::vector<std::string>& too_many : std::vector<std::vector<std::string>>{
           {"/d/{0..9999999}.tar"},                              // one range
           {"/d/{0..999}-{0..999}-{0..9}.tar"},                  // groups multiplying
           {"/d/{0..999999}-{0..999999}-{0..999999}.tar"},       // 10^18
           {"/d/{0..999999}.tar", "/d/x.tar"},                   // several patterns together
           {"/d/" + std::string(4000, 'p') + "{0..99999}.tar"},  // 400 MB of names
       }) {
    auto r = ExpandShardPatterns(too_many);
    ASSERT_FALSE(r.ok()) << too_many[0].substr(0, 40);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("more than 1000000 names or 64 MiB of names"));
    EXPECT_LT(r.status().message().size(), 400u);  // a long pattern is quoted in part
  }
  EXPECT_EQ(ExpandShardPatterns({"/d/{0..999999}.tar"})->size(), 1000000u);
}

}  // namespace
}  // namespace ferry
