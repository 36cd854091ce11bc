#include "server/dataset/blend_source.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/random.h"
#include "common/status_macros.h"

namespace ferry {
namespace {

// Keeps the passes of different sources apart in IndexPermutation's key.
constexpr uint64_t kPassKeyTag = 0x626c656e64706173ull;  // "blendpas"

// Bytes equal to `value` among data[0, n): eight at a time (a zero byte of x = word ^ value
// has its high bit set in ~(((x & 0x7f..) + 0x7f..) | x) | 0x7f..; no false positives; the
// multiply sums the eight flags into the top byte, with no POPCNT instruction needed).
int64_t CountByte(const uint8_t* data, size_t n, uint8_t value) {
  constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7full;
  const uint64_t pattern = 0x0101010101010101ull * value;
  int64_t count = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, data + i, 8);
    const uint64_t x = word ^ pattern;
    const uint64_t zero_bytes = ~(((x & kLow7) + kLow7) | x | kLow7);
    count += static_cast<int64_t>(((zero_bytes >> 7) * 0x0101010101010101ull) >> 56);
  }
  for (; i < n; ++i) count += data[i] == value;
  return count;
}

class BlendScratch final : public SampleSource::Scratch {
 public:
  explicit BlendScratch(size_t sources) : per_source(sources) {}
  std::vector<std::unique_ptr<SampleSource::Scratch>> per_source;  // made on first use
};

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

std::string DescribeFields(const std::vector<FieldLayout>& fields) {
  return absl::StrJoin(fields, ", ", [](std::string* out, const FieldLayout& f) {
    absl::StrAppend(out, f.name, " ", ferry::v1::DType_Name(f.dtype), "[",
                    absl::StrJoin(f.shape, ", "), "]");
  });
}

bool SameFields(const std::vector<FieldLayout>& a, const std::vector<FieldLayout>& b) {
  if (a.size() != b.size()) return false;
  for (size_t f = 0; f < a.size(); ++f) {
    if (a[f].name != b[f].name || a[f].dtype != b[f].dtype || a[f].shape != b[f].shape ||
        a[f].device_dtype != b[f].device_dtype) {
      return false;
    }
  }
  return true;
}

// Opens every source with `options`; the first error, prefixed with the source's name.
absl::Status OpenSources(const ferry::v1::JobSpec& spec, const std::shared_ptr<const DatasetFs>& fs,
                         const SourceOptions& options, const std::vector<std::string>& names,
                         std::vector<std::unique_ptr<SampleSource>>* sources) {
  sources->clear();
  const ferry::v1::BlendDataset& blend = spec.dataset().blend();
  for (int i = 0; i < blend.sources_size(); ++i) {
    ferry::v1::JobSpec one = spec;
    *one.mutable_dataset() = blend.sources(i).dataset();
    absl::StatusOr<std::unique_ptr<SampleSource>> source = MakeSampleSource(one, fs, options);
    if (!source.ok()) {
      return absl::Status(source.status().code(),
                          absl::StrCat("dataset.blend.sources[", i, "] ('", names[i],
                                       "'): ", source.status().message()));
    }
    sources->push_back(*std::move(source));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BlendSource>> BlendSource::Create(
    const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
    const SourceOptions& options) {
  const ferry::v1::BlendDataset& blend = spec.dataset().blend();
  const int n = blend.sources_size();
  if (n == 0) {
    return absl::InvalidArgumentError(
        "dataset.blend.sources must list at least one dataset (with its weight)");
  }
  if (n > kMaxSources) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.blend.sources lists ", n,
                                                   " datasets; a blend takes at most ", kMaxSources,
                                                   ": merge some sources"));
  }
  std::unique_ptr<BlendSource> source(new BlendSource());
  double total_weight = 0;
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < n; ++i) {
    const ferry::v1::BlendSource& s = blend.sources(i);
    const std::string field = absl::StrCat("dataset.blend.sources[", i, "]");
    if (s.dataset().has_blend()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ".dataset is a blend; blends do not nest: list its sources in this "
                       "blend with their weights multiplied out"));
    }
    if (!(s.weight() > 0) || !std::isfinite(s.weight())) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".weight must be a positive finite number (got ", s.weight(), ")"));
    }
    std::string name = s.name().empty() ? absl::StrCat("source", i) : s.name();
    if (!ValidName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".name '", name, "' must be 1 to 64 letters, digits, '_', '-' or '.'"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".name '", name, "' is used by an earlier source; names must differ"));
    }
    source->names_.push_back(std::move(name));
    source->weights_.push_back(s.weight());
    total_weight += s.weight();
  }
  if (!std::isfinite(total_weight)) {
    return absl::InvalidArgumentError("dataset.blend.sources' weights sum to infinity; scale them");
  }
  for (double& w : source->weights_) w /= total_weight;

  FERRY_RETURN_IF_ERROR(OpenSources(spec, fs, options, source->names_, &source->sources_));
  // A source the device would widen (raw tokens) next to one the workers widen has other
  // host fields but delivers the same: then every source is widened by the workers.
  auto all_alike = [&source] {
    for (const auto& s : source->sources_) {
      if (!SameFields(s->fields(), source->sources_[0]->fields())) return false;
    }
    return true;
  };
  if (!all_alike() && options.device_widens_tokens) {
    SourceOptions on_host = options;
    on_host.device_widens_tokens = false;
    FERRY_RETURN_IF_ERROR(OpenSources(spec, fs, on_host, source->names_, &source->sources_));
  }
  for (int i = 1; i < n; ++i) {
    if (!SameFields(source->sources_[i]->fields(), source->sources_[0]->fields())) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.blend.sources must deliver the same fields: '", source->names_[0],
                       "' has ", DescribeFields(source->sources_[0]->fields()), " but '",
                       source->names_[i], "' has ", DescribeFields(source->sources_[i]->fields()),
                       "; give them the same seq_len, output_dtype and options (or crop size)"));
    }
  }

  const std::vector<FieldLayout>& fields = source->sources_[0]->fields();
  for (size_t f = 0; f < fields.size(); ++f) {
    if (fields[f].name == "index" && fields[f].dtype == ferry::v1::INT64 &&
        fields[f].shape.empty()) {
      source->index_field_ = static_cast<int>(f);
    }
  }
  source->offsets_.push_back(0);
  for (const auto& s : source->sources_) {
    source->offsets_.push_back(source->offsets_.back() + s->size());
    source->fill_is_copy_ = source->fill_is_copy_ && s->FillIsCopy();
  }
  const uint64_t per_epoch = blend.samples_per_epoch() == 0
                                 ? static_cast<uint64_t>(source->offsets_.back())
                                 : blend.samples_per_epoch();
  if (per_epoch > static_cast<uint64_t>(kMaxSamplesPerEpoch)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.blend.samples_per_epoch is ", per_epoch, "; at most ", kMaxSamplesPerEpoch,
        " (one byte of memory each)",
        blend.samples_per_epoch() == 0 ? ": the sources hold more, so set it lower" : ""));
  }
  if (options.host_budget != nullptr) {
    // Reserved before it is built: a blend of billions of positions is refused at once.
    FERRY_ASSIGN_OR_RETURN(source->index_memory_,
                           options.host_budget->Reserve(
                               IndexBytes(static_cast<int64_t>(per_epoch), source->sources_.size()),
                               absl::StrCat("the table of a blend's ", per_epoch,
                                            " positions (dataset.blend.samples_per_epoch)")));
  }
  source->Interleave(static_cast<int64_t>(per_epoch));
  source->drawn_ = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(n));
  return source;
}

