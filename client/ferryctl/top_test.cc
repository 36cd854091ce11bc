#include "client/ferryctl/top.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/ferryctl/format.h"
#include "client/ferryctl/live.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

v1::RankStatus* AddRank(v1::JobStatus* job, uint32_t rank, bool attached, double stall) {
  v1::RankStatus* r = job->add_ranks();
  r->set_rank(rank);
  r->set_attached(attached);
  r->set_stall_ratio(stall);
  r->set_samples_per_second(1000 + rank);
  r->set_queue_depth(3);
  r->set_slots(8);
  r->set_slots_leased(2);
  return r;
}

v1::GetStatusResponse Sample() {
  v1::GetStatusResponse s;
  v1::DaemonStatus* d = s.mutable_daemon();
  d->set_version("0.4.0");
  d->set_pid(42);
  d->set_uptime_seconds(187);
  d->set_workers(16);
  d->set_workers_busy_fraction(0.75);
  d->set_cpu_seconds(100);
  d->set_consumers(3);
  d->set_host_memory_in_use_bytes(uint64_t{1} << 30);
  d->set_host_memory_budget_bytes(uint64_t{4} << 30);

  v1::JobStatus* train = s.add_jobs();
  train->mutable_job()->set_id("j-train");
  train->mutable_job()->set_name("imagenet-train");
  train->mutable_job()->set_slot_bytes(uint64_t{1} << 20);
  AddRank(train, 0, true, 0.10)->set_limiting_stage(v1::LIMITED_BY_TRAINER);
  AddRank(train, 1, true, 0.60)->set_limiting_stage(v1::LIMITED_BY_DECODE);
  AddRank(train, 2, true, 0.0);  // stage not known yet

  v1::JobStatus* idle = s.add_jobs();
  idle->mutable_job()->set_id("j-idle");
  idle->mutable_job()->set_name("finished-run");
  idle->set_idle_seconds(190);
  AddRank(idle, 0, false, 0.9)->set_samples_per_second(777);  // its last consumer's rate
  return s;
}

std::vector<std::string> Lines(const std::string& text, bool skip_empty = true) {
  if (skip_empty) return absl::StrSplit(text, '\n', absl::SkipEmpty());
  return absl::StrSplit(text, '\n');
}

// The table's rows (after the header and its blank line), minus the column headings.
std::vector<std::string> Rows(const std::string& text) {
  std::vector<std::string> rows;
  bool in_table = false;
  for (const std::string& line : Lines(text, /*skip_empty=*/false)) {
    if (in_table && !line.empty()) rows.push_back(line);
    if (line.rfind("JOB", 0) == 0) in_table = true;
  }
  return rows;
}

TEST(TopTest, HeaderShowsDaemonWorkersAndMemory) {
  const std::string out = RenderTop(Sample(), nullptr, {});
  const std::vector<std::string> lines = Lines(out);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0], "ferryd 0.4.0  pid 42  up 3m 07s  workers 16 (75% busy)  cpu -  consumers 3");
  EXPECT_EQ(lines[1], "memory: host 1.0 GiB / 4.0 GiB (25%)");
  EXPECT_THAT(out, HasSubstr("JOB      NAME            RANK  STATE"));
  EXPECT_THAT(out, HasSubstr("SAMPLES/S  STALL  STAGE    QUEUE  LEASED   MEMORY\n"));
}

TEST(TopTest, GpusShowDeviceMemoryAndH2dRate) {
  v1::GetStatusResponse s = Sample();
  s.mutable_daemon()->set_pinned_memory_in_use_bytes(uint64_t{512} << 20);
  s.mutable_daemon()->set_pinned_memory_budget_bytes(uint64_t{2} << 30);
  v1::GpuStatus* g = s.mutable_daemon()->add_gpus();
  g->set_ordinal(1);
  g->set_name("NVIDIA H100 80GB HBM3");
  g->set_device_memory_in_use_bytes(uint64_t{2} << 30);
  g->set_device_memory_budget_bytes(uint64_t{20} << 30);
  g->set_h2d_bytes_per_second(25.5e9);
  g->set_batches_in_flight(3);
  v1::RankStatus* r = s.mutable_jobs(0)->mutable_ranks(0);
  r->set_pinned_bytes(uint64_t{8} << 20);
  r->set_device_bytes(uint64_t{16} << 20);
  const std::string out = RenderTop(s, nullptr, {});
  EXPECT_THAT(out, HasSubstr("memory: host 1.0 GiB / 4.0 GiB (25%)  pinned 512.0 MiB / 2.0 GiB "
                             "(25%)\n"));
  EXPECT_THAT(out, HasSubstr("gpu 1: device 2.0 GiB / 20.0 GiB (10%)  H2D 25.50 GB/s  3 in "
                             "flight  NVIDIA H100 80GB HBM3\n"));
  EXPECT_THAT(out, HasSubstr("8.0 MiB + 16.0 MiB dev"));
}

