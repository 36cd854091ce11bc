#include "client/ferryctl/format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(TableTest, AlignsTextLeftAndNumbersRight) {
  Table table({{"NAME"}, {"COUNT", true}});
  table.AddRow({"a", "5"});
  table.AddRow({"longer", "12345"});
  EXPECT_EQ(table.Render(),
            "NAME    COUNT\n"
            "a           5\n"
            "longer  12345\n");
}

TEST(FormatTest, Numbers) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 30), "3.0 GiB");
  EXPECT_EQ(FormatUptime(45), "45s");
  EXPECT_EQ(FormatUptime(187), "3m 07s");
  EXPECT_EQ(FormatUptime(7380), "2h 03m");
  EXPECT_EQ(FormatUptime(90000), "1d 01h");
  EXPECT_EQ(FormatRate(12.34), "12.3");
  EXPECT_EQ(FormatRate(1234.5), "1234");
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({}), "-");
  EXPECT_EQ(FormatTime(0), "1970-01-01 00:00:00 UTC");
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(1000), "1,000");
  EXPECT_EQ(FormatCount(120345), "120,345");
  EXPECT_EQ(FormatCount(-1234567), "-1,234,567");
  EXPECT_EQ(FormatCount(INT64_MIN), "-9,223,372,036,854,775,808");
}

JobStatus SampleJob() {
  JobStatus s;
  s.job.id = "job-1";
  s.job.name = "imagenet-train";
  s.job.owner_uid = 1000;
  s.job.spec.dataset = ImageFolderOptions{"/data/train"};
  RandomResizedCropOptions rrc;
  rrc.size = 224;
  rrc.flip = true;
  s.job.spec.transform = rrc;
  s.job.spec.batch_size = 256;
  s.job.spec.world_size = 2;
  s.job.num_samples = 1000;
  s.job.batches_per_epoch = 2;
  s.job.fields.push_back({"image", DType::kUint8, {224, 224, 3}, 0, 150528});
  RankStatus r0;
  r0.rank = 0;
  r0.attached = true;
  r0.batches_per_second = 10;
  r0.samples_per_second = 2560;
  r0.consumer_wait_seconds = 1.25;
  r0.slots = 17;
  r0.batch_channel = true;
  s.ranks.push_back(r0);
  RankStatus r1;
  r1.rank = 1;
  s.ranks.push_back(r1);
  s.errors = 1;
  s.recent_errors.push_back({17, "/data/train/a/bad.jpg", "not a JPEG file"});
  return s;
}

TEST(FormatTest, TransformNamesEachComposedOp) {
  JobOptions spec;
  EXPECT_EQ(FormatTransform(spec), "-");
  spec.transform = CenterCropOptions{.size = 224, .resize = 256};
  EXPECT_EQ(FormatTransform(spec), "center_crop 224 (resize 256)");
  spec.transform = ComposeOptions{.ops = {transforms::RandomCrop{.size = 32, .padding = {4}},
                                          transforms::RandomHorizontalFlip{},
                                          transforms::Normalize{.mean = {0.5f}, .std = {0.5f}},
                                          std::monostate()}};
  EXPECT_EQ(FormatTransform(spec), "compose random_crop 32, random_horizontal_flip, normalize, ?");
}

TEST(RenderTest, JobsTableSumsRatesAndCountsAttachedRanks) {
  StatusReport report;
  report.jobs.push_back(SampleJob());
  std::string out = RenderJobs(report);
  EXPECT_THAT(out, HasSubstr("ID     NAME"));
  EXPECT_THAT(out, HasSubstr("imagefolder /data/train"));
  EXPECT_THAT(out, HasSubstr("1/2"));
  EXPECT_THAT(out, HasSubstr("2560"));
  EXPECT_THAT(out, HasSubstr("active"));
  EXPECT_EQ(RenderJobs(StatusReport()), "no jobs\n");
}

