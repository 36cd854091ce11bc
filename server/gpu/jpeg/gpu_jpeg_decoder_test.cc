// GPU tests of GpuJpegDecoder (CTest label `gpu`): batched nvJPEG decode compared pixel by
// pixel with ferry's CPU decode (libjpeg-turbo, ImageDecoder::DecodeRgb) on both backends,
// with and without interpolated chroma; Probe against what the engine takes; argument checks;
// changing batch sizes; a decode state per chroma subsampling; recovery after a failed batch;
// and, as information, the decode rate for 128 copies of a ~110 KiB photo-like JPEG. Skips
// with the reason without a GPU or without libnvjpeg.
//
// Tolerance (per image, uint8 RGB): mean |GPU - CPU| < 1.0 and max <= 8 for 4:4:4 and gray,
// <= 24 for subsampled chroma. nvJPEG's IDCT and colour conversion round differently from
// libjpeg-turbo's (a level or two); its replicated chroma differs from libjpeg's "fancy"
// (triangular) upsampling near chroma edges: on these test images libjpeg's own replicated vs
// fancy upsampling differ by a mean of 0.05-0.2 and at most 4-6 levels.
#include "server/gpu/jpeg/gpu_jpeg_decoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/random.h"
#include "cuda/cuda_resources.h"
#include "cuda/gpu_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/decode/image_transform.h"
#include "server/gpu/jpeg/nvjpeg_library.h"
#include "testing/jpeg_writer.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using testutil::ChromaSubsampling;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// A photo-like image: testutil's smooth pattern plus luma noise of +-luma and chroma noise of
// +-chroma levels (real photos carry most of their detail in luma).
std::vector<uint8_t> TexturedRgb(int w, int h, uint64_t seed, int luma, int chroma) {
  std::vector<uint8_t> rgb = testutil::MakeTestPattern(w, h, seed);
  Rng rng(MixSeed(seed, 0x6e6f697365ull));
  for (size_t p = 0; p < rgb.size(); p += 3) {
    const int y = static_cast<int>(std::floor(rng.Uniform(-luma, luma + 1.0)));
    for (int c = 0; c < 3; ++c) {
      const int n = static_cast<int>(std::floor(rng.Uniform(-chroma, chroma + 1.0)));
      rgb[p + c] = static_cast<uint8_t>(std::clamp(rgb[p + c] + y + n, 0, 255));
    }
  }
  return rgb;
}

struct TestImage {
  std::string name;
  std::vector<uint8_t> jpeg;
  bool subsampled = true;
};

TestImage Textured(int w, int h, ChromaSubsampling sub, int restart_interval = 0) {
  const char* names[] = {"4:2:0", "4:2:2", "4:4:4", "4:4:0", "4:1:1"};
  testutil::JpegEncodeOptions o;
  o.quality = 90;
  o.subsampling = sub;
  o.restart_interval = restart_interval;
  const std::vector<uint8_t> rgb = TexturedRgb(w, h, w * 7919 + h, 24, 6);
  return TestImage{absl::StrCat(w, "x", h, " ", names[static_cast<int>(sub)],
                                restart_interval ? " restart" : ""),
                   testutil::EncodeJpeg(rgb.data(), w, h, o), sub != ChromaSubsampling::k444};
}

TestImage Gray(int w, int h) {
  std::vector<uint8_t> rgb = TexturedRgb(w, h, 11, 24, 0), gray(static_cast<size_t>(w) * h);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = rgb[3 * i + 1];
  return TestImage{absl::StrCat(w, "x", h, " gray"),
                   testutil::EncodeGrayJpeg(gray.data(), w, h, 90), false};
}

