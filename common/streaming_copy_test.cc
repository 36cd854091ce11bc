#include "common/streaming_copy.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

// Every length around the streaming threshold and the 16- and 64-byte steps, at every
// destination and source alignment within a line: the bytes arrive, nothing around them
// is touched.
TEST(StreamingCopyTest, CopiesEveryLengthAndAlignmentExactly) {
  constexpr size_t kGuard = 64;
  std::vector<uint8_t> src(8192 + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 200; ++n) lengths.push_back(n);
  for (size_t n = kStreamingCopyMinBytes - 70; n <= kStreamingCopyMinBytes + 140; ++n) {
    lengths.push_back(n);
  }
  lengths.push_back(4098);  // a 2048-token uint16 row plus its label token
  lengths.push_back(8192);
  for (size_t n : lengths) {
    for (size_t dst_off : {0, 1, 8, 15, 16, 33, 63}) {
      for (size_t src_off : {0, 3, 16, 61}) {
        std::vector<uint8_t> dst(n + 2 * kGuard + 64, 0xee);
        StreamingCopy(dst.data() + kGuard + dst_off, src.data() + src_off, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= kGuard + dst_off && i < kGuard + dst_off + n;
          const uint8_t want = inside ? src[i - kGuard - dst_off + src_off] : 0xee;
          ASSERT_EQ(dst[i], want) << "length " << n << ", destination offset " << dst_off
                                  << ", source offset " << src_off << ", byte " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry
