#include "common/error_reason.h"

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(ErrorReasonTest, ARidesOnTheStatusAndKeepsItsCodeAndMessage) {
  const absl::Status held =
      WithReason(absl::FailedPreconditionError("rank 0 is held"), kReasonRankHeld);
  EXPECT_EQ(ReasonOf(held), "RANK_HELD");
  EXPECT_EQ(held.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(held.message(), "rank 0 is held");
  EXPECT_EQ(ReasonOf(absl::FailedPreconditionError("rank 0 is held")), "");
  EXPECT_EQ(ReasonOf(WithReason(absl::OkStatus(), kReasonRankHeld)), "");  // OK stays OK
}

}  // namespace
}  // namespace ferry
