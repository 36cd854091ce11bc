#include "server/remote/store_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "server/dataset/mapped_file.h"
#include "server/dataset/token_shards_source.h"
#include "server/pipeline/read_ahead.h"
#include "server/remote/remote_dataset_fs.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// An object store of one object at /bucket/dir/obj.bin (and /plain.bin for plain URLs) that
// serves ranges and misbehaves as each test asks.
class FakeStore {
 public:
  FakeStore() {
    for (int i = 0; i < 100000; ++i) object_.push_back(static_cast<char>('a' + i * 7 % 26));
    auto serve = [this](const httplib::Request& req, httplib::Response& res) {
      int n;
      {
        absl::MutexLock lock(&mutex_);
        n = ++requests_;
        requests_seen_.push_back(req);
      }
      if (req.method == "GET" && hold_gets_ != nullptr) hold_gets_->WaitForNotification();
      if (req.method == "GET" && req.get_header_value("Range") == refused_range()) {
        res.status = 403;
        Body(res, "<Error><Code>AccessDenied</Code></Error>");
        return;
      }
      if (n <= fail_first_) {
        res.status = 503;
        Body(res, "<Error><Code>SlowDown</Code></Error>");
        return;
      }
      if (status_ != 200) {
        res.status = status_;
        Body(res, absl::StrCat("<Error><Code>", code_, "</Code></Error>"));
        return;
      }
      res.set_header("ETag", "\"abc123\"");
      if (n <= break_first_ && req.method == "GET") {
        // Half of what was asked, then the connection drops.
        const auto range = req.ranges.empty() ? std::pair<ssize_t, ssize_t>{0, -1} : req.ranges[0];
        const size_t begin = static_cast<size_t>(range.first);
        res.status = 206;
        res.set_header("Content-Range",
                       absl::StrCat("bytes ", begin, "-", object_.size() - 1, "/", object_.size()));
        // Chunked, so that the server does not apply the range to it a second time.
        res.set_chunked_content_provider("application/octet-stream",
                                         [this, begin](size_t offset, httplib::DataSink& sink) {
                                           if (offset > 0) return false;  // drop the connection
                                           sink.write(object_.data() + begin, 5000);
                                           return true;
                                         });
        return;
      }
      res.set_content(object_, "application/octet-stream");
    };
    server_.Get("/bucket/dir/obj.bin", serve);
    // ListObjectsV2: page i+1 follows the token "page <i>"; the first fails once (503).
    server_.Get("/bucket", [this](const httplib::Request& req, httplib::Response& res) {
      bool fail;
      {
        absl::MutexLock lock(&mutex_);
        requests_seen_.push_back(req);
        fail = ++requests_ == 1;
      }
      if (fail || req.get_param_value("list-type") != "2") {
        res.status = fail ? 503 : 400;
        Body(res, "<Error><Code>SlowDown</Code></Error>");
        return;
      }
      const std::string token = req.get_param_value("continuation-token");
      const size_t page = token.empty() ? 0 : std::stoul(token.substr(5)) + 1;
      res.set_content(listing_pages_.at(page), "application/xml");
    });
    server_.Get("/plain.bin", serve);
    server_.Get("/moved.bin", [](const httplib::Request&, httplib::Response& res) {
      res.set_redirect("http://169.254.169.254/latest/meta-data/");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeStore() {
    server_.stop();
    thread_.join();
  }

  // An error body as a store sends it: whole, whatever range was asked for (chunked, so
  // that the server library does not cut it to the range).
  static void Body(httplib::Response& res, std::string text) {
    res.set_chunked_content_provider(
        "application/xml", [text = std::move(text)](size_t offset, httplib::DataSink& sink) {
          if (offset == 0) sink.write(text.data(), text.size());
          sink.done();
          return true;
        });
  }

  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }
  const std::string& object() const { return object_; }
  // Replaces the object's bytes; before any request.
  void set_object(std::string bytes) { object_ = std::move(bytes); }
  int requests() {
    absl::MutexLock lock(&mutex_);
    return requests_;
  }
  std::vector<httplib::Request> requests_seen() {
    absl::MutexLock lock(&mutex_);
    return requests_seen_;
  }

  std::vector<std::string> listing_pages_;
  absl::Notification* hold_gets_ = nullptr;  // GETs of the object wait for it when set
  // A GET with this Range header is refused (403 AccessDenied); "" refuses none.
  void set_refused_range(std::string range) {
    absl::MutexLock lock(&mutex_);
    refused_range_ = std::move(range);
  }
  std::string refused_range() {
    absl::MutexLock lock(&mutex_);
    return refused_range_.empty() ? std::string("-") : refused_range_;
  }
  int fail_first_ = 0;
  int break_first_ = 0;
  int status_ = 200;
  std::string code_;

 private:
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::string object_;
  absl::Mutex mutex_;
  int requests_ ABSL_GUARDED_BY(mutex_) = 0;
  std::vector<httplib::Request> requests_seen_ ABSL_GUARDED_BY(mutex_);
  std::string refused_range_ ABSL_GUARDED_BY(mutex_);
};

class StoreClientTest : public ::testing::Test {
 protected:
  StoreOptions Options() {
    return {.endpoint = store_.endpoint(),
            .max_attempts = 3,
            .first_backoff = absl::Milliseconds(1),
            .max_backoff = absl::Milliseconds(5)};
  }
  static ObjectLocation S3() { return *ObjectLocation::Parse("s3://bucket/dir/obj.bin"); }

  // A temporary file, its bytes read back by Contents.
  int TempFile() {
    char path[] = "/tmp/store_client_test_XXXXXX";
    const int fd = ::mkstemp(path);
    ::unlink(path);
    fds_.push_back(fd);
    return fd;
  }
  static std::string Contents(int fd) {
    std::string out;
    char buffer[65536];
    ssize_t n;
    off_t at = 0;
    while ((n = ::pread(fd, buffer, sizeof buffer, at)) > 0) {
      out.append(buffer, static_cast<size_t>(n));
      at += n;
    }
    return out;
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
  }
  // After the derived fixtures' members, which may hold a cache (its flushing thread writes
  // into its directory until the cache goes).
  ~StoreClientTest() override {
    for (const std::string& dir : cache_dirs_) std::filesystem::remove_all(dir);
  }

  // A job's filesystem over this store, with a node cache of 1 MiB in a directory removed
  // after the test; null (and a failure) when the cache cannot be made.
  std::shared_ptr<const DatasetFs> RemoteFs(const RemoteFsOptions& options = {}) {
    char dir[] = "/tmp/store_client_test_cache_XXXXXX";
    if (::mkdtemp(dir) == nullptr) {
      ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
      return nullptr;
    }
    cache_dirs_.push_back(dir);
    auto cache = ObjectCache::Open({.dir = dir, .capacity_bytes = 1 << 20});
    if (!cache.ok()) {
      ADD_FAILURE() << cache.status();
      return nullptr;
    }
    return MakeRemoteDatasetFs(nullptr, *std::move(cache), std::make_shared<StoreClient>(Options()),
                               options);
  }

  FakeStore store_;
  std::vector<int> fds_;
  std::vector<std::string> cache_dirs_;
};

TEST_F(StoreClientTest, HeadGivesTheSizeAndVersion) {
  StoreClient client(Options());
  auto info = client.Head(S3());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, store_.object().size());
  EXPECT_EQ(info->etag, "\"abc123\"");
}

TEST_F(StoreClientTest, ReadsARangeIntoTheFile) {
  StoreClient client(Options());
  const int fd = TempFile();
  ASSERT_TRUE(client.Read(S3(), 1000, 30000, fd).ok());
  EXPECT_EQ(Contents(fd), store_.object().substr(1000, 30000));
  const auto seen = store_.requests_seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].get_header_value("Range"), "bytes=1000-30999");
  // A plain URL: no signature, no bucket in the path.
  const int plain = TempFile();
  ASSERT_TRUE(
      client.Read(*ObjectLocation::Parse(store_.endpoint() + "/plain.bin"), 0, 100, plain).ok());
  EXPECT_EQ(Contents(plain), store_.object().substr(0, 100));
}

