#include "common/epoch_layout.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

// Appends [begin, end) to sorted ranges, merging it with the last one when they touch.
void AppendRange(int64_t begin, int64_t end, std::vector<PositionRange>* out) {
  if (begin >= end) return;
  if (!out->empty() && out->back().end >= begin) {
    out->back().end = std::max(out->back().end, end);
    return;
  }
  out->push_back({begin, end});
}

// The union of two sorted lists of disjoint ranges, merged.
std::vector<PositionRange> Union(const std::vector<PositionRange>& a,
                                 const std::vector<PositionRange>& b) {
  std::vector<PositionRange> all(a);
  all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end(),
            [](const PositionRange& x, const PositionRange& y) { return x.begin < y.begin; });
  std::vector<PositionRange> merged;
  for (const PositionRange& r : all) AppendRange(r.begin, r.end, &merged);
  return merged;
}

}  // namespace

std::string FormatRanges(const std::vector<PositionRange>& ranges) {
  if (ranges.empty()) return "none";
  std::string out;
  for (const PositionRange& r : ranges) {
    absl::StrAppend(&out, out.empty() ? "" : " ", "[", r.begin, ", ", r.end, ")");
  }
  return out;
}

absl::StatusOr<EpochLayout> EpochLayout::Make(Options options) {
  if (options.num_positions <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the epoch must have at least 1 position (got ", options.num_positions, ")"));
  }
  if (options.world_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be at least 1 (got ", options.world_size, ")"));
  }
  if (options.batch_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size must be at least 1 (got ", options.batch_size, ")"));
  }
  if (options.contiguous && options.micro_batches) {
    return absl::InvalidArgumentError("an epoch is dealt contiguous or in micro-batches, not both");
  }
  std::vector<PositionRange> merged;
  int64_t previous_end = 0;
  for (const PositionRange& r : options.consumed) {
    if (r.begin < previous_end || r.begin >= r.end || r.end > options.num_positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the consumed positions must be sorted, disjoint, non-empty ranges inside the epoch's ",
          options.num_positions, " positions; got ", FormatRanges(options.consumed)));
    }
    previous_end = r.end;
    AppendRange(r.begin, r.end, &merged);
  }
  options.consumed = std::move(merged);
  return EpochLayout(std::move(options));
}

EpochLayout::EpochLayout(Options options) : options_(std::move(options)) {
  int64_t next = 0;
  for (const PositionRange& r : options_.consumed) {
    if (next < r.begin) {
      left_starts_.push_back(remaining_);
      left_.push_back({next, r.begin});
      remaining_ += r.begin - next;
    }
    next = r.end;
  }
  if (next < options_.num_positions) {
    left_starts_.push_back(remaining_);
    left_.push_back({next, options_.num_positions});
    remaining_ += options_.num_positions - next;
  }
  const int64_t w = options_.world_size;
  const int64_t full = remaining_ / w;
  per_rank_ = options_.drop_last || remaining_ % w == 0 ? full : full + 1;
  const int64_t b = options_.batch_size;
  batches_ = options_.drop_last || per_rank_ % b == 0 ? per_rank_ / b : per_rank_ / b + 1;
}

int64_t EpochLayout::Entry(int64_t i) const {
  const int64_t j = i % remaining_;
  // The last range starting at or before entry j.
  const size_t k = static_cast<size_t>(
      std::upper_bound(left_starts_.begin(), left_starts_.end(), j) - left_starts_.begin() - 1);
  return left_[k].begin + (j - left_starts_[k]);
}

void EpochLayout::BatchPositions(int64_t rank, int64_t batch, std::vector<int64_t>* out) const {
  const int64_t begin = batch * options_.batch_size;
  const int64_t end = std::min(begin + options_.batch_size, per_rank_);
  out->clear();
  out->reserve(static_cast<size_t>(std::max<int64_t>(0, end - begin)));
  int64_t first = options_.contiguous ? rank * per_rank_ : rank;
  int64_t stride = options_.contiguous ? 1 : options_.world_size;
  if (options_.micro_batches) {
    // Entry j of this rank's share is entry first + j of L: global batch g's entries of
    // this rank start at g * G + rank * b, where b is batch_size, or ceil(tail / W) in the
    // short last global batch.
    const int64_t global = options_.world_size * options_.batch_size;
    const int64_t full = remaining_ / global;
    const int64_t b =
        batch < full ? options_.batch_size
                     : (remaining_ - full * global + options_.world_size - 1) / options_.world_size;
    first = batch * global + rank * b - begin;
    stride = 1;
  }
  if (left_.size() == 1) {  // the common case: one run of positions left
    const int64_t base = left_[0].begin;
    for (int64_t j = begin; j < end; ++j) out->push_back(base + (first + j * stride) % remaining_);
    return;
  }
  for (int64_t j = begin; j < end; ++j) out->push_back(Entry(first + j * stride));
}

void EpochLayout::AppendEntries(int64_t begin, int64_t end, std::vector<PositionRange>* out) const {
  if (begin >= end) return;
  size_t k = static_cast<size_t>(std::upper_bound(left_starts_.begin(), left_starts_.end(), begin) -
                                 left_starts_.begin() - 1);
  for (; k < left_.size() && left_starts_[k] < end; ++k) {
    const int64_t from = std::max(begin, left_starts_[k]);
    const int64_t to = std::min(end, left_starts_[k] + (left_[k].end - left_[k].begin));
    AppendRange(left_[k].begin + (from - left_starts_[k]), left_[k].begin + (to - left_starts_[k]),
                out);
  }
}

std::vector<PositionRange> EpochLayout::ConsumedAfter(int64_t batches_done) const {
  const int64_t k = std::clamp<int64_t>(batches_done, 0, batches_);
  // Entries each rank was dealt in its first k batches.
  const int64_t taken = std::min(k * options_.batch_size, per_rank_);
  std::vector<PositionRange> dealt;
  if (options_.contiguous) {
    for (int64_t r = 0; r < options_.world_size; ++r) {
      const int64_t begin = r * per_rank_;
      if (begin >= remaining_) break;  // this rank and the next ones hold padding only
      AppendEntries(begin, std::min(begin + taken, remaining_), &dealt);
    }
  } else {
    AppendEntries(0, std::min(taken * options_.world_size, remaining_), &dealt);
  }
  return Union(options_.consumed, dealt);
}

}  // namespace ferry
