#include "server/dataset/token_source.h"

#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/streaming_copy.h"
#include "server/dataset/token_convert.h"
#include "server/dataset/token_file_check.h"

namespace ferry {
namespace {

using ferry::v1::DType;

class NoScratch final : public SampleSource::Scratch {};

}  // namespace

absl::StatusOr<std::unique_ptr<TokenSource>> TokenSource::Create(
    const ferry::v1::TokensDataset& spec, bool raw, const DatasetFs& fs) {
  if (spec.path().empty()) {
    return absl::InvalidArgumentError("dataset.tokens.path must be set to the token file");
  }
  if (spec.seq_len() == 0) {
    return absl::InvalidArgumentError(
        "dataset.tokens.seq_len must be at least 1 (got 0); a sample is seq_len + 1 tokens");
  }
  FERRY_ASSIGN_OR_RETURN(
      const TokenDtypes dtypes,
      CheckTokenDtypes("dataset.tokens", spec.token_dtype(), spec.output_dtype()));
  const size_t token_bytes = dtypes.token_bytes;
  const DType output = dtypes.output;
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, fs.MapFileInRanges(spec.path()));
  FERRY_RETURN_IF_ERROR(CheckMappedLooksLikeTokens("token file", *file));
  const size_t bytes = file->bytes().size();
  if (bytes % token_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file '", spec.path(), "' is ", bytes, " bytes, not a multiple of ",
                     token_bytes, " (the size of dataset.tokens.token_dtype ",
                     ferry::v1::DType_Name(spec.token_dtype()), "); is token_dtype right?"));
  }
  const int64_t num_tokens = static_cast<int64_t>(bytes / token_bytes);
  const int64_t seq_len = spec.seq_len();
  if (num_tokens < seq_len + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "token file '", spec.path(), "' holds ", num_tokens, " tokens, fewer than one sample (",
        "dataset.tokens.seq_len + 1 = ", seq_len + 1,
        " tokens); lower seq_len or use a longer file"));
  }
  const int64_t num_samples = (num_tokens - 1) / seq_len;
  if (raw && token_bytes == 4 && output == ferry::v1::INT32) {
    return absl::InvalidArgumentError(
        "raw tokens cannot deliver UINT32 as INT32 (the range check runs on the host)");
  }
  return std::unique_ptr<TokenSource>(
      new TokenSource(std::move(file), token_bytes, output, seq_len, num_samples, raw));
}

TokenSource::TokenSource(std::shared_ptr<const MappedFile> file, size_t token_bytes,
                         DType output_dtype, int64_t seq_len, int64_t num_samples, bool raw)
    : file_(std::move(file)),
      token_bytes_(token_bytes),
      output_dtype_(output_dtype),
      seq_len_(seq_len),
      num_samples_(num_samples),
      raw_(raw) {
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

std::unique_ptr<SampleSource::Scratch> TokenSource::NewScratch() const {
  return std::make_unique<NoScratch>();
}

absl::Status TokenSource::Fill(int64_t index, uint64_t sample_seed, absl::Span<uint8_t* const> rows,
                               Scratch* scratch) const {
  if (index < 0 || index >= num_samples_) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " is outside [0, ",
                                              num_samples_, ") of '", file_->path(), "'"));
  }
  if (rows.size() != fields_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fill needs ", fields_.size(), " rows (tokens, index), got ", rows.size()));
  }
  const int64_t count = seq_len_ + 1;
  const uint8_t* src = file_->bytes().data() + static_cast<size_t>(index * seq_len_) * token_bytes_;
  int64_t overflow = -1;
  uint32_t overflow_value = 0;
  FERRY_RETURN_IF_ERROR(file_->Read(src, static_cast<size_t>(count) * token_bytes_, [&] {
    if (raw_) {
      // Raw rows are for GPU jobs only: streaming stores (RowStores::kStreaming says why).
      StreamingCopy(rows[0], src, static_cast<size_t>(count) * token_bytes_);
    } else {
      overflow = token_bytes_ == 2 ? ConvertTokensTo<uint16_t>(output_dtype_, src, count, rows[0])
                                   : ConvertTokensTo<uint32_t>(output_dtype_, src, count, rows[0]);
      if (overflow >= 0) overflow_value = LoadLittleEndian<uint32_t>(src + overflow * token_bytes_);
    }
  }));
  if (overflow >= 0) {
    const int64_t token = index * seq_len_ + overflow;
    return absl::DataLossError(
        absl::StrCat("token ", token, " of '", file_->path(), "' (value ", overflow_value,
                     ") does not fit dataset.tokens.output_dtype INT32; use INT64"));
  }
  std::memcpy(rows[1], &index, sizeof(index));
  return absl::OkStatus();
}

void TokenSource::RangesOf(int64_t index, std::vector<MappedRange>* ranges) const {
  if (!file_->read_in_ranges() || index < 0 || index >= num_samples_) return;
  ranges->push_back(MappedRange{.file = file_,
                                .offset = static_cast<uint64_t>(index * seq_len_) * token_bytes_,
                                .length = static_cast<uint64_t>(seq_len_ + 1) * token_bytes_});
}

std::string TokenSource::Describe(int64_t index) const {
  return absl::StrCat(file_->path(), " tokens [", index * seq_len_, ", ",
                      index * seq_len_ + seq_len_ + 1, ")");
}

}  // namespace ferry
