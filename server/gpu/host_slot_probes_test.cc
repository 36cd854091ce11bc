// HostSlotProbes with a probe the test controls: it records which slots it probed and can
// be held inside a probe until the test lets it go, so that each ordering of the probe
// thread against Queue, Take and Forget is made to happen, not hoped for.
#include "server/gpu/host_slot_probes.h"

#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;

// A probe that answers each row with a verdict naming the slot (width) and row (height),
// and that the test may hold inside a call.
class TestProbe {
 public:
  std::vector<GpuJpegVerdict> operator()(int host_slot, uint32_t num_samples) {
    absl::MutexLock lock(&mutex_);
    probed_.push_back(host_slot);
    inside_ = host_slot;
    mutex_.Await(absl::Condition(
        +[](bool* held) { return !*held; }, &held_));
    inside_ = -1;
    std::vector<GpuJpegVerdict> verdicts(num_samples);
    for (uint32_t i = 0; i < num_samples; ++i) {
      verdicts[i].reason = GpuJpegReject::kNone;
      verdicts[i].width = host_slot;
      verdicts[i].height = static_cast<int>(i);
    }
    return verdicts;
  }
  void Hold() {
    absl::MutexLock lock(&mutex_);
    held_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mutex_);
    held_ = false;
  }
  // Waits until the probe thread is inside a call for `host_slot`.
  void AwaitInside(int host_slot) {
    absl::MutexLock lock(&mutex_);
    auto inside = [this, host_slot]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return inside_ == host_slot; };
    mutex_.Await(absl::Condition(&inside));
  }
  // Waits until `n` probes have been made and none is under way.
  void AwaitProbed(size_t n) {
    absl::MutexLock lock(&mutex_);
    auto started = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
      return probed_.size() >= n && inside_ == -1;
    };
    mutex_.Await(absl::Condition(&started));
  }
  std::vector<int> probed() {
    absl::MutexLock lock(&mutex_);
    return probed_;
  }

 private:
  absl::Mutex mutex_;
  std::vector<int> probed_ ABSL_GUARDED_BY(mutex_);
  int inside_ ABSL_GUARDED_BY(mutex_) = -1;
  bool held_ ABSL_GUARDED_BY(mutex_) = false;
};

HostSlotProbes::Probe Calling(TestProbe& probe) {
  return [&probe](int host_slot, uint32_t n) { return probe(host_slot, n); };
}

// Queues `host_slot` (`n` rows) and returns once the probe thread is held inside its probe.
void QueueAndHold(HostSlotProbes& probes, TestProbe& probe, int host_slot, uint32_t n) {
  probe.Hold();
  probes.Queue(host_slot, n);
  probe.AwaitInside(host_slot);
}

TEST(HostSlotProbesTest, AQueuedBatchIsProbedOnTheThreadAndTakenWithItsVerdicts) {
  TestProbe probe;
  HostSlotProbes probes(Calling(probe), "test");
  probes.Queue(3, 2);
  probes.Queue(1, 4);
  probe.AwaitProbed(2);  // a Take waits for a probe it finds under way
  std::optional<std::vector<GpuJpegVerdict>> three = probes.Take(3);
  ASSERT_TRUE(three.has_value());
  ASSERT_EQ(three->size(), 2u);
  EXPECT_EQ((*three)[1].width, 3);
  EXPECT_EQ((*three)[1].height, 1);
  std::optional<std::vector<GpuJpegVerdict>> one = probes.Take(1);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->size(), 4u);
  EXPECT_THAT(probe.probed(), ElementsAre(3, 1));  // in fill order
  // Taken once: the slot's verdicts are gone until it is queued again.
  EXPECT_FALSE(probes.Take(3).has_value());
  EXPECT_EQ(probes.taken_ready(), 2);
  EXPECT_EQ(probes.taken_unprobed(), 1);
}

TEST(HostSlotProbesTest, ATakeWhileTheThreadProbesTheSlotWaitsForItsVerdicts) {
  TestProbe probe;
  HostSlotProbes probes(Calling(probe), "test");
  QueueAndHold(probes, probe, 0, 3);
  std::optional<std::vector<GpuJpegVerdict>> taken;
  std::thread taker([&] { taken = probes.Take(0); });
  probe.Release();  // whenever the taker got to wait, it returns only after the probe
  taker.join();
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->size(), 3u);
}

TEST(HostSlotProbesTest, ASlotTakenBeforeTheThreadReachesItLeavesTheQueueUnprobed) {
  TestProbe probe;
  HostSlotProbes probes(Calling(probe), "test");
  // The thread is busy with slot 0; slots 1 and 2 wait in the queue.
  QueueAndHold(probes, probe, 0, 1);
  probes.Queue(1, 1);
  probes.Queue(2, 1);
  EXPECT_FALSE(probes.Take(1).has_value());  // the caller probes it itself
  probes.Forget(2);                          // dropped by a seek
  probe.Release();
  EXPECT_TRUE(probes.Take(0).has_value());
  // Queued again after its take: probed again, with the new batch's size.
  probes.Queue(1, 5);
  probe.AwaitProbed(2);  // a Take waits for a probe it finds under way
  std::optional<std::vector<GpuJpegVerdict>> again = probes.Take(1);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->size(), 5u);
  EXPECT_THAT(probe.probed(), ElementsAre(0, 1));  // never 2, nor the first 1
}

TEST(HostSlotProbesTest, ForgetWaitsForTheProbeOfItsSlotAndDropsIt) {
  TestProbe probe;
  HostSlotProbes probes(Calling(probe), "test");
  QueueAndHold(probes, probe, 4, 2);
  std::thread forgetter([&] { probes.Forget(4); });
  probe.Release();
  forgetter.join();  // returns only once the thread no longer reads slot 4
  EXPECT_FALSE(probes.Take(4).has_value());
}

TEST(HostSlotProbesTest, DestroyingItWhileItProbesJoinsAfterThatProbeAndDropsTheQueue) {
  TestProbe probe;
  {
    HostSlotProbes probes(Calling(probe), "test");
    QueueAndHold(probes, probe, 0, 1);
    probes.Queue(1, 1);
    probe.Release();
  }  // joins: slot 0's probe ends; slot 1 may or may not have started before the quit
  EXPECT_EQ(probe.probed().front(), 0);
}

}  // namespace
}  // namespace ferry
