#include "server/pipeline/job.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace ferry {
namespace {

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }
constexpr size_t kMaxRecentErrors = 32;

}  // namespace

absl::StatusOr<SlotLayout> SlotLayout::Make(const std::vector<FieldLayout>& fields,
                                            int64_t batch_size) {
  if (batch_size < 1 || batch_size > int64_t{kMaxBatchSize}) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size must be in [1, ", kMaxBatchSize, "] (got ", batch_size, ")"));
  }
  SlotLayout layout;
  layout.fields = fields;
  layout.batch_size = batch_size;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t offset = 0;
  for (const FieldLayout& f : fields) {
    offset = RoundUp(offset, 256);
    layout.offsets.push_back(offset);
    uint64_t block = 0;
    // offset <= kMaxSlotBytes here, so the sum cannot wrap once block is checked too.
    if (__builtin_mul_overflow(static_cast<uint64_t>(f.row_bytes),
                               static_cast<uint64_t>(batch_size), &block) ||
        block > kMaxSlotBytes || offset + block > kMaxSlotBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("a batch of ", batch_size, " rows of field '", f.name, "' (", f.row_bytes,
                       " bytes a row) exceeds the largest batch ferryd holds (", kMaxSlotBytes,
                       " bytes for all fields); lower batch_size"));
    }
    offset += block;
  }
  layout.slot_bytes = RoundUp(std::max<uint64_t>(offset, 1), page);
  return layout;
}

absl::StatusOr<std::shared_ptr<Job>> Job::Create(JobIdentity identity,
                                                 const ferry::v1::JobSpec& spec,
                                                 std::shared_ptr<const DatasetFs> fs,
                                                 const SourceOptions& options) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<SampleSource> source,
                         MakeSampleSource(spec, std::move(fs), options));
  return Create(std::move(identity), spec, std::move(source), options.gpu_decode);
}

absl::StatusOr<std::shared_ptr<Job>> Job::Create(JobIdentity identity,
                                                 const ferry::v1::JobSpec& spec,
                                                 std::unique_ptr<SampleSource> source,
                                                 std::shared_ptr<GpuDecodeSplit> gpu_decode) {
  SamplerOptions options;
  options.num_samples = source->size();
  options.batch_size = spec.batch_size();
  options.world_size = spec.world_size() == 0 ? 1 : spec.world_size();
  options.shuffle = spec.shuffle();
  options.drop_last = spec.drop_last();
  options.seed = spec.seed();
  if (source->HasStreamOrder()) {
    // The source orders the epoch (shards, then a shuffle buffer) and each rank reads a
    // contiguous run of it. The Job owns both, so the source outlives the sampler's calls.
    const SampleSource* stream = source.get();
    options.epoch_order = [stream, seed = options.seed, shuffle = options.shuffle](
                              int64_t epoch, std::vector<int64_t>* order) {
      stream->StreamOrder(seed, epoch, shuffle, order);
    };
    options.contiguous = true;
  }
  if (source->DealsMicroBatches()) {
    if (options.shuffle) {
      return absl::InvalidArgumentError(
          "shuffle must be off for a dataset in Megatron-LM's own order "
          "(dataset.megatron_gpt shuffles its samples itself, from its random_seed); set "
          "shuffle=False");
    }
    options.micro_batches = true;
  }
  if (source->MapsPositions()) {
    // The sampler deals the blend's positions; the source maps each to a sample.
    const SampleSource* mapped = source.get();
    options.num_samples = source->epoch_size();
    options.map_positions = [mapped, seed = options.seed, shuffle = options.shuffle](
                                int64_t epoch, absl::Span<int64_t> positions) {
      mapped->MapPositions(seed, epoch, shuffle, positions);
    };
  }
  FERRY_ASSIGN_OR_RETURN(SlotLayout layout, SlotLayout::Make(source->fields(), options.batch_size));
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Sampler> sampler, Sampler::Create(options));
  std::shared_ptr<Job> job(
      new Job(std::move(identity), spec, std::move(source), std::move(sampler), std::move(layout)));
  for (const FieldLayout& field : job->layout().fields) {
    if (field.internal && field.name == kGpuDecodePlanField) job->gpu_decode_ = gpu_decode;
  }
  return job;
}

