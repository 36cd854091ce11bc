// Tests of the `records` and `npy` datasets. The .npy files are written byte by byte here
// (preamble, header dict, data), as numpy's format.py lays them out.
#include "server/dataset/record_source.h"

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataset/mapped_file.h"
#include "server/dataset/npy_source.h"
#include "server/dataset/sample_source.h"
#include "testing/recording_fs.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// A fresh temporary directory, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ferry_records_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void Put(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {  // host order: the tests run little-endian
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// Bytes 0, 1, 2, ... (mod 251, so records differ) of a payload of `n` bytes.
std::string Pattern(size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(i % 251);
  return out;
}

// A .npy file: magic, version, header length, `dict` padded with spaces and a newline to a
// multiple of 64 bytes (as numpy writes it), then `data`.
std::string Npy(const std::string& dict, const std::string& data, int major = 1, int minor = 0) {
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t preamble = 8 + length_bytes;
  std::string header = dict;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back(static_cast<char>(minor));
  for (size_t i = 0; i < length_bytes; ++i) {
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  return out + header + data;
}

std::string Dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

absl::Span<const uint8_t> Span(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// One sample's rows, one buffer per field.
struct Rows {
  explicit Rows(const SampleSource& source) {
    for (const FieldLayout& f : source.fields()) buffers.emplace_back(f.row_bytes, '\xAB');
    for (auto& b : buffers) pointers.push_back(reinterpret_cast<uint8_t*>(b.data()));
  }
  int64_t Index() const {
    int64_t v;
    std::memcpy(&v, buffers[1].data(), sizeof(v));
    return v;
  }
  std::vector<std::string> buffers;
  std::vector<uint8_t*> pointers;
};

ferry::v1::RecordsDataset RecordsSpec(const std::string& path, ferry::v1::DType dtype,
                                      std::vector<int64_t> shape, uint64_t header_bytes = 0) {
  ferry::v1::RecordsDataset spec;
  spec.set_path(path);
  spec.set_dtype(dtype);
  for (int64_t d : shape) spec.add_shape(d);
  spec.set_header_bytes(header_bytes);
  return spec;
}

// Fills every record of `source` and compares it with its bytes in `payload`.
void ExpectEachRecord(const SampleSource& source, const std::string& payload, size_t row_bytes) {
  auto scratch = source.NewScratch();
  for (int64_t i = 0; i < source.size(); ++i) {
    Rows rows(source);
    ASSERT_TRUE(source.Fill(i, 0, rows.pointers, scratch.get()).ok()) << i;
    EXPECT_EQ(rows.buffers[0], payload.substr(i * row_bytes, row_bytes)) << i;
    EXPECT_EQ(rows.Index(), i);
  }
}

// ---------------------------------------------------------------------------------------
// records

TEST(RecordsTest, EveryDtypeDeliversEachRecordAfterTheHeader) {
  TempDir dir;
  for (ferry::v1::DType dtype :
       {ferry::v1::UINT8, ferry::v1::UINT16, ferry::v1::UINT32, ferry::v1::INT32, ferry::v1::INT64,
        ferry::v1::FLOAT16, ferry::v1::BFLOAT16, ferry::v1::FLOAT32}) {
    SCOPED_TRACE(ferry::v1::DType_Name(dtype));
    const size_t row_bytes = 3 * 2 * DTypeSize(dtype);
    constexpr int kRecords = 7;
    constexpr size_t kHeader = 13;
    const std::string payload = Pattern(kRecords * row_bytes);
    const std::string path = dir.File(ferry::v1::DType_Name(dtype));
    Put(path, std::string(kHeader, 'h') + payload);
    auto source = RecordSource::Create(RecordsSpec(path, dtype, {3, 2}, kHeader));
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_EQ((*source)->size(), kRecords);
    const auto& fields = (*source)->fields();
    ASSERT_EQ(fields.size(), 2u);
    EXPECT_EQ(fields[0].name, "data");
    EXPECT_EQ(fields[0].dtype, dtype);
    EXPECT_THAT(fields[0].shape, ElementsAre(3, 2));
    EXPECT_EQ(fields[0].row_bytes, row_bytes);
    EXPECT_EQ(fields[1].name, "index");
    EXPECT_EQ(fields[1].dtype, ferry::v1::INT64);
    EXPECT_THAT(fields[1].shape, IsEmpty());
    ExpectEachRecord(**source, payload, row_bytes);
    EXPECT_EQ((*source)->Describe(4), path + " record 4");
  }
}

// A GPU job's rows are written with streaming stores; they must be the same bytes. Rows
// of 4 KiB + 6 are long enough to stream and odd enough to leave a head and a tail.
// Read in ranges (a large remote object's blocks), a record's Fill reads exactly the range
// RangesOf gives, which the read-ahead fetches before the workers get to it.
TEST(RecordsTest, RangesOfAreTheRangesFillReads) {
  TempDir dir;
  const std::string path = dir.File("r.bin");
  Put(path, std::string(16, 'h') + std::string(10 * 6, 'r'));
  RangesRecordingFs ranged(/*unit=*/32);
  auto source = RecordSource::Create(RecordsSpec(path, ferry::v1::UINT16, {3}, 16),
                                     RowStores::kOrdinary, ranged);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE((*source)->ReadsInRanges());
  EXPECT_FALSE((*source)->direct_rows().has_value());
  auto scratch = (*source)->NewScratch();
  for (int64_t i = 0; i < (*source)->size(); ++i) {
    std::vector<MappedRange> ranges;
    (*source)->RangesOf(i, &ranges);
    ASSERT_EQ(ranges.size(), 1u);
    EXPECT_EQ(ranges[0].offset, 16 + 6 * static_cast<uint64_t>(i));
    EXPECT_EQ(ranges[0].length, 6u);
    Rows rows(**source);
    ASSERT_TRUE((*source)->Fill(i, 0, rows.pointers, scratch.get()).ok());
    const std::vector<RangesRecordingFs::Held> held = ranged.TakeHeld();
    ASSERT_EQ(held.size(), 1u);
    EXPECT_EQ(held[0].offset, ranges[0].offset);
    EXPECT_EQ(held[0].length, ranges[0].length);
  }
}

TEST(RecordsTest, StreamingStoresDeliverTheSameRows) {
  TempDir dir;
  constexpr int kRecords = 5;
  const size_t row_bytes = 2051 * 2;
  const std::string payload = Pattern(kRecords * row_bytes);
  const std::string path = dir.File("rows.u16");
  Put(path, payload);
  for (RowStores stores : {RowStores::kOrdinary, RowStores::kStreaming}) {
    auto source = RecordSource::Create(RecordsSpec(path, ferry::v1::UINT16, {2051}), stores);
    ASSERT_TRUE(source.ok()) << source.status();
    ExpectEachRecord(**source, payload, row_bytes);
  }
}

// direct_rows locates record i at records + i * row_bytes inside the whole mapping, for a
// device to read it there; Fill given a null "data" row writes the index only.
TEST(RecordsTest, DirectRowsLocateEachRecordInTheMapping) {
  TempDir dir;
  constexpr size_t kHeader = 13, kRow = 24;
  constexpr int kRecords = 9;
  const std::string payload = Pattern(kRecords * kRow);
  const std::string path = dir.File("direct");
  Put(path, std::string(kHeader, 'h') + payload);
  auto source = RecordSource::Create(RecordsSpec(path, ferry::v1::INT64, {3}, kHeader));
  ASSERT_TRUE(source.ok()) << source.status();
  const std::optional<DirectRows> direct = (*source)->direct_rows();
  ASSERT_TRUE(direct.has_value());
  EXPECT_EQ(direct->field, 0);
  EXPECT_EQ(direct->index_field, 1);
  EXPECT_EQ(direct->num_records, kRecords);
  EXPECT_EQ(direct->row_bytes, kRow);
  EXPECT_EQ(direct->path, path);
  EXPECT_EQ(direct->mapping_bytes, kHeader + payload.size());
  EXPECT_EQ(direct->records, direct->mapping + kHeader);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(direct->mapping) % 4096, 0u);
  for (int64_t i = 0; i < kRecords; ++i) {
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(direct->records + i * kRow), kRow),
              payload.substr(i * kRow, kRow));
  }
  auto scratch = (*source)->NewScratch();
  Rows rows(**source);
  rows.pointers[0] = nullptr;
  ASSERT_TRUE((*source)->Fill(5, 0, rows.pointers, scratch.get()).ok());
  EXPECT_EQ(rows.Index(), 5);
  EXPECT_EQ(rows.buffers[0], std::string(kRow, '\xAB'));  // untouched
}

