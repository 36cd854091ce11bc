// ferry's C++ client: talks to a local ferryd over its Unix socket, creates jobs, and
// consumes batches straight out of the daemon's shared-memory slab (host transport, device
// "cpu") or out of device slots on the trainer's GPU (GPU transport, device "cuda:N"; see
// "GPU batches" below).
//
//   FERRY_ASSIGN_OR_RETURN(std::unique_ptr<ferry::Client> client,
//                          ferry::Client::Connect(""));          // default socket
//   ferry::JobOptions options;
//   options.dataset = ferry::ImageFolderOptions{"/data/train"};
//   options.transform = ferry::RandomResizedCropOptions{.size = 224, .flip = true};
//   options.batch_size = 256;
//   FERRY_ASSIGN_OR_RETURN(ferry::JobInfo job, client->CreateJob(options));
//   FERRY_ASSIGN_OR_RETURN(std::unique_ptr<ferry::Consumer> consumer,
//                          client->Attach(job.id, /*rank=*/0));
//   FERRY_RETURN_IF_ERROR(consumer->StartEpoch(/*epoch=*/0, /*first_batch=*/0));
//   while (true) {
//     FERRY_ASSIGN_OR_RETURN(std::optional<ferry::Batch> batch, consumer->Next());
//     if (!batch) break;  // end of the epoch
//     const ferry::BatchField* image = batch->field("image");
//     ...                 // read image->data; the slot is given back when `batch` dies
//   }
//
// No gRPC or protobuf type appears in this header: the implementation sits behind pImpl
// classes, so users need only abseil to build against it.
#ifndef FERRY_CLIENT_CPP_INCLUDE_FERRY_CLIENT_H_
#define FERRY_CLIENT_CPP_INCLUDE_FERRY_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ferry {

// Element types; the numeric values are those of ferry.v1.DType (and of the C ABI's codes).
enum class DType : int {
  kUnspecified = 0,
  kUint8 = 1,
  kUint16 = 2,
  kUint32 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat16 = 6,
  kBFloat16 = 7,
  kFloat32 = 8,
  kBool = 9,  // one byte, 0 or 1
};

// Bytes per element; 0 for kUnspecified or an unknown value.
size_t DTypeSize(DType dtype);
// "uint8", "int64", "bfloat16", ...; "unspecified" for anything else.
std::string_view DTypeName(DType dtype);

// ---------------------------------------------------------------------------------------
// Job specification: plain structs mirroring ferry.v1.JobSpec.

// root/<class>/<file>; label = index of the class directory in sorted order. Files named .jpg,
// .jpeg or .png (any case), each decoded by its content (docs/data.md, "Image formats").
struct ImageFolderOptions {
  std::string root;
  // Turn each image upright by its EXIF Orientation before the transform, as
  // PIL.ImageOps.exif_transpose does. Default: false (as PIL and torchvision).
  bool exif_orientation = false;
};

// Flat binary file of little-endian token ids; a sample is seq_len + 1 tokens starting at
// sample_index * seq_len.
struct TokensOptions {
  std::string path;
  // kUint16 or kUint32. Default: kUint16.
  DType token_dtype = DType::kUint16;
  uint32_t seq_len = 0;
  // kInt64 or kInt32. Default: kInt64.
  DType output_dtype = DType::kInt64;
  // GPU jobs: widened by ferryd's workers and copied, not by a kernel of ferryd's on the
  // GPU (ferry.v1.TokensDataset.widen_on_host). For compute-bound trainers without MPS.
  bool widen_on_host = false;
};

// Sharded flat token files (nanoGPT-style .bin shards), taken in the listed order; a sample is
// seq_len + 1 tokens. Window j of a shard starts at its token j * seq_len and no window
// straddles two files unless windows_cross_files (ferry.v1.TokenShardsDataset; docs/data.md).
struct TokenShardsOptions {
  // Paths or brace patterns ("/data/train-{000..127}.bin").
  std::vector<std::string> shards;
  // kUint16 or kUint32. Default: kUint16.
  DType token_dtype = DType::kUint16;
  uint32_t seq_len = 0;
  // kInt64 or kInt32. Default: kInt64.
  DType output_dtype = DType::kInt64;
  // Windows may span the end of one shard and the start of the next. Default: false.
  bool windows_cross_files = false;
  // As TokensOptions::widen_on_host. Default: false.
  bool widen_on_host = false;
};

// A Megatron-LM indexed dataset (path_prefix + ".bin" / ".idx"): sequences packed in file
// order, cut into samples of seq_len + 1 tokens; optionally "position_ids" and "cu_seqlens" +
// "num_seqs" for document-masked attention (ferry.v1.IndexedDataset; docs/data.md).
struct IndexedOptions {
  std::string path_prefix;  // without .bin / .idx
  uint32_t seq_len = 0;
  // kInt64 or kInt32. Default: kInt64.
  DType output_dtype = DType::kInt64;
  bool position_ids = false;  // Default: false
  bool cu_seqlens = false;    // Default: false
  // As TokensOptions::widen_on_host. Default: false.
  bool widen_on_host = false;
};

