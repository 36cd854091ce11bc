// The kernel of photometric.h: a batch of uint8 HWC images, each with its own program of
// photometric ops, in float32, written as CHW float32 / float16 / bfloat16. Argument checks
// and statuses live in photometric.cc; this file sees only CUDA.
//
// One thread block per image. The ops are pointwise except kContrast, whose blend needs the
// mean of gray over the whole image as it stands at that op. So for each contrast op the
// block makes one pass over its image that recomputes the ops before it from the uint8
// input (the means of earlier contrast ops already known) and sums gray, then reduces the
// sums; a last pass runs the whole program and writes the output. An image (150 KB at
// 224 x 224) stays in L2 between passes, so a program with one contrast op reads DRAM
// about once, and every other byte moved is output.
//
// Each step of a thread takes kUnroll groups of consecutive pixels, kThreads groups apart,
// so that each load and each store of a warp covers one contiguous run: on the vector
// path a group is 4 pixels (12 input bytes as 3 words; per channel plane one 16-byte
// float4 or 8-byte pair of halves), otherwise one pixel.
//
// Arithmetic follows torchvision's float32 expressions op by op, each multiply and add
// rounded on its own (compiled with -fmad=false, as torchvision runs them as separate
// tensor ops), so that the device agrees with ApplyPhotometricReference to a few units in
// the last place; the exceptions, where an IEEE division would cost more than the rest of
// the op, are normalise's 1 / std and hue's 1 / max, multiplications by correctly rounded
// reciprocals.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "server/kernels/internal/convert.cuh"
#include "server/kernels/internal/kernels.h"
#include "server/kernels/internal/photometric_program.h"

namespace ferry {
namespace cuda_internal {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 2;
constexpr int kOpWords = static_cast<int>(sizeof(PhotometricOp) / 4);
static_assert(kMaxPhotometricOps * kOpWords <= kThreads, "one word of the ops per thread");

// torch.clamp(x, 0, 1): NaN stays NaN.
__device__ __forceinline__ float Clamp01(float x) {
  return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
}

// _rgb_to_grayscale_image's weights.
__device__ __forceinline__ float Gray(float r, float g, float b) {
  return r * 0.2989f + g * 0.587f + b * 0.114f;
}

// x mod 1 for |x| < 2^23, exactly (fmod(x, 1) and x - trunc(x) are the same float there).
__device__ __forceinline__ float Fmod1(float x) { return x - truncf(x); }

// v2.functional.adjust_hue_image on one pixel: _rgb_to_hsv (gray pixels, maxc == minc, get
// s = 0 and h = 0 without a division by zero), h = (h + factor) % 1.0, _hsv_to_rgb (p, q, t
// clamped to [0, 1], v not). Every h below is finite and within (-1, 2), where Fmod1 is
// exact.
//
// h is computed exactly as torchvision computes it (IEEE divisions, no fused multiply-add:
// this file is compiled with -fmad=false): its `(h / 6 + 1) % 1` rounds h to steps of
// 2^-23, and a hue one step off moves the output by up to 6 * 2^-23, which the contrast,
// brightness and normalise after it multiply. Of rc, gc, bc only the two that h uses are
// divided; s, which varies the output smoothly, is a multiplication by a correctly
// rounded reciprocal.
__device__ __forceinline__ void AdjustHue(float factor, float& r, float& g, float& b) {
  const float maxc = fmaxf(r, fmaxf(g, b));
  const float minc = fminf(r, fminf(g, b));
  const bool eqc = maxc == minc;
  const float channels_range = maxc - minc;
  const float s = channels_range * __frcp_rn(eqc ? 1.0f : maxc);
  const float divisor = eqc ? 1.0f : channels_range;
  // hr = bc - gc, hg = (rc + 2) - bc, hb = (gc + 4) - rc: h = (first + offset) - second.
  const bool max_is_r = maxc == r, max_is_g = !max_is_r && maxc == g;
  const float first = max_is_r ? b : (max_is_g ? r : g);
  const float second = max_is_r ? g : (max_is_g ? b : r);
  const float offset = max_is_r ? 0.0f : (max_is_g ? 2.0f : 4.0f);
  float h = ((maxc - first) / divisor + offset) - (maxc - second) / divisor;
  h = Fmod1(h * (1.0f / 6.0f) + 1.0f);
  const float v = maxc;

  h = Fmod1(h + factor);  // torch.remainder: into [0, 1) when negative
  if (h < 0.0f) h += 1.0f;

  const float h6 = h * 6.0f;
  const float i = floorf(h6);
  const float f = h6 - i;
  int sector = static_cast<int>(i);
  if (sector >= 6) sector -= 6;  // h * 6 rounded up to 6
  const float sxf = s * f;
  const float one_minus_s = 1.0f - s;
  const float q = Clamp01((1.0f - sxf) * v);
  const float t = Clamp01((sxf + one_minus_s) * v);
  const float p = Clamp01(one_minus_s * v);
  // torchvision's select table over (v, p, q, t), as selects rather than a 6-way branch.
  r = (sector == 0 || sector == 5) ? v : (sector == 1 ? q : (sector == 4 ? t : p));
  g = (sector == 1 || sector == 2) ? v : (sector == 0 ? t : (sector == 3 ? q : p));
  b = (sector == 3 || sector == 4) ? v : (sector == 2 ? t : (sector == 5 ? q : p));
}

// The block's program, in shared memory.
struct Program {
  PhotometricOp ops[kMaxPhotometricOps];
  int4 boxes[kMaxPhotometricOps];   // kErase: rows [x, y), columns [z, w), inside the image
  float means[kMaxPhotometricOps];  // kContrast: the mean of gray at that op, once reduced
  int num_ops;                      // runnable: up to the first unknown kind
};

// kUnroll groups of kPixels consecutive pixels, the u-th starting at pixel
// (first_group + u * kThreads) * kPixels.
template <int kPixels>
struct Tile {
  static constexpr int kSize = kPixels * kUnroll;
  float r[kSize], g[kSize], b[kSize];
  bool valid[kUnroll];
  uint32_t first_group;