TEST(RecordsTest, EmptyShapeIsOneScalarPerRecord) {
  TempDir dir;
  const std::string path = dir.File("scalars.f32");
  Put(path, Bytes(std::vector<float>{1.5f, -2.0f, 3.25f}));
  auto source = RecordSource::Create(RecordsSpec(path, ferry::v1::FLOAT32, {}));
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->size(), 3);
  EXPECT_THAT((*source)->fields()[0].shape, IsEmpty());
  EXPECT_EQ((*source)->fields()[0].row_bytes, 4u);
  Rows rows(**source);
  auto scratch = (*source)->NewScratch();
  ASSERT_TRUE((*source)->Fill(2, 0, rows.pointers, scratch.get()).ok());
  float v;
  std::memcpy(&v, rows.buffers[0].data(), sizeof(v));
  EXPECT_EQ(v, 3.25f);
  EXPECT_EQ(rows.Index(), 2);
  EXPECT_EQ((*source)->Fill(3, 0, rows.pointers, scratch.get()).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*source)->Fill(-1, 0, rows.pointers, scratch.get()).code(),
            absl::StatusCode::kOutOfRange);
}

TEST(RecordsTest, SpecErrorsNameTheField) {
  TempDir dir;
  const std::string path = dir.File("r.bin");
  Put(path, Pattern(64));
  struct Case {
    ferry::v1::RecordsDataset spec;
    std::string message;
  } cases[] = {
      {RecordsSpec("", ferry::v1::UINT8, {}), "dataset.records.path"},
      {RecordsSpec(path, ferry::v1::DTYPE_UNSPECIFIED, {}), "dataset.records.dtype must be one of"},
      {RecordsSpec(path, static_cast<ferry::v1::DType>(42), {}), "(got 42)"},
      {RecordsSpec(path, ferry::v1::UINT8, {4, 0}), "dataset.records.shape[1] must be at least 1"},
      {RecordsSpec(path, ferry::v1::UINT8, {-3}), "dataset.records.shape[0]"},
      {RecordsSpec(path, ferry::v1::INT64, {int64_t{1} << 40, int64_t{1} << 40}),
       "larger than any file"},
  };
  for (const Case& c : cases) {
    auto source = RecordSource::Create(c.spec);
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(source.status().message(), HasSubstr(c.message));
  }
}