TEST(RenderTest, IdleJobsShowHowLongAndNoRates) {
  StatusReport report;
  JobStatus idle = SampleJob();
  for (RankStatus& r : idle.ranks) r.attached = false;
  idle.idle_seconds = 190;
  idle.deleted_in_seconds = 410;
  report.jobs.push_back(idle);
  const std::string out = RenderJobs(report);
  EXPECT_THAT(out, HasSubstr("idle 3m 10s, deleted in 6m 50s"));
  EXPECT_THAT(out, Not(HasSubstr("2560")));  // the last consumer's rate is not shown
  idle.deleted_in_seconds = 0;               // job_idle_timeout_seconds 0: kept
  EXPECT_EQ(FormatJobState(idle), "idle 3m 10s");
}

TEST(RenderTest, JobShowsRanksAndRecentErrors) {
  std::string out = RenderJob(SampleJob());
  EXPECT_THAT(out, HasSubstr("random_resized_crop 224 flip"));
  EXPECT_THAT(out, HasSubstr("image uint8[224,224,3]"));
  EXPECT_THAT(out, HasSubstr("WAIT S"));
  EXPECT_THAT(out, HasSubstr("1.2"));  // consumer wait seconds
  EXPECT_THAT(out, HasSubstr("SLOTS"));
  EXPECT_THAT(out, HasSubstr(" 17 "));      // rank 0's ring
  EXPECT_THAT(out, HasSubstr("yes, shm"));  // rank 0 takes batches through the channel
  EXPECT_THAT(out, HasSubstr("/data/train/a/bad.jpg  not a JPEG file"));
  EXPECT_THAT(out, Not(HasSubstr("copy path")));  // host transport
}

// The ranks of one run on several GPUs are one job, a row per rank with its GPU.
TEST(RenderTest, JobShowsEachRanksDevice) {
  JobStatus s = SampleJob();
  s.ranks.resize(2);
  s.ranks[0].rank = 0;
  s.ranks[0].device = "cuda:0";
  s.ranks[1].rank = 1;
  s.ranks[1].device = "cuda:1";
  const std::string out = RenderJob(s);
  EXPECT_THAT(out, HasSubstr("RANK  DEVICE"));
  EXPECT_THAT(out, HasSubstr("   0  cuda:0  yes, shm"));
  EXPECT_THAT(out, HasSubstr("   1  cuda:1  no"));
}

TEST(RenderTest, JobShowsEachRanksDemandForItsGpusDecoder) {
  JobStatus s = SampleJob();
  EXPECT_THAT(RenderJob(s), Not(HasSubstr("GPU DEC")));  // no GPU decodes for a host job
  s.gpu_decode = JobStatus::GpuDecode{.mode = "auto", .gpu_share = 0.4};
  s.ranks[0].gpu_decode_demand = 0.9;
  s.ranks[0].gpu_decode_batches = 1234;
  const std::string out = RenderJob(s);
  EXPECT_THAT(out, HasSubstr("LIMIT      GPU DEC\n"));
  EXPECT_THAT(out, HasSubstr("0.90, 1,234\n"));
  EXPECT_THAT(out, HasSubstr("0.00, 0\n"));
}

TEST(RenderTest, JobSaysWhichRanksResumeAnEpochBegunElsewhere) {
  JobStatus s = SampleJob();
  EXPECT_THAT(RenderJob(s), Not(HasSubstr("resumed:")));
  s.ranks[0].epoch = 3;
  s.ranks[0].epoch_batches = 21;
  s.ranks[0].resumed_after_positions = 640;
  EXPECT_THAT(RenderJob(s), HasSubstr("resumed:\nrank 0: epoch 3 goes on after the 640 positions "
                                      "an earlier run delivered (21 batches a rank)"));
}

