#include "common/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace ferry {

void StreamingCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n < kStreamingCopyMinBytes) {
    std::memcpy(dst, src, n);
    return;
  }
  auto* out = static_cast<uint8_t*>(dst);
  auto* in = static_cast<const uint8_t*>(src);
  // Streaming stores need 16-byte aligned destinations: copy the head up to the boundary.
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(out) & 15)) & 15;
  std::memcpy(out, in, head);
  out += head;
  in += head;
  n -= head;
  // 64 bytes (one cache line) per iteration, so each line's write-combining buffer fills.
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 48), d);
  }
  for (; i + 16 <= n; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
  }
  std::memcpy(out + i, in + i, n - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace ferry
