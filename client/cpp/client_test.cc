// Client library tests that need no ferryd: JSON parsing, layout validation, slab mapping,
// and the session socket and gRPC calls against scripted fake daemons.
#include "ferry/client.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/cpp/internal/json.h"
#include "client/cpp/internal/layout.h"
#include "client/cpp/internal/rpc.h"
#include "client/cpp/internal/session.h"
#include "common/error_reason.h"
#include "common/session_protocol.h"
#include "ferry/v1/ferry.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ferry_client_XXXXXX");
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_; }

 private:
  std::string path_;
};

// A scripted session-socket server: accepts one client and runs `script` on it.
class FakeSessionServer {
 public:
  FakeSessionServer(const std::string& grpc_socket, std::function<void(int)> script)
      : FakeSessionServer(grpc_socket, std::vector<std::function<void(int)>>{std::move(script)}) {}
  // One script per connection, in the order they come; each connection closes when its
  // script returns.
  FakeSessionServer(const std::string& grpc_socket, std::vector<std::function<void(int)>> scripts) {
    auto fd = ListenUnix(SessionSocketPath(grpc_socket), SOCK_SEQPACKET, 0600);
    EXPECT_TRUE(fd.ok()) << fd.status();
    listener_ = std::move(*fd);
    thread_ = std::thread([this, scripts = std::move(scripts)] {
      for (const auto& script : scripts) {
        UniqueFd conn(::accept(listener_.get(), nullptr, nullptr));
        if (conn.valid()) script(conn.get());
      }
    });
  }
  ~FakeSessionServer() { thread_.join(); }

 private:
  UniqueFd listener_;
  std::thread thread_;
};

TEST(ConnectTest, MissingSocketSaysWhereAndHowToStartFerryd) {
  TempDir dir;
  const std::string address = dir.path() + "/nothing/ferryd.sock";
  auto client = Client::Connect(address);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(client.status().message(), HasSubstr(absl::StrCat("no ferryd at ", address)));
  EXPECT_THAT(client.status().message(), HasSubstr("No such file or directory"));
  EXPECT_THAT(client.status().message(),
              HasSubstr("start one with 'ferryd' (per-user) or 'systemctl start ferryd', or "
                        "pass the address"));
}

TEST(ConnectTest, UnixPrefixIsAccepted) {
  TempDir dir;
  const std::string address = dir.path() + "/ferryd.sock";
  auto client = Client::Connect("unix:" + address);
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(client.status().message(), HasSubstr(absl::StrCat("no ferryd at ", address, " ")));
}

TEST(ConnectTest, DefaultAddressIsTheDefaultSocketPath) {
  TempDir dir;
  ASSERT_EQ(setenv("XDG_RUNTIME_DIR", dir.path().c_str(), 1), 0);
  auto client = Client::Connect("");
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(client.status().message(), HasSubstr(DefaultSocketPath()));
}

TEST(ConnectTest, StaleSocketIsUnavailable) {
  TempDir dir;
  const std::string address = dir.path() + "/ferryd.sock";
  {
    // Bound and closed: the file stays, nobody listens (a crashed daemon's leftover).
    auto fd = ListenUnix(SessionSocketPath(address), SOCK_SEQPACKET, 0600);
    ASSERT_TRUE(fd.ok()) << fd.status();
  }
  auto client = Client::Connect(address);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr("start one with 'ferryd'"));
}

// A directory another user made where this user's daemon would listen (/tmp/ferry-<uid>):
// the client does not greet whatever listens there.
TEST(ConnectTest, ASquattedSocketDirectoryIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to hand a directory to another uid";
  TempDir dir;
  const std::string address = dir.path() + "/ferryd.sock";
  FakeSessionServer server(address, [](int fd) { (void)SendPacket(fd, "HELLO token 1"); });
  ASSERT_EQ(chown(dir.path().c_str(), 4242, 4242), 0);
  auto client = Client::Connect(address);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(client.status().message(),
              HasSubstr("socket directory '" + dir.path() + "' belongs to uid 4242"));
}