// Megatron-Core's GPTDataset (one prefix) or BlendedDataset (several, with weights) over
// Megatron-LM indexed datasets: sample i is sample i of Megatron's dataset for the same files,
// split, seed, sequence length and blend, field for field; ranks are dealt as Megatron's
// MegatronPretrainingSampler deals them, and the job's shuffle must be off
// (ferry.v1.MegatronGptDataset; docs/data.md, "Megatron-Core's samples").
struct MegatronGptOptions {
  std::vector<std::string> path_prefixes;  // Megatron's --data-path, without .bin / .idx
  std::vector<double> weights;             // one per prefix; empty for one prefix
  uint32_t sequence_length = 0;            // Required, >= 2.
  std::string split;                       // Default: empty = "969, 30, 1"
  enum class Split { kTrain = 0, kValid = 1, kTest = 2 };
  Split split_name = Split::kTrain;
  uint64_t num_samples = 0;  // Default: 0 = one epoch of one prefix; required for a blend
  uint64_t random_seed = 0;
  int64_t eod_token = 0;             // tokenizer.eod
  std::optional<int64_t> pad_token;  // tokenizer.pad. Default: unset = -1
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  bool create_attention_mask = false;  // "attention_mask" kBool [1, S, S]
  bool no_extra_token = false;         // add_extra_token_to_sequence=False
  bool keep_partial_validation_sequence = false;
  std::optional<double> mid_level_dataset_surplus;  // Default: unset = 0.005
  bool cu_seqlens = false;                          // "cu_seqlens" and "num_seqs"
  DType output_dtype = DType::kInt64;               // kInt64 or kInt32
};

// WebDataset tar shards: a sample is the members sharing a basename; fields "image",
// "label" (from the label member, -1 when absent), "index". Each rank reads a contiguous run
// of the epoch's order (shards shuffled by (seed, epoch), then a bounded shuffle buffer).
struct WebDatasetOptions {
  // Paths or brace patterns ("/data/train-{000000..000146}.tar").
  std::vector<std::string> shards;
  std::string image_key = "jpg";  // Default: "jpg" (also matches "jpeg"); "png", ...
  std::string label_key = "cls";  // Default: "cls"
  uint32_t shuffle_buffer = 0;    // Samples. Default: 0 = 1000, chosen by the daemon.
  bool exif_orientation = false;  // As ImageFolderOptions::exif_orientation. Default: false
};

// Fixed-size binary records after `header_bytes`: a sample is one record, field "data" of
// `dtype` and `shape` (empty = scalar), plus "index".
struct RecordsOptions {
  std::string path;
  DType dtype = DType::kUnspecified;  // Required.
  std::vector<int64_t> shape;
  uint64_t header_bytes = 0;
};

// A NumPy .npy array: a sample is one row along axis 0 (field "data"), plus "index".
struct NpyOptions {
  std::string path;
};

// Any one dataset kind: what a blend's sources are.
using DatasetOptions =
    std::variant<std::monostate, ImageFolderOptions, TokensOptions, WebDatasetOptions,
                 RecordsOptions, NpyOptions, TokenShardsOptions, IndexedOptions>;

struct BlendSourceOptions {
  DatasetOptions dataset;  // Required: any kind but a blend.
  double weight = 0;       // Required: > 0 (weights are divided by their sum).
  // Name in status and metrics ([A-Za-z0-9_.-], at most 64). Default: "source<i>".
  std::string name;
};

// Several datasets mixed by weight, deterministically (ferry.v1.BlendDataset; docs/data.md):
// every source must deliver the same fields. Sample indices number the first source's
// samples, then the second's, ...
struct BlendOptions {
  std::vector<BlendSourceOptions> sources;
  // Samples in one epoch. Default: 0 = the sum of the sources' sizes.
  uint64_t samples_per_epoch = 0;
};

// What a job does with a sample that cannot be read or decoded.
enum class CorruptSamplePolicy {
  // Replace it by a deterministic substitute, report it, never read it again (default).
  kSkip,
  // Stop the job; consumers' next call fails with DATA_LOSS naming the file.
  kFail,
};

// torchvision's RandomResizedCrop followed by RandomHorizontalFlip(0.5) when `flip`.
struct RandomResizedCropOptions {
  uint32_t size = 0;
  float scale_min = 0.08f;        // Default: 0.08
  float scale_max = 1.0f;         // Default: 1.0
  float ratio_min = 3.0f / 4.0f;  // Default: 3/4
  float ratio_max = 4.0f / 3.0f;  // Default: 4/3
  bool flip = false;
  // Decode JPEGs at full resolution, as torchvision does (ferry.v1.RandomResizedCrop.full_decode).
  bool full_decode = false;
};

// torchvision's Resize(resize) (shorter side) followed by CenterCrop(size).
struct CenterCropOptions {
  uint32_t size = 0;
  // Default: 0 = size * 256 / 224, chosen by the daemon.
  uint32_t resize = 0;
  // As RandomResizedCropOptions::full_decode.
  bool full_decode = false;
};

