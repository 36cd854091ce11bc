// A stand-in libnvjpeg for nvjpeg_library_test: exports nvJPEG's entry points with the
// signatures of internal/nvjpeg_api.h, so that the loader's search, symbol resolution and
// version reading run in CI, where no libnvjpeg exists. Only nvjpegGetProperty does anything
// (it reports version 99.1.2); the rest refuse with NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED
// and are never called by the test. Built three ways:
//   FERRY_FAKE_NVJPEG_OMIT_HW_INFO: without nvjpegGetHardwareDecoderInfo and
//     nvjpegDecodeBatchedPreAllocate (optional; early 11.x)
//   FERRY_FAKE_NVJPEG_OMIT_SUPPORTED: without nvjpegDecodeBatchedSupported (required)
#include "server/gpu/jpeg/internal/nvjpeg_api.h"

using namespace ferry::nvjpeg;  // NOLINT(build/namespaces)

namespace {
constexpr nvjpegStatus_t kNo = NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
}  // namespace

extern "C" {

__attribute__((visibility("default"))) nvjpegStatus_t nvjpegGetProperty(libraryPropertyType type,
                                                                        int* value) {
  *value = type == MAJOR_VERSION ? 99 : type == MINOR_VERSION ? 1 : 2;
  return NVJPEG_STATUS_SUCCESS;
}
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegCreateEx(nvjpegBackend_t,
                                                                     nvjpegDevAllocator_t*,
                                                                     nvjpegPinnedAllocator_t*,
                                                                     unsigned int,
                                                                     nvjpegHandle_t*) {
  return kNo;
}
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegDestroy(nvjpegHandle_t) { return kNo; }
#ifndef FERRY_FAKE_NVJPEG_OMIT_HW_INFO
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegGetHardwareDecoderInfo(nvjpegHandle_t,
                                                                                   unsigned int*,
                                                                                   unsigned int*) {
  return kNo;
}
#endif
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegJpegStateCreate(nvjpegHandle_t,
                                                                            nvjpegJpegState_t*) {
  return kNo;
}
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegJpegStateDestroy(nvjpegJpegState_t) {
  return kNo;
}
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegDecodeBatchedInitialize(
    nvjpegHandle_t, nvjpegJpegState_t, int, int, nvjpegOutputFormat_t) {
  return kNo;
}
#ifndef FERRY_FAKE_NVJPEG_OMIT_HW_INFO
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegDecodeBatchedPreAllocate(
    nvjpegHandle_t, nvjpegJpegState_t, int, int, int, nvjpegChromaSubsampling_t,
    nvjpegOutputFormat_t) {
  return kNo;
}
#endif
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegDecodeBatched(
    nvjpegHandle_t, nvjpegJpegState_t, const unsigned char* const*, const size_t*, nvjpegImage_t*,
    cudaStream_t) {
  return kNo;
}
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegJpegStreamCreate(nvjpegHandle_t,
                                                                             nvjpegJpegStream_t*) {
  return kNo;
}
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegJpegStreamDestroy(nvjpegJpegStream_t) {
  return kNo;
}
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegJpegStreamParseHeader(
    nvjpegHandle_t, const unsigned char*, size_t, nvjpegJpegStream_t) {
  return kNo;
}
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegJpegStreamGetFrameDimensions(
    nvjpegJpegStream_t, unsigned int*, unsigned int*) {
  return kNo;
}
#ifndef FERRY_FAKE_NVJPEG_OMIT_SUPPORTED
__attribute__((visibility("default"))) nvjpegStatus_t nvjpegDecodeBatchedSupported(
    nvjpegHandle_t, nvjpegJpegStream_t, int*) {
  return kNo;
}
#endif

}  // extern "C"