TEST(ConnectTest, BadGreetingIsReported) {
  TempDir dir;
  const std::string address = dir.path() + "/ferryd.sock";
  FakeSessionServer server(address, [](int fd) { (void)SendPacket(fd, "HI THERE"); });
  auto client = Client::Connect(address);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(client.status().message(), HasSubstr("unexpected greeting 'HI THERE'"));
}

TEST(ConnectTest, HelloGivesTokenAndPidAndRpcErrorsNameTheDaemon) {
  TempDir dir;
  const std::string address = dir.path() + "/ferryd.sock";
  FakeSessionServer server(address, [](int fd) {
    (void)SendPacket(fd, "HELLO tok123 4242");
    (void)RecvPacket(fd);  // wait for the client to hang up
  });
  auto client = Client::Connect(address);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->daemon_pid(), 4242);
  EXPECT_EQ((*client)->address(), address);
  // No gRPC server behind the address: a transport error that names call and daemon.
  auto status = (*client)->GetStatus();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.status().message(), HasSubstr("GetStatus to ferryd at " + address));
  client->reset();
}

TEST(FromGrpcTest, ACallTheDaemonEndedIsUnavailableAndNamesTheCall) {
  // A ferryd shutting down cancels its calls in flight; callers retry UNAVAILABLE.
  absl::Status s = internal::FromGrpc(grpc::Status(grpc::StatusCode::CANCELLED, "CANCELLED"),
                                      "CreateJob to ferryd at /run/ferry/ferryd.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("CreateJob to ferryd at /run/ferry/ferryd.sock"));
  EXPECT_THAT(s.message(), HasSubstr("shutting down"));
  // The daemon's own answers keep their code and text.
  s = internal::FromGrpc(grpc::Status(grpc::StatusCode::NOT_FOUND, "no job 'x'"), "GetJob");
  EXPECT_EQ(s, absl::NotFoundError("no job 'x'"));
}

// `service` behind a gRPC socket in a fresh directory, with a session socket that greets
// one client as ferryd pid 4242 would; `client` connected to both.
class FakeFerryd {
 public:
  explicit FakeFerryd(grpc::Service* service)
      : address_(dir_.path() + "/ferryd.sock"), session_(address_, [](int fd) {
          (void)SendPacket(fd, "HELLO tok 4242");
          (void)RecvPacket(fd);  // wait for the client to hang up
        }) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + address_, grpc::InsecureServerCredentials());
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    auto client = Client::Connect(address_);
    EXPECT_TRUE(client.ok()) << client.status();
    if (client.ok()) client_ = *std::move(client);
  }
  ~FakeFerryd() {
    client_.reset();  // the session server's script ends when the client hangs up
    if (server_ != nullptr) server_->Shutdown();
  }
  Client* client() { return client_.get(); }

 private:
  TempDir dir_;
  const std::string address_;
  FakeSessionServer session_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
};

// A ferryd from before GPU jobs were shared across ranks: its status has no protocol, and
// it would take device "cuda" for another form of spec.
class OldFerryd final : public ferry::v1::Ferry::Service {
 public:
  grpc::Status GetStatus(grpc::ServerContext*, const ferry::v1::GetStatusRequest*,
                         ferry::v1::GetStatusResponse* response) override {
    response->mutable_daemon()->set_version("0.1.0");
    response->mutable_daemon()->set_pid(4242);
    return grpc::Status::OK;
  }
  grpc::Status CreateJob(grpc::ServerContext*, const ferry::v1::CreateJobRequest* request,
                         ferry::v1::CreateJobResponse* response) override {
    created_devices.push_back(request->spec().device());
    response->mutable_job()->set_id("j1");
    *response->mutable_job()->mutable_spec() = request->spec();
    return grpc::Status::OK;
  }
  std::vector<std::string> created_devices;
};

