#include "server/cache/object_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <list>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "server/cache/sha256.h"

namespace ferry {
namespace {

constexpr char kObjectSuffix[] = ".obj";
constexpr char kKeySuffix[] = ".key";
constexpr char kTempMark[] = ".tmp.";

absl::Status Errno(const std::string& what) {
  const int e = errno;
  return absl::Status(e == ENOSPC || e == EDQUOT  ? absl::StatusCode::kResourceExhausted
                      : e == EACCES || e == EPERM ? absl::StatusCode::kPermissionDenied
                                                  : absl::StatusCode::kInternal,
                      absl::StrCat(what, ": ", std::strerror(e)));
}

// Writes all of `text` to a new file at `path` and flushes it to the disk.
absl::Status WriteFileDurably(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create '" + path + "'");
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status s = Errno("cannot write '" + path + "'");
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fdatasync(fd) != 0) {
    absl::Status s = Errno("cannot flush '" + path + "'");
    ::close(fd);
    return s;
  }
  ::close(fd);
  return absl::OkStatus();
}

// The key file: the canonical key, then the entry's size on a line of its own.
std::string KeyFileText(const std::string& canonical, uint64_t bytes) {
  return absl::StrCat(canonical, "\n", bytes, "\n");
}

}  // namespace

std::string ObjectCache::Key::Canonical() const {
  // Length-prefixed fields: no choice of text makes two keys collide.
  return absl::StrCat("ferry-object-cache-1 ", store.size(), ":", store, " ", object.size(), ":",
                      object, " ", version.size(), ":", version, " ", block);
}

struct ObjectCache::State {
  struct Entry {
    std::string name;       // the SHA-256, without suffix
    std::string canonical;  // Key::Canonical(), for the key file of an entry filled here
    uint64_t bytes = 0;
    bool ready = false;
    bool failed = false;
    bool evicted = false;   // gone from the cache (a caller that waited for it looks again)
    bool flushing = false;  // FlushLoop is making it durable: not evicted meanwhile
    absl::Status failure;
    int pins = 0;
    std::list<Entry*>::iterator recency;  // in `lru` once ready
  };

  std::string dir;
  uint64_t capacity = 0;
  int lock_fd = -1;
  std::atomic<uint64_t> temp_counter{0};

  mutable absl::Mutex mutex;
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> entries ABSL_GUARDED_BY(mutex);
  std::list<Entry*> lru ABSL_GUARDED_BY(mutex);  // ready entries, least recent first
  uint64_t used ABSL_GUARDED_BY(mutex) = 0;
  ObjectCache::Stats stats ABSL_GUARDED_BY(mutex);
  // Complete entries filled here whose file and key file are not flushed yet, oldest first.
  std::deque<std::shared_ptr<Entry>> unflushed ABSL_GUARDED_BY(mutex);
  int flushing ABSL_GUARDED_BY(mutex) = 0;  // entries FlushLoop holds now (0 or 1)
  bool stopping ABSL_GUARDED_BY(mutex) = false;
  std::function<void()> before_flush;  // Options::before_flush

  ~State() {
    if (lock_fd >= 0) ::close(lock_fd);  // releases the flock
  }

  std::string PathOf(const std::string& name, const char* suffix) const {
    return absl::StrCat(dir, "/", name, suffix);
  }

  // Removes a ready, unpinned entry and its files.
  void EvictLocked(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    ::unlink(PathOf(e->name, kObjectSuffix).c_str());
    ::unlink(PathOf(e->name, kKeySuffix).c_str());
    lru.erase(e->recency);
    used -= e->bytes;
    ++stats.evictions;
    e->evicted = true;
    entries.erase(e->name);  // destroys *e unless a caller waiting for it holds it
  }

