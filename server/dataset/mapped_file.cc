#include "server/dataset/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/unique_fd.h"

namespace ferry {
namespace {

// What makes two opens the same unchanged file: the inode, and its size and modification
// time when opened (a file rewritten in place gets a new mapping, as a replaced one does).
using FileKey = std::tuple<dev_t, ino_t, off_t, int64_t, int64_t>;

FileKey KeyOf(const struct stat& st) {
  return {st.st_dev, st.st_ino, st.st_size, static_cast<int64_t>(st.st_mtim.tv_sec),
          static_cast<int64_t>(st.st_mtim.tv_nsec)};
}

// The process's live mappings. Entries whose mapping is gone are swept on each Open (few
// datasets are open at once).
struct Registry {
  absl::Mutex mutex;
  absl::flat_hash_map<FileKey, std::weak_ptr<const MappedFile>> files ABSL_GUARDED_BY(mutex);
};

Registry& TheRegistry() {
  static Registry* const registry = new Registry;  // never destroyed: used until exit
  return *registry;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path,
                                                                   const DatasetFs& fs) {
  absl::StatusOr<UniqueFd> fd = fs.OpenFile(path);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return FileErrnoStatus(errno, "cannot stat", path);
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) return std::shared_ptr<const MappedFile>(new MappedFile(path, nullptr, 0));

  Registry& registry = TheRegistry();
  // Held across the mmap, so that two jobs opening one file at once map it once.
  absl::MutexLock lock(&registry.mutex);
  absl::erase_if(registry.files, [](const auto& entry) { return entry.second.expired(); });
  std::weak_ptr<const MappedFile>& slot = registry.files[KeyOf(st)];
  if (std::shared_ptr<const MappedFile> live = slot.lock()) return live;
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd->get(), 0);
  if (addr == MAP_FAILED) {
    const int err = errno;
    registry.files.erase(KeyOf(st));
    return FileErrnoStatus(err, absl::StrCat("cannot map ", size, " bytes of"), path);
  }
  std::shared_ptr<const MappedFile> file(
      new MappedFile(path, static_cast<const uint8_t*>(addr), size));
  slot = file;
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr && ::munmap(const_cast<uint8_t*>(data_), size_) != 0) {
    // Destructors never throw; a failing munmap means a corrupted address, worth a log line.
    FERRY_LOG(ERROR) << "munmap of '" << path_ << "' failed: " << std::strerror(errno);
  }
}

}  // namespace ferry
