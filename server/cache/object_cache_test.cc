#include "server/cache/object_cache.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

class ObjectCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/object_cache_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name(), "_",
                        ::getpid());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<ObjectCache> MustOpen(uint64_t capacity) {
    auto cache = ObjectCache::Open({.dir = dir_, .capacity_bytes = capacity});
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? *std::move(cache) : nullptr;
  }

  static ObjectCache::Key KeyOf(const std::string& object, std::string version = "v1") {
    return {.store = "https://store.test", .object = object, .version = std::move(version)};
  }

  // A fill that writes `bytes` copies of `c` and counts its calls.
  ObjectCache::Fill Writes(uint64_t bytes, char c) {
    return [this, bytes, c](int fd) {
      ++fills_;
      const std::string data(bytes, c);
      return ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(bytes)
                 ? absl::OkStatus()
                 : absl::InternalError("write");
    };
  }

  static std::string Read(const ObjectCache::Pin& pin) {
    std::string out(pin.bytes(), '\0');
    EXPECT_EQ(::pread(pin.fd(), out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
    return out;
  }

  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) out.push_back(e.path());
    return out;
  }

  std::string dir_;
  std::atomic<int> fills_{0};
};

TEST_F(ObjectCacheTest, AMissFillsOnceAndLaterGetsAreHits) {
  auto cache = MustOpen(1000);
  {
    auto pin = cache->Get(KeyOf("bucket/a.tar"), 100, Writes(100, 'a'));
    ASSERT_TRUE(pin.ok()) << pin.status();
    EXPECT_EQ(Read(*pin), std::string(100, 'a'));
  }
  auto again = cache->Get(KeyOf("bucket/a.tar"), 100, Writes(100, 'x'));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Read(*again), std::string(100, 'a'));
  EXPECT_EQ(fills_, 1);
  // A new version of the object is another entry.
  auto v2 = cache->Get(KeyOf("bucket/a.tar", "v2"), 50, Writes(50, 'b'));
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(Read(*v2), std::string(50, 'b'));
  const ObjectCache::Stats s = cache->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.entries, 2u);
  EXPECT_EQ(s.bytes, 150u);
  EXPECT_EQ(s.pinned_entries, 2u);
}

TEST_F(ObjectCacheTest, ConcurrentGetsOfOneObjectDownloadItOnce) {
  auto cache = MustOpen(1 << 20);
  absl::Notification release;
  std::atomic<int> calls{0};
  ObjectCache::Fill slow = [&](int fd) {
    ++calls;
    release.WaitForNotification();  // every other caller arrives while this one fills
    const std::string data(4096, 'z');
    return ::write(fd, data.data(), data.size()) == 4096 ? absl::OkStatus()
                                                         : absl::InternalError("write");
  };
  std::vector<std::thread> threads;
  std::atomic<int> right{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      auto pin = cache->Get(KeyOf("bucket/shared.tar"), 4096, slow);
      if (pin.ok() && Read(*pin) == std::string(4096, 'z')) ++right;
    });
  }
  while (calls == 0) std::this_thread::yield();
  release.Notify();
  for (auto& t : threads) t.join();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(right, 8);
  EXPECT_EQ(cache->stats().misses, 1u);
  EXPECT_EQ(cache->stats().hits, 7u);
}