// The ops of a composed transform (ComposeOptions), named and defaulted as
// torchvision.transforms.v2's; ferry.v1.TransformOp, docs/data.md ("Composed transforms").
// Sizes are square. Every field starts at torchvision's default and is sent as it is; an
// empty list, a `p` of std::nullopt, an empty padding_mode or a num_magnitude_bins of 0 is
// left unset in the spec, which ferryd reads as the same default. JobOptionsFromJson keeps
// either form, so a spec makes the same JSON again.
namespace transforms {

// RandomResizedCrop(size, scale, ratio), antialiased bilinear.
struct RandomResizedCrop {
  uint32_t size = 0;                                      // Required.
  std::vector<float> scale = {0.08f, 1.0f};               // Default: {0.08, 1.0}
  std::vector<float> ratio = {3.0f / 4.0f, 4.0f / 3.0f};  // Default: {3/4, 4/3}
  // As RandomResizedCropOptions::full_decode, when this op comes first. Default: false.
  bool full_decode = false;
};

// Resize(size): the shorter side to `size`, antialiased bilinear.
struct Resize {
  uint32_t size = 0;  // Required.
  // As RandomResizedCropOptions::full_decode, when this op comes first. Default: false.
  bool full_decode = false;
};

// CenterCrop(size); a smaller image is padded with zeros first.
struct CenterCrop {
  uint32_t size = 0;  // Required.
};

// RandomCrop(size, padding, pad_if_needed, fill, padding_mode).
struct RandomCrop {
  uint32_t size = 0;  // Required.
  // 1 value (every side), 2 (left/right, top/bottom) or 4 (left, top, right, bottom).
  // Default: none.
  std::vector<uint32_t> padding;
  bool pad_if_needed = false;  // Default: false
  // Padding of padding_mode "constant": 1 or 3 values (RGB, 0..255). Default: {0}
  std::vector<uint32_t> fill = {0};
  // "constant", "edge", "reflect" or "symmetric". Default: "constant"
  std::string padding_mode = "constant";
};

struct RandomHorizontalFlip {
  std::optional<float> p = 0.5f;  // Default: 0.5
};

struct RandomVerticalFlip {
  std::optional<float> p = 0.5f;  // Default: 0.5
};

// ColorJitter(brightness, contrast, saturation, hue), the set ones in a random order. Each
// is empty (not applied, the default), one value b ([max(0, 1 - b), 1 + b]; hue h: [-h, h])
// or two values [min, max].
struct ColorJitter {
  std::vector<float> brightness;
  std::vector<float> contrast;
  std::vector<float> saturation;
  std::vector<float> hue;
};

// RandomGrayscale(p), three output channels.
struct RandomGrayscale {
  std::optional<float> p = 0.1f;  // Default: 0.1
};

// TrivialAugmentWide(num_magnitude_bins, interpolation=NEAREST, fill).
struct TrivialAugmentWide {
  uint32_t num_magnitude_bins = 31;  // Default: 31
  // Of the pixels that shear, translate and rotate uncover: 1 or 3 values (RGB, 0..255).
  // Default: none = 0.
  std::vector<uint32_t> fill;
};

// ToDtype(float32, scale=True) then Normalize(mean, std): the image leaves as CHW floats.
struct Normalize {
  std::vector<float> mean;  // Required: 1 or 3 values (RGB).
  std::vector<float> std;   // Required: 1 or 3 values (RGB).
};

// RandomErasing(p, scale, ratio, value); value in the image's scale where the op runs
// (0..255 before Normalize, normalized units after).
struct RandomErasing {
  std::optional<float> p = 0.5f;              // Default: 0.5
  std::vector<float> scale = {0.02f, 0.33f};  // Default: {0.02, 0.33}
  std::vector<float> ratio = {0.3f, 3.3f};    // Default: {0.3, 3.3}
  std::vector<float> value = {0.0f};          // 1 or 3 values (RGB). Default: {0}
};

}  // namespace transforms

// One op of a ComposeOptions. std::monostate only stands for an op this client does not
// know (in a newer ferryd's answer); sent back, it is an empty op, which ferryd refuses.
using TransformOpOptions =
    std::variant<std::monostate, transforms::RandomResizedCrop, transforms::Resize,
                 transforms::CenterCrop, transforms::RandomCrop, transforms::RandomHorizontalFlip,
                 transforms::RandomVerticalFlip, transforms::ColorJitter,
                 transforms::RandomGrayscale, transforms::TrivialAugmentWide, transforms::Normalize,
                 transforms::RandomErasing>;

// torchvision's Compose(ops), applied in order (ferry.v1.Compose). The geometric ops must
// end in a crop to a fixed size; after a Normalize only RandomErasing may follow. E.g. a
// ViT recipe:
//   ferry::ComposeOptions{.ops = {
//       ferry::transforms::RandomResizedCrop{.size = 224},
//       ferry::transforms::RandomHorizontalFlip{},
//       ferry::transforms::TrivialAugmentWide{},
//       ferry::transforms::Normalize{.mean = {0.485f, 0.456f, 0.406f},
//                                    .std = {0.229f, 0.224f, 0.225f}},
//       ferry::transforms::RandomErasing{.p = 0.25f}}}
struct ComposeOptions {
  std::vector<TransformOpOptions> ops;
};

// How images reach a GPU trainer (device "cuda:N" only): ferryd copies uint8 HWC crops to
// the GPU and converts them there.
struct ImageOutputOptions {
  // kUint8 (HWC as decoded), or kFloat32 / kFloat16 / kBFloat16: CHW, normalized as
  // (x / 255 - mean) / std per channel. Default: kUnspecified = kUint8.
  DType dtype = DType::kUnspecified;
  // Per-channel (RGB) mean and std. Default: empty = torchvision's ImageNet values.
  std::vector<float> mean;
  std::vector<float> std;
};

