#include "server/remote/store_client.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "server/remote/s3_listing.h"

namespace ferry {
namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// "scheme://host[:port]" and the path after it ("" or "/base").
struct Endpoint {
  std::string scheme_host;
  std::string scheme;
  std::string host;  // host[:port]
  std::string base_path;
};

Endpoint SplitEndpoint(absl::string_view url) {
  Endpoint e;
  const size_t scheme_end = url.find("://");
  e.scheme = std::string(url.substr(0, scheme_end));
  absl::string_view rest = url.substr(scheme_end == absl::string_view::npos ? 0 : scheme_end + 3);
  const size_t slash = rest.find('/');
  e.host = std::string(rest.substr(0, slash));
  e.base_path = slash == absl::string_view::npos ? "" : std::string(rest.substr(slash));
  while (absl::EndsWith(e.base_path, "/")) e.base_path.pop_back();
  e.scheme_host = absl::StrCat(e.scheme, "://", e.host);
  return e;
}

// The value of S3's <Code> in an error body, or "".
std::string S3ErrorCode(const std::string& body) {
  const size_t begin = body.find("<Code>");
  const size_t end = body.find("</Code>");
  if (begin == std::string::npos || end == std::string::npos || end < begin) return "";
  return body.substr(begin + 6, end - begin - 6);
}

bool TransientHttp(long status) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

}  // namespace

absl::StatusOr<ObjectLocation> ObjectLocation::Parse(absl::string_view text) {
  ObjectLocation out;
  if (absl::StartsWith(text, "s3://")) {
    absl::string_view rest = text.substr(5);
    const size_t slash = rest.find('/');
    if (slash == absl::string_view::npos || slash == 0 || slash + 1 == rest.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", text, "' is not an object location: write s3://bucket/key"));
    }
    out.kind = Kind::kS3;
    out.bucket = std::string(rest.substr(0, slash));
    out.key = std::string(rest.substr(slash + 1));
    return out;
  }
  if (absl::StartsWith(text, "http://") || absl::StartsWith(text, "https://")) {
    const size_t host = text.find("://") + 3;
    if (host >= text.size() || text[host] == '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("'", text, "' is not a URL of an object: it names no host"));
    }
    out.kind = Kind::kHttp;
    out.url = std::string(text);
    return out;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", text, "' is not an object location: write s3://bucket/key or an http(s):// URL"));
}

bool ObjectLocation::IsRemote(absl::string_view path) {
  return absl::StartsWith(path, "s3://") || absl::StartsWith(path, "http://") ||
         absl::StartsWith(path, "https://");
}

std::string ObjectLocation::ToString() const {
  return kind == Kind::kS3 ? absl::StrCat("s3://", bucket, "/", key) : url;
}

StoreClient::StoreClient(StoreOptions options) : options_(std::move(options)) {
  GlobalInit();
  if (options_.counters == nullptr) options_.counters = std::make_shared<StoreCounters>();
}

std::string StoreClient::UrlOf(const ObjectLocation& location) const {
  if (location.kind == ObjectLocation::Kind::kHttp) return location.url;
  const bool aws = options_.endpoint.empty();
  const Endpoint e = SplitEndpoint(
      aws ? absl::StrCat("https://s3.", options_.region, ".amazonaws.com") : options_.endpoint);
  bool virtual_host = options_.addressing == StoreOptions::Addressing::kVirtualHost;
  if (options_.addressing == StoreOptions::Addressing::kAuto) {
    virtual_host = aws && !absl::StrContains(location.bucket, ".");
  }
  const std::string key = UriEncode(location.key, /*keep_slash=*/true);
  if (virtual_host) {
    return absl::StrCat(e.scheme, "://", location.bucket, ".", e.host, e.base_path, "/", key);
  }
  const std::string bucket_url =
      absl::StrCat(e.scheme_host, e.base_path, "/", UriEncode(location.bucket, false));
  return key.empty() ? bucket_url : absl::StrCat(bucket_url, "/", key);  // the bucket: a listing
}

struct Response {
  CURLcode curl = CURLE_OK;
  std::string curl_error;
  long http = 0;
  std::string etag;
  int64_t content_length = -1;
  int64_t range_start = -1;    // from Content-Range
  std::string error_body;      // of a failed request, its first KiB
  int write_errno = 0;         // a failed write to the caller's file
  bool ignored_range = false;  // a 200 with the whole object for a range from byte > 0
};

namespace {

struct Transfer {
  int fd = -1;
  uint64_t* written = nullptr;
  uint64_t length = 0;  // what the caller wants in all
  uint64_t start = 0;   // the object byte this attempt asked for first
  CURL* handle = nullptr;
  Response* response = nullptr;
  std::string* text = nullptr;  // a listing: the whole body goes here instead of fd
  uint64_t file_offset = 0;     // where in fd the first byte asked for goes
};

// The most bytes of one listing page ferry takes (S3 sends 1,000 keys, ~300 KiB).
constexpr size_t kMaxListingBytes = 64 << 20;

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* r = static_cast<Response*>(user);
  absl::string_view line(data, size * count);
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    const std::string name = absl::AsciiStrToLower(line.substr(0, colon));
    absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (name == "etag") {
      r->etag = std::string(value);
    } else if (name == "content-length") {
      int64_t n;
      if (absl::SimpleAtoi(value, &n)) r->content_length = n;
    } else if (name == "content-range") {
      // "bytes <start>-<end>/<total>"
      absl::string_view v = value;
      if (absl::ConsumePrefix(&v, "bytes ")) {
        int64_t start;
        if (absl::SimpleAtoi(v.substr(0, v.find('-')), &start)) r->range_start = start;
      }
    }
  }
  return size * count;
}

size_t OnBody(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  long status = 0;
  curl_easy_getinfo(t->handle, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200 && status != 206) {
    std::string& body = t->response->error_body;
    body.append(data, std::min(n, size_t{1024} - std::min(body.size(), size_t{1024})));
    return n;
  }
  if (t->text != nullptr) {
    if (t->text->size() + n > kMaxListingBytes) return 0;  // aborts the transfer
    t->text->append(data, n);
    return n;
  }
  if (status == 200 && t->start > 0) {
    t->response->ignored_range = true;  // these bytes start at the object's first
    return 0;
  }
  // Only what was asked for (a server that ignores Range sends the whole object).
  const uint64_t room = t->length - std::min(t->length, *t->written);
  size_t take = static_cast<size_t>(std::min<uint64_t>(n, room));
  size_t done = 0;
  while (done < take) {
    const ssize_t w = ::pwrite(t->fd, data + done, take - done,
                               static_cast<off_t>(t->file_offset + *t->written + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      t->response->write_errno = errno;
      return 0;  // aborts the transfer
    }
    done += static_cast<size_t>(w);
  }
  *t->written += take;
  return take == room && n > take ? 0 : n;  // stop once all that was asked arrived
}

// One attempt of a request to `url` (with the canonical query string `query`, "" for
// none); `fd` -1 for HEAD. Appends the body to fd at *written, or to *text when given (no
// Range then).
Response Attempt(const StoreOptions& options, const std::string& url, const std::string& query,
                 const ObjectLocation& location, bool head, uint64_t offset, uint64_t length,
                 int fd, uint64_t* written, std::string* text, const std::string& version,
                 uint64_t file_offset) {
  Response r;
  CURL* h = curl_easy_init();
  if (h == nullptr) {
    r.curl = CURLE_FAILED_INIT;
    r.curl_error = "curl_easy_init failed";
    return r;
  }
  std::vector<Header> headers;
  const uint64_t from = offset + (written != nullptr ? *written : 0);
  if (!head && text == nullptr) {
    headers.push_back({"range", absl::StrCat("bytes=", from, "-", offset + length - 1)});
  }
  if (!version.empty()) headers.push_back({"if-match", version});
  if (location.kind == ObjectLocation::Kind::kS3 && options.credentials.has_value()) {
    const Endpoint e = SplitEndpoint(url);
    headers.push_back({"host", e.host});
    std::string path = e.base_path;  // the URL's path: already encoded
    if (path.empty()) path = "/";
    SignV4(
        {.method = head ? "HEAD" : "GET", .path = path, .query = query, .region = options.region},
        *options.credentials, absl::Now(), &headers);
  }
  const std::string full_url = query.empty() ? url : absl::StrCat(url, "?", query);
  curl_slist* list = nullptr;
  for (const Header& hd : headers) {
    list = curl_slist_append(list, absl::StrCat(hd.first, ": ", hd.second).c_str());
  }
  char error[CURL_ERROR_SIZE] = {0};
  Transfer transfer{fd, written, length, from, h, &r, text, file_offset};
  curl_easy_setopt(h, CURLOPT_URL, full_url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options.connect_timeout)));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME,
                   std::max(1L, static_cast<long>(absl::ToInt64Seconds(options.stall_timeout))));
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &transfer);
  // No redirects: a request goes only where the job's path (checked against the daemon's
  // allowed prefixes) says.
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  if (head) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  r.curl = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.http);
  if (r.curl != CURLE_OK) r.curl_error = error[0] != 0 ? error : curl_easy_strerror(r.curl);
  curl_slist_free_all(list);
  curl_easy_cleanup(h);
  return r;
}

}  // namespace

