#include "server/dataset/dataset_fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/unique_fd.h"
#include "server/dataset/mapped_file.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

// Paths in messages are cut to this many bytes: a request may name a path of any length.
constexpr size_t kMaxQuotedPath = 512;

std::string Quoted(const std::string& path) {
  if (path.size() <= kMaxQuotedPath) return absl::StrCat("'", path, "'");
  return absl::StrCat("'", path.substr(0, kMaxQuotedPath), "...' (", path.size(), " bytes)");
}

// Absolute `path` with empty and "." components dropped and ".." applied (lexically, as
// std::filesystem's lexically_normal, at a fraction of its cost: a shard list names up to
// kMaxShardNames paths); "/" for the root.
std::string NormalPath(absl::string_view path) {
  std::string out;
  out.reserve(path.size());
  size_t i = 0;
  while (i < path.size()) {
    while (i < path.size() && path[i] == '/') ++i;
    size_t j = path.find('/', i);
    if (j == absl::string_view::npos) j = path.size();
    const absl::string_view part = path.substr(i, j - i);
    if (part == "..") {
      const size_t last = out.rfind('/');
      out.resize(last == std::string::npos ? 0 : last);
    } else if (!part.empty() && part != ".") {
      out += '/';
      out.append(part.data(), part.size());
    }
    i = j;
  }
  return out.empty() ? std::string("/") : out;
}

bool IsUnder(const std::string& normal, const std::string& root) {
  if (root == "/") return true;
  return normal.size() >= root.size() && normal.compare(0, root.size(), root) == 0 &&
         (normal.size() == root.size() || normal[root.size()] == '/');
}

// `normal` below `root` (both normal, IsUnder), without a leading slash; "." for the root.
std::string Below(const std::string& normal, const std::string& root) {
  if (normal.size() == root.size()) return ".";
  return normal.substr(root == "/" ? 1 : root.size() + 1);
}

// The path an open descriptor refers to, as the kernel resolved it.
std::optional<std::string> ResolvedPath(int fd) {
  char link[64];
  snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  std::string target(4096, '\0');
  const ssize_t n = ::readlink(link, target.data(), target.size());
  if (n <= 0 || static_cast<size_t>(n) >= target.size()) return std::nullopt;
  target.resize(static_cast<size_t>(n));
  return target;
}

FileIdentity IdentityOf(const struct stat& st) {
  return FileIdentity{.device = static_cast<uint64_t>(st.st_dev),
                      .inode = static_cast<uint64_t>(st.st_ino),
                      .size = static_cast<uint64_t>(st.st_size),
                      .mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                                  static_cast<int64_t>(st.st_mtim.tv_nsec)};
}

// A file read with pread on its own descriptor.
class RealFile final : public RandomAccessFile {
 public:
  RealFile(std::string path, const FileIdentity& identity, UniqueFd fd)
      : RandomAccessFile(std::move(path), identity), fd_(std::move(fd)) {}

  absl::StatusOr<size_t> ReadAt(uint64_t offset, absl::Span<uint8_t> out) const override {
    const absl::Time start = absl::Now();
    for (;;) {
      const ssize_t n = ::pread(fd_.get(), out.data(), out.size(), static_cast<off_t>(offset));
      if (n >= 0) {
        TallyRead(static_cast<uint64_t>(n), absl::ToInt64Nanoseconds(absl::Now() - start));
        return static_cast<size_t>(n);
      }
      if (errno != EINTR) {
        TallyRead(0, absl::ToInt64Nanoseconds(absl::Now() - start));
        return FileErrnoStatus(errno, "cannot read", path());
      }
    }
  }

 private:
  const UniqueFd fd_;
};

class RealDatasetFs final : public DatasetFs {
 public:
  struct Root {
    std::string configured;  // NormalPath
    std::string canonical;   // symlinks of the root itself resolved (the admin's choice)
  };

  RealDatasetFs(std::vector<Root> roots, bool follow_symlinks, std::string config_path)
      : roots_(std::move(roots)),
        follow_symlinks_(follow_symlinks),
        config_path_(std::move(config_path)) {}