TEST(RenderTest, JobShowsEachDistinctCopyPath) {
  JobStatus s = SampleJob();
  for (RankStatus& r : s.ranks) {
    r.copy_path = "page-cache gather";
    r.pinned_dataset_bytes = uint64_t{512} << 20;
  }
  s.ranks[0].batches_copied = 100;
  s.ranks[0].batches_gathered = 60;
  s.ranks[1].batches_copied = 50;
  s.ranks[1].batches_gathered = 5;
  std::string out = RenderJob(s);
  EXPECT_THAT(out,
              HasSubstr("copy path      page-cache gather (512.0 MiB of the dataset pinned)\n"));
  EXPECT_THAT(out, HasSubstr("gathered       65 of 150 batches (the others copied by workers)\n"));
  // The default: gathered while the trainer waits, as the note says.
  for (RankStatus& r : s.ranks) {
    r.copy_path_note = "kernels gather the batches made while the trainer waits for them";
  }
  EXPECT_THAT(RenderJob(s), HasSubstr("copy path      page-cache gather (512.0 MiB of the dataset "
                                      "pinned): kernels gather the batches made while the "
                                      "trainer waits for them\n"));
  s.ranks[0].copy_path_note.clear();
  s.ranks[1].copy_path = "slot copy";
  s.ranks[1].pinned_dataset_bytes = 0;
  s.ranks[1].copy_path_note = "workers copy the records: over budget";
  out = RenderJob(s);
  EXPECT_THAT(out, HasSubstr("pinned); slot copy: workers copy the records: over budget"));
  // Only the ranks that gather count.
  EXPECT_THAT(out, HasSubstr("gathered       60 of 100 batches"));
  for (RankStatus& r : s.ranks) r.copy_path = "slot copy";
  EXPECT_THAT(RenderJob(s), Not(HasSubstr("gathered ")));
}

TEST(RenderTest, JobShowsWhatTheReadAheadDid) {
  JobStatus s = SampleJob();
  EXPECT_THAT(RenderJob(s), Not(HasSubstr("read ahead")));  // a local dataset: no row
  s.read_ahead = ReadAheadStatus{
      .opened = 12345, .skipped = 30, .files_in_window = 256, .bytes_in_window = 3ull << 29};
  EXPECT_THAT(RenderJob(s), HasSubstr("read ahead     12,345 files fetched ahead of the workers, "
                                      "30 reached first by the workers; window 256 files, "
                                      "1.5 GiB\n"));
  s.read_ahead->failed = 2;
  EXPECT_EQ(FormatReadAhead(s),
            "12,345 files fetched ahead of the workers, 30 reached first by the workers, 2 "
            "failed; window 256 files, 1.5 GiB");
}

TEST(RenderTest, JobShowsWhoDecodesTheJpegs) {
  JobStatus s = SampleJob();
  EXPECT_THAT(RenderJob(s), Not(HasSubstr("gpu decode")));  // a host job: no row
  s.gpu_decode = JobStatus::GpuDecode{
      .mode = "auto",
      .gpu_images = 120345,
      .cpu_images = 30100,
      .fallbacks = {{"progressive", 812}, {"cmyk", 301}, {"too_large", 9800}, {"not_jpeg", 2}},
      .gpu_share = 0.81,
      .cpu_ms_per_image = 1.95,
      .gpu_ms_per_image = 0.041};
  EXPECT_THAT(RenderJob(s),
              HasSubstr("gpu decode     auto: 81% of the files the GPU can decode go to it (share "
                        "0.81); 1.95 ms/image on a worker, 0.041 ms/image on the GPU\n"
                        "               120,345 images decoded on the GPU, 30,100 on the CPU (not "
                        "for the GPU: progressive 812, cmyk 301, too_large 9,800, not_jpeg 2)\n"));

  // Mode "gpu" before any batch was timed, nothing fallen back yet.
  s.gpu_decode = JobStatus::GpuDecode{.mode = "gpu", .gpu_images = 512, .gpu_share = 1};
  EXPECT_EQ(FormatGpuDecode(s),
            (std::vector<std::string>{"gpu: every file the GPU can decode goes to it",
                                      "512 images decoded on the GPU, 0 on the CPU"}));
  s.gpu_decode->cpu_ms_per_image = 2.5;
  EXPECT_EQ(FormatGpuDecode(s)[0],
            "gpu: every file the GPU can decode goes to it; 2.5 ms/image on a worker, not yet "
            "measured on the GPU");

  // A job shared by the ranks of four GPUs: each GPU's engines decode its rank's files.
  s.gpu_decode->gpu_ms_per_image = 0.4;
  s.gpu_decode->decoders = 4;
  EXPECT_EQ(FormatGpuDecode(s)[0],
            "gpu: every file the GPU can decode goes to it; 2.5 ms/image on a worker, 0.4 "
            "ms/image on each of 4 GPUs");

  // Off: one line with ferryd's reason, without its "GPU JPEG decode is off" preamble.
  s.gpu_decode =
      JobStatus::GpuDecode{.off = "GPU JPEG decode is off: the daemon's gpu_decode is \"cpu\""};
  EXPECT_THAT(RenderJob(s), HasSubstr("gpu decode     off: the daemon's gpu_decode is \"cpu\"\n"));
  s.gpu_decode->off = "GPU JPEG decode is off for this job: its transform runs ops on the workers";
  EXPECT_EQ(FormatGpuDecode(s),
            (std::vector<std::string>{"off: its transform runs ops on the workers"}));
  s.gpu_decode->off = "no libnvjpeg: tried libnvjpeg.so.13";
  EXPECT_EQ(FormatGpuDecode(s),
            (std::vector<std::string>{"off: no libnvjpeg: tried libnvjpeg.so.13"}));
}

