// AWS Signature Version 4 for S3 requests without a body (GET, HEAD), in the Authorization
// header: what S3 and the S3-compatible stores (MinIO, Ceph, R2, GCS's XML API) check.
// Written on OpenSSL's HMAC-SHA256 rather than libcurl's CURLOPT_AWS_SIGV4 so that the
// headers signed (x-amz-content-sha256, x-amz-security-token, range) are ours to choose and
// the signature is tested against AWS's own worked example.
//
//   std::vector<Header> headers = {{"host", "bucket.s3.us-east-1.amazonaws.com"},
//                                  {"range", "bytes=0-9"}};
//   SignV4({.method = "GET", .path = "/train-000042.tar", .region = "us-east-1"},
//          credentials, absl::Now(), &headers);   // adds x-amz-date, ..., authorization
//
// Pure functions; thread-safe.
#ifndef FERRY_SERVER_REMOTE_SIGV4_H_
#define FERRY_SERVER_REMOTE_SIGV4_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ferry {

// A store's credentials, as the AWS tools read them. Never logged, shown or written to disk.
struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless temporary credentials
};

// An HTTP header: lower-case name, value.
using Header = std::pair<std::string, std::string>;

struct SigV4Request {
  std::string method = "GET";
  // The URI path, already encoded as it goes on the wire (UriEncodePath).
  std::string path = "/";
  // The canonical query string: name=value pairs, encoded and sorted, joined by '&'.
  std::string query;
  std::string region = "us-east-1";
  std::string service = "s3";
};

// RFC 3986 encoding as SigV4 wants it: unreserved characters stay, every other byte becomes
// %XX (upper-case hex); '/' stays when `keep_slash`.
std::string UriEncode(absl::string_view text, bool keep_slash);

// The hex SHA-256 of an empty body (what x-amz-content-sha256 holds for a GET).
inline constexpr char kEmptyPayloadSha256[] =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// Adds x-amz-date (from `now`), x-amz-content-sha256 (the empty body's, unless *headers has
// one), x-amz-security-token (with a session token) and authorization to *headers, which
// must hold "host". Every header in *headers is signed.
void SignV4(const SigV4Request& request, const AwsCredentials& credentials, absl::Time now,
            std::vector<Header>* headers);

}  // namespace ferry

#endif  // FERRY_SERVER_REMOTE_SIGV4_H_
