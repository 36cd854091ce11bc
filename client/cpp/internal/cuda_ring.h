// The trainer's side of ferryd's GPU transport: the device slots and events of one attach,
// opened once over CUDA IPC and kept for the attach's lifetime.
//
// ferryd exports, per slot, a device buffer, a "ready" event (recorded after its copy and
// kernels) and a "released" event; the trainer opens all three. ferryd writes a slot again
// only once it has seen that slot's released event complete. The trainer exports nothing:
// an importer of another process's events keeps a mapping of that process's driver segment
// for good, so ferryd, which outlives thousands of trainers, must import none of theirs.
// Per batch the trainer only enqueues:
//   WaitReady(slot, stream)       cudaStreamWaitEvent(stream, ready[slot]), skipped when
//                                 the event has completed already (ferry ahead)
//   SignalReleased(slot, stream)  cudaEventRecord(released[slot], stream), skipped when the
//                                 stream has no pending work; then Release.
// Nothing here blocks the host.
//
// This header does not include CUDA's: the implementation is cuda_ring.cc with CUDA and
// cuda_ring_none.cc without, where Open fails with FAILED_PRECONDITION.
//
// Thread safety: every const method may be called from any thread.
#ifndef FERRY_CLIENT_CPP_INTERNAL_CUDA_RING_H_
#define FERRY_CLIENT_CPP_INTERNAL_CUDA_RING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ferry {
namespace internal {

// What ferryd sent in AttachResponse.cuda, minus the field layout.
struct CudaRingSpec {
  int daemon_device = 0;   // ferryd's ordinal, for messages only
  std::string pci_bus_id;  // selects the local device
  uint64_t slot_bytes = 0;
  std::vector<std::string> mem_handles;      // 64 bytes each, one per slot
  std::vector<std::string> ready_events;     // 64 bytes each, one per slot
  std::vector<std::string> released_events;  // 64 bytes each, one per slot
};

class CudaRing {
 public:
  virtual ~CudaRing() = default;

  // Opens every slot, ready and released event of `spec` on the local device with
  // spec.pci_bus_id. Errors name the CUDA call and error (INTERNAL for handle counts that
  // disagree, e.g. an older ferryd that sends no released events):
  // FAILED_PRECONDITION when the device is not visible to this process, for IPC failures
  // (e.g. another IPC namespace), or when this library was built without CUDA.
  static absl::StatusOr<std::shared_ptr<const CudaRing>> Open(const CudaRingSpec& spec);

  // The local CUDA ordinal the slots live on (the trainer's numbering).
  virtual int device() const = 0;
  virtual uint32_t num_slots() const = 0;
  // Device address of slot `slot` (mapped; slot_bytes long).
  virtual const uint8_t* slot_data(uint32_t slot) const = 0;
  // True when `spec` names the same exported slots and events (a reattach to the same
  // pipeline), so the mappings can be kept.
  virtual bool Matches(const CudaRingSpec& spec) const = 0;

  // Makes `stream` (a cudaStream_t; null = the device's legacy default stream) wait for
  // slot `slot`'s ready event. Returns at once.
  virtual absl::Status WaitReady(uint32_t slot, void* stream) const = 0;
  // Signals that the trainer's use of slot `slot` ends with the work enqueued on `stream`
  // so far (null = legacy default stream). Returns true when it recorded the slot's
  // released event for ferryd to watch; false when `stream` had no pending work
  // (cudaStreamQuery), so no use of the slot is left and nothing needed recording: the
  // Release then says `complete` and ferryd rewrites the slot at once. Skipping the record
  // also keeps the GPU from switching to the trainer's context just to signal an event.
  virtual absl::StatusOr<bool> SignalReleased(uint32_t slot, void* stream) const = 0;
};

// PCI bus id ("0000:3b:00.0", lower case) of this process's CUDA device `ordinal`.
// INVALID_ARGUMENT for an ordinal it does not have; FAILED_PRECONDITION without a usable
// driver or device, or when built without CUDA.
absl::StatusOr<std::string> CudaPciBusId(int ordinal);

// Whether this library was built with the GPU transport.
bool BuiltWithCuda();

}  // namespace internal
}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_INTERNAL_CUDA_RING_H_