  absl::Status CheckPath(const std::string& path) const override {
    if (path.empty() || path[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "dataset path ", Quoted(path), " is relative; ferryd needs an absolute path"));
    }
    if (roots_.empty()) return absl::OkStatus();
    return FindRoot(NormalPath(path)).status();
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
      const std::string& path) const override {
    FileIdentity identity;
    absl::StatusOr<UniqueFd> fd = OpenRegular(path, &identity);
    if (!fd.ok()) return fd.status();
    return std::make_unique<RealFile>(path, identity, *std::move(fd));
  }

  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFile(
      const std::string& path) const override {
    FileIdentity identity;
    absl::StatusOr<UniqueFd> fd = OpenRegular(path, &identity);
    if (!fd.ok()) return fd.status();
    return mappings_.Map(path, fd->get(), identity);
  }

  absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string& path) const override {
    absl::StatusOr<UniqueFd> fd = Open(path, O_RDONLY | O_DIRECTORY);
    if (!fd.ok()) {
      if (fd.status().code() == absl::StatusCode::kFailedPrecondition) {
        return absl::InvalidArgumentError(absl::StrCat(Quoted(path), " is not a directory"));
      }
      return fd.status();
    }
    DIR* dir = ::fdopendir(fd->get());
    if (dir == nullptr) return FileErrnoStatus(errno, "cannot list", path);
    fd->Release();  // the DIR owns it now
    std::vector<Entry> entries;
    absl::Status status;
    for (;;) {
      errno = 0;
      const struct dirent* d = ::readdir(dir);
      if (d == nullptr) {
        if (errno != 0) status = FileErrnoStatus(errno, "cannot list", path);
        break;
      }
      if (std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0) continue;
      Entry e;
      e.name = d->d_name;
      unsigned char type = d->d_type;
      if (type == DT_UNKNOWN) {  // filesystems without d_type: one lstat
        struct stat st;
        if (::fstatat(::dirfd(dir), d->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
          type = S_ISREG(st.st_mode)   ? DT_REG
                 : S_ISDIR(st.st_mode) ? DT_DIR
                 : S_ISLNK(st.st_mode) ? DT_LNK
                                       : DT_UNKNOWN;
        }
      }
      e.type = type == DT_REG   ? EntryType::kFile
               : type == DT_DIR ? EntryType::kDirectory
               : type == DT_LNK ? EntryType::kSymlink
                                : EntryType::kOther;
      if (e.type == EntryType::kSymlink && follow_symlinks_) {
        e.type = TargetType(absl::StrCat(path, path.back() == '/' ? "" : "/", e.name));
      }
      entries.push_back(std::move(e));
    }
    ::closedir(dir);
    if (!status.ok()) return status;
    return entries;
  }

 private:
  // The root `normal` lies under and its path below that root.
  absl::StatusOr<std::pair<const Root*, std::string>> FindRoot(const std::string& normal) const {
    for (const Root& r : roots_) {
      if (IsUnder(normal, r.configured)) return std::make_pair(&r, Below(normal, r.configured));
      if (IsUnder(normal, r.canonical)) return std::make_pair(&r, Below(normal, r.canonical));
    }
    std::vector<std::string> names;
    for (const Root& r : roots_) names.push_back(r.configured);
    return absl::PermissionDeniedError(absl::StrCat(
        "dataset path ", Quoted(normal), " is not under any configured dataset_roots (",
        absl::StrJoin(names, ", "), "); add its directory to dataset_roots in ", config_path_));
  }

  bool UnderSomeRoot(const std::string& resolved) const {
    for (const Root& r : roots_) {
      if (IsUnder(resolved, r.canonical)) return true;
    }
    return false;
  }

  absl::Status SymlinkRefused(const std::string& path) const {
    return absl::PermissionDeniedError(absl::StrCat(
        "dataset path ", Quoted(path),
        " passes through a symbolic link, and ferryd follows none below dataset_roots; replace "
        "the link with the file, or set follow_symlinks_within_roots: true in ",
        config_path_, " if the tree's links stay within the roots"));
  }

  absl::Status LeavesRoots(const std::string& path) const {
    return absl::PermissionDeniedError(absl::StrCat(
        "dataset path ", Quoted(path),
        " leads outside dataset_roots through a symbolic link or '..'; ferryd reads only files "
        "under the roots configured in ",
        config_path_));
  }

  // Opens `path` with `flags` (O_RDONLY, maybe O_DIRECTORY) under the policy. ENOTDIR for
  // O_DIRECTORY comes back as FAILED_PRECONDITION.
  absl::StatusOr<UniqueFd> Open(const std::string& path, int flags) const {
    absl::Status checked = CheckPath(path);
    if (!checked.ok()) return checked;
    flags |= O_CLOEXEC;
    if (roots_.empty()) {
      UniqueFd fd(::open(path.c_str(), flags));
      if (!fd.valid()) return OpenError(errno, path);
      return fd;
    }
    const std::string normal = NormalPath(path);
    absl::StatusOr<std::pair<const Root*, std::string>> found = FindRoot(normal);
    if (!found.ok()) return found.status();
    const Root& root = *found->first;
    const std::string& below = found->second;
    UniqueFd root_fd(::open(root.canonical.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root_fd.valid()) return OpenError(errno, root.configured);
    if (follow_symlinks_) {
      // Links are followed wherever they lead; what was opened must lie under a root.
      UniqueFd fd(::openat(root_fd.get(), below.c_str(), flags));
      if (!fd.valid()) return OpenError(errno, path);
      const std::optional<std::string> resolved = ResolvedPath(fd.get());
      if (!resolved.has_value() || !UnderSomeRoot(*resolved)) return LeavesRoots(path);
      return fd;
    }
    struct open_how how;
    std::memset(&how, 0, sizeof(how));
    how.flags = static_cast<uint64_t>(flags);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    const long opened = ::syscall(SYS_openat2, root_fd.get(), below.c_str(), &how, sizeof(how));
    if (opened >= 0) return UniqueFd(static_cast<int>(opened));
    const int err = errno;
    if (err == ELOOP) return SymlinkRefused(path);
    if (err == EXDEV) return LeavesRoots(path);
    if (err != ENOSYS) return OpenError(err, path);
    // Kernels before 5.6: refuse a final link, then require that the kernel's resolution
    // of the rest is the path as named (any link on the way would change it).
    UniqueFd fd(::openat(root_fd.get(), below.c_str(), flags | O_NOFOLLOW));
    if (!fd.valid()) {
      if (errno == ELOOP) return SymlinkRefused(path);
      return OpenError(errno, path);
    }
    const std::optional<std::string> resolved = ResolvedPath(fd.get());
    const std::string expected = NormalPath(absl::StrCat(root.canonical, "/", below));
    if (!resolved.has_value() || *resolved != expected) return SymlinkRefused(path);
    return fd;
  }

  // Opens the regular file `path` read-only and says which file it is. O_NONBLOCK: a FIFO
  // (or a device) put where a dataset file should be would otherwise block the open, and
  // with it a worker thread, until someone writes to it; it is refused instead.
  absl::StatusOr<UniqueFd> OpenRegular(const std::string& path, FileIdentity* identity) const {
    absl::StatusOr<UniqueFd> fd = Open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
    if (!fd.ok()) return fd.status();
    struct stat st;
    if (::fstat(fd->get(), &st) != 0) return FileErrnoStatus(errno, "cannot stat", path);
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(Quoted(path), " is not a regular file (",
                                                     S_ISFIFO(st.st_mode)   ? "a FIFO"
                                                     : S_ISCHR(st.st_mode)  ? "a character device"
                                                     : S_ISBLK(st.st_mode)  ? "a block device"
                                                     : S_ISSOCK(st.st_mode) ? "a socket"
                                                                            : "not a file",
                                                     "); a dataset names files"));
    }
    // Reads of a regular file never block on O_NONBLOCK's account; cleared all the same.
    const int status_flags = ::fcntl(fd->get(), F_GETFL);
    if (status_flags >= 0) ::fcntl(fd->get(), F_SETFL, status_flags & ~O_NONBLOCK);
    *identity = IdentityOf(st);
    return fd;
  }

  absl::Status OpenError(int err, const std::string& path) const {
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("dataset path ", Quoted(path), " does not exist"));
    }
    if (err == ENOTDIR) {
      return absl::FailedPreconditionError(absl::StrCat(Quoted(path), " is not a directory"));
    }
    return FileErrnoStatus(err, "cannot open", path);
  }

  // What a followed link below `path`'s directory points at (kSymlink when it may not be
  // followed: outside the roots).
  EntryType TargetType(const std::string& path) const {
    absl::StatusOr<UniqueFd> fd = Open(path, O_PATH);
    struct stat st;
    if (!fd.ok() || ::fstat(fd->get(), &st) != 0) return EntryType::kSymlink;
    return S_ISREG(st.st_mode)   ? EntryType::kFile
           : S_ISDIR(st.st_mode) ? EntryType::kDirectory
                                 : EntryType::kOther;
  }

  // Constant after construction.
  const std::vector<Root> roots_;
  const bool follow_symlinks_;
  const std::string config_path_;
  // MapFile's live mappings (thread-safe itself).
  mutable MappingRegistry mappings_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const DatasetFs>> MakeDatasetFs(const DatasetAccess& access) {
  std::vector<RealDatasetFs::Root> roots;
  for (const std::string& root : access.roots) {
    if (root.empty() || root[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat("dataset_roots entry ", Quoted(root),
                                                     " is not an absolute path; fix it in ",
                                                     access.config_path));
    }
    RealDatasetFs::Root r;
    r.configured = NormalPath(root);
    std::error_code ec;
    r.canonical = NormalPath(fs::weakly_canonical(r.configured, ec).string());
    if (ec) r.canonical = r.configured;
    roots.push_back(std::move(r));
  }
  return std::shared_ptr<const DatasetFs>(std::make_shared<RealDatasetFs>(
      std::move(roots), access.follow_symlinks_within_roots, access.config_path));
}

