#include "server/dataset/indexed_source.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/streaming_copy.h"
#include "server/dataset/token_convert.h"

namespace ferry {
namespace {

using ferry::v1::DType;

// Per thread: the window's document starts, and rows computed before they are streamed into
// a GPU job's slot.
class IndexedScratch final : public SampleSource::Scratch {
 public:
  std::vector<int64_t> starts;
  std::vector<IndexedSource::Segment> segments;
  std::vector<uint8_t> staging;
};

// Writes `bytes` computed at `src` into a slot row: streamed for a GPU job's slot
// (RowStores::kStreaming), a plain copy otherwise.
void StoreRow(RowStores stores, uint8_t* dst, const uint8_t* src, size_t bytes) {
  if (stores == RowStores::kStreaming) {
    StreamingCopy(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

// The position of the first negative little-endian int32 of `count` at `src`, or -1. One
// pass of ORs first (vectorised), the search only when one is there.
int64_t FirstNegative(const uint8_t* src, int64_t count) {
  uint32_t any = 0;
  for (int64_t i = 0; i < count; ++i) any |= LoadLittleEndian<uint32_t>(src + i * 4);
  if ((any >> 31) == 0) return -1;
  for (int64_t i = 0; i < count; ++i) {
    if (LoadLittleEndian<int32_t>(src + i * 4) < 0) return i;
  }
  return -1;
}

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

// Megatron-LM's DType codes (megatron/core/datasets/indexed_dataset.py).
const char* DTypeCodeName(uint8_t code) {
  static const char* const kNames[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                       "int64", "float64", "float32", "uint16"};
  return code < 9 ? kNames[code] : "unknown";
}

}  // namespace

absl::StatusOr<std::unique_ptr<IndexedSource>> IndexedSource::Create(
    const ferry::v1::IndexedDataset& spec, const DatasetFs& fs, const SourceOptions& options) {
  const bool device_widens = options.device_widens_tokens && !spec.widen_on_host();
  if (spec.path_prefix().empty()) {
    return absl::InvalidArgumentError(
        "dataset.indexed.path_prefix must be set to the files' path without .bin/.idx");
  }
  if (spec.seq_len() == 0) {
    return absl::InvalidArgumentError(
        "dataset.indexed.seq_len must be at least 1 (got 0); a sample is seq_len + 1 tokens");
  }
  DType output = spec.output_dtype();
  if (output == ferry::v1::DTYPE_UNSPECIFIED) output = ferry::v1::INT64;
  if (output != ferry::v1::INT64 && output != ferry::v1::INT32) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.indexed.output_dtype must be INT64 (the default) or INT32 (got ",
                     ferry::v1::DType_Name(output), ")"));
  }
  const std::string idx_path = spec.path_prefix() + ".idx";
  const std::string bin_path = spec.path_prefix() + ".bin";
  std::unique_ptr<IndexedSource> source(new IndexedSource());
  FERRY_ASSIGN_OR_RETURN(source->idx_, fs.MapFile(idx_path));
  FERRY_ASSIGN_OR_RETURN(source->bin_, fs.MapFile(bin_path));
  const absl::Span<const uint8_t> mapped = source->idx_->bytes();
  const std::string what = absl::StrCat("Megatron index '", idx_path, "'");
  if (mapped.size() < kIdxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", mapped.size(), " bytes, shorter than the ", kIdxHeaderBytes,
                     "-byte MMIDIDX header; is it a Megatron .idx, or was it cut short?"));
  }
  // The header is copied out of the mapping under its guard (the file may shrink under it),
  // and parsed from the copy.
  uint8_t header[kIdxHeaderBytes];
  FERRY_RETURN_IF_ERROR(
      source->idx_->Read([&] { std::memcpy(header, mapped.data(), kIdxHeaderBytes); }));
  const absl::Span<const uint8_t> idx(header, kIdxHeaderBytes);
  if (std::memcmp(idx.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     " does not start with the magic \"MMIDIDX\\0\\0\"; it is not a Megatron-LM "
                     "indexed dataset index (or an old lazy/cached format, which is not read)"));
  }
  const uint64_t version = LoadLittleEndian<uint64_t>(idx.data() + 9);
  if (version != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has version ", version, "; only version 1 (Megatron-LM's) is read"));
  }
  const uint8_t code = idx[17];
  if (code == 8) {
    source->token_bytes_ = 2;
  } else if (code == 4) {
    source->token_bytes_ = 4;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has token dtype code ", code, " (", DTypeCodeName(code),
                     "); token datasets are uint16 (code 8) or int32 (code 4)"));
  }
  const uint64_t sequences = LoadLittleEndian<uint64_t>(idx.data() + 18);
  const uint64_t documents = LoadLittleEndian<uint64_t>(idx.data() + 26);
  const uint64_t body = mapped.size() - kIdxHeaderBytes;
  // Checked one at a time so that no product overflows: 12 bytes per sequence (length and
  // pointer), 8 per document index, and optionally 1 per sequence (multimodal modes).
  const bool fits = sequences <= body / 12 && documents <= (body - sequences * 12) / 8;
  const uint64_t expected = fits ? kIdxHeaderBytes + sequences * 12 + documents * 8 : 0;
  if (!fits || (mapped.size() != expected && mapped.size() != expected + sequences)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", mapped.size(), " bytes, but its header's ", sequences, " sequences and ",
        documents, " document indices need ",
        fits ? absl::StrCat(expected, " (or ", expected + sequences, " with sequence modes)")
             : std::string("more"),
        "; the index is truncated or corrupt: rebuild it"));
  }
  source->num_sequences_ = static_cast<int64_t>(sequences);
  source->num_documents_ = static_cast<int64_t>(documents);
  if (sequences == 0) {
    return absl::FailedPreconditionError(absl::StrCat(what, " holds no sequence"));
  }
  // The entries checked here, read under the mapping's guard.
  const int64_t last = source->num_sequences_ - 1;
  int64_t first_document = 0, last_document = 0, first_pointer = 0, last_pointer = 0,
          last_length = 0;
  FERRY_RETURN_IF_ERROR(source->idx_->Read([&] {
    if (documents > 0) {
      first_document = source->DocumentIndex(0);
      last_document = source->DocumentIndex(source->num_documents_ - 1);
    }
    first_pointer = source->SequencePointer(0);
    last_pointer = source->SequencePointer(last);
    last_length = source->SequenceLength(last);
  }));
  if (documents < 2 || first_document != 0 || last_document != source->num_sequences_) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, "'s document indices must run from 0 to its sequence count ", sequences, " (got ",
        documents, " entries",
        documents > 0 ? absl::StrCat(", first ", first_document, ", last ", last_document) : "",
        "); the index is corrupt: rebuild it"));
  }
  const int64_t bin_bytes = static_cast<int64_t>(source->bin_->bytes().size());
  if (first_pointer != 0 || last_pointer < 0 || last_length < 0 || last_pointer > bin_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        " is corrupt: its sequences must start at byte 0 of the .bin and lie within it "
        "(first pointer ",
        first_pointer, ", last pointer ", last_pointer, ", last length ", last_length,
        ", .bin bytes ", bin_bytes, "); rebuild it"));
  }
  source->used_bytes_ = last_pointer + last_length * static_cast<int64_t>(source->token_bytes_);
  if (source->used_bytes_ > bin_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Megatron data '", bin_path, "' is ", bin_bytes, " bytes, but its index '", idx_path,
        "' needs ", source->used_bytes_, "; the .bin is truncated (or belongs to another .idx)"));
  }
  source->seq_len_ = spec.seq_len();
  const int64_t tokens = source->used_bytes_ / static_cast<int64_t>(source->token_bytes_);
  if (tokens < source->seq_len_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Megatron dataset '", spec.path_prefix(), "' holds ", tokens,
        " tokens, fewer than one sample (dataset.indexed.seq_len + 1 = ", source->seq_len_ + 1,
        "); lower seq_len"));
  }
  source->num_samples_ = (tokens - 1) / source->seq_len_;
  source->output_dtype_ = output;
  source->row_stores_ = options.row_stores;
  const int64_t n = source->seq_len_ + 1;
  const size_t out_bytes = DTypeSize(output);
  const DType file_dtype = source->token_bytes_ == 2 ? ferry::v1::UINT16 : ferry::v1::INT32;
  source->raw_ = device_widens && file_dtype != output;
  const DType row_dtype = source->raw_ ? file_dtype : output;
  source->fields_.push_back(
      FieldLayout{.name = "tokens",
                  .dtype = row_dtype,
                  .shape = {n},
                  .row_bytes = static_cast<size_t>(n) * DTypeSize(row_dtype),
                  .device_dtype = source->raw_ ? output : ferry::v1::DTYPE_UNSPECIFIED});
  if (spec.position_ids()) {
    source->position_field_ = static_cast<int>(source->fields_.size());
    source->fields_.push_back(FieldLayout{.name = "position_ids",
                                          .dtype = output,
                                          .shape = {n},
                                          .row_bytes = static_cast<size_t>(n) * out_bytes});
  }
  if (spec.cu_seqlens()) {
    source->cu_field_ = static_cast<int>(source->fields_.size());
    source->fields_.push_back(FieldLayout{.name = "cu_seqlens",
                                          .dtype = ferry::v1::INT32,
                                          .shape = {n},
                                          .row_bytes = static_cast<size_t>(n) * 4});
    source->count_field_ = static_cast<int>(source->fields_.size());
    source->fields_.push_back(
        FieldLayout{.name = "num_seqs", .dtype = ferry::v1::INT32, .shape = {}, .row_bytes = 4});
  }
  source->index_field_ = static_cast<int>(source->fields_.size());
  source->fields_.push_back(
      FieldLayout{.name = "index", .dtype = ferry::v1::INT64, .shape = {}, .row_bytes = 8});
  return source;
}