struct JobOptions {
  // Jobs with the same name and spec are one job (all local ranks of a run share it).
  // Default: empty = derived by the daemon from the spec.
  std::string name;
  // Required.
  std::variant<std::monostate, ImageFolderOptions, TokensOptions, WebDatasetOptions, RecordsOptions,
               NpyOptions, TokenShardsOptions, IndexedOptions, BlendOptions, MegatronGptOptions>
      dataset;
  // Required for image datasets; ignored for tokens.
  std::variant<std::monostate, RandomResizedCropOptions, CenterCropOptions, ComposeOptions>
      transform;
  uint32_t batch_size = 0;  // Required.
  bool shuffle = false;     // Default: false
  uint64_t seed = 0;        // Default: 0
  bool drop_last = false;   // Default: false
  uint32_t world_size = 1;  // Default: 1
  // "cpu" (host transport), or "cuda" (GPU transport; each rank names its GPU when it
  // attaches, Client::Attach's `device`, so the ranks of one run on several GPUs share the
  // job). "cuda:N" (ferryd's device N) or "cuda:<PCI bus id>" ("cuda:0000:3b:00.0", the
  // same GPU whatever the numbering; see CudaPciBusId) makes a job of that one GPU, as
  // before ranks named their own. Default: "cpu"
  std::string device = "cpu";
  uint32_t prefetch_depth = 0;  // Slots per rank. Default: 0 = the daemon's default.
  // Device "cuda:..." only. Default: uint8 HWC images.
  ImageOutputOptions image_output;
  CorruptSamplePolicy on_corrupt_sample = CorruptSamplePolicy::kSkip;
};

// The JobSpec part of `options` (everything but `name`) as the proto3 JSON mapping of
// ferry.v1.JobSpec, with proto field names, e.g.
//   {"dataset":{"image_folder":{"root":"/data"}},"transform":{"center_crop":{"size":224}},
//    "batch_size":32,"world_size":1,"device":"cpu"}
std::string JobOptionsToJson(const JobOptions& options);
// Parses the proto3 JSON mapping of ferry.v1.JobSpec (proto or lowerCamelCase names).
// INVALID_ARGUMENT with the parser's message on malformed JSON or unknown fields.
absl::StatusOr<JobOptions> JobOptionsFromJson(std::string_view json);

// ---------------------------------------------------------------------------------------
// Jobs and status (plain copies of the daemon's answers).

struct FieldInfo {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;  // per sample; the batch dimension is not included
  uint64_t offset = 0;         // of the first row inside a slot
  uint64_t row_bytes = 0;      // bytes per sample
};

struct JobInfo;

// Positions [begin, end) of an epoch's order: the order is a function of the job's seed and
// the epoch only, never of the world size, so a run's progress through an epoch is the set
// of positions it consumed.
struct EpochRange {
  int64_t begin = 0;
  int64_t end = 0;
  friend bool operator==(const EpochRange& a, const EpochRange& b) {
    return a.begin == b.begin && a.end == b.end;
  }
};

// Which positions of an epoch a run has consumed, for a resume state that holds on any world
// size and batch size (docs/data.md, "Resuming on another number of GPUs"). The run's
// ranks were dealt the positions left after `consumed` (empty for a fresh epoch) as
// Consumer::ResumeEpoch deals them.
struct EpochProgress {
  int64_t positions = 0;  // JobInfo::samples_per_epoch
  int64_t world_size = 1;
  int64_t batch_size = 1;
  bool drop_last = false;
  bool contiguous_ranks = false;  // JobInfo::contiguous_ranks
  std::vector<EpochRange> consumed;

  // The run's options as its job has them, after `consumed`.
  static EpochProgress Of(const JobInfo& job, std::vector<EpochRange> consumed = {});
  // The positions consumed once every rank took its first `batches_done` batches of the
  // epoch: `consumed` plus what the ranks were dealt, merged. INVALID_ARGUMENT when a field
  // is out of range or `consumed` is not sorted disjoint ranges of the epoch.
  absl::StatusOr<std::vector<EpochRange>> ConsumedAfter(int64_t batches_done) const;
  // Batches per rank in the epoch.
  absl::StatusOr<int64_t> Batches() const;
};

struct JobInfo {
  std::string id;
  std::string name;
  JobOptions spec;  // spec.name is left empty; see `name`
  uint32_t owner_uid = 0;
  int64_t num_samples = 0;        // sample indices lie in [0, num_samples)
  int64_t samples_per_epoch = 0;  // all ranks' (num_samples except for a blend)
  int64_t batches_per_epoch = 0;  // per rank, of a fresh epoch
  // Each rank reads a contiguous run of the epoch's order (WebDataset) instead of every
  // world_size-th position; see EpochProgress.
  bool contiguous_ranks = false;
  std::vector<FieldInfo> fields;
  uint64_t slot_bytes = 0;
  int64_t create_time_unix_ms = 0;
};

