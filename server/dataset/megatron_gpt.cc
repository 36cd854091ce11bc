#include "server/dataset/megatron_gpt.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ferry::megatron {
namespace {

constexpr int kStateWords = 624;
constexpr int kShift = 397;

// numpy's pairwise_sum (loops_utils.h): exact order of additions.
double PairwiseSum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return PairwiseSum(a, n2) + PairwiseSum(a + n2, n - n2);
}

}  // namespace

NumpyRandomState::NumpyRandomState(uint32_t seed) {
  for (int pos = 0; pos < kStateWords; ++pos) {
    state_[pos] = seed;
    seed = 1812433253u * (seed ^ (seed >> 30)) + static_cast<uint32_t>(pos) + 1u;
  }
  pos_ = kStateWords;
}

void NumpyRandomState::Twist() {
  constexpr uint32_t kMatrixA = 0x9908b0dfu;
  constexpr uint32_t kUpper = 0x80000000u;
  constexpr uint32_t kLower = 0x7fffffffu;
  int i = 0;
  for (; i < kStateWords - kShift; ++i) {
    const uint32_t y = (state_[i] & kUpper) | (state_[i + 1] & kLower);
    state_[i] = state_[i + kShift] ^ (y >> 1) ^ (-(y & 1u) & kMatrixA);
  }
  for (; i < kStateWords - 1; ++i) {
    const uint32_t y = (state_[i] & kUpper) | (state_[i + 1] & kLower);
    state_[i] = state_[i + (kShift - kStateWords)] ^ (y >> 1) ^ (-(y & 1u) & kMatrixA);
  }
  const uint32_t y = (state_[kStateWords - 1] & kUpper) | (state_[0] & kLower);
  state_[kStateWords - 1] = state_[kShift - 1] ^ (y >> 1) ^ (-(y & 1u) & kMatrixA);
  pos_ = 0;
}

uint32_t NumpyRandomState::NextUint32() {
  if (pos_ == kStateWords) Twist();
  uint32_t y = state_[pos_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t NumpyRandomState::NextUint64() {
  const uint64_t high = NextUint32();
  return (high << 32) | NextUint32();
}

uint64_t NumpyRandomState::Interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffu) {
    while ((value = (NextUint32() & mask)) > max) {
    }
  } else {
    while ((value = (NextUint64() & mask)) > max) {
    }
  }
  return value;
}

double NumpySum(absl::Span<const double> values) {
  return PairwiseSum(values.data(), static_cast<int64_t>(values.size()));
}

std::vector<double> Normalize(absl::Span<const double> weights) {
  const double sum = NumpySum(weights);
  std::vector<double> out(weights.begin(), weights.end());
  for (double& w : out) w /= sum;
  return out;
}

std::vector<int32_t> BuildDocumentIndex(absl::Span<const int32_t> documents, int32_t num_epochs,
                                        NumpyRandomState* rng, bool separate_final_epoch) {
  if (!separate_final_epoch || num_epochs == 1) {
    std::vector<int32_t> index;
    index.reserve(documents.size() * static_cast<size_t>(num_epochs));
    for (int32_t e = 0; e < num_epochs; ++e)
      index.insert(index.end(), documents.begin(), documents.end());
    rng->Shuffle(&index);
    return index;
  }
  std::vector<int32_t> first = BuildDocumentIndex(documents, num_epochs - 1, rng, false);
  std::vector<int32_t> last = BuildDocumentIndex(documents, 1, rng, false);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

absl::StatusOr<std::vector<int64_t>> BuildSampleIndex(absl::Span<const int32_t> sizes,
                                                      absl::Span<const int32_t> document_index,
                                                      int32_t seq_length, int32_t num_epochs,
                                                      int64_t tokens_per_epoch,
                                                      bool drop_last_partial_sequence,
                                                      bool add_extra_token_to_sequence) {
  if (seq_length < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Megatron-Core packs samples of at least 2 tokens (its build_sample_idx asserts "
        "seq_length > 1); got sequence_length ",
        seq_length));
  }
  if (num_epochs < 1 || tokens_per_epoch < 2 || document_index.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Megatron-Core needs at least 2 tokens and one epoch to pack samples from (got ",
        tokens_per_epoch, " tokens an epoch, ", num_epochs, " epochs)"));
  }
  const int32_t extra = add_extra_token_to_sequence ? 1 : 0;
  const int64_t tokens = static_cast<int64_t>(num_epochs) * tokens_per_epoch - extra;
  // Megatron's own arithmetic, float ceil included.
  const int64_t num_samples =
      drop_last_partial_sequence
          ? tokens / seq_length
          : static_cast<int64_t>(std::ceil(static_cast<float>(tokens) / seq_length));
  std::vector<int64_t> sample_index(static_cast<size_t>(2 * (num_samples + 1)));
  int64_t sample = 0;
  int64_t document = 0;  // position in document_index
  int64_t offset = 0;    // in that document
  sample_index[0] = document;
  sample_index[1] = offset;
  ++sample;
  const int64_t last_document = static_cast<int64_t>(document_index.size()) - 1;
  while (sample <= num_samples) {
    int64_t remaining = seq_length + extra;
    while (remaining != 0) {
      const int64_t length = sizes[static_cast<size_t>(document_index[document])] - offset;
      remaining -= length;
      if (remaining <= 0) {
        offset += remaining + length - extra;
        remaining = 0;
      } else {
        if (document == last_document) {
          if (sample != num_samples) {
            return absl::InternalError(absl::StrCat(
                "build_sample_idx ran out of documents at sample ", sample, " of ", num_samples));
          }
          offset = sizes[static_cast<size_t>(document_index[document])] - extra;
          break;
        }
        ++document;
        offset = 0;
      }
    }
    sample_index[static_cast<size_t>(2 * sample)] = document;
    sample_index[static_cast<size_t>(2 * sample + 1)] = offset;
    ++sample;
  }
  return sample_index;
}

