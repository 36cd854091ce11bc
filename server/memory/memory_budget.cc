#include "server/memory/memory_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry {

MemoryBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

MemoryBudget::Reservation& MemoryBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr) budget_->Return(bytes_);
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

MemoryBudget::Reservation::~Reservation() {
  if (budget_ != nullptr) budget_->Return(bytes_);
}

MemoryBudget::MemoryBudget(std::string name, std::string setting, uint64_t limit_bytes,
                           std::string config_path)
    : name_(std::move(name)),
      setting_(std::move(setting)),
      limit_(limit_bytes),
      config_path_(std::move(config_path)) {}

absl::StatusOr<MemoryBudget::Reservation> MemoryBudget::Reserve(uint64_t bytes,
                                                                const std::string& what) {
  absl::MutexLock lock(&mutex_);
  if (bytes > limit_ || in_use_ > limit_ - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", bytes, " bytes but the ", name_, " has ", limit_ - in_use_, " of ", limit_,
        " bytes free; lower batch_size or prefetch_depth, delete idle jobs "
        "(ferryctl jobs), or raise ",
        setting_, " in ", config_path_));
  }
  in_use_ += bytes;
  return Reservation(this, bytes);
}

uint64_t MemoryBudget::in_use() const {
  absl::MutexLock lock(&mutex_);
  return in_use_;
}

void MemoryBudget::Return(uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  in_use_ -= bytes;
}

}  // namespace ferry
