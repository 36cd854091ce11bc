// ferryd's status as Prometheus metrics: the text exposition format (version 0.0.4) of a
// GetStatusResponse, the same message the GetStatus RPC returns. A pure function, so the
// names, labels and types are tested without a server; MetricsServer serves its result.
//
//   ferry::v1::GetStatusResponse status = ...;  // daemon + every job
//   std::string body = StatusToPrometheus(status);
//
// Conventions: every name starts with ferry_; counters end in _total, durations are
// _seconds, sizes _bytes, fractions _ratio. Per-rank series carry job_id, job_name and
// rank; per-GPU series gpu (the CUDA ordinal). The label is not `job`: Prometheus sets
// `job` on every series of a scrape target and would rename ours to `exported_job`.
// Label values come from bounded sets only (jobs alive, their ranks, GPUs, the five
// limiting stages, the fixed bad-sample reasons); free text (limiting_stage_note, error
// messages) stays in `ferryctl status`. docs/operations.md ("Metrics") lists every family.
#ifndef FERRY_SERVER_METRICS_PROMETHEUS_TEXT_H_
#define FERRY_SERVER_METRICS_PROMETHEUS_TEXT_H_

#include <string>

#include "ferry/v1/ferry.pb.h"

namespace ferry {

// Content-Type of StatusToPrometheus's output.
inline constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Every family is written with its # HELP and # TYPE lines, also when no job exists (then
// with no samples), so a dashboard's queries name families that are always there.
std::string StatusToPrometheus(const ferry::v1::GetStatusResponse& status);

}  // namespace ferry

#endif  // FERRY_SERVER_METRICS_PROMETHEUS_TEXT_H_
