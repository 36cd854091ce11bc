// Device-side conversions shared by ferryd's kernels (normalize.cu, photometric.cu): uint8
// to float without I2F, and float to each output type rounded to nearest. CUDA-only: the
// .cu files include it, nothing else.
#ifndef FERRY_SERVER_KERNELS_INTERNAL_CONVERT_CUH_
#define FERRY_SERVER_KERNELS_INTERNAL_CONVERT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace ferry {
namespace cuda_internal {

// uint8 -> float exactly, without I2F (a quarter-rate instruction on Hopper): put byte
// `k` of `word` in the low mantissa bits of 2^23 and subtract 2^23.
template <int k>
__device__ __forceinline__ float ByteToFloat(uint32_t word) {
  static_assert(k >= 0 && k < 4);
  return __int_as_float(__byte_perm(word, 0x4B000000u, 0x7440u | k)) - 8388608.0f;
}

// float -> the output type, rounded to nearest.
template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Two values, `lo` first in memory, rounded to nearest.
__device__ __forceinline__ uint32_t Pack2(__half, float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}
__device__ __forceinline__ uint32_t Pack2(__nv_bfloat16, float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof(u));
  return u;
}

}  // namespace cuda_internal
}  // namespace ferry

#endif  // FERRY_SERVER_KERNELS_INTERNAL_CONVERT_CUH_
