// Client library tests that need no ferryd: spec <-> JSON conversion, layout validation,
// slab mapping, and the session socket against a scripted fake daemon.
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
#include "client/cpp/internal/convert.h"
#include "client/cpp/internal/session.h"
#include "common/error_reason.h"
#include "common/session_protocol.h"
#include "ferry/v1/ferry.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace ferry {
namespace transforms {

// Field-for-field equality of the composed transform's ops, for the round-trip tests (the
// public header stays C++17, without defaulted comparisons). Here, not in an unnamed
// namespace, so that std::variant's operator== finds them by argument-dependent lookup.
bool operator==(const RandomResizedCrop& a, const RandomResizedCrop& b) {
  return std::tie(a.size, a.scale, a.ratio, a.full_decode) ==
         std::tie(b.size, b.scale, b.ratio, b.full_decode);
}
bool operator==(const Resize& a, const Resize& b) {
  return std::tie(a.size, a.full_decode) == std::tie(b.size, b.full_decode);
}
bool operator==(const CenterCrop& a, const CenterCrop& b) { return a.size == b.size; }
bool operator==(const RandomCrop& a, const RandomCrop& b) {
  return std::tie(a.size, a.padding, a.pad_if_needed, a.fill, a.padding_mode) ==
         std::tie(b.size, b.padding, b.pad_if_needed, b.fill, b.padding_mode);
}
bool operator==(const RandomHorizontalFlip& a, const RandomHorizontalFlip& b) { return a.p == b.p; }
bool operator==(const RandomVerticalFlip& a, const RandomVerticalFlip& b) { return a.p == b.p; }
bool operator==(const ColorJitter& a, const ColorJitter& b) {
  return std::tie(a.brightness, a.contrast, a.saturation, a.hue) ==
         std::tie(b.brightness, b.contrast, b.saturation, b.hue);
}
bool operator==(const RandomGrayscale& a, const RandomGrayscale& b) { return a.p == b.p; }
bool operator==(const TrivialAugmentWide& a, const TrivialAugmentWide& b) {
  return std::tie(a.num_magnitude_bins, a.fill) == std::tie(b.num_magnitude_bins, b.fill);
}
bool operator==(const Normalize& a, const Normalize& b) {
  return std::tie(a.mean, a.std) == std::tie(b.mean, b.std);
}
bool operator==(const RandomErasing& a, const RandomErasing& b) {
  return std::tie(a.p, a.scale, a.ratio, a.value) == std::tie(b.p, b.scale, b.ratio, b.value);
}

}  // namespace transforms

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

TEST(JobOptionsJsonTest, ImageFolderRoundTrip) {
  JobOptions options;
  options.dataset = ImageFolderOptions{"/data/train"};
  RandomResizedCropOptions rrc;
  rrc.size = 224;
  rrc.flip = true;
  options.transform = rrc;
  options.batch_size = 256;
  options.shuffle = true;
  options.seed = 7;
  options.world_size = 8;
  options.device = "cuda:3";
  const std::string json = JobOptionsToJson(options);
  EXPECT_THAT(json, HasSubstr(R"("image_folder":{"root":"/data/train","exif_orientation":false})"));
  EXPECT_THAT(json, HasSubstr(R"("batch_size":256)"));
  EXPECT_THAT(json, HasSubstr(R"("seed":"7")"));  // uint64 is a string in proto3 JSON

  auto parsed = JobOptionsFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(std::holds_alternative<ImageFolderOptions>(parsed->dataset));
  EXPECT_EQ(std::get<ImageFolderOptions>(parsed->dataset).root, "/data/train");
  ASSERT_TRUE(std::holds_alternative<RandomResizedCropOptions>(parsed->transform));
  const auto& t = std::get<RandomResizedCropOptions>(parsed->transform);
  EXPECT_EQ(t.size, 224u);
  EXPECT_TRUE(t.flip);
  EXPECT_FLOAT_EQ(t.scale_min, 0.08f);
  EXPECT_FLOAT_EQ(t.ratio_max, 4.0f / 3.0f);
  EXPECT_EQ(parsed->batch_size, 256u);
  EXPECT_TRUE(parsed->shuffle);
  EXPECT_EQ(parsed->seed, 7u);
  EXPECT_EQ(parsed->world_size, 8u);
  EXPECT_EQ(parsed->device, "cuda:3");
  EXPECT_FALSE(std::get<ImageFolderOptions>(parsed->dataset).exif_orientation);

  // exif_orientation travels both ways.
  options.dataset = ImageFolderOptions{"/data/train", /*exif_orientation=*/true};
  const std::string with_exif = JobOptionsToJson(options);
  EXPECT_THAT(with_exif,
              HasSubstr(R"("image_folder":{"root":"/data/train","exif_orientation":true})"));
  parsed = JobOptionsFromJson(with_exif);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(std::get<ImageFolderOptions>(parsed->dataset).exif_orientation);
}

