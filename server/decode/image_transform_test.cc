#include "server/decode/image_transform.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/decode/decode_test_util.h"
#include "testing/jpeg_writer.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testutil::ChromaSubsampling;
using testutil::EncodeCmykJpeg;
using testutil::EncodeGrayJpeg;
using testutil::EncodeJpeg;
using testutil::JpegEncodeOptions;
using testutil::MakeTestPattern;

using decode_test::Crop;
using decode_test::Decoded;
using decode_test::FullDecode;
using decode_test::Image;

struct Diff {
  double mean = 0;
  int max = 0;
};

Diff Compare(const Image& a, const Image& b) {
  EXPECT_EQ(a.size(), b.size());
  Diff d;
  const size_t n = std::min(a.size(), b.size());
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const int e = std::abs(static_cast<int>(a[i]) - static_cast<int>(b[i]));
    sum += e;
    d.max = std::max(d.max, e);
  }
  d.mean = n ? sum / n : 0;
  return d;
}

std::string Describe(const Diff& d) { return absl::StrCat("mean ", d.mean, " max ", d.max); }

Image Mirror(const Image& img, int width, int height) {
  Image out(img.size());
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < 3; ++c) {
        out[(static_cast<size_t>(y) * width + (width - 1 - x)) * 3 + c] =
            img[(static_cast<size_t>(y) * width + x) * 3 + c];
      }
    }
  }
  return out;
}

// Independent reference for PIL's BILINEAR resampling, in double with no intermediate
// rounding: interval [in0, in1) onto n samples, reading only source samples in [lo, hi).
std::vector<std::vector<std::pair<int, double>>> ReferenceWeights(double in0, double in1, int lo,
                                                                  int hi, int n) {
  const double scale = (in1 - in0) / n;
  const double support = std::max(scale, 1.0);
  std::vector<std::vector<std::pair<int, double>>> all(n);
  for (int i = 0; i < n; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    double total = 0;
    for (int x = lo; x < hi; ++x) {
      const double d = std::fabs((x + 0.5 - center) / support);
      if (d < 1.0) {
        all[i].push_back({x, 1.0 - d});
        total += 1.0 - d;
      }
    }
    for (auto& [x, w] : all[i]) w /= total;
  }
  return all;
}

