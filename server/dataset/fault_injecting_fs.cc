#include "server/dataset/fault_injecting_fs.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/match.h"

namespace ferry {

class FaultInjectingFs::FaultyFile final : public RandomAccessFile {
 public:
  FaultyFile(const FaultInjectingFs& fs, std::unique_ptr<RandomAccessFile> base)
      : RandomAccessFile(base->path(), base->identity()), fs_(fs), base_(std::move(base)) {}

  absl::StatusOr<size_t> ReadAt(uint64_t offset, absl::Span<uint8_t> out) const override {
    const std::optional<Faults> faults = fs_.FaultsFor(path());
    if (!faults.has_value()) return base_->ReadAt(offset, out);
    {
      absl::MutexLock lock(&fs_.mutex_);
      ++fs_.faulty_reads_;
    }
    const int read = reads_.fetch_add(1, std::memory_order_relaxed);
    if (faults->read_errno != 0 && read >= faults->reads_before_error) {
      return FileErrnoStatus(faults->read_errno, "cannot read", path());
    }
    if (faults->readable_bytes.has_value()) {
      if (offset >= *faults->readable_bytes) return 0;
      out = out.subspan(0, std::min<uint64_t>(out.size(), *faults->readable_bytes - offset));
    }
    if (faults->max_read_bytes > 0) out = out.subspan(0, faults->max_read_bytes);
    return base_->ReadAt(offset, out);
  }

 private:
  const FaultInjectingFs& fs_;
  const std::unique_ptr<RandomAccessFile> base_;
  mutable std::atomic<int> reads_{0};
};

void FaultInjectingFs::Inject(const std::string& suffix, const Faults& faults) {
  absl::MutexLock lock(&mutex_);
  for (auto& [s, f] : faults_) {
    if (s == suffix) {
      f = faults;
      return;
    }
  }
  faults_.emplace_back(suffix, faults);
}

void FaultInjectingFs::Clear() {
  absl::MutexLock lock(&mutex_);
  faults_.clear();
}

int FaultInjectingFs::faulty_reads() const {
  absl::MutexLock lock(&mutex_);
  return faulty_reads_;
}

std::optional<FaultInjectingFs::Faults> FaultInjectingFs::FaultsFor(const std::string& path) const {
  absl::MutexLock lock(&mutex_);
  for (const auto& [suffix, faults] : faults_) {
    if (absl::EndsWith(path, suffix)) return faults;
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> FaultInjectingFs::OpenFile(
    const std::string& path) const {
  const std::optional<Faults> faults = FaultsFor(path);
  if (faults.has_value() && faults->open_errno != 0) {
    return FileErrnoStatus(faults->open_errno, "cannot open", path);
  }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = base_->OpenFile(path);
  if (!file.ok()) return file.status();
  return std::make_unique<FaultyFile>(*this, *std::move(file));
}

absl::StatusOr<std::shared_ptr<const MappedFile>> FaultInjectingFs::MapFile(
    const std::string& path) const {
  const std::optional<Faults> faults = FaultsFor(path);
  if (faults.has_value() && faults->open_errno != 0) {
    return FileErrnoStatus(faults->open_errno, "cannot open", path);
  }
  absl::StatusOr<std::shared_ptr<const MappedFile>> file = base_->MapFile(path);
  if (!file.ok() || !faults.has_value() || !faults->mapped_bytes.has_value()) return file;
  // A prefix of the real mapping, which it keeps alive.
  const absl::Span<const uint8_t> bytes = (*file)->bytes();
  const size_t kept = static_cast<size_t>(std::min<uint64_t>(bytes.size(), *faults->mapped_bytes));
  FileIdentity identity = (*file)->identity();
  identity.size = kept;
  return std::make_shared<const MappedFile>((*file)->path(), identity, bytes.subspan(0, kept),
                                            *file);
}

}  // namespace ferry