struct RankStatus {
  uint32_t rank = 0;
  bool attached = false;
  int64_t batches_delivered = 0;
  int64_t samples_delivered = 0;
  double batches_per_second = 0;
  double samples_per_second = 0;
  uint32_t queue_depth = 0;   // ready, not yet taken by the consumer
  uint32_t slots_leased = 0;  // held by the consumer
  uint32_t slots = 0;         // of the rank's ring (its prefetch depth)
  double consumer_wait_seconds = 0;
  int64_t epoch = 0;
  int64_t next_batch = 0;
  int64_t epoch_batches = 0;  // of `epoch`, for this rank
  // Positions of the epoch an earlier run delivered, when this one resumes it (0: whole).
  int64_t resumed_after_positions = 0;
  // Where this rank's batches go: "cpu", or "cuda:N" (ferryd's ordinal of its GPU).
  std::string device;
  // The current (or last) consumer takes batches through the shared-memory batch channel
  // (false: on the gRPC stream; see docs/protocol.md).
  bool batch_channel = false;
  // GPU transport: how batches reach the device. "slot copy" (workers fill pinned host
  // slots, the copy engine moves them) or "page-cache gather" (a kernel reads the records
  // straight from the dataset file's pinned page cache); empty for the host transport.
  // copy_path_note says why a dataset that could be gathered is not, or which batches are.
  std::string copy_path;
  std::string copy_path_note;
  uint64_t pinned_dataset_bytes = 0;  // of the dataset file, pinned for the gather
  // GPU transport: batches copied to the device, and of those, gathered from the page cache.
  uint64_t batches_copied = 0;
  uint64_t batches_gathered = 0;
  // Over the last stall_window_seconds: the fraction of wall time the trainer waited for a
  // batch (exact when the client reports its waits, as this library does), the stage that
  // limits the rank ("trainer", "trainer_cpu", "read", "remote_read", "decode", "copy";
  // empty while unknown) and why, and the fraction of it the consumer's main thread waited
  // for a CPU (-1: not known; "trainer_cpu" when high while the stall ratio is low).
  double stall_ratio = 0;
  double stall_window_seconds = 0;
  std::string limiting_stage;
  std::string limiting_stage_note;
  double consumer_cpu_wait_ratio = -1;
  // GPU image jobs: this rank's demand for its GPU's JPEG decoder in [0, 1], and its batches
  // whose JPEGs that decoder took (see JobStatus::gpu_decode).
  double gpu_decode_demand = 0;
  uint64_t gpu_decode_batches = 0;
};

struct SampleError {
  int64_t index = 0;
  std::string path;
  std::string message;
};

// A GPU image job's JPEG decoding (JobStatus::gpu_decode). Defined outside JobStatus so that
// std::optional sees a complete type with its member initializers.
struct GpuDecodeStatus {
  // "auto", "gpu" or "cpu" (DaemonConfig.gpu_decode) while the GPU decodes for the job;
  // empty when it does not, and then `off` says why.
  std::string mode;
  std::string off;
  int64_t gpu_images = 0;  // decoded by the GPU
  int64_t cpu_images = 0;  // decoded by the workers, fallbacks included
  // Files the workers decoded because the GPU could not, by reason ("progressive",
  // "cmyk", "too_large", "not_jpeg", ...), as ferryd lists them.
  struct Fallback {
    std::string reason;
    int64_t count = 0;
  };
  std::vector<Fallback> fallbacks;
  // The share of the files the GPU can take that it is given now (1 in mode "gpu"), and
  // the measured costs behind it (0 until measured).
  double gpu_share = 0;
  double cpu_ms_per_image = 0;  // worker CPU time per image the workers decode
  double gpu_ms_per_image = 0;  // GPU time per image it decodes and resamples
  // Mode "auto": how much the trainers wait for batches, in [0, 1]; the GPU decodes only
  // while they do (gpu_share is this times the share that balances the costs).
  double demand = 0;
  // GPUs decoding for the job now (one per rank attached on a GPU), side by side.
  int decoders = 0;
};

// What ferryd's read-ahead did for a job (JobStatus::read_ahead; ferry.proto
// ReadAheadStatus says what each count means).
struct ReadAheadStatus {
  int64_t opened = 0;   // files opened ahead of the workers
  int64_t failed = 0;   // opens that failed (the workers report the error)
  int64_t skipped = 0;  // files the workers reached first
  int64_t files_in_window = 0;
  uint64_t bytes_in_window = 0;
};

struct JobStatus {
  JobInfo job;
  std::vector<RankStatus> ranks;
  int64_t errors = 0;  // bad samples, each counted once
  std::vector<SampleError> recent_errors;
  int64_t quarantined = 0;  // bad samples remembered and never read again
  int64_t substituted = 0;  // substitutes delivered in their place
  std::string failure;      // non-empty once the job stopped (FAIL policy, machine errors)
  // Non-empty while reads wait on the machine (out of descriptors, ...): the latest error.
  std::string paused;
  int64_t transient_errors = 0;  // reads that failed so, each try counted
  // Samples the workers read and transformed, and the bytes they read from the dataset.
  int64_t samples_decoded = 0;
  uint64_t bytes_read = 0;
  // Seconds since a consumer was last attached (0 while one is), and until ferryd deletes
  // the idle job (job_idle_timeout_seconds; 0 when not idle or idle jobs are kept).
  double idle_seconds = 0;
  double deleted_in_seconds = 0;
  // GetJob only: every quarantined sample, ascending.
  std::vector<int64_t> quarantined_indices;
  // A blend's sources, in the spec's order.
  struct BlendSource {
    std::string name;
    double weight = 0;  // normalised
    int64_t num_samples = 0;
    int64_t samples_per_epoch = 0;  // positions of each epoch drawn from it
    int64_t samples_drawn = 0;      // positions of batches so far (prefetched included)
  };
  std::vector<BlendSource> blend_sources;
  // Who decodes the JPEGs of an image job on a GPU (docs/operations.md, "JPEG decode on the
  // GPU"). Absent for jobs that decode no images, or whose daemon predates it.
  using GpuDecode = GpuDecodeStatus;
  std::optional<GpuDecode> gpu_decode;
  // Jobs whose files ferryd reads ahead of the workers (remote image folders and WebDataset
  // shards; docs/operations.md, "Remote datasets"). Absent for the others.
  std::optional<ReadAheadStatus> read_ahead;
};

