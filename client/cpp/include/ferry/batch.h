// A batch a Consumer hands out (ferry/consumer.h): a view of its fields in ferryd's slot
// memory, host or GPU, and the lease on that slot, given back when the batch is released or
// dies.
//
//   FERRY_ASSIGN_OR_RETURN(std::optional<ferry::Batch> batch, consumer->Next());
//   const ferry::BatchField* tokens = batch->field("tokens");  // int64 [batch, seq_len + 1]
//   FERRY_RETURN_IF_ERROR(batch->WaitOn(stream));              // GPU batches: before reading
//   ...                                                        // enqueue work on `stream`
//   FERRY_RETURN_IF_ERROR(batch->ReleaseOn(stream));           // the slot goes back
#ifndef FERRY_CLIENT_CPP_INCLUDE_FERRY_BATCH_H_
#define FERRY_CLIENT_CPP_INCLUDE_FERRY_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "ferry/v1/dtype.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

// One field of a batch: a contiguous, C-ordered [num_samples, *per-sample shape] array.
struct BatchField {
  std::string name;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;  // batch dimension first
  // Read-only; valid until the batch is released. Host memory when `device` is -1,
  // otherwise device memory on CUDA device `device` (this process's ordinal).
  const void* data = nullptr;
  size_t bytes = 0;
  int device = -1;
};

namespace internal {
class BatchLease;
class ConsumerImpl;
}  // namespace internal

// A view of one batch in the daemon's shared memory plus a lease on its slot. The lease
// is given back (Release on the stream) by Release() or the destructor, whichever comes
// first; afterwards the daemon may overwrite the memory, so `data` pointers must not be
// used. Move-only. A Batch may outlive its Consumer (releasing it is then a no-op, and
// its memory stays mapped until the batch dies).
//
// GPU batches (device() >= 0: the job's device is "cuda:..."). The fields are device
// memory in a slot of ferryd's ring on the trainer's GPU, mapped once per attach. The
// contract, all on CUDA streams of the caller's choosing (`stream` is a cudaStream_t;
// nullptr = the device's legacy default stream), with no host synchronisation:
//   1. WaitOn(stream) before any work that reads the fields is enqueued on `stream` (or on
//      a stream ordered after it). The data is not ready before: ferryd's copy may still
//      be running when Next returns.
//   2. ReleaseOn(stream) after the last work that reads the fields has been enqueued on
//      `stream`: it records the slot's "released" event there and gives the slot back;
//      ferryd writes the slot again only after that event has completed. Work on other
//      streams must be ordered before `stream`'s record (e.g. by an event) by the caller.
//   3. Release() and the destructor on a GPU batch mean ReleaseOn(the stream last passed to
//      WaitOn), or the legacy default stream when WaitOn was never called. That stream must
//      still exist.
// The device memory stays mapped while any Batch of the attach lives, even past the
// Consumer; after a release its contents may change at any time. A failed CUDA call
// (e.g. a lost context) returns its error and leaves the lease held, since giving the slot
// back without the event could let ferryd overwrite memory still being read; the slot is
// then reclaimed when the stream ends.
// For host batches WaitOn is a no-op and ReleaseOn is Release.
//
// Thread safety: a Batch is not synchronized; use one from one thread at a time. Batches
// of one consumer may be released concurrently from different threads.
class Batch final {
 public:
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }  // batch number within the epoch
  int64_t seq() const { return seq_; }      // position in the consumer's stream
  uint32_t slot() const { return slot_; }
  uint32_t num_samples() const { return num_samples_; }
  const std::vector<BatchField>& fields() const { return fields_; }
  // The field called `name`, or null.
  const BatchField* field(std::string_view name) const;

  // Gives the slot back. Idempotent: later calls return OK and do nothing. An error means
  // the release could not be sent because the stream is gone, in which case the daemon
  // has reclaimed the slot anyway.
  absl::Status Release();
  bool released() const;

  // CUDA device of the batch's fields (this process's ordinal), or -1 for host memory.
  int device() const { return device_; }
  // GPU batches: makes `stream` wait (on the device) until the batch is in its slot.
  // Returns at once. See the contract above.
  absl::Status WaitOn(void* stream);
  // GPU batches: records the slot's released event on `stream`, then gives the slot back.
  // Idempotent like Release. See the contract above.
  absl::Status ReleaseOn(void* stream);

 private:
  friend class internal::ConsumerImpl;
  Batch() = default;

  int64_t epoch_ = 0;
  int64_t index_ = 0;
  int64_t seq_ = 0;
  uint32_t slot_ = 0;
  uint32_t num_samples_ = 0;
  int device_ = -1;
  std::vector<BatchField> fields_;
  std::unique_ptr<internal::BatchLease> lease_;
};

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_INCLUDE_FERRY_BATCH_H_