TEST_F(ObjectCacheTest, AnEntryEvictedWhileACallerWaitedForItIsFetchedAgain) {
  // Room for fifteen of forty objects, each held only for a read: an object a caller waits
  // for may be filled, read by its filler and evicted for another (and other entries come
  // and go) before the waiter wakes. The waiter then fills it again; it never reads an
  // evicted entry's files.
  auto cache = MustOpen(1550);
  std::vector<std::thread> threads;
  std::atomic<int> right{0}, wrong{0}, full{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1500; ++i) {
        const int object = (i * (t + 1)) % 40;
        const char c = static_cast<char>('a' + object);
        auto pin = cache->Get(KeyOf(absl::StrCat("bucket/", object)), 100, [c](int fd) {
          std::this_thread::yield();
          const std::string data(100, c);
          return ::write(fd, data.data(), 100) == 100 ? absl::OkStatus()
                                                      : absl::InternalError("write");
        });
        if (!pin.ok()) {
          // The callers may hold every entry that fits while a fifth is asked for.
          (pin.status().code() == absl::StatusCode::kResourceExhausted ? full : wrong) += 1;
          continue;
        }
        (Read(*pin) == std::string(100, c) ? right : wrong) += 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(right, 0);
  const ObjectCache::Stats s = cache->stats();
  EXPECT_LE(s.bytes, 1550u);
  EXPECT_EQ(s.pinned_entries, 0u);
  EXPECT_EQ(s.hits + s.misses, static_cast<uint64_t>(right + wrong));
}

TEST_F(ObjectCacheTest, EvictsTheLeastRecentlyUsedAndNeverAHeldEntry) {
  auto cache = MustOpen(300);
  auto held = cache->Get(KeyOf("held"), 100, Writes(100, 'h'));
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(cache->Get(KeyOf("old"), 100, Writes(100, 'o')).ok());
  ASSERT_TRUE(cache->Get(KeyOf("new"), 100, Writes(100, 'n')).ok());
  ASSERT_TRUE(cache->Get(KeyOf("old"), 100, Writes(100, '?')).ok());  // now "new" is older
  ASSERT_TRUE(cache->Get(KeyOf("next"), 100, Writes(100, 'x')).ok());
  EXPECT_EQ(cache->stats().evictions, 1u);
  const int before = fills_;
  ASSERT_TRUE(cache->Get(KeyOf("old"), 100, Writes(100, '?')).ok());
  EXPECT_EQ(fills_, before) << "the recently used entry must still be there";
  ASSERT_TRUE(cache->Get(KeyOf("new"), 100, Writes(100, 'n')).ok());
  EXPECT_EQ(fills_, before + 1) << "the least recently used entry was the one evicted";
  EXPECT_EQ(Read(*held), std::string(100, 'h')) << "a held entry is never evicted";

  // Held entries that leave no room: refused, saying what to raise.
  auto a = cache->Get(KeyOf("a"), 100, Writes(100, 'a'));
  auto b = cache->Get(KeyOf("b"), 100, Writes(100, 'b'));
  ASSERT_TRUE(a.ok() && b.ok());
  auto refused = cache->Get(KeyOf("c"), 100, Writes(100, 'c'));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("raise cache_bytes"));
  auto too_big = cache->Get(KeyOf("huge"), 301, Writes(301, 'x'));
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.status().message(), HasSubstr("larger than the object cache"));
}

TEST_F(ObjectCacheTest, AFailedOrShortFillCachesNothingAndTheNextGetTriesAgain) {
  auto cache = MustOpen(1000);
  auto failed = cache->Get(KeyOf("flaky"), 10,
                           [](int) { return absl::UnavailableError("connection reset"); });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  auto shorter = cache->Get(KeyOf("flaky"), 10, Writes(7, 's'));
  EXPECT_EQ(shorter.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(shorter.status().message(), HasSubstr("should be 10 bytes, but 7 arrived"));
  EXPECT_EQ(cache->stats().bytes, 0u);
  EXPECT_TRUE(Files().size() == 1u) << "only .lock: no partial entry left";
  auto ok = cache->Get(KeyOf("flaky"), 10, Writes(10, 'k'));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(Read(*ok), std::string(10, 'k'));
  EXPECT_EQ(cache->stats().fill_failures, 2u);
}

TEST_F(ObjectCacheTest, WaitersOfAFailedFillGetItsError) {
  auto cache = MustOpen(1000);
  absl::Notification release;
  std::atomic<int> calls{0};
  std::vector<std::thread> threads;
  std::atomic<int> unavailable{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      auto pin = cache->Get(KeyOf("down"), 10, [&](int) {
        ++calls;
        release.WaitForNotification();
        return absl::UnavailableError("store down");
      });
      if (pin.status().code() == absl::StatusCode::kUnavailable) ++unavailable;
    });
  }
  while (calls == 0) std::this_thread::yield();
  release.Notify();
  for (auto& t : threads) t.join();
  // One fill; the callers that waited for it share its outcome (a late one may fill again).
  EXPECT_EQ(unavailable, 4);
  EXPECT_LE(calls, 4);
  EXPECT_EQ(cache->stats().bytes, 0u);
}

TEST_F(ObjectCacheTest, EntriesSurviveARestartAndCrashLeftoversAreDropped) {
  {
    auto cache = MustOpen(1000);
    ASSERT_TRUE(cache->Get(KeyOf("first"), 100, Writes(100, '1')).ok());
    ASSERT_TRUE(cache->Get(KeyOf("second"), 200, Writes(200, '2')).ok());
  }
  // What a crash mid-download leaves: a temporary file; and an entry whose file was cut.
  std::ofstream(dir_ + "/deadbeef.obj.tmp.7") << "partial";
  std::string cut;
  for (const std::string& f : Files()) {
    if (absl::EndsWith(f, ".obj")) cut = f;
  }
  ASSERT_FALSE(cut.empty());
  std::filesystem::resize_file(cut, 3);

  auto cache = MustOpen(1000);
  const ObjectCache::Stats s = cache->stats();
  EXPECT_EQ(s.adopted, 1u) << "the entry cut short is dropped";
  for (const std::string& f : Files()) EXPECT_THAT(f, ::testing::Not(HasSubstr(".tmp.")));
  // The intact entry is served without a download; the dropped one is fetched again.
  int fetched = 0;
  for (const auto& [name, c, bytes] : std::vector<std::tuple<std::string, char, uint64_t>>{
           {"first", '1', 100}, {"second", '2', 200}}) {
    const int before = fills_;
    auto pin = cache->Get(KeyOf(name), bytes, Writes(bytes, c));
    ASSERT_TRUE(pin.ok());
    EXPECT_EQ(Read(*pin), std::string(bytes, c));
    fetched += fills_ - before;
  }
  EXPECT_EQ(fetched, 1);
}

