// Faults every reader kind must survive, injected through FaultInjectingFs: a read failing
// with EIO, short reads, a file that shrinks or is replaced while a job reads it, and
// opens and mappings that fail or come back short.
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataset/dataset_fs.h"
#include "server/dataset/fault_injecting_fs.h"
#include "server/dataset/mapped_file.h"
#include "server/dataset/record_source.h"
#include "server/dataset/sample_source.h"
#include "testing/jpeg_writer.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::ferry::testutil::EncodeJpeg;
using ::ferry::testutil::MakeTestPattern;
using ::testing::HasSubstr;
using Faults = FaultInjectingFs::Faults;

std::string Jpeg(int w, int h, uint64_t seed) {
  std::vector<uint8_t> rgb = MakeTestPattern(w, h, seed);
  std::vector<uint8_t> jpeg = EncodeJpeg(rgb.data(), w, h, /*quality=*/90);
  return std::string(jpeg.begin(), jpeg.end());
}

void Put(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Writes `bytes` to a new file and renames it over `path`, as a tool that regenerates a
// dataset does: a reader holding the old file keeps it, a new open gets the new one.
void Replace(const std::string& path, const std::string& bytes) {
  Put(path + ".new", bytes);
  ASSERT_EQ(std::rename((path + ".new").c_str(), path.c_str()), 0) << std::strerror(errno);
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

using Members = std::vector<std::pair<std::string, std::string>>;  // name, content

std::string Tar(const std::string& dir, const Members& members) {
  const std::string path = dir + "/build.tar";
  archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  archive_write_open_filename(a, path.c_str());
  for (const auto& [name, content] : members) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, static_cast<la_int64_t>(content.size()));
    archive_write_header(a, e);
    archive_write_data(a, content.data(), content.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(path);
  return bytes;
}

// A .npy (format 1.0) of `rows` x `cols` little-endian float32 values.
std::string Npy(const std::vector<float>& values, int rows, int cols) {
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", rows, ", ", cols, "), }");
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header + Bytes(values);
}

struct Rows {
  explicit Rows(const SampleSource& source) {
    for (const FieldLayout& f : source.fields()) buffers.emplace_back(f.row_bytes, 0xAB);
    for (auto& b : buffers) pointers.push_back(b.data());
  }
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<uint8_t*> pointers;
};

class DatasetFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ferry_fault_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    // A real filesystem of the test's own (its own mappings), under the faults.
    absl::StatusOr<std::shared_ptr<const DatasetFs>> real = MakeDatasetFs(DatasetAccess());
    ASSERT_TRUE(real.ok()) << real.status();
    fs_ = std::make_shared<FaultInjectingFs>(*real);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::unique_ptr<SampleSource> Make(const ferry::v1::JobSpec& spec) {
    absl::StatusOr<std::unique_ptr<SampleSource>> source = MakeSampleSource(spec, fs_);
    EXPECT_TRUE(source.ok()) << source.status();
    return source.ok() ? *std::move(source) : nullptr;
  }
  // Sample `index`'s rows, or the Fill error.
  absl::StatusOr<std::vector<std::vector<uint8_t>>> Read(const SampleSource& source, int64_t index,
                                                         SampleSource::Scratch* scratch = nullptr) {
    std::unique_ptr<SampleSource::Scratch> own;
    if (scratch == nullptr) {
      own = source.NewScratch();
      scratch = own.get();
    }
    Rows rows(source);
    absl::Status s = source.Fill(index, 7, rows.pointers, scratch);
    if (!s.ok()) return s;
    return rows.buffers;
  }

  ferry::v1::JobSpec ImageFolder() {
    fs::create_directories(Path("images/c0"));
    Put(Path("images/c0/a.jpg"), Jpeg(40, 32, 1));
    Put(Path("images/c0/b.jpg"), Jpeg(40, 32, 2));
    ferry::v1::JobSpec spec;
    spec.mutable_dataset()->mutable_image_folder()->set_root(Path("images"));
    spec.mutable_transform()->mutable_center_crop()->set_size(16);
    return spec;
  }
  ferry::v1::JobSpec WebDataset(const std::string& name, uint64_t seed) {
    Put(Path(name), Tar(dir_, {{"s0.jpg", Jpeg(40, 32, seed)},
                               {"s0.cls", "3"},
                               {"s1.jpg", Jpeg(48, 40, seed + 1)},
                               {"s1.cls", "4"}}));
    ferry::v1::JobSpec spec;
    spec.mutable_dataset()->mutable_webdataset()->add_shards(Path(name));
    spec.mutable_transform()->mutable_center_crop()->set_size(16);
    return spec;
  }
  ferry::v1::JobSpec Tokens(const std::vector<uint16_t>& tokens) {
    Put(Path("t.bin"), Bytes(tokens));
    ferry::v1::JobSpec spec;
    ferry::v1::TokensDataset* t = spec.mutable_dataset()->mutable_tokens();
    t->set_path(Path("t.bin"));
    t->set_token_dtype(ferry::v1::UINT16);
    t->set_seq_len(4);
    return spec;
  }
  ferry::v1::JobSpec Records(const std::vector<int32_t>& values) {
    Put(Path("r.bin"), Bytes(values));
    ferry::v1::JobSpec spec;
    ferry::v1::RecordsDataset* r = spec.mutable_dataset()->mutable_records();
    r->set_path(Path("r.bin"));
    r->set_dtype(ferry::v1::INT32);
    r->add_shape(2);
    return spec;
  }
  ferry::v1::JobSpec NpySpec(const std::vector<float>& values) {
    Put(Path("a.npy"), Npy(values, static_cast<int>(values.size() / 2), 2));
    ferry::v1::JobSpec spec;
    spec.mutable_dataset()->mutable_npy()->set_path(Path("a.npy"));
    return spec;
  }

  std::string dir_;
  std::shared_ptr<FaultInjectingFs> fs_;
};

