// Helpers shared by the decoder's tests: whole-image decodes and crops of RGB HWC buffers.
#ifndef FERRY_SERVER_DECODE_DECODE_TEST_UTIL_H_
#define FERRY_SERVER_DECODE_DECODE_TEST_UTIL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "server/decode/image_transform.h"

namespace ferry::decode_test {

using Image = std::vector<uint8_t>;

struct Decoded {
  Image rgb;
  int width = 0, height = 0;
};

// ImageDecoder::DecodeRgb of `bytes` (JPEG or PNG); a failed decode fails the test.
inline Decoded FullDecode(const Image& bytes) {
  ImageDecoder decoder;
  Decoded d;
  absl::Status s = decoder.DecodeRgb(bytes, &d.rgb, &d.width, &d.height);
  EXPECT_TRUE(s.ok()) << s;
  return d;
}

// The pixels of `box` of an RGB HWC image `width` pixels wide, tightly packed.
inline Image Crop(const Image& img, int width, const CropBox& box) {
  Image out;
  for (int y = box.y; y < box.y + box.height; ++y) {
    const uint8_t* row = img.data() + (static_cast<size_t>(y) * width + box.x) * 3;
    out.insert(out.end(), row, row + static_cast<size_t>(box.width) * 3);
  }
  return out;
}

}  // namespace ferry::decode_test

#endif  // FERRY_SERVER_DECODE_DECODE_TEST_UTIL_H_
