// A DatasetFs for tests that wraps another (normally the real one) and injects the faults
// readers must survive: a read failing with an errno (EIO), reads returning fewer bytes than
// asked, a file that shrinks after it was opened, opens and maps that fail, and mappings
// shorter than the file. Faults apply to the files whose path ends with a given suffix.
//
//   auto fs = std::make_shared<FaultInjectingFs>(UnconfinedDatasetFs());
//   fs->FailReads("x.jpg", EIO);
//   absl::Status s = source->Fill(...);  // UNAVAILABLE "cannot read '.../x.jpg': ..."
//
// Thread-safe: faults may be changed while other threads read. Files it opened must not
// outlive it (a source holds its DatasetFs, so its files do not).
#ifndef FERRY_SERVER_DATASET_FAULT_INJECTING_FS_H_
#define FERRY_SERVER_DATASET_FAULT_INJECTING_FS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/dataset/dataset_fs.h"
#include "server/dataset/mapped_file.h"

namespace ferry {

class FaultInjectingFs final : public DatasetFs {
 public:
  // What happens to the files whose path ends with a suffix.
  struct Faults {
    // ReadAt fails with this errno (FileErrnoStatus "cannot read"). Default: 0, none.
    int read_errno = 0;
    // Reads before read_errno takes effect (a file that fails part way). Default: 0.
    int reads_before_error = 0;
    // ReadAt returns at most this many bytes (0: as many as asked). Default: 0.
    size_t max_read_bytes = 0;
    // The file reads as if it ended here (it shrank after it was opened). Default: none.
    std::optional<uint64_t> readable_bytes;
    // OpenFile and MapFile fail with this errno (FileErrnoStatus "cannot open").
    // Default: 0, none.
    int open_errno = 0;
    // MapFile gives only the first this many bytes (the file shrank between its stat and
    // its mapping). Default: none.
    std::optional<uint64_t> mapped_bytes;
  };

  explicit FaultInjectingFs(std::shared_ptr<const DatasetFs> base) : base_(std::move(base)) {}

  // Sets the faults of the files whose path ends with `suffix` (replacing that suffix's).
  void Inject(const std::string& suffix, const Faults& faults);
  // Removes every fault: the base filesystem as it is.
  void Clear();
  // ReadAt calls on files with faults, so far.
  int faulty_reads() const;

  absl::Status CheckPath(const std::string& path) const override { return base_->CheckPath(path); }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
      const std::string& path) const override;
  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFile(const std::string& path) const override;
  absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string& path) const override {
    return base_->ListDirectory(path);
  }
  bool Stopping() const override { return base_->Stopping(); }

 private:
  class FaultyFile;
  // The faults for `path`, if any. Looked up at each read, so that a test may inject faults
  // into files already open.
  std::optional<Faults> FaultsFor(const std::string& path) const;

  // Constant after construction.
  const std::shared_ptr<const DatasetFs> base_;

  mutable absl::Mutex mutex_;
  std::vector<std::pair<std::string, Faults>> faults_ ABSL_GUARDED_BY(mutex_);
  mutable int faulty_reads_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_FAULT_INJECTING_FS_H_