absl::Status StoreClient::Run(const ObjectLocation& location, bool head, uint64_t offset,
                              uint64_t length, int fd, ObjectInfo* info, const std::string& query,
                              std::string* text, const std::string& version,
                              uint64_t file_offset) const {
  const std::string where = location.ToString();
  StoreCounters& counters = *options_.counters;
  // Every return but success's counts as a failure.
  absl::Cleanup failed = [&counters] { counters.failures.fetch_add(1, std::memory_order_relaxed); };
  uint64_t written = 0;
  std::string last;
  thread_local std::mt19937_64 jitter(std::random_device{}());
  const int attempts = std::max(1, options_.max_attempts);
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    if (attempt > 1) {
      // Full jitter: a uniform wait up to the exponential bound.
      const absl::Duration bound =
          std::min(options_.max_backoff, options_.first_backoff * (int64_t{1} << (attempt - 2)));
      absl::SleepFor(bound * std::uniform_real_distribution<double>(0, 1)(jitter));
    }
    const uint64_t before = written;
    if (text != nullptr) text->clear();  // a listing is fetched whole by each attempt
    counters.requests.fetch_add(1, std::memory_order_relaxed);
    counters.in_flight.fetch_add(1, std::memory_order_relaxed);
    const Response r = Attempt(options_, UrlOf(location), query, location, head, offset, length,
                               head ? -1 : fd, &written, text, version, file_offset);
    counters.in_flight.fetch_sub(1, std::memory_order_relaxed);
    counters.downloaded_bytes.fetch_add((written - before) + (text != nullptr ? text->size() : 0),
                                        std::memory_order_relaxed);
    if (r.write_errno != 0) {
      return absl::InternalError(absl::StrCat("cannot write '", where,
                                              "' into the cache: ", std::strerror(r.write_errno)));
    }
    const bool got_all = head || text != nullptr || written >= length;
    const bool complete_early = r.curl == CURLE_WRITE_ERROR && got_all;  // we stopped it
    if (r.ignored_range) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the server of '", where, "' ignores byte ranges (it sent the whole object for ",
          "bytes from ", offset + before, "); ferry needs range reads"));
    }
    if (r.curl != CURLE_OK && !complete_early) {
      last = absl::StrCat(r.curl_error, " (", where, ")");
      if (r.curl == CURLE_UNSUPPORTED_PROTOCOL || r.curl == CURLE_URL_MALFORMAT) break;
      // Connection refused, reset, timed out, stalled: try again (a transfer that brought
      // some bytes resumes after them).
      (written > before ? counters.retried_short : counters.retried_connection)
          .fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (TransientHttp(r.http)) {
      last = absl::StrCat("HTTP ", r.http, " ", S3ErrorCode(r.error_body));
      (r.http == 429 || r.http == 503 ? counters.retried_throttled : counters.retried_server)
          .fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (r.http == 404) {
      return absl::NotFoundError(absl::StrCat("object '", where, "' does not exist (HTTP 404",
                                              S3ErrorCode(r.error_body).empty() ? "" : ", ",
                                              S3ErrorCode(r.error_body), ")"));
    }
    if (r.http == 401 || r.http == 403) {
      return absl::PermissionDeniedError(
          absl::StrCat("the store refused to read '", where, "' (HTTP ", r.http,
                       S3ErrorCode(r.error_body).empty() ? "" : ", ", S3ErrorCode(r.error_body),
                       "): check the credentials, region and endpoint the job was given"));
    }
    if (r.http == 416) {
      return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + length,
                                                ") lie past the end of '", where, "'"));
    }
    if (!version.empty() && (r.http == 412 || ((r.http == 200 || r.http == 206) &&
                                               !r.etag.empty() && r.etag != version))) {
      return absl::AbortedError(absl::StrCat("object '", where, "' changed since version ", version,
                                             " was asked for (the store has ",
                                             r.http == 412 ? "another" : r.etag, ")"));
    }
    if (r.http >= 300 && r.http < 400) {
      return absl::FailedPreconditionError(
          absl::StrCat("the server of '", where, "' redirected (HTTP ", r.http,
                       "); ferry follows no redirects: give the object's final URL"));
    }
    if (r.http != 200 && r.http != 206) {
      return absl::FailedPreconditionError(absl::StrCat("the store answered HTTP ", r.http, " ",
                                                        S3ErrorCode(r.error_body), " for '", where,
                                                        "'"));
    }
    if (text != nullptr) {
      if (r.curl == CURLE_OK) {
        std::move(failed).Cancel();
        return absl::OkStatus();
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "the listing of '", where, "' is larger than ", kMaxListingBytes, " bytes a page"));
    }
    if (head) {
      if (r.content_length < 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("the store gave no size (Content-Length) for '", where, "'"));
      }
      info->size = static_cast<uint64_t>(r.content_length);
      info->etag = r.etag;
      std::move(failed).Cancel();
      return absl::OkStatus();
    }
    if (r.http == 206 && r.range_start >= 0 &&
        static_cast<uint64_t>(r.range_start) != offset + before) {
      return absl::DataLossError(absl::StrCat("the store sent bytes from ", r.range_start, " of '",
                                              where, "' when asked for bytes from ",
                                              offset + before));
    }
    if (written >= length) {
      std::move(failed).Cancel();
      return absl::OkStatus();
    }
    counters.retried_short.fetch_add(1, std::memory_order_relaxed);
    last = absl::StrCat("the transfer ended after ", written, " of ", length, " bytes");
    // The next attempt asks for the rest.
  }
  return absl::UnavailableError(
      absl::StrCat("could not read '", where, "' after ", attempts, " attempts: ", last));
}

