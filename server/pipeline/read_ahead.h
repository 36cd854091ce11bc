// Reads a job's files ahead of its workers, in the order its ranks' batches will read them:
// each file is opened once through the job's DatasetFs and closed again, which is what
// brings a remote object (server/remote) into the node's cache, so that when a worker opens
// it the bytes are on local disk. For datasets whose samples live in files opened as they
// are read (an image folder's images, WebDataset shards); kinds that map their files when
// the job is created have nothing left to fetch.
//
// Contract:
//  * Each rank has a lane: the files of its next batches, added in batch order by the rank
//    (Add) and leaving it when the rank's workers start those batches (Reached). A lane holds
//    at most max_files / ranks files and stops taking batches once the bytes of the files
//    opened in it reach max_bytes / ranks (a file's bytes are known once it is open), so the
//    job's window stays within max_files and max_bytes whatever the ranks do.
//  * At most `connections` files are opened at once, taken from the lanes in turn (no rank
//    waits behind another's window), each lane's in its batch order. A file whose batch the
//    workers already started is not opened here (the worker opens it itself); a file already
//    in the lane (another sample of a shard the lane holds) is not added again.
//  * Opening is best effort: a file that fails here fails again, with its error, where the
//    worker opens it; failures are only counted.
//  * The destructor stops the threads and waits for the opens under way.
//
//   ReadAhead ahead(fs, {.connections = 16, .max_files = 256, .max_bytes = 1 << 30,
//                        .ranks = world_size});
//   ahead.Reached(rank, {epoch, batch});           // the workers start this batch
//   while (ahead.HasRoom(rank)) ahead.Add(rank, {epoch, next}, FilesOf(epoch, next++));
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
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "server/dataset/dataset_fs.h"

namespace ferry {

class ReadAhead final {
 public:
  struct Options {
    int connections = 16;             // files opened at once, >= 1
    int64_t max_files = 256;          // the job's window, in files (each lane gets its share, >= 1)
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
    int64_t opened = 0;            // files this read-ahead opened (fetched, or found in the cache)
    int64_t failed = 0;            // opens that failed (the worker meets the error again)
    int64_t skipped = 0;           // files whose batch the workers started before they were opened
    int64_t in_window = 0;         // files in the lanes now
    uint64_t bytes_in_window = 0;  // bytes of the opened ones
  };

  ReadAhead(std::shared_ptr<const DatasetFs> fs, const Options& options);
  ~ReadAhead();
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // Whether rank's lane takes another batch. False for a rank outside [0, ranks).
  bool HasRoom(int rank) const;
  // Appends the files batch `key` of `rank` reads, in reading order. Batches are added in
  // the rank's order; a key not after the lane's last one is ignored.
  void Add(int rank, BatchKey key, const std::vector<std::string>& files);
  // Rank's workers start batch `key`: the files of earlier batches leave the lane.
  void Reached(int rank, BatchKey key);
  // Empties rank's lane (the rank starts somewhere else).
  void Reset(int rank);
  // The last key added to rank's lane, if any batch is in it.
  std::optional<BatchKey> LastAdded(int rank) const;

  Stats stats() const;

 private:
  struct Item {
    std::string path;
    BatchKey key;
    bool taken = false;    // a thread opens it, or opened it
    bool dropped = false;  // left the lane (its bytes no longer count there)
    uint64_t bytes = 0;    // once opened
  };
  struct Lane {
    std::deque<std::shared_ptr<Item>> items;  // in batch order
    size_t next = 0;                          // first item no thread took
    uint64_t bytes = 0;                       // of opened items still in the lane
    std::optional<BatchKey> last_added;
    absl::flat_hash_set<std::string> paths;  // of `items`, each once
  };

  void Run();
  bool WorkOrStopLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The next item to open, taking lanes in turn; null when none is waiting.
  std::shared_ptr<Item> TakeLocked(int* lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  bool HasRoomLocked(const Lane& lane) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void DropFrontLocked(Lane& lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

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