TEST(RecordsTest, MissingFileIsNotFoundNamingThePath) {
  TempDir dir;
  const std::string path = dir.File("missing.bin");
  auto source = RecordSource::Create(RecordsSpec(path, ferry::v1::UINT8, {}));
  EXPECT_EQ(source.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(source.status().message(), HasSubstr(path));
}

TEST(RecordsTest, SizeMismatchesAreFailedPreconditionWithTheSizes) {
  TempDir dir;
  const std::string path = dir.File("r.bin");
  // 100 bytes - 4 header = 96, records of 3 x 4 x 4 = 48 bytes: two records.
  Put(path, Pattern(100));
  EXPECT_TRUE(RecordSource::Create(RecordsSpec(path, ferry::v1::FLOAT32, {3, 4}, 4)).ok());

  auto odd = RecordSource::Create(RecordsSpec(path, ferry::v1::FLOAT32, {3, 4}, 0));
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(odd.status().message(),
              AllOf(HasSubstr(path), HasSubstr("100 bytes"), HasSubstr("record size 48 bytes"),
                    HasSubstr("FLOAT32 [3, 4]"), HasSubstr("2 records and 4 bytes left over"),
                    HasSubstr("header_bytes")));

  auto short_file = RecordSource::Create(RecordsSpec(path, ferry::v1::FLOAT32, {64}, 4));
  EXPECT_EQ(short_file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(short_file.status().message(), AllOf(HasSubstr("holds no full record"),
                                                   HasSubstr("96 bytes"), HasSubstr("256 bytes")));

  auto header = RecordSource::Create(RecordsSpec(path, ferry::v1::UINT8, {}, 101));
  EXPECT_EQ(header.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(header.status().message(),
              HasSubstr("shorter than its dataset.records.header_bytes"));

  const std::string empty = dir.File("empty.bin");
  Put(empty, "");
  auto none = RecordSource::Create(RecordsSpec(empty, ferry::v1::UINT8, {}));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("holds no full record"));
}

TEST(RecordsTest, FromLayoutRefusesALayoutPastTheFile) {
  TempDir dir;
  const std::string path = dir.File("r.bin");
  Put(path, Pattern(40));
  auto open = [&] { return std::move(UnconfinedDatasetFs()->MapFile(path)).value(); };
  RecordLayout layout{.data_offset = 8, .dtype = ferry::v1::INT64, .shape = {2}, .num_records = 2};
  EXPECT_TRUE(RecordSource::FromLayout(open(), layout, "row").ok());
  layout.num_records = 3;
  EXPECT_EQ(RecordSource::FromLayout(open(), layout, "row").status().code(),
            absl::StatusCode::kInvalidArgument);
  layout = {.data_offset = 41, .dtype = ferry::v1::UINT8, .shape = {}, .num_records = 1};
  EXPECT_FALSE(RecordSource::FromLayout(open(), layout, "row").ok());
  layout = {.data_offset = 0, .dtype = ferry::v1::UINT8, .shape = {}, .num_records = 0};
  EXPECT_FALSE(RecordSource::FromLayout(open(), layout, "row").ok());
}

// ---------------------------------------------------------------------------------------
// MappedFile: one mapping per unchanged file

TEST(MappedFileTest, AFileOpenedTwiceByAnyLinkSharesOneMapping) {
  TempDir dir;
  const std::string path = dir.File("r.bin");
  Put(path, Pattern(4096));
  fs::create_hard_link(path, dir.File("hard.bin"));
  fs::create_symlink(path, dir.File("soft.bin"));
  auto first = UnconfinedDatasetFs()->MapFile(path);
  ASSERT_TRUE(first.ok()) << first.status();
  for (const std::string& other : {path, dir.File("hard.bin"), dir.File("soft.bin")}) {
    auto again = UnconfinedDatasetFs()->MapFile(other);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->get(), first->get()) << other;
    EXPECT_EQ((*again)->bytes().data(), (*first)->bytes().data()) << other;
  }
  EXPECT_EQ((*first)->path(), path);
}

TEST(MappedFileTest, AFileOpenedFromManyThreadsAtOnceIsMappedOnce) {
  TempDir dir;
  const std::string path = dir.File("r.bin");
  Put(path, Pattern(1 << 20));
  std::vector<std::shared_ptr<const MappedFile>> files(8);
  std::vector<std::thread> threads;
  for (auto& file : files) {
    threads.emplace_back([&path, &file] { file = UnconfinedDatasetFs()->MapFile(path).value(); });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& file : files) EXPECT_EQ(file.get(), files[0].get());
}

TEST(MappedFileTest, AReplacedOrRewrittenFileGetsAMappingOfItsOwn) {
  TempDir dir;
  const std::string path = dir.File("r.bin");
  Put(path, Pattern(4096));
  auto old = UnconfinedDatasetFs()->MapFile(path).value();
  // Replaced (a new inode under the same name): the old mapping keeps the old bytes.
  Put(dir.File("new.bin"), std::string(4096, 'x'));
  fs::rename(dir.File("new.bin"), path);
  auto replaced = UnconfinedDatasetFs()->MapFile(path).value();
  EXPECT_NE(replaced.get(), old.get());
  EXPECT_EQ(replaced->bytes()[0], 'x');
  EXPECT_EQ(old->bytes()[1], 1);
  // Rewritten in place to another size (same inode).
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << "more";
  }
  auto grown = UnconfinedDatasetFs()->MapFile(path).value();
  EXPECT_NE(grown.get(), replaced.get());
  EXPECT_EQ(grown->bytes().size(), 4100u);
  EXPECT_EQ(replaced->bytes().size(), 4096u);
}

