// Test helpers: PNG encoding of every PNG type with libspng, and EXIF blocks for JPEG and
// PNG files. For tests and benchmarks only (never linked into ferryd).
//
//   PngEncodeOptions o;
//   o.color_type = kPngGray;
//   o.bit_depth = 16;
//   std::vector<uint8_t> png = EncodePng(samples, /*width=*/5, /*height=*/3, o);
//   std::vector<uint8_t> jpeg = AddJpegExif(EncodeJpeg(...), ExifWithOrientation(6, true));
//
// The encoders abort the process with a message on invalid arguments: in a test such a call
// is a bug in the test itself.
#ifndef FERRY_TESTING_PNG_WRITER_H_
#define FERRY_TESTING_PNG_WRITER_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::testutil {

// PNG colour types (IHDR).
inline constexpr int kPngGray = 0;
inline constexpr int kPngRgb = 2;
inline constexpr int kPngPalette = 3;
inline constexpr int kPngGrayAlpha = 4;
inline constexpr int kPngRgba = 6;

struct PngEncodeOptions {
  int color_type = kPngRgb;
  int bit_depth = 8;                            // 1, 2, 4, 8 or 16 as the colour type allows
  bool interlaced = false;                      // Adam7. Default: false
  std::vector<std::array<uint8_t, 3>> palette;  // PLTE, for kPngPalette
  std::vector<uint8_t> trns;                    // tRNS chunk data, written when not empty
  std::vector<uint8_t> exif;                    // eXIf chunk data (a TIFF block), when not empty
};

// Channels per pixel of a colour type: 1, 3, 1, 2, 4.
int PngChannels(int color_type);

// Encodes `samples` (width * height * PngChannels values, row-major, each < 2^bit_depth;
// palette indices for kPngPalette) as a PNG.
std::vector<uint8_t> EncodePng(const std::vector<uint16_t>& samples, int width, int height,
                               const PngEncodeOptions& options);

// `png` with a chunk of `type` and `data` (CRC computed) inserted before the first chunk of
// type `before` ("IDAT", "IEND").
std::vector<uint8_t> AddPngChunk(const std::vector<uint8_t>& png, const std::string& type,
                                 const std::vector<uint8_t>& data, const std::string& before);

// Offset of the first chunk of `type` (its length field) in `png`; aborts when absent.
size_t FindPngChunk(const std::vector<uint8_t>& png, const std::string& type);

// A TIFF block whose IFD0 holds one Orientation (0x0112) entry of `type` (3 SHORT, 4 LONG,
// ...) and `value`, big- or little-endian.
std::vector<uint8_t> ExifWithOrientation(int value, bool big_endian, int type = 3);

// `jpeg` with an APP1 "Exif\0\0" segment holding `tiff` right after its SOI marker.
std::vector<uint8_t> AddJpegExif(const std::vector<uint8_t>& jpeg,
                                 const std::vector<uint8_t>& tiff);

}  // namespace ferry::testutil

#endif  // FERRY_TESTING_PNG_WRITER_H_