int64_t IndexedSource::SequenceLength(int64_t s) const {
  return LoadLittleEndian<int32_t>(idx_->bytes().data() + kIdxHeaderBytes + s * 4);
}

int64_t IndexedSource::SequencePointer(int64_t s) const {
  return LoadLittleEndian<int64_t>(idx_->bytes().data() + kIdxHeaderBytes + num_sequences_ * 4 +
                                   s * 8);
}

int64_t IndexedSource::DocumentIndex(int64_t d) const {
  return LoadLittleEndian<int64_t>(idx_->bytes().data() + kIdxHeaderBytes + num_sequences_ * 12 +
                                   d * 8);
}

bool IndexedSource::SequenceFits(int64_t s) const {
  const int64_t pointer = SequencePointer(s);
  const int64_t length = SequenceLength(s);
  const int64_t next = s + 1 < num_sequences_ ? SequencePointer(s + 1) : used_bytes_;
  return length >= 0 && pointer >= 0 && pointer <= used_bytes_ &&
         pointer + length * static_cast<int64_t>(token_bytes_) == next;
}

IndexedSource::IndexFault IndexedSource::Misfit(int64_t s) const {
  return {IndexFault::Kind::kSequence, s, SequencePointer(s), SequenceLength(s),
          s + 1 < num_sequences_ ? SequencePointer(s + 1) : used_bytes_};
}

