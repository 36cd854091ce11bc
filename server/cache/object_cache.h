// A node-local cache of remote objects in a directory one ferryd owns: each entry is one
// object (a shard) or one fixed-size block of a large object, stored whole in a file of its
// own named by the SHA-256 of its key, so that every job and rank of the node reads what one
// download brought.
//
// Contract:
//  * Get(key, bytes, fill) returns a Pin on the entry's file once the file holds all `bytes`.
//    When the entry is absent one caller runs `fill`, which writes the bytes to a temporary
//    file, while the other callers for the same key wait for it (one download per node). The
//    file takes the entry's name only once complete (written and renamed), so no reader ever
//    sees a partial entry; Open deletes leftover temporary files.
//  * Durability is off the readers' path: a complete entry is served at once, and a thread
//    of the cache then flushes its file to the disk and only after that writes its key
//    file (flushed, renamed). Open adopts only entries with a key file, so after a crash of
//    the process or the machine an entry whose flush had not ended is dropped and fetched
//    again, never served with bytes the disk lost. The cache's destruction flushes every
//    entry still waiting.
//  * At most capacity_bytes are held. Making room evicts the least recently used entries no
//    Pin holds; an entry a Pin holds (a worker reads it) is never evicted, nor one being
//    flushed (Get waits for that flush when it needs the room), and when the held ones leave
//    no room Get fails with RESOURCE_EXHAUSTED saying to raise the capacity.
//  * Entries survive a restart: Open adopts the files it finds (their recency from their
//    modification times, which Get refreshes), drops any whose size disagrees with its key
//    file, and evicts down to the capacity.
//  * One process uses a directory at a time (an flock on <dir>/.lock); a second Open of a
//    directory in use fails with FAILED_PRECONDITION.
//
//   FERRY_ASSIGN_OR_RETURN(auto cache, ObjectCache::Open({.dir = "/var/cache/ferry",
//                                                         .capacity_bytes = 500ull << 30}));
//   FERRY_ASSIGN_OR_RETURN(ObjectCache::Pin pin,
//                          cache->Get({.store = "https://s3.us-east-1.amazonaws.com",
//                                      .object = "bucket/train-000042.tar",
//                                      .version = "\"9b2cf535f27731c974343645a3985328\""},
//                                     size, [&](int fd) { return Download(..., fd); }));
//   // pin.fd() / pin.path(): the object's bytes, while `pin` lives.
//
// Thread-safe. Pins may outlive the cache object.
#ifndef FERRY_SERVER_CACHE_OBJECT_CACHE_H_
#define FERRY_SERVER_CACHE_OBJECT_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ferry {

class ObjectCache final {
 public:
  struct Options {
    std::string dir;              // created (mode 0700) when missing
    uint64_t capacity_bytes = 0;  // > 0
    // Called by the flushing thread before it flushes an entry's file (a seam for tests,
    // which hold it to stand for a crash before the flush).
    std::function<void()> before_flush;
  };

  // What identifies the bytes: the store (its endpoint), the object (bucket and key, or the
  // URL's path), its version (the ETag, or what stands for one: size and modification time),
  // and for a block of a large object its index. Keys equal in every field name the same
  // bytes; a new version of an object is another entry.
  struct Key {
    std::string store;
    std::string object;
    std::string version;
    int64_t block = -1;  // -1: the whole object
    // The text the entry's name is the SHA-256 of (also kept in its key file).
    std::string Canonical() const;
  };

  // A hold on one complete entry: its file stays in place and readable while the Pin lives.
  class Pin final {
   public:
    Pin() = default;
    Pin(Pin&& other) noexcept;
    Pin& operator=(Pin&& other) noexcept;
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;
    ~Pin();

    const std::string& path() const { return path_; }
    uint64_t bytes() const { return bytes_; }
    int fd() const { return fd_; }  // open read-only; closed with the Pin

   private:
    friend class ObjectCache;
    struct Holder;
    std::shared_ptr<Holder> holder_;
    std::string path_;
    uint64_t bytes_ = 0;
    int fd_ = -1;
  };

  // Writes exactly the entry's bytes to `fd` (a new, empty file). An error goes to every
  // caller of Get that waited for this key, and nothing is cached.
  using Fill = std::function<absl::Status(int fd)>;

  // Errors: INVALID_ARGUMENT for an empty dir or a zero capacity; the filesystem's errors
  // naming the directory; FAILED_PRECONDITION when another process uses it.
  static absl::StatusOr<std::unique_ptr<ObjectCache>> Open(const Options& options);

  ObjectCache(const ObjectCache&) = delete;
  ObjectCache& operator=(const ObjectCache&) = delete;
  ~ObjectCache();

  // The entry for `key`, of `bytes` bytes, filled once by `fill` when absent (see above).
  // Errors: fill's; DATA_LOSS when fill wrote another number of bytes; RESOURCE_EXHAUSTED
  // when `bytes` exceed the capacity or the held entries leave no room.
  absl::StatusOr<Pin> Get(const Key& key, uint64_t bytes, const Fill& fill);

  struct Stats {
    uint64_t capacity_bytes = 0;
    uint64_t bytes = 0;  // of complete entries and those being filled
    uint64_t entries = 0;
    uint64_t pinned_entries = 0;
    uint64_t hits = 0;    // Gets served by an entry that was there or being filled
    uint64_t misses = 0;  // Gets that ran fill
    uint64_t evictions = 0;
    uint64_t fill_failures = 0;
    uint64_t adopted = 0;    // entries Open found from an earlier run
    uint64_t unflushed = 0;  // complete entries not yet on the disk (a crash drops them)
  };
  Stats stats() const;

 private:
  struct State;
  explicit ObjectCache(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
  std::thread flusher_;  // State::FlushLoop; stopped and joined by the destructor
};

}  // namespace ferry

#endif  // FERRY_SERVER_CACHE_OBJECT_CACHE_H_
