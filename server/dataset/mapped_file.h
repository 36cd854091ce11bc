// A read-only view of a whole file's bytes, shared by its owners: what DatasetFs::MapFile
// returns (the real filesystem maps the file; a test's may hand out memory, or fewer bytes).
//
//   FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
//                          fs->MapFile("/data/tokens.bin"));
//   absl::Span<const uint8_t> bytes = file->bytes();
//
// bytes() may be read from any thread; they stay valid while the MappedFile lives.
#ifndef FERRY_SERVER_DATASET_MAPPED_FILE_H_
#define FERRY_SERVER_DATASET_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/dataset/dataset_fs.h"

namespace ferry {

class MappedFile final {
 public:
  // What brings a mapping's bytes in as they are read (DatasetFs::MapFileInRanges: a remote
  // object cached in blocks): Hold makes bytes [offset, offset + length) readable, fetching
  // what is missing, and keeps them so while the returned hold lives. Errors name the file
  // and the cause (a network error is the store's, never the data's).
  class Ranges {
   public:
    virtual ~Ranges() = default;
    virtual absl::StatusOr<std::shared_ptr<const void>> Hold(uint64_t offset,
                                                             uint64_t length) const = 0;
    // The unit Hold brings bytes in by (a block): holding any byte of a unit brings in the
    // whole unit, which starts at a multiple of unit_bytes(). > 0.
    virtual uint64_t unit_bytes() const = 0;
  };

  // `bytes` (the file's, from its first byte) stay valid while `owner` lives: the mapping
  // that unmaps itself when destroyed, or a fake's memory. `owner` may be null for empty
  // bytes. With `ranges`, only the bytes a Read holds may be touched.
  MappedFile(std::string path, const FileIdentity& identity, absl::Span<const uint8_t> bytes,
             std::shared_ptr<const void> owner, std::shared_ptr<const Ranges> ranges = nullptr)
      : path_(std::move(path)),
        identity_(identity),
        bytes_(bytes),
        owner_(std::move(owner)),
        ranges_(std::move(ranges)) {}
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  absl::Span<const uint8_t> bytes() const { return bytes_; }
  // Runs `read`, which reads bytes(), so that the file shrinking under the mapping (its
  // owner truncates it) ends the read with DatasetChangedError instead of a SIGBUS that
  // would kill ferryd. `read` is abandoned where it faults: it may only copy (see
  // common/mapped_read.h). A mapping read in ranges holds all of its bytes for it.
  absl::Status Read(absl::FunctionRef<void()> read) const;
  // The same for a read of only bytes [data, data + length) of bytes(): a mapping read in
  // ranges fetches and holds just those. INVALID_ARGUMENT for a range outside bytes().
  absl::Status Read(const uint8_t* data, size_t length, absl::FunctionRef<void()> read) const;
  // Whether bytes() are fetched as they are read (then only held ranges may be touched,
  // and the mapping cannot be registered with a device whole).
  bool read_in_ranges() const { return ranges_ != nullptr; }
  // For a mapping read in ranges: fetches bytes [offset, offset + length) as a Read of them
  // would, and keeps them readable while the returned hold lives, so that a Read soon after
  // finds them there (ReadAhead fetches the ranges of a job's next batches so). The hold
  // must not outlive this MappedFile. Null for a mapping not read in ranges (all its bytes
  // are there) and for length 0. INVALID_ARGUMENT for a range outside bytes(); the fetch's
  // errors as Read's.
  absl::StatusOr<std::shared_ptr<const void>> Hold(uint64_t offset, uint64_t length) const;
  // The unit a mapping read in ranges brings bytes in by (Ranges::unit_bytes); 0 for one not
  // read in ranges.
  uint64_t range_unit() const { return ranges_ != nullptr ? ranges_->unit_bytes() : 0; }
  // The path the file was first mapped by (another opener may have named it by another
  // link: the file is the same).
  const std::string& path() const { return path_; }
  const FileIdentity& identity() const { return identity_; }

 private:
  // Constant after construction.
  const std::string path_;
  const FileIdentity identity_;
  const absl::Span<const uint8_t> bytes_;
  const std::shared_ptr<const void> owner_;
  const std::shared_ptr<const Ranges> ranges_;
};

// Bytes [offset, offset + length) of a mapping: a range a sample's read touches
// (SampleSource::RangesOf). `file` is shared, so the range may outlive its reader.
struct MappedRange {
  std::shared_ptr<const MappedFile> file;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// The live mappings of one DatasetFs, by FileIdentity (DatasetFs::MapFile's sharing). Entries
// whose mapping is gone are swept on each Map (few datasets are open at once). Thread-safe.
class MappingRegistry final {
 public:
  MappingRegistry() = default;
  MappingRegistry(const MappingRegistry&) = delete;
  MappingRegistry& operator=(const MappingRegistry&) = delete;

  // The live mapping of the file with `identity`, else a new mapping of `fd` (an open
  // descriptor of that file, `path` naming it; the caller closes it: the mapping keeps the
  // file alive). An empty file gets empty bytes and nothing mapped. mmap's errors as
  // FileErrnoStatus, naming the path.
  absl::StatusOr<std::shared_ptr<const MappedFile>> Map(const std::string& path, int fd,
                                                        const FileIdentity& identity);

 private:
  absl::Mutex mutex_;
  // Held across the mmap, so that two jobs opening one file at once map it once.
  absl::flat_hash_map<FileIdentity, std::weak_ptr<const MappedFile>> files_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_MAPPED_FILE_H_
