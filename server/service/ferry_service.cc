#include "server/service/ferry_service.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/batch_channel.h"
#include "common/error_reason.h"
#include "common/logging.h"
#include "common/session_protocol.h"

namespace ferry {
namespace {

// Finishes a unary call with `status`, its reason (common/error_reason.h) in the trailing
// metadata.
void FinishUnary(grpc::CallbackServerContext* context, grpc::ServerUnaryReactor* reactor,
                 const absl::Status& status) {
  if (const std::string reason = ReasonOf(status); !reason.empty()) {
    context->AddTrailingMetadata(kReasonMetadataKey, reason);
  }
  reactor->Finish(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context,
                                     const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishUnary(context, reactor, status);
  return reactor;
}

// One Consume stream: binds to a rank's pipeline on Open and forwards its batches. Owns
// itself; deleted in OnDone after the pipeline has been unbound.
//
// With a batch channel (Open.channel) the batches go out as channel messages and the
// trainer's StartEpoch and Release come in through the channel, read by the ChannelPoller's
// thread (DrainChannel); the stream then only opens, ends, and carries the final status.
class ConsumeReactor final
    : public grpc::ServerBidiReactor<ferry::v1::ConsumeRequest, ferry::v1::ConsumeResponse>,
      public BatchConsumer {
 public:
  ConsumeReactor(JobManager* jobs, SessionServer* sessions, ChannelPoller* poller,
                 absl::StatusOr<Caller> caller, std::string token)
      : jobs_(jobs),
        sessions_(sessions),
        poller_(poller),
        caller_(std::move(caller)),
        token_(std::move(token)) {
    if (!caller_.ok()) {
      FinishOnce(caller_.status());
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side or went away
      FinishOnce(absl::OkStatus());
      return;
    }
    absl::Status status = Handle(request_);
    if (!status.ok()) {
      FinishOnce(status);
      return;
    }
    StartRead(&request_);
  }

  void OnBatchReady(const ferry::v1::BatchReady& batch) override {
    if (channel_ != nullptr) {
      ChannelMessage m;
      m.kind = ChannelMessage::kBatchReady;
      m.slot = batch.slot();
      m.seq = batch.seq();
      m.epoch = batch.epoch();
      m.batch = batch.batch();
      m.num_samples = batch.num_samples();
      SendToChannel(m);
      return;
    }
    ferry::v1::ConsumeResponse response;
    *response.mutable_batch() = batch;
    Enqueue(std::move(response));
  }

  void OnEpochEnd(int64_t epoch) override {
    if (channel_ != nullptr) {
      ChannelMessage m;
      m.kind = ChannelMessage::kEpochEnd;
      m.epoch = epoch;
      SendToChannel(m);
      return;
    }
    ferry::v1::ConsumeResponse response;
    response.mutable_epoch_end()->set_epoch(epoch);
    Enqueue(std::move(response));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mutex_);
    writing_ = false;
    if (!ok) return;  // the stream is broken; OnDone follows
    outbox_.pop_front();
    WriteNextLocked();
  }

  void OnShutdown(const absl::Status& reason) override { FinishOnce(reason); }

  bool via_channel() const override { return channel_ != nullptr; }

  void OnCancel() override { FinishOnce(absl::CancelledError("consumer cancelled")); }

  void OnDone() override {
    // First the channel (its handler calls into this reactor and the pipeline), then the
    // pipeline (its callbacks do).
    if (poll_id_ != 0) poller_->Remove(poll_id_);
    if (pipeline_ != nullptr) pipeline_->Unbind(this);
    delete this;
  }

 private:
  absl::Status Handle(const ferry::v1::ConsumeRequest& request) {
    if (request.releases_size() > 0 && !request.has_release()) {
      return absl::InvalidArgumentError(
          "ConsumeRequest.releases without release: put the first release in `release` and "
          "the ones after it in `releases` (docs/protocol.md)");
    }
    switch (request.kind_case()) {
      case ferry::v1::ConsumeRequest::kOpen: {
        if (pipeline_ != nullptr) return absl::FailedPreconditionError("stream already open");
        const std::string& attach_id = request.open().attach_id();
        auto pipeline = jobs_->FindAttachment(*caller_, attach_id);
        if (!pipeline.ok()) return pipeline.status();
        if (request.open().channel()) {
          // Set before Bind: the pipeline's first callback may follow it at once.
          channel_ = sessions_->TakeChannel(token_, attach_id);
          if (channel_ == nullptr) {
            return absl::FailedPreconditionError(absl::StrCat(
                "Open.channel is set but this session fetched no batch channel for attachment ",
                attach_id, ": send 'CHANNEL ", attach_id,
                "' on the session socket first (docs/protocol.md)"));
          }
        }
        const auto& events = request.open().released_events();
        absl::Status bound = (*pipeline)->Bind(
            this, caller_->pid, std::vector<std::string>(events.begin(), events.end()));
        if (!bound.ok()) return bound;
        pipeline_ = *std::move(pipeline);
        if (channel_ != nullptr) {
          absl::StatusOr<uint64_t> id =
              poller_->Add(channel_->wake_fd(), [this](uint64_t id) { DrainChannel(id); });
          if (!id.ok()) return id.status();
          poll_id_ = *id;
        }
        return absl::OkStatus();
      }
      case ferry::v1::ConsumeRequest::kStartEpoch:
        if (pipeline_ == nullptr) return absl::FailedPreconditionError("send Open first");
        return pipeline_->StartEpoch(this, request.start_epoch().epoch(),
                                     request.start_epoch().first_batch());
      case ferry::v1::ConsumeRequest::kRelease: {
        if (pipeline_ == nullptr) return absl::FailedPreconditionError("send Open first");
        absl::Status s = Release(request.release());
        for (int i = 0; s.ok() && i < request.releases_size(); ++i) {
          s = Release(request.releases(i));
        }
        return s;
      }
      default:
        return absl::InvalidArgumentError("empty ConsumeRequest");
    }
  }

  absl::Status Release(const ferry::v1::ConsumeRequest::Release& release) {
    return pipeline_->Release(
        this, release.slot(), release.seq(), release.complete(),
        release.has_wait_us() ? std::optional(ReportedWait(release.wait_us())) : std::nullopt);
  }

  // A wait the trainer reported (its own figure: bounded, so a nonsense value skews only
  // its own rank's status, and no further than a window).
  static absl::Duration ReportedWait(int64_t wait_us) {
    return std::clamp(absl::Microseconds(wait_us), absl::ZeroDuration(), absl::Hours(1));
  }

  // Runs on the ChannelPoller's thread: handles what the trainer sent through the channel,
  // until the ring is empty and the poller may sleep on it, or until one ring's worth was
  // handled: then the other channels get their turn first (one busy or hostile trainer
  // must not starve the others).
  void DrainChannel(uint64_t poll_id) {
    channel_->ClearWakeups();
    if (channel_failed_.load()) {  // SendToChannel failed and ended the stream
      poller_->Remove(poll_id);    // a closed wake socket would stay readable: no spinning
      return;
    }
    absl::Status status;
    for (uint32_t handled = 0; status.ok(); ++handled) {
      if (handled == channel_->capacity()) {
        poller_->RunAgain(poll_id);
        return;
      }
      ChannelMessage m;
      absl::StatusOr<bool> got = channel_->Receive(&m);
      status = got.status();
      if (status.ok() && !*got) {
        if (channel_->peer_closed()) {
          status = absl::CancelledError(
              "the trainer closed its batch channel (it exited or gave the stream up)");
          break;
        }
        if (channel_->PrepareToSleep()) return;
        continue;
      }
      if (status.ok()) {
        status = HandleChannelMessage(m);
      } else {
        status = absl::Status(
            status.code(), absl::StrCat("reading the trainer's batch channel: ", status.message()));
      }
    }
    channel_failed_.store(true);
    poller_->Remove(poll_id);  // from the handler itself: no more calls, returns at once
    // OnDone may follow on gRPC's thread at once; its Remove waits for this handler to
    // return before the reactor is deleted.
    FinishOnce(status);
  }

  absl::Status HandleChannelMessage(const ChannelMessage& m) {
    switch (m.kind) {
      case ChannelMessage::kStartEpoch:
        return pipeline_->StartEpoch(this, m.epoch, m.batch);
      case ChannelMessage::kRelease:
        return pipeline_->Release(
            this, m.slot, m.seq, (m.flags & ChannelMessage::kReleaseComplete) != 0,
            (m.flags & ChannelMessage::kReleaseWaited) != 0 ? std::optional(ReportedWait(m.batch))
                                                            : std::nullopt);
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("the trainer sent a batch channel message of kind ", m.kind,
                         "; a trainer sends StartEpoch (3) and Release (4) only"));
    }
  }

