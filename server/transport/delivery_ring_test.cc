// HostRing and DeviceRing alone, against a fake DeviceStage that records what it is asked
// and reports only when the test says so. RankPipeline's use of them is tested in
// server/pipeline/pipeline_test.cc.
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/transport/device_ring.h"
#include "server/transport/device_stage.h"
#include "server/transport/host_ring.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(HostRingTest, AFilledBatchIsLeasedInItsHostSlotAndFreedByItsRelease) {
  HostRing ring(/*num_host_slots=*/3, /*slab_bytes=*/3000);
  EXPECT_EQ(ring.num_slots(), 3);
  ring.Enqueue({.ticket = 0, .host_slot = 2, .num_samples = 4});
  EXPECT_EQ(ring.TakeReady(0, /*seq=*/0), std::nullopt);  // still filling
  ring.Filled(0);
  EXPECT_EQ(ring.TakeReady(0, 0), std::optional<uint32_t>(2));
  EXPECT_EQ(ring.leased(), 1);
  std::vector<int> freed;
  EXPECT_EQ(ring.Release(2, /*seq=*/1, false, &freed).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(freed, IsEmpty());
  EXPECT_TRUE(ring.Release(2, 0, false, &freed).ok());
  EXPECT_THAT(freed, ElementsAre(2));
  EXPECT_EQ(ring.leased(), 0);
  ferry::v1::AttachResponse response;
  ring.Describe(&response);
  EXPECT_EQ(response.host().slab_bytes(), 3000u);
}

TEST(HostRingTest, ASeekFreesFilledBatchesAndAClosedConsumerItsLeases) {
  HostRing ring(3, 3000);
  ring.Enqueue({.ticket = 0, .host_slot = 0});
  ring.Enqueue({.ticket = 1, .host_slot = 1});
  ring.Enqueue({.ticket = 2, .host_slot = 2});
  ring.Filled(0);
  ring.Filled(2);
  ASSERT_TRUE(ring.TakeReady(0, 0).has_value());
  std::vector<int> freed;
  ring.DropQueued(&freed);  // slot 1 is still being filled: the pipeline's to free
  EXPECT_THAT(freed, ElementsAre(2));
  freed.clear();
  ring.CloseConsumer(&freed);
  EXPECT_THAT(freed, ElementsAre(0));
  EXPECT_EQ(ring.OpenConsumer({"event"}).code(), absl::StatusCode::kInvalidArgument);
}

// Copies are recorded, not run; reports come when the test calls Complete / Released.
class RecordingStage final : public DeviceStage {
 public:
  struct Copy {
    int host_slot, device_slot;
    uint64_t token;
  };
  explicit RecordingStage(int slots) : slots_(slots) {}
  int num_device_slots() const override { return slots_; }
  void SetCallbacks(Callbacks callbacks) override { callbacks_ = std::move(callbacks); }
  absl::Status StartCopy(int host_slot, int device_slot, uint32_t, bool, uint64_t token) override {
    if (on_start_copy) on_start_copy();
    if (!fail.ok()) return fail;
    copies.push_back({host_slot, device_slot, token});
    return absl::OkStatus();
  }
  void WatchReleased(int device_slot, uint64_t token) override {
    watched.emplace_back(device_slot, token);
  }
  void Describe(ferry::v1::AttachResponse* response) const override {
    response->set_slot_bytes(4096);
  }
  void BatchFilled(int host_slot, uint32_t num_samples) override {
    filled.emplace_back(host_slot, num_samples);
  }
  void BatchDropped(int host_slot) override { dropped.push_back(host_slot); }
  // A decoder that takes every other batch, and remembers the waits it was told of.
  bool PlanGpuDecode() override { return decodes && planned++ % 2 == 0; }
  void ReportConsumerWait(absl::Duration waited, absl::Duration interval) override {
    waits.emplace_back(waited, interval);
  }
  absl::Status OpenConsumer(const std::vector<std::string>&) override { return absl::OkStatus(); }
  void CloseConsumer() override { watched.clear(); }

  // The copy of copies[i] is done: the host slot first, then the device slot.
  void Complete(size_t i) {
    callbacks_.host_slot_free(copies[i].host_slot);
    callbacks_.device_slot_ready(copies[i].device_slot, copies[i].token);
  }
  void Released(size_t i) { callbacks_.device_slot_released(watched[i].first, watched[i].second); }