TEST(MappedFileTest, AFileMappedAgainAfterItsLastOwnerWentReadsTheSame) {
  TempDir dir;
  const std::string path = dir.File("r.bin");
  Put(path, Pattern(4096));
  UnconfinedDatasetFs()->MapFile(path).value().reset();
  auto file = UnconfinedDatasetFs()->MapFile(path).value();
  ASSERT_EQ(file->bytes().size(), 4096u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(file->bytes().data()), 4096), Pattern(4096));
  EXPECT_EQ(UnconfinedDatasetFs()->MapFile(dir.File("missing.bin")).status().code(),
            absl::StatusCode::kNotFound);
}

// Two jobs over one records file read the same mapping: a device transport registers (and
// counts against its pinned budget) one range for both.
TEST(RecordsTest, SourcesOverOneFileShareItsMapping) {
  TempDir dir;
  const std::string path = dir.File("r.bin");
  Put(path, Pattern(64 * 8));
  auto a = RecordSource::Create(RecordsSpec(path, ferry::v1::INT64, {}));
  auto b = RecordSource::Create(RecordsSpec(path, ferry::v1::INT64, {2}));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*a)->direct_rows().has_value());
  ASSERT_TRUE((*b)->direct_rows().has_value());
  EXPECT_EQ((*a)->direct_rows()->mapping, (*b)->direct_rows()->mapping);
  EXPECT_EQ((*a)->direct_rows()->mapping_bytes, 64u * 8);
}

