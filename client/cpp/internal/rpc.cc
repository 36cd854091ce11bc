#include "client/cpp/internal/rpc.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_reason.h"

namespace ferry::internal {

absl::Status FromGrpc(const grpc::Status& status, std::string_view context,
                      const grpc::ClientContext* call) {
  if (status.ok()) return absl::OkStatus();
  if (call != nullptr) {
    const auto& trailers = call->GetServerTrailingMetadata();
    if (auto it = trailers.find(kReasonMetadataKey); it != trailers.end()) {
      return WithReason(FromGrpc(status, context),
                        absl::string_view(it->second.data(), it->second.size()));
    }
  }
  auto code = static_cast<absl::StatusCode>(status.error_code());
  switch (code) {
    case absl::StatusCode::kCancelled:
      // The client cancels no call whose status it reports: the server ended it, which a
      // ferryd does to the calls in flight when it shuts down.
      return absl::UnavailableError(absl::StrCat(
          std::string(context), ": ferryd ended the call without an answer (",
          status.error_message(), "); it is probably shutting down: try again once it is back"));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return absl::Status(code, absl::StrCat(std::string(context), ": ", status.error_message()));
    default:
      return absl::Status(code, status.error_message());
  }
}

std::vector<size_t> PackReleases(std::vector<v1::ConsumeRequest>* requests) {
  std::vector<v1::ConsumeRequest> packed;
  std::vector<size_t> counts;
  for (v1::ConsumeRequest& request : *requests) {
    if (request.has_release() && !packed.empty() && packed.back().has_release()) {
      *packed.back().add_releases() = std::move(*request.mutable_release());
      ++counts.back();
      continue;
    }
    packed.push_back(std::move(request));
    counts.push_back(1);
  }
  *requests = std::move(packed);
  return counts;
}

}  // namespace ferry::internal
