// The `webdataset` dataset: samples stored in tar shards the way WebDataset writes them,
// each sample a run of consecutive members sharing a basename:
//   n01440764_10026.jpg  n01440764_10026.cls  n01440764_10027.jpg  n01440764_10027.cls ...
//
// Grouping (WebDataset's rule): a member's basename is its path up to the first '.' of its
// file-name part, its extension the rest, lowercased ("a/b.seg.PNG" -> "a/b", "seg.png").
// Members with no '.' in the file name, or a file name starting with '.', are ignored; a
// run of members with the same basename is one sample (a basename that comes back later,
// after another, starts a new sample). Within a sample the first member with a given
// extension wins; repeats are ignored and counted.
//
// Fields: "image" uint8 [size, size, 3]: the member whose extension is image_key (default
// "jpg"; "jpg" and "jpeg" match each other; "png" for PNG members), decoded by its content
// (JPEG or PNG) and transformed exactly as ImageFolderSource does; "label" int64: the decimal text
// of the label_key member (default "cls"; surrounding whitespace allowed), -1 when the sample has
// none; "index" int64. A sample without an image member is skipped at indexing and counted.
//
// Samples are numbered in shard order (patterns expanded in order), then member order. Every
// shard is indexed once, in Create, by reading its headers (see tar_index.h); a shard cut
// short keeps the samples before the cut (the one the cut member may belong to is dropped
// too; a warning is logged and counted); a damaged header refuses the whole dataset.
//
// Order: StreamOrder gives the epoch's order WebDataset-style (shards permuted, then a
// bounded shuffle buffer) so that, dealt in contiguous runs, each rank reads its own shards
// mostly sequentially. See StreamOrder.
//
// Memory: ~40 bytes plus the image member's name per sample.
#ifndef FERRY_SERVER_DATASET_WEBDATASET_SOURCE_H_
#define FERRY_SERVER_DATASET_WEBDATASET_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/sample_source.h"
#include "server/decode/image_transform.h"

namespace ferry {

class WebDatasetSource final : public SampleSource {
 public:
  // What indexing found besides the samples; logged by Create.
  struct Stats {
    int64_t shards = 0;
    int64_t members = 0;                // regular files in all shards
    int64_t samples_without_image = 0;  // skipped
    int64_t members_ignored = 0;        // no extension, or a repeated one within a sample
    int64_t truncated_shards = 0;       // cut short: their last member(s) dropped
    int64_t truncated_samples = 0;      // the sample at a cut (maybe incomplete): dropped
  };

  // Expands and indexes spec.shards (indexing runs on a few threads). Errors:
  //   INVALID_ARGUMENT: no shards, a bad pattern, or an empty image_key/label_key after
  //     defaults;
  //   NOT_FOUND "dataset path '<shard>' does not exist", other open errors name the shard;
  //   FAILED_PRECONDITION "webdataset shard '<shard>' is damaged: ..." for a corrupt header
  //     (with its byte offset), or when no shard holds a sample with an image member.
  // Shards are opened through `fs`, now and by Fill.
  static absl::StatusOr<std::unique_ptr<WebDatasetSource>> Create(
      const ferry::v1::WebDataset& spec, const ImageTransform& transform,
      const DecodeLimits& limits = DecodeLimits(),
      std::shared_ptr<const DatasetFs> fs = UnconfinedDatasetFs());

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  const std::vector<FieldLayout>& fields() const override { return fields_; }
  uint64_t index_bytes() const override;
  std::unique_ptr<Scratch> NewScratch() const override;
  // Errors name "<shard>:<member>": the open/read errno as its canonical code (EIO is
  // UNAVAILABLE: IsTransientReadError); DATA_LOSS for an image member that is empty, over
  // limits.max_sample_bytes or does not decode, a label that is not a decimal integer, a
  // shard now shorter than when it was indexed, or a shard replaced or rewritten since (a
  // Scratch that has the shard open keeps reading the file it opened).
  absl::Status Fill(int64_t index, uint64_t sample_seed, absl::Span<uint8_t* const> rows,
                    Scratch* scratch) const override;
  // "<shard path>:<image member name>".
  std::string Describe(int64_t index) const override;
  std::string FileOf(int64_t index) const override;

  bool HasStreamOrder() const override { return true; }
  // The epoch's order, a permutation of [0, size()):
  //   * shuffle off: the identity (shard order, then member order);
  //   * shuffle on: the shards permuted by Fisher-Yates drawn from (seed, epoch), their
  //     samples concatenated in that order, then passed through a shuffle buffer of
  //     shuffle_buffer samples (default 1000) drawn from (seed, epoch) too: fill the buffer,
  //     then for each next sample emit a random buffered one and put the new one in its
  //     place; at the end emit the rest in random order. shuffle_buffer <= 1 keeps the
  //     shard-permuted order as is.
  // A pure function of (seed, epoch, the shard list and their contents): every node computes
  // the same order.
  void StreamOrder(uint64_t seed, int64_t epoch, bool shuffle,
                   std::vector<int64_t>* order) const override;

  const Stats& stats() const { return stats_; }
  const std::vector<std::string>& shards() const { return shards_; }
  // Samples of shard s: [shard_begin()[s], shard_begin()[s + 1]).
  const std::vector<int64_t>& shard_begin() const { return shard_begin_; }

 private:
  static constexpr uint16_t kNoLabel = 0xffff;
  // Where one sample's members lie.
  struct Sample {
    uint64_t image_offset = 0;
    uint64_t image_size = 0;
    uint64_t label_offset = 0;
    uint32_t label_size = 0;  // saturated: larger members are refused at Fill anyway
    uint32_t shard = 0;
    uint16_t label_spelling = kNoLabel;  // label_spellings_[i], or kNoLabel
  };
  struct ShardResult;  // one shard's samples, before they are merged

  WebDatasetSource(const ImageTransform& transform, const DecodeLimits& limits,
                   uint32_t shuffle_buffer, std::shared_ptr<const DatasetFs> fs);
  static absl::StatusOr<ShardResult> IndexShard(const std::string& path,
                                                const std::string& image_key,
                                                const std::string& label_key, const DatasetFs& fs);
  absl::string_view ImageName(int64_t index) const;
  std::string LabelName(int64_t index) const;

  // Constant after construction.
  const ImageTransform transform_;
  const DecodeLimits limits_;
  const uint32_t shuffle_buffer_;
  const std::shared_ptr<const DatasetFs> fs_;
  std::vector<std::string> shards_;
  // Per shard: the file indexed. Fill reads a shard only while its path opens this file.
  std::vector<FileIdentity> shard_identities_;
  std::vector<int64_t> shard_begin_;  // per shard + 1
  std::vector<Sample> samples_;
  std::vector<uint64_t> name_offsets_;  // per sample + 1: names_[off[i], off[i+1])
  std::string names_;                   // image member names, concatenated
  // The label extensions as members spell them ("cls", "CLS", ...): the label member of
  // sample i is <its basename>.<label_spellings_[samples_[i].label_spelling]>.
  std::vector<std::string> label_spellings_;
  Stats stats_;
  std::vector<FieldLayout> fields_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_WEBDATASET_SOURCE_H_
