// An index of the regular-file members of a tar archive: per member its name, the byte
// offset of its data in the file and its size, so that any member can later be read in place
// with one pread.
//
//   FERRY_ASSIGN_OR_RETURN(TarIndex index, IndexTarFile("/data/train-000042.tar", *fs));
//   for (const TarMember& m : index.members) { ... file->ReadAt(m.data_offset, ...) ... }
//
// Why not libarchive: ferry reads samples in place, in any order (exact resume at any batch,
// each rank starting in the middle of the epoch's order), so it needs each member's byte
// offset in the shard. libarchive's read API is a stream (archive_read_next_header /
// archive_read_data) and does not expose where a member's data lies in the file. The format
// subset WebDataset shards use is small, and reading only headers (one 512-byte pread per
// member, data skipped by offset) indexes a shard of 10k members in milliseconds.
//
// Format coverage:
//   * ustar / POSIX headers (name + prefix), GNU headers ("ustar  " magic, prefix unused),
//     and old V7 headers (no magic; a name ending in '/' is a directory);
//   * pax extended headers ('x', and Solaris 'X'): "path" and "size" override the next
//     member's; other keys are ignored; a member carrying GNU.sparse.* keys is skipped;
//   * pax global headers ('g') are skipped (their keys are ignored);
//   * GNU long names ('L'; 'K' long link names are skipped);
//   * sizes in octal or GNU base-256; header checksums (unsigned sum, or the historic signed
//     sum) are verified;
//   * regular files ('0', '\0', '7') are indexed; directories, hard and symbolic links,
//     devices, FIFOs, GNU sparse files ('S', including their extension blocks) and unknown
//     types are skipped, as Python's tarfile (which WebDataset itself uses) does;
//   * the archive ends at the first all-zero block (normally the first of two) or at EOF.
//
// Damage:
//   * a header that fails its checksum, a malformed number, a malformed pax record or an
//     oversized pax/long-name payload is corruption: DATA_LOSS naming the shard and the byte
//     offset of the header; nothing is indexed;
//   * a header, or a member's data, that runs past the end of the file is truncation: the
//     members before it are kept, that member and everything after it are dropped, and the
//     result says where (TarIndex::truncated_at) so the caller can warn and count.
#ifndef FERRY_SERVER_DATASET_TAR_INDEX_H_
#define FERRY_SERVER_DATASET_TAR_INDEX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/dataset/dataset_fs.h"

namespace ferry {

inline constexpr uint64_t kTarBlockSize = 512;

// Random access to the bytes of one archive: a file (pread) or memory (tests).
class TarReader {
 public:
  virtual ~TarReader() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly out.size() bytes at `offset`; the caller guarantees
  // offset + out.size() <= size(). Errors carry the errno's canonical code.
  virtual absl::Status ReadAt(uint64_t offset, absl::Span<uint8_t> out) const = 0;
};

struct TarMember {
  std::string name;            // pax path, else GNU long name, else prefix/name
  uint64_t header_offset = 0;  // first header block of the member (pax/long-name included)
  uint64_t data_offset = 0;    // data_offset + size <= file size, always
  uint64_t size = 0;
};

struct TarIndex {
  std::vector<TarMember> members;  // regular files, in archive order
  uint64_t file_size = 0;
  // Set when the archive is cut short: the header at truncated_at (or the data of the member
  // it starts) runs past the end of the file. That member and any after it are lost.
  bool truncated = false;
  uint64_t truncated_at = 0;
  std::string truncated_member;  // its name, when its headers were complete
  // The file indexed (IndexTarFile; zero for IndexTarBytes): a reader of the members later
  // checks that it still reads this file, not another renamed over its path.
  FileIdentity identity;
};

// Indexes the archive behind `reader`; `shard` names it in error messages. DATA_LOSS
// "corrupt tar header in '<shard>' at byte <offset>: <what>" for corruption (see above); the
// reader's error, with the shard and offset added, when a read fails.
absl::StatusOr<TarIndex> IndexTar(const std::string& shard, const TarReader& reader);

// Indexes the tar file at `path`, opened and read through `fs`. NOT_FOUND "dataset path '<path>'
// does not exist", PERMISSION_DENIED and other open errors name the path; INVALID_ARGUMENT when it
// is not a regular file.
absl::StatusOr<TarIndex> IndexTarFile(const std::string& path,
                                      const DatasetFs& fs = *UnconfinedDatasetFs());

// Indexes an archive held in memory (tests, tools).
absl::StatusOr<TarIndex> IndexTarBytes(const std::string& shard, absl::Span<const uint8_t> bytes);

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_TAR_INDEX_H_