template <typename T>
std::vector<T> Values(const std::vector<uint8_t>& row) {
  std::vector<T> out(row.size() / sizeof(T));
  std::memcpy(out.data(), row.data(), out.size() * sizeof(T));
  return out;
}

// ---- image folder: one open and whole-file read per sample.

TEST_F(DatasetFaultTest, ImageFolderEioIsTransientAndNamesTheFile) {
  std::unique_ptr<SampleSource> source = Make(ImageFolder());
  ASSERT_NE(source, nullptr);
  fs_->Inject("/c0/a.jpg", Faults{.read_errno = EIO});
  absl::StatusOr<std::vector<std::vector<uint8_t>>> rows = Read(*source, 0);
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kUnavailable) << rows.status();
  EXPECT_THAT(rows.status().message(),
              HasSubstr("cannot read '" + Path("images/c0/a.jpg") + "': Input/output error"));
  EXPECT_TRUE(IsTransientReadError(rows.status()));
  EXPECT_TRUE(Read(*source, 1).ok()) << "b.jpg has no fault";
  fs_->Clear();  // the I/O error passed: the retry reads the sample
  EXPECT_TRUE(Read(*source, 0).ok());
}

TEST_F(DatasetFaultTest, ImageFolderShortReadsGiveTheSameImage) {
  std::unique_ptr<SampleSource> source = Make(ImageFolder());
  ASSERT_NE(source, nullptr);
  absl::StatusOr<std::vector<std::vector<uint8_t>>> whole = Read(*source, 0);
  ASSERT_TRUE(whole.ok()) << whole.status();
  fs_->Inject("/c0/a.jpg", Faults{.max_read_bytes = 7});
  absl::StatusOr<std::vector<std::vector<uint8_t>>> pieces = Read(*source, 0);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  EXPECT_EQ(*pieces, *whole);
  EXPECT_GT(fs_->faulty_reads(), 100) << "the reader did not loop over 7-byte reads";
}

TEST_F(DatasetFaultTest, ImageFolderFileShrinkingWhileReadIsRetriedNotDecoded) {
  std::unique_ptr<SampleSource> source = Make(ImageFolder());
  ASSERT_NE(source, nullptr);
  const uint64_t size = fs::file_size(Path("images/c0/a.jpg"));
  fs_->Inject("/c0/a.jpg", Faults{.readable_bytes = size / 2});
  absl::StatusOr<std::vector<std::vector<uint8_t>>> rows = Read(*source, 0);
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kUnavailable) << rows.status();
  EXPECT_THAT(rows.status().message(),
              HasSubstr(absl::StrCat("'", Path("images/c0/a.jpg"), "' shrank from ", size, " to ",
                                     size / 2, " bytes while ferryd read it")));
}

