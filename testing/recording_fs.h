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

}  // namespace ferry

#endif  // FERRY_TESTING_RECORDING_FS_H_
