// Reads a job's data ahead of its workers, in the order its ranks' batches will read it, so
// that when a worker reads a sample its bytes are on local disk. Two units of reading ahead:
//  * a file, opened once through the job's DatasetFs and closed again, which is what brings a
//    remote object (server/remote) into the node's cache: for datasets whose samples live in
//    files opened as they are read (an image folder's images, WebDataset shards);
//  * a unit of a mapping read in ranges (MappedFile::range_unit: a block of a large remote
//    object), held (MappedFile::Hold), which fetches it into the node's cache and keeps it
//    there until its batch's workers start: for the kinds that read such a mapping in
//    ranges (tokens, token shards, records, indexed, megatron_gpt, blends of those;
//    SampleSource::RangesOf). Mappings whose bytes are all there have nothing to read
//    ahead.
//
// Contract:
//  * Each rank has a lane: the files and units of its next batches, added in batch order by
//    the rank (Add) and leaving it when the rank's workers start those batches (Reached).
//    A lane holds at most max_files / ranks entries (a file or a unit each) and bytes
//    max_bytes / ranks. A file's bytes count once it is open (they are known then), and a
//    lane stops taking batches once they reach its share. A unit's bytes are known when it
//    is added: a lane takes a batch's units only when all of them fit in both shares (Add
//    says when they do not, and the rank offers the batch again later), so the units in
//    the window never exceed them; a batch larger than a whole share goes into an empty
//    lane as far as it fits, and its workers fetch the rest. The job's window so stays
//    within max_files and max_bytes whatever the ranks do. A lane also holds at most
//    max_files / ranks batches, so that batches that add nothing (their samples' files or
//    blocks are in the lane already) do not carry it through the whole epoch.
//  * At most `connections` files are opened, or units fetched, at once, taken from the
//    lanes in turn (no rank waits behind another's window), each lane's in its batch order.
//    An entry whose batch the workers already started is not fetched here (the worker
//    fetches it itself); a file or unit already in the lane (another sample of a shard or
//    block the lane holds) is not added again.
//  * A unit fetched here is held while it is in the lane, so the cache does not evict it
//    before its batch's workers start; from then on it is an entry like any other, which
//    the workers' reads hold while they run (the mapping keeps recently read units mapped).
//  * Fetching is best effort: what fails here fails again, with its error, where the worker
//    reads it; failures are only counted.
//  * The destructor stops the threads and waits for the fetches under way. Mappings added
//    stay alive while their units are in a lane (MappedRange shares them).
//
//   ReadAhead ahead(fs, {.connections = 16, .max_files = 256, .max_bytes = 1 << 30,
//                        .ranks = world_size});
//   ahead.Reached(rank, {epoch, batch});           // the workers start this batch
//   while (ahead.HasRoom(rank) &&
//          ahead.Add(rank, {epoch, next}, FilesOf(epoch, next), RangesOf(epoch, next))) {
//     ++next;
//   }
//
// Thread-safe.
#ifndef FERRY_SERVER_PIPELINE_READ_AHEAD_H_
#define FERRY_SERVER_PIPELINE_READ_AHEAD_H_

#include <compare>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "server/dataset/dataset_fs.h"
#include "server/dataset/mapped_file.h"

namespace ferry {

class ReadAhead final {
 public:
  struct Options {
    int connections = 16;             // files opened, or units fetched, at once, >= 1
    int64_t max_files = 256;          // the job's window, in files and units (each lane gets
                                      // its share, >= 1)
    uint64_t max_bytes = 1ull << 30;  // and in bytes
    int ranks = 1;                    // lanes, one per rank
  };
  // A batch of a rank, in the rank's order of batches.
  struct BatchKey {
    int64_t epoch = 0;
    int64_t batch = 0;
    auto operator<=>(const BatchKey&) const = default;
  };
  struct Stats {
    int64_t added = 0;  // files and units added to the lanes
    // Files this read-ahead opened and units it held (fetched, or found in the cache).
    int64_t opened = 0;
    int64_t failed = 0;     // opens and holds that failed (the worker meets the error again)
    int64_t skipped = 0;    // files and units whose batch the workers started before they were
                            // fetched here
    int64_t in_window = 0;  // files and units in the lanes now
    uint64_t bytes_in_window = 0;  // bytes of the opened files and of the units
  };

  ReadAhead(std::shared_ptr<const DatasetFs> fs, const Options& options);
  ~ReadAhead();
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // Whether rank's lane takes another batch. False for a rank outside [0, ranks).
  bool HasRoom(int rank) const;
  // Appends the files batch `key` of `rank` reads, and the units of mappings read in ranges
  // that the byte ranges it reads fall in, in reading order (ranges of mappings not read in
  // ranges add nothing). Batches are added in the rank's order; a key not after the lane's
  // last one is ignored. False, adding nothing, when the batch's units do not fit in the
  // lane's room now: offer the batch again once Reached made room. (A batch whose units
  // exceed the lane's whole share is taken into an empty lane as far as they fit.)
  bool Add(int rank, BatchKey key, const std::vector<std::string>& files,
           const std::vector<MappedRange>& ranges = {});
  // Rank's workers start batch `key`: the files of earlier batches leave the lane.
  void Reached(int rank, BatchKey key);
  // Empties rank's lane (the rank starts somewhere else).
  void Reset(int rank);
  // The last key added to rank's lane, if any batch is in it.
  std::optional<BatchKey> LastAdded(int rank) const;

  Stats stats() const;

 private:
  // A file (`mapping` null) or a unit of `mapping`, bytes [offset, offset + bytes).
  struct Item {
    std::string path;
    std::shared_ptr<const MappedFile> mapping;
    uint64_t offset = 0;
    BatchKey key;
    bool taken = false;    // a thread fetches it, or fetched it
    bool dropped = false;  // left the lane (its bytes no longer count there)
    uint64_t bytes = 0;    // a file's once opened; a unit's from the start
    // The unit's hold while it is in the lane. Declared after `mapping`, which it must not
    // outlive.
    std::shared_ptr<const void> hold;
  };
  // What an entry is in a lane's set: a file's path and kWholeFile, or a unit's mapping's
  // path and offset.
  static constexpr uint64_t kWholeFile = ~uint64_t{0};
  using EntryKey = std::pair<std::string, uint64_t>;
  struct Lane {
    std::deque<std::shared_ptr<Item>> items;  // in batch order
    size_t next = 0;                          // first item no thread took
    uint64_t bytes = 0;                       // of opened items still in the lane
    std::optional<BatchKey> last_added;
    absl::flat_hash_set<EntryKey> entries;  // of `items`, each once
    std::deque<BatchKey> batches;           // added and not reached, in order
  };

  void Run();
  bool WorkOrStopLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The next item to open, taking lanes in turn; null when none is waiting.
  std::shared_ptr<Item> TakeLocked(int* lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool HasRoomLocked(const Lane& lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Moves the lane's first item to *dropped, which the caller destroys once it no longer
  // holds mutex_ (ending a unit's hold unmaps it, which need not wait under the lock).
  void DropFrontLocked(Lane& lane, std::vector<std::shared_ptr<Item>>* dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const std::shared_ptr<const DatasetFs> fs_;
  const int64_t lane_files_;
  const uint64_t lane_bytes_;

  mutable absl::Mutex mutex_;
  std::vector<Lane> lanes_ ABSL_GUARDED_BY(mutex_);
  size_t turn_ ABSL_GUARDED_BY(mutex_) = 0;  // the lane TakeLocked looks at first
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  Stats stats_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::thread> threads_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_PIPELINE_READ_AHEAD_H_