TEST_F(StoreClientTest, ReadsARangeToAFileOffset) {
  StoreClient client(Options());
  const int fd = TempFile();
  ASSERT_TRUE(client.Read(S3(), 1000, 3000, fd, "", /*file_offset=*/5000).ok());
  const std::string contents = Contents(fd);
  ASSERT_EQ(contents.size(), 8000u);
  EXPECT_EQ(contents.substr(0, 5000), std::string(5000, '\0'));
  EXPECT_EQ(contents.substr(5000), store_.object().substr(1000, 3000));
}

TEST_F(StoreClientTest, AnObjectOverPartBytesComesInPartsOfItsVersion) {
  std::shared_ptr<const DatasetFs> fs = RemoteFs({.part_bytes = 16384, .part_connections = 3});
  ASSERT_NE(fs, nullptr);
  auto file = fs->OpenFile("s3://bucket/dir/obj.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  std::string got(store_.object().size(), '\0');
  ASSERT_EQ(
      *ReadUpTo(**file, 0, absl::MakeSpan(reinterpret_cast<uint8_t*>(got.data()), got.size())),
      got.size());
  EXPECT_EQ(got, store_.object());
  std::vector<std::string> ranges;
  for (const httplib::Request& r : store_.requests_seen()) {
    if (r.method != "GET") continue;
    EXPECT_EQ(r.get_header_value("If-Match"), "\"abc123\"");  // every part of one version
    ranges.push_back(r.get_header_value("Range"));
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::string> want;
  for (uint64_t at = 0; at < store_.object().size(); at += 16384) {
    want.push_back(absl::StrCat("bytes=", at, "-",
                                std::min<uint64_t>(at + 16384, store_.object().size()) - 1));
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(ranges, want);  // each part once, no whole-object GET
}

TEST_F(StoreClientTest, APartRefusedFailsTheObjectAndEveryTurnEnds) {
  store_.set_refused_range("bytes=16384-32767");
  std::shared_ptr<const DatasetFs> fs = RemoteFs({.part_bytes = 16384, .part_connections = 2});
  ASSERT_NE(fs, nullptr);
  auto refused = fs->OpenFile("s3://bucket/dir/obj.bin");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("s3://bucket/dir/obj.bin"));
  // The parts after the refused one ended their turns: the next fetch gets its own.
  store_.set_refused_range("");
  auto file = fs->OpenFile("s3://bucket/dir/obj.bin");
  ASSERT_TRUE(file.ok()) << file.status();
}

TEST_F(StoreClientTest, AReadOfAVersionAsksForItAndRefusesAnother) {
  StoreClient client(Options());
  const int fd = TempFile();
  ASSERT_TRUE(client.Read(S3(), 0, 100, fd, "\"abc123\"").ok());
  EXPECT_EQ(Contents(fd), store_.object().substr(0, 100));
  EXPECT_EQ(store_.requests_seen()[0].get_header_value("If-Match"), "\"abc123\"");
  // The store holds another version: a server that ignores If-Match sends it, and its ETag
  // says so.
  absl::Status changed = client.Read(S3(), 0, 100, TempFile(), "\"listed\"");
  EXPECT_EQ(changed.code(), absl::StatusCode::kAborted) << changed;
  EXPECT_THAT(changed.message(), HasSubstr("changed since version \"listed\""));
  EXPECT_THAT(changed.message(), HasSubstr("\"abc123\""));
  // One that honours it answers 412.
  store_.status_ = 412;
  store_.code_ = "PreconditionFailed";
  EXPECT_EQ(client.Read(S3(), 0, 100, TempFile(), "\"listed\"").code(), absl::StatusCode::kAborted);
  // Without a version, any is read.
  store_.status_ = 200;
  EXPECT_TRUE(client.Read(S3(), 0, 100, TempFile()).ok());
}

TEST_F(StoreClientTest, TransientErrorsAreRetried) {
  store_.fail_first_ = 2;
  StoreClient client(Options());
  const int fd = TempFile();
  ASSERT_TRUE(client.Read(S3(), 0, 5000, fd).ok());
  EXPECT_EQ(Contents(fd), store_.object().substr(0, 5000));
  EXPECT_EQ(store_.requests(), 3);
  const StoreCounters& counted = client.counters();
  EXPECT_EQ(counted.requests.load(), 3u);
  EXPECT_EQ(counted.retried_throttled.load(), 2u) << "two 503 SlowDown";
  EXPECT_EQ(counted.retried_connection.load() + counted.retried_server.load() +
                counted.retried_short.load(),
            0u);
  EXPECT_EQ(counted.downloaded_bytes.load(), 5000u) << "error bodies are not counted";
  EXPECT_EQ(counted.failures.load(), 0u);
  EXPECT_EQ(counted.in_flight.load(), 0);
}

TEST_F(StoreClientTest, ABrokenTransferResumesWhereItStopped) {
  store_.break_first_ = 1;
  StoreClient client(Options());
  const int fd = TempFile();
  ASSERT_TRUE(client.Read(S3(), 2000, 50000, fd).ok());
  EXPECT_EQ(Contents(fd), store_.object().substr(2000, 50000));
  const auto seen = store_.requests_seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].get_header_value("Range"), "bytes=7000-51999") << "the rest, not it all";
  EXPECT_EQ(client.counters().retried_short.load(), 1u);
  EXPECT_EQ(client.counters().downloaded_bytes.load(), 50000u) << "nothing fetched twice";
}