uint64_t BlendSource::index_bytes() const {
  uint64_t bytes = 0;
  for (const auto& source : sources_) bytes += source->index_bytes();
  return bytes;
}

int64_t BlendSource::Stride(size_t sources) {
  // At most a byte of checkpoints per position whatever the source count, and a scan of
  // under 64 bytes per lookup for up to 8 sources.
  return std::max<int64_t>(64, static_cast<int64_t>(std::bit_ceil(8 * sources)));
}

uint64_t BlendSource::IndexBytes(int64_t samples_per_epoch, size_t sources) {
  const uint64_t positions = static_cast<uint64_t>(samples_per_epoch);
  return positions +
         (positions / static_cast<uint64_t>(Stride(sources)) + 1) * sources * sizeof(int64_t);
}

void BlendSource::Interleave(int64_t samples_per_epoch) {
  const size_t n = sources_.size();
  source_of_.resize(static_cast<size_t>(samples_per_epoch));
  stride_ = Stride(n);
  checkpoints_.reserve(static_cast<size_t>(samples_per_epoch / stride_ + 1) * n);
  std::vector<int64_t> count(n, 0);
  for (int64_t p = 0; p < samples_per_epoch; ++p) {
    if (p % stride_ == 0) checkpoints_.insert(checkpoints_.end(), count.begin(), count.end());
    // Megatron's build_blending_indices, in the same floating-point steps (this file is
    // compiled without FMA contraction, so every machine picks the same sources).
    const double target = static_cast<double>(std::max<int64_t>(p, 1));
    size_t best = 0;
    double best_error = weights_[0] * target - static_cast<double>(count[0]);
    for (size_t s = 1; s < n; ++s) {
      const double error = weights_[s] * target - static_cast<double>(count[s]);
      if (error > best_error) {
        best_error = error;
        best = s;
      }
    }
    source_of_[static_cast<size_t>(p)] = static_cast<uint8_t>(best);
    ++count[best];
  }
  per_epoch_ = std::move(count);
}

int64_t BlendSource::IndexAt(uint64_t seed, int64_t epoch, bool shuffle, int64_t position) const {
  return Map(seed, epoch, shuffle, position, nullptr);
}

