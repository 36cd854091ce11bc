#include "client/cpp/internal/store_credentials.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"

namespace ferry::internal {
namespace {

std::string Env(const std::function<const char*(const char*)>& getenv, const char* name) {
  const char* value = getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

bool ReadsS3(const google::protobuf::Message& message) {
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    using Type = google::protobuf::FieldDescriptor::CppType;
    if (field->cpp_type() == Type::CPPTYPE_STRING) {
      if (field->is_repeated()) {
        for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
          if (absl::StartsWith(reflection->GetRepeatedString(message, field, i), "s3://")) {
            return true;
          }
        }
      } else if (absl::StartsWith(reflection->GetString(message, field), "s3://")) {
        return true;
      }
    } else if (field->cpp_type() == Type::CPPTYPE_MESSAGE) {
      if (field->is_repeated()) {
        for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
          if (ReadsS3(reflection->GetRepeatedMessage(message, field, i))) return true;
        }
      } else if (ReadsS3(reflection->GetMessage(message, field))) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace

bool SpecReadsS3(const v1::JobSpec& spec) { return spec.has_dataset() && ReadsS3(spec.dataset()); }

absl::StatusOr<std::optional<v1::StoreCredentials>> TrainerStoreCredentials(
    const std::function<const char*(const char*)>& getenv) {
  const std::string id = Env(getenv, "AWS_ACCESS_KEY_ID");
  const std::string secret = Env(getenv, "AWS_SECRET_ACCESS_KEY");
  if (!id.empty() || !secret.empty()) {
    if (id.empty() || secret.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          id.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID", " is set but ",
          id.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
          " is not: set both, or neither to use a profile of the shared credentials file"));
    }
    v1::StoreCredentials credentials;
    credentials.set_access_key_id(id);
    credentials.set_secret_access_key(secret);
    credentials.set_session_token(Env(getenv, "AWS_SESSION_TOKEN"));
    return credentials;
  }

  const std::string named_profile = Env(getenv, "AWS_PROFILE");
  const std::string profile = named_profile.empty() ? "default" : named_profile;
  std::string path = Env(getenv, "AWS_SHARED_CREDENTIALS_FILE");
  const bool named_file = !path.empty();
  if (path.empty()) {
    const std::string home = Env(getenv, "HOME");
    if (home.empty()) {
      if (named_profile.empty()) return std::nullopt;
      return absl::FailedPreconditionError(
          absl::StrCat("AWS_PROFILE is '", profile,
                       "' but HOME is not set, so ~/.aws/credentials cannot be found; set "
                       "AWS_SHARED_CREDENTIALS_FILE"));
    }
    path = absl::StrCat(home, "/.aws/credentials");
  }
  std::ifstream file(path);
  if (!file) {
    const int error = errno;
    // No file and nothing asked of it: the trainer has no credentials; ferryd's own apply.
    if (error == ENOENT && !named_file && named_profile.empty()) return std::nullopt;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot read the AWS credentials file ", path, " (", std::strerror(error),
        ") for profile '", profile, "'", named_file ? " (AWS_SHARED_CREDENTIALS_FILE)" : ""));
  }
  // INI: [profile] sections of key = value lines; '#' and ';' start comments.
  std::string section;
  bool found = false;
  v1::StoreCredentials credentials;
  std::string line;
  while (std::getline(file, line)) {
    absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#' || text[0] == ';') continue;
    if (text.front() == '[' && text.back() == ']') {
      section = std::string(absl::StripAsciiWhitespace(text.substr(1, text.size() - 2)));
      found = found || section == profile;
      continue;
    }
    if (section != profile) continue;
    const size_t equals = text.find('=');
    if (equals == absl::string_view::npos) continue;
    const std::string key =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(text.substr(0, equals)));
    const std::string value(absl::StripAsciiWhitespace(text.substr(equals + 1)));
    if (key == "aws_access_key_id") credentials.set_access_key_id(value);
    if (key == "aws_secret_access_key") credentials.set_secret_access_key(value);
    if (key == "aws_session_token") credentials.set_session_token(value);
  }
  if (!found) {
    if (named_profile.empty()) return std::nullopt;  // no [default]: ferryd's own apply
    return absl::NotFoundError(absl::StrCat("AWS_PROFILE is '", profile, "' but ", path,
                                            " has no [", profile, "] section"));
  }
  if (credentials.access_key_id().empty() || credentials.secret_access_key().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile [", profile, "] of ", path,
        " needs both aws_access_key_id and aws_secret_access_key (ferry does not run "
        "credential_process or SSO logins: export the keys, or use a profile that holds them)"));
  }
  return credentials;
}

}  // namespace ferry::internal
