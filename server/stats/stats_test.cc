// LatencyHistogram buckets, RecentWindow sums over the last seconds, and each rule of
// DecideLimitingStage, and the run-queue delay of a thread starved of CPU by construction.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/stats/latency_histogram.h"
#include "server/stats/limiting_stage.h"
#include "server/stats/recent_window.h"
#include "server/stats/run_delay.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(LatencyHistogramTest, CountsFallIntoTheirBucketsAndTheLastTakesTheRest) {
  LatencyHistogram h;
  h.Observe(absl::Microseconds(1));  // (0, 1 us]
  h.Observe(absl::Microseconds(2));  // (1 us, 2.5 us]
  h.Observe(absl::Milliseconds(3));  // (2.5 ms, 5 ms]
  h.Observe(absl::Seconds(20));      // above 10 s
  h.Observe(-absl::Seconds(1));      // counts as 0
  ferry::v1::Histogram p;
  h.ToProto(&p);
  ASSERT_EQ(p.bounds_size(), 22);
  EXPECT_DOUBLE_EQ(p.bounds(0), 1e-6);
  EXPECT_DOUBLE_EQ(p.bounds(21), 10);
  ASSERT_EQ(p.counts_size(), 23);
  EXPECT_EQ(p.counts(0), 2u);
  EXPECT_EQ(p.counts(1), 1u);
  EXPECT_EQ(p.counts(11), 1u);  // 5e-3 is bounds[11]
  EXPECT_EQ(p.counts(22), 1u);
  EXPECT_EQ(p.count(), 5u);
  EXPECT_NEAR(p.sum(), 20.003003, 1e-9);
  h.Clear();
  h.ToProto(&p);
  EXPECT_EQ(p.count(), 0u);
  EXPECT_EQ(p.counts_size(), 23);
}

TEST(RecentWindowTest, SumsTheLastSecondsAndForgetsOlderOnes) {
  RecentWindow w(2);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  w.Add(0, 1, t0);
  w.Add(1, 5, t0 + absl::Seconds(3));
  std::vector<double> sums;
  EXPECT_EQ(w.Sum(t0 + absl::Milliseconds(9500), &sums), t0);
  EXPECT_THAT(sums, testing::ElementsAre(1, 5));
  // Ten seconds later the first second is out of the window, the fourth not yet.
  EXPECT_EQ(w.Sum(t0 + absl::Seconds(10), &sums), t0 + absl::Seconds(1));
  EXPECT_THAT(sums, testing::ElementsAre(0, 5));
  // An amount for a time the window no longer holds is dropped.
  w.Add(0, 7, t0 + absl::Seconds(20));
  w.Add(0, 3, t0);
  EXPECT_EQ(w.Sum(t0 + absl::Seconds(20), &sums), t0 + absl::Seconds(11));
  EXPECT_THAT(sums, testing::ElementsAre(7, 0));
  w.Clear();
  w.Sum(t0 + absl::Seconds(20), &sums);
  EXPECT_THAT(sums, testing::ElementsAre(0, 0));
}

TEST(RecentWindowTest, IntervalsAreSpreadOverTheSecondsTheyOverlap) {
  RecentWindow w(1);
  const absl::Time t0 = absl::FromUnixSeconds(2000);
  // 1.5 s from t0 + 0.5 s, and a 30 s interval of which only the window's part counts.
  w.AddInterval(0, t0 + absl::Milliseconds(500), t0 + absl::Seconds(2));
  std::vector<double> sums;
  w.Sum(t0 + absl::Seconds(2), &sums);
  EXPECT_DOUBLE_EQ(sums[0], 1.5);
  w.Sum(t0 + absl::Seconds(10), &sums);  // [t0 + 1 s, ...): the first 0.5 s is out
  EXPECT_DOUBLE_EQ(sums[0], 1.0);
  RecentWindow long_wait(1);
  long_wait.AddInterval(0, t0, t0 + absl::Seconds(30));
  EXPECT_EQ(long_wait.Sum(t0 + absl::Seconds(30), &sums), t0 + absl::Seconds(21));
  EXPECT_DOUBLE_EQ(sums[0], 9.0);
}

