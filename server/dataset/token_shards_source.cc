#include "server/dataset/token_shards_source.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/streaming_copy.h"
#include "server/dataset/shard_pattern.h"
#include "server/dataset/token_convert.h"
#include "server/dataset/token_file_check.h"

namespace ferry {
namespace {

using ferry::v1::DType;

class NoScratch final : public SampleSource::Scratch {};

}  // namespace

absl::StatusOr<std::unique_ptr<TokenShardsSource>> TokenShardsSource::Create(
    const ferry::v1::TokenShardsDataset& spec, bool raw, const DatasetFs& fs) {
  if (spec.shards().empty()) {
    return absl::InvalidArgumentError(
        "dataset.token_shards.shards must list at least one token file or brace pattern");
  }
  if (spec.seq_len() == 0) {
    return absl::InvalidArgumentError(
        "dataset.token_shards.seq_len must be at least 1 (got 0); a sample is seq_len + 1 "
        "tokens");
  }
  FERRY_ASSIGN_OR_RETURN(
      const TokenDtypes dtypes,
      CheckTokenDtypes("dataset.token_shards", spec.token_dtype(), spec.output_dtype()));
  const size_t token_bytes = dtypes.token_bytes;
  const DType output = dtypes.output;
  if (raw && token_bytes == 4 && output == ferry::v1::INT32) {
    return absl::InvalidArgumentError(
        "raw tokens cannot deliver UINT32 as INT32 (the range check runs on the host)");
  }
  // Bounded before any name is made: a pattern of a million names costs nothing.
  FERRY_ASSIGN_OR_RETURN(
      std::vector<std::string> paths,
      ExpandShardPatterns({spec.shards().begin(), spec.shards().end()}, kMaxShards));
  const int64_t seq_len = spec.seq_len();
  std::vector<Shard> shards;
  shards.reserve(paths.size());
  int64_t total_tokens = 0;
  int64_t total_windows = 0;
  for (const std::string& path : paths) {
    if (path.empty()) {
      return absl::InvalidArgumentError("dataset.token_shards.shards holds an empty path");
    }
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, fs.MapFileInRanges(path));
    FERRY_RETURN_IF_ERROR(CheckMappedLooksLikeTokens("token shard", *file));
    const size_t bytes = file->bytes().size();
    if (bytes % token_bytes != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("token shard '", path, "' is ", bytes, " bytes, not a multiple of ",
                       token_bytes, " (the size of dataset.token_shards.token_dtype ",
                       ferry::v1::DType_Name(spec.token_dtype()),
                       "); is token_dtype right, or was the shard cut short?"));
    }
    Shard shard;
    shard.file = std::move(file);
    shard.tokens = static_cast<int64_t>(bytes / token_bytes);
    shard.first_token = total_tokens;
    shard.first_window = total_windows;
    total_tokens += shard.tokens;
    if (shard.tokens > seq_len) total_windows += (shard.tokens - 1) / seq_len;
    shards.push_back(std::move(shard));
  }
  const int64_t num_samples = spec.windows_cross_files()
                                  ? (total_tokens > seq_len ? (total_tokens - 1) / seq_len : 0)
                                  : total_windows;
  if (num_samples == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", paths.size(), " token shards of dataset.token_shards.shards (first '", paths[0],
        "') hold ", total_tokens, " tokens and no whole sample of seq_len + 1 = ", seq_len + 1,
        " tokens", spec.windows_cross_files() ? "" : " within one shard",
        "; lower seq_len, use longer shards",
        spec.windows_cross_files() ? "" : " or set windows_cross_files"));
  }
  return std::unique_ptr<TokenShardsSource>(
      new TokenShardsSource(std::move(shards), token_bytes, output, seq_len,
                            spec.windows_cross_files(), num_samples, raw));
}

TokenShardsSource::TokenShardsSource(std::vector<Shard> shards, size_t token_bytes,
                                     DType output_dtype, int64_t seq_len, bool cross_files,
                                     int64_t num_samples, bool raw)
    : shards_(std::move(shards)),
      token_bytes_(token_bytes),
      output_dtype_(output_dtype),
      seq_len_(seq_len),
      cross_files_(cross_files),
      num_samples_(num_samples),
      raw_(raw),
      reads_in_ranges_(std::any_of(shards_.begin(), shards_.end(),
                                   [](const Shard& s) { return s.file->read_in_ranges(); })) {
  const DType row_dtype =
      raw ? (token_bytes == 2 ? ferry::v1::UINT16 : ferry::v1::UINT32) : output_dtype;
  fields_.push_back(
      FieldLayout{.name = "tokens",
                  .dtype = row_dtype,
                  .shape = {seq_len + 1},
                  .row_bytes = static_cast<size_t>(seq_len + 1) * DTypeSize(row_dtype),
                  .device_dtype = raw ? output_dtype : ferry::v1::DTYPE_UNSPECIFIED});
  fields_.push_back(
      FieldLayout{.name = "index", .dtype = ferry::v1::INT64, .shape = {}, .row_bytes = 8});
}

