// The `npy` dataset: a NumPy .npy file (format 1.0, 2.0 or 3.0), memory-mapped read-only.
// Sample i is row i along axis 0, delivered as the field "data" with the remaining axes as
// its shape (a 1-d array gives one scalar per sample), plus "index" (int64). The rows are
// served by a RecordSource over the array's bytes; this file reads the header.
//
//   ferry::v1::NpyDataset spec;
//   spec.set_path("/data/features.npy");  // np.save of float32 [N, 3, 4]
//   FERRY_ASSIGN_OR_RETURN(auto source, OpenNpySource(spec));  // "data" FLOAT32 [3, 4]
//
// Supported: C order (or a 1-d array), dtypes |u1 <u2 <u4 <i4 <i8 <f2 <f4 (byte order '<',
// '=' or '|'; the daemon runs on little-endian hosts). Everything else is refused with what
// to do: big-endian, int8 and other dtypes ferry has no DType for, object and structured
// dtypes, fortran_order arrays of 2 or more axes, 0-d arrays.
#ifndef FERRY_SERVER_DATASET_NPY_SOURCE_H_
#define FERRY_SERVER_DATASET_NPY_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/sample_source.h"

namespace ferry {

// What the header of a .npy file says, once checked against the file.
struct NpyHeader {
  ferry::v1::DType dtype = ferry::v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;  // the whole array's; at least one axis
  size_t data_offset = 0;      // where the array's bytes start
};

// Parses the preamble and header dict of `file` (the whole .npy file's bytes) and checks
// that the array's bytes fill the rest of the file exactly. `path` names the file in errors.
// Every problem is FAILED_PRECONDITION naming the file and saying what to do; malformed
// input of any kind returns an error (never reads past `file`).
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::Span<const uint8_t> file, absl::string_view path);

// Errors: INVALID_ARGUMENT when dataset.npy.path is empty; NOT_FOUND naming the path;
// FAILED_PRECONDITION from ParseNpyHeader, or when the array has no rows or empty rows.
// `stores`: see RowStores (sample_source.h). The file is mapped through `fs` (MapFile).
absl::StatusOr<std::unique_ptr<SampleSource>> OpenNpySource(
    const ferry::v1::NpyDataset& spec, RowStores stores = RowStores::kOrdinary,
    const DatasetFs& fs = *UnconfinedDatasetFs());

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_NPY_SOURCE_H_