std::shared_ptr<const DatasetFs> UnconfinedDatasetFs() {
  static const std::shared_ptr<const DatasetFs> unconfined =
      std::make_shared<RealDatasetFs>(std::vector<RealDatasetFs::Root>{}, true, "");
  return unconfined;
}

namespace {
thread_local ReadTally this_thread_reads;
}  // namespace

ReadTally ThisThreadReadTally() { return this_thread_reads; }

void TallyRead(uint64_t bytes, int64_t nanos) {
  this_thread_reads.bytes += bytes;
  this_thread_reads.nanos += nanos;
}

void TallyRemoteWait(int64_t nanos) {
  this_thread_reads.nanos += nanos;
  this_thread_reads.remote_nanos += nanos;
}

absl::StatusOr<size_t> ReadUpTo(const RandomAccessFile& file, uint64_t offset,
                                absl::Span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    absl::StatusOr<size_t> n = file.ReadAt(offset + done, out.subspan(done));
    if (!n.ok()) return n.status();
    if (*n == 0) break;  // the end of the file
    done += std::min(*n, out.size() - done);
  }
  return done;
}

namespace {
constexpr char kDatasetChangedPayload[] = "ferry.dev/dataset-changed";
}  // namespace

absl::Status DatasetChangedError(const std::string& path, uint64_t mapped_bytes) {
  struct stat st;
  const std::string now = ::stat(path.c_str(), &st) == 0
                              ? absl::StrCat("it is now ", st.st_size, " bytes")
                              : absl::StrCat("it cannot be read now: ", strerror(errno));
  absl::Status status = absl::DataLossError(absl::StrCat(
      "dataset file '", path, "' shrank while the job read it (", mapped_bytes,
      " bytes when the job opened it; ", now,
      "): a dataset file must not be truncated or rewritten while a job reads it. Write new "
      "data to a new file (then rename it into place), and create the job again"));
  status.SetPayload(kDatasetChangedPayload, absl::Cord("1"));
  return status;
}