struct Decoded {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

Decoded CpuDecode(const std::vector<uint8_t>& jpeg) {
  ImageDecoder decoder;
  Decoded d;
  const absl::Status s = decoder.DecodeRgb(jpeg, &d.rgb, &d.width, &d.height);
  EXPECT_TRUE(s.ok()) << s;
  return d;
}

// Decodes `jpegs` as one batch on `stream` into fresh device buffers and copies them back.
absl::StatusOr<std::vector<Decoded>> GpuDecode(GpuJpegDecoder& decoder,
                                               const std::vector<std::vector<uint8_t>>& jpegs,
                                               const CudaStream& stream) {
  std::vector<absl::Span<const uint8_t>> spans;
  std::vector<GpuJpegVerdict> verdicts;
  std::vector<GpuJpegDecoder::Target> targets;
  std::vector<DeviceBuffer> buffers;
  std::vector<Decoded> out(jpegs.size());
  for (size_t i = 0; i < jpegs.size(); ++i) {
    const GpuJpegVerdict v = decoder.Probe(jpegs[i]);
    if (v.reason != GpuJpegReject::kNone) {
      return absl::FailedPreconditionError(
          absl::StrCat("Probe refuses image ", i, ": ", GpuJpegRejectName(v.reason)));
    }
    out[i].width = v.width;
    out[i].height = v.height;
    const size_t bytes = static_cast<size_t>(v.width) * v.height * 3;
    absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Create(decoder.device(), bytes);
    if (!buffer.ok()) return buffer.status();
    targets.push_back(
        {static_cast<uint8_t*>(buffer->data()), static_cast<size_t>(v.width) * 3, bytes});
    buffers.push_back(std::move(*buffer));
    spans.push_back(jpegs[i]);
    verdicts.push_back(v);
  }
  absl::Status s = decoder.DecodeBatch(spans, verdicts, targets, stream.get());
  if (!s.ok()) return s;
  s = stream.Synchronize();
  if (!s.ok()) return s;
  for (size_t i = 0; i < jpegs.size(); ++i) {
    out[i].rgb.resize(targets[i].bytes);
    if (cudaMemcpy(out[i].rgb.data(), targets[i].data, targets[i].bytes, cudaMemcpyDeviceToHost) !=
        cudaSuccess) {
      return absl::InternalError("cudaMemcpy of a decoded image failed");
    }
  }
  return out;
}

struct Diff {
  double mean = 0;
  int max = 0;
};

Diff Compare(const Decoded& gpu, const Decoded& cpu) {
  Diff d;
  if (gpu.rgb.size() != cpu.rgb.size() || gpu.rgb.empty()) return Diff{1e9, 255};
  double sum = 0;
  for (size_t i = 0; i < gpu.rgb.size(); ++i) {
    const int e = std::abs(int{gpu.rgb[i]} - int{cpu.rgb[i]});
    sum += e;
    d.max = std::max(d.max, e);
  }
  d.mean = sum / static_cast<double>(gpu.rgb.size());
  return d;
}

void ExpectWithinTolerance(const TestImage& image, const Decoded& gpu, const Decoded& cpu,
                           const std::string& config) {
  EXPECT_EQ(gpu.width, cpu.width) << image.name;
  EXPECT_EQ(gpu.height, cpu.height) << image.name;
  const Diff d = Compare(gpu, cpu);
  const int max_bound = image.subsampled ? 24 : 8;
  // Replicated chroma (nvJPEG before 12, or where interpolation is not offered) against
  // libjpeg's interpolated chroma differs at every chroma edge: on an image a few MCUs
  // across, nearly every pixel is near one (measured on the H100: 17x9 4:2:0, mean 5.6).
  const bool tiny = std::min(cpu.width, cpu.height) < 32;
  const double mean_bound =
      image.subsampled && tiny && config.find("replicated") != std::string::npos ? 8.0 : 1.0;
  std::printf("  %-28s %-22s mean |diff| %.3f  max %3d\n", image.name.c_str(), config.c_str(),
              d.mean, d.max);
  EXPECT_LT(d.mean, mean_bound) << image.name << " " << config;
  EXPECT_LE(d.max, max_bound) << image.name << " " << config;
}

class GpuJpegDecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FERRY_SKIP_WITHOUT_GPU();
    absl::StatusOr<const NvJpegLibrary*> lib = NvJpegLibrary::Load();
    if (!lib.ok()) GTEST_SKIP() << lib.status().message();
    library_ = *lib;
    absl::StatusOr<CudaStream> stream = CudaStream::Create(0);
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = std::make_unique<CudaStream>(std::move(*stream));
  }

  absl::StatusOr<GpuJpegDecoder> MakeDecoder(int max_batch, bool hardware = true,
                                             bool interpolate = true) {
    GpuJpegDecoder::Options o;
    o.allow_hardware = hardware;
    o.interpolate_chroma = interpolate;
    return GpuJpegDecoder::Create(*library_, 0, max_batch, o);
  }

  static std::string Describe(const GpuJpegDecoder& d) {
    return absl::StrCat(GpuJpegDecoder::BackendName(d.backend()),
                        d.interpolates_chroma() ? ", interpolated" : ", replicated");
  }

  const NvJpegLibrary* library_ = nullptr;
  std::unique_ptr<CudaStream> stream_;
};

