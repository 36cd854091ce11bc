// How the positions of one epoch's order are dealt to the ranks of a run, including a run
// that resumes an epoch an earlier run began on another number of ranks or batch size.
//
// The epoch's order has `num_positions` positions (the sampler maps each to a sample; the
// order is a pure function of the seed and the epoch, never of the world size). An earlier
// run may have consumed some of them: `consumed`, sorted disjoint ranges. What is left, in
// order, is the list L of R positions, and L is dealt as DistributedSampler + BatchSampler
// deal a dataset:
//   * L is padded by repeating its head to ceil(R / W) * W entries, or with drop_last cut
//     to floor(R / W) * W;
//   * rank r takes entries r, r + W, r + 2W, ... (strided), or the run
//     [r * per_rank, (r + 1) * per_rank) (contiguous), per_rank = (padded or cut size) / W;
//   * each rank's share is cut into batches of batch_size, the last one short, or with
//     drop_last dropped when short.
// With micro_batches, L is dealt as Megatron-LM's MegatronPretrainingSampler deals it: in
// global batches of G = W * batch_size entries, rank r taking entries [r * batch_size,
// (r + 1) * batch_size) of each; the short last global batch (g < G entries) is dropped with
// drop_last, otherwise padded by repeating L's head to W * ceil(g / W) entries and dealt in
// runs of ceil(g / W). The batch counts and ConsumedAfter are the strided dealing's; only
// which entries a rank gets differs.
// A fresh epoch is the case of nothing consumed. Every rank gets the same number of batches.
//
// After every rank took its first k batches, the run has consumed ConsumedAfter(k): the
// ranges it started from plus the positions of L its ranks were dealt (padding entries
// repeat a position and add nothing). A later run that starts from that set delivers the
// rest; across the runs every position of the epoch is delivered exactly once, except that
// padding entries repeat positions and drop_last leaves out what it cuts in the run that
// finishes the epoch.
//
//   FERRY_ASSIGN_OR_RETURN(EpochLayout layout, EpochLayout::Make({.num_positions = n,
//       .world_size = 4, .batch_size = 32, .consumed = {{0, 640}}}));
//   layout.BatchPositions(/*rank=*/1, /*batch=*/0, &positions);
//
// Immutable after Make: safe to share between threads.
#ifndef FERRY_COMMON_EPOCH_LAYOUT_H_
#define FERRY_COMMON_EPOCH_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ferry {

// Positions [begin, end) of an epoch's order.
struct PositionRange {
  int64_t begin = 0;
  int64_t end = 0;
  friend bool operator==(const PositionRange& a, const PositionRange& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

// Ranges as "[0, 640) [900, 1000)", for messages.
std::string FormatRanges(const std::vector<PositionRange>& ranges);

class EpochLayout final {
 public:
  struct Options {
    int64_t num_positions = 0;
    int64_t world_size = 1;
    int64_t batch_size = 1;
    bool drop_last = false;
    bool contiguous = false;
    // Deal global batches of micro-batches (see above); not with contiguous.
    bool micro_batches = false;
    // Sorted, disjoint, non-empty ranges inside [0, num_positions); adjacent ones are
    // merged. Empty: a fresh epoch.
    std::vector<PositionRange> consumed;
  };

  // INVALID_ARGUMENT (naming the field) when a count is out of range or `consumed` is not
  // sorted disjoint ranges inside the epoch.
  static absl::StatusOr<EpochLayout> Make(Options options);

  const Options& options() const { return options_; }
  // The consumed ranges, merged.
  const std::vector<PositionRange>& consumed() const { return options_.consumed; }
  // R: positions not consumed.
  int64_t remaining() const { return remaining_; }
  // Entries each rank is dealt (padding included), and its batches.
  int64_t per_rank() const { return per_rank_; }
  int64_t batches() const { return batches_; }

  // Positions of batch `batch` of `rank`. Requires 0 <= rank < world_size and
  // 0 <= batch < batches().
  void BatchPositions(int64_t rank, int64_t batch, std::vector<int64_t>* out) const;

  // The consumed ranges once every rank took its first `batches_done` batches
  // (0 <= batches_done <= batches(); larger counts are clamped), merged.
  std::vector<PositionRange> ConsumedAfter(int64_t batches_done) const;

 private:
  explicit EpochLayout(Options options);
  // L[i % R]: the i-th entry of the padded list.
  int64_t Entry(int64_t i) const;
  // Adds the positions of L[begin, end) (end <= R) to `out`, as ranges in order.
  void AppendEntries(int64_t begin, int64_t end, std::vector<PositionRange>* out) const;

  Options options_;
  // The remaining positions as ranges, and how many entries of L precede each.
  std::vector<PositionRange> left_;
  std::vector<int64_t> left_starts_;
  int64_t remaining_ = 0;
  int64_t per_rank_ = 0;
  int64_t batches_ = 0;
};

}  // namespace ferry

#endif  // FERRY_COMMON_EPOCH_LAYOUT_H_
