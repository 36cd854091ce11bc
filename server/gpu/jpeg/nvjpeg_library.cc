#include "server/gpu/jpeg/nvjpeg_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace ferry {

using namespace ::ferry::nvjpeg;  // NOLINT(build/namespaces): nvJPEG's names, as in C

namespace {

constexpr char kOff[] = "GPU JPEG decode is off: ";
constexpr char kInstall[] =
    "install CUDA's nvJPEG (from NVIDIA's CUDA repository: apt-get install libnvjpeg-13-0, or "
    "libnvjpeg-12-x) or point FERRY_NVJPEG_LIBRARY at a libnvjpeg.so.N";

std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlopen error";
}

}  // namespace

NvJpegSearch NvJpegSearch::FromEnvironment() {
  NvJpegSearch s;
  if (const char* path = std::getenv(kNvJpegLibraryEnv); path != nullptr) s.override_path = path;
  s.names = {"libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so.11", "libnvjpeg.so"};
  s.directories = {"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"};
  return s;
}

absl::StatusOr<const NvJpegLibrary*> NvJpegLibrary::Load() {
  // Leaked on purpose: nvJPEG handles may be destroyed during static destruction.
  static const auto* const loaded =
      new absl::StatusOr<std::unique_ptr<NvJpegLibrary>>(Open(NvJpegSearch::FromEnvironment()));
  if (!loaded->ok()) return loaded->status();
  return loaded->value().get();
}

absl::StatusOr<std::unique_ptr<NvJpegLibrary>> NvJpegLibrary::Open(const NvJpegSearch& search) {
  std::vector<std::string> candidates;
  if (!search.override_path.empty()) {
    candidates.push_back(search.override_path);
  } else {
    candidates = search.names;
    for (const std::string& dir : search.directories) {
      for (const std::string& name : search.names) candidates.push_back(dir + "/" + name);
    }
  }
  std::string first_error;
  absl::Status incomplete;  // from a library that loaded but lacked a function
  for (const std::string& path : candidates) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      if (first_error.empty()) first_error = DlError();
      continue;
    }
    std::unique_ptr<NvJpegLibrary> lib(new NvJpegLibrary());
    lib->handle_ = handle;
    lib->path_ = path;
    absl::Status resolved = lib->Resolve();
    if (!resolved.ok()) {
      if (incomplete.ok()) incomplete = resolved;
      continue;  // the destructor closes the handle
    }
    return lib;
  }
  if (!incomplete.ok()) return incomplete;
  if (!search.override_path.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(kOff, "cannot load ", kNvJpegLibraryEnv, "=", search.override_path, " (",
                     first_error, "); point it at CUDA's libnvjpeg.so.N, or unset it to search ",
                     absl::StrJoin(search.names, ", ")));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      kOff, search.names.empty() ? "libnvjpeg" : search.names.front(), " not found (tried ",
      absl::StrJoin(search.names, ", "), " on the loader's path",
      search.directories.empty() ? "" : " and in ", absl::StrJoin(search.directories, ", "),
      first_error.empty() ? "" : "; first error: ", first_error, "); ", kInstall));
}

NvJpegLibrary::~NvJpegLibrary() {
  if (handle_ != nullptr && dlclose(handle_) != 0) {
    FERRY_LOG(WARNING) << "dlclose(" << path_ << "): " << DlError();
  }
}

absl::Status NvJpegLibrary::Resolve() {
  std::string missing;
  auto resolve = [&](auto& fn, const char* name, bool required) {
    dlerror();  // clear
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle_, name));
    if (fn == nullptr && required && missing.empty()) missing = name;
  };
#define FERRY_NVJPEG_RESOLVE(name, required) resolve(name, #name, required)
  FERRY_NVJPEG_RESOLVE(nvjpegGetProperty, true);
  FERRY_NVJPEG_RESOLVE(nvjpegCreateEx, true);
  FERRY_NVJPEG_RESOLVE(nvjpegDestroy, true);
  FERRY_NVJPEG_RESOLVE(nvjpegGetHardwareDecoderInfo, false);
  FERRY_NVJPEG_RESOLVE(nvjpegJpegStateCreate, true);
  FERRY_NVJPEG_RESOLVE(nvjpegJpegStateDestroy, true);
  FERRY_NVJPEG_RESOLVE(nvjpegDecodeBatchedInitialize, true);
  FERRY_NVJPEG_RESOLVE(nvjpegDecodeBatchedPreAllocate, false);
  FERRY_NVJPEG_RESOLVE(nvjpegDecodeBatched, true);
  FERRY_NVJPEG_RESOLVE(nvjpegJpegStreamCreate, true);
  FERRY_NVJPEG_RESOLVE(nvjpegJpegStreamDestroy, true);
  FERRY_NVJPEG_RESOLVE(nvjpegJpegStreamParseHeader, true);
  FERRY_NVJPEG_RESOLVE(nvjpegJpegStreamGetFrameDimensions, true);
  FERRY_NVJPEG_RESOLVE(nvjpegDecodeBatchedSupported, true);
