#include "server/service/handler_pool.h"

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

constexpr absl::Duration kWait = absl::Seconds(10);

// Holds a pool thread until Release.
class Blocker {
 public:
  HandlerPool::Task Task() {
    return [this](absl::Status) {
      started_.Notify();
      release_.WaitForNotification();
    };
  }
  bool WaitStarted() { return started_.WaitForNotificationWithTimeout(kWait); }
  // Runs the blocking call as `uid` on `pool` and waits until it holds a thread.
  bool Hold(HandlerPool& pool, unsigned uid) {
    pool.Run(uid, absl::InfiniteFuture(), Task());
    return WaitStarted();
  }
  void Release() { release_.Notify(); }

 private:
  absl::Notification started_, release_;
};

// The status one call was given.
class Recorder {
 public:
  HandlerPool::Task Task() {
    return [this](absl::Status ready) {
      status_ = std::move(ready);
      done_.Notify();
    };
  }
  // The status, once the call ran (or was refused) within kWait.
  std::optional<absl::Status> Wait() {
    if (!done_.WaitForNotificationWithTimeout(kWait)) return std::nullopt;
    return status_;
  }

 private:
  absl::Status status_;
  absl::Notification done_;
};

TEST(HandlerPoolTest, OneUsersSlowCallsDoNotHoldUpAnothers) {
  HandlerPool pool(4, "test-handler");
  EXPECT_EQ(pool.max_per_uid(), 2u);
  absl::Notification release;
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) {
    pool.Run(1000, absl::InfiniteFuture(), [&](absl::Status ready) {
      EXPECT_TRUE(ready.ok());
      release.WaitForNotification();
      ++ran;
    });
  }
  absl::Notification other;
  pool.Run(1001, absl::InfiniteFuture(), [&](absl::Status ready) {
    EXPECT_TRUE(ready.ok());
    other.Notify();
  });
  EXPECT_TRUE(other.WaitForNotificationWithTimeout(kWait)) << "held up by uid 1000's calls";
  // Its two threads may still be starting on a loaded machine: wait for them, then no more
  // run, though two threads are free and eight of its calls wait.
  const absl::Time started = absl::Now() + kWait;
  while (pool.running(1000) < 2 && absl::Now() < started) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(pool.running(1000), 2u) << "one uid runs on at most half of the threads";
  release.Notify();
  const absl::Time until = absl::Now() + kWait;
  while (ran.load() < 10 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(ran.load(), 10);
}

TEST(HandlerPoolTest, UsersTakeTurns) {
  HandlerPool pool(1, "test-handler");
  Blocker blocker;
  ASSERT_TRUE(blocker.Hold(pool, 9));
  absl::Mutex mutex;
  std::vector<std::string> order;
  auto record = [&](std::string name) {
    return [&, name](absl::Status) {
      absl::MutexLock lock(&mutex);
      order.push_back(name);
    };
  };
  pool.Run(1, absl::InfiniteFuture(), record("a1"));
  pool.Run(1, absl::InfiniteFuture(), record("a2"));
  pool.Run(1, absl::InfiniteFuture(), record("a3"));
  pool.Run(2, absl::InfiniteFuture(), record("b1"));
  blocker.Release();
  absl::MutexLock lock(&mutex);
  auto all_ran = [&order]() { return order.size() == 4; };
  ASSERT_TRUE(mutex.AwaitWithTimeout(absl::Condition(&all_ran), kWait));
  // uid 2's call does not wait for all of uid 1's.
  EXPECT_EQ(order, (std::vector<std::string>{"a1", "b1", "a2", "a3"}));
}

TEST(HandlerPoolTest, ACallWhoseDeadlinePassedWhileWaitingIsNotRun) {
  HandlerPool pool(1, "test-handler");
  Blocker blocker;
  ASSERT_TRUE(blocker.Hold(pool, 1));
  Recorder late;
  pool.Run(2, absl::Now() + absl::Milliseconds(10), late.Task());
  absl::SleepFor(absl::Milliseconds(50));
  blocker.Release();
  std::optional<absl::Status> got = late.Wait();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->code(), absl::StatusCode::kDeadlineExceeded) << *got;
}

TEST(HandlerPoolTest, StopFailsQueuedAndLaterCallsAndWaitsForRunningOnes) {
  HandlerPool pool(1, "test-handler");
  Blocker blocker;
  ASSERT_TRUE(blocker.Hold(pool, 1));
  Recorder queued;
  pool.Run(2, absl::InfiniteFuture(), queued.Task());
  std::thread stopper([&] { pool.Stop(); });
  std::optional<absl::Status> got = queued.Wait();
  ASSERT_TRUE(got.has_value()) << "Stop kept a queued call";
  EXPECT_EQ(got->code(), absl::StatusCode::kUnavailable) << *got;
  blocker.Release();
  stopper.join();
  Recorder later;
  pool.Run(3, absl::InfiniteFuture(), later.Task());
  got = later.Wait();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->code(), absl::StatusCode::kUnavailable) << *got;
}

TEST(HandlerPoolTest, OneUsersWaitingCallsAreBoundedAndTheRefusalSaysSo) {
  HandlerPool pool(1, "test-handler", /*max_queued_per_uid=*/3);
  Blocker blocker;
  ASSERT_TRUE(blocker.Hold(pool, 1));
  std::vector<Recorder> waiting(3);
  for (Recorder& r : waiting) pool.Run(1, absl::InfiniteFuture(), r.Task());
  Recorder refused;
  pool.Run(1, absl::InfiniteFuture(), refused.Task());
  std::optional<absl::Status> got = refused.Wait();  // at once, the pool's thread being held
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->code(), absl::StatusCode::kResourceExhausted) << *got;
  EXPECT_THAT(std::string(got->message()), ::testing::HasSubstr("uid 1 has 3"));
  Recorder other_user;
  pool.Run(2, absl::InfiniteFuture(), other_user.Task());
  blocker.Release();
  for (Recorder& r : waiting) {
    got = r.Wait();
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(got->ok()) << *got;
  }
  got = other_user.Wait();
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->ok()) << *got;
}

}  // namespace
}  // namespace ferry
