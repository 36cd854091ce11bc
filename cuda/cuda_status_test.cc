// What of ferry_cuda needs no device: the CUDA error -> Status mapping, the owners'
// argument checks that fail before any CUDA call, and the GPU tests' skip decision. Runs in
// CI.
#include "cuda/cuda_status.h"

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "cuda/cuda_resources.h"
#include "cuda/gpu_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

TEST(CudaStatus, SuccessIsOk) { EXPECT_TRUE(CudaStatus(cudaSuccess, "cudaMalloc").ok()); }

TEST(CudaStatus, NamesTheCallTheDetailAndTheError) {
  const absl::Status status =
      CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc", "1024 bytes on device 0");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(status.message(),
            "cudaMalloc(1024 bytes on device 0): cudaErrorMemoryAllocation (out of memory)");
}

TEST(CudaStatus, WithoutDetail) {
  const absl::Status status = CudaStatus(cudaErrorInvalidValue, "cudaMemcpyAsync");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("cudaMemcpyAsync: cudaErrorInvalidValue ("));
}

TEST(CudaStatus, CanonicalCodes) {
  EXPECT_EQ(CudaErrorCode(cudaErrorMemoryAllocation), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaErrorCode(cudaErrorInvalidDevice), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaErrorCode(cudaErrorNoDevice), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaErrorCode(cudaErrorInsufficientDriver), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaErrorCode(cudaErrorMapBufferObjectFailed), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaErrorCode(cudaErrorHostMemoryAlreadyRegistered), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(CudaErrorCode(cudaErrorNotReady), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaErrorCode(cudaErrorIllegalAddress), absl::StatusCode::kInternal);
  EXPECT_EQ(CudaErrorCode(cudaErrorLaunchFailure), absl::StatusCode::kInternal);
}

TEST(CudaStatus, UnknownCodeStillReadable) {
  const absl::Status status = CudaStatus(static_cast<cudaError_t>(98765), "cudaFoo");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("cudaFoo: "));
}

TEST(GpuSkipReason, SaysWhy) {
  EXPECT_EQ(GpuSkipReason(2), "");
  EXPECT_THAT(GpuSkipReason(0), HasSubstr("no CUDA device"));
  const std::string reason =
      GpuSkipReason(CudaStatus(cudaErrorInsufficientDriver, "cudaGetDeviceCount"));
  EXPECT_THAT(reason, HasSubstr("no usable CUDA driver"));
  EXPECT_THAT(reason, HasSubstr("cudaGetDeviceCount: cudaErrorInsufficientDriver"));
}

// On a machine without a GPU this is the path every `gpu` test takes; on one with a GPU
// it counts it. Either way it must not crash.
TEST(DeviceCount, CountsOrExplains) {
  const absl::StatusOr<int> count = DeviceCount();
  if (count.ok()) {
    EXPECT_GE(*count, 0);
  } else {
    EXPECT_EQ(count.status().code(), absl::StatusCode::kFailedPrecondition) << count.status();
    EXPECT_THAT(count.status().message(), HasSubstr("cudaGetDeviceCount"));
  }
  std::cout << "GPU tests here: "
            << (GpuSkipReason(count).empty() ? "run" : "skip: " + GpuSkipReason(count)) << "\n";
}

TEST(Owners, RejectEmptyRequestsBeforeTouchingCuda) {
  EXPECT_EQ(DeviceBuffer::Create(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostRegistration::Create(0, nullptr, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
