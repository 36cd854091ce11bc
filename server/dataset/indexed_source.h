// The `indexed` dataset: a Megatron-LM indexed dataset, `<prefix>.bin` plus `<prefix>.idx`
// (IndexedFiles), mapped through DatasetFs::MapFile and read in place, packed ferry's way.
// (`megatron_gpt` reads the same files as Megatron-Core's GPTDataset does.)
//
// The sequences are packed in file order into one stream of tokens, cut into windows of
// seq_len + 1 tokens starting at i * seq_len (as `tokens`); a document may continue from one
// window into the next. Each window also reports where documents start inside it
// (position_ids, cu_seqlens: see ferry.v1.IndexedDataset and docs/data.md).
//
// Cost of opening: IndexedFiles::Open's, O(1) whatever the corpus size. A sample
// finds its first sequence by binary search over the mapped pointers (O(log sequences)) and
// checks every sequence it touches (its length, its pointer, that it ends where the next
// begins), so a corrupt index fails that sample with DATA_LOSS naming the file and never
// reads outside the mappings.
//
//   FERRY_ASSIGN_OR_RETURN(auto source, IndexedSource::Create(spec, fs));
#ifndef FERRY_SERVER_DATASET_INDEXED_SOURCE_H_
#define FERRY_SERVER_DATASET_INDEXED_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/indexed_files.h"
#include "server/dataset/sample_source.h"

namespace ferry {

class IndexedSource final : public SampleSource {
 public:
  // Errors: INVALID_ARGUMENT naming the field (dataset.indexed.*) or saying what is wrong
  // with the .idx (magic, version, dtype code, sizes that disagree with its header, document
  // indices not from 0 to the sequence count) or the .bin (shorter than the index says);
  // NOT_FOUND naming a missing file; FAILED_PRECONDITION when there is no whole window.
  // With options.device_widens_tokens (and not spec.widen_on_host), the "tokens" field holds
  // the file's uint16 / int32 ids for the device to widen (FieldLayout::device_dtype),
  // unless they are int32 delivered as INT32. options.row_stores says how computed rows
  // (position_ids, cu_seqlens) are written.
  static absl::StatusOr<std::unique_ptr<IndexedSource>> Create(
      const ferry::v1::IndexedDataset& spec, const DatasetFs& fs = *UnconfinedDatasetFs(),
      const SourceOptions& options = SourceOptions());

  int64_t size() const override { return num_samples_; }
  const std::vector<FieldLayout>& fields() const override { return fields_; }
  std::unique_ptr<Scratch> NewScratch() const override;
  // DATA_LOSS naming the .idx for a sequence that contradicts the index's layout, or the .bin
  // for a token that does not fit the output dtype.
  absl::Status Fill(int64_t index, uint64_t sample_seed, absl::Span<uint8_t* const> rows,
                    Scratch* scratch) const override;
  std::string Describe(int64_t index) const override;
  bool FillIsCopy() const override { return true; }
  // A window's tokens lie packed in the .bin, from token index * seq_len on (sequences end
  // where the next begins, the first at byte 0: IndexedFiles::Open and SequenceFits), so its
  // range needs no walk through the index; a malformed index makes it wrong, and Fill fail.
  void RangesOf(int64_t index, std::vector<MappedRange>* ranges) const override;
  bool ReadsInRanges() const override { return files_.bin().read_in_ranges(); }

  // A run of a sequence's tokens that a window reads: where in the .bin, how many.
  struct Segment {
    int64_t byte;
    int64_t tokens;
  };

 private:
  explicit IndexedSource(IndexedFiles files) : files_(std::move(files)) {}

  // What is wrong with the index where a window's walk through it stopped (PlanWindow),
  // made into a status outside the guarded read (which may not allocate).
  struct IndexFault {
    enum class Kind { kNone, kSequence, kNotIncreasing, kEnds };
    Kind kind = Kind::kNone;
    int64_t at = 0;  // the sequence (kSequence, kNotIncreasing), the token (kEnds)
    int64_t pointer = 0, length = 0, next = 0;  // kSequence: what the index says of it
  };
  // The window of `n` tokens from stream token `first`: for each sequence it touches, the
  // byte in the .bin and the token count, into `segments`; the window positions where a
  // document starts into `starts` (0 first). Reads only the .idx mapping and writes only
  // the two vectors, within their capacity (n + 1): it runs inside a guarded read.
  IndexFault PlanWindow(int64_t first, int64_t n, std::vector<Segment>& segments,
                        std::vector<int64_t>& starts) const;
  // The fault for sequence s, which does not fit (SequenceFits).
  IndexFault Misfit(int64_t s) const;
  absl::Status FaultStatus(const IndexFault& fault) const;
  // Whether sequence s begins a document. *cursor: -1 on a window's first call (a binary
  // search), then the entry it stopped at, which later calls for larger s walk on from.
  bool StartsDocument(int64_t s, int64_t* cursor) const;

  // Constant after construction.
  IndexedFiles files_;
  ferry::v1::DType output_dtype_ = ferry::v1::INT64;
  bool raw_ = false;  // "tokens" holds the file's ids (device_dtype set)
  RowStores row_stores_ = RowStores::kOrdinary;
  int64_t seq_len_ = 0;
  int64_t num_samples_ = 0;
  int position_field_ = -1;
  int cu_field_ = -1;
  int count_field_ = -1;
  int index_field_ = -1;
  std::vector<FieldLayout> fields_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_INDEXED_SOURCE_H_