std::vector<int64_t> BuildShuffleIndex(int64_t num_samples, int64_t total_size,
                                       NumpyRandomState* rng) {
  std::vector<int64_t> first(static_cast<size_t>(num_samples));
  for (int64_t i = 0; i < num_samples; ++i) first[static_cast<size_t>(i)] = i;
  rng->Shuffle(&first);
  if (num_samples == total_size) return first;
  std::vector<int64_t> last(static_cast<size_t>(total_size - num_samples));
  for (int64_t i = num_samples; i < total_size; ++i) {
    last[static_cast<size_t>(i - num_samples)] = i;
  }
  rng->Shuffle(&last);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

absl::StatusOr<GptIndex> BuildGptIndex(absl::Span<const int32_t> sizes,
                                       absl::Span<const int32_t> documents,
                                       const GptIndexOptions& options) {
  int64_t tokens_per_epoch = 0;
  for (int32_t d : documents) {
    if (d < 0 || static_cast<size_t>(d) >= sizes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("document ", d, " is outside the dataset's ", sizes.size(), " sequences"));
    }
    tokens_per_epoch += sizes[static_cast<size_t>(d)];
  }
  if (options.num_samples.has_value() && *options.num_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_samples must be >= 0 (got ", *options.num_samples, ")"));
  }
  const int32_t extra = options.add_extra_token_to_sequence ? 1 : 0;
  const int32_t seq_length = options.sequence_length;
  GptIndex index;
  // gpt_dataset._get_num_epochs.
  index.num_epochs = 1;
  if (options.num_samples.has_value() && tokens_per_epoch > 0) {
    const int64_t requested = *options.num_samples * seq_length + extra;
    for (int64_t tokens = tokens_per_epoch; tokens < requested; tokens += tokens_per_epoch) {
      ++index.num_epochs;
    }
  }
  int64_t samples_sans_final_epoch = 0;
  if (index.num_epochs > 1) {
    samples_sans_final_epoch = ((index.num_epochs - 1) * tokens_per_epoch - extra) / seq_length;
    const int64_t from_final_epoch = *options.num_samples - samples_sans_final_epoch;
    const int64_t per_epoch = (tokens_per_epoch - extra) / seq_length;
    if (from_final_epoch < 0 || from_final_epoch > per_epoch + 1) {
      return absl::InternalError(
          absl::StrCat("Megatron's epoch arithmetic does not hold: ", from_final_epoch,
                       " samples from the final epoch of ", per_epoch));
    }
    // The final epoch is shuffled apart when it is used below 80 %.
    index.separate_final_epoch =
        from_final_epoch < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  NumpyRandomState rng(options.seed);
  index.document_index =
      BuildDocumentIndex(documents, index.num_epochs, &rng, index.separate_final_epoch);
  FERRY_ASSIGN_OR_RETURN(
      index.sample_index,
      BuildSampleIndex(sizes, index.document_index, seq_length, index.num_epochs, tokens_per_epoch,
                       options.drop_last_partial_sequence, options.add_extra_token_to_sequence));
  const int64_t samples = index.samples();
  index.shuffle_index = BuildShuffleIndex(
      index.separate_final_epoch ? samples_sans_final_epoch : samples, samples, &rng);
  return index;
}

void BuildBlendingIndices(absl::Span<const double> weights, int64_t size,
                          std::vector<int16_t>* dataset_index,
                          std::vector<int64_t>* dataset_sample_index) {
  std::vector<int64_t> current(weights.size(), 0);
  dataset_index->resize(static_cast<size_t>(size));
  dataset_sample_index->resize(static_cast<size_t>(size));
  for (int64_t sample = 0; sample < size; ++sample) {
    const double at = std::max(static_cast<double>(sample), 1.0);
    size_t best = 0;
    double best_error = weights[0] * at - static_cast<double>(current[0]);
    for (size_t d = 1; d < weights.size(); ++d) {
      const double error = weights[d] * at - static_cast<double>(current[d]);
      if (error > best_error) {
        best_error = error;
        best = d;
      }
    }
    (*dataset_index)[static_cast<size_t>(sample)] = static_cast<int16_t>(best);
    (*dataset_sample_index)[static_cast<size_t>(sample)] = current[best];
    ++current[best];
  }
}

absl::StatusOr<std::array<SplitRange, 3>> SplitRanges(absl::string_view split, int64_t count) {
  // re.findall(r"[.0-9]+", split), each parsed as a float.
  std::vector<double> weights;
  for (size_t i = 0; i < split.size();) {
    if (!(split[i] == '.' || (split[i] >= '0' && split[i] <= '9'))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < split.size() && (split[j] == '.' || (split[j] >= '0' && split[j] <= '9'))) ++j;
    const std::string number(split.substr(i, j - i));
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "split \"", split, "\": \"", number, "\" is not a number; write e.g. \"969,30,1\""));
    }
    weights.push_back(value);
    i = j;
  }
  if (weights.empty() || weights.size() > 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split \"", split, "\" must give 1 to 3 weights (train, valid, test), e.g. \"969,30,1\""));
  }
  weights.resize(3, 0.0);
  if (NumpySum(weights) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("split \"", split, "\" gives every split weight 0"));
  }
  weights = Normalize(weights);
  std::array<SplitRange, 3> ranges;
  double begin = 0;  // Python's running sum, left to right
  for (size_t k = 0; k < 3; ++k) {
    const double end = begin + weights[k];
    if (end > begin) {
      // int(round(x * float(count))): round half to even, as Python's round.
      ranges[k] = std::make_pair(static_cast<int64_t>(std::nearbyint(begin * count)),
                                 static_cast<int64_t>(std::nearbyint(end * count)));
    }
    begin = end;
  }
  return ranges;
}