TEST_F(GpuJpegDecoderTest, MatchesTheCpuDecoder) {
  const std::vector<TestImage> images = {
      Textured(333, 501, ChromaSubsampling::k420),
      Textured(333, 501, ChromaSubsampling::k444),
      Textured(333, 501, ChromaSubsampling::k422),
      Textured(333, 501, ChromaSubsampling::k440),
      Gray(257, 129),
      Textured(500, 375, ChromaSubsampling::k420, /*restart_interval=*/5),
      Textured(17, 9, ChromaSubsampling::k420),
      Textured(1023, 767, ChromaSubsampling::k420)};
  std::vector<std::vector<uint8_t>> jpegs;
  std::vector<Decoded> cpu;
  for (const TestImage& image : images) {
    jpegs.push_back(image.jpeg);
    cpu.push_back(CpuDecode(image.jpeg));
  }
  absl::StatusOr<GpuJpegDecoder> first_or = MakeDecoder(16);
  ASSERT_TRUE(first_or.ok()) << first_or.status();
  GpuJpegDecoder& first = *first_or;
  std::printf("nvJPEG %s from %s; device 0: %s backend, %d JPEG engines x %d cores\n",
              std::string(first.library_version()).c_str(), library_->path().c_str(),
              std::string(GpuJpegDecoder::BackendName(first.backend())).c_str(),
              first.hardware_engines(), first.hardware_cores_per_engine());
  for (const bool hardware : {true, false}) {
    for (const bool interpolate : {true, false}) {
      absl::StatusOr<GpuJpegDecoder> decoder_or = MakeDecoder(16, hardware, interpolate);
      ASSERT_TRUE(decoder_or.ok()) << decoder_or.status();
      GpuJpegDecoder& decoder = *decoder_or;
      if (!hardware) {
        EXPECT_EQ(decoder.backend(), GpuJpegDecoder::Backend::kCuda);
      }
      const std::string config = Describe(decoder);
      absl::StatusOr<std::vector<Decoded>> gpu = GpuDecode(decoder, jpegs, *stream_);
      ASSERT_TRUE(gpu.ok()) << config << ": " << gpu.status();
      for (size_t i = 0; i < images.size(); ++i) {
        ExpectWithinTolerance(images[i], (*gpu)[i], cpu[i], config);
      }
    }
  }
}

TEST_F(GpuJpegDecoderTest, ProbeSendsWhatTheEngineCannotTakeToTheCpu) {
  absl::StatusOr<GpuJpegDecoder> decoder_or = MakeDecoder(4);
  ASSERT_TRUE(decoder_or.ok()) << decoder_or.status();
  GpuJpegDecoder& decoder = *decoder_or;
  const std::vector<uint8_t> rgb = TexturedRgb(96, 64, 3, 24, 6);
  testutil::JpegEncodeOptions progressive;
  progressive.progressive = true;
  EXPECT_EQ(decoder.Probe(testutil::EncodeJpeg(rgb.data(), 96, 64, progressive)).reason,
            GpuJpegReject::kProgressive);
  testutil::JpegEncodeOptions s411;
  s411.subsampling = ChromaSubsampling::k411;
  EXPECT_EQ(decoder.Probe(testutil::EncodeJpeg(rgb.data(), 96, 64, s411)).reason,
            GpuJpegReject::kUnsupportedSubsampling);
  std::vector<uint8_t> cmyk(96 * 64 * 4, 50);
  EXPECT_EQ(decoder.Probe(testutil::EncodeCmykJpeg(cmyk.data(), 96, 64, 90)).reason,
            GpuJpegReject::kCmyk);
  const std::vector<uint8_t> good = testutil::EncodeJpeg(rgb.data(), 96, 64, 90);
  const GpuJpegVerdict v = decoder.Probe(good);
  EXPECT_EQ(v.reason, GpuJpegReject::kNone);
  EXPECT_EQ(v.width, 96);
  EXPECT_EQ(v.height, 64);
  const std::vector<uint8_t> cut(good.begin(), good.begin() + good.size() / 2);
  EXPECT_EQ(decoder.Probe(cut).reason, GpuJpegReject::kCorrupt);
}

