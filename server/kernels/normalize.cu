// Kernels for normalize.h and their launch arithmetic. Argument checks and error statuses
// live in normalize.cc; this file sees only CUDA.
//
// Both kernels are memory-bound (a few arithmetic instructions per byte), so they are
// written around the bytes: a persistent grid (one wave of resident blocks, each thread
// striding over the work) so no partial last wave idles the memory system; 16-byte loads
// and stores where alignment allows; each input byte read once and each output byte
// written once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "server/kernels/internal/convert.cuh"
#include "server/kernels/internal/kernels.h"

namespace ferry {
namespace cuda_internal {
namespace {

constexpr int kThreads = 256;
// The vector path stages a tile of the batch's pixels in shared memory, so that both sides
// move 16 bytes per thread with consecutive lanes on consecutive addresses: loads of the
// tile's 3 * kTilePixels input bytes, and per channel plane one 16-byte store of 16 /
// sizeof(output) pixels. (Storing 32 or 64 contiguous bytes per thread instead, with the
// lanes 32 or 64 bytes apart, reaches only a fraction of device-to-device copy bandwidth.)
constexpr int kTilePixels = 4096;
constexpr int kTileBytes = 3 * kTilePixels;  // 12 KiB: 768 16-byte loads, 3 per thread

// Byte `byte` of the pixels held in w, as float.
template <int byte, int kWords>
__device__ __forceinline__ float ByteOf(const uint32_t (&w)[kWords]) {
  return ByteToFloat<byte % 4>(w[byte / 4]);
}

// Stores one 16-byte run of outputs at a 16-byte aligned `dst`: 4 floats or 8 halves.
// (__stcg: an explicit 16-byte store; left to itself the compiler split some into four.)
__device__ __forceinline__ void Store16(float* dst, const float (&v)[4]) {
  __stcg(reinterpret_cast<float4*>(dst), make_float4(v[0], v[1], v[2], v[3]));
}
template <typename Half>
__device__ __forceinline__ void Store16(Half* dst, const float (&v)[8]) {
  __stcg(reinterpret_cast<uint4*>(dst),
         make_uint4(Pack2(Half(), v[0], v[1]), Pack2(Half(), v[2], v[3]), Pack2(Half(), v[4], v[5]),
                    Pack2(Half(), v[6], v[7])));
}

// Channel c of the kUnit pixels held in w (3 * kUnit bytes, HWC).
template <int c, int kUnit, int kWords, int i = 0>
__device__ __forceinline__ void Channel(const uint32_t (&w)[kWords], const NormalizeParams& p,
                                        float (&v)[kUnit]) {
  if constexpr (i < kUnit) {
    v[i] = fmaf(ByteOf<3 * i + c>(w), p.scale[c], p.bias[c]);
    Channel<c, kUnit, kWords, i + 1>(w, p, v);
  }
}

// Vector path: pixels per image a multiple of 16 (so no unit of 4 or 8 pixels straddles two
// images), both pointers 16-byte aligned. Each block walks tiles of kTilePixels of the
// whole batch (a tile may span images).
template <typename Out, typename Index>
__global__ void __launch_bounds__(kThreads)
    NormalizeTiles(const uint8_t* __restrict__ src, Out* __restrict__ dst, Index pixels,
                   Index total_pixels, NormalizeParams p) {
  constexpr int kUnit = 16 / sizeof(Out);  // pixels per 16-byte store
  constexpr int kWords = 3 * kUnit / 4;    // their input, in 32-bit words
  __shared__ __align__(16) uint8_t tile[kTileBytes];
  const Index total_loads = total_pixels * 3 / 16;  // exact: total_pixels % 16 == 0
  const Index tiles = (total_pixels + kTilePixels - 1) / kTilePixels;
  for (Index t = blockIdx.x; t < tiles; t += gridDim.x) {
    const Index first_load = t * (kTileBytes / 16);
    for (int k = threadIdx.x; k < kTileBytes / 16; k += kThreads) {
      if (first_load + k < total_loads) {
        reinterpret_cast<uint4*>(tile)[k] = reinterpret_cast<const uint4*>(src)[first_load + k];
      }
    }
    __syncthreads();
    const Index first_pixel = t * kTilePixels;
    for (int u = threadIdx.x; u < kTilePixels / kUnit; u += kThreads) {
      const Index pixel = first_pixel + static_cast<Index>(u) * kUnit;
      if (pixel >= total_pixels) break;
      uint32_t w[kWords];
      if constexpr (kWords == 6) {  // 24 bytes at a multiple of 24: three 8-byte reads,
                                    // which meet no bank conflict across a half-warp
        const uint2* s = reinterpret_cast<const uint2*>(tile + 24 * u);
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          const uint2 d = s[j];
          w[2 * j] = d.x;
          w[2 * j + 1] = d.y;
        }
      } else {  // 12 bytes: three words, 3 banks apart across lanes: no conflict
        const uint32_t* s = reinterpret_cast<const uint32_t*>(tile + 12 * u);
#pragma unroll
        for (int j = 0; j < kWords; ++j) w[j] = s[j];
      }
      const Index image = pixel / pixels;
      Out* out = dst + image * (3 * pixels) + (pixel - image * pixels);
      float v[kUnit];
      Channel<0>(w, p, v);
      Store16(out, v);
      Channel<1>(w, p, v);
      Store16(out + pixels, v);
      Channel<2>(w, p, v);
      Store16(out + 2 * pixels, v);
    }
    __syncthreads();  // the tile is read by all before the next one overwrites it
  }
}

// Any shape and alignment: one pixel per step. Loads of a warp cover 96 contiguous bytes;
// stores of a warp are contiguous within each plane.
template <typename Out, typename Index>
__global__ void __launch_bounds__(kThreads)
    NormalizePixels(const uint8_t* __restrict__ src, Out* __restrict__ dst, Index pixels,
                    Index total_pixels, NormalizeParams p) {
  const Index stride = static_cast<Index>(gridDim.x) * kThreads;
  for (Index q = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; q < total_pixels;
       q += stride) {
    const Index image = q / pixels;
    const Index i = q - image * pixels;
    const uint8_t* in = src + q * 3;
    Out* out = dst + image * (3 * pixels) + i;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      out[c * pixels] = FromFloat<Out>(fmaf(static_cast<float>(in[c]), p.scale[c], p.bias[c]));
    }
  }
}

// Widening copy. With both pointers 16-byte aligned, each step loads 16 bytes of input and
// stores 16 * sizeof(Out) / sizeof(In) bytes; the tail (and everything, unaligned) goes one
// element per step.
template <typename In, typename Out>
__global__ void __launch_bounds__(kThreads)
    WidenTokens(const In* __restrict__ src, Out* __restrict__ dst, int64_t count, bool vector) {
  constexpr int kPerLoad = 16 / sizeof(In);
  constexpr int kStores = kPerLoad * sizeof(Out) / 16;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t groups = vector ? count / kPerLoad : 0;
  for (int64_t g = first; g < groups; g += stride) {
    const uint4 raw = reinterpret_cast<const uint4*>(src)[g];
    In in[kPerLoad];
    memcpy(in, &raw, sizeof(raw));
    Out out[kPerLoad];
#pragma unroll
    for (int k = 0; k < kPerLoad; ++k) out[k] = static_cast<Out>(in[k]);
    uint4 packed[kStores];
    memcpy(packed, out, sizeof(out));
    uint4* d = reinterpret_cast<uint4*>(dst + g * kPerLoad);
#pragma unroll
    for (int k = 0; k < kStores; ++k) d[k] = packed[k];
  }
  for (int64_t q = groups * kPerLoad + first; q < count; q += stride) {
    dst[q] = static_cast<Out>(src[q]);
  }
}

// Blocks for a persistent grid: as many as are resident at once on the current device,
// fewer when the work is smaller.
template <typename Kernel>
cudaError_t GridSize(Kernel kernel, int64_t work_items, int* blocks) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  // Resident blocks of `kernel` on `device`: asked once, since the occupancy query costs
  // microseconds and a launch happens per batch. (Keyed by the kernel's address: kernels
  // of one signature share this template instance.)
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int64_t>* resident_blocks =
      new std::map<std::pair<const void*, int>, int64_t>();  // never destroyed: used at exit
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), device);
  int64_t resident = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = resident_blocks->find(key);
    if (it != resident_blocks->end()) resident = it->second;
  }
  if (resident == 0) {
    int sms = 0;
    error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (error != cudaSuccess) return error;
    int per_sm = 0;
    error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
    if (error != cudaSuccess) return error;
    resident = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
    std::lock_guard<std::mutex> lock(mutex);
    (*resident_blocks)[key] = resident;
  }
  const int64_t needed = (work_items + kThreads - 1) / kThreads;
  *blocks = static_cast<int>(needed < resident ? needed : resident);
  return cudaSuccess;
}

