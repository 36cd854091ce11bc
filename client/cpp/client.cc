// ferry::Client, Consumer and Batch over gRPC (see ferry/client.h for the contracts).
#include "ferry/client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <iterator>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/internal/cuda_ring.h"
#include "client/cpp/internal/json.h"
#include "client/cpp/internal/layout.h"
#include "client/cpp/internal/rpc.h"
#include "client/cpp/internal/session.h"
#include "client/cpp/internal/store_credentials.h"
#include "common/batch_channel.h"
#include "common/epoch_layout.h"
#include "common/error_reason.h"
#include "common/session_protocol.h"
#include "common/status_macros.h"
#include "common/thread_name.h"
#include "ferry/v1/ferry.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace ferry {
namespace internal {
namespace {

// Unary calls that only read or delete state answer from memory; anything slower means a
// wedged daemon. CreateJob (scans a dataset) and Attach (allocates a slab) get no deadline.
constexpr absl::Duration kQuickCallDeadline = absl::Seconds(30);
// How long a reattaching consumer waits for ferryd to notice that its previous stream ended.
constexpr absl::Duration kReattachPatience = absl::Seconds(5);

// Batches travel through a shared-memory batch channel unless FERRY_BATCH_CHANNEL=grpc
// (or 0) keeps them on the gRPC stream: for comparing the two and for debugging.
bool UseBatchChannel() {
  const char* value = std::getenv("FERRY_BATCH_CHANNEL");
  if (value == nullptr) return true;
  const std::string_view v(value);
  return !(v == "grpc" || v == "0");
}

}  // namespace

// Shared by a Client and all its consumers. Thread-safe: everything is constant after
// construction (the stub and the session are themselves thread-safe).
class ClientImpl {
 public:
  ClientImpl(std::string address, std::unique_ptr<Session> session)
      : address_(std::move(address)),
        session_(std::move(session)),
        channel_(grpc::CreateCustomChannel(absl::StrCat("unix:", address_),
                                           grpc::InsecureChannelCredentials(), ChannelArgs())),
        stub_(v1::Ferry::NewStub(channel_)) {}

  const std::string& address() const { return address_; }
  Session& session() const { return *session_; }

  // A connection of this client's own: gRPC's process-wide subchannel pool would hand a new
  // Client the connection of an earlier one, which after a ferryd restart is a dead socket
  // until gRPC notices (the new client's first call failing with "Broken pipe").
  static grpc::ChannelArguments ChannelArgs() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return args;
  }
  v1::Ferry::Stub& stub() const { return *stub_; }

  // Adds the session token (and for quick calls a deadline) to a call's context.
  void Prepare(grpc::ClientContext* context, bool quick) const {
    context->AddMetadata(kSessionMetadataKey, session_->token());
    if (quick) context->set_deadline(absl::ToChronoTime(absl::Now() + kQuickCallDeadline));
  }
  // Prefix for transport errors of `rpc`.
  std::string Context(std::string_view rpc) const {
    return absl::StrCat(std::string(rpc), " to ferryd at ", address_);
  }

  // The unary call `rpc` (named `name` in its errors) with this session's token, and with a
  // deadline when `quick`.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(grpc::Status (v1::Ferry::Stub::*rpc)(grpc::ClientContext*,
                                                                     const Request&, Response*),
                                std::string_view name, const Request& request,
                                bool quick = true) const {
    grpc::ClientContext context;
    Prepare(&context, quick);
    Response response;
    grpc::Status status = (stub_.get()->*rpc)(&context, request, &response);
    if (!status.ok()) return FromGrpc(status, Context(name));
    return response;
  }

 private:
  const std::string address_;
  const std::unique_ptr<Session> session_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Ferry::Stub> stub_;
};

namespace {

absl::StatusOr<v1::Job> CallCreateJob(const ClientImpl& impl, const v1::CreateJobRequest& request) {
  FERRY_ASSIGN_OR_RETURN(
      v1::CreateJobResponse response,
      impl.Call(&v1::Ferry::Stub::CreateJob, "CreateJob", request, /*quick=*/false));
  return std::move(*response.mutable_job());
}

absl::StatusOr<v1::JobStatus> CallGetJob(const ClientImpl& impl, std::string_view job_id) {
  v1::GetJobRequest request;
  request.set_job_id(std::string(job_id));
  return impl.Call(&v1::Ferry::Stub::GetJob, "GetJob", request);
}

absl::StatusOr<v1::ListJobsResponse> CallListJobs(const ClientImpl& impl) {
  return impl.Call(&v1::Ferry::Stub::ListJobs, "ListJobs", v1::ListJobsRequest());
}

absl::StatusOr<v1::GetStatusResponse> CallGetStatus(const ClientImpl& impl) {
  return impl.Call(&v1::Ferry::Stub::GetStatus, "GetStatus", v1::GetStatusRequest());
}

// A GPU job in this client's form (device "cuda", each rank naming its GPU at attach) goes
// only to a ferryd that understands it: an older one would read the spec otherwise.
absl::Status CheckDaemonTakes(const ClientImpl& impl, const v1::JobSpec& spec) {
  if (spec.device() != "cuda") return absl::OkStatus();
  FERRY_ASSIGN_OR_RETURN(v1::GetStatusResponse status, CallGetStatus(impl));
  if (status.daemon().protocol() >= kSharedGpuJobsProtocol) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "ferryd at ", impl.address(), " (pid ", status.daemon().pid(), ", version ",
      status.daemon().version().empty() ? "unknown" : status.daemon().version(),
      ") is older than this ferry client: it cannot serve a GPU job whose ranks name their "
      "own GPUs (device \"cuda\"). Restart ferryd from this ferry's package (ferryctl drain, "
      "then start it again), or use the ferry client that came with that ferryd"));
}

// A spec that reads s3:// objects goes with the trainer's credentials, when it has some
// (internal/store_credentials.h), so the job reads as this user and not as ferryd.
absl::StatusOr<v1::Job> CreateChecked(const ClientImpl& impl, v1::CreateJobRequest request) {
  FERRY_RETURN_IF_ERROR(CheckDaemonTakes(impl, request.spec()));
  if (SpecReadsS3(request.spec()) && !request.has_store_credentials()) {
    FERRY_ASSIGN_OR_RETURN(std::optional<v1::StoreCredentials> mine,
                           TrainerStoreCredentials(std::getenv));
    if (mine.has_value()) *request.mutable_store_credentials() = *std::move(mine);
  }
  return CallCreateJob(impl, request);
}

absl::StatusOr<uint32_t> CallQuarantine(const ClientImpl& impl, std::string_view job_id,
                                        const std::vector<int64_t>& indices) {
  v1::QuarantineRequest request;
  request.set_job_id(std::string(job_id));
  request.mutable_indices()->Add(indices.begin(), indices.end());
  FERRY_ASSIGN_OR_RETURN(v1::QuarantineResponse response,
                         impl.Call(&v1::Ferry::Stub::Quarantine, "Quarantine", request));
  return response.added();
}

}  // namespace

// The client's link to the ferryd at its address, across restarts of that ferryd: the
// session and channel in use (a ClientImpl, replaced by a new one once ferryd is gone), and
// what taking a job back on a new ferryd needs: the CreateJob request of each job this
// client created, the samples quarantined through it, and the job's id on the ferryd of now
// (a job created again gets a new id; the one CreateJob returned keeps naming it here).
//
// Thread-safe.
class Connection {
 public:
  explicit Connection(std::shared_ptr<const ClientImpl> first)
      : address_(first->address()), current_(std::move(first)) {}

  const std::string& address() const { return address_; }