LimitingStageFigures Stalled() {
  LimitingStageFigures f;
  f.consumer = true;
  f.window_seconds = 10;
  f.wait_seconds = 6;
  f.wait_reported = true;
  f.starved_fill_seconds = 5;
  f.starved_copy_seconds = 1;
  f.task_seconds = 16;
  f.read_seconds = 2;
  f.worker_threads = 2;
  return f;
}

TEST(LimitingStageTest, NoConsumerOrTooLittleObservedIsUnspecified) {
  LimitingStageFigures f = Stalled();
  f.consumer = false;
  LimitingStageVerdict v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITING_STAGE_UNSPECIFIED);
  EXPECT_EQ(v.note, "no consumer attached");
  f = Stalled();
  f.window_seconds = 0.5;
  v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITING_STAGE_UNSPECIFIED);
  EXPECT_THAT(v.note, HasSubstr("observed for 0.5 s"));
}

TEST(LimitingStageTest, ALowStallRatioMeansTheTrainerIsTheLimit) {
  LimitingStageFigures f = Stalled();
  f.wait_seconds = 0.5;
  f.wait_reported = false;
  f.ready_batches = 3;
  const LimitingStageVerdict v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITED_BY_TRAINER);
  EXPECT_THAT(v.note, HasSubstr("waited 5% of the last 10.0 s (ferryd's estimate)"));
  EXPECT_THAT(v.note, HasSubstr("3 batches ready"));
}

TEST(LimitingStageTest, ATrainerAheadOfWhichFerryIsButShortOfCpuIsTrainerCpu) {
  LimitingStageFigures f = Stalled();
  f.wait_seconds = 0.2;
  f.ready_batches = 4;
  f.cpu_wait_seconds = 2.5;  // its main thread waited for a CPU a quarter of the window
  LimitingStageVerdict v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITED_BY_TRAINER_CPU);
  EXPECT_THAT(v.note, HasSubstr("waited for a CPU 25% of the time: it is short of CPU"));
  EXPECT_EQ(CpuWaitRatio(f), 0.25);
  // A little run-queue delay is any busy machine's: the trainer is the limit, as before.
  f.cpu_wait_seconds = 0.3;
  v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITED_BY_TRAINER);
  EXPECT_THAT(v.note, HasSubstr("(its main thread waited for a CPU 3% of the time)"));
  // Not known: no mention.
  f.cpu_wait_seconds = -1;
  v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITED_BY_TRAINER);
  EXPECT_THAT(v.note, Not(HasSubstr("CPU")));
  EXPECT_EQ(CpuWaitRatio(f), -1);
  // A trainer that waits for batches is told by what it waits for, whatever its CPU.
  f = Stalled();
  f.cpu_wait_seconds = 5;
  EXPECT_NE(DecideLimitingStage(f).stage, ferry::v1::LIMITED_BY_TRAINER_CPU);
}

TEST(RunDelayTest, SchedstatsSecondFieldIsTheRunQueueDelay) {
  EXPECT_EQ(*ParseSchedstatRunDelay("123456 7890000 42\n"), absl::Nanoseconds(7890000));
  EXPECT_EQ(ParseSchedstatRunDelay("garbage").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(MainThreadRunDelay(getpid()).ok());
  // A process that is gone (its pid reaped) is NOT_FOUND.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_EQ(MainThreadRunDelay(child).status().code(), absl::StatusCode::kNotFound);
}

TEST(RunDelayTest, AThreadThatSharesItsOnlyCpuWithTwoSpinnersWaitsMostOfTheTime) {
  // This thread and two spinning threads, all confined to one CPU: whatever the machine's
  // load, this thread is runnable and off the CPU about two thirds of the time.
  cpu_set_t original;
  ASSERT_EQ(sched_getaffinity(0, sizeof(original), &original), 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &original)) ++cpu;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  for (int i = 0; i < 2; ++i) {
    spinners.emplace_back([&] {
      sched_setaffinity(0, sizeof(one), &one);
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  }
  // The main thread is the process's: MainThreadRunDelay reads this one when the test runs
  // on it (gtest's default).
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const absl::Duration before = *MainThreadRunDelay(getpid());
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Milliseconds(600)) {
  }
  const absl::Duration waited = *MainThreadRunDelay(getpid()) - before;
  stop = true;
  for (std::thread& t : spinners) t.join();
  ASSERT_EQ(sched_setaffinity(0, sizeof(original), &original), 0);
  // Ideally 400 ms of 600; a kernel without schedstats reports 0 for every thread.
  if (waited == absl::ZeroDuration()) GTEST_SKIP() << "the kernel keeps no run-queue delays";
  EXPECT_GT(waited, absl::Milliseconds(200));
}

TEST(LimitingStageTest, WaitingMostlyOnReadsIsRead) {
  LimitingStageFigures f = Stalled();
  f.read_seconds = 12;
  const LimitingStageVerdict v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITED_BY_READ);
  EXPECT_THAT(v.note, HasSubstr("waited 60% of the last 10.0 s (as it measured)"));
  EXPECT_THAT(v.note, HasSubstr("75% of their 16.0 s on its tasks in dataset reads"));
  EXPECT_THAT(v.note, HasSubstr("workers busy 80% of 2 threads"));
}