TEST_F(StoreClientTest, GivesUpAfterMaxAttemptsNamingTheObject) {
  store_.fail_first_ = 100;
  StoreClient client(Options());
  const int fd = TempFile();
  const absl::Status s = client.Read(S3(), 0, 1000, fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("s3://bucket/dir/obj.bin"));
  EXPECT_THAT(s.message(), HasSubstr("after 3 attempts"));
  EXPECT_THAT(s.message(), HasSubstr("SlowDown"));
  EXPECT_EQ(store_.requests(), 3);
  EXPECT_EQ(client.counters().failures.load(), 1u);
}

TEST_F(StoreClientTest, MissingAndForbiddenObjectsSayWhatToDo) {
  StoreOptions options = Options();
  options.credentials = AwsCredentials{"AKIDEXAMPLE", "very-secret-key", "session-token"};
  StoreClient client(options);
  store_.status_ = 404;
  store_.code_ = "NoSuchKey";
  auto missing = client.Head(S3());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("s3://bucket/dir/obj.bin"));
  store_.status_ = 403;
  store_.code_ = "AccessDenied";
  const int fd = TempFile();
  const absl::Status forbidden = client.Read(S3(), 0, 1000, fd);
  EXPECT_EQ(forbidden.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(forbidden.message(), HasSubstr("check the credentials"));
  EXPECT_THAT(forbidden.message(), HasSubstr("AccessDenied")) << forbidden;
  for (const char* secret : {"very-secret-key", "session-token"}) {
    EXPECT_THAT(forbidden.message(), Not(HasSubstr(secret)));
    EXPECT_THAT(missing.status().message(), Not(HasSubstr(secret)));
  }
  EXPECT_EQ(store_.requests(), 2) << "4xx answers are not retried";
  // A refused HEAD has no body; the store's reason comes from a one-byte GET.
  store_.code_ = "SignatureDoesNotMatch";
  auto refused = client.Head(S3());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("SignatureDoesNotMatch")) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("s3://bucket/dir/obj.bin"));
  EXPECT_EQ(store_.requests(), 4);
}