  // Evicts least recently used unpinned entries until `bytes` more fit.
  bool MakeRoomLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    for (auto it = lru.begin(); used + bytes > capacity && it != lru.end();) {
      Entry* e = *it++;
      if (e->pins == 0 && !e->flushing) EvictLocked(e);
    }
    return used + bytes <= capacity;
  }

  bool NoneFlushing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) { return flushing == 0; }
  bool FlushWaiting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex) {
    return stopping || !unflushed.empty();
  }

  // Flushes the entry's file, then writes its key file (flushed, renamed): from then on
  // Open adopts it.
  absl::Status Flush(const Entry& e) {
    const std::string path = PathOf(e.name, kObjectSuffix);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("cannot open '" + path + "' to flush it");
    const bool flushed = ::fdatasync(fd) == 0;
    absl::Status status = flushed ? absl::OkStatus() : Errno("cannot flush '" + path + "'");
    ::close(fd);
    FERRY_RETURN_IF_ERROR(status);
    const std::string key_path = PathOf(e.name, kKeySuffix);
    const std::string key_temp =
        absl::StrCat(key_path, kTempMark, temp_counter.fetch_add(1, std::memory_order_relaxed));
    status = WriteFileDurably(key_temp, KeyFileText(e.canonical, e.bytes));
    if (status.ok() && ::rename(key_temp.c_str(), key_path.c_str()) != 0) {
      status = Errno("cannot rename '" + key_temp + "'");
    }
    if (!status.ok()) ::unlink(key_temp.c_str());
    return status;
  }

  // The flushing thread: makes entries durable in the order they were filled, until the
  // cache is destroyed, and then the ones still waiting.
  void FlushLoop() {
    for (;;) {
      std::shared_ptr<Entry> e;
      {
        absl::MutexLock lock(&mutex);
        mutex.Await(absl::Condition(this, &State::FlushWaiting));
        if (unflushed.empty()) return;  // stopping, and every entry is flushed
        e = std::move(unflushed.front());
        unflushed.pop_front();
        if (e->evicted) continue;  // its files are gone
        e->flushing = true;
        ++flushing;
      }
      if (before_flush) before_flush();
      const absl::Status flushed = Flush(*e);
      if (!flushed.ok()) {
        // Served from here on as it is; a restart fetches it again.
        FERRY_LOG(WARNING) << "object cache: " << flushed.message()
                           << "; the entry stays in use but will not survive a restart";
      }
      absl::MutexLock lock(&mutex);
      e->flushing = false;
      --flushing;
      if (used > capacity) MakeRoomLocked(0);
    }
  }

  void Unpin(Entry* e) {
    absl::MutexLock lock(&mutex);
    if (--e->pins == 0) --stats.pinned_entries;
    // An entry over the capacity (Open found more than fits, or room was short while it was
    // held) goes once nothing holds it.
    if (used > capacity) MakeRoomLocked(0);
  }
};

struct ObjectCache::Pin::Holder {
  std::shared_ptr<State> state;
  std::shared_ptr<State::Entry> entry;
  ~Holder() { state->Unpin(entry.get()); }
};

ObjectCache::Pin::Pin(Pin&& other) noexcept
    : holder_(std::move(other.holder_)),
      path_(std::move(other.path_)),
      bytes_(other.bytes_),
      fd_(std::exchange(other.fd_, -1)) {}

