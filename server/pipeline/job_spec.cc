#include "server/pipeline/job_spec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/quote.h"
#include "server/dataset/sample_source.h"

namespace ferry {

JobDevice ParseJobDevice(absl::string_view device) {
  if (device == "cpu") return JobDevice::kCpu;
  if (device == "cuda" || absl::StartsWith(device, "cuda:")) return JobDevice::kCuda;
  return JobDevice::kUnknown;
}

absl::Status CheckJobName(absl::string_view name) {
  if (name.size() > kMaxJobNameBytes ||
      !std::all_of(name.begin(), name.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) {
    return absl::InvalidArgumentError(absl::StrCat("job name ", QuoteForMessage(name, 64),
                                                   " must be at most ", kMaxJobNameBytes,
                                                   " printable ASCII characters"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ferry::v1::JobSpec> NormalizeJobSpec(ferry::v1::JobSpec spec,
                                                    const SpecDefaults& defaults) {
  if (spec.batch_size() < 1 || spec.batch_size() > kMaxBatchSize) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size must be in [1, ", kMaxBatchSize,
                                                   "] (got ", spec.batch_size(), ")"));
  }
  if (spec.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("world_size must be at most ", kMaxWorldSize,
                                                   " (got ", spec.world_size(), ")"));
  }
  if (spec.world_size() == 0) spec.set_world_size(1);
  if (spec.prefetch_depth() > kMaxPrefetchDepth) {
    return absl::InvalidArgumentError(absl::StrCat("prefetch_depth must be at most ",
                                                   kMaxPrefetchDepth, " (got ",
                                                   spec.prefetch_depth(), ")"));
  }
  if (spec.device().empty()) spec.set_device("cpu");
  const JobDevice device = ParseJobDevice(spec.device());
  if (device == JobDevice::kUnknown) {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be \"cpu\", \"cuda\" or \"cuda:N\" (got ",
                     QuoteForMessage(spec.device(), 64), ")"));
  }
  const bool cuda = device == JobDevice::kCuda;
  if (!cuda && spec.has_image_output() && spec.image_output().dtype() != ferry::v1::UINT8 &&
      spec.image_output().dtype() != ferry::v1::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "image_output converts images on the GPU; it needs device=\"cuda:N\"");
  }
  ApplyDatasetDefaults(spec.mutable_dataset());
  // Before the job's key is made: a GPU job that asks for widen_on_host and one that gets it
  // from the daemon are then the same job.
  if (cuda && defaults.widen_tokens_on_host) SetWidenOnHost(spec.mutable_dataset());
  return spec;
}

}  // namespace ferry
