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

v1::RankStatus* AddRank(v1::JobStatus* job, uint32_t rank) {
  v1::RankStatus* r = job->add_ranks();
  r->set_rank(rank);
  return r;
}

v1::ReasonCount Reason(const std::string& reason, int64_t count) {
  v1::ReasonCount c;
  c.set_reason(reason);
  c.set_count(count);
  return c;
}

v1::JobStatus SampleJob() {
  v1::JobStatus s;
  v1::Job* job = s.mutable_job();
  job->set_id("job-1");
  job->set_name("imagenet-train");
  job->set_owner_uid(1000);
  v1::JobSpec* spec = job->mutable_spec();
  spec->mutable_dataset()->mutable_image_folder()->set_root("/data/train");
  v1::RandomResizedCrop* rrc = spec->mutable_transform()->mutable_random_resized_crop();
  rrc->set_size(224);
  rrc->set_flip(true);
  spec->set_batch_size(256);
  spec->set_world_size(2);
  job->set_num_samples(1000);
  job->set_batches_per_epoch(2);
  v1::Field* image = job->add_fields();
  image->set_name("image");
  image->set_dtype(v1::UINT8);
  for (int64_t d : {224, 224, 3}) image->add_shape(d);
  image->set_row_bytes(150528);
  v1::RankStatus* r0 = AddRank(&s, 0);
  r0->set_attached(true);
  r0->set_batches_per_second(10);
  r0->set_samples_per_second(2560);
  r0->set_consumer_wait_seconds(1.25);
  r0->set_slots(17);
  r0->set_batch_channel(true);
  AddRank(&s, 1);
  s.set_errors(1);
  v1::SampleError* error = s.add_recent_errors();
  error->set_index(17);
  error->set_path("/data/train/a/bad.jpg");
  error->set_message("not a JPEG file");
  return s;
}

v1::GetStatusResponse StatusOf(const v1::JobStatus& job) {
  v1::GetStatusResponse status;
  *status.add_jobs() = job;
  return status;
}

TEST(FormatTest, TransformNamesEachComposedOp) {
  v1::JobSpec spec;
  EXPECT_EQ(FormatTransform(spec), "-");
  spec.mutable_transform()->mutable_center_crop()->set_size(224);
  spec.mutable_transform()->mutable_center_crop()->set_resize(256);
  EXPECT_EQ(FormatTransform(spec), "center_crop 224 (resize 256)");
  v1::Compose* compose = spec.mutable_transform()->mutable_compose();
  v1::TransformOp::RandomCrop* crop = compose->add_ops()->mutable_random_crop();
  crop->set_size(32);
  crop->add_padding(4);
  compose->add_ops()->mutable_random_horizontal_flip();
  v1::TransformOp::Normalize* normalize = compose->add_ops()->mutable_normalize();
  normalize->add_mean(0.5f);
  normalize->add_std(0.5f);
  compose->add_ops();  // an op this ferryctl does not know (a newer ferryd's)
  EXPECT_EQ(FormatTransform(spec), "compose random_crop 32, random_horizontal_flip, normalize, ?");
}

TEST(FormatTest, DatasetOfEachKind) {
  v1::JobSpec spec;
  EXPECT_EQ(FormatDataset(spec), "-");
  v1::RecordsDataset* records = spec.mutable_dataset()->mutable_records();
  records->set_path("/data/r.bin");
  records->set_dtype(v1::INT64);
  records->add_shape(2);
  records->add_shape(3);
  EXPECT_EQ(FormatDataset(spec), "records /data/r.bin (int64[2,3])");
  v1::WebDataset* wds = spec.mutable_dataset()->mutable_webdataset();
  wds->add_shards("/data/a.tar");
  wds->add_shards("/data/b.tar");
  wds->set_exif_orientation(true);
  EXPECT_EQ(FormatDataset(spec), "webdataset /data/a.tar /data/b.tar (exif_orientation)");
  wds->add_shards("/data/c.tar");
  wds->add_shards("/data/d.tar");
  for (int i = 0; i < 4; ++i) wds->add_shard_samples(10);
  EXPECT_EQ(FormatDataset(spec),
            "webdataset /data/a.tar ... /data/d.tar (4 shards) (counted, exif_orientation)");
  v1::MegatronGptDataset* megatron = spec.mutable_dataset()->mutable_megatron_gpt();
  megatron->add_path_prefixes("/data/wiki");
  megatron->set_split_name(v1::MegatronGptDataset::VALID);
  megatron->set_sequence_length(4096);
  megatron->set_random_seed(1234);
  EXPECT_EQ(FormatDataset(spec), "megatron_gpt /data/wiki (valid split, seq 4096, seed 1234)");
  v1::BlendDataset* blend = spec.mutable_dataset()->mutable_blend();
  blend->add_sources();
  blend->add_sources();
  EXPECT_EQ(FormatDataset(spec), "blend of 2 sources");
}

