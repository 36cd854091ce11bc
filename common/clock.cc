#include "common/clock.h"

#include "absl/time/clock.h"

namespace ferry {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void SleepFor(absl::Duration duration) const override {
    if (duration > absl::ZeroDuration()) absl::SleepFor(duration);
  }
};

}  // namespace

const Clock& Clock::Real() {
  static const RealClock* const clock = new RealClock();
  return *clock;
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mutex_);
  return now_;
}

void FakeClock::SleepFor(absl::Duration duration) const {
  absl::MutexLock lock(&mutex_);
  const absl::Time wake = now_ + duration;
  ++sleepers_;
  changed_.SignalAll();  // AwaitSleepers
  while (now_ < wake) changed_.Wait(&mutex_);
  --sleepers_;
}

void FakeClock::Advance(absl::Duration duration) {
  absl::MutexLock lock(&mutex_);
  now_ += duration;
  changed_.SignalAll();
}

void FakeClock::AwaitSleepers(int count) const {
  absl::MutexLock lock(&mutex_);
  while (sleepers_ < count) changed_.Wait(&mutex_);
}

}  // namespace ferry