IndexedSource::IndexFault IndexedSource::PlanWindow(int64_t first, int64_t n,
                                                    std::vector<Segment>& segments,
                                                    std::vector<int64_t>& starts) const {
  using Kind = IndexFault::Kind;
  const int64_t byte = first * static_cast<int64_t>(token_bytes_);
  // The last sequence whose pointer is <= byte (empty sequences share the next one's).
  int64_t lo = 0, hi = num_sequences_;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (SequencePointer(mid) <= byte) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  if (!SequenceFits(lo)) return Misfit(lo);
  if (byte < SequencePointer(lo) ||
      byte >= SequencePointer(lo) + SequenceLength(lo) * static_cast<int64_t>(token_bytes_)) {
    return {Kind::kNotIncreasing, lo, 0, 0, 0};
  }
  int64_t s = lo;
  int64_t offset = first - SequencePointer(s) / static_cast<int64_t>(token_bytes_);
  segments.clear();
  starts.assign(1, 0);
  int64_t document_cursor = -1;  // StartsDocument's place in the document index
  int64_t pos = 0;
  while (pos < n) {
    if (s >= num_sequences_) return {Kind::kEnds, first + pos, 0, 0, 0};
    if (!SequenceFits(s)) return Misfit(s);
    if (offset == 0 && pos > 0 && starts.back() != pos && StartsDocument(s, &document_cursor)) {
      starts.push_back(pos);
    }
    const int64_t count = std::min(n - pos, SequenceLength(s) - offset);
    if (count > 0) {
      segments.push_back(
          Segment{SequencePointer(s) + offset * static_cast<int64_t>(token_bytes_), count});
    }
    pos += count;
    offset = 0;
    ++s;
  }
  return {};
}

