// The Consume stream over a batch channel, spoken by hand against an in-process ferryd:
// what a well-behaved trainer gets, and how ferryd ends the stream of one that is not.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/batch_channel.h"
#include "common/session_protocol.h"
#include "ferry/v1/ferry.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/service/daemon.h"

namespace ferry {
namespace {

constexpr int kSeqLen = 15;
constexpr int kSamples = 64;

class ConsumeChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat("/tmp/ferry-cc-", getpid());
    std::filesystem::create_directories(dir_);
    const std::string tokens = dir_ + "/tokens.bin";
    std::vector<uint16_t> data(kSeqLen * kSamples + 1);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint16_t>(i);
    std::ofstream(tokens, std::ios::binary)
        .write(reinterpret_cast<const char*>(data.data()),
               static_cast<std::streamsize>(data.size() * 2));
    DaemonOptions options;
    options.listen = dir_ + "/ferryd.sock";
    options.workers = 1;
    auto daemon = Daemon::Start(options);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    auto session = ConnectUnix(SessionSocketPath(options.listen), SOCK_SEQPACKET);
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = *std::move(session);
    auto hello = RecvPacket(session_.get());
    ASSERT_TRUE(hello.ok());
    std::vector<std::string> parts = absl::StrSplit(*hello, ' ');
    ASSERT_EQ(parts.size(), 3u);
    token_ = parts[1];
    stub_ = v1::Ferry::NewStub(grpc::CreateChannel(absl::StrCat("unix:", options.listen),
                                                   grpc::InsecureChannelCredentials()));
    v1::CreateJobRequest create;
    v1::TokensDataset* t = create.mutable_spec()->mutable_dataset()->mutable_tokens();
    t->set_path(tokens);
    t->set_token_dtype(v1::UINT16);
    t->set_seq_len(kSeqLen);
    create.mutable_spec()->set_batch_size(4);
    create.mutable_spec()->set_prefetch_depth(4);
    v1::CreateJobResponse created;
    grpc::ClientContext context;
    Prepare(&context);
    ASSERT_TRUE(stub_->CreateJob(&context, create, &created).ok());
    job_id_ = created.job().id();
  }

