// The annotations make TSan see abseil's ordering, and only that: handoffs through
// absl::Mutex (Lock, Await, LockWhen, CondVar) and absl::Notification are not reported, and
// accesses that no lock orders still are. Built and run only in the TSan preset.

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

// A report makes the process exit with 66 (TSAN_OPTIONS halt_on_error=1 in the test preset;
// exitcode=66 is TSan's default), which fails the test that saw it.

TEST(AbslTsanAnnotationsTest, MutexProtectedCountersAreNotReported) {
  absl::Mutex mu;
  int counter = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        absl::MutexLock lock(&mu);
        ++counter;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(counter, 4000);
}

TEST(AbslTsanAnnotationsTest, HandoffsThroughAwaitLockWhenCondVarAndNotificationAreOrdered) {
  absl::Mutex mu;
  absl::CondVar cv;
  int stage = 0;
  int payload = 0;  // written before each handoff, read after it, never under mu
  absl::Notification done;
  std::thread worker([&] {
    mu.LockWhen(absl::Condition(
        +[](int* s) { return *s == 1; }, &stage));
    payload += 10;
    stage = 2;
    mu.Unlock();
    absl::MutexLock lock(&mu);
    while (stage != 3) cv.Wait(&mu);
    payload += 100;
    stage = 4;
    cv.SignalAll();
  });
  payload = 1;
  {
    absl::MutexLock lock(&mu);
    stage = 1;
    mu.Await(absl::Condition(
        +[](int* s) { return *s == 2; }, &stage));
  }
  EXPECT_EQ(payload, 11);
  {
    absl::MutexLock lock(&mu);
    stage = 3;
    cv.SignalAll();
    while (stage != 4) {
      cv.WaitWithTimeout(&mu, absl::Seconds(1));
    }
  }
  EXPECT_EQ(payload, 111);
  worker.join();

  int note = 0;
  std::thread notifier([&] {
    note = 7;
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(note, 7);
  notifier.join();
}

TEST(AbslTsanAnnotationsTest, ReaderLocksOrderAgainstWriters) {
  absl::Mutex mu;
  int value = 0;
  std::thread writer([&] {
    for (int i = 0; i < 500; ++i) {
      absl::MutexLock lock(&mu);
      ++value;
    }
  });
  int seen = 0;
  for (int i = 0; i < 500; ++i) {
    absl::ReaderMutexLock lock(&mu);
    seen = value;
  }
  writer.join();
  EXPECT_LE(seen, 500);
}

// The same shapes with one side not taking the lock (or taking another) must be reported:
// the annotations must not order what abseil does not.
//
// TSan can miss a race whose two accesses run at the same instant on two cores (each reads
// the shadow word before the other writes it), so the other thread's write comes first in
// time: the main thread waits for a relaxed flag, which orders nothing for TSan.
void WaitForRelaxed(const std::atomic<bool>& flag) {
  while (!flag.load(std::memory_order_relaxed)) std::this_thread::yield();
}

void UnguardedWriteRace() {
  absl::Mutex mu;
  int counter = 0;
  std::atomic<bool> written{false};
  std::thread other([&] {
    absl::MutexLock lock(&mu);
    ++counter;
    written.store(true, std::memory_order_relaxed);
  });
  WaitForRelaxed(written);
  ++counter;  // no lock
  other.join();
}

void TwoDifferentMutexesRace() {
  absl::Mutex a, b;
  int counter = 0;
  std::atomic<bool> written{false};
  std::thread other([&] {
    absl::MutexLock lock(&a);
    ++counter;
    written.store(true, std::memory_order_relaxed);
  });
  WaitForRelaxed(written);
  {
    absl::MutexLock lock(&b);
    ++counter;
  }
  other.join();
}

TEST(AbslTsanAnnotationsDeathTest, AnUnguardedAccessIsStillReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(UnguardedWriteRace(), testing::ExitedWithCode(66), "data race");
}

TEST(AbslTsanAnnotationsDeathTest, AccessesUnderDifferentMutexesAreStillReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(TwoDifferentMutexesRace(), testing::ExitedWithCode(66), "data race");
}

}  // namespace
}  // namespace ferry