TEST(RenderTest, JobsTableSumsRatesAndCountsAttachedRanks) {
  std::string out = RenderJobs(StatusOf(SampleJob()));
  EXPECT_THAT(out, HasSubstr("ID     NAME"));
  EXPECT_THAT(out, HasSubstr("imagefolder /data/train"));
  EXPECT_THAT(out, HasSubstr("1/2"));
  EXPECT_THAT(out, HasSubstr("2560"));
  EXPECT_THAT(out, HasSubstr("active"));
  EXPECT_EQ(RenderJobs(v1::GetStatusResponse()), "no jobs\n");
}

TEST(RenderTest, IdleJobsShowHowLongAndNoRates) {
  v1::JobStatus idle = SampleJob();
  for (v1::RankStatus& r : *idle.mutable_ranks()) r.set_attached(false);
  idle.set_idle_seconds(190);
  idle.set_deleted_in_seconds(410);
  const std::string out = RenderJobs(StatusOf(idle));
  EXPECT_THAT(out, HasSubstr("idle 3m 10s, deleted in 6m 50s"));
  EXPECT_THAT(out, Not(HasSubstr("2560")));  // the last consumer's rate is not shown
  idle.set_deleted_in_seconds(0);            // job_idle_timeout_seconds 0: kept
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
  v1::JobStatus s = SampleJob();
  s.mutable_ranks(0)->set_device("cuda:0");
  s.mutable_ranks(1)->set_device("cuda:1");
  const std::string out = RenderJob(s);
  EXPECT_THAT(out, HasSubstr("RANK  DEVICE"));
  EXPECT_THAT(out, HasSubstr("   0  cuda:0  yes, shm"));
  EXPECT_THAT(out, HasSubstr("   1  cuda:1  no"));
}

TEST(RenderTest, JobShowsEachRanksDemandForItsGpusDecoder) {
  v1::JobStatus s = SampleJob();
  EXPECT_THAT(RenderJob(s), Not(HasSubstr("GPU DEC")));  // no GPU decodes for a host job
  s.mutable_gpu_decode()->set_mode("auto");
  s.mutable_gpu_decode()->set_gpu_share(0.4);
  s.mutable_ranks(0)->set_gpu_decode_demand(0.9);
  s.mutable_ranks(0)->set_gpu_decode_batches(1234);
  const std::string out = RenderJob(s);
  EXPECT_THAT(out, HasSubstr("LIMIT      GPU DEC\n"));
  EXPECT_THAT(out, HasSubstr("0.90, 1,234\n"));
  EXPECT_THAT(out, HasSubstr("0.00, 0\n"));
}

TEST(RenderTest, JobSaysWhichRanksResumeAnEpochBegunElsewhere) {
  v1::JobStatus s = SampleJob();
  EXPECT_THAT(RenderJob(s), Not(HasSubstr("resumed:")));
  s.mutable_ranks(0)->set_epoch(3);
  s.mutable_ranks(0)->set_epoch_batches(21);
  s.mutable_ranks(0)->set_resumed_after_positions(640);
  EXPECT_THAT(RenderJob(s), HasSubstr("resumed:\nrank 0: epoch 3 goes on after the 640 positions "
                                      "an earlier run delivered (21 batches a rank)"));
}

