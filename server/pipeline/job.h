// A job: one dataset + transform + sampling spec, shared by all local ranks of a training
// run. Immutable after creation except for its error counters.
#ifndef FERRY_SERVER_PIPELINE_JOB_H_
#define FERRY_SERVER_PIPELINE_JOB_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/ferry.pb.h"
#include "server/dataset/sample_source.h"
#include "server/sampler/sampler.h"

namespace ferry {

// Where each field's rows live inside a slot. Every field block starts on a 256-byte
// boundary (aligned for vector loads and DMA) and the slot size is a multiple of the page
// size, so every slot starts page-aligned in the slab.
struct SlotLayout {
  std::vector<FieldLayout> fields;
  std::vector<size_t> offsets;  // per field, from the slot's start
  int64_t batch_size = 0;
  size_t slot_bytes = 0;

  static SlotLayout Make(const std::vector<FieldLayout>& fields, int64_t batch_size);
};

struct JobIdentity {
  std::string id;
  std::string name;
  uint32_t owner_uid = 0;
  uint64_t serial = 0;  // unique per daemon lifetime
};

class Job final {
 public:
  // Opens the dataset and checks the spec. Errors name the offending field.
  static absl::StatusOr<std::shared_ptr<Job>> Create(JobIdentity identity,
                                                     const ferry::v1::JobSpec& spec,
                                                     const DecodeLimits& limits = DecodeLimits());
  // Same, over an already opened source (tests feed fakes through this).
  static absl::StatusOr<std::shared_ptr<Job>> Create(JobIdentity identity,
                                                     const ferry::v1::JobSpec& spec,
                                                     std::unique_ptr<SampleSource> source);

  const JobIdentity& identity() const { return identity_; }
  const ferry::v1::JobSpec& spec() const { return spec_; }
  const SampleSource& source() const { return *source_; }
  Sampler& sampler() const { return *sampler_; }
  const SlotLayout& layout() const { return layout_; }
  absl::Time create_time() const { return create_time_; }

  // Fills `job` (the API view) with identity, spec and layout.
  void ToProto(ferry::v1::Job* job) const;

  // Records a sample that could not be delivered (counted, kept among the recent ones).
  void RecordSampleError(int64_t index, const std::string& path, const std::string& message);
  int64_t error_count() const;
  std::vector<ferry::v1::SampleError> recent_errors() const;

 private:
  Job(JobIdentity identity, ferry::v1::JobSpec spec, std::unique_ptr<SampleSource> source,
      std::unique_ptr<Sampler> sampler);

  const JobIdentity identity_;
  const ferry::v1::JobSpec spec_;
  const std::unique_ptr<SampleSource> source_;
  const std::unique_ptr<Sampler> sampler_;
  const SlotLayout layout_;
  const absl::Time create_time_;

  mutable absl::Mutex errors_mutex_;
  int64_t error_count_ ABSL_GUARDED_BY(errors_mutex_) = 0;
  std::deque<ferry::v1::SampleError> recent_errors_ ABSL_GUARDED_BY(errors_mutex_);
};

}  // namespace ferry

#endif  // FERRY_SERVER_PIPELINE_JOB_H_
