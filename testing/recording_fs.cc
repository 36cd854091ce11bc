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

}  // namespace

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