// Resamples [x0, x1) x [y0, y1) of `img` to out_w x out_h, filters clamped to the clamp box.
Image ReferenceResize(const Image& img, int width, double x0, double x1, double y0, double y1,
                      const CropBox& clamp, int out_w, int out_h) {
  auto wx = ReferenceWeights(x0, x1, clamp.x, clamp.x + clamp.width, out_w);
  auto wy = ReferenceWeights(y0, y1, clamp.y, clamp.y + clamp.height, out_h);
  Image out(static_cast<size_t>(out_w) * out_h * 3);
  for (int j = 0; j < out_h; ++j) {
    for (int i = 0; i < out_w; ++i) {
      for (int c = 0; c < 3; ++c) {
        double v = 0;
        for (auto [y, a] : wy[j]) {
          for (auto [x, b] : wx[i]) {
            v += a * b * img[(static_cast<size_t>(y) * width + x) * 3 + c];
          }
        }
        out[(static_cast<size_t>(j) * out_w + i) * 3 + c] =
            static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------- decoding

TEST(JpegDecoderTest, DecodesPatternAtHighQuality) {
  const int w = 203, h = 157;  // odd sizes: partial MCUs on both edges
  const Image pattern = MakeTestPattern(w, h, 1);
  for (ChromaSubsampling sub : {ChromaSubsampling::k444, ChromaSubsampling::k420}) {
    JpegEncodeOptions options;
    options.quality = 95;
    options.subsampling = sub;
    const Image jpeg = EncodeJpeg(pattern.data(), w, h, options);
    ImageDecoder decoder;
    int rw = 0, rh = 0;
    ASSERT_TRUE(decoder.ReadSize(jpeg, &rw, &rh).ok());
    EXPECT_EQ(rw, w);
    EXPECT_EQ(rh, h);
    Image rgb;
    int dw = 0, dh = 0;
    ASSERT_TRUE(decoder.DecodeRgb(jpeg, &rgb, &dw, &dh).ok());
    ASSERT_EQ(dw, w);
    ASSERT_EQ(dh, h);
    const Diff d = Compare(rgb, pattern);
    EXPECT_LT(d.mean, 1.5) << Describe(d);
    EXPECT_LE(d.max, 12) << Describe(d);
  }
}

TEST(JpegDecoderTest, TestPatternIsNotConstantAndIsDeterministic) {
  const Image a = MakeTestPattern(64, 48, 5);
  EXPECT_EQ(a, MakeTestPattern(64, 48, 5));
  EXPECT_NE(a, MakeTestPattern(64, 48, 6));
  const auto [lo, hi] = std::minmax_element(a.begin(), a.end());
  EXPECT_GT(*hi - *lo, 40);
  EXPECT_GE(*lo, 16);
  EXPECT_LE(*hi, 239);
}

TEST(JpegDecoderTest, ProgressiveMatchesBaseline) {
  const int w = 150, h = 99;
  const Image pattern = MakeTestPattern(w, h, 2);
  const Decoded baseline = FullDecode(EncodeJpeg(pattern.data(), w, h, 90));
  const Decoded progressive = FullDecode(EncodeJpeg(pattern.data(), w, h, 90, true));
  ASSERT_EQ(progressive.width, w);
  ASSERT_EQ(progressive.height, h);
  const Diff d = Compare(progressive.rgb, baseline.rgb);
  EXPECT_LE(d.max, 1) << Describe(d);
}

TEST(JpegDecoderTest, GrayscaleDecodesToEqualChannels) {
  const int w = 77, h = 51;
  const Image rgb = MakeTestPattern(w, h, 3);
  Image gray(static_cast<size_t>(w) * h);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = rgb[i * 3 + 1];
  const Decoded d = FullDecode(EncodeGrayJpeg(gray.data(), w, h, 95));
  ASSERT_EQ(d.rgb.size(), gray.size() * 3);
  int max_err = 0;
  for (size_t i = 0; i < gray.size(); ++i) {
    EXPECT_EQ(d.rgb[3 * i], d.rgb[3 * i + 1]);
    EXPECT_EQ(d.rgb[3 * i], d.rgb[3 * i + 2]);
    max_err = std::max(max_err, std::abs(d.rgb[3 * i] - gray[i]));
  }
  EXPECT_LE(max_err, 6);
}

TEST(JpegDecoderTest, AdobeCmykDecodesToRgb) {
  const int w = 64, h = 40;
  const Image rgb = MakeTestPattern(w, h, 4);
  // No black ink and C = 255 - R etc.: the RGB result must be the pattern itself.
  Image cmyk(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
    for (int c = 0; c < 3; ++c) cmyk[4 * i + c] = 255 - rgb[3 * i + c];
    cmyk[4 * i + 3] = 0;
  }
  const Image jpeg = EncodeCmykJpeg(cmyk.data(), w, h, 95);
  const Decoded d = FullDecode(jpeg);
  const Diff diff = Compare(d.rgb, rgb);
  EXPECT_LT(diff.mean, 1.5) << Describe(diff);
  EXPECT_LE(diff.max, 8) << Describe(diff);

  // The cropped, scaled path converts too.
  ImageDecoder decoder;
  Rng rng(1);
  Image out(32 * 32 * 3);
  ASSERT_TRUE(DecodeAndTransform(decoder, jpeg, ImageTransform::ResizeCenterCrop(32, 40), rng,
                                 absl::MakeSpan(out))
                  .ok());
  double mean = 0;
  for (uint8_t v : out) mean += v;
  EXPECT_GT(mean / out.size(), 40);  // not black, not inverted-to-garbage
}

// ---------------------------------------------------------------- errors

void ExpectDecodeError(const Image& bytes, const std::string& fragment,
                       const DecodeLimits& limits = DecodeLimits()) {
  ImageDecoder decoder;
  decoder.set_limits(limits);
  Image rgb;
  int w = 0, h = 0;
  absl::Status s = decoder.DecodeRgb(bytes, &rgb, &w, &h);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));

  Rng rng(9);
  Image out(48 * 48 * 3);
  s = DecodeAndTransform(decoder, bytes, ImageTransform::ResizeCenterCrop(48, 64), rng,
                         absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));
}

Image GoodJpeg(bool progressive = false) {
  const Image p = MakeTestPattern(160, 120, 11);
  return EncodeJpeg(p.data(), 160, 120, 90, progressive);
}

TEST(JpegDecoderErrorTest, EmptyInput) { ExpectDecodeError({}, "empty"); }

TEST(JpegDecoderErrorTest, NotAJpeg) {
  // The signature (FF D8 FF) passes, the next marker is not one (libjpeg's check).
  Image almost = {0xFF, 0xD8, 0xFF, 0x00, 0x12, 0x34};
  ExpectDecodeError(almost, "cannot decode JPEG");
  Image text(500, 'x');
  ExpectDecodeError(text, "not a JPEG or PNG");
  // The message never quotes the file's bytes (libjpeg's own says "starts with 0x78 0x78").
  ImageDecoder decoder;
  Image rgb;
  int w = 0, h = 0;
  absl::Status s = decoder.DecodeRgb(text, &rgb, &w, &h);
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("0x78")));
}

