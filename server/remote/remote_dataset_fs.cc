#include "server/remote/remote_dataset_fs.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "server/dataset/mapped_file.h"
#include "server/remote/object_blocks.h"

namespace ferry {
namespace {

// A cached object read with pread, holding its cache entry.
class CachedFile final : public RandomAccessFile {
 public:
  CachedFile(std::string path, const FileIdentity& identity, ObjectCache::Pin pin)
      : RandomAccessFile(std::move(path), identity), pin_(std::move(pin)) {}

  absl::StatusOr<size_t> ReadAt(uint64_t offset, absl::Span<uint8_t> out) const override {
    return ReadCacheEntry(pin_, offset, out, path());
  }

 private:
  const ObjectCache::Pin pin_;
};

// Turns for the GETs of objects' parts: at most `slots` at once, begun in the order their
// tickets were taken (Take(n) takes n consecutive ones), so that the parts asked for first
// are fetched first. Every ticket taken must be begun and ended, or later ones never begin.
class PartTurns {
 public:
  explicit PartTurns(int slots) : slots_(std::max(1, slots)) {}

  // The first of `n` consecutive tickets.
  uint64_t Take(uint64_t n) {
    absl::MutexLock lock(&mutex_);
    const uint64_t first = next_ticket_;
    next_ticket_ += n;
    return first;
  }
  // Waits until every earlier ticket has begun and a slot is free.
  void Begin(uint64_t ticket) {
    absl::MutexLock lock(&mutex_);
    while (ticket != begun_ || active_ >= slots_) changed_.Wait(&mutex_);
    ++begun_;
    ++active_;
    changed_.SignalAll();  // the next ticket's turn may have come
  }
  void End() {
    absl::MutexLock lock(&mutex_);
    --active_;
    changed_.SignalAll();
  }

 private:
  const int slots_;
  absl::Mutex mutex_;
  absl::CondVar changed_;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t begun_ ABSL_GUARDED_BY(mutex_) = 0;
  int active_ ABSL_GUARDED_BY(mutex_) = 0;
};

class RemoteDatasetFs final : public DatasetFs {
 public:
  RemoteDatasetFs(std::shared_ptr<const DatasetFs> local, std::shared_ptr<ObjectCache> cache,
                  std::shared_ptr<const StoreClient> store, const RemoteFsOptions& options)
      : local_(std::move(local)),
        cache_(std::move(cache)),
        store_(std::move(store)),
        options_(options) {}