  __device__ __forceinline__ uint32_t Pixel(int j) const {
    return (first_group + static_cast<uint32_t>(j / kPixels) * kThreads) * kPixels + j % kPixels;
  }
};

// ops[0, end) of the program on every pixel of the tile.
template <int kPixels>
__device__ __forceinline__ void RunOps(const Program& program, int end, uint32_t width,
                                       Tile<kPixels>& t) {
  constexpr int n = Tile<kPixels>::kSize;
  for (int k = 0; k < end; ++k) {
    const PhotometricOp& op = program.ops[k];
    const float a = op.a;
    switch (static_cast<PhotometricKind>(op.kind)) {
      case PhotometricKind::kBrightness:
#pragma unroll
        for (int j = 0; j < n; ++j) {
          t.r[j] = Clamp01(t.r[j] * a);
          t.g[j] = Clamp01(t.g[j] * a);
          t.b[j] = Clamp01(t.b[j] * a);
        }
        break;
      case PhotometricKind::kContrast: {
        const float other = (1.0f - a) * program.means[k];
#pragma unroll
        for (int j = 0; j < n; ++j) {
          t.r[j] = Clamp01(t.r[j] * a + other);
          t.g[j] = Clamp01(t.g[j] * a + other);
          t.b[j] = Clamp01(t.b[j] * a + other);
        }
        break;
      }
      case PhotometricKind::kSaturation: {
        const float one_minus_a = 1.0f - a;
#pragma unroll
        for (int j = 0; j < n; ++j) {
          const float other = Gray(t.r[j], t.g[j], t.b[j]) * one_minus_a;
          t.r[j] = Clamp01(t.r[j] * a + other);
          t.g[j] = Clamp01(t.g[j] * a + other);
          t.b[j] = Clamp01(t.b[j] * a + other);
        }
        break;
      }
      case PhotometricKind::kHue:
#pragma unroll
        for (int j = 0; j < n; ++j) AdjustHue(a, t.r[j], t.g[j], t.b[j]);
        break;
      case PhotometricKind::kGrayscale:
#pragma unroll
        for (int j = 0; j < n; ++j) t.r[j] = t.g[j] = t.b[j] = Gray(t.r[j], t.g[j], t.b[j]);
        break;
      case PhotometricKind::kNormalize: {
        // (x - mean) / std, the division as a multiplication by 1 / std rounded once.
        const float m0 = op.v[0], m1 = op.v[1], m2 = op.v[2];
        const float i0 = __frcp_rn(op.w[0]), i1 = __frcp_rn(op.w[1]), i2 = __frcp_rn(op.w[2]);
#pragma unroll
        for (int j = 0; j < n; ++j) {
          t.r[j] = (t.r[j] - m0) * i0;
          t.g[j] = (t.g[j] - m1) * i1;
          t.b[j] = (t.b[j] - m2) * i2;
        }
        break;
      }
      case PhotometricKind::kErase: {
        const int4 box = program.boxes[k];
        const float v0 = op.v[0], v1 = op.v[1], v2 = op.v[2];
        // One division per group; its other pixels step along the row.
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const uint32_t first = t.Pixel(u * kPixels);
          uint32_t y = first / width;
          uint32_t x = first - y * width;
#pragma unroll
          for (int i = 0; i < kPixels; ++i) {
            if (i > 0 && ++x == width) {
              x = 0;
              ++y;
            }
            const int j = u * kPixels + i;
            if (static_cast<int>(y) >= box.x && static_cast<int>(y) < box.y &&
                static_cast<int>(x) >= box.z && static_cast<int>(x) < box.w) {
              t.r[j] = v0;
              t.g[j] = v1;
              t.b[j] = v2;
            }
          }
        }
        break;
      }
      default:  // not reached: num_ops stops before an unknown kind
        break;
    }
  }
}

// uint8 -> float, then v2.ToDtype(float32, scale=True)'s multiply by 1 / 255.
constexpr float kByteScale = static_cast<float>(1.0 / 255.0);
__device__ __forceinline__ float ByteAt(const uint32_t (&w)[3], int byte) {
  return __int_as_float(__byte_perm(w[byte / 4], 0x4B000000u, 0x7440u | (byte % 4))) - 8388608.0f;
}

// Loads the tile's valid groups of `in` (one image) as floats in [0, 1].
__device__ __forceinline__ void Load(const uint8_t* __restrict__ in, uint32_t groups, Tile<4>& t) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint32_t group = t.first_group + u * kThreads;
    t.valid[u] = group < groups;
    uint32_t w[3] = {0, 0, 0};
    if (t.valid[u]) {
      const uint32_t* words = reinterpret_cast<const uint32_t*>(in) + 3 * group;
      w[0] = __ldg(words);
      w[1] = __ldg(words + 1);
      w[2] = __ldg(words + 2);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      t.r[4 * u + i] = ByteAt(w, 3 * i) * kByteScale;
      t.g[4 * u + i] = ByteAt(w, 3 * i + 1) * kByteScale;
      t.b[4 * u + i] = ByteAt(w, 3 * i + 2) * kByteScale;
    }
  }
}
__device__ __forceinline__ void Load(const uint8_t* __restrict__ in, uint32_t groups, Tile<1>& t) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint32_t pixel = t.first_group + u * kThreads;
    t.valid[u] = pixel < groups;
    float r = 0, g = 0, b = 0;
    if (t.valid[u]) {
      r = static_cast<float>(__ldg(in + 3 * pixel));
      g = static_cast<float>(__ldg(in + 3 * pixel + 1));
      b = static_cast<float>(__ldg(in + 3 * pixel + 2));
    }
    t.r[u] = r * kByteScale;
    t.g[u] = g * kByteScale;
    t.b[u] = b * kByteScale;
  }
}