TEST(JpegDecoderErrorTest, TruncatedInHeader) {
  Image jpeg = GoodJpeg();
  jpeg.resize(100);
  ExpectDecodeError(jpeg, "Premature end of JPEG file");
  ImageDecoder decoder;
  int w = 0, h = 0;
  absl::Status s = decoder.ReadSize(jpeg, &w, &h);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("Premature end of JPEG file"));
}

TEST(JpegDecoderErrorTest, TruncatedInScanDataIsAnErrorNotGray) {
  for (bool progressive : {false, true}) {
    Image jpeg = GoodJpeg(progressive);
    jpeg.resize(jpeg.size() * 6 / 10);  // cuts through the center crop's rows
    ExpectDecodeError(jpeg, "Premature end of JPEG file");
  }
}

TEST(JpegDecoderErrorTest, CorruptScanData) {
  Image jpeg = GoodJpeg();
  // A restart marker where none is allowed, in the middle of the entropy-coded data.
  const size_t mid = jpeg.size() / 2;
  jpeg[mid] = 0xFF;
  jpeg[mid + 1] = 0xD3;
  ExpectDecodeError(jpeg, "Corrupt JPEG data");
}

TEST(JpegDecoderErrorTest, HugeProgressiveHeaderFailsWithoutAllocating) {
  Image jpeg = GoodJpeg(/*progressive=*/true);
  // Patch the SOF2 frame header to claim 60000 x 60000 (~10 GiB of coefficients).
  bool patched = false;
  for (size_t i = 0; i + 8 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC2) {
      jpeg[i + 5] = 60000 >> 8, jpeg[i + 6] = 60000 & 0xFF;  // height
      jpeg[i + 7] = 60000 >> 8, jpeg[i + 8] = 60000 & 0xFF;  // width
      patched = true;
      break;
    }
  }
  ASSERT_TRUE(patched);
  // Refused from the header by the pixel limit, before libjpeg allocates anything...
  ExpectDecodeError(jpeg, "over decode_limits.max_image_pixels (89478485)");
  // ...and, with that limit off, by the cap on libjpeg's memory.
  DecodeLimits unlimited;
  unlimited.max_image_pixels = 0;
  ExpectDecodeError(jpeg, "MiB of decoder memory", unlimited);
}

TEST(JpegDecoderErrorTest, PixelAndSizeLimitsAreConfigurable) {
  const Image jpeg = GoodJpeg();  // 160 x 120
  DecodeLimits limits;
  limits.max_image_pixels = 160 * 120 - 1;
  ExpectDecodeError(jpeg, "declares 160x120 = 19200 pixels", limits);
  limits = DecodeLimits();
  limits.max_sample_bytes = jpeg.size() - 1;
  ExpectDecodeError(jpeg, "over decode_limits.max_sample_bytes", limits);
  limits.max_sample_bytes = jpeg.size();
  ImageDecoder decoder;
  decoder.set_limits(limits);
  Image rgb;
  int w = 0, h = 0;
  EXPECT_TRUE(decoder.DecodeRgb(jpeg, &rgb, &w, &h).ok());
}

TEST(JpegDecoderErrorTest, ScanBombIsRefusedBeforeDecoding) {
  const Image p = MakeTestPattern(512, 512, 5);
  JpegEncodeOptions options;
  options.scan_per_coefficient = true;
  const Image bomb = EncodeJpeg(p.data(), 512, 512, options);
  // The file is valid: without a limit it decodes.
  DecodeLimits unlimited;
  unlimited.max_progressive_scans = 0;
  ImageDecoder decoder;
  decoder.set_limits(unlimited);
  Image rgb;
  int w = 0, h = 0;
  ASSERT_TRUE(decoder.DecodeRgb(bomb, &rgb, &w, &h).ok());
  // The default limit (100) refuses it, on both decode paths.
  ExpectDecodeError(bomb, "more than 100 scans (decode_limits.max_progressive_scans)");
  // An ordinary progressive JPEG (about 10 scans) passes the default.
  decoder.set_limits(DecodeLimits());
  EXPECT_TRUE(decoder.DecodeRgb(GoodJpeg(/*progressive=*/true), &rgb, &w, &h).ok());
}

