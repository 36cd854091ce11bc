// ferry's C++ client: talks to a local ferryd over its Unix socket, creates jobs, and
// consumes batches straight out of the daemon's shared-memory slab (host transport, device
// "cpu") or out of device slots on the trainer's GPU (GPU transport, device "cuda:N"; see
// "GPU batches" below).
//
//   FERRY_ASSIGN_OR_RETURN(std::unique_ptr<ferry::Client> client,
//                          ferry::Client::Connect(""));          // default socket
//   ferry::v1::JobSpec spec;
//   spec.mutable_dataset()->mutable_image_folder()->set_root("/data/train");
//   ferry::v1::RandomResizedCrop* crop = spec.mutable_transform()->mutable_random_resized_crop();
//   crop->set_size(224);
//   crop->set_flip(true);
//   spec.set_batch_size(256);
//   FERRY_ASSIGN_OR_RETURN(ferry::v1::Job job, client->CreateJob(/*name=*/"", spec));
//   FERRY_ASSIGN_OR_RETURN(std::unique_ptr<ferry::Consumer> consumer,
//                          client->Attach(job.id(), /*rank=*/0));
//   FERRY_RETURN_IF_ERROR(consumer->StartEpoch(/*epoch=*/0, /*first_batch=*/0));
//   while (true) {
//     FERRY_ASSIGN_OR_RETURN(std::optional<ferry::Batch> batch, consumer->Next());
//     if (!batch) break;  // end of the epoch
//     const ferry::BatchField* image = batch->field("image");
//     ...                 // read image->data; the slot is given back when `batch` dies
//   }
//
// Job specs, jobs and status are the messages ferry.proto generates (ferry/v1/ferry.pb.h),
// the one description of them: a spec sets the fields it needs, and ferryd applies the
// defaults ferry.proto states for those it leaves unset. No gRPC type appears in this header
// (the implementation sits behind pImpl classes): users build against abseil and protobuf.
#ifndef FERRY_CLIENT_CPP_INCLUDE_FERRY_CLIENT_H_
#define FERRY_CLIENT_CPP_INCLUDE_FERRY_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/v1/dtype.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

// ---------------------------------------------------------------------------------------
// Epochs.

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

// ---------------------------------------------------------------------------------------
// Batches.

// One field of a batch: a contiguous, C-ordered [num_samples, *per-sample shape] array.
struct BatchField {
  std::string name;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;  // batch dimension first
  // Read-only; valid until the batch is released. Host memory when `device` is -1,
  // otherwise device memory on CUDA device `device` (this process's ordinal).
  const void* data = nullptr;
  size_t bytes = 0;
  int device = -1;
};

namespace internal {
class BatchLease;
class Connection;
class ConsumerImpl;
}  // namespace internal