  // Pipeline callbacks never overlap, so this is the channel's only sender. Under the
  // lock that Finish takes: nothing enters the channel once the stream is finished, so a
  // trainer that sees the stream's end has already been sent all there will be.
  void SendToChannel(const ChannelMessage& m) {
    absl::MutexLock lock(&mutex_);
    if (finished_) return;
    absl::Status sent = channel_->Send(m);
    if (sent.ok()) return;
    channel_failed_.store(true);
    FinishLocked(absl::Status(
        sent.code(), absl::StrCat("sending to the trainer's batch channel: ", sent.message())));
  }

  void Enqueue(ferry::v1::ConsumeResponse response) {
    absl::MutexLock lock(&mutex_);
    if (finished_) return;
    outbox_.push_back(std::move(response));
    WriteNextLocked();
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (writing_ || finished_ || outbox_.empty()) return;
    // Coalesce the batches queued behind the first one into its message.
    // (Only the deque's ends are touched: erasing inside it would invalidate the head.)
    if (outbox_.front().has_batch() && outbox_.size() > 1) {
      ferry::v1::ConsumeResponse head = std::move(outbox_.front());
      outbox_.pop_front();
      while (!outbox_.empty() && outbox_.front().has_batch()) {
        *head.add_batches() = std::move(*outbox_.front().mutable_batch());
        outbox_.pop_front();
      }
      outbox_.push_front(std::move(head));
    }
    writing_ = true;
    StartWrite(&outbox_.front());
  }