  // The session in use and its generation (how many times this connection connected again).
  std::pair<std::shared_ptr<const ClientImpl>, uint64_t> current() const {
    absl::MutexLock lock(&mu_);
    return {current_, generation_};
  }

  // The id that CreateJob first returned for the job `id` names (`id` itself for a job this
  // client did not create).
  std::string Original(std::string_view id) const {
    absl::MutexLock lock(&mu_);
    auto alias = aliases_.find(Key(id));
    return alias != aliases_.end() ? alias->second : std::string(id);
  }
  // The job's id on the ferryd of now.
  std::string IdNow(std::string_view id) const {
    absl::MutexLock lock(&mu_);
    auto alias = aliases_.find(Key(id));
    auto job = jobs_.find(alias != aliases_.end() ? alias->second : std::string(id));
    return job != jobs_.end() ? job->second.id_now : std::string(id);
  }
  bool Recreatable(std::string_view original) const {
    absl::MutexLock lock(&mu_);
    return jobs_.contains(Key(original));
  }

  // CreateJob with `request` (as the caller gave it: credentials from the environment are
  // read again when it is sent again) returned job `id`.
  void NoteCreated(const std::string& id, v1::CreateJobRequest request) {
    absl::MutexLock lock(&mu_);
    if (aliases_.contains(id)) return;  // the same job, created again on this ferryd
    Created& job = jobs_[id];
    job.request = std::move(request);
    job.id_now = id;
    job.generation = generation_;
  }
  void NoteQuarantined(std::string_view id, const std::vector<int64_t>& indices) {
    absl::MutexLock lock(&mu_);
    auto alias = aliases_.find(Key(id));
    auto job = jobs_.find(alias != aliases_.end() ? alias->second : std::string(id));
    if (job != jobs_.end()) job->second.quarantined.insert(indices.begin(), indices.end());
  }

  // After a call on the session of generation `failed` found ferryd gone: a session with the
  // ferryd that answers at the address now, and its generation (connecting once for every
  // consumer whose stream broke, after the reconnect hook).
  absl::StatusOr<std::pair<std::shared_ptr<const ClientImpl>, uint64_t>> Reconnect(
      uint64_t failed) {
    absl::MutexLock serial(&reconnect_mu_);
    auto now = current();
    if (now.second != failed) return now;  // another consumer connected again
    if (before_reconnect_) FERRY_RETURN_IF_ERROR(before_reconnect_());
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, Session::Open(address_));
    auto client = std::make_shared<const ClientImpl>(address_, std::move(session));
    absl::MutexLock lock(&mu_);
    current_ = client;
    return std::make_pair(std::move(client), ++generation_);
  }

  // The id, on the ferryd of `client` (of `generation`), of the job this client created as
  // `original`: created there again, once, with the samples quarantined through this client.
  absl::StatusOr<std::string> JobOn(const ClientImpl& client, uint64_t generation,
                                    const std::string& original) {
    absl::MutexLock serial(&reconnect_mu_);  // one creation at a time
    v1::CreateJobRequest request;
    std::vector<int64_t> quarantined;
    {
      absl::MutexLock lock(&mu_);
      const Created& job = jobs_.at(original);
      if (job.generation == generation) return job.id_now;
      request = job.request;
      quarantined.assign(job.quarantined.begin(), job.quarantined.end());
    }
    FERRY_ASSIGN_OR_RETURN(v1::Job created, CreateChecked(client, request));
    if (!quarantined.empty()) {
      FERRY_RETURN_IF_ERROR(CallQuarantine(client, created.id(), quarantined).status());
    }
    absl::MutexLock lock(&mu_);
    Created& job = jobs_.at(original);
    job.id_now = created.id();
    job.generation = generation;
    aliases_[created.id()] = original;
    return created.id();
  }

  absl::Duration held_rank_wait() const {
    absl::MutexLock lock(&mu_);
    return held_rank_wait_;
  }
  void set_held_rank_wait(absl::Duration wait) {
    absl::MutexLock lock(&mu_);
    held_rank_wait_ = std::max(wait, absl::ZeroDuration());
  }
  absl::Duration reattach_patience() const {
    absl::MutexLock lock(&mu_);
    return reattach_patience_;
  }
  void set_reattach(absl::Duration patience, std::function<absl::Status()> before_reconnect) {
    absl::MutexLock serial(&reconnect_mu_);
    absl::MutexLock lock(&mu_);
    reattach_patience_ = std::max(patience, absl::ZeroDuration());
    before_reconnect_ = std::move(before_reconnect);
  }

 private:
  static absl::string_view Key(std::string_view id) { return {id.data(), id.size()}; }

  struct Created {
    v1::CreateJobRequest request;
    std::string id_now;       // on the ferryd of `generation`
    uint64_t generation = 0;  // of the session the job was last created on
    std::set<int64_t> quarantined;
  };

  const std::string address_;
  absl::Mutex reconnect_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::function<absl::Status()> before_reconnect_ ABSL_GUARDED_BY(reconnect_mu_);
  mutable absl::Mutex mu_;
  std::shared_ptr<const ClientImpl> current_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, Created> jobs_ ABSL_GUARDED_BY(mu_);  // by original id
  absl::flat_hash_map<std::string, std::string> aliases_
      ABSL_GUARDED_BY(mu_);  // id now -> original
  absl::Duration held_rank_wait_ ABSL_GUARDED_BY(mu_) = Client::kHeldRankWait;
  absl::Duration reattach_patience_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
};

// One Consume stream. A reader thread moves every message into a queue, so the consumer can
// wait with a timeout and a dead daemon shows up as an error, never as a hang. A writer
// thread sends the requests in the order they were given: Release costs its caller a queue
// push instead of a write round trip through gRPC, and Write, which waits for
// its request to be sent, still follows every Release posted before it.
//
// With a batch channel (common/batch_channel.h) the batches, StartEpoch and the releases
// travel through shared memory instead: Read takes the next message from the channel, and
// StartEpoch and Release are written into it by their caller. The stream then only opens,
// and the reader thread waits for its end (ferryd's error, shutdown or death) and wakes a
// Read that sleeps on the channel.
//
// Thread safety: Write and Post may be called from any thread; Read from one thread at a
// time; Cancel from the owning consumer.
class StreamState {
 public:
  // `channel`: null to keep batches on the stream.
  static absl::StatusOr<std::shared_ptr<StreamState>> Open(const ClientImpl& client,
                                                           const std::string& attach_id,
                                                           std::unique_ptr<BatchChannel> channel) {
    auto state = std::shared_ptr<StreamState>(new StreamState(client.Context("Consume")));
    state->channel_ = std::move(channel);
    client.Prepare(&state->context_, /*quick=*/false);
    state->stream_ = client.stub().Consume(&state->context_);
    state->reader_ = std::thread([s = state.get()] { s->ReaderLoop(); });
    state->writer_ = std::thread([s = state.get()] { s->WriterLoop(); });
    v1::ConsumeRequest open;
    open.mutable_open()->set_attach_id(attach_id);
    open.mutable_open()->set_channel(state->channel_ != nullptr);
    FERRY_RETURN_IF_ERROR(state->Write(std::move(open)));
    return state;
  }

  ~StreamState() { Cancel(); }