TEST(OldDaemonTest, AGpuJobOfThisClientsFormIsRefusedSayingWhatToDo) {
  OldFerryd old;
  FakeFerryd ferryd(&old);
  Client* client = ferryd.client();
  ASSERT_NE(client, nullptr);
  const std::string gpu_job =
      R"({"batch_size": 8, "device": "cuda", "dataset": {"tokens": {"path": "/d/t.bin"}}})";
  auto refused = client->CreateJobJson("", gpu_job);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("pid 4242, version 0.1.0"));
  EXPECT_THAT(refused.status().message(), HasSubstr("older than this ferry client"));
  EXPECT_THAT(refused.status().message(), HasSubstr("Restart ferryd"));
  EXPECT_TRUE(old.created_devices.empty()) << "the old ferryd was asked";
  // What an old ferryd understands goes through.
  const std::string host_job =
      R"({"batch_size": 8, "device": "cpu", "dataset": {"tokens": {"path": "/d/t.bin"}}})";
  EXPECT_TRUE(client->CreateJobJson("", host_job).ok());
  EXPECT_EQ(old.created_devices, std::vector<std::string>{"cpu"});
}

// CreateJob sends the spec as the caller built it (ferryd applies the defaults) and answers
// ferryd's Job.
TEST(CreateJobTest, SendsTheSpecAsGivenAndReturnsTheJob) {
  OldFerryd ferryd_service;
  FakeFerryd ferryd(&ferryd_service);
  Client* client = ferryd.client();
  ASSERT_NE(client, nullptr);
  v1::JobSpec spec;
  spec.mutable_dataset()->mutable_tokens()->set_path("/d/t.bin");
  spec.mutable_dataset()->mutable_tokens()->set_seq_len(16);
  spec.set_batch_size(8);
  absl::StatusOr<v1::Job> job = client->CreateJob("run-1", spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->id(), "j1");
  EXPECT_EQ(job->spec().dataset().tokens().path(), "/d/t.bin");
  EXPECT_EQ(job->spec().batch_size(), 8u);
  EXPECT_EQ(job->spec().device(), "") << "the client adds no default of its own";
  EXPECT_EQ(ferryd_service.created_devices, std::vector<std::string>{""});
}

// A ferryd whose rank 0 is held: Attach is refused with the reason in trailing metadata
// (rank 1: FAILED_PRECONDITION for another cause, with no reason).
class HeldRankFerryd final : public ferry::v1::Ferry::Service {
 public:
  grpc::Status Attach(grpc::ServerContext* context, const ferry::v1::AttachRequest* request,
                      ferry::v1::AttachResponse*) override {
    ++attaches[request->rank()];
    if (request->rank() == 1) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "rank 1 named no GPU");
    }
    context->AddTrailingMetadata(kReasonMetadataKey, kReasonRankHeld);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "rank 0 is held");
  }
  std::atomic<int> attaches[2] = {0, 0};
};

TEST(ReasonTest, AnAttachRefusalCarriesItsReasonToTheCaller) {
  HeldRankFerryd held;
  FakeFerryd ferryd(&held);
  Client* client = ferryd.client();
  ASSERT_NE(client, nullptr);
  auto consumer = client->Attach("j1", 0);  // retried for a moment, then refused
  ASSERT_EQ(consumer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(consumer.status()), kReasonRankHeld);
  EXPECT_EQ(consumer.status().message(), "rank 0 is held");
  EXPECT_GT(held.attaches[0].load(), 1) << "a held rank is asked again while it may let go";
  // Any other refusal is final: asked once.
  auto other = client->Attach("j1", 1);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReasonOf(other.status()), "");
  EXPECT_EQ(held.attaches[1].load(), 1);
}

TEST(ReasonTest, AHeldRankIsRefusedAtOnceByAClientThatWaitsForNone) {
  HeldRankFerryd held;
  FakeFerryd ferryd(&held);
  Client* client = ferryd.client();
  ASSERT_NE(client, nullptr);
  client->set_held_rank_wait(absl::ZeroDuration());
  auto consumer = client->Attach("j1", 0);
  EXPECT_EQ(ReasonOf(consumer.status()), kReasonRankHeld);
  EXPECT_EQ(held.attaches[0].load(), 1);
}