// Stall attribution: each rank's stall ratio and limiting stage, and the job's most stalled rank.
TEST(RenderTest, StallAndLimitingStageAreShownPerRankAndForTheJob) {
  JobStatus s = SampleJob();
  s.ranks[0].stall_ratio = 0.634;
  s.ranks[0].stall_window_seconds = 10;
  s.ranks[0].limiting_stage = "read";
  s.ranks[0].limiting_stage_note = "the trainer waited 63% of the last 10.0 s (as it measured)";
  RankStatus r2;
  r2.rank = 2;
  r2.attached = true;
  r2.stall_ratio = 0.02;
  r2.stall_window_seconds = 10;
  r2.limiting_stage = "trainer_cpu";
  r2.consumer_cpu_wait_ratio = 0.31;  // ahead of it, ferry; its main thread short of CPU
  s.ranks.push_back(r2);
  const std::string job = RenderJob(s);
  EXPECT_THAT(job, HasSubstr("STALL  CPU WAIT  LIMIT"));
  EXPECT_THAT(job, HasSubstr("63%         -  read"));  // rank 0's CPU wait is not known
  EXPECT_THAT(job, HasSubstr("2%       31%  trainer_cpu"));
  EXPECT_THAT(job, HasSubstr("limiting stage:\nrank 0: the trainer waited 63% of the last 10.0 s "
                             "(as it measured)\n"));
  StatusReport report;
  report.jobs.push_back(s);
  const std::string jobs = RenderJobs(report);
  EXPECT_THAT(jobs, HasSubstr("STALL  LIMIT"));
  EXPECT_THAT(jobs, HasSubstr("63%  read"));  // the most stalled rank
  EXPECT_THAT(jobs, Not(HasSubstr("trainer")));
  // Before a window was observed, and for a rank ferryd cannot tell about yet: "-".
  s.ranks = {RankStatus()};
  s.ranks[0].attached = true;
  report.jobs = {s};
  EXPECT_THAT(RenderJobs(report), HasSubstr("-  -"));
}