  // Sends `request` after everything posted before it and waits until it is sent.
  // UNAVAILABLE once the stream has ended (the daemon reclaims its slots then).
  absl::Status Write(v1::ConsumeRequest request) {
    if (channel_ != nullptr && request.has_start_epoch()) {
      ChannelMessage m;
      m.kind = ChannelMessage::kStartEpoch;
      m.epoch = request.start_epoch().epoch();
      m.batch = request.start_epoch().first_batch();
      return SendToDaemon(m);
    }
    uint64_t ticket;
    {
      absl::MutexLock lock(&out_mu_);
      ticket = Enqueue(std::move(request));
      auto sent = [this, ticket]() ABSL_SHARED_LOCKS_REQUIRED(out_mu_) {
        return sent_ >= ticket || write_failed_;
      };
      out_mu_.Await(absl::Condition(&sent));
      if (sent_ >= ticket) return absl::OkStatus();
    }
    // The stream has ended: report why, as the reader learns it from Finish (ferryd's
    // status names the reason, e.g. that it is shutting down).
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return end_.has_value(); };
    if (mu_.AwaitWithTimeout(absl::Condition(&ended), absl::Seconds(1))) return *end_;
    return absl::UnavailableError(absl::StrCat("the batch stream (", context_text_, ") is closed"));
  }

  // Sends `request` after everything posted before it, without waiting. A request that
  // cannot be sent any more (the stream ended) is dropped: an ended stream took every
  // lease with it.
  void Post(v1::ConsumeRequest request) {
    if (channel_ != nullptr && request.has_release() && request.releases_size() == 0) {
      ChannelMessage m;
      m.kind = ChannelMessage::kRelease;
      m.slot = request.release().slot();
      m.seq = request.release().seq();
      m.flags = request.release().complete() ? ChannelMessage::kReleaseComplete : 0;
      if (request.release().has_wait_us()) {
        m.flags |= ChannelMessage::kReleaseWaited;
        m.batch = request.release().wait_us();
      }
      (void)SendToDaemon(m);  // fails only once the stream is over, which took the lease
      return;
    }
    absl::MutexLock lock(&out_mu_);
    Enqueue(std::move(request));
  }

  // The next message from ferryd, kBatchReady or kEpochEnd, whichever data plane carried it
  // (a plain descriptor: taking a batch allocates nothing here); nullopt when none arrived
  // within `timeout`; the stream's final status (never OK) once it has ended and every
  // message before the end has been read.
  absl::StatusOr<std::optional<ChannelMessage>> Read(absl::Duration timeout) {
    if (channel_ != nullptr) return ReadChannel(timeout);
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return !queue_.empty() || end_.has_value();
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (!queue_.empty()) {
      const ChannelMessage message = queue_.front();
      queue_.pop_front();
      return std::optional<ChannelMessage>(message);
    }
    if (end_.has_value()) return *end_;
    return std::optional<ChannelMessage>();
  }

  bool uses_channel() const { return channel_ != nullptr; }

  // Ends the call (the daemon sees the consumer go away) and joins both threads.
  // Idempotent. Requests still queued are dropped.
  void Cancel() {
    context_.TryCancel();
    {
      absl::MutexLock lock(&out_mu_);
      stopping_ = true;
    }
    if (writer_.joinable()) writer_.join();
    if (reader_.joinable()) reader_.join();
  }

 private:
  explicit StreamState(std::string context_text) : context_text_(std::move(context_text)) {}

  // How long a full channel may stay full (ferryd not reading it) before the stream is
  // given up. ferryd sizes the ring so that an honest trainer never fills it.
  static constexpr absl::Duration kChannelFullPatience = absl::Seconds(30);

  // Writes `m` into the channel after everything written before it. The stream's end
  // status once it has ended; a channel error (or a channel full for kChannelFullPatience)
  // ends the stream.
  absl::Status SendToDaemon(const ChannelMessage& m) {
    absl::MutexLock send_lock(&send_mu_);
    absl::Time give_up = absl::InfiniteFuture();
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        if (end_.has_value()) return *end_;
      }
      absl::Status sent = channel_->Send(m);
      if (sent.ok()) return sent;
      if (absl::IsResourceExhausted(sent)) {
        const absl::Time now = absl::Now();
        if (give_up == absl::InfiniteFuture()) give_up = now + kChannelFullPatience;
        if (now < give_up) {
          absl::SleepFor(absl::Microseconds(50));
          continue;
        }
      }
      context_.TryCancel();  // the reader thread records the end
      return absl::UnavailableError(
          absl::StrCat("the batch channel of ", context_text_, " failed: ", sent.message()));
    }
  }

  // Read for a stream with a channel: messages come from the channel; the stream's end is
  // reported once the channel holds nothing more.
  absl::StatusOr<std::optional<ChannelMessage>> ReadChannel(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    ChannelMessage m;
    for (;;) {
      absl::StatusOr<bool> got = channel_->Receive(&m);
      if (got.ok() && !*got) {
        bool ended;
        {
          absl::MutexLock lock(&mu_);
          ended = end_.has_value();
        }
        // Whatever ferryd wrote before the stream ended is in the channel by now.
        if (ended) {
          got = channel_->Receive(&m);
          if (got.ok() && !*got) {
            absl::MutexLock lock(&mu_);
            return *end_;
          }
        } else {
          const absl::Duration left = deadline - absl::Now();
          if (left <= absl::ZeroDuration()) return std::optional<ChannelMessage>();
          if (channel_->peer_closed()) {
            // ferryd closed its end (it exited or ended the stream): its stream's status
            // says why, and arrives shortly.
            absl::MutexLock lock(&mu_);
            auto ended_now = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return end_.has_value(); };
            mu_.AwaitWithTimeout(absl::Condition(&ended_now), left);
            continue;
          }
          got = channel_->ReceiveOrWait(&m, left);
          if (got.ok() && !*got) continue;  // out of time, or woken by the stream's end
        }
      }
      if (!got.ok()) {
        context_.TryCancel();
        return absl::Status(got.status().code(),
                            absl::StrCat("reading the batch channel of ", context_text_, ": ",
                                         got.status().message()));
      }
      if (m.kind != ChannelMessage::kBatchReady && m.kind != ChannelMessage::kEpochEnd) {
        context_.TryCancel();
        return absl::InternalError(absl::StrCat("ferryd sent a batch channel message of kind ",
                                                m.kind, " on ", context_text_));
      }
      return std::optional<ChannelMessage>(m);
    }
  }

  // The descriptor of a batch announced on the gRPC stream.
  static ChannelMessage FromProto(const v1::BatchReady& b) {
    ChannelMessage m;
    m.kind = ChannelMessage::kBatchReady;
    m.seq = b.seq();
    m.epoch = b.epoch();
    m.batch = b.batch();
    m.slot = b.slot();
    m.num_samples = b.num_samples();
    return m;
  }

  // The request's ticket: it is sent once sent_ reaches it.
  uint64_t Enqueue(v1::ConsumeRequest request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(out_mu_) {
    if (!write_failed_) outbox_.push_back(std::move(request));  // else nobody would send it
    return ++queued_;
  }

  void WriterLoop() {
    NameThisThread("ferry-releases");
    std::vector<v1::ConsumeRequest> batch;
    for (;;) {
      {
        absl::MutexLock lock(&out_mu_);
        auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(out_mu_) {
          return stopping_ || !outbox_.empty();
        };
        out_mu_.Await(absl::Condition(&work));
        if (stopping_ || write_failed_) {
          write_failed_ = true;  // wakes writers waiting for requests that stay unsent
          return;
        }
        batch.assign(std::make_move_iterator(outbox_.begin()),
                     std::make_move_iterator(outbox_.end()));
        outbox_.clear();
      }
      uint64_t sent = 0;
      bool ok = true;
      {
        absl::MutexLock lock(&write_mu_);  // Finish must not overlap a Write
        // Releases queued back to back travel in one message (ConsumeRequest.releases).
        const std::vector<size_t> counts = PackReleases(&batch);
        for (size_t i = 0; i < batch.size(); ++i) {
          if (closed_ || !stream_->Write(batch[i])) {
            ok = false;
            break;
          }
          sent += counts[i];
        }
      }
      batch.clear();
      absl::MutexLock lock(&out_mu_);
      sent_ += sent;
      if (!ok) {
        write_failed_ = true;
        outbox_.clear();
        return;
      }
    }
  }

  void ReaderLoop() {
    NameThisThread("ferry-batches");
    v1::ConsumeResponse message;
    while (stream_->Read(&message)) {
      absl::MutexLock lock(&mu_);
      // ferryd coalesces the batches ready when a write starts (`batches` follow `batch`);
      // the queue holds one batch per entry (a message of `batches` alone is valid too). A
      // message with no batch at all and no epoch end is queued as kind 0, which Next
      // reports.
      if (message.has_batch()) {
        queue_.push_back(FromProto(message.batch()));
      } else if (message.has_epoch_end()) {
        ChannelMessage end;
        end.kind = ChannelMessage::kEpochEnd;
        end.epoch = message.epoch_end().epoch();
        queue_.push_back(end);
      } else if (message.batches_size() == 0) {
        queue_.push_back(ChannelMessage());
      }
      for (const v1::BatchReady& b : message.batches()) queue_.push_back(FromProto(b));
      message.Clear();
    }
    grpc::Status status;
    {
      absl::MutexLock lock(&write_mu_);
      closed_ = true;
      status = stream_->Finish();
    }
    absl::Status end = status.ok() ? absl::UnavailableError(absl::StrCat(
                                         "ferryd ended the batch stream without an error (",
                                         context_text_, "); the daemon is probably shutting down"))
                                   : FromGrpc(status, context_text_);
    {
      absl::MutexLock lock(&mu_);
      end_ = std::move(end);
    }
    if (channel_ != nullptr) channel_->WakeSelf();  // a Read may sleep on the channel
    // Nothing queued can be sent any more.
    absl::MutexLock lock(&out_mu_);
    write_failed_ = true;
  }

  const std::string context_text_;
  grpc::ClientContext context_;  // thread-safe for TryCancel
  std::unique_ptr<grpc::ClientReaderWriter<v1::ConsumeRequest, v1::ConsumeResponse>> stream_;
  std::thread reader_;
  std::thread writer_;
  std::unique_ptr<BatchChannel> channel_;  // set before the threads start; null: none
  absl::Mutex send_mu_;                    // one writer into the channel at a time (SendToDaemon)

  absl::Mutex write_mu_;  // held by the writer thread while it writes, by the reader to Finish
  bool closed_ ABSL_GUARDED_BY(write_mu_) = false;

  absl::Mutex out_mu_;
  std::deque<v1::ConsumeRequest> outbox_ ABSL_GUARDED_BY(out_mu_);
  uint64_t queued_ ABSL_GUARDED_BY(out_mu_) = 0;  // requests ever enqueued
  uint64_t sent_ ABSL_GUARDED_BY(out_mu_) = 0;    // of those, written in order
  bool write_failed_ ABSL_GUARDED_BY(out_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(out_mu_) = false;

  absl::Mutex mu_;
  std::deque<ChannelMessage> queue_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mu_);
};

