// The seam through which a rank pipeline delivers its batches: the ring of slots a consumer
// leases. The pipeline fills host slots in a shared-memory slab and decides the order of
// batches; a DeliveryRing turns each filled host slot into a slot the consumer can read and
// takes it back when the consumer releases it.
//
//   HostRing (host_ring.h):     the delivered slot is the host slot itself.
//   DeviceRing (device_ring.h): the host slot is copied (or its records gathered, its JPEGs
//                               decoded) into a device slot, which is delivered; its events
//                               are watched on the host. With a CudaStage (server/gpu/) it
//                               is the CUDA ring.
// The pipeline knows rings only through this interface: what a device does to a batch
// reaches the workers as the batch's plan (BatchPlan).
//
// The protocol, per batch, in delivery order (a ticket names a batch for the ring's life):
//   BatchPlan plan = ring->PlanBatch();         // as the batch is scheduled
//   ring->Enqueue({ticket, host_slot, n, plan.gather});
//   ... workers fill the host slot as `plan` says ...
//   ring->Filled(ticket);
//   ... the pipeline, when the batch is next to deliver:
//   std::optional<uint32_t> slot = ring->TakeReady(ticket, seq);  // leased if set
//   ... the consumer gives it back:
//   ring->Release(slot, seq, complete, &freed_host_slots);
// A host slot is the ring's from Enqueue until the ring gives it back: through a `freed`
// out-parameter of the call that freed it, or through Listener::host_slot_free.
//
// Locking: every method but Flush is called with the pipeline's lock held, and none blocks
// on a device or calls the listener. Flush is called without it, from any thread (it starts
// the copies decided under the lock). The listener is called from the ring's own thread (a
// device's event watcher), holding no lock of the ring's: it may call back into the ring.
#ifndef FERRY_SERVER_TRANSPORT_DELIVERY_RING_H_
#define FERRY_SERVER_TRANSPORT_DELIVERY_RING_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

class DeliveryRing {
 public:
  // How the ring tells the pipeline of progress it made on its own.
  struct Listener {
    // Host slot `host_slot` is no longer needed by the ring: it may be filled again.
    std::function<void(int host_slot)> host_slot_free;
    // A batch may have become deliverable, or a slot free: deliver and flush.
    std::function<void()> progress;
  };

  // One batch handed to the ring.
  struct Batch {
    uint64_t ticket = 0;  // grows with each batch the pipeline schedules
    int host_slot = 0;
    uint32_t num_samples = 0;
    bool gather = false;  // PlanBatch's answer for it
  };

  // How the workers fill one batch's host slot.
  struct BatchPlan {
    // The ring reads the batch's gathered_field() rows from the dataset itself: the
    // workers leave them unwritten.
    bool gather = false;
    // The device decodes the batch's JPEGs: the workers write each JPEG file a row could
    // hand over as it is (server/decode/gpu_decode_plan.h) instead of decoding it.
    bool gpu_decode = false;
  };

  DeliveryRing() = default;
  DeliveryRing(const DeliveryRing&) = delete;
  DeliveryRing& operator=(const DeliveryRing&) = delete;
  virtual ~DeliveryRing() = default;

  // Called once, before anything but the constant accessors below.
  virtual void SetListener(Listener listener) = 0;

  // Slots the consumer leases (AttachResponse.num_slots). Constant.
  virtual int num_slots() const = 0;
  // The field a batch with `gather` leaves unwritten by the workers (the ring reads its
  // rows from the dataset itself), or -1 when no batch is ever gathered. Constant.
  virtual int gathered_field() const { return -1; }

  // Asked once per batch as the pipeline schedules it, in delivery order.
  virtual BatchPlan PlanBatch() { return BatchPlan(); }
  // The consumer released a batch it had waited `waited` for, `interval` after it released
  // the one before: how much the trainer waits on ferry, which a device that decodes
  // JPEGs follows (it takes more of them while the trainer waits).
  virtual void ReportConsumerWait(absl::Duration waited, absl::Duration interval) {}
  // The batch was scheduled into host slot `batch.host_slot`, after every batch enqueued
  // before it. Its rows are being written.
  virtual void Enqueue(const Batch& batch) = 0;
  // Every row of the batch is written.
  virtual void Filled(uint64_t ticket) = 0;
  // When the batch can be read by the consumer: leases its slot under `seq` and returns
  // the slot number to send; nullopt while it cannot yet (its copy is still running).
  virtual std::optional<uint32_t> TakeReady(uint64_t ticket, int64_t seq) = 0;
  // Forgets every batch enqueued and not yet taken (a seek, the pipeline's StartEpoch):
  // their device work is abandoned; host slots of filled batches that the ring will not
  // give back by itself go to `freed`. Batches still being filled are the pipeline's to free.
  virtual void DropQueued(std::vector<int>* freed) = 0;

  // INVALID_ARGUMENT naming the slot unless `slot` is leased under `seq`. `complete`: the
  // consumer's last use of the slot is already over (a device slot is then free at once
  // instead of once its released signal is seen complete). Host slots freed go to `freed`.
  virtual absl::Status Release(uint32_t slot, int64_t seq, bool complete,
                               std::vector<int>* freed) = 0;
  // Slots leased now.
  virtual int leased() const = 0;

  // A consumer binds, with `released_events` (per-slot signals it sent; see DeviceStage).
  virtual absl::Status OpenConsumer(const std::vector<std::string>& released_events) = 0;
  // The consumer is gone: every slot it leased is reclaimed (host slots freed go to
  // `freed`), and what the ring learned about it is forgotten.
  virtual void CloseConsumer(std::vector<int>* freed) = 0;

  // Starts, without the pipeline's lock, the device work decided under it (one thread at a
  // time does; a call while another runs leaves its work to that one). An error means the
  // device failed and the rank must stop; the ring then starts nothing more.
  virtual absl::Status Flush() { return absl::OkStatus(); }
  // Called once, as the pipeline shuts down: no device work starts after this returns
  // (work being started by a Flush on another thread is waited for).
  virtual void StopDeviceWork() {}

  // What a consumer needs to map the slots: the transport oneof and slot_bytes.
  virtual void Describe(ferry::v1::AttachResponse* response) const = 0;
  // The ring's part of status: queue_depth, slots_leased, lease_seconds, and a device's
  // figures (gpu_decode_demand with a device decoder).
  virtual void FillStatus(ferry::v1::RankStatus* status) const = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVER_TRANSPORT_DELIVERY_RING_H_
