#include "server/pipeline/read_ahead.h"

#include <algorithm>
#include <utility>

namespace ferry {

ReadAhead::ReadAhead(std::shared_ptr<const DatasetFs> fs, const Options& options)
    : fs_(std::move(fs)),
      lane_files_(std::max<int64_t>(1, options.max_files / std::max(1, options.ranks))),
      lane_bytes_(std::max<uint64_t>(
          1, options.max_bytes / static_cast<uint64_t>(std::max(1, options.ranks)))),
      lanes_(static_cast<size_t>(std::max(1, options.ranks))) {
  const int connections = std::max(1, options.connections);
  threads_.reserve(static_cast<size_t>(connections));
  for (int i = 0; i < connections; ++i) threads_.emplace_back([this] { Run(); });
}

ReadAhead::~ReadAhead() {
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

bool ReadAhead::HasRoomLocked(const Lane& lane) const {
  return static_cast<int64_t>(lane.items.size()) < lane_files_ && lane.bytes < lane_bytes_ &&
         static_cast<int64_t>(lane.batches.size()) < lane_files_;
}

bool ReadAhead::HasRoom(int rank) const {
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || static_cast<size_t>(rank) >= lanes_.size()) return false;
  return !stopping_ && HasRoomLocked(lanes_[rank]);
}

bool ReadAhead::Add(int rank, BatchKey key, const std::vector<std::string>& files,
                    const std::vector<MappedRange>& ranges) {
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || static_cast<size_t>(rank) >= lanes_.size()) return true;
  Lane& lane = lanes_[rank];
  if (lane.last_added.has_value() && key <= *lane.last_added) return true;
  // The batch's units not in the lane yet, each once (neighbouring windows share blocks).
  std::vector<std::shared_ptr<Item>> units;
  absl::flat_hash_set<EntryKey> batch_entries;
  uint64_t unit_bytes = 0;
  for (const MappedRange& range : ranges) {
    const uint64_t unit = range.file != nullptr ? range.file->range_unit() : 0;
    const uint64_t size = range.file != nullptr ? range.file->bytes().size() : 0;
    if (unit == 0 || range.length == 0 || range.offset >= size) continue;  // all there
    const uint64_t end = range.offset + std::min(range.length, size - range.offset);
    for (uint64_t offset = range.offset / unit * unit; offset < end; offset += unit) {
      EntryKey entry(range.file->path(), offset);
      if (lane.entries.contains(entry) || !batch_entries.insert(entry).second) continue;
      auto item = std::make_shared<Item>();
      item->path = range.file->path();
      item->mapping = range.file;
      item->offset = offset;
      item->key = key;
      item->bytes = std::min(unit, size - offset);
      unit_bytes += item->bytes;
      units.push_back(std::move(item));
    }
  }
  const bool fits = static_cast<int64_t>(lane.items.size() + units.size()) <= lane_files_ &&
                    lane.bytes + unit_bytes <= lane_bytes_;
  // A batch larger than the whole share still has its first units fetched ahead.
  if (!fits && !lane.items.empty()) return false;
  lane.last_added = key;
  lane.batches.push_back(key);
  for (const std::string& path : files) {
    // Samples of the shards a lane holds (a shuffle buffer interleaves a few): each shard is
    // fetched once.
    if (!lane.entries.insert(EntryKey(path, kWholeFile)).second) continue;
    auto item = std::make_shared<Item>();
    item->path = path;
    item->key = key;
    lane.items.push_back(std::move(item));
    ++stats_.added;
  }
  for (std::shared_ptr<Item>& item : units) {
    if (static_cast<int64_t>(lane.items.size()) >= lane_files_ ||
        lane.bytes + item->bytes > lane_bytes_) {
      break;
    }
    lane.entries.insert(EntryKey(item->path, item->offset));
    lane.bytes += item->bytes;
    lane.items.push_back(std::move(item));
    ++stats_.added;
  }
  return true;
}

