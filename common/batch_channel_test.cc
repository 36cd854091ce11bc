#include "common/batch_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

struct Pair {
  std::unique_ptr<BatchChannel> daemon;
  std::unique_ptr<BatchChannel> trainer;
};

// Both ends in this process, the trainer's through its own fds and mapping, as after the
// hand-over on the session socket.
Pair MakePair(uint32_t capacity) {
  auto daemon = BatchChannel::Create(capacity);
  EXPECT_TRUE(daemon.ok()) << daemon.status();
  const std::vector<int> fds = (*daemon)->HandoverFds();
  auto trainer =
      BatchChannel::Attach(UniqueFd(dup(fds[0])), UniqueFd(dup(fds[1])), UniqueFd(dup(fds[2])));
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  return Pair{*std::move(daemon), *std::move(trainer)};
}

ChannelMessage Batch(int64_t seq) {
  ChannelMessage m;
  m.kind = ChannelMessage::kBatchReady;
  m.slot = static_cast<uint32_t>(seq % 7);
  m.seq = seq;
  m.epoch = 3;
  m.batch = seq + 10;
  m.num_samples = 64;
  return m;
}

TEST(BatchChannelTest, MessagesArriveInOrderAcrossManyWrapArounds) {
  Pair p = MakePair(3);
  EXPECT_EQ(p.daemon->capacity(), 4u) << "rounded up to a power of two";
  int64_t sent = 0, received = 0;
  for (int round = 0; round < 1000; ++round) {
    const int n = 1 + round % 4;
    for (int i = 0; i < n; ++i) ASSERT_TRUE(p.daemon->Send(Batch(sent++)).ok());
    ChannelMessage m;
    for (int i = 0; i < n; ++i) {
      auto got = p.trainer->Receive(&m);
      ASSERT_TRUE(got.ok() && *got) << got.status();
      EXPECT_EQ(m.seq, received);
      EXPECT_EQ(m.batch, received + 10);
      EXPECT_EQ(m.slot, static_cast<uint32_t>(received % 7));
      ++received;
    }
    auto empty = p.trainer->Receive(&m);
    ASSERT_TRUE(empty.ok());
    EXPECT_FALSE(*empty);
  }
}

TEST(BatchChannelTest, FullRingIsResourceExhaustedAndNothingIsLost) {
  Pair p = MakePair(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p.daemon->Send(Batch(i)).ok());
  absl::Status full = p.daemon->Send(Batch(4));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("not reading"), std::string::npos) << full;
  ChannelMessage m;
  ASSERT_TRUE(*p.trainer->Receive(&m));
  EXPECT_EQ(m.seq, 0);
  ASSERT_TRUE(p.daemon->Send(Batch(4)).ok()) << "one read frees one entry";
  for (int i = 1; i <= 4; ++i) {
    ASSERT_TRUE(*p.trainer->Receive(&m));
    EXPECT_EQ(m.seq, i);
  }
}

TEST(BatchChannelTest, TheTwoDirectionsAreSeparateRings) {
  Pair p = MakePair(8);
  ChannelMessage release;
  release.kind = ChannelMessage::kRelease;
  release.slot = 5;
  release.seq = 42;
  release.flags = ChannelMessage::kReleaseComplete;
  ASSERT_TRUE(p.trainer->Send(release).ok());
  ASSERT_TRUE(p.daemon->Send(Batch(0)).ok());
  ChannelMessage m;
  ASSERT_TRUE(*p.daemon->Receive(&m));
  EXPECT_EQ(m.kind, ChannelMessage::kRelease);
  EXPECT_EQ(m.slot, 5u);
  EXPECT_EQ(m.seq, 42);
  EXPECT_EQ(m.flags, ChannelMessage::kReleaseComplete);
  EXPECT_FALSE(*p.daemon->Receive(&m)) << "the daemon does not read its own messages";
  ASSERT_TRUE(*p.trainer->Receive(&m));
  EXPECT_EQ(m.kind, ChannelMessage::kBatchReady);
}

TEST(BatchChannelTest, TheMemfdIsSealedAgainstResizing) {
  Pair p = MakePair(8);
  const int memfd = p.daemon->HandoverFds()[0];
  EXPECT_NE(ftruncate(memfd, 0), 0);
  EXPECT_EQ(errno, EPERM) << "a trainer must not be able to shrink ferryd's mapping";
  EXPECT_NE(ftruncate(memfd, 1 << 20), 0);
}