absl::StatusOr<StoreClient::Listing> StoreClient::List(const std::string& bucket,
                                                       const std::string& prefix,
                                                       bool delimit) const {
  ObjectLocation where;
  where.kind = ObjectLocation::Kind::kS3;
  where.bucket = bucket;  // no key: requests go to the bucket
  Listing listing;
  std::string token;
  std::string body;
  do {
    // The canonical query string: names sorted, values encoded.
    std::string query;
    if (!token.empty())
      absl::StrAppend(&query, "continuation-token=", UriEncode(token, false), "&");
    if (delimit) absl::StrAppend(&query, "delimiter=%2F&");
    absl::StrAppend(&query, "list-type=2&prefix=", UriEncode(prefix, false));
    absl::Status s = Run(where, /*head=*/false, 0, 0, -1, nullptr, query, &body);
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrReplaceAll(s.message(), {{"read 's3://", "list 's3://"}}));
    }
    absl::StatusOr<ListPage> page = ParseListObjectsV2(body);
    if (!page.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the store's listing of 's3://", bucket, "/", prefix, "': ", page.status().message()));
    }
    for (ListedObject& o : page->objects) listing.objects.push_back(std::move(o));
    for (std::string& p : page->common_prefixes) listing.prefixes.push_back(std::move(p));
    token = page->truncated ? page->next_token : "";
  } while (!token.empty());
  return listing;
}

absl::StatusOr<StoreClient::ObjectInfo> StoreClient::Head(const ObjectLocation& location) const {
  ObjectInfo info;
  absl::Status s = Run(location, /*head=*/true, 0, 0, -1, &info, "", nullptr);
  if (absl::IsPermissionDenied(s)) {
    // A HEAD's answer has no body, so no reason (SignatureDoesNotMatch, AccessDenied,
    // InvalidAccessKeyId, ExpiredToken): a one-byte GET brings the store's own.
    const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (devnull >= 0) {
      absl::Status reason = Run(location, /*head=*/false, 0, 1, devnull, nullptr, "", nullptr);
      ::close(devnull);
      if (absl::IsPermissionDenied(reason)) return reason;
    }
  }
  if (!s.ok()) return s;
  return info;
}

absl::Status StoreClient::Read(const ObjectLocation& location, uint64_t offset, uint64_t length,
                               int fd, const std::string& version, uint64_t file_offset) const {
  if (length == 0) return absl::OkStatus();
  return Run(location, /*head=*/false, offset, length, fd, nullptr, "", nullptr, version,
             file_offset);
}

}  // namespace ferry