template <typename Kernel, typename... Args>
cudaError_t LaunchPersistent(Kernel kernel, int64_t work_items, cudaStream_t stream, Args... args) {
  int blocks = 0;
  const cudaError_t error = GridSize(kernel, work_items, &blocks);
  if (error != cudaSuccess) return error;
  // Drop an earlier call's error so that the check below reports this launch alone.
  (void)cudaGetLastError();
  kernel<<<blocks, kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}

template <typename Out, typename Index>
cudaError_t NormalizeAs(const uint8_t* src, void* dst, int64_t batch, int64_t pixels,
                        const NormalizeParams& params, cudaStream_t stream) {
  Out* out = static_cast<Out*>(dst);
  const bool aligned =
      reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  if (aligned && pixels % 16 == 0) {
    const int64_t tiles = (batch * pixels + kTilePixels - 1) / kTilePixels;
    return LaunchPersistent(NormalizeTiles<Out, Index>, tiles * kThreads, stream, src, out,
                            static_cast<Index>(pixels), static_cast<Index>(batch * pixels), params);
  }
  return LaunchPersistent(NormalizePixels<Out, Index>, batch * pixels, stream, src, out,
                          static_cast<Index>(pixels), static_cast<Index>(batch * pixels), params);
}

template <typename Out>
cudaError_t NormalizeAs(const uint8_t* src, void* dst, int64_t batch, int64_t pixels,
                        const NormalizeParams& params, cudaStream_t stream) {
  // 32-bit index arithmetic (cheaper division) whenever every output index fits.
  if (batch * pixels * 3 <= static_cast<int64_t>(UINT32_MAX)) {
    return NormalizeAs<Out, uint32_t>(src, dst, batch, pixels, params, stream);
  }
  return NormalizeAs<Out, uint64_t>(src, dst, batch, pixels, params, stream);
}

