#include "server/transport/host_ring.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ferry {

HostRing::HostRing(int num_host_slots, uint64_t slab_bytes, const Clock& clock)
    : slab_bytes_(slab_bytes), clock_(clock), slots_(static_cast<size_t>(num_host_slots)) {}

void HostRing::Enqueue(const Batch& batch) {
  queued_.push_back(Queued{batch.ticket, batch.host_slot, false});
}

void HostRing::Filled(uint64_t ticket) {
  for (Queued& q : queued_) {
    if (q.ticket == ticket) q.filled = true;
  }
}

std::optional<uint32_t> HostRing::TakeReady(uint64_t ticket, int64_t seq) {
  auto it = std::find_if(queued_.begin(), queued_.end(),
                         [ticket](const Queued& q) { return q.ticket == ticket; });
  if (it == queued_.end() || !it->filled) return std::nullopt;
  Slot& slot = slots_[it->host_slot];
  slot.leased = true;
  slot.seq = seq;
  slot.since = clock_.Now();
  const uint32_t number = static_cast<uint32_t>(it->host_slot);
  queued_.erase(it);
  return number;
}

void HostRing::DropQueued(std::vector<int>* freed) {
  for (const Queued& q : queued_) {
    if (q.filled) freed->push_back(q.host_slot);
  }
  queued_.clear();
}

absl::Status HostRing::Release(uint32_t slot, int64_t seq, bool complete, std::vector<int>* freed) {
  if (slot >= slots_.size() || !slots_[slot].leased || slots_[slot].seq != seq) {
    return absl::InvalidArgumentError(absl::StrCat("release of slot ", slot, " seq ", seq,
                                                   ", which is not leased to this consumer"));
  }
  Slot& s = slots_[slot];
  lease_time_ += clock_.Now() - s.since;
  s.leased = false;
  s.seq = -1;
  freed->push_back(static_cast<int>(slot));
  return absl::OkStatus();
}

int HostRing::leased() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.leased;
  return n;
}

absl::Status HostRing::OpenConsumer(const std::vector<std::string>& released_events) {
  if (!released_events.empty()) {
    return absl::InvalidArgumentError(
        "released_events sent to a host-transport attach; they belong to GPU attaches only");
  }
  return absl::OkStatus();
}

void HostRing::CloseConsumer(std::vector<int>* freed) {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].leased) continue;
    slots_[i].leased = false;
    slots_[i].seq = -1;
    freed->push_back(static_cast<int>(i));
  }
}

void HostRing::Describe(ferry::v1::AttachResponse* response) const {
  response->mutable_host()->set_slab_bytes(slab_bytes_);
}

void HostRing::FillStatus(ferry::v1::RankStatus* status) const {
  uint32_t queued = 0;
  for (const Queued& q : queued_) queued += q.filled;
  status->set_queue_depth(queued);
  status->set_slots_leased(static_cast<uint32_t>(leased()));
  status->set_lease_seconds(absl::ToDoubleSeconds(lease_time_));
}

}  // namespace ferry