TEST(TopTest, CpuUseComesFromTwoAnswersOfTheSameDaemon) {
  v1::GetStatusResponse previous = Sample();
  v1::GetStatusResponse now = Sample();
  now.mutable_daemon()->set_uptime_seconds(189);
  now.mutable_daemon()->set_cpu_seconds(105);  // 5 CPU-seconds in 2 s
  EXPECT_THAT(RenderTop(now, &previous, {}), HasSubstr("  cpu 250%  "));
  previous.mutable_daemon()->set_pid(43);  // another ferryd: its totals do not compare
  EXPECT_THAT(RenderTop(now, &previous, {}), HasSubstr("  cpu -  "));
}

TEST(TopTest, MostStalledRanksFirstAndRanksWithoutConsumerLast) {
  const std::vector<std::string> rows = Rows(RenderTop(Sample(), nullptr, {}));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_THAT(rows[0], StartsWith("j-train  imagenet-train     1  active"));
  EXPECT_THAT(rows[0], HasSubstr("1001    60%  decode"));
  EXPECT_THAT(rows[1], StartsWith("j-train  imagenet-train     0"));
  EXPECT_THAT(rows[1], HasSubstr("10%  trainer"));
  EXPECT_THAT(rows[2], StartsWith("j-train  imagenet-train     2"));
  // The idle job's rank stalled most when it last ran, but has no consumer now.
  EXPECT_THAT(rows[3], StartsWith("j-idle   finished-run       0  idle 3m 10s"));
}

TEST(TopTest, UnknownStageAndIdleRanksShowDashes) {
  const std::vector<std::string> rows = Rows(RenderTop(Sample(), nullptr, {}));
  ASSERT_EQ(rows.size(), 4u);
  // Rank 2: attached, no stage told yet.
  EXPECT_THAT(rows[2], HasSubstr("1002     0%  -          3/8       2  8.0 MiB"));
  // The idle job: no rate, stall or stage (777/s was its last consumer's).
  EXPECT_THAT(rows[3], HasSubstr("idle 3m 10s          -      -  -          3/8       2      0 B"));
  EXPECT_THAT(rows[3], Not(HasSubstr("777")));
  EXPECT_EQ(FormatLimitingStage(v1::LIMITING_STAGE_UNSPECIFIED), "-");
  EXPECT_EQ(FormatLimitingStage(v1::LIMITED_BY_READ), "read");
  EXPECT_EQ(FormatLimitingStage(v1::LIMITED_BY_COPY), "copy");
}

TEST(TopTest, GpuDecodeShareShowsOnlyWhileAJobsGpuDecodes) {
  v1::GetStatusResponse s = Sample();
  // A job whose GPU decodes none of its JPEGs adds no column.
  s.mutable_jobs(1)->mutable_gpu_decode()->set_off("GPU JPEG decode is off: no libnvjpeg");
  EXPECT_THAT(RenderTop(s, nullptr, {}), Not(HasSubstr("GPU DEC")));
  v1::GpuDecodeStatus* g = s.mutable_jobs(0)->mutable_gpu_decode();
  g->set_mode("auto");
  g->set_gpu_share(0.81);
  const std::string out = RenderTop(s, nullptr, {});
  EXPECT_THAT(out, HasSubstr("STAGE    GPU DEC  QUEUE"));
  const std::vector<std::string> rows = Rows(out);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_THAT(rows[0], HasSubstr("60%  decode       81%    3/8"));
  EXPECT_THAT(rows[2], HasSubstr("0%  -            81%    3/8"));
  EXPECT_THAT(rows[3], HasSubstr("-  -            off    3/8"));
  // A job without images on a daemon where another job's GPU decodes.
  s.mutable_jobs(1)->clear_gpu_decode();
  EXPECT_THAT(Rows(RenderTop(s, nullptr, {}))[3], HasSubstr("-  -              -    3/8"));
}

TEST(TopTest, StateIsWordedAsFerryctlJobsWordsIt) {
  v1::GetStatusResponse s = Sample();
  s.mutable_jobs(0)->set_paused("reading /data/x: too many open files");
  s.mutable_jobs(1)->set_failure("bad sample /data/y");
  const std::vector<std::string> rows = Rows(RenderTop(s, nullptr, {}));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_THAT(rows[0], HasSubstr("  paused  "));
  EXPECT_THAT(rows[3], HasSubstr("  failed  "));
}

TEST(TopTest, JobWithoutRanksHasOneRow) {
  v1::GetStatusResponse s;
  v1::JobStatus* job = s.add_jobs();
  job->mutable_job()->set_id("j-new");
  job->mutable_job()->set_name("fresh");
  const std::vector<std::string> rows = Rows(RenderTop(s, nullptr, {}));
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_THAT(rows[0], StartsWith("j-new  fresh     -  idle 0s"));
  EXPECT_THAT(RenderTop(v1::GetStatusResponse(), nullptr, {}), HasSubstr("\n\nno jobs\n"));
}