// A view of one batch in the daemon's shared memory plus a lease on its slot. The lease
// is given back (Release on the stream) by Release() or the destructor, whichever comes
// first; afterwards the daemon may overwrite the memory, so `data` pointers must not be
// used. Move-only. A Batch may outlive its Consumer (releasing it is then a no-op, and
// its memory stays mapped until the batch dies).
//
// GPU batches (device() >= 0: the job's device is "cuda:..."). The fields are device
// memory in a slot of ferryd's ring on the trainer's GPU, mapped once per attach. The
// contract, all on CUDA streams of the caller's choosing (`stream` is a cudaStream_t;
// nullptr = the device's legacy default stream), with no host synchronisation:
//   1. WaitOn(stream) before any work that reads the fields is enqueued on `stream` (or on
//      a stream ordered after it). The data is not ready before: ferryd's copy may still
//      be running when Next returns.
//   2. ReleaseOn(stream) after the last work that reads the fields has been enqueued on
//      `stream`: it records the slot's "released" event there and gives the slot back;
//      ferryd writes the slot again only after that event has completed. Work on other
//      streams must be ordered before `stream`'s record (e.g. by an event) by the caller.
//   3. Release() and the destructor on a GPU batch mean ReleaseOn(the stream last passed to
//      WaitOn), or the legacy default stream when WaitOn was never called. That stream must
//      still exist.
// The device memory stays mapped while any Batch of the attach lives, even past the
// Consumer; after a release its contents may change at any time. A failed CUDA call
// (e.g. a lost context) returns its error and leaves the lease held, since giving the slot
// back without the event could let ferryd overwrite memory still being read; the slot is
// then reclaimed when the stream ends.
// For host batches WaitOn is a no-op and ReleaseOn is Release.
//
// Thread safety: a Batch is not synchronized; use one from one thread at a time. Batches
// of one consumer may be released concurrently from different threads.
class Batch final {
 public:
  Batch(Batch&&) noexcept;
  Batch& operator=(Batch&&) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }  // batch number within the epoch
  int64_t seq() const { return seq_; }      // position in the consumer's stream
  uint32_t slot() const { return slot_; }
  uint32_t num_samples() const { return num_samples_; }
  const std::vector<BatchField>& fields() const { return fields_; }
  // The field called `name`, or null.
  const BatchField* field(std::string_view name) const;

  // Gives the slot back. Idempotent: later calls return OK and do nothing. An error means
  // the release could not be sent because the stream is gone, in which case the daemon
  // has reclaimed the slot anyway.
  absl::Status Release();
  bool released() const;

  // CUDA device of the batch's fields (this process's ordinal), or -1 for host memory.
  int device() const { return device_; }
  // GPU batches: makes `stream` wait (on the device) until the batch is in its slot.
  // Returns at once. See the contract above.
  absl::Status WaitOn(void* stream);
  // GPU batches: records the slot's released event on `stream`, then gives the slot back.
  // Idempotent like Release. See the contract above.
  absl::Status ReleaseOn(void* stream);

 private:
  friend class internal::ConsumerImpl;
  Batch() = default;

  int64_t epoch_ = 0;
  int64_t index_ = 0;
  int64_t seq_ = 0;
  uint32_t slot_ = 0;
  uint32_t num_samples_ = 0;
  int device_ = -1;
  std::vector<BatchField> fields_;
  std::unique_ptr<internal::BatchLease> lease_;
};

// ---------------------------------------------------------------------------------------
// Consumer: one rank of one job.
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

// ---------------------------------------------------------------------------------------
// Client: one session with one ferryd.
//
// Thread safety: every method may be called concurrently. Consumers keep the session they
// need alive on their own, so a Client may be destroyed before its consumers.
class Client final {
 public:
  // Connects to ferryd's gRPC socket at `address` (a path, optionally prefixed "unix:");
  // empty means DefaultSocketPath(). Opens the session socket next to it and keeps it open
  // for the client's lifetime. NOT_FOUND / UNAVAILABLE when no ferryd answers there, with
  // the path looked at and how to start one.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(std::string_view address);

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The gRPC socket path in use.
  const std::string& address() const;
  // Pid the daemon reported in its HELLO.
  int daemon_pid() const;

  // Creates the job `name` of `spec`, or returns the existing one with the same name and
  // spec (all local ranks of a run share it). An empty name lets ferryd name the job after the
  // spec. ferryd applies the defaults of the fields the spec leaves unset, so the job's spec
  // is the spec with its defaults; INVALID_ARGUMENT naming the field it cannot take.
  absl::StatusOr<v1::Job> CreateJob(std::string_view name, const v1::JobSpec& spec);
  // The job with its ranks, errors and every quarantined sample.
  absl::StatusOr<v1::JobStatus> GetJob(std::string_view job_id);
  // The caller's jobs.
  absl::StatusOr<std::vector<v1::Job>> ListJobs();
  absl::Status DeleteJob(std::string_view job_id);
  // Asks ferryd to take no new jobs or attaches and to exit once the consumers attached now
  // are done (root or ferryd's own uid only). Returns how many consumers were attached.
  absl::StatusOr<uint32_t> Drain();
  // Quarantines samples of a job known to be bad elsewhere (a resume state taken on an
  // earlier ferryd): never read, substituted as its own bad samples are. Returns how many
  // were new. INVALID_ARGUMENT for an index outside the job's samples.
  absl::StatusOr<uint32_t> Quarantine(std::string_view job_id, const std::vector<int64_t>& indices);
  // The daemon (memory, NUMA nodes, GPUs, remote reads) and the caller's jobs with their ranks.
  absl::StatusOr<v1::GetStatusResponse> GetStatus();

