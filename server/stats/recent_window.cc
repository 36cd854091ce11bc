#include "server/stats/recent_window.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ferry {
namespace {

constexpr double kUnitsPerAmount = 1e9;

int64_t SecondOf(absl::Time t) {
  return absl::ToInt64Seconds(absl::Floor(t - absl::UnixEpoch(), absl::Seconds(1)));
}

absl::Time StartOfSecond(int64_t second) { return absl::FromUnixSeconds(second); }

size_t BucketOf(int64_t second) {
  return static_cast<size_t>(((second % RecentWindow::kSeconds) + RecentWindow::kSeconds) %
                             RecentWindow::kSeconds);
}

}  // namespace

RecentWindow::RecentWindow(int figures)
    : figures_(figures),
      second_(new std::atomic<int64_t>[kSeconds]),
      units_(new std::atomic<int64_t>[static_cast<size_t>(kSeconds) * figures]) {
  for (int b = 0; b < kSeconds; ++b) {
    second_[b].store(std::numeric_limits<int64_t>::min(), std::memory_order_relaxed);
  }
  for (size_t i = 0; i < static_cast<size_t>(kSeconds) * figures_; ++i) {
    units_[i].store(0, std::memory_order_relaxed);
  }
}

absl::Time RecentWindow::Start(absl::Time now) {
  return StartOfSecond(SecondOf(now) - (kSeconds - 1));
}

void RecentWindow::AddUnits(int figure, int64_t units, int64_t second) {
  const size_t b = BucketOf(second);
  int64_t held = second_[b].load(std::memory_order_acquire);
  if (held > second) return;  // older than the second this bucket holds now
  if (held < second) {
    absl::MutexLock lock(&mutex_);
    held = second_[b].load(std::memory_order_relaxed);
    if (held > second) return;
    if (held < second) {
      for (int f = 0; f < figures_; ++f) {
        units_[b * figures_ + f].store(0, std::memory_order_relaxed);
      }
      second_[b].store(second, std::memory_order_release);
    }
  }
  units_[b * figures_ + figure].fetch_add(units, std::memory_order_relaxed);
}

void RecentWindow::Add(int figure, double amount, absl::Time at) {
  AddUnits(figure, std::llround(amount * kUnitsPerAmount), SecondOf(at));
}

void RecentWindow::AddInterval(int figure, absl::Time begin, absl::Time end) {
  if (end <= begin) return;
  // Only the last kSeconds seconds of the interval can still be in any window.
  begin = std::max(begin, StartOfSecond(SecondOf(end) - (kSeconds - 1)));
  for (int64_t s = SecondOf(begin); begin < end; ++s) {
    const absl::Time next = std::min(end, StartOfSecond(s + 1));
    AddUnits(figure, absl::ToInt64Nanoseconds(next - begin), s);
    begin = next;
  }
}

absl::Time RecentWindow::Sum(absl::Time now, std::vector<double>* sums) const {
  sums->assign(figures_, 0.0);
  const int64_t last = SecondOf(now);
  const int64_t first = last - (kSeconds - 1);
  absl::MutexLock lock(&mutex_);  // no bucket moves to another second meanwhile
  for (int b = 0; b < kSeconds; ++b) {
    const int64_t second = second_[b].load(std::memory_order_acquire);
    if (second < first || second > last) continue;
    for (int f = 0; f < figures_; ++f) {
      (*sums)[f] += units_[b * figures_ + f].load(std::memory_order_relaxed) / kUnitsPerAmount;
    }
  }
  return StartOfSecond(first);
}

void RecentWindow::Clear() {
  absl::MutexLock lock(&mutex_);
  for (int b = 0; b < kSeconds; ++b) {
    second_[b].store(std::numeric_limits<int64_t>::min(), std::memory_order_relaxed);
  }
  for (size_t i = 0; i < static_cast<size_t>(kSeconds) * figures_; ++i) {
    units_[i].store(0, std::memory_order_relaxed);
  }
}

}  // namespace ferry