TEST(JpegDecoderErrorTest, DecoderIsReusableAfterErrorsAndMoves) {
  const Image good = GoodJpeg();
  Image bad = good;
  bad.resize(bad.size() / 2);
  ImageDecoder decoder;
  Image rgb;
  int w = 0, h = 0;
  ASSERT_FALSE(decoder.DecodeRgb(bad, &rgb, &w, &h).ok());
  ASSERT_TRUE(decoder.DecodeRgb(good, &rgb, &w, &h).ok());
  const Image first = rgb;
  Rng rng(3);
  Image out(64 * 64 * 3);
  ASSERT_FALSE(DecodeAndTransform(decoder, bad, ImageTransform::ResizeCenterCrop(64, 100), rng,
                                  absl::MakeSpan(out))
                   .ok());
  ImageDecoder moved = std::move(decoder);
  ASSERT_TRUE(moved.DecodeRgb(good, &rgb, &w, &h).ok());
  EXPECT_EQ(rgb, first);
  // A moved-from decoder works again too.
  ASSERT_TRUE(decoder.DecodeRgb(good, &rgb, &w, &h).ok());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(rgb, first);
}

TEST(DecodeAndTransformTest, RejectsBadTransformAndOutputSize) {
  const Image jpeg = GoodJpeg();
  ImageDecoder decoder;
  Rng rng(1);
  Image out(10 * 10 * 3);
  absl::Status s = DecodeAndTransform(decoder, jpeg, ImageTransform::RandomResizedCrop(11, false),
                                      rng, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("363"));

  ImageTransform t = ImageTransform::RandomResizedCrop(10, false);
  t.scale_min = 0.9;
  t.scale_max = 0.1;
  s = DecodeAndTransform(decoder, jpeg, t, rng, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("scale"));

  EXPECT_EQ(ValidateTransform(ImageTransform::ResizeCenterCrop(224, 200)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateTransform(ImageTransform::ResizeCenterCrop(224, 256)).ok());
  EXPECT_TRUE(ValidateTransform(ImageTransform::RandomResizedCrop(224, true)).ok());
  EXPECT_EQ(ValidateTransform(ImageTransform::RandomResizedCrop(0, true)).code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------- crop geometry

TEST(RandomResizedCropTest, BoxesInsideImageWithAreaAndRatioInRange) {
  const ImageTransform t = ImageTransform::RandomResizedCrop(224, false);
  for (auto [w, h] : {std::pair{500, 375}, {375, 500}, {1024, 768}, {333, 333}}) {
    const double area = static_cast<double>(w) * h;
    bool left = false, right = false, top = false, bottom = false;
    double min_frac = 1, max_frac = 0;
    for (uint64_t seed = 0; seed < 5000; ++seed) {
      Rng rng(MixSeed(42, seed));
      const CropBox b = SampleRandomResizedCrop(w, h, t, rng);
      ASSERT_GE(b.x, 0);
      ASSERT_GE(b.y, 0);
      ASSERT_GT(b.width, 0);
      ASSERT_GT(b.height, 0);
      ASSERT_LE(b.x + b.width, w);
      ASSERT_LE(b.y + b.height, h);
      // Rounding each side to an integer moves area and ratio by at most ~0.5 / side.
      const double frac = b.width * static_cast<double>(b.height) / area;
      const double slack = 1.0 + 1.2 / std::min(b.width, b.height);
      EXPECT_GE(frac * slack * slack, t.scale_min) << b.width << "x" << b.height;
      EXPECT_LE(frac, t.scale_max);
      const double ratio = static_cast<double>(b.width) / b.height;
      EXPECT_GE(ratio * slack, t.ratio_min);
      EXPECT_LE(ratio / slack, t.ratio_max);
      min_frac = std::min(min_frac, frac);
      max_frac = std::max(max_frac, frac);
      left |= b.x == 0;
      top |= b.y == 0;
      right |= b.x + b.width == w;
      bottom |= b.y + b.height == h;
    }
    // The draws really spread over the range.
    EXPECT_LT(min_frac, 0.1);
    EXPECT_GT(max_frac, 0.9);
    EXPECT_TRUE(left && right && top && bottom);
  }
}

TEST(RandomResizedCropTest, DeterministicForSeed) {
  const ImageTransform t = ImageTransform::RandomResizedCrop(224, false);
  int distinct = 0;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    Rng a(seed), b(seed), c(seed + 1000);
    const CropBox ba = SampleRandomResizedCrop(640, 480, t, a);
    const CropBox bb = SampleRandomResizedCrop(640, 480, t, b);
    const CropBox bc = SampleRandomResizedCrop(640, 480, t, c);
    EXPECT_EQ(ba.x, bb.x);
    EXPECT_EQ(ba.y, bb.y);
    EXPECT_EQ(ba.width, bb.width);
    EXPECT_EQ(ba.height, bb.height);
    distinct += ba.x != bc.x || ba.width != bc.width || ba.y != bc.y || ba.height != bc.height;
  }
  EXPECT_GT(distinct, 95);
}

TEST(RandomResizedCropTest, RoundsHalfToEvenLikePython) {
  // 13 x 13 with scale fixed at 0.25 and ratio 1: sqrt(42.25) = 6.5 rounds to 6 in Python.
  ImageTransform t = ImageTransform::RandomResizedCrop(8, false);
  t.scale_min = t.scale_max = 0.25;
  t.ratio_min = t.ratio_max = 1.0;
  Rng rng(1);
  const CropBox b = SampleRandomResizedCrop(13, 13, t, rng);
  EXPECT_EQ(b.width, 6);
  EXPECT_EQ(b.height, 6);
}

TEST(RandomResizedCropTest, FallsBackToClampedCenterCrop) {
  const ImageTransform t = ImageTransform::RandomResizedCrop(224, false);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Rng rng(seed);
    // Ratio 100: any crop of >= 8% area is far wider than 4/3 allows with height <= 10.
    CropBox b = SampleRandomResizedCrop(1000, 10, t, rng);
    EXPECT_EQ(b.height, 10);
    EXPECT_EQ(b.width, 13);  // round(10 * 4/3)
    EXPECT_EQ(b.x, (1000 - 13) / 2);
    EXPECT_EQ(b.y, 0);
    b = SampleRandomResizedCrop(10, 1000, t, rng);
    EXPECT_EQ(b.width, 10);
    EXPECT_EQ(b.height, 13);  // round(10 / (3/4))
    EXPECT_EQ(b.x, 0);
    EXPECT_EQ(b.y, (1000 - 13) / 2);
  }
  // In range but impossible area (scale > 1): the whole image.
  ImageTransform big = t;
  big.scale_min = big.scale_max = 4.0;
  Rng rng(7);
  const CropBox b = SampleRandomResizedCrop(300, 250, big, rng);
  EXPECT_EQ(b.x, 0);
  EXPECT_EQ(b.y, 0);
  EXPECT_EQ(b.width, 300);
  EXPECT_EQ(b.height, 250);
}

TEST(ResizeCenterCropTest, GeometryFollowsTorchvision) {
  const ImageTransform t = ImageTransform::ResizeCenterCrop(224, 256);
  ResizeCenterCropGeometry g = ComputeResizeCenterCrop(500, 375, t);
  EXPECT_EQ(g.resized_width, 341);  // int(256 * 500 / 375) = int(341.33)
  EXPECT_EQ(g.resized_height, 256);
  EXPECT_EQ(g.left, 58);  // round(58.5) -> 58 (ties to even)
  EXPECT_EQ(g.top, 16);
  g = ComputeResizeCenterCrop(375, 500, t);
  EXPECT_EQ(g.resized_width, 256);
  EXPECT_EQ(g.resized_height, 341);
  EXPECT_EQ(g.left, 16);
  EXPECT_EQ(g.top, 58);
  g = ComputeResizeCenterCrop(300, 200, ImageTransform::ResizeCenterCrop(224, 257));
  EXPECT_EQ(g.resized_width, 385);  // int(385.5)
  EXPECT_EQ(g.resized_height, 257);
  EXPECT_EQ(g.left, 80);  // round(80.5) -> 80
  EXPECT_EQ(g.top, 16);   // round(16.5) -> 16
  g = ComputeResizeCenterCrop(259, 259, ImageTransform::ResizeCenterCrop(224, 257));
  EXPECT_EQ(g.resized_width, 257);
  EXPECT_EQ(g.left, 16);  // round(16.5) -> 16
}

// ---------------------------------------------------------------- resize

TEST(ResizeTest, ConstantImageStaysConstant) {
  const int w = 97, h = 61;
  Image img(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < img.size(); i += 3) img[i] = 200, img[i + 1] = 17, img[i + 2] = 255;
  for (auto [ow, oh] : {std::pair{13, 7}, {97, 61}, {224, 224}, {1, 1}, {300, 20}}) {
    for (CropBox box : {CropBox{0, 0, w, h}, CropBox{5, 9, 31, 40}, CropBox{96, 60, 1, 1}}) {
      Image out(static_cast<size_t>(ow) * oh * 3);
      ResizeBilinearAntialias(img.data(), w, h, w * 3, box, out.data(), ow, oh);
      for (size_t i = 0; i < out.size(); i += 3) {
        ASSERT_EQ(out[i], 200);
        ASSERT_EQ(out[i + 1], 17);
        ASSERT_EQ(out[i + 2], 255);
      }
    }
  }
}

TEST(ResizeTest, HalvingIsTheOneThreeThreeOneFilter) {
  // PIL BILINEAR at factor 2 has support 2: taps (1, 3, 3, 1) / 8 around each pair, cut
  // and renormalised at the borders.
  const int w = 40, h = 30;
  const Image img = MakeTestPattern(w, h, 8);
  Image out(20 * 15 * 3);
  ResizeBilinearAntialias(img.data(), w, h, w * 3, CropBox{0, 0, w, h}, out.data(), 20, 15);
  auto taps = [](int i, int n) {
    std::vector<std::pair<int, double>> t;
    const double k[4] = {1, 3, 3, 1};
    double total = 0;
    for (int d = 0; d < 4; ++d) {
      const int x = 2 * i - 1 + d;
      if (x >= 0 && x < n) t.push_back({x, k[d]}), total += k[d];
    }
    for (auto& [x, v] : t) v /= total;
    return t;
  };
  int max_err = 0;
  for (int j = 0; j < 15; ++j) {
    for (int i = 0; i < 20; ++i) {
      for (int c = 0; c < 3; ++c) {
        double v = 0;
        for (auto [y, a] : taps(j, h)) {
          for (auto [x, b] : taps(i, w)) v += a * b * img[(y * w + x) * 3 + c];
        }
        max_err = std::max(max_err,
                           std::abs(out[(j * 20 + i) * 3 + c] - static_cast<int>(std::lround(v))));
      }
    }
  }
  EXPECT_LE(max_err, 1);  // one rounding between the two passes
}

TEST(ResizeTest, MatchesDoublePrecisionReferenceOnBoxes) {
  const int w = 120, h = 90;
  const Image img = MakeTestPattern(w, h, 9);
  struct Case {
    CropBox box;
    int ow, oh;
  };
  for (const Case& c : {Case{{0, 0, 120, 90}, 37, 23}, Case{{10, 5, 64, 48}, 64, 48},
                        Case{{100, 70, 20, 20}, 57, 33}, Case{{3, 0, 117, 11}, 224, 5},
                        Case{{0, 0, 1, 90}, 4, 9}}) {
    Image out(static_cast<size_t>(c.ow) * c.oh * 3);
    ResizeBilinearAntialias(img.data(), w, h, w * 3, c.box, out.data(), c.ow, c.oh);
    const Image ref = ReferenceResize(img, w, c.box.x, c.box.x + c.box.width, c.box.y,
                                      c.box.y + c.box.height, c.box, c.ow, c.oh);
    EXPECT_LE(Compare(out, ref).max, 1);
  }
  // Identity size copies the box exactly.
  const CropBox box{7, 3, 50, 41};
  Image out(50 * 41 * 3);
  ResizeBilinearAntialias(img.data(), w, h, w * 3, box, out.data(), 50, 41);
  EXPECT_EQ(out, Crop(img, w, box));
}

// ---------------------------------------------------------------- decode + transform

// Encodes a test pattern; `sub` and `progressive` vary the decoder's paths.
Image PatternJpeg(int w, int h, uint64_t seed, ChromaSubsampling sub, bool progressive = false,
                  int restart_interval = 0) {
  const Image p = MakeTestPattern(w, h, seed);
  JpegEncodeOptions o;
  o.quality = 95;
  o.subsampling = sub;
  o.progressive = progressive;
  o.restart_interval = restart_interval;
  return EncodeJpeg(p.data(), w, h, o);
}

TEST(DecodeAndTransformTest, UnscaledIdentityCropEqualsFullDecodeExactly) {
  // A crop of exactly size x size decodes at 8/8 and resizes by 1: the output must be the
  // full decode's pixels, which checks jpeg_crop_scanline / jpeg_skip_scanlines / the
  // column offset for every subsampling, including crops that touch the edges.
  const int size = 64;
  bool at_left = false, at_right = false, at_top = false, at_bottom = false;
  for (auto [w, h] : {std::pair{181, 139}, {77, 71}}) {
    ImageTransform t = ImageTransform::RandomResizedCrop(size, false);
    t.scale_min = t.scale_max = static_cast<double>(size) * size / (w * h);
    t.ratio_min = t.ratio_max = 1.0;
    for (ChromaSubsampling sub :
         {ChromaSubsampling::k420, ChromaSubsampling::k422, ChromaSubsampling::k444}) {
      for (bool progressive : {false, true}) {
        const Image jpeg = PatternJpeg(w, h, 21, sub, progressive, progressive ? 0 : 3);
        const Decoded full = FullDecode(jpeg);
        ImageDecoder decoder;
        for (uint64_t seed = 0; seed < 40; ++seed) {
          Rng rng(seed), copy(seed);
          const CropBox box = SampleRandomResizedCrop(w, h, t, copy);
          ASSERT_EQ(box.width, size);
          ASSERT_EQ(box.height, size);
          at_left |= box.x == 0;
          at_top |= box.y == 0;
          at_right |= box.x + size == w;
          at_bottom |= box.y + size == h;
          Image out(size * size * 3);
          ASSERT_TRUE(DecodeAndTransform(decoder, jpeg, t, rng, absl::MakeSpan(out)).ok());
          ASSERT_EQ(out, Crop(full.rgb, w, box))
              << w << "x" << h << " box " << box.x << "," << box.y << " subsampling "
              << static_cast<int>(sub) << " progressive " << progressive;
        }
      }
    }
  }
  EXPECT_TRUE(at_left && at_right && at_top && at_bottom);
}

// Compares DecodeAndTransform (scaled, cropped decode) with full decode + the same crop +
// ResizeBilinearAntialias over many random boxes; *worst (if given) gets the worst mean
// difference.
void CheckScaledMatchesFull(const Image& jpeg, const ImageTransform& t, int seeds, double max_mean,
                            int max_max, double* worst = nullptr) {
  const Decoded full = FullDecode(jpeg);
  ImageDecoder decoder;
  double worst_mean = 0;
  int worst_max = 0;
  for (int seed = 0; seed < seeds; ++seed) {
    Rng rng(MixSeed(5, seed)), copy(MixSeed(5, seed));
    Image out(static_cast<size_t>(t.size) * t.size * 3);
    ASSERT_TRUE(DecodeAndTransform(decoder, jpeg, t, rng, absl::MakeSpan(out)).ok());
    Image ref(out.size());
    if (t.kind == ImageTransform::Kind::kRandomResizedCrop) {
      const CropBox box = SampleRandomResizedCrop(full.width, full.height, t, copy);
      ResizeBilinearAntialias(full.rgb.data(), full.width, full.height, full.width * 3, box,
                              ref.data(), t.size, t.size);
    } else {
      const ResizeCenterCropGeometry g = ComputeResizeCenterCrop(full.width, full.height, t);
      const double sx = static_cast<double>(full.width) / g.resized_width;
      const double sy = static_cast<double>(full.height) / g.resized_height;
      ref = ReferenceResize(full.rgb, full.width, g.left * sx, (g.left + t.size) * sx, g.top * sy,
                            (g.top + t.size) * sy, CropBox{0, 0, full.width, full.height}, t.size,
                            t.size);
    }
    const Diff d = Compare(out, ref);
    worst_mean = std::max(worst_mean, d.mean);
    worst_max = std::max(worst_max, d.max);
  }
  EXPECT_LE(worst_mean, max_mean);
  EXPECT_LE(worst_max, max_max);
  std::printf("    %dx%d size %d%s: worst mean %.3f, worst max %d\n", full.width, full.height,
              t.size, t.full_decode ? " full_decode" : "", worst_mean, worst_max);
  if (worst != nullptr) *worst = worst_mean;
}

TEST(DecodeAndTransformTest, FullDecodeMatchesAFullResolutionDecodeExactly) {
  // Crops large enough for the default to decode at 1/2 or 1/4: full_decode must give the
  // pixels of a full decode + crop + resize, the default only nearly.
  for (auto [w, h] : {std::pair{1000, 750}, {1023, 767}}) {
    const Image jpeg = PatternJpeg(w, h, 41, ChromaSubsampling::k420);
    ImageTransform t = ImageTransform::RandomResizedCrop(160, false);
    t.scale_min = 0.5;  // boxes of at least ~600 px a side: scaled by default
    double scaled = 0, full = 0;
    CheckScaledMatchesFull(jpeg, t, 20, 1.5, 16, &scaled);
    t.full_decode = true;
    CheckScaledMatchesFull(jpeg, t, 20, 0.0, 0, &full);
    EXPECT_GT(scaled, full) << "the default should decode these crops at a reduced scale";
    ImageTransform center = ImageTransform::ResizeCenterCrop(160, 180);
    center.full_decode = true;
    CheckScaledMatchesFull(jpeg, center, 1, 0.15, 1);  // vs the double-precision reference
  }
}

TEST(DecodeAndTransformTest, ScaledCroppedDecodeMatchesFullDecode) {
  struct Case {
    int w, h;
    ChromaSubsampling sub;
    bool progressive;
    int size;
  };
  for (const Case& c : {Case{500, 375, ChromaSubsampling::k420, false, 224},
                        Case{1000, 750, ChromaSubsampling::k444, false, 224},
                        Case{1000, 750, ChromaSubsampling::k420, true, 224},
                        Case{333, 501, ChromaSubsampling::k420, true, 64},
                        Case{1023, 767, ChromaSubsampling::k420, false, 96},
                        Case{1023, 767, ChromaSubsampling::k444, false, 57},
                        Case{97, 131, ChromaSubsampling::k422, false, 160}}) {
    SCOPED_TRACE(absl::StrCat(c.w, "x", c.h, " size ", c.size));
    const Image jpeg = PatternJpeg(c.w, c.h, 31, c.sub, c.progressive);
    CheckScaledMatchesFull(jpeg, ImageTransform::RandomResizedCrop(c.size, false), 40, 1.5, 16);
    // The whole image (every edge) as the box.
    ImageTransform whole = ImageTransform::RandomResizedCrop(c.size, false);
    whole.scale_min = whole.scale_max = 1.0;
    whole.ratio_min = whole.ratio_max = static_cast<double>(c.w) / c.h;
    CheckScaledMatchesFull(jpeg, whole, 1, 1.5, 16);
    CheckScaledMatchesFull(jpeg, ImageTransform::ResizeCenterCrop(c.size, c.size + c.size / 7), 1,
                           1.5, 16);
  }
}

TEST(DecodeAndTransformTest, FlipMirrorsTheSameCrop) {
  const Image jpeg = PatternJpeg(320, 240, 41, ChromaSubsampling::k420);
  ImageDecoder decoder;
  int flipped = 0;
  const int n = 40;
  for (ImageTransform t :
       {ImageTransform::RandomResizedCrop(96, true), ImageTransform::ResizeCenterCrop(96, 110)}) {
    for (uint64_t seed = 0; seed < n; ++seed) {
      ImageTransform plain_t = t;
      plain_t.flip = false;
      Rng a(seed), b(seed);
      Image plain(96 * 96 * 3), maybe(96 * 96 * 3);
      ASSERT_TRUE(DecodeAndTransform(decoder, jpeg, plain_t, a, absl::MakeSpan(plain)).ok());
      ASSERT_TRUE(DecodeAndTransform(decoder, jpeg, t, b, absl::MakeSpan(maybe)).ok());
      if (maybe == plain) continue;
      ASSERT_EQ(maybe, Mirror(plain, 96, 96)) << "seed " << seed;
      ++flipped;
    }
  }
  // p = 0.5 over 2 * 40 draws.
  EXPECT_GT(flipped, 20);
  EXPECT_LT(flipped, 60);
}

TEST(DecodeAndTransformTest, DeterministicForSeedAndReusableDecoder) {
  const Image jpeg = PatternJpeg(400, 300, 51, ChromaSubsampling::k420);
  const ImageTransform t = ImageTransform::RandomResizedCrop(128, true);
  ImageDecoder d1, d2;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Rng a(seed), b(seed);
    Image x(128 * 128 * 3), y(128 * 128 * 3);
    ASSERT_TRUE(DecodeAndTransform(d1, jpeg, t, a, absl::MakeSpan(x)).ok());
    ASSERT_TRUE(DecodeAndTransform(d2, jpeg, t, b, absl::MakeSpan(y)).ok());
    EXPECT_EQ(x, y);
  }
}

}  // namespace
}  // namespace ferry
