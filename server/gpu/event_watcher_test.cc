// EventWatcher over fake completions that the test flips: which watches are queried, when
// callbacks run, and what the watcher counts. No CUDA.
#include "server/gpu/event_watcher.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Stands for an event: pending until the test completes or fails it; counts its queries.
class FakeCompletion {
 public:
  void Complete() { state_.store(kComplete); }
  void Fail() { state_.store(kFailed); }
  int queries() const { return queries_.load(); }

  EventWatcher::CompletionQuery Query() {
    return [this]() -> absl::StatusOr<bool> {
      queries_.fetch_add(1);
      switch (state_.load()) {
        case kFailed:
          return absl::InternalError("cudaEventQuery: cudaErrorLaunchFailure (fake)");
        case kComplete:
          return true;
        default:
          return false;
      }
    };
  }

 private:
  enum State { kPending, kComplete, kFailed };
  std::atomic<int> state_{kPending};
  std::atomic<int> queries_{0};
};

// The callbacks' names, in the order they ran, and the threads they ran on.
class CallbackLog {
 public:
  std::function<void()> Add(std::string name) {
    return [this, name] {
      absl::MutexLock lock(&mutex_);
      names_.push_back(name);
      threads_.push_back(std::this_thread::get_id());
    };
  }
  std::vector<std::string> names() const {
    absl::MutexLock lock(&mutex_);
    return names_;
  }
  std::vector<std::thread::id> threads() const {
    absl::MutexLock lock(&mutex_);
    return threads_;
  }
  // Waits up to 10 s for `n` callbacks in all.
  bool WaitForCount(size_t n) const {
    absl::MutexLock lock(&mutex_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return names_.size() >= n; };
    return mutex_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }

 private:
  mutable absl::Mutex mutex_;
  std::vector<std::string> names_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::thread::id> threads_ ABSL_GUARDED_BY(mutex_);
};

// Waits up to 10 s for `done`.
bool WaitUntil(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Microseconds(200));
  }
  return true;
}

TEST(EventWatcherTest, CallbacksRunOnceEachAfterCompletionOnTheWatchersThread) {
  auto counters = std::make_shared<GpuCounters>();
  CallbackLog log;
  FakeCompletion copied, ready, released;
  EventWatcher watcher(counters, "job j on GPU 0");
  watcher.Watch(copied.Query(), EventWatcher::kHostSlotCopied, log.Add("copied"));
  watcher.Watch(ready.Query(), EventWatcher::kDeviceSlotReady, log.Add("ready"));
  watcher.Watch(released.Query(), EventWatcher::kReleased, log.Add("released"));

  ASSERT_TRUE(WaitUntil([&] { return copied.queries() >= 3 && released.queries() >= 3; }));
  EXPECT_TRUE(log.names().empty());

  copied.Complete();
  ready.Complete();
  ASSERT_TRUE(log.WaitForCount(2));
  EXPECT_THAT(log.names(), ElementsAre("copied", "ready"));
  released.Complete();
  ASSERT_TRUE(log.WaitForCount(3));

  // Done watches are neither queried nor called again.
  const int queries = copied.queries() + ready.queries() + released.queries();
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_THAT(log.names(), ElementsAre("copied", "ready", "released"));
  EXPECT_EQ(copied.queries() + ready.queries() + released.queries(), queries);
  for (std::thread::id id : log.threads()) EXPECT_NE(id, std::this_thread::get_id());
}

TEST(EventWatcherTest, StreamOrderWatchesBehindAPendingOneAreNotQueried) {
  auto counters = std::make_shared<GpuCounters>();
  CallbackLog log;
  FakeCompletion first, second, third;
  EventWatcher watcher(counters, "job j on GPU 0");
  watcher.Watch(first.Query(), EventWatcher::kHostSlotCopied, log.Add("first"));
  watcher.Watch(second.Query(), EventWatcher::kDeviceSlotReady, log.Add("second"));
  watcher.Watch(third.Query(), EventWatcher::kHostSlotCopied, log.Add("third"));
  second.Complete();  // done on another stream before the first
  third.Complete();

  ASSERT_TRUE(WaitUntil([&] { return first.queries() >= 5; }));  // several rounds
  EXPECT_EQ(second.queries(), 0);
  EXPECT_EQ(third.queries(), 0);
  EXPECT_TRUE(log.names().empty());

  first.Complete();
  ASSERT_TRUE(log.WaitForCount(3));
  EXPECT_THAT(log.names(), ElementsAre("first", "second", "third"));
  EXPECT_EQ(second.queries(), 1);
  EXPECT_EQ(third.queries(), 1);
}