TEST_F(DatasetFaultTest, ImageFolderFileReplacedMidRunIsReadAnew) {
  std::unique_ptr<SampleSource> source = Make(ImageFolder());
  ASSERT_NE(source, nullptr);
  absl::StatusOr<std::vector<std::vector<uint8_t>>> before = Read(*source, 0);
  ASSERT_TRUE(before.ok()) << before.status();
  Replace(Path("images/c0/a.jpg"), Jpeg(40, 32, 99));
  // Each read opens the file: the sample is the new file, whole (never a mix).
  absl::StatusOr<std::vector<std::vector<uint8_t>>> after = Read(*source, 0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_NE((*after)[0], (*before)[0]);
  std::unique_ptr<SampleSource> fresh = Make(ImageFolder());
  Replace(Path("images/c0/a.jpg"), Jpeg(40, 32, 99));
  EXPECT_EQ((*after)[0], (*Read(*fresh, 0))[0]);
}

// ---- webdataset: tar shards indexed once, members read with pread.

TEST_F(DatasetFaultTest, WebDatasetEioIsTransientAndNamesShardAndMember) {
  const ferry::v1::JobSpec spec = WebDataset("s.tar", 1);
  std::unique_ptr<SampleSource> source = Make(spec);
  ASSERT_NE(source, nullptr);
  fs_->Inject("/s.tar", Faults{.read_errno = EIO});
  absl::StatusOr<std::vector<std::vector<uint8_t>>> rows = Read(*source, 1);
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kUnavailable) << rows.status();
  EXPECT_THAT(rows.status().message(), HasSubstr("cannot read '" + Path("s.tar") + ":s1.jpg'"));
  EXPECT_THAT(rows.status().message(), HasSubstr("Input/output error"));
  // While indexing: the job is refused for now, naming the shard and where.
  absl::StatusOr<std::unique_ptr<SampleSource>> indexed = MakeSampleSource(spec, fs_);
  ASSERT_FALSE(indexed.ok());
  EXPECT_EQ(indexed.status().code(), absl::StatusCode::kUnavailable) << indexed.status();
  EXPECT_THAT(indexed.status().message(),
              HasSubstr("cannot read tar shard '" + Path("s.tar") + "' at byte 0"));
  fs_->Clear();
  EXPECT_TRUE(Read(*source, 1).ok());
}

TEST_F(DatasetFaultTest, WebDatasetShortReadsIndexAndReadTheSame) {
  const ferry::v1::JobSpec spec = WebDataset("s.tar", 1);
  std::unique_ptr<SampleSource> plain = Make(spec);
  ASSERT_NE(plain, nullptr);
  fs_->Inject("/s.tar", Faults{.max_read_bytes = 100});
  std::unique_ptr<SampleSource> shortened = Make(spec);
  ASSERT_NE(shortened, nullptr);
  ASSERT_EQ(shortened->size(), plain->size());
  for (int64_t i = 0; i < plain->size(); ++i) {
    absl::StatusOr<std::vector<std::vector<uint8_t>>> a = Read(*plain, i);
    absl::StatusOr<std::vector<std::vector<uint8_t>>> b = Read(*shortened, i);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    EXPECT_EQ(*a, *b) << "sample " << i;
  }
  EXPECT_GT(fs_->faulty_reads(), 20);
}

TEST_F(DatasetFaultTest, WebDatasetShardCutShortAfterIndexingIsDataLoss) {
  std::unique_ptr<SampleSource> source = Make(WebDataset("s.tar", 1));
  ASSERT_NE(source, nullptr);
  fs_->Inject("/s.tar", Faults{.readable_bytes = 1536});  // into the first image
  absl::StatusOr<std::vector<std::vector<uint8_t>>> rows = Read(*source, 0);
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kDataLoss) << rows.status();
  EXPECT_THAT(rows.status().message(), HasSubstr("cannot read '" + Path("s.tar") + ":s0.jpg'"));
  EXPECT_THAT(rows.status().message(), HasSubstr("the shard ends at byte 1536"));
}