Job::Job(JobIdentity identity, ferry::v1::JobSpec spec, std::unique_ptr<SampleSource> source,
         std::unique_ptr<Sampler> sampler, SlotLayout layout)
    : identity_(std::move(identity)),
      spec_(std::move(spec)),
      source_(std::move(source)),
      sampler_(std::move(sampler)),
      layout_(std::move(layout)),
      create_time_(absl::Now()) {}

void Job::StartReadAhead(std::shared_ptr<const DatasetFs> fs, const ReadAhead::Options& options) {
  // Sources whose files are all mapped, and all there, have nothing to read ahead.
  if (source_->size() == 0 || (source_->FileOf(0).empty() && !source_->ReadsInRanges())) return;
  read_ahead_ = std::make_unique<ReadAhead>(std::move(fs), options);
}

void Job::ToProto(ferry::v1::Job* job) const {
  job->set_id(identity_.id);
  job->set_name(identity_.name);
  *job->mutable_spec() = spec_;
  job->set_owner_uid(identity_.owner_uid);
  job->set_num_samples(source_->size());
  job->set_samples_per_epoch(sampler_->options().num_samples);
  job->set_contiguous_ranks(sampler_->options().contiguous);
  job->set_batches_per_epoch(sampler_->batches_per_epoch());
  for (size_t f = 0; f < layout_.fields.size(); ++f) {
    if (layout_.fields[f].internal) continue;
    ferry::v1::Field* field = job->add_fields();
    field->set_name(layout_.fields[f].name);
    field->set_dtype(layout_.fields[f].dtype);
    for (int64_t d : layout_.fields[f].shape) field->add_shape(d);
    field->set_offset(layout_.offsets[f]);
    field->set_row_bytes(layout_.fields[f].row_bytes);
  }
  job->set_slot_bytes(layout_.slot_bytes);
  job->set_create_time_unix_ms(absl::ToUnixMillis(create_time_));
}

std::string_view SampleErrorReason(const absl::Status& error) {
  // Decode limits refuse with INVALID_ARGUMENT naming the limit (image_transform.cc).
  if (absl::StrContains(error.message(), "decode_limits.")) return "too_large";
  switch (error.code()) {
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kInvalidArgument:
      return "corrupt";
    case absl::StatusCode::kNotFound:
      return "missing";
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnavailable:
      return "unreadable";
    case absl::StatusCode::kResourceExhausted:
      return "too_large";
    default:
      return "other";
  }
}

int64_t Job::max_quarantined() const {
  return std::min<int64_t>(source().size() / 2, kMaxQuarantined);
}

bool Job::RecordSampleError(int64_t index, const std::string& path, const absl::Status& error) {
  const std::string message(error.message());
  absl::MutexLock lock(&errors_mutex_);
  // Two ranks (or a rank and its speculation into the next epoch) may hit the same sample
  // before either quarantined it: count and log it once.
  if (quarantine_.contains(index)) return true;
  if (static_cast<int64_t>(quarantine_.size()) >= max_quarantined()) return false;
  quarantine_.insert(index);
  quarantined_.store(static_cast<int64_t>(quarantine_.size()), std::memory_order_release);
  FERRY_LOG(WARNING) << "job " << identity_.id << ": bad sample " << index << " (" << path
                     << "): " << message
                     << (fail_on_corrupt_sample() ? "" : "; quarantined, a substitute is served");
  ++error_count_;
  const std::string_view reason = SampleErrorReason(error);
  for (size_t r = 0; r < kSampleErrorReasons.size(); ++r) {
    if (kSampleErrorReasons[r] == reason) ++errors_by_reason_[r];
  }
  ferry::v1::SampleError e;
  e.set_index(index);
  e.set_path(path);
  e.set_message(message);
  recent_errors_.push_back(std::move(e));
  if (recent_errors_.size() > kMaxRecentErrors) recent_errors_.pop_front();
  return true;
}

