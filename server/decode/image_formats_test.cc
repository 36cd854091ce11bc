// PNG decoding, format sniffing and EXIF orientation through ImageDecoder /
// DecodeAndTransform. PIL itself is the reference in tests/integration/test_image_formats.py;
// here the expected pixels follow the rules internal/png.h states.
#include <algorithm>
#include <array>
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
#include "server/decode/exif.h"
#include "server/decode/image_transform.h"
#include "testing/jpeg_writer.h"
#include "testing/png_writer.h"

namespace ferry {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testutil::AddJpegExif;
using testutil::AddPngChunk;
using testutil::EncodeJpeg;
using testutil::EncodePng;
using testutil::ExifWithOrientation;
using testutil::FindPngChunk;
using testutil::kPngGray;
using testutil::kPngGrayAlpha;
using testutil::kPngPalette;
using testutil::kPngRgb;
using testutil::kPngRgba;
using testutil::MakeTestPattern;
using testutil::PngChannels;
using testutil::PngEncodeOptions;

using decode_test::Crop;
using decode_test::Decoded;
using decode_test::FullDecode;
using decode_test::Image;

// Samples for a PNG of `o`'s type: random in [0, 2^depth), palette indices below `max_index`.
std::vector<uint16_t> RandomSamples(int w, int h, const PngEncodeOptions& o, uint64_t seed,
                                    int max_index = 0) {
  Rng rng(seed);
  const uint64_t range = o.color_type == kPngPalette ? max_index : uint64_t{1} << o.bit_depth;
  std::vector<uint16_t> samples(static_cast<size_t>(w) * h * PngChannels(o.color_type));
  for (uint16_t& v : samples) v = static_cast<uint16_t>(rng.Below(range));
  return samples;
}

// PIL's Image.open(f).convert("RGB") of one pixel (internal/png.h's table).
std::array<uint8_t, 3> PilRgb(const PngEncodeOptions& o, const uint16_t* px) {
  const int d = o.bit_depth;
  auto gray = [](int v) { return std::array<uint8_t, 3>{uint8_t(v), uint8_t(v), uint8_t(v)}; };
  switch (o.color_type) {
    case kPngGray:
      return gray(d == 16 ? std::min<int>(px[0], 255) : px[0] * 255 / ((1 << d) - 1));
    case kPngGrayAlpha:
      return gray(d == 16 ? px[0] >> 8 : px[0]);
    case kPngPalette:
      if (px[0] < o.palette.size()) return o.palette[px[0]];
      return gray(px[0]);
    default:  // RGB, RGBA
      if (d == 16) return {uint8_t(px[0] >> 8), uint8_t(px[1] >> 8), uint8_t(px[2] >> 8)};
      return {uint8_t(px[0]), uint8_t(px[1]), uint8_t(px[2])};
  }
}

Image PilImage(const std::vector<uint16_t>& samples, int w, int h, const PngEncodeOptions& o) {
  const int channels = PngChannels(o.color_type);
  Image rgb;
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
    const std::array<uint8_t, 3> p = PilRgb(o, &samples[i * channels]);
    rgb.insert(rgb.end(), p.begin(), p.end());
  }
  return rgb;
}

std::vector<std::array<uint8_t, 3>> TestPalette(int n, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::array<uint8_t, 3>> palette(n);
  for (auto& c : palette) {
    for (uint8_t& v : c) v = static_cast<uint8_t>(rng.Below(256));
  }
  return palette;
}

// An 8-bit RGB PNG of the given pixels.
Image RgbPng(const Image& rgb, int w, int h, const Image& exif = {}) {
  PngEncodeOptions o;
  o.exif = exif;
  return EncodePng(std::vector<uint16_t>(rgb.begin(), rgb.end()), w, h, o);
}

// ---------------------------------------------------------------- sniffing

