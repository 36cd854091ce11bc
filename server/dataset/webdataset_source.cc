#include "server/dataset/webdataset_source.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <optional>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/random.h"
#include "common/status_macros.h"
#include "server/dataset/image_folder_source.h"
#include "server/dataset/shard_pattern.h"
#include "server/dataset/tar_index.h"

namespace ferry {
namespace {

constexpr uint32_t kDefaultShuffleBuffer = 1000;
// A label is a short decimal number; a larger member is not a label.
constexpr uint64_t kMaxLabelBytes = 64;
// Image and label members closer than this are read with one pread (the usual layout: the
// two members are adjacent, one 512-byte header apart).
constexpr uint64_t kMaxReadGap = 4096;
// Threads that index shards at once: enough to hide the latency of a network filesystem,
// few enough not to disturb the running jobs' workers.
constexpr size_t kIndexThreads = 8;
// Random streams of StreamOrder. MixSeed's last argument is a sample index (< 2^63) for the
// per-sample transforms, so these values never meet one.
constexpr uint64_t kShardOrderStream = uint64_t{1} << 63;
constexpr uint64_t kShuffleBufferStream = (uint64_t{1} << 63) + 1;

class WebDatasetScratch final : public SampleSource::Scratch {
 public:
  ImageDecoder decoder;
  ComposeScratch compose;
  std::vector<uint8_t> buffer;  // grows to the largest read, never shrinks
  // The shard last read: a rank reads a contiguous run of the order, so consecutive samples
  // mostly share a shard.
  int64_t shard = -1;
  std::unique_ptr<RandomAccessFile> file;
};

// "dir/n01_0001.seg.PNG" -> basename "dir/n01_0001", extension "seg.png"; false when the
// file-name part has no '.' or starts with one (WebDataset ignores such members).
bool SplitMemberName(const std::string& name, absl::string_view* basename,
                     absl::string_view* extension) {
  const size_t slash = name.rfind('/');
  const size_t file = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', file);
  if (dot == std::string::npos || dot == file) return false;
  *basename = absl::string_view(name).substr(0, dot);
  *extension = absl::string_view(name).substr(dot + 1);
  return true;
}

std::string NormalizeKey(const std::string& key, const char* fallback) {
  std::string k = absl::AsciiStrToLower(key.empty() ? fallback : key);
  if (!k.empty() && k.front() == '.') k.erase(0, 1);  // ".jpg" means "jpg"
  return k;
}

bool MatchesKey(absl::string_view lower_extension, const std::string& key) {
  if (lower_extension == key) return true;
  // "jpg" and "jpeg" name the same thing.
  return (key == "jpg" && lower_extension == "jpeg") || (key == "jpeg" && lower_extension == "jpg");
}

// Reads `bytes` bytes at `offset`. The error says what went wrong, not where: the caller
// names the member.
absl::Status ReadExactly(const RandomAccessFile& file, uint64_t offset, uint8_t* out,
                         uint64_t bytes) {
  absl::StatusOr<size_t> n = ReadUpTo(file, offset, absl::MakeSpan(out, bytes));
  if (!n.ok()) return n.status();
  if (*n < bytes) {
    return absl::DataLossError(
        absl::StrCat("the shard ends at byte ", offset + *n,
                     ", before the member does; it changed after the job indexed it"));
  }
  return absl::OkStatus();
}

absl::Status ReadError(const absl::Status& status, const std::string& member) {
  return absl::Status(status.code(),
                      absl::StrCat("cannot read '", member, "': ", status.message()));
}

}  // namespace

absl::StatusOr<WebDatasetSource::ShardTable> WebDatasetSource::IndexShard(
    const std::string& path, const std::string& image_key, const std::string& label_key,
    const DatasetFs& fs) {
  absl::StatusOr<TarIndex> tar = IndexTarFile(path, fs);
  if (!tar.ok()) {
    if (tar.status().code() == absl::StatusCode::kDataLoss) {
      return absl::FailedPreconditionError(absl::StrCat(
          "webdataset shard '", path, "' is damaged: ", tar.status().message(),
          ". Repair or re-create the shard, or remove it from dataset.webdataset.shards"));
    }
    return tar.status();
  }
  ShardTable table;
  table.identity = tar->identity;
  table.truncated = tar->truncated;
  table.stats.members = static_cast<int64_t>(tar->members.size());

  // The sample being assembled: a run of members with the same basename.
  std::string basename;
  const TarMember* image = nullptr;
  const TarMember* label = nullptr;
  std::string label_spelling;
  auto flush = [&] {
    if (basename.empty()) return;
    Sample sample;
    sample.has_image = image != nullptr;
    if (image != nullptr) {
      sample.image_offset = image->data_offset;
      sample.image_size = image->size;
    } else {
      ++table.stats.samples_without_image;
    }
    if (label != nullptr) {
      sample.label_offset = label->data_offset;
      sample.label_size = static_cast<uint32_t>(std::min<uint64_t>(label->size, UINT32_MAX));
      std::vector<std::string>& spellings = table.label_spellings;
      auto it = std::find(spellings.begin(), spellings.end(), label_spelling);
      if (it == spellings.end()) {
        // Past 65535 distinct spellings (absurd), messages name the first one.
        it = spellings.size() < kNoLabel ? spellings.insert(it, label_spelling) : spellings.begin();
      }
      sample.label_spelling = static_cast<uint16_t>(it - spellings.begin());
    }
    table.samples.push_back(sample);
    table.names += image != nullptr ? image->name : basename;
    table.name_ends.push_back(static_cast<uint32_t>(table.names.size()));
  };
  for (const TarMember& member : tar->members) {
    absl::string_view base, extension;
    if (!SplitMemberName(member.name, &base, &extension)) {
      ++table.stats.members_ignored;
      continue;
    }
    if (base != basename) {
      flush();
      basename.assign(base.data(), base.size());
      image = label = nullptr;
    }
    const std::string lower = absl::AsciiStrToLower(extension);
    const bool is_image = MatchesKey(lower, image_key);
    const bool is_label = !is_image && lower == label_key;
    if (!is_image && !is_label) continue;  // another field of the sample: unused
    const TarMember*& slot = is_image ? image : label;
    if (slot != nullptr) {  // "x.jpg" twice in one run: the first one wins
      ++table.stats.members_ignored;
      continue;
    }
    slot = &member;
    if (is_label) label_spelling.assign(extension.data(), extension.size());
    if (table.names.size() + member.name.size() > UINT32_MAX) {
      return absl::FailedPreconditionError(
          absl::StrCat("webdataset shard '", path, "' has over 4 GiB of member names; split it"));
    }
  }
  if (tar->truncated) {
    ++table.stats.truncated_shards;
    // The member cut off may belong to the last sample (its label, say): drop that sample
    // rather than serve it with a missing field.
    absl::string_view cut_base, cut_extension;
    const bool maybe_same =
        tar->truncated_member.empty() ||
        (SplitMemberName(tar->truncated_member, &cut_base, &cut_extension) && cut_base == basename);
    if (maybe_same && !basename.empty()) {
      ++table.stats.truncated_samples;
      basename.clear();
    }
    FERRY_LOG(WARNING) << "webdataset shard '" << path << "' is truncated: "
                       << (tar->truncated_member.empty()
                               ? std::string("a header")
                               : absl::StrCat("member '", tar->truncated_member, "'"))
                       << " at byte " << tar->truncated_at << " runs past its end ("
                       << tar->file_size << " bytes); it and anything after it are "
                       << "skipped, the samples before are used";
  }
  flush();
  return table;
}

uint64_t WebDatasetSource::index_bytes() const {
  uint64_t bytes = shard_begin_.capacity() * sizeof(int64_t) +
                   shards_.capacity() * (sizeof(void*) + sizeof(Shard));
  for (const std::string& s : shard_paths_) bytes += sizeof(s) + s.capacity();
  if (lazy_) {
    // The tables are built as shards are read: what a sample takes, with a name of 48 bytes.
    return bytes + static_cast<uint64_t>(size()) * (sizeof(Sample) + sizeof(uint32_t) + 48);
  }
  for (const auto& shard : shards_) {
    const ShardTable& t = shard->table;
    bytes += t.samples.capacity() * sizeof(Sample) + t.name_ends.capacity() * sizeof(uint32_t) +
             t.names.capacity();
    for (const std::string& s : t.label_spellings) bytes += sizeof(s) + s.capacity();
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<WebDatasetSource>> WebDatasetSource::Create(
    const ferry::v1::WebDataset& spec, const ImageTransform& transform, const DecodeLimits& limits,
    std::shared_ptr<const DatasetFs> fs) {
  if (spec.shards().empty()) {
    if (!spec.shard_index().empty()) {
      return absl::InvalidArgumentError(
          "dataset.webdataset.shard_index is read into dataset.webdataset.shards when a job is "
          "created (ResolveDatasetIndexes); this spec was not");
    }
    return absl::InvalidArgumentError(
        "dataset.webdataset.shards must list at least one .tar path or pattern, e.g. "
        "\"/data/train-{000000..000146}.tar\" (or give dataset.webdataset.shard_index)");
  }
  std::string image_key = NormalizeKey(spec.image_key(), "jpg");
  std::string label_key = NormalizeKey(spec.label_key(), "cls");
  if (image_key.empty() || label_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.webdataset.", image_key.empty() ? "image_key" : "label_key",
                     " must be a member extension such as \"jpg\" or \"cls\" (got \".\")"));
  }
  if (MatchesKey(label_key, image_key)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.webdataset.image_key and label_key must differ (both are \"", image_key, "\")"));
  }
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> shards,
                         ExpandShardPatterns({spec.shards().begin(), spec.shards().end()}));
  if (shards.size() >= UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("dataset.webdataset.shards expands to ",
                                                   shards.size(), " shards; at most ",
                                                   UINT32_MAX - 1, " are supported"));
  }
  const bool lazy = !spec.shard_samples().empty();
  if (lazy && static_cast<size_t>(spec.shard_samples_size()) != shards.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.webdataset.shard_samples has ", spec.shard_samples_size(),
                     " counts for ", shards.size(), " shards; give one per shard, in order"));
  }

  const uint32_t shuffle_buffer =
      spec.shuffle_buffer() == 0 ? kDefaultShuffleBuffer : spec.shuffle_buffer();
  std::unique_ptr<WebDatasetSource> source(
      new WebDatasetSource(transform, limits, shuffle_buffer, image_key, label_key, std::move(fs)));
  source->lazy_ = lazy;
  source->shards_.reserve(shards.size());
  for (const std::string& path : shards) {
    source->shards_.push_back(std::make_unique<Shard>());
    source->shards_.back()->path = path;
  }
  source->shard_begin_.push_back(0);
  Stats& stats = source->stats_;
  stats.shards = static_cast<int64_t>(shards.size());

  if (lazy) {
    for (uint64_t n : spec.shard_samples()) {
      if (n > static_cast<uint64_t>(INT64_MAX - source->shard_begin_.back())) {
        return absl::InvalidArgumentError("dataset.webdataset.shard_samples sum past 2^63");
      }
      source->shard_begin_.push_back(source->shard_begin_.back() + static_cast<int64_t>(n));
    }
    if (source->shard_begin_.back() == 0) {
      return absl::InvalidArgumentError(
          "dataset.webdataset.shard_samples count no sample in any shard");
    }
    source->shard_paths_ = std::move(shards);
    return source;
  }

  // Index the shards on a few threads. The first failure stops the others: the job is
  // refused anyway, and a list of many missing shards must not take long to refuse.
  std::vector<std::optional<absl::Status>> results(shards.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    for (size_t s = next.fetch_add(1); s < shards.size() && !failed.load(); s = next.fetch_add(1)) {
      absl::StatusOr<ShardTable> table =
          source->fs_->Stopping()
              ? absl::StatusOr<ShardTable>(StoppingError())
              : IndexShard(shards[s], source->image_key_, source->label_key_, *source->fs_);
      if (table.ok()) source->shards_[s]->table = *std::move(table);
      results[s] = table.status();
      if (!table.ok()) failed.store(true);
    }
  };
  const size_t threads = std::min(kIndexThreads, shards.size());
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();

  for (size_t s = 0; s < shards.size(); ++s) {
    if (!results[s].has_value()) continue;  // after a failure, which the loop reaches
    if (!results[s]->ok()) return *results[s];
    ShardTable& table = source->shards_[s]->table;
    stats.members += table.stats.members;
    stats.samples_without_image += table.stats.samples_without_image;
    stats.members_ignored += table.stats.members_ignored;
    stats.truncated_shards += table.stats.truncated_shards;
    stats.truncated_samples += table.stats.truncated_samples;
    // Numbered by their counts alone, a dataset skips the samples without an image member.
    if (table.stats.samples_without_image > 0) {
      ShardTable all = std::move(table);
      table.identity = all.identity;
      table.label_spellings = std::move(all.label_spellings);
      table.truncated = all.truncated;
      table.stats = all.stats;
      for (size_t i = 0; i < all.samples.size(); ++i) {
        if (!all.samples[i].has_image) continue;
        table.samples.push_back(all.samples[i]);
        absl::StrAppend(&table.names, source->NameOf(all, i));
        table.name_ends.push_back(static_cast<uint32_t>(table.names.size()));
      }
    }
    table.samples.shrink_to_fit();
    table.name_ends.shrink_to_fit();
    table.names.shrink_to_fit();
    source->shards_[s]->indexed.store(true, std::memory_order_release);
    source->shard_begin_.push_back(source->shard_begin_.back() +
                                   static_cast<int64_t>(table.samples.size()));
  }
  source->shard_paths_ = std::move(shards);
  if (source->size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset.webdataset.shards (", stats.shards, " shards, ", stats.members,
        " files) hold no sample with an image member '<basename>.", image_key,
        "'; check dataset.webdataset.image_key and that the shards are WebDataset tars"));
  }
  if (stats.samples_without_image > 0 || stats.members_ignored > 0) {
    FERRY_LOG(WARNING) << "webdataset: " << stats.samples_without_image << " samples without a '"
                       << image_key << "' member skipped, " << stats.members_ignored
                       << " files ignored (no extension, or a repeated one within a sample)";
  }
  return source;
}

