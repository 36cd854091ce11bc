// The kernel of resample.h: whole RGB images through their windows to size x size, equal
// byte for byte to ResampleWindow (server/decode/internal/resample.cc's ComputeAxisFilter,
// ResampleRow, ResampleColumns). Argument checks and statuses live in resample.cc; this
// file sees only CUDA.
//
// Layout: one thread block per (image, tile of kTileRows output rows x kTileCols output
// columns); thread k of the block owns byte k of the tile's rows (pixel k / 3, channel
// k % 3). The block first computes the filters of its tile (one output sample per thread:
// kTileCols horizontal, kTileRows vertical) into shared memory. A byte of the output
// depends only on the same byte column of the horizontal pass, so from there on every
// thread works alone, with no synchronisation:
//   - staged (the tile reads at most kStagedRows source rows, a vertical downscale up to
//     about 5x): the thread computes its byte of the horizontal pass (rounded to uint8, as
//     ResampleRow does) for each of those rows into its own column of a shared buffer,
//     then each output row's vertical sum from that column, as ResampleColumns does;
//   - streaming (more rows): it computes each source row's byte and adds it, times each
//     output row's vertical weight for that row, into kTileRows accumulators held in
//     registers. The vertical pass is a sum of integer products, so the order of the terms
//     does not change it.
// So no intermediate image is stored in global memory (no scratch, no allocation); the
// price is that blocks stacked vertically recompute the source rows their output rows
// share (about 2 * support rows per tile), and every block recomputes its filters.
//
// The filters are ComputeAxisFilter's double-precision arithmetic step by step: every
// multiply, add and divide is written as its correctly rounded intrinsic (and the file is
// built with -fmad=false), matching the host's SSE2 double arithmetic, which rounds each
// operation on its own; sums run in the host's order. A filter of more than kMaxTaps taps
// (a downscale of more than about 31x) does not fit the shared table: its weights are
// recomputed from the sample's center and total where they are used.
#include <cuda_runtime.h>

#include <cstdint>

#include "server/kernels/internal/kernels.h"
#include "server/kernels/internal/resample_job.h"