TEST(SniffImageFormatTest, BySignatureOnly) {
  const Image p = MakeTestPattern(8, 8, 1);
  EXPECT_EQ(SniffImageFormat(EncodeJpeg(p.data(), 8, 8, 90)), ImageFormat::kJpeg);
  EXPECT_EQ(SniffImageFormat(RgbPng(p, 8, 8)), ImageFormat::kPng);
  EXPECT_EQ(SniffImageFormat(Image{0xFF, 0xD8}), ImageFormat::kUnknown);
  EXPECT_EQ(SniffImageFormat(Image{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A}), ImageFormat::kUnknown);
  EXPECT_EQ(SniffImageFormat(Image{}), ImageFormat::kUnknown);
}

void ExpectNotJpegOrPng(const std::string& bytes, const std::string& looks_like) {
  ImageDecoder decoder;
  Image rgb;
  int w = 0, h = 0;
  const Image data(bytes.begin(), bytes.end());
  absl::Status s = decoder.DecodeRgb(data, &rgb, &w, &h);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a JPEG or PNG"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(looks_like));
  Rng rng(1);
  Image out(8 * 8 * 3);
  s = DecodeAndTransform(decoder, data, ImageTransform::RandomResizedCrop(8, false), rng,
                         absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a JPEG or PNG"));
  EXPECT_EQ(decoder.ReadSize(data, &w, &h).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SniffImageFormatTest, OtherFormatsAreNamedWithoutQuotingTheFile) {
  ExpectNotJpegOrPng(std::string("GIF89a") + std::string(40, '\1'), "looks like a GIF");
  ExpectNotJpegOrPng(std::string("RIFF\x10\0\0\0WEBPVP8 ", 16) + std::string(40, '\1'),
                     "looks like a WebP");
  ExpectNotJpegOrPng(std::string("\0\0\0\x1c"
                                 "ftypavif",
                                 12) +
                         std::string(40, '\1'),
                     "looks like an ISO media file");
  ExpectNotJpegOrPng("<html><body>secret-token-123</body></html>", "looks like text");
  // Not a format it knows: named by what it is not only.
  ExpectNotJpegOrPng(std::string("\x01\x02\x03\x04\x05", 5), "89 50 4E 47");
  ImageDecoder decoder;
  Image rgb;
  int w = 0, h = 0;
  const std::string html = "<html><body>secret-token-123</body></html>";
  absl::Status s = decoder.DecodeRgb(Image(html.begin(), html.end()), &rgb, &w, &h);
  EXPECT_THAT(std::string(s.message()), AllOf(Not(HasSubstr("secret")), Not(HasSubstr("<html"))));
}

TEST(SniffImageFormatTest, PngNamedJpegAndJpegBytesDecodeByContent) {
  // What the bytes are decides, not what a name would say: the decoder never sees names, and
  // both formats go through the same calls.
  const Image p = MakeTestPattern(24, 16, 2);
  const Decoded png = FullDecode(RgbPng(p, 24, 16));
  EXPECT_EQ(png.rgb, p);
  const Decoded jpeg = FullDecode(EncodeJpeg(p.data(), 24, 16, 95));
  EXPECT_EQ(jpeg.width, 24);
  EXPECT_EQ(jpeg.height, 16);
}

// ---------------------------------------------------------------- PNG types

struct PngType {
  int color_type;
  int bit_depth;
};

TEST(PngDecodeTest, EveryTypeAndDepthMatchesPilConvertRgb) {
  const PngType types[] = {
      {kPngGray, 1},    {kPngGray, 2},      {kPngGray, 4},       {kPngGray, 8},    {kPngGray, 16},
      {kPngRgb, 8},     {kPngRgb, 16},      {kPngPalette, 1},    {kPngPalette, 2}, {kPngPalette, 4},
      {kPngPalette, 8}, {kPngGrayAlpha, 8}, {kPngGrayAlpha, 16}, {kPngRgba, 8},    {kPngRgba, 16}};
  // Odd sizes: partial bytes at the end of sub-byte rows, and Adam7 passes of every size
  // (one of 1 x N and N x 1 passes empty).
  const std::pair<int, int> sizes[] = {{13, 7}, {1, 9}, {9, 1}, {33, 17}};
  int checked = 0;
  for (const PngType& type : types) {
    for (bool interlaced : {false, true}) {
      for (auto [w, h] : sizes) {
        SCOPED_TRACE(absl::StrCat("colour type ", type.color_type, " depth ", type.bit_depth,
                                  interlaced ? " interlaced " : " ", w, "x", h));
        PngEncodeOptions o;
        o.color_type = type.color_type;
        o.bit_depth = type.bit_depth;
        o.interlaced = interlaced;
        int max_index = 0;
        if (type.color_type == kPngPalette) {
          max_index = 1 << type.bit_depth;
          o.palette = TestPalette(max_index, 100 + type.bit_depth);
          o.trns = {0, 128, 255};  // alpha for the first entries: ignored, as by PIL
        }
        if (type.color_type == kPngGray && type.bit_depth == 8) o.trns = {0, 7};  // gray 7
        const std::vector<uint16_t> samples = RandomSamples(w, h, o, 7 * w + h, max_index);
        const Image png = EncodePng(samples, w, h, o);
        ImageDecoder decoder;
        int rw = 0, rh = 0;
        ASSERT_TRUE(decoder.ReadSize(png, &rw, &rh).ok());
        EXPECT_EQ(rw, w);
        EXPECT_EQ(rh, h);
        const Decoded d = FullDecode(png);
        ASSERT_EQ(d.width, w);
        ASSERT_EQ(d.height, h);
        ASSERT_EQ(d.rgb, PilImage(samples, w, h, o));
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 15 * 2 * 4);
}

TEST(PngDecodeTest, Gray16ClipsAt255AndWideSamplesTakeTheHighByte) {
  PngEncodeOptions gray;
  gray.color_type = kPngGray;
  gray.bit_depth = 16;
  const std::vector<uint16_t> values = {0, 1, 100, 254, 255, 256, 257, 300, 511, 65535};
  Decoded d = FullDecode(EncodePng(values, 10, 1, gray));
  const Image want_gray = {0, 1, 100, 254, 255, 255, 255, 255, 255, 255};
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(d.rgb[3 * i], want_gray[i]) << values[i];
    EXPECT_EQ(d.rgb[3 * i + 2], want_gray[i]) << values[i];
  }
  PngEncodeOptions rgb16;
  rgb16.bit_depth = 16;
  // 58377 = 0xE409: the high byte 228, where rounding to 8 bits would give 227.
  d = FullDecode(EncodePng({58377, 255, 65535}, 1, 1, rgb16));
  EXPECT_EQ(d.rgb, (Image{228, 0, 255}));
}

TEST(PngDecodeTest, AlphaIsDroppedNotComposited) {
  PngEncodeOptions rgba;
  rgba.color_type = kPngRgba;
  Decoded d = FullDecode(EncodePng({100, 50, 20, 0, 200, 30, 40, 128}, 2, 1, rgba));
  EXPECT_EQ(d.rgb, (Image{100, 50, 20, 200, 30, 40}));
  PngEncodeOptions la;
  la.color_type = kPngGrayAlpha;
  d = FullDecode(EncodePng({100, 0, 200, 128}, 2, 1, la));
  EXPECT_EQ(d.rgb, (Image{100, 100, 100, 200, 200, 200}));
}

TEST(PngDecodeTest, PaletteIndexPastTheEndIsGrayAsInPil) {
  PngEncodeOptions o;
  o.color_type = kPngPalette;
  o.palette = {{10, 20, 30}, {40, 50, 60}};
  Decoded d = FullDecode(EncodePng({0, 1, 5, 200}, 4, 1, o));
  EXPECT_EQ(d.rgb, (Image{10, 20, 30, 40, 50, 60, 5, 5, 5, 200, 200, 200}));
}

// ---------------------------------------------------------------- PNG errors and limits

void ExpectPngError(const Image& bytes, const std::string& fragment,
                    const DecodeLimits& limits = DecodeLimits()) {
  ImageDecoder decoder;
  decoder.set_limits(limits);
  Image rgb;
  int w = 0, h = 0;
  absl::Status s = decoder.DecodeRgb(bytes, &rgb, &w, &h);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));
  for (ImageTransform t :
       {ImageTransform::ResizeCenterCrop(16, 20), ImageTransform::RandomResizedCrop(16, true)}) {
    t.exif_orientation = true;
    Rng rng(3);
    Image out(16 * 16 * 3);
    s = DecodeAndTransform(decoder, bytes, t, rng, absl::MakeSpan(out));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));
  }
}