WebDatasetSource::WebDatasetSource(const ImageTransform& transform, const DecodeLimits& limits,
                                   uint32_t shuffle_buffer, std::string image_key,
                                   std::string label_key, std::shared_ptr<const DatasetFs> fs)
    : transform_(transform),
      limits_(limits),
      shuffle_buffer_(shuffle_buffer),
      image_key_(std::move(image_key)),
      label_key_(std::move(label_key)),
      fs_(std::move(fs)),
      fields_(ImageSampleFields(transform_)) {}

std::unique_ptr<SampleSource::Scratch> WebDatasetSource::NewScratch() const {
  auto scratch = std::make_unique<WebDatasetScratch>();
  scratch->decoder.set_limits(limits_);
  return scratch;
}

size_t WebDatasetSource::ShardOf(int64_t index) const {
  return static_cast<size_t>(std::upper_bound(shard_begin_.begin(), shard_begin_.end(), index) -
                             shard_begin_.begin() - 1);
}

absl::string_view WebDatasetSource::NameOf(const ShardTable& table, size_t sample) const {
  const size_t begin = sample == 0 ? 0 : table.name_ends[sample - 1];
  return absl::string_view(table.names).substr(begin, table.name_ends[sample] - begin);
}

std::string WebDatasetSource::LabelName(const ShardTable& table, size_t sample) const {
  const absl::string_view image = NameOf(table, sample);
  const size_t slash = image.rfind('/');
  const size_t dot = image.find('.', slash == absl::string_view::npos ? 0 : slash + 1);
  const uint16_t spelling = table.samples[sample].label_spelling;
  return absl::StrCat(image.substr(0, dot), ".",
                      spelling == kNoLabel ? label_key_ : table.label_spellings[spelling]);
}

