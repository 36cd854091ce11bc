// Reads objects from object storage (the S3 API: AWS, MinIO, Ceph, R2, GCS's XML API) and
// from plain HTTP(S) servers: an object's size and version (HEAD), byte ranges of it (GET
// with Range), and a bucket's keys under a prefix (ListObjectsV2), with retries.
//
// Contract:
//  * Locations are "s3://bucket/key" (signed with SigV4 when credentials are given, on the
//    configured endpoint, bucket in the path or the host name) or "http(s)://..." URLs.
//  * Transient failures (no connection, a reset or stalled transfer, HTTP 429 and 5xx) are
//    retried up to max_attempts times with exponential backoff and full jitter; a transfer
//    broken midway resumes from the last byte received, so nothing is fetched twice.
//  * Redirects are not followed (a request goes only where the location says).
//  * Errors name the location and say what to do; they never hold the credentials.
//
//   StoreClient store({.endpoint = "http://127.0.0.1:9000", .credentials = credentials});
//   FERRY_ASSIGN_OR_RETURN(ObjectLocation where, ObjectLocation::Parse("s3://data/a.tar"));
//   FERRY_ASSIGN_OR_RETURN(StoreClient::ObjectInfo info, store.Head(where));
//   FERRY_RETURN_IF_ERROR(store.Read(where, 0, info.size, fd));
//
// Thread-safe: calls may run on many threads at once (each uses its own connection).
#ifndef FERRY_SERVER_REMOTE_STORE_CLIENT_H_
#define FERRY_SERVER_REMOTE_STORE_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/remote/s3_listing.h"
#include "server/remote/sigv4.h"

namespace ferry {

// Where an object is.
struct ObjectLocation {
  enum class Kind { kS3, kHttp };
  Kind kind = Kind::kS3;
  std::string bucket;  // kS3
  std::string key;     // kS3: the object's key, unencoded
  std::string url;     // kHttp: the URL as given

  // INVALID_ARGUMENT naming the text when it is neither form (or has no bucket or key).
  static absl::StatusOr<ObjectLocation> Parse(absl::string_view text);
  // Whether a dataset path names a remote object rather than a local file.
  static bool IsRemote(absl::string_view path);
  std::string ToString() const;  // "s3://bucket/key" or the URL
};

// What a ferryd's store clients did, counted together (every job's client shares one).
// Thread-safe; read by status and metrics.
struct StoreCounters {
  std::atomic<uint64_t> requests{0};          // attempts sent
  std::atomic<uint64_t> downloaded_bytes{0};  // object and listing bytes received
  std::atomic<int64_t> in_flight{0};          // requests being answered now
  std::atomic<uint64_t> failures{0};          // requests that failed for good
  // Attempts that failed and were tried again, by cause.
  std::atomic<uint64_t> retried_connection{0};  // refused, reset, timed out, stalled
  std::atomic<uint64_t> retried_throttled{0};   // HTTP 429, 503 (SlowDown)
  std::atomic<uint64_t> retried_server{0};      // other 5xx
  std::atomic<uint64_t> retried_short{0};       // a transfer cut midway: resumed
};

struct StoreOptions {
  // The S3 endpoint, scheme included. Default: empty = "https://s3.<region>.amazonaws.com".
  std::string endpoint;
  std::string region = "us-east-1";
  // Where the bucket goes: the path ("endpoint/bucket/key", what most S3-compatible stores
  // want) or the host name ("bucket.endpoint-host/key", AWS's preference). Default: kAuto =
  // the host name on AWS's endpoint unless the bucket has a dot, the path elsewhere.
  enum class Addressing { kAuto, kPath, kVirtualHost };
  Addressing addressing = Addressing::kAuto;
  // Unset: unsigned requests (public buckets, HTTP servers).
  std::optional<AwsCredentials> credentials;
  int max_attempts = 5;
  absl::Duration first_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
  absl::Duration connect_timeout = absl::Seconds(10);
  // A transfer that moves less than 1 KiB/s for this long is abandoned and retried.
  absl::Duration stall_timeout = absl::Seconds(30);
  // Where the client counts its requests; unset: a counter of its own.
  std::shared_ptr<StoreCounters> counters;
};

class StoreClient final {
 public:
  explicit StoreClient(StoreOptions options);

  struct ObjectInfo {
    uint64_t size = 0;
    std::string etag;  // the version the cache keys the object by ("" when the server has none)
  };
  // NOT_FOUND for a missing object, PERMISSION_DENIED when the credentials may not read it,
  // UNAVAILABLE when the store did not answer after max_attempts.
  absl::StatusOr<ObjectInfo> Head(const ObjectLocation& location) const;

  // Writes bytes [offset, offset + length) of the object to `fd` at file offsets
  // [file_offset, file_offset + length).
  // Errors as Head's; OUT_OF_RANGE for a range past the object's end; DATA_LOSS when the
  // server sends other bytes than asked for. With `version` (an ETag, as a listing or a HEAD
  // gave it), only that version is read: the request carries If-Match, and an answer of
  // another version (HTTP 412, or an ETag that differs, from a server that ignores
  // If-Match) is ABORTED "changed since".
  absl::Status Read(const ObjectLocation& location, uint64_t offset, uint64_t length, int fd,
                    const std::string& version = "", uint64_t file_offset = 0) const;

  // The objects of `bucket` whose keys start with `prefix`, every page of the listing
  // (ListObjectsV2). With `delimit`, keys with a '/' after the prefix are rolled up into
  // `prefixes` (one per "directory", ending in '/'). Errors as Head's, naming the prefix;
  // FAILED_PRECONDITION for an answer that is not a listing.
  struct Listing {
    std::vector<ListedObject> objects;
    std::vector<std::string> prefixes;
  };
  absl::StatusOr<Listing> List(const std::string& bucket, const std::string& prefix,
                               bool delimit) const;

  // The URL a request for `location` goes to (the bucket placed as options say).
  std::string UrlOf(const ObjectLocation& location) const;

  const StoreOptions& options() const { return options_; }
  const StoreCounters& counters() const { return *options_.counters; }

 private:
  // Runs attempts until one succeeds or fails for good. With `text`, a GET of the whole
  // answer to `query` into *text (a listing) instead of bytes of the object into fd.
  // `version`: as Read's.
  absl::Status Run(const ObjectLocation& location, bool head, uint64_t offset, uint64_t length,
                   int fd, ObjectInfo* info, const std::string& query, std::string* text,
                   const std::string& version = "", uint64_t file_offset = 0) const;

  StoreOptions options_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_REMOTE_STORE_CLIENT_H_
