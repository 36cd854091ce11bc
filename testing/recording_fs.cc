#include "testing/recording_fs.h"

#include <algorithm>
#include <utility>

#include "absl/time/time.h"

namespace ferry {
namespace {

class EmptyFile final : public RandomAccessFile {
 public:
  EmptyFile(std::string path, uint64_t bytes)
      : RandomAccessFile(std::move(path), FileIdentity{.size = bytes}) {}
  absl::StatusOr<size_t> ReadAt(uint64_t, absl::Span<uint8_t>) const override { return 0; }
};

// Records each Hold with the filesystem; the mapping's bytes are all there already.
class RecordingRanges final : public MappedFile::Ranges {
 public:
  RecordingRanges(const RangesRecordingFs* fs, std::string path, uint64_t unit)
      : fs_(fs), path_(std::move(path)), unit_(unit) {}
  absl::StatusOr<std::shared_ptr<const void>> Hold(uint64_t offset,
                                                   uint64_t length) const override {
    fs_->Record({path_, offset, length});
    return std::shared_ptr<const void>(this, [](const void*) {});
  }
  uint64_t unit_bytes() const override { return unit_; }

 private:
  const RangesRecordingFs* const fs_;
  const std::string path_;
  const uint64_t unit_;
};

}  // namespace

absl::Status RangesRecordingFs::CheckPath(const std::string& path) const {
  return UnconfinedDatasetFs()->CheckPath(path);
}
absl::StatusOr<std::unique_ptr<RandomAccessFile>> RangesRecordingFs::OpenFile(
    const std::string& path) const {
  return UnconfinedDatasetFs()->OpenFile(path);
}
absl::StatusOr<std::shared_ptr<const MappedFile>> RangesRecordingFs::MapFile(
    const std::string& path) const {
  return UnconfinedDatasetFs()->MapFile(path);
}
absl::StatusOr<std::shared_ptr<const MappedFile>> RangesRecordingFs::MapFileInRanges(
    const std::string& path) const {
  absl::StatusOr<std::shared_ptr<const MappedFile>> real = UnconfinedDatasetFs()->MapFile(path);
  if (!real.ok()) return real.status();
  const std::shared_ptr<const MappedFile>& file = *real;
  return std::make_shared<const MappedFile>(file->path(), file->identity(), file->bytes(),
                                            std::shared_ptr<const void>(file),
                                            std::make_shared<RecordingRanges>(this, path, unit_));
}
absl::StatusOr<std::vector<DatasetFs::Entry>> RangesRecordingFs::ListDirectory(
    const std::string& path) const {
  return UnconfinedDatasetFs()->ListDirectory(path);
}
std::vector<RangesRecordingFs::Held> RangesRecordingFs::TakeHeld() const {
  absl::MutexLock lock(&mutex_);
  std::vector<Held> held;
  held.swap(held_);
  return held;
}
void RangesRecordingFs::Record(Held held) const {
  absl::MutexLock lock(&mutex_);
  held_.push_back(std::move(held));
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> RecordingFs::OpenFile(
    const std::string& path) const {
  absl::MutexLock lock(&mutex_);
  opened_.push_back(path);
  most_at_once_ = std::max(most_at_once_, ++open_now_);
  if (options_.hold_first && opened_.size() == 1) {
    auto released = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return released_; };
    mutex_.AwaitWithTimeout(absl::Condition(&released), absl::Seconds(10));
  }
  if (!gathered_) {
    // Once `gather` are open together (or the wait timed out), no open waits any more.
    auto all_open = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
      return gathered_ || open_now_ >= options_.gather;
    };
    mutex_.AwaitWithTimeout(absl::Condition(&all_open), absl::Seconds(10));
    gathered_ = true;
  }
  --open_now_;
  if (path.find("missing") != std::string::npos) return absl::NotFoundError(path);
  return std::unique_ptr<RandomAccessFile>(new EmptyFile(path, options_.bytes));
}

absl::StatusOr<std::shared_ptr<const MappedFile>> RecordingFs::MapFile(const std::string&) const {
  return absl::UnimplementedError("RecordingFs maps no file");
}

absl::StatusOr<std::vector<DatasetFs::Entry>> RecordingFs::ListDirectory(const std::string&) const {
  return absl::UnimplementedError("RecordingFs lists no folder");
}

void RecordingFs::Release() {
  absl::MutexLock lock(&mutex_);
  released_ = true;
}

std::vector<std::string> RecordingFs::Opened(size_t count) const {
  absl::MutexLock lock(&mutex_);
  auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return opened_.size() >= count; };
  mutex_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  return opened_;
}

int RecordingFs::most_at_once() const {
  absl::MutexLock lock(&mutex_);
  return most_at_once_;
}

}  // namespace ferry
