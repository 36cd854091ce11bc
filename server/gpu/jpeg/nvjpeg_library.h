// nvJPEG, loaded at run time: ferryd links no libnvjpeg, so it builds and runs where CUDA's
// nvJPEG is missing, and then says why GPU JPEG decode is off (Load's status is what ferryd
// status shows). The library is looked for as libnvjpeg.so.13, .so.12, .so.11 and .so, first
// on the dynamic loader's path, then in /usr/local/cuda/lib64 and
// /usr/local/cuda/targets/x86_64-linux/lib; FERRY_NVJPEG_LIBRARY=/path/to/libnvjpeg.so.N
// names the one file to load instead.
//
//   absl::StatusOr<const NvJpegLibrary*> nvjpeg = NvJpegLibrary::Load();
//   if (!nvjpeg.ok()) { ... report nvjpeg.status().message(); decode on the CPU ... }
//   (*nvjpeg)->nvjpegCreateEx(...);  // through GpuJpegDecoder, not by hand
//
// Thread safety: Load is thread-safe; a loaded library is immutable.
#ifndef FERRY_SERVER_GPU_JPEG_NVJPEG_LIBRARY_H_
#define FERRY_SERVER_GPU_JPEG_NVJPEG_LIBRARY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/gpu/jpeg/internal/nvjpeg_api.h"

namespace ferry {

// The environment variable that names the library file to load, bypassing the search.
inline constexpr char kNvJpegLibraryEnv[] = "FERRY_NVJPEG_LIBRARY";

// Where to look for libnvjpeg.
struct NvJpegSearch {
  // When not empty: this file alone (FERRY_NVJPEG_LIBRARY). Default: empty.
  std::string override_path;
  // File names tried on the loader's path (dlopen without a slash), in order.
  // Default: libnvjpeg.so.13, libnvjpeg.so.12, libnvjpeg.so.11, libnvjpeg.so.
  std::vector<std::string> names;
  // Then each name in each of these directories. Default: /usr/local/cuda/lib64,
  // /usr/local/cuda/targets/x86_64-linux/lib.
  std::vector<std::string> directories;

  // The defaults, with override_path from FERRY_NVJPEG_LIBRARY.
  static NvJpegSearch FromEnvironment();
};

// An opened libnvjpeg with every function ferry calls resolved (dlsym). The dlopen handle is
// closed when the object is destroyed: nothing may call a function pointer after that.
// Move-only.
class NvJpegLibrary final {
 public:
  // The process-wide library: the first call searches (NvJpegSearch::FromEnvironment()),
  // later calls return the same result, success or failure. The library stays loaded until
  // the process exits. FAILED_PRECONDITION when no candidate loads or one lacks a function,
  // with a message that starts "GPU JPEG decode is off: " and names what was tried and what
  // to install.
  static absl::StatusOr<const NvJpegLibrary*> Load();

  // Searches as `search` says, uncached (tests; a daemon uses Load). Errors as Load's.
  static absl::StatusOr<std::unique_ptr<NvJpegLibrary>> Open(const NvJpegSearch& search);

  NvJpegLibrary(const NvJpegLibrary&) = delete;
  NvJpegLibrary& operator=(const NvJpegLibrary&) = delete;
  ~NvJpegLibrary();

  // The name or path that was opened ("libnvjpeg.so.13", or FERRY_NVJPEG_LIBRARY's value).
  const std::string& path() const { return path_; }
  // nvjpegGetProperty's MAJOR_VERSION.MINOR_VERSION.PATCH_LEVEL, e.g. "11.9.0".
  const std::string& version() const { return version_; }
  int major_version() const { return major_; }

  // Never null once loaded, except nvjpegGetHardwareDecoderInfo and
  // nvjpegDecodeBatchedPreAllocate (absent from early 11.x).
  nvjpeg::nvjpegGetProperty_fn nvjpegGetProperty = nullptr;
  nvjpeg::nvjpegCreateEx_fn nvjpegCreateEx = nullptr;
  nvjpeg::nvjpegDestroy_fn nvjpegDestroy = nullptr;
  nvjpeg::nvjpegGetHardwareDecoderInfo_fn nvjpegGetHardwareDecoderInfo = nullptr;
  nvjpeg::nvjpegJpegStateCreate_fn nvjpegJpegStateCreate = nullptr;
  nvjpeg::nvjpegJpegStateDestroy_fn nvjpegJpegStateDestroy = nullptr;
  nvjpeg::nvjpegDecodeBatchedInitialize_fn nvjpegDecodeBatchedInitialize = nullptr;
  nvjpeg::nvjpegDecodeBatchedPreAllocate_fn nvjpegDecodeBatchedPreAllocate = nullptr;
  nvjpeg::nvjpegDecodeBatched_fn nvjpegDecodeBatched = nullptr;
  nvjpeg::nvjpegJpegStreamCreate_fn nvjpegJpegStreamCreate = nullptr;
  nvjpeg::nvjpegJpegStreamDestroy_fn nvjpegJpegStreamDestroy = nullptr;
  nvjpeg::nvjpegJpegStreamParseHeader_fn nvjpegJpegStreamParseHeader = nullptr;
  nvjpeg::nvjpegJpegStreamGetFrameDimensions_fn nvjpegJpegStreamGetFrameDimensions = nullptr;
  nvjpeg::nvjpegDecodeBatchedSupported_fn nvjpegDecodeBatchedSupported = nullptr;

 private:
  NvJpegLibrary() = default;
  // Resolves every function from handle_; FAILED_PRECONDITION naming the first one missing.
  absl::Status Resolve();

  void* handle_ = nullptr;  // dlopen's; dlclose'd by the destructor
  std::string path_;
  std::string version_;
  int major_ = 0;
};

// An nvJPEG status as absl::Status: OK for NVJPEG_STATUS_SUCCESS, else a message naming
// `call` (with `detail` in parentheses when given) and the status's name, e.g.
// "nvjpegDecodeBatched(4 images on device 0): NVJPEG_STATUS_BAD_JPEG (corrupt or unreadable
// JPEG data)". Codes: BAD_JPEG, INCOMPLETE_BITSTREAM, INVALID_PARAMETER -> INVALID_ARGUMENT;
// JPEG_NOT_SUPPORTED, IMPLEMENTATION_NOT_SUPPORTED -> UNIMPLEMENTED; ARCH_MISMATCH,
// NOT_INITIALIZED -> FAILED_PRECONDITION; ALLOCATOR_FAILURE -> RESOURCE_EXHAUSTED;
// EXECUTION_FAILED, INTERNAL_ERROR and unknown values -> INTERNAL.
absl::Status NvJpegStatus(int status, absl::string_view call, absl::string_view detail = {});

// "NVJPEG_STATUS_BAD_JPEG", or "NVJPEG_STATUS_<n>" for a value this build does not know.
std::string NvJpegStatusName(int status);

}  // namespace ferry

#endif  // FERRY_SERVER_GPU_JPEG_NVJPEG_LIBRARY_H_
