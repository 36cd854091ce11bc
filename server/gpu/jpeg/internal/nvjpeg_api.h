// The part of nvJPEG's C API that ferry calls, declared here so that ferry builds without
// nvjpeg.h (CUDA toolkits without nvJPEG, CI) and loads libnvjpeg at run time
// (nvjpeg_library.h). NVIDIA's header is not copied into the tree: its licence is NVIDIA's.
// Only types, values and signatures are restated, under NVIDIA's names, in this namespace.
//
// Checked against:
//   - nvjpeg.h 11.9.0.86 of CUDA 11.8 (Debian bookworm non-free, nvidia-cuda-dev
//     11.8.89~11.8.0-5~deb12u1), and the symbols libnvjpeg.so.11 (libnvjpeg11) exports;
//   - the nvJPEG documentation of CUDA 13 (docs.nvidia.com/cuda/nvjpeg: backends up to
//     NVJPEG_BACKEND_LOSSLESS_JPEG = 6, output formats up to NVJPEG_OUTPUT_YUY2 = 9, the
//     flags up to NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION = 32, and the signatures below),
//     which keeps every value and signature used here as 11.x has it.
// The API is C: enums are passed as int-sized values, handles as pointers, and cudaStream_t
// is CUstream_st*, as in CUDA's own headers.
#ifndef FERRY_SERVER_GPU_JPEG_INTERNAL_NVJPEG_API_H_
#define FERRY_SERVER_GPU_JPEG_INTERNAL_NVJPEG_API_H_

#include <cstddef>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace ferry::nvjpeg {

enum nvjpegStatus_t : int {
  NVJPEG_STATUS_SUCCESS = 0,
  NVJPEG_STATUS_NOT_INITIALIZED = 1,
  NVJPEG_STATUS_INVALID_PARAMETER = 2,
  NVJPEG_STATUS_BAD_JPEG = 3,
  NVJPEG_STATUS_JPEG_NOT_SUPPORTED = 4,
  NVJPEG_STATUS_ALLOCATOR_FAILURE = 5,
  NVJPEG_STATUS_EXECUTION_FAILED = 6,
  NVJPEG_STATUS_ARCH_MISMATCH = 7,
  NVJPEG_STATUS_INTERNAL_ERROR = 8,
  NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED = 9,
  NVJPEG_STATUS_INCOMPLETE_BITSTREAM = 10,
};

enum nvjpegChromaSubsampling_t : int {
  NVJPEG_CSS_444 = 0,
  NVJPEG_CSS_422 = 1,
  NVJPEG_CSS_420 = 2,
  NVJPEG_CSS_440 = 3,
  NVJPEG_CSS_411 = 4,
  NVJPEG_CSS_410 = 5,
  NVJPEG_CSS_GRAY = 6,
  NVJPEG_CSS_410V = 7,
  NVJPEG_CSS_UNKNOWN = -1,
};

enum nvjpegOutputFormat_t : int {
  // Interleaved RGB into channel[0] with pitch[0] >= width * 3. A grayscale JPEG comes out
  // with its luminance in all three channels.
  NVJPEG_OUTPUT_RGBI = 5,
};

enum nvjpegBackend_t : int {
  NVJPEG_BACKEND_DEFAULT = 0,
  // The JPEG decode engines (A100, H100 and later): baseline Huffman JPEGs with one scan.
  NVJPEG_BACKEND_HARDWARE = 3,
};

// nvjpegCreateEx's flags (bit fields).
inline constexpr unsigned kNvjpegFlagsDefault = 0;  // NVJPEG_FLAGS_DEFAULT
// NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION: interpolated (not replicated) chroma upsampling,
// as libjpeg's "fancy" upsampling. In the CUDA 12.x/13 documentation, not in 11.x.
inline constexpr unsigned kNvjpegFlagsUpsamplingWithInterpolation = 32;

// libraryPropertyType (CUDA's library_types.h).
enum libraryPropertyType : int { MAJOR_VERSION = 0, MINOR_VERSION = 1, PATCH_LEVEL = 2 };

inline constexpr int NVJPEG_MAX_COMPONENT = 4;

struct nvjpegImage_t {
  unsigned char* channel[NVJPEG_MAX_COMPONENT];
  size_t pitch[NVJPEG_MAX_COMPONENT];
};