absl::StatusOr<const WebDatasetSource::ShardTable*> WebDatasetSource::TableOf(
    size_t shard_number) const {
  Shard& shard = *shards_[shard_number];
  if (!shard.indexed.load(std::memory_order_acquire)) {
    absl::MutexLock lock(&shard.mutex);
    if (!shard.indexed.load(std::memory_order_relaxed)) {
      absl::StatusOr<ShardTable> table = IndexShard(shard.path, image_key_, label_key_, *fs_);
      // A condition of the machine may pass: the next Fill indexes the shard again.
      if (!table.ok() && IsTransientReadError(table.status())) return table.status();
      const uint64_t expected =
          static_cast<uint64_t>(shard_begin_[shard_number + 1] - shard_begin_[shard_number]);
      if (!table.ok()) {
        shard.error = StopsTheJob(table.status());
      } else if (table->samples.size() > expected ||
                 (table->samples.size() < expected && !table->truncated)) {
        shard.error = StopsTheJob(absl::FailedPreconditionError(absl::StrCat(
            "webdataset shard '", shard.path, "' holds ", table->samples.size(),
            " samples, but dataset.webdataset.shard_samples (from its shard index) says ", expected,
            ": the index is of other shards or of an earlier version of this one. "
            "Make the index again (widsindex create), or give dataset.webdataset.shards "
            "without it")));
      } else {
        // One line for a shard that holds something odd, not one for each of thousands.
        if (table->stats.samples_without_image > 0 || table->stats.members_ignored > 0) {
          FERRY_LOG(WARNING) << "webdataset shard '" << shard.path << "': " << table->samples.size()
                             << " samples, " << table->stats.samples_without_image << " without a '"
                             << image_key_ << "' member, " << table->stats.members_ignored
                             << " files ignored (no extension, or a repeated one)";
        }
        shard.table = *std::move(table);
      }
      shard.indexed.store(true, std::memory_order_release);
    }
  }
  if (!shard.error.ok()) return shard.error;
  return &shard.table;
}