TEST(JobOptionsJsonTest, WebDatasetRoundTrip) {
  JobOptions options;
  WebDatasetOptions wds;
  wds.shards = {"/data/train-{000..009}.tar"};
  wds.image_key = "png";
  wds.exif_orientation = true;
  options.dataset = wds;
  options.transform = CenterCropOptions{224, 0};
  options.batch_size = 8;
  const std::string json = JobOptionsToJson(options);
  EXPECT_THAT(json, HasSubstr(R"("image_key":"png")"));
  EXPECT_THAT(json, HasSubstr(R"("exif_orientation":true)"));
  auto parsed = JobOptionsFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(std::holds_alternative<WebDatasetOptions>(parsed->dataset));
  const auto& back = std::get<WebDatasetOptions>(parsed->dataset);
  EXPECT_EQ(back.shards, wds.shards);
  EXPECT_EQ(back.image_key, "png");
  EXPECT_EQ(back.label_key, "cls");
  EXPECT_TRUE(back.exif_orientation);
}

TEST(JobOptionsJsonTest, TokensFromHandWrittenJsonWithCamelCaseNames) {
  auto parsed = JobOptionsFromJson(
      R"({"dataset":{"tokens":{"path":"/d/t.bin","tokenDtype":"UINT32","seqLen":2048}},
          "batchSize":8,"dropLast":true})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(std::holds_alternative<TokensOptions>(parsed->dataset));
  const auto& tokens = std::get<TokensOptions>(parsed->dataset);
  EXPECT_EQ(tokens.path, "/d/t.bin");
  EXPECT_EQ(tokens.token_dtype, DType::kUint32);
  EXPECT_EQ(tokens.seq_len, 2048u);
  EXPECT_EQ(tokens.output_dtype, DType::kUnspecified);  // left to the daemon's default
  EXPECT_TRUE(std::holds_alternative<std::monostate>(parsed->transform));
  EXPECT_EQ(parsed->batch_size, 8u);
  EXPECT_TRUE(parsed->drop_last);
}

TEST(JobOptionsJsonTest, TokensWidenedOnTheHostRoundTrip) {
  JobOptions options;
  TokensOptions tokens;
  tokens.path = "/d/t.bin";
  tokens.seq_len = 16;
  tokens.widen_on_host = true;
  options.dataset = tokens;
  options.device = "cuda:0";
  const std::string json = JobOptionsToJson(options);
  EXPECT_THAT(json, HasSubstr(R"("widen_on_host":true)"));
  auto parsed = JobOptionsFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(std::holds_alternative<TokensOptions>(parsed->dataset));
  EXPECT_TRUE(std::get<TokensOptions>(parsed->dataset).widen_on_host);
  auto camel = JobOptionsFromJson(
      R"({"dataset":{"tokens":{"path":"/d/t.bin","seqLen":4,"widenOnHost":true}}})");
  ASSERT_TRUE(camel.ok()) << camel.status();
  EXPECT_TRUE(std::get<TokensOptions>(camel->dataset).widen_on_host);
}

