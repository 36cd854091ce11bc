#include "server/stats/latency_histogram.h"

#include <algorithm>

namespace ferry {

void LatencyHistogram::Observe(absl::Duration latency) {
  const double seconds = std::max(0.0, absl::ToDoubleSeconds(latency));
  // Bucket i holds (kBounds[i-1], kBounds[i]]: the first bound not below the value.
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(std::max<int64_t>(0, absl::ToInt64Nanoseconds(latency)),
                       std::memory_order_relaxed);
}

void LatencyHistogram::Clear() {
  for (std::atomic<uint64_t>& c : counts_) c.store(0, std::memory_order_relaxed);
  sum_nanos_.store(0, std::memory_order_relaxed);
}

uint64_t LatencyHistogram::count() const {
  uint64_t n = 0;
  for (const std::atomic<uint64_t>& c : counts_) n += c.load(std::memory_order_relaxed);
  return n;
}

void LatencyHistogram::ToProto(ferry::v1::Histogram* out) const {
  out->Clear();
  for (const double bound : kBounds) out->add_bounds(bound);
  uint64_t n = 0;
  for (const std::atomic<uint64_t>& c : counts_) {
    const uint64_t v = c.load(std::memory_order_relaxed);
    out->add_counts(v);
    n += v;
  }
  out->set_count(n);
  out->set_sum(static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) * 1e-9);
}

}  // namespace ferry
