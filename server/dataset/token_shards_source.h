// The `token_shards` dataset: several flat files of little-endian uint16/uint32 token ids
// (nanoGPT-style `.bin` shards), each memory-mapped read-only through DatasetFs::MapFile (one
// mapping per file, shared with other jobs over it). A sample is a window of seq_len + 1
// tokens (inputs and shifted targets).
//
// Without windows_cross_files, window j of a shard starts at its token j * seq_len, a shard
// of n tokens holds (n - 1) / seq_len windows (none when n < seq_len + 1: its tokens are
// unused), and sample indices number the first shard's windows, then the second's, ...; no
// window straddles two files. With windows_cross_files the shards are read as their
// concatenation, windowed like one `tokens` file: num_samples = (total_tokens - 1) / seq_len.
// The epoch's order is the job's sampler's (a shuffle of all windows of all shards from
// (seed, epoch), dealt to ranks with equal counts), as for every non-stream dataset.
//
// Cost of opening: one open + fstat + mmap per shard and O(shards) arithmetic; no token is
// read until a sample is. Fill finds its shard by binary search (O(log shards)).
//
//   FERRY_ASSIGN_OR_RETURN(auto source, TokenShardsSource::Create(spec, /*raw=*/false, fs));
#ifndef FERRY_SERVER_DATASET_TOKEN_SHARDS_SOURCE_H_
#define FERRY_SERVER_DATASET_TOKEN_SHARDS_SOURCE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/mapped_file.h"
#include "server/dataset/sample_source.h"

namespace ferry {

class TokenShardsSource final : public SampleSource {
 public:
  // A job maps at most this many shards: each is a mapping of the daemon's, and the kernel
  // bounds a process's mappings (vm.max_map_count, 65530 by default) for all jobs together.
  static constexpr size_t kMaxShards = 16384;

  // Errors: INVALID_ARGUMENT naming the field (dataset.token_shards.*) or the shard (a size
  // that is not a multiple of the token size, too many shards, a malformed pattern);
  // NOT_FOUND / PERMISSION_DENIED naming a shard that cannot be mapped; FAILED_PRECONDITION
  // when no shard holds a whole window.
  // `raw`: as TokenSource's (the device widens the file's own dtype).
  static absl::StatusOr<std::unique_ptr<TokenShardsSource>> Create(
      const ferry::v1::TokenShardsDataset& spec, bool raw = false,
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
  bool ReadsInRanges() const override { return reads_in_ranges_; }

  // Where sample `index` starts: its shard (position in the expanded list) and the token
  // offset in it. For tests and error reports.
  struct Location {
    size_t shard = 0;
    int64_t token = 0;
  };
  Location Locate(int64_t index) const;
  size_t num_shards() const { return shards_.size(); }

 private:
  struct Shard {
    std::shared_ptr<const MappedFile> file;
    int64_t tokens = 0;
    int64_t first_token = 0;   // in the concatenation of all shards
    int64_t first_window = 0;  // sample index of its first window (without crossing)
  };

  TokenShardsSource(std::vector<Shard> shards, size_t token_bytes, ferry::v1::DType output_dtype,
                    int64_t seq_len, bool cross_files, int64_t num_samples, bool raw);

  // Constant after construction.
  const std::vector<Shard> shards_;
  const size_t token_bytes_;             // 2 or 4
  const ferry::v1::DType output_dtype_;  // INT64 or INT32
  const int64_t seq_len_;
  const bool cross_files_;
  const int64_t num_samples_;
  const bool raw_;
  const bool reads_in_ranges_;  // some shard is read in ranges
  std::vector<FieldLayout> fields_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_TOKEN_SHARDS_SOURCE_H_