TEST(JobOptionsJsonTest, BlendRoundTripKeepsEverySource) {
  JobOptions options;
  BlendOptions blend;
  IndexedOptions wiki;
  wiki.path_prefix = "/d/wiki_text_document";
  wiki.seq_len = 2048;
  wiki.widen_on_host = true;
  TokenShardsOptions web;
  web.shards = {"/d/web-{000..127}.bin"};
  web.seq_len = 2048;
  blend.sources.push_back({.dataset = wiki, .weight = 0.3, .name = "wiki"});
  blend.sources.push_back({.dataset = web, .weight = 0.7, .name = ""});
  blend.samples_per_epoch = 1000000;
  options.dataset = blend;
  options.batch_size = 8;
  const std::string json = JobOptionsToJson(options);
  EXPECT_THAT(json, HasSubstr(R"("samples_per_epoch":"1000000")"));
  auto parsed = JobOptionsFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(std::holds_alternative<BlendOptions>(parsed->dataset));
  const auto& back = std::get<BlendOptions>(parsed->dataset);
  ASSERT_EQ(back.sources.size(), 2u);
  EXPECT_EQ(back.samples_per_epoch, 1000000u);
  EXPECT_EQ(back.sources[0].name, "wiki");
  EXPECT_DOUBLE_EQ(back.sources[0].weight, 0.3);
  ASSERT_TRUE(std::holds_alternative<IndexedOptions>(back.sources[0].dataset));
  EXPECT_EQ(std::get<IndexedOptions>(back.sources[0].dataset).path_prefix, wiki.path_prefix);
  EXPECT_TRUE(std::get<IndexedOptions>(back.sources[0].dataset).widen_on_host);
  ASSERT_TRUE(std::holds_alternative<TokenShardsOptions>(back.sources[1].dataset));
  EXPECT_EQ(std::get<TokenShardsOptions>(back.sources[1].dataset).shards, web.shards);
  EXPECT_DOUBLE_EQ(back.sources[1].weight, 0.7);
}

TEST(JobOptionsJsonTest, TokenShardsRoundTripAndCamelCase) {
  JobOptions options;
  TokenShardsOptions shards;
  shards.shards = {"/d/train-{000..127}.bin", "/d/extra.bin"};
  shards.token_dtype = DType::kUint32;
  shards.seq_len = 1024;
  shards.windows_cross_files = true;
  options.dataset = shards;
  const std::string json = JobOptionsToJson(options);
  EXPECT_THAT(json, HasSubstr(R"("token_shards":{"shards":["/d/train-{000..127}.bin")"));
  auto parsed = JobOptionsFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(std::holds_alternative<TokenShardsOptions>(parsed->dataset));
  const auto& got = std::get<TokenShardsOptions>(parsed->dataset);
  EXPECT_EQ(got.shards, shards.shards);
  EXPECT_EQ(got.token_dtype, DType::kUint32);
  EXPECT_EQ(got.seq_len, 1024u);
  EXPECT_TRUE(got.windows_cross_files);
  EXPECT_FALSE(got.widen_on_host);
  auto camel = JobOptionsFromJson(
      R"({"dataset":{"tokenShards":{"shards":["/d/a.bin"],"seqLen":4,"windowsCrossFiles":true}}})");
  ASSERT_TRUE(camel.ok()) << camel.status();
  EXPECT_TRUE(std::get<TokenShardsOptions>(camel->dataset).windows_cross_files);
}