TEST(RenderTest, JobShowsEachDistinctCopyPath) {
  v1::JobStatus s = SampleJob();
  for (v1::RankStatus& r : *s.mutable_ranks()) {
    r.set_copy_path(v1::PAGE_CACHE_GATHER);
    r.set_pinned_dataset_bytes(uint64_t{512} << 20);
  }
  s.mutable_ranks(0)->set_batches_copied(100);
  s.mutable_ranks(0)->set_batches_gathered(60);
  s.mutable_ranks(1)->set_batches_copied(50);
  s.mutable_ranks(1)->set_batches_gathered(5);
  std::string out = RenderJob(s);
  EXPECT_THAT(out,
              HasSubstr("copy path      page-cache gather (512.0 MiB of the dataset pinned)\n"));
  EXPECT_THAT(out, HasSubstr("gathered       65 of 150 batches (the others copied by workers)\n"));
  // The default: gathered while the trainer waits, as the note says.
  for (v1::RankStatus& r : *s.mutable_ranks()) {
    r.set_copy_path_note("kernels gather the batches made while the trainer waits for them");
  }
  EXPECT_THAT(RenderJob(s), HasSubstr("copy path      page-cache gather (512.0 MiB of the dataset "
                                      "pinned): kernels gather the batches made while the "
                                      "trainer waits for them\n"));
  s.mutable_ranks(0)->clear_copy_path_note();
  s.mutable_ranks(1)->set_copy_path(v1::SLOT_COPY);
  s.mutable_ranks(1)->set_pinned_dataset_bytes(0);
  s.mutable_ranks(1)->set_copy_path_note("workers copy the records: over budget");
  out = RenderJob(s);
  EXPECT_THAT(out, HasSubstr("pinned); slot copy: workers copy the records: over budget"));
  // Only the ranks that gather count.
  EXPECT_THAT(out, HasSubstr("gathered       60 of 100 batches"));
  for (v1::RankStatus& r : *s.mutable_ranks()) r.set_copy_path(v1::SLOT_COPY);
  EXPECT_THAT(RenderJob(s), Not(HasSubstr("gathered ")));
}

TEST(RenderTest, JobShowsWhatTheReadAheadDid) {
  v1::JobStatus s = SampleJob();
  EXPECT_THAT(RenderJob(s), Not(HasSubstr("read ahead")));  // a local dataset: no row
  v1::ReadAheadStatus* ahead = s.mutable_read_ahead();
  ahead->set_opened(12345);
  ahead->set_skipped(30);
  ahead->set_files_in_window(256);
  ahead->set_bytes_in_window(3ull << 29);
  EXPECT_THAT(RenderJob(s), HasSubstr("read ahead     12,345 files fetched ahead of the workers, "
                                      "30 reached first by the workers; window 256 files, "
                                      "1.5 GiB\n"));
  ahead->set_failed(2);
  EXPECT_EQ(FormatReadAhead(s),
            "12,345 files fetched ahead of the workers, 30 reached first by the workers, 2 "
            "failed; window 256 files, 1.5 GiB");
}

TEST(RenderTest, JobShowsWhoDecodesTheJpegs) {
  v1::JobStatus s = SampleJob();
  EXPECT_THAT(RenderJob(s), Not(HasSubstr("gpu decode")));  // a host job: no row
  v1::GpuDecodeStatus* g = s.mutable_gpu_decode();
  g->set_mode("auto");
  g->set_gpu_images(120345);
  g->set_cpu_images(30100);
  for (const v1::ReasonCount& f : {Reason("progressive", 812), Reason("cmyk", 301),
                                   Reason("too_large", 9800), Reason("not_jpeg", 2)}) {
    *g->add_fallbacks() = f;
  }
  g->set_gpu_share(0.81);
  g->set_cpu_ms_per_image(1.95);
  g->set_gpu_ms_per_image(0.041);
  EXPECT_THAT(RenderJob(s),
              HasSubstr("gpu decode     auto: 81% of the files the GPU can decode go to it (share "
                        "0.81); 1.95 ms/image on a worker, 0.041 ms/image on the GPU\n"
                        "               120,345 images decoded on the GPU, 30,100 on the CPU (not "
                        "for the GPU: progressive 812, cmyk 301, too_large 9,800, not_jpeg 2)\n"));
  // The search by batch rate moved the share past the costs' balance.
  g->set_search_offset(0.15);
  EXPECT_THAT(FormatGpuDecode(s)[0],
              HasSubstr("0.041 ms/image on the GPU; the search by batch rate moved the share "
                        "+0.15"));

  // Mode "gpu" before any batch was timed, nothing fallen back yet.
  g->Clear();
  g->set_mode("gpu");
  g->set_gpu_images(512);
  g->set_gpu_share(1);
  EXPECT_EQ(FormatGpuDecode(s),
            (std::vector<std::string>{"gpu: every file the GPU can decode goes to it",
                                      "512 images decoded on the GPU, 0 on the CPU"}));
  g->set_cpu_ms_per_image(2.5);
  EXPECT_EQ(FormatGpuDecode(s)[0],
            "gpu: every file the GPU can decode goes to it; 2.5 ms/image on a worker, not yet "
            "measured on the GPU");

  // A job shared by the ranks of four GPUs: each GPU's engines decode its rank's files.
  g->set_gpu_ms_per_image(0.4);
  g->set_decoders(4);
  EXPECT_EQ(FormatGpuDecode(s)[0],
            "gpu: every file the GPU can decode goes to it; 2.5 ms/image on a worker, 0.4 "
            "ms/image on each of 4 GPUs");

  // Off: one line with ferryd's reason, without its "GPU JPEG decode is off" preamble.
  g->Clear();
  g->set_off("GPU JPEG decode is off: the daemon's gpu_decode is \"cpu\"");
  EXPECT_THAT(RenderJob(s), HasSubstr("gpu decode     off: the daemon's gpu_decode is \"cpu\"\n"));
  g->set_off("GPU JPEG decode is off for this job: its transform runs ops on the workers");
  EXPECT_EQ(FormatGpuDecode(s),
            (std::vector<std::string>{"off: its transform runs ops on the workers"}));
  g->set_off("no libnvjpeg: tried libnvjpeg.so.13");
  EXPECT_EQ(FormatGpuDecode(s),
            (std::vector<std::string>{"off: no libnvjpeg: tried libnvjpeg.so.13"}));
}