TEST(SessionTest, FetchSlabReceivesTheMemfd) {
  TempDir dir;
  const std::string address = dir.path() + "/ferryd.sock";
  FakeSessionServer server(address, [](int fd) {
    (void)SendPacket(fd, "HELLO t 1");
    auto request = RecvPacket(fd);
    ASSERT_TRUE(request.ok());
    EXPECT_EQ(*request, "FD att-1");
    UniqueFd memfd(memfd_create("slab", MFD_CLOEXEC));
    ASSERT_EQ(ftruncate(memfd.get(), 8192), 0);
    ASSERT_EQ(pwrite(memfd.get(), "ferry", 5, 4096), 5);
    (void)SendPacket(fd, "OK 8192", memfd.get());
    request = RecvPacket(fd);
    ASSERT_TRUE(request.ok());
    (void)SendPacket(fd, "ERR attachment att-2 does not exist");
    (void)RecvPacket(fd);
  });
  auto session = internal::Session::Open(address);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->token(), "t");
  auto slab = (*session)->FetchSlab("att-1");
  ASSERT_TRUE(slab.ok()) << slab.status();
  EXPECT_EQ(slab->bytes, 8192u);
  auto mapping = internal::SlabMapping::Create(slab->fd.get(), slab->bytes);
  ASSERT_TRUE(mapping.ok()) << mapping.status();
  slab->fd.Reset();  // the mapping stays valid without the fd
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*mapping)->data()) + 4096, 5), "ferry");

  auto refused = (*session)->FetchSlab("att-2");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("att-2 does not exist"));
  session->reset();
}

TEST(SessionTest, ALateAnswerIsNotTakenForTheNextRequestsAnswer) {
  TempDir dir;
  const std::string address = dir.path() + "/ferryd.sock";
  absl::Notification timed_out;
  FakeSessionServer server(address, [&](int fd) {
    (void)SendPacket(fd, "HELLO t 1");
    auto request = RecvPacket(fd);
    ASSERT_TRUE(request.ok());
    EXPECT_EQ(*request, "FD att-1");
    timed_out.WaitForNotification();  // a wedged ferryd answers after the client gave up
    UniqueFd memfd(memfd_create("slab", MFD_CLOEXEC));
    ASSERT_EQ(ftruncate(memfd.get(), 8192), 0);
    (void)SendPacket(fd, "OK 8192", memfd.get());
    request = RecvPacket(fd);
    ASSERT_TRUE(request.ok());
    EXPECT_EQ(*request, "FD att-2");
    (void)SendPacket(fd, "ERR attachment att-2 does not exist");
    (void)RecvPacket(fd);
  });
  auto session = internal::Session::Open(address, absl::Seconds(1));
  ASSERT_TRUE(session.ok()) << session.status();
  auto late = (*session)->FetchSlab("att-1");
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late.status().message(), HasSubstr("did not answer the slab request within 1s"));
  timed_out.Notify();
  // att-1's late answer (and its fd) arrive first; they are dropped, not handed to att-2.
  auto refused = (*session)->FetchSlab("att-2");
  ASSERT_FALSE(refused.ok()) << "att-2 was handed att-1's late slab";
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("att-2 does not exist"));
  session->reset();
}

TEST(SessionTest, DaemonGoneOnceTheSessionSocketCloses) {
  TempDir dir;
  const std::string address = dir.path() + "/ferryd.sock";
  absl::Notification checked_alive, closed;
  FakeSessionServer server(address, [&](int fd) {
    (void)SendPacket(fd, "HELLO t 1");
    checked_alive.WaitForNotification();
    shutdown(fd, SHUT_RDWR);  // what the kernel does to a killed ferryd's sockets
    closed.Notify();
  });
  auto session = internal::Session::Open(address);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_FALSE((*session)->DaemonGone());
  EXPECT_FALSE((*session)->DaemonGone()) << "asking twice changes nothing";
  checked_alive.Notify();
  closed.WaitForNotification();
  EXPECT_TRUE((*session)->DaemonGone());
}

// The session a client opens after a BYE: greets with token t2 (the same daemon, pid 7)
// and answers the slab request for att-1 that it does not exist.
void RenewedSessionRefusingAtt1(int fd) {
  (void)SendPacket(fd, "HELLO t2 7");
  auto request = RecvPacket(fd);
  ASSERT_TRUE(request.ok());
  EXPECT_EQ(*request, "FD att-1");
  (void)SendPacket(fd, "ERR attachment att-1 does not exist");
  (void)RecvPacket(fd);
}