TEST(JobOptionsJsonTest, IndexedRoundTripAndCamelCase) {
  JobOptions options;
  IndexedOptions indexed;
  indexed.path_prefix = "/d/wiki_text_document";
  indexed.seq_len = 2048;
  indexed.cu_seqlens = true;
  options.dataset = indexed;
  const std::string json = JobOptionsToJson(options);
  EXPECT_THAT(json, HasSubstr(R"("indexed":{"path_prefix":"/d/wiki_text_document")"));
  auto parsed = JobOptionsFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_TRUE(std::holds_alternative<IndexedOptions>(parsed->dataset));
  const auto& got = std::get<IndexedOptions>(parsed->dataset);
  EXPECT_EQ(got.path_prefix, "/d/wiki_text_document");
  EXPECT_EQ(got.seq_len, 2048u);
  EXPECT_TRUE(got.cu_seqlens);
  EXPECT_FALSE(got.position_ids);
  auto camel = JobOptionsFromJson(
      R"({"dataset":{"indexed":{"pathPrefix":"/d/x","seqLen":4,"positionIds":true}}})");
  ASSERT_TRUE(camel.ok()) << camel.status();
  EXPECT_TRUE(std::get<IndexedOptions>(camel->dataset).position_ids);
}

TEST(JobOptionsJsonTest, MalformedJsonAndUnknownFieldsAreInvalidArgument) {
  auto bad = JobOptionsFromJson(R"({"batch_size": )");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("cannot parse job spec"));

  auto unknown = JobOptionsFromJson(R"({"batchsize": 3})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("batchsize"));
}

// The ops of `parsed`'s ComposeOptions; fails the test when it holds another transform.
std::vector<TransformOpOptions> ComposedOps(const absl::StatusOr<JobOptions>& parsed) {
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (!parsed.ok()) return {};
  const auto* compose = std::get_if<ComposeOptions>(&parsed->transform);
  EXPECT_NE(compose, nullptr) << "transform index " << parsed->transform.index();
  return compose != nullptr ? compose->ops : std::vector<TransformOpOptions>{};
}

TEST(JobOptionsJsonTest, ComposedViTRecipeRoundTrips) {
  JobOptions options;
  options.dataset = ImageFolderOptions{"/data/train"};
  options.transform = ComposeOptions{
      .ops = {
          transforms::RandomResizedCrop{.size = 224}, transforms::RandomHorizontalFlip{},
          transforms::TrivialAugmentWide{},
          transforms::ColorJitter{.brightness = {0.4f}, .contrast = {0.4f}, .saturation = {0.4f}},
          transforms::Normalize{.mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}},
          transforms::RandomErasing{.p = 0.25f}}};
  options.batch_size = 256;
  options.device = "cuda:0";
  const std::string json = JobOptionsToJson(options);
  // Proto field names, every op field printed, torchvision's defaults sent as values.
  EXPECT_THAT(json, HasSubstr(R"("transform":{"compose":{"ops":[{"random_resized_crop":)"
                              R"({"size":224,"scale":[0.08,1],"ratio":[0.75,1.33333337],)"
                              R"("full_decode":false}},{"random_horizontal_flip":{"p":0.5}},)"
                              R"({"trivial_augment_wide":{"num_magnitude_bins":31,"fill":[]}},)"
                              R"({"color_jitter":{"brightness":[0.4],"contrast":[0.4],)"
                              R"("saturation":[0.4],"hue":[]}},{"normalize":{"mean":[0.485,)"))
      << json;
  // An optional p, when set, prints after the lists.
  EXPECT_THAT(json, HasSubstr(R"({"random_erasing":{"scale":[0.02,0.33],"ratio":[0.3,3.3],)"
                              R"("value":[0],"p":0.25}}]}})"))
      << json;

  auto parsed = JobOptionsFromJson(json);
  EXPECT_TRUE(ComposedOps(parsed) == std::get<ComposeOptions>(options.transform).ops) << json;
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(JobOptionsToJson(*parsed), json);
  EXPECT_EQ(parsed->transform.index(), 3u);  // appended: the older kinds keep 1 and 2
}

