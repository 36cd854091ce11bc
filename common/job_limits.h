// The bounds ferryd puts on a job spec (docs/operations.md, "Limits"). ferryd checks them
// in NormalizeJobSpec (server/pipeline/job_spec.h); the client libraries export them
// (ferry_job_limit in the C ABI), so that a client refuses what ferryd would, with the
// same numbers and before any call.
#ifndef FERRY_COMMON_JOB_LIMITS_H_
#define FERRY_COMMON_JOB_LIMITS_H_

#include <cstdint>

namespace ferry {

// Far above any training batch, and small enough that a row count times any row size
// ferry accepts is checked arithmetic, never a wrap.
inline constexpr uint32_t kMaxBatchSize = uint32_t{1} << 20;
inline constexpr uint32_t kMaxWorldSize = uint32_t{1} << 20;
// Slots a rank may ask for (JobSpec.prefetch_depth).
inline constexpr uint32_t kMaxPrefetchDepth = 64;
// A job name: printable ASCII.
inline constexpr uint32_t kMaxJobNameBytes = 128;

}  // namespace ferry

#endif  // FERRY_COMMON_JOB_LIMITS_H_
