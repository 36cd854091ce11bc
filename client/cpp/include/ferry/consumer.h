// A consumer is one rank of one job (Client::Attach, ferry/client.h): it asks for an
// epoch's batches and hands them out in order, each a ferry::Batch (ferry/batch.h).
//
//   FERRY_ASSIGN_OR_RETURN(std::unique_ptr<ferry::Consumer> consumer,
//                          client->Attach(job.id(), /*rank=*/0));
//   FERRY_RETURN_IF_ERROR(consumer->StartEpoch(/*epoch=*/0, /*first_batch=*/0));
//   while (true) {
//     FERRY_ASSIGN_OR_RETURN(std::optional<ferry::Batch> batch, consumer->Next());
//     if (!batch) break;  // end of the epoch
//     ...
//   }
#ifndef FERRY_CLIENT_CPP_INCLUDE_FERRY_CONSUMER_H_
#define FERRY_CLIENT_CPP_INCLUDE_FERRY_CONSUMER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/batch.h"
#include "ferry/epoch.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

namespace internal {
class ConsumerImpl;
}  // namespace internal

class Client;

// One rank of one job.
//
// Thread safety: StartEpoch and Next must not be called concurrently with each other (one
// consuming thread); the batches they return may be released from any thread.
class Consumer final {
 public:
  ~Consumer();  // closes the stream: the daemon reclaims every slot still leased
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // The job as ferryd answered the attach: job().fields() is the host layout. Batches carry
  // the layout they are delivered in (for GPU jobs, the device layout, e.g. CHW floats).
  const v1::Job& job() const;
  uint32_t rank() const;
  uint32_t num_slots() const;
  // CUDA device (this process's ordinal) the batches arrive on, or -1 for the host
  // transport.
  int device() const;

  // Asks for batches [first_batch, job().batches_per_epoch()) of `epoch`. When the previous
  // epoch has not been consumed to its end, the consumer reattaches first (a new stream;
  // batches still held from the old one stay readable but their slots are no longer
  // protected). INVALID_ARGUMENT when first_batch is out of range.
  absl::Status StartEpoch(int64_t epoch, int64_t first_batch);

  // Resuming on another world size or batch size: asks for the rest of `epoch` after an
  // earlier run delivered the positions `consumed` of the epoch's order (sorted disjoint
  // ranges of [0, job().samples_per_epoch()), from EpochProgress::ConsumedAfter of that run).
  // The positions left are dealt to the job's ranks as a fresh epoch is, and this rank gets
  // batches [first_batch, n) of that deal; returns n, the same for every rank. Every rank of
  // the run must pass the same ranges: FAILED_PRECONDITION when another attached rank
  // resumes the epoch from other positions, or when ferryd is too old to resume;
  // INVALID_ARGUMENT when the ranges are not positions of this job's epoch. Empty
  // `consumed`: StartEpoch. Otherwise as StartEpoch.
  absl::StatusOr<int64_t> ResumeEpoch(int64_t epoch, const std::vector<EpochRange>& consumed,
                                      int64_t first_batch);
  // Batches of the epoch last started (StartEpoch or ResumeEpoch), per rank.
  int64_t epoch_batches() const;

  // Where the run stands after the last batch Next returned, for a checkpoint: the epoch last
  // started and the positions its ranks consumed once each took as many batches as this one
  // (the next epoch, none consumed, after its end; epoch 0 before any StartEpoch).
  // Needs no daemon.
  absl::StatusOr<ResumePoint> Position() const;
  // Starts where `point` (a Position of any run of a job over the same data and order) says,
  // as PlanResume plans it for this job, and returns the plan. Errors as PlanResume's, then
  // as ResumeEpoch's.
  absl::StatusOr<ResumePlan> Resume(const ResumePoint& point);
  // How many times this consumer attached: 1 after Client::Attach, one more at every
  // reattach (StartEpoch after an unfinished epoch, taking the job back on a new ferryd).
  // Batches of an earlier attach stay readable, but a caller that keeps views of the slots
  // (addresses of fields) must take them again from the batches of the new one.
  int64_t attaches() const;

  // The next batch of the epoch, or nullopt after its last batch. Errors: FAILED_PRECONDITION
  // before StartEpoch; DEADLINE_EXCEEDED when nothing arrived within `timeout` (nothing is
  // lost: call again); otherwise the stream's error (e.g. UNAVAILABLE when ferryd died),
  // after which the consumer is unusable until the next StartEpoch. GPU transport: once
  // ferryd is gone, batches it sent but not yet taken are dropped, not returned (their
  // device memory went with it): Next fails with UNAVAILABLE at once. Batches already taken
  // stay mapped, but their contents are undefined from then on.
  //
  // When ferryd went away and the client has a reattach patience (Client::set_reattach),
  // Next, StartEpoch and ResumeEpoch first take the job back on the ferryd that answers at
  // the client's address: they connect again, create the job again (as the client's
  // CreateJob did, with the samples quarantined through the client), attach as this rank
  // and GPU and go on with the epoch after the last batch Next returned, so no sample is
  // lost or repeated (the order is a function of the seed and the epoch). They fail with
  // the UNAVAILABLE, saying why the job was not taken back, once the patience is spent or
  // at an error that waiting does not cure; the next StartEpoch tries again.
  absl::StatusOr<std::optional<Batch>> Next(absl::Duration timeout = absl::InfiniteDuration());

 private:
  friend class Client;
  explicit Consumer(std::unique_ptr<internal::ConsumerImpl> impl);
  std::unique_ptr<internal::ConsumerImpl> impl_;
};

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_INCLUDE_FERRY_CONSUMER_H_
