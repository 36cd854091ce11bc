// GatherPolicy alone: when a device ring gathers a batch and when it copies it. The ring's
// use of it is tested through RankPipeline (server/pipeline/pipeline_test.cc).
#include "server/transport/gather_policy.h"

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(GatherPolicyTest, GathersWhileTheTrainerHoldsFewSlots) {
  GatherPolicy policy(32);
  EXPECT_TRUE(policy.GatherNext(/*leased=*/0, /*pending=*/0));
  EXPECT_TRUE(policy.GatherNext(3, 1));   // one pending: the batch its GPU is on
  EXPECT_TRUE(policy.GatherNext(23, 0));  // 23 < 3/4 of 31
  EXPECT_FALSE(policy.GatherNext(24, 0));
  EXPECT_FALSE(policy.GatherNext(23, 1));  // pending ones count as held
  EXPECT_TRUE(policy.GatherNext(0, 0));    // held slots alone leave nothing behind
}

TEST(GatherPolicyTest, SmallRingsCopyWhileTheTrainerHoldsTheOtherSlots) {
  GatherPolicy one(1);
  EXPECT_FALSE(one.GatherNext(0, 0));
  GatherPolicy two(2);
  EXPECT_TRUE(two.GatherNext(0, 0));
  EXPECT_FALSE(two.GatherNext(1, 0));
  GatherPolicy three(3);
  EXPECT_TRUE(three.GatherNext(1, 0));
  EXPECT_FALSE(three.GatherNext(2, 0));
}

// Two pending released signals: the trainer's GPU is behind its host. That batch and the
// next ring's worth are copied even when the trainer then holds nothing (it ran dry, and
// resumes computing as soon as a batch arrives); a new sign starts the count again.
TEST(GatherPolicyTest, CopiesARingsWorthOfBatchesAfterTheTrainersGpuWasBehind) {
  GatherPolicy policy(8);
  EXPECT_FALSE(policy.GatherNext(0, GatherPolicy::kGpuBehind));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(policy.GatherNext(0, 0)) << i;
  EXPECT_FALSE(policy.GatherNext(1, 3));
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(policy.GatherNext(0, 0)) << i;
  EXPECT_TRUE(policy.GatherNext(0, 0));
  EXPECT_TRUE(policy.GatherNext(0, 1));
}

}  // namespace
}  // namespace ferry