// ---------------------------------------------------------------------------------------
// npy: the header parser

TEST(NpyHeaderTest, ReadsEverySupportedDtypeAndByteOrder) {
  struct Case {
    std::string descr;
    ferry::v1::DType dtype;
    size_t itemsize;
  } cases[] = {
      {"|u1", ferry::v1::UINT8, 1},   {"<u1", ferry::v1::UINT8, 1},
      {"<u2", ferry::v1::UINT16, 2},  {"=u2", ferry::v1::UINT16, 2},
      {"<u4", ferry::v1::UINT32, 4},  {"<i4", ferry::v1::INT32, 4},
      {"<i8", ferry::v1::INT64, 8},   {"<f2", ferry::v1::FLOAT16, 2},
      {"<f4", ferry::v1::FLOAT32, 4}, {"|f4", ferry::v1::FLOAT32, 4},
  };
  for (const Case& c : cases) {
    const std::string file = Npy(Dict(c.descr, "(5, 3)"), Pattern(15 * c.itemsize));
    auto header = ParseNpyHeader(Span(file), "x.npy");
    ASSERT_TRUE(header.ok()) << c.descr << ": " << header.status();
    EXPECT_EQ(header->dtype, c.dtype) << c.descr;
    EXPECT_THAT(header->shape, ElementsAre(5, 3));
    EXPECT_EQ(header->data_offset, file.size() - 15 * c.itemsize);
    EXPECT_EQ(header->data_offset % 64, 0u);  // numpy's alignment, kept by Npy()
  }
}

TEST(NpyHeaderTest, ReadsVersions1To3AndHeaderVariants) {
  const std::string data = Pattern(6 * 4);
  for (int major : {1, 2, 3}) {
    const std::string file = Npy(Dict("<f4", "(6,)"), data, major);
    auto header = ParseNpyHeader(Span(file), "x.npy");
    ASSERT_TRUE(header.ok()) << major << ": " << header.status();
    EXPECT_THAT(header->shape, ElementsAre(6));
    EXPECT_EQ(header->data_offset + data.size(), file.size());
  }
  // Written by hand or by old numpy versions: other key orders, double quotes, no trailing
  // comma, Python 2 long integers and u'' strings, no padding, a 1-d array in Fortran order.
  for (const std::string& dict : {
           std::string("{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}"),
           std::string("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}"),
           std::string("{'descr': u'<f4', 'fortran_order': False, 'shape': (2L, 3L), }"),
           std::string("{'descr':'<f4','fortran_order':False,'shape':(2,3,)}"),
           std::string("  {'descr': '<f4',\n 'fortran_order': False,\t'shape': (6,)}  \n"),
           std::string("{'descr': '<f4', 'fortran_order': True, 'shape': (6,)}"),
       }) {
    std::string file("\x93NUMPY\x01\x00", 8);
    file.push_back(static_cast<char>(dict.size()));
    file.push_back(0);
    file += dict + data;
    auto header = ParseNpyHeader(Span(file), "x.npy");
    ASSERT_TRUE(header.ok()) << dict << ": " << header.status();
    EXPECT_EQ(header->dtype, ferry::v1::FLOAT32);
    EXPECT_EQ(header->data_offset, 10 + dict.size());
  }
}