// Four values of one plane at a 4-pixel boundary (16 bytes of float, 8 of a 16-bit type).
__device__ __forceinline__ void Store4(float* dst, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(dst) = make_float4(a, b, c, d);
}
template <typename Half>
__device__ __forceinline__ void Store4(Half* dst, float a, float b, float c, float d) {
  *reinterpret_cast<uint2*>(dst) = make_uint2(Pack2(Half(), a, b), Pack2(Half(), c, d));
}

// Writes the tile's valid groups into `out` (one image, CHW).
template <typename Out>
__device__ __forceinline__ void Store(const Tile<4>& t, uint32_t pixels, Out* __restrict__ out) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (!t.valid[u]) continue;
    const uint32_t pixel = (t.first_group + u * kThreads) * 4;
    const int j = 4 * u;
    Store4(out + pixel, t.r[j], t.r[j + 1], t.r[j + 2], t.r[j + 3]);
    Store4(out + pixels + pixel, t.g[j], t.g[j + 1], t.g[j + 2], t.g[j + 3]);
    Store4(out + 2 * pixels + pixel, t.b[j], t.b[j + 1], t.b[j + 2], t.b[j + 3]);
  }
}
template <typename Out>
__device__ __forceinline__ void Store(const Tile<1>& t, uint32_t pixels, Out* __restrict__ out) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (!t.valid[u]) continue;
    const uint32_t pixel = t.first_group + u * kThreads;
    out[pixel] = FromFloat<Out>(t.r[u]);
    out[pixels + pixel] = FromFloat<Out>(t.g[u]);
    out[2 * pixels + pixel] = FromFloat<Out>(t.b[u]);
  }
}

// The block's sum of `v`, in thread 0. Leaves `scratch` in use until a __syncthreads.
__device__ __forceinline__ double BlockSum(double v, double* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += scratch[w];
  }
  return total;
}