TEST_F(GpuJpegDecoderTest, DecodeBatchChecksItsArguments) {
  absl::StatusOr<GpuJpegDecoder> decoder_or = MakeDecoder(2);
  ASSERT_TRUE(decoder_or.ok()) << decoder_or.status();
  GpuJpegDecoder& decoder = *decoder_or;
  const std::vector<uint8_t> rgb = TexturedRgb(64, 48, 5, 24, 6);
  const std::vector<uint8_t> good = testutil::EncodeJpeg(rgb.data(), 64, 48, 90);
  testutil::JpegEncodeOptions po;
  po.progressive = true;
  const std::vector<uint8_t> progressive = testutil::EncodeJpeg(rgb.data(), 64, 48, po);
  absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Create(0, 2 * 64 * 48 * 3);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  uint8_t* base = static_cast<uint8_t*>(buffer->data());
  const GpuJpegDecoder::Target t0{base, 64 * 3, 64 * 48 * 3};
  const GpuJpegDecoder::Target t1{base + 64 * 48 * 3, 64 * 3, 64 * 48 * 3};
  const absl::Span<const uint8_t> g(good), p(progressive);
  const GpuJpegVerdict gv = decoder.Probe(g), pv = decoder.Probe(p);
  ASSERT_EQ(gv.reason, GpuJpegReject::kNone);

  absl::Status s = decoder.DecodeBatch({g, p}, {gv, pv}, {t0, t1}, stream_->get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("image 1 of the batch cannot be decoded on the GPU (progressive)"));

  s = decoder.DecodeBatch({g}, {gv}, {GpuJpegDecoder::Target{base, 64 * 3, 64 * 48 * 3 - 1}},
                          stream_->get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("target 0 of the batch (pitch 192, 9215 bytes) cannot hold 64x48"));
  s = decoder.DecodeBatch({g}, {gv}, {GpuJpegDecoder::Target{base, 64 * 3 - 1, 1 << 20}},
                          stream_->get());
  EXPECT_THAT(Msg(s), HasSubstr("needs a pitch of at least 192"));

  s = decoder.DecodeBatch({g, g, g}, {gv, gv, gv}, {t0, t1, t1}, stream_->get());
  EXPECT_THAT(Msg(s), HasSubstr("batch of 3 images; this decoder takes 1 to 2"));
  s = decoder.DecodeBatch({g, g}, {gv, gv}, {t0}, stream_->get());
  EXPECT_THAT(Msg(s), HasSubstr("counts differ"));
  s = decoder.DecodeBatch({g, g}, {gv}, {t0, t1}, stream_->get());
  EXPECT_THAT(Msg(s), HasSubstr("2 images with 1 verdicts into 2 targets: counts differ"));
  s = decoder.DecodeBatch({}, {}, {}, stream_->get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  // Still usable.
  ASSERT_TRUE(decoder.DecodeBatch({g, g}, {gv, gv}, {t0, t1}, stream_->get()).ok());
  ASSERT_TRUE(stream_->Synchronize().ok());
}

TEST_F(GpuJpegDecoderTest, BatchSizeMayChangeAndABadBatchIsSurvived) {
  absl::StatusOr<GpuJpegDecoder> decoder_or = MakeDecoder(8);
  ASSERT_TRUE(decoder_or.ok()) << decoder_or.status();
  GpuJpegDecoder& decoder = *decoder_or;
  const TestImage image = Textured(200, 160, ChromaSubsampling::k420);
  const Decoded cpu = CpuDecode(image.jpeg);
  // Cut inside the scan and closed with EOI: passes the header rules, fails or garbles in
  // nvJPEG. Whatever nvJPEG makes of it, the next batches must decode right.
  std::vector<uint8_t> damaged(image.jpeg.begin(), image.jpeg.begin() + image.jpeg.size() / 3);
  damaged.insert(damaged.end(), {0xFF, 0xD9});
  for (const int n : {3, 5, -1, 3, 1}) {
    if (n < 0) {
      const absl::StatusOr<std::vector<Decoded>> bad =
          GpuDecode(decoder, {image.jpeg, damaged}, *stream_);
      std::printf("  a batch with a damaged file: %s\n", bad.ok()
                                                             ? "decoded (nvJPEG reported no error)"
                                                             : bad.status().ToString().c_str());
      continue;
    }
    std::vector<std::vector<uint8_t>> jpegs(n, image.jpeg);
    absl::StatusOr<std::vector<Decoded>> gpu = GpuDecode(decoder, jpegs, *stream_);
    ASSERT_TRUE(gpu.ok()) << "batch of " << n << ": " << gpu.status();
    for (const Decoded& d : *gpu) ExpectWithinTolerance(image, d, cpu, Describe(decoder));
  }
}

TEST_F(GpuJpegDecoderTest, EachChromaSubsamplingKeepsItsOwnDecodeState) {
  absl::StatusOr<GpuJpegDecoder> decoder_or = MakeDecoder(8);
  ASSERT_TRUE(decoder_or.ok()) << decoder_or.status();
  GpuJpegDecoder& decoder = *decoder_or;
  const std::vector<TestImage> images = {
      Textured(320, 240, ChromaSubsampling::k420), Textured(300, 200, ChromaSubsampling::k444),
      Textured(240, 320, ChromaSubsampling::k420), Gray(200, 150),
      Textured(200, 300, ChromaSubsampling::k444)};
  std::vector<std::vector<uint8_t>> jpegs;
  std::vector<Decoded> cpu;
  for (const TestImage& image : images) {
    jpegs.push_back(image.jpeg);
    cpu.push_back(CpuDecode(image.jpeg));
  }
  // Three groups a batch (4:2:0, 4:4:4, gray), each initialised once: a shared state would
  // be initialised again for every group of every batch.
  for (int batch = 0; batch < 3; ++batch) {
    absl::StatusOr<std::vector<Decoded>> gpu = GpuDecode(decoder, jpegs, *stream_);
    ASSERT_TRUE(gpu.ok()) << "batch " << batch << ": " << gpu.status();
    for (size_t i = 0; i < images.size(); ++i) {
      ExpectWithinTolerance(images[i], (*gpu)[i], cpu[i], Describe(decoder));
    }
    EXPECT_EQ(decoder.stats().batches, batch + 1);
    EXPECT_EQ(decoder.stats().groups, 3 * (batch + 1));
    EXPECT_EQ(decoder.stats().initializations, 3) << "after batch " << batch;
    // The engines wait for the stream once before a batch and once after, not per group.
    if (decoder.backend() == GpuJpegDecoder::Backend::kHardware) {
      EXPECT_EQ(decoder.stats().drains, 2 * (batch + 1));
    }
  }
  // Only the 4:2:0 group changes size: only its state is initialised again.
  absl::StatusOr<std::vector<Decoded>> gpu = GpuDecode(decoder, {jpegs[0], jpegs[1]}, *stream_);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(decoder.stats().initializations, 5);  // 4:2:0 (2 -> 1) and 4:4:4 (2 -> 1)
  gpu = GpuDecode(decoder, {jpegs[0], jpegs[1], jpegs[4]}, *stream_);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ(decoder.stats().initializations, 6);  // 4:4:4 back to 2; 4:2:0 still 1
  ExpectWithinTolerance(images[4], (*gpu)[2], cpu[4], Describe(decoder));
}

TEST_F(GpuJpegDecoderTest, DecodeRate) {
  // 500x375 4:2:0 at quality 90 with photo-like noise: ~110 KiB, ImageNet's mean file.
  const std::vector<uint8_t> rgb = TexturedRgb(500, 375, 42, 52, 8);
  const std::vector<uint8_t> jpeg = testutil::EncodeJpeg(rgb.data(), 500, 375, 90);
  constexpr int kBatch = 128, kBatches = 10;
  const size_t bytes = 500 * 375 * 3;
  absl::StatusOr<DeviceBuffer> out = DeviceBuffer::Create(0, bytes * kBatch);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<absl::Span<const uint8_t>> spans(kBatch, absl::Span<const uint8_t>(jpeg));
  std::vector<GpuJpegVerdict> verdicts;
  std::vector<GpuJpegDecoder::Target> targets;
  for (int i = 0; i < kBatch; ++i) {
    targets.push_back({static_cast<uint8_t*>(out->data()) + i * bytes, 500 * 3, bytes});
  }
  std::printf("decode rate, batches of %d x %zu KiB 500x375 4:2:0:\n", kBatch, jpeg.size() >> 10);
  for (const bool hardware : {true, false}) {
    absl::StatusOr<GpuJpegDecoder> decoder_or = MakeDecoder(kBatch, hardware);
    ASSERT_TRUE(decoder_or.ok()) << decoder_or.status();
    GpuJpegDecoder& decoder = *decoder_or;
    verdicts.assign(kBatch, decoder.Probe(jpeg));
    for (int i = 0; i < 2; ++i) {  // warm-up: nvJPEG sizes its buffers
      ASSERT_TRUE(decoder.DecodeBatch(spans, verdicts, targets, stream_->get()).ok());
    }
    ASSERT_TRUE(stream_->Synchronize().ok());
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatches; ++i) {
      const absl::Status s = decoder.DecodeBatch(spans, verdicts, targets, stream_->get());
      ASSERT_TRUE(s.ok()) << s;
    }
    ASSERT_TRUE(stream_->Synchronize().ok());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("  %-22s %8.0f images/s  (%.2f ms per batch)\n", Describe(decoder).c_str(),
                kBatch * kBatches / seconds, 1e3 * seconds / kBatches);
  }
}

}  // namespace
}  // namespace ferry
