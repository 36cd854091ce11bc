#include "common/clock.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(ClockTest, TheRealClockIsTheProcesssTime) {
  const Clock& clock = Clock::Real();
  const absl::Time before = absl::Now();
  clock.SleepFor(absl::Milliseconds(2));
  EXPECT_GE(clock.Now() - before, absl::Milliseconds(2));
  clock.SleepFor(-absl::Seconds(1));  // returns at once
}

TEST(ClockTest, AFakeClockMovesOnlyWhenAdvanced) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Minutes(5));
  EXPECT_EQ(clock.Now(), start + absl::Minutes(5));
  clock.SleepFor(absl::ZeroDuration());  // returns at once
}

TEST(ClockTest, ASleeperWakesOnlyOnceTheClockHasPassedItsTime) {
  FakeClock clock;
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Hours(1));
    woke = true;
  });
  clock.AwaitSleepers(1);
  clock.Advance(absl::Minutes(59));
  // Still asleep: it waits for the hour whatever the real time.
  clock.AwaitSleepers(1);
  EXPECT_FALSE(woke.load());
  clock.Advance(absl::Minutes(1));
  sleeper.join();
  EXPECT_TRUE(woke.load());
}

}  // namespace
}  // namespace ferry
