// WebDatasetSource: grouping of tar members into samples, fields, errors and the stream order.
// Shards are written with libarchive (pax, as WebDataset's writers produce them).
#include "server/dataset/webdataset_source.h"

#include <archive.h>
#include <archive_entry.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataset/dataset_fs.h"
#include "server/dataset/image_folder_source.h"
#include "server/dataset/mapped_file.h"
#include "server/dataset/sample_source.h"
#include "server/dataset/tar_index.h"
#include "server/decode/exif.h"
#include "server/decode/image_transform.h"
#include "testing/jpeg_writer.h"
#include "testing/png_writer.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::ferry::testutil::EncodeJpeg;
using ::ferry::testutil::MakeTestPattern;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ferry_wds_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string Jpeg(int w, int h, uint64_t seed) {
  std::vector<uint8_t> rgb = MakeTestPattern(w, h, seed);
  std::vector<uint8_t> jpeg = EncodeJpeg(rgb.data(), w, h, /*quality=*/90);
  return std::string(jpeg.begin(), jpeg.end());
}

using Members = std::vector<std::pair<std::string, std::string>>;  // name, content

void WriteTar(const std::string& path, const Members& members) {
  archive* a = archive_write_new();
  ASSERT_EQ(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK) << archive_error_string(a);
  for (const auto& [name, content] : members) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, static_cast<la_int64_t>(content.size()));
    ASSERT_EQ(archive_write_header(a, e), ARCHIVE_OK) << archive_error_string(a);
    if (!content.empty()) archive_write_data(a, content.data(), content.size());
    archive_entry_free(e);
  }
  ASSERT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
}

ferry::v1::JobSpec Spec(const std::vector<std::string>& shards, uint32_t size = 24) {
  ferry::v1::JobSpec spec;
  ferry::v1::WebDataset* wds = spec.mutable_dataset()->mutable_webdataset();
  for (const std::string& s : shards) wds->add_shards(s);
  spec.mutable_transform()->mutable_random_resized_crop()->set_size(size);
  return spec;
}

struct Rows {
  explicit Rows(const SampleSource& source) {
    for (const FieldLayout& f : source.fields()) buffers.emplace_back(f.row_bytes, 0xAB);
    for (auto& b : buffers) pointers.push_back(b.data());
  }
  int64_t Int64(size_t field) const {
    int64_t v;
    std::memcpy(&v, buffers[field].data(), sizeof(v));
    return v;
  }
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<uint8_t*> pointers;
};

WebDatasetSource* AsWds(const std::unique_ptr<SampleSource>& source) {
  return static_cast<WebDatasetSource*>(source.get());
}

class WebDatasetSourceTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.path() + "/" + name; }

  // Shards <stem>0.tar .. <stem>2.tar of 2, 3 and 4 samples "k<shard>_<i>", labels
  // 10 * shard + i.
  void WriteThreeShards(const std::string& stem) {
    for (int s = 0; s < 3; ++s) {
      Members members;
      for (int i = 0; i < 2 + s; ++i) {
        members.push_back({absl::StrCat("k", s, "_", i, ".jpg"), Jpeg(24, 20, 10 * s + i)});
        members.push_back({absl::StrCat("k", s, "_", i, ".cls"), absl::StrCat(10 * s + i)});
      }
      WriteTar(Path(absl::StrCat(stem, s, ".tar")), members);
    }
  }

  std::unique_ptr<SampleSource> Make(const ferry::v1::JobSpec& spec,
                                     const DecodeLimits& limits = DecodeLimits()) {
    SourceOptions options;
    options.limits = limits;
    absl::StatusOr<std::unique_ptr<SampleSource>> source =
        MakeSampleSource(spec, UnconfinedDatasetFs(), options);
    EXPECT_TRUE(source.ok()) << source.status();
    return source.ok() ? *std::move(source) : nullptr;
  }

  TempDir dir_;
};