TEST_F(StoreClientTest, ListsEveryPageOfAPrefix) {
  store_.listing_pages_ = {
      "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken>page 0"
      "</NextContinuationToken><Contents><Key>data/a b.jpg</Key><Size>3</Size></Contents>"
      "</ListBucketResult>",
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>data/c/d.jpg</Key>"
      "<Size>4</Size><ETag>\"e\"</ETag></Contents></ListBucketResult>"};
  StoreOptions options = Options();
  options.credentials = AwsCredentials{"AKIDEXAMPLE", "very-secret-key", ""};
  StoreClient client(options);
  auto listing = client.List("bucket", "data/", /*delimit=*/false);
  ASSERT_TRUE(listing.ok()) << listing.status();
  ASSERT_EQ(listing->objects.size(), 2u);
  EXPECT_EQ(listing->objects[0].key, "data/a b.jpg");
  EXPECT_EQ(listing->objects[1].key, "data/c/d.jpg");
  EXPECT_EQ(listing->objects[1].etag, "\"e\"");
  const std::vector<httplib::Request> seen = store_.requests_seen();
  ASSERT_EQ(seen.size(), 3u) << "a 503, then two pages";
  EXPECT_EQ(seen[1].get_param_value("prefix"), "data/");
  EXPECT_EQ(seen[2].get_param_value("continuation-token"), "page 0");
  EXPECT_THAT(seen[2].get_header_value("Authorization"), HasSubstr("Credential=AKIDEXAMPLE/"));
  // An answer that is not a listing is named as such.
  store_.listing_pages_ = {"<Oops/>"};
  auto bad = client.List("bucket", "data/", false);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(bad.status().message(), HasSubstr("s3://bucket/data/"));
}

TEST_F(StoreClientTest, RedirectsAreNotFollowed) {
  StoreClient client(Options());
  const int fd = TempFile();
  const absl::Status s =
      client.Read(*ObjectLocation::Parse(store_.endpoint() + "/moved.bin"), 0, 100, fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("redirected"));
}

TEST_F(StoreClientTest, SignedRequestsCarryWhatWasSigned) {
  StoreOptions options = Options();
  const AwsCredentials credentials{"AKIDEXAMPLE", "very-secret-key", ""};
  options.credentials = credentials;
  options.region = "eu-west-1";
  StoreClient client(options);
  const int fd = TempFile();
  ASSERT_TRUE(client.Read(S3(), 5, 10, fd).ok());
  const auto seen = store_.requests_seen();
  ASSERT_EQ(seen.size(), 1u);
  const httplib::Request& r = seen[0];
  // Sign what arrived, at the time it says: the same Authorization, so nothing signed was
  // changed on the way (host with its port, range, the path as encoded).
  const std::string date = r.get_header_value("x-amz-date");  // 20261129T091500Z
  ASSERT_EQ(date.size(), 16u);
  const absl::Time at = absl::FromCivil(
      absl::CivilSecond(std::stoi(date.substr(0, 4)), std::stoi(date.substr(4, 2)),
                        std::stoi(date.substr(6, 2)), std::stoi(date.substr(9, 2)),
                        std::stoi(date.substr(11, 2)), std::stoi(date.substr(13, 2))),
      absl::UTCTimeZone());
  std::vector<Header> again = {{"host", r.get_header_value("Host")},
                               {"range", r.get_header_value("Range")}};
  SignV4({.method = "GET", .path = r.path, .region = "eu-west-1"}, credentials, at, &again);
  std::string expected;
  for (const Header& h : again) {
    if (h.first == "authorization") expected = h.second;
  }
  EXPECT_EQ(r.get_header_value("Authorization"), expected);
  EXPECT_THAT(expected, HasSubstr("/eu-west-1/s3/aws4_request"));
  EXPECT_EQ(r.path, "/bucket/dir/obj.bin");
}