Image GoodPng(int w = 64, int h = 48, bool interlaced = false) {
  PngEncodeOptions o;
  o.interlaced = interlaced;
  const Image p = MakeTestPattern(w, h, 12);
  return EncodePng(std::vector<uint16_t>(p.begin(), p.end()), w, h, o);
}

uint32_t BigEndian32(const Image& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) |
         b[at + 3];
}

TEST(PngErrorTest, TruncatedAnywhereIsAnError) {
  for (bool interlaced : {false, true}) {
    const Image good = GoodPng(64, 48, interlaced);
    const size_t iend = FindPngChunk(good, "IEND");
    // In the header, in the rows, in the last CRC, and only IEND missing (which PIL accepts).
    for (size_t cut : {size_t{20}, size_t{40}, good.size() / 2, iend - 2, iend}) {
      SCOPED_TRACE(absl::StrCat("cut at ", cut, " of ", good.size()));
      ExpectPngError(Image(good.begin(), good.begin() + cut), "cannot decode PNG");
    }
  }
}

TEST(PngErrorTest, ChecksumMismatchesInCriticalChunksAreReported) {
  const Image good = GoodPng();
  const size_t idat = FindPngChunk(good, "IDAT");
  const size_t idat_length = BigEndian32(good, idat);
  // A flipped bit in the compressed rows: whatever notices first (a bad filter byte, zlib,
  // the CRC) fails the file.
  Image data_bit = good;
  data_bit[idat + 8 + idat_length / 2] ^= 0x10;
  ExpectPngError(data_bit, "cannot decode PNG");
  // A flipped bit in zlib's Adler-32 at the very end of the image data, after every row.
  Image trailer_bit = good;
  trailer_bit[idat + 8 + idat_length - 1] ^= 0x01;
  ExpectPngError(trailer_bit, "cannot decode PNG: IDAT stream error");
  // The CRC itself damaged, in the last image data chunk (read only once every row is
  // decoded) and in the header.
  Image idat_crc = good;
  idat_crc[idat + 8 + idat_length] ^= 0x01;
  ExpectPngError(idat_crc, "cannot decode PNG: invalid chunk checksum");
  Image ihdr_crc = good;
  ihdr_crc[8 + 8 + 13] ^= 0x01;
  ExpectPngError(ihdr_crc, "cannot decode PNG");
}