#undef FERRY_NVJPEG_RESOLVE
  if (nvjpegGetProperty != nullptr) {
    int major = -1, minor = -1, patch = -1;
    if (nvjpegGetProperty(MAJOR_VERSION, &major) == NVJPEG_STATUS_SUCCESS &&
        nvjpegGetProperty(MINOR_VERSION, &minor) == NVJPEG_STATUS_SUCCESS &&
        nvjpegGetProperty(PATCH_LEVEL, &patch) == NVJPEG_STATUS_SUCCESS) {
      major_ = major;
      version_ = absl::StrCat(major, ".", minor, ".", patch);
    } else {
      version_ = "unknown";
    }
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        kOff, path_, " (nvJPEG ", version_.empty() ? "of unknown version" : version_, ") lacks ",
        missing, "; ferry needs nvJPEG of CUDA 11 or later (libnvjpeg.so.11, .12 or .13)"));
  }
  return absl::OkStatus();
}

std::string NvJpegStatusName(int status) {
  switch (status) {
    case NVJPEG_STATUS_SUCCESS:
      return "NVJPEG_STATUS_SUCCESS";
    case NVJPEG_STATUS_NOT_INITIALIZED:
      return "NVJPEG_STATUS_NOT_INITIALIZED";
    case NVJPEG_STATUS_INVALID_PARAMETER:
      return "NVJPEG_STATUS_INVALID_PARAMETER";
    case NVJPEG_STATUS_BAD_JPEG:
      return "NVJPEG_STATUS_BAD_JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
      return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
      return "NVJPEG_STATUS_ALLOCATOR_FAILURE";
    case NVJPEG_STATUS_EXECUTION_FAILED:
      return "NVJPEG_STATUS_EXECUTION_FAILED";
    case NVJPEG_STATUS_ARCH_MISMATCH:
      return "NVJPEG_STATUS_ARCH_MISMATCH";
    case NVJPEG_STATUS_INTERNAL_ERROR:
      return "NVJPEG_STATUS_INTERNAL_ERROR";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
      return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM";
    default:
      return absl::StrCat("NVJPEG_STATUS_", status);
  }
}

absl::Status NvJpegStatus(int status, absl::string_view call, absl::string_view detail) {
  if (status == NVJPEG_STATUS_SUCCESS) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  const char* meaning = "nvJPEG failed";
  switch (status) {
    case NVJPEG_STATUS_BAD_JPEG:
      code = absl::StatusCode::kInvalidArgument;
      meaning = "corrupt or unreadable JPEG data";
      break;
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
      code = absl::StatusCode::kInvalidArgument;
      meaning = "JPEG data cut short";
      break;
    case NVJPEG_STATUS_INVALID_PARAMETER:
      code = absl::StatusCode::kInvalidArgument;
      meaning = "invalid argument";
      break;
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
      code = absl::StatusCode::kUnimplemented;
      meaning = "this kind of JPEG is not supported";
      break;
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      code = absl::StatusCode::kUnimplemented;
      meaning = "not supported by this backend";
      break;
    case NVJPEG_STATUS_ARCH_MISMATCH:
      code = absl::StatusCode::kFailedPrecondition;
      meaning = "not available on this GPU";
      break;
    case NVJPEG_STATUS_NOT_INITIALIZED:
      code = absl::StatusCode::kFailedPrecondition;
      meaning = "not initialized";
      break;
    case NVJPEG_STATUS_ALLOCATOR_FAILURE:
      code = absl::StatusCode::kResourceExhausted;
      meaning = "memory allocation failed";
      break;
    case NVJPEG_STATUS_EXECUTION_FAILED:
      meaning = "GPU execution failed";
      break;
    case NVJPEG_STATUS_INTERNAL_ERROR:
      meaning = "internal error";
      break;
    default:
      break;
  }
  return absl::Status(
      code, absl::StrCat(call, detail.empty() ? "" : "(", detail, detail.empty() ? "" : ")", ": ",
                         NvJpegStatusName(status), " (", meaning, ")"));
}

}  // namespace ferry
