#include "server/decode/internal/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ferry::decode_internal {
namespace {

inline double Triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

inline uint8_t Clip8(int32_t v) {
  v >>= kWeightBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

constexpr int32_t kHalf = 1 << (kWeightBits - 1);

}  // namespace

void ComputeAxisFilter(double in0, double in1, int lo, int hi, int out_size, AxisFilter* f) {
  const double scale = (in1 - in0) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // The triangle's support is 1 at filter scale 1.
  const double inv_filter_scale = 1.0 / filter_scale;
  const int stride = static_cast<int>(std::ceil(support)) * 2 + 1;

  f->out_size = out_size;
  f->stride = stride;
  f->first.resize(out_size);
  f->count.resize(out_size);
  f->weights.assign(static_cast<size_t>(out_size) * stride, 0);
  f->scratch.resize(stride + 1);
  f->begin = hi;
  f->end = lo;

  for (int i = 0; i < out_size; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    int xmin = std::max(static_cast<int>(std::floor(center - support + 0.5)), lo);
    int xmax = std::min(static_cast<int>(std::floor(center + support + 0.5)), hi);
    double total = 0.0;
    double* w = f->scratch.data();
    for (int x = xmin; x < xmax; ++x) {
      w[x - xmin] = Triangle((x - center + 0.5) * inv_filter_scale);
      total += w[x - xmin];
    }
    if (!(total > 0.0)) {
      // Only reachable when the clamp range misses the filter entirely (a degenerate
      // interval at the border): fall back to the nearest readable sample.
      xmin = std::clamp(static_cast<int>(std::floor(center)), lo, hi - 1);
      xmax = xmin + 1;
      w[0] = total = 1.0;
    }
    int32_t* fixed = &f->weights[static_cast<size_t>(i) * stride];
    int n = 0;
    int first = xmin;
    for (int x = xmin; x < xmax; ++x) {
      const int32_t q = static_cast<int32_t>(0.5 + w[x - xmin] / total * (1 << kWeightBits));
      if (q == 0 && n == 0) {  // Drop zero-weight taps at the start...
        ++first;
        continue;
      }
      fixed[n++] = q;
    }
    while (n > 1 && fixed[n - 1] == 0) --n;  // ...and at the end: they read bytes for nothing.
    if (n == 0) {  // All weights rounded to zero (cannot happen for sane sizes).
      first = xmin;
      fixed[0] = 1 << kWeightBits;
      n = 1;
    }
    f->first[i] = first;
    f->count[i] = n;
    f->begin = std::min(f->begin, first);
    f->end = std::max(f->end, first + n);
  }

  f->pair_stride = (stride + 1) / 2;
  f->pair_weights.assign(static_cast<size_t>(out_size) * f->pair_stride, 0);
  for (int i = 0; i < out_size; ++i) {
    const int32_t* w = &f->weights[static_cast<size_t>(i) * stride];
    int32_t* pairs = &f->pair_weights[static_cast<size_t>(i) * f->pair_stride];
    for (int t = 0; t < f->count[i]; t += 2) {
      const uint32_t lo = static_cast<uint16_t>(w[t]);
      const uint32_t hi = t + 1 < f->count[i] ? static_cast<uint16_t>(w[t + 1]) : 0;
      pairs[t / 2] = static_cast<int32_t>(lo | (hi << 16));
    }
  }
}

#if defined(__SSE2__)

// Loads the pixel at p as four int16 lanes (R, G, B, next byte); reads 4 bytes.
inline __m128i LoadPixel16(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm_unpacklo_epi8(_mm_cvtsi32_si128(v), _mm_setzero_si128());
}

void ResampleRow(const uint8_t* src, int src_x0, const AxisFilter& f, bool mirror, uint8_t* dst) {
  // Per pair of taps: interleave the two pixels' channels as int16 (R0 R1 G0 G1 B0 B1 ..)
  // and multiply-add with the (w0, w1) pair in one pmaddwd, giving R, G, B as int32.
  const int n_out = f.out_size;
  const __m128i half = _mm_set1_epi32(kHalf);
  for (int i = 0; i < n_out; ++i) {
    const uint8_t* p = src + static_cast<size_t>(f.first[i] - src_x0) * 3;
    const int32_t* pairs = &f.pair_weights[static_cast<size_t>(i) * f.pair_stride];
    const int n = f.count[i];
    __m128i acc = half;
    int t = 0;
    for (; t + 1 < n; t += 2, p += 6) {
      const __m128i px = _mm_unpacklo_epi16(LoadPixel16(p), LoadPixel16(p + 3));
      acc = _mm_add_epi32(acc, _mm_madd_epi16(px, _mm_set1_epi32(pairs[t / 2])));
    }
    if (t < n) {  // Odd tap count: the pair's high weight is 0.
      const __m128i px = _mm_unpacklo_epi16(LoadPixel16(p), _mm_setzero_si128());
      acc = _mm_add_epi32(acc, _mm_madd_epi16(px, _mm_set1_epi32(pairs[t / 2])));
    }
    acc = _mm_srai_epi32(acc, kWeightBits);
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);
    const uint32_t rgbx = static_cast<uint32_t>(_mm_cvtsi128_si32(packed));
    uint8_t* o = dst + static_cast<size_t>(mirror ? n_out - 1 - i : i) * 3;
    std::memcpy(o, &rgbx, 3);  // Exactly 3 bytes: neighbours may already be written.
  }
}

#else  // Portable version.

void ResampleRow(const uint8_t* src, int src_x0, const AxisFilter& f, bool mirror, uint8_t* dst) {
  const int n_out = f.out_size;
  for (int i = 0; i < n_out; ++i) {
    const uint8_t* p = src + static_cast<size_t>(f.first[i] - src_x0) * 3;
    const int32_t* w = &f.weights[static_cast<size_t>(i) * f.stride];
    int32_t r = kHalf, g = kHalf, b = kHalf;
    const int n = f.count[i];
    for (int t = 0; t < n; ++t) {
      r += p[3 * t] * w[t];
      g += p[3 * t + 1] * w[t];
      b += p[3 * t + 2] * w[t];
    }
    uint8_t* o = dst + static_cast<size_t>(mirror ? n_out - 1 - i : i) * 3;
    o[0] = Clip8(r);
    o[1] = Clip8(g);
    o[2] = Clip8(b);
  }
}

#endif

void ResampleColumns(const uint8_t* rows, size_t row_stride, int row0, const AxisFilter& f,
                     int width_bytes, uint8_t* dst, size_t dst_stride, int32_t* accum) {
  for (int j = 0; j < f.out_size; ++j) {
    const int32_t* w = &f.weights[static_cast<size_t>(j) * f.stride];
    const uint8_t* row = rows + static_cast<size_t>(f.first[j] - row0) * row_stride;
    // The first tap initialises the accumulator; later taps add to it. Each inner loop is
    // a contiguous multiply-add the compiler vectorises.
    const int16_t w0 = static_cast<int16_t>(w[0]);
    for (int k = 0; k < width_bytes; ++k) accum[k] = kHalf + static_cast<int16_t>(row[k]) * w0;
    for (int t = 1; t < f.count[j]; ++t) {
      row += row_stride;
      const int16_t wt = static_cast<int16_t>(w[t]);
      for (int k = 0; k < width_bytes; ++k) accum[k] += static_cast<int16_t>(row[k]) * wt;
    }
    uint8_t* out = dst + static_cast<size_t>(j) * dst_stride;
    for (int k = 0; k < width_bytes; ++k) out[k] = Clip8(accum[k]);
  }
}

}  // namespace ferry::decode_internal
