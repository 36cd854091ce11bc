// A dataset together with its per-sample transform: turns a global sample index into the
// bytes of each output field, written in place into a batch slot's rows.
//
// Fields (per sample; the batch dimension is added by the slot layout):
//   imagefolder: "image" uint8 [size, size, 3], "label" int64 [], "index" int64 []
//   tokens:      "tokens" int64|int32 [seq_len + 1], "index" int64 []
//   token_shards: as tokens
//   indexed:     "tokens" int64|int32 [seq_len + 1], ["position_ids" same], ["cu_seqlens"
//                int32 [seq_len + 1], "num_seqs" int32 []], "index" int64 []
//   records:     "data" dtype [shape...] (spec's; [] when shape is empty), "index" int64 []
//   npy:         "data" the array's dtype [axes after the first] ([] for a 1-d array),
//                "index" int64 []
//   webdataset:  "image" uint8 [size, size, 3], "label" int64 [], "index" int64 []
//   blend:       its sources' fields (all alike)
//
//   FERRY_ASSIGN_OR_RETURN(auto source, MakeSampleSource(spec, fs));
//   std::vector<uint8_t*> rows = {...};  // one pointer per field, in fields() order
//   absl::Status s = source->Fill(index, MixSeed(seed, epoch, index), rows, scratch.get());
//
// Thread-safety: Fill is const and may run on many threads at once, each with its own
// Scratch (decoder state).
#ifndef FERRY_SERVER_DATASET_SAMPLE_SOURCE_H_
#define FERRY_SERVER_DATASET_SAMPLE_SOURCE_H_

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/streaming_copy.h"
#include "ferry/v1/dtype.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/dataset_fs.h"
#include "server/dataset/mapped_file.h"
#include "server/decode/gpu_decode_split.h"
#include "server/decode/image_transform.h"