  const int slots_;
  Callbacks callbacks_;
  std::vector<Copy> copies;
  std::vector<std::pair<int, uint64_t>> watched;
  std::vector<std::pair<int, uint32_t>> filled;  // BatchFilled's (host slot, samples)
  std::vector<int> dropped;                      // BatchDropped's host slots
  absl::Status fail;
  std::function<void()> on_start_copy;
  bool decodes = false;
  int planned = 0;
  std::vector<std::pair<absl::Duration, absl::Duration>> waits;
};

class DeviceRingTest : public ::testing::Test {
 protected:
  void Make(int device_slots) {
    auto stage = std::make_unique<RecordingStage>(device_slots);
    stage_ = stage.get();
    ring_ = std::make_unique<DeviceRing>(std::move(stage));
    DeliveryRing::Listener listener;
    listener.host_slot_free = [this](int slot) { host_slots_freed_.push_back(slot); };
    listener.progress = [this] { ++progress_; };
    ring_->SetListener(std::move(listener));
  }

  RecordingStage* stage_ = nullptr;
  std::unique_ptr<DeviceRing> ring_;
  std::vector<int> host_slots_freed_;
  int progress_ = 0;
};

TEST_F(DeviceRingTest, ABatchIsDeliveredFromItsDeviceSlotOnceTheCopyIsDone) {
  Make(2);
  ring_->Enqueue({.ticket = 7, .host_slot = 3, .num_samples = 4});
  ring_->Filled(7);
  ASSERT_TRUE(ring_->Flush().ok());
  ASSERT_EQ(stage_->copies.size(), 1u);
  EXPECT_EQ(stage_->copies[0].host_slot, 3);
  EXPECT_EQ(ring_->TakeReady(7, 0), std::nullopt);  // copy still running
  stage_->Complete(0);
  EXPECT_THAT(host_slots_freed_, ElementsAre(3));
  EXPECT_EQ(progress_, 1);
  const std::optional<uint32_t> slot = ring_->TakeReady(7, 0);
  ASSERT_TRUE(slot.has_value());
  EXPECT_EQ(*slot, static_cast<uint32_t>(stage_->copies[0].device_slot));
  ferry::v1::AttachResponse response;
  ring_->Describe(&response);
  EXPECT_EQ(response.slot_bytes(), 4096u);
}

// What the device does to a batch reaches the pipeline only as the ring's plan: a host ring
// plans nothing, a device ring the decode its stage asks for, batch by batch; the
// trainer's waits go to the stage.
TEST_F(DeviceRingTest, TheStagesDecoderDecidesTheBatchPlanAndHearsTheTrainersWaits) {
  HostRing host(2, 2000);
  EXPECT_FALSE(host.PlanBatch().gpu_decode);
  EXPECT_FALSE(host.PlanBatch().gather);
  Make(2);
  EXPECT_FALSE(ring_->PlanBatch().gpu_decode);  // a stage without a decoder
  stage_->decodes = true;
  std::vector<bool> plans;
  for (int b = 0; b < 4; ++b) {
    const DeliveryRing::BatchPlan plan = ring_->PlanBatch();
    plans.push_back(plan.gpu_decode);
    EXPECT_FALSE(plan.gather);  // no gathered field
  }
  EXPECT_THAT(plans, ElementsAre(true, false, true, false));
  ring_->ReportConsumerWait(absl::Milliseconds(3), absl::Milliseconds(40));
  ASSERT_EQ(stage_->waits.size(), 1u);
  EXPECT_EQ(stage_->waits[0].first, absl::Milliseconds(3));
  EXPECT_EQ(stage_->waits[0].second, absl::Milliseconds(40));
}