// Durability is off the readers' path: an entry is served before its flush, and a process
// that dies before the flush leaves nothing the next Open adopts. The child stands for a
// ferryd killed (or a machine lost) between the two: its flushing thread is held.
TEST_F(ObjectCacheTest, AnEntryIsServedBeforeItsFlushAndACrashBeforeTheFlushDropsIt) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto cache = ObjectCache::Open({.dir = dir_, .capacity_bytes = 1000, .before_flush = [] {
                                      for (;;) ::pause();
                                    }});
    if (!cache.ok()) ::_exit(2);
    auto pin = (*cache)->Get(KeyOf("early"), 100, Writes(100, 'e'));
    // Served complete, and counted as not yet flushed.
    if (!pin.ok() || Read(*pin) != std::string(100, 'e')) ::_exit(3);
    const ObjectCache::Stats s = (*cache)->stats();
    if (s.unflushed != 1) ::_exit(4);
    ::_exit(0);  // no destructor: what a crash leaves
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child's checks (see its exit codes)";
  // The complete object file is there, without its key file.
  int objects = 0, keys = 0;
  for (const std::string& f : Files()) {
    objects += absl::EndsWith(f, ".obj");
    keys += absl::EndsWith(f, ".key");
  }
  EXPECT_EQ(objects, 1);
  EXPECT_EQ(keys, 0);

  {
    auto cache = MustOpen(1000);
    EXPECT_EQ(cache->stats().adopted, 0u);
    const int before = fills_;
    auto pin = cache->Get(KeyOf("early"), 100, Writes(100, 'e'));
    ASSERT_TRUE(pin.ok());
    EXPECT_EQ(fills_ - before, 1) << "fetched again, not adopted";
  }  // a clean end flushes it
  auto cache = MustOpen(1000);
  EXPECT_EQ(cache->stats().adopted, 1u);
  EXPECT_EQ(cache->stats().unflushed, 0u);
}

TEST_F(ObjectCacheTest, ARestartWithLessRoomKeepsTheMostRecent) {
  {
    auto cache = MustOpen(1000);
    for (const char* name : {"a", "b", "c"}) {
      ASSERT_TRUE(cache->Get(KeyOf(name), 100, Writes(100, name[0])).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // distinct mtimes
    }
    ASSERT_TRUE(cache->Get(KeyOf("a"), 100, Writes(100, 'a')).ok());  // a is the most recent
  }
  auto cache = MustOpen(200);
  EXPECT_EQ(cache->stats().entries, 2u);
  const int before = fills_;
  ASSERT_TRUE(cache->Get(KeyOf("a"), 100, Writes(100, 'a')).ok());
  ASSERT_TRUE(cache->Get(KeyOf("c"), 100, Writes(100, 'c')).ok());
  EXPECT_EQ(fills_, before) << "b, the least recent, was evicted";
}

TEST_F(ObjectCacheTest, OneProcessADirectoryAndClearErrors) {
  auto cache = MustOpen(1000);
  auto second = ObjectCache::Open({.dir = dir_, .capacity_bytes = 1000});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("in use by another process"));
  EXPECT_EQ(ObjectCache::Open({.dir = "", .capacity_bytes = 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ObjectCache::Open({.dir = dir_ + "x", .capacity_bytes = 0}).status().message(),
              HasSubstr("cache_bytes must be > 0"));
}

TEST_F(ObjectCacheTest, KeysDifferInEveryField) {
  const ObjectCache::Key base{.store = "s", .object = "o", .version = "v", .block = 1};
  for (ObjectCache::Key other :
       {ObjectCache::Key{"s2", "o", "v", 1}, ObjectCache::Key{"s", "o2", "v", 1},
        ObjectCache::Key{"s", "o", "v2", 1}, ObjectCache::Key{"s", "o", "v", 2},
        ObjectCache::Key{"s o", "", "v", 1}}) {
    EXPECT_NE(other.Canonical(), base.Canonical());
  }
}

}  // namespace
}  // namespace ferry