TEST_F(StoreClientTest, BucketsGoInThePathOrTheHostName) {
  const ObjectLocation where = *ObjectLocation::Parse("s3://my-data/shards/train 0.tar");
  EXPECT_EQ(StoreClient({.region = "us-west-2"}).UrlOf(where),
            "https://my-data.s3.us-west-2.amazonaws.com/shards/train%200.tar");
  EXPECT_EQ(StoreClient({.endpoint = "http://minio:9000"}).UrlOf(where),
            "http://minio:9000/my-data/shards/train%200.tar");
  EXPECT_EQ(StoreClient({.endpoint = "https://r2.example/",
                         .addressing = StoreOptions::Addressing::kVirtualHost})
                .UrlOf(where),
            "https://my-data.r2.example/shards/train%200.tar");
  const ObjectLocation dotted = *ObjectLocation::Parse("s3://my.data/x");
  EXPECT_EQ(StoreClient({}).UrlOf(dotted), "https://s3.us-east-1.amazonaws.com/my.data/x");
}

TEST_F(StoreClientTest, AWorkersWaitForAnObjectIsARemoteReadAndItsReadsAreLocalOnes) {
  std::shared_ptr<const DatasetFs> fs = RemoteFs();
  ASSERT_NE(fs, nullptr);
  const ReadTally before = ThisThreadReadTally();
  auto file = fs->OpenFile("s3://bucket/dir/obj.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  const ReadTally opened = ThisThreadReadTally();
  EXPECT_GT(opened.remote_nanos, before.remote_nanos);  // the HEAD and the download
  EXPECT_EQ(opened.nanos - before.nanos, opened.remote_nanos - before.remote_nanos);
  EXPECT_EQ(opened.bytes, before.bytes);
  std::vector<uint8_t> out(1000);
  ASSERT_EQ(*ReadUpTo(**file, 10, absl::MakeSpan(out)), out.size());
  const ReadTally read = ThisThreadReadTally();
  EXPECT_EQ(read.bytes - opened.bytes, 1000u);  // read from the cache: a local read
  EXPECT_EQ(read.remote_nanos, opened.remote_nanos);
}

TEST_F(StoreClientTest, AnOpenOfAListedObjectBeingFetchedWaitsForThatGetInsteadOfAHead) {
  store_.listing_pages_ = {absl::StrCat(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>dir/obj.bin"
      "</Key><Size>",
      store_.object().size(), "</Size><ETag>\"abc123\"</ETag></Contents>", "</ListBucketResult>")};
  std::shared_ptr<const DatasetFs> fs = RemoteFs();
  ASSERT_NE(fs, nullptr);
  ASSERT_TRUE(fs->ListDirectory("s3://bucket/dir").ok());
  absl::Notification release;
  store_.hold_gets_ = &release;
  const auto gets = [&] {
    int n = 0;
    for (const httplib::Request& r : store_.requests_seen())
      n += r.method == "GET" && r.path == "/bucket/dir/obj.bin";
    return n;
  };
  // The read-ahead, say, fetches the listed version; a worker opens the object meanwhile.
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> first, second;
  std::thread fetching([&] { first = fs->OpenFile("s3://bucket/dir/obj.bin"); });
  while (gets() == 0) absl::SleepFor(absl::Milliseconds(1));
  std::thread opening([&] { second = fs->OpenFile("s3://bucket/dir/obj.bin"); });
  absl::SleepFor(absl::Milliseconds(100));  // time for a HEAD it should not send
  release.Notify();
  fetching.join();
  opening.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  std::vector<uint8_t> out(100);
  ASSERT_EQ(*ReadUpTo(**second, 500, absl::MakeSpan(out)), out.size());
  EXPECT_EQ(std::string(out.begin(), out.end()), store_.object().substr(500, 100));
  int heads = 0;
  for (const httplib::Request& r : store_.requests_seen()) heads += r.method == "HEAD";
  EXPECT_EQ(heads, 0) << "the GET of the listed version proves these credentials";
  EXPECT_EQ(gets(), 1);
}

// The store's 100,000-byte object read through a mapping in blocks of 16 KiB (objects over
// 50,000 bytes go in blocks), at most 32 KiB of blocks kept mapped.
class BlockReadsTest : public StoreClientTest {
 protected:
  void SetUp() override {
    fs_ =
        RemoteFs({.whole_object_max_bytes = 50000, .block_bytes = 16384, .max_held_bytes = 32768});
    ASSERT_NE(fs_, nullptr);
  }
  // The ranges of the object's GETs so far ("49152-65535").
  std::vector<std::string> Ranges() {
    std::vector<std::string> ranges;
    for (const httplib::Request& r : store_.requests_seen()) {
      if (r.method == "GET") {
        ranges.push_back(std::string(absl::StripPrefix(r.get_header_value("Range"), "bytes=")));
      }
    }
    return ranges;
  }
  // Bytes [offset, offset + n) through a ranged read of `file`.
  std::string ReadMapped(const MappedFile& file, size_t offset, size_t n) {
    std::string out(n, '\0');
    const uint8_t* at = file.bytes().data() + offset;
    const absl::Status s = file.Read(at, n, [&] { std::memcpy(out.data(), at, n); });
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  std::shared_ptr<const DatasetFs> fs_;
};

TEST_F(BlockReadsTest, AMappingFetchesOnlyTheBlocksItsReadsTouch) {
  auto mapped = fs_->MapFileInRanges("s3://bucket/dir/obj.bin");
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const MappedFile& file = **mapped;
  EXPECT_TRUE(file.read_in_ranges());
  ASSERT_EQ(file.bytes().size(), store_.object().size());
  EXPECT_TRUE(Ranges().empty()) << "mapping fetches nothing (a HEAD gives the size)";
  EXPECT_EQ(ReadMapped(file, 50000, 100), store_.object().substr(50000, 100));
  EXPECT_THAT(Ranges(), ::testing::ElementsAre("49152-65535"));
  EXPECT_EQ(ReadMapped(file, 50100, 100), store_.object().substr(50100, 100));
  EXPECT_EQ(Ranges().size(), 1u) << "a mapped block is read again without a request";
  // Across a block boundary: both blocks; the last block is short.
  EXPECT_EQ(ReadMapped(file, 16380, 10), store_.object().substr(16380, 10));
  EXPECT_EQ(ReadMapped(file, 99990, 10), store_.object().substr(99990, 10));
  EXPECT_THAT(Ranges(),
              ::testing::ElementsAre("49152-65535", "0-16383", "16384-32767", "98304-99999"));
  // More blocks than the mapping keeps: the oldest are let go, and stay in the cache.
  EXPECT_EQ(ReadMapped(file, 70000, 10), store_.object().substr(70000, 10));
  EXPECT_EQ(ReadMapped(file, 50000, 10), store_.object().substr(50000, 10));
  EXPECT_EQ(Ranges().size(), 5u) << "a block let go is read from the cache again";
  // A read outside the file is refused, not made.
  const absl::Status outside = file.Read(file.bytes().data() + 99995, 10, [] {});
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument) << outside;
  // Whole: every block.
  std::string all(store_.object().size(), '\0');
  ASSERT_TRUE(file.Read([&] { std::memcpy(all.data(), file.bytes().data(), all.size()); }).ok());
  EXPECT_EQ(all, store_.object());
}

TEST_F(BlockReadsTest, AnObjectGoneAfterItWasMappedStopsTheJobNotJustTheSample) {
  auto mapped = fs_->MapFileInRanges("s3://bucket/dir/obj.bin");
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  store_.status_ = 404;
  store_.code_ = "NoSuchKey";
  const MappedFile& file = **mapped;
  const absl::Status s = file.Read(file.bytes().data() + 20000, 10, [] {});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(IsDatasetChanged(s)) << "a bad sample would be substituted: " << s;
  EXPECT_THAT(s.message(), HasSubstr("block 1 of 's3://bucket/dir/obj.bin'"));
}

TEST_F(BlockReadsTest, AFileReadsTheSameBlocksAndAWholeMappingTheWholeObject) {
  auto file = fs_->OpenFile("s3://bucket/dir/obj.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<uint8_t> out(39000);  // bytes 10,000 to 48,999: blocks 0 to 2
  ASSERT_EQ(*ReadUpTo(**file, 10000, absl::MakeSpan(out)), out.size());
  EXPECT_EQ(std::string(out.begin(), out.end()), store_.object().substr(10000, 39000));
  EXPECT_THAT(Ranges(), ::testing::ElementsAre("0-16383", "16384-32767", "32768-49151"));
  // The mapping of the same object finds those blocks in the cache.
  auto mapped = fs_->MapFileInRanges("s3://bucket/dir/obj.bin");
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(ReadMapped(**mapped, 20000, 100), store_.object().substr(20000, 100));
  EXPECT_EQ(Ranges().size(), 3u);
  // MapFile, which lets its reader touch any byte, fetches the object whole.
  auto whole = fs_->MapFile("s3://bucket/dir/obj.bin");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_FALSE((*whole)->read_in_ranges());
  EXPECT_EQ(std::string((*whole)->bytes().begin(), (*whole)->bytes().end()), store_.object());
  EXPECT_EQ(Ranges().back(), "0-99999");
}

// A token shard of 131,072 uint16 tokens (256 KiB, 64 blocks of 4 KiB: objects over 8 KiB go
// in blocks) read by windows of 256 tokens (512 bytes) in a shuffled order, in batches of 8,
// with a ReadAhead over the blocks of the next batches, as a job's ranks drive it: one
// connection (so its fetches come in lane order) and a window of 24 blocks (a batch of 4
// windows reads at most 8).
class BlockReadAheadTest : public StoreClientTest {
 protected:
  static constexpr uint64_t kBlock = 4096;
  static constexpr int64_t kWindowBlocks = 24;
  static constexpr size_t kBatch = 4;

  void SetUp() override {
    std::mt19937 rng(7);
    std::string tokens(256 * 1024, '\0');
    for (char& c : tokens) c = static_cast<char>(rng() & 0xff);
    store_.set_object(std::move(tokens));
    fs_ = RemoteFs({.whole_object_max_bytes = 2 * kBlock, .block_bytes = kBlock});
    ASSERT_NE(fs_, nullptr);
    ferry::v1::TokenShardsDataset spec;
    spec.add_shards("s3://bucket/dir/obj.bin");
    spec.set_seq_len(255);
    spec.set_token_dtype(ferry::v1::UINT16);
    spec.set_output_dtype(ferry::v1::INT64);
    auto source = TokenShardsSource::Create(spec, /*raw=*/false, *fs_);
    ASSERT_TRUE(source.ok()) << source.status();
    source_ = *std::move(source);
    ASSERT_TRUE(source_->ReadsInRanges());
    std::vector<int64_t> order(static_cast<size_t>(source_->size()));
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i = 0; i < order.size(); i += kBatch) {
      batches_.emplace_back(order.begin() + i, order.begin() + std::min(order.size(), i + kBatch));
    }
  }

  // The blocks the GETs so far fetched, in the order asked.
  std::vector<uint64_t> BlocksFetched() {
    std::vector<uint64_t> blocks;
    for (const httplib::Request& r : store_.requests_seen()) {
      if (r.method != "GET") continue;
      EXPECT_EQ(r.ranges.size(), 1u);
      blocks.push_back(static_cast<uint64_t>(r.ranges[0].first) / kBlock);
    }
    return blocks;
  }
  std::vector<MappedRange> RangesOf(size_t batch) const {
    std::vector<MappedRange> ranges;
    for (const int64_t index : batches_[batch]) source_->RangesOf(index, &ranges);
    return ranges;
  }
  // The blocks batch `batch` reads, in reading order, each once.
  std::vector<uint64_t> BlocksOf(size_t batch) const {
    std::vector<uint64_t> blocks;
    for (const MappedRange& r : RangesOf(batch)) {
      for (uint64_t b = r.offset / kBlock; b <= (r.offset + r.length - 1) / kBlock; ++b) {
        if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
      }
    }
    return blocks;
  }
  // Adds batches to rank 0's lane from *next while it has room, as RankPipeline does.
  void TopUp(ReadAhead& ahead, size_t* next) {
    while (*next < batches_.size() && ahead.HasRoom(0) &&
           ahead.Add(0, {0, static_cast<int64_t>(*next)}, {}, RangesOf(*next))) {
      ++*next;
    }
  }
  // Waits until the read-ahead has nothing left to fetch (every entry added was fetched,
  // failed, or left to the workers); no deadline is a verdict: the checks that follow are.
  static ReadAhead::Stats Settle(const ReadAhead& ahead) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    ReadAhead::Stats stats = ahead.stats();
    while (stats.opened + stats.failed + stats.skipped < stats.added && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
      stats = ahead.stats();
    }
    return stats;
  }
  // Sample `index` through the source, as a worker reads it, against the shard's bytes.
  void ExpectSample(int64_t index) {
    std::vector<int64_t> tokens(256);
    int64_t got_index = -1;
    std::vector<uint8_t*> rows = {reinterpret_cast<uint8_t*>(tokens.data()),
                                  reinterpret_cast<uint8_t*>(&got_index)};
    auto scratch = source_->NewScratch();
    ASSERT_TRUE(source_->Fill(index, 0, absl::MakeSpan(rows), scratch.get()).ok());
    EXPECT_EQ(got_index, index);
    const std::string& bytes = store_.object();
    for (size_t t = 0; t < tokens.size(); ++t) {
      const size_t at = (static_cast<size_t>(index) * 255 + t) * 2;
      const int64_t want = static_cast<uint8_t>(bytes[at]) | static_cast<uint8_t>(bytes[at + 1])
                                                                 << 8;
      ASSERT_EQ(tokens[t], want) << "sample " << index << " token " << t;
    }
  }

  std::shared_ptr<const DatasetFs> fs_;
  std::unique_ptr<TokenShardsSource> source_;
  std::vector<std::vector<int64_t>> batches_;
};