TEST(LimitingStageTest, ReadsMostlyWaitingForTheRemoteStoreAreRemoteRead) {
  LimitingStageFigures f = Stalled();
  f.read_seconds = 12;
  f.remote_read_seconds = 9;
  LimitingStageVerdict v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITED_BY_REMOTE_READ);
  EXPECT_THAT(v.note, HasSubstr("75% of their 16.0 s on its tasks in dataset reads"));
  EXPECT_THAT(v.note, HasSubstr("75% of the reads waited for the remote store"));
  EXPECT_THAT(v.note, HasSubstr("read_ahead_objects"));
  f.remote_read_seconds = 5;  // most reads are local ones (cache hits, local files)
  EXPECT_EQ(DecideLimitingStage(f).stage, ferry::v1::LIMITED_BY_READ);
  f.read_seconds = 4;  // few reads at all: the workers decode
  f.remote_read_seconds = 4;
  EXPECT_EQ(DecideLimitingStage(f).stage, ferry::v1::LIMITED_BY_DECODE);
}

TEST(LimitingStageTest, WaitingOnBusyWorkersNotReadingIsDecode) {
  const LimitingStageVerdict v = DecideLimitingStage(Stalled());
  EXPECT_EQ(v.stage, ferry::v1::LIMITED_BY_DECODE);
  EXPECT_THAT(v.note, HasSubstr("still being filled 83%"));
  EXPECT_THAT(v.note, HasSubstr("13% of their 16.0 s"));
}

TEST(LimitingStageTest, WaitingOnFilledBatchesIsCopy) {
  LimitingStageFigures f = Stalled();
  f.starved_fill_seconds = 1;
  f.starved_copy_seconds = 3;
  f.read_seconds = 16;  // irrelevant once the batches wait for the copy
  const LimitingStageVerdict v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITED_BY_COPY);
  EXPECT_THAT(v.note, HasSubstr("waiting for its copy to the GPU 75%"));
}

TEST(LimitingStageTest, WaitsFerrydNeverSawOrNoFinishedTaskAreUnspecified) {
  LimitingStageFigures f = Stalled();
  f.starved_fill_seconds = 0;
  f.starved_copy_seconds = 0;
  LimitingStageVerdict v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITING_STAGE_UNSPECIFIED);
  EXPECT_THAT(v.note, HasSubstr("handoff"));
  f = Stalled();
  f.task_seconds = 0;
  v = DecideLimitingStage(f);
  EXPECT_EQ(v.stage, ferry::v1::LIMITING_STAGE_UNSPECIFIED);
  EXPECT_THAT(v.note, HasSubstr("no fill task finished"));
}

TEST(LimitingStageTest, TheStallRatioIsClampedToOne) {
  LimitingStageFigures f = Stalled();
  f.wait_seconds = 12;
  EXPECT_DOUBLE_EQ(StallRatio(f), 1.0);
  f.window_seconds = 0;
  EXPECT_DOUBLE_EQ(StallRatio(f), 0.0);
}

}  // namespace
}  // namespace ferry
