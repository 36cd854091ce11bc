#include "server/transport/device_ring.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/thread_name.h"

namespace ferry {

DeviceRing::DeviceRing(std::unique_ptr<DeviceStage> stage, const Clock& clock)
    : clock_(clock),
      num_slots_(stage->num_device_slots()),
      gathered_field_(stage->gathered_field()),
      slots_(static_cast<size_t>(num_slots_)),
      gather_policy_(num_slots_),
      stage_(std::move(stage)) {
  const absl::Time now = clock_.Now();
  for (DeviceSlot& d : slots_) d.since = now;
  DeviceStage::Callbacks callbacks;
  // host_slot_free goes straight to the pipeline: the ring keeps no state for it.
  callbacks.host_slot_free = [this](int host_slot) {
    const std::function<void(int)> free = listener_.host_slot_free;  // may outlive *this
    free(host_slot);
  };
  callbacks.device_slot_ready = [this](int device_slot, uint64_t token) {
    OnDeviceSlotReady(device_slot, token);
  };
  callbacks.device_slot_released = [this](int device_slot, uint64_t token) {
    OnDeviceSlotReleased(device_slot, token);
  };
  stage_->SetCallbacks(std::move(callbacks));
  if (stage_->start_copy_waits()) {
    copy_thread_ = std::thread([this, alive = alive_] { RunCopyThread(*alive); });
  }
}

DeviceRing::~DeviceRing() {
  if (!copy_thread_.joinable()) return;
  {
    absl::MutexLock lock(&mutex_);
    quitting_ = true;
  }
  alive_->store(false);
  if (copy_thread_.get_id() == std::this_thread::get_id()) {
    copy_thread_.detach();  // inside the listener's progress: the thread returns right after
  } else {
    copy_thread_.join();
  }
}

void DeviceRing::SetListener(Listener listener) { listener_ = std::move(listener); }

DeliveryRing::BatchPlan DeviceRing::PlanBatch() {
  absl::MutexLock lock(&mutex_);
  return BatchPlan{.gather = GatherNextLocked(), .gpu_decode = stage_->PlanGpuDecode()};
}

void DeviceRing::ReportConsumerWait(absl::Duration waited, absl::Duration interval) {
  absl::MutexLock lock(&mutex_);
  stage_->ReportConsumerWait(waited, interval);
}

bool DeviceRing::GatherNextLocked() {
  if (gathered_field_ < 0 || !stage_->gather_ready()) return false;
  if (stage_->gathers_every_batch()) return true;
  int leased = 0;
  // The latest releases (their tokens grow with each Release), newest first.
  std::array<int, GatherPolicy::kGpuBehind> latest;
  latest.fill(-1);
  for (size_t i = 0; i < slots_.size(); ++i) {
    const DeviceSlot& d = slots_[i];
    leased += d.state == State::kLeased;
    if (d.state != State::kReleasing) continue;
    int slot = static_cast<int>(i);
    for (int& l : latest) {
      if (l < 0 || slots_[l].token < slots_[slot].token) std::swap(l, slot);
      if (slot < 0) break;
    }
  }
  // Whether their released signals are pending is asked now, not taken from the stage's
  // reports, which may come later than a small batch lasts. Only the latest few are
  // asked, newest first, and only until one is complete: a trainer's stream completes its
  // releases in order, so the ones before a complete one are complete too. At most
  // kGpuBehind queries under the lock.
  int pending = 0;
  for (const int slot : latest) {
    if (slot < 0 || !stage_->ReleasedSignalPending(slot)) break;
    ++pending;
  }
  return gather_policy_.GatherNext(leased, pending);
}

void DeviceRing::Enqueue(const Batch& batch) {
  absl::MutexLock lock(&mutex_);
  queued_.push_back(Queued{batch.ticket, batch.host_slot, batch.num_samples, batch.gather});
}

void DeviceRing::Filled(uint64_t ticket) {
  absl::MutexLock lock(&mutex_);
  for (Queued& q : queued_) {
    if (q.ticket != ticket) continue;
    q.filled = true;
    q.filled_at = clock_.Now();
    stage_->BatchFilled(q.host_slot, q.num_samples);
    break;
  }
  OrderCopiesLocked();
}

void DeviceRing::OrderCopiesLocked() {
  if (stopped_) return;
  int free_slots = 0;
  for (const DeviceSlot& dev : slots_) free_slots += dev.state == State::kFree;
  int earlier_without_slot = 0;
  size_t d = 0;
  for (Queued& q : queued_) {
    if (q.device_slot >= 0) continue;
    if (free_slots <= earlier_without_slot) return;
    if (!q.filled) {
      ++earlier_without_slot;
      continue;
    }
    while (slots_[d].state != State::kFree) ++d;  // free_slots > 0: one exists
    --free_slots;
    const uint64_t token = ++tokens_;
    copy_orders_.push_back(
        CopyOrder{q.host_slot, static_cast<int>(d), q.num_samples, q.gather, token});
    const absl::Time now = clock_.Now();
    copy_wait_time_ += now - q.filled_at;
    DeviceSlot& dev = slots_[d];
    device_idle_time_ += now - dev.since;
    dev.state = State::kCopying;  // kReady once the stage reports it
    dev.token = token;
    dev.ordered = now;
    q.device_slot = static_cast<int>(d);
  }
}

void DeviceRing::FreeLocked(DeviceSlot& slot) {
  slot.state = State::kFree;
  slot.seq = -1;
  slot.since = clock_.Now();
}

std::optional<uint32_t> DeviceRing::TakeReady(uint64_t ticket, int64_t seq) {
  absl::MutexLock lock(&mutex_);
  auto it = std::find_if(queued_.begin(), queued_.end(),
                         [ticket](const Queued& q) { return q.ticket == ticket; });
  if (it == queued_.end() || it->device_slot < 0) return std::nullopt;
  DeviceSlot& dev = slots_[it->device_slot];
  if (dev.state != State::kReady) return std::nullopt;
  dev.state = State::kLeased;
  dev.seq = seq;
  dev.since = clock_.Now();
  const uint32_t number = static_cast<uint32_t>(it->device_slot);
  queued_.erase(it);
  return number;
}

void DeviceRing::DropQueued(std::vector<int>* freed) {
  absl::MutexLock lock(&mutex_);
  for (const Queued& q : queued_) {
    if (q.device_slot >= 0) {
      // Copied (or being copied) already: the device slot is simply reused; the host slot
      // comes back through host_slot_free once the copy has read it.
      FreeLocked(slots_[q.device_slot]);
    } else if (q.filled) {
      stage_->BatchDropped(q.host_slot);
      freed->push_back(q.host_slot);
    }
  }
  queued_.clear();
}

absl::Status DeviceRing::Release(uint32_t slot, int64_t seq, bool complete,
                                 std::vector<int>* freed) {
  absl::MutexLock lock(&mutex_);
  if (slot >= slots_.size() || slots_[slot].state != State::kLeased || slots_[slot].seq != seq) {
    return absl::InvalidArgumentError(absl::StrCat("release of slot ", slot, " seq ", seq,
                                                   ", which is not leased to this consumer"));
  }
  // Written again only once the consumer's last use of it is over on the GPU.
  DeviceSlot& dev = slots_[slot];
  const absl::Time now = clock_.Now();
  lease_time_ += now - dev.since;
  dev.since = now;
  dev.seq = -1;
  dev.token = ++tokens_;
  ++releases_;
  if (complete) {
    dev.state = State::kFree;
    ++releases_complete_;
    OrderCopiesLocked();
  } else {
    dev.state = State::kReleasing;
    stage_->WatchReleased(static_cast<int>(slot), dev.token);
  }
  return absl::OkStatus();
}

int DeviceRing::leased() const {
  absl::MutexLock lock(&mutex_);
  int n = 0;
  for (const DeviceSlot& d : slots_) n += d.state == State::kLeased;
  return n;
}

absl::Status DeviceRing::OpenConsumer(const std::vector<std::string>& released_events) {
  absl::MutexLock lock(&mutex_);
  return stage_->OpenConsumer(released_events);
}

void DeviceRing::CloseConsumer(std::vector<int>* freed) {
  absl::MutexLock lock(&mutex_);
  stage_->CloseConsumer();
  // What the policy learned was about this consumer's GPU.
  gather_policy_ = GatherPolicy(num_slots_);
  for (DeviceSlot& d : slots_) {
    // A dead consumer's work on its slots is gone with its context.
    if (d.state == State::kLeased || d.state == State::kReleasing) FreeLocked(d);
  }
  OrderCopiesLocked();
}

absl::Status DeviceRing::Flush() {
  if (!copy_thread_.joinable()) return StartOrderedCopies();
  absl::MutexLock lock(&mutex_);  // unlocking wakes the copy thread when there is work
  return std::exchange(copy_failure_, absl::OkStatus());
}

void DeviceRing::RunCopyThread(const std::atomic<bool>& alive) {
  NameThisThread("ferry-copy");
  for (;;) {
    {
      absl::MutexLock lock(&mutex_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return quitting_ || (!copy_orders_.empty() && !flushing_);
      };
      mutex_.Await(absl::Condition(&has_work));
      if (quitting_) return;
    }
    absl::Status s = StartOrderedCopies();
    if (s.ok()) continue;
    {
      absl::MutexLock lock(&mutex_);
      if (copy_failure_.ok()) copy_failure_ = std::move(s);
    }
    // The pipeline flushes when told of progress, and so hears of the failure.
    const std::function<void()> progress = listener_.progress;
    if (progress) progress();
    if (!alive.load()) return;  // the pipeline dropped this ring in progress()
  }
}

absl::Status DeviceRing::StartOrderedCopies() {
  std::vector<CopyOrder> orders;
  {
    absl::MutexLock lock(&mutex_);
    if (stopped_) copy_orders_.clear();  // nobody will receive the batch
    if (flushing_ || copy_orders_.empty()) return absl::OkStatus();  // the other takes ours
    flushing_ = true;
    orders.swap(copy_orders_);
  }
  for (;;) {
    absl::Status failed;
    for (const CopyOrder& o : orders) {
      if (copies_stopped_.load(std::memory_order_relaxed)) break;
      failed = stage_->StartCopy(o.host_slot, o.device_slot, o.num_samples, o.gather, o.token);
      if (!failed.ok()) break;
    }
    absl::MutexLock lock(&mutex_);
    if (!failed.ok()) {
      // A device that fails a copy will fail the next one too: the rank stops with the
      // reason instead of handing out slots that were never written.
      stopped_ = true;
      copies_stopped_.store(true, std::memory_order_relaxed);
      copy_orders_.clear();
      flushing_ = false;
      return absl::Status(failed.code(),
                          absl::StrCat("copy to the GPU failed: ", failed.message()));
    }
    if (stopped_) copy_orders_.clear();
    if (copy_orders_.empty()) {
      flushing_ = false;
      return absl::OkStatus();
    }
    orders.clear();
    orders.swap(copy_orders_);
  }
}

void DeviceRing::StopDeviceWork() {
  absl::MutexLock lock(&mutex_);
  stopped_ = true;
  copy_orders_.clear();
  copies_stopped_.store(true, std::memory_order_relaxed);
  mutex_.Await(absl::Condition(
      +[](bool* flushing) { return !*flushing; }, &flushing_));
}

void DeviceRing::OnDeviceSlotReady(int device_slot, uint64_t token) {
  {
    absl::MutexLock lock(&mutex_);
    DeviceSlot& dev = slots_[device_slot];
    // A copy abandoned by DropQueued (the slot was freed, maybe reused) is not delivered.
    if (dev.state != State::kCopying || dev.token != token) return;
    dev.state = State::kReady;
    copy_latency_.Observe(clock_.Now() - dev.ordered);
  }
  Progress();
}

void DeviceRing::OnDeviceSlotReleased(int device_slot, uint64_t token) {
  {
    absl::MutexLock lock(&mutex_);
    DeviceSlot& dev = slots_[device_slot];
    // After CloseConsumer the slot was reclaimed already.
    if (dev.state != State::kReleasing || dev.token != token) return;
    FreeLocked(dev);
    OrderCopiesLocked();
  }
  Progress();
}

void DeviceRing::Progress() {
  // A copy: the pipeline this reaches may drop its last reference, and this ring with it.
  const std::function<void()> progress = listener_.progress;
  progress();
}

void DeviceRing::Describe(ferry::v1::AttachResponse* response) const { stage_->Describe(response); }

void DeviceRing::FillStatus(ferry::v1::RankStatus* status) const {
  absl::MutexLock lock(&mutex_);
  uint32_t ready = 0, leased = 0;
  for (const DeviceSlot& d : slots_) {
    ready += d.state == State::kReady;
    leased += d.state == State::kLeased;
  }
  status->set_queue_depth(ready);
  status->set_slots_leased(leased);
  stage_->FillStatus(status);
  status->set_releases(releases_);
  status->set_releases_complete(releases_complete_);
  status->set_lease_seconds(absl::ToDoubleSeconds(lease_time_));
  status->set_copy_wait_seconds(absl::ToDoubleSeconds(copy_wait_time_));
  status->set_device_slot_idle_seconds(absl::ToDoubleSeconds(device_idle_time_));
  copy_latency_.ToProto(status->mutable_copy_latency());
}

}  // namespace ferry
