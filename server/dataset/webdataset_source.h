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
// shard is indexed once, by reading its headers (see tar_index.h):
//   * without shard_samples, all of them in Create. A shard cut short keeps the samples
//     before the cut (the one the cut member may belong to is dropped too; a warning is
//     logged and counted); a damaged header refuses the whole dataset.
//   * with shard_samples (each shard's count, from a shard index), each shard when a Fill
//     first reads it, so that Create opens no shard and an epoch over a store overlaps the
//     download of its later shards. The numbering is the counts': a sample without an image
//     member is a bad sample (DATA_LOSS) instead of skipped, and so are the samples a cut
//     shard lost. A shard that is damaged, missing, or holds more samples than its count (or
//     fewer, uncut) fails every Fill of its samples with StopsTheJob.
//
// Order: StreamOrder gives the epoch's order WebDataset-style (shards permuted, then a
// bounded shuffle buffer) so that, dealt in contiguous runs, each rank reads its own shards
// mostly sequentially. See StreamOrder.
//
// Memory: ~36 bytes plus the image member's name per sample.
#ifndef FERRY_SERVER_DATASET_WEBDATASET_SOURCE_H_
#define FERRY_SERVER_DATASET_WEBDATASET_SOURCE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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

  // Expands spec.shards and indexes them (on a few threads) unless spec.shard_samples
  // gives their counts. Errors:
  //   INVALID_ARGUMENT: no shards (or a shard_index not read into shards yet: CreateJob
  //     does, ResolveDatasetIndexes), a bad pattern, shard_samples not one per shard or
  //     summing to 0, or an empty image_key/label_key after defaults;
  //   NOT_FOUND "dataset path '<shard>' does not exist", other open errors name the shard;
  //   FAILED_PRECONDITION "webdataset shard '<shard>' is damaged: ..." for a corrupt header
  //     (with its byte offset), or when no shard holds a sample with an image member.
  // Shards are opened through `fs`, now and by Fill.
  static absl::StatusOr<std::unique_ptr<WebDatasetSource>> Create(
      const ferry::v1::WebDataset& spec, const ImageTransform& transform,
      const DecodeLimits& limits = DecodeLimits(),
      std::shared_ptr<const DatasetFs> fs = UnconfinedDatasetFs());

  int64_t size() const override { return shard_begin_.back(); }
  const std::vector<FieldLayout>& fields() const override { return fields_; }
  uint64_t index_bytes() const override;
  std::unique_ptr<Scratch> NewScratch() const override;
  // Errors name "<shard>:<member>": the open/read errno as its canonical code (EIO is
  // UNAVAILABLE: IsTransientReadError); DATA_LOSS for an image member that is empty, over
  // limits.max_sample_bytes or does not decode, a label that is not a decimal integer, a
  // shard now shorter than when it was indexed, or a shard replaced or rewritten since (a
  // Scratch that has the shard open keeps reading the file it opened). With shard_samples,
  // also the errors of indexing the shard (see above).
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

  // What Create's indexing found (nothing with shard_samples: shards indexed later log
  // what they found).
  const Stats& stats() const { return stats_; }
  const std::vector<std::string>& shards() const { return shard_paths_; }
  // Samples of shard s: [shard_begin()[s], shard_begin()[s + 1]).
  const std::vector<int64_t>& shard_begin() const { return shard_begin_; }

 private:
  static constexpr uint16_t kNoLabel = 0xffff;
  // Where one sample's members lie.
  struct Sample {
    uint64_t image_offset = 0;
    uint64_t image_size = 0;
    uint64_t label_offset = 0;
    uint32_t label_size = 0;             // saturated: larger members are refused at Fill anyway
    uint16_t label_spelling = kNoLabel;  // ShardTable::label_spellings[i], or kNoLabel
    bool has_image = true;  // false only with shard_samples: the sample is refused at Fill
  };
  // One shard's samples as indexing found them.
  struct ShardTable {
    FileIdentity identity;  // the file indexed: Fill reads the shard only while it is this
    std::vector<Sample> samples;
    // Per sample: where its name ends in `names` (the image member's name; the basename
    // for a sample without one).
    std::vector<uint32_t> name_ends;
    std::string names;
    // The label extensions as members spell them ("cls", "CLS", ...): the label member of
    // a sample is <its basename>.<label_spellings[sample.label_spelling]>.
    std::vector<std::string> label_spellings;
    bool truncated = false;  // cut short: with shard_samples, the samples past the cut fail
    Stats stats;
  };
  struct Shard {
    std::string path;
    // With shard_samples, held while the shard is indexed. `table` and `error` are written
    // once, before `indexed` is set (release); read only after it is seen set (acquire).
    absl::Mutex mutex;
    std::atomic<bool> indexed{false};
    absl::Status error;  // not ok: every Fill of the shard's samples fails with it
    ShardTable table;
  };

  WebDatasetSource(const ImageTransform& transform, const DecodeLimits& limits,
                   uint32_t shuffle_buffer, std::string image_key, std::string label_key,
                   std::shared_ptr<const DatasetFs> fs);
  // Every member group of the shard at `path`, with or without an image member.
  static absl::StatusOr<ShardTable> IndexShard(const std::string& path,
                                               const std::string& image_key,
                                               const std::string& label_key, const DatasetFs& fs);
  // The shard's table: indexed now (with shard_samples, the first time), or why its samples
  // cannot be read.
  absl::StatusOr<const ShardTable*> TableOf(size_t shard) const;
  // The shard holding sample `index` (in [0, size())).
  size_t ShardOf(int64_t index) const;
  absl::string_view NameOf(const ShardTable& table, size_t sample) const;
  std::string LabelName(const ShardTable& table, size_t sample) const;

  // Constant after construction.
  const ImageTransform transform_;
  const DecodeLimits limits_;
  const uint32_t shuffle_buffer_;
  const std::string image_key_;
  const std::string label_key_;
  const std::shared_ptr<const DatasetFs> fs_;
  bool lazy_ = false;  // shard_samples gave the counts
  std::vector<std::string> shard_paths_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<int64_t> shard_begin_;  // per shard + 1
  Stats stats_;
  std::vector<FieldLayout> fields_;
};

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_WEBDATASET_SOURCE_H_
