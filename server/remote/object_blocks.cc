#include "server/remote/object_blocks.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace ferry {
namespace {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

size_t RoundUpToPage(uint64_t bytes) {
  const size_t page = PageSize();
  return static_cast<size_t>((bytes + page - 1) / page * page);
}

class BlockFile final : public RandomAccessFile {
 public:
  BlockFile(std::shared_ptr<const ObjectBlocks> blocks, const FileIdentity& identity)
      : RandomAccessFile(blocks->path, identity), blocks_(std::move(blocks)) {}

  // Up to the end of the block `offset` is in (callers loop: ReadUpTo).
  absl::StatusOr<size_t> ReadAt(uint64_t offset, absl::Span<uint8_t> out) const override {
    if (offset >= blocks_->info.size || out.empty()) return 0;
    const uint64_t block = offset / blocks_->block_bytes;
    const uint64_t within = offset - block * blocks_->block_bytes;
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(out.size(), blocks_->BlockSize(block) - within));
    FERRY_ASSIGN_OR_RETURN(const ObjectCache::Pin pin, blocks_->Block(block));
    return ReadCacheEntry(pin, within, out.subspan(0, n), path());
  }

 private:
  const std::shared_ptr<const ObjectBlocks> blocks_;
};

// The address range of a MappedFile over the blocks, the blocks mapped into it, and the
// reads that hold them.
class BlockMapping final : public MappedFile::Ranges {
 public:
  BlockMapping(std::shared_ptr<const ObjectBlocks> blocks, uint8_t* base, size_t reserved,
               uint64_t max_held_bytes)
      : blocks_(std::move(blocks)),
        base_(base),
        reserved_(reserved),
        max_held_bytes_(max_held_bytes),
        slots_(blocks_->num_blocks()) {}
  ~BlockMapping() override {
    if (::munmap(base_, reserved_) != 0) {
      FERRY_LOG(ERROR) << "munmap of the blocks of '" << blocks_->path
                       << "' failed: " << std::strerror(errno);
    }
  }

  absl::StatusOr<std::shared_ptr<const void>> Hold(uint64_t offset,
                                                   uint64_t length) const override {
    const uint64_t first = offset / blocks_->block_bytes;
    const uint64_t last = (offset + length - 1) / blocks_->block_bytes;
    for (uint64_t block = first; block <= last; ++block) {
      absl::Status held = HoldBlock(block);
      if (!held.ok()) {
        Let(first, block);
        return held;
      }
    }
    return std::shared_ptr<const void>(this,
                                       [this, first, last](const void*) { Let(first, last + 1); });
  }

  uint64_t unit_bytes() const override { return blocks_->block_bytes; }

  const uint8_t* base() const { return base_; }

 private:
  struct Slot {
    ObjectCache::Pin pin;  // set while the block is mapped
    int readers = 0;
    uint64_t used = 0;  // when a read last let it go (tick_)
  };

  // Maps `block` if it is not, and counts a reader of it.
  absl::Status HoldBlock(uint64_t block) const {
    {
      absl::MutexLock lock(&mutex_);
      Slot& slot = slots_[block];
      if (slot.pin.fd() >= 0) {
        ++slot.readers;
        return absl::OkStatus();
      }
    }
    // Fetched (or waited for) without the lock: other reads of mapped blocks go on.
    FERRY_ASSIGN_OR_RETURN(ObjectCache::Pin pin, blocks_->Block(block));
    absl::MutexLock lock(&mutex_);
    Slot& slot = slots_[block];
    if (slot.pin.fd() < 0) {
      uint8_t* at = base_ + block * blocks_->block_bytes;
      const size_t bytes = RoundUpToPage(blocks_->BlockSize(block));
      if (::mmap(at, bytes, PROT_READ, MAP_SHARED | MAP_FIXED, pin.fd(), 0) == MAP_FAILED) {
        return FileErrnoStatus(errno, absl::StrCat("cannot map block ", block, " of"),
                               blocks_->path);
      }
      slot.pin = std::move(pin);
      held_bytes_ += blocks_->BlockSize(block);
    }
    ++slot.readers;
    return absl::OkStatus();
  }

