#include "client/cpp/internal/json.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace ferry::internal {

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Printing a well-formed message cannot fail (no Any fields in ferry's protos).
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

absl::Status FromJson(std::string_view json, std::string_view what,
                      google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse ", std::string(what),
                     " from JSON: ", std::string(status.message()), "; input: ",
                     json.size() > 200 ? absl::StrCat(std::string(json.substr(0, 200)), "...")
                                       : std::string(json)));
  }
  return absl::OkStatus();
}

}  // namespace ferry::internal