// O_NONBLOCK belongs to an open file, which fd passing shares: the trainer's wake sockets
// must be other open files than ferryd's, or it could make ferryd's reads block.
TEST(BatchChannelTest, TheTrainerCannotMakeFerrydsWakeSocketBlocking) {
  Pair p = MakePair(8);
  ASSERT_EQ(fcntl(p.trainer->wake_fd(), F_SETFL, 0), 0);
  EXPECT_TRUE(fcntl(p.daemon->wake_fd(), F_GETFL) & O_NONBLOCK);
  p.daemon->ClearWakeups();  // returns at once with nothing to read
  ASSERT_TRUE(p.daemon->Send(Batch(0)).ok()) << "the wake is sent without blocking";
}

TEST(BatchChannelTest, AFloodOfWakeupsIsReadABoundedAmountAtATime) {
  // A trainer writing its wake socket full must not keep ferryd's channel thread (which
  // serves every trainer) in ClearWakeups: each call reads a bounded amount, and the rest
  // keeps the fd readable for the thread's next turn.
  auto daemon = BatchChannel::Create(8);
  ASSERT_TRUE(daemon.ok());
  UniqueFd to_daemon(dup((*daemon)->HandoverFds()[2]));
  (*daemon)->DropHandoverFds();
  ASSERT_EQ(fcntl(to_daemon.get(), F_SETFL, O_NONBLOCK), 0);
  std::vector<char> junk(1024, 'x');
  size_t flooded = 0;
  while (send(to_daemon.get(), junk.data(), junk.size(), MSG_DONTWAIT) > 0) {
    flooded += junk.size();
  }
  ASSERT_GT(flooded, 4 * BatchChannel::kMaxWakeBytesPerClear);
  (*daemon)->ClearWakeups();
  pollfd p{(*daemon)->wake_fd(), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 1) << "one ClearWakeups read the whole flood of " << flooded;
  int calls = 1;
  while (poll(&p, 1, 0) == 1 && calls < 100000) {
    (*daemon)->ClearWakeups();
    ++calls;
  }
  EXPECT_EQ(poll(&p, 1, 0), 0) << "the flood is read in the end";
  EXPECT_FALSE((*daemon)->peer_closed());
}

TEST(BatchChannelTest, APeerThatClosedItsEndStopsTheWaitAtOnce) {
  Pair p = MakePair(8);
  p.daemon->DropHandoverFds();
  p.trainer.reset();  // the trainer exits
  ChannelMessage m;
  const absl::Time start = absl::Now();
  auto got = p.daemon->ReceiveOrWait(&m, absl::Seconds(60));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
  EXPECT_TRUE(p.daemon->peer_closed());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_TRUE(p.daemon->Send(Batch(1)).ok()) << "sending to a gone peer neither fails nor blocks";
}

TEST(BatchChannelTest, AnIndexThePeerWroteOverIsDataLoss) {
  Pair p = MakePair(8);
  // Scribble on the trainer -> daemon ring's head (bytes 256..264, see the layout).
  void* raw = mmap(nullptr, p.daemon->bytes(), PROT_READ | PROT_WRITE, MAP_SHARED,
                   p.daemon->HandoverFds()[0], 0);
  ASSERT_NE(raw, MAP_FAILED);
  const uint64_t bogus = 1000;
  memcpy(static_cast<uint8_t*>(raw) + 256, &bogus, sizeof(bogus));
  ChannelMessage m;
  auto got = p.daemon->Receive(&m);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  // And the daemon -> trainer ring's tail (bytes 128..136) moved past what was written.
  memcpy(static_cast<uint8_t*>(raw) + 128, &bogus, sizeof(bogus));
  EXPECT_EQ(p.daemon->Send(Batch(0)).code(), absl::StatusCode::kDataLoss);
  munmap(raw, p.daemon->bytes());
}