std::string WebDatasetSource::FileOf(int64_t index) const {
  if (index < 0 || index >= size()) return {};
  return shard_paths_[ShardOf(index)];
}

std::string WebDatasetSource::Describe(int64_t index) const {
  if (index < 0 || index >= size()) {
    return absl::StrCat("webdataset sample ", index, " (out of range; ", size(), " samples)");
  }
  const size_t s = ShardOf(index);
  const Shard& shard = *shards_[s];
  const size_t sample = static_cast<size_t>(index - shard_begin_[s]);
  if (shard.indexed.load(std::memory_order_acquire) && shard.error.ok() &&
      sample < shard.table.samples.size()) {
    return absl::StrCat(shard.path, ":", NameOf(shard.table, sample));
  }
  return absl::StrCat(shard.path, ": sample ", sample);
}

absl::Status WebDatasetSource::Fill(int64_t index, uint64_t sample_seed,
                                    absl::Span<uint8_t* const> rows, Scratch* scratch) const {
  if (index < 0 || index >= size()) {
    return absl::OutOfRangeError(
        absl::StrCat("sample index ", index, " is outside [0, ", size(), ") of the webdataset"));
  }
  if (rows.size() != fields_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Fill needs ", fields_.size(), " rows (image, label, index), got ", rows.size()));
  }
  auto* s = dynamic_cast<WebDatasetScratch*>(scratch);
  if (s == nullptr) {
    return absl::InvalidArgumentError("Fill needs a Scratch from this source's NewScratch()");
  }
  const size_t shard_number = ShardOf(index);
  const std::string& shard = shard_paths_[shard_number];
  FERRY_ASSIGN_OR_RETURN(const ShardTable* table, TableOf(shard_number));
  const size_t local = static_cast<size_t>(index - shard_begin_[shard_number]);
  if (local >= table->samples.size()) {
    return absl::DataLossError(absl::StrCat("'", Describe(index), "' is lost: webdataset shard '",
                                            shard, "' is cut short after its sample ",
                                            table->samples.size()));
  }
  const Sample& sample = table->samples[local];
  if (!sample.has_image) {
    return absl::DataLossError(absl::StrCat("'", Describe(index), "' has no '", image_key_,
                                            "' member (dataset.webdataset.image_key)"));
  }
  const bool has_label = sample.label_spelling != kNoLabel;
  if (sample.image_size == 0) {
    return absl::DataLossError(absl::StrCat("'", Describe(index), "' is empty"));
  }
  if (limits_.max_sample_bytes > 0 && sample.image_size > limits_.max_sample_bytes) {
    return absl::DataLossError(absl::StrCat("refused '", Describe(index), "': ", sample.image_size,
                                            " bytes, over decode_limits.max_sample_bytes (",
                                            limits_.max_sample_bytes, ")"));
  }
  if (has_label && sample.label_size > kMaxLabelBytes) {
    return absl::DataLossError(absl::StrCat("'", shard, ":", LabelName(*table, local), "' is ",
                                            sample.label_size,
                                            " bytes; a label is the decimal "
                                            "text of a class number"));
  }

  if (s->shard != static_cast<int64_t>(shard_number)) {
    s->file.reset();
    s->shard = -1;
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> opened = fs_->OpenFile(shard);
    if (!opened.ok()) {
      return absl::Status(opened.status().code(), absl::StrCat("cannot read '", Describe(index),
                                                               "': ", opened.status().message()));
    }
    // The members' offsets are the indexed file's: another file renamed over the shard's
    // path (or the shard rewritten in place) would give other bytes at them.
    const FileIdentity& indexed = table->identity;
    if (!((*opened)->identity() == indexed)) {
      return absl::DataLossError(
          absl::StrCat("cannot read '", Describe(index), "': webdataset shard '", shard,
                       "' was replaced or rewritten after the job indexed it (", indexed.size,
                       " bytes then, ", (*opened)->size(),
                       " bytes now); delete the job and create it "
                       "again to index the shard anew"));
    }
    s->file = *std::move(opened);
    s->shard = static_cast<int64_t>(shard_number);
  }
  // One read when the label lies next to the image (either side), two otherwise.
  uint64_t begin = sample.image_offset;
  uint64_t end = sample.image_offset + sample.image_size;
  const uint64_t label_end = sample.label_offset + sample.label_size;
  const bool together =
      has_label && std::max(end, label_end) - std::min(begin, sample.label_offset) <=
                       sample.image_size + sample.label_size + kMaxReadGap;
  if (together) {
    begin = std::min(begin, sample.label_offset);
    end = std::max(end, label_end);
  }
  const uint64_t span = end - begin + (has_label && !together ? sample.label_size : 0);
  if (s->buffer.size() < span) s->buffer.resize(span);
  absl::Status read = ReadExactly(*s->file, begin, s->buffer.data(), end - begin);
  if (!read.ok()) return ReadError(read, Describe(index));
  const uint8_t* image = s->buffer.data() + (sample.image_offset - begin);
  const uint8_t* label_bytes = nullptr;
  if (has_label) {
    if (together) {
      label_bytes = s->buffer.data() + (sample.label_offset - begin);
    } else {
      uint8_t* tail = s->buffer.data() + (end - begin);
      read = ReadExactly(*s->file, sample.label_offset, tail, sample.label_size);
      if (!read.ok()) return ReadError(read, absl::StrCat(shard, ":", LabelName(*table, local)));
      label_bytes = tail;
    }
  }

  int64_t label = -1;
  if (has_label) {
    const absl::string_view text(reinterpret_cast<const char*>(label_bytes), sample.label_size);
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &label)) {
      return absl::DataLossError(absl::StrCat("'", shard, ":", LabelName(*table, local),
                                              "' is not a decimal integer label: \"",
                                              absl::CEscape(text.substr(0, 32)), "\""));
    }
  }
  absl::Status decoded =
      TransformImageSample(s->decoder, s->compose, absl::MakeConstSpan(image, sample.image_size),
                           transform_, sample_seed, fields_, rows, s->gpu_batch);
  if (!decoded.ok()) {
    // The transform and the row size were validated, so what is left is the member's content.
    const absl::StatusCode code = decoded.code() == absl::StatusCode::kInvalidArgument
                                      ? absl::StatusCode::kDataLoss
                                      : decoded.code();
    return absl::Status(code,
                        absl::StrCat("cannot decode '", Describe(index), "': ", decoded.message()));
  }
  std::memcpy(rows[1], &label, sizeof(label));
  std::memcpy(rows[2], &index, sizeof(index));
  return absl::OkStatus();
}