TEST(TopTest, NarrowTerminalShortensNamesThenCutsLines) {
  v1::GetStatusResponse s = Sample();
  s.mutable_jobs(0)->mutable_job()->set_name("a-very-long-job-name-that-would-not-fit-anywhere");
  const std::string wide = RenderTop(s, nullptr, {});
  EXPECT_THAT(wide, HasSubstr("a-very-long-job-name-that-would-not-fit-anywhere"));
  for (int width : {120, 100, 80, 40}) {
    const std::string out = RenderTop(s, nullptr, {width, 0});
    for (const std::string& line : Lines(out)) {
      EXPECT_LE(line.size(), static_cast<size_t>(width)) << line;
    }
    EXPECT_THAT(out, Not(HasSubstr("would-not-fit-anywhere"))) << width;
  }
  // At 100 columns the shortened name leaves room for every column.
  const std::string out = RenderTop(s, nullptr, {100, 0});
  const std::vector<std::string> rows = Rows(out);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_THAT(rows[0], StartsWith("j-train  a-very-long-"));
  EXPECT_THAT(rows[0], HasSubstr("~"));
  EXPECT_THAT(rows[0], HasSubstr("8.0 MiB"));  // the last column
}

TEST(TopTest, EightyColumnsDropTheLeastUsefulColumnsInsteadOfCuttingRows) {
  v1::GetStatusResponse s = Sample();
  s.mutable_jobs(0)->mutable_job()->set_name("imagenet-train-resnet50-bf16");
  s.mutable_jobs(0)->mutable_gpu_decode()->set_mode("auto");
  s.mutable_jobs(0)->mutable_ranks(1)->set_pinned_bytes(uint64_t{3} << 30);
  s.mutable_jobs(0)->mutable_ranks(1)->set_device_bytes(uint64_t{2} << 30);
  const std::string wide = RenderTop(s, nullptr, {});
  EXPECT_THAT(wide, HasSubstr("MEMORY"));
  const std::string out = RenderTop(s, nullptr, {80, 0});
  for (const std::string& line : Lines(out)) {
    EXPECT_LE(line.size(), 80u) << line;
  }
  const std::vector<std::string> rows = Rows(out);
  ASSERT_EQ(rows.size(), 4u);
  for (const std::string& row : rows) {
    EXPECT_THAT(row, Not(testing::EndsWith("~"))) << row;  // no row is cut
  }
  // The columns that matter go last: the stage of the most stalled rank is whole.
  EXPECT_THAT(rows[0], HasSubstr("decode"));
  EXPECT_THAT(out, HasSubstr("SAMPLES/S"));
  EXPECT_THAT(out, HasSubstr("STALL"));
  EXPECT_THAT(out, Not(HasSubstr("MEMORY")));
  // Each narrower width keeps a subset of the wider one's columns.
  EXPECT_THAT(RenderTop(s, nullptr, {120, 0}), HasSubstr("MEMORY"));
  const std::string narrow = RenderTop(s, nullptr, {60, 0});
  EXPECT_THAT(narrow, Not(HasSubstr("QUEUE")));
  EXPECT_THAT(narrow, HasSubstr("STAGE"));
}

TEST(TopTest, ShortTerminalSaysHowManyLinesAreLeft) {
  const std::string out = RenderTop(Sample(), nullptr, {0, 5});
  const std::vector<std::string> lines = Lines(out);
  // 8 lines (header, memory, blank, headings, 4 rows): 4 kept, then the count of the rest.
  EXPECT_EQ(out, absl::StrCat(lines[0], "\n", lines[1], "\n\n", lines[2], "\n... 4 more lines\n"));
}

TEST(TopTest, TruncateAndFit) {
  EXPECT_EQ(TruncateLine("abcdef", 0), "abcdef");
  EXPECT_EQ(TruncateLine("abcdef", 6), "abcdef");
  EXPECT_EQ(TruncateLine("abcdef", 4), "abc~");
  // Code points, not bytes: a name in UTF-8 is never cut inside a character.
  EXPECT_EQ(TruncateLine("h\xc3\xa9llo-w\xc3\xb6rld", 7), "h\xc3\xa9llo-~");
  EXPECT_EQ(FitToScreen("one\ntwo\nthree\nfour\n", {3, 3}), "one\ntwo\n..~\n");
  EXPECT_EQ(FitToScreen("one\ntwo\n", {0, 0}), "one\ntwo\n");
}

// A live view of a fixed text, for ComposeFrame.
class FixedView final : public LiveView {
 public:
  absl::Status Refresh() override { return absl::OkStatus(); }
  std::string Render(ScreenSize size) const override {
    return FitToScreen("JOB  NAME\nj-1  last-snapshot\n", size);
  }
};

TEST(LiveTest, AFailedRefreshClearsTheStaleSnapshot) {
  FixedView view;
  const LiveOptions options{.interval = absl::Seconds(2), .title = "ferryctl top"};
  const std::string good = ComposeFrame(view, absl::OkStatus(), options, {80, 24});
  EXPECT_EQ(good, "ferryctl top\nJOB  NAME\nj-1  last-snapshot\n");
  const std::string gone =
      ComposeFrame(view, absl::UnavailableError("Socket closed"), options, {80, 24});
  EXPECT_EQ(gone, "ferryctl top\nferryd unreachable: Socket closed (retrying every 2s)\n");
  EXPECT_THAT(gone, Not(HasSubstr("last-snapshot")));
}

}  // namespace
}  // namespace ferry::ctl