  // Ends the reads of blocks [first, end), then lets the least recently read blocks go
  // while more than max_held_bytes_ are mapped.
  void Let(uint64_t first, uint64_t end) const {
    absl::MutexLock lock(&mutex_);
    for (uint64_t block = first; block < end; ++block) {
      Slot& slot = slots_[block];
      --slot.readers;
      slot.used = ++tick_;
    }
    while (held_bytes_ > max_held_bytes_) {
      Slot* oldest = nullptr;
      uint64_t oldest_block = 0;
      for (uint64_t block = 0; block < slots_.size(); ++block) {
        Slot& slot = slots_[block];
        if (slot.pin.fd() < 0 || slot.readers > 0) continue;
        if (oldest == nullptr || slot.used < oldest->used) oldest = &slot, oldest_block = block;
      }
      if (oldest == nullptr) return;  // every mapped block is being read
      // The block's pages are replaced by an inaccessible reservation again, atomically.
      uint8_t* at = base_ + oldest_block * blocks_->block_bytes;
      const size_t bytes = RoundUpToPage(blocks_->BlockSize(oldest_block));
      if (::mmap(at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
                 0) == MAP_FAILED) {
        FERRY_LOG(WARNING) << "cannot unmap block " << oldest_block << " of '" << blocks_->path
                           << "': " << std::strerror(errno) << "; it stays held";
        return;
      }
      oldest->pin = ObjectCache::Pin();
      held_bytes_ -= blocks_->BlockSize(oldest_block);
    }
  }

  const std::shared_ptr<const ObjectBlocks> blocks_;
  uint8_t* const base_;
  const size_t reserved_;
  const uint64_t max_held_bytes_;
  mutable absl::Mutex mutex_;
  mutable std::vector<Slot> slots_ ABSL_GUARDED_BY(mutex_);
  mutable uint64_t held_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  mutable uint64_t tick_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace

absl::StatusOr<size_t> ReadCacheEntry(const ObjectCache::Pin& pin, uint64_t offset,
                                      absl::Span<uint8_t> out, const std::string& path) {
  const absl::Time start = absl::Now();
  while (true) {
    const ssize_t n = ::pread(pin.fd(), out.data(), out.size(), static_cast<off_t>(offset));
    if (n >= 0) {
      TallyRead(static_cast<uint64_t>(n), absl::ToInt64Nanoseconds(absl::Now() - start));
      return static_cast<size_t>(n);
    }
    if (errno != EINTR) return FileErrnoStatus(errno, "cannot read", path);
  }
}

uint64_t ObjectBlocks::BlockSize(uint64_t block) const {
  return std::min(block_bytes, info.size - block * block_bytes);
}

absl::StatusOr<ObjectCache::Pin> ObjectBlocks::Block(uint64_t block) const {
  ObjectCache::Key block_key = key;
  block_key.version = absl::StrCat(key.version, " block ", block, " of ", block_bytes, " bytes");
  const uint64_t offset = block * block_bytes;
  const uint64_t bytes = BlockSize(block);
  const absl::Time start = absl::Now();
  absl::StatusOr<ObjectCache::Pin> pin = cache->Get(
      block_key, bytes, [&](int fd) { return store->Read(where, offset, bytes, fd, info.etag); });
  TallyRemoteWait(absl::ToInt64Nanoseconds(absl::Now() - start));
  if (pin.ok() || IsTransientReadError(pin.status())) return pin;
  // Refused, gone, or changed since the job opened it: no other sample of the object reads.
  return StopsTheJob(absl::Status(
      pin.status().code(),
      absl::StrCat("block ", block, " of '", path, "': ", pin.status().message(),
                   ". A job reads one version of an object for its whole life: make the object "
                   "readable as it was, or create the job again to read it as it is now")));
}

std::unique_ptr<RandomAccessFile> OpenBlocks(std::shared_ptr<const ObjectBlocks> blocks,
                                             const FileIdentity& identity) {
  return std::make_unique<BlockFile>(std::move(blocks), identity);
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MapBlocks(
    std::shared_ptr<const ObjectBlocks> blocks, const FileIdentity& identity,
    uint64_t max_held_bytes) {
  const std::string path = blocks->path;
  const uint64_t size = blocks->info.size;
  if (size == 0) {
    return std::make_shared<const MappedFile>(path, identity, absl::Span<const uint8_t>(), nullptr);
  }
  const size_t reserved = RoundUpToPage(size);
  void* base =
      ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return FileErrnoStatus(errno, absl::StrCat("cannot reserve ", size, " bytes of addresses for"),
                           path);
  }
  auto mapping = std::make_shared<const BlockMapping>(
      std::move(blocks), static_cast<uint8_t*>(base), reserved, max_held_bytes);
  return std::make_shared<const MappedFile>(path, identity,
                                            absl::MakeConstSpan(mapping->base(), size),
                                            std::shared_ptr<const void>(mapping), mapping);
}

}  // namespace ferry