// Every error is FAILED_PRECONDITION naming the file and containing `message`.
void ExpectRefused(const std::string& file, const std::string& message) {
  auto header = ParseNpyHeader(Span(file), "/data/x.npy");
  ASSERT_FALSE(header.ok()) << "accepted: " << message;
  EXPECT_EQ(header.status().code(), absl::StatusCode::kFailedPrecondition) << header.status();
  EXPECT_THAT(header.status().message(), AllOf(HasSubstr("/data/x.npy"), HasSubstr(message)));
  // The caller may be refused the file: a message describes the header, never quotes it.
  EXPECT_THAT(header.status().message(), Not(HasSubstr("SECRET")));
}

TEST(NpyHeaderTest, RefusesUnsupportedArraysSayingWhatToDo) {
  const std::string data = Pattern(64);
  ExpectRefused(Npy(Dict(">f4", "(4, 4)"), data), "big-endian");
  ExpectRefused(Npy(Dict(">i8", "(8,)"), data), "newbyteorder('<')");
  ExpectRefused(Npy(Dict("|i1", "(64,)"), data), "int8 has no ferry dtype");
  ExpectRefused(Npy(Dict("<f8", "(8,)"), data), "astype(np.float32)");
  ExpectRefused(Npy(Dict("|b1", "(64,)"), data), "astype(np.uint8)");
  ExpectRefused(Npy(Dict("<U4", "(4,)"), data), "cannot serve");
  ExpectRefused(Npy(Dict("|O", "(8,)"), data), "Python objects");
  ExpectRefused(Npy("{'descr': [('x', '<f4'), ('y', '<f4')], 'fortran_order': False, "
                    "'shape': (8,), }",
                    data),
                "structured dtype");
  ExpectRefused(Npy(Dict("<f4", "(4, 4)", /*fortran=*/true), data), "np.ascontiguousarray");
  ExpectRefused(Npy(Dict("<f4", "()"), Pattern(4)), "0-d array");
}

