#include "server/stats/limiting_stage.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry {
namespace {

std::string Percent(double fraction) {
  return absl::StrCat(static_cast<int>(std::lround(100 * fraction)), "%");
}

std::string Seconds(double s) { return absl::StrFormat("%.1f s", s); }

}  // namespace

double StallRatio(const LimitingStageFigures& f) {
  if (f.window_seconds <= 0) return 0;
  return std::clamp(f.wait_seconds / f.window_seconds, 0.0, 1.0);
}

double CpuWaitRatio(const LimitingStageFigures& f) {
  if (f.window_seconds <= 0 || f.cpu_wait_seconds < 0) return -1;
  return std::clamp(f.cpu_wait_seconds / f.window_seconds, 0.0, 1.0);
}

LimitingStageVerdict DecideLimitingStage(const LimitingStageFigures& f) {
  LimitingStageVerdict v;
  if (!f.consumer) {
    v.note = "no consumer attached";
    return v;
  }
  if (f.window_seconds < kMinObservedSeconds) {
    v.note = absl::StrCat("observed for ", Seconds(f.window_seconds), "; at least ",
                          Seconds(kMinObservedSeconds), " needed");
    return v;
  }
  const double ratio = StallRatio(f);
  const std::string waited = absl::StrCat(
      "the trainer waited ", Percent(ratio), " of the last ", Seconds(f.window_seconds),
      f.wait_reported ? " (as it measured)" : " (ferryd's estimate)");
  if (ratio < kStalledRatio) {
    const double cpu_wait = CpuWaitRatio(f);
    const std::string ahead =
        absl::StrCat(waited, "; ferry is ahead (", f.ready_batches, " batches ready)");
    if (cpu_wait >= kCpuStarvedRatio) {
      v.stage = ferry::v1::LIMITED_BY_TRAINER_CPU;
      v.note = absl::StrCat(
          ahead, ", but the trainer's main thread waited for a CPU ", Percent(cpu_wait),
          " of the time: it is short of CPU, not of batches (give ferryd fewer workers, "
          "workers_per_node, or the trainers CPUs of their own)");
      return v;
    }
    v.stage = ferry::v1::LIMITED_BY_TRAINER;
    v.note = absl::StrCat(ahead, ": the trainer's own step is the limit");
    if (cpu_wait >= 0) {
      absl::StrAppend(&v.note, " (its main thread waited for a CPU ", Percent(cpu_wait),
                      " of the time)");
    }
    return v;
  }
  const double starved = f.starved_fill_seconds + f.starved_copy_seconds;
  if (starved <= 0) {
    v.note = absl::StrCat(waited,
                          ", yet ferryd always had a batch ready: the time goes in the handoff "
                          "(see handoff_latency)");
    return v;
  }
  if (f.starved_copy_seconds > f.starved_fill_seconds) {
    v.stage = ferry::v1::LIMITED_BY_COPY;
    v.note =
        absl::StrCat(waited, "; the next batch was filled and waiting for its copy to the GPU ",
                     Percent(f.starved_copy_seconds / starved), " of the time ferryd had none",
                     " (see copy_latency, copy_wait_seconds)");
    return v;
  }
  const std::string filling =
      absl::StrCat("; the next batch was still being filled ",
                   Percent(f.starved_fill_seconds / starved), " of the time ferryd had none");
  if (f.task_seconds <= 0) {
    v.note = absl::StrCat(waited, filling, ", and no fill task finished in the window");
    return v;
  }
  const double read_share = std::clamp(f.read_seconds / f.task_seconds, 0.0, 1.0);
  const std::string busy =
      f.worker_threads > 0
          ? absl::StrCat(
                ", workers busy ",
                Percent(std::min(1.0, f.task_seconds / (f.window_seconds * f.worker_threads))),
                " of ", f.worker_threads, " threads on this rank")
          : "";
  const std::string reads = absl::StrCat("; workers spent ", Percent(read_share), " of their ",
                                         Seconds(f.task_seconds), " on its tasks in dataset reads");
  v.note = absl::StrCat(waited, filling, reads, busy);
  if (read_share < kReadShare) {
    v.stage = ferry::v1::LIMITED_BY_DECODE;
  } else if (f.remote_read_seconds >= kReadShare * f.read_seconds) {
    v.stage = ferry::v1::LIMITED_BY_REMOTE_READ;
    absl::StrAppend(&v.note, "; ", Percent(std::min(1.0, f.remote_read_seconds / f.read_seconds)),
                    " of the reads waited for the remote store (raise the remote section's "
                    "fetch_connections or read_ahead_objects; ferryctl status shows the "
                    "transfers)");
  } else {
    v.stage = ferry::v1::LIMITED_BY_READ;
  }
  return v;
}

}  // namespace ferry
