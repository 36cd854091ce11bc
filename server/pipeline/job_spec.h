// The front door of a job spec: NormalizeJobSpec applies every default a JobSpec leaves to
// ferryd and checks every bound that needs neither the dataset nor a GPU, once, before
// anything else reads the spec. What it returns is the spec ferryd keeps (two specs that
// normalize alike make the same job).
//
//   FERRY_RETURN_IF_ERROR(CheckJobName(name));
//   FERRY_ASSIGN_OR_RETURN(ferry::v1::JobSpec spec,
//                          NormalizeJobSpec(request.spec(), {.widen_tokens_on_host = false}));
//
// The dataset's own fields are checked when it opens (MakeSampleSource), the GPU named by a
// "cuda:N" device by the GpuProvider.
#ifndef FERRY_SERVER_PIPELINE_JOB_SPEC_H_
#define FERRY_SERVER_PIPELINE_JOB_SPEC_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/job_limits.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

// Where a job's batches go (JobSpec.device): "cpu", or "cuda" / "cuda:N" /
// "cuda:<PCI bus id>". The one function that reads the device string; the GpuProvider
// resolves a named GPU.
enum class JobDevice { kCpu, kCuda, kUnknown };
JobDevice ParseJobDevice(absl::string_view device);

// What the daemon's configuration adds to every spec.
struct SpecDefaults {
  // DaemonConfig.widen_tokens_on_host: GPU jobs' token ids are widened by the host.
  bool widen_tokens_on_host = false;
};

// INVALID_ARGUMENT unless `name` is at most kMaxJobNameBytes printable ASCII characters
// (empty: ferryd names the job).
absl::Status CheckJobName(absl::string_view name);

// `spec` with its defaults applied: device "cpu", world_size 1, the dataset's own
// (ApplyDatasetDefaults: token_dtype UINT16), widen_on_host on a GPU job's token ids when
// `defaults` say so. INVALID_ARGUMENT naming the field for a batch_size
// outside [1, kMaxBatchSize], a world_size over kMaxWorldSize, a prefetch_depth over
// kMaxPrefetchDepth, an unknown device, or an image_output conversion on a host job.
absl::StatusOr<ferry::v1::JobSpec> NormalizeJobSpec(ferry::v1::JobSpec spec,
                                                    const SpecDefaults& defaults);

}  // namespace ferry

#endif  // FERRY_SERVER_PIPELINE_JOB_SPEC_H_
