// Machine-readable reasons of ferry's errors, for the cases a client acts on (it never
// matches an error's text). A reason rides on an absl::Status as a payload inside ferryd
// and the client library, as the trailing metadata kReasonMetadataKey on the wire, and as
// ferry_last_error_reason() in the C ABI (FerryError.reason in Python).
//
//   return WithReason(absl::FailedPreconditionError("..."), kReasonRankHeld);
//   if (ReasonOf(status) == kReasonRankHeld) ...  // take the rank over
#ifndef FERRY_COMMON_ERROR_REASON_H_
#define FERRY_COMMON_ERROR_REASON_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ferry {

// The rank is consumed by a live process now (FAILED_PRECONDITION); the same process may
// take it over once its earlier consumer's stream has ended.
inline constexpr char kReasonRankHeld[] = "RANK_HELD";

// Consumer::Next's wait ended before a batch came (DEADLINE_EXCEEDED); nothing is lost:
// calling Next again goes on waiting.
inline constexpr char kReasonNoBatchYet[] = "NO_BATCH_YET";

// gRPC trailing metadata that carries the reason.
inline constexpr char kReasonMetadataKey[] = "ferry-reason";

// `status` with `reason` attached (an OK status stays as it is).
absl::Status WithReason(absl::Status status, absl::string_view reason);
// The reason attached to `status`; empty when none.
std::string ReasonOf(const absl::Status& status);

}  // namespace ferry

#endif  // FERRY_COMMON_ERROR_REASON_H_