TEST_F(WebDatasetSourceTest, GroupsMembersIntoSamples) {
  WriteTar(Path("a.tar"), {
                              {"s/n01_0001.cls", " 3\n"},  // label before image: fine
                              {"s/n01_0001.jpg", Jpeg(40, 30, 1)},
                              {"s/n01_0002.jpeg", Jpeg(30, 40, 2)},  // no label: -1
                              {"s/n01_0002.json", "{}"},
                              {"s/n01_0003.cls", "5"},  // no image: skipped
                              {"README", "no extension"},
                              {"dir.v2/x.y.JPG", Jpeg(32, 32, 3)},  // basename "dir.v2/x"
                              {"dir.v2/x.y.jpg", Jpeg(32, 32, 4)},  // ext "y.jpg" != "jpg"
                              {"n01_0004.JPG", Jpeg(20, 20, 5)},
                              {"n01_0004.CLS", "-7"},
                              {"n01_0004.jpg", Jpeg(20, 20, 6)},  // repeat: ignored
                              {"n01_0001.jpg", Jpeg(24, 24, 7)},  // basename again: new
                          });
  std::unique_ptr<SampleSource> source = Make(Spec({Path("a.tar")}));
  ASSERT_NE(source, nullptr);
  std::vector<std::string> described;
  for (int64_t i = 0; i < source->size(); ++i) described.push_back(source->Describe(i));
  EXPECT_THAT(described,
              ElementsAre(Path("a.tar") + ":s/n01_0001.jpg", Path("a.tar") + ":s/n01_0002.jpeg",
                          Path("a.tar") + ":n01_0004.JPG", Path("a.tar") + ":n01_0001.jpg"));
  const WebDatasetSource::Stats& stats = AsWds(source)->stats();
  EXPECT_EQ(stats.shards, 1);
  EXPECT_EQ(stats.members, 12);
  EXPECT_EQ(stats.samples_without_image, 2);  // n01_0003 and dir.v2/x
  EXPECT_EQ(stats.members_ignored, 2);        // README and the repeated n01_0004.jpg
  EXPECT_EQ(stats.truncated_shards, 0);

  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  const int64_t want_labels[] = {3, -1, -7, -1};
  for (int64_t i = 0; i < source->size(); ++i) {
    Rows rows(*source);
    absl::Status s = source->Fill(i, i, rows.pointers, scratch.get());
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(rows.Int64(1), want_labels[i]) << described[i];
    EXPECT_EQ(rows.Int64(2), i);
  }
}

TEST_F(WebDatasetSourceTest, FillDecodesExactlyAsImageFolderDoes) {
  const std::string jpegs[] = {Jpeg(96, 80, 11), Jpeg(50, 70, 12), Jpeg(64, 64, 13)};
  WriteTar(Path("s.tar"), {{"0.jpg", jpegs[0]},
                           {"0.cls", "0"},
                           {"1.jpg", jpegs[1]},
                           {"1.cls", "1"},
                           {"2.jpg", jpegs[2]}});
  ferry::v1::JobSpec spec = Spec({Path("s.tar")}, 32);
  spec.mutable_transform()->mutable_random_resized_crop()->set_flip(true);
  std::unique_ptr<SampleSource> source = Make(spec);
  ASSERT_NE(source, nullptr);
  absl::StatusOr<ImageTransform> t = ImageTransformFromSpec(spec.transform());
  ASSERT_TRUE(t.ok());
  const auto& f = source->fields();
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].name, "image");
  EXPECT_THAT(f[0].shape, ElementsAre(32, 32, 3));
  EXPECT_EQ(f[1].name, "label");
  EXPECT_EQ(f[2].name, "index");
  ImageDecoder decoder;
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  for (int64_t i : {0, 2, 1}) {
    const std::vector<uint8_t> bytes(jpegs[i].begin(), jpegs[i].end());
    std::vector<uint8_t> want(32 * 32 * 3);
    Rng rng(MixSeed(5, 1, i));
    ASSERT_TRUE(DecodeAndTransform(decoder, bytes, *t, rng, absl::MakeSpan(want)).ok());
    Rows rows(*source);
    ASSERT_TRUE(source->Fill(i, MixSeed(5, 1, i), rows.pointers, scratch.get()).ok());
    EXPECT_EQ(rows.buffers[0], want) << i;
  }
}

TEST_F(WebDatasetSourceTest, ShardsNumberedInPatternOrderAndReadInAnyOrder) {
  WriteThreeShards("shard-0");
  std::unique_ptr<SampleSource> source = Make(Spec({Path("shard-{00..02}.tar")}));
  ASSERT_NE(source, nullptr);
  ASSERT_EQ(source->size(), 2 + 3 + 4);
  EXPECT_THAT(AsWds(source)->shard_begin(), ElementsAre(0, 2, 5, 9));
  EXPECT_EQ(source->Describe(2), Path("shard-01.tar") + ":k1_0.jpg");
  // Alternate between shards through one scratch (it caches the last shard's fd).
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  const int64_t want[] = {0, 1, 10, 11, 12, 20, 21, 22, 23};
  for (int64_t i : {8, 0, 4, 5, 1, 2, 7, 3, 6}) {
    Rows rows(*source);
    ASSERT_TRUE(source->Fill(i, 1, rows.pointers, scratch.get()).ok());
    EXPECT_EQ(rows.Int64(1), want[i]);
  }
}

