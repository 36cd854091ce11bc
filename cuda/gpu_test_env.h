// For ferry's GPU tests: whether this machine can run them, and why not, and the
// assertions they share. Tests labelled
// `gpu` call FERRY_SKIP_WITHOUT_GPU() first, so they pass as "skipped, with the reason" on
// CI machines that have the CUDA toolkit but no device.
//
//   TEST(Transport, Copies) {
//     FERRY_SKIP_WITHOUT_GPU();
//     ...
//   }
#ifndef FERRY_CUDA_GPU_TEST_ENV_H_
#define FERRY_CUDA_GPU_TEST_ENV_H_

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cuda/cuda_resources.h"
#include "gtest/gtest.h"

namespace ferry {

// Empty when there is at least one device; else a sentence saying why GPU tests skip.
inline std::string GpuSkipReason(const absl::StatusOr<int>& device_count) {
  if (!device_count.ok()) {
    return absl::StrCat("no usable CUDA driver: ", device_count.status().ToString());
  }
  if (*device_count <= 0) return "no CUDA device (cudaGetDeviceCount found 0)";
  return "";
}

}  // namespace ferry

#define FERRY_SKIP_WITHOUT_GPU()                                                           \
  do {                                                                                     \
    const std::string ferry_skip_reason_ = ::ferry::GpuSkipReason(::ferry::DeviceCount()); \
    if (!ferry_skip_reason_.empty()) GTEST_SKIP() << ferry_skip_reason_;                   \
  } while (0)

// Assertions the GPU tests share: a CUDA runtime call that must succeed, an absl::Status
// that must be OK, and the value of a StatusOr the test cannot go on without.
#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
#define ASSERT_OK(expr)                     \
  do {                                      \
    const absl::Status ferry_s_ = (expr);   \
    ASSERT_TRUE(ferry_s_.ok()) << ferry_s_; \
  } while (0)

namespace ferry {

template <typename T>
T ValueOrDie(absl::StatusOr<T> v) {
  if (!v.ok()) {
    ADD_FAILURE() << v.status();
    std::abort();
  }
  return std::move(v).value();
}

}  // namespace ferry

#endif  // FERRY_CUDA_GPU_TEST_ENV_H_