absl::Status StopsTheJob(absl::Status status) {
  status.SetPayload(kDatasetChangedPayload, absl::Cord("1"));
  return status;
}

bool IsDatasetChanged(const absl::Status& status) {
  return status.GetPayload(kDatasetChangedPayload).has_value();
}

bool IsTransientReadError(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted ||
         status.code() == absl::StatusCode::kUnavailable;
}

absl::Status FileErrnoStatus(int err, const std::string& what, const std::string& path) {
  absl::StatusCode code;
  switch (err) {
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case ENOBUFS:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case EIO:
    case EAGAIN:
    case ESTALE:
    case ETIMEDOUT:
    case EINTR:
      code = absl::StatusCode::kUnavailable;
      break;
    default:
      code = absl::ErrnoToStatusCode(err);
      // Codes the reader treats as transient stay reserved for the cases above.
      if (code == absl::StatusCode::kResourceExhausted || code == absl::StatusCode::kUnavailable) {
        code = absl::StatusCode::kInternal;
      }
  }
  return absl::Status(code, absl::StrCat(what, " ", Quoted(path), ": ", std::strerror(err)));
}

absl::Status StoppingError() {
  return absl::UnavailableError(
      "ferryd is stopping; the dataset was not indexed: create the job again once ferryd is "
      "back");
}

namespace {

class StoppableFs final : public DatasetFs {
 public:
  StoppableFs(std::shared_ptr<const DatasetFs> fs,
              std::shared_ptr<const std::atomic<bool>> stopping)
      : fs_(std::move(fs)), stopping_(std::move(stopping)) {}

  absl::Status CheckPath(const std::string& path) const override { return fs_->CheckPath(path); }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenFile(
      const std::string& path) const override {
    return fs_->OpenFile(path);
  }
  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFile(
      const std::string& path) const override {
    return fs_->MapFile(path);
  }
  absl::StatusOr<std::shared_ptr<const MappedFile>> MapFileInRanges(
      const std::string& path) const override {
    return fs_->MapFileInRanges(path);
  }
  absl::StatusOr<std::vector<Entry>> ListDirectory(const std::string& path) const override {
    return fs_->ListDirectory(path);
  }
  bool Stopping() const override {
    return stopping_->load(std::memory_order_relaxed) || fs_->Stopping();
  }

 private:
  const std::shared_ptr<const DatasetFs> fs_;
  const std::shared_ptr<const std::atomic<bool>> stopping_;
};

}  // namespace

std::shared_ptr<const DatasetFs> StoppableDatasetFs(
    std::shared_ptr<const DatasetFs> fs, std::shared_ptr<const std::atomic<bool>> stopping) {
  return std::make_shared<StoppableFs>(std::move(fs), std::move(stopping));
}

}  // namespace ferry
