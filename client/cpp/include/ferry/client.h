// ferry's C++ client: talks to a local ferryd over its Unix socket, creates jobs, and
// consumes batches straight out of the daemon's shared-memory slab (host transport, device
// "cpu") or out of device slots on the trainer's GPU (GPU transport, device "cuda:N"; see
// "GPU batches" in ferry/batch.h).
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
//
// This header declares the Client and includes the rest of the API: ferry/consumer.h
// (Consumer), ferry/batch.h (Batch, BatchField), ferry/epoch.h (EpochRange, EpochProgress)
// and the messages, ferry/v1/ferry.pb.h with ferry/v1/dtype.h (DTypeSize, DTypeName).
#ifndef FERRY_CLIENT_CPP_INCLUDE_FERRY_CLIENT_H_
#define FERRY_CLIENT_CPP_INCLUDE_FERRY_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/batch.h"
#include "ferry/consumer.h"
#include "ferry/epoch.h"
#include "ferry/v1/dtype.h"
#include "ferry/v1/ferry.pb.h"

namespace ferry {

namespace internal {
class Connection;
}  // namespace internal

// One session with one ferryd.
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
  // spec. `spec` is sent as it is: ferryd applies the defaults ferry.proto states for the
  // fields it leaves unset (the returned Job's spec shows those that decide which job it is,
  // such as world_size and device). INVALID_ARGUMENT naming a field ferryd cannot take.
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