// A released device slot is written again only once its released signal is reported.
TEST_F(DeviceRingTest, AReleasedSlotIsReusedOnlyAfterItsSignal) {
  Make(1);
  ring_->Enqueue({.ticket = 0, .host_slot = 0});
  ring_->Enqueue({.ticket = 1, .host_slot = 1});
  ring_->Filled(0);
  ring_->Filled(1);
  ASSERT_TRUE(ring_->Flush().ok());
  stage_->Complete(0);
  ASSERT_TRUE(ring_->TakeReady(0, 0).has_value());
  std::vector<int> freed;
  EXPECT_EQ(ring_->Release(0, /*seq=*/5, false, &freed).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ring_->Release(0, 0, false, &freed).ok());
  EXPECT_THAT(freed, IsEmpty());
  ASSERT_TRUE(ring_->Flush().ok());
  EXPECT_EQ(stage_->copies.size(), 1u);  // slot 0 is releasing
  stage_->Released(0);
  ASSERT_TRUE(ring_->Flush().ok());
  ASSERT_EQ(stage_->copies.size(), 2u);
  EXPECT_EQ(stage_->copies[1].host_slot, 1);
}

// A filled batch overtakes an earlier one still filling only while a free device slot
// stays for the earlier one.
TEST_F(DeviceRingTest, AFilledBatchOvertakesAStragglerOnlyWhileASlotStaysForIt) {
  Make(2);
  for (uint64_t t = 0; t < 3; ++t) ring_->Enqueue({.ticket = t, .host_slot = int(t)});
  ring_->Filled(1);
  ring_->Filled(2);
  ASSERT_TRUE(ring_->Flush().ok());
  ASSERT_EQ(stage_->copies.size(), 1u);  // batch 1; batch 2 would take batch 0's slot
  EXPECT_EQ(stage_->copies[0].host_slot, 1);
  ring_->Filled(0);
  ASSERT_TRUE(ring_->Flush().ok());
  ASSERT_EQ(stage_->copies.size(), 2u);
  EXPECT_EQ(stage_->copies[1].host_slot, 0);
}

// The stage hears of each filled batch as it fills, before a device slot is free for its
// copy (so that it can prepare the copy), and of each filled batch a seek drops before its
// copy, before the pipeline may refill that host slot.
TEST_F(DeviceRingTest, TheStageHearsOfFilledBatchesBeforeTheirCopiesAndOfDroppedOnes) {
  Make(1);
  ring_->Enqueue({.ticket = 0, .host_slot = 4, .num_samples = 8});
  ring_->Enqueue({.ticket = 1, .host_slot = 5, .num_samples = 3});
  ring_->Enqueue({.ticket = 2, .host_slot = 6, .num_samples = 2});
  EXPECT_THAT(stage_->filled, IsEmpty());
  ring_->Filled(0);
  ring_->Filled(1);  // no device slot left for it
  ASSERT_TRUE(ring_->Flush().ok());
  ASSERT_EQ(stage_->copies.size(), 1u);
  EXPECT_THAT(stage_->filled, ElementsAre(std::pair(4, 8u), std::pair(5, 3u)));
  std::vector<int> freed;
  ring_->DropQueued(&freed);
  EXPECT_THAT(freed, ElementsAre(5));
  EXPECT_THAT(stage_->dropped, ElementsAre(5));  // not 4 (being copied) nor 6 (not filled)
}

TEST_F(DeviceRingTest, ASeekFreesDeviceSlotsAndIgnoresTheAbandonedCopysReport) {
  Make(2);
  ring_->Enqueue({.ticket = 0, .host_slot = 0});
  ring_->Enqueue({.ticket = 1, .host_slot = 1});
  ring_->Enqueue({.ticket = 2, .host_slot = 2});
  ring_->Filled(0);
  ring_->Filled(1);
  ring_->Filled(2);  // no device slot left for it
  ASSERT_TRUE(ring_->Flush().ok());
  ASSERT_EQ(stage_->copies.size(), 2u);
  std::vector<int> freed;
  ring_->DropQueued(&freed);
  EXPECT_THAT(freed, ElementsAre(2));  // the copied ones come back through host_slot_free
  stage_->Complete(0);                 // the abandoned copy's report
  EXPECT_THAT(host_slots_freed_, ElementsAre(0));
  ring_->Enqueue({.ticket = 3, .host_slot = 2});
  ring_->Filled(3);
  ASSERT_TRUE(ring_->Flush().ok());
  ASSERT_EQ(stage_->copies.size(), 3u);
  EXPECT_EQ(ring_->TakeReady(3, 0), std::nullopt);  // the old report made nothing ready
  stage_->Complete(2);
  EXPECT_TRUE(ring_->TakeReady(3, 0).has_value());
}