TEST(JobOptionsJsonTest, ComposedCifarRecipeRoundTrips) {
  JobOptions options;
  options.dataset = ImageFolderOptions{"/data/cifar10/train"};
  const std::vector<TransformOpOptions> ops = {
      transforms::RandomCrop{.size = 32, .padding = {4}}, transforms::RandomHorizontalFlip{},
      transforms::Normalize{.mean = {0.4914f, 0.4822f, 0.4465f}, .std = {0.247f, 0.243f, 0.261f}}};
  options.transform = ComposeOptions{.ops = ops};
  options.batch_size = 128;
  const std::string json = JobOptionsToJson(options);
  EXPECT_THAT(json, HasSubstr(R"({"random_crop":{"size":32,"padding":[4],"pad_if_needed":false,)"
                              R"("fill":[0],"padding_mode":"constant"}})"))
      << json;
  EXPECT_TRUE(ComposedOps(JobOptionsFromJson(json)) == ops) << json;

  // Every other field of RandomCrop, a vertical flip and a grayscale travel too.
  const std::vector<TransformOpOptions> more = {transforms::Resize{.size = 40, .full_decode = true},
                                                transforms::RandomCrop{.size = 32,
                                                                       .padding = {1, 2, 3, 4},
                                                                       .pad_if_needed = true,
                                                                       .fill = {10, 20, 30},
                                                                       .padding_mode = "reflect"},
                                                transforms::RandomVerticalFlip{.p = 0.0f},
                                                transforms::RandomGrayscale{.p = 1.0f},
                                                transforms::ColorJitter{.hue = {-0.1f, 0.2f}},
                                                transforms::CenterCrop{.size = 28}};
  options.transform = ComposeOptions{.ops = more};
  const std::string more_json = JobOptionsToJson(options);
  EXPECT_THAT(more_json, HasSubstr(R"({"random_vertical_flip":{"p":0}})")) << more_json;
  EXPECT_TRUE(ComposedOps(JobOptionsFromJson(more_json)) == more) << more_json;
}

TEST(JobOptionsJsonTest, ComposedOpsKeepTorchvisionDefaultsAndUnsetFields) {
  // Default-constructed ops carry torchvision's values and come back with them.
  const std::vector<TransformOpOptions> defaults = {
      transforms::RandomResizedCrop{.size = 224}, transforms::RandomHorizontalFlip{},
      transforms::RandomVerticalFlip{},           transforms::RandomGrayscale{},
      transforms::TrivialAugmentWide{},           transforms::RandomErasing{},
      transforms::RandomCrop{.size = 32}};
  JobOptions options;
  options.transform = ComposeOptions{.ops = defaults};
  std::vector<TransformOpOptions> back = ComposedOps(JobOptionsFromJson(JobOptionsToJson(options)));
  ASSERT_EQ(back.size(), defaults.size());
  EXPECT_TRUE(back == defaults);
  const auto& rrc = std::get<transforms::RandomResizedCrop>(back[0]);
  EXPECT_EQ(rrc.scale, (std::vector<float>{0.08f, 1.0f}));
  EXPECT_EQ(rrc.ratio, (std::vector<float>{3.0f / 4.0f, 4.0f / 3.0f}));
  EXPECT_EQ(std::get<transforms::RandomHorizontalFlip>(back[1]).p, 0.5f);
  EXPECT_EQ(std::get<transforms::RandomVerticalFlip>(back[2]).p, 0.5f);
  EXPECT_EQ(std::get<transforms::RandomGrayscale>(back[3]).p, 0.1f);
  EXPECT_EQ(std::get<transforms::TrivialAugmentWide>(back[4]).num_magnitude_bins, 31u);
  const auto& erasing = std::get<transforms::RandomErasing>(back[5]);
  EXPECT_EQ(erasing.p, 0.5f);
  EXPECT_EQ(erasing.scale, (std::vector<float>{0.02f, 0.33f}));
  EXPECT_EQ(erasing.ratio, (std::vector<float>{0.3f, 3.3f}));
  EXPECT_EQ(erasing.value, (std::vector<float>{0.0f}));
  EXPECT_EQ(std::get<transforms::RandomCrop>(back[6]).padding_mode, "constant");

  // Fields a hand-written spec leaves unset (ferryd's defaults) stay unset: p is nullopt,
  // not 0 and not 0.5, and the JSON made again has no "p". An explicit p of 0 stays 0.
  const std::string sparse =
      R"({"transform":{"compose":{"ops":[{"random_resized_crop":{"size":224}},)"
      R"({"randomHorizontalFlip":{}},{"random_grayscale":{"p":0}},{"random_erasing":{}}]}}})";
  auto parsed = JobOptionsFromJson(sparse);
  back = ComposedOps(parsed);
  ASSERT_EQ(back.size(), 4u);
  EXPECT_TRUE(std::get<transforms::RandomResizedCrop>(back[0]).scale.empty());
  EXPECT_EQ(std::get<transforms::RandomHorizontalFlip>(back[1]).p, std::nullopt);
  EXPECT_EQ(std::get<transforms::RandomGrayscale>(back[2]).p, 0.0f);
  EXPECT_EQ(std::get<transforms::RandomErasing>(back[3]).p, std::nullopt);
  EXPECT_TRUE(std::get<transforms::RandomErasing>(back[3]).value.empty());
  const std::string again = JobOptionsToJson(*parsed);
  EXPECT_THAT(again, HasSubstr(R"({"random_horizontal_flip":{}})")) << again;
  EXPECT_THAT(again, HasSubstr(R"({"random_grayscale":{"p":0}})")) << again;
  EXPECT_THAT(again, HasSubstr(R"({"random_erasing":{"scale":[],"ratio":[],"value":[]}})"))
      << again;
  EXPECT_TRUE(ComposedOps(JobOptionsFromJson(again)) == back);
}