template <typename In, typename Out>
cudaError_t WidenAs(const void* src, void* dst, int64_t count, cudaStream_t stream) {
  const bool vector =
      reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int64_t items = vector ? (count + 16 / sizeof(In) - 1) / (16 / sizeof(In)) : count;
  return LaunchPersistent(WidenTokens<In, Out>, items, stream, static_cast<const In*>(src),
                          static_cast<Out*>(dst), count, vector);
}

// Gather: row r of the batch is record indices[r] of a mapping in host memory, read by the
// SMs across PCIe (the mapping is registered: device-readable). The batch is one flat run
// of V-sized units; consecutive lanes take consecutive units (a warp reads 32 contiguous
// units of one row, or two rows' ends), and each thread issues kUnroll loads before its
// first store, so that enough reads are in flight to cover PCIe's latency with few
// blocks. A row whose index is outside [0, num_records) is written as zeros (the pipeline
// marks a row with no readable sample by index -1, and the workers' copy path zeroes it
// too); the kernel never reads outside the mapping. With `index_out`, the indices are
// written there too.
//
// The indices come from device memory, or travel in the launch's own parameters (up to
// 32 KiB of them since CUDA 12.1): then nothing is copied before the kernel runs, which
// saves a small H2D copy's latency per batch.
struct DeviceIndices {
  const int64_t* __restrict__ at;
  __device__ __forceinline__ int64_t operator[](uint32_t r) const { return at[r]; }
};
template <int64_t kRows>
struct ParamIndices {
  int64_t at[kRows];
  __device__ __forceinline__ int64_t operator[](uint32_t r) const { return at[r]; }
};