namespace ferry {

class MemoryBudget;

struct FieldLayout {
  std::string name;
  ferry::v1::DType dtype = ferry::v1::UINT8;
  std::vector<int64_t> shape;  // per sample
  size_t row_bytes = 0;        // product(shape) * sizeof(dtype)
  // Set on a field of raw token ids (UINT16, UINT32 or INT32 as the file holds them) that a
  // device transport widens to this dtype (INT64 or INT32) on the GPU, so that only the
  // file's bytes cross PCIe; see SourceOptions::device_widens_tokens. Default: unset.
  ferry::v1::DType device_dtype = ferry::v1::DTYPE_UNSPECIFIED;
  // A field for the device transport's own use (the photometric programs of a composed
  // transform, server/decode/compose.h): it travels in the slot but is not one of the
  // job's fields a trainer sees. Default: false.
  bool internal = false;
};

// Name of the internal field (FieldLayout::internal) of a composed transform's photometric
// programs, one PhotometricProgram (server/kernels/photometric.h) per row.
inline constexpr char kPhotometricField[] = "photometric_program";
// Names of the internal fields of a GPU-decoding job: its per-row GpuDecodePlan and the
// routed JPEG's bytes (server/decode/gpu_decode_plan.h).
inline constexpr char kGpuDecodePlanField[] = "gpu_decode_plan";
inline constexpr char kGpuDecodeJpegField[] = "gpu_decode_jpeg";

// How a copy-only source writes sample rows into a slot: kStreaming for slots the GPU's copy
// engine reads next (a row left dirty in the workers' caches slows the DMA that reads it:
// common/streaming_copy.h), kOrdinary for slots a trainer's CPU reads.
enum class RowStores { kOrdinary, kStreaming };

// Writes `bytes` computed at `src` into a slot row as `stores` says.
inline void StoreRow(RowStores stores, uint8_t* dst, const uint8_t* src, size_t bytes) {
  if (stores == RowStores::kStreaming) {
    StreamingCopy(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

// A field that is a plain slice of a read-only file mapping: sample i's row is the
// row_bytes at records + record * row_bytes, where `record` is the int64 the source writes
// into field `index_field` of the same row. A device transport may then read those rows
// itself, straight from the mapping (registered with the driver), and leave the workers
// only the index to write: see Fill's `rows` contract. `mapping` / `mapping_bytes` are the
// whole mapping (page-aligned start), what must be registered; `path` names it.
struct DirectRows {
  int field = -1;
  int index_field = -1;
  const uint8_t* records = nullptr;
  int64_t num_records = 0;
  size_t row_bytes = 0;
  const uint8_t* mapping = nullptr;
  size_t mapping_bytes = 0;
  std::string path;
};

class SampleSource {
 public:
  // Per-thread mutable state (an image decoder, file buffers). Opaque to callers, but for
  // what the caller sets before each Fill:
  class Scratch {
   public:
    virtual ~Scratch() = default;
    // The sample's batch is one whose JPEGs the GPU's decoder takes
    // (GpuDecodeSplit::Rank::RouteBatch): a source that routes JPEGs (SourceOptions::gpu_decode)
    // sends each it can there. Ignored by the others.
    bool gpu_batch = false;
  };

  virtual ~SampleSource() = default;

  virtual int64_t size() const = 0;
  virtual const std::vector<FieldLayout>& fields() const = 0;
  virtual std::unique_ptr<Scratch> NewScratch() const = 0;

  // Writes sample `index` into rows[f] for each field f (rows.size() == fields().size(),
  // each with fields()[f].row_bytes writable). rows[f] is null for the field that
  // direct_rows() names when the caller reads those rows from the mapping itself: Fill
  // then writes the other fields only. `sample_seed` drives every random choice.
  // A sample that cannot be read or decoded returns a status naming its file (DATA_LOSS for
  // corrupt content, NOT_FOUND / PERMISSION_DENIED for I/O, RESOURCE_EXHAUSTED / UNAVAILABLE
  // when the machine, not the data, failed: IsTransientReadError); the caller decides what
  // to do.
  virtual absl::Status Fill(int64_t index, uint64_t sample_seed, absl::Span<uint8_t* const> rows,
                            Scratch* scratch) const = 0;

  // Human-readable location of a sample ("<root>/<class>/<file>"), for error reports.
  virtual std::string Describe(int64_t index) const = 0;

  // The file a Fill of `index` opens (an image's file, a WebDataset shard), for reading
  // files ahead of the workers (ReadAhead); empty for sources that open their files when the
  // job is created (mapped kinds), and for an index outside [0, size()).
  virtual std::string FileOf(int64_t index) const { return {}; }

  // The byte ranges of mappings read in ranges (MappedFile::read_in_ranges: a large remote
  // object cached in blocks) that a Fill of `index` reads, appended to *ranges in reading
  // order, for fetching them ahead of the workers (ReadAhead): nothing for bytes of a
  // mapping that are all there, and for an index outside [0, size()). Arithmetic on what
  // the source holds: no I/O.
  virtual void RangesOf(int64_t index, std::vector<MappedRange>* ranges) const {}
  // Whether some mapping the source reads is read in ranges, so that RangesOf may give
  // ranges.
  virtual bool ReadsInRanges() const { return false; }

  // True when Fill only copies the sample's bytes (tokens, records, arrays: no decoding), so
  // its cost is a few microseconds per row and the pipeline hands a worker many rows at
  // once: dispatching a task costs more than copying a small row.
  virtual bool FillIsCopy() const { return false; }

  // A field whose rows a device may read straight from the dataset's mapping (DirectRows);
  // nullopt for sources that decode, convert or read through a file API.
  virtual std::optional<DirectRows> direct_rows() const { return std::nullopt; }

  // Sources stored as streams (tar shards) define the epoch's order themselves, so that
  // each rank, dealt a contiguous run of it, reads its own shards mostly sequentially. When
  // HasStreamOrder(), the job's sampler takes StreamOrder's order in place of its own
  // permutation and deals contiguous runs instead of striding (see SamplerOptions).
  virtual bool HasStreamOrder() const { return false; }
  // Fills *order with a permutation of [0, size()) for `epoch`, a pure function of
  // (seed, epoch, shuffle) and the dataset. Called only when HasStreamOrder().
  virtual void StreamOrder(uint64_t seed, int64_t epoch, bool shuffle,
                           std::vector<int64_t>* order) const {}

  // Sources whose index order is already the training order of Megatron-LM's pretraining
  // sampler (megatron_gpt: the dataset shuffles itself) return true: the job's sampler keeps
  // that order (the job's shuffle must be off) and deals it in global batches of
  // micro-batches, rank r taking micro-batch r of each (SamplerOptions::micro_batches).
  virtual bool DealsMicroBatches() const { return false; }

  // Sources whose epoch is not a permutation of their samples (a blend draws each epoch's
  // positions from its sources by weight) return true: the job's sampler then deals
  // epoch_size() positions per epoch (shuffled as usual), and position p of `epoch` serves
  // sample IndexAt(seed, epoch, shuffle, p), a pure function, in [0, size()).
  // MapPositions replaces every position of a batch by its sample, as IndexAt would.
  virtual bool MapsPositions() const { return false; }
  virtual int64_t epoch_size() const { return size(); }
  virtual int64_t IndexAt(uint64_t seed, int64_t epoch, bool shuffle, int64_t position) const {
    return position;
  }
  virtual void MapPositions(uint64_t seed, int64_t epoch, bool shuffle,
                            absl::Span<int64_t> positions) const {
    for (int64_t& p : positions) p = IndexAt(seed, epoch, shuffle, p);
  }

  // The parts a source is made of, for status (a blend's sources); empty for a plain one.
  struct Part {
    std::string name;
    double weight = 0;
    int64_t num_samples = 0;
    int64_t samples_per_epoch = 0;
    int64_t samples_drawn = 0;  // positions mapped to it so far (MapPositions)
  };
  virtual std::vector<Part> parts() const { return {}; }

  // Host memory the source keeps to find its samples (file names, tar member indexes): the
  // job counts it against the host memory budget for its life. (A blend reserves its table
  // of positions itself, before building it: SourceOptions::host_budget.)
  virtual uint64_t index_bytes() const { return 0; }
};

// How the job wants its dataset read. The job fills it (from its device and the daemon's
// settings); sources never look at JobSpec.device themselves.
struct SourceOptions {
  // How copy-only sources (records, npy) write rows: kStreaming for a GPU job.
  // Default: RowStores::kOrdinary.
  RowStores row_stores = RowStores::kOrdinary;
  // The rows go to a device that widens token ids itself (the GPU transport): the token
  // datasets (tokens, token_shards, indexed) then deliver the file's own dtype in a field
  // with FieldLayout::device_dtype set, so only 2 or 4 bytes per token cross PCIe. Not where
  // the job asks for tokens widened on the host (widen_on_host) or nothing widens (UINT32
  // -> INT32, whose range check runs on the host; int32 Megatron tokens to INT32).
  // Default: false.
  bool device_widens_tokens = false;
  // The images go to a device (the GPU transport) that converts them to the job's
  // image_output dtype: a composed transform then leaves its trailing photometric ops to
  // the device (compose.h). Default: false.
  bool device_images = false;
  // A GPU job whose device stages decode JPEGs (nvJPEG): the image sources route each
  // JPEG a transform allows (GpuDecodable) through it. Default: null (workers decode all).
  std::shared_ptr<GpuDecodeSplit> gpu_decode;
  // Guards for the decoders of image datasets (DaemonConfig.decode_limits).
  // Default: DecodeLimits()'s.
  DecodeLimits limits;
  // The memory a source builds for its job's index (a blend's table of positions) is
  // reserved from this budget for the source's life (the daemon's host memory budget).
  // Default: null, not counted.
  MemoryBudget* host_budget = nullptr;
};

// Validates `spec` (dataset + transform) and opens the dataset. Errors:
//   INVALID_ARGUMENT naming the field (crop size 0, seq_len 0, unknown token dtype, ...);
//   NOT_FOUND naming the path when it does not exist;
//   FAILED_PRECONDITION when the dataset is empty (says what was expected).
// Every file is opened through `fs` (dataset_roots: DatasetFs).
absl::StatusOr<std::unique_ptr<SampleSource>> MakeSampleSource(
    const ferry::v1::JobSpec& spec, std::shared_ptr<const DatasetFs> fs,
    const SourceOptions& options = SourceOptions());

// Every file or directory `dataset` names (shard patterns expanded), so that a caller can
// check them against dataset_roots (DatasetFs::CheckPath) before touching the disk.
// INVALID_ARGUMENT when no dataset kind is set, a path is empty or a pattern is malformed.
absl::StatusOr<std::vector<std::string>> DatasetPaths(const ferry::v1::DatasetSpec& dataset);

// The files that opening the dataset reads (a caller fetches remote ones ahead of it):
// DatasetPaths', but none for a kind whose path is a folder (an image folder's root) and
// none for WebDataset shards with their counts (shard_samples: read as the epoch goes).
absl::StatusOr<std::vector<std::string>> DatasetFilePaths(const ferry::v1::DatasetSpec& dataset);

// Whether the dataset's samples are images: a transform applies, and JPEGs may be decoded on
// a GPU. False when no kind is set.
bool DatasetHasImages(const ferry::v1::DatasetSpec& dataset);
// Sets widen_on_host on a dataset of token ids (tokens, token_shards, indexed), so that the
// host widens them rather than the device; other kinds stay as they are.
void SetWidenOnHost(ferry::v1::DatasetSpec* dataset);
// Fills the fields of `dataset` that its kind defaults when they are unset: token_dtype
// UINT16 for tokens and token_shards, in a blend's sources too. Other fields, and what is
// set, stay as they are.
void ApplyDatasetDefaults(ferry::v1::DatasetSpec* dataset);

// Checks a path the dataset names (against dataset roots, remote prefixes) before it is read.
using DatasetPathCheck = std::function<absl::Status(const std::string& path)>;
// Reads into `dataset` what it names by reference: a webdataset's shard_index becomes its
// shards and shard_samples (shard_index is cleared), in a blend's sources too. The index is
// checked with `check` before it is read through `fs`. Other kinds, and a spec with nothing
// to read, stay as they are. Errors: INVALID_ARGUMENT for shard_index given with shards or
// shard_samples, or a shard name with a brace (shards are patterns); `check`'s; and
// ReadShardIndex's (webdataset_index.h).
absl::Status ResolveDatasetIndexes(ferry::v1::DatasetSpec* dataset, const DatasetPathCheck& check,
                                   const DatasetFs& fs);

}  // namespace ferry

#endif  // FERRY_SERVER_DATASET_SAMPLE_SOURCE_H_