TEST(SessionTest, AfterAByeTheNextUseOpensANewSessionAndTheDaemonIsNotGone) {
  TempDir dir;
  const std::string address = dir.path() + "/ferryd.sock";
  absl::Notification bye_sent;
  FakeSessionServer server(address,
                           {[&](int fd) {
                              (void)SendPacket(fd, "HELLO t1 7");
                              (void)SendPacket(fd, "BYE idle for 10m with no consumer attached");
                              bye_sent.Notify();  // and the connection closes, as ferryd closes it
                            },
                            RenewedSessionRefusingAtt1});
  auto session = internal::Session::Open(address);
  ASSERT_TRUE(session.ok()) << session.status();
  bye_sent.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(50));  // the close reaches this end
  EXPECT_FALSE((*session)->DaemonGone()) << "ferryd said BYE: it closed an idle session";
  EXPECT_EQ((*session)->token(), "t2");
  auto refused = (*session)->FetchSlab("att-1");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_FALSE((*session)->DaemonGone());
  session->reset();
}

TEST(SessionTest, AByeInPlaceOfAnAnswerAsksAgainOnANewSession) {
  TempDir dir;
  const std::string address = dir.path() + "/ferryd.sock";
  FakeSessionServer server(address,
                           {[&](int fd) {
                              (void)SendPacket(fd, "HELLO t1 7");
                              auto request = RecvPacket(fd);  // closed for idleness as it came
                              ASSERT_TRUE(request.ok());
                              (void)SendPacket(fd, "BYE idle for 10m with no consumer attached");
                            },
                            RenewedSessionRefusingAtt1});
  auto session = internal::Session::Open(address);
  ASSERT_TRUE(session.ok()) << session.status();
  auto refused = (*session)->FetchSlab("att-1");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("att-1 does not exist"));
  EXPECT_EQ((*session)->token(), "t2");
  session->reset();
}

TEST(SlabMappingTest, RefusesAFileSmallerThanAnnounced) {
  UniqueFd memfd(memfd_create("slab", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(memfd.get(), 4096), 0);
  auto mapping = internal::SlabMapping::Create(memfd.get(), 8192);
  ASSERT_FALSE(mapping.ok());
  EXPECT_THAT(mapping.status().message(), HasSubstr("holds 4096 bytes, ferryd announced 8192"));
}

TEST(JsonTest, MalformedJsonAndUnknownFieldsAreInvalidArgument) {
  v1::JobSpec spec;
  absl::Status bad = internal::FromJson(R"({"batch_size": )", "job spec (ferry.v1.JobSpec)", &spec);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("cannot parse job spec"));

  absl::Status unknown =
      internal::FromJson(R"({"batchsize": 3})", "job spec (ferry.v1.JobSpec)", &spec);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("batchsize"));

  // lowerCamelCase names are proto3 JSON too; printed back with proto names.
  ASSERT_TRUE(internal::FromJson(R"({"batchSize": 8, "dataset": {"tokens": {"seqLen": 4}}})",
                                 "job spec (ferry.v1.JobSpec)", &spec)
                  .ok());
  EXPECT_EQ(spec.dataset().tokens().seq_len(), 4u);
  EXPECT_THAT(internal::ToJson(spec), HasSubstr(R"("batch_size":8)"));
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(v1::UINT8), 1u);
  EXPECT_EQ(DTypeSize(v1::BFLOAT16), 2u);
  EXPECT_EQ(DTypeSize(v1::INT64), 8u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_UNSPECIFIED), 0u);
  EXPECT_EQ(DTypeName(v1::FLOAT32), "float32");
  EXPECT_EQ(DTypeName(v1::BOOL), "bool");
  EXPECT_EQ(DTypeName(static_cast<v1::DType>(99)), "unspecified");
}

v1::Field* AddField(v1::Job* job, const std::string& name, v1::DType dtype,
                    std::vector<int64_t> shape, uint64_t offset, uint64_t row_bytes) {
  v1::Field* f = job->add_fields();
  f->set_name(name);
  f->set_dtype(dtype);
  for (int64_t d : shape) f->add_shape(d);
  f->set_offset(offset);
  f->set_row_bytes(row_bytes);
  return f;
}

