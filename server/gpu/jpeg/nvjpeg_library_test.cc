// nvJPEG's run-time loading without a GPU or a real libnvjpeg: the search and its messages
// (what ferryd status shows when GPU decode is off), symbol resolution against stand-in
// libraries (fake_nvjpeg.cc), nvJPEG status mapping, and the decoder's argument checks.
// CTest runs this with FERRY_NVJPEG_LIBRARY naming a file that does not exist.
//
// FERRY_NVJPEG_CHECK_LIBRARY=/path/to/libnvjpeg.so.N also checks that a real library
// resolves every function ferry uses (RealLibraryResolvesEverything; skipped otherwise).
#include "server/gpu/jpeg/nvjpeg_library.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "cuda/cuda_resources.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/gpu/jpeg/gpu_jpeg_decoder.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

NvJpegSearch OnlyFile(const std::string& path) {
  NvJpegSearch s = NvJpegSearch::FromEnvironment();
  s.override_path = path;
  return s;
}

void ExpectEverythingResolved(const NvJpegLibrary& lib) {
  EXPECT_NE(lib.nvjpegGetProperty, nullptr);
  EXPECT_NE(lib.nvjpegCreateEx, nullptr);
  EXPECT_NE(lib.nvjpegDestroy, nullptr);
  EXPECT_NE(lib.nvjpegJpegStateCreate, nullptr);
  EXPECT_NE(lib.nvjpegJpegStateDestroy, nullptr);
  EXPECT_NE(lib.nvjpegDecodeBatchedInitialize, nullptr);
  EXPECT_NE(lib.nvjpegDecodeBatched, nullptr);
  EXPECT_NE(lib.nvjpegJpegStreamCreate, nullptr);
  EXPECT_NE(lib.nvjpegJpegStreamDestroy, nullptr);
  EXPECT_NE(lib.nvjpegJpegStreamParseHeader, nullptr);
  EXPECT_NE(lib.nvjpegJpegStreamGetFrameDimensions, nullptr);
  EXPECT_NE(lib.nvjpegDecodeBatchedSupported, nullptr);
}

TEST(NvJpegLibrary, DefaultSearch) {
  const NvJpegSearch s = NvJpegSearch::FromEnvironment();
  EXPECT_THAT(s.names, ::testing::ElementsAre("libnvjpeg.so.13", "libnvjpeg.so.12",
                                              "libnvjpeg.so.11", "libnvjpeg.so"));
  EXPECT_THAT(s.directories, ::testing::Contains("/usr/local/cuda/lib64"));
}

TEST(NvJpegLibrary, LoadNamesTheMissingOverride) {
  const char* env = std::getenv(kNvJpegLibraryEnv);
  if (env == nullptr || std::string(env) != "/nonexistent/ferry-test/libnvjpeg.so.13") {
    GTEST_SKIP() << "run through ctest, which sets " << kNvJpegLibraryEnv
                 << "=/nonexistent/ferry-test/libnvjpeg.so.13";
  }
  absl::StatusOr<const NvJpegLibrary*> lib = NvJpegLibrary::Load();
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(lib.status()), StartsWith("GPU JPEG decode is off: cannot load "
                                            "FERRY_NVJPEG_LIBRARY=/nonexistent/ferry-test/"
                                            "libnvjpeg.so.13 ("));
  EXPECT_THAT(Msg(lib.status()), HasSubstr("No such file"));
  // Loaded once: the second call gives the same answer.
  EXPECT_EQ(NvJpegLibrary::Load().status(), lib.status());
}

TEST(NvJpegLibrary, NotFoundSaysWhatWasTriedAndWhatToInstall) {
  NvJpegSearch s;
  s.names = {"libferry-absent-nvjpeg.so.13", "libferry-absent-nvjpeg.so.12"};
  s.directories = {"/nonexistent/cuda/lib64"};
  absl::StatusOr<std::unique_ptr<NvJpegLibrary>> lib = NvJpegLibrary::Open(s);
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(lib.status()),
              StartsWith("GPU JPEG decode is off: libferry-absent-nvjpeg.so.13 not found (tried "
                         "libferry-absent-nvjpeg.so.13, libferry-absent-nvjpeg.so.12 on the "
                         "loader's path and in /nonexistent/cuda/lib64; first error: "));
  EXPECT_THAT(Msg(lib.status()), HasSubstr("install CUDA's nvJPEG"));
  EXPECT_THAT(Msg(lib.status()), HasSubstr("libnvjpeg-13-0"));
}

