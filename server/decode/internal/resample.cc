#include "server/decode/internal/resample.h"

#include <algorithm>
#include <cmath>

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
}

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

void ResampleColumns(const uint8_t* rows, size_t row_stride, int row0, const AxisFilter& f,
                     int width_bytes, uint8_t* dst, size_t dst_stride, int32_t* accum) {
  for (int j = 0; j < f.out_size; ++j) {
    const int32_t* w = &f.weights[static_cast<size_t>(j) * f.stride];
    const uint8_t* row = rows + static_cast<size_t>(f.first[j] - row0) * row_stride;
    // The first tap initialises the accumulator; later taps add to it. Each inner loop is
    // a contiguous multiply-add the compiler vectorises.
    const int32_t w0 = w[0];
    for (int k = 0; k < width_bytes; ++k) accum[k] = kHalf + row[k] * w0;
    for (int t = 1; t < f.count[j]; ++t) {
      row += row_stride;
      const int32_t wt = w[t];
      for (int k = 0; k < width_bytes; ++k) accum[k] += row[k] * wt;
    }
    uint8_t* out = dst + static_cast<size_t>(j) * dst_stride;
    for (int k = 0; k < width_bytes; ++k) out[k] = Clip8(accum[k]);
  }
}

}  // namespace ferry::decode_internal
