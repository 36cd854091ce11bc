#include "common/error_reason.h"

#include <utility>

#include "absl/strings/cord.h"

namespace ferry {
namespace {

constexpr char kReasonPayload[] = "type.ferry.dev/ferry.ErrorReason";

}  // namespace

absl::Status WithReason(absl::Status status, absl::string_view reason) {
  if (!status.ok()) status.SetPayload(kReasonPayload, absl::Cord(reason));
  return status;
}

std::string ReasonOf(const absl::Status& status) {
  const auto reason = status.GetPayload(kReasonPayload);
  return reason.has_value() ? std::string(*reason) : std::string();
}

}  // namespace ferry