TEST_F(DeviceRingTest, AFailedCopyStopsTheRingWithTheReason) {
  Make(2);
  stage_->fail = absl::InternalError("cudaMemcpyAsync: an illegal memory access");
  ring_->Enqueue({.ticket = 0, .host_slot = 0});
  ring_->Filled(0);
  const absl::Status s = ring_->Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("copy to the GPU failed: cudaMemcpyAsync"));
  stage_->fail = absl::OkStatus();
  ring_->Enqueue({.ticket = 1, .host_slot = 1});
  ring_->Filled(1);
  EXPECT_TRUE(ring_->Flush().ok());
  EXPECT_THAT(stage_->copies, IsEmpty());  // stopped: nothing more starts
}

// StopDeviceWork waits for a copy another thread is starting; nothing starts after it.
TEST_F(DeviceRingTest, StopDeviceWorkWaitsForACopyBeingStarted) {
  Make(2);
  absl::Notification entered, go;
  stage_->on_start_copy = [&] {
    entered.Notify();
    go.WaitForNotification();
  };
  ring_->Enqueue({.ticket = 0, .host_slot = 0});
  ring_->Filled(0);
  std::thread flusher([&] { EXPECT_TRUE(ring_->Flush().ok()); });
  entered.WaitForNotification();
  absl::Notification stopped;
  std::thread stopper([&] {
    ring_->StopDeviceWork();
    stopped.Notify();
  });
  EXPECT_FALSE(stopped.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  go.Notify();
  stopper.join();
  flusher.join();
  EXPECT_TRUE(stopped.HasBeenNotified());
  stage_->on_start_copy = nullptr;
  ring_->Enqueue({.ticket = 1, .host_slot = 1});
  ring_->Filled(1);
  EXPECT_TRUE(ring_->Flush().ok());
  EXPECT_EQ(stage_->copies.size(), 1u);  // the one being started; none after
}

// A stage whose StartCopy waits for the device, by construction: each call blocks until the
// test lets it go (or fails it). Thread-safe, as the ring's copy thread calls it.
class WaitingStage final : public DeviceStage {
 public:
  int num_device_slots() const override { return 2; }
  bool start_copy_waits() const override { return true; }
  void SetCallbacks(Callbacks callbacks) override { callbacks_ = std::move(callbacks); }
  absl::Status StartCopy(int host_slot, int, uint32_t, bool, uint64_t) override {
    absl::MutexLock lock(&mutex_);
    ++started_;
    caller_ = std::this_thread::get_id();
    mutex_.Await(absl::Condition(
        +[](WaitingStage* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mutex_) { return s->go_ > s->done_; },
        this));
    ++done_;
    if (!fail_.ok()) return fail_;
    copied_.push_back(host_slot);
    return absl::OkStatus();
  }
  void WatchReleased(int, uint64_t) override {}
  void Describe(ferry::v1::AttachResponse*) const override {}
  absl::Status OpenConsumer(const std::vector<std::string>&) override { return absl::OkStatus(); }
  void CloseConsumer() override {}

  void Go(int copies, absl::Status fail = absl::OkStatus()) {
    absl::MutexLock lock(&mutex_);
    go_ += copies;
    fail_ = std::move(fail);
  }
  void AwaitStarted(int n) {
    absl::MutexLock lock(&mutex_);
    auto started = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return started_ >= n; };
    mutex_.Await(absl::Condition(&started));
  }
  void AwaitCopied(size_t n) {
    absl::MutexLock lock(&mutex_);
    auto copied = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return copied_.size() >= n; };
    mutex_.Await(absl::Condition(&copied));
  }
  std::vector<int> copied() {
    absl::MutexLock lock(&mutex_);
    return copied_;
  }
  std::thread::id caller() {
    absl::MutexLock lock(&mutex_);
    return caller_;
  }

 private:
  Callbacks callbacks_;
  absl::Mutex mutex_;
  int started_ ABSL_GUARDED_BY(mutex_) = 0;
  int done_ ABSL_GUARDED_BY(mutex_) = 0;
  int go_ ABSL_GUARDED_BY(mutex_) = 0;
  absl::Status fail_ ABSL_GUARDED_BY(mutex_);
  std::vector<int> copied_ ABSL_GUARDED_BY(mutex_);
  std::thread::id caller_ ABSL_GUARDED_BY(mutex_);
};