  void FinishOnce(const absl::Status& status) {
    absl::MutexLock lock(&mutex_);
    FinishLocked(status);
  }

  void FinishLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    if (finished_) return;
    finished_ = true;
    Finish(ToGrpcStatus(status));
  }

  JobManager* const jobs_;
  SessionServer* const sessions_;
  ChannelPoller* const poller_;
  const absl::StatusOr<Caller> caller_;
  const std::string token_;
  ferry::v1::ConsumeRequest request_;       // touched by the read chain only
  std::shared_ptr<RankPipeline> pipeline_;  // set once by the read chain, read in OnDone
  // Set once by the read chain on Open, before the pipeline or the poller can use them.
  std::shared_ptr<BatchChannel> channel_;
  uint64_t poll_id_ = 0;
  std::atomic<bool> channel_failed_{false};

  absl::Mutex mutex_;
  // Bounded: at most one BatchReady per slot plus an EpochEnd are ever outstanding.
  std::deque<ferry::v1::ConsumeResponse> outbox_ ABSL_GUARDED_BY(mutex_);
  bool writing_ ABSL_GUARDED_BY(mutex_) = false;
  bool finished_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

FerryService::FerryService(JobManager* jobs, SessionServer* sessions, ChannelPoller* channels,
                           DaemonStatusFiller daemon_status, Drainer drainer)
    : jobs_(jobs),
      sessions_(sessions),
      channels_(channels),
      daemon_status_(std::move(daemon_status)),
      drainer_(std::move(drainer)) {}

std::string FerryService::SessionToken(grpc::CallbackServerContext* context) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kSessionMetadataKey);
  if (it == metadata.end()) return std::string();
  return std::string(it->second.data(), it->second.size());
}

absl::StatusOr<Caller> FerryService::Authenticate(grpc::CallbackServerContext* context) const {
  const std::string token = SessionToken(context);
  if (token.empty()) {
    return absl::UnauthenticatedError(
        "call carries no ferry session; connect through the ferry client library (it opens the "
        "session socket next to the gRPC socket)");
  }
  std::optional<PeerCredentials> peer = sessions_->Lookup(token);
  if (!peer.has_value()) {
    return absl::UnauthenticatedError("unknown or closed ferry session; reconnect");
  }
  return Caller{peer->uid, peer->pid};
}

namespace {

// The call's deadline; InfiniteFuture when the client set none.
absl::Time Deadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

}  // namespace

