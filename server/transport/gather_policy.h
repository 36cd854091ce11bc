// Whether a rank's next batch has its rows gathered by the device stage (kernels in
// ferryd's CUDA context reading the dataset's pinned page cache) or written by the workers
// into the host slot and moved by a slot copy (the copy engine).
//
// Why it matters: without MPS the GPU runs one CUDA context at a time. A slot copy runs on
// the copy engine beside the trainer's kernels and costs its step little. A gather kernel
// must wait for ferryd's context to get the GPU, and a trainer whose host runs ahead of its
// GPU keeps the GPU busy for milliseconds on end: gathers enqueued while it computes (and
// every copy queued behind them on their stream) wait until its GPU runs dry, so it runs
// dry on every pass through the ring. Gathering pays only while the trainer waits for
// batches, where it is faster than the workers' copy. docs/benchmarks.md ("Raw records:
// gathered from the page cache", "What feeding a step costs the step") has the figures.
//
// So the policy gathers only while the trainer waits, or soon will, and reads two signs
// that it will not:
//  - Its GPU is behind its host: work on its `kGpuBehind` latest released slots is still
//    queued there (their released signals pending). One pending is the batch its GPU
//    is on (a safe-mode Loader's clone of the batch just taken, or the step over it), which
//    may end any moment. Once seen, the next ring's worth of batches is copied even if the
//    sign goes away: a trainer that ran dry (its host waiting on batches held up by
//    ferryd's own kernels) shows nothing pending, yet resumes computing as soon as a batch
//    arrives, and the gathers chosen then would be held up in turn.
//  - It holds most slots (sent to it and not released, or released with their signals
//    pending): it is busy with those and this batch has their time to be made. Most is 3/4
//    of the slots but one: a batch is scheduled when its host slot frees, as its
//    predecessor's copy completes, so that copy's device slot is not held yet (with 2 or 3
//    slots, 3/4 of them all could never be reached; a ring of 1 is never gathered).
//
// For each batch the pipeline schedules, the device ring counts the consumer's leased
// slots and asks its stage about its latest releases (DeviceRing::PlanBatch):
//   GatherPolicy policy(num_device_slots);
//   slot.gather = policy.GatherNext(leased, pending);
// Not thread-safe: the ring calls it under its lock, and starts a new one for each
// consumer (what it learned was about that consumer's GPU).
#ifndef FERRY_SERVER_TRANSPORT_GATHER_POLICY_H_
#define FERRY_SERVER_TRANSPORT_GATHER_POLICY_H_

namespace ferry {

class GatherPolicy final {
 public:
  // Released signals pending on the trainer's GPU that say it is behind its host.
  static constexpr int kGpuBehind = 2;

  // `slots`: the rank's device slots.
  explicit GatherPolicy(int slots = 0) : slots_(slots) {}

  // For the batch being scheduled: `leased` batches are sent to the consumer and not
  // released; the latest `pending` of those it released still have their released
  // signal pending (the caller may stop counting at kGpuBehind). True: gather it.
  bool GatherNext(int leased, int pending);

 private:
  int slots_;
  int copies_left_ = 0;  // batches still copied since the trainer's GPU was last behind
};

}  // namespace ferry

#endif  // FERRY_SERVER_TRANSPORT_GATHER_POLICY_H_