TEST(DeviceRingCopyThreadTest, FlushReturnsWhileAStageThatWaitsCopiesOnTheRingsThread) {
  auto owned = std::make_unique<WaitingStage>();
  WaitingStage* stage = owned.get();
  DeviceRing ring(std::move(owned));
  ring.SetListener({.host_slot_free = [](int) {}, .progress = [] {}});
  ring.Enqueue({.ticket = 0, .host_slot = 5, .num_samples = 1});
  ring.Filled(0);
  // Returns though the copy cannot finish until Go: the caller (a decode worker) never
  // waits for the device.
  ASSERT_TRUE(ring.Flush().ok());
  stage->AwaitStarted(1);
  EXPECT_NE(stage->caller(), std::this_thread::get_id());
  ring.Enqueue({.ticket = 1, .host_slot = 6, .num_samples = 1});
  ring.Filled(1);
  ASSERT_TRUE(ring.Flush().ok());  // ordered while the first copy still waits
  stage->Go(2);
  stage->AwaitCopied(2);
  EXPECT_THAT(stage->copied(), ElementsAre(5, 6));  // in the order decided
}

TEST(DeviceRingCopyThreadTest, ACopyThatFailsOnTheRingsThreadIsReturnedByTheNextFlush) {
  auto owned = std::make_unique<WaitingStage>();
  WaitingStage* stage = owned.get();
  DeviceRing ring(std::move(owned));
  absl::Notification told;
  ring.SetListener({.host_slot_free = [](int) {},
                    .progress =
                        [&told] {
                          if (!told.HasBeenNotified()) told.Notify();
                        }});
  ring.Enqueue({.ticket = 0, .host_slot = 0, .num_samples = 1});
  ring.Filled(0);
  ASSERT_TRUE(ring.Flush().ok());
  stage->Go(1, absl::InternalError("device lost"));
  told.WaitForNotification();  // the pipeline hears of it as progress, and flushes
  const absl::Status failed = ring.Flush();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failed.message(), HasSubstr("device lost"));
  EXPECT_TRUE(ring.Flush().ok());  // told once
  // The ring is stopped: nothing more is copied.
  ring.Enqueue({.ticket = 1, .host_slot = 1, .num_samples = 1});
  ring.Filled(1);
  EXPECT_TRUE(ring.Flush().ok());
  ring.StopDeviceWork();
  EXPECT_THAT(stage->copied(), IsEmpty());
}

TEST(DeviceRingCopyThreadTest, DestroyingTheRingWhileACopyWaitsJoinsTheThreadAfterIt) {
  auto owned = std::make_unique<WaitingStage>();
  WaitingStage* stage = owned.get();
  auto ring = std::make_unique<DeviceRing>(std::move(owned));
  ring->SetListener({.host_slot_free = [](int) {}, .progress = [] {}});
  ring->Enqueue({.ticket = 0, .host_slot = 0, .num_samples = 1});
  ring->Filled(0);
  ASSERT_TRUE(ring->Flush().ok());
  stage->AwaitStarted(1);
  std::thread release([stage] {
    absl::SleepFor(absl::Milliseconds(20));
    stage->Go(1);
  });
  ring->StopDeviceWork();  // waits for the copy being started
  ring.reset();
  release.join();
}

TEST(DeviceRingCopyThreadTest, AListenerThatDropsTheRingOnTheCopyThreadEndsItCleanly) {
  auto owned = std::make_unique<WaitingStage>();
  WaitingStage* stage = owned.get();
  auto ring =
      std::make_shared<std::unique_ptr<DeviceRing>>(std::make_unique<DeviceRing>(std::move(owned)));
  absl::Notification dropped;
  (*ring)->SetListener({.host_slot_free = [](int) {},
                        .progress =
                            [ring, &dropped] {
                              ring->reset();  // the pipeline's last reference goes
                              dropped.Notify();
                            }});
  (*ring)->Enqueue({.ticket = 0, .host_slot = 0, .num_samples = 1});
  (*ring)->Filled(0);
  ASSERT_TRUE((*ring)->Flush().ok());
  stage->Go(1, absl::InternalError("device lost"));
  dropped.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(50));  // the detached thread returns without the ring
}

}  // namespace
}  // namespace ferry
