// The `megatron_gpt` dataset: Megatron-Core's GPTDataset over one Megatron-LM indexed dataset,
// or its BlendedDataset over several, as BlendedMegatronDatasetBuilder builds them for one
// split (ferry.v1.MegatronGptDataset). Sample i is sample i of that Megatron dataset, field
// for field; the index arrays are megatron_gpt.h's.
//
// Cost of opening: each prefix's sequence lengths are copied (4 bytes a sequence) and its
// GPTDataset's index built (numpy's shuffles over the documents and samples), O(samples +
// documents * epochs); the arrays stay in memory for the source's life, reserved from
// SourceOptions::host_budget before they are built. A sample reads its pieces of sequences
// through the mappings, checking each against the index, so a corrupt or shrunk file fails
// that sample with DATA_LOSS (or DatasetChangedError) naming the file.
//
//   FERRY_ASSIGN_OR_RETURN(auto source, MegatronGptSource::Create(spec.dataset().megatron_gpt(),
//                                                                 fs, options));
#ifndef FERRY_SERVER_DATASET_MEGATRON_GPT_SOURCE_H_
#define FERRY_SERVER_DATASET_MEGATRON_GPT_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/indexed_files.h"
#include "server/dataset/megatron_gpt.h"
#include "server/dataset/sample_source.h"
#include "server/memory/memory_budget.h"

namespace ferry {

class MegatronGptSource final : public SampleSource {
 public:
  // Errors: INVALID_ARGUMENT naming the field of dataset.megatron_gpt that is out of range
  // (or Megatron's own refusal: sequence_length 1, a split of weight 0, a blend without
  // num_samples), IndexedFiles::Open's errors, FAILED_PRECONDITION for a split with no
  // token, RESOURCE_EXHAUSTED when the index arrays do not fit the host budget.
  static absl::StatusOr<std::unique_ptr<MegatronGptSource>> Create(
      const ferry::v1::MegatronGptDataset& spec, const DatasetFs& fs,
      const SourceOptions& options = SourceOptions());

  int64_t size() const override { return size_; }
  const std::vector<FieldLayout>& fields() const override { return fields_; }
  std::unique_ptr<Scratch> NewScratch() const override;
  absl::Status Fill(int64_t index, uint64_t sample_seed, absl::Span<uint8_t* const> rows,
                    Scratch* scratch) const override;
  std::string Describe(int64_t index) const override;
  bool FillIsCopy() const override { return true; }
  bool DealsMicroBatches() const override { return true; }
  // The pieces of sequences a Fill of `index` reads from a .bin read in ranges, one range a
  // piece in reading order, found in the .idx; none when the .idx is read in ranges too.
  void RangesOf(int64_t index, std::vector<MappedRange>* ranges) const override;
  bool ReadsInRanges() const override;

 private:
  // One GPTDataset: a prefix's files and the index of its split.
  struct Gpt {
    IndexedFiles files;
    megatron::GptIndex index;
  };

  MegatronGptSource() = default;

  // Which GPTDataset and which of its samples serve sample `index`.
  std::pair<const Gpt*, int64_t> Locate(int64_t index) const;
  // Appends the int64 ids of `length` tokens (-1: to its end) of sequence `sequence` from
  // `offset`, as GptSampleText asks; the first error goes to *status.
  void ReadTokens(const Gpt& gpt, int32_t sequence, int64_t offset, int64_t length,
                  std::vector<int64_t>* out, absl::Status* status) const;

  // Constant after construction.
  std::vector<Gpt> gpts_;
  std::vector<int16_t> dataset_index_;  // a blend's: source of each sample
  std::vector<int64_t> dataset_sample_index_;
  std::string split_name_;
  megatron::GptSampleOptions sample_;
  ferry::v1::DType output_dtype_ = ferry::v1::INT64;
  RowStores row_stores_ = RowStores::kOrdinary;
  int64_t size_ = 0;
  int mask_field_ = -1;
  int cu_field_ = -1;
  // The index arrays, in SourceOptions::host_budget.
  MemoryBudget::Reservation index_memory_;
  std::vector<FieldLayout> fields_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_MEGATRON_GPT_SOURCE_H_
