// Test helpers: synthetic images, JPEG encoding with libjpeg, and writing bytes to files.
// For tests and benchmarks only (never linked into ferryd).
//
//   std::vector<uint8_t> rgb = MakeTestPattern(320, 240, /*seed=*/7);
//   std::vector<uint8_t> jpeg = EncodeJpeg(rgb.data(), 320, 240, /*quality=*/95);
//   ASSERT_TRUE(WriteFile(dir + "/cat/0.jpg", jpeg).ok());
//
// The encoders abort the process with a message on invalid arguments (non-positive size,
// quality outside 1..100): in a test such a call is a bug in the test itself.
#ifndef FERRY_TESTING_JPEG_WRITER_H_
#define FERRY_TESTING_JPEG_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

// Not `ferry::testing`: that would shadow gtest's ::testing inside namespace ferry.

namespace ferry::testutil {

enum class ChromaSubsampling {
  k420,  // 2x2 (libjpeg's default for YCbCr, and most photos)
  k422,  // 2x1
  k444,  // none
  k440,  // 1x2 (vertical only)
  k411,  // 4x1
};

struct JpegEncodeOptions {
  int quality = 90;                                         // 1..100. Default: 90
  ChromaSubsampling subsampling = ChromaSubsampling::k420;  // Default: 4:2:0
  bool progressive = false;                                 // Default: baseline (sequential)
  // Store the channels as RGB, with no YCbCr transform (an Adobe APP14 marker with transform
  // 0 says so; no JFIF marker). Default: false (YCbCr, JFIF)
  bool store_rgb = false;
  int restart_interval = 0;  // In MCUs; 0 = no restart markers. Default: 0
  // Progressive with one scan per AC coefficient and component (1 + 63 * 3 = 190 scans): a
  // valid file with far more scans than any real encoder writes (a scan-count bomb).
  bool scan_per_coefficient = false;
};

// Encodes `width` x `height` RGB HWC pixels (tightly packed) as a YCbCr JFIF JPEG, 4:2:0.
std::vector<uint8_t> EncodeJpeg(const uint8_t* rgb, int width, int height, int quality,
                                bool progressive = false);

// As above with every option.
std::vector<uint8_t> EncodeJpeg(const uint8_t* rgb, int width, int height,
                                const JpegEncodeOptions& options);

// Encodes one-channel pixels as a grayscale JPEG.
std::vector<uint8_t> EncodeGrayJpeg(const uint8_t* gray, int width, int height, int quality);

// Encodes CMYK pixels (4 channels, 0 = no ink) as an Adobe CMYK JPEG with inverted samples,
// the way Photoshop and PIL write them.
std::vector<uint8_t> EncodeCmykJpeg(const uint8_t* cmyk, int width, int height, int quality);

// A smooth, non-constant RGB HWC image: gradients plus a few low-frequency waves per
// channel, values inside [16, 239]. JPEG at quality >= 90 preserves it to within a few
// levels. The same (width, height, seed) always gives the same pixels.
std::vector<uint8_t> MakeTestPattern(int width, int height, uint64_t seed);

// Writes `bytes` to `path` (created or truncated, mode 0644). Does not create directories.
absl::Status WriteFile(const std::string& path, absl::Span<const uint8_t> bytes);

}  // namespace ferry::testutil

#endif  // FERRY_TESTING_JPEG_WRITER_H_