// Opaque handles. The allocator structs are only ever passed as null (the defaults:
// cudaMalloc and cudaHostAlloc), so they stay incomplete here.
struct nvjpegHandle;
using nvjpegHandle_t = nvjpegHandle*;
struct nvjpegJpegState;
using nvjpegJpegState_t = nvjpegJpegState*;
struct nvjpegJpegStream;
using nvjpegJpegStream_t = nvjpegJpegStream*;
struct nvjpegDevAllocator_t;
struct nvjpegPinnedAllocator_t;

using cudaStream_t = CUstream_st*;

// The signatures, in nvjpeg.h's order.
using nvjpegGetProperty_fn = nvjpegStatus_t (*)(libraryPropertyType type, int* value);
using nvjpegCreateEx_fn = nvjpegStatus_t (*)(nvjpegBackend_t backend,
                                             nvjpegDevAllocator_t* dev_allocator,
                                             nvjpegPinnedAllocator_t* pinned_allocator,
                                             unsigned int flags, nvjpegHandle_t* handle);
using nvjpegDestroy_fn = nvjpegStatus_t (*)(nvjpegHandle_t handle);
using nvjpegGetHardwareDecoderInfo_fn = nvjpegStatus_t (*)(nvjpegHandle_t handle,
                                                           unsigned int* num_engines,
                                                           unsigned int* num_cores_per_engine);
using nvjpegJpegStateCreate_fn = nvjpegStatus_t (*)(nvjpegHandle_t handle,
                                                    nvjpegJpegState_t* jpeg_handle);
using nvjpegJpegStateDestroy_fn = nvjpegStatus_t (*)(nvjpegJpegState_t jpeg_handle);
using nvjpegDecodeBatchedInitialize_fn = nvjpegStatus_t (*)(nvjpegHandle_t handle,
                                                            nvjpegJpegState_t jpeg_handle,
                                                            int batch_size, int max_cpu_threads,
                                                            nvjpegOutputFormat_t output_format);
// Hardware backend only (nvJPEG 11.x and later): reserves the engines' buffers for batches of
// up to batch_size images of up to width x height.
using nvjpegDecodeBatchedPreAllocate_fn = nvjpegStatus_t (*)(
    nvjpegHandle_t handle, nvjpegJpegState_t jpeg_handle, int batch_size, int width, int height,
    nvjpegChromaSubsampling_t chroma_subsampling, nvjpegOutputFormat_t output_format);
using nvjpegDecodeBatched_fn = nvjpegStatus_t (*)(nvjpegHandle_t handle,
                                                  nvjpegJpegState_t jpeg_handle,
                                                  const unsigned char* const* data,
                                                  const size_t* lengths,
                                                  nvjpegImage_t* destinations, cudaStream_t stream);
using nvjpegJpegStreamCreate_fn = nvjpegStatus_t (*)(nvjpegHandle_t handle,
                                                     nvjpegJpegStream_t* jpeg_stream);
// By value, as nvjpeg.h 11.8 declares it and DALI calls it against CUDA 12 (the CUDA 13
// documentation's "nvjpegJpegStream_t*" is a typo of the page: the parameter is "Input").
using nvjpegJpegStreamDestroy_fn = nvjpegStatus_t (*)(nvjpegJpegStream_t jpeg_stream);
using nvjpegJpegStreamParseHeader_fn = nvjpegStatus_t (*)(nvjpegHandle_t handle,
                                                          const unsigned char* data, size_t length,
                                                          nvjpegJpegStream_t jpeg_stream);
// The frame's size as nvJPEG read it from the parsed stream.
using nvjpegJpegStreamGetFrameDimensions_fn = nvjpegStatus_t (*)(nvjpegJpegStream_t jpeg_stream,
                                                                 unsigned int* width,
                                                                 unsigned int* height);
// *is_supported == 0 means nvjpegDecodeBatched can decode the parsed stream.
using nvjpegDecodeBatchedSupported_fn = nvjpegStatus_t (*)(nvjpegHandle_t handle,
                                                           nvjpegJpegStream_t jpeg_stream,
                                                           int* is_supported);

}  // namespace ferry::nvjpeg

#endif  // FERRY_SERVER_GPU_JPEG_INTERNAL_NVJPEG_API_H_