struct NumaNodeStatus {
  int32_t id = 0;
  std::vector<int32_t> cpus;
  uint32_t workers = 0;
};

// One GPU ferryd can serve (GPU transport).
struct GpuStatus {
  int32_t ordinal = 0;
  std::string name;
  std::string pci_bus_id;
  int32_t numa_node = -1;
  std::vector<int32_t> local_cpus;  // where the workers of its jobs run
  uint64_t device_memory_in_use_bytes = 0;
  uint64_t device_memory_budget_bytes = 0;
  uint64_t pinned_memory_in_use_bytes = 0;
  uint64_t bytes_to_device = 0;
  double h2d_bytes_per_second = 0;  // over the last ~10 s
  uint32_t batches_in_flight = 0;
  uint32_t ranks = 0;
  // Since ferryd started, over the jobs whose JPEGs this GPU may decode: images its JPEG
  // decoder decoded, images CPUs decoded, and the reasons of those the GPU could not take.
  int64_t jpeg_gpu_images = 0;
  int64_t jpeg_cpu_images = 0;
  std::vector<GpuDecodeStatus::Fallback> jpeg_fallbacks;
};

// The node cache of remote datasets and the transfers that fill it (counters since ferryd
// started, unless said "now").
struct RemoteStatus {
  uint64_t cache_bytes = 0;  // now
  uint64_t cache_capacity_bytes = 0;
  uint64_t cache_entries = 0;         // now
  uint64_t cache_pinned_entries = 0;  // now: being read
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;  // opens that downloaded
  uint64_t cache_evictions = 0;
  uint64_t downloaded_bytes = 0;
  uint64_t requests = 0;
  uint32_t requests_in_flight = 0;  // now
  struct Retries {
    std::string cause;  // "connection", "throttled", "server", "short"
    int64_t count = 0;
  };
  std::vector<Retries> retries;
  uint64_t failures = 0;
};

struct DaemonStatus {
  std::string version;
  double uptime_seconds = 0;
  uint32_t pid = 0;
  std::vector<NumaNodeStatus> numa_nodes;
  uint64_t host_memory_in_use_bytes = 0;
  uint64_t host_memory_budget_bytes = 0;
  bool cuda_available = false;
  std::string config_path;
  std::vector<std::string> dataset_roots;
  uint64_t pinned_memory_in_use_bytes = 0;
  uint64_t pinned_memory_budget_bytes = 0;
  std::vector<GpuStatus> gpus;
  bool draining = false;  // Client::Drain was called: ferryd exits when no consumer is left
  uint32_t job_idle_timeout_seconds = 0;  // 0: idle jobs are kept
  uint32_t consumers = 0;                 // attached, over all jobs of every user
  // Of the worker threads' time over the last 10 s, the fraction spent on tasks; ferryd's
  // CPU seconds (user + system) since it started; its worker threads.
  double workers_busy_fraction = 0;
  double cpu_seconds = 0;
  uint32_t workers = 0;
  std::optional<RemoteStatus> remote;  // unset: ferryd reads no remote datasets
};

struct StatusReport {
  DaemonStatus daemon;
  std::vector<JobStatus> jobs;
};

// ---------------------------------------------------------------------------------------
// Batches.

// One field of a batch: a contiguous, C-ordered [num_samples, *per-sample shape] array.
struct BatchField {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;  // batch dimension first
  // Read-only; valid until the batch is released. Host memory when `device` is -1,
  // otherwise device memory on CUDA device `device` (this process's ordinal).
  const void* data = nullptr;
  size_t bytes = 0;
  int device = -1;
};

namespace internal {
class BatchLease;
class Connection;
class ConsumerImpl;
}  // namespace internal

