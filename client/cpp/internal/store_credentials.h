// The trainer's credentials for object storage, found as the AWS CLI and SDKs find them, so
// that a job reading s3:// objects reads them as the trainer's user and not as ferryd:
//  1. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN, if set);
//  2. else the profile AWS_PROFILE names ("default" when unset) in the shared credentials
//     file: AWS_SHARED_CREDENTIALS_FILE, or ~/.aws/credentials.
// Neither: none (ferryd uses its own). An AWS_PROFILE that the file lacks, a file that cannot
// be read, or half a key pair is an error that names the variable or file and the profile;
// no error holds a secret.
//
//   FERRY_ASSIGN_OR_RETURN(std::optional<v1::StoreCredentials> mine,
//                          TrainerStoreCredentials(std::getenv));
#ifndef FERRY_CLIENT_CPP_INTERNAL_STORE_CREDENTIALS_H_
#define FERRY_CLIENT_CPP_INTERNAL_STORE_CREDENTIALS_H_

#include <functional>
#include <optional>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry::internal {

// Reads the environment through `getenv` (a test passes its own).
absl::StatusOr<std::optional<v1::StoreCredentials>> TrainerStoreCredentials(
    const std::function<const char*(const char*)>& getenv);

// Whether the spec names an s3:// object anywhere in its dataset (every string field, at
// any depth: no list of dataset kinds to keep in step).
bool SpecReadsS3(const v1::JobSpec& spec);

}  // namespace ferry::internal

#endif  // FERRY_CLIENT_CPP_INTERNAL_STORE_CREDENTIALS_H_