  // The same answers as the proto3 JSON mapping (proto field names, every field printed),
  // of ferry.v1.Job (CreateJobJson, whose spec_json is a ferry.v1.JobSpec), JobStatus,
  // ListJobsResponse and GetStatusResponse: what the C ABI hands over.
  absl::StatusOr<std::string> CreateJobJson(std::string_view name, std::string_view spec_json);
  absl::StatusOr<std::string> GetJobJson(std::string_view job_id);
  absl::StatusOr<std::string> ListJobsJson();
  absl::StatusOr<std::string> GetStatusJson();

  // Attaches as `rank` of job `job_id` and opens the batch stream. Host transport: maps
  // the job's slab read-only. GPU transport: selects the local device with ferryd's PCI
  // bus id, opens every slot and ready event over CUDA IPC and creates the released
  // events, once for the attach's lifetime; FAILED_PRECONDITION naming the CUDA error when
  // this process cannot see that GPU or CUDA IPC fails (e.g. another IPC namespace), or
  // when this library was built without CUDA. Call StartEpoch on the result to receive
  // batches.
  absl::StatusOr<std::unique_ptr<Consumer>> Attach(std::string_view job_id, uint32_t rank);
  // The same for a GPU job's rank on GPU `device`: "cuda:<PCI bus id>" (CudaPciBusId of
  // this process's ordinal: the same GPU whatever CUDA_VISIBLE_DEVICES says) or "cuda:N"
  // (ferryd's ordinal). Needed for a job of device "cuda"; for one of device "cuda:N" it
  // overrides the spec's GPU. Every reattach of the consumer names the same device.
  absl::StatusOr<std::unique_ptr<Consumer>> Attach(std::string_view job_id, uint32_t rank,
                                                   std::string_view device);

  // How long Attach waits for a rank that another consumer holds (FAILED_PRECONDITION with
  // reason RANK_HELD) to be let go before it returns that refusal: a consumer closed just
  // before (a loader closed and made again, a trainer restarted) ends its stream
  // asynchronously, and ferryd may not have seen the end yet. The refusal names the
  // holder's pid. Zero: refused at once. Default: kHeldRankWait.
  static constexpr absl::Duration kHeldRankWait = absl::Seconds(5);
  void set_held_rank_wait(absl::Duration wait);

  // Consumers of jobs this client created (CreateJob, CreateJobJson) take their job back on
  // a new ferryd at the same address when theirs goes away (a restart by systemd, an
  // upgrade), trying for up to `patience` (see Consumer::Next). `before_reconnect`, when
  // set, runs before each attempt to connect again (a trainer that started its own ferryd
  // starts it again there); its error ends that attempt. A job id CreateJob returned keeps
  // naming the job created again, in every call of this client. Zero patience (the
  // default): a consumer whose ferryd went away fails with UNAVAILABLE at once.
  void set_reattach(absl::Duration patience,
                    std::function<absl::Status()> before_reconnect = nullptr);

 private:
  explicit Client(std::shared_ptr<internal::Connection> impl);
  std::shared_ptr<internal::Connection> impl_;
};

// PCI bus id ("0000:3b:00.0", lower case) of this process's CUDA device `ordinal`, the
// form to send as device "cuda:<bus id>" so that ferryd picks the same GPU whatever
// CUDA_VISIBLE_DEVICES says. INVALID_ARGUMENT for an ordinal this process does not have;
// FAILED_PRECONDITION without a usable device or driver, or when built without CUDA.
absl::StatusOr<std::string> CudaPciBusId(int ordinal);

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_INCLUDE_FERRY_CLIENT_H_