TEST_F(BlockReadAheadTest, TheBlocksOfTheNextBatchesAreFetchedInTheirOrderWithinTheWindow) {
  // Creation read the shard's first 64 KiB (the check that it holds tokens): blocks 0-15.
  const std::vector<uint64_t> at_creation = BlocksFetched();
  ASSERT_EQ(at_creation.size(), 16u);
  ReadAhead ahead(fs_, {.connections = 1, .max_files = kWindowBlocks, .max_bytes = 1 << 20});
  size_t next = 0;
  TopUp(ahead, &next);
  const ReadAhead::Stats stats = Settle(ahead);
  EXPECT_EQ(stats.failed, 0);
  EXPECT_LE(stats.in_window, kWindowBlocks);
  EXPECT_LE(stats.bytes_in_window, kWindowBlocks * kBlock);
  // The window: whole batches, in order, while their blocks fit in it.
  std::vector<uint64_t> window;
  size_t batches = 0;
  for (; batches < batches_.size() && static_cast<int64_t>(window.size()) < kWindowBlocks;
       ++batches) {
    std::vector<uint64_t> more;
    for (uint64_t block : BlocksOf(batches)) {
      if (std::find(window.begin(), window.end(), block) == window.end()) more.push_back(block);
    }
    if (static_cast<int64_t>(window.size() + more.size()) > kWindowBlocks) break;
    window.insert(window.end(), more.begin(), more.end());
  }
  ASSERT_EQ(next, batches);
  ASSERT_EQ(static_cast<int64_t>(window.size()), stats.in_window);
  // Exactly the blocks of those batches that were not cached yet were fetched, in their
  // batch order, and nothing of a batch after them.
  std::vector<uint64_t> expected = at_creation;
  for (uint64_t block : window) {
    if (block >= 16) expected.push_back(block);
  }
  EXPECT_EQ(BlocksFetched(), expected);
  EXPECT_GT(expected.size(), at_creation.size()) << "the window's blocks were all cached";
  // The first batch's samples now read without a request.
  for (const int64_t index : batches_[0]) ExpectSample(index);
  EXPECT_EQ(BlocksFetched(), expected);
}