// The real filesystem, counting opens; the next `fail` opens fail with `failure`, and the
// daemon "stops" (stopping()) at the open that reaches stop_at.
class CountingFs final : public DatasetFs {
 public:
  explicit CountingFs(int stop_at = 0) : stop_at_(stop_at) {}
  absl::Status CheckPath(const std::string& path) const override { return fs_->CheckPath(path); }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
      const std::string& path) const override {
    if (opens_.fetch_add(1) + 1 == stop_at_) stopping_->store(true);
    if (fail_.load() > 0) {
      fail_.fetch_sub(1);
      return failure_;
    }
    return fs_->OpenFile(path);
  }
  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFile(
      const std::string& path) const override {
    return fs_->MapFile(path);
  }
  absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string& path) const override {
    return fs_->ListDirectory(path);
  }
  int opens() const { return opens_.load(); }
  std::shared_ptr<std::atomic<bool>> stopping() const { return stopping_; }
  void FailNext(int opens, absl::Status failure) {
    failure_ = std::move(failure);
    fail_.store(opens);
  }

 private:
  const std::shared_ptr<const DatasetFs> fs_ = UnconfinedDatasetFs();
  const int stop_at_;
  const std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
  mutable std::atomic<int> opens_{0};
  mutable std::atomic<int> fail_{0};
  absl::Status failure_;
};

TEST_F(WebDatasetSourceTest, IndexingGivesUpWhenTheDaemonStops) {
  constexpr int kShards = 400;
  const std::string jpeg = Jpeg(8, 8, 1);
  for (int s = 0; s < kShards; ++s) {
    WriteTar(Path(absl::StrCat("stop-", s, ".tar")), {{"a.jpg", jpeg}, {"a.cls", "1"}});
  }
  auto counting = std::make_shared<CountingFs>(/*stop_at=*/10);
  std::shared_ptr<const DatasetFs> fs = StoppableDatasetFs(counting, counting->stopping());
  absl::StatusOr<std::unique_ptr<SampleSource>> source =
      MakeSampleSource(Spec({Path(absl::StrCat("stop-{0..", kShards - 1, "}.tar"))}), fs);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kUnavailable) << source.status();
  EXPECT_THAT(source.status().message(), HasSubstr("ferryd is stopping"));
  // Each indexing thread finishes the shard it has open, then stops.
  EXPECT_LT(counting->opens(), 40) << "indexing went on after the daemon began to stop";
}

TEST_F(WebDatasetSourceTest, BadSamplesAreDataLossNamingShardAndMember) {
  const std::string good = Jpeg(40, 40, 1);
  WriteTar(Path("bad.tar"), {{"ok.jpg", good},
                             {"ok.cls", "1"},
                             {"corrupt.jpg", good.substr(0, 20) + std::string(200, '\x55')},
                             {"text.jpg", "this is not a JPEG at all"},
                             {"empty.jpg", ""},
                             {"word.jpg", good},
                             {"word.Cls", "cat"},
                             {"big.jpg", good},
                             {"biglabel.jpg", good},
                             {"biglabel.cls", std::string(100, '1')}});
  DecodeLimits limits;
  limits.max_sample_bytes = good.size();
  std::unique_ptr<SampleSource> source = Make(Spec({Path("bad.tar")}), limits);
  ASSERT_NE(source, nullptr);
  ASSERT_EQ(source->size(), 7);
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  struct Case {
    int64_t index;
    std::string message;
  };
  const std::string shard = Path("bad.tar");
  const Case cases[] = {
      {1, "cannot decode '" + shard + ":corrupt.jpg'"},
      {2, "cannot decode '" + shard + ":text.jpg'"},
      {3, "'" + shard + ":empty.jpg' is empty"},
      {4, "'" + shard + ":word.Cls' is not a decimal integer label: \"cat\""},
      {6, "'" + shard + ":biglabel.cls' is 100 bytes"},
  };
  for (const Case& c : cases) {
    Rows rows(*source);
    absl::Status s = source->Fill(c.index, 1, rows.pointers, scratch.get());
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.message << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
  Rows rows(*source);
  EXPECT_TRUE(source->Fill(0, 1, rows.pointers, scratch.get()).ok());
  EXPECT_TRUE(source->Fill(5, 1, rows.pointers, scratch.get()).ok());  // exactly at the limit

  limits.max_sample_bytes = good.size() - 1;
  std::unique_ptr<SampleSource> strict = Make(Spec({Path("bad.tar")}), limits);
  ASSERT_NE(strict, nullptr);
  std::unique_ptr<SampleSource::Scratch> strict_scratch = strict->NewScratch();
  absl::Status s = strict->Fill(5, 1, rows.pointers, strict_scratch.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("refused '" + shard + ":big.jpg'"));
  EXPECT_THAT(s.message(), HasSubstr("decode_limits.max_sample_bytes"));
}

TEST_F(WebDatasetSourceTest, TruncatedShardKeepsItsCompleteSamples) {
  Members members;
  for (int i = 0; i < 4; ++i) {
    members.push_back({absl::StrCat(i, ".jpg"), Jpeg(32, 32, i)});
    members.push_back({absl::StrCat(i, ".cls"), absl::StrCat(i)});
  }
  WriteTar(Path("cut.tar"), members);
  WriteTar(Path("whole.tar"), {{"w.jpg", Jpeg(16, 16, 9)}, {"w.cls", "9"}});
  // Cut inside the last image.
  const uint64_t size = fs::file_size(Path("cut.tar"));
  fs::resize_file(Path("cut.tar"), size - 1024 - 2 * 512 - 300);
  std::unique_ptr<SampleSource> source = Make(Spec({Path("cut.tar"), Path("whole.tar")}));
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->size(), 3 + 1);
  EXPECT_EQ(AsWds(source)->stats().truncated_shards, 1);
  EXPECT_EQ(source->Describe(3), Path("whole.tar") + ":w.jpg");
  EXPECT_EQ(AsWds(source)->stats().truncated_samples, 0);  // the cut starts sample 3
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  for (int64_t i = 0; i < source->size(); ++i) {
    Rows rows(*source);
    ASSERT_TRUE(source->Fill(i, 1, rows.pointers, scratch.get()).ok()) << i;
  }

  // Cut inside a sample's label: the image before it is whole, but the sample is dropped
  // rather than served with label -1.
  WriteTar(Path("label-cut.tar"), {{"a.jpg", Jpeg(16, 16, 1)},
                                   {"a.cls", "1"},
                                   {"b.jpg", Jpeg(16, 16, 2)},
                                   {"b.cls", std::string(40, '2')}});
  absl::StatusOr<TarIndex> index = IndexTarFile(Path("label-cut.tar"));
  ASSERT_TRUE(index.ok());
  ASSERT_EQ(index->members.size(), 4u);
  fs::resize_file(Path("label-cut.tar"), index->members[3].data_offset + 10);
  source = Make(Spec({Path("label-cut.tar")}));
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->size(), 1);
  EXPECT_EQ(AsWds(source)->stats().truncated_samples, 1);
}

