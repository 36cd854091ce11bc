// The `records` dataset: a flat file of fixed-size binary records after an optional header,
// memory-mapped read-only. Sample i is record i, delivered unchanged as the field "data"
// (dtype and per-record shape from the spec; an empty shape is one scalar), plus "index"
// (int64, the global sample index). Multi-byte values are little-endian in the file.
//
//   ferry::v1::RecordsDataset spec;
//   spec.set_path("/data/features.f32");
//   spec.set_dtype(ferry::v1::FLOAT32);
//   spec.add_shape(3);
//   spec.add_shape(4);  // records of 3 x 4 floats = 48 bytes
//   FERRY_ASSIGN_OR_RETURN(auto source, RecordSource::Create(spec));
//
// The `npy` dataset (npy_source.h) is the same thing with its layout read from the .npy
// header; it builds a RecordSource through FromLayout. Most callers go through
// MakeSampleSource(spec).
#ifndef FERRY_SERVER_DATASET_RECORD_SOURCE_H_
#define FERRY_SERVER_DATASET_RECORD_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/mapped_file.h"
#include "server/dataset/sample_source.h"

namespace ferry {

// Where the records of a mapped file lie and what one record holds.
struct RecordLayout {
  size_t data_offset = 0;  // bytes before the first record
  ferry::v1::DType dtype = ferry::v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;  // per record; empty = one scalar
  int64_t num_records = 0;
};

class RecordSource final : public SampleSource {
 public:
  // Errors: INVALID_ARGUMENT naming the field (dataset.records.path, .dtype, .shape[i]);
  // NOT_FOUND naming the path; FAILED_PRECONDITION when the file is shorter than
  // header_bytes, holds no full record, or its size minus header_bytes is not a multiple of
  // the record size (the message gives the sizes).
  // `stores`: how Fill writes the rows (RowStores, sample_source.h). The file is mapped
  // through `fs` (DatasetFs::MapFile: shared with other jobs over the same file).
  static absl::StatusOr<std::unique_ptr<RecordSource>> Create(
      const ferry::v1::RecordsDataset& spec, RowStores stores = RowStores::kOrdinary,
      const DatasetFs& fs = *UnconfinedDatasetFs());

  // A file whose layout the caller has read elsewhere (a .npy header). `unit` names one
  // record in Describe ("row"). INVALID_ARGUMENT when the layout is empty or does not fit
  // the file: callers check their own input first, with their own messages.
  static absl::StatusOr<std::unique_ptr<RecordSource>> FromLayout(
      std::shared_ptr<const MappedFile> file, const RecordLayout& layout, std::string unit,
      RowStores stores = RowStores::kOrdinary);

  int64_t size() const override { return num_records_; }
  const std::vector<FieldLayout>& fields() const override { return fields_; }
  std::unique_ptr<Scratch> NewScratch() const override;
  // Never fails for an index in range: it is a copy out of the mapping.
  absl::Status Fill(int64_t index, uint64_t sample_seed, absl::Span<uint8_t* const> rows,
                    Scratch* scratch) const override;
  std::string Describe(int64_t index) const override;
  bool FillIsCopy() const override { return true; }
  void RangesOf(int64_t index, std::vector<MappedRange>* ranges) const override;
  bool ReadsInRanges() const override { return file_->read_in_ranges(); }
  // "data" is the file's records as they are (on little-endian hosts: nothing to swap),
  // located by "index".
  std::optional<DirectRows> direct_rows() const override;

 private:
  RecordSource(std::shared_ptr<const MappedFile> file, const RecordLayout& layout, size_t row_bytes,
               std::string unit, RowStores stores);

  // Constant after construction.
  const std::shared_ptr<const MappedFile> file_;  // shared with other jobs over the file
  const size_t data_offset_;
  const size_t row_bytes_;
  const RowStores stores_;
  const size_t value_bytes_;  // DTypeSize(dtype), for byte-swapping on big-endian hosts
  const int64_t num_records_;
  const std::string unit_;
  std::vector<FieldLayout> fields_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_RECORD_SOURCE_H_
