#include "server/stats/recent_window.h"

#include <algorithm>
#include <limits>

namespace ferry {
namespace {

int64_t SecondOf(absl::Time t) {
  return absl::ToInt64Seconds(absl::Floor(t - absl::UnixEpoch(), absl::Seconds(1)));
}

absl::Time StartOfSecond(int64_t second) { return absl::FromUnixSeconds(second); }

}  // namespace

RecentWindow::RecentWindow(int figures)
    : figures_(figures),
      second_(kSeconds, std::numeric_limits<int64_t>::min()),
      amounts_(static_cast<size_t>(kSeconds) * figures, 0.0) {}

absl::Time RecentWindow::Start(absl::Time now) {
  return StartOfSecond(SecondOf(now) - (kSeconds - 1));
}

void RecentWindow::AddLocked(int figure, double amount, int64_t second) {
  const size_t b = static_cast<size_t>(((second % kSeconds) + kSeconds) % kSeconds);
  if (second_[b] > second) return;  // older than the window this bucket holds now
  if (second_[b] < second) {
    second_[b] = second;
    std::fill_n(amounts_.begin() + b * figures_, figures_, 0.0);
  }
  amounts_[b * figures_ + figure] += amount;
}

void RecentWindow::Add(int figure, double amount, absl::Time at) {
  absl::MutexLock lock(&mutex_);
  AddLocked(figure, amount, SecondOf(at));
}

void RecentWindow::AddInterval(int figure, absl::Time begin, absl::Time end) {
  if (end <= begin) return;
  // Only the last kSeconds seconds of the interval can still be in any window.
  begin = std::max(begin, StartOfSecond(SecondOf(end) - (kSeconds - 1)));
  absl::MutexLock lock(&mutex_);
  for (int64_t s = SecondOf(begin); begin < end; ++s) {
    const absl::Time next = std::min(end, StartOfSecond(s + 1));
    AddLocked(figure, absl::ToDoubleSeconds(next - begin), s);
    begin = next;
  }
}

absl::Time RecentWindow::Sum(absl::Time now, std::vector<double>* sums) const {
  sums->assign(figures_, 0.0);
  const int64_t last = SecondOf(now);
  const int64_t first = last - (kSeconds - 1);
  absl::MutexLock lock(&mutex_);
  for (size_t b = 0; b < second_.size(); ++b) {
    if (second_[b] < first || second_[b] > last) continue;
    for (int f = 0; f < figures_; ++f) (*sums)[f] += amounts_[b * figures_ + f];
  }
  return StartOfSecond(first);
}

void RecentWindow::Clear() {
  absl::MutexLock lock(&mutex_);
  std::fill(second_.begin(), second_.end(), std::numeric_limits<int64_t>::min());
  std::fill(amounts_.begin(), amounts_.end(), 0.0);
}

}  // namespace ferry
