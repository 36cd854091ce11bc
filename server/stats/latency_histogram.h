// A latency histogram of fixed buckets, cheap enough for every batch: Observe is a few
// relaxed atomic adds and takes no lock, so it may be called under other locks or from any
// thread. The bounds (1-2.5-5 steps from 1 us to 10 s) suit every latency ferryd reports,
// from a batch channel handoff (microseconds) to a GPU copy behind a busy trainer (seconds).
//
//   LatencyHistogram handoff;
//   handoff.Observe(absl::Now() - taken);
//   handoff.ToProto(status->mutable_handoff_latency());
//
// Thread-safety: thread-safe. A ToProto concurrent with Observe may see an observation in
// `counts` and not yet in `sum` (or the reverse); `count` is always the sum of `counts`.
#ifndef FERRY_SERVER_STATS_LATENCY_HISTOGRAM_H_
#define FERRY_SERVER_STATS_LATENCY_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

class LatencyHistogram final {
 public:
  // Upper bounds of the buckets, in seconds, ascending; one more bucket counts the rest.
  static constexpr std::array<double, 22> kBounds = {
      1e-6, 2.5e-6, 5e-6,   1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3,
      5e-3, 1e-2,   2.5e-2, 5e-2, 0.1,    0.25, 0.5,  1,      2.5,  5,    10};

  LatencyHistogram() = default;
  LatencyHistogram(const LatencyHistogram&) = delete;
  LatencyHistogram& operator=(const LatencyHistogram&) = delete;

  // Counts one observation; a negative duration counts as zero.
  void Observe(absl::Duration latency);
  // Forgets every observation.
  void Clear();
  // Fills the Histogram message: bounds, counts (kBounds.size() + 1), sum and count.
  void ToProto(ferry::v1::Histogram* out) const;
  uint64_t count() const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> counts_{};
  std::atomic<int64_t> sum_nanos_{0};
};

}  // namespace ferry

#endif  // FERRY_SERVER_STATS_LATENCY_HISTOGRAM_H_