TEST(BatchChannelTest, AttachRefusesAFileThatIsNoChannel) {
  UniqueFd fd(memfd_create("not-a-channel", MFD_CLOEXEC));
  ASSERT_EQ(ftruncate(fd.get(), 1 << 16), 0);
  auto other = BatchChannel::Create(4);
  ASSERT_TRUE(other.ok());
  auto attached = BatchChannel::Attach(std::move(fd), UniqueFd(dup((*other)->HandoverFds()[1])),
                                       UniqueFd(dup((*other)->HandoverFds()[2])));
  EXPECT_EQ(attached.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(attached.status().message().find("another version"), std::string::npos)
      << attached.status();
  auto missing = BatchChannel::Attach(UniqueFd(), UniqueFd(), UniqueFd());
  EXPECT_FALSE(missing.ok());
}

TEST(BatchChannelTest, ASleepingReaderWakesOnSendAndTimesOutWithout) {
  Pair p = MakePair(8);
  ChannelMessage m;
  auto none = p.trainer->ReceiveOrWait(&m, absl::Milliseconds(20));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(*none);
  std::thread sender([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(p.daemon->Send(Batch(7)).ok());
  });
  // Would time out (false) if the send did not wake it.
  auto got = p.trainer->ReceiveOrWait(&m, absl::Seconds(60));
  sender.join();
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(*got);
  EXPECT_EQ(m.seq, 7);
}

TEST(BatchChannelTest, WakeSelfEndsASleepWithoutAMessage) {
  Pair p = MakePair(8);
  std::thread waker([&] {
    absl::SleepFor(absl::Milliseconds(50));
    p.trainer->WakeSelf();
  });
  ChannelMessage m;
  const absl::Time start = absl::Now();
  auto got = p.trainer->ReceiveOrWait(&m, absl::Seconds(60));
  waker.join();
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "the wakeup was lost";
}

// The daemon saw the trainer about to sleep and sent a wake byte, but the trainer found the
// message before sleeping: the byte is stale. The next wait must not end on it (found by the
// ping-pong test under TSan's timing).
TEST(BatchChannelTest, AStaleWakeByteDoesNotEndTheNextWait) {
  Pair p = MakePair(8);
  ASSERT_TRUE(p.trainer->PrepareToSleep());
  ASSERT_TRUE(p.daemon->Send(Batch(1)).ok());  // sees the trainer asleep: writes a wake byte
  ChannelMessage m;
  auto first = p.trainer->Receive(&m);  // found without sleeping; the wake byte stays
  ASSERT_TRUE(first.ok() && *first);
  std::thread sender([&] {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(p.daemon->Send(Batch(2)).ok());
  });
  auto got = p.trainer->ReceiveOrWait(&m, absl::Seconds(60));
  sender.join();
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(*got) << "the wait ended on the stale wake byte, without a message";
  EXPECT_EQ(m.seq, 2);
}

// Ping-pong between two processes: every message must arrive, in order, and no wakeup may be
// lost (a lost one leaves both sides asleep until the 10 s timeout, which fails the test).
TEST(BatchChannelTest, TwoProcessesPingPongWithoutLosingAWakeup) {
  Pair p = MakePair(16);
  constexpr int kRounds = 20000;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The trainer: answer every batch with a release of the same seq; sometimes two.
    int64_t expect = 0;
    while (expect < kRounds) {
      ChannelMessage m;
      auto got = p.trainer->ReceiveOrWait(&m, absl::Seconds(10));
      if (!got.ok()) _exit(2);
      if (!*got) {
        if (p.trainer->peer_closed()) _exit(4);  // the parent failed and is gone
        continue;
      }
      if (m.seq != expect || m.kind != ChannelMessage::kBatchReady) _exit(3);
      ++expect;
      ChannelMessage release;
      release.kind = ChannelMessage::kRelease;
      release.seq = m.seq;
      while (absl::IsResourceExhausted(p.trainer->Send(release))) std::this_thread::yield();
    }
    _exit(0);
  }
  int64_t sent = 0, released = 0;
  const absl::Time give_up = absl::Now() + absl::Seconds(120);
  while (released < kRounds && absl::Now() < give_up) {
    // Keep up to 4 in flight, so both the sleeping and the busy paths are taken.
    while (sent < kRounds && sent - released < 4) ASSERT_TRUE(p.daemon->Send(Batch(sent++)).ok());
    ChannelMessage m;
    auto got = p.daemon->ReceiveOrWait(&m, absl::Seconds(10));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(*got) << "no release within 10 s after seq " << released << ": a wakeup was lost";
    ASSERT_EQ(m.seq, released);
    ++released;
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(released, kRounds);
}

}  // namespace
}  // namespace ferry