// Block b: image b of `src` (height x width x 3 bytes) with programs[b] into image b of
// `dst` (3 planes of height x width). kPixels: 4 on the vector path (pixels % 4 == 0, src
// 4-byte and dst 16-byte aligned), else 1.
template <typename Out, int kPixels>
__global__ void __launch_bounds__(kThreads, 2)
    PhotometricImages(const uint8_t* __restrict__ src,
                      const PhotometricProgram* __restrict__ programs, Out* __restrict__ dst,
                      uint32_t height, uint32_t width) {
  __shared__ Program program;
  __shared__ double scratch[kWarps];
  const PhotometricProgram& source = programs[blockIdx.x];
  if (threadIdx.x < kMaxPhotometricOps * kOpWords) {
    reinterpret_cast<uint32_t*>(program.ops)[threadIdx.x] =
        reinterpret_cast<const uint32_t*>(source.ops)[threadIdx.x];
  }
  if (threadIdx.x == 0) {
    const uint32_t declared = source.num_ops;
    int n = declared < kMaxPhotometricOps ? static_cast<int>(declared) : kMaxPhotometricOps;
    for (int k = 0; k < n; ++k) {
      const PhotometricOp& op = source.ops[k];
      if (op.kind < static_cast<uint32_t>(PhotometricKind::kBrightness) ||
          op.kind > static_cast<uint32_t>(PhotometricKind::kErase)) {
        n = k;
        break;
      }
      if (op.kind == static_cast<uint32_t>(PhotometricKind::kErase)) {
        // The box clipped to the image, in 64 bits: top + height may pass INT_MAX.
        const int64_t y0 = op.top > 0 ? op.top : 0, x0 = op.left > 0 ? op.left : 0;
        const int64_t y1 = static_cast<int64_t>(op.top) + op.height;
        const int64_t x1 = static_cast<int64_t>(op.left) + op.width;
        program.boxes[k] =
            make_int4(static_cast<int>(y0), static_cast<int>(y1 < height ? y1 : height),
                      static_cast<int>(x0), static_cast<int>(x1 < width ? x1 : width));
      }
    }
    program.num_ops = n;
  }
  __syncthreads();

  const uint32_t pixels = height * width;
  const uint32_t groups = pixels / kPixels;
  const uint8_t* in = src + static_cast<size_t>(blockIdx.x) * pixels * 3;
  Out* out = dst + static_cast<size_t>(blockIdx.x) * pixels * 3;
  const int num_ops = program.num_ops;
  constexpr uint32_t kStep = kThreads * kUnroll;

  for (int k = 0; k < num_ops; ++k) {
    if (program.ops[k].kind != static_cast<uint32_t>(PhotometricKind::kContrast)) continue;
    // Summed in float64 past each tile: a float32 running sum of a thread's ~100 grays
    // drifts by 1e-5 of the mean, which normalise then amplifies.
    double sum = 0;
    for (uint32_t first = threadIdx.x; first < groups; first += kStep) {
      Tile<kPixels> t;
      t.first_group = first;
      Load(in, groups, t);
      RunOps(program, k, width, t);
      float tile_sum = 0;
#pragma unroll
      for (int j = 0; j < Tile<kPixels>::kSize; ++j) {
        if (t.valid[j / kPixels]) tile_sum += Gray(t.r[j], t.g[j], t.b[j]);
      }
      sum += tile_sum;
    }
    const double total = BlockSum(sum, scratch);
    if (threadIdx.x == 0) program.means[k] = static_cast<float>(total / pixels);
    __syncthreads();
  }

  for (uint32_t first = threadIdx.x; first < groups; first += kStep) {
    Tile<kPixels> t;
    t.first_group = first;
    Load(in, groups, t);
    RunOps(program, num_ops, width, t);
    Store(t, pixels, out);
  }
}

template <typename Out>
cudaError_t PhotometricAs(const uint8_t* src, const PhotometricProgram* programs, void* dst,
                          int64_t batch, int height, int width, cudaStream_t stream) {
  const int64_t pixels = static_cast<int64_t>(height) * width;
  const bool vector = pixels % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  // Drop an earlier call's error so that the check below reports this launch alone.
  (void)cudaGetLastError();
  const dim3 grid(static_cast<unsigned>(batch));
  Out* out = static_cast<Out*>(dst);
  if (vector) {
    PhotometricImages<Out, 4><<<grid, kThreads, 0, stream>>>(src, programs, out, height, width);
  } else {
    PhotometricImages<Out, 1><<<grid, kThreads, 0, stream>>>(src, programs, out, height, width);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t EnqueuePhotometric(const uint8_t* src, const PhotometricProgram* programs, void* dst,
                               NormalizeOut out, int64_t batch, int height, int width,
                               cudaStream_t stream) {
  switch (out) {
    case NormalizeOut::kFloat32:
      return PhotometricAs<float>(src, programs, dst, batch, height, width, stream);
    case NormalizeOut::kFloat16:
      return PhotometricAs<__half>(src, programs, dst, batch, height, width, stream);
    case NormalizeOut::kBFloat16:
      return PhotometricAs<__nv_bfloat16>(src, programs, dst, batch, height, width, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda_internal
}  // namespace ferry