TEST(NpyHeaderTest, MalformedFilesAreErrors) {
  const std::string good = Npy(Dict("<f4", "(4, 3)"), Pattern(48));
  ASSERT_TRUE(ParseNpyHeader(Span(good), "x.npy").ok());

  ExpectRefused("", "too short");
  ExpectRefused("\x93NUMP", "too short");
  ExpectRefused("PK\x03\x04 an npz archive, really", "magic");
  ExpectRefused(std::string("\x93NUMPZ\x01\x00\x02\x00{}", 12), "magic");
  for (auto [major, minor] :
       {std::pair{0, 0}, std::pair{4, 0}, std::pair{1, 1}, std::pair{255, 255}}) {
    ExpectRefused(Npy(Dict("<f4", "(4, 3)"), Pattern(48), major, minor),
                  absl::StrCat("version ", major, ".", minor));
  }
  ExpectRefused(std::string("\x93NUMPY\x02\x00\x10\x00", 10), "inside its preamble");

  // The header length field points past the end of the file.
  std::string long_header = good;
  long_header[8] = '\xff';
  long_header[9] = '\x7f';
  ExpectRefused(long_header, "past the end of the file");
  std::string long_v2 = Npy(Dict("<f4", "(4, 3)"), Pattern(48), 2);
  long_v2[11] = '\x80';
  ExpectRefused(long_v2, "past the end of the file");

  // Array bytes missing or left over.
  ExpectRefused(good.substr(0, good.size() - 1), "is truncated");
  ExpectRefused(good + "x", "1 bytes after its array");
  ExpectRefused(Npy(Dict("<f4", "(4611686018427387904, 4)"), Pattern(4)), "over 2^64");

  // Missing keys, unknown keys, bad values; none of the header's text is quoted back.
  ExpectRefused(Npy("{'SECRET': 1, 'descr': '<f4'", Pattern(48)), "malformed header");
  ExpectRefused(Npy("['SECRET', '<f4']", Pattern(48)), "not a dict");
  ExpectRefused(
      Npy("{'SECRET': 1, 'descr': '<f4', 'fortran_order': False, 'shape': (4, 3)}", Pattern(48)),
      "header key other than");
  ExpectRefused(Npy("{'descr': '<f4', 'fortran_order': 'SECRET', 'shape': (4, 3)}", Pattern(48)),
                "'fortran_order' that is not True or False");
  ExpectRefused(Npy("{'fortran_order': False, 'shape': (4, 3), }", Pattern(48)), "'descr'");
  ExpectRefused(Npy("{'descr': '<f4', 'shape': (4, 3), }", Pattern(48)), "'fortran_order'");
  ExpectRefused(Npy("{'descr': '<f4', 'fortran_order': False, }", Pattern(48)), "'shape'");
  ExpectRefused(
      Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), 'x': 1}", Pattern(48)),
      "header key other than 'descr', 'fortran_order' and 'shape' (key 4 of 4");
  ExpectRefused(Npy("{'descr': 4, 'fortran_order': False, 'shape': (4, 3)}", Pattern(48)),
                "'descr' that is not a dtype string");
  ExpectRefused(Npy("{'descr': '<f4', 'fortran_order': 0, 'shape': (4, 3)}", Pattern(48)),
                "'fortran_order' that is not True or False");
  ExpectRefused(Npy("[1, 2]", Pattern(48)), "not a dict");
  for (const char* shape :
       {"(4, 'a')", "(-4, 3)", "12", "[4, 3]", "(4, None)", "((4,), 3)", "(4, True)"}) {
    ExpectRefused(Npy(Dict("<f4", shape), Pattern(48)), "'shape' that is not a tuple");
  }
  for (const char* shape :
       {"(4, 3", "(4 3)", "(4,, 3)", "(99999999999999999999, 3)", "(4, 3x)", "(4, 0x3)",
        "(4, 3) junk", "(4, 3.0)", "(-, 3)", "(4, 3)}", "(4, 'abc", "(4, foo)"}) {
    ExpectRefused(Npy(Dict("<f4", shape), Pattern(48)), "malformed header");
  }
  ExpectRefused(Npy("{'descr': '<f4' 'fortran_order': False}", ""), "malformed header");
  ExpectRefused(Npy("{'descr' '<f4'}", ""), "expected ':'");
  ExpectRefused(Npy("{'descr': '<f4', 'shape': " + std::string(10000, '(') + "4", ""),
                "nesting too deep");
  ExpectRefused(Npy("", ""), "malformed header");
  ExpectRefused(Npy("{'descr': '\x01\xff', 'fortran_order': False, 'shape': (1,)}", "x"),
                "cannot serve");
}

