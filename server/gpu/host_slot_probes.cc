#include "server/gpu/host_slot_probes.h"

#include <algorithm>
#include <utility>

#include "common/thread_name.h"

namespace ferry {

HostSlotProbes::HostSlotProbes(Probe probe, const std::string& name)
    : probe_(std::move(probe)), thread_([this, name] { Run(name); }) {}

HostSlotProbes::~HostSlotProbes() {
  {
    absl::MutexLock lock(&mutex_);
    quitting_ = true;
  }
  thread_.join();
}

void HostSlotProbes::Queue(int host_slot, uint32_t num_samples) {
  absl::MutexLock lock(&mutex_);
  if (static_cast<size_t>(host_slot) >= slots_.size()) slots_.resize(host_slot + 1);
  Slot& slot = slots_[host_slot];
  slot.num_samples = num_samples;
  slot.done = false;
  slot.verdicts.clear();
  if (!slot.queued) queue_.push_back(host_slot);
  slot.queued = true;
}

std::optional<std::vector<GpuJpegVerdict>> HostSlotProbes::Take(int host_slot) {
  absl::MutexLock lock(&mutex_);
  auto not_probing = [this, host_slot]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return probing_ != host_slot; };
  mutex_.Await(absl::Condition(&not_probing));
  std::optional<std::vector<GpuJpegVerdict>> verdicts;
  if (static_cast<size_t>(host_slot) < slots_.size()) {
    Slot& slot = slots_[host_slot];
    if (slot.queued) {
      queue_.erase(std::find(queue_.begin(), queue_.end(), host_slot));
      slot.queued = false;
    }
    if (slot.done) verdicts = std::move(slot.verdicts);
    slot.done = false;
    slot.verdicts.clear();
  }
  ++(verdicts.has_value() ? taken_ready_ : taken_unprobed_);
  return verdicts;
}

int64_t HostSlotProbes::taken_ready() const {
  absl::MutexLock lock(&mutex_);
  return taken_ready_;
}

int64_t HostSlotProbes::taken_unprobed() const {
  absl::MutexLock lock(&mutex_);
  return taken_unprobed_;
}

void HostSlotProbes::Run(const std::string& name) {
  NameThisThread("ferry-probe-" + name);
  for (;;) {
    int host_slot = -1;
    uint32_t num_samples = 0;
    {
      absl::MutexLock lock(&mutex_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return quitting_ || !queue_.empty();
      };
      mutex_.Await(absl::Condition(&has_work));
      if (quitting_) return;
      host_slot = queue_.front();
      queue_.pop_front();
      slots_[host_slot].queued = false;
      num_samples = slots_[host_slot].num_samples;
      probing_ = host_slot;
    }
    std::vector<GpuJpegVerdict> verdicts = probe_(host_slot, num_samples);
    absl::MutexLock lock(&mutex_);
    probing_ = -1;
    slots_[host_slot].verdicts = std::move(verdicts);
    slots_[host_slot].done = true;
  }
}

}  // namespace ferry