absl::Status IndexedSource::FaultStatus(const IndexFault& fault) const {
  switch (fault.kind) {
    case IndexFault::Kind::kNone:
      return absl::OkStatus();
    case IndexFault::Kind::kSequence:
      return absl::DataLossError(absl::StrCat(
          "Megatron index '", idx_->path(), "' is corrupt at sequence ", fault.at, " (pointer ",
          fault.pointer, ", length ", fault.length, ", next pointer ", fault.next,
          "): sequences must follow each other in the .bin, as Megatron-LM's builder writes "
          "them; rebuild the index"));
    case IndexFault::Kind::kNotIncreasing:
      return absl::DataLossError(absl::StrCat("Megatron index '", idx_->path(),
                                              "' is corrupt: its sequence pointers are not "
                                              "increasing near sequence ",
                                              fault.at, "; rebuild the index"));
    case IndexFault::Kind::kEnds:
      return absl::DataLossError(
          absl::StrCat("Megatron index '", idx_->path(), "' ends before token ", fault.at));
  }
  return absl::InternalError("unknown index fault");
}

bool IndexedSource::StartsDocument(int64_t s, int64_t* cursor) const {
  if (*cursor >= 0) {
    // Walking forward from the previous answer: the entries only grow, and a window's
    // sequences come in order, so this is one or two steps.
    while (*cursor < num_documents_ && DocumentIndex(*cursor) < s) ++*cursor;
    return *cursor < num_documents_ && DocumentIndex(*cursor) == s;
  }
  int64_t lo = 0, hi = num_documents_;  // first entry >= s
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (DocumentIndex(mid) < s) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  *cursor = lo;
  return lo < num_documents_ && DocumentIndex(lo) == s;
}

std::unique_ptr<SampleSource::Scratch> IndexedSource::NewScratch() const {
  return std::make_unique<IndexedScratch>();
}

