// The proto3 JSON mapping of ferry's messages, as the client's *Json methods (and through
// them the C ABI) hand them over. Internal to the client library.
#ifndef FERRY_CLIENT_CPP_INTERNAL_JSON_H_
#define FERRY_CLIENT_CPP_INTERNAL_JSON_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace ferry::internal {

// Proto3 JSON with proto field names and every field printed (zeros included), so the
// output's shape does not depend on the values.
std::string ToJson(const google::protobuf::Message& message);
// Parses proto3 JSON (proto or lowerCamelCase field names) into `message`; INVALID_ARGUMENT
// naming `what`, with the parser's message, on malformed JSON or an unknown field.
absl::Status FromJson(std::string_view json, std::string_view what,
                      google::protobuf::Message* message);

}  // namespace ferry::internal

#endif  // FERRY_CLIENT_CPP_INTERNAL_JSON_H_