TEST_F(WebDatasetSourceTest, CreateErrorsNameTheProblem) {
  WriteTar(Path("good.tar"), {{"a.jpg", Jpeg(16, 16, 1)}});
  WriteTar(Path("labels.tar"), {{"a.cls", "1"}, {"b.txt", "x"}});
  // Damage the second header's checksum.
  WriteTar(Path("damaged.tar"), {{"a.jpg", Jpeg(16, 16, 1)}, {"a.cls", "1"}});
  absl::StatusOr<TarIndex> index = IndexTarFile(Path("damaged.tar"));
  ASSERT_TRUE(index.ok());
  // pax_restricted writes plain ustar headers for these names: member 1's header is
  // 512 bytes before its data.
  const uint64_t header = index->members[1].data_offset - 512;
  {
    std::FILE* f = std::fopen(Path("damaged.tar").c_str(), "r+b");
    std::fseek(f, static_cast<long>(header + 148), SEEK_SET);
    std::fputc('7', f);
    std::fclose(f);
  }

  struct Case {
    ferry::v1::JobSpec spec;
    absl::StatusCode code;
    std::string message;
  };
  ferry::v1::JobSpec same_keys = Spec({Path("good.tar")});
  same_keys.mutable_dataset()->mutable_webdataset()->set_image_key("JPEG");
  same_keys.mutable_dataset()->mutable_webdataset()->set_label_key("jpg");
  ferry::v1::JobSpec no_transform = Spec({Path("good.tar")});
  no_transform.clear_transform();
  const Case cases[] = {
      {Spec({}), absl::StatusCode::kInvalidArgument,
       "dataset.webdataset.shards must list at least one"},
      {Spec({Path("missing-{0..1}.tar")}), absl::StatusCode::kNotFound,
       "dataset path '" + Path("missing-0.tar") + "' does not exist"},
      {Spec({Path("bad-{1..0}.tar")}), absl::StatusCode::kInvalidArgument, "bad-{1..0}.tar"},
      {Spec({Path("good.tar"), Path("damaged.tar")}), absl::StatusCode::kFailedPrecondition,
       absl::StrCat("webdataset shard '", Path("damaged.tar"),
                    "' is damaged: corrupt tar "
                    "header in '",
                    Path("damaged.tar"), "' at byte ", header)},
      {Spec({Path("labels.tar")}), absl::StatusCode::kFailedPrecondition,
       "(1 shards, 2 files) hold no sample with an image member '<basename>.jpg'"},
      {same_keys, absl::StatusCode::kInvalidArgument, "image_key and label_key must differ"},
      {no_transform, absl::StatusCode::kInvalidArgument, "transform must be set"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<SampleSource>> source =
        MakeSampleSource(c.spec, UnconfinedDatasetFs());
    EXPECT_EQ(source.status().code(), c.code) << c.message << ": " << source.status();
    EXPECT_THAT(source.status().message(), HasSubstr(c.message));
  }
}

TEST_F(WebDatasetSourceTest, CustomKeys) {
  WriteTar(Path("k.tar"),
           {{"a.input.jpg", Jpeg(16, 16, 1)}, {"a.target", "4"}, {"a.jpg", "unused"}});
  ferry::v1::JobSpec spec = Spec({Path("k.tar")});
  spec.mutable_dataset()->mutable_webdataset()->set_image_key(".input.jpg");
  spec.mutable_dataset()->mutable_webdataset()->set_label_key("TARGET");
  std::unique_ptr<SampleSource> source = Make(spec);
  ASSERT_NE(source, nullptr);
  ASSERT_EQ(source->size(), 1);
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  Rows rows(*source);
  ASSERT_TRUE(source->Fill(0, 1, rows.pointers, scratch.get()).ok());
  EXPECT_EQ(rows.Int64(1), 4);
}

TEST_F(WebDatasetSourceTest, PngMembersDecodeByContentWithExifOrientation) {
  // image_key "png": a PNG stored on its side (EXIF orientation 8) and a JPEG named .png.
  const int w = 30, h = 20;
  const std::vector<uint8_t> stored = MakeTestPattern(w, h, 4);
  testutil::PngEncodeOptions o;
  o.exif = testutil::ExifWithOrientation(8, false);
  const std::vector<uint8_t> png =
      testutil::EncodePng(std::vector<uint16_t>(stored.begin(), stored.end()), w, h, o);
  WriteTar(Path("p.tar"), {{"a.png", std::string(png.begin(), png.end())},
                           {"a.cls", "1"},
                           {"b.png", Jpeg(h, h, 5)},
                           {"b.jpg", "not the image member"}});
  std::vector<uint8_t> upright(stored.size());
  ApplyExifOrientation(8, stored.data(), w, h, upright.data());
  for (bool on : {false, true}) {
    ferry::v1::JobSpec spec = Spec({Path("p.tar")});
    spec.mutable_dataset()->mutable_webdataset()->set_image_key("png");
    spec.mutable_dataset()->mutable_webdataset()->set_exif_orientation(on);
    spec.mutable_transform()->mutable_center_crop()->set_size(h);
    spec.mutable_transform()->mutable_center_crop()->set_resize(h);
    std::unique_ptr<SampleSource> source = Make(spec);
    ASSERT_NE(source, nullptr);
    ASSERT_EQ(source->size(), 2);
    std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
    Rows a(*source), b(*source);
    ASSERT_TRUE(source->Fill(0, 1, a.pointers, scratch.get()).ok());
    ASSERT_TRUE(source->Fill(1, 1, b.pointers, scratch.get()).ok());
    EXPECT_EQ(a.Int64(1), 1);
    // The central h x h square of the 30 x 20 stored image, or of the 20 x 30 upright one.
    std::vector<uint8_t> want;
    const int left = on ? 0 : (w - h) / 2, top = on ? (w - h) / 2 : 0;
    const int width = on ? h : w;
    const std::vector<uint8_t>& from = on ? upright : stored;
    for (int y = top; y < top + h; ++y) {
      const uint8_t* row = from.data() + (static_cast<size_t>(y) * width + left) * 3;
      want.insert(want.end(), row, row + static_cast<size_t>(h) * 3);
    }
    EXPECT_EQ(a.buffers[0], want) << "exif_orientation " << on;
  }
}

// ---------------------------------------------------------------------------------------
// Shards with their counts (shard_samples, from a shard index): indexed when first read.

class CountedShardsTest : public WebDatasetSourceTest {
 protected:
  ferry::v1::JobSpec Counted(const std::vector<uint64_t>& counts) {
    ferry::v1::JobSpec spec = Spec({Path("c-{0..2}.tar")});
    for (uint64_t n : counts) spec.mutable_dataset()->mutable_webdataset()->add_shard_samples(n);
    return spec;
  }
  std::unique_ptr<SampleSource> MakeOn(const ferry::v1::JobSpec& spec,
                                       std::shared_ptr<const DatasetFs> fs) {
    absl::StatusOr<std::unique_ptr<SampleSource>> source = MakeSampleSource(spec, std::move(fs));
    EXPECT_TRUE(source.ok()) << source.status();
    return source.ok() ? *std::move(source) : nullptr;
  }
};

TEST_F(CountedShardsTest, CreateOpensNoShardAndSamplesComeOutAsIndexedOnes) {
  WriteThreeShards("c-");
  auto counting = std::make_shared<CountingFs>();
  std::unique_ptr<SampleSource> counted = MakeOn(Counted({2, 3, 4}), counting);
  ASSERT_NE(counted, nullptr);
  EXPECT_EQ(counting->opens(), 0);
  EXPECT_EQ(counted->size(), 9);
  EXPECT_THAT(AsWds(counted)->shard_begin(), ElementsAre(0, 2, 5, 9));
  EXPECT_EQ(counted->FileOf(4), Path("c-1.tar"));
  EXPECT_EQ(counted->Describe(4), Path("c-1.tar") + ": sample 2");  // not read yet

  std::unique_ptr<SampleSource> indexed = Make(Spec({Path("c-{0..2}.tar")}));
  ASSERT_NE(indexed, nullptr);
  for (bool shuffle : {false, true}) {
    std::vector<int64_t> a, b;
    counted->StreamOrder(7, 2, shuffle, &a);
    indexed->StreamOrder(7, 2, shuffle, &b);
    EXPECT_EQ(a, b);
  }
  std::unique_ptr<SampleSource::Scratch> x = counted->NewScratch(), y = indexed->NewScratch();
  for (int64_t i : {8, 0, 4, 5, 1, 2, 7, 3, 6}) {
    Rows got(*counted), want(*indexed);
    ASSERT_TRUE(counted->Fill(i, 3, got.pointers, x.get()).ok()) << i;
    ASSERT_TRUE(indexed->Fill(i, 3, want.pointers, y.get()).ok()) << i;
    EXPECT_EQ(got.buffers, want.buffers) << i;
    EXPECT_EQ(counted->Describe(i), indexed->Describe(i));
  }
  // Each shard is indexed once: in this order every Fill opens another shard (the second
  // pass starts on the shard the first ended on), and no shard is indexed again.
  EXPECT_EQ(counting->opens(), 3 + 9);
  for (int64_t i : {8, 0, 4, 5, 1, 2, 7, 3, 6}) {
    Rows rows(*counted);
    ASSERT_TRUE(counted->Fill(i, 3, rows.pointers, x.get()).ok()) << i;
  }
  EXPECT_EQ(counting->opens(), 3 + 9 + 8);
}

TEST_F(CountedShardsTest, ManyWorkersMeetingAShardFirstIndexItOnce) {
  WriteThreeShards("c-");
  std::unique_ptr<SampleSource> counted = MakeOn(Counted({2, 3, 4}), UnconfinedDatasetFs());
  std::unique_ptr<SampleSource> indexed = Make(Spec({Path("c-{0..2}.tar")}));
  ASSERT_NE(counted, nullptr);
  ASSERT_NE(indexed, nullptr);
  std::vector<std::vector<uint8_t>> want;
  std::unique_ptr<SampleSource::Scratch> scratch = indexed->NewScratch();
  for (int64_t i = 0; i < indexed->size(); ++i) {
    Rows rows(*indexed);
    ASSERT_TRUE(indexed->Fill(i, 5, rows.pointers, scratch.get()).ok());
    want.push_back(rows.buffers[0]);
  }
  constexpr int kThreads = 8;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<SampleSource::Scratch> mine = counted->NewScratch();
      for (int64_t k = 0; k < counted->size(); ++k) {
        const int64_t i = (k * 5 + t) % counted->size();
        Rows rows(*counted);
        if (!counted->Fill(i, 5, rows.pointers, mine.get()).ok() || rows.buffers[0] != want[i] ||
            counted->Describe(i) != indexed->Describe(i)) {
          wrong.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(CountedShardsTest, AShardWithAnotherCountStopsTheJob) {
  WriteThreeShards("c-");
  for (const std::vector<uint64_t>& counts :
       {std::vector<uint64_t>{2, 5, 4}, std::vector<uint64_t>{2, 2, 4}}) {
    std::unique_ptr<SampleSource> source = MakeOn(Counted(counts), UnconfinedDatasetFs());
    ASSERT_NE(source, nullptr);
    std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
    Rows rows(*source);
    EXPECT_TRUE(source->Fill(0, 1, rows.pointers, scratch.get()).ok());
    absl::Status s = source->Fill(2, 1, rows.pointers, scratch.get());
    EXPECT_TRUE(IsDatasetChanged(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("webdataset shard '" + Path("c-1.tar") + "' holds 3 "));
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("says ", counts[1])));
    EXPECT_THAT(s.message(), HasSubstr("Make the index again"));
    // Every sample of that shard fails so, without reading it again; the others are served.
    EXPECT_TRUE(IsDatasetChanged(source->Fill(3, 1, rows.pointers, scratch.get())));
    EXPECT_TRUE(source->Fill(source->size() - 1, 1, rows.pointers, scratch.get()).ok());
  }
}

TEST_F(CountedShardsTest, ASampleWithoutImageOrPastACutIsABadSample) {
  WriteTar(Path("c-0.tar"), {{"a.jpg", Jpeg(16, 16, 1)},
                             {"a.cls", "1"},
                             {"b.cls", "2"},  // no image: a bad sample, not skipped
                             {"c.jpg", Jpeg(16, 16, 3)}});
  Members members;
  for (int i = 0; i < 4; ++i) {
    members.push_back({absl::StrCat(i, ".jpg"), Jpeg(32, 32, i)});
    members.push_back({absl::StrCat(i, ".cls"), absl::StrCat(i)});
  }
  WriteTar(Path("c-1.tar"), members);
  fs::resize_file(Path("c-1.tar"), fs::file_size(Path("c-1.tar")) - 1024 - 2 * 512 - 300);
  WriteTar(Path("c-2.tar"), {{"z.jpg", Jpeg(16, 16, 9)}});
  std::unique_ptr<SampleSource> source = MakeOn(Counted({3, 4, 1}), UnconfinedDatasetFs());
  ASSERT_NE(source, nullptr);
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  for (int64_t i = 0; i < source->size(); ++i) {
    Rows rows(*source);
    absl::Status s = source->Fill(i, 1, rows.pointers, scratch.get());
    if (i == 1) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_THAT(s.message(), HasSubstr("'" + Path("c-0.tar") + ":b' has no 'jpg' member"));
    } else if (i == 6) {  // the last sample of c-1.tar, cut
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_FALSE(IsDatasetChanged(s));
      EXPECT_THAT(s.message(), HasSubstr("is cut short after its sample 3"));
    } else {
      EXPECT_TRUE(s.ok()) << i << ": " << s;
    }
  }
}

TEST_F(CountedShardsTest, AMissingShardStopsTheJobAndAPassingFailureIsRetried) {
  WriteThreeShards("c-");
  ferry::v1::JobSpec spec = Counted({2, 3, 4, 1});
  spec.mutable_dataset()->mutable_webdataset()->add_shards(Path("gone.tar"));
  auto counting = std::make_shared<CountingFs>();
  std::unique_ptr<SampleSource> source = MakeOn(spec, counting);
  ASSERT_NE(source, nullptr);
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  Rows rows(*source);
  absl::Status gone = source->Fill(9, 1, rows.pointers, scratch.get());
  EXPECT_TRUE(IsDatasetChanged(gone)) << gone;
  EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.message(), HasSubstr("gone.tar"));

  counting->FailNext(1, absl::UnavailableError("cannot open: EIO"));
  absl::Status passing = source->Fill(0, 1, rows.pointers, scratch.get());
  EXPECT_TRUE(IsTransientReadError(passing)) << passing;
  EXPECT_FALSE(IsDatasetChanged(passing));
  EXPECT_TRUE(source->Fill(0, 1, rows.pointers, scratch.get()).ok());
}

TEST_F(CountedShardsTest, CountsMustBeOnePerShardAndHoldASample) {
  WriteThreeShards("c-");
  for (const auto& [counts, message] : std::vector<std::pair<std::vector<uint64_t>, std::string>>{
           {{2, 3}, "shard_samples has 2 counts for 3 shards"},
           {{0, 0, 0}, "count no sample in any shard"}}) {
    absl::StatusOr<std::unique_ptr<SampleSource>> source =
        MakeSampleSource(Counted(counts), UnconfinedDatasetFs());
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << source.status();
    EXPECT_THAT(source.status().message(), HasSubstr(message));
  }
}

// ---------------------------------------------------------------------------------------
// Stream order.

class StreamOrderTest : public WebDatasetSourceTest {
 protected:
  // kShards shards of kPerShard samples (images are tiny: the order never reads them).
  static constexpr int kShards = 12;
  static constexpr int kPerShard = 40;

  std::unique_ptr<SampleSource> MakeSource(uint32_t shuffle_buffer) {
    const std::string jpeg = Jpeg(8, 8, 1);
    for (int s = 0; s < kShards; ++s) {
      if (fs::exists(Path(absl::StrCat("o-", s, ".tar")))) continue;
      Members members;
      for (int i = 0; i < kPerShard; ++i)
        members.push_back({absl::StrCat(s, "_", i, ".jpg"), jpeg});
      WriteTar(Path(absl::StrCat("o-", s, ".tar")), members);
    }
    ferry::v1::JobSpec spec = Spec({Path(absl::StrCat("o-{0..", kShards - 1, "}.tar"))});
    spec.mutable_dataset()->mutable_webdataset()->set_shuffle_buffer(shuffle_buffer);
    return Make(spec);
  }
};

TEST_F(StreamOrderTest, ShuffleOffIsIdentity) {
  std::unique_ptr<SampleSource> source = MakeSource(0);
  ASSERT_NE(source, nullptr);
  ASSERT_TRUE(source->HasStreamOrder());
  std::vector<int64_t> order;
  source->StreamOrder(1, 3, /*shuffle=*/false, &order);
  std::vector<int64_t> identity(kShards * kPerShard);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_EQ(order, identity);
}

TEST_F(StreamOrderTest, ShardsPermutedThenBoundedShuffle) {
  std::unique_ptr<SampleSource> source = MakeSource(1);  // no buffer: shard order only
  ASSERT_NE(source, nullptr);
  std::vector<int64_t> order;
  source->StreamOrder(7, 2, true, &order);
  ASSERT_EQ(order.size(), static_cast<size_t>(kShards * kPerShard));
  // Each shard's samples stay together and in order.
  std::vector<int64_t> shard_sequence;
  for (size_t p = 0; p < order.size(); ++p) {
    if (p % kPerShard == 0) {
      ASSERT_EQ(order[p] % kPerShard, 0);
      shard_sequence.push_back(order[p] / kPerShard);
    } else {
      ASSERT_EQ(order[p], order[p - 1] + 1);
    }
  }
  // ... in the Fisher-Yates order of MixSeed(seed, epoch, 2^63).
  std::vector<int64_t> want(kShards);
  std::iota(want.begin(), want.end(), int64_t{0});
  Rng rng(MixSeed(7, 2, uint64_t{1} << 63));
  for (size_t i = kShards; i > 1; --i) std::swap(want[i - 1], want[rng.Below(i)]);
  EXPECT_EQ(shard_sequence, want);

  // With a buffer of 25: a permutation in which no sample moves earlier than 25 positions
  // before its place in the shard-permuted stream, and whose first 25 outputs can only
  // come from the first 50 of that stream.
  constexpr uint32_t kBuffer = 25;
  std::unique_ptr<SampleSource> buffered = MakeSource(kBuffer);
  ASSERT_NE(buffered, nullptr);
  std::vector<int64_t> shuffled;
  buffered->StreamOrder(7, 2, true, &shuffled);
  std::vector<int64_t> sorted = shuffled;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(kShards * kPerShard);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(shuffled, order);
  std::map<int64_t, size_t> stream_position;
  for (size_t p = 0; p < order.size(); ++p) stream_position[order[p]] = p;
  for (size_t p = 0; p < shuffled.size(); ++p) {
    EXPECT_GE(p + kBuffer, stream_position[shuffled[p]]) << "sample " << shuffled[p];
  }
}

TEST_F(StreamOrderTest, PinnedToTheDocumentedAlgorithm) {
  constexpr uint32_t kBuffer = 30;
  std::unique_ptr<SampleSource> source = MakeSource(kBuffer);
  ASSERT_NE(source, nullptr);
  for (int64_t epoch : {0, 1, 99}) {
    const uint64_t seed = 1234;
    std::vector<int64_t> stream;
    std::vector<int64_t> shards(kShards);
    std::iota(shards.begin(), shards.end(), int64_t{0});
    Rng shard_rng(MixSeed(seed, epoch, uint64_t{1} << 63));
    for (size_t i = kShards; i > 1; --i) std::swap(shards[i - 1], shards[shard_rng.Below(i)]);
    for (int64_t s : shards) {
      for (int i = 0; i < kPerShard; ++i) stream.push_back(s * kPerShard + i);
    }
    Rng buffer_rng(MixSeed(seed, epoch, (uint64_t{1} << 63) + 1));
    std::vector<int64_t> buffer, want;
    for (int64_t x : stream) {
      if (buffer.size() < kBuffer) {
        buffer.push_back(x);
        continue;
      }
      const size_t k = buffer_rng.Below(kBuffer);
      want.push_back(buffer[k]);
      buffer[k] = x;
    }
    while (!buffer.empty()) {
      const size_t k = buffer_rng.Below(buffer.size());
      want.push_back(buffer[k]);
      buffer[k] = buffer.back();
      buffer.pop_back();
    }
    std::vector<int64_t> got;
    source->StreamOrder(seed, epoch, true, &got);
    EXPECT_EQ(got, want) << "epoch " << epoch;

    std::vector<int64_t> again, next;
    source->StreamOrder(seed, epoch, true, &again);
    source->StreamOrder(seed, epoch + 1, true, &next);
    EXPECT_EQ(again, got);
    EXPECT_NE(next, got);
  }
}

}  // namespace
}  // namespace ferry
