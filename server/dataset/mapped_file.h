// Shared owner of a read-only memory mapping of a whole file.
//
//   FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file,
//                          MappedFile::Open("/data/tokens.bin"));
//   absl::Span<const uint8_t> bytes = file->bytes();
//
// One mapping per file per process: opening a file that is already mapped -- the same
// inode, unchanged since (size and modification time), by any path -- returns the existing
// mapping. Jobs over the same dataset then share its address range, and with it the GPU
// transport's one registration of those pages and one charge to the pinned budget
// (cudaHostRegister pins by address range: two mappings of one file would pin its page
// cache twice). A file replaced or rewritten since gets a mapping of its own.
//
// The file descriptor is closed as soon as the mapping exists (the mapping keeps the file
// alive); the last owner removes the mapping. bytes() may be read from any thread, and
// Open may be called from any thread.
#ifndef FERRY_SERVER_DATASET_MAPPED_FILE_H_
#define FERRY_SERVER_DATASET_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/dataset/dataset_fs.h"

namespace ferry {

class MappedFile final {
 public:
  // Maps `path` read-only, opened through `fs`, or returns the mapping of the same unchanged
  // file if one is alive. Errors as DatasetFs::OpenFile's (NOT_FOUND, PERMISSION_DENIED,
  // INVALID_ARGUMENT when it is not a regular file) and mmap's, naming the path. An empty
  // file gives an empty mapping (bytes() is empty, nothing is mapped).
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(
      const std::string& path, const DatasetFs& fs = *UnconfinedDatasetFs());

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  absl::Span<const uint8_t> bytes() const { return {data_, size_}; }
  // The path the file was first opened by (another opener may have named it by another
  // link: the file is the same).
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  const std::string path_;
  const uint8_t* const data_;
  const size_t size_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_MAPPED_FILE_H_
