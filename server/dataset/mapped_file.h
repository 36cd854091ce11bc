// Move-only owner of a read-only memory mapping of a whole file.
//
//   FERRY_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open("/data/tokens.bin"));
//   absl::Span<const uint8_t> bytes = file.bytes();
//
// The file descriptor is closed as soon as the mapping exists (the mapping keeps the file
// alive); the mapping is removed by the destructor. bytes() may be read from any thread.
#ifndef FERRY_SERVER_DATASET_MAPPED_FILE_H_
#define FERRY_SERVER_DATASET_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ferry {

class MappedFile final {
 public:
  // Maps `path` read-only. NOT_FOUND "dataset path '<path>' does not exist", PERMISSION_DENIED
  // and other open/mmap failures name the path; INVALID_ARGUMENT when it is not a regular
  // file. An empty file gives an empty mapping (bytes() is empty, nothing is mapped).
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  absl::Span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  void Reset();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_MAPPED_FILE_H_