TEST(PngErrorTest, DamagedAncillaryChunkIsDroppedAndTheImageDecodes) {
  const Image good = GoodPng(16, 8);
  Image png = AddPngChunk(good, "tEXt", {'k', 0, 'v'}, "IDAT");
  png[FindPngChunk(png, "tEXt") + 8 + 3] ^= 0x01;  // its CRC
  const Decoded d = FullDecode(png);
  EXPECT_EQ(d.rgb, FullDecode(good).rgb);
}

// `png` with its IHDR declaring width x height (CRC recomputed by re-adding the chunk).
Image WithDeclaredSize(const Image& png, uint32_t width, uint32_t height) {
  Image ihdr(png.begin() + 16, png.begin() + 16 + 13);
  for (int i = 0; i < 4; ++i) {
    ihdr[i] = static_cast<uint8_t>(width >> (24 - 8 * i));
    ihdr[4 + i] = static_cast<uint8_t>(height >> (24 - 8 * i));
  }
  // The old IHDR (25 bytes after the signature) out, the new one in before the chunk that
  // now comes first.
  Image out = png;
  out.erase(out.begin() + 8, out.begin() + 8 + 25);
  const std::string first(out.begin() + 12, out.begin() + 16);
  return AddPngChunk(out, "IHDR", ihdr, first);
}