// A view of one batch in the daemon's shared memory plus a lease on its slot. The lease
// is given back (Release on the stream) by Release() or the destructor, whichever comes
// first; afterwards the daemon may overwrite the memory, so `data` pointers must not be
// used. Move-only. A Batch may outlive its Consumer (releasing it is then a no-op, and
// its memory stays mapped until the batch dies).
//
// GPU batches (device() >= 0: the job's device is "cuda:..."). The fields are device
// memory in a slot of ferryd's ring on the trainer's GPU, mapped once per attach. The
// contract, all on CUDA streams of the caller's choosing (`stream` is a cudaStream_t;
// nullptr = the device's legacy default stream), with no host synchronisation:
//   1. WaitOn(stream) before any work that reads the fields is enqueued on `stream` (or on
//      a stream ordered after it). The data is not ready before: ferryd's copy may still
//      be running when Next returns.
//   2. ReleaseOn(stream) after the last work that reads the fields has been enqueued on
//      `stream`: it records the slot's "released" event there and gives the slot back;
//      ferryd writes the slot again only after that event has completed. Work on other
//      streams must be ordered before `stream`'s record (e.g. by an event) by the caller.
//   3. Release() and the destructor on a GPU batch mean ReleaseOn(the stream last passed to
//      WaitOn), or the legacy default stream when WaitOn was never called. That stream must
//      still exist.
// The device memory stays mapped while any Batch of the attach lives, even past the
// Consumer; after a release its contents may change at any time. A failed CUDA call
// (e.g. a lost context) returns its error and leaves the lease held, since giving the slot
// back without the event could let ferryd overwrite memory still being read; the slot is
// then reclaimed when the stream ends.
// For host batches WaitOn is a no-op and ReleaseOn is Release.
//
// Thread safety: a Batch is not synchronized; use one from one thread at a time. Batches
// of one consumer may be released concurrently from different threads.
class Batch final {
 public:
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }  // batch number within the epoch
  int64_t seq() const { return seq_; }      // position in the consumer's stream
  uint32_t slot() const { return slot_; }
  uint32_t num_samples() const { return num_samples_; }
  const std::vector<BatchField>& fields() const { return fields_; }
  // The field called `name`, or null.
  const BatchField* field(std::string_view name) const;

  // Gives the slot back. Idempotent: later calls return OK and do nothing. An error means
  // the release could not be sent because the stream is gone, in which case the daemon
  // has reclaimed the slot anyway.
  absl::Status Release();
  bool released() const;

  // CUDA device of the batch's fields (this process's ordinal), or -1 for host memory.
  int device() const { return device_; }
  // GPU batches: makes `stream` wait (on the device) until the batch is in its slot.
  // Returns at once. See the contract above.
  absl::Status WaitOn(void* stream);
  // GPU batches: records the slot's released event on `stream`, then gives the slot back.
  // Idempotent like Release. See the contract above.
  absl::Status ReleaseOn(void* stream);

 private:
  friend class internal::ConsumerImpl;
  Batch() = default;

  int64_t epoch_ = 0;
  int64_t index_ = 0;
  int64_t seq_ = 0;
  uint32_t slot_ = 0;
  uint32_t num_samples_ = 0;
  int device_ = -1;
  std::vector<BatchField> fields_;
  std::unique_ptr<internal::BatchLease> lease_;
};

// ---------------------------------------------------------------------------------------
// Consumer: one rank of one job.
//
// Thread safety: StartEpoch and Next must not be called concurrently with each other (one
// consuming thread); the batches they return may be released from any thread.
class Consumer final {
 public:
  ~Consumer();  // closes the stream: the daemon reclaims every slot still leased
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // The job as CreateJob returned it: job().fields is the host layout. Batches carry the
  // layout they are delivered in (for GPU jobs, the device layout, e.g. CHW floats).
  const JobInfo& job() const;
  uint32_t rank() const;
  uint32_t num_slots() const;
  // CUDA device (this process's ordinal) the batches arrive on, or -1 for the host
  // transport.
  int device() const;

  // Asks for batches [first_batch, job().batches_per_epoch) of `epoch`. When the previous
  // epoch has not been consumed to its end, the consumer reattaches first (a new stream;
  // batches still held from the old one stay readable but their slots are no longer
  // protected). INVALID_ARGUMENT when first_batch is out of range.
  absl::Status StartEpoch(int64_t epoch, int64_t first_batch);

  // Resuming on another world size or batch size: asks for the rest of `epoch` after an
  // earlier run delivered the positions `consumed` of the epoch's order (sorted disjoint
  // ranges of [0, job().samples_per_epoch), from EpochProgress::ConsumedAfter of that run).
  // The positions left are dealt to the job's ranks as a fresh epoch is, and this rank gets
  // batches [first_batch, n) of that deal; returns n, the same for every rank. Every rank of
  // the run must pass the same ranges: FAILED_PRECONDITION when another attached rank
  // resumes the epoch from other positions, or when ferryd is too old to resume;
  // INVALID_ARGUMENT when the ranges are not positions of this job's epoch. Empty
  // `consumed`: StartEpoch. Otherwise as StartEpoch.
  absl::StatusOr<int64_t> ResumeEpoch(int64_t epoch, const std::vector<EpochRange>& consumed,
                                      int64_t first_batch);
  // Batches of the epoch last started (StartEpoch or ResumeEpoch), per rank.
  int64_t epoch_batches() const;
  // How many times this consumer attached: 1 after Client::Attach, one more at every
  // reattach (StartEpoch after an unfinished epoch, taking the job back on a new ferryd).
  // Batches of an earlier attach stay readable, but a caller that keeps views of the slots
  // (addresses of fields) must take them again from the batches of the new one.
  int64_t attaches() const;

  // The next batch of the epoch, or nullopt after its last batch. Errors: FAILED_PRECONDITION
  // before StartEpoch; DEADLINE_EXCEEDED when nothing arrived within `timeout` (nothing is
  // lost: call again); otherwise the stream's error (e.g. UNAVAILABLE when ferryd died),
  // after which the consumer is unusable until the next StartEpoch. GPU transport: once
  // ferryd is gone, batches it sent but not yet taken are dropped, not returned (their
  // device memory went with it): Next fails with UNAVAILABLE at once. Batches already taken
  // stay mapped, but their contents are undefined from then on.
  //
  // When ferryd went away and the client has a reattach patience (Client::set_reattach),
  // Next, StartEpoch and ResumeEpoch first take the job back on the ferryd that answers at
  // the client's address: they connect again, create the job again (as the client's
  // CreateJob did, with the samples quarantined through the client), attach as this rank
  // and GPU and go on with the epoch after the last batch Next returned, so no sample is
  // lost or repeated (the order is a function of the seed and the epoch). They fail with
  // the UNAVAILABLE, saying why the job was not taken back, once the patience is spent or
  // at an error that waiting does not cure; the next StartEpoch tries again.
  absl::StatusOr<std::optional<Batch>> Next(absl::Duration timeout = absl::InfiniteDuration());

