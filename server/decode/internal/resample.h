// Separable antialiased bilinear resampling with PIL's BILINEAR semantics (triangle filter
// whose support widens with the downscale factor; weights normalised per output sample;
// 14-bit fixed point; horizontal pass first, rounded to uint8, then vertical pass).
// Private to server/decode.
#ifndef FERRY_SERVER_DECODE_INTERNAL_RESAMPLE_H_
#define FERRY_SERVER_DECODE_INTERNAL_RESAMPLE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::decode_internal {

// Weights fit int16 so that the vertical pass multiplies 16-bit lanes.
inline constexpr int kWeightBits = 14;

// Maps a continuous source interval onto `out_size` output samples along one axis. Output
// sample i reads source samples [first[i], first[i] + count[i]) with weights
// weights[i * stride ...], which sum to about 1 << kWeightBits.
struct AxisFilter {
  int out_size = 0;
  int stride = 0;          // weights per output sample in `weights`
  std::vector<int> first;  // out_size entries
  std::vector<int> count;  // out_size entries, each >= 1
  std::vector<int32_t> weights;
  // The same weights as int16 pairs (tap 2k in the low half, 2k + 1 in the high half, 0
  // past the end), pair_stride per output sample: operands for 16-bit multiply-adds.
  int pair_stride = 0;
  std::vector<int32_t> pair_weights;
  int begin = 0;  // union of all source ranges: [begin, end)
  int end = 0;
  std::vector<double> scratch;  // reused by ComputeAxisFilter
};

// Computes `f` so that the continuous source interval [in0, in1) (pixel edges; pixel k
// spans [k, k + 1)) is resampled onto out_size samples, reading only source samples in
// [lo, hi). Requires out_size > 0, lo < hi, in0 < in1. Reuses f's buffers.
void ComputeAxisFilter(double in0, double in1, int lo, int hi, int out_size, AxisFilter* f);

// Bytes past the last pixel of a row that ResampleRow may read (and ignore).
inline constexpr int kRowPadding = 8;

// Horizontal pass over one RGB row. `src` holds source columns starting at `src_x0` (which
// must be <= f.begin and cover up to f.end), followed by kRowPadding readable bytes. Writes
// exactly f.out_size RGB pixels to `dst`, in reverse order when `mirror`.
void ResampleRow(const uint8_t* src, int src_x0, const AxisFilter& f, bool mirror, uint8_t* dst);

// Vertical pass. `rows` holds consecutive rows of `width_bytes` bytes (stride `row_stride`),
// rows[0] being source row `row0` (<= f.begin, covering up to f.end). Writes f.out_size rows
// of width_bytes to `dst` with stride `dst_stride`. `accum` must hold width_bytes entries.
void ResampleColumns(const uint8_t* rows, size_t row_stride, int row0, const AxisFilter& f,
                     int width_bytes, uint8_t* dst, size_t dst_stride, int32_t* accum);

}  // namespace ferry::decode_internal

#endif  // FERRY_SERVER_DECODE_INTERNAL_RESAMPLE_H_