TEST(PngErrorTest, PixelLimitIsCheckedFromTheHeaderBeforeDecoding) {
  // 60000 x 60000 declared (3.6 G pixels, 10.8 GB as RGB): refused at once.
  const Image huge = WithDeclaredSize(GoodPng(), 60000, 60000);
  ExpectPngError(huge,
                 "declares 60000x60000 = 3600000000 pixels, over "
                 "decode_limits.max_image_pixels (89478485)");
  // With the limit off, the last line refuses it too, before any allocation.
  DecodeLimits unlimited;
  unlimited.max_image_pixels = 0;
  ExpectPngError(huge, "MiB to decode", unlimited);

  const Image png = GoodPng(64, 48);
  DecodeLimits limits;
  limits.max_image_pixels = 64 * 48 - 1;
  ExpectPngError(png, "declares 64x48 = 3072 pixels, over decode_limits.max_image_pixels", limits);
  limits.max_image_pixels = 64 * 48;
  ImageDecoder decoder;
  decoder.set_limits(limits);
  Image rgb;
  int w = 0, h = 0;
  EXPECT_TRUE(decoder.DecodeRgb(png, &rgb, &w, &h).ok());
}

TEST(PngErrorTest, SampleByteLimitAndEmptyInput) {
  const Image png = GoodPng(16, 16);
  DecodeLimits limits;
  limits.max_sample_bytes = png.size() - 1;
  ExpectPngError(png, "over decode_limits.max_sample_bytes", limits);
  ExpectPngError({}, "empty input");
}

TEST(PngErrorTest, DecoderIsReusableAfterPngAndJpegErrors) {
  const Image good_png = GoodPng(40, 30);
  const Image p = MakeTestPattern(40, 30, 3);
  const Image good_jpeg = EncodeJpeg(p.data(), 40, 30, 90);
  const Image bad_png(good_png.begin(), good_png.begin() + good_png.size() / 2);
  ImageDecoder decoder;
  Image rgb;
  int w = 0, h = 0;
  ASSERT_FALSE(decoder.DecodeRgb(bad_png, &rgb, &w, &h).ok());
  ASSERT_TRUE(decoder.DecodeRgb(good_jpeg, &rgb, &w, &h).ok());
  ASSERT_TRUE(decoder.DecodeRgb(good_png, &rgb, &w, &h).ok());
  EXPECT_EQ(rgb, MakeTestPattern(40, 30, 12));
}

// ---------------------------------------------------------------- transform

TEST(PngTransformTest, RandomResizedCropIsTheFullResolutionCropAndResize) {
  const int w = 120, h = 90;
  const Image p = MakeTestPattern(w, h, 21);
  for (bool interlaced : {false, true}) {
    PngEncodeOptions o;
    o.interlaced = interlaced;
    const Image png = EncodePng(std::vector<uint16_t>(p.begin(), p.end()), w, h, o);
    ImageDecoder decoder;
    int flipped = 0;
    for (uint64_t seed = 0; seed < 30; ++seed) {
      const ImageTransform t = ImageTransform::RandomResizedCrop(32, /*flip=*/true);
      Rng rng(seed), copy(seed);
      Image out(32 * 32 * 3);
      ASSERT_TRUE(DecodeAndTransform(decoder, png, t, rng, absl::MakeSpan(out)).ok());
      const CropBox box = SampleRandomResizedCrop(w, h, t, copy);
      const bool mirror = copy.Uniform() < 0.5;
      Image want(out.size());
      ResizeBilinearAntialias(p.data(), w, h, w * 3, box, want.data(), 32, 32);
      if (mirror) {
        ++flipped;
        for (int y = 0; y < 32; ++y) {
          for (int x = 0; x < 16; ++x) {
            for (int c = 0; c < 3; ++c) {
              std::swap(want[(y * 32 + x) * 3 + c], want[(y * 32 + 31 - x) * 3 + c]);
            }
          }
        }
      }
      ASSERT_EQ(out, want) << "seed " << seed;
      // Both used the same draws: the next one agrees.
      EXPECT_EQ(rng.Uniform(), copy.Uniform());
    }
    EXPECT_GT(flipped, 5);
    EXPECT_LT(flipped, 25);
  }
}

