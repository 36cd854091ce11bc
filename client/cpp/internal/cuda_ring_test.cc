// The GPU transport's failure paths, which need no device: a build without CUDA, a machine
// without a GPU, a GPU the process cannot see, IPC handles that do not open. Each must fail
// at attach, fast, with FAILED_PRECONDITION naming the cause. On a GPU machine the same
// tests exercise the real CUDA calls.
#include "client/cpp/internal/cuda_ring.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace internal {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

CudaRingSpec GarbageSpec(std::string pci_bus_id) {
  CudaRingSpec spec;
  spec.daemon_device = 0;
  spec.pci_bus_id = std::move(pci_bus_id);
  spec.slot_bytes = 1 << 20;
  spec.mem_handles = {std::string(64, '\x5a'), std::string(64, '\x5a')};
  spec.ready_events = {std::string(64, '\x33'), std::string(64, '\x33')};
  spec.released_events = {std::string(64, '\x44'), std::string(64, '\x44')};
  return spec;
}

// Whether this process has a CUDA device (and this build has CUDA).
bool HaveDevice() { return CudaPciBusId(0).ok(); }

TEST(CudaRingTest, WithoutCudaOrDeviceOpenIsFailedPrecondition) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is visible; covered by the tests below";
  const absl::Time start = absl::Now();
  auto ring = CudaRing::Open(GarbageSpec("0000:3b:00.0"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_FALSE(ring.ok());
  EXPECT_EQ(ring.status().code(), absl::StatusCode::kFailedPrecondition) << ring.status();
  if (BuiltWithCuda()) {
    EXPECT_THAT(ring.status().message(), HasSubstr("0000:3b:00.0"));
    EXPECT_THAT(ring.status().message(), HasSubstr("no usable CUDA device"));
    EXPECT_THAT(ring.status().message(), HasSubstr("cudaGetDeviceCount"));
  } else {
    EXPECT_THAT(ring.status().message(), HasSubstr("this libferry was built without CUDA"));
  }
}

TEST(CudaRingTest, PciBusIdWithoutDeviceIsFailedPrecondition) {
  if (HaveDevice()) GTEST_SKIP() << "a CUDA device is visible";
  auto id = ferry::CudaPciBusId(0);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition) << id.status();
  EXPECT_THAT(id.status().message(),
              AnyOf(HasSubstr("cudaGetDeviceCount"), HasSubstr("built without CUDA")));
}

TEST(CudaRingTest, PciBusIdOfMissingOrdinalIsInvalidArgument) {
  if (!HaveDevice()) GTEST_SKIP() << "needs a CUDA device: " << CudaPciBusId(0).status();
  auto id = ferry::CudaPciBusId(1000);
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << id.status();
  auto zero = ferry::CudaPciBusId(0);
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->size(), 12u) << *zero;  // "0000:3b:00.0"
  EXPECT_EQ(*zero, absl::AsciiStrToLower(*zero));
}

TEST(CudaRingTest, InvisibleGpuIsFailedPrecondition) {
  if (!HaveDevice()) GTEST_SKIP() << "needs a CUDA device: " << CudaPciBusId(0).status();
  auto ring = CudaRing::Open(GarbageSpec("0000:fe:1f.0"));
  ASSERT_FALSE(ring.ok());
  EXPECT_EQ(ring.status().code(), absl::StatusCode::kFailedPrecondition) << ring.status();
  EXPECT_THAT(ring.status().message(), HasSubstr("cannot see"));
  EXPECT_THAT(ring.status().message(), HasSubstr("CUDA_VISIBLE_DEVICES"));
}

TEST(CudaRingTest, BadIpcHandleFailsFastNamingTheCall) {
  if (!HaveDevice()) GTEST_SKIP() << "needs a CUDA device: " << CudaPciBusId(0).status();
  const absl::Time start = absl::Now();
  auto ring = CudaRing::Open(GarbageSpec(*CudaPciBusId(0)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  ASSERT_FALSE(ring.ok());
  EXPECT_EQ(ring.status().code(), absl::StatusCode::kFailedPrecondition) << ring.status();
  EXPECT_THAT(ring.status().message(), HasSubstr("cudaIpcOpenMemHandle"));
  EXPECT_THAT(ring.status().message(), HasSubstr("IPC namespace"));
}

TEST(CudaRingTest, MismatchedHandleCountsAreInternal) {
  CudaRingSpec spec = GarbageSpec("0000:3b:00.0");
  spec.ready_events.pop_back();
  auto ring = CudaRing::Open(spec);
  ASSERT_FALSE(ring.ok());
  if (BuiltWithCuda()) {
    EXPECT_EQ(ring.status().code(), absl::StatusCode::kInternal) << ring.status();
  }
  // An older ferryd sends no released events (the trainer exported its own then).
  spec = GarbageSpec("0000:3b:00.0");
  spec.released_events.clear();
  ring = CudaRing::Open(spec);
  ASSERT_FALSE(ring.ok());
  if (BuiltWithCuda()) {
    EXPECT_EQ(ring.status().code(), absl::StatusCode::kInternal) << ring.status();
    EXPECT_THAT(ring.status().message(), HasSubstr("released events"));
  }
}

}  // namespace
}  // namespace internal
}  // namespace ferry