void WebDatasetSource::StreamOrder(uint64_t seed, int64_t epoch, bool shuffle,
                                   std::vector<int64_t>* order) const {
  const int64_t n = size();
  order->resize(static_cast<size_t>(n));
  if (!shuffle) {
    std::iota(order->begin(), order->end(), int64_t{0});
    return;
  }
  // Shards: Fisher-Yates from the back, as the Sampler permutes samples.
  const size_t num_shards = shard_paths_.size();
  std::vector<uint32_t> shard_order(num_shards);
  std::iota(shard_order.begin(), shard_order.end(), uint32_t{0});
  Rng shard_rng(MixSeed(seed, static_cast<uint64_t>(epoch), kShardOrderStream));
  for (size_t i = num_shards; i > 1; --i) {
    std::swap(shard_order[i - 1], shard_order[shard_rng.Below(i)]);
  }
  size_t out = 0;
  for (uint32_t s : shard_order) {
    for (int64_t i = shard_begin_[s]; i < shard_begin_[s + 1]; ++i) (*order)[out++] = i;
  }
  if (shuffle_buffer_ <= 1) return;

  // The shuffle buffer, in place: the write position never passes the read position, which
  // runs shuffle_buffer_ ahead once the buffer is full.
  Rng buffer_rng(MixSeed(seed, static_cast<uint64_t>(epoch), kShuffleBufferStream));
  const size_t capacity = std::min<size_t>(shuffle_buffer_, static_cast<size_t>(n));
  std::vector<int64_t> buffer;
  buffer.reserve(capacity);
  size_t write = 0;
  for (size_t read = 0; read < static_cast<size_t>(n); ++read) {
    const int64_t incoming = (*order)[read];
    if (buffer.size() < capacity) {
      buffer.push_back(incoming);
      continue;
    }
    const size_t pick = static_cast<size_t>(buffer_rng.Below(capacity));
    (*order)[write++] = buffer[pick];
    buffer[pick] = incoming;
  }
  while (!buffer.empty()) {
    const size_t pick = static_cast<size_t>(buffer_rng.Below(buffer.size()));
    (*order)[write++] = buffer[pick];
    buffer[pick] = buffer.back();
    buffer.pop_back();
  }
}

}  // namespace ferry
