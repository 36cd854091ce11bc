// The host transport's DeliveryRing: the consumer reads the host slots themselves, mapped
// from the rank's shared-memory slab, so a filled host slot is deliverable at once and is
// free again when the consumer releases it.
//
//   auto ring = std::make_unique<HostRing>(num_host_slots, slab.size());
//
// Thread-safety: none of its own; the pipeline calls it under its lock (delivery_ring.h).
#ifndef FERRY_SERVER_TRANSPORT_HOST_RING_H_
#define FERRY_SERVER_TRANSPORT_HOST_RING_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"
#include "server/transport/delivery_ring.h"

namespace ferry {

class HostRing final : public DeliveryRing {
 public:
  // Lease times are read on `clock`, which must outlive the ring.
  HostRing(int num_host_slots, uint64_t slab_bytes, const Clock& clock = Clock::Real());

  void SetListener(Listener listener) override {}
  int num_slots() const override { return static_cast<int>(slots_.size()); }
  void Enqueue(const Batch& batch) override;
  void Filled(uint64_t ticket) override;
  std::optional<uint32_t> TakeReady(uint64_t ticket, int64_t seq) override;
  void DropQueued(std::vector<int>* freed) override;
  absl::Status Release(uint32_t slot, int64_t seq, bool complete, std::vector<int>* freed) override;
  int leased() const override;
  absl::Status OpenConsumer(const std::vector<std::string>& released_events) override;
  void CloseConsumer(std::vector<int>* freed) override;
  void Describe(ferry::v1::AttachResponse* response) const override;
  void FillStatus(ferry::v1::RankStatus* status) const override;

 private:
  struct Queued {
    uint64_t ticket;
    int host_slot;
    bool filled;
  };
  struct Slot {
    bool leased = false;
    int64_t seq = -1;  // while leased
    absl::Time since;  // of the lease, for lease_seconds
  };

  const uint64_t slab_bytes_;
  const Clock& clock_;
  std::deque<Queued> queued_;  // enqueued and not taken, in delivery order
  std::vector<Slot> slots_;    // one per host slot
  absl::Duration lease_time_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_TRANSPORT_HOST_RING_H_
