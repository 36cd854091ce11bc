// The device side of a DeviceRing (device_ring.h): the copies and signals of one rank's
// device slots. The ring decides which host slot goes to which device slot and when; the
// stage does the device work and reports when it is done. CudaStage (server/gpu/) is the
// CUDA one; tests use fakes.
//
// Contract: WatchReleased, ReleasedSignalPending (at most two calls per batch scheduled),
// gather_ready, PlanGpuDecode, ReportConsumerWait, OpenConsumer and CloseConsumer are called
// with the ring's lock held;
// StartCopy is called without it, from one thread at a time, in the order the ring decided
// the copies under its lock (not necessarily delivery order: a filled batch may go before
// an earlier one still filling). The stage relies only on that order being the order of
// its own calls (CudaStage watches its events in stream order). None of them blocks on the
// device, but StartCopy of a stage that says so (start_copy_waits): they enqueue work and
// return. FillStatus may run concurrently with StartCopy.
// The stage reports progress through Callbacks, from a thread of its own, holding no lock
// of its own. Everything the stage needs (device memory, events, streams, pinned
// registration) is allocated when it is created; nothing after.
//
// Why the ring, not the GPU, waits for the consumer's "released" signal: ferryd and the
// trainer are two CUDA contexts on one GPU. A stream of one context waiting for an event of
// the other that has not completed yet holds the GPU until the context time slice ends
// (milliseconds), once per batch. So a device slot is reused only after its
// released signal has been seen complete on the host, and a batch is delivered only after
// its ready signal has: neither process ever queues a wait on the other's unfinished work.
#ifndef FERRY_SERVER_TRANSPORT_DEVICE_STAGE_H_
#define FERRY_SERVER_TRANSPORT_DEVICE_STAGE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

class DeviceStage {
 public:
  virtual ~DeviceStage() = default;

  virtual int num_device_slots() const = 0;

  // The field whose rows the stage can read from the dataset itself rather than from the
  // host slot (SampleSource::direct_rows): for a batch the ring asks it to gather
  // (StartCopy's `gather`), workers leave those rows unwritten. -1 when the stage copies
  // every field from the host slot. Constant after creation.
  virtual int gathered_field() const { return -1; }
  // With a gathered_field: true to gather every batch; false to gather only the batches
  // the ring schedules while the consumer waits for batches, or soon will
  // (server/transport/gather_policy.h says how it tells), workers writing the rows of
  // the others. A gather runs kernels in ferryd's CUDA context, which the GPU time-slices
  // with the trainer's; a slot copy runs on the copy engine beside the trainer's kernels.
  // So gathering pays while the trainer waits for batches, and costs its step time while
  // it computes. Constant after creation.
  virtual bool gathers_every_batch() const { return true; }
  // With a gathered_field: false until the stage can gather (its dataset mapping is still
  // being registered, or that failed); until then every batch's rows are written by the
  // workers. Once true, stays true. Called under the ring's lock.
  virtual bool gather_ready() const { return true; }

  // Asked once per batch as the ring plans it, in delivery order: true when the stage's
  // decoder takes the batch's JPEGs (DeliveryRing::BatchPlan::gpu_decode). A stage without
  // one says false.
  virtual bool PlanGpuDecode() { return false; }
  // DeliveryRing::ReportConsumerWait, for a stage whose decoder follows the trainer's waits.
  virtual void ReportConsumerWait(absl::Duration waited, absl::Duration interval) {}

  // How a stage reports progress. `token` is the value passed to the call that started the
  // work; the ring uses it to ignore reports about work it has since abandoned.
  struct Callbacks {
    // The host slot's bytes are on the device: the host slot may be refilled.
    std::function<void(int host_slot)> host_slot_free;
    // The copy (and conversion) into the device slot is complete: it may be delivered.
    std::function<void(int device_slot, uint64_t token)> device_slot_ready;
    // The consumer's last use of the device slot is over: it may be written again.
    std::function<void(int device_slot, uint64_t token)> device_slot_released;
  };
  // Called once, before any other call but num_device_slots.
  virtual void SetCallbacks(Callbacks callbacks) = 0;

  // Whether StartCopy may wait for the device (CudaStage's GPU JPEG decode waits for
  // nvJPEG's hardware decoder). The ring then calls StartCopy from a thread of its own, so
  // that the threads that flush it (the decode workers) never wait for a GPU, and each
  // stage's device work proceeds beside every other's. Constant.
  virtual bool start_copy_waits() const { return false; }

  // The batch in host slot `host_slot` (`num_samples` rows) is filled: a StartCopy of it
  // follows, unless BatchDropped(host_slot) comes first. The stage may read the host slot
  // from now on (nothing writes it before its host_slot_free or BatchDropped), e.g. to
  // prepare the copy while earlier ones run. Called under the ring's lock: must not block.
  virtual void BatchFilled(int host_slot, uint32_t num_samples) {}
  // The filled batch in host slot `host_slot` will not be copied (DeliveryRing::DropQueued).
  // Once this returns the stage reads the host slot no more: it may be refilled. Called
  // under the ring's lock.
  virtual void BatchDropped(int host_slot) {}

  // Copies host slot `host_slot` (holding `num_samples` rows) into device slot
  // `device_slot`, converts it there and records the slot's "ready" signal after that work;
  // then reports host_slot_free(host_slot) and device_slot_ready(device_slot, token). The
  // device slot must be free: never leased, or its released signal reported. `gather`: the
  // host slot lacks the rows of gathered_field(), which the stage reads from the dataset
  // at the indices of the source's index field (only with a gathered_field).
  virtual absl::Status StartCopy(int host_slot, int device_slot, uint32_t num_samples, bool gather,
                                 uint64_t token) = 0;

  // The consumer released `device_slot`: reports device_slot_released(device_slot, token)
  // once its "released" signal has completed. Dropped by CloseConsumer.
  virtual void WatchReleased(int device_slot, uint64_t token) = 0;
  // Whether the "released" signal of `device_slot`, watched since WatchReleased, has not
  // completed yet, asked now: the consumer's GPU still has work on the slot queued. The
  // report of a completed one may come later (CudaStage polls its events every 5-100 us).
  // Called under the ring's lock; must not block. A stage that cannot tell says true.
  virtual bool ReleasedSignalPending(int device_slot) const { return true; }

  // What a consumer needs to map the device slots: AttachResponse's transport and its
  // slot_bytes (a device slot's).
  virtual void Describe(ferry::v1::AttachResponse* response) const = 0;

  // A consumer binds: `released_events` are per-slot "released" signals it sent, if the
  // stage takes them (CudaStage exports its own in Describe and refuses any).
  virtual absl::Status OpenConsumer(const std::vector<std::string>& released_events) = 0;
  // The consumer is gone: forget its signals (a dead process's events never fire again).
  // No device_slot_released report for a slot watched before starts after this returns.
  virtual void CloseConsumer() = 0;

  // For status: device bytes, pinned bytes, copy throughput, the decoder's demand.
  virtual void FillStatus(ferry::v1::RankStatus* status) const {}
};

}  // namespace ferry

#endif  // FERRY_SERVER_TRANSPORT_DEVICE_STAGE_H_