TEST(JobOptionsJsonTest, UnknownOrEmptyComposedOpIsInvalidArgument) {
  auto unknown = JobOptionsFromJson(
      R"({"transform":{"compose":{"ops":[{"resize":{"size":256}},{"random_rotation":{}}]}}})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("random_rotation"));

  auto empty =
      JobOptionsFromJson(R"({"transform":{"compose":{"ops":[{"resize":{"size":256}},{}]}}})");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("transform.compose.ops[1] sets no op"));
}

TEST(JobOptionsProtoTest, AnOpThisClientDoesNotKnowKeepsItsPlace) {
  // A newer ferryd's op arrives as a TransformOp with no op this client knows: it stays in
  // its position as a monostate and goes back as an empty op (which ferryd refuses by name).
  v1::JobSpec spec;
  v1::Compose* compose = spec.mutable_transform()->mutable_compose();
  compose->add_ops()->mutable_center_crop()->set_size(224);
  compose->add_ops();
  compose->add_ops()->mutable_random_horizontal_flip();
  const JobOptions options = internal::FromProto(spec);
  const auto& ops = std::get<ComposeOptions>(options.transform).ops;
  ASSERT_EQ(ops.size(), 3u);
  EXPECT_TRUE(std::holds_alternative<transforms::CenterCrop>(ops[0]));
  EXPECT_TRUE(std::holds_alternative<std::monostate>(ops[1]));
  EXPECT_EQ(std::get<transforms::RandomHorizontalFlip>(ops[2]).p, std::nullopt);
  const v1::JobSpec sent = internal::ToProto(options);
  ASSERT_EQ(sent.transform().compose().ops_size(), 3);
  EXPECT_EQ(sent.transform().compose().ops(1).op_case(), v1::TransformOp::OP_NOT_SET);
  EXPECT_FALSE(sent.transform().compose().ops(2).random_horizontal_flip().has_p());
}