TEST(PngTransformTest, SameDrawsAsAJpegOfTheSameSize) {
  const Image p = MakeTestPattern(200, 150, 22);
  const Image png = RgbPng(p, 200, 150);
  const Image jpeg = EncodeJpeg(p.data(), 200, 150, 95);
  ImageDecoder decoder;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const ImageTransform t = ImageTransform::RandomResizedCrop(48, true);
    Rng a(seed), b(seed);
    Image x(48 * 48 * 3), y(48 * 48 * 3);
    ASSERT_TRUE(DecodeAndTransform(decoder, png, t, a, absl::MakeSpan(x)).ok());
    ASSERT_TRUE(DecodeAndTransform(decoder, jpeg, t, b, absl::MakeSpan(y)).ok());
    EXPECT_EQ(a.Uniform(), b.Uniform()) << "seed " << seed;
    // Same crop, same flip: the pixels differ by JPEG's loss and DCT scaling only.
    double diff = 0;
    for (size_t i = 0; i < x.size(); ++i) diff += std::abs(x[i] - y[i]);
    EXPECT_LT(diff / x.size(), 4.0) << "seed " << seed;
  }
}

// ---------------------------------------------------------------- EXIF orientation

// Center crop without resampling: the shorter side is already `resize`, so the output is the
// central side x side square of the (turned) image, exactly.
ImageTransform ExactCenterCrop(int side) {
  ImageTransform t = ImageTransform::ResizeCenterCrop(side, side);
  t.exif_orientation = true;
  return t;
}

Image CenterSquare(const Image& img, int w, int h) {
  const int side = std::min(w, h);
  const ResizeCenterCropGeometry g =
      ComputeResizeCenterCrop(w, h, ImageTransform::ResizeCenterCrop(side, side));
  return Crop(img, w, CropBox{g.left, g.top, side, side});
}

TEST(ExifTransformTest, EveryOrientationTurnsJpegAndPngBeforeTheCrop) {
  const int w = 40, h = 26;  // not square: 5..8 swap the sides
  const Image p = MakeTestPattern(w, h, 31);
  const Image plain_jpeg = EncodeJpeg(p.data(), w, h, 95);
  const Decoded jpeg_pixels = FullDecode(plain_jpeg);
  ImageDecoder decoder;
  for (int o = 1; o <= 8; ++o) {
    for (bool big_endian : {false, true}) {
      SCOPED_TRACE(absl::StrCat("orientation ", o, big_endian ? " big-endian" : ""));
      const Image tiff = ExifWithOrientation(o, big_endian);
      int uw = 0, uh = 0;
      OrientedSize(o, w, h, &uw, &uh);
      ASSERT_EQ(uw, o >= 5 ? h : w);
      for (bool is_png : {true, false}) {
        const Image file = is_png ? RgbPng(p, w, h, tiff) : AddJpegExif(plain_jpeg, tiff);
        const Image& stored = is_png ? p : jpeg_pixels.rgb;
        ASSERT_EQ(ReadExifOrientation(file), o);
        Image upright(stored.size());
        ApplyExifOrientation(o, stored.data(), w, h, upright.data());
        const int side = std::min(w, h);
        Image out(static_cast<size_t>(side) * side * 3);
        Rng rng(1);
        ASSERT_TRUE(
            DecodeAndTransform(decoder, file, ExactCenterCrop(side), rng, absl::MakeSpan(out))
                .ok());
        EXPECT_EQ(out, CenterSquare(upright, uw, uh)) << (is_png ? "PNG" : "JPEG");
        // Off: the pixels as stored, whatever the tag says.
        ImageTransform off = ExactCenterCrop(side);
        off.exif_orientation = false;
        ASSERT_TRUE(DecodeAndTransform(decoder, file, off, rng, absl::MakeSpan(out)).ok());
        EXPECT_EQ(out, CenterSquare(stored, w, h)) << (is_png ? "PNG" : "JPEG");
      }
    }
  }
}

