#include "server/service/channel_poller.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

void Signal(int fd) {
  const uint64_t one = 1;
  ASSERT_EQ(write(fd, &one, sizeof(one)), 8);
}

void Drain(int fd) {
  uint64_t n;
  (void)!read(fd, &n, sizeof(n));
}

TEST(ChannelPollerTest, RunsTheHandlerOfTheFdThatBecameReadable) {
  auto poller = ChannelPoller::Start();
  ASSERT_TRUE(poller.ok()) << poller.status();
  UniqueFd a(eventfd(0, EFD_NONBLOCK)), b(eventfd(0, EFD_NONBLOCK));
  std::atomic<int> runs_a{0}, runs_b{0};
  absl::Notification a_ran;
  auto id_a = (*poller)->Add(a.get(), [&](uint64_t) {
    Drain(a.get());
    if (runs_a.fetch_add(1) == 0) a_ran.Notify();
  });
  auto id_b = (*poller)->Add(b.get(), [&](uint64_t) {
    Drain(b.get());
    runs_b.fetch_add(1);
  });
  ASSERT_TRUE(id_a.ok() && id_b.ok());
  Signal(a.get());
  ASSERT_TRUE(a_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  (*poller)->Remove(*id_a);
  (*poller)->Remove(*id_b);
  EXPECT_EQ(runs_a.load(), 1);
  EXPECT_EQ(runs_b.load(), 0);
}

TEST(ChannelPollerTest, AnFdReadableBeforeAddIsHandledAtOnce) {
  auto poller = ChannelPoller::Start();
  ASSERT_TRUE(poller.ok());
  UniqueFd fd(eventfd(0, EFD_NONBLOCK));
  Signal(fd.get());
  absl::Notification ran;
  auto id = (*poller)->Add(fd.get(), [&](uint64_t) {
    Drain(fd.get());
    if (!ran.HasBeenNotified()) ran.Notify();
  });
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  (*poller)->Remove(*id);
}

TEST(ChannelPollerTest, RemoveWaitsForARunningHandler) {
  auto poller = ChannelPoller::Start();
  ASSERT_TRUE(poller.ok());
  UniqueFd fd(eventfd(0, EFD_NONBLOCK));
  absl::Notification entered;
  std::atomic<bool> finished{false};
  auto id = (*poller)->Add(fd.get(), [&](uint64_t) {
    Drain(fd.get());
    entered.Notify();
    absl::SleepFor(absl::Milliseconds(200));
    finished.store(true);
  });
  ASSERT_TRUE(id.ok());
  Signal(fd.get());
  ASSERT_TRUE(entered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  (*poller)->Remove(*id);
  EXPECT_TRUE(finished.load()) << "Remove returned while the handler was still running";
  Signal(fd.get());  // no handler any more: nothing runs (a run would touch `entered` twice)
  absl::SleepFor(absl::Milliseconds(20));
}

TEST(ChannelPollerTest, RunAgainRunsTheHandlerWithoutItsFdBeingReadable) {
  auto poller = ChannelPoller::Start();
  ASSERT_TRUE(poller.ok());
  UniqueFd fd(eventfd(0, EFD_NONBLOCK));
  std::atomic<int> runs{0};
  absl::Notification third;
  auto id = (*poller)->Add(fd.get(), [&](uint64_t self) {
    Drain(fd.get());
    const int run = ++runs;
    if (run < 3) (*poller)->RunAgain(self);
    if (run == 3) third.Notify();
  });
  ASSERT_TRUE(id.ok());
  Signal(fd.get());  // one wakeup, three runs
  EXPECT_TRUE(third.WaitForNotificationWithTimeout(absl::Seconds(30)));
  (*poller)->Remove(*id);
  EXPECT_EQ(runs.load(), 3);
}

TEST(ChannelPollerTest, AHandlerMayRemoveItself) {
  auto poller = ChannelPoller::Start();
  ASSERT_TRUE(poller.ok());
  UniqueFd fd(eventfd(0, EFD_NONBLOCK));
  std::atomic<uint64_t> id{0};
  absl::Notification removed;
  auto added = (*poller)->Add(fd.get(), [&](uint64_t) {
    Drain(fd.get());
    (*poller)->Remove(id.load());  // would deadlock if it waited for itself
    removed.Notify();
  });
  ASSERT_TRUE(added.ok());
  id.store(*added);
  Signal(fd.get());
  EXPECT_TRUE(removed.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

// What a Consume stream does at its end: its channel handler removes itself and goes on
// to finish the stream, while gRPC's thread runs OnDone, which removes the registration
// too and then deletes what the handler uses. That Remove must wait for the handler.
TEST(ChannelPollerTest, RemoveWaitsForAHandlerThatRemovedItselfAndGoesOn) {
  auto poller = ChannelPoller::Start();
  ASSERT_TRUE(poller.ok());
  UniqueFd fd(eventfd(0, EFD_NONBLOCK));
  std::atomic<uint64_t> id{0};
  absl::Notification removed_itself, go_on;
  std::atomic<bool> finished{false};
  auto added = (*poller)->Add(fd.get(), [&](uint64_t self) {
    Drain(fd.get());
    (*poller)->Remove(self);
    removed_itself.Notify();
    go_on.WaitForNotification();
    finished.store(true);
  });
  ASSERT_TRUE(added.ok());
  id.store(*added);
  Signal(fd.get());
  ASSERT_TRUE(removed_itself.WaitForNotificationWithTimeout(absl::Seconds(30)));
  std::atomic<bool> returned{false};
  std::thread remover([&] {
    (*poller)->Remove(id.load());
    returned.store(true);
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(returned.load()) << "Remove returned while the handler was still running";
  go_on.Notify();
  remover.join();
  EXPECT_TRUE(finished.load());
}

}  // namespace

}  // namespace ferry
