// A shared-memory slab: one memfd, mapped once, optionally bound to a NUMA node before the
// first touch. The host transport hands its fd to the trainer over the session socket; the
// trainer maps it read-only and reads batch rows in place.
//
// memfd (not shm_open) because it has no name in /dev/shm: whatever way either side exits,
// the kernel frees the memory when the last fd and mapping are gone, and nothing is left
// behind to clean up.
//
//   FERRY_ASSIGN_OR_RETURN(SharedSlab slab, SharedSlab::Create("job-1/rank-0", bytes, node));
//   uint8_t* p = slab.data();  int fd = slab.fd();
#ifndef FERRY_SERVER_MEMORY_SHARED_SLAB_H_
#define FERRY_SERVER_MEMORY_SHARED_SLAB_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/unique_fd.h"

namespace ferry {

class SharedSlab final {
 public:
  // Creates a memfd of `bytes` (rounded up to the page size), maps it read-write, binds it
  // to `numa_node` (-1: no binding) and touches every page so it is resident before use.
  // RESOURCE_EXHAUSTED when the kernel refuses the memory.
  static absl::StatusOr<SharedSlab> Create(const std::string& name, size_t bytes, int numa_node);

  SharedSlab(SharedSlab&& other) noexcept;
  SharedSlab& operator=(SharedSlab&& other) noexcept;
  SharedSlab(const SharedSlab&) = delete;
  SharedSlab& operator=(const SharedSlab&) = delete;
  ~SharedSlab();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_.get(); }

 private:
  SharedSlab(UniqueFd fd, uint8_t* data, size_t size)
      : fd_(std::move(fd)), data_(data), size_(size) {}

  UniqueFd fd_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVER_MEMORY_SHARED_SLAB_H_
