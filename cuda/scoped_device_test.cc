// ScopedDevice's contract, on fake devices (the DeviceCalls seam; no GPU needed, runs in
// CI): a scope makes its device current and puts back exactly what the thread had, a
// context of another device or none at all, on any number of threads at once. The real
// driver's side is covered by the GPU tests (tests/gpu/test_multi_gpu.py).
#include "cuda/scoped_device.h"

#include <array>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

constexpr int kDevices = 4;

// Per-thread fake driver state: the current context (a device's primary context, or
// none), and how many times this thread bound each device's context.
std::array<char, kDevices> contexts;  // their addresses are the fake contexts
thread_local void* current = nullptr;
thread_local std::array<int, kDevices> bound{};
std::atomic<bool> fail_set_device{false};

int DeviceOf(void* context) { return static_cast<int>(static_cast<char*>(context) - &contexts[0]); }

const DeviceCalls kFakeCalls = {
    [](void** context) {
      *context = current;
      return true;
    },
    [](void* context) {
      current = context;
      return true;
    },
    [](int* device) {
      // As the runtime: device 0 when no context is current (and none is made).
      *device = current == nullptr ? 0 : DeviceOf(current);
      return cudaSuccess;
    },
    [](int device) {
      if (fail_set_device.load() || device < 0 || device >= kDevices) {
        return cudaErrorInvalidDevice;
      }
      current = &contexts[device];
      ++bound[device];
      return cudaSuccess;
    },
};

class ScopedDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetDeviceCallsForTesting(&kFakeCalls);
    current = nullptr;
    bound = {};
  }
  void TearDown() override { SetDeviceCallsForTesting(nullptr); }
};

TEST_F(ScopedDeviceTest, AThreadWithNoContextKeepsNone) {
  {
    ScopedDevice scope(1);
    ASSERT_TRUE(scope.status().ok()) << scope.status();
    EXPECT_EQ(current, &contexts[1]);
  }
  EXPECT_EQ(current, nullptr);  // not device 0's context, as cudaGetDevice's 0 would give
  EXPECT_EQ(bound[0], 0);
  EXPECT_EQ(bound[1], 1);
}

TEST_F(ScopedDeviceTest, AnotherDevicesContextIsPutBack) {
  current = &contexts[2];
  {
    ScopedDevice scope(3);
    EXPECT_EQ(current, &contexts[3]);
    {
      ScopedDevice inner(1);
      EXPECT_EQ(current, &contexts[1]);
    }
    EXPECT_EQ(current, &contexts[3]);
  }
  EXPECT_EQ(current, &contexts[2]);
}

TEST_F(ScopedDeviceTest, TheCurrentDeviceIsNotEnteredAgain) {
  current = &contexts[2];
  {
    ScopedDevice scope(2);
    EXPECT_TRUE(scope.status().ok());
    EXPECT_EQ(current, &contexts[2]);
  }
  EXPECT_EQ(current, &contexts[2]);
  EXPECT_EQ(bound[2], 0);
}

TEST_F(ScopedDeviceTest, AFailedEntryNamesTheDeviceAndChangesNothing) {
  current = &contexts[1];
  {
    ScopedDevice scope(kDevices);  // no such device
    EXPECT_EQ(scope.error(), cudaErrorInvalidDevice);
    EXPECT_NE(scope.status().message().find("device 4"), absl::string_view::npos) << scope.status();
    EXPECT_EQ(current, &contexts[1]);
  }
  EXPECT_EQ(current, &contexts[1]);
}

// Many threads, each with its own starting state (none, or some device's context), enter
// random devices in nested scopes at the same time: inside a scope its device is current,
// and after it the thread has what it had before.
TEST_F(ScopedDeviceTest, EveryThreadGetsBackWhatItHadWhileOthersSwitch) {
  constexpr int kThreads = 8;
  std::atomic<int> wrong{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &wrong, &go] {
      current = t % 3 == 0 ? nullptr : &contexts[t % kDevices];
      void* const start = current;
      std::mt19937 rng(t);
      while (!go.load()) {
      }
      for (int i = 0; i < 20000; ++i) {
        const int outer = static_cast<int>(rng() % kDevices);
        const int inner = static_cast<int>(rng() % kDevices);
        {
          ScopedDevice a(outer);
          if (current != &contexts[outer]) ++wrong;
          {
            ScopedDevice b(inner);
            if (current != &contexts[inner]) ++wrong;
          }
          if (current != &contexts[outer]) ++wrong;
        }
        if (current != start) ++wrong;
      }
    });
  }
  go.store(true);
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace ferry