grpc::ServerUnaryReactor* FerryService::CreateJob(grpc::CallbackServerContext* context,
                                                  const ferry::v1::CreateJobRequest* request,
                                                  ferry::v1::CreateJobResponse* response) {
  auto caller = Authenticate(context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Opening the dataset may take long: off the reactor (HandlerPool).
  slow_handlers_.Run(
      caller->uid, Deadline(context),
      [this, reactor, caller = *caller, request, response](absl::Status ready) {
        if (!ready.ok()) return reactor->Finish(ToGrpcStatus(ready));
        std::optional<AwsCredentials> credentials;
        if (request->has_store_credentials()) {
          const ferry::v1::StoreCredentials& given = request->store_credentials();
          if (given.access_key_id().empty() || given.secret_access_key().empty()) {
            return reactor->Finish(ToGrpcStatus(
                absl::InvalidArgumentError("store_credentials need both access_key_id and "
                                           "secret_access_key")));
          }
          credentials = AwsCredentials{given.access_key_id(), given.secret_access_key(),
                                       given.session_token()};
        }
        auto created = jobs_->CreateJob(caller, request->name(), request->spec(), credentials);
        if (!created.ok()) return reactor->Finish(ToGrpcStatus(created.status()));
        created->job->ToProto(response->mutable_job());
        response->set_created(created->created);
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* FerryService::GetJob(grpc::CallbackServerContext* context,
                                               const ferry::v1::GetJobRequest* request,
                                               ferry::v1::JobStatus* response) {
  auto caller = Authenticate(context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  auto job = jobs_->GetJob(*caller, request->job_id());
  if (!job.ok()) return FinishWith(context, job.status());
  jobs_->FillJobStatus(**job, response);
  for (int64_t index : (*job)->quarantined_indices()) response->add_quarantined_indices(index);
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* FerryService::Quarantine(grpc::CallbackServerContext* context,
                                                   const ferry::v1::QuarantineRequest* request,
                                                   ferry::v1::QuarantineResponse* response) {
  auto caller = Authenticate(context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  auto added = jobs_->Quarantine(*caller, request->job_id(),
                                 {request->indices().begin(), request->indices().end()});
  if (added.ok()) response->set_added(static_cast<uint32_t>(*added));
  return FinishWith(context, added.status());
}

grpc::ServerUnaryReactor* FerryService::ResumeEpoch(grpc::CallbackServerContext* context,
                                                    const ferry::v1::ResumeEpochRequest* request,
                                                    ferry::v1::ResumeEpochResponse* response) {
  auto caller = Authenticate(context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  std::vector<PositionRange> consumed;
  consumed.reserve(static_cast<size_t>(request->consumed_size()));
  for (const ferry::v1::PositionRange& r : request->consumed()) {
    consumed.push_back({r.begin(), r.end()});
  }
  auto batches =
      jobs_->ResumeEpoch(*caller, request->attach_id(), request->epoch(), std::move(consumed));
  if (batches.ok()) response->set_batches(*batches);
  return FinishWith(context, batches.status());
}

grpc::ServerUnaryReactor* FerryService::ListJobs(grpc::CallbackServerContext* context,
                                                 const ferry::v1::ListJobsRequest* request,
                                                 ferry::v1::ListJobsResponse* response) {
  auto caller = Authenticate(context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  for (const auto& job : jobs_->ListJobs(*caller)) job->ToProto(response->add_jobs());
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* FerryService::DeleteJob(grpc::CallbackServerContext* context,
                                                  const ferry::v1::DeleteJobRequest* request,
                                                  ferry::v1::DeleteJobResponse* response) {
  auto caller = Authenticate(context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  return FinishWith(context, jobs_->DeleteJob(*caller, request->job_id()));
}

grpc::ServerUnaryReactor* FerryService::Attach(grpc::CallbackServerContext* context,
                                               const ferry::v1::AttachRequest* request,
                                               ferry::v1::AttachResponse* response) {
  auto caller = Authenticate(context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // A slab is allocated, bound and (for a GPU) registered: off the reactor (HandlerPool).
  slow_handlers_.Run(
      caller->uid, Deadline(context),
      [this, context, reactor, caller = *caller, request, response](absl::Status ready) {
        if (!ready.ok()) return FinishUnary(context, reactor, ready);
        auto attached =
            jobs_->Attach(caller, request->job_id(), request->rank(), request->device());
        if (!attached.ok()) return FinishUnary(context, reactor, attached.status());
        response->set_attach_id(attached->attach_id);
        attached->pipeline->job().ToProto(response->mutable_job());
        response->set_num_slots(static_cast<uint32_t>(attached->pipeline->num_slots()));
        response->set_slot_bytes(attached->pipeline->job().layout().slot_bytes);
        attached->pipeline->ring().Describe(response);  // the transport, and its slot_bytes
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerBidiReactor<ferry::v1::ConsumeRequest, ferry::v1::ConsumeResponse>*
FerryService::Consume(grpc::CallbackServerContext* context) {
  return new ConsumeReactor(jobs_, sessions_, channels_, Authenticate(context),
                            SessionToken(context));
}

grpc::ServerUnaryReactor* FerryService::GetStatus(grpc::CallbackServerContext* context,
                                                  const ferry::v1::GetStatusRequest* request,
                                                  ferry::v1::GetStatusResponse* response) {
  daemon_status_(response->mutable_daemon());
  // Without a session (TCP, grpcurl) only the daemon's own status is shown.
  auto caller = Authenticate(context);
  if (caller.ok()) {
    for (const auto& job : jobs_->ListJobs(*caller))
      jobs_->FillJobStatus(*job, response->add_jobs());
  }
  return FinishWith(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* FerryService::Drain(grpc::CallbackServerContext* context,
                                              const ferry::v1::DrainRequest* request,
                                              ferry::v1::DrainResponse* response) {
  auto caller = Authenticate(context);
  if (!caller.ok()) return FinishWith(context, caller.status());
  absl::StatusOr<uint32_t> consumers = drainer_(*caller);
  if (consumers.ok()) response->set_consumers(*consumers);
  return FinishWith(context, consumers.status());
}

}  // namespace ferry
