#include "server/dataset/sample_source.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/dataset/image_folder_source.h"
#include "server/decode/compose.h"
#include "server/decode/exif.h"
#include "server/decode/gpu_decode_plan.h"
#include "server/decode/gpu_decode_split.h"
#include "server/decode/image_transform.h"
#include "testing/jpeg_writer.h"
#include "testing/png_writer.h"
#include "testing/recording_fs.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::ferry::testutil::EncodeJpeg;
using ::ferry::testutil::EncodePng;
using ::ferry::testutil::ExifWithOrientation;
using ::ferry::testutil::MakeTestPattern;
using ::ferry::testutil::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh temporary directory, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ferry_dataset_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<uint8_t> TestJpeg(int w, int h, uint64_t seed) {
  std::vector<uint8_t> rgb = MakeTestPattern(w, h, seed);
  return EncodeJpeg(rgb.data(), w, h, /*quality=*/90);
}

// An 8-bit RGB PNG of the test pattern, with an eXIf chunk when `exif` is not empty.
std::vector<uint8_t> TestPng(int w, int h, uint64_t seed, const std::vector<uint8_t>& exif = {}) {
  std::vector<uint8_t> rgb = MakeTestPattern(w, h, seed);
  testutil::PngEncodeOptions o;
  o.exif = exif;
  return EncodePng(std::vector<uint16_t>(rgb.begin(), rgb.end()), w, h, o);
}

void Put(const std::string& path, absl::Span<const uint8_t> bytes) {
  fs::create_directories(fs::path(path).parent_path());
  absl::Status s = WriteFile(path, bytes);
  ASSERT_TRUE(s.ok()) << s;
}

void PutText(const std::string& path, const std::string& text) {
  Put(path, absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

ferry::v1::JobSpec ImageSpec(const std::string& root, uint32_t size = 32) {
  ferry::v1::JobSpec spec;
  spec.mutable_dataset()->mutable_image_folder()->set_root(root);
  spec.mutable_transform()->mutable_random_resized_crop()->set_size(size);
  return spec;
}

// The rows of one sample, one buffer per field.
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

std::unique_ptr<SampleSource> MustMake(const ferry::v1::JobSpec& spec) {
  absl::StatusOr<std::unique_ptr<SampleSource>> source =
      MakeSampleSource(spec, UnconfinedDatasetFs());
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *std::move(source) : nullptr;
}

// ---------------------------------------------------------------------------------------
// imagefolder

class ImageFolderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Byte order puts upper case first: Apple < cat < empty_class < zebra.
    Put(Root("zebra/1.jpeg"), TestJpeg(40, 30, 1));
    Put(Root("cat/b.jpg"), TestJpeg(64, 48, 2));
    Put(Root("cat/a.JPEG"), TestJpeg(48, 64, 3));
    Put(Root("cat/c.Jpg"), TestJpeg(50, 50, 4));
    Put(Root("Apple/x.jpg"), TestJpeg(96, 80, 5));
    PutText(Root("cat/notes.txt"), "not an image");
    Put(Root("cat/d.png"), TestPng(36, 28, 8));
    Put(Root("cat/image.png"), TestJpeg(20, 20, 6));  // JPEG bytes named .png: a JPEG
    fs::create_directories(Root("cat/folder.jpg"));   // a directory, not a file
    fs::create_directories(Root("empty_class"));
    Put(Root("stray.jpg"), TestJpeg(20, 20, 7));  // not inside a class
  }
  std::string Root(const std::string& rel = "") const {
    return rel.empty() ? dir_.path() : dir_.path() + "/" + rel;
  }

  TempDir dir_;
};

TEST_F(ImageFolderTest, ListsClassMajorSortedWithLabels) {
  std::unique_ptr<SampleSource> source = MustMake(ImageSpec(Root(), 32));
  ASSERT_NE(source, nullptr);
  ASSERT_EQ(source->size(), 7);
  std::vector<std::string> paths;
  for (int64_t i = 0; i < source->size(); ++i) paths.push_back(source->Describe(i));
  EXPECT_THAT(paths, ElementsAre(Root("Apple/x.jpg"), Root("cat/a.JPEG"), Root("cat/b.jpg"),
                                 Root("cat/c.Jpg"), Root("cat/d.png"), Root("cat/image.png"),
                                 Root("zebra/1.jpeg")));
  EXPECT_THAT(static_cast<ImageFolderSource*>(source.get())->classes(),
              ElementsAre("Apple", "cat", "empty_class", "zebra"));

  const int64_t want_labels[] = {0, 1, 1, 1, 1, 1, 3};  // the empty class keeps label 2
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  for (int64_t i = 0; i < source->size(); ++i) {
    Rows rows(*source);
    absl::Status s = source->Fill(i, /*sample_seed=*/i, rows.pointers, scratch.get());
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(rows.Int64(1), want_labels[i]) << paths[i];
    EXPECT_EQ(rows.Int64(2), i) << paths[i];
  }
}

TEST_F(ImageFolderTest, FieldLayout) {
  std::unique_ptr<SampleSource> source = MustMake(ImageSpec(Root(), 24));
  ASSERT_NE(source, nullptr);
  const auto& f = source->fields();
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].name, "image");
  EXPECT_EQ(f[0].dtype, ferry::v1::UINT8);
  EXPECT_THAT(f[0].shape, ElementsAre(24, 24, 3));
  EXPECT_EQ(f[0].row_bytes, 24u * 24u * 3u);
  EXPECT_EQ(f[1].name, "label");
  EXPECT_EQ(f[1].dtype, ferry::v1::INT64);
  EXPECT_TRUE(f[1].shape.empty());
  EXPECT_EQ(f[1].row_bytes, 8u);
  EXPECT_EQ(f[2].name, "index");
  EXPECT_EQ(f[2].dtype, ferry::v1::INT64);
  EXPECT_EQ(f[2].row_bytes, 8u);
}

