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

// Where a run stands in an epoch, as a checkpoint keeps it (Consumer::Position): enough for a
// later run, on any world size and batch size, to deliver the rest of the epoch exactly once
// (Consumer::Resume). Every rank of a run in step has the same.
struct ResumePoint {
  int64_t epoch = 0;
  int64_t positions = 0;             // of the epoch's order (Job.samples_per_epoch)
  std::vector<EpochRange> consumed;  // the positions the run consumed, sorted and disjoint
  // The run's deal, which a run dealt alike goes on with at the same batch (its batches,
  // padding included, are then those of an uninterrupted run):
  int64_t world_size = 1;
  int64_t batch_size = 1;
  bool drop_last = false;
  std::vector<EpochRange> resumed_from;  // the positions the deal left out
  int64_t batches_done = 0;              // each rank's batches of the deal taken
};

// Where a run starts from a ResumePoint: Consumer::ResumeEpoch(epoch, dealt_after,
// first_batch).
struct ResumePlan {
  int64_t epoch = 0;
  std::vector<EpochRange> dealt_after;
  int64_t first_batch = 0;
};

// The plan for a run whose job deals as `run` says (EpochProgress::Of its job): a point whose
// epoch was consumed whole starts the next epoch; a run dealt as the point's (same world
// size, batch size and drop_last) goes on with that deal at its batch; any other is dealt
// the positions the point did not consume. FAILED_PRECONDITION when the point's epoch has
// another number of positions (the dataset changed since it was taken); INVALID_ARGUMENT
// naming the field when a field is out of range or its ranges are not sorted, disjoint and
// inside the epoch.
absl::StatusOr<ResumePlan> PlanResume(const ResumePoint& point, const EpochProgress& run);

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_INCLUDE_FERRY_EPOCH_H_