int64_t BlendSource::Map(uint64_t seed, int64_t epoch, bool shuffle, int64_t position,
                         std::vector<PassOrder>* orders) const {
  const size_t n = sources_.size();
  const uint8_t s = source_of_[static_cast<size_t>(position)];
  const int64_t block = position / stride_;
  const int64_t k = checkpoints_[static_cast<size_t>(block) * n + s] +
                    CountByte(source_of_.data() + block * stride_,
                              static_cast<size_t>(position - block * stride_), s);
  const uint64_t size = static_cast<uint64_t>(sources_[s]->size());
  const uint64_t draw = static_cast<uint64_t>(epoch) * static_cast<uint64_t>(per_epoch_[s]) +
                        static_cast<uint64_t>(k);
  uint64_t local = draw % size;
  if (shuffle) {
    const uint64_t pass = draw / size;
    if (orders == nullptr) {
      local = IndexPermutation(size, MixSeed(seed, kPassKeyTag + s, pass))(local);
    } else {
      PassOrder& order = (*orders)[s];
      if (!order.permutation.has_value() || order.pass != pass) {
        order.pass = pass;
        order.permutation.emplace(size, MixSeed(seed, kPassKeyTag + s, pass));
      }
      local = (*order.permutation)(local);
    }
  }
  return offsets_[s] + static_cast<int64_t>(local);
}

void BlendSource::MapPositions(uint64_t seed, int64_t epoch, bool shuffle,
                               absl::Span<int64_t> positions) const {
  const size_t n = sources_.size();
  for (int64_t p : positions) {
    __builtin_prefetch(source_of_.data() + p);
    __builtin_prefetch(checkpoints_.data() + static_cast<size_t>(p / stride_) * n);
  }
  std::vector<PassOrder> orders(n);  // most of a batch's draws share their source's pass
  absl::InlinedVector<int64_t, 8> drawn(n, 0);
  for (int64_t& p : positions) {
    ++drawn[source_of_[static_cast<size_t>(p)]];
    p = Map(seed, epoch, shuffle, p, &orders);
  }
  for (size_t s = 0; s < n; ++s) {
    if (drawn[s] != 0) drawn_[s].fetch_add(drawn[s], std::memory_order_relaxed);
  }
}

int BlendSource::SourceOf(int64_t index, int64_t* local) const {
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), index);
  const int s = static_cast<int>(it - offsets_.begin()) - 1;
  *local = index - offsets_[static_cast<size_t>(s)];
  return s;
}

std::unique_ptr<SampleSource::Scratch> BlendSource::NewScratch() const {
  return std::make_unique<BlendScratch>(sources_.size());
}

std::string BlendSource::FileOf(int64_t index) const {
  if (index < 0 || index >= size()) return {};
  int64_t local = 0;
  const int s = SourceOf(index, &local);
  return sources_[static_cast<size_t>(s)]->FileOf(local);
}

void BlendSource::RangesOf(int64_t index, std::vector<MappedRange>* ranges) const {
  if (index < 0 || index >= size()) return;
  int64_t local = 0;
  const int s = SourceOf(index, &local);
  sources_[static_cast<size_t>(s)]->RangesOf(local, ranges);
}

bool BlendSource::ReadsInRanges() const {
  for (const auto& source : sources_) {
    if (source->ReadsInRanges()) return true;
  }
  return false;
}

absl::Status BlendSource::Fill(int64_t index, uint64_t sample_seed, absl::Span<uint8_t* const> rows,
                               Scratch* scratch) const {
  int64_t local = 0;
  const int s = SourceOf(index, &local);
  auto& own = static_cast<BlendScratch*>(scratch)->per_source[static_cast<size_t>(s)];
  if (own == nullptr) own = sources_[static_cast<size_t>(s)]->NewScratch();
  FERRY_RETURN_IF_ERROR(
      sources_[static_cast<size_t>(s)]->Fill(local, sample_seed, rows, own.get()));
  // The source wrote its own index; the trainer sees the blend's.
  if (index_field_ >= 0 && rows[static_cast<size_t>(index_field_)] != nullptr) {
    std::memcpy(rows[static_cast<size_t>(index_field_)], &index, sizeof(index));
  }
  return absl::OkStatus();
}

std::string BlendSource::Describe(int64_t index) const {
  int64_t local = 0;
  const int s = SourceOf(index, &local);
  return absl::StrCat(sources_[static_cast<size_t>(s)]->Describe(local), " (blend source '",
                      names_[static_cast<size_t>(s)], "')");
}

std::vector<SampleSource::Part> BlendSource::parts() const {
  std::vector<Part> parts;
  for (size_t s = 0; s < sources_.size(); ++s) {
    parts.push_back(Part{.name = names_[s],
                         .weight = weights_[s],
                         .num_samples = sources_[s]->size(),
                         .samples_per_epoch = per_epoch_[s],
                         .samples_drawn = drawn_[s].load(std::memory_order_relaxed)});
  }
  return parts;
}

}  // namespace ferry
