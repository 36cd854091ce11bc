// The filesystem as a job's dataset sees it. Every file and directory a sample source opens
// goes through one DatasetFs, so that:
//  * a system daemon's dataset_roots hold at the open itself, not only for the path a request
//    names: a path is resolved beneath its root by the kernel (openat2 with RESOLVE_BENEATH),
//    and symbolic links below a root are refused unless the daemon is configured to follow
//    those that stay within the roots. A user who can write into an allowed tree cannot point
//    ferryd at a file outside it.
//  * tests can inject failures (a fault-injecting DatasetFs over the real one).
//
//   DatasetAccess access;
//   access.roots = {"/data"};
//   FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const DatasetFs> fs, MakeDatasetFs(access));
//   FERRY_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
//                          fs->OpenFile("/data/imagenet/train/n01/x.JPEG"));
//   FERRY_ASSIGN_OR_RETURN(size_t n, ReadUpTo(*file, 0, absl::MakeSpan(buffer)));
//   FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> tokens,
//                          fs->MapFile("/data/tokens.bin"));
//
// Readers read only through what OpenFile and MapFile return, so a test's DatasetFs
// (FaultInjectingFs) can fail reads with EIO, shorten them, or shrink a file.
//
// Errors name the path, never a file's contents, and carry a canonical code:
//   NOT_FOUND "dataset path '<path>' does not exist";
//   PERMISSION_DENIED for what the daemon may not read, a path outside the roots and a
//     symbolic link it does not follow (the message says what to configure);
//   RESOURCE_EXHAUSTED / UNAVAILABLE for conditions of the machine, not of the data (out of
//     file descriptors or memory, I/O errors that may pass): see IsTransientReadError.
// Thread-safety: every method is const and may be called from many threads at once.
#ifndef FERRY_SERVER_DATASET_DATASET_FS_H_
#define FERRY_SERVER_DATASET_DATASET_FS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ferry {

// What makes two opens the same unchanged file, by any path: the inode, and its size and
// modification time when opened. A file replaced (a new inode) or rewritten in place (a new
// size or mtime) since has another identity.
struct FileIdentity {
  uint64_t device = 0;
  uint64_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;

  bool operator==(const FileIdentity&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const FileIdentity& id) {
    return H::combine(std::move(h), id.device, id.inode, id.size, id.mtime_ns);
  }
};

// A regular file opened through a DatasetFs, read at any offset. It stays the file that was
// opened (a file renamed over its path later is another file). Thread-safe: ReadAt may be
// called from many threads at once.
class RandomAccessFile {
 public:
  RandomAccessFile(std::string path, const FileIdentity& identity)
      : path_(std::move(path)), identity_(identity) {}
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;
  virtual ~RandomAccessFile() = default;

  // The path it was opened by; errors name it.
  const std::string& path() const { return path_; }
  // The file when it was opened.
  const FileIdentity& identity() const { return identity_; }
  uint64_t size() const { return identity_.size; }

  // Reads up to out.size() bytes at `offset` into `out` and returns how many it read: 0 at
  // or past the end of the file, and possibly fewer than asked anywhere (as pread may), so
  // callers loop (ReadUpTo does). Errors: FileErrnoStatus(err, "cannot read", path()), so
  // that EIO is UNAVAILABLE (IsTransientReadError).
  virtual absl::StatusOr<size_t> ReadAt(uint64_t offset, absl::Span<uint8_t> out) const = 0;

 private:
  // Constant after construction.
  const std::string path_;
  const FileIdentity identity_;
};

// Reads `out.size()` bytes at `offset`, looping over short reads, and returns how many it
// read: fewer only where the file ends first (the caller says what that means for its
// format). ReadAt's errors.
absl::StatusOr<size_t> ReadUpTo(const RandomAccessFile& file, uint64_t offset,
                                absl::Span<uint8_t> out);

// Per-thread read accounting: every RandomAccessFile::ReadAt of the real filesystem adds
// the bytes it read and the wall time it took to the calling thread's tally, so the code
// that runs a task on a worker thread can tell how much of the task was file I/O (the
// difference of ThisThreadReadTally() before and after; RankPipeline counts a job's
// bytes_read and the read share of its workers' time so). Reads of a MappedFile are page
// faults inside the caller's copy and are not counted here.
struct ReadTally {
  uint64_t bytes = 0;
  int64_t nanos = 0;
  int64_t remote_nanos = 0;  // of nanos, waiting for a remote object (TallyRemoteWait)
};
// The calling thread's running totals (never reset: callers take differences).
ReadTally ThisThreadReadTally();
// Adds a read to the calling thread's tally (RealFile::ReadAt; fakes that stand for reads).
void TallyRead(uint64_t bytes, int64_t nanos);
// Adds a wait for a remote object to come into the node cache (an open of a remote dataset
// file): a read of no bytes yet, and remote.
void TallyRemoteWait(int64_t nanos);

class MappedFile;

class DatasetFs {
 public:
  enum class EntryType { kFile, kDirectory, kSymlink, kOther };
  struct Entry {
    std::string name;
    // kSymlink only for a link this filesystem does not follow; a followed link has the
    // type of its target.
    EntryType type = EntryType::kOther;
  };

