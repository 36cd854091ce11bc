// Where a run stands in an epoch, in positions of the epoch's order, for resume states that
// hold on any world size and batch size (docs/data.md, "Resuming on another number of
// GPUs"): what a run consumed, and what it will have consumed after some batches.
//
//   ferry::EpochProgress progress = ferry::EpochProgress::Of(consumer->job());
//   FERRY_ASSIGN_OR_RETURN(std::vector<ferry::EpochRange> consumed,
//                          progress.ConsumedAfter(batches_done));  // save it with the model
//   ...                                                            // later, any world size:
//   FERRY_ASSIGN_OR_RETURN(int64_t batches, consumer->ResumeEpoch(epoch, consumed, 0));
#ifndef FERRY_CLIENT_CPP_INCLUDE_FERRY_EPOCH_H_
#define FERRY_CLIENT_CPP_INCLUDE_FERRY_EPOCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

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
  int64_t positions = 0;  // Job.samples_per_epoch
  int64_t world_size = 1;
  int64_t batch_size = 1;
  bool drop_last = false;
  bool contiguous_ranks = false;  // Job.contiguous_ranks
  std::vector<EpochRange> consumed;

  // The run's options as its job has them, after `consumed`.
  static EpochProgress Of(const v1::Job& job, std::vector<EpochRange> consumed = {});
  // The positions consumed once every rank took its first `batches_done` batches of the
  // epoch: `consumed` plus what the ranks were dealt, merged. INVALID_ARGUMENT when a field
  // is out of range or `consumed` is not sorted disjoint ranges of the epoch.
  absl::StatusOr<std::vector<EpochRange>> ConsumedAfter(int64_t batches_done) const;
  // Batches per rank in the epoch.
  absl::StatusOr<int64_t> Batches() const;
};

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_INCLUDE_FERRY_EPOCH_H_
