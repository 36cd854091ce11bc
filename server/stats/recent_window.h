// Sums of a few figures over the recent past: the last kSeconds seconds of wall time, kept
// in one bucket per second, so that status shows what happens now rather than averages
// since a job began. A figure is a quantity (seconds of waiting, bytes, batches); an
// interval of time (a wait from t0 to t1) is spread over the seconds it overlaps.
//
//   RecentWindow window(kNumFigures);
//   window.AddInterval(kWait, waited_since, now);
//   std::vector<double> sums;
//   const absl::Time start = window.Sum(now, &sums);   // sums[kWait]: waited since `start`
//
// The window covers [start, now) with start = the beginning of the second kSeconds - 1
// seconds before now's, so it spans between kSeconds - 1 and kSeconds seconds. Amounts
// added for a time older than that are dropped. Every call takes `now`, so tests drive the
// clock.
//
// Amounts are kept in billionths (a second is 1e9: nanoseconds), so one bucket holds up to
// about 9e9 units of a figure.
//
// Thread-safety: thread-safe. Adding is lock-free (workers add once per task, many at once):
// an atomic add into the second's bucket; only the first add of a new second takes the
// mutex, to recycle the bucket. An add that stalls for kSeconds between finding its bucket
// and adding to it would count in the recycled second; nothing else is lost. Sum and Clear
// take the mutex.
#ifndef FERRY_SERVER_STATS_RECENT_WINDOW_H_
#define FERRY_SERVER_STATS_RECENT_WINDOW_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

class RecentWindow final {
 public:
  static constexpr int kSeconds = 10;

  explicit RecentWindow(int figures);
  RecentWindow(const RecentWindow&) = delete;
  RecentWindow& operator=(const RecentWindow&) = delete;

  // Adds `amount` to `figure` in the second holding `at`.
  void Add(int figure, double amount, absl::Time at) ABSL_LOCKS_EXCLUDED(mutex_);
  // Adds the seconds of [begin, end) to `figure`, each second's share to its bucket.
  void AddInterval(int figure, absl::Time begin, absl::Time end) ABSL_LOCKS_EXCLUDED(mutex_);
  // Sets *sums (one per figure) to the sums over the window ending at `now`; returns the
  // window's start.
  absl::Time Sum(absl::Time now, std::vector<double>* sums) const ABSL_LOCKS_EXCLUDED(mutex_);
  // The start of the window ending at `now`.
  static absl::Time Start(absl::Time now);
  void Clear() ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  void AddUnits(int figure, int64_t units, int64_t second) ABSL_LOCKS_EXCLUDED(mutex_);

  // Constant after construction.
  const int figures_;
  // Bucket b holds second second_[b] (b = second mod kSeconds) and, for each figure f,
  // units_[b * figures_ + f]. Changed without the mutex only by atomic adds to units_; a
  // bucket moves to a new second under it.
  std::unique_ptr<std::atomic<int64_t>[]> second_;
  std::unique_ptr<std::atomic<int64_t>[]> units_;
  mutable absl::Mutex mutex_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_STATS_RECENT_WINDOW_H_
