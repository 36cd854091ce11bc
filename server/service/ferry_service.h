// The gRPC edge of ferryd: translates ferry.v1.Ferry calls into JobManager calls, converting
// absl::Status to grpc::Status here and nowhere else. Uses the callback API: unary handlers
// finish inline; Consume is a bidi reactor that owns its per-stream state and never blocks.
// A Consume stream opened with a batch channel moves its batches and releases through that
// channel (common/batch_channel.h), read on the ChannelPoller's thread.
#ifndef FERRY_SERVER_SERVICE_FERRY_SERVICE_H_
#define FERRY_SERVER_SERVICE_FERRY_SERVICE_H_

#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "ferry/v1/ferry.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/service/channel_poller.h"
#include "server/service/handler_pool.h"
#include "server/service/job_manager.h"
#include "server/service/session_server.h"

namespace ferry {

grpc::Status ToGrpcStatus(const absl::Status& status);

class FerryService final : public ferry::v1::Ferry::CallbackService {
 public:
  using DaemonStatusFiller = std::function<void(ferry::v1::DaemonStatus*)>;
  // Starts a drain for `caller` (Daemon checks who may): the consumers attached, or an error.
  using Drainer = std::function<absl::StatusOr<uint32_t>(const Caller& caller)>;

  FerryService(JobManager* jobs, SessionServer* sessions, ChannelPoller* channels,
               DaemonStatusFiller daemon_status, Drainer drainer);

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* context,
                                      const ferry::v1::CreateJobRequest* request,
                                      ferry::v1::CreateJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const ferry::v1::GetJobRequest* request,
                                   ferry::v1::JobStatus* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const ferry::v1::ListJobsRequest* request,
                                     ferry::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const ferry::v1::DeleteJobRequest* request,
                                      ferry::v1::DeleteJobResponse* response) override;
  grpc::ServerUnaryReactor* Attach(grpc::CallbackServerContext* context,
                                   const ferry::v1::AttachRequest* request,
                                   ferry::v1::AttachResponse* response) override;
  grpc::ServerBidiReactor<ferry::v1::ConsumeRequest, ferry::v1::ConsumeResponse>* Consume(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const ferry::v1::GetStatusRequest* request,
                                      ferry::v1::GetStatusResponse* response) override;
  grpc::ServerUnaryReactor* Quarantine(grpc::CallbackServerContext* context,
                                       const ferry::v1::QuarantineRequest* request,
                                       ferry::v1::QuarantineResponse* response) override;
  grpc::ServerUnaryReactor* ResumeEpoch(grpc::CallbackServerContext* context,
                                        const ferry::v1::ResumeEpochRequest* request,
                                        ferry::v1::ResumeEpochResponse* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const ferry::v1::DrainRequest* request,
                                  ferry::v1::DrainResponse* response) override;

  // CreateJob and Attach calls still waiting for a handler thread end with UNAVAILABLE, and
  // so do later ones; waits for those running. Before the server shuts down (it waits for
  // every call to finish).
  void StopSlowHandlers() { slow_handlers_.Stop(); }

  // Threads that run CreateJob and Attach (HandlerPool).
  static constexpr int kSlowHandlerThreads = 4;

 private:
  // The caller's session token (ferry-session metadata); empty without one.
  static std::string SessionToken(grpc::CallbackServerContext* context);
  // The caller's credentials from its session token; UNAUTHENTICATED without one.
  absl::StatusOr<Caller> Authenticate(grpc::CallbackServerContext* context) const;

  JobManager* const jobs_;
  SessionServer* const sessions_;
  ChannelPoller* const channels_;
  const DaemonStatusFiller daemon_status_;
  const Drainer drainer_;
  HandlerPool slow_handlers_{kSlowHandlerThreads, "ferry-handler"};
};

}  // namespace ferry

#endif  // FERRY_SERVER_SERVICE_FERRY_SERVICE_H_