// Wherever this runs: either a real nvJPEG is found by the default search, or the message is
// the one ferryd status shows.
TEST(NvJpegLibrary, DefaultSearchLoadsOrSaysWhy) {
  NvJpegSearch s = NvJpegSearch::FromEnvironment();
  s.override_path.clear();
  absl::StatusOr<std::unique_ptr<NvJpegLibrary>> lib = NvJpegLibrary::Open(s);
  if (lib.ok()) {
    ExpectEverythingResolved(**lib);
    EXPECT_GE((*lib)->major_version(), 11) << (*lib)->path();
    return;
  }
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(lib.status()),
              StartsWith("GPU JPEG decode is off: libnvjpeg.so.13 not found (tried "
                         "libnvjpeg.so.13, libnvjpeg.so.12, libnvjpeg.so.11, libnvjpeg.so on the "
                         "loader's path and in /usr/local/cuda/lib64, "
                         "/usr/local/cuda/targets/x86_64-linux/lib"));
}

TEST(NvJpegLibrary, ResolvesEveryFunctionAndReadsTheVersion) {
  absl::StatusOr<std::unique_ptr<NvJpegLibrary>> lib =
      NvJpegLibrary::Open(OnlyFile(FERRY_FAKE_NVJPEG_FULL));
  ASSERT_TRUE(lib.ok()) << lib.status();
  ExpectEverythingResolved(**lib);
  EXPECT_NE((*lib)->nvjpegGetHardwareDecoderInfo, nullptr);
  EXPECT_NE((*lib)->nvjpegDecodeBatchedPreAllocate, nullptr);
  EXPECT_EQ((*lib)->version(), "99.1.2");
  EXPECT_EQ((*lib)->major_version(), 99);
  EXPECT_EQ((*lib)->path(), FERRY_FAKE_NVJPEG_FULL);
}

TEST(NvJpegLibrary, HardwareDecoderInfoIsOptional) {
  absl::StatusOr<std::unique_ptr<NvJpegLibrary>> lib =
      NvJpegLibrary::Open(OnlyFile(FERRY_FAKE_NVJPEG_OLD));
  ASSERT_TRUE(lib.ok()) << lib.status();
  ExpectEverythingResolved(**lib);
  EXPECT_EQ((*lib)->nvjpegGetHardwareDecoderInfo, nullptr);
  EXPECT_EQ((*lib)->nvjpegDecodeBatchedPreAllocate, nullptr);
}

TEST(NvJpegLibrary, MissingFunctionIsNamed) {
  absl::StatusOr<std::unique_ptr<NvJpegLibrary>> lib =
      NvJpegLibrary::Open(OnlyFile(FERRY_FAKE_NVJPEG_INCOMPLETE));
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(lib.status()),
              StartsWith(std::string("GPU JPEG decode is off: ") + FERRY_FAKE_NVJPEG_INCOMPLETE +
                         " (nvJPEG 99.1.2) lacks nvjpegDecodeBatchedSupported;"));
}

TEST(NvJpegLibrary, SearchTakesTheFirstCompleteLibrary) {
  NvJpegSearch s;
  s.names = {"libferry-absent-nvjpeg.so.13", FERRY_FAKE_NVJPEG_INCOMPLETE, FERRY_FAKE_NVJPEG_FULL};
  absl::StatusOr<std::unique_ptr<NvJpegLibrary>> lib = NvJpegLibrary::Open(s);
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_EQ((*lib)->path(), FERRY_FAKE_NVJPEG_FULL);
  // Only an incomplete one: its error, not "not found".
  s.names = {"libferry-absent-nvjpeg.so.13", FERRY_FAKE_NVJPEG_INCOMPLETE};
  lib = NvJpegLibrary::Open(s);
  ASSERT_FALSE(lib.ok());
  EXPECT_THAT(Msg(lib.status()), HasSubstr("lacks nvjpegDecodeBatchedSupported"));
}