// A batch's claim on its slot; keeps the stream and the mapping (slab or CUDA ring) alive.
// Release is thread-safe and idempotent; WaitOn is not synchronized with it (a Batch is
// used from one thread at a time).
class BatchLease {
 public:
  // `waited`: how long Next blocked for this batch, reported to ferryd with the release
  // (ConsumeRequest.Release.wait_us: its stall ratio).
  BatchLease(std::shared_ptr<StreamState> stream, std::shared_ptr<const SlabMapping> slab,
             std::shared_ptr<const CudaRing> ring, uint32_t slot, int64_t seq,
             absl::Duration waited)
      : stream_(std::move(stream)),
        slab_(std::move(slab)),
        ring_(std::move(ring)),
        slot_(slot),
        seq_(seq),
        waited_(waited) {}
  ~BatchLease() { (void)Release(); }

  absl::Status WaitOn(void* stream) {
    if (ring_ == nullptr) return absl::OkStatus();
    if (released_.load()) {
      return absl::FailedPreconditionError(
          absl::StrCat("WaitOn: batch seq ", seq_, " (slot ", slot_, ") was already released"));
    }
    FERRY_RETURN_IF_ERROR(ring_->WaitReady(slot_, stream));
    wait_stream_ = stream;
    return absl::OkStatus();
  }

  // GPU: on the stream last waited on (or the legacy default stream).
  absl::Status Release() { return ReleaseOn(wait_stream_); }

  absl::Status ReleaseOn(void* stream) {
    if (released_.load()) return absl::OkStatus();
    v1::ConsumeRequest request;
    if (ring_ != nullptr) {
      // Serialises concurrent releases of this batch so the event is recorded once and
      // before the Release message; a failed record keeps the lease (see client.h).
      absl::MutexLock lock(&release_mu_);
      if (released_.load()) return absl::OkStatus();
      FERRY_ASSIGN_OR_RETURN(const bool recorded, ring_->SignalReleased(slot_, stream));
      request.mutable_release()->set_complete(!recorded);
      released_.store(true);
    } else if (released_.exchange(true)) {
      return absl::OkStatus();
    }
    request.mutable_release()->set_slot(slot_);
    request.mutable_release()->set_seq(seq_);
    request.mutable_release()->set_wait_us(absl::ToInt64Microseconds(waited_));
    // A stream that has ended took every lease with it: nothing is left to give back.
    stream_->Post(std::move(request));
    return absl::OkStatus();
  }
  bool released() const { return released_.load(); }

 private:
  const std::shared_ptr<StreamState> stream_;
  const std::shared_ptr<const SlabMapping> slab_;  // host transport
  const std::shared_ptr<const CudaRing> ring_;     // GPU transport
  const uint32_t slot_;
  const int64_t seq_;
  const absl::Duration waited_;
  void* wait_stream_ = nullptr;  // owner thread only
  absl::Mutex release_mu_;
  std::atomic<bool> released_{false};
};

// Thread-compatible: the owning Consumer documents one consuming thread.
class ConsumerImpl {
 public:
  ConsumerImpl(std::shared_ptr<Connection> connection, std::string_view job_id, uint32_t rank,
               std::string device)
      : connection_(std::move(connection)),
        original_job_id_(connection_->Original(job_id)),
        job_id_(connection_->IdNow(job_id)),
        rank_(rank),
        device_(std::move(device)) {
    std::tie(client_, generation_) = connection_->current();
  }
  ~ConsumerImpl() {
    if (stream_) stream_->Cancel();
  }