// Stall attribution: each rank's stall ratio and limiting stage, and the job's most stalled rank.
TEST(RenderTest, StallAndLimitingStageAreShownPerRankAndForTheJob) {
  v1::JobStatus s = SampleJob();
  v1::RankStatus* r0 = s.mutable_ranks(0);
  r0->set_stall_ratio(0.634);
  r0->set_stall_window_seconds(10);
  r0->set_limiting_stage(v1::LIMITED_BY_READ);
  r0->set_limiting_stage_note("the trainer waited 63% of the last 10.0 s (as it measured)");
  r0->set_consumer_cpu_wait_ratio(-1);  // ferryd cannot read it
  v1::RankStatus* r2 = AddRank(&s, 2);
  r2->set_attached(true);
  r2->set_stall_ratio(0.02);
  r2->set_stall_window_seconds(10);
  r2->set_limiting_stage(v1::LIMITED_BY_TRAINER_CPU);
  r2->set_consumer_cpu_wait_ratio(0.31);  // ahead of it, ferry; its main thread short of CPU
  const std::string job = RenderJob(s);
  EXPECT_THAT(job, HasSubstr("STALL  CPU WAIT  LIMIT"));
  EXPECT_THAT(job, HasSubstr("63%         -  read"));  // rank 0's CPU wait is not known
  EXPECT_THAT(job, HasSubstr("2%       31%  trainer_cpu"));
  EXPECT_THAT(job, HasSubstr("limiting stage:\nrank 0: the trainer waited 63% of the last 10.0 s "
                             "(as it measured)\n"));
  const std::string jobs = RenderJobs(StatusOf(s));
  EXPECT_THAT(jobs, HasSubstr("STALL  LIMIT"));
  EXPECT_THAT(jobs, HasSubstr("63%  read"));  // the most stalled rank
  EXPECT_THAT(jobs, Not(HasSubstr("trainer")));
  // Before a window was observed, and for a rank ferryd cannot tell about yet: "-".
  s.clear_ranks();
  AddRank(&s, 0)->set_attached(true);
  EXPECT_THAT(RenderJobs(StatusOf(s)), HasSubstr("-  -"));
}

