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
  FERRY_ASSIGN_OR_RETURN(IndexedFiles files, IndexedFiles::Open(spec.path_prefix(), fs));
  std::unique_ptr<IndexedSource> source(new IndexedSource(std::move(files)));
  source->seq_len_ = spec.seq_len();
  const int64_t tokens =
      source->files_.used_bytes() / static_cast<int64_t>(source->files_.token_bytes());
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
  const DType file_dtype = source->files_.token_bytes() == 2 ? ferry::v1::UINT16 : ferry::v1::INT32;
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

IndexedSource::IndexFault IndexedSource::Misfit(int64_t s) const {
  return {IndexFault::Kind::kSequence, s, files_.SequencePointer(s), files_.SequenceLength(s),
          s + 1 < files_.num_sequences() ? files_.SequencePointer(s + 1) : files_.used_bytes()};
}

IndexedSource::IndexFault IndexedSource::PlanWindow(int64_t first, int64_t n,
                                                    std::vector<Segment>& segments,
                                                    std::vector<int64_t>& starts) const {
  using Kind = IndexFault::Kind;
  const int64_t byte = first * static_cast<int64_t>(files_.token_bytes());
  // The last sequence whose pointer is <= byte (empty sequences share the next one's).
  int64_t lo = 0, hi = files_.num_sequences();  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (files_.SequencePointer(mid) <= byte) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  if (!files_.SequenceFits(lo)) return Misfit(lo);
  if (byte < files_.SequencePointer(lo) ||
      byte >= files_.SequencePointer(lo) +
                  files_.SequenceLength(lo) * static_cast<int64_t>(files_.token_bytes())) {
    return {Kind::kNotIncreasing, lo, 0, 0, 0};
  }
  int64_t s = lo;
  int64_t offset = first - files_.SequencePointer(s) / static_cast<int64_t>(files_.token_bytes());
  segments.clear();
  starts.assign(1, 0);
  int64_t document_cursor = -1;  // StartsDocument's place in the document index
  int64_t pos = 0;
  while (pos < n) {
    if (s >= files_.num_sequences()) return {Kind::kEnds, first + pos, 0, 0, 0};
    if (!files_.SequenceFits(s)) return Misfit(s);
    if (offset == 0 && pos > 0 && starts.back() != pos && StartsDocument(s, &document_cursor)) {
      starts.push_back(pos);
    }
    const int64_t count = std::min(n - pos, files_.SequenceLength(s) - offset);
    if (count > 0) {
      segments.push_back(Segment{
          files_.SequencePointer(s) + offset * static_cast<int64_t>(files_.token_bytes()), count});
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
          "Megatron index '", files_.idx().path(), "' is corrupt at sequence ", fault.at,
          " (pointer ", fault.pointer, ", length ", fault.length, ", next pointer ", fault.next,
          "): sequences must follow each other in the .bin, as Megatron-LM's builder writes "
          "them; rebuild the index"));
    case IndexFault::Kind::kNotIncreasing:
      return absl::DataLossError(absl::StrCat("Megatron index '", files_.idx().path(),
                                              "' is corrupt: its sequence pointers are not "
                                              "increasing near sequence ",
                                              fault.at, "; rebuild the index"));
    case IndexFault::Kind::kEnds:
      return absl::DataLossError(
          absl::StrCat("Megatron index '", files_.idx().path(), "' ends before token ", fault.at));
  }
  return absl::InternalError("unknown index fault");
}

bool IndexedSource::StartsDocument(int64_t s, int64_t* cursor) const {
  if (*cursor >= 0) {
    // Walking forward from the previous answer: the entries only grow, and a window's
    // sequences come in order, so this is one or two steps.
    while (*cursor < files_.num_documents() && files_.DocumentIndex(*cursor) < s) ++*cursor;
    return *cursor < files_.num_documents() && files_.DocumentIndex(*cursor) == s;
  }
  int64_t lo = 0, hi = files_.num_documents();  // first entry >= s
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (files_.DocumentIndex(mid) < s) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  *cursor = lo;
  return lo < files_.num_documents() && files_.DocumentIndex(lo) == s;
}

std::unique_ptr<SampleSource::Scratch> IndexedSource::NewScratch() const {
  return std::make_unique<IndexedScratch>();
}

void IndexedSource::RangesOf(int64_t index, std::vector<MappedRange>* ranges) const {
  if (!files_.bin().read_in_ranges() || index < 0 || index >= num_samples_) return;
  const uint64_t token_bytes = files_.token_bytes();
  ranges->push_back(MappedRange{.file = files_.shared_bin(),
                                .offset = static_cast<uint64_t>(index * seq_len_) * token_bytes,
                                .length = static_cast<uint64_t>(seq_len_ + 1) * token_bytes});
}

absl::Status IndexedSource::Fill(int64_t index, uint64_t sample_seed,
                                 absl::Span<uint8_t* const> rows, Scratch* scratch) const {
  if (index < 0 || index >= num_samples_) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " is outside [0, ",
                                              num_samples_, ") of '", files_.bin().path(), "'"));
  }
  if (rows.size() != fields_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fill needs ", fields_.size(), " rows, got ", rows.size()));
  }
  const int64_t n = seq_len_ + 1;
  const size_t out_bytes = raw_ ? files_.token_bytes() : DTypeSize(output_dtype_);
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
  FERRY_RETURN_IF_ERROR(files_.idx().Read([&] { fault = PlanWindow(first, n, segments, starts); }));
  if (fault.kind != IndexFault::Kind::kNone) return FaultStatus(fault);
  int64_t pos = 0;
  for (const Segment& segment : segments) {
    const int64_t count = segment.tokens;
    const uint8_t* src = files_.bin().bytes().data() + segment.byte;
    uint8_t* dst = rows[0] + static_cast<size_t>(pos) * out_bytes;
    int64_t overflow = -1;
    int32_t overflow_value = 0;
    const size_t src_bytes = static_cast<size_t>(count) * files_.token_bytes();
    FERRY_RETURN_IF_ERROR(files_.bin().Read(src, src_bytes, [&] {
      if (raw_) {
        // Copied as the file holds them (streamed: raw rows are a GPU job's); int32 ids are
        // still checked, none may be negative.
        if (files_.token_bytes() == 4) overflow = FirstNegative(src, count);
        if (overflow < 0)
          StreamingCopy(dst, src, static_cast<size_t>(count) * files_.token_bytes());
      } else {
        overflow = files_.token_bytes() == 2
                       ? ConvertTokensTo<uint16_t>(output_dtype_, src, count, dst)
                       : ConvertTokensTo<int32_t>(output_dtype_, src, count, dst);
      }
      if (overflow >= 0) {
        overflow_value =
            LoadLittleEndian<int32_t>(src + overflow * static_cast<int64_t>(files_.token_bytes()));
      }
    }));
    if (overflow >= 0) {
      return absl::DataLossError(absl::StrCat(
          "token ", first + pos + overflow, " of Megatron data '", files_.bin().path(), "' (value ",
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
  return absl::StrCat(files_.bin().path(), " packed tokens [", index * seq_len_, ", ",
                      index * seq_len_ + seq_len_ + 1, ")");
}

}  // namespace ferry
