#include "server/decode/exif.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "testing/jpeg_writer.h"
#include "testing/png_writer.h"

namespace ferry {
namespace {

using testutil::AddJpegExif;
using testutil::AddPngChunk;
using testutil::EncodeJpeg;
using testutil::EncodePng;
using testutil::ExifWithOrientation;
using testutil::MakeTestPattern;
using testutil::PngEncodeOptions;

using Bytes = std::vector<uint8_t>;

int Parse(const Bytes& tiff) { return ParseExifOrientation(tiff); }

// ---------------------------------------------------------------- the TIFF block

TEST(ParseExifOrientationTest, AllEightValuesInBothByteOrders) {
  for (int o = 1; o <= 8; ++o) {
    EXPECT_EQ(Parse(ExifWithOrientation(o, /*big_endian=*/false)), o);
    EXPECT_EQ(Parse(ExifWithOrientation(o, /*big_endian=*/true)), o);
  }
}

TEST(ParseExifOrientationTest, IntegerTypesAsPilReadsThem) {
  for (bool be : {false, true}) {
    EXPECT_EQ(Parse(ExifWithOrientation(6, be, /*type=*/3)), 6);  // SHORT
    EXPECT_EQ(Parse(ExifWithOrientation(6, be, /*type=*/8)), 6);  // SSHORT
    EXPECT_EQ(Parse(ExifWithOrientation(6, be, /*type=*/4)), 6);  // LONG
    EXPECT_EQ(Parse(ExifWithOrientation(6, be, /*type=*/9)), 6);  // SLONG
    EXPECT_EQ(Parse(ExifWithOrientation(6, be, /*type=*/1)), 1);  // BYTE: PIL ignores it
    EXPECT_EQ(Parse(ExifWithOrientation(6, be, /*type=*/7)), 1);  // UNDEFINED
  }
}

TEST(ParseExifOrientationTest, ValuesOutsideOneToEightMeanUpright) {
  for (int v : {0, 9, 255, 65535}) EXPECT_EQ(Parse(ExifWithOrientation(v, false)), 1) << v;
}

TEST(ParseExifOrientationTest, MalformedBlocksMeanUpright) {
  EXPECT_EQ(Parse({}), 1);
  EXPECT_EQ(Parse({'g', 'a', 'r', 'b', 'a', 'g', 'e', '!', 'g', 'a', 'r', 'b'}), 1);
  EXPECT_EQ(Parse({'I', 'I', 42, 0}), 1);                          // no IFD offset
  EXPECT_EQ(Parse({'I', 'I', 42, 0, 0xFF, 0xFF, 0xFF, 0xFF}), 1);  // IFD far outside
  EXPECT_EQ(Parse({'M', 'M', 42, 0, 0, 0, 0, 8}), 1);              // byte order mixed up
  // The IFD says 1000 entries; only the header of the first fits.
  Bytes tiff = ExifWithOrientation(6, false);
  tiff[8] = 0xE8, tiff[9] = 0x03;
  tiff.resize(8 + 2 + 6);
  EXPECT_EQ(Parse(tiff), 1);
  // Every truncation of a good block: the entry is whole (6) or ignored (1), nothing else.
  const Bytes good = ExifWithOrientation(6, true);
  for (size_t n = 0; n <= good.size(); ++n) {
    const int o = Parse(Bytes(good.begin(), good.begin() + n));
    EXPECT_TRUE(o == 1 || (o == 6 && n >= 8 + 2 + 12)) << n;
  }
}

TEST(ParseExifOrientationTest, EveryByteDamagedStillGivesAValidOrientation) {
  // For the sanitizer builds: no read outside the block, whatever a byte says.
  for (bool be : {false, true}) {
    const Bytes good = ExifWithOrientation(6, be);
    for (size_t i = 0; i < good.size(); ++i) {
      for (uint8_t v : {0x00, 0x01, 0x7F, 0x80, 0xFF}) {
        Bytes bad = good;
        bad[i] = v;
        const int o = Parse(bad);
        EXPECT_TRUE(o >= 1 && o <= 8) << i;
      }
    }
  }
}

TEST(ParseExifOrientationTest, LastOfTwoEntriesWinsAndFirstValueOfACount) {
  // Two Orientation entries (3 then 8): PIL keeps the last.
  Bytes tiff = {'I', 'I', 42, 0, 8, 0, 0, 0, 2, 0};
  for (int v : {3, 8}) {
    const Bytes entry = {0x12, 0x01, 3, 0, 1, 0, 0, 0, static_cast<uint8_t>(v), 0, 0, 0};
    tiff.insert(tiff.end(), entry.begin(), entry.end());
  }
  tiff.insert(tiff.end(), {0, 0, 0, 0});
  EXPECT_EQ(Parse(tiff), 8);
  // SHORT with count 2 (both values in the entry) and count 3 (at an offset): the first.
  Bytes two = {'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 2, 0, 5, 0, 7};
  EXPECT_EQ(Parse(two), 5);
  Bytes three = {'M', 'M', 0, 42, 0, 0,  0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0,
                 0,   3,   0, 0,  0, 26, 0, 0, 0, 0, 0,    7,    0, 2, 0, 2};
  EXPECT_EQ(Parse(three), 7);
  three[21] = 200;  // the offset points past the end: the entry is skipped
  EXPECT_EQ(Parse(three), 1);
}

TEST(ParseExifOrientationTest, IfdAnywhereInTheBlock) {
  // IFD0 at offset 20 after padding, as some writers place it.
  Bytes tiff = {'I', 'I', 42, 0, 20, 0, 0, 0};
  tiff.resize(20, 0xAA);
  const Bytes ifd = {1, 0, 0x12, 0x01, 3, 0, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0};
  tiff.insert(tiff.end(), ifd.begin(), ifd.end());
  EXPECT_EQ(Parse(tiff), 8);
}

// ---------------------------------------------------------------- finding the block

Bytes SmallJpeg() {
  const Bytes p = MakeTestPattern(16, 8, 1);
  return EncodeJpeg(p.data(), 16, 8, 90);
}

Bytes SmallPng(const Bytes& exif = {}) {
  PngEncodeOptions o;
  o.exif = exif;
  const Bytes p = MakeTestPattern(16, 8, 1);
  return EncodePng(std::vector<uint16_t>(p.begin(), p.end()), 16, 8, o);
}

// `jpeg` with an APP1 segment of `payload` right after SOI.
Bytes WithApp1(const Bytes& jpeg, const std::string& payload) {
  const size_t length = payload.size() + 2;
  Bytes out = {
      0xFF, 0xD8, 0xFF, 0xE1, static_cast<uint8_t>(length >> 8), static_cast<uint8_t>(length)};
  out.insert(out.end(), payload.begin(), payload.end());
  out.insert(out.end(), jpeg.begin() + 2, jpeg.end());
  return out;
}

TEST(FindExifTest, JpegFirstExifApp1BeforeTheScan) {
  const Bytes jpeg = SmallJpeg();  // JFIF APP0 first, then the tables
  EXPECT_TRUE(FindJpegExif(jpeg).empty());
  EXPECT_EQ(ReadExifOrientation(jpeg), 1);
  const Bytes six = AddJpegExif(jpeg, ExifWithOrientation(6, true));
  EXPECT_EQ(ReadExifOrientation(six), 6);
  // Of two Exif APP1 segments the first counts (PIL's): AddJpegExif puts the new one first.
  EXPECT_EQ(ReadExifOrientation(AddJpegExif(six, ExifWithOrientation(3, false))), 3);
  // An APP1 that is not Exif (XMP) before it is skipped.
  const Bytes xmp = WithApp1(six, "http://ns.adobe.com/xap/1.0/");
  EXPECT_EQ(ReadExifOrientation(xmp), 6);
  // Exif only after the start of scan is image data, not metadata.
  Bytes late = jpeg;
  const Bytes segment = AddJpegExif({0xFF, 0xD8}, ExifWithOrientation(6, false));
  late.insert(late.end() - 2, segment.begin() + 2, segment.end());
  EXPECT_EQ(ReadExifOrientation(late), 1);
}

TEST(FindExifTest, JpegBrokenMarkersEndTheSearch) {
  const Bytes six = AddJpegExif(SmallJpeg(), ExifWithOrientation(6, false));
  // Every truncation of the file: 6 once the block is whole, else 1; never a read past it.
  const size_t block_end = 4 + 2 + 6 + ExifWithOrientation(6, false).size();
  for (size_t n = 0; n <= block_end + 4; ++n) {
    const int o = ReadExifOrientation(Bytes(six.begin(), six.begin() + n));
    EXPECT_EQ(o, n >= block_end ? 6 : 1) << n;
  }
  // A segment length of 0 or 1, or past the end.
  for (uint8_t low : {0, 1, 0xFF}) {
    Bytes bad = six;
    bad[4] = low == 0xFF ? 0xFF : 0, bad[5] = low;
    EXPECT_EQ(ReadExifOrientation(bad), 1) << int{low};
  }
}

TEST(FindExifTest, PngLastExifChunkBeforeOrAfterTheImageData) {
  EXPECT_EQ(ReadExifOrientation(SmallPng()), 1);
  const Bytes six = SmallPng(ExifWithOrientation(6, false));
  EXPECT_EQ(ReadExifOrientation(six), 6);
  EXPECT_FALSE(FindPngExif(six).empty());
  EXPECT_EQ(
      ReadExifOrientation(AddPngChunk(SmallPng(), "eXIf", ExifWithOrientation(8, true), "IEND")),
      8);
  // Two: the last wins (PIL's)...
  Bytes two = AddPngChunk(six, "eXIf", ExifWithOrientation(3, true), "IEND");
  EXPECT_EQ(ReadExifOrientation(two), 3);
  // ...unless its CRC is wrong: a damaged chunk is dropped, the first one stands.
  two[testutil::FindPngChunk(two, "IEND") - 1] ^= 0x01;
  EXPECT_EQ(ReadExifOrientation(two), 6);
  Bytes damaged = six;  // the block intact, its CRC not
  damaged[testutil::FindPngChunk(damaged, "eXIf") + 8 + ExifWithOrientation(6, false).size()] ^=
      0x01;
  EXPECT_EQ(ReadExifOrientation(damaged), 1);
  // With the JPEG-style "Exif\0\0" prefix the block is not TIFF: ignored (PIL raises).
  Bytes prefixed = {'E', 'x', 'i', 'f', 0, 0};
  const Bytes tiff = ExifWithOrientation(6, false);
  prefixed.insert(prefixed.end(), tiff.begin(), tiff.end());
  EXPECT_EQ(ReadExifOrientation(AddPngChunk(SmallPng(), "eXIf", prefixed, "IDAT")), 1);
  // Truncated files: the chunk counts only when whole.
  for (size_t n = 0; n < six.size(); ++n) {
    const int o = ReadExifOrientation(Bytes(six.begin(), six.begin() + n));
    EXPECT_TRUE(o == 1 || o == 6) << n;
  }
  // A chunk length past the end stops the walk.
  Bytes bad = six;
  bad[8] = 0x7F;  // IHDR's length
  EXPECT_EQ(ReadExifOrientation(bad), 1);
}

TEST(FindExifTest, OtherFormatsHaveNone) {
  EXPECT_EQ(ReadExifOrientation({}), 1);
  EXPECT_EQ(ReadExifOrientation({'G', 'I', 'F', '8', '9', 'a'}), 1);
  EXPECT_EQ(ReadExifOrientation(ExifWithOrientation(6, false)), 1);  // bare TIFF
}

// ---------------------------------------------------------------- turning the pixels

TEST(ApplyExifOrientationTest, MatchesPilExifTranspose) {
  // A 3 x 2 image whose red channel numbers the pixels 0, 10, ..., 50, and what
  // PIL.ImageOps.exif_transpose makes of it for each orientation (Pillow 9.4, red channel).
  const std::vector<std::vector<int>> want = {
      {0, 10, 20, 30, 40, 50},  // 1
      {20, 10, 0, 50, 40, 30},  // 2
      {50, 40, 30, 20, 10, 0},  // 3
      {30, 40, 50, 0, 10, 20},  // 4
      {0, 30, 10, 40, 20, 50},  // 5 (2 x 3 from here)
      {30, 0, 40, 10, 50, 20},  // 6
      {50, 20, 40, 10, 30, 0},  // 7
      {20, 50, 10, 40, 0, 30},  // 8
  };
  Bytes src;
  for (int i = 0; i < 6; ++i) src.insert(src.end(), {uint8_t(10 * i), uint8_t(i), 7});
  for (int o = 1; o <= 8; ++o) {
    int w = 0, h = 0;
    OrientedSize(o, 3, 2, &w, &h);
    EXPECT_EQ(w, o >= 5 ? 2 : 3) << o;
    EXPECT_EQ(h, o >= 5 ? 3 : 2) << o;
    Bytes dst(src.size(), 0);
    ApplyExifOrientation(o, src.data(), 3, 2, dst.data());
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(dst[3 * i], want[o - 1][i]) << "orientation " << o << " pixel " << i;
      EXPECT_EQ(dst[3 * i + 1] * 10, dst[3 * i]) << "channels move together";
      EXPECT_EQ(dst[3 * i + 2], 7);
    }
  }
}

TEST(ApplyExifOrientationTest, InversePairsRestoreTheImage) {
  // 6 (clockwise) then 8 (counter-clockwise) is the identity; 2, 3, 4, 5, 7 undo themselves.
  const int w = 7, h = 4;
  const Bytes src = MakeTestPattern(w, h, 3);
  Bytes once(src.size()), twice(src.size());
  ApplyExifOrientation(6, src.data(), w, h, once.data());
  ApplyExifOrientation(8, once.data(), h, w, twice.data());
  EXPECT_EQ(twice, src);
  for (int o : {2, 3, 4, 5, 7}) {
    int ow = 0, oh = 0;
    OrientedSize(o, w, h, &ow, &oh);
    ApplyExifOrientation(o, src.data(), w, h, once.data());
    ApplyExifOrientation(o, once.data(), ow, oh, twice.data());
    EXPECT_EQ(twice, src) << o;
  }
}

}  // namespace
}  // namespace ferry