TEST_F(BlockReadAheadTest, AnEpochReadsEverySampleOnceFromBlocksFetchedAhead) {
  ReadAhead ahead(fs_, {.connections = 1, .max_files = kWindowBlocks, .max_bytes = 1 << 20});
  size_t next = 0;
  std::set<int64_t> seen;
  for (size_t b = 0; b < batches_.size(); ++b) {
    // The workers start batch b: what the read-ahead holds of earlier batches leaves the
    // window, which takes later batches.
    ahead.Reached(0, {0, static_cast<int64_t>(b)});
    TopUp(ahead, &next);
    const ReadAhead::Stats stats = Settle(ahead);
    ASSERT_LE(stats.in_window, kWindowBlocks);
    ASSERT_LE(stats.bytes_in_window, kWindowBlocks * kBlock);
    const size_t fetched = BlocksFetched().size();
    for (const int64_t index : batches_[b]) {
      ExpectSample(index);
      EXPECT_TRUE(seen.insert(index).second) << "sample " << index << " twice";
    }
    // Every block the batch read was fetched before its samples were: they asked for none.
    ASSERT_EQ(BlocksFetched().size(), fetched) << "batch " << b;
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), source_->size());
  // One download per block: the 64 blocks, each once, by creation's check or read-ahead.
  std::vector<uint64_t> blocks = BlocksFetched();
  std::sort(blocks.begin(), blocks.end());
  EXPECT_EQ(blocks.size(), 64u);
  EXPECT_EQ(std::unique(blocks.begin(), blocks.end()), blocks.end());
  const ReadAhead::Stats stats = ahead.stats();
  EXPECT_EQ(stats.failed, 0);
  EXPECT_EQ(stats.skipped, 0);
  EXPECT_GT(stats.opened, 0);
}

TEST_F(StoreClientTest, LocationsParseOrSayWhy) {
  EXPECT_TRUE(ObjectLocation::IsRemote("s3://b/k"));
  EXPECT_TRUE(ObjectLocation::IsRemote("https://h/p"));
  EXPECT_FALSE(ObjectLocation::IsRemote("/data/train.bin"));
  for (const char* bad : {"s3://bucket", "s3:///key", "s3://bucket/", "ftp://h/x", "http:///x"}) {
    auto parsed = ObjectLocation::Parse(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr(bad));
  }
  EXPECT_EQ(ObjectLocation::Parse("s3://b/a/b.tar")->key, "a/b.tar");
}

}  // namespace
}  // namespace ferry