  // Attaches (again), maps the slab and opens a stream, waiting for the daemon to let go of
  // this rank's previous stream: up to kReattachPatience with `retry` (this consumer's own
  // stream broke), the client's held_rank_wait without.
  absl::Status Attach(bool retry) {
    if (stream_) {
      stream_->Cancel();
      stream_.reset();
    }
    state_ = State::kBroken;
    error_ = absl::UnavailableError("the consumer lost its stream and could not reattach");
    v1::AttachRequest request;
    request.set_job_id(job_id_);
    request.set_rank(rank_);
    request.set_device(device_);
    v1::AttachResponse response;
    const absl::Time give_up =
        absl::Now() + (retry ? kReattachPatience : connection_->held_rank_wait());
    while (true) {
      grpc::ClientContext context;
      client_->Prepare(&context, /*quick=*/false);
      grpc::Status status = client_->stub().Attach(&context, request, &response);
      if (status.ok()) break;
      absl::Status refused = FromGrpc(status, client_->Context("Attach"), &context);
      // Only a rank still held waits (by its reason): every other refusal is final.
      if (ReasonOf(refused) == kReasonRankHeld && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(50));
        continue;
      }
      return refused;
    }
    v1::Job job = std::move(*response.mutable_job());
    google::protobuf::RepeatedPtrField<v1::Field> layout;
    switch (response.transport_case()) {
      case v1::AttachResponse::kHost: {
        FERRY_ASSIGN_OR_RETURN(Session::Slab slab,
                               client_->session().FetchSlab(response.attach_id()));
        if (slab.bytes != response.host().slab_bytes()) {
          return absl::InternalError(absl::StrCat("ferryd announced a slab of ",
                                                  response.host().slab_bytes(),
                                                  " bytes in Attach but handed over ", slab.bytes));
        }
        FERRY_RETURN_IF_ERROR(ValidateLayout(job, job.fields(), response.num_slots(),
                                             response.slot_bytes(), slab.bytes));
        FERRY_ASSIGN_OR_RETURN(slab_, SlabMapping::Create(slab.fd.get(), slab.bytes));
        ring_.reset();
        layout = job.fields();
        break;
      }
      case v1::AttachResponse::kCuda: {
        const v1::CudaTransport& cuda = response.cuda();
        if (cuda.slot_bytes() != response.slot_bytes() ||
            static_cast<uint32_t>(cuda.slots_size()) != response.num_slots()) {
          return absl::InternalError(
              absl::StrCat("ferryd announced ", response.num_slots(), " slots of ",
                           response.slot_bytes(), " bytes but its CUDA transport has ",
                           cuda.slots_size(), " slots of ", cuda.slot_bytes(), " bytes"));
        }
        FERRY_RETURN_IF_ERROR(ValidateLayout(job, cuda.fields(), response.num_slots(),
                                             cuda.slot_bytes(),
                                             uint64_t{response.num_slots()} * cuda.slot_bytes()));
        CudaRingSpec spec;
        spec.daemon_device = cuda.device();
        spec.pci_bus_id = cuda.pci_bus_id();
        spec.slot_bytes = cuda.slot_bytes();
        for (const v1::CudaSlot& slot : cuda.slots()) {
          spec.mem_handles.push_back(slot.mem_handle());
          spec.ready_events.push_back(slot.ready_event());
          spec.released_events.push_back(slot.released_event());
        }
        // A reattach to the same pipeline keeps the mappings (CUDA maps an IPC handle once
        // per process); batches of the old stream keep theirs alive either way.
        if (ring_ == nullptr || !ring_->Matches(spec)) {
          absl::StatusOr<std::shared_ptr<const CudaRing>> ring = CudaRing::Open(spec);
          if (!ring.ok()) {
            return absl::Status(ring.status().code(),
                                absl::StrCat("attaching to job '", job_id_, "' rank ", rank_, ": ",
                                             ring.status().message()));
          }
          ring_ = *std::move(ring);
        }
        slab_.reset();
        layout = cuda.fields();
        break;
      }
      default:
        return absl::UnimplementedError(absl::StrCat(
            "ferryd offered job '", job_id_,
            "' over a transport this client does not support; update the client library"));
    }
    std::unique_ptr<BatchChannel> channel;
    if (UseBatchChannel()) {
      absl::StatusOr<std::unique_ptr<BatchChannel>> fetched =
          client_->session().FetchChannel(response.attach_id());
      if (fetched.ok()) {
        channel = *std::move(fetched);
      } else if (!absl::IsUnimplemented(fetched.status())) {  // else: an older ferryd
        return fetched.status();
      }
    }
    FERRY_ASSIGN_OR_RETURN(stream_,
                           StreamState::Open(*client_, response.attach_id(), std::move(channel)));
    layout_ = std::move(layout);
    job_ = std::move(job);
    attach_id_ = response.attach_id();
    num_slots_ = response.num_slots();
    slot_bytes_ = response.slot_bytes();
    state_ = State::kIdle;
    error_ = absl::OkStatus();
    next_seq_ = 0;
    resumed_ = false;  // ferryd forgets a resume at every attach
    ++attaches_;
    return absl::OkStatus();
  }

  absl::Status StartEpoch(int64_t epoch, int64_t first_batch) {
    return ResumeEpoch(epoch, {}, first_batch).status();
  }

  absl::StatusOr<int64_t> ResumeEpoch(int64_t epoch, const std::vector<EpochRange>& consumed,
                                      int64_t first_batch) {
    if (epoch < 0 || first_batch < 0) {
      return absl::InvalidArgumentError(absl::StrCat("StartEpoch(epoch=", epoch,
                                                     ", first_batch=", first_batch,
                                                     "): epoch and first_batch must be >= 0"));
    }
    if (state_ == State::kInEpoch && next_batch_ == epoch_batches_) {
      // Every batch was taken; only the EpochEnd is still in flight.
      auto last = NextOnThisStream(absl::Seconds(5));
      if (last.ok() && !last->has_value()) state_ = State::kEpochDone;
    }
    if (state_ == State::kInEpoch || state_ == State::kBroken) {
      absl::Status attached = Attach(/*retry=*/true);
      if (!attached.ok()) FERRY_RETURN_IF_ERROR(TakeBack(attached, /*resume=*/false));
    }
    absl::StatusOr<int64_t> begun = Begin(epoch, consumed, first_batch);
    if (!begun.ok() && DaemonWentAway(begun.status()) &&
        TakeBack(begun.status(), /*resume=*/false).ok()) {
      begun = Begin(epoch, consumed, first_batch);
    }
    return begun;
  }

  absl::StatusOr<std::optional<Batch>> Next(absl::Duration timeout) {
    absl::StatusOr<std::optional<Batch>> next = NextOnThisStream(timeout);
    // ferryd went away (a restart, an upgrade): the epoch goes on where it was on the new one.
    while (!next.ok() && DaemonWentAway(next.status())) {
      FERRY_RETURN_IF_ERROR(TakeBack(next.status(), /*resume=*/true));
      next = NextOnThisStream(timeout);
    }
    return next;
  }

  const v1::Job& job() const { return job_; }
  int64_t epoch_batches() const { return epoch_batches_; }

  absl::StatusOr<ResumePoint> Position() const {
    const EpochProgress deal = EpochProgress::Of(job_, consumed_);
    ResumePoint point;
    point.positions = deal.positions;
    point.world_size = deal.world_size;
    point.batch_size = deal.batch_size;
    point.drop_last = deal.drop_last;
    point.epoch = epoch_;
    if (state_ == State::kEpochDone || (epoch_batches_ > 0 && next_batch_ >= epoch_batches_)) {
      ++point.epoch;  // after the epoch's end: the next one, none of it consumed
      return point;
    }
    point.resumed_from = consumed_;
    point.batches_done = next_batch_;
    FERRY_ASSIGN_OR_RETURN(point.consumed, deal.ConsumedAfter(next_batch_));
    return point;
  }
  uint32_t rank() const { return rank_; }
  uint32_t num_slots() const { return num_slots_; }
  int device() const { return ring_ ? ring_->device() : -1; }
  int64_t attaches() const { return attaches_; }

 private:
  enum class State { kIdle, kInEpoch, kEpochDone, kBroken };

  // Asks this attach's stream for batches [first_batch, n) of `epoch` after `consumed`.
  absl::StatusOr<int64_t> Begin(int64_t epoch, const std::vector<EpochRange>& consumed,
                                int64_t first_batch) {
    int64_t batches = job_.batches_per_epoch();
    // ferryd keeps a resume for this attach only: say it again after a reattach, and undo
    // it when this epoch is dealt whole.
    if (!consumed.empty() || resumed_) {
      absl::StatusOr<int64_t> resumed = CallResumeEpoch(epoch, consumed);
      if (!resumed.ok()) return Break(resumed.status());
      batches = *resumed;
      resumed_ = !consumed.empty();
    }
    if (first_batch > batches) {
      return absl::InvalidArgumentError(
          absl::StrCat("StartEpoch(epoch=", epoch, ", first_batch=", first_batch,
                       "): first_batch must be in [0, ", batches, "]"));
    }
    v1::ConsumeRequest request;
    request.mutable_start_epoch()->set_epoch(epoch);
    request.mutable_start_epoch()->set_first_batch(first_batch);
    absl::Status written = stream_->Write(request);
    if (!written.ok()) return Break(written);
    state_ = State::kInEpoch;
    in_epoch_ = true;
    epoch_ = epoch;
    consumed_ = consumed;
    next_batch_ = first_batch;
    epoch_batches_ = batches;
    return batches;
  }

  // Whether a call failed because the ferryd this consumer used went away: the stream or a
  // call broke (UNAVAILABLE), or a call reached a new ferryd at the address, which does not
  // know this consumer's session (UNAUTHENTICATED).
  static bool DaemonWentAway(const absl::Status& status) {
    return absl::IsUnavailable(status) || absl::IsUnauthenticated(status);
  }

  // After `cause` (DaemonWentAway), when this consumer's client created the job and has a
  // reattach patience: takes the job back on the ferryd that answers at the address, trying
  // for up to the patience. It connects again and creates the job again
  // (Connection::Reconnect, JobOn), attaches as this rank (and GPU) and, with `resume`, asks
  // for the epoch from the batch after the last one Next handed out. The epoch's order is a
  // function of (seed, epoch), so no sample is lost or repeated. Otherwise, or once the
  // patience is spent, UNAVAILABLE with `cause` and why the job was not taken back; the
  // consumer is then broken until the next StartEpoch, which tries again.
  absl::Status TakeBack(const absl::Status& cause, bool resume) {
    const absl::Duration patience = connection_->reattach_patience();
    if (!DaemonWentAway(cause) || patience <= absl::ZeroDuration() ||
        !connection_->Recreatable(original_job_id_)) {
      return Break(cause);
    }
    const bool in_epoch = resume && in_epoch_;
    std::fprintf(stderr, "ferry: lost ferryd at %s (%s); taking job '%s' (%s) rank %u back",
                 connection_->address().c_str(), std::string(cause.message()).c_str(),
                 job_.name().c_str(), original_job_id_.c_str(), rank_);
    if (in_epoch) {
      std::fprintf(stderr, " at epoch %lld batch %lld", static_cast<long long>(epoch_),
                   static_cast<long long>(next_batch_));
    }
    std::fprintf(stderr, "\n");
    const int64_t epoch = epoch_;
    const std::vector<EpochRange> consumed = consumed_;
    const int64_t first_batch = next_batch_;
    const absl::Time give_up = absl::Now() + patience;
    while (true) {
      absl::Status attempt = [&]() -> absl::Status {
        FERRY_ASSIGN_OR_RETURN(std::tie(client_, generation_), connection_->Reconnect(generation_));
        FERRY_ASSIGN_OR_RETURN(job_id_,
                               connection_->JobOn(*client_, generation_, original_job_id_));
        FERRY_RETURN_IF_ERROR(Attach(/*retry=*/true));
        if (in_epoch) return Begin(epoch, consumed, first_batch).status();
        return absl::OkStatus();
      }();
      if (attempt.ok()) return attempt;
      const bool transient = absl::IsUnavailable(attempt) || absl::IsNotFound(attempt) ||
                             absl::IsResourceExhausted(attempt);
      if (!transient || absl::Now() >= give_up) {
        return Break(absl::UnavailableError(
            absl::StrCat(cause.message(), "; ferryd did not take the job back within ",
                         absl::FormatDuration(patience), ": ", attempt.message(),
                         ". Start ferryd again (systemctl start ferryd, or ferryd); the next "
                         "StartEpoch tries again")));
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  absl::StatusOr<std::optional<Batch>> NextOnThisStream(absl::Duration timeout) {
    switch (state_) {
      case State::kIdle:
        return absl::FailedPreconditionError("call StartEpoch before Next");
      case State::kEpochDone:
        return std::optional<Batch>();
      case State::kBroken:
        return error_;
      case State::kInEpoch:
        break;
    }
    // How long the trainer waits for this batch: Next's blocking, over calls that timed out
    // before it came too.
    const absl::Time asked = absl::Now();
    absl::StatusOr<std::optional<ChannelMessage>> message = stream_->Read(timeout);
    waited_ += absl::Now() - asked;

    if (!message.ok()) return Break(message.status());
    if (!message->has_value()) {
      return WithReason(absl::DeadlineExceededError(absl::StrCat(
                            "no batch from ferryd within ", absl::FormatDuration(timeout),
                            " (epoch ", epoch_, ", batch ", next_batch_, ")")),
                        kReasonNoBatchYet);
    }
    const ChannelMessage& ready = **message;
    if (ready.kind == ChannelMessage::kEpochEnd) {
      if (ready.epoch != epoch_ || next_batch_ != epoch_batches_) {
        return Break(absl::InternalError(
            absl::StrCat("ferryd ended epoch ", ready.epoch, " while this consumer was in ",
                         "epoch ", epoch_, " at batch ", next_batch_, " of ", epoch_batches_)));
      }
      state_ = State::kEpochDone;
      in_epoch_ = false;
      waited_ = absl::ZeroDuration();  // for the epoch's end, not a batch
      return std::optional<Batch>();
    }
    if (ready.kind != ChannelMessage::kBatchReady) {
      return Break(absl::InternalError("ferryd sent an empty message on the batch stream"));
    }

    // A GPU batch lives in ferryd's device memory, which CUDA frees with ferryd: once
    // ferryd is gone, batches it sent that this trainer has not taken are not handed out
    // (the stream may not have noticed yet; the session socket has).
    if (ring_ != nullptr && client_->session().DaemonGone()) {
      return Break(absl::UnavailableError(absl::StrCat(
          "ferryd (pid ", client_->session().daemon_pid(),
          ") is gone: its session socket "
          "closed. The GPU batches it sent that this trainer had not taken are dropped, since "
          "their device memory went with it. Start ferryd again and attach again; epoch ",
          epoch_, " resumes at batch ", next_batch_, " with StartEpoch(", epoch_, ", ", next_batch_,
          ")")));
    }
    if (ready.seq != next_seq_ || ready.epoch != epoch_ || ready.batch != next_batch_ ||
        ready.slot >= num_slots_ || ready.num_samples == 0 ||
        ready.num_samples > job_.spec().batch_size()) {
      return Break(absl::InternalError(absl::StrCat(
          "ferryd sent BatchReady{seq=", ready.seq, ", epoch=", ready.epoch,
          ", batch=", ready.batch, ", slot=", ready.slot, ", num_samples=", ready.num_samples,
          "} but expected seq ", next_seq_, ", epoch ", epoch_, ", batch ", next_batch_,
          ", slot < ", num_slots_, ", 1..", job_.spec().batch_size(), " samples")));
    }
    ++next_seq_;
    ++next_batch_;
    Batch batch;
    batch.epoch_ = ready.epoch;
    batch.index_ = ready.batch;
    batch.seq_ = ready.seq;
    batch.slot_ = ready.slot;
    batch.num_samples_ = ready.num_samples;
    const int device = ring_ ? ring_->device() : -1;
    const uint8_t* slot_base =
        ring_ ? ring_->slot_data(ready.slot) : slab_->data() + uint64_t{ready.slot} * slot_bytes_;
    batch.device_ = device;
    batch.fields_.reserve(layout_.size());
    for (const v1::Field& f : layout_) {
      BatchField field;
      field.name = f.name();
      field.dtype = f.dtype();
      field.shape.reserve(f.shape_size() + 1);
      field.shape.push_back(ready.num_samples);
      field.shape.insert(field.shape.end(), f.shape().begin(), f.shape().end());
      field.data = slot_base + f.offset();
      field.bytes = uint64_t{ready.num_samples} * f.row_bytes();
      field.device = device;
      batch.fields_.push_back(std::move(field));
    }
    batch.lease_ =
        std::make_unique<BatchLease>(stream_, slab_, ring_, ready.slot, ready.seq, waited_);
    waited_ = absl::ZeroDuration();
    return std::optional<Batch>(std::move(batch));
  }

  absl::Status Break(absl::Status error) {
    state_ = State::kBroken;
    error_ = error;
    return error;
  }

  // ResumeEpoch on this attach; an older ferryd has no such call.
  absl::StatusOr<int64_t> CallResumeEpoch(int64_t epoch, const std::vector<EpochRange>& consumed) {
    v1::ResumeEpochRequest request;
    request.set_attach_id(attach_id_);
    request.set_epoch(epoch);
    for (const EpochRange& r : consumed) {
      v1::PositionRange* range = request.add_consumed();
      range->set_begin(r.begin);
      range->set_end(r.end);
    }
    grpc::ClientContext context;
    client_->Prepare(&context, /*quick=*/true);
    v1::ResumeEpochResponse response;
    grpc::Status status = client_->stub().ResumeEpoch(&context, request, &response);
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ferryd at ", client_->address(),
          " is older than this ferry client: it cannot resume an epoch begun on another number "
          "of ranks or batch size. Restart ferryd from this ferry's package (ferryctl drain, "
          "then start it again), or resume at the world size and batch size the state was "
          "saved with"));
    }
    if (!status.ok()) return FromGrpc(status, client_->Context("ResumeEpoch"), &context);
    return response.batches();
  }

  const std::shared_ptr<Connection> connection_;
  const std::string original_job_id_;         // as this client's CreateJob returned it
  std::shared_ptr<const ClientImpl> client_;  // the session of this attach
  uint64_t generation_ = 0;                   // client_'s (Connection::current)
  std::string job_id_;                        // the job's id on client_'s ferryd
  const uint32_t rank_;
  const std::string device_;  // AttachRequest.device; empty: the job spec's

  v1::Job job_;
  std::string attach_id_;
  uint32_t num_slots_ = 0;
  uint64_t slot_bytes_ = 0;
  google::protobuf::RepeatedPtrField<v1::Field> layout_;  // of the fields in a slot, as delivered
  std::shared_ptr<const SlabMapping> slab_;               // host transport
  std::shared_ptr<const CudaRing> ring_;                  // GPU transport
  std::shared_ptr<StreamState> stream_;
  State state_ = State::kIdle;
  bool in_epoch_ = false;  // an epoch was begun and its end not read (a break keeps it)
  absl::Status error_;
  int64_t epoch_ = 0;
  std::vector<EpochRange> consumed_;  // of epoch_, before this run's deal
  int64_t next_batch_ = 0;
  int64_t epoch_batches_ = 0;  // of epoch_, per rank
  bool resumed_ = false;       // a ResumeEpoch holds for this attach
  int64_t next_seq_ = 0;
  absl::Duration waited_;  // by Next, for the batch it hands out next
  int64_t attaches_ = 0;   // successful Attach calls
};

}  // namespace internal

