// Which stage of the input pipeline limits a rank (RankStatus.limiting_stage), told from
// figures over the rank's recent window (RecentWindow) by one pure function, so that every
// rule is unit-tested with plain numbers.
//
//   LimitingStageFigures f;  // filled by RankPipeline::FillStatus
//   LimitingStageVerdict v = DecideLimitingStage(f);
//   status->set_limiting_stage(v.stage);
//   status->set_limiting_stage_note(v.note);
//
// The rules, in order:
//   UNSPECIFIED  less than kMinObservedSeconds observed with a consumer.
//   TRAINER_CPU  the trainer waited less than kStalledRatio of the window for batches, and
//                its main thread waited for a CPU at least kCpuStarvedRatio of it: ferry is
//                ahead, the trainer is short of CPU.
//   TRAINER      the trainer waited less than kStalledRatio of the window: ferry is ahead.
//   Otherwise the trainer waits, and what it waited for is read from ferryd's own record of
//   its starvation (the time it had no batch to send), split by the state of the batch next
//   in order while it had none:
//   COPY         the next batch was filled and its copy to the GPU not complete (waiting
//                for a free device slot, or copying) more often than it was still filling.
//   REMOTE_READ  it was filling, the workers spent at least kReadShare of their time on the
//                rank's tasks inside dataset file reads, and at least kReadShare of those
//                waiting for a remote store to bring objects into the node cache.
//   READ         it was filling, and the workers spent at least kReadShare of their time on
//                the rank's tasks inside dataset file reads.
//   DECODE       it was filling, the workers mostly not reading: they are saturated
//                decoding and transforming (or serving other jobs).
//   UNSPECIFIED  the trainer reports waits but ferryd always had a batch ready (the time
//                goes in the handoff), or no fill task finished in the window.
#ifndef FERRY_SERVER_STATS_LIMITING_STAGE_H_
#define FERRY_SERVER_STATS_LIMITING_STAGE_H_

#include <string>

#include "ferry/v1/ferry.pb.h"

namespace ferry {

// Figures of one rank over its recent window, in seconds of wall time.
struct LimitingStageFigures {
  bool consumer = false;            // a consumer is attached
  double window_seconds = 0;        // observed with this consumer: at most RecentWindow::kSeconds
  double wait_seconds = 0;          // of those, the trainer waited for a batch
  bool wait_reported = false;       // wait_seconds is what the trainer measured (else ferryd's)
  double starved_fill_seconds = 0;  // ferryd had no batch to send, the next one filling
  double starved_copy_seconds = 0;  // ferryd had no batch to send, the next one copying
  double task_seconds = 0;          // worker time spent on the rank's fill tasks
  double read_seconds = 0;          // of which inside dataset file reads
  double remote_read_seconds = 0;   // of those, waiting for remote objects (node cache fills)
  int worker_threads = 0;           // threads that serve the rank's tasks
  int ready_batches = 0;            // batches ready to send now (queue_depth)
  // The trainer's main thread waited for a CPU (run_delay.h); negative when not known.
  double cpu_wait_seconds = -1;
};

struct LimitingStageVerdict {
  ferry::v1::LimitingStage stage = ferry::v1::LIMITING_STAGE_UNSPECIFIED;
  std::string note;  // one line: the figures the stage was told from
};

inline constexpr double kMinObservedSeconds = 1.0;
inline constexpr double kStalledRatio = 0.1;
inline constexpr double kReadShare = 0.5;
inline constexpr double kCpuStarvedRatio = 0.1;

// The stall ratio of `f`: wait_seconds / window_seconds in [0, 1] (0 for an empty window).
double StallRatio(const LimitingStageFigures& f);
// cpu_wait_seconds / window_seconds in [0, 1]; -1 when not known or the window is empty.
double CpuWaitRatio(const LimitingStageFigures& f);

LimitingStageVerdict DecideLimitingStage(const LimitingStageFigures& f);

}  // namespace ferry

#endif  // FERRY_SERVER_STATS_LIMITING_STAGE_H_