absl::Status IndexedSource::Fill(int64_t index, uint64_t sample_seed,
                                 absl::Span<uint8_t* const> rows, Scratch* scratch) const {
  if (index < 0 || index >= num_samples_) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " is outside [0, ",
                                              num_samples_, ") of '", bin_->path(), "'"));
  }
  if (rows.size() != fields_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fill needs ", fields_.size(), " rows, got ", rows.size()));
  }
  const int64_t n = seq_len_ + 1;
  const size_t out_bytes = raw_ ? token_bytes_ : DTypeSize(output_dtype_);
  const int64_t first = index * seq_len_;
  IndexedScratch& own = *static_cast<IndexedScratch*>(scratch);
  std::vector<int64_t>& starts = own.starts;
  std::vector<Segment>& segments = own.segments;
  // The walk through the .idx runs under its mapping's guard (a file truncated under the job
  // ends it with DatasetChangedError), so it may not allocate: room for a window whose
  // every token is a sequence of its own.
  starts.reserve(static_cast<size_t>(n) + 1);
  segments.reserve(static_cast<size_t>(n) + 1);
  IndexFault fault;
  FERRY_RETURN_IF_ERROR(idx_->Read([&] { fault = PlanWindow(first, n, segments, starts); }));
  if (fault.kind != IndexFault::Kind::kNone) return FaultStatus(fault);
  int64_t pos = 0;
  for (const Segment& segment : segments) {
    const int64_t count = segment.tokens;
    const uint8_t* src = bin_->bytes().data() + segment.byte;
    uint8_t* dst = rows[0] + static_cast<size_t>(pos) * out_bytes;
    int64_t overflow = -1;
    int32_t overflow_value = 0;
    FERRY_RETURN_IF_ERROR(bin_->Read([&] {
      if (raw_) {
        // Copied as the file holds them (streamed: raw rows are a GPU job's); int32 ids are
        // still checked, none may be negative.
        if (token_bytes_ == 4) overflow = FirstNegative(src, count);
        if (overflow < 0) StreamingCopy(dst, src, static_cast<size_t>(count) * token_bytes_);
      } else {
        overflow = token_bytes_ == 2 ? ConvertTokensTo<uint16_t>(output_dtype_, src, count, dst)
                                     : ConvertTokensTo<int32_t>(output_dtype_, src, count, dst);
      }
      if (overflow >= 0) {
        overflow_value =
            LoadLittleEndian<int32_t>(src + overflow * static_cast<int64_t>(token_bytes_));
      }
    }));
    if (overflow >= 0) {
      return absl::DataLossError(absl::StrCat(
          "token ", first + pos + overflow, " of Megatron data '", bin_->path(), "' (value ",
          overflow_value, ") is negative or does not fit dataset.indexed.output_dtype ",
          ferry::v1::DType_Name(output_dtype_)));
    }
    pos += count;
  }
  // The computed rows go through `staging`, then into the slot as the job's rows want.
  if (position_field_ >= 0 && rows[position_field_] != nullptr) {
    const size_t bytes = fields_[position_field_].row_bytes;
    own.staging.resize(bytes);
    uint8_t* out = own.staging.data();
    size_t segment = 0;
    for (int64_t p = 0; p < n; ++p) {
      while (segment + 1 < starts.size() && starts[segment + 1] <= p) ++segment;
      const int64_t id = p - starts[segment];
      if (output_dtype_ == ferry::v1::INT64) {
        std::memcpy(out + p * 8, &id, 8);
      } else {
        const int32_t id32 = static_cast<int32_t>(id);
        std::memcpy(out + p * 4, &id32, 4);
      }
    }
    StoreRow(row_stores_, rows[position_field_], out, bytes);
  }
  if (cu_field_ >= 0) {
    // FlashAttention's varlen boundaries of the seq_len inputs: a document starting at the
    // last position (a target only) is no segment of the inputs.
    const size_t bytes = fields_[cu_field_].row_bytes;
    own.staging.resize(bytes);
    uint8_t* out = own.staging.data();
    int32_t count = 0;
    for (int64_t p = 0; p < n; ++p) {
      int32_t value = static_cast<int32_t>(seq_len_);
      if (static_cast<size_t>(p) < starts.size() && starts[p] < seq_len_) {
        value = static_cast<int32_t>(starts[p]);
        count = static_cast<int32_t>(p + 1);
      }
      std::memcpy(out + p * 4, &value, 4);
    }
    StoreRow(row_stores_, rows[cu_field_], out, bytes);
    std::memcpy(rows[count_field_], &count, 4);
  }
  std::memcpy(rows[index_field_], &index, sizeof(index));
  return absl::OkStatus();
}

std::string IndexedSource::Describe(int64_t index) const {
  return absl::StrCat(bin_->path(), " packed tokens [", index * seq_len_, ", ",
                      index * seq_len_ + seq_len_ + 1, ")");
}

}  // namespace ferry