// ---------------------------------------------------------------------------------------
// Batch

Batch::Batch(Batch&&) noexcept = default;
Batch& Batch::operator=(Batch&&) noexcept = default;
Batch::~Batch() = default;

const BatchField* Batch::field(std::string_view name) const {
  for (const BatchField& f : fields_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

absl::Status Batch::Release() { return lease_ ? lease_->Release() : absl::OkStatus(); }
bool Batch::released() const { return !lease_ || lease_->released(); }
absl::Status Batch::WaitOn(void* stream) {
  return lease_ ? lease_->WaitOn(stream) : absl::OkStatus();
}
absl::Status Batch::ReleaseOn(void* stream) {
  return lease_ ? lease_->ReleaseOn(stream) : absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// EpochProgress

namespace {

absl::StatusOr<EpochLayout> LayoutOf(const EpochProgress& p) {
  std::vector<PositionRange> consumed;
  consumed.reserve(p.consumed.size());
  for (const EpochRange& r : p.consumed) consumed.push_back({r.begin, r.end});
  return EpochLayout::Make({.num_positions = p.positions,
                            .world_size = p.world_size,
                            .batch_size = p.batch_size,
                            .drop_last = p.drop_last,
                            .contiguous = p.contiguous_ranks,
                            .consumed = std::move(consumed)});
}

}  // namespace

EpochProgress EpochProgress::Of(const v1::Job& job, std::vector<EpochRange> consumed) {
  EpochProgress p;
  p.positions = job.samples_per_epoch();
  p.world_size = job.spec().world_size() == 0 ? 1 : job.spec().world_size();
  p.batch_size = job.spec().batch_size();
  p.drop_last = job.spec().drop_last();
  p.contiguous_ranks = job.contiguous_ranks();
  p.consumed = std::move(consumed);
  return p;
}

absl::StatusOr<std::vector<EpochRange>> EpochProgress::ConsumedAfter(int64_t batches_done) const {
  FERRY_ASSIGN_OR_RETURN(const EpochLayout layout, LayoutOf(*this));
  std::vector<EpochRange> out;
  for (const PositionRange& r : layout.ConsumedAfter(batches_done)) out.push_back({r.begin, r.end});
  return out;
}

absl::StatusOr<int64_t> EpochProgress::Batches() const {
  FERRY_ASSIGN_OR_RETURN(const EpochLayout layout, LayoutOf(*this));
  return layout.batches();
}

namespace {

absl::Status CheckRanges(std::string_view name, const std::vector<EpochRange>& ranges,
                         int64_t positions) {
  int64_t end = 0;
  for (const EpochRange& r : ranges) {
    if (r.begin < end || r.begin >= r.end || r.end > positions) {
      return absl::InvalidArgumentError(
          absl::StrCat("ResumePoint.", std::string(name),
                       " must be sorted, disjoint, non-empty ranges inside "
                       "the epoch's ",
                       positions, " positions; [", r.begin, ", ", r.end, ") is not"));
    }
    end = r.end;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResumePlan> PlanResume(const ResumePoint& point, const EpochProgress& run) {
  if (point.positions != run.positions) {
    return absl::FailedPreconditionError(
        absl::StrCat("the resume point was taken with ", point.positions,
                     " positions an epoch, and this "
                     "job's dataset has ",
                     run.positions,
                     ": the dataset changed (files added or removed) "
                     "since; resume over the data the point was taken with"));
  }
  if (point.epoch < 0 || point.batches_done < 0 || point.world_size < 1 || point.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ResumePoint has epoch ", point.epoch, ", batches_done ", point.batches_done,
                     ", world_size ", point.world_size, ", batch_size ", point.batch_size,
                     ": epoch and batches_done must be >= 0, world_size and batch_size >= 1"));
  }
  FERRY_RETURN_IF_ERROR(CheckRanges("consumed", point.consumed, point.positions));
  if (point.consumed.size() == 1 && point.consumed[0].begin == 0 &&
      point.consumed[0].end == point.positions) {
    return ResumePlan{point.epoch + 1, {}, 0};  // the epoch was consumed whole
  }
  if (point.world_size == run.world_size && point.batch_size == run.batch_size &&
      point.drop_last == run.drop_last) {
    FERRY_RETURN_IF_ERROR(CheckRanges("resumed_from", point.resumed_from, point.positions));
    return ResumePlan{point.epoch, point.resumed_from, point.batches_done};
  }
  return ResumePlan{point.epoch, point.consumed, 0};
}

// ---------------------------------------------------------------------------------------
// Consumer

Consumer::Consumer(std::unique_ptr<internal::ConsumerImpl> impl) : impl_(std::move(impl)) {}
Consumer::~Consumer() = default;
const v1::Job& Consumer::job() const { return impl_->job(); }
uint32_t Consumer::rank() const { return impl_->rank(); }
uint32_t Consumer::num_slots() const { return impl_->num_slots(); }
int Consumer::device() const { return impl_->device(); }
absl::Status Consumer::StartEpoch(int64_t epoch, int64_t first_batch) {
  return impl_->StartEpoch(epoch, first_batch);
}
absl::StatusOr<int64_t> Consumer::ResumeEpoch(int64_t epoch,
                                              const std::vector<EpochRange>& consumed,
                                              int64_t first_batch) {
  return impl_->ResumeEpoch(epoch, consumed, first_batch);
}
int64_t Consumer::epoch_batches() const { return impl_->epoch_batches(); }
int64_t Consumer::attaches() const { return impl_->attaches(); }
absl::StatusOr<ResumePoint> Consumer::Position() const { return impl_->Position(); }
absl::StatusOr<ResumePlan> Consumer::Resume(const ResumePoint& point) {
  FERRY_ASSIGN_OR_RETURN(ResumePlan plan, PlanResume(point, EpochProgress::Of(impl_->job())));
  FERRY_RETURN_IF_ERROR(
      impl_->ResumeEpoch(plan.epoch, plan.dealt_after, plan.first_batch).status());
  return plan;
}
absl::StatusOr<std::optional<Batch>> Consumer::Next(absl::Duration timeout) {
  return impl_->Next(timeout);
}

// ---------------------------------------------------------------------------------------
// Client

Client::Client(std::shared_ptr<internal::Connection> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(std::string_view address) {
  absl::string_view rest(address.data(), address.size());
  if (!absl::ConsumePrefix(&rest, "unix://")) absl::ConsumePrefix(&rest, "unix:");
  std::string path = rest.empty() ? DefaultSocketPath() : std::string(rest);
  absl::StatusOr<std::unique_ptr<internal::Session>> session = internal::Session::Open(path);
  // With no address, a user without a daemon of their own uses the system one (systemd's
  // ferryd on /run/ferry/ferryd.sock), if it is there.
  if (!session.ok() && rest.empty() && path != kSystemSocketPath &&
      (absl::IsNotFound(session.status()) || absl::IsUnavailable(session.status()))) {
    absl::StatusOr<std::unique_ptr<internal::Session>> system =
        internal::Session::Open(kSystemSocketPath);
    if (system.ok()) {
      path = kSystemSocketPath;
      session = std::move(system);
    }
  }
  if (!session.ok()) return session.status();
  return std::unique_ptr<Client>(new Client(std::make_shared<internal::Connection>(
      std::make_shared<const internal::ClientImpl>(path, *std::move(session)))));
}

const std::string& Client::address() const { return impl_->address(); }
int Client::daemon_pid() const { return impl_->current().first->session().daemon_pid(); }

absl::StatusOr<v1::Job> Client::CreateJob(std::string_view name, const v1::JobSpec& spec) {
  v1::CreateJobRequest request;
  request.set_name(std::string(name));
  *request.mutable_spec() = spec;
  FERRY_ASSIGN_OR_RETURN(v1::Job job, internal::CreateChecked(*impl_->current().first, request));
  impl_->NoteCreated(job.id(), std::move(request));
  return job;
}

absl::StatusOr<std::string> Client::CreateJobJson(std::string_view name,
                                                  std::string_view spec_json) {
  v1::CreateJobRequest request;
  request.set_name(std::string(name));
  FERRY_RETURN_IF_ERROR(
      internal::FromJson(spec_json, "job spec (ferry.v1.JobSpec)", request.mutable_spec()));
  FERRY_ASSIGN_OR_RETURN(v1::Job job, internal::CreateChecked(*impl_->current().first, request));
  impl_->NoteCreated(job.id(), std::move(request));
  return internal::ToJson(job);
}

absl::StatusOr<v1::JobStatus> Client::GetJob(std::string_view job_id) {
  return internal::CallGetJob(*impl_->current().first, impl_->IdNow(job_id));
}

absl::StatusOr<std::string> Client::GetJobJson(std::string_view job_id) {
  FERRY_ASSIGN_OR_RETURN(v1::JobStatus status,
                         internal::CallGetJob(*impl_->current().first, impl_->IdNow(job_id)));
  return internal::ToJson(status);
}

absl::StatusOr<std::vector<v1::Job>> Client::ListJobs() {
  FERRY_ASSIGN_OR_RETURN(v1::ListJobsResponse response,
                         internal::CallListJobs(*impl_->current().first));
  return std::vector<v1::Job>(std::make_move_iterator(response.mutable_jobs()->begin()),
                              std::make_move_iterator(response.mutable_jobs()->end()));
}

absl::StatusOr<std::string> Client::ListJobsJson() {
  FERRY_ASSIGN_OR_RETURN(v1::ListJobsResponse response,
                         internal::CallListJobs(*impl_->current().first));
  return internal::ToJson(response);
}

absl::Status Client::DeleteJob(std::string_view job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(impl_->IdNow(job_id));
  return impl_->current().first->Call(&v1::Ferry::Stub::DeleteJob, "DeleteJob", request).status();
}

absl::StatusOr<uint32_t> Client::Quarantine(std::string_view job_id,
                                            const std::vector<int64_t>& indices) {
  FERRY_ASSIGN_OR_RETURN(uint32_t added, internal::CallQuarantine(*impl_->current().first,
                                                                  impl_->IdNow(job_id), indices));
  impl_->NoteQuarantined(job_id, indices);
  return added;
}

absl::StatusOr<uint32_t> Client::Drain() {
  FERRY_ASSIGN_OR_RETURN(
      v1::DrainResponse response,
      impl_->current().first->Call(&v1::Ferry::Stub::Drain, "Drain", v1::DrainRequest()));
  return response.consumers();
}

absl::StatusOr<v1::GetStatusResponse> Client::GetStatus() {
  return internal::CallGetStatus(*impl_->current().first);
}

void Client::set_held_rank_wait(absl::Duration wait) { impl_->set_held_rank_wait(wait); }

void Client::set_reattach(absl::Duration patience, std::function<absl::Status()> before_reconnect) {
  impl_->set_reattach(patience, std::move(before_reconnect));
}

absl::StatusOr<std::string> Client::GetStatusJson() {
  FERRY_ASSIGN_OR_RETURN(v1::GetStatusResponse response,
                         internal::CallGetStatus(*impl_->current().first));
  return internal::ToJson(response);
}

absl::StatusOr<std::unique_ptr<Consumer>> Client::Attach(std::string_view job_id, uint32_t rank) {
  return Attach(job_id, rank, "");
}

absl::StatusOr<std::unique_ptr<Consumer>> Client::Attach(std::string_view job_id, uint32_t rank,
                                                         std::string_view device) {
  auto impl = std::make_unique<internal::ConsumerImpl>(impl_, job_id, rank, std::string(device));
  FERRY_RETURN_IF_ERROR(impl->Attach(/*retry=*/false));
  return std::unique_ptr<Consumer>(new Consumer(std::move(impl)));
}

absl::StatusOr<std::string> CudaPciBusId(int ordinal) { return internal::CudaPciBusId(ordinal); }

}  // namespace ferry
