#include "server/dataset/mapped_file.h"

#include <errno.h>
#include <sys/mman.h>

#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/mapped_read.h"
#include "common/status_macros.h"

namespace ferry {

absl::Status MappedFile::Read(absl::FunctionRef<void()> read) const {
  return Read(bytes_.data(), bytes_.size(), read);
}

absl::StatusOr<std::shared_ptr<const void>> MappedFile::Hold(uint64_t offset,
                                                             uint64_t length) const {
  if (ranges_ == nullptr || length == 0) return nullptr;
  if (length > bytes_.size() || offset > bytes_.size() - length) {
    return absl::InvalidArgumentError(absl::StrCat("a read of ", length, " bytes at ", offset,
                                                   " outside the ", bytes_.size(), " of '", path_,
                                                   "'"));
  }
  return ranges_->Hold(offset, length);
}

absl::Status MappedFile::Read(const uint8_t* data, size_t length,
                              absl::FunctionRef<void()> read) const {
  std::shared_ptr<const void> hold;
  if (ranges_ != nullptr && length > 0) {
    if (data < bytes_.data() || static_cast<size_t>(data - bytes_.data()) > bytes_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a read of ", length, " bytes outside the ",
                                                     bytes_.size(), " of '", path_, "'"));
    }
    FERRY_ASSIGN_OR_RETURN(hold, Hold(static_cast<uint64_t>(data - bytes_.data()), length));
  }
  absl::Status s = GuardMappedRead(bytes_, read);
  if (s.ok()) return s;
  return DatasetChangedError(path_, bytes_.size());
}
namespace {

// Owner of one mmap: unmaps it when the last MappedFile over it goes.
class Mapping final {
 public:
  Mapping(std::string path, void* addr, size_t size)
      : path_(std::move(path)), addr_(addr), size_(size) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (::munmap(addr_, size_) != 0) {
      // Destructors never throw; a failing munmap means a corrupted address, worth a log line.
      FERRY_LOG(ERROR) << "munmap of '" << path_ << "' failed: " << std::strerror(errno);
    }
  }

 private:
  const std::string path_;
  void* const addr_;
  const size_t size_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const MappedFile>> MappingRegistry::Map(
    const std::string& path, int fd, const FileIdentity& identity) {
  const size_t size = static_cast<size_t>(identity.size);
  if (size == 0) {
    return std::make_shared<const MappedFile>(path, identity, absl::Span<const uint8_t>(), nullptr);
  }
  absl::MutexLock lock(&mutex_);
  absl::erase_if(files_, [](const auto& entry) { return entry.second.expired(); });
  std::weak_ptr<const MappedFile>& slot = files_[identity];
  if (std::shared_ptr<const MappedFile> live = slot.lock()) return live;
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    files_.erase(identity);
    return FileErrnoStatus(err, absl::StrCat("cannot map ", size, " bytes of"), path);
  }
  auto mapping = std::make_shared<const Mapping>(path, addr, size);
  auto file = std::make_shared<const MappedFile>(
      path, identity, absl::MakeConstSpan(static_cast<const uint8_t*>(addr), size),
      std::move(mapping));
  slot = file;
  return file;
}

}  // namespace ferry
