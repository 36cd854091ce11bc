// A daemon-wide cap on bytes of one kind of memory (host slabs, pinned, device per GPU).
// Reservations are RAII: the bytes come back when the Reservation is destroyed.
//
//   FERRY_ASSIGN_OR_RETURN(MemoryBudget::Reservation r, budget.Reserve(bytes, "job x rank 0"));
//
// Thread-safe.
#ifndef FERRY_SERVER_MEMORY_MEMORY_BUDGET_H_
#define FERRY_SERVER_MEMORY_MEMORY_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ferry {

class MemoryBudget final {
 public:
  class Reservation final {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();
    uint64_t bytes() const { return bytes_; }

   private:
    friend class MemoryBudget;
    Reservation(MemoryBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
    MemoryBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  // `name` and `setting` appear in errors: "host memory budget", "host_memory_budget_bytes".
  MemoryBudget(std::string name, std::string setting, uint64_t limit_bytes,
               std::string config_path);
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // RESOURCE_EXHAUSTED naming the budget, the requested and free bytes, and what to lower.
  absl::StatusOr<Reservation> Reserve(uint64_t bytes, const std::string& what);

  uint64_t limit() const { return limit_; }
  uint64_t in_use() const;

 private:
  void Return(uint64_t bytes);

  const std::string name_;
  const std::string setting_;
  const uint64_t limit_;
  const std::string config_path_;
  mutable absl::Mutex mutex_;
  uint64_t in_use_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVER_MEMORY_MEMORY_BUDGET_H_
