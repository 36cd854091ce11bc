// The GPU decoder's verdicts on the JPEGs of filled batches, worked out on a thread of its
// own ahead of each batch's copy, so that the thread that drives the decoder finds them
// ready instead of parsing each file between two decodes (GpuJpegStage).
//
//   HostSlotProbes probes([&](int slot, uint32_t n) { return ProbeRows(slot, n); }, "g0");
//   probes.Queue(host_slot, n);                 // the batch filled (under the ring's lock)
//   ... later, on the decoding thread:
//   std::optional<std::vector<GpuJpegVerdict>> v = probes.Take(host_slot);
//   if (!v.has_value()) ... probe the batch here ...
//
// A host slot's entry lives from its Queue to its Take (or Forget). The caller's contract,
// which the ring keeps: a host slot is queued again only after it was taken or forgotten,
// and its bytes do not change in between; so the thread never reads a slot being written.
//
// Thread safety: thread-safe. `probe` runs on the object's thread, one call at a time,
// without the object's lock held.
#ifndef FERRY_SERVER_GPU_HOST_SLOT_PROBES_H_
#define FERRY_SERVER_GPU_HOST_SLOT_PROBES_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/decode/jpeg_header.h"

namespace ferry {

class HostSlotProbes {
 public:
  // The verdict on each of the batch's rows in host slot `host_slot` (`num_samples` rows).
  using Probe = std::function<std::vector<GpuJpegVerdict>(int host_slot, uint32_t num_samples)>;

  // Starts the thread, named "ferry-probe-" + `name`.
  HostSlotProbes(Probe probe, const std::string& name);
  // Joins the thread once it is done with the slot it is probing, if any; drops the rest.
  ~HostSlotProbes();
  HostSlotProbes(const HostSlotProbes&) = delete;
  HostSlotProbes& operator=(const HostSlotProbes&) = delete;

  // Host slot `host_slot` holds a filled batch of `num_samples` rows: the thread probes it
  // after the slots queued before. Does not block.
  void Queue(int host_slot, uint32_t num_samples) ABSL_LOCKS_EXCLUDED(mutex_);
  // The slot's verdicts when the thread has probed it; nullopt when it had not started (the
  // slot then leaves the queue: the caller probes it). Waits while the thread probes it.
  std::optional<std::vector<GpuJpegVerdict>> Take(int host_slot) ABSL_LOCKS_EXCLUDED(mutex_);
  // The batch will not be taken: as Take, dropping the verdicts. On return the thread no
  // longer reads the slot.
  void Forget(int host_slot) ABSL_LOCKS_EXCLUDED(mutex_) { Take(host_slot); }

  // Takes so far that found the verdicts ready, and that did not.
  int64_t taken_ready() const ABSL_LOCKS_EXCLUDED(mutex_);
  int64_t taken_unprobed() const ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  struct Slot {
    uint32_t num_samples = 0;
    bool queued = false;  // in queue_, not yet started
    bool done = false;    // `verdicts` holds the probe
    std::vector<GpuJpegVerdict> verdicts;
  };
  void Run(const std::string& name);

  const Probe probe_;
  mutable absl::Mutex mutex_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mutex_);  // per host slot, grown on Queue
  std::deque<int> queue_ ABSL_GUARDED_BY(mutex_);    // host slots, in fill order
  int probing_ ABSL_GUARDED_BY(mutex_) = -1;         // the thread's slot
  bool quitting_ ABSL_GUARDED_BY(mutex_) = false;
  int64_t taken_ready_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t taken_unprobed_ ABSL_GUARDED_BY(mutex_) = 0;
  std::thread thread_;  // last: starts once the rest is made
};

}  // namespace ferry

#endif  // FERRY_SERVER_GPU_HOST_SLOT_PROBES_H_