namespace ferry {
namespace cuda_internal {
namespace {

constexpr int kTileCols = 64;  // output pixels per block, across
constexpr int kTileRows = 16;  // output rows per block
constexpr int kThreads = kTileCols * 3;
constexpr int kMaxTaps = 64;  // weights kept in shared memory per output sample
// Source rows a tile may read and still keep their horizontal pass in shared memory (a
// vertical downscale up to about 5x); a tile that reads more streams them (see above).
constexpr int kStagedRows = 96;
constexpr int kMaxGridZ = 65535;
// Caps registers at 64 (a few bytes spill) so that five blocks fit per SM instead of the
// four that 70 registers allow: with five the kernel runs faster, spill included.
constexpr int kMinBlocksPerSm = 5;
static_assert(kThreads >= kTileCols + kTileRows, "one thread per output sample's filter");

// resample.h's kWeightBits and the rounding constant of ResampleRow / ResampleColumns.
constexpr int kWeightBits = 14;
constexpr int32_t kHalf = 1 << (kWeightBits - 1);

// One axis of a job: ComputeAxisFilter's per-call values.
struct Axis {
  double in0, scale, support, inv_filter_scale;
  int lo, hi;
};

// One output sample's filter: source samples [first, first + count), weights in the shared
// table when count <= kMaxTaps, otherwise recomputed from center and total.
struct Sample {
  double center, total;
  int first, count;
};

__device__ __forceinline__ Axis MakeAxis(double in0, double in1, int lo, int hi, int out_size) {
  Axis a;
  a.in0 = in0;
  a.scale = __ddiv_rn(__dsub_rn(in1, in0), static_cast<double>(out_size));
  const double filter_scale = a.scale < 1.0 ? 1.0 : a.scale;  // std::max(scale, 1.0)
  a.support = filter_scale;
  a.inv_filter_scale = __ddiv_rn(1.0, filter_scale);
  a.lo = lo;
  a.hi = hi;
  return a;
}

// Triangle((x - center + 0.5) * inv_filter_scale).
__device__ __forceinline__ double TriangleAt(int x, double center, double inv_filter_scale) {
  const double v =
      fabs(__dmul_rn(__dadd_rn(__dsub_rn(static_cast<double>(x), center), 0.5), inv_filter_scale));
  return v < 1.0 ? __dsub_rn(1.0, v) : 0.0;
}

// static_cast<int32_t>(0.5 + w / total * (1 << kWeightBits)).
__device__ __forceinline__ int32_t Quantize(double w, double total) {
  return __double2int_rz(
      __dadd_rn(0.5, __dmul_rn(__ddiv_rn(w, total), static_cast<double>(1 << kWeightBits))));
}

__device__ __noinline__ int32_t TapWeight(const Axis& a, const Sample& s, int x) {
  return Quantize(TriangleAt(x, s.center, a.inv_filter_scale), s.total);
}

// ComputeAxisFilter's loop body for output sample i: writes s and, when they fit, the
// weights to w[0, count). Not inlined, nor is TapWeight: inlined, their double arithmetic
// took the kernel to 145 registers (ptxas -v), two blocks per SM.
__device__ __noinline__ void PlanSample(const Axis& a, int i, Sample* s, int16_t* w) {
  const double center =
      __dadd_rn(a.in0, __dmul_rn(__dadd_rn(static_cast<double>(i), 0.5), a.scale));
  const int xmin = max(static_cast<int>(floor(__dadd_rn(__dsub_rn(center, a.support), 0.5))), a.lo);
  const int xmax = min(static_cast<int>(floor(__dadd_rn(__dadd_rn(center, a.support), 0.5))), a.hi);
  double total = 0.0;
  for (int x = xmin; x < xmax; ++x)
    total = __dadd_rn(total, TriangleAt(x, center, a.inv_filter_scale));
  int first = xmin, count = 1;
  if (!(total > 0.0)) {
    // The clamp range misses the filter: the nearest readable sample, weight 1.
    first = min(max(static_cast<int>(floor(center)), a.lo), a.hi - 1);
    w[0] = 1 << kWeightBits;
    total = 1.0;
  } else {
    // Zero weights are dropped at the start (moving first) and at the end.
    int n = 0, kept = 0;
    for (int x = xmin; x < xmax; ++x) {
      const int32_t q = Quantize(TriangleAt(x, center, a.inv_filter_scale), total);
      if (q == 0 && n == 0) {
        ++first;
        continue;
      }
      if (n < kMaxTaps) w[n] = static_cast<int16_t>(q);
      ++n;
      if (q != 0) kept = n;
    }
    if (n == 0) {  // every weight rounded to zero
      first = xmin;
      w[0] = 1 << kWeightBits;
    } else {
      count = kept;
    }
  }
  s->center = center;
  s->total = total;
  s->first = first;
  s->count = count;
}

__device__ __forceinline__ uint8_t Clip8(int32_t v) {
  v >>= kWeightBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// ResampleRow's byte: kHalf plus the taps from p (the sample's first source byte of this
// row and channel), shifted and clamped to uint8.
__device__ __forceinline__ uint8_t HorizontalByte(const uint8_t* p, const Axis& ax,
                                                  const Sample& sx, const int16_t* wx) {
  int32_t h = kHalf;
  if (sx.count <= kMaxTaps) {
    for (int t = 0; t < sx.count; ++t) h += static_cast<int32_t>(__ldg(p + 3 * t)) * wx[t];
  } else {
    for (int t = 0; t < sx.count; ++t) {
      h += static_cast<int32_t>(__ldg(p + 3 * t)) * TapWeight(ax, sx, sx.first + t);
    }
  }
  return Clip8(h);
}

// resample.h's CheckResampleJob, on the device. The window must be finite: x0 < x1 is false
// for a NaN, and x1 - x0 is not finite for an infinity.
__device__ __forceinline__ bool JobIsValid(const ResampleJob& j) {
  return j.src != 0 && j.width >= 1 && j.height >= 1 &&
         static_cast<int64_t>(j.pitch) >= 3 * static_cast<int64_t>(j.width) && 0 <= j.clamp_x0 &&
         j.clamp_x0 < j.clamp_x1 && j.clamp_x1 <= j.width && 0 <= j.clamp_y0 &&
         j.clamp_y0 < j.clamp_y1 && j.clamp_y1 <= j.height && j.x0 < j.x1 && j.y0 < j.y1 &&
         isfinite(j.x1 - j.x0) && isfinite(j.y1 - j.y0);
}

__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    ResampleWindowsKernel(const ResampleJob* __restrict__ jobs, int count, int size) {
  __shared__ Sample xs[kTileCols];
  __shared__ Sample ys[kTileRows];
  __shared__ int2 y_range[kTileRows];  // ys' (first, count), read by the main loop
  __shared__ int16_t xw[kTileCols][kMaxTaps];
  __shared__ int16_t yw[kTileRows][kMaxTaps];
  __shared__ uint8_t staged[kStagedRows][kThreads];  // thread k's horizontal bytes: column k

  const int k = threadIdx.x;
  const int col0 = blockIdx.x * kTileCols, row0 = blockIdx.y * kTileRows;
  const int px = col0 + k / 3, channel = k % 3;  // the output byte this thread owns
  const size_t out_row_bytes = static_cast<size_t>(size) * 3;

  for (int n = blockIdx.z; n < count; n += gridDim.z) {
    const ResampleJob job = jobs[n];
    if (job.dst == 0) continue;
    uint8_t* dst = reinterpret_cast<uint8_t*>(job.dst);
    if (!JobIsValid(job)) {
      if (px < size) {
        for (int r = 0; r < kTileRows && row0 + r < size; ++r) {
          dst[(row0 + r) * out_row_bytes + px * 3 + channel] = 0;
        }
      }
      continue;  // uniform across the block
    }
    const Axis ax = MakeAxis(job.x0, job.x1, job.clamp_x0, job.clamp_x1, size);
    const Axis ay = MakeAxis(job.y0, job.y1, job.clamp_y0, job.clamp_y1, size);
    const bool mirror = job.mirror != 0;

    __syncthreads();  // the previous job's filters are no longer read
    if (k < kTileCols) {
      // Output column col0 + k is filter sample size - 1 - (col0 + k) when mirrored.
      const int p = col0 + k;
      if (p < size) PlanSample(ax, mirror ? size - 1 - p : p, &xs[k], xw[k]);
    } else if (k < kTileCols + kTileRows) {
      const int r = k - kTileCols;
      if (row0 + r < size) {
        PlanSample(ay, row0 + r, &ys[r], yw[r]);
        y_range[r] = make_int2(ys[r].first, ys[r].count);
      } else {
        y_range[r] = make_int2(0, 0);  // no such row: never accumulates
      }
    }
    __syncthreads();

    if (px < size) {
      int y_begin = y_range[0].x, y_end = y_range[0].x + y_range[0].y;
      for (int r = 1; r < kTileRows && row0 + r < size; ++r) {
        y_begin = min(y_begin, y_range[r].x);
        y_end = max(y_end, y_range[r].x + y_range[r].y);
      }
      const Sample sx = xs[k / 3];
      const int16_t* wx = xw[k / 3];
      const uint8_t* src =
          reinterpret_cast<const uint8_t*>(job.src) + static_cast<size_t>(sx.first) * 3 + channel;
      uint8_t* out = dst + static_cast<size_t>(row0) * out_row_bytes + px * 3 + channel;
      const int rows = min(kTileRows, size - row0);
      if (y_end - y_begin <= kStagedRows) {
        // The horizontal pass of every source row into this thread's column of `staged`,
        // then ResampleColumns' sums from there.
        uint8_t* column = &staged[0][k];
        for (int y = y_begin; y < y_end; ++y) {
          column[(y - y_begin) * kThreads] =
              HorizontalByte(src + static_cast<size_t>(y) * job.pitch, ax, sx, wx);
        }
        for (int r = 0; r < rows; ++r) {
          const int2 range = y_range[r];
          const uint8_t* in = column + (range.x - y_begin) * kThreads;
          int32_t acc = kHalf;
          for (int t = 0; t < range.y; ++t) {
            const int32_t wy = range.y <= kMaxTaps ? yw[r][t] : TapWeight(ay, ys[r], range.x + t);
            acc += static_cast<int32_t>(in[t * kThreads]) * wy;
          }
          out[r * out_row_bytes] = Clip8(acc);
        }
        continue;
      }

      // Too many source rows to stage: each one's horizontal byte goes straight into the
      // sums of the output rows that read it.
      int32_t acc[kTileRows];
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) acc[r] = kHalf;
      for (int y = y_begin; y < y_end; ++y) {
        const int32_t h = HorizontalByte(src + static_cast<size_t>(y) * job.pitch, ax, sx, wx);
#pragma unroll
        for (int r = 0; r < kTileRows; ++r) {
          const int2 range = y_range[r];  // one shared load: first, count
          const int t = y - range.x;
          if (static_cast<unsigned>(t) < static_cast<unsigned>(range.y)) {
            const int32_t wy = range.y <= kMaxTaps ? yw[r][t] : TapWeight(ay, ys[r], y);
            acc[r] += h * wy;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kTileRows; ++r) {
        if (r < rows) out[r * out_row_bytes] = Clip8(acc[r]);
      }
    }
  }
}

}  // namespace

cudaError_t EnqueueResampleWindows(const ResampleJob* jobs, int count, int size,
                                   cudaStream_t stream) {
  const dim3 grid((size + kTileCols - 1) / kTileCols, (size + kTileRows - 1) / kTileRows,
                  count < kMaxGridZ ? count : kMaxGridZ);
  ResampleWindowsKernel<<<grid, kThreads, 0, stream>>>(jobs, count, size);
  return cudaGetLastError();
}

}  // namespace cuda_internal
}  // namespace ferry
