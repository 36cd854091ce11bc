// Conversions between the public plain structs of ferry/client.h and the ferry.v1 protos,
// the proto3 JSON mapping ferry prints, and gRPC -> absl status mapping. Internal to the
// client library (the only place besides client.cc that sees protobuf types).
#ifndef FERRY_CLIENT_CPP_INTERNAL_CONVERT_H_
#define FERRY_CLIENT_CPP_INTERNAL_CONVERT_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/client.h"
#include "ferry/v1/ferry.pb.h"
#include "google/protobuf/message.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace ferry::internal {

v1::JobSpec ToProto(const JobOptions& options);
JobOptions FromProto(const v1::JobSpec& spec);
FieldInfo FromProto(const v1::Field& field);
JobInfo FromProto(const v1::Job& job);
JobStatus FromProto(const v1::JobStatus& status);
StatusReport FromProto(const v1::GetStatusResponse& response);

// Proto3 JSON with proto field names and every field printed (zeros included), so the
// output's shape does not depend on the values.
std::string ToJson(const google::protobuf::Message& message);
// Parses proto3 JSON into `message`; INVALID_ARGUMENT naming `what` on failure.
absl::Status FromJson(std::string_view json, std::string_view what,
                      google::protobuf::Message* message);

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

// Checks that a job's slot layout is self-consistent: every field's rows fit in a slot and
// row_bytes matches shape and dtype. INTERNAL naming the field otherwise.
absl::Status ValidateLayout(const JobInfo& job, uint64_t num_slots, uint64_t slot_bytes,
                            uint64_t slab_bytes);

}  // namespace ferry::internal

#endif  // FERRY_CLIENT_CPP_INTERNAL_CONVERT_H_
