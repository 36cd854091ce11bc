// Megatron-Core's GPT samples, bit for bit: the index arrays GPTDataset and BlendedDataset
// build (megatron/core/datasets/gpt_dataset.py, blended_dataset.py, helpers.cpp
// build_sample_idx and build_blending_indices, utils.normalize), with the numpy pieces they
// rest on (numpy.random.RandomState's seeding and shuffle, numpy.sum's order of additions),
// and the fields GPTDataset.__getitem__ makes of a sample's tokens (labels, loss_mask,
// position_ids, attention_mask). A run that trains with Megatron-Core gets the same samples
// in the same order from the same .bin/.idx, seed, sequence length, split and blend.
//
//   FERRY_ASSIGN_OR_RETURN(GptIndex index,
//                          BuildGptIndex(sequence_lengths, documents,
//                                        {.sequence_length = 2048, .num_samples = n,
//                                         .seed = 1234}));
//   // Sample i: tokens from document_index[sample_index[s]] at offset sample_index[s+1]...,
//   // s = 2 * shuffle_index[i] (see GptIndex).
//
// Pure functions of their arguments; thread-compatible.
#ifndef FERRY_SERVER_DATASET_MEGATRON_GPT_H_
#define FERRY_SERVER_DATASET_MEGATRON_GPT_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace ferry::megatron {

// numpy.random.RandomState(seed) for an integer seed: MT19937 seeded as numpy's legacy
// seeding does (init_genrand), drawing as its legacy distributions do.
class NumpyRandomState final {
 public:
  explicit NumpyRandomState(uint32_t seed);

  uint32_t NextUint32();
  // Two 32-bit draws, the first in the high half (numpy's legacy next_uint64).
  uint64_t NextUint64();
  // numpy's random_interval: uniform in [0, max], by masked rejection.
  uint64_t Interval(uint64_t max);
  // RandomState.shuffle of a 1-D array: for i = n-1 down to 1, swap v[i] and
  // v[Interval(i)].
  template <typename T>
  void Shuffle(std::vector<T>* v) {
    for (size_t i = v->size(); i-- > 1;) {
      std::swap((*v)[i], (*v)[static_cast<size_t>(Interval(i))]);
    }
  }

 private:
  void Twist();
  uint32_t state_[624];
  int pos_ = 624;
};

// numpy.sum of a float64 array: its pairwise summation (8 partial sums per block of at
// most 128, blocks halved recursively), so that the result is numpy's to the bit.
double NumpySum(absl::Span<const double> values);

// megatron.core.datasets.utils.normalize: w / numpy.sum(w).
std::vector<double> Normalize(absl::Span<const double> weights);

// gpt_dataset._build_document_index: `documents` repeated num_epochs times and shuffled;
// with separate_final_epoch the last epoch is shuffled on its own after the others.
std::vector<int32_t> BuildDocumentIndex(absl::Span<const int32_t> documents, int32_t num_epochs,
                                        NumpyRandomState* rng, bool separate_final_epoch);

// helpers.cpp build_sample_idx: (samples + 1) pairs (position in document_index, offset in
// that document) that start each sample, flattened. INVALID_ARGUMENT where Megatron's
// assertions stop (seq_length < 2, no epoch, fewer than 2 tokens an epoch).
absl::StatusOr<std::vector<int64_t>> BuildSampleIndex(absl::Span<const int32_t> sizes,
                                                      absl::Span<const int32_t> document_index,
                                                      int32_t seq_length, int32_t num_epochs,
                                                      int64_t tokens_per_epoch,
                                                      bool drop_last_partial_sequence,
                                                      bool add_extra_token_to_sequence);

// gpt_dataset._build_shuffle_index: [0, num_samples) shuffled, then [num_samples,
// total_size) shuffled on its own.
std::vector<int64_t> BuildShuffleIndex(int64_t num_samples, int64_t total_size,
                                       NumpyRandomState* rng);

struct GptIndexOptions {
  int32_t sequence_length = 0;
  // Samples to draw (GPTDataset's num_samples); unset: one epoch's worth.
  std::optional<int64_t> num_samples;
  uint32_t seed = 0;  // GPTDatasetConfig.random_seed
  bool add_extra_token_to_sequence = true;
  // False only for a validation split with drop_last_partial_validation_sequence off.
  bool drop_last_partial_sequence = true;
};

