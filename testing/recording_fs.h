// A DatasetFs for tests of code that opens dataset files ahead of their readers
// (FetchAhead, ReadAhead): it records every open, in the order they start, and returns a
// file of `bytes` bytes that reads nothing. A path holding "missing" is NOT_FOUND.
// Options make the opens meet in time whatever the machine's load:
//  * hold_first: the first open waits until Release() (or 10 s);
//  * gather = N: the first opens wait until N of them are open together (or 10 s).
// Thread-safe.
#ifndef FERRY_TESTING_RECORDING_FS_H_
#define FERRY_TESTING_RECORDING_FS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/dataset/dataset_fs.h"
#include "server/dataset/mapped_file.h"

namespace ferry {

class RecordingFs final : public DatasetFs {
 public:
  struct Options {
    uint64_t bytes = 0;  // of every file
    bool hold_first = false;
    int gather = 1;
  };
  explicit RecordingFs(const Options& options) : options_(options) {}

  absl::Status CheckPath(const std::string&) const override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
      const std::string& path) const override;
  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFile(const std::string&) const override;
  absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string&) const override;

  // Lets the held first open go on.
  void Release();
  // The opens started so far, once there are `count` of them (or after 10 s).
  std::vector<std::string> Opened(size_t count = 0) const;
  // The most opens that were under way at once.
  int most_at_once() const;

 private:
  const Options options_;
  mutable absl::Mutex mutex_;
  bool released_ ABSL_GUARDED_BY(mutex_) = false;
  mutable bool gathered_ ABSL_GUARDED_BY(mutex_) = false;
  mutable std::vector<std::string> opened_ ABSL_GUARDED_BY(mutex_);
  mutable int open_now_ ABSL_GUARDED_BY(mutex_) = 0;
  mutable int most_at_once_ ABSL_GUARDED_BY(mutex_) = 0;
};

// The real filesystem (UnconfinedDatasetFs) whose MapFileInRanges mappings are read in
// ranges of `unit` bytes, as a large remote object's are: every MappedFile::Hold (each
// ranged Read makes one) is recorded, so a test can compare what a reader read with what
// SampleSource::RangesOf says it reads. The bytes are the real mapping's, all there.
// Thread-safe.
class RangesRecordingFs final : public DatasetFs {
 public:
  struct Held {
    std::string path;
    uint64_t offset = 0;
    uint64_t length = 0;
    bool operator==(const Held&) const = default;
  };
  explicit RangesRecordingFs(uint64_t unit) : unit_(unit) {}

  absl::Status CheckPath(const std::string& path) const override;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
      const std::string& path) const override;
  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFile(const std::string& path) const override;
  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFileInRanges(
      const std::string& path) const override;
  absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string& path) const override;

  // The holds since the last call, in the order made; clears them.
  std::vector<Held> TakeHeld() const;
  void Record(Held held) const;

 private:
  const uint64_t unit_;
  mutable absl::Mutex mutex_;
  mutable std::vector<Held> held_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ferry

#endif  // FERRY_TESTING_RECORDING_FS_H_