TEST_F(ImageFolderTest, FillMatchesDecodingThatFileWithTheSampleSeed) {
  ferry::v1::JobSpec spec = ImageSpec(Root(), 32);
  spec.mutable_transform()->mutable_random_resized_crop()->set_flip(true);
  std::unique_ptr<SampleSource> source = MustMake(spec);
  ASSERT_NE(source, nullptr);
  absl::StatusOr<ImageTransform> t = ImageTransformFromSpec(spec.transform());
  ASSERT_TRUE(t.ok()) << t.status();
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  ImageDecoder decoder;
  // Largest file first, then smaller ones through the same (growing, reused) scratch; a PNG
  // (4) and a JPEG named .png (5) among them.
  for (int64_t i : {0, 4, 1, 5, 3}) {
    std::ifstream in(source->Describe(i), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    std::vector<uint8_t> want(32 * 32 * 3);
    Rng rng(MixSeed(9, 0, i));
    ASSERT_TRUE(DecodeAndTransform(decoder, bytes, *t, rng, absl::MakeSpan(want)).ok());
    Rows rows(*source);
    ASSERT_TRUE(source->Fill(i, MixSeed(9, 0, i), rows.pointers, scratch.get()).ok());
    EXPECT_EQ(rows.buffers[0], want) << source->Describe(i);
  }
}

TEST_F(ImageFolderTest, SameSeedSameCropDifferentSeedsDifferentCrops) {
  std::unique_ptr<SampleSource> source = MustMake(ImageSpec(Root(), 16));
  ASSERT_NE(source, nullptr);
  std::unique_ptr<SampleSource::Scratch> s1 = source->NewScratch();
  std::unique_ptr<SampleSource::Scratch> s2 = source->NewScratch();
  Rows a(*source), b(*source);
  ASSERT_TRUE(source->Fill(0, 1234, a.pointers, s1.get()).ok());
  ASSERT_TRUE(source->Fill(0, 1234, b.pointers, s2.get()).ok());
  EXPECT_EQ(a.buffers[0], b.buffers[0]);

  int different = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    Rows c(*source);
    ASSERT_TRUE(source->Fill(0, 1234 + seed, c.pointers, s1.get()).ok());
    if (c.buffers[0] != a.buffers[0]) ++different;
  }
  EXPECT_GE(different, 7);  // crops of 8%..100% of a 96x80 image rarely coincide
}

TEST_F(ImageFolderTest, CenterCropIgnoresTheSeed) {
  ferry::v1::JobSpec spec;
  spec.mutable_dataset()->mutable_image_folder()->set_root(Root());
  spec.mutable_transform()->mutable_center_crop()->set_size(16);
  std::unique_ptr<SampleSource> source = MustMake(spec);
  ASSERT_NE(source, nullptr);
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  Rows a(*source), b(*source);
  ASSERT_TRUE(source->Fill(2, 1, a.pointers, scratch.get()).ok());
  ASSERT_TRUE(source->Fill(2, 2, b.pointers, scratch.get()).ok());
  EXPECT_EQ(a.buffers[0], b.buffers[0]);
}

TEST_F(ImageFolderTest, CorruptFilesFailNamingThePath) {
  std::vector<uint8_t> good = TestJpeg(64, 64, 11);
  PutText(Root("dog/0_garbage.jpg"), "this is not a JPEG at all");
  Put(Root("dog/1_truncated.jpg"), absl::MakeConstSpan(good.data(), 40));
  PutText(Root("dog/2_empty.jpg"), "");
  std::unique_ptr<SampleSource> source = MustMake(ImageSpec(Root(), 16));
  ASSERT_NE(source, nullptr);
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  for (const char* name : {"dog/0_garbage.jpg", "dog/1_truncated.jpg", "dog/2_empty.jpg"}) {
    int64_t index = -1;
    for (int64_t i = 0; i < source->size(); ++i) {
      if (source->Describe(i) == Root(name)) index = i;
    }
    ASSERT_GE(index, 0) << name;
    Rows rows(*source);
    absl::Status s = source->Fill(index, 1, rows.pointers, scratch.get());
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << name << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(Root(name)));
  }
  // The scratch still works after failures.
  Rows rows(*source);
  EXPECT_TRUE(source->Fill(0, 1, rows.pointers, scratch.get()).ok());
}

TEST_F(ImageFolderTest, FileRemovedAfterListingIsNotFound) {
  std::unique_ptr<SampleSource> source = MustMake(ImageSpec(Root(), 16));
  ASSERT_NE(source, nullptr);
  ASSERT_TRUE(fs::remove(Root("cat/b.jpg")));
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  Rows rows(*source);
  absl::Status s = source->Fill(2, 1, rows.pointers, scratch.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(Root("cat/b.jpg")));
}

