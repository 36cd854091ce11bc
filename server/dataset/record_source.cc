#include "server/dataset/record_source.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/streaming_copy.h"

namespace ferry {
namespace {

class NoScratch final : public SampleSource::Scratch {};

// DType_Name is empty for a value this build does not know (proto3 enums are open).
std::string DTypeLabel(ferry::v1::DType dtype) {
  const std::string& name = ferry::v1::DType_Name(dtype);
  return name.empty() ? absl::StrCat(static_cast<int>(dtype)) : name;
}

// "FLOAT32 [3, 4]" / "FLOAT32 scalar": what one record is, for size messages.
std::string RecordLabel(ferry::v1::DType dtype, const std::vector<int64_t>& shape) {
  if (shape.empty()) return absl::StrCat(DTypeLabel(dtype), " scalar");
  return absl::StrCat(DTypeLabel(dtype), " [", absl::StrJoin(shape, ", "), "]");
}

// Bytes of one record of `shape` x `value_bytes`, or 0 when that overflows size_t.
// Requires every dimension >= 1.
size_t RowBytes(const std::vector<int64_t>& shape, size_t value_bytes) {
  size_t bytes = value_bytes;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) return 0;
  }
  return bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RecordSource>> RecordSource::Create(
    const ferry::v1::RecordsDataset& spec, RowStores stores, const DatasetFs& fs) {
  if (spec.path().empty()) {
    return absl::InvalidArgumentError("dataset.records.path must be set to the records file");
  }
  const size_t value_bytes = DTypeSize(spec.dtype());
  if (value_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.records.dtype must be one of UINT8, UINT16, UINT32, INT32, INT64, FLOAT16, "
        "BFLOAT16, FLOAT32 (got ",
        DTypeLabel(spec.dtype()), ")"));
  }
  RecordLayout layout;
  layout.dtype = spec.dtype();
  layout.shape.assign(spec.shape().begin(), spec.shape().end());
  for (size_t i = 0; i < layout.shape.size(); ++i) {
    if (layout.shape[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset.records.shape[", i, "] must be at least 1 (got ", layout.shape[i],
                       "); leave dataset.records.shape empty for one scalar per record"));
    }
  }
  const size_t row_bytes = RowBytes(layout.shape, value_bytes);
  if (row_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset.records.shape [", absl::StrJoin(layout.shape, ", "), "] of dataset.records.dtype ",
        DTypeLabel(spec.dtype()), " makes a record larger than any file; is the shape right?"));
  }
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, fs.MapFileInRanges(spec.path()));
  const size_t bytes = file->bytes().size();
  const uint64_t header = spec.header_bytes();
  const std::string record = RecordLabel(layout.dtype, layout.shape);
  if (bytes < header) {
    return absl::FailedPreconditionError(
        absl::StrCat("records file '", spec.path(), "' is ", bytes,
                     " bytes, shorter than its dataset.records.header_bytes ", header,
                     "; is header_bytes right?"));
  }
  const size_t payload = bytes - header;
  if (payload < row_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "records file '", spec.path(), "' holds no full record: ", bytes, " bytes - ", header,
        " header bytes = ", payload, " bytes, less than one record of ", row_bytes, " bytes (",
        record, "); check dataset.records.dtype, shape and header_bytes"));
  }
  if (payload % row_bytes != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "records file '", spec.path(), "' is ", bytes, " bytes: ", payload, " bytes after its ",
        header, "-byte header, not a multiple of the record size ", row_bytes, " bytes (", record,
        "): ", payload / row_bytes, " records and ", payload % row_bytes,
        " bytes left over; check dataset.records.dtype, shape and header_bytes, or cut the "
        "file to a whole number of records"));
  }
  layout.data_offset = header;
  layout.num_records = static_cast<int64_t>(payload / row_bytes);
  return std::unique_ptr<RecordSource>(
      new RecordSource(std::move(file), layout, row_bytes, "record", stores));
}