TEST(NvJpegLibrary, RealLibraryResolvesEverything) {
  const char* path = std::getenv("FERRY_NVJPEG_CHECK_LIBRARY");
  if (path == nullptr) GTEST_SKIP() << "set FERRY_NVJPEG_CHECK_LIBRARY=/path/to/libnvjpeg.so.N";
  absl::StatusOr<std::unique_ptr<NvJpegLibrary>> lib = NvJpegLibrary::Open(OnlyFile(path));
  ASSERT_TRUE(lib.ok()) << lib.status();
  ExpectEverythingResolved(**lib);
  EXPECT_NE((*lib)->nvjpegGetHardwareDecoderInfo, nullptr);
  EXPECT_GE((*lib)->major_version(), 11);
  std::printf("%s: nvJPEG %s, every function resolved\n", path, (*lib)->version().c_str());
}

TEST(NvJpegStatus, NamesAndCodes) {
  EXPECT_TRUE(NvJpegStatus(0, "nvjpegDecodeBatched").ok());
  const absl::Status bad = NvJpegStatus(3, "nvjpegDecodeBatched", "4 images on device 0");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(),
            "nvjpegDecodeBatched(4 images on device 0): NVJPEG_STATUS_BAD_JPEG (corrupt or "
            "unreadable JPEG data)");
  EXPECT_EQ(NvJpegStatus(5, "nvjpegCreateEx").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(NvJpegStatus(4, "x").code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(NvJpegStatus(7, "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(NvJpegStatus(10, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NvJpegStatus(6, "x").code(), absl::StatusCode::kInternal);
  const absl::Status unknown = NvJpegStatus(42, "nvjpegDestroy");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Msg(unknown), StartsWith("nvjpegDestroy: NVJPEG_STATUS_42 ("));
  for (int s = 1; s <= 10; ++s) {
    EXPECT_THAT(NvJpegStatusName(s), ::testing::Not(::testing::ContainsRegex("_STATUS_[0-9]")))
        << s;
  }
  EXPECT_EQ(NvJpegStatusName(9), "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED");
}

TEST(GpuJpegDecoder, RefusesAnEmptyBatchSizeBeforeTouchingADevice) {
  absl::StatusOr<std::unique_ptr<NvJpegLibrary>> lib =
      NvJpegLibrary::Open(OnlyFile(FERRY_FAKE_NVJPEG_FULL));
  ASSERT_TRUE(lib.ok()) << lib.status();
  absl::StatusOr<GpuJpegDecoder> decoder = GpuJpegDecoder::Create(**lib, 0, 0, {});
  ASSERT_FALSE(decoder.ok());
  EXPECT_EQ(decoder.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(decoder.status()), HasSubstr("batch size 0 must be at least 1"));
}

TEST(GpuJpegDecoder, FakeLibraryFailsCreateWithNvJpegsStatus) {
  absl::StatusOr<std::unique_ptr<NvJpegLibrary>> lib =
      NvJpegLibrary::Open(OnlyFile(FERRY_FAKE_NVJPEG_FULL));
  ASSERT_TRUE(lib.ok()) << lib.status();
  absl::StatusOr<int> devices = DeviceCount();
  absl::StatusOr<GpuJpegDecoder> decoder = GpuJpegDecoder::Create(**lib, 0, 8, {});
  ASSERT_FALSE(decoder.ok());
  if (!devices.ok() || *devices == 0) {
    // No device: refused before nvJPEG is called.
    EXPECT_TRUE(decoder.status().code() == absl::StatusCode::kFailedPrecondition ||
                decoder.status().code() == absl::StatusCode::kInvalidArgument)
        << decoder.status();
    return;
  }
  // The stand-in refuses both backends; the CUDA backend's refusal is the answer.
  EXPECT_EQ(decoder.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(Msg(decoder.status()),
              StartsWith("nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT on device 0): "
                         "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED"));
}

}  // namespace
}  // namespace ferry