TEST(JobStatusProtoTest, GpuDecodeCarriesCountsFallbacksAndCosts) {
  v1::JobStatus status;
  v1::GpuDecodeStatus* g = status.mutable_gpu_decode();
  g->set_mode("auto");
  g->set_gpu_images(120345);
  g->set_cpu_images(30100);
  v1::ReasonCount* progressive = g->add_fallbacks();
  progressive->set_reason("progressive");
  progressive->set_count(812);
  v1::ReasonCount* not_jpeg = g->add_fallbacks();
  not_jpeg->set_reason("not_jpeg");
  not_jpeg->set_count(2);
  g->set_gpu_share(0.81);
  g->set_cpu_ms_per_image(1.95);
  g->set_gpu_ms_per_image(0.041);
  const JobStatus out = internal::FromProto(status);
  ASSERT_TRUE(out.gpu_decode.has_value());
  const JobStatus::GpuDecode& gpu = *out.gpu_decode;
  EXPECT_EQ(gpu.mode, "auto");
  EXPECT_EQ(gpu.off, "");
  EXPECT_EQ(gpu.gpu_images, 120345);
  EXPECT_EQ(gpu.cpu_images, 30100);
  ASSERT_EQ(gpu.fallbacks.size(), 2u);
  EXPECT_EQ(gpu.fallbacks[0].reason, "progressive");
  EXPECT_EQ(gpu.fallbacks[0].count, 812);
  EXPECT_EQ(gpu.fallbacks[1].reason, "not_jpeg");
  EXPECT_EQ(gpu.fallbacks[1].count, 2);
  EXPECT_DOUBLE_EQ(gpu.gpu_share, 0.81);
  EXPECT_DOUBLE_EQ(gpu.cpu_ms_per_image, 1.95);
  EXPECT_DOUBLE_EQ(gpu.gpu_ms_per_image, 0.041);
}

TEST(JobStatusProtoTest, GpuDecodeOffKeepsTheReasonAndAbsentStaysAbsent) {
  v1::JobStatus off;
  off.mutable_gpu_decode()->set_off("GPU JPEG decode is off: the daemon's gpu_decode is \"cpu\"");
  const JobStatus out = internal::FromProto(off);
  ASSERT_TRUE(out.gpu_decode.has_value());
  EXPECT_EQ(out.gpu_decode->mode, "");
  EXPECT_EQ(out.gpu_decode->off, "GPU JPEG decode is off: the daemon's gpu_decode is \"cpu\"");
  EXPECT_TRUE(out.gpu_decode->fallbacks.empty());

  // A token job (or an older ferryd) sends no gpu_decode at all.
  EXPECT_FALSE(internal::FromProto(v1::JobStatus()).gpu_decode.has_value());
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kUint8), 1u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kInt64), 8u);
  EXPECT_EQ(DTypeSize(DType::kUnspecified), 0u);
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_EQ(DTypeName(static_cast<DType>(99)), "unspecified");
}

JobInfo ImageJob() {
  JobInfo job;
  job.id = "j1";
  job.spec.batch_size = 4;
  job.fields.push_back({"image", DType::kUint8, {8, 8, 3}, 0, 192});
  job.fields.push_back({"label", DType::kInt64, {}, 768, 8});
  job.slot_bytes = 800;
  return job;
}

TEST(ValidateLayoutTest, AcceptsAConsistentLayout) {
  EXPECT_TRUE(internal::ValidateLayout(ImageJob(), 4, 800, 3200).ok());
}

TEST(ValidateLayoutTest, RejectsFieldsThatOverrunTheSlot) {
  JobInfo job = ImageJob();
  job.fields[1].offset = 780;
  absl::Status status = internal::ValidateLayout(job, 4, 800, 3200);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("field 'label'"));
  EXPECT_THAT(status.message(), HasSubstr("overruns the slot of 800 bytes"));
}

TEST(ValidateLayoutTest, RejectsRowBytesThatDisagreeWithTheShape) {
  JobInfo job = ImageJob();
  job.fields[0].row_bytes = 100;
  EXPECT_THAT(internal::ValidateLayout(job, 4, 800, 3200).message(),
              HasSubstr("row_bytes 100, shape and uint8 imply 192"));
}

TEST(ValidateLayoutTest, RejectsSlotsBeyondTheSlab) {
  EXPECT_THAT(internal::ValidateLayout(ImageJob(), 5, 800, 3200).message(),
              HasSubstr("5 slots of 800 bytes exceed the slab of 3200 bytes"));
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

}  // namespace
}  // namespace ferry