std::vector<int64_t> BlendSourceSamples(absl::Span<const double> normalized_weights, int64_t size,
                                        double surplus) {
  std::vector<int64_t> out;
  out.reserve(normalized_weights.size());
  for (double w : normalized_weights) {
    const double target = std::ceil(static_cast<double>(size) * w);
    out.push_back(static_cast<int64_t>(std::ceil(target * (1 + surplus))));
  }
  return out;
}

void GptSampleText(const GptIndex& index, int64_t i, int32_t sequence_length,
                   bool add_extra_token_to_sequence, int64_t pad_token,
                   const std::function<void(int32_t sequence, int64_t offset, int64_t length,
                                            std::vector<int64_t>* out)>& read,
                   std::vector<int64_t>* text) {
  const int64_t extra = add_extra_token_to_sequence ? 1 : 0;
  const int64_t s = index.shuffle_index[static_cast<size_t>(i)];
  const int64_t first = index.sample_index[static_cast<size_t>(2 * s)];
  const int64_t first_offset = index.sample_index[static_cast<size_t>(2 * s + 1)];
  const int64_t last = index.sample_index[static_cast<size_t>(2 * s + 2)];
  const int64_t last_offset = index.sample_index[static_cast<size_t>(2 * s + 3)];
  text->clear();
  auto document = [&](int64_t d) { return index.document_index[static_cast<size_t>(d)]; };
  if (first == last) {
    read(document(first), first_offset, last_offset - first_offset + extra, text);
  } else {
    for (int64_t d = first; d <= last; ++d) {
      read(document(d), d == first ? first_offset : 0, d < last ? -1 : last_offset + extra, text);
    }
  }
  text->resize(static_cast<size_t>(sequence_length + extra), pad_token);
}

void MakeGptSample(absl::Span<const int64_t> text, const GptSampleOptions& options, int64_t* tokens,
                   int64_t* labels, float* loss_mask, int64_t* position_ids, bool* attention_mask) {
  const int64_t n = options.sequence_length;
  const int64_t pad = options.pad_token;
  for (int64_t i = 0; i < n; ++i) {
    tokens[i] = text[static_cast<size_t>(i)];
    labels[i] = options.add_extra_token_to_sequence ? text[static_cast<size_t>(i + 1)]
                : i + 1 < n                         ? text[static_cast<size_t>(i + 1)]
                                                    : pad;
    loss_mask[i] = options.eod_mask_loss && tokens[i] == options.eod_token ? 0.0f : 1.0f;
    position_ids[i] = i;
  }
  if (attention_mask != nullptr) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < n; ++c) attention_mask[r * n + c] = c > r;
    }
  }
  if (options.reset_position_ids || options.reset_attention_mask) {
    // Each end of document (by its position in the unpadded tokens) starts a new one.
    int64_t previous = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (tokens[i] != options.eod_token) continue;
      if (options.reset_attention_mask && attention_mask != nullptr) {
        for (int64_t r = i + 1; r < n; ++r) {
          for (int64_t c = 0; c <= i; ++c) attention_mask[r * n + c] = true;
        }
      }
      if (options.reset_position_ids) {
        for (int64_t j = i + 1; j < n; ++j) position_ids[j] -= i + 1 - previous;
        previous = i + 1;
      }
    }
  }
  // Padding: no loss, and ids an embedding can look up.
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] == pad) loss_mask[i] = 0.0f;
    if (tokens[i] == pad) tokens[i] = 0;
    if (labels[i] == pad) labels[i] = 0;
  }
}

}  // namespace ferry::megatron