template <typename V, int kUnroll, typename Indices>
__global__ void __launch_bounds__(kThreads)
    GatherRows(const uint8_t* __restrict__ records, int64_t num_records, const Indices indices,
               uint32_t count, uint32_t units_per_row, uint32_t total_units,
               uint8_t* __restrict__ dst, int64_t* __restrict__ index_out) {
  const uint32_t stride = gridDim.x * kThreads;
  const uint32_t thread = blockIdx.x * kThreads + threadIdx.x;
  const size_t row_bytes = static_cast<size_t>(units_per_row) * sizeof(V);
  if (index_out != nullptr) {
    for (uint32_t r = thread; r < count; r += stride) index_out[r] = indices[r];
  }
  for (uint32_t first = thread; first < total_units; first += stride * kUnroll) {
    V v[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t unit = first + u * stride;
      valid[u] = unit < total_units;
      v[u] = V{};
      if (valid[u]) {
        const uint32_t row = unit / units_per_row;
        const int64_t index = indices[row];
        if (index >= 0 && index < num_records) {
          const V* src =
              reinterpret_cast<const V*>(records + static_cast<size_t>(index) * row_bytes);
          v[u] = __ldcs(src + (unit - row * units_per_row));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (valid[u]) reinterpret_cast<V*>(dst)[first + u * stride] = v[u];
    }
  }
}

template <typename V, int kUnroll, typename Indices>
cudaError_t GatherAs(const uint8_t* records, int64_t num_records, size_t row_bytes,
                     const Indices& indices, int64_t count, void* dst, int64_t* index_out,
                     int blocks, cudaStream_t stream) {
  const uint32_t units_per_row = static_cast<uint32_t>(row_bytes / sizeof(V));
  const uint32_t total_units = static_cast<uint32_t>(count * units_per_row);
  const int64_t needed = (static_cast<int64_t>(total_units) + kThreads - 1) / kThreads;
  if (blocks > needed) blocks = static_cast<int>(needed);
  (void)cudaGetLastError();
  GatherRows<V, kUnroll, Indices><<<blocks, kThreads, 0, stream>>>(
      records, num_records, indices, static_cast<uint32_t>(count), units_per_row, total_units,
      static_cast<uint8_t*>(dst), index_out);
  return cudaGetLastError();
}

// The widest unit that divides the rows and both bases: every unit is then aligned.
template <typename Indices>
cudaError_t GatherAny(const uint8_t* records, int64_t num_records, size_t row_bytes,
                      const Indices& indices, int64_t count, void* dst, int64_t* index_out,
                      int blocks, cudaStream_t stream) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(records) | reinterpret_cast<uintptr_t>(dst) |
                         static_cast<uintptr_t>(row_bytes);
  if (bits % 16 == 0) {
    return GatherAs<uint4, 4>(records, num_records, row_bytes, indices, count, dst, index_out,
                              blocks, stream);
  }
  if (bits % 8 == 0) {
    return GatherAs<uint2, 8>(records, num_records, row_bytes, indices, count, dst, index_out,
                              blocks, stream);
  }
  if (bits % 4 == 0) {
    return GatherAs<uint32_t, 8>(records, num_records, row_bytes, indices, count, dst, index_out,
                                 blocks, stream);
  }
  return GatherAs<uint8_t, 8>(records, num_records, row_bytes, indices, count, dst, index_out,
                              blocks, stream);
}

// Parameter lists of a few sizes, so a batch of 64 rows does not ship 32 KiB per launch.
template <int64_t kRows>
cudaError_t GatherWithParams(const uint8_t* records, int64_t num_records, size_t row_bytes,
                             const int64_t* host_indices, int64_t count, void* dst,
                             int64_t* index_out, int blocks, cudaStream_t stream) {
  ParamIndices<kRows> params;
  memcpy(params.at, host_indices, static_cast<size_t>(count) * sizeof(int64_t));
  return GatherAny(records, num_records, row_bytes, params, count, dst, index_out, blocks, stream);
}

// The first of `kRows, kLarger...` that holds `count` rows; cudaErrorInvalidValue past
// the last.
template <int64_t kRows, int64_t... kLarger>
cudaError_t GatherWithSmallestParams(const uint8_t* records, int64_t num_records, size_t row_bytes,
                                     const int64_t* host_indices, int64_t count, void* dst,
                                     int64_t* index_out, int blocks, cudaStream_t stream) {
  if (count <= kRows) {
    return GatherWithParams<kRows>(records, num_records, row_bytes, host_indices, count, dst,
                                   index_out, blocks, stream);
  }
  if constexpr (sizeof...(kLarger) > 0) {
    return GatherWithSmallestParams<kLarger...>(records, num_records, row_bytes, host_indices,
                                                count, dst, index_out, blocks, stream);
  } else {
    return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t EnqueueNormalizeImages(const uint8_t* src, void* dst, NormalizeOut out, int64_t batch,
                                   int64_t pixels, const NormalizeParams& params,
                                   cudaStream_t stream) {
  switch (out) {
    case NormalizeOut::kFloat32:
      return NormalizeAs<float>(src, dst, batch, pixels, params, stream);
    case NormalizeOut::kFloat16:
      return NormalizeAs<__half>(src, dst, batch, pixels, params, stream);
    case NormalizeOut::kBFloat16:
      return NormalizeAs<__nv_bfloat16>(src, dst, batch, pixels, params, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t EnqueueWidenTokens(const void* src, void* dst, WidenKind kind, int64_t count,
                               cudaStream_t stream) {
  switch (kind) {
    case WidenKind::kU16ToI32:
      return WidenAs<uint16_t, int32_t>(src, dst, count, stream);
    case WidenKind::kU16ToI64:
      return WidenAs<uint16_t, int64_t>(src, dst, count, stream);
    case WidenKind::kU32ToI32:
      return WidenAs<uint32_t, int32_t>(src, dst, count, stream);
    case WidenKind::kU32ToI64:
      return WidenAs<uint32_t, int64_t>(src, dst, count, stream);
    case WidenKind::kI32ToI64:
      return WidenAs<int32_t, int64_t>(src, dst, count, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t EnqueueGatherRows(const uint8_t* records, int64_t num_records, size_t row_bytes,
                              const int64_t* indices, int64_t count, void* dst, int blocks,
                              cudaStream_t stream) {
  return GatherAny(records, num_records, row_bytes, DeviceIndices{indices}, count, dst, nullptr,
                   blocks, stream);
}

cudaError_t EnqueueGatherRowsIndexedFromHost(const uint8_t* records, int64_t num_records,
                                             size_t row_bytes, const int64_t* host_indices,
                                             int64_t count, void* dst, int64_t* index_out,
                                             int blocks, cudaStream_t stream) {
  return GatherWithSmallestParams<64, 256, 1024, kMaxGatherParamRows>(
      records, num_records, row_bytes, host_indices, count, dst, index_out, blocks, stream);
}

}  // namespace cuda_internal
}  // namespace ferry
