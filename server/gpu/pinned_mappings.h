// Dataset file mappings registered read-only with the driver for the page-cache gather
// (kernels read a batch's rows across PCIe straight from the page cache). One registration
// per mapping however many ranks read it (registering a range twice fails), counted once
// against the pinned budget.
//
// Registering reads the whole file in, at the disk's speed when it is not cached, so each
// registration runs on a thread of its own: Acquire reserves the budget, starts the
// registration and waits for it at most `wait`; the Lease tells whether it is done. A Lease
// keeps its mapping registered; the last one to go unregisters it (after the registering
// thread is done) without the registry's lock, so other mappings' Acquires go on, while an
// Acquire of the same mapping waits for it to be gone (a range registers only once).
//
//   PinnedMappings mappings(&pinned_budget);  // registers with cudaHostRegister
//   FERRY_ASSIGN_OR_RETURN(PinnedMappings::Lease lease,
//                          mappings.Acquire(rows, device, absl::Seconds(1)));
//   absl::StatusOr<const PinnedRange*> range = lease.registration();  // UNAVAILABLE: not yet
//
// Thread safety: Acquire may be called from any thread. A Lease is used by one thread at a
// time; different Leases may be used and destroyed concurrently. Every Lease must go before
// the PinnedMappings that made it.
#ifndef FERRY_SERVER_GPU_PINNED_MAPPINGS_H_
#define FERRY_SERVER_GPU_PINNED_MAPPINGS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/dataset/sample_source.h"
#include "server/memory/memory_budget.h"

namespace ferry {

// A host range registered with the driver; unregistered when destroyed.
class PinnedRange {
 public:
  PinnedRange() = default;
  PinnedRange(const PinnedRange&) = delete;
  PinnedRange& operator=(const PinnedRange&) = delete;
  virtual ~PinnedRange() = default;

  // The address at which kernels on `device` read the range.
  virtual absl::StatusOr<const void*> DeviceData(int device) const = 0;
};

// Registers `bytes` bytes at `data` (whole pages of a read-only file mapping) for `device`,
// or says why not. Runs on a registering thread of its own, concurrently with other
// registrations.
using PinnedRangeRegistrar = std::function<absl::StatusOr<std::unique_ptr<PinnedRange>>(
    void* data, size_t bytes, int device)>;

// The registrar of ferryd: HostRegistration::Create(data, bytes, kReadOnly) with `device`
// current.
PinnedRangeRegistrar CudaHostRegistrar();

class PinnedMappings final {
 private:
  struct Entry;

 public:
  class Lease final {
   public:
    Lease(Lease&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)), key_(other.key_), entry_(other.entry_) {}
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease();

    // The pinned budget this mapping holds (0 once its registration failed).
    uint64_t bytes() const;
    // Not done yet: UNAVAILABLE. Done: the registration (kept until the last Lease goes),
    // or why it failed.
    absl::StatusOr<const PinnedRange*> registration() const;

   private:
    friend class PinnedMappings;
    Lease(PinnedMappings* owner, const void* key, Entry* entry)
        : owner_(owner), key_(key), entry_(entry) {}
    PinnedMappings* owner_;
    const void* key_;
    Entry* entry_;  // owned by the registry
  };

  // `budget` (the pinned one) must outlive this. `registrar` registers each mapping.
  explicit PinnedMappings(MemoryBudget* budget,
                          PinnedRangeRegistrar registrar = CudaHostRegistrar());
  PinnedMappings(const PinnedMappings&) = delete;
  PinnedMappings& operator=(const PinnedMappings&) = delete;

  // A Lease on `rows.mapping` (its whole pages) registered for `device`, starting the
  // registration unless another Lease holds it. RESOURCE_EXHAUSTED (the pinned budget,
  // naming the file) at once; the registration's outcome through the Lease, after waiting
  // for it up to `wait`.
  absl::StatusOr<Lease> Acquire(const DirectRows& rows, int device, absl::Duration wait)
      ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  struct Entry {
    int users = 0;  // Leases; guarded by PinnedMappings::mutex_
    absl::Mutex mutex;
    // Given back when the registration fails: nothing stays pinned then.
    MemoryBudget::Reservation reservation ABSL_GUARDED_BY(mutex);
    bool done ABSL_GUARDED_BY(mutex) = false;
    absl::StatusOr<std::unique_ptr<PinnedRange>> registration ABSL_GUARDED_BY(mutex) =
        absl::UnavailableError("registering");
    std::thread registering;  // joined by ~Entry: the registration outlives no thread
    ~Entry();
  };

  void Release(const void* key) ABSL_LOCKS_EXCLUDED(mutex_);

  // Constant after construction. registrar_ is declared before entries_: the registering
  // threads (joined when their Entry goes) call it.
  MemoryBudget* const budget_;
  const PinnedRangeRegistrar registrar_;

  // State below is protected by mutex_.
  absl::Mutex mutex_;
  absl::flat_hash_map<const void*, std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mutex_);
  // Mappings whose last Lease is unregistering them now.
  absl::flat_hash_set<const void*> retiring_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ferry

#endif  // FERRY_SERVER_GPU_PINNED_MAPPINGS_H_
