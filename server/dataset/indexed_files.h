// A Megatron-LM indexed dataset's two files, mapped and checked: `<prefix>.bin` (token ids)
// and `<prefix>.idx` (MMIDIDX version 1: a 34-byte header, then int32 sequence lengths, int64
// sequence byte pointers into the .bin, int64 document indices (the first sequence of each
// document, then the sequence count), optionally int8 sequence modes). Shared by the
// `indexed` dataset (ferry's packing) and `megatron_gpt` (Megatron-Core's).
//
// Open reads the header and four entries of the index and checks the file sizes against
// it, O(1) whatever the corpus size; no array is parsed or copied. The entry accessors read
// the mapping unchecked beyond that: call them inside idx().Read (a file cut short under the
// job then ends the read instead of killing ferryd), and check each sequence a read touches
// with SequenceFits before trusting its pointer.
//
//   FERRY_ASSIGN_OR_RETURN(IndexedFiles files, IndexedFiles::Open("/data/wiki", fs));
//   int64_t length;
//   FERRY_RETURN_IF_ERROR(files.idx().Read([&] { length = files.SequenceLength(0); }));
//
// Immutable after Open: safe to share between threads.
#ifndef FERRY_SERVER_DATASET_INDEXED_FILES_H_
#define FERRY_SERVER_DATASET_INDEXED_FILES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/dataset/dataset_fs.h"
#include "server/dataset/mapped_file.h"

namespace ferry {

class IndexedFiles final {
 public:
  static constexpr size_t kIdxHeaderBytes = 34;

  // Maps and checks `<prefix>.idx` and `<prefix>.bin`. Errors: NOT_FOUND naming a missing
  // file; INVALID_ARGUMENT saying what is wrong with the .idx (magic, version, dtype code,
  // sizes that disagree with its header, document indices not from 0 to the sequence count,
  // pointers outside the .bin) or the .bin (shorter than the index says);
  // FAILED_PRECONDITION for an index of no sequence.
  static absl::StatusOr<IndexedFiles> Open(const std::string& prefix, const DatasetFs& fs);

  const MappedFile& idx() const { return *idx_; }
  const MappedFile& bin() const { return *bin_; }
  // The .bin's mapping, shared (for a range of it that outlives this object: MappedRange).
  const std::shared_ptr<const MappedFile>& shared_bin() const { return bin_; }
  const std::string& prefix() const { return prefix_; }
  size_t token_bytes() const { return token_bytes_; }  // 2 (uint16) or 4 (int32)
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_documents_; }  // entries: documents + 1
  int64_t used_bytes() const { return used_bytes_; }        // of the .bin
  int64_t tokens() const { return used_bytes_ / static_cast<int64_t>(token_bytes_); }

  // Entries of the index; inside idx().Read only. 0 <= s < num_sequences(),
  // 0 <= d < num_documents().
  int64_t SequenceLength(int64_t s) const;
  int64_t SequencePointer(int64_t s) const;
  int64_t DocumentIndex(int64_t d) const;
  // True when sequence s lies where the packed .bin needs it: a non-negative length, ending
  // where sequence s + 1 begins (the .bin's used end for the last). Inside idx().Read.
  bool SequenceFits(int64_t s) const;

  // Every sequence length, copied out (GPTDataset's `sequence_lengths`). DATA_LOSS naming
  // the .idx for a negative one; DatasetChangedError when the file shrinks meanwhile.
  absl::StatusOr<std::vector<int32_t>> SequenceLengths() const;

 private:
  IndexedFiles() = default;

  std::string prefix_;
  std::shared_ptr<const MappedFile> idx_;
  std::shared_ptr<const MappedFile> bin_;
  size_t token_bytes_ = 0;
  int64_t num_sequences_ = 0;
  int64_t num_documents_ = 0;
  int64_t used_bytes_ = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_INDEXED_FILES_H_
