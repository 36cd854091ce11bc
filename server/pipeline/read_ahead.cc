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
  return static_cast<int64_t>(lane.items.size()) < lane_files_ && lane.bytes < lane_bytes_;
}

bool ReadAhead::HasRoom(int rank) const {
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || static_cast<size_t>(rank) >= lanes_.size()) return false;
  return !stopping_ && HasRoomLocked(lanes_[rank]);
}

void ReadAhead::Add(int rank, BatchKey key, const std::vector<std::string>& files) {
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || static_cast<size_t>(rank) >= lanes_.size()) return;
  Lane& lane = lanes_[rank];
  if (lane.last_added.has_value() && key <= *lane.last_added) return;
  lane.last_added = key;
  for (const std::string& path : files) {
    // Samples of the shards a lane holds (a shuffle buffer interleaves a few): each shard is
    // fetched once.
    if (!lane.paths.insert(path).second) continue;
    auto item = std::make_shared<Item>();
    item->path = path;
    item->key = key;
    lane.items.push_back(std::move(item));
  }
}

void ReadAhead::DropFrontLocked(Lane& lane) {
  Item& item = *lane.items.front();
  item.dropped = true;
  lane.bytes -= std::min(lane.bytes, item.bytes);
  if (!item.taken) ++stats_.skipped;
  lane.paths.erase(item.path);
  lane.items.pop_front();
  if (lane.next > 0) --lane.next;
}

void ReadAhead::Reached(int rank, BatchKey key) {
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || static_cast<size_t>(rank) >= lanes_.size()) return;
  Lane& lane = lanes_[rank];
  while (!lane.items.empty() && lane.items.front()->key < key) DropFrontLocked(lane);
}

void ReadAhead::Reset(int rank) {
  absl::MutexLock lock(&mutex_);
  if (rank < 0 || static_cast<size_t>(rank) >= lanes_.size()) return;
  Lane& lane = lanes_[rank];
  while (!lane.items.empty()) DropFrontLocked(lane);
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