  absl::Status CheckPath(const std::string& path) const override {
    if (!ObjectLocation::IsRemote(path)) return Local(path)->CheckPath(path);
    return ObjectLocation::Parse(path).status();
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
      const std::string& path) const override {
    if (!ObjectLocation::IsRemote(path)) return Local(path)->OpenFile(path);
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const ObjectBlocks> blocks, InBlocks(path));
    if (blocks != nullptr) {
      const FileIdentity identity = IdentityOf(blocks->key, blocks->info);
      return OpenBlocks(std::move(blocks), identity);
    }
    FERRY_ASSIGN_OR_RETURN(Fetched fetched, Fetch(path));
    return std::unique_ptr<RandomAccessFile>(
        new CachedFile(path, fetched.identity, std::move(fetched.pin)));
  }

  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFile(
      const std::string& path) const override {
    if (!ObjectLocation::IsRemote(path)) return Local(path)->MapFile(path);
    FERRY_ASSIGN_OR_RETURN(Fetched fetched, Fetch(path));
    // The cache's file, mapped once for every job (the registry shares it), under the
    // object's name; the mapping holds the cache entry.
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mapped,
                           UnconfinedDatasetFs()->MapFile(fetched.pin.path()));
    struct Owner {
      std::shared_ptr<const MappedFile> mapped;
      ObjectCache::Pin pin;
    };
    auto owner = std::make_shared<Owner>(Owner{mapped, std::move(fetched.pin)});
    return std::make_shared<const MappedFile>(path, fetched.identity, mapped->bytes(),
                                              std::shared_ptr<const void>(owner));
  }

  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFileInRanges(
      const std::string& path) const override {
    if (!ObjectLocation::IsRemote(path)) return Local(path)->MapFileInRanges(path);
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const ObjectBlocks> blocks, InBlocks(path));
    if (blocks == nullptr) return MapFile(path);
    const FileIdentity identity = IdentityOf(blocks->key, blocks->info);
    const uint64_t held =
        options_.max_held_bytes > 0 ? options_.max_held_bytes : cache_->stats().capacity_bytes / 4;
    return MapBlocks(std::move(blocks), identity, held);
  }

  absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string& path) const override {
    if (!ObjectLocation::IsRemote(path)) return Local(path)->ListDirectory(path);
    FERRY_ASSIGN_OR_RETURN(const ObjectLocation where, ObjectLocation::Parse(path));
    if (where.kind != ObjectLocation::Kind::kS3) {
      return absl::UnimplementedError(
          absl::StrCat("'", path,
                       "' names a folder on an HTTP server, which cannot be listed: give the "
                       "objects (shards) by name or brace pattern, or put them in an S3 bucket"));
    }
    std::string dir = where.key;
    if (!absl::EndsWith(dir, "/")) dir += '/';
    {
      absl::MutexLock lock(&mutex_);
      if (auto it = listed_.find(ListedKey(where.bucket, dir)); it != listed_.end()) {
        std::vector<Entry> entries = std::move(it->second);
        listed_.erase(it);
        return entries;
      }
    }
    // Everything under the folder, listed once; the entries of its subfolders wait for the
    // ListDirectory calls that follow (an image folder's classes), each handed out once.
    FERRY_ASSIGN_OR_RETURN(const StoreClient::Listing listing,
                           store_->List(where.bucket, dir, /*delimit=*/false));
    if (listing.objects.empty()) {
      return absl::NotFoundError(absl::StrCat("dataset path '", path,
                                              "' does not exist: no object's key in bucket '",
                                              where.bucket, "' starts with '", dir, "'"));
    }
    absl::flat_hash_map<std::string, std::vector<Entry>> tree;  // folder key -> its entries
    for (const ListedObject& object : listing.objects) {
      absl::string_view rest = absl::string_view(object.key).substr(dir.size());
      std::string parent = dir;
      bool usable = true;
      for (size_t slash; usable && (slash = rest.find('/')) != absl::string_view::npos;) {
        usable = slash > 0;  // "a//b" names no path
        std::string child = absl::StrCat(parent, rest.substr(0, slash), "/");
        if (usable && !tree.contains(child)) {
          tree[parent].push_back(Entry{std::string(rest.substr(0, slash)), EntryType::kDirectory});
          tree[child];
        }
        parent = std::move(child);
        rest.remove_prefix(slash + 1);
      }
      // A key ending in '/' is a folder marker, not a file.
      if (usable && !rest.empty())
        tree[parent].push_back(Entry{std::string(rest), EntryType::kFile});
    }
    std::vector<Entry> entries = std::move(tree[dir]);
    tree.erase(dir);
    absl::MutexLock lock(&mutex_);
    for (auto& [folder, below] : tree) listed_[ListedKey(where.bucket, folder)] = std::move(below);
    for (const ListedObject& object : listing.objects) {
      if (object.etag.empty()) continue;
      ObjectLocation at = where;
      at.key = object.key;
      listed_versions_.try_emplace(at.ToString(),
                                   StoreClient::ObjectInfo{object.size, object.etag});
    }
    return entries;
  }

  bool Stopping() const override { return local_ != nullptr && local_->Stopping(); }

 private:
  // The filesystem local paths go to; one that refuses them when there is none.
  const DatasetFs* Local(const std::string& path) const {
    return local_ != nullptr ? local_.get() : &refusing_;
  }

  // The blocks of `path` when it is too large to fetch whole, checked for these credentials
  // (a HEAD, asked once); null for an object fetched whole. An object of a listed folder no
  // larger than whole_object_max_bytes costs no request here.
  absl::StatusOr<std::shared_ptr<const ObjectBlocks>> InBlocks(const std::string& path) const {
    FERRY_ASSIGN_OR_RETURN(const ObjectLocation where, ObjectLocation::Parse(path));
    {
      absl::MutexLock lock(&mutex_);
      const std::string object = where.ToString();
      auto it = listed_versions_.find(object);
      if (it != listed_versions_.end() && it->second.size <= options_.whole_object_max_bytes) {
        return nullptr;
      }
      // A listed object another call fetches whole now: small enough.
      if (listed_in_flight_.contains(object)) return nullptr;
    }
    FERRY_ASSIGN_OR_RETURN(const StoreClient::ObjectInfo info, Head(where, path));
    if (info.size <= options_.whole_object_max_bytes) return nullptr;
    return std::make_shared<const ObjectBlocks>(ObjectBlocks{.path = path,
                                                             .where = where,
                                                             .info = info,
                                                             .key = KeyOf(where, info),
                                                             .block_bytes = options_.block_bytes,
                                                             .cache = cache_,
                                                             .store = store_});
  }

  // The object's size and version as the store told these credentials, asked once.
  absl::StatusOr<StoreClient::ObjectInfo> Head(const ObjectLocation& where,
                                               const std::string& path) const {
    {
      absl::MutexLock lock(&mutex_);
      if (auto it = heads_.find(path); it != heads_.end()) return it->second;
    }
    FERRY_ASSIGN_OR_RETURN(StoreClient::ObjectInfo info, store_->Head(where));
    absl::MutexLock lock(&mutex_);
    return heads_.try_emplace(path, std::move(info)).first->second;
  }

  struct Fetched {
    ObjectCache::Pin pin;
    // The object's version, not its cache file's (whose modification time marks its
    // recency): the same for every open of that version, also after it was evicted and
    // fetched again.
    FileIdentity identity;
  };

  // The object's cache entry, fetched whole when absent, once these credentials may read it.
  // The time it takes is the calling thread's remote wait (TallyRemoteWait).
  absl::StatusOr<Fetched> Fetch(const std::string& path) const {
    const absl::Time start = absl::Now();
    absl::StatusOr<Fetched> fetched = FetchUntimed(path);
    TallyRemoteWait(absl::ToInt64Nanoseconds(absl::Now() - start));
    return fetched;
  }
  absl::StatusOr<Fetched> FetchUntimed(const std::string& path) const {
    FERRY_ASSIGN_OR_RETURN(const ObjectLocation where, ObjectLocation::Parse(path));
    if (std::optional<StoreClient::ObjectInfo> listed = TakeListedVersion(where, path)) {
      absl::StatusOr<Fetched> fetched = FetchListed(where, path, *listed);
      {
        absl::MutexLock lock(&mutex_);
        listed_in_flight_.erase(where.ToString());
      }
      // Changed since it was listed: the object's version as a HEAD tells it.
      if (!absl::IsAborted(fetched.status())) return fetched;
    }
    FERRY_ASSIGN_OR_RETURN(const StoreClient::ObjectInfo info, Head(where, path));
    const ObjectCache::Key key = KeyOf(where, info);
    FERRY_ASSIGN_OR_RETURN(ObjectCache::Pin pin, cache_->Get(key, info.size, [&](int fd) {
      return ReadWhole(where, info.size, info.etag, fd);
    }));
    return Fetched{std::move(pin), IdentityOf(key, info)};
  }

  // An object of a listed folder whose version the listing gave, not yet confirmed for these
  // credentials (a listing proves the right to list, not to read): moved from the listed
  // versions to those in flight, since the caller fetches it now, and ends it there. A call
  // for an object in flight waits for that fetch: its success confirms the version for
  // these credentials (heads_), so that the object costs no HEAD.
  std::optional<StoreClient::ObjectInfo> TakeListedVersion(const ObjectLocation& where,
                                                           const std::string& path) const {
    const std::string object = where.ToString();
    absl::MutexLock lock(&mutex_);
    struct InFlight {
      const absl::flat_hash_set<std::string>* fetching;
      const std::string* object;
    } in_flight{&listed_in_flight_, &object};
    mutex_.Await(absl::Condition(
        +[](InFlight* f) { return !f->fetching->contains(*f->object); }, &in_flight));
    if (heads_.contains(path)) return std::nullopt;
    auto it = listed_versions_.find(object);
    if (it == listed_versions_.end()) return std::nullopt;
    StoreClient::ObjectInfo info = std::move(it->second);
    listed_versions_.erase(it);
    listed_in_flight_.insert(object);
    return info;
  }

  // Writes the object's `size` bytes to fd: with one GET, or, for an s3:// object over
  // part_bytes that has a version (`etag`), in parts (RemoteFsOptions::part_bytes) on up to
  // part_connections threads, each part a range GET of that version, in the turns that
  // turns_ gives. Plain HTTP servers need not serve ranges: their objects take one GET.
  absl::Status ReadWhole(const ObjectLocation& where, uint64_t size, const std::string& etag,
                         int fd) const {
    const uint64_t part = options_.part_bytes;
    if (part == 0 || size <= part || etag.empty() || where.kind != ObjectLocation::Kind::kS3) {
      return store_->Read(where, 0, size, fd, etag);
    }
    const uint64_t parts = (size + part - 1) / part;
    const uint64_t first = turns_.Take(parts);
    std::atomic<uint64_t> next{0};
    std::atomic<bool> failed{false};
    absl::Mutex error_mutex;
    absl::Status error;
    auto work = [&] {
      for (uint64_t p = next.fetch_add(1); p < parts; p = next.fetch_add(1)) {
        turns_.Begin(first + p);
        if (!failed.load()) {
          const uint64_t offset = p * part;
          absl::Status read =
              store_->Read(where, offset, std::min(part, size - offset), fd, etag, offset);
          if (!read.ok() && !failed.exchange(true)) {
            absl::MutexLock lock(&error_mutex);
            error = std::move(read);
          }
        }
        turns_.End();  // a part skipped after a failure still ends its turn
      }
    };
    const uint64_t threads =
        std::min<uint64_t>(parts, static_cast<uint64_t>(std::max(1, options_.part_connections)));
    std::vector<std::thread> pool;
    for (uint64_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& thread : pool) thread.join();
    absl::MutexLock lock(&error_mutex);
    return error;
  }

  // One request where the object is not cached: a GET of the listed version, signed with
  // these credentials, proves the right to read it as a HEAD would. A cached one is served
  // after a HEAD says these credentials may read that version. ABORTED when the object
  // changed since the listing, or when another job's GET that this call waited for failed
  // (the caller then asks with a HEAD, as for an object never listed).
  absl::StatusOr<Fetched> FetchListed(const ObjectLocation& where, const std::string& path,
                                      const StoreClient::ObjectInfo& listed) const {
    const ObjectCache::Key key = KeyOf(where, listed);
    bool read_here = false;
    absl::StatusOr<ObjectCache::Pin> pin = cache_->Get(key, listed.size, [&](int fd) {
      read_here = true;
      return ReadWhole(where, listed.size, listed.etag, fd);
    });
    if (!pin.ok()) {
      // Another job's GET of it failed while this one waited (that job's credentials, say,
      // which the listing did not check for reading): not this job's answer.
      if (!read_here) return absl::AbortedError(pin.status().message());
      return pin.status();
    }
    if (read_here) {
      absl::MutexLock lock(&mutex_);
      heads_.try_emplace(path, listed);
    } else {
      FERRY_ASSIGN_OR_RETURN(const StoreClient::ObjectInfo info, Head(where, path));
      if (info.etag != listed.etag || info.size != listed.size) {
        return absl::AbortedError(absl::StrCat("'", path, "' changed since it was listed"));
      }
    }
    return Fetched{*std::move(pin), IdentityOf(key, listed)};
  }

  ObjectCache::Key KeyOf(const ObjectLocation& where, const StoreClient::ObjectInfo& info) const {
    ObjectCache::Key key;
    key.store = where.kind == ObjectLocation::Kind::kS3 ? store_->UrlOf(where) : where.url;
    key.object = where.ToString();
    key.version = info.etag.empty() ? absl::StrCat("size ", info.size) : info.etag;
    return key;
  }
  static FileIdentity IdentityOf(const ObjectCache::Key& key, const StoreClient::ObjectInfo& info) {
    return FileIdentity{
        .device = 0, .inode = absl::HashOf(key.Canonical()), .size = info.size, .mtime_ns = 0};
  }

  // What local paths meet on a daemon that reads none.
  class NoLocalFs final : public DatasetFs {
   public:
    absl::Status CheckPath(const std::string& path) const override { return Refuse(path); }
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
        const std::string& path) const override {
      return Refuse(path);
    }
    absl::StatusOr<std::shared_ptr<const MappedFile>> MapFile(
        const std::string& path) const override {
      return Refuse(path);
    }
    absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string& path) const override {
      return Refuse(path);
    }
    bool Stopping() const override { return false; }

   private:
    static absl::Status Refuse(const std::string& path) {
      return absl::PermissionDeniedError(absl::StrCat(
          "dataset path '", path.substr(0, 512),
          "' is local, and this ferryd reads only remote datasets (no dataset_roots)"));
    }
  };

  static std::string ListedKey(const std::string& bucket, const std::string& folder) {
    return absl::StrCat(bucket, "/", folder);
  }

  const std::shared_ptr<const DatasetFs> local_;
  const NoLocalFs refusing_;
  const std::shared_ptr<ObjectCache> cache_;
  const std::shared_ptr<const StoreClient> store_;
  const RemoteFsOptions options_;
  mutable PartTurns turns_{options_.part_connections};
  mutable absl::Mutex mutex_;
  mutable absl::flat_hash_map<std::string, StoreClient::ObjectInfo> heads_ ABSL_GUARDED_BY(mutex_);
  // "bucket/folder/" -> the entries of a folder listed with its parent, not yet asked for.
  mutable absl::flat_hash_map<std::string, std::vector<Entry>> listed_ ABSL_GUARDED_BY(mutex_);
  // "s3://bucket/key" -> size and version as a listing gave them, for objects not fetched yet.
  mutable absl::flat_hash_map<std::string, StoreClient::ObjectInfo> listed_versions_
      ABSL_GUARDED_BY(mutex_);
  // "s3://bucket/key" of the listed objects whose listed version a call is fetching now.
  mutable absl::flat_hash_set<std::string> listed_in_flight_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace

void FetchAhead(const DatasetFs& fs, const std::vector<std::string>& paths, int connections,
                uint64_t max_bytes) {
  std::vector<const std::string*> remote;
  for (const std::string& path : paths) {
    if (ObjectLocation::IsRemote(path)) remote.push_back(&path);
  }
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> fetched{0};
  auto fetch = [&] {
    while (fetched.load() < max_bytes && !fs.Stopping()) {
      const size_t i = next.fetch_add(1);
      if (i >= remote.size()) return;
      absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = fs.OpenFile(*remote[i]);
      if (!file.ok()) continue;
      fetched.fetch_add((*file)->size());
      // An object read in blocks is only asked for its size by the open: its first block,
      // which indexing reads first (a token file's check, a tar's first headers, an index's
      // header), is fetched here too, in parallel with the others'. Free for an object
      // fetched whole.
      uint8_t first = 0;
      (void)ReadUpTo(**file, 0, absl::MakeSpan(&first, 1));
    }
  };
  std::vector<std::thread> threads;
  const size_t count = std::min(remote.size(), static_cast<size_t>(std::max(1, connections)));
  for (size_t t = 1; t < count; ++t) threads.emplace_back(fetch);
  if (count > 0) fetch();
  for (std::thread& thread : threads) thread.join();
}

std::shared_ptr<const DatasetFs> MakeRemoteDatasetFs(std::shared_ptr<const DatasetFs> local,
                                                     std::shared_ptr<ObjectCache> cache,
                                                     std::shared_ptr<const StoreClient> store,
                                                     const RemoteFsOptions& options) {
  return std::make_shared<RemoteDatasetFs>(std::move(local), std::move(cache), std::move(store),
                                           options);
}

}  // namespace ferry