std::unique_ptr<SampleSource::Scratch> TokenShardsSource::NewScratch() const {
  return std::make_unique<NoScratch>();
}

TokenShardsSource::Location TokenShardsSource::Locate(int64_t index) const {
  // The last shard starting at or before the position; shards without windows (or tokens)
  // share their start with the next one, so they are never the answer for an index in range.
  if (cross_files_) {
    const int64_t token = index * seq_len_;
    auto it = std::upper_bound(shards_.begin(), shards_.end(), token,
                               [](int64_t t, const Shard& s) { return t < s.first_token; });
    const size_t shard = static_cast<size_t>(it - shards_.begin()) - 1;
    return Location{shard, token - shards_[shard].first_token};
  }
  auto it = std::upper_bound(shards_.begin(), shards_.end(), index,
                             [](int64_t i, const Shard& s) { return i < s.first_window; });
  const size_t shard = static_cast<size_t>(it - shards_.begin()) - 1;
  return Location{shard, (index - shards_[shard].first_window) * seq_len_};
}

absl::Status TokenShardsSource::Fill(int64_t index, uint64_t sample_seed,
                                     absl::Span<uint8_t* const> rows, Scratch* scratch) const {
  if (index < 0 || index >= num_samples_) {
    return absl::OutOfRangeError(
        absl::StrCat("sample index ", index, " is outside [0, ", num_samples_, ") of ",
                     shards_.size(), " token shards (first '", shards_[0].file->path(), "')"));
  }
  if (rows.size() != fields_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fill needs ", fields_.size(), " rows (tokens, index), got ", rows.size()));
  }
  const size_t out_bytes = raw_ ? token_bytes_ : DTypeSize(output_dtype_);
  Location at = Locate(index);
  int64_t remaining = seq_len_ + 1;
  uint8_t* dst = rows[0];
  // One piece per shard the window touches: one without windows_cross_files.
  while (remaining > 0) {
    const Shard& shard = shards_[at.shard];
    const int64_t count = std::min(remaining, shard.tokens - at.token);
    const uint8_t* src = shard.file->bytes().data() + static_cast<size_t>(at.token) * token_bytes_;
    int64_t overflow = -1;
    uint32_t overflow_value = 0;
    FERRY_RETURN_IF_ERROR(shard.file->Read(src, static_cast<size_t>(count) * token_bytes_, [&] {
      if (raw_) {
        // Raw rows are for GPU jobs only: streaming stores (RowStores::kStreaming says why).
        StreamingCopy(dst, src, static_cast<size_t>(count) * token_bytes_);
      } else {
        overflow = token_bytes_ == 2 ? ConvertTokensTo<uint16_t>(output_dtype_, src, count, dst)
                                     : ConvertTokensTo<uint32_t>(output_dtype_, src, count, dst);
        if (overflow >= 0) {
          overflow_value = LoadLittleEndian<uint32_t>(src + overflow * token_bytes_);
        }
      }
    }));
    if (overflow >= 0) {
      return absl::DataLossError(absl::StrCat(
          "token ", at.token + overflow, " of '", shard.file->path(), "' (value ", overflow_value,
          ") does not fit dataset.token_shards.output_dtype INT32; use INT64"));
    }
    dst += static_cast<size_t>(count) * out_bytes;
    remaining -= count;
    at = Location{at.shard + 1, 0};
  }
  std::memcpy(rows[1], &index, sizeof(index));
  return absl::OkStatus();
}

void TokenShardsSource::RangesOf(int64_t index, std::vector<MappedRange>* ranges) const {
  if (!reads_in_ranges_ || index < 0 || index >= num_samples_) return;
  // The pieces Fill reads.
  Location at = Locate(index);
  for (int64_t remaining = seq_len_ + 1; remaining > 0; at = Location{at.shard + 1, 0}) {
    const Shard& shard = shards_[at.shard];
    const int64_t count = std::min(remaining, shard.tokens - at.token);
    if (count > 0 && shard.file->read_in_ranges()) {
      ranges->push_back(MappedRange{.file = shard.file,
                                    .offset = static_cast<uint64_t>(at.token) * token_bytes_,
                                    .length = static_cast<uint64_t>(count) * token_bytes_});
    }
    remaining -= count;
  }
}

std::string TokenShardsSource::Describe(int64_t index) const {
  if (index < 0 || index >= num_samples_) return absl::StrCat("token shards sample ", index);
  const Location at = Locate(index);
  const Shard& shard = shards_[at.shard];
  const int64_t end = at.token + seq_len_ + 1;
  if (end <= shard.tokens) {
    return absl::StrCat(shard.file->path(), " tokens [", at.token, ", ", end, ")");
  }
  return absl::StrCat(shard.file->path(), " tokens [", at.token, ", ", shard.tokens,
                      ") and the next shards' first ", end - shard.tokens);
}

}  // namespace ferry