TEST(EventWatcherTest, ReleasedWatchesAreQueriedIndependently) {
  auto counters = std::make_shared<GpuCounters>();
  CallbackLog log;
  FakeCompletion copy, released_pending, released_done;
  EventWatcher watcher(counters, "job j on GPU 0");
  watcher.Watch(copy.Query(), EventWatcher::kDeviceSlotReady, log.Add("copy"));
  watcher.Watch(released_pending.Query(), EventWatcher::kReleased, log.Add("pending"));
  watcher.Watch(released_done.Query(), EventWatcher::kReleased, log.Add("done"));
  released_done.Complete();

  // Neither the pending copy nor the pending release ahead of it holds it back.
  ASSERT_TRUE(log.WaitForCount(1));
  EXPECT_THAT(log.names(), ElementsAre("done"));
  ASSERT_TRUE(WaitUntil([&] { return released_pending.queries() >= 3; }));
  EXPECT_THAT(log.names(), ElementsAre("done"));

  released_pending.Complete();
  ASSERT_TRUE(log.WaitForCount(2));
  EXPECT_THAT(log.names(), ElementsAre("done", "pending"));
  copy.Complete();
  ASSERT_TRUE(log.WaitForCount(3));
}

TEST(EventWatcherTest, ForgetDropsPendingWatchesOfThatKindOnly) {
  auto counters = std::make_shared<GpuCounters>();
  CallbackLog log;
  FakeCompletion released_a, released_b, ready;
  EventWatcher watcher(counters, "job j on GPU 0");
  watcher.Watch(released_a.Query(), EventWatcher::kReleased, log.Add("released a"));
  watcher.Watch(released_b.Query(), EventWatcher::kReleased, log.Add("released b"));
  watcher.Watch(ready.Query(), EventWatcher::kDeviceSlotReady, log.Add("ready"));
  ASSERT_TRUE(WaitUntil([&] { return released_a.queries() >= 2 && ready.queries() >= 2; }));

  watcher.Forget(EventWatcher::kReleased);
  const int queries_a = released_a.queries(), queries_b = released_b.queries();
  released_a.Complete();
  released_b.Complete();
  ready.Complete();
  ASSERT_TRUE(log.WaitForCount(1));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_THAT(log.names(), ElementsAre("ready"));
  // What a forgotten watch read may be gone once Forget returned: never queried again.
  EXPECT_EQ(released_a.queries(), queries_a);
  EXPECT_EQ(released_b.queries(), queries_b);
}