TEST(RenderTest, StatusShowsDaemonNumaAndMemory) {
  v1::GetStatusResponse status;
  v1::DaemonStatus* d = status.mutable_daemon();
  d->set_version("0.1.0");
  d->set_pid(42);
  d->set_uptime_seconds(65);
  d->set_host_memory_in_use_bytes(uint64_t{1} << 30);
  d->set_host_memory_budget_bytes(uint64_t{4} << 30);
  v1::NumaNodeStatus* node = d->add_numa_nodes();
  node->set_id(0);
  for (int32_t cpu : {0, 1, 2, 3}) node->add_cpus(cpu);
  node->set_workers(4);
  d->set_workers(8);
  d->set_workers_busy_fraction(0.45);
  d->set_cpu_seconds(12.5);
  std::string out = RenderStatus(status);
  EXPECT_THAT(out, HasSubstr("ferryd         0.1.0"));
  EXPECT_THAT(out, HasSubstr("1.0 GiB in use of 4.0 GiB budget (25.0%)"));
  EXPECT_THAT(out, HasSubstr("cuda           no"));
  EXPECT_THAT(out, HasSubstr("workers        8 threads, 45% busy over the last 10 s; ferryd used "
                             "12.5 CPU seconds"));
  EXPECT_THAT(out, HasSubstr("0-3"));
  EXPECT_THAT(out, HasSubstr("no jobs"));
  EXPECT_THAT(out, Not(HasSubstr("WORKER CPUS")));  // no GPU table without GPUs
  EXPECT_THAT(out, Not(HasSubstr("remote")));       // nor remote rows without remote reads

  v1::RemoteStatus* remote = d->mutable_remote();
  remote->set_cache_bytes(uint64_t{3} << 30);
  remote->set_cache_capacity_bytes(uint64_t{100} << 30);
  remote->set_cache_entries(40);
  remote->set_cache_pinned_entries(2);
  remote->set_cache_hits(900);
  remote->set_cache_misses(40);
  remote->set_downloaded_bytes(uint64_t{3} << 30);
  remote->set_requests(85);
  for (const v1::ReasonCount& c :
       {Reason("connection", 0), Reason("throttled", 4), Reason("server", 1), Reason("short", 0)}) {
    *remote->add_retries() = c;
  }
  remote->set_failures(1);
  out = RenderStatus(status);
  EXPECT_THAT(out, HasSubstr("remote cache   3.0 GiB of 100.0 GiB in 40 objects (2 being read); "
                             "900 hits, 40 downloads, 0 evicted"));
  EXPECT_THAT(out, HasSubstr("remote reads   3.0 GiB downloaded in 85 requests (0 now); "
                             "retried: 4 throttled, 1 server; 1 failed"));
  d->clear_remote();

  v1::GpuStatus* gpu = d->add_gpus();
  gpu->set_ordinal(0);
  gpu->set_name("NVIDIA H100 80GB HBM3");
  gpu->set_pci_bus_id("0000:3b:00.0");
  gpu->set_numa_node(1);
  for (int32_t cpu : {8, 9, 10, 11}) gpu->add_local_cpus(cpu);
  gpu->set_pinned_memory_in_use_bytes(uint64_t{3} << 30);
  gpu->set_device_memory_in_use_bytes(uint64_t{2} << 30);
  gpu->set_device_memory_budget_bytes(uint64_t{20} << 30);
  gpu->set_h2d_bytes_per_second(25.5e9);
  gpu->set_batches_in_flight(3);
  gpu->set_ranks(2);
  out = RenderStatus(status);
  EXPECT_THAT(out, HasSubstr("WORKER CPUS"));
  EXPECT_THAT(out, HasSubstr("NVIDIA H100 80GB HBM3"));
  EXPECT_THAT(out, HasSubstr("0000:3b:00.0"));
  EXPECT_THAT(out, HasSubstr("8-11"));
  EXPECT_THAT(out, HasSubstr("3.0 GiB"));
  EXPECT_THAT(out, HasSubstr("2.0 GiB / 20.0 GiB"));
  EXPECT_THAT(out, HasSubstr("23.7 GiB"));          // 25.5e9 B/s
  EXPECT_THAT(out, Not(HasSubstr("JPEG decode")));  // none of its jobs decodes there

  // A GPU whose JPEG decoder took a quarter of the images.
  gpu->set_jpeg_gpu_images(1000);
  gpu->set_jpeg_cpu_images(3000);
  *gpu->add_jpeg_fallbacks() = Reason("progressive", 120);
  *gpu->add_jpeg_fallbacks() = Reason("not_jpeg", 1);
  out = RenderStatus(status);
  EXPECT_THAT(out, HasSubstr("GPU 0 JPEG decode: 1,000 images decoded on the GPU, 3,000 on the "
                             "CPU (not for the GPU: progressive 120, not_jpeg 1); 25% on the "
                             "GPU\n"));
}

}  // namespace
}  // namespace ferry::ctl