TEST(ExifTransformTest, RandomResizedCropIsDrawnOnTheUprightSize) {
  const int w = 90, h = 50;
  const Image p = MakeTestPattern(w, h, 32);
  const Image png = RgbPng(p, w, h, ExifWithOrientation(6, false));
  Image upright(p.size());
  ApplyExifOrientation(6, p.data(), w, h, upright.data());
  ImageTransform t = ImageTransform::RandomResizedCrop(24, false);
  t.exif_orientation = true;
  ImageDecoder decoder;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    Rng rng(seed), copy(seed);
    Image out(24 * 24 * 3), want(24 * 24 * 3);
    ASSERT_TRUE(DecodeAndTransform(decoder, png, t, rng, absl::MakeSpan(out)).ok());
    const CropBox box = SampleRandomResizedCrop(h, w, t, copy);  // 50 x 90 upright
    ResizeBilinearAntialias(upright.data(), h, w, h * 3, box, want.data(), 24, 24);
    ASSERT_EQ(out, want) << "seed " << seed;
  }
}

TEST(ExifTransformTest, UprightJpegTakesTheScaledPathAndGarbageExifIsIgnored) {
  const int w = 300, h = 200;
  const Image p = MakeTestPattern(w, h, 33);
  const Image jpeg = EncodeJpeg(p.data(), w, h, 95);
  const Image six = ExifWithOrientation(6, false);
  std::vector<Image> files = {
      AddJpegExif(jpeg, ExifWithOrientation(1, false)),
      AddJpegExif(jpeg, {'g', 'a', 'r', 'b', 'a', 'g', 'e', '!', 1, 2, 3}),
      AddJpegExif(jpeg, ExifWithOrientation(9, true)),
      AddJpegExif(jpeg, Image(six.begin(), six.begin() + 15)),  // the entry cut short
  };
  ImageDecoder decoder;
  ImageTransform on = ImageTransform::RandomResizedCrop(40, true);
  on.exif_orientation = true;
  ImageTransform off = on;
  off.exif_orientation = false;
  for (size_t i = 0; i < files.size(); ++i) {
    for (uint64_t seed = 0; seed < 5; ++seed) {
      Rng a(seed), b(seed);
      Image x(40 * 40 * 3), y(40 * 40 * 3);
      ASSERT_TRUE(DecodeAndTransform(decoder, files[i], on, a, absl::MakeSpan(x)).ok()) << i;
      ASSERT_TRUE(DecodeAndTransform(decoder, jpeg, off, b, absl::MakeSpan(y)).ok());
      EXPECT_EQ(x, y) << "file " << i << " seed " << seed;
    }
  }
  // A PNG with a garbage eXIf decodes as stored (PIL's exif_transpose raises for it).
  const Image png = AddPngChunk(GoodPng(32, 20), "eXIf", {'M', 'M', 0, 42, 0xFF, 0, 0, 0}, "IDAT");
  Rng rng(1);
  Image out(20 * 20 * 3);
  ImageTransform t = ExactCenterCrop(20);
  ASSERT_TRUE(DecodeAndTransform(decoder, png, t, rng, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, CenterSquare(MakeTestPattern(32, 20, 12), 32, 20));
}

TEST(ExifTransformTest, PngExifAfterTheImageDataCounts) {
  const Image p = MakeTestPattern(30, 20, 34);
  const Image png = AddPngChunk(RgbPng(p, 30, 20), "eXIf", ExifWithOrientation(3, true), "IEND");
  ASSERT_GT(FindPngChunk(png, "eXIf"), FindPngChunk(png, "IDAT"));
  Image upright(p.size());
  ApplyExifOrientation(3, p.data(), 30, 20, upright.data());
  ImageDecoder decoder;
  Rng rng(1);
  Image out(20 * 20 * 3);
  ASSERT_TRUE(DecodeAndTransform(decoder, png, ExactCenterCrop(20), rng, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, CenterSquare(upright, 30, 20));
}

}  // namespace
}  // namespace ferry