void ReadAhead::DropFrontLocked(Lane& lane, std::vector<std::shared_ptr<Item>>* dropped) {
  Item& item = *lane.items.front();
  item.dropped = true;
  lane.bytes -= std::min(lane.bytes, item.bytes);
  if (!item.taken) ++stats_.skipped;
  lane.entries.erase(EntryKey(item.path, item.mapping != nullptr ? item.offset : kWholeFile));
  dropped->push_back(std::move(lane.items.front()));
  lane.items.pop_front();
  if (lane.next > 0) --lane.next;
}

void ReadAhead::Reached(int rank, BatchKey key) {
  std::vector<std::shared_ptr<Item>> dropped;  // let go after the lock
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || static_cast<size_t>(rank) >= lanes_.size()) return;
  Lane& lane = lanes_[rank];
  while (!lane.items.empty() && lane.items.front()->key < key) DropFrontLocked(lane, &dropped);
  while (!lane.batches.empty() && lane.batches.front() < key) lane.batches.pop_front();
}

void ReadAhead::Reset(int rank) {
  std::vector<std::shared_ptr<Item>> dropped;  // let go after the lock
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || static_cast<size_t>(rank) >= lanes_.size()) return;
  Lane& lane = lanes_[rank];
  while (!lane.items.empty()) DropFrontLocked(lane, &dropped);
  lane.batches.clear();
  lane.next = 0;
  lane.last_added.reset();
}

std::optional<ReadAhead::BatchKey> ReadAhead::LastAdded(int rank) const {
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || static_cast<size_t>(rank) >= lanes_.size()) return std::nullopt;
  return lanes_[rank].last_added;
}

ReadAhead::Stats ReadAhead::stats() const {
  absl::MutexLock lock(&mutex_);
  Stats stats = stats_;
  for (const Lane& lane : lanes_) {
    stats.in_window += static_cast<int64_t>(lane.items.size());
    stats.bytes_in_window += lane.bytes;
  }
  return stats;
}

bool ReadAhead::WorkOrStopLocked() const {
  if (stopping_) return true;
  for (const Lane& lane : lanes_) {
    if (lane.next < lane.items.size()) return true;
  }
  return false;
}

std::shared_ptr<ReadAhead::Item> ReadAhead::TakeLocked(int* lane_index) {
  for (size_t i = 0; i < lanes_.size(); ++i) {
    const size_t at = (turn_ + i) % lanes_.size();
    Lane& lane = lanes_[at];
    if (lane.next >= lane.items.size()) continue;
    turn_ = (at + 1) % lanes_.size();
    std::shared_ptr<Item> item = lane.items[lane.next++];
    item->taken = true;
    *lane_index = static_cast<int>(at);
    return item;
  }
  return nullptr;
}

void ReadAhead::Run() {
  while (true) {
    std::shared_ptr<Item> item;
    int lane = 0;
    {
      absl::MutexLock lock(&mutex_);
      mutex_.Await(absl::Condition(this, &ReadAhead::WorkOrStopLocked));
      if (stopping_) return;
      item = TakeLocked(&lane);
    }
    if (item == nullptr) continue;
    if (item->mapping != nullptr) {
      // Fetches the unit into the node cache and maps it; held while it is in the lane.
      absl::StatusOr<std::shared_ptr<const void>> hold =
          item->mapping->Hold(item->offset, item->bytes);
      std::shared_ptr<const void> late;  // a hold whose item left meanwhile: ended unlocked
      absl::MutexLock lock(&mutex_);
      if (!hold.ok()) {
        ++stats_.failed;
        continue;
      }
      ++stats_.opened;
      (item->dropped ? late : item->hold) = *std::move(hold);
      continue;
    }
    // Opening brings a remote object into the node cache; the file is closed at once, so
    // the cache may evict it again only once nothing holds it.
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = fs_->OpenFile(item->path);
    absl::MutexLock lock(&mutex_);
    if (!file.ok()) {
      ++stats_.failed;
      continue;
    }
    ++stats_.opened;
    item->bytes = (*file)->size();
    if (!item->dropped) lanes_[lane].bytes += item->bytes;
  }
}

}  // namespace ferry
