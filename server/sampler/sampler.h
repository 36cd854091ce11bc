// Deterministic shuffling and sharding of a dataset over the ranks of a training run.
//
// Semantics match torch.utils.data.DistributedSampler followed by a BatchSampler:
//   * the epoch's order is a permutation of [0, num_samples) drawn from (seed, epoch) when
//     shuffle is on, the identity otherwise;
//   * with drop_last the order is cut to floor(N / world) * world samples, otherwise it is
//     padded by repeating its head to ceil(N / world) * world samples;
//   * rank r takes positions r, r + world, r + 2 * world, ... of that order;
//     with `contiguous` it takes positions [r * per_rank, (r + 1) * per_rank) instead, where
//     per_rank = floor(N / world) with drop_last, ceil(N / world) otherwise (the same
//     counts; the padding then lands at the end of the last ranks' runs);
//   * each rank's share is cut into batches of batch_size; with drop_last a trailing partial
//     batch is dropped, otherwise it is delivered short.
// Every rank therefore gets exactly the same number of batches (DDP cannot hang), and every
// node computes the same order from the same spec with no coordinator.
//
// A dataset stored as streams (WebDataset tar shards) supplies its own epoch order through
// `epoch_order` and sets `contiguous`, so that each rank reads a run of whole shards. A
// dataset whose epoch is not a permutation of its samples (a blend) maps each dealt position
// to a sample through `map_positions`; num_samples then counts positions. A dataset already in
// Megatron-LM's training order sets `micro_batches` (and no shuffle): rank r takes micro-batch
// r of each global batch of world * batch_size positions.
//
//   Sampler sampler({.num_samples = n, .batch_size = 256, .world_size = 8, ...});
//   std::vector<int64_t> ids;
//   sampler.BatchIndices(epoch, rank, batch, &ids);
//
// Resuming: an epoch that an earlier run began (on any world size and batch size) is dealt
// from the positions that run left, through a layout from ResumedLayout
// (common/epoch_layout.h); the order itself never depends on the world size.
//
// Thread-safe: BatchIndices may be called concurrently (it caches the permutations of the
// two epochs it was last asked for under a mutex: a pipeline's workers, its read-ahead and
// its ranks straddle an epoch's end without computing either again; 4 bytes a sample each
// for fewer than 2^32 samples).
#ifndef FERRY_SERVER_SAMPLER_SAMPLER_H_
#define FERRY_SERVER_SAMPLER_SAMPLER_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/epoch_layout.h"

namespace ferry {

struct SamplerOptions {
  int64_t num_samples = 0;
  int64_t batch_size = 1;
  int64_t world_size = 1;
  bool shuffle = false;
  bool drop_last = false;
  uint64_t seed = 0;
  // When set, gives the epoch's order in place of the shuffle/identity permutation: fills
  // *order with a permutation of [0, num_samples), as a pure function of the epoch (every
  // node must compute the same). Called once per epoch change, under the sampler's lock;
  // `shuffle` is then ignored by the sampler. Default: unset.
  std::function<void(int64_t epoch, std::vector<int64_t>* order)> epoch_order;
  // Deal contiguous runs of the order to ranks instead of striding (see above). Default: false.
  bool contiguous = false;
  // Deal the order in global batches of micro-batches, as Megatron-LM's
  // MegatronPretrainingSampler does (EpochLayout::Options::micro_batches). Default: false.
  bool micro_batches = false;
  // When set, the order holds positions, not samples: BatchIndices hands the positions it
  // deals to map_positions, which replaces each by its sample, a pure function of
  // (epoch, position) (a blend maps its positions to the samples of its sources). Called
  // without the sampler's lock, from many threads at once. Default: unset (positions are
  // samples).
  std::function<void(int64_t epoch, absl::Span<int64_t> positions)> map_positions;
};

class Sampler final {
 public:
  // INVALID_ARGUMENT when a field is out of range (names the field), FAILED_PRECONDITION
  // when a rank would get no batch at all.
  static absl::StatusOr<std::unique_ptr<Sampler>> Create(const SamplerOptions& options);

  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  int64_t samples_per_rank() const { return fresh_.per_rank(); }
  // Of a fresh epoch, per rank, identical for all ranks.
  int64_t batches_per_epoch() const { return fresh_.batches(); }
  const SamplerOptions& options() const { return options_; }
  // How a fresh epoch is dealt.
  const EpochLayout& fresh_layout() const { return fresh_; }

  // The layout of an epoch of which the positions `consumed` were delivered already (by an
  // earlier run). INVALID_ARGUMENT when the ranges are not sorted, disjoint and inside
  // [0, num_samples).
  absl::StatusOr<std::shared_ptr<const EpochLayout>> ResumedLayout(
      std::vector<PositionRange> consumed) const;

  // Global sample indices of batch `batch` (0-based) of `rank` in `epoch`, dealt by `layout`
  // (null: a fresh epoch). Requires 0 <= rank < world_size and 0 <= batch < the layout's
  // batches().
  void BatchIndices(int64_t epoch, int64_t rank, int64_t batch, std::vector<int64_t>* out,
                    const EpochLayout* layout = nullptr);

  // BatchIndices in two steps, so that the mapping of a blend's positions (the costlier
  // part) can run on many threads: the batch's positions (its indices when the options
  // have no map_positions), then MapPositions replaces any run of them by their indices.
  void BatchPositions(int64_t epoch, int64_t rank, int64_t batch, std::vector<int64_t>* out,
                      const EpochLayout* layout = nullptr);
  void MapPositions(int64_t epoch, absl::Span<int64_t> positions) const;

 private:
  Sampler(const SamplerOptions& options, EpochLayout fresh);
  // One epoch's order (shuffled, or from epoch_order), narrow when the samples fit 32 bits.
  struct Order {
    int64_t epoch = -1;  // -1: none yet
    uint64_t used = 0;   // uses_ when last asked for
    std::vector<uint32_t> narrow;
    std::vector<int64_t> wide;
    int64_t At(size_t i) const { return narrow.empty() ? wide[i] : narrow[i]; }
  };
  // The epoch's order, computed in place of the least recently used of the two cached.
  // Aborts when epoch_order breaks its contract.
  const Order& OrderOf(int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void CheckEpochOrder(int64_t epoch, const std::vector<int64_t>& order)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const SamplerOptions options_;
  const EpochLayout fresh_;
  absl::Mutex mutex_;
  std::array<Order, 2> orders_ ABSL_GUARDED_BY(mutex_);
  uint64_t uses_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVER_SAMPLER_SAMPLER_H_
