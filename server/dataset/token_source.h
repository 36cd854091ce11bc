// The `tokens` dataset: a flat file of little-endian uint16/uint32 token ids, memory-mapped
// read-only. Sample i is the window of seq_len + 1 tokens starting at token i * seq_len
// (inputs and shifted targets of a language-model step), so consecutive samples overlap by one
// token and num_samples = (num_tokens - 1) / seq_len.
//
// Most callers go through MakeSampleSource(spec); TokenSource::Create is the same thing
// without the JobSpec wrapper.
#ifndef FERRY_SERVER_DATASET_TOKEN_SOURCE_H_
#define FERRY_SERVER_DATASET_TOKEN_SOURCE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/mapped_file.h"
#include "server/dataset/sample_source.h"

namespace ferry {

class TokenSource final : public SampleSource {
 public:
  // Errors name the proto field (dataset.tokens.*) or the file; see MakeSampleSource.
  //
  // `raw`: the "tokens" field holds the file's own token dtype (UINT16 / UINT32), copied
  // as is, and a GPU transport widens it on the device, so only 2 or 4 bytes per token
  // cross PCIe and the workers only copy. Refused (INVALID_ARGUMENT) for UINT32 -> INT32,
  // whose overflow check needs the host.
  // The file is mapped through `fs` (DatasetFs::MapFile).
  static absl::StatusOr<std::unique_ptr<TokenSource>> Create(
      const ferry::v1::TokensDataset& spec, bool raw = false,
      const DatasetFs& fs = *UnconfinedDatasetFs());

  int64_t size() const override { return num_samples_; }
  const std::vector<FieldLayout>& fields() const override { return fields_; }
  std::unique_ptr<Scratch> NewScratch() const override;
  // Never fails for an index in range, except DATA_LOSS for a uint32 token that does not fit
  // an INT32 output.
  absl::Status Fill(int64_t index, uint64_t sample_seed, absl::Span<uint8_t* const> rows,
                    Scratch* scratch) const override;
  std::string Describe(int64_t index) const override;
  bool FillIsCopy() const override { return true; }
  void RangesOf(int64_t index, std::vector<MappedRange>* ranges) const override;
  bool ReadsInRanges() const override { return file_->read_in_ranges(); }

 private:
  TokenSource(std::shared_ptr<const MappedFile> file, size_t token_bytes,
              ferry::v1::DType output_dtype, int64_t seq_len, int64_t num_samples, bool raw);

  // Constant after construction.
  const std::shared_ptr<const MappedFile> file_;  // shared with other jobs over the file
  const size_t token_bytes_;                      // 2 or 4
  const ferry::v1::DType output_dtype_;           // INT64 or INT32
  const int64_t seq_len_;
  const int64_t num_samples_;
  const bool raw_;
  std::vector<FieldLayout> fields_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_TOKEN_SOURCE_H_