TEST_F(DatasetFaultTest, WebDatasetShardReplacedMidRunIsReadConsistentlyOrRefused) {
  std::unique_ptr<SampleSource> source = Make(WebDataset("s.tar", 1));
  ASSERT_NE(source, nullptr);
  std::unique_ptr<SampleSource::Scratch> open = source->NewScratch();
  absl::StatusOr<std::vector<std::vector<uint8_t>>> first = Read(*source, 0, open.get());
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::vector<std::vector<uint8_t>>> expected = Read(*source, 1);
  ASSERT_TRUE(expected.ok()) << expected.status();
  // Another shard (other images: other offsets) renamed over the path.
  Replace(Path("s.tar"), Tar(dir_, {{"s0.jpg", Jpeg(64, 48, 50)}, {"s0.cls", "9"}}));
  // A worker that has the shard open keeps reading the file it indexed.
  absl::StatusOr<std::vector<std::vector<uint8_t>>> kept = Read(*source, 1, open.get());
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, *expected);
  // One that opens it now gets the new file, and refuses to read it at the old offsets.
  absl::StatusOr<std::vector<std::vector<uint8_t>>> reopened = Read(*source, 1);
  ASSERT_FALSE(reopened.ok());
  EXPECT_EQ(reopened.status().code(), absl::StatusCode::kDataLoss) << reopened.status();
  EXPECT_THAT(reopened.status().message(),
              HasSubstr("webdataset shard '" + Path("s.tar") +
                        "' was replaced or rewritten after the job indexed it"));
  EXPECT_THAT(reopened.status().message(), HasSubstr("create it again"));
}

// ---- tokens, records, npy: one mapping per file, shared by the jobs over it.

TEST_F(DatasetFaultTest, TokensOpenErrorsKeepTheirClass) {
  const ferry::v1::JobSpec spec = Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9});
  fs_->Inject("/t.bin", Faults{.open_errno = EIO});
  absl::StatusOr<std::unique_ptr<SampleSource>> source = MakeSampleSource(spec, fs_);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnavailable) << source.status();
  EXPECT_THAT(source.status().message(),
              HasSubstr("cannot open '" + Path("t.bin") + "': Input/output error"));
  fs_->Inject("/t.bin", Faults{.open_errno = EMFILE});
  source = MakeSampleSource(spec, fs_);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kResourceExhausted) << source.status();
  EXPECT_TRUE(IsTransientReadError(source.status()));
}

TEST_F(DatasetFaultTest, TokensMappingShorterThanTheFileIsMeasuredNotOverrun) {
  const ferry::v1::JobSpec spec = Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9});
  fs_->Inject("/t.bin", Faults{.mapped_bytes = 9});
  absl::StatusOr<std::unique_ptr<SampleSource>> source = MakeSampleSource(spec, fs_);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << source.status();
  EXPECT_THAT(source.status().message(),
              HasSubstr("token file '" + Path("t.bin") + "' is 9 bytes, not a multiple of 2"));
  fs_->Inject("/t.bin", Faults{.mapped_bytes = 8});
  source = MakeSampleSource(spec, fs_);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kFailedPrecondition) << source.status();
  EXPECT_THAT(source.status().message(), HasSubstr("holds 4 tokens, fewer than one sample"));
  fs_->Inject("/t.bin", Faults{.mapped_bytes = 12});  // 6 tokens: one sample of 5, not two
  source = MakeSampleSource(spec, fs_);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->size(), 1);
}

TEST_F(DatasetFaultTest, TokensFileReplacedMidRunKeepsItsMapping) {
  std::unique_ptr<SampleSource> source = Make(Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9}));
  ASSERT_NE(source, nullptr);
  Replace(Path("t.bin"), Bytes(std::vector<uint16_t>{11, 12, 13, 14, 15, 16, 17, 18, 19}));
  absl::StatusOr<std::vector<std::vector<uint8_t>>> rows = Read(*source, 1);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(Values<int64_t>((*rows)[0]), ::testing::ElementsAre(5, 6, 7, 8, 9));
  // A job created now maps the new file.
  std::unique_ptr<SampleSource> fresh = Make(Tokens({11, 12, 13, 14, 15, 16, 17, 18, 19}));
  ASSERT_NE(fresh, nullptr);
  EXPECT_THAT(Values<int64_t>((*Read(*fresh, 1))[0]), ::testing::ElementsAre(15, 16, 17, 18, 19));
}

TEST_F(DatasetFaultTest, RecordsOpenErrorAndShortMappingNameTheFile) {
  const ferry::v1::JobSpec spec = Records({1, 2, 3, 4, 5, 6});
  fs_->Inject("/r.bin", Faults{.open_errno = EIO});
  absl::StatusOr<std::unique_ptr<SampleSource>> source = MakeSampleSource(spec, fs_);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnavailable) << source.status();
  EXPECT_THAT(source.status().message(), HasSubstr("cannot open '" + Path("r.bin") + "'"));
  fs_->Inject("/r.bin", Faults{.mapped_bytes = 20});
  source = MakeSampleSource(spec, fs_);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kFailedPrecondition) << source.status();
  EXPECT_THAT(source.status().message(),
              HasSubstr("records file '" + Path("r.bin") + "' is 20 bytes"));
  EXPECT_THAT(source.status().message(), HasSubstr("not a multiple of the record size 8"));
}