absl::StatusOr<std::unique_ptr<RecordSource>> RecordSource::FromLayout(
    std::shared_ptr<const MappedFile> file, const RecordLayout& layout, std::string unit,
    RowStores stores) {
  const size_t value_bytes = DTypeSize(layout.dtype);
  const bool dims_ok =
      std::all_of(layout.shape.begin(), layout.shape.end(), [](int64_t d) { return d >= 1; });
  const size_t row_bytes = dims_ok ? RowBytes(layout.shape, value_bytes) : 0;
  size_t data_bytes = 0;
  if (value_bytes == 0 || row_bytes == 0 || layout.num_records < 1 ||
      __builtin_mul_overflow(row_bytes, static_cast<uint64_t>(layout.num_records), &data_bytes) ||
      layout.data_offset > file->bytes().size() ||
      data_bytes > file->bytes().size() - layout.data_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("record layout (", layout.num_records, " x ",
                     RecordLabel(layout.dtype, layout.shape), " at byte ", layout.data_offset,
                     ") does not fit '", file->path(), "' (", file->bytes().size(), " bytes)"));
  }
  return std::unique_ptr<RecordSource>(
      new RecordSource(std::move(file), layout, row_bytes, std::move(unit), stores));
}

RecordSource::RecordSource(std::shared_ptr<const MappedFile> file, const RecordLayout& layout,
                           size_t row_bytes, std::string unit, RowStores stores)
    : file_(std::move(file)),
      data_offset_(layout.data_offset),
      row_bytes_(row_bytes),
      stores_(stores),
      value_bytes_(DTypeSize(layout.dtype)),
      num_records_(layout.num_records),
      unit_(std::move(unit)) {
  fields_.push_back(FieldLayout{
      .name = "data", .dtype = layout.dtype, .shape = layout.shape, .row_bytes = row_bytes});
  fields_.push_back(
      FieldLayout{.name = "index", .dtype = ferry::v1::INT64, .shape = {}, .row_bytes = 8});
}

std::unique_ptr<SampleSource::Scratch> RecordSource::NewScratch() const {
  return std::make_unique<NoScratch>();
}

absl::Status RecordSource::Fill(int64_t index, uint64_t sample_seed,
                                absl::Span<uint8_t* const> rows, Scratch* scratch) const {
  if (index < 0 || index >= num_records_) {
    return absl::OutOfRangeError(absl::StrCat("sample index ", index, " is outside [0, ",
                                              num_records_, ") of '", file_->path(), "'"));
  }
  if (rows.size() != fields_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fill needs ", fields_.size(), " rows (data, index), got ", rows.size()));
  }
  std::memcpy(rows[1], &index, sizeof(index));
  const uint8_t* src =
      file_->bytes().data() + data_offset_ + static_cast<size_t>(index) * row_bytes_;
  if (rows[0] == nullptr) {
    // The device reads the row from the mapping (direct_rows()), where pages cut from the
    // file stay pinned with their old bytes. Touching the row's last byte here makes a file
    // cut short under the job a DatasetChangedError, as for a copied row, instead of rows
    // the file no longer has.
    return file_->Read(src, row_bytes_, [&] {
      const volatile uint8_t* last = src + row_bytes_ - 1;
      (void)*last;
    });
  }
  FERRY_RETURN_IF_ERROR(file_->Read(src, row_bytes_, [&] {
    if (stores_ == RowStores::kStreaming) {
      StreamingCopy(rows[0], src, row_bytes_);
    } else {
      std::memcpy(rows[0], src, row_bytes_);
    }
  }));
  if constexpr (std::endian::native == std::endian::big) {
    // The file is little-endian; the slot holds host order.
    for (size_t v = 0; v + value_bytes_ <= row_bytes_; v += value_bytes_) {
      std::reverse(rows[0] + v, rows[0] + v + value_bytes_);
    }
  }
  return absl::OkStatus();
}

std::optional<DirectRows> RecordSource::direct_rows() const {
  if constexpr (std::endian::native != std::endian::little) return std::nullopt;
  // A mapping fetched as it is read cannot be registered with a device whole.
  if (file_->read_in_ranges()) return std::nullopt;
  return DirectRows{.field = 0,
                    .index_field = 1,
                    .records = file_->bytes().data() + data_offset_,
                    .num_records = num_records_,
                    .row_bytes = row_bytes_,
                    .mapping = file_->bytes().data(),
                    .mapping_bytes = file_->bytes().size(),
                    .path = file_->path()};
}

void RecordSource::RangesOf(int64_t index, std::vector<MappedRange>* ranges) const {
  if (!file_->read_in_ranges() || index < 0 || index >= num_records_) return;
  ranges->push_back(MappedRange{.file = file_,
                                .offset = data_offset_ + static_cast<uint64_t>(index) * row_bytes_,
                                .length = row_bytes_});
}

std::string RecordSource::Describe(int64_t index) const {
  return absl::StrCat(file_->path(), " ", unit_, " ", index);
}

}  // namespace ferry
