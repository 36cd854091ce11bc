// The `blend` dataset: several sources mixed by weight (ferry.v1.BlendDataset), as
// Megatron-LM's BlendedDataset does, deterministically and with no per-sample state.
//
// Sample indices are the sources' own, concatenated: source s's sample j is index
// offset(s) + j. An epoch of the blend is samples_per_epoch positions; the sampler deals
// and shuffles positions, and IndexAt maps each to a sample:
//   * position p belongs to source s(p), chosen greedily over p = 0, 1, ... as the source
//     whose count lags weight * max(p, 1) the most (ties to the earlier source): Megatron's
//     build_blending_indices. So any prefix follows the weights within one sample a source.
//   * it is that source's k-th position of the epoch, so its draw number is
//     g = epoch * (positions of s per epoch) + k; draw g reads sample g mod size(s) of pass
//     g / size(s), permuted by IndexPermutation(size(s), (seed, s, pass)) when the job
//     shuffles. A source is thus read in whole passes, never repeating a sample before it
//     has served all of them, and a source weighted below its size reads new samples each
//     epoch.
//
// Cost: one byte per position (the source of each) and a count per source every
// max(64, 8 * sources) positions (at most another byte per position), computed once at
// creation in O(samples_per_epoch * sources); IndexAt is O(1) (a scan of fewer positions
// than that stride, eight at a time, and one Feistel permutation).
//
//   FERRY_ASSIGN_OR_RETURN(auto blend, BlendSource::Create(spec, fs, options));
#ifndef FERRY_SERVER_DATASET_BLEND_SOURCE_H_
#define FERRY_SERVER_DATASET_BLEND_SOURCE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/random.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/sample_source.h"
#include "server/memory/memory_budget.h"

namespace ferry {

class BlendSource final : public SampleSource {
 public:
  // The most sources a blend takes (each position's source is one byte).
  static constexpr int kMaxSources = 256;
  // The most positions an epoch may have (a byte each, held in memory).
  static constexpr int64_t kMaxSamplesPerEpoch = int64_t{1} << 33;

  // Opens every source of spec.dataset().blend() with MakeSampleSource (the job's transform
  // applies to each). Errors: INVALID_ARGUMENT naming the field (dataset.blend.sources[i]...)
  // for no sources, a weight that is not a positive finite number, a bad or repeated name,
  // a nested blend, sources whose fields differ (says how) or samples_per_epoch too large;
  // a source's own error prefixed with its name.
  static absl::StatusOr<std::unique_ptr<BlendSource>> Create(const ferry::v1::JobSpec& spec,
                                                             std::shared_ptr<const DatasetFs> fs,
                                                             const SourceOptions& options);

  int64_t size() const override { return offsets_.back(); }
  const std::vector<FieldLayout>& fields() const override { return sources_[0]->fields(); }
  uint64_t index_bytes() const override;  // its sources' (the table is reserved apart)
  std::unique_ptr<Scratch> NewScratch() const override;
  absl::Status Fill(int64_t index, uint64_t sample_seed, absl::Span<uint8_t* const> rows,
                    Scratch* scratch) const override;
  std::string Describe(int64_t index) const override;
  bool FillIsCopy() const override { return fill_is_copy_; }
  // The file, or the ranges, that the sample's source reads for it.
  std::string FileOf(int64_t index) const override;
  void RangesOf(int64_t index, std::vector<MappedRange>* ranges) const override;
  bool ReadsInRanges() const override;

  bool MapsPositions() const override { return true; }
  int64_t epoch_size() const override { return static_cast<int64_t>(source_of_.size()); }
  int64_t IndexAt(uint64_t seed, int64_t epoch, bool shuffle, int64_t position) const override;
  // Fetches every position's bytes ahead, then maps them: the lookups' cache misses overlap.
  void MapPositions(uint64_t seed, int64_t epoch, bool shuffle,
                    absl::Span<int64_t> positions) const override;
  std::vector<Part> parts() const override;

  // The source of `index` and the index within it. Requires 0 <= index < size().
  int SourceOf(int64_t index, int64_t* local) const;

 private:
  BlendSource() = default;
  // Assigns every position its source and records the checkpoints.
  void Interleave(int64_t samples_per_epoch);
  // Positions per checkpoint for `sources` sources, and the bytes Interleave keeps for an
  // epoch of `samples_per_epoch` positions.
  static int64_t Stride(size_t sources);
  static uint64_t IndexBytes(int64_t samples_per_epoch, size_t sources);
  // A source's permutation of one pass, kept while a batch's positions are mapped.
  struct PassOrder {
    uint64_t pass = 0;
    std::optional<IndexPermutation> permutation;
  };
  // IndexAt, reusing the permutations in `orders` (one per source; null: none kept).
  int64_t Map(uint64_t seed, int64_t epoch, bool shuffle, int64_t position,
              std::vector<PassOrder>* orders) const;

  std::vector<std::unique_ptr<SampleSource>> sources_;
  std::vector<std::string> names_;
  std::vector<double> weights_;       // normalised
  std::vector<int64_t> offsets_;      // sources_.size() + 1 prefix sums of sizes
  std::vector<int64_t> per_epoch_;    // positions of each source per epoch
  std::vector<uint8_t> source_of_;    // per position
  int64_t stride_ = 64;               // positions between checkpoints
  std::vector<int64_t> checkpoints_;  // [position / stride_][source]: count before it
  int index_field_ = -1;              // the "index" field, rewritten to the blend's index
  bool fill_is_copy_ = true;
  std::unique_ptr<std::atomic<int64_t>[]> drawn_;  // per source, by MapPositions
  // source_of_ and checkpoints_, in SourceOptions::host_budget
  MemoryBudget::Reservation index_memory_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_BLEND_SOURCE_H_
