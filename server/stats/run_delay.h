// How long a process's main thread has waited for a CPU: the kernel's run-queue delay, the
// time it was ready to run but another thread held every CPU it may use (the second field
// of /proc/<pid>/schedstat, kept by every kernel built with CONFIG_SCHED_INFO). A trainer
// whose main thread (its Python loop, its kernel launches) waits for a CPU is short of CPU,
// whatever its batches do: RankPipeline samples its consumer's to tell the two apart.
//
//   absl::StatusOr<absl::Duration> waited = MainThreadRunDelay(pid);
//
// Any user may read any process's schedstat. A process that is gone is NOT_FOUND; a kernel
// without schedstat (or a procfs that hides it) is UNAVAILABLE.
#ifndef FERRY_SERVER_STATS_RUN_DELAY_H_
#define FERRY_SERVER_STATS_RUN_DELAY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ferry {

// The run-queue delay of `pid`'s main thread (the thread whose id is the process id) since
// it started.
absl::StatusOr<absl::Duration> MainThreadRunDelay(int pid);

// The delay in the text of a schedstat file ("<on-cpu ns> <run-queue ns> <timeslices>\n").
absl::StatusOr<absl::Duration> ParseSchedstatRunDelay(absl::string_view text);

}  // namespace ferry

#endif  // FERRY_SERVER_STATS_RUN_DELAY_H_