TEST(NpyHeaderTest, EveryPrefixAndEveryByteFlipIsHandled) {
  const std::string good = Npy(Dict("<i8", "(2, 3)"), Pattern(48), 2);
  for (size_t n = 0; n < good.size(); ++n) {
    auto header = ParseNpyHeader(Span(good.substr(0, n)), "x.npy");
    EXPECT_FALSE(header.ok()) << "prefix of " << n << " bytes";
  }
  // Flips may still parse (a padding space becomes a tab); they must never crash or read
  // out of bounds (run under ASan to check the latter).
  for (size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      auto header = ParseNpyHeader(Span(bad), "x.npy");
      if (header.ok()) {
        EXPECT_LE(header->data_offset, bad.size());
        EXPECT_FALSE(header->shape.empty());
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// npy: the source

TEST(NpySourceTest, RowsAlongAxisZeroWithIndex) {
  TempDir dir;
  std::vector<float> values(5 * 3 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  const std::string path = dir.File("f.npy");
  Put(path, Npy(Dict("<f4", "(5, 3, 4)"), Bytes(values), 3));
  ferry::v1::NpyDataset spec;
  spec.set_path(path);
  auto source = OpenNpySource(spec);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->size(), 5);
  const auto& fields = (*source)->fields();
  ASSERT_EQ(fields.size(), 2u);
  EXPECT_EQ(fields[0].name, "data");
  EXPECT_EQ(fields[0].dtype, ferry::v1::FLOAT32);
  EXPECT_THAT(fields[0].shape, ElementsAre(3, 4));
  EXPECT_EQ(fields[0].row_bytes, 48u);
  EXPECT_EQ(fields[1].name, "index");
  auto scratch = (*source)->NewScratch();
  for (int64_t i = 0; i < 5; ++i) {
    Rows rows(**source);
    ASSERT_TRUE((*source)->Fill(i, 7, rows.pointers, scratch.get()).ok());
    EXPECT_EQ(rows.buffers[0], Bytes(values).substr(i * 48, 48));
    EXPECT_EQ(rows.Index(), i);
  }
  EXPECT_EQ((*source)->Describe(3), path + " row 3");
}

TEST(NpySourceTest, OneDimensionalArrayIsOneScalarPerSample) {
  TempDir dir;
  const std::string path = dir.File("i.npy");
  Put(path, Npy(Dict("<i8", "(3,)"), Bytes(std::vector<int64_t>{10, -20, 30})));
  ferry::v1::NpyDataset spec;
  spec.set_path(path);
  auto source = OpenNpySource(spec);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->size(), 3);
  EXPECT_EQ((*source)->fields()[0].dtype, ferry::v1::INT64);
  EXPECT_THAT((*source)->fields()[0].shape, IsEmpty());
  Rows rows(**source);
  auto scratch = (*source)->NewScratch();
  ASSERT_TRUE((*source)->Fill(1, 0, rows.pointers, scratch.get()).ok());
  int64_t v;
  std::memcpy(&v, rows.buffers[0].data(), sizeof(v));
  EXPECT_EQ(v, -20);
}

TEST(NpySourceTest, Errors) {
  TempDir dir;
  ferry::v1::NpyDataset spec;
  EXPECT_EQ(OpenNpySource(spec).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(OpenNpySource(spec).status().message(), HasSubstr("dataset.npy.path"));

  spec.set_path(dir.File("missing.npy"));
  EXPECT_EQ(OpenNpySource(spec).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(OpenNpySource(spec).status().message(), HasSubstr(spec.path()));

  spec.set_path(dir.File("big.npy"));
  Put(spec.path(), Npy(Dict(">f4", "(2,)"), Pattern(8)));
  EXPECT_EQ(OpenNpySource(spec).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(OpenNpySource(spec).status().message(),
              AllOf(HasSubstr(spec.path()), HasSubstr("big-endian")));

  spec.set_path(dir.File("norows.npy"));
  Put(spec.path(), Npy(Dict("<f4", "(0, 3)"), ""));
  EXPECT_EQ(OpenNpySource(spec).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(OpenNpySource(spec).status().message(), HasSubstr("has no rows"));

  spec.set_path(dir.File("emptyrows.npy"));
  Put(spec.path(), Npy(Dict("<f4", "(3, 0)"), ""));
  EXPECT_EQ(OpenNpySource(spec).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(OpenNpySource(spec).status().message(), HasSubstr("empty rows"));
}

// ---------------------------------------------------------------------------------------
// MakeSampleSource

TEST(MakeSampleSourceTest, DispatchesRecordsAndNpy) {
  TempDir dir;
  ferry::v1::JobSpec records;
  *records.mutable_dataset()->mutable_records() =
      RecordsSpec(dir.File("r.bin"), ferry::v1::UINT16, {2});
  Put(dir.File("r.bin"), Pattern(12));
  auto r = MakeSampleSource(records, UnconfinedDatasetFs());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->size(), 3);

  ferry::v1::JobSpec npy;
  npy.mutable_dataset()->mutable_npy()->set_path(dir.File("a.npy"));
  Put(dir.File("a.npy"), Npy(Dict("|u1", "(4, 2)"), Pattern(8)));
  auto n = MakeSampleSource(npy, UnconfinedDatasetFs());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ((*n)->size(), 4);
  EXPECT_EQ((*n)->fields()[0].dtype, ferry::v1::UINT8);

  auto none = MakeSampleSource(ferry::v1::JobSpec(), UnconfinedDatasetFs());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(),
              AllOf(HasSubstr("image_folder"), HasSubstr("tokens"), HasSubstr("webdataset"),
                    HasSubstr("records"), HasSubstr("npy")));
}

}  // namespace
}  // namespace ferry
