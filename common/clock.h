// Where time comes from: the process's real clock, or, in tests, one that only moves when
// the test moves it (FakeClock), so that timeouts, back-offs and waits are exact and take
// no real time.
//
//   const Clock& clock = Clock::Real();
//   const absl::Time give_up = clock.Now() + limit;
//   while (clock.Now() < give_up) clock.SleepFor(absl::Milliseconds(20));
//
// Thread-safe.
#ifndef FERRY_COMMON_CLOCK_H_
#define FERRY_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Returns once this clock has moved `duration` on from the call (at once for <= 0).
  virtual void SleepFor(absl::Duration duration) const = 0;

  // absl::Now() and absl::SleepFor; lives as long as the process.
  static const Clock& Real();
};

// A clock that stands still until Advance moves it; SleepFor blocks until it has been
// moved far enough.
class FakeClock final : public Clock {
 public:
  // Starts at `start`. Default: a fixed instant, not the real time.
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'800'000'000));

  absl::Time Now() const override;
  void SleepFor(absl::Duration duration) const override;

  // Moves the clock `duration` on and wakes the sleepers it passes.
  void Advance(absl::Duration duration);
  // Blocks until at least `count` threads are inside SleepFor: the point at which the
  // code under test waits for the clock.
  void AwaitSleepers(int count) const;

 private:
  mutable absl::Mutex mutex_;
  mutable absl::CondVar changed_;  // the time or the number of sleepers changed
  absl::Time now_ ABSL_GUARDED_BY(mutex_);
  mutable int sleepers_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ferry

#endif  // FERRY_COMMON_CLOCK_H_