  DatasetFs() = default;
  DatasetFs(const DatasetFs&) = delete;
  DatasetFs& operator=(const DatasetFs&) = delete;
  virtual ~DatasetFs() = default;

  // OK when `path` (absolute) may be read by a job; the PERMISSION_DENIED an open of it
  // would return otherwise. Checks the name only: callers use it to refuse a request before
  // touching the disk.
  virtual absl::Status CheckPath(const std::string& path) const = 0;

  // Opens a regular file read-only. INVALID_ARGUMENT when it is not a regular file.
  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
      const std::string& path) const = 0;

  // Maps a regular file read-only, or returns the live mapping of the same unchanged file
  // (FileIdentity) that this DatasetFs made earlier: jobs over one dataset then share its
  // address range, and with it the GPU transport's one registration of those pages
  // (cudaHostRegister pins by address range; two mappings of one file would pin its page
  // cache twice). A file replaced or rewritten since gets a mapping of its own; an empty
  // file an empty one. The mapping keeps the file alive: a job keeps reading the file it
  // mapped even after another is renamed over its path. Errors as OpenFile's, and mmap's
  // naming the path.
  virtual absl::StatusOr<std::shared_ptr<const MappedFile>> MapFile(
      const std::string& path) const = 0;
  // The same for a reader that reads the mapping only through ranged MappedFile::Read
  // calls and never touches bytes() outside them: a filesystem may then bring the bytes in
  // as they are read (a large remote object, cached in blocks: read_in_ranges()). Default:
  // MapFile.
  virtual absl::StatusOr<std::shared_ptr<const MappedFile>> MapFileInRanges(
      const std::string& path) const {
    return MapFile(path);
  }

  // Lists directory `path`: every entry but "." and "..", in the order the directory gives.
  virtual absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string& path) const = 0;

  // True once the daemon is stopping: code that opens many files to index a dataset (a
  // long shard list) checks it between files and gives up with StoppingError(), so that
  // SIGTERM is not held up by a job being created. Reads of an existing job's samples do
  // not check it (draining consumers finish their batches).
  virtual bool Stopping() const { return false; }
};

// The error for indexing given up because the daemon is stopping (UNAVAILABLE: retry).
absl::Status StoppingError();

// `fs`, whose Stopping() turns true when `*stopping` does.
std::shared_ptr<const DatasetFs> StoppableDatasetFs(
    std::shared_ptr<const DatasetFs> fs, std::shared_ptr<const std::atomic<bool>> stopping);

// Which paths a job may read.
struct DatasetAccess {
  // Absolute directories a job's files must lie under. Empty: any path the daemon can read
  // (a per-user daemon, which reads only what its user can read anyway).
  std::vector<std::string> roots;
  // Follow a symbolic link below a root when its target lies under one of the roots too
  // (trees that link shared files into each split). Default: false, every link is refused.
  bool follow_symlinks_within_roots = false;
  // Named in the messages that say what to configure.
  std::string config_path;
};

// The real filesystem under `access` (openat2 with RESOLVE_BENEATH, pread, mmap). It owns
// the registry of its live mappings (MapFile): the daemon makes one for all its jobs.
// INVALID_ARGUMENT for a relative root. A root that does not exist yet is allowed (it may
// be mounted later); opens under it fail until it does.
absl::StatusOr<std::shared_ptr<const DatasetFs>> MakeDatasetFs(const DatasetAccess& access);

// The real filesystem with no roots: every path the process can read. One instance for the
// process (its callers share mappings).
std::shared_ptr<const DatasetFs> UnconfinedDatasetFs();

// True for a read that failed because of the machine, not the data: out of file descriptors
// (EMFILE, ENFILE) or memory (ENOMEM), and I/O errors that may pass (EIO, EAGAIN, ESTALE,
// ETIMEDOUT). A sample that fails so is not corrupt: the reader waits and tries again.
bool IsTransientReadError(const absl::Status& status);

// A dataset file changed under a job that reads it (it shrank while mapped): no later
// sample of it can be trusted, so the job stops with this error (naming the file and what
// to do) instead of substituting samples. DATA_LOSS, marked so that IsDatasetChanged tells
// it from a corrupt sample.
absl::Status DatasetChangedError(const std::string& path, uint64_t mapped_bytes);
bool IsDatasetChanged(const absl::Status& status);
// `status`, marked as IsDatasetChanged: an error every later sample would meet too (the
// store refuses an object, or it changed since the job opened it), so the job stops with it
// instead of substituting samples.
absl::Status StopsTheJob(absl::Status status);

// The status of a failed system call on `path`: `what` ("cannot open", "cannot read") names
// the step. The code follows the classes above (RESOURCE_EXHAUSTED for EMFILE, ENFILE,
// ENOMEM; UNAVAILABLE for EIO, EAGAIN, ESTALE, ETIMEDOUT; absl's mapping otherwise).
absl::Status FileErrnoStatus(int err, const std::string& what, const std::string& path);

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_DATASET_FS_H_