 private:
  friend class Client;
  explicit Consumer(std::unique_ptr<internal::ConsumerImpl> impl);
  std::unique_ptr<internal::ConsumerImpl> impl_;
};

// ---------------------------------------------------------------------------------------
// Client: one session with one ferryd.
//
// Thread safety: every method may be called concurrently. Consumers keep the session they
// need alive on their own, so a Client may be destroyed before its consumers.
class Client final {
 public:
  // Connects to ferryd's gRPC socket at `address` (a path, optionally prefixed "unix:");
  // empty means DefaultSocketPath(). Opens the session socket next to it and keeps it open
  // for the client's lifetime. NOT_FOUND / UNAVAILABLE when no ferryd answers there, with
  // the path looked at and how to start one.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(std::string_view address);

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The gRPC socket path in use.
  const std::string& address() const;
  // Pid the daemon reported in its HELLO.
  int daemon_pid() const;

  // Creates the job or returns the existing one with the same name and spec.
  absl::StatusOr<JobInfo> CreateJob(const JobOptions& options);
  absl::StatusOr<JobStatus> GetJob(std::string_view job_id);
  absl::StatusOr<std::vector<JobInfo>> ListJobs();
  absl::Status DeleteJob(std::string_view job_id);
  // Asks ferryd to take no new jobs or attaches and to exit once the consumers attached now
  // are done (root or ferryd's own uid only). Returns how many consumers were attached.
  absl::StatusOr<uint32_t> Drain();
  // Quarantines samples of a job known to be bad elsewhere (a resume state taken on an
  // earlier ferryd): never read, substituted as its own bad samples are. Returns how many
  // were new. INVALID_ARGUMENT for an index outside the job's samples.
  absl::StatusOr<uint32_t> Quarantine(std::string_view job_id, const std::vector<int64_t>& indices);
  absl::StatusOr<StatusReport> GetStatus();

  // The same answers as the proto3 JSON mapping (proto field names, every field printed),
  // of ferry.v1.Job (CreateJobJson), JobStatus, ListJobsResponse and GetStatusResponse.
  absl::StatusOr<std::string> CreateJobJson(std::string_view name, std::string_view spec_json);
  absl::StatusOr<std::string> GetJobJson(std::string_view job_id);
  absl::StatusOr<std::string> ListJobsJson();
  absl::StatusOr<std::string> GetStatusJson();

  // Attaches as `rank` of job `job_id` and opens the batch stream. Host transport: maps
  // the job's slab read-only. GPU transport: selects the local device with ferryd's PCI
  // bus id, opens every slot and ready event over CUDA IPC and creates the released
  // events, once for the attach's lifetime; FAILED_PRECONDITION naming the CUDA error when
  // this process cannot see that GPU or CUDA IPC fails (e.g. another IPC namespace), or
  // when this library was built without CUDA. Call StartEpoch on the result to receive
  // batches.
  absl::StatusOr<std::unique_ptr<Consumer>> Attach(std::string_view job_id, uint32_t rank);
  // The same for a GPU job's rank on GPU `device`: "cuda:<PCI bus id>" (CudaPciBusId of
  // this process's ordinal: the same GPU whatever CUDA_VISIBLE_DEVICES says) or "cuda:N"
  // (ferryd's ordinal). Needed for a job of device "cuda"; for one of device "cuda:N" it
  // overrides the spec's GPU. Every reattach of the consumer names the same device.
  absl::StatusOr<std::unique_ptr<Consumer>> Attach(std::string_view job_id, uint32_t rank,
                                                   std::string_view device);

  // How long Attach waits for a rank that another consumer holds (FAILED_PRECONDITION with
  // reason RANK_HELD) to be let go before it returns that refusal: a consumer closed just
  // before (a loader closed and made again, a trainer restarted) ends its stream
  // asynchronously, and ferryd may not have seen the end yet. The refusal names the
  // holder's pid. Zero: refused at once. Default: kHeldRankWait.
  static constexpr absl::Duration kHeldRankWait = absl::Seconds(5);
  void set_held_rank_wait(absl::Duration wait);

  // Consumers of jobs this client created (CreateJob, CreateJobJson) take their job back on
  // a new ferryd at the same address when theirs goes away (a restart by systemd, an
  // upgrade), trying for up to `patience` (see Consumer::Next). `before_reconnect`, when
  // set, runs before each attempt to connect again (a trainer that started its own ferryd
  // starts it again there); its error ends that attempt. A job id CreateJob returned keeps
  // naming the job created again, in every call of this client. Zero patience (the
  // default): a consumer whose ferryd went away fails with UNAVAILABLE at once.
  void set_reattach(absl::Duration patience,
                    std::function<absl::Status()> before_reconnect = nullptr);

 private:
  explicit Client(std::shared_ptr<internal::Connection> impl);
  std::shared_ptr<internal::Connection> impl_;
};

// PCI bus id ("0000:3b:00.0", lower case) of this process's CUDA device `ordinal`, the
// form to send as device "cuda:<bus id>" so that ferryd picks the same GPU whatever
// CUDA_VISIBLE_DEVICES says. INVALID_ARGUMENT for an ordinal this process does not have;
// FAILED_PRECONDITION without a usable device or driver, or when built without CUDA.
absl::StatusOr<std::string> CudaPciBusId(int ordinal);

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_INCLUDE_FERRY_CLIENT_H_
