#include "server/gpu/pinned_mappings.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/thread_name.h"
#include "cuda/cuda_resources.h"

namespace ferry {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

class RegisteredRange final : public PinnedRange {
 public:
  explicit RegisteredRange(HostRegistration registration)
      : registration_(std::move(registration)) {}
  absl::StatusOr<const void*> DeviceData(int device) const override {
    return registration_.DeviceData(device);
  }

 private:
  HostRegistration registration_;
};

}  // namespace

PinnedRangeRegistrar CudaHostRegistrar() {
  return [](void* data, size_t bytes, int device) -> absl::StatusOr<std::unique_ptr<PinnedRange>> {
    absl::StatusOr<HostRegistration> registration =
        HostRegistration::Create(device, data, bytes, HostRegistration::Access::kReadOnly);
    if (!registration.ok()) return registration.status();
    return std::make_unique<RegisteredRange>(*std::move(registration));
  };
}

PinnedMappings::Lease::~Lease() {
  if (owner_ != nullptr) owner_->Release(key_);
}

uint64_t PinnedMappings::Lease::bytes() const {
  absl::MutexLock lock(&entry_->mutex);
  return entry_->reservation.bytes();
}

absl::StatusOr<const PinnedRange*> PinnedMappings::Lease::registration() const {
  absl::MutexLock lock(&entry_->mutex);
  if (!entry_->done) return absl::UnavailableError("still registering");
  if (!entry_->registration.ok()) return entry_->registration.status();
  return entry_->registration->get();
}

PinnedMappings::Entry::~Entry() {
  if (registering.joinable()) registering.join();
}

PinnedMappings::PinnedMappings(MemoryBudget* budget, PinnedRangeRegistrar registrar)
    : budget_(budget), registrar_(std::move(registrar)) {}

absl::StatusOr<PinnedMappings::Lease> PinnedMappings::Acquire(const DirectRows& rows, int device,
                                                              absl::Duration wait) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uint64_t bytes = RoundUp(rows.mapping_bytes, page);  // the mapping's whole pages
  Entry* entry;
  {
    absl::MutexLock lock(&mutex_);
    auto gone = [this, key = rows.mapping]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return !retiring_.contains(key); };
    mutex_.Await(absl::Condition(&gone));
    std::unique_ptr<Entry>& slot = entries_[rows.mapping];
    if (slot == nullptr) {
      absl::StatusOr<MemoryBudget::Reservation> reservation =
          budget_->Reserve(bytes, absl::StrCat("the pinned page cache of '", rows.path, "'"));
      if (!reservation.ok()) {
        entries_.erase(rows.mapping);
        return reservation.status();
      }
      slot = std::make_unique<Entry>();
      Entry* e = slot.get();
      {
        absl::MutexLock entry_lock(&e->mutex);
        e->reservation = *std::move(reservation);
      }
      uint8_t* data = const_cast<uint8_t*>(rows.mapping);
      e->registering = std::thread([this, e, data, bytes, device] {
        NameThisThread("ferry-register");
        absl::StatusOr<std::unique_ptr<PinnedRange>> r = registrar_(data, bytes, device);
        absl::MutexLock lock(&e->mutex);
        if (!r.ok()) e->reservation = MemoryBudget::Reservation();
        e->registration = std::move(r);
        e->done = true;
      });
    }
    entry = slot.get();
    ++entry->users;
  }
  Lease lease(this, rows.mapping, entry);
  absl::MutexLock lock(&entry->mutex);
  entry->mutex.AwaitWithTimeout(absl::Condition(&entry->done), wait);
  return lease;
}

void PinnedMappings::Release(const void* key) {
  std::unique_ptr<Entry> last;
  {
    absl::MutexLock lock(&mutex_);
    auto it = entries_.find(key);
    if (it == entries_.end() || --it->second->users > 0) return;
    last = std::move(it->second);
    entries_.erase(it);
    retiring_.insert(key);
  }
  // Joins the registering thread (it may be reading a whole file in) and unregisters, a
  // CUDA call: not under the registry's lock.
  last.reset();
  absl::MutexLock lock(&mutex_);
  retiring_.erase(key);
}

}  // namespace ferry