// Everything GPTDataset._build_document_sample_shuffle_indices makes. Sample i reads the
// documents document_index[sample_index[2s]] .. document_index[sample_index[2s + 2]] from
// offset sample_index[2s + 1] to offset sample_index[2s + 3] (plus the extra token), for
// s = shuffle_index[i].
struct GptIndex {
  int32_t num_epochs = 0;
  bool separate_final_epoch = false;
  std::vector<int32_t> document_index;
  std::vector<int64_t> sample_index;  // (samples + 1) pairs
  std::vector<int64_t> shuffle_index;
  int64_t samples() const { return static_cast<int64_t>(sample_index.size() / 2) - 1; }
};

// The indices of a GPTDataset over the documents (sequences of the .idx) `documents` of a
// dataset whose sequence lengths are `sizes`. INVALID_ARGUMENT naming what is out of range.
absl::StatusOr<GptIndex> BuildGptIndex(absl::Span<const int32_t> sizes,
                                       absl::Span<const int32_t> documents,
                                       const GptIndexOptions& options);

// helpers.cpp build_blending_indices: for each of `size` samples, the source whose share so
// far lags its weight most (the first on ties), and that source's next sample.
void BuildBlendingIndices(absl::Span<const double> weights, int64_t size,
                          std::vector<int16_t>* dataset_index,
                          std::vector<int64_t>* dataset_sample_index);

// Megatron's split string ("969,30,1") over a dataset of `count` sequences: the sequences
// [begin, end) of train, valid and test (parse_and_normalize_split,
// convert_split_vector_to_split_matrix, then int(round(bookend * count))); nullopt for a
// split of weight 0, which Megatron does not build. INVALID_ARGUMENT naming the string when
// it does not hold one to three non-negative numbers with a positive sum.
using SplitRange = std::optional<std::pair<int64_t, int64_t>>;
absl::StatusOr<std::array<SplitRange, 3>> SplitRanges(absl::string_view split, int64_t count);

// blended_megatron_dataset_builder._get_size_per_split_per_dataset for one split: the
// samples each source of a blend is asked for, int(ceil(ceil(size * w) * (1 + surplus))),
// with the normalized weights. With surplus 0 these are the blend's targets (their sum is
// the blend's length); Megatron builds each source with surplus 0.005.
std::vector<int64_t> BlendSourceSamples(absl::Span<const double> normalized_weights, int64_t size,
                                        double surplus);

// The tokens of sample i of a GPTDataset (_query_document_sample_shuffle_indices):
// `read(sequence, offset, length, out)` appends `length` tokens of a sequence of the .idx
// from `offset` (length -1: to its end). The result is padded with pad_token to
// sequence_length (+ 1 with the extra token).
void GptSampleText(const GptIndex& index, int64_t i, int32_t sequence_length,
                   bool add_extra_token_to_sequence, int64_t pad_token,
                   const std::function<void(int32_t sequence, int64_t offset, int64_t length,
                                            std::vector<int64_t>* out)>& read,
                   std::vector<int64_t>* text);

struct GptSampleOptions {
  int32_t sequence_length = 0;
  bool add_extra_token_to_sequence = true;
  int64_t eod_token = 0;
  // The tokenizer's pad id (GPTDataset pads a short sample with it), or -1 without one.
  int64_t pad_token = -1;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
};

// GPTDataset.__getitem__ and _get_ltor_masks_and_position_ids for one sample. `text`:
// sequence_length (+ 1 with the extra token) ids, padded with pad_token as
// _query_document_sample_shuffle_indices returns them. Writes sequence_length entries of
// tokens, labels, loss_mask and position_ids, and, when attention_mask is not null,
// sequence_length x sequence_length entries, true where attention is masked (Megatron's
// `attention_mask < 0.5`).
void MakeGptSample(absl::Span<const int64_t> text, const GptSampleOptions& options, int64_t* tokens,
                   int64_t* labels, float* loss_mask, int64_t* position_ids, bool* attention_mask);

}  // namespace ferry::megatron

#endif  // FERRY_SERVER_DATASET_MEGATRON_GPT_H_