  void TearDown() override {
    stub_.reset();
    session_.Reset();
    if (daemon_) daemon_->Drain();
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Prepare(grpc::ClientContext* context) { context->AddMetadata(kSessionMetadataKey, token_); }

  // Attaches rank 0, waiting up to 5 s for ferryd to let go of a previous stream's rank.
  std::string Attach() {
    grpc::Status status;
    for (int attempt = 0; attempt < 100; ++attempt) {
      v1::AttachRequest request;
      request.set_job_id(job_id_);
      v1::AttachResponse response;
      grpc::ClientContext context;
      Prepare(&context);
      status = stub_->Attach(&context, request, &response);
      if (status.ok()) return response.attach_id();
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "Attach: " << status.error_message();
    return std::string();
  }

  // "CHANNEL <attach_id>" on the session socket: the answer's text, and the channel if OK.
  std::string FetchChannel(const std::string& attach_id, std::unique_ptr<BatchChannel>* out) {
    EXPECT_TRUE(SendPacket(session_.get(), absl::StrCat("CHANNEL ", attach_id)).ok());
    std::vector<UniqueFd> fds;
    auto answer = RecvPacket(session_.get(), &fds);
    EXPECT_TRUE(answer.ok());
    if (out != nullptr && fds.size() == 3) {
      memfd_ = UniqueFd(dup(fds[0].get()));  // for tests that write over the channel
      wake_out_ = UniqueFd(dup(fds[2].get()));
      auto channel = BatchChannel::Attach(std::move(fds[0]), std::move(fds[1]), std::move(fds[2]));
      EXPECT_TRUE(channel.ok()) << channel.status();
      if (channel.ok()) *out = *std::move(channel);
    }
    return answer.ok() ? *answer : std::string();
  }

  struct Stream {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::ConsumeRequest, v1::ConsumeResponse>> rw;
  };
  std::unique_ptr<Stream> Open(const std::string& attach_id, bool channel) {
    auto s = std::make_unique<Stream>();
    Prepare(&s->context);
    s->rw = stub_->Consume(&s->context);
    v1::ConsumeRequest open;
    open.mutable_open()->set_attach_id(attach_id);
    open.mutable_open()->set_channel(channel);
    EXPECT_TRUE(s->rw->Write(open));
    return s;
  }
  // The stream's final status (the server ends it; nothing arrives on it before).
  grpc::Status End(Stream& s) {
    v1::ConsumeResponse unexpected;
    EXPECT_FALSE(s.rw->Read(&unexpected)) << "a channel stream carries no messages";
    return s.rw->Finish();
  }

  // Attach, a fetched channel and a stream opened on it: what a client does.
  struct Consumer {
    std::unique_ptr<BatchChannel> channel;  // null when fetching failed (a test failure)
    std::unique_ptr<Stream> stream;
  };
  Consumer AttachAndOpen() {
    Consumer c;
    const std::string attach_id = Attach();
    const std::string answer = FetchChannel(attach_id, &c.channel);
    EXPECT_EQ(answer.rfind("OK ", 0), 0u) << answer;
    if (c.channel != nullptr) c.stream = Open(attach_id, /*channel=*/true);
    return c;
  }

  static ChannelMessage StartEpoch(int64_t epoch) {
    ChannelMessage m;
    m.kind = ChannelMessage::kStartEpoch;
    m.epoch = epoch;
    return m;
  }
  static ChannelMessage Next(BatchChannel& channel) {
    ChannelMessage m;
    // ReceiveOrWait may also return false early, woken by a wake-up whose message an
    // earlier call already took ("let the caller look around"): ask again until the
    // deadline, as the client library does.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    absl::StatusOr<bool> got = false;
    while (got.ok() && !*got && absl::Now() < deadline) {
      got = channel.ReceiveOrWait(&m, deadline - absl::Now());
    }
    EXPECT_TRUE(got.ok() && *got) << "no message from ferryd within 30 s: " << got.status();
    return m;
  }

  std::string dir_;
  std::unique_ptr<Daemon> daemon_;
  UniqueFd session_;
  std::string token_;
  std::unique_ptr<v1::Ferry::Stub> stub_;
  std::string job_id_;
  UniqueFd memfd_;     // of the last channel fetched
  UniqueFd wake_out_;  // its trainer -> ferryd wake socket
};

TEST_F(ConsumeChannelTest, AnEpochTravelsThroughTheChannelInOrder) {
  Consumer c = AttachAndOpen();
  ASSERT_NE(c.channel, nullptr);
  BatchChannel* channel = c.channel.get();
  auto& stream = c.stream;
  ASSERT_TRUE(channel->Send(StartEpoch(0)).ok());
  const int64_t batches = kSamples / 4;  // (tokens - 1) / seq_len samples, 4 per batch
  for (int64_t b = 0; b < batches; ++b) {
    ChannelMessage m = Next(*channel);
    ASSERT_EQ(m.kind, ChannelMessage::kBatchReady);
    EXPECT_EQ(m.seq, b);
    EXPECT_EQ(m.epoch, 0);
    EXPECT_EQ(m.batch, b);
    EXPECT_LT(m.slot, 4u);
    EXPECT_GE(m.num_samples, 1u);
    ChannelMessage release;
    release.kind = ChannelMessage::kRelease;
    release.slot = m.slot;
    release.seq = m.seq;
    ASSERT_TRUE(channel->Send(release).ok());
  }
  ChannelMessage end = Next(*channel);
  EXPECT_EQ(end.kind, ChannelMessage::kEpochEnd);
  EXPECT_EQ(end.epoch, 0);
  stream->context.TryCancel();
}

TEST_F(ConsumeChannelTest, OpenWithoutAFetchedChannelIsFailedPrecondition) {
  const std::string attach_id = Attach();
  auto stream = Open(attach_id, /*channel=*/true);
  grpc::Status status = End(*stream);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("CHANNEL " + attach_id), std::string::npos)
      << status.error_message();
}

TEST_F(ConsumeChannelTest, AChannelForAnUnknownAttachmentIsRefused) {
  const std::string answer = FetchChannel("nosuchattachment", nullptr);
  EXPECT_EQ(answer.rfind("ERR ", 0), 0u) << answer;
  EXPECT_NE(answer.find("unknown attach_id"), std::string::npos) << answer;
}

TEST_F(ConsumeChannelTest, AReleaseOfASlotNotLeasedEndsTheStream) {
  Consumer c = AttachAndOpen();
  ASSERT_NE(c.channel, nullptr);
  BatchChannel* channel = c.channel.get();
  auto& stream = c.stream;
  ASSERT_TRUE(channel->Send(StartEpoch(0)).ok());
  ChannelMessage first = Next(*channel);
  ChannelMessage release;
  release.kind = ChannelMessage::kRelease;
  release.slot = first.slot;
  release.seq = first.seq + 7;  // not what the slot was leased under
  ASSERT_TRUE(channel->Send(release).ok());
  grpc::Status status = End(*stream);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
}

TEST_F(ConsumeChannelTest, AnUnknownMessageKindEndsTheStream) {
  Consumer c = AttachAndOpen();
  ASSERT_NE(c.channel, nullptr);
  BatchChannel* channel = c.channel.get();
  auto& stream = c.stream;
  ChannelMessage bogus;
  bogus.kind = ChannelMessage::kBatchReady;  // ferryd's kind, not the trainer's
  ASSERT_TRUE(channel->Send(bogus).ok());
  grpc::Status status = End(*stream);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("kind 1"), std::string::npos) << status.error_message();
}

TEST_F(ConsumeChannelTest, AChannelTheTrainerWroteOverEndsItsStreamAndTheRankAttachesAgain) {
  Consumer c = AttachAndOpen();
  ASSERT_NE(c.channel, nullptr);
  BatchChannel* channel = c.channel.get();
  auto& stream = c.stream;
  // Claim 1000 unread messages in the trainer -> daemon ring (its head: bytes 256..264).
  ASSERT_TRUE(memfd_.valid());
  void* raw = mmap(nullptr, channel->bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, memfd_.get(), 0);
  ASSERT_NE(raw, MAP_FAILED);
  const uint64_t bogus = 1000;
  memcpy(static_cast<uint8_t*>(raw) + 256, &bogus, sizeof(bogus));
  munmap(raw, channel->bytes());
  ASSERT_EQ(send(wake_out_.get(), "x", 1, 0), 1);  // wake ferryd's channel thread
  grpc::Status status = End(*stream);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS) << status.error_message();

  // The rank is free again: a fresh attach with a fresh channel delivers.
  Consumer again = AttachAndOpen();  // Attach waits for ferryd to unbind the old stream
  ASSERT_NE(again.channel, nullptr);
  BatchChannel* fresh = again.channel.get();
  auto& second = again.stream;
  ASSERT_TRUE(fresh->Send(StartEpoch(1)).ok());
  ChannelMessage m = Next(*fresh);
  EXPECT_EQ(m.kind, ChannelMessage::kBatchReady);
  EXPECT_EQ(m.epoch, 1);
  second->context.TryCancel();
}

}  // namespace
}  // namespace ferry