TEST_F(DatasetFaultTest, RecordsFileReplacedMidRunKeepsItsMapping) {
  std::unique_ptr<SampleSource> source = Make(Records({1, 2, 3, 4, 5, 6}));
  ASSERT_NE(source, nullptr);
  const std::optional<DirectRows> direct = source->direct_rows();
  ASSERT_TRUE(direct.has_value());
  Replace(Path("r.bin"), Bytes(std::vector<int32_t>{-1, -2, -3, -4, -5, -6}));
  absl::StatusOr<std::vector<std::vector<uint8_t>>> rows = Read(*source, 2);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(Values<int32_t>((*rows)[0]), ::testing::ElementsAre(5, 6));
  EXPECT_EQ(source->direct_rows()->mapping, direct->mapping);  // the registered range holds
  std::unique_ptr<SampleSource> fresh = Make(Records({-1, -2, -3, -4, -5, -6}));
  ASSERT_NE(fresh, nullptr);
  EXPECT_NE(fresh->direct_rows()->mapping, direct->mapping);
  EXPECT_THAT(Values<int32_t>((*Read(*fresh, 2))[0]), ::testing::ElementsAre(-5, -6));
}

TEST_F(DatasetFaultTest, NpyOpenErrorAndShortMappingNameTheFile) {
  const ferry::v1::JobSpec spec = NpySpec({1, 2, 3, 4, 5, 6});
  fs_->Inject("/a.npy", Faults{.open_errno = EIO});
  absl::StatusOr<std::unique_ptr<SampleSource>> source = MakeSampleSource(spec, fs_);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnavailable) << source.status();
  EXPECT_THAT(source.status().message(), HasSubstr("cannot open '" + Path("a.npy") + "'"));
  // The header and 1.5 of the 3 rows.
  fs_->Inject("/a.npy", Faults{.mapped_bytes = fs::file_size(Path("a.npy")) - 12});
  source = MakeSampleSource(spec, fs_);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kFailedPrecondition) << source.status();
  EXPECT_THAT(source.status().message(), HasSubstr("npy file '" + Path("a.npy") + "' is truncated"))
      << source.status();
  fs_->Inject("/a.npy", Faults{.mapped_bytes = 6});  // inside the preamble
  source = MakeSampleSource(spec, fs_);
  EXPECT_EQ(source.status().code(), absl::StatusCode::kFailedPrecondition) << source.status();
  EXPECT_THAT(source.status().message(), HasSubstr("too short to be a .npy file"));
}

TEST_F(DatasetFaultTest, NpyFileReplacedMidRunKeepsItsMapping) {
  std::unique_ptr<SampleSource> source = Make(NpySpec({1, 2, 3, 4, 5, 6}));
  ASSERT_NE(source, nullptr);
  Replace(Path("a.npy"), Npy({7, 8, 9, 10}, 2, 2));
  EXPECT_EQ(source->size(), 3);
  absl::StatusOr<std::vector<std::vector<uint8_t>>> rows = Read(*source, 2);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_THAT(Values<float>((*rows)[0]), ::testing::ElementsAre(5.0f, 6.0f));
  std::unique_ptr<SampleSource> fresh = Make(NpySpec({7, 8, 9, 10}));
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->size(), 2);
}

// The mappings belong to a DatasetFs, not to the process: jobs through one share a file's
// mapping (the GPU transport registers it once); another DatasetFs has its own.
TEST_F(DatasetFaultTest, MappingsAreSharedWithinOneDatasetFsOnly) {
  Put(Path("m.bin"), std::string(4096, 'x'));
  absl::StatusOr<std::shared_ptr<const MappedFile>> a = fs_->MapFile(Path("m.bin"));
  absl::StatusOr<std::shared_ptr<const MappedFile>> b = fs_->MapFile(Path("m.bin"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  absl::StatusOr<std::shared_ptr<const DatasetFs>> other = MakeDatasetFs(DatasetAccess());
  ASSERT_TRUE(other.ok());
  absl::StatusOr<std::shared_ptr<const MappedFile>> c = (*other)->MapFile(Path("m.bin"));
  ASSERT_TRUE(c.ok());
  EXPECT_NE((*c)->bytes().data(), (*a)->bytes().data());
  EXPECT_EQ((*c)->identity(), (*a)->identity());
}

}  // namespace
}  // namespace ferry
