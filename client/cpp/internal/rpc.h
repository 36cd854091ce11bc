// What the client library does to talk gRPC to ferryd: gRPC -> absl status mapping, and the
// packing of releases into the Consume stream's messages. Internal to the client library.
#ifndef FERRY_CLIENT_CPP_INTERNAL_RPC_H_
#define FERRY_CLIENT_CPP_INTERNAL_RPC_H_

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "ferry/v1/ferry.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace ferry::internal {

// Maps a gRPC status onto the same canonical absl code. Transport failures (UNAVAILABLE,
// DEADLINE_EXCEEDED) get `context` prepended, since gRPC's own text ("Socket closed") does
// not say which daemon or call; the daemon's own messages pass unchanged. CANCELLED becomes
// UNAVAILABLE: the client reports no call it cancelled itself, so the daemon ended it (a
// ferryd shutting down cancels its calls in flight), and trying again is the remedy. The
// reason in `call`'s trailing metadata, if any, rides on the result (common/error_reason.h).
absl::Status FromGrpc(const grpc::Status& status, std::string_view context,
                      const grpc::ClientContext* call = nullptr);

// Packs each run of consecutive Release requests in `requests` into its first request
// (ConsumeRequest.releases), in order, leaving every other request as it is: what the
// stream writer sends for what was queued. Returns how many requests each message
// carries, so the caller can count what it sent.
std::vector<size_t> PackReleases(std::vector<v1::ConsumeRequest>* requests);

}  // namespace ferry::internal

#endif  // FERRY_CLIENT_CPP_INTERNAL_RPC_H_