v1::Job ImageJob() {
  v1::Job job;
  job.set_id("j1");
  job.mutable_spec()->set_batch_size(4);
  AddField(&job, "image", v1::UINT8, {8, 8, 3}, 0, 192);
  AddField(&job, "label", v1::INT64, {}, 768, 8);
  job.set_slot_bytes(800);
  return job;
}

TEST(ValidateLayoutTest, AcceptsAConsistentLayout) {
  const v1::Job job = ImageJob();
  EXPECT_TRUE(internal::ValidateLayout(job, job.fields(), 4, 800, 3200).ok());
}

TEST(ValidateLayoutTest, RejectsFieldsThatOverrunTheSlot) {
  v1::Job job = ImageJob();
  job.mutable_fields(1)->set_offset(780);
  absl::Status status = internal::ValidateLayout(job, job.fields(), 4, 800, 3200);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("job 'j1'"));
  EXPECT_THAT(status.message(), HasSubstr("field 'label'"));
  EXPECT_THAT(status.message(), HasSubstr("overruns the slot of 800 bytes"));
}

TEST(ValidateLayoutTest, RejectsRowBytesThatDisagreeWithTheShape) {
  v1::Job job = ImageJob();
  job.mutable_fields(0)->set_row_bytes(100);
  EXPECT_THAT(internal::ValidateLayout(job, job.fields(), 4, 800, 3200).message(),
              HasSubstr("row_bytes 100, shape and uint8 imply 192"));
}

TEST(ValidateLayoutTest, RejectsSlotsBeyondTheSlab) {
  const v1::Job job = ImageJob();
  EXPECT_THAT(internal::ValidateLayout(job, job.fields(), 5, 800, 3200).message(),
              HasSubstr("5 slots of 800 bytes exceed the slab of 3200 bytes"));
}

// A device layout is checked as given, not the job's host one.
TEST(ValidateLayoutTest, ChecksTheFieldsItIsGiven) {
  const v1::Job job = ImageJob();
  v1::Job device;
  AddField(&device, "image", v1::FLOAT32, {3, 8, 8}, 0, 768);
  EXPECT_THAT(internal::ValidateLayout(job, device.fields(), 4, 800, 3200).message(),
              HasSubstr("field 'image' (offset 0, 4 rows of 768 bytes) overruns the slot"));
  EXPECT_TRUE(internal::ValidateLayout(job, device.fields(), 4, 3072, 4 * 3072).ok());
}

TEST(PackReleasesTest, RunsOfReleasesTravelInOneMessageInOrder) {
  std::vector<v1::ConsumeRequest> requests(6);
  auto release = [](v1::ConsumeRequest* r, uint32_t slot, int64_t seq) {
    r->mutable_release()->set_slot(slot);
    r->mutable_release()->set_seq(seq);
  };
  release(&requests[0], 3, 10);
  release(&requests[1], 4, 11);
  release(&requests[2], 5, 12);
  requests[3].mutable_start_epoch()->set_epoch(2);
  release(&requests[4], 6, 13);
  release(&requests[5], 7, 14);
  requests[5].mutable_release()->set_complete(true);
  const std::vector<size_t> counts = internal::PackReleases(&requests);
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(counts, (std::vector<size_t>{3, 1, 2}));
  EXPECT_EQ(requests[0].release().slot(), 3u);
  ASSERT_EQ(requests[0].releases_size(), 2);
  EXPECT_EQ(requests[0].releases(0).seq(), 11);
  EXPECT_EQ(requests[0].releases(1).seq(), 12);
  EXPECT_EQ(requests[1].start_epoch().epoch(), 2);
  EXPECT_EQ(requests[2].release().seq(), 13);
  ASSERT_EQ(requests[2].releases_size(), 1);
  EXPECT_TRUE(requests[2].releases(0).complete());
  std::vector<v1::ConsumeRequest> none;
  EXPECT_TRUE(internal::PackReleases(&none).empty());
}