ObjectCache::Pin& ObjectCache::Pin::operator=(Pin&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    holder_ = std::move(other.holder_);
    path_ = std::move(other.path_);
    bytes_ = other.bytes_;
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

ObjectCache::Pin::~Pin() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::unique_ptr<ObjectCache>> ObjectCache::Open(const Options& options) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("cache_dir must name a directory for the object cache");
  }
  if (options.capacity_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache_bytes must be > 0 for the object cache in '", options.dir, "'"));
  }
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create the cache directory '", options.dir, "': ", ec.message()));
  }
  ::chmod(options.dir.c_str(), 0700);
  auto state = std::make_shared<State>();
  state->dir = options.dir;
  state->capacity = options.capacity_bytes;
  state->before_flush = options.before_flush;
  const std::string lock_path = options.dir + "/.lock";
  state->lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (state->lock_fd < 0) return Errno("cannot open '" + lock_path + "'");
  if (::flock(state->lock_fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("the cache directory '", options.dir,
                       "' is in use by another process (another ferryd?); give each ferryd a "
                       "cache_dir of its own"));
    }
    return Errno("cannot lock '" + lock_path + "'");
  }

  // Adopt what an earlier run left: complete entries (object and key file of one size) in
  // order of recency; temporary files and halves of entries are deleted.
  struct Found {
    std::string name;
    uint64_t bytes;
    int64_t mtime_ns;
  };
  std::vector<Found> found;
  for (const auto& e : std::filesystem::directory_iterator(options.dir, ec)) {
    const std::string file = e.path().filename();
    const std::string path = e.path();
    if (file == ".lock") continue;
    if (absl::StrContains(file, kTempMark)) {
      ::unlink(path.c_str());
      continue;
    }
    if (!absl::EndsWith(file, kObjectSuffix)) {
      if (absl::EndsWith(file, kKeySuffix)) {
        const std::string name = file.substr(0, file.size() - std::strlen(kKeySuffix));
        if (!std::filesystem::exists(state->PathOf(name, kObjectSuffix))) ::unlink(path.c_str());
      }
      continue;
    }
    const std::string name = file.substr(0, file.size() - std::strlen(kObjectSuffix));
    const std::string key_path = state->PathOf(name, kKeySuffix);
    std::string text;
    {
      const int fd = ::open(key_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        char buffer[4096];
        ssize_t n;
        while ((n = ::read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, n);
        ::close(fd);
      }
    }
    struct stat st;
    uint64_t recorded = 0;
    const std::vector<std::string> lines = absl::StrSplit(text, '\n');
    const bool valid = lines.size() >= 2 && absl::SimpleAtoi(lines[lines.size() - 2], &recorded) &&
                       Sha256Hex(text.substr(0, text.rfind('\n', text.size() - 2))) == name &&
                       ::stat(path.c_str(), &st) == 0 &&
                       static_cast<uint64_t>(st.st_size) == recorded;
    if (!valid) {
      FERRY_LOG(WARNING) << "object cache: dropping '" << path
                         << "', which does not match its key file";
      ::unlink(path.c_str());
      ::unlink(key_path.c_str());
      continue;
    }
    found.push_back({name, recorded,
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot list the cache directory '", options.dir, "': ", ec.message()));
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime_ns < b.mtime_ns; });
  {
    absl::MutexLock lock(&state->mutex);
    for (const Found& f : found) {
      auto entry = std::make_shared<State::Entry>();
      entry->name = f.name;
      entry->bytes = f.bytes;
      entry->ready = true;
      entry->recency = state->lru.insert(state->lru.end(), entry.get());
      state->used += f.bytes;
      state->entries.emplace(f.name, std::move(entry));
      ++state->stats.adopted;
    }
    state->MakeRoomLocked(0);
  }
  return std::unique_ptr<ObjectCache>(new ObjectCache(std::move(state)));
}

ObjectCache::ObjectCache(std::shared_ptr<State> state)
    : state_(std::move(state)), flusher_([state = state_] { state->FlushLoop(); }) {}

ObjectCache::~ObjectCache() {
  {
    absl::MutexLock lock(&state_->mutex);
    state_->stopping = true;
  }
  flusher_.join();
}

absl::StatusOr<ObjectCache::Pin> ObjectCache::Get(const Key& key, uint64_t bytes,
                                                  const Fill& fill) {
  State& s = *state_;
  const std::string canonical = key.Canonical();
  const std::string name = Sha256Hex(canonical);
  const std::string path = s.PathOf(name, kObjectSuffix);
  std::shared_ptr<State::Entry> entry;
  bool filler = false;
  {
    absl::MutexLock lock(&s.mutex);
    // An entry found may be evicted while this caller waits for its fill to end (its filler
    // read it and let it go, and another Get made room): then look again. (The wait
    // releases the lock: an iterator into `entries` is not used across it.)
    bool hit = false;
    for (auto it = s.entries.find(name); it != s.entries.end(); it = s.entries.find(name)) {
      entry = it->second;
      State::Entry* e = entry.get();
      // Another caller is filling it: wait for the outcome.
      s.mutex.Await(absl::Condition(
          +[](State::Entry* x) { return x->ready || x->failed || x->evicted; }, e));
      if (e->failed) return e->failure;
      if (!e->evicted) {
        hit = true;
        break;
      }
    }
    if (hit) {
      ++s.stats.hits;
    } else {
      if (bytes > s.capacity) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "object '", key.object, "' (", bytes, " bytes) is larger than the object cache (",
            s.capacity, " bytes in '", s.dir, "'): raise cache_bytes"));
      }
      bool room = s.MakeRoomLocked(bytes);
      if (!room && !s.NoneFlushing()) {
        // An entry being flushed goes once its flush ends.
        s.mutex.Await(absl::Condition(&s, &State::NoneFlushing));
        room = s.MakeRoomLocked(bytes);
      }
      if (!room) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the object cache in '", s.dir, "' (", s.capacity, " bytes) has no room for '",
            key.object, "' (", bytes, " bytes): the entries being read hold ", s.used,
            " bytes; raise cache_bytes"));
      }
      entry = std::make_shared<State::Entry>();
      entry->name = name;
      entry->canonical = canonical;
      entry->bytes = bytes;
      s.entries.emplace(name, entry);
      s.used += bytes;
      ++s.stats.misses;
      filler = true;
    }
    if (!filler) {
      if (entry->pins++ == 0) ++s.stats.pinned_entries;
      s.lru.splice(s.lru.end(), s.lru, entry->recency);
    }
  }

  if (filler) {
    absl::Status filled = [&]() -> absl::Status {
      const std::string temp =
          absl::StrCat(path, kTempMark, s.temp_counter.fetch_add(1, std::memory_order_relaxed));
      const int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0) return Errno("cannot create '" + temp + "'");
      absl::Status status = fill(fd);
      struct stat st;
      if (status.ok() && ::fstat(fd, &st) != 0) status = Errno("cannot stat '" + temp + "'");
      if (status.ok() && static_cast<uint64_t>(st.st_size) != bytes) {
        status = absl::DataLossError(absl::StrCat("object '", key.object, "' should be ", bytes,
                                                  " bytes, but ", st.st_size,
                                                  " arrived; it may have changed in the store"));
      }
      ::close(fd);
      // No key file yet (FlushLoop writes it): until then a restart drops the entry.
      if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
        status = Errno("cannot rename '" + temp + "'");
      }
      if (!status.ok()) ::unlink(temp.c_str());
      return status;
    }();
    absl::MutexLock lock(&s.mutex);
    if (!filled.ok()) {
      entry->failed = true;
      entry->failure = filled;
      s.entries.erase(name);
      s.used -= bytes;
      ++s.stats.fill_failures;
      return filled;
    }
    entry->ready = true;
    entry->recency = s.lru.insert(s.lru.end(), entry.get());
    if (entry->pins++ == 0) ++s.stats.pinned_entries;
    s.unflushed.push_back(entry);
  }

  Pin pin;
  // Built in place: a Holder's destruction unpins.
  pin.holder_ = std::shared_ptr<Pin::Holder>(new Pin::Holder{state_, entry});
  pin.path_ = path;
  pin.bytes_ = entry->bytes;
  pin.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (pin.fd_ < 0) return Errno("cannot open the cached object '" + path + "'");
  ::futimens(pin.fd_, nullptr);  // its recency, for the next Open
  return pin;
}

ObjectCache::Stats ObjectCache::stats() const {
  absl::MutexLock lock(&state_->mutex);
  Stats out = state_->stats;
  out.capacity_bytes = state_->capacity;
  out.bytes = state_->used;
  out.entries = state_->entries.size();
  out.unflushed = static_cast<uint64_t>(state_->flushing);
  for (const auto& e : state_->unflushed) out.unflushed += e->evicted ? 0 : 1;
  return out;
}

}  // namespace ferry