TEST(EventWatcherTest, AFailedQueryCompletesItsWatchWithAWarning) {
  auto counters = std::make_shared<GpuCounters>();
  counters->in_flight = 1;  // as CudaStage counts the copy it enqueues
  CallbackLog log;
  FakeCompletion broken, behind;
  testing::internal::CaptureStderr();
  {
    EventWatcher watcher(counters, "job j on GPU 0");
    watcher.Watch(broken.Query(), EventWatcher::kDeviceSlotReady, log.Add("broken"));
    watcher.Watch(behind.Query(), EventWatcher::kHostSlotCopied, log.Add("behind"));
    broken.Fail();
    behind.Complete();
    ASSERT_TRUE(log.WaitForCount(2));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_THAT(log.names(), ElementsAre("broken", "behind"));
  // A warning: journald's priority prefix, or the severity's name after the time.
  EXPECT_THAT(err, testing::AnyOf(HasSubstr("<4>"), HasSubstr(" WARNING ")));
  EXPECT_THAT(
      err,
      HasSubstr("job j on GPU 0: event watch: INTERNAL: cudaEventQuery: cudaErrorLaunchFailure"));
  EXPECT_EQ(counters->in_flight.load(), 0);
}

TEST(EventWatcherTest, DestroyedFromItsOwnCallbackItStopsWithoutDeadlock) {
  auto counters = std::make_shared<GpuCounters>();
  FakeCompletion last_reference;
  // `next` completes in the round that sees `last_reference` complete (it is queried right
  // after it), so its callback is due right after the one that drops the watcher.
  std::atomic<bool> last_reference_seen{false};
  std::atomic<bool> destroyed{false}, next_ran{false};
  auto watcher = std::make_unique<EventWatcher>(counters, "job j on GPU 0");
  EventWatcher::CompletionQuery last_reference_query = last_reference.Query();
  watcher->Watch(
      [&]() -> absl::StatusOr<bool> {
        absl::StatusOr<bool> complete = last_reference_query();
        if (complete.ok() && *complete) last_reference_seen = true;
        return complete;
      },
      EventWatcher::kReleased,
      [&] {
        watcher.reset();  // as a callback dropping the last reference to the pipeline
        destroyed = true;
      });
  watcher->Watch([&]() -> absl::StatusOr<bool> { return last_reference_seen.load(); },
                 EventWatcher::kReleased, [&] { next_ran = true; });
  last_reference.Complete();

  ASSERT_TRUE(WaitUntil([&] { return destroyed.load(); }));
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(last_reference_seen.load());
  EXPECT_FALSE(next_ran.load());  // its watcher is gone
}

TEST(EventWatcherTest, LatencySecondsAccumulatePerKind) {
  auto counters = std::make_shared<GpuCounters>();
  CallbackLog log;
  FakeCompletion ready, ready_for_both, released;
  EventWatcher watcher(counters, "job j on GPU 0");
  watcher.Watch(ready.Query(), EventWatcher::kDeviceSlotReady, log.Add("ready"));
  watcher.Watch(ready_for_both.Query(), EventWatcher::kDeviceSlotReady, log.Add("both"),
                /*also_frees_host_slot=*/true);
  watcher.Watch(released.Query(), EventWatcher::kReleased, log.Add("released"));
  absl::SleepFor(absl::Milliseconds(50));
  ready.Complete();
  ready_for_both.Complete();
  ASSERT_TRUE(log.WaitForCount(2));
  EXPECT_GE(watcher.seconds(EventWatcher::kDeviceSlotReady), 2 * 0.05);
  EXPECT_GE(watcher.seconds(EventWatcher::kHostSlotCopied), 0.05);  // `both` alone
  EXPECT_LT(watcher.seconds(EventWatcher::kHostSlotCopied),
            watcher.seconds(EventWatcher::kDeviceSlotReady));
  EXPECT_EQ(watcher.seconds(EventWatcher::kReleased), 0);  // still pending

  released.Complete();
  ASSERT_TRUE(log.WaitForCount(3));
  EXPECT_GE(watcher.seconds(EventWatcher::kReleased), 0.05);
}

TEST(EventWatcherTest, InFlightCountsReadyWatchesUntilDoneOrDropped) {
  auto counters = std::make_shared<GpuCounters>();
  counters->in_flight = 3;  // three copies enqueued
  CallbackLog log;
  FakeCompletion done, pending_a, pending_b, released;
  {
    EventWatcher watcher(counters, "job j on GPU 0");
    watcher.Watch(done.Query(), EventWatcher::kDeviceSlotReady, log.Add("done"));
    watcher.Watch(pending_a.Query(), EventWatcher::kDeviceSlotReady, log.Add("a"));
    watcher.Watch(pending_b.Query(), EventWatcher::kDeviceSlotReady, log.Add("b"));
    watcher.Watch(released.Query(), EventWatcher::kReleased, log.Add("released"));
    done.Complete();
    released.Complete();
    ASSERT_TRUE(log.WaitForCount(2));
    EXPECT_EQ(counters->in_flight.load(), 2);  // a release is no copy
  }
  // Copies nobody waits for any more.
  EXPECT_EQ(counters->in_flight.load(), 0);
  EXPECT_THAT(log.names(), testing::UnorderedElementsAre("done", "released"));
}

TEST(EventWatcherTest, IdleWatcherSleepsAndWakesForANewWatch) {
  auto counters = std::make_shared<GpuCounters>();
  CallbackLog log;
  EventWatcher watcher(counters, "job j on GPU 0");
  absl::SleepFor(absl::Milliseconds(20));  // nothing watched: waits on its condition
  FakeCompletion later;
  later.Complete();
  watcher.Watch(later.Query(), EventWatcher::kReleased, log.Add("later"));
  ASSERT_TRUE(log.WaitForCount(1));
  EXPECT_EQ(later.queries(), 1);
}

}  // namespace
}  // namespace ferry