// A run of 2 ranks, batches of 4, over 100 positions: a point after 3 batches each.
ResumePoint PointAfterThreeBatches() {
  EpochProgress deal{.positions = 100, .world_size = 2, .batch_size = 4};
  ResumePoint point;
  point.epoch = 5;
  point.positions = 100;
  point.world_size = 2;
  point.batch_size = 4;
  point.batches_done = 3;
  point.consumed = *deal.ConsumedAfter(3);
  return point;
}

TEST(PlanResumeTest, ARunDealtAlikeGoesOnWithTheDealAtItsBatch) {
  const ResumePoint point = PointAfterThreeBatches();
  EXPECT_EQ(point.consumed, (std::vector<EpochRange>{{0, 24}}));
  absl::StatusOr<ResumePlan> plan =
      PlanResume(point, EpochProgress{.positions = 100, .world_size = 2, .batch_size = 4});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->epoch, 5);
  EXPECT_TRUE(plan->dealt_after.empty());
  EXPECT_EQ(plan->first_batch, 3);
}

TEST(PlanResumeTest, AnotherDealIsDealtWhatThePointDidNotConsume) {
  const ResumePoint point = PointAfterThreeBatches();
  for (const EpochProgress& run :
       {EpochProgress{.positions = 100, .world_size = 3, .batch_size = 4},
        EpochProgress{.positions = 100, .world_size = 2, .batch_size = 8},
        EpochProgress{.positions = 100, .world_size = 2, .batch_size = 4, .drop_last = true}}) {
    absl::StatusOr<ResumePlan> plan = PlanResume(point, run);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->epoch, 5);
    EXPECT_EQ(plan->dealt_after, point.consumed);
    EXPECT_EQ(plan->first_batch, 0);
    // The new run's deal covers exactly what is left, once.
    EpochProgress rest = run;
    rest.consumed = plan->dealt_after;
    absl::StatusOr<int64_t> batches = rest.Batches();
    ASSERT_TRUE(batches.ok()) << batches.status();
    absl::StatusOr<std::vector<EpochRange>> after = rest.ConsumedAfter(*batches);
    ASSERT_TRUE(after.ok()) << after.status();
    // (drop_last leaves out what is short of a whole batch for every rank: 76 % 8.)
    EXPECT_EQ(*after, (std::vector<EpochRange>{{0, run.drop_last ? 96 : 100}}));
  }
}

TEST(PlanResumeTest, AnEpochConsumedWholeStartsTheNext) {
  ResumePoint point = PointAfterThreeBatches();
  point.consumed = {{0, 100}};
  point.batches_done = 13;
  absl::StatusOr<ResumePlan> plan =
      PlanResume(point, EpochProgress{.positions = 100, .world_size = 7, .batch_size = 3});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->epoch, 6);
  EXPECT_TRUE(plan->dealt_after.empty());
  EXPECT_EQ(plan->first_batch, 0);
}

TEST(PlanResumeTest, ADatasetThatChangedOrBadRangesAreRefusedSayingWhy) {
  ResumePoint point = PointAfterThreeBatches();
  absl::Status changed =
      PlanResume(point, EpochProgress{.positions = 101, .world_size = 2, .batch_size = 4}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(changed)) << changed;
  EXPECT_THAT(std::string(changed.message()), HasSubstr("dataset changed"));
  const EpochProgress run{.positions = 100, .world_size = 2, .batch_size = 4};
  point.consumed = {{10, 20}, {15, 30}};
  absl::Status overlapping = PlanResume(point, run).status();
  EXPECT_TRUE(absl::IsInvalidArgument(overlapping)) << overlapping;
  EXPECT_THAT(std::string(overlapping.message()), HasSubstr("ResumePoint.consumed"));
  point.consumed = {{0, 24}};
  point.resumed_from = {{90, 120}};
  absl::Status outside = PlanResume(point, run).status();
  EXPECT_THAT(std::string(outside.message()), HasSubstr("ResumePoint.resumed_from"));
  point.resumed_from.clear();
  point.batch_size = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(PlanResume(point, run).status()));
}

}  // namespace
}  // namespace ferry
