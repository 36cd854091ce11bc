#include "server/memory/shared_slab.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/topology/topology.h"

namespace ferry {

absl::StatusOr<SharedSlab> SharedSlab::Create(const std::string& name, size_t bytes,
                                              int numa_node) {
  if (bytes == 0) return absl::InvalidArgumentError("shared slab of 0 bytes");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  bytes = (bytes + page - 1) / page * page;
  UniqueFd fd(memfd_create(absl::StrCat("ferry-", name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat("memfd_create for slab ", name, ": ", strerror(errno)));
  }
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size slab ", name, " to ", bytes, " bytes: ", strerror(errno)));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map slab ", name, " of ", bytes, " bytes: ", strerror(errno)));
  }
  SharedSlab slab(std::move(fd), static_cast<uint8_t*>(p), bytes);
  FERRY_RETURN_IF_ERROR(BindMemoryToNode(p, bytes, numa_node));
  // First touch after the binding, so pages land on the bound node. A memfd that cannot be
  // backed (tmpfs limits) raises SIGBUS here rather than in a worker later; fallocate makes
  // that an error instead.
  if (fallocate(slab.fd(), 0, 0, static_cast<off_t>(bytes)) != 0 && errno != EOPNOTSUPP) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes,
                                                     " bytes of shared memory for slab ", name,
                                                     ": ", strerror(errno)));
  }
  for (size_t off = 0; off < bytes; off += page) slab.data_[off] = 0;
  // The trainer gets this fd. Sealed, it cannot shrink the file under ferryd's mapping
  // (ferryd's next write there would be a SIGBUS) nor, where the kernel has
  // F_SEAL_FUTURE_WRITE (5.1+), map it writable: the slab is read-only outside ferryd.
  if (fcntl(slab.fd(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    return absl::InternalError(absl::StrCat("sealing slab ", name, ": ", strerror(errno)));
  }
#ifdef F_SEAL_FUTURE_WRITE
  (void)fcntl(slab.fd(), F_ADD_SEALS, F_SEAL_FUTURE_WRITE);
#endif
  (void)fcntl(slab.fd(), F_ADD_SEALS, F_SEAL_SEAL);
  return slab;
}

SharedSlab::SharedSlab(SharedSlab&& other) noexcept
    : fd_(std::move(other.fd_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

SharedSlab& SharedSlab::operator=(SharedSlab&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    fd_ = std::move(other.fd_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SharedSlab::~SharedSlab() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace ferry