TEST_F(ImageFolderTest, BadCallsAreRejected) {
  std::unique_ptr<SampleSource> source = MustMake(ImageSpec(Root(), 16));
  ASSERT_NE(source, nullptr);
  std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
  Rows rows(*source);
  EXPECT_EQ(source->Fill(source->size(), 1, rows.pointers, scratch.get()).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(source->Fill(-1, 1, rows.pointers, scratch.get()).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(source->Fill(0, 1, absl::MakeConstSpan(rows.pointers.data(), 2), scratch.get()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ImageFolderTest, ConcurrentFillsMatchSerial) {
  std::unique_ptr<SampleSource> source = MustMake(ImageSpec(Root(), 16));
  ASSERT_NE(source, nullptr);
  std::vector<std::vector<uint8_t>> serial;
  {
    std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
    for (int64_t i = 0; i < source->size(); ++i) {
      Rows rows(*source);
      ASSERT_TRUE(source->Fill(i, 77 + i, rows.pointers, scratch.get()).ok());
      serial.push_back(rows.buffers[0]);
    }
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
      for (int round = 0; round < 10; ++round) {
        for (int64_t i = 0; i < source->size(); ++i) {
          Rows rows(*source);
          absl::Status s = source->Fill(i, 77 + i, rows.pointers, scratch.get());
          if (!s.ok() || rows.buffers[0] != serial[i]) ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(mismatches, ElementsAre(0, 0, 0, 0));
}

// A GPU-decoding job's worker routes a JPEG by copying its bytes into the JPEG row (256 KiB
// whatever the crop), so a file several times larger than the decoded row still reaches the
// GPU; only a file over the JPEG row stays on the worker, counted too_large.
TEST(GpuRoutingTest, JpegsLargerThanTheImageRowReachTheGpu) {
  ImageTransform t;
  t.size = 16;
  t.gpu_decode = std::make_shared<GpuDecodeSplit>(GpuDecodeMode::kGpu, 1);
  const std::vector<FieldLayout> fields = ImageSampleFields(t);
  ASSERT_EQ(fields.back().name, kGpuDecodeJpegField);
  ASSERT_EQ(fields.back().row_bytes, kGpuDecodeJpegRowBytes);
  ASSERT_EQ(fields[fields.size() - 2].name, kGpuDecodePlanField);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<uint8_t*> rows;
  for (const FieldLayout& f : fields) storage.emplace_back(f.row_bytes, uint8_t{0xab});
  for (std::vector<uint8_t>& row : storage) rows.push_back(row.data());
  ImageDecoder decoder;
  ComposeScratch compose;
  auto plan_of = [&] {
    GpuDecodePlan plan;
    std::memcpy(&plan, storage[fields.size() - 2].data(), sizeof(plan));
    return plan;
  };

  const std::vector<uint8_t> jpeg = TestJpeg(120, 90, 1);
  ASSERT_GT(jpeg.size(), 2 * fields[0].row_bytes);
  ASSERT_TRUE(TransformImageSample(decoder, compose, jpeg, t, 7, fields, rows, true).ok());
  GpuDecodePlan plan = plan_of();
  EXPECT_EQ(plan.on_gpu, 1u);
  EXPECT_EQ(plan.jpeg_bytes, jpeg.size());
  EXPECT_EQ(plan.width, 120);
  EXPECT_EQ(plan.height, 90);
  EXPECT_TRUE(std::equal(jpeg.begin(), jpeg.end(), storage.back().begin()));
  // The image row is the device's to write.
  EXPECT_TRUE(
      std::all_of(storage[0].begin(), storage[0].end(), [](uint8_t b) { return b == 0xab; }));

  const std::vector<uint8_t> rgb = MakeTestPattern(1600, 1200, 2);
  const std::vector<uint8_t> big = EncodeJpeg(rgb.data(), 1600, 1200, /*quality=*/100);
  ASSERT_GT(big.size(), kGpuDecodeJpegRowBytes);
  ASSERT_TRUE(TransformImageSample(decoder, compose, big, t, 7, fields, rows, true).ok());
  plan = plan_of();
  EXPECT_EQ(plan.on_gpu, 0u);
  EXPECT_EQ(plan.cpu_reason, static_cast<int32_t>(GpuJpegReject::kTooLarge));
  EXPECT_FALSE(
      std::all_of(storage[0].begin(), storage[0].end(), [](uint8_t b) { return b == 0xab; }));
  const GpuDecodeSplit::Counts counts = t.gpu_decode->counts();
  EXPECT_EQ(counts.gpu_images, 1);
  EXPECT_EQ(counts.fallbacks[static_cast<int>(GpuJpegReject::kTooLarge)], 1);
}

TEST(ImageFolderErrorsTest, MissingRootIsNotFound) {
  TempDir dir;
  const std::string missing = dir.path() + "/nope";
  absl::StatusOr<std::unique_ptr<SampleSource>> source =
      MakeSampleSource(ImageSpec(missing), UnconfinedDatasetFs());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(source.status().message(), "dataset path '" + missing + "' does not exist");
}

TEST(ImageFolderErrorsTest, RootThatIsAFileIsInvalid) {
  TempDir dir;
  PutText(dir.path() + "/file", "x");
  absl::StatusOr<std::unique_ptr<SampleSource>> source =
      MakeSampleSource(ImageSpec(dir.path() + "/file"), UnconfinedDatasetFs());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(source.status().message(), HasSubstr("is not a directory"));
}

TEST(ImageFolderErrorsTest, EmptyDatasetIsFailedPrecondition) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<SampleSource>> none =
      MakeSampleSource(ImageSpec(dir.path()), UnconfinedDatasetFs());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr(dir.path()));

  PutText(dir.path() + "/cat/readme.txt", "no images here");
  fs::create_directories(dir.path() + "/dog");
  absl::StatusOr<std::unique_ptr<SampleSource>> no_jpeg =
      MakeSampleSource(ImageSpec(dir.path()), UnconfinedDatasetFs());
  EXPECT_EQ(no_jpeg.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_jpeg.status().message(), HasSubstr("2 class directories"));
  EXPECT_THAT(no_jpeg.status().message(), HasSubstr("holds no .jpg, .jpeg or .png files"));
}

// Center crop without resampling (the shorter side already `side`): the central square.
std::vector<uint8_t> CenterSquare(const std::vector<uint8_t>& rgb, int w, int h) {
  const int side = std::min(w, h);
  const int left = (w - side) / 2, top = (h - side) / 2;  // even differences: exact halves
  std::vector<uint8_t> out;
  for (int y = top; y < top + side; ++y) {
    const uint8_t* row = rgb.data() + (static_cast<size_t>(y) * w + left) * 3;
    out.insert(out.end(), row, row + static_cast<size_t>(side) * 3);
  }
  return out;
}

TEST(ImageFolderExifTest, ExifOrientationTurnsTheImageOnlyWhenAsked) {
  // A PNG named .jpg, stored on its side (orientation 6: turn clockwise to view).
  TempDir dir;
  const int w = 40, h = 26;
  Put(dir.path() + "/c/side.jpg", TestPng(w, h, 3, ExifWithOrientation(6, true)));
  const std::vector<uint8_t> stored = MakeTestPattern(w, h, 3);
  std::vector<uint8_t> upright(stored.size());
  ApplyExifOrientation(6, stored.data(), w, h, upright.data());
  for (bool on : {false, true}) {
    ferry::v1::JobSpec spec;
    spec.mutable_dataset()->mutable_image_folder()->set_root(dir.path());
    spec.mutable_dataset()->mutable_image_folder()->set_exif_orientation(on);
    spec.mutable_transform()->mutable_center_crop()->set_size(h);
    spec.mutable_transform()->mutable_center_crop()->set_resize(h);
    std::unique_ptr<SampleSource> source = MustMake(spec);
    ASSERT_NE(source, nullptr);
    std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
    Rows rows(*source);
    ASSERT_TRUE(source->Fill(0, 1, rows.pointers, scratch.get()).ok());
    EXPECT_EQ(rows.buffers[0], on ? CenterSquare(upright, h, w) : CenterSquare(stored, w, h))
        << "exif_orientation " << on;
  }
}

TEST(ImageFolderErrorsTest, UnsetRootOrKindIsInvalid) {
  absl::StatusOr<std::unique_ptr<SampleSource>> no_root =
      MakeSampleSource(ImageSpec(""), UnconfinedDatasetFs());
  EXPECT_EQ(no_root.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_root.status().message(), HasSubstr("dataset.image_folder.root"));

  absl::StatusOr<std::unique_ptr<SampleSource>> no_kind =
      MakeSampleSource(ferry::v1::JobSpec(), UnconfinedDatasetFs());
  EXPECT_EQ(no_kind.status().code(), absl::StatusCode::kInvalidArgument);
  // Every kind is named.
  for (const char* kind : {"dataset.image_folder, ", "dataset.tokens, ", "dataset.token_shards, ",
                           "dataset.indexed, ", "dataset.webdataset, ", "dataset.records, ",
                           "dataset.npy, ", "dataset.megatron_gpt or ", "dataset.blend"}) {
    EXPECT_THAT(no_kind.status().message(), HasSubstr(kind));
  }
  // An empty path names every kind's path field.
  ferry::v1::DatasetSpec empty_records;
  empty_records.mutable_records();
  absl::StatusOr<std::vector<std::string>> no_path = DatasetPaths(empty_records);
  EXPECT_EQ(no_path.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_path.status().message(),
              HasSubstr("give dataset.image_folder.root, dataset.tokens.path, "
                        "dataset.token_shards.shards, dataset.indexed.path_prefix, "
                        "dataset.webdataset.shards, dataset.records.path, dataset.npy.path or "
                        "dataset.megatron_gpt.path_prefixes"));
}

TEST(DatasetKindsTest, ImagesAndWidenOnHostFollowTheKind) {
  ferry::v1::DatasetSpec d;
  EXPECT_FALSE(DatasetHasImages(d));
  SetWidenOnHost(&d);  // no kind: nothing set
  EXPECT_EQ(d.kind_case(), ferry::v1::DatasetSpec::KIND_NOT_SET);
  d.mutable_image_folder();
  EXPECT_TRUE(DatasetHasImages(d));
  d.mutable_webdataset();
  EXPECT_TRUE(DatasetHasImages(d));
  d.mutable_tokens();
  EXPECT_FALSE(DatasetHasImages(d));
  SetWidenOnHost(&d);
  EXPECT_TRUE(d.tokens().widen_on_host());
  d.mutable_token_shards();
  SetWidenOnHost(&d);
  EXPECT_TRUE(d.token_shards().widen_on_host());
  d.mutable_indexed();
  SetWidenOnHost(&d);
  EXPECT_TRUE(d.indexed().widen_on_host());
  d.mutable_records();
  SetWidenOnHost(&d);
  EXPECT_EQ(d.kind_case(), ferry::v1::DatasetSpec::kRecords);
}

// ---------------------------------------------------------------------------------------
// TransformSpec -> ImageTransform

TEST(TransformSpecTest, TorchvisionDefaultsForZeroFields) {
  ferry::v1::TransformSpec spec;
  spec.mutable_random_resized_crop()->set_size(224);
  absl::StatusOr<ImageTransform> t = ImageTransformFromSpec(spec);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind, ImageTransform::Kind::kRandomResizedCrop);
  EXPECT_EQ(t->size, 224);
  EXPECT_DOUBLE_EQ(t->scale_min, 0.08);
  EXPECT_DOUBLE_EQ(t->scale_max, 1.0);
  EXPECT_DOUBLE_EQ(t->ratio_min, 3.0 / 4.0);
  EXPECT_DOUBLE_EQ(t->ratio_max, 4.0 / 3.0);
  EXPECT_FALSE(t->flip);

  spec.mutable_random_resized_crop()->set_scale_min(0.25f);
  spec.mutable_random_resized_crop()->set_ratio_max(2.0f);
  spec.mutable_random_resized_crop()->set_flip(true);
  t = ImageTransformFromSpec(spec);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(t->scale_min, 0.25);
  EXPECT_DOUBLE_EQ(t->scale_max, 1.0);
  EXPECT_DOUBLE_EQ(t->ratio_min, 3.0 / 4.0);
  EXPECT_DOUBLE_EQ(t->ratio_max, 2.0);
  EXPECT_TRUE(t->flip);

  ferry::v1::TransformSpec center;
  center.mutable_center_crop()->set_size(224);
  t = ImageTransformFromSpec(center);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->kind, ImageTransform::Kind::kResizeCenterCrop);
  EXPECT_EQ(t->size, 224);
  EXPECT_EQ(t->resize, 256);
  EXPECT_FALSE(t->flip);
  center.mutable_center_crop()->set_size(160);
  EXPECT_EQ(ImageTransformFromSpec(center)->resize, 182);  // 160 * 256 / 224, floored
  center.mutable_center_crop()->set_resize(200);
  EXPECT_EQ(ImageTransformFromSpec(center)->resize, 200);
  EXPECT_FALSE(ImageTransformFromSpec(center)->full_decode);
  center.mutable_center_crop()->set_full_decode(true);
  EXPECT_TRUE(ImageTransformFromSpec(center)->full_decode);
  EXPECT_FALSE(ImageTransformFromSpec(spec)->full_decode);
  spec.mutable_random_resized_crop()->set_full_decode(true);
  EXPECT_TRUE(ImageTransformFromSpec(spec)->full_decode);
}

TEST(TransformSpecTest, InvalidSpecsNameTheField) {
  struct Case {
    const char* what;
    ferry::v1::TransformSpec spec;
    std::vector<std::string> substrings;
  };
  std::vector<Case> cases;
  auto rrc = [](uint32_t size) {
    ferry::v1::TransformSpec s;
    s.mutable_random_resized_crop()->set_size(size);
    return s;
  };
  cases.push_back({"no kind", ferry::v1::TransformSpec(), {"transform must be set"}});
  cases.push_back(
      {"rrc size 0", rrc(0), {"transform.random_resized_crop.size must be at least 1"}});
  cases.push_back({"rrc size huge", rrc(100000), {"transform.random_resized_crop.size", "100000"}});
  {
    ferry::v1::TransformSpec s;
    s.mutable_center_crop();
    cases.push_back({"center size 0", s, {"transform.center_crop.size must be at least 1"}});
  }
  {
    ferry::v1::TransformSpec s;
    s.mutable_center_crop()->set_size(224);
    s.mutable_center_crop()->set_resize(100);
    cases.push_back({"resize < size", s, {"transform.center_crop.resize (100)", "224"}});
  }
  {
    ferry::v1::TransformSpec s = rrc(224);
    s.mutable_random_resized_crop()->set_scale_min(0.9f);
    s.mutable_random_resized_crop()->set_scale_max(0.5f);
    cases.push_back(
        {"scale inverted", s, {"transform.random_resized_crop.scale_min (0.9", "scale_max (0.5"}});
  }
  {
    ferry::v1::TransformSpec s = rrc(224);
    s.mutable_random_resized_crop()->set_scale_max(0.05f);  // below the default scale_min
    cases.push_back({"scale inverted by default",
                     s,
                     {"transform.random_resized_crop.scale_min (0.08", "scale_max (0.05"}});
  }
  {
    ferry::v1::TransformSpec s = rrc(224);
    s.mutable_random_resized_crop()->set_ratio_min(2.0f);
    s.mutable_random_resized_crop()->set_ratio_max(0.5f);
    cases.push_back({"ratio inverted", s, {"transform.random_resized_crop.ratio_min (2"}});
  }
  {
    ferry::v1::TransformSpec s = rrc(224);
    s.mutable_random_resized_crop()->set_scale_min(-0.5f);
    cases.push_back({"negative scale", s, {"transform.random_resized_crop.scale_min", "-0.5"}});
  }
  {
    ferry::v1::TransformSpec s = rrc(224);
    s.mutable_random_resized_crop()->set_ratio_max(std::numeric_limits<float>::infinity());
    cases.push_back({"infinite ratio", s, {"transform.random_resized_crop.ratio_max"}});
  }
  TempDir dir;
  Put(dir.path() + "/cat/a.jpg", TestJpeg(16, 16, 1));
  for (const Case& c : cases) {
    absl::StatusOr<ImageTransform> t = ImageTransformFromSpec(c.spec);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    for (const std::string& sub : c.substrings) {
      EXPECT_THAT(t.status().message(), HasSubstr(sub)) << c.what;
    }
    // And through the factory, on a valid dataset.
    ferry::v1::JobSpec job;
    job.mutable_dataset()->mutable_image_folder()->set_root(dir.path());
    *job.mutable_transform() = c.spec;
    absl::StatusOr<std::unique_ptr<SampleSource>> source =
        MakeSampleSource(job, UnconfinedDatasetFs());
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(source.status().message(), t.status().message()) << c.what;
  }
}

// ---------------------------------------------------------------------------------------
// tokens

template <typename T>
void WriteTokens(const std::string& path, const std::vector<T>& tokens) {
  std::vector<uint8_t> bytes;
  for (T t : tokens) {
    for (size_t b = 0; b < sizeof(T); ++b) bytes.push_back(static_cast<uint8_t>(t >> (8 * b)));
  }
  Put(path, bytes);
}

ferry::v1::JobSpec TokenSpec(const std::string& path, ferry::v1::DType token_dtype,
                             uint32_t seq_len,
                             ferry::v1::DType output = ferry::v1::DTYPE_UNSPECIFIED) {
  ferry::v1::JobSpec spec;
  ferry::v1::TokensDataset* t = spec.mutable_dataset()->mutable_tokens();
  t->set_path(path);
  t->set_token_dtype(token_dtype);
  t->set_seq_len(seq_len);
  t->set_output_dtype(output);
  return spec;
}

template <typename Out>
std::vector<int64_t> ReadRow(const std::vector<uint8_t>& row) {
  std::vector<int64_t> values(row.size() / sizeof(Out));
  for (size_t i = 0; i < values.size(); ++i) {
    Out v;
    std::memcpy(&v, row.data() + i * sizeof(Out), sizeof(Out));
    values[i] = v;
  }
  return values;
}

TEST(TokensTest, WindowsOverlapByOneTokenInEveryDtypeCombination) {
  TempDir dir;
  constexpr int kTokens = 1001;
  std::vector<uint16_t> t16(kTokens);
  std::vector<uint32_t> t32(kTokens);
  for (int k = 0; k < kTokens; ++k) {
    t16[k] = static_cast<uint16_t>(65535 - k * 37);  // uses the high byte and bit
    t32[k] = 100000u + static_cast<uint32_t>(k) * 1000003u % 2000000000u;
  }
  WriteTokens(dir.path() + "/t16.bin", t16);
  WriteTokens(dir.path() + "/t32.bin", t32);

  for (ferry::v1::DType in : {ferry::v1::UINT16, ferry::v1::UINT32}) {
    for (ferry::v1::DType out :
         {ferry::v1::DTYPE_UNSPECIFIED, ferry::v1::INT64, ferry::v1::INT32}) {
      const std::string path = dir.path() + (in == ferry::v1::UINT16 ? "/t16.bin" : "/t32.bin");
      SCOPED_TRACE(ferry::v1::DType_Name(in) + " -> " + ferry::v1::DType_Name(out));
      std::unique_ptr<SampleSource> source = MustMake(TokenSpec(path, in, 10, out));
      ASSERT_NE(source, nullptr);
      EXPECT_EQ(source->size(), 100);  // (1001 - 1) / 10
      const bool is32 = out == ferry::v1::INT32;
      ASSERT_EQ(source->fields().size(), 2u);
      EXPECT_EQ(source->fields()[0].name, "tokens");
      EXPECT_EQ(source->fields()[0].dtype, is32 ? ferry::v1::INT32 : ferry::v1::INT64);
      EXPECT_THAT(source->fields()[0].shape, ElementsAre(11));
      EXPECT_EQ(source->fields()[0].row_bytes, is32 ? 44u : 88u);
      EXPECT_EQ(source->fields()[1].name, "index");
      EXPECT_EQ(source->fields()[1].row_bytes, 8u);

      std::unique_ptr<SampleSource::Scratch> scratch = source->NewScratch();
      for (int64_t i : {0, 1, 57, 99}) {
        Rows rows(*source);
        absl::Status s = source->Fill(i, 0, rows.pointers, scratch.get());
        ASSERT_TRUE(s.ok()) << s;
        std::vector<int64_t> want;
        for (int64_t k = i * 10; k < i * 10 + 11; ++k) {
          want.push_back(in == ferry::v1::UINT16 ? int64_t{t16[k]} : int64_t{t32[k]});
        }
        std::vector<int64_t> got =
            is32 ? ReadRow<int32_t>(rows.buffers[0]) : ReadRow<int64_t>(rows.buffers[0]);
        EXPECT_EQ(got, want) << "sample " << i;
        EXPECT_EQ(rows.Int64(1), i);
      }
    }
  }
}

// Read in ranges (a large remote object's blocks), a window's Fill reads exactly the range
// RangesOf gives, which the read-ahead fetches before the workers get to it.
TEST(TokensTest, RangesOfAreTheRangesFillReads) {
  TempDir dir;
  std::vector<uint16_t> tokens(1001);
  for (size_t k = 0; k < tokens.size(); ++k) tokens[k] = static_cast<uint16_t>(k * 7);
  WriteTokens(dir.path() + "/t.bin", tokens);
  auto ranged = std::make_shared<RangesRecordingFs>(/*unit=*/64);
  auto source = MakeSampleSource(TokenSpec(dir.path() + "/t.bin", ferry::v1::UINT16, 10), ranged);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_TRUE((*source)->ReadsInRanges());
  ranged->TakeHeld();  // the check that the file holds tokens
  auto scratch = (*source)->NewScratch();
  for (int64_t i = 0; i < (*source)->size(); ++i) {
    std::vector<MappedRange> ranges;
    (*source)->RangesOf(i, &ranges);
    ASSERT_EQ(ranges.size(), 1u);
    std::vector<uint8_t> row((*source)->fields()[0].row_bytes), index(8);
    std::vector<uint8_t*> rows = {row.data(), index.data()};
    ASSERT_TRUE((*source)->Fill(i, 0, absl::MakeSpan(rows), scratch.get()).ok());
    const std::vector<RangesRecordingFs::Held> held = ranged->TakeHeld();
    ASSERT_EQ(held.size(), 1u);
    EXPECT_EQ(held[0].offset, ranges[0].offset) << "sample " << i;
    EXPECT_EQ(held[0].length, ranges[0].length) << "sample " << i;
    EXPECT_EQ(ranges[0].offset, static_cast<uint64_t>(i) * 10 * 2);
  }
}

TEST(TokensTest, SampleCountAtTheEdges) {
  TempDir dir;
  const std::string path = dir.path() + "/t.bin";
  struct Case {
    int tokens;
    uint32_t seq_len;
    int64_t samples;
  };
  for (Case c : {Case{11, 10, 1}, Case{20, 10, 1}, Case{21, 10, 2}, Case{2, 1, 1}, Case{5, 1, 4}}) {
    std::vector<uint16_t> tokens(c.tokens);
    for (int k = 0; k < c.tokens; ++k) tokens[k] = static_cast<uint16_t>(k);
    WriteTokens(path, tokens);
    std::unique_ptr<SampleSource> source = MustMake(TokenSpec(path, ferry::v1::UINT16, c.seq_len));
    ASSERT_NE(source, nullptr);
    EXPECT_EQ(source->size(), c.samples) << c.tokens << " tokens, seq_len " << c.seq_len;
    // The last window ends inside the file.
    Rows rows(*source);
    const int64_t last = source->size() - 1;
    ASSERT_TRUE(source->Fill(last, 0, rows.pointers, source->NewScratch().get()).ok());
    EXPECT_EQ(ReadRow<int64_t>(rows.buffers[0]).back(), last * c.seq_len + c.seq_len);
    EXPECT_EQ(source->Fill(last + 1, 0, rows.pointers, source->NewScratch().get()).code(),
              absl::StatusCode::kOutOfRange);
  }
}

TEST(TokensTest, Uint32TokenTooLargeForInt32IsDataLoss) {
  TempDir dir;
  const std::string path = dir.path() + "/big.bin";
  std::vector<uint32_t> tokens(41, 5);
  tokens[25] = 0xFFFFFFF0u;
  WriteTokens(path, tokens);
  std::unique_ptr<SampleSource> as32 =
      MustMake(TokenSpec(path, ferry::v1::UINT32, 10, ferry::v1::INT32));
  std::unique_ptr<SampleSource> as64 =
      MustMake(TokenSpec(path, ferry::v1::UINT32, 10, ferry::v1::INT64));
  ASSERT_TRUE(as32 && as64);
  std::unique_ptr<SampleSource::Scratch> scratch = as32->NewScratch();
  Rows rows32(*as32), rows64(*as64);
  EXPECT_TRUE(as32->Fill(0, 0, rows32.pointers, scratch.get()).ok());
  absl::Status s = as32->Fill(2, 0, rows32.pointers, scratch.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("token 25"));
  ASSERT_TRUE(as64->Fill(2, 0, rows64.pointers, scratch.get()).ok());
  EXPECT_EQ(ReadRow<int64_t>(rows64.buffers[0])[5], int64_t{0xFFFFFFF0u});
}

// A GPU job (SourceOptions::device_widens_tokens, set by the job manager) gets the file's
// own token dtype, for ferryd's kernel to widen on the device, unless the job asks for them
// widened on the host (widen_on_host; the daemon's widen_tokens_on_host sets it:
// JobManagerTest) or the output narrows (UINT32 -> INT32, checked here); a host job's are
// always widened here. The device string itself is not read here.
TEST(TokensTest, GpuJobsGetRawTokensUnlessWidenedOnTheHost) {
  TempDir dir;
  const std::string path = dir.path() + "/t.bin";
  WriteTokens(path, std::vector<uint16_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  WriteTokens(path + "32", std::vector<uint32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  const ferry::v1::JobSpec plain = TokenSpec(path, ferry::v1::UINT16, 4);
  ferry::v1::JobSpec widened = plain;
  widened.mutable_dataset()->mutable_tokens()->set_widen_on_host(true);
  SourceOptions gpu;
  gpu.device_widens_tokens = true;
  auto tokens_dtype = [](const ferry::v1::JobSpec& spec, const SourceOptions& options) {
    absl::StatusOr<std::unique_ptr<SampleSource>> source =
        MakeSampleSource(spec, UnconfinedDatasetFs(), options);
    EXPECT_TRUE(source.ok()) << source.status();
    return source.ok() ? (*source)->fields()[0].dtype : ferry::v1::DTYPE_UNSPECIFIED;
  };
  EXPECT_EQ(tokens_dtype(plain, gpu), ferry::v1::UINT16);
  EXPECT_EQ(tokens_dtype(widened, gpu), ferry::v1::INT64);
  EXPECT_EQ(tokens_dtype(plain, SourceOptions()), ferry::v1::INT64);
  // A device string alone changes nothing: the options decide.
  ferry::v1::JobSpec named_gpu = plain;
  named_gpu.set_device("cuda:0");
  EXPECT_EQ(tokens_dtype(named_gpu, SourceOptions()), ferry::v1::INT64);
  EXPECT_EQ(tokens_dtype(TokenSpec(path + "32", ferry::v1::UINT32, 4, ferry::v1::INT32), gpu),
            ferry::v1::INT32);

  // Widened on the host for a GPU job: the rows hold the int64 values.
  absl::StatusOr<std::unique_ptr<SampleSource>> source =
      MakeSampleSource(widened, UnconfinedDatasetFs(), gpu);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_EQ((*source)->fields()[0].row_bytes, 5u * 8u);
  std::vector<uint8_t> row(5 * 8);
  int64_t index = -1;
  uint8_t* rows[] = {row.data(), reinterpret_cast<uint8_t*>(&index)};
  ASSERT_TRUE((*source)->Fill(1, 0, rows, (*source)->NewScratch().get()).ok());
  EXPECT_THAT(ReadRow<int64_t>(row), ElementsAre(5, 6, 7, 8, 9));
  EXPECT_EQ(index, 1);
}

TEST(TokensTest, UnalignedRowsAndDescribe) {
  TempDir dir;
  const std::string path = dir.path() + "/t.bin";
  WriteTokens(path, std::vector<uint16_t>{1, 2, 3, 4, 5, 6, 7});
  std::unique_ptr<SampleSource> source = MustMake(TokenSpec(path, ferry::v1::UINT16, 3));
  ASSERT_NE(source, nullptr);
  std::vector<uint8_t> buffer(1 + 32 + 8);
  uint8_t* rows[] = {buffer.data() + 1, buffer.data() + 1 + 32};
  ASSERT_TRUE(source->Fill(1, 0, rows, source->NewScratch().get()).ok());
  std::vector<uint8_t> row(buffer.begin() + 1, buffer.begin() + 33);
  EXPECT_THAT(ReadRow<int64_t>(row), ElementsAre(4, 5, 6, 7));
  EXPECT_EQ(source->Describe(1), path + " tokens [3, 7)");
}

TEST(TokensTest, InvalidSpecsNameTheField) {
  TempDir dir;
  const std::string path = dir.path() + "/t.bin";
  WriteTokens(path, std::vector<uint16_t>(100, 1));  // 200 bytes
  struct Case {
    const char* what;
    ferry::v1::JobSpec spec;
    absl::StatusCode code;
    std::vector<std::string> substrings;
  };
  std::vector<Case> cases = {
      {"seq_len 0",
       TokenSpec(path, ferry::v1::UINT16, 0),
       absl::StatusCode::kInvalidArgument,
       {"dataset.tokens.seq_len must be at least 1"}},
      {"token dtype unset",
       TokenSpec(path, ferry::v1::DTYPE_UNSPECIFIED, 4),
       absl::StatusCode::kInvalidArgument,
       {"dataset.tokens.token_dtype", "UINT16 or UINT32", "DTYPE_UNSPECIFIED"}},
      {"token dtype int64",
       TokenSpec(path, ferry::v1::INT64, 4),
       absl::StatusCode::kInvalidArgument,
       {"dataset.tokens.token_dtype", "INT64"}},
      {"token dtype uint8",
       TokenSpec(path, ferry::v1::UINT8, 4),
       absl::StatusCode::kInvalidArgument,
       {"dataset.tokens.token_dtype"}},
      {"output float32",
       TokenSpec(path, ferry::v1::UINT16, 4, ferry::v1::FLOAT32),
       absl::StatusCode::kInvalidArgument,
       {"dataset.tokens.output_dtype", "INT64", "INT32", "FLOAT32"}},
      {"output uint16",
       TokenSpec(path, ferry::v1::UINT16, 4, ferry::v1::UINT16),
       absl::StatusCode::kInvalidArgument,
       {"dataset.tokens.output_dtype"}},
      {"size not multiple of 4",
       TokenSpec(path + "x", ferry::v1::UINT32, 4),
       absl::StatusCode::kInvalidArgument,
       {"not a multiple of 4", "token_dtype"}},
      {"too short",
       TokenSpec(path, ferry::v1::UINT16, 100),
       absl::StatusCode::kFailedPrecondition,
       {path, "100 tokens", "seq_len"}},
      {"missing",
       TokenSpec(dir.path() + "/missing.bin", ferry::v1::UINT16, 4),
       absl::StatusCode::kNotFound,
       {"dataset path '" + dir.path() + "/missing.bin' does not exist"}},
      {"directory",
       TokenSpec(dir.path(), ferry::v1::UINT16, 4),
       absl::StatusCode::kInvalidArgument,
       {"not a regular file"}},
      {"empty file",
       TokenSpec(dir.path() + "/empty.bin", ferry::v1::UINT16, 4),
       absl::StatusCode::kFailedPrecondition,
       {"holds 0 tokens"}},
      {"odd size",
       TokenSpec(dir.path() + "/odd.bin", ferry::v1::UINT16, 4),
       absl::StatusCode::kInvalidArgument,
       {"is 201 bytes", "not a multiple of 2"}},
      {"no path",
       TokenSpec("", ferry::v1::UINT16, 4),
       absl::StatusCode::kInvalidArgument,
       {"dataset.tokens.path"}},
  };
  WriteTokens(path + "x", std::vector<uint16_t>(51, 1));  // 102 bytes
  PutText(dir.path() + "/empty.bin", "");
  PutText(dir.path() + "/odd.bin", std::string(201, 'x'));
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<SampleSource>> source =
        MakeSampleSource(c.spec, UnconfinedDatasetFs());
    EXPECT_EQ(source.status().code(), c.code) << c.what << ": " << source.status();
    for (const std::string& sub : c.substrings) {
      EXPECT_THAT(source.status().message(), HasSubstr(sub)) << c.what;
    }
  }
}

TEST(DTypeSizeTest, AllDtypes) {
  EXPECT_EQ(DTypeSize(ferry::v1::DTYPE_UNSPECIFIED), 0u);
  EXPECT_EQ(DTypeSize(ferry::v1::UINT8), 1u);
  EXPECT_EQ(DTypeSize(ferry::v1::UINT16), 2u);
  EXPECT_EQ(DTypeSize(ferry::v1::UINT32), 4u);
  EXPECT_EQ(DTypeSize(ferry::v1::INT32), 4u);
  EXPECT_EQ(DTypeSize(ferry::v1::INT64), 8u);
  EXPECT_EQ(DTypeSize(ferry::v1::FLOAT16), 2u);
  EXPECT_EQ(DTypeSize(ferry::v1::BFLOAT16), 2u);
  EXPECT_EQ(DTypeSize(ferry::v1::FLOAT32), 4u);
}

}  // namespace
}  // namespace ferry