TEST(RenderTest, StatusShowsDaemonNumaAndMemory) {
  StatusReport report;
  report.daemon.version = "0.1.0";
  report.daemon.pid = 42;
  report.daemon.uptime_seconds = 65;
  report.daemon.host_memory_in_use_bytes = uint64_t{1} << 30;
  report.daemon.host_memory_budget_bytes = uint64_t{4} << 30;
  report.daemon.numa_nodes.push_back({0, {0, 1, 2, 3}, 4});
  report.daemon.workers = 8;
  report.daemon.workers_busy_fraction = 0.45;
  report.daemon.cpu_seconds = 12.5;
  std::string out = RenderStatus(report);
  EXPECT_THAT(out, HasSubstr("ferryd         0.1.0"));
  EXPECT_THAT(out, HasSubstr("1.0 GiB in use of 4.0 GiB budget (25.0%)"));
  EXPECT_THAT(out, HasSubstr("cuda           no"));
  EXPECT_THAT(out, HasSubstr("workers        8 threads, 45% busy over the last 10 s; ferryd used "
                             "12.5 CPU seconds"));
  EXPECT_THAT(out, HasSubstr("0-3"));
  EXPECT_THAT(out, HasSubstr("no jobs"));
  EXPECT_THAT(out, Not(HasSubstr("WORKER CPUS")));  // no GPU table without GPUs
  EXPECT_THAT(out, Not(HasSubstr("remote")));       // nor remote rows without remote reads

  RemoteStatus& remote = report.daemon.remote.emplace();
  remote.cache_bytes = uint64_t{3} << 30;
  remote.cache_capacity_bytes = uint64_t{100} << 30;
  remote.cache_entries = 40;
  remote.cache_pinned_entries = 2;
  remote.cache_hits = 900;
  remote.cache_misses = 40;
  remote.downloaded_bytes = uint64_t{3} << 30;
  remote.requests = 85;
  remote.retries = {{"connection", 0}, {"throttled", 4}, {"server", 1}, {"short", 0}};
  remote.failures = 1;
  out = RenderStatus(report);
  EXPECT_THAT(out, HasSubstr("remote cache   3.0 GiB of 100.0 GiB in 40 objects (2 being read); "
                             "900 hits, 40 downloads, 0 evicted"));
  EXPECT_THAT(out, HasSubstr("remote reads   3.0 GiB downloaded in 85 requests (0 now); "
                             "retried: 4 throttled, 1 server; 1 failed"));
  report.daemon.remote.reset();

  GpuStatus gpu;
  gpu.ordinal = 0;
  gpu.name = "NVIDIA H100 80GB HBM3";
  gpu.pci_bus_id = "0000:3b:00.0";
  gpu.numa_node = 1;
  gpu.local_cpus = {8, 9, 10, 11};
  gpu.pinned_memory_in_use_bytes = uint64_t{3} << 30;
  gpu.device_memory_in_use_bytes = uint64_t{2} << 30;
  gpu.device_memory_budget_bytes = uint64_t{20} << 30;
  gpu.h2d_bytes_per_second = 25.5e9;
  gpu.batches_in_flight = 3;
  gpu.ranks = 2;
  report.daemon.gpus.push_back(gpu);
  out = RenderStatus(report);
  EXPECT_THAT(out, HasSubstr("WORKER CPUS"));
  EXPECT_THAT(out, HasSubstr("NVIDIA H100 80GB HBM3"));
  EXPECT_THAT(out, HasSubstr("0000:3b:00.0"));
  EXPECT_THAT(out, HasSubstr("8-11"));
  EXPECT_THAT(out, HasSubstr("3.0 GiB"));
  EXPECT_THAT(out, HasSubstr("2.0 GiB / 20.0 GiB"));
  EXPECT_THAT(out, HasSubstr("23.7 GiB"));          // 25.5e9 B/s
  EXPECT_THAT(out, Not(HasSubstr("JPEG decode")));  // none of its jobs decodes there

  // A GPU whose JPEG decoder took a quarter of the images.
  report.daemon.gpus[0].jpeg_gpu_images = 1000;
  report.daemon.gpus[0].jpeg_cpu_images = 3000;
  report.daemon.gpus[0].jpeg_fallbacks = {{"progressive", 120}, {"not_jpeg", 1}};
  out = RenderStatus(report);
  EXPECT_THAT(out, HasSubstr("GPU 0 JPEG decode: 1,000 images decoded on the GPU, 3,000 on the "
                             "CPU (not for the GPU: progressive 120, not_jpeg 1); 25% on the "
                             "GPU\n"));
}

}  // namespace
}  // namespace ferry::ctl