bool Job::IsQuarantined(int64_t index) const {
  if (quarantined_.load(std::memory_order_acquire) == 0) return false;
  absl::ReaderMutexLock lock(&errors_mutex_);
  return quarantine_.contains(index);
}

int64_t Job::quarantined_count() const { return quarantined_.load(std::memory_order_acquire); }

absl::StatusOr<int> Job::AddToQuarantine(const std::vector<int64_t>& indices) {
  absl::MutexLock lock(&errors_mutex_);
  int64_t new_ones = 0;
  for (int64_t index : indices) new_ones += quarantine_.contains(index) ? 0 : 1;
  if (static_cast<int64_t>(quarantine_.size()) + new_ones > max_quarantined()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "quarantining ", new_ones, " more samples would leave job ", identity_.id, " with ",
        quarantine_.size() + new_ones, " bad samples of its ", source().size(), ", more than the ",
        max_quarantined(), " it may hold (half its samples, at most ", kMaxQuarantined,
        "): the resume state is of another dataset, or the dataset is damaged"));
  }
  int added = 0;
  for (int64_t index : indices) added += quarantine_.insert(index).second ? 1 : 0;
  quarantined_.store(static_cast<int64_t>(quarantine_.size()), std::memory_order_release);
  return added;
}

std::vector<int64_t> Job::quarantined_indices() const {
  std::vector<int64_t> out;
  {
    absl::MutexLock lock(&errors_mutex_);
    out.assign(quarantine_.begin(), quarantine_.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Job::NoteTransientError(const std::string& path, const absl::Status& status) {
  transient_errors_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&errors_mutex_);
  const bool first = !paused_.load(std::memory_order_relaxed);
  paused_reason_ = absl::StrCat("reading '", path, "': ", status.message());
  paused_.store(true, std::memory_order_release);
  if (first) {
    FERRY_LOG(WARNING) << "job " << identity_.id << " paused: " << paused_reason_
                       << " (a condition of this machine, not of the data: the sample is "
                          "read again until it succeeds, for at most "
                       << absl::FormatDuration(transient_retry_limit()) << ")";
  }
}

void Job::EndPause() {
  absl::MutexLock lock(&errors_mutex_);
  if (!paused_.load(std::memory_order_relaxed)) return;
  paused_.store(false, std::memory_order_release);
  FERRY_LOG(INFO) << "job " << identity_.id << " resumed (paused by " << paused_reason_ << ")";
  paused_reason_.clear();
}

std::string Job::paused_reason() const {
  absl::MutexLock lock(&errors_mutex_);
  return paused_reason_;
}

void Job::Fail(const absl::Status& status) {
  absl::MutexLock lock(&errors_mutex_);
  if (!failure_.ok()) return;
  failure_ = status;
  failed_.store(true, std::memory_order_release);
  FERRY_LOG(ERROR) << "job " << identity_.id << " stopped: " << status;
}

absl::Status Job::failure() const {
  absl::MutexLock lock(&errors_mutex_);
  return failure_;
}

int64_t Job::error_count() const {
  absl::MutexLock lock(&errors_mutex_);
  return error_count_;
}

std::vector<ferry::v1::ReasonCount> Job::errors_by_reason() const {
  std::vector<ferry::v1::ReasonCount> out;
  absl::MutexLock lock(&errors_mutex_);
  for (size_t r = 0; r < kSampleErrorReasons.size(); ++r) {
    if (errors_by_reason_[r] == 0) continue;
    ferry::v1::ReasonCount& c = out.emplace_back();
    c.set_reason(std::string(kSampleErrorReasons[r]));
    c.set_count(errors_by_reason_[r]);
  }
  return out;
}

std::vector<ferry::v1::SampleError> Job::recent_errors() const {
  absl::MutexLock lock(&errors_mutex_);
  return {recent_errors_.begin(), recent_errors_.end()};
}

}  // namespace ferry
