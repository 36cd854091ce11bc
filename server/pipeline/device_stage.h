// The seam between the producer and a device transport. A RankPipeline fills host slots;
// with a DeviceStage it then hands each filled host slot to the stage, which copies it into
// one of its own device slots (and converts it there), and the consumer is given device
// slots instead of host slots. The host transport has no stage: consumers read host slots.
//
// Contract: StartCopy is called with the pipeline's lock held and must not block on the
// device (it enqueues work and returns); when the host slot may be refilled the stage calls
// the `host_slot_free` callback given at Attach from a thread of its own, holding no lock.
// Everything the stage needs (device memory, events, streams, pinned registration) is
// allocated when it is created; nothing after.
#ifndef FERRY_SERVER_PIPELINE_DEVICE_STAGE_H_
#define FERRY_SERVER_PIPELINE_DEVICE_STAGE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

class DeviceStage {
 public:
  virtual ~DeviceStage() = default;

  virtual int num_device_slots() const = 0;

  // Sets the callback run when a host slot's copy has completed. Called once, before any
  // StartCopy.
  virtual void SetHostSlotFreeCallback(std::function<void(int host_slot)> callback) = 0;

  // Copies host slot `host_slot` (holding `num_samples` rows) into device slot
  // `device_slot` after the consumer's last use of that device slot, converts it, and makes
  // the device slot's "ready" signal follow that work.
  virtual absl::Status StartCopy(int host_slot, int device_slot, uint32_t num_samples) = 0;

  // What a consumer needs to map the device slots (filled into AttachResponse).
  virtual void Describe(ferry::v1::AttachResponse* response) const = 0;

  // A consumer binds: `released_events` are its per-slot "released" signals.
  virtual absl::Status OpenConsumer(const std::vector<std::string>& released_events) = 0;
  // The consumer is gone: forget its signals (a dead process's events never fire again).
  virtual void CloseConsumer() = 0;

  // For status: device bytes, pinned bytes, copy throughput.
  virtual void FillStatus(ferry::v1::RankStatus* status) const {}
};

}  // namespace ferry

#endif  // FERRY_SERVER_PIPELINE_DEVICE_STAGE_H_
