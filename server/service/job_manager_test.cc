// JobManager: ownership, dataset_roots policy, idempotent creation and every bad-input error
// a client can provoke, on a real tokens dataset in a temporary directory.
#include "server/service/job_manager.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/transport/gpu_provider.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ferry_job_manager_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_ / "data");
    std::filesystem::create_directories(dir_ / "elsewhere");
    tokens_ = (dir_ / "data" / "tokens.bin").string();
    std::ofstream out(tokens_, std::ios::binary);
    for (uint16_t t = 0; t < 4096; ++t) out.write(reinterpret_cast<const char*>(&t), 2);
    out.close();
    Topology topo = *Topology::Read("/sys");
    pool_ = *WorkerPool::Create(topo, 1);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<JobManager> Manager(std::vector<std::string> roots, bool allow_any,
                                      uint64_t budget = 1 << 30,
                                      absl::Duration idle_timeout = absl::Minutes(10),
                                      uint32_t max_jobs_per_uid = 64) {
    budget_ = std::make_unique<MemoryBudget>("host memory budget", "host_memory_budget_bytes",
                                             budget, "/etc/ferry/ferryd.conf");
    JobManager::Options o;
    o.dataset_roots = std::move(roots);
    o.allow_any_dataset = allow_any;
    o.config_path = "/etc/ferry/ferryd.conf";
    o.job_idle_timeout = idle_timeout;
    o.max_jobs_per_uid = max_jobs_per_uid;
    o.clock = manager_clock_;
    return std::make_unique<JobManager>(o, pool_.get(), budget_.get());
  }
  // A manager of any dataset, 1 GiB of host budget, over `gpus` (which must outlive it).
  std::unique_ptr<JobManager> GpuManager(GpuProvider* gpus) {
    budget_ = std::make_unique<MemoryBudget>("host memory budget", "host_memory_budget_bytes",
                                             1 << 30, "/etc/ferry/ferryd.conf");
    JobManager::Options o;
    o.allow_any_dataset = true;
    return std::make_unique<JobManager>(o, pool_.get(), budget_.get(), gpus);
  }

  ferry::v1::JobSpec TokensSpec(const std::string& path, uint32_t seq_len = 16) {
    ferry::v1::JobSpec spec;
    spec.mutable_dataset()->mutable_tokens()->set_path(path);
    spec.mutable_dataset()->mutable_tokens()->set_token_dtype(ferry::v1::UINT16);
    spec.mutable_dataset()->mutable_tokens()->set_seq_len(seq_len);
    spec.set_batch_size(8);
    spec.set_world_size(2);
    return spec;
  }

  std::filesystem::path dir_;
  std::string tokens_;
  // The budget outlives the pool: a worker may drop a pipeline's last reference (and with it
  // its reservation) until the pool has joined it.
  FakeClock clock_;                              // outlives the workers, which may still read it
  const Clock* manager_clock_ = &Clock::Real();  // Manager's; a test may point it at clock_
  std::unique_ptr<MemoryBudget> budget_;
  std::unique_ptr<WorkerPool> pool_;
};

const Caller kAlice{1000, 11};
const Caller kBob{1001, 12};
const Caller kRoot{0, 13};

TEST_F(JobManagerTest, IdenticalSpecsShareOneJob) {
  auto m = Manager({}, true);
  auto a = m->CreateJob(kAlice, "", TokensSpec(tokens_));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->created);
  auto b = m->CreateJob(kAlice, "", TokensSpec(tokens_));
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->created);
  EXPECT_EQ(a->job->identity().id, b->job->identity().id);
  auto other = m->CreateJob(kAlice, "", TokensSpec(tokens_, 32));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->job->identity().id, a->job->identity().id);
  auto clash = m->CreateJob(kAlice, a->job->identity().name, TokensSpec(tokens_, 8));
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(JobManagerTest, MissingDatasetIsNotFoundNamingThePath) {
  auto m = Manager({}, true);
  const std::string missing = (dir_ / "data" / "nope.bin").string();
  auto r = m->CreateJob(kAlice, "", TokensSpec(missing));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(missing));
}

TEST_F(JobManagerTest, DatasetOutsideRootsIsPermissionDenied) {
  auto m = Manager({(dir_ / "elsewhere").string()}, false);
  auto r = m->CreateJob(kAlice, "", TokensSpec(tokens_));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(r.status().message(), HasSubstr((dir_ / "elsewhere").string()));
  EXPECT_THAT(r.status().message(), HasSubstr("/etc/ferry/ferryd.conf"));
  // A sibling directory whose name starts like the root is not under it.
  auto m2 = Manager({(dir_ / "dat").string()}, false);
  EXPECT_EQ(m2->CreateJob(kAlice, "", TokensSpec(tokens_)).status().code(),
            absl::StatusCode::kPermissionDenied);
  // ".." cannot climb out of a root.
  auto m3 = Manager({(dir_ / "elsewhere").string()}, false);
  EXPECT_EQ(m3->CreateJob(kAlice, "", TokensSpec((dir_ / "elsewhere/../data/tokens.bin").string()))
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  auto ok = Manager({(dir_ / "data").string()}, false);
  EXPECT_TRUE(ok->CreateJob(kAlice, "", TokensSpec(tokens_)).ok());
}

// The request that crashed ferryd: one 1 TiB record and a batch of 2^24 of them wrapped the
// slot size, and a worker wrote past its slot. Every size is checked now, naming the field.
TEST_F(JobManagerTest, BatchesWhoseSizeOverflowsAreRefusedNamingTheField) {
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
  GTEST_SKIP() << "TSan's shadow memory leaves no room to map a 1 TiB file (plain and ASan "
                  "builds run this test)";
#endif
#endif
  const std::string huge = (dir_ / "data" / "one_record.bin").string();
  { std::ofstream create(huge, std::ios::binary); }
  if (truncate(huge.c_str(), off_t{1} << 40) != 0) {
    GTEST_SKIP() << "this filesystem cannot hold a sparse 1 TiB file";
  }
  auto m = Manager({}, true);
  ferry::v1::JobSpec spec;
  spec.mutable_dataset()->mutable_records()->set_path(huge);
  spec.mutable_dataset()->mutable_records()->set_dtype(ferry::v1::UINT8);
  spec.mutable_dataset()->mutable_records()->add_shape(int64_t{1} << 40);
  spec.set_batch_size(1u << 24);
  auto r = m->CreateJob(kAlice, "", spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("batch_size must be in [1, 1048576]"));

  spec.set_batch_size(1u << 20);  // allowed, but 2^60 bytes a batch
  r = m->CreateJob(kAlice, "", spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("field 'data'"));
  EXPECT_THAT(r.status().message(), HasSubstr("lower batch_size"));
}

// What a request may carry is bounded, and errors quote a bounded part of it: a 9 KB job id
// turned NOT_FOUND into RESOURCE_EXHAUSTED (over gRPC's metadata limit), a 3 MiB job name was
// accepted, and a rank of 2^32 - 1 was cast to int.
TEST_F(JobManagerTest, RequestSizesAreBoundedAndErrorsQuoteLittleOfThem) {
  auto m = Manager({}, true);
  const std::string long_id(9000, 'j');
  auto missing = m->GetJob(kAlice, long_id);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(missing.status().message().size(), 200u);
  EXPECT_THAT(missing.status().message(), HasSubstr("(9000 bytes)"));

  auto named = m->CreateJob(kAlice, std::string(3 << 20, 'n'), TokensSpec(tokens_));
  EXPECT_EQ(named.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(named.status().message(), HasSubstr("at most 128 printable ASCII characters"));
  EXPECT_LT(named.status().message().size(), 300u);
  EXPECT_EQ(m->CreateJob(kAlice, "a\nb", TokensSpec(tokens_)).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto spec = TokensSpec(tokens_);
  spec.set_world_size(UINT32_MAX);
  auto wide = m->CreateJob(kAlice, "", spec);
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wide.status().message(), HasSubstr("world_size must be at most 1048576"));

  auto job = m->CreateJob(kAlice, "ranks", TokensSpec(tokens_));
  ASSERT_TRUE(job.ok()) << job.status();
  auto rank = m->Attach(kAlice, job->job->identity().id, UINT32_MAX);
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rank.status().message(), HasSubstr("rank must be in [0, 2)"));
  EXPECT_THAT(rank.status().message(), HasSubstr("(got 4294967295)"));
}

TEST_F(JobManagerTest, NoRootsOnASystemDaemonRefusesEverything) {
  auto m = Manager({}, false);
  auto r = m->CreateJob(kAlice, "", TokensSpec(tokens_));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(r.status().message(), HasSubstr("none configured"));
}

TEST_F(JobManagerTest, InvalidFieldsAreNamed) {
  auto m = Manager({}, true);
  auto spec = TokensSpec(tokens_);
  spec.set_batch_size(0);
  auto r = m->CreateJob(kAlice, "", spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("batch_size"));

  r = m->CreateJob(kAlice, "", TokensSpec(tokens_, 0));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("seq_len"));

  spec = TokensSpec(tokens_);
  spec.mutable_dataset()->mutable_tokens()->set_token_dtype(ferry::v1::FLOAT32);
  r = m->CreateJob(kAlice, "", spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("token_dtype"));

  ferry::v1::JobSpec image;
  image.mutable_dataset()->mutable_image_folder()->set_root(dir_.string());
  image.mutable_transform()->mutable_random_resized_crop()->set_size(0);
  image.set_batch_size(4);
  r = m->CreateJob(kAlice, "", image);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("size"));

  spec = TokensSpec(tokens_);
  spec.set_device("tpu:0");
  EXPECT_EQ(m->CreateJob(kAlice, "", spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.set_device("cuda:0");
  EXPECT_EQ(m->CreateJob(kAlice, "", spec).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Accepts "cuda:0" and checks nothing: enough to create GPU jobs (no rank attaches).
class OneGpu final : public GpuProvider {
 public:
  absl::StatusOr<int> Resolve(const std::string&) const override { return 0; }
  absl::Status CheckJob(const Job&) const override { return absl::OkStatus(); }
  int NumaNode(int) const override { return -1; }
  absl::StatusOr<std::unique_ptr<DeviceStage>> MakeStage(const Job&, int, const SharedSlab&,
                                                         int) override {
    return absl::UnimplementedError("no device here");
  }
  void FillStatus(ferry::v1::DaemonStatus*) const override {}
};

// DaemonConfig.widen_tokens_on_host makes every GPU token job one that asks for
// widen_on_host: its host rows are int64, and a job that asked for it itself is the same
// job. Host jobs and other daemons are untouched.
TEST_F(JobManagerTest, WidenTokensOnHostSetsEveryGpuTokenJobsOwnOption) {
  budget_ = std::make_unique<MemoryBudget>("host memory budget", "host_memory_budget_bytes",
                                           1 << 30, "/etc/ferry/ferryd.conf");
  OneGpu gpu;
  JobManager::Options o;
  o.allow_any_dataset = true;
  o.widen_tokens_on_host = true;
  JobManager widening(o, pool_.get(), budget_.get(), &gpu);
  o.widen_tokens_on_host = false;
  JobManager plain(o, pool_.get(), budget_.get(), &gpu);

  auto spec = TokensSpec(tokens_);
  spec.set_device("cuda:0");
  auto widened = widening.CreateJob(kAlice, "", spec);
  ASSERT_TRUE(widened.ok()) << widened.status();
  EXPECT_TRUE(widened->job->spec().dataset().tokens().widen_on_host());
  EXPECT_EQ(widened->job->layout().fields[0].dtype, ferry::v1::INT64);
  auto asked = spec;
  asked.mutable_dataset()->mutable_tokens()->set_widen_on_host(true);
  auto same = widening.CreateJob(kAlice, "", asked);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->job->identity().id, widened->job->identity().id);

  auto host = widening.CreateJob(kAlice, "", TokensSpec(tokens_));
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_FALSE(host->job->spec().dataset().tokens().widen_on_host());
  auto raw = plain.CreateJob(kAlice, "", spec);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ(raw->job->layout().fields[0].dtype, ferry::v1::UINT16);
}

TEST_F(JobManagerTest, JobOverTheBudgetIsResourceExhausted) {
  auto m = Manager({}, true, /*budget=*/64 * 1024);
  auto spec = TokensSpec(tokens_, 100);
  spec.set_batch_size(32);  // 32 x 101 x 8 bytes = 25856 -> 28672 per slot, 4 slots
  spec.set_prefetch_depth(4);
  auto r = m->CreateJob(kAlice, "", spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("host_memory_budget_bytes"));
  EXPECT_THAT(r.status().message(), HasSubstr("114688 bytes"));
}

// A device stage that holds a ring and copies nothing (no consumer starts an epoch here).
class IdleStage final : public DeviceStage {
 public:
  explicit IdleStage(int slots) : slots_(slots) {}
  int num_device_slots() const override { return slots_; }
  void SetCallbacks(Callbacks) override {}
  absl::Status StartCopy(int, int, uint32_t, bool, uint64_t) override {
    return absl::UnimplementedError("IdleStage copies nothing");
  }
  void WatchReleased(int, uint64_t) override {}
  void Describe(ferry::v1::AttachResponse*) const override {}
  absl::Status OpenConsumer(const std::vector<std::string>&) override { return absl::OkStatus(); }
  void CloseConsumer() override {}

 private:
  const int slots_;
};

// Two fake GPUs, "cuda:0" and "cuda:1". MakeStage records which GPU each ring was made on
// and how many were being made at once, waiting for `together` of them.
class TwoGpus final : public GpuProvider {
 public:
  absl::StatusOr<int> Resolve(const std::string& device) const override {
    if (device == "cuda:0") return 0;
    if (device == "cuda:1") return 1;
    return absl::FailedPreconditionError(absl::StrCat("no GPU '", device, "'"));
  }
  absl::Status CheckJob(const Job&) const override { return absl::OkStatus(); }
  int NumaNode(int) const override { return -1; }
  absl::StatusOr<std::unique_ptr<DeviceStage>> MakeStage(const Job&, int ordinal, const SharedSlab&,
                                                         int slots) override {
    const int now = ++making;
    int seen = most_at_once.load();
    while (now > seen && !most_at_once.compare_exchange_weak(seen, now)) {
    }
    // Stays in until `together` rings are being made at once (or 10 s pass): if nothing
    // serialises them they all get in, however slowly the machine starts the threads.
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (making.load() < together.load() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    --making;
    absl::MutexLock lock(&mutex);
    made_on.push_back(ordinal);
    return std::make_unique<IdleStage>(slots);
  }
  void FillStatus(ferry::v1::DaemonStatus*) const override {}

  std::atomic<int> making{0};
  std::atomic<int> most_at_once{0};
  std::atomic<int> together{1};
  absl::Mutex mutex;
  std::vector<int> made_on ABSL_GUARDED_BY(mutex);
};

std::map<int, std::string> RankDevices(JobManager& m, const Job& job) {
  ferry::v1::JobStatus status;
  m.FillJobStatus(job, &status);
  std::map<int, std::string> out;
  for (const auto& r : status.ranks()) out[static_cast<int>(r.rank())] = r.device();
  return out;
}

// The ranks of one training run on different GPUs share one job (the spec names no GPU:
// device "cuda"), and each rank's ring is made on its own GPU, both at once.
TEST_F(JobManagerTest, RanksOnDifferentGpusShareOneJob) {
  TwoGpus gpus;
  std::unique_ptr<JobManager> manager = GpuManager(&gpus);
  JobManager& m = *manager;
  auto spec = TokensSpec(tokens_);
  spec.set_device("cuda");
  spec.set_world_size(2);
  auto first = m.CreateJob(kAlice, "train", spec);
  auto second = m.CreateJob(kAlice, "train", spec);  // rank 1's process, same name and spec
  ASSERT_TRUE(first.ok() && second.ok()) << first.status() << second.status();
  EXPECT_TRUE(first->created);
  EXPECT_FALSE(second->created);
  const std::string id = first->job->identity().id;
  EXPECT_EQ(second->job->identity().id, id);

  absl::StatusOr<JobManager::Attachment> rank0, rank1;
  gpus.together.store(2);
  std::thread a([&] { rank0 = m.Attach(kAlice, id, 0, "cuda:0"); });
  std::thread b([&] { rank1 = m.Attach(kAlice, id, 1, "cuda:1"); });
  a.join();
  b.join();
  gpus.together.store(1);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_EQ(gpus.most_at_once.load(), 2);  // no lock serialises the two GPUs' rings
  {
    absl::MutexLock lock(&gpus.mutex);
    std::vector<int> made_on = gpus.made_on;
    std::sort(made_on.begin(), made_on.end());
    EXPECT_EQ(made_on, (std::vector<int>{0, 1}));
  }
  EXPECT_EQ(RankDevices(m, *first->job),
            (std::map<int, std::string>{{0, "cuda:0"}, {1, "cuda:1"}}));
  EXPECT_EQ(m.ListJobs(kAlice).size(), 1u);

  // A rank whose trainer comes back on the other GPU gets its ring there.
  auto moved = m.Attach(kAlice, id, 0, "cuda:1");
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_NE(moved->pipeline, rank0->pipeline);
  EXPECT_EQ(RankDevices(m, *first->job)[0], "cuda:1");
  // Attaching again on the same GPU keeps the rank's pipeline.
  auto again = m.Attach(kAlice, id, 0, "cuda:1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->pipeline, moved->pipeline);
}

// Eight fake GPUs on two sockets, as the fake sysfs below lays them out: cuda:0-3 on NUMA
// node 0, cuda:4-7 on node 1.
class TwoSocketGpus final : public GpuProvider {
 public:
  absl::StatusOr<int> Resolve(const std::string& device) const override {
    for (int i = 0; i < 8; ++i) {
      if (device == absl::StrCat("cuda:", i)) return i;
    }
    return absl::FailedPreconditionError(absl::StrCat("no GPU '", device, "'"));
  }
  absl::Status CheckJob(const Job&) const override { return absl::OkStatus(); }
  int NumaNode(int ordinal) const override { return ordinal < 4 ? 0 : 1; }
  absl::StatusOr<std::unique_ptr<DeviceStage>> MakeStage(const Job&, int, const SharedSlab&,
                                                         int slots) override {
    return std::make_unique<IdleStage>(slots);
  }
  void FillStatus(ferry::v1::DaemonStatus*) const override {}
};

// A job shared by ranks on GPUs of both sockets of a 2-socket x 4-GPU host (a fake sysfs):
// the pool has a group of workers per node on that node's CPUs, each rank's batches are
// filled by the group of its GPU's node, and its slab is placed there (not bound here: the
// fake topology's nodes are not this machine's).
TEST_F(JobManagerTest, ASharedJobsRanksAreFilledOnTheirGpusNumaNode) {
  const std::filesystem::path sys = dir_ / "sys";
  auto write = [&](const std::string& rel, const std::string& text) {
    std::filesystem::create_directories((sys / rel).parent_path());
    std::ofstream(sys / rel) << text;
  };
  write("devices/system/node/node0/cpulist", "0-15,32-47\n");
  write("devices/system/node/node1/cpulist", "16-31,48-63\n");
  Topology topo = *Topology::Read(sys.string());
  EXPECT_FALSE(topo.describes_this_machine());
  pool_ = *WorkerPool::Create(topo, 2);
  ASSERT_EQ(pool_->groups().size(), 2u);
  EXPECT_EQ(pool_->groups()[0].numa_node, 0);
  EXPECT_EQ(pool_->groups()[1].numa_node, 1);
  EXPECT_EQ(pool_->groups()[1].cpus.front(), 16);
  EXPECT_EQ(pool_->groups()[1].threads, 2);
  EXPECT_EQ(pool_->MemoryNodeFor(1), -1);

  TwoSocketGpus gpus;
  std::unique_ptr<JobManager> manager = GpuManager(&gpus);
  JobManager& m = *manager;
  auto spec = TokensSpec(tokens_);
  spec.set_device("cuda");
  spec.set_world_size(4);
  auto created = m.CreateJob(kAlice, "train", spec);
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string id = created->job->identity().id;
  const std::map<int, std::string> devices = {
      {0, "cuda:1"}, {1, "cuda:3"}, {2, "cuda:4"}, {3, "cuda:7"}};
  std::vector<JobManager::Attachment> attached;
  for (const auto& [rank, device] : devices) {
    auto a = m.Attach(kAlice, id, static_cast<uint32_t>(rank), device);
    ASSERT_TRUE(a.ok()) << a.status();
    attached.push_back(*a);
  }
  ferry::v1::JobStatus status;
  m.FillJobStatus(*created->job, &status);
  ASSERT_EQ(status.ranks_size(), 4);
  std::map<int, std::pair<std::string, int>> placed;
  for (const auto& r : status.ranks()) {
    placed[static_cast<int>(r.rank())] = {r.device(), r.numa_node()};
  }
  EXPECT_EQ(placed,
            (std::map<int, std::pair<std::string, int>>{
                {0, {"cuda:1", 0}}, {1, {"cuda:3", 0}}, {2, {"cuda:4", 1}}, {3, {"cuda:7", 1}}}));
  // One job for the four ranks: its sampler, index and status.
  EXPECT_EQ(m.ListJobs(kAlice).size(), 1u);
  for (const JobManager::Attachment& a : attached) EXPECT_NE(a.pipeline, nullptr);
  // A rank's trainer that comes back on the other socket's GPU moves there.
  auto moved = m.Attach(kAlice, id, 0, "cuda:5");
  ASSERT_TRUE(moved.ok()) << moved.status();
  status.Clear();
  m.FillJobStatus(*created->job, &status);
  for (const auto& r : status.ranks()) {
    if (r.rank() == 0) {
      EXPECT_EQ(r.numa_node(), 1);
    }
  }
}

TEST_F(JobManagerTest, EachRankOfAGpuJobNamesItsGpu) {
  TwoGpus gpus;
  std::unique_ptr<JobManager> manager = GpuManager(&gpus);
  JobManager& m = *manager;
  auto spec = TokensSpec(tokens_);
  spec.set_device("cuda");
  auto job = m.CreateJob(kAlice, "", spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job->identity().id;
  // An older client names no GPU at attach.
  auto none = m.Attach(kAlice, id, 0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("AttachRequest.device"));
  EXPECT_THAT(none.status().message(), HasSubstr("upgrade it"));
  auto wrong = m.Attach(kAlice, id, 0, "cuda:7");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.status().message(), HasSubstr("no GPU 'cuda:7'"));
  EXPECT_EQ(m.Attach(kAlice, id, 0, "tpu:0").status().code(), absl::StatusCode::kInvalidArgument);

  // A job whose spec names its GPU (what older clients send) keeps working unchanged.
  auto old_style = TokensSpec(tokens_);
  old_style.set_device("cuda:1");
  auto old_job = m.CreateJob(kAlice, "", old_style);
  ASSERT_TRUE(old_job.ok()) << old_job.status();
  ASSERT_TRUE(m.Attach(kAlice, old_job->job->identity().id, 0).ok());
  EXPECT_EQ(RankDevices(m, *old_job->job)[0], "cuda:1");

  // A host job has no GPU ranks.
  auto host = m.CreateJob(kAlice, "", TokensSpec(tokens_));
  ASSERT_TRUE(host.ok()) << host.status();
  auto gpu_rank = m.Attach(kAlice, host->job->identity().id, 0, "cuda:0");
  EXPECT_EQ(gpu_rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gpu_rank.status().message(), HasSubstr("GPU ranks need a job made with device"));
  ASSERT_TRUE(m.Attach(kAlice, host->job->identity().id, 0, "cpu").ok());
  EXPECT_EQ(RankDevices(m, *host->job)[0], "cpu");
}

// A consumer that takes nothing: binding it is what makes a job "in use".
class IdleConsumer final : public BatchConsumer {
 public:
  void OnBatchReady(const ferry::v1::BatchReady&) override {}
  void OnEpochEnd(int64_t) override {}
  void OnShutdown(const absl::Status&) override {}
};

TEST_F(JobManagerTest, IdleJobsAreDeletedAndTheirMemoryReturned) {
  const absl::Duration timeout = absl::Seconds(60);
  auto m = Manager({}, true, 1 << 30, timeout);
  auto job = m->CreateJob(kAlice, "run1", TokensSpec(tokens_));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job->identity().id;
  auto a0 = m->Attach(kAlice, id, 0);
  auto a1 = m->Attach(kAlice, id, 1);
  ASSERT_TRUE(a0.ok() && a1.ok());
  EXPECT_GT(budget_->in_use(), 0u);
  ferry::v1::JobStatus status;
  m->FillJobStatus(*job->job, &status);  // attached, but no consumer yet: idle
  EXPECT_GT(status.deleted_in_seconds(), 0);
  EXPECT_LE(status.deleted_in_seconds(), absl::ToDoubleSeconds(timeout));
  IdleConsumer consumer;
  ASSERT_TRUE(a0->pipeline->Bind(&consumer, 1).ok());

  // In use: never deleted, however long.
  const absl::Time start = absl::Now();
  EXPECT_TRUE(m->DeleteIdleJobs(start + 10 * timeout).empty());
  status.Clear();
  m->FillJobStatus(*job->job, &status);
  EXPECT_EQ(status.idle_seconds(), 0);
  EXPECT_EQ(status.deleted_in_seconds(), 0);

  // Its consumer goes: idle from the last time one was seen, deleted after the timeout.
  a0->pipeline->Unbind(&consumer);
  const absl::Time last_seen = start + 10 * timeout;
  EXPECT_TRUE(m->DeleteIdleJobs(last_seen + timeout / 2).empty());
  EXPECT_EQ(m->DeleteIdleJobs(last_seen + timeout), std::vector<std::string>{id});
  EXPECT_EQ(m->GetJob(kAlice, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(m->ListJobs(kRoot).empty());
  // The slabs go with the last reference (the test's attachments here, a stream's in ferryd).
  a0 = absl::InternalError("dropped");
  a1 = absl::InternalError("dropped");
  EXPECT_EQ(budget_->in_use(), 0u);

  // A timeout of zero keeps idle jobs.
  auto keep = Manager({}, true, 1 << 30, absl::ZeroDuration());
  auto kept = keep->CreateJob(kAlice, "kept", TokensSpec(tokens_));
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(keep->DeleteIdleJobs(absl::Now() + absl::Hours(24 * 365)).empty());
}

TEST_F(JobManagerTest, ResumeEpochDealsTheRestAndRefusesRanksOfAnotherState) {
  auto m = Manager({}, true);
  auto job = m->CreateJob(kAlice, "", TokensSpec(tokens_));  // 255 windows, 2 ranks of 8
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job->identity().id;
  auto a0 = m->Attach(kAlice, id, 0);
  auto a1 = m->Attach(kAlice, id, 1);
  ASSERT_TRUE(a0.ok() && a1.ok());
  IdleConsumer c0, c1;
  ASSERT_TRUE(a0->pipeline->Bind(&c0, 1).ok());
  ASSERT_TRUE(a1->pipeline->Bind(&c1, 2).ok());

  // 4 ranks of batch 8 took 3 batches of epoch 2 (96 windows): 159 left, 80 per rank.
  auto batches = m->ResumeEpoch(kAlice, a0->attach_id, 2, {{0, 96}});
  ASSERT_TRUE(batches.ok()) << batches.status();
  EXPECT_EQ(*batches, 10);
  EXPECT_EQ(a0->pipeline->ResumeLayout(2)->remaining(), 159);
  EXPECT_EQ(a0->pipeline->ResumeLayout(3), nullptr);  // the epochs after are whole

  auto other = m->ResumeEpoch(kAlice, a1->attach_id, 2, {{0, 64}});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("must load the same state_dict"));
  EXPECT_THAT(other.status().message(), HasSubstr("[0, 96)"));
  EXPECT_TRUE(m->ResumeEpoch(kAlice, a1->attach_id, 2, {{0, 96}}).ok());

  auto outside = m->ResumeEpoch(kAlice, a1->attach_id, 2, {{0, 300}});
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.status().message(), HasSubstr("another dataset or spec"));
  EXPECT_EQ(m->ResumeEpoch(kBob, a1->attach_id, 2, {}).status().code(),
            absl::StatusCode::kPermissionDenied);

  // The epoch dealt whole again (a loop that iterates it once more), and a new attach of a
  // rank forgets its resume.
  EXPECT_EQ(*m->ResumeEpoch(kAlice, a1->attach_id, 2, {}), 16);
  EXPECT_EQ(a1->pipeline->ResumeLayout(2), nullptr);
  // Dealing the next epoch whole undoes the resume of this one too (a loop that comes back
  // to epoch 2 later gets it whole).
  EXPECT_EQ(*m->ResumeEpoch(kAlice, a0->attach_id, 3, {}), 16);
  EXPECT_EQ(a0->pipeline->ResumeLayout(2), nullptr);
  a0->pipeline->Unbind(&c0);
  auto again = m->Attach(kAlice, id, 0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->pipeline->ResumeLayout(2), nullptr);
  a1->pipeline->Unbind(&c1);
}

TEST_F(JobManagerTest, DeleteFreesTheBudget) {
  auto m = Manager({}, true);
  auto job = m->CreateJob(kAlice, "done", TokensSpec(tokens_));
  ASSERT_TRUE(job.ok());
  const std::string id = job->job->identity().id;
  {
    auto a = m->Attach(kAlice, id, 0);
    ASSERT_TRUE(a.ok());
    EXPECT_GT(budget_->in_use(), 0u);
  }
  ASSERT_TRUE(m->DeleteJob(kAlice, id).ok());
  EXPECT_EQ(budget_->in_use(), 0u);
  EXPECT_EQ(m->DeleteJob(kAlice, id).code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, JobsAreBoundedPerUidAndTheRefusalSaysWhatToDo) {
  auto m = Manager({}, true, 1 << 30, absl::Minutes(10), /*max_jobs_per_uid=*/2);
  auto first = m->CreateJob(kAlice, "a", TokensSpec(tokens_));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(m->CreateJob(kAlice, "b", TokensSpec(tokens_)).ok());
  // The same job again is no new job.
  ASSERT_TRUE(m->CreateJob(kAlice, "a", TokensSpec(tokens_)).ok());
  auto third = m->CreateJob(kAlice, "c", TokensSpec(tokens_));
  ASSERT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  EXPECT_EQ(third.status().message(),
            "uid 1000 has 2 jobs, the most ferryd allows one user (max_jobs_per_uid, 2 in "
            "/etc/ferry/ferryd.conf); delete jobs that are done (ferryctl delete JOB)");
  // Other users, and root, are not held back by alice's jobs.
  EXPECT_TRUE(m->CreateJob(kBob, "c", TokensSpec(tokens_)).ok());
  for (const char* name : {"r1", "r2", "r3"}) {
    EXPECT_TRUE(m->CreateJob(kRoot, name, TokensSpec(tokens_)).ok()) << name;
  }
  // A deleted job gives its place back.
  ASSERT_TRUE(m->DeleteJob(kAlice, first->job->identity().id).ok());
  EXPECT_TRUE(m->CreateJob(kAlice, "c", TokensSpec(tokens_)).ok());
}

// An image folder's index (a name per file) is host memory the job keeps: counted in the
// budget while the job lives, and refused when it does not fit.
TEST_F(JobManagerTest, ADatasetsIndexCountsAgainstTheHostBudget) {
  const std::filesystem::path root = dir_ / "data" / "folder";
  std::filesystem::create_directories(root / "cls");
  const std::string long_name(200, 'n');
  for (int i = 0; i < 1000; ++i) {
    std::ofstream(root / "cls" / (long_name + std::to_string(i) + ".jpg")) << "x";
  }
  ferry::v1::JobSpec spec;
  spec.mutable_dataset()->mutable_image_folder()->set_root(root.string());
  spec.mutable_transform()->mutable_center_crop()->set_size(8);
  spec.set_batch_size(2);
  auto m = Manager({}, true);
  auto job = m->CreateJob(kAlice, "folder", spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_GE(budget_->in_use(), 200u * 1000) << "the names are counted before any attach";
  ASSERT_TRUE(m->DeleteJob(kAlice, job->job->identity().id).ok());
  EXPECT_EQ(budget_->in_use(), 0u);

  auto small = Manager({}, true, /*budget=*/64 * 1024);
  auto refused = small->CreateJob(kAlice, "folder", spec);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("the index of job 'folder''s 1000 samples"));
  EXPECT_THAT(refused.status().message(), HasSubstr("host_memory_budget_bytes"));
}

// A refusal for memory says who holds it: the caller's own jobs by id and name, other
// users' by uid only.
TEST_F(JobManagerTest, ABudgetRefusalNamesTheJobsHoldingMemory) {
  auto spec = TokensSpec(tokens_, 100);
  spec.set_batch_size(32);  // 28672 bytes per slot
  spec.set_prefetch_depth(4);
  auto m = Manager({}, true, /*budget=*/200 * 1024);
  auto mine = m->CreateJob(kAlice, "alices-run", spec);
  ASSERT_TRUE(mine.ok()) << mine.status();
  auto bobs = m->CreateJob(kBob, "bobs-run", spec);
  ASSERT_TRUE(bobs.ok());
  auto held = m->Attach(kAlice, mine->job->identity().id, 0);  // 112 KiB of 200
  ASSERT_TRUE(held.ok()) << held.status();
  auto refused = m->Attach(kBob, bobs->job->identity().id, 0);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("a job of uid 1000 (1 rank"));
  EXPECT_THAT(refused.status().message(), Not(HasSubstr("alices-run")));
  auto again = m->CreateJob(kAlice, "alices-second", spec);
  ASSERT_EQ(again.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(again.status().message(),
              HasSubstr(absl::StrCat("job ", mine->job->identity().id, " 'alices-run' (1 rank")));
  EXPECT_THAT(again.status().message(), HasSubstr("ferryctl delete"));
}

// A job on the default prefetch takes the slots that fit instead of being refused, down to
// kMinSlots.
TEST_F(JobManagerTest, ASmallBudgetGivesDefaultJobsFewerSlots) {
  auto spec = TokensSpec(tokens_, 100);
  spec.set_batch_size(32);  // 28672 bytes per slot; the default would be 4 or more
  auto m = Manager({}, true, /*budget=*/3 * 28672 + 100);
  auto job = m->CreateJob(kAlice, "small-budget", spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_GT(m->SlotsPerRank(*job->job), 3u);
  auto r0 = m->Attach(kAlice, job->job->identity().id, 0);
  ASSERT_TRUE(r0.ok()) << r0.status();
  EXPECT_EQ(r0->pipeline->num_slots(), 3);
  // One slot left: below the minimum, refused with the reason.
  auto r1 = m->Attach(kAlice, job->job->identity().id, 1);
  EXPECT_EQ(r1.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r1.status().message(), HasSubstr("'small-budget'"));
}

TEST_F(JobManagerTest, StopTakingWorkRefusesNewJobsAndAttachesButKeepsConsumers) {
  auto m = Manager({}, true);
  auto job = m->CreateJob(kAlice, "draining", TokensSpec(tokens_));
  ASSERT_TRUE(job.ok());
  auto a = m->Attach(kAlice, job->job->identity().id, 0);
  ASSERT_TRUE(a.ok());
  IdleConsumer consumer;
  ASSERT_TRUE(a->pipeline->Bind(&consumer, 1).ok());
  EXPECT_EQ(m->Consumers(), 1);
  m->StopTakingWork("ferryd is draining (test)");
  EXPECT_FALSE(m->taking_work());
  auto refused = m->CreateJob(kAlice, "new", TokensSpec(tokens_));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("draining"));
  EXPECT_EQ(m->Attach(kAlice, job->job->identity().id, 1).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(a->pipeline->bound());  // the attached consumer goes on
  EXPECT_TRUE(a->pipeline->StartEpoch(&consumer, 0, 0).ok());
  a->pipeline->Unbind(&consumer);
  EXPECT_EQ(m->Consumers(), 0);
}

// A consumer that keeps every batch it is sent (a raw stream whose trainer holds them).
class HoldingConsumer final : public BatchConsumer {
 public:
  void OnBatchReady(const ferry::v1::BatchReady&) override { held_.fetch_add(1); }
  void OnEpochEnd(int64_t) override {}
  void OnShutdown(const absl::Status& reason) override {
    reason_ = reason;
    told_.Notify();
  }
  int held() const { return held_.load(); }
  absl::Notification& told() { return told_; }
  const absl::Status& reason() const { return reason_; }

 private:
  std::atomic<int> held_{0};
  absl::Status reason_;
  absl::Notification told_;
};

TEST_F(JobManagerTest, ARankHeldByALiveConsumerIsRefusedInOneWordingNamingItsPid) {
  auto m = Manager({}, true);
  auto job = m->CreateJob(kAlice, "held-rank", TokensSpec(tokens_));
  ASSERT_TRUE(job.ok());
  const std::string id = job->job->identity().id;
  auto a = m->Attach(kAlice, id, 0);
  ASSERT_TRUE(a.ok());
  HoldingConsumer first, second;
  ASSERT_TRUE(a->pipeline->Bind(&first, 4242).ok());
  // Refused by the manager (a new attach) and by the pipeline (a second bind) alike.
  const absl::Status attach = m->Attach(kAlice, id, 0).status();
  const absl::Status bind = a->pipeline->Bind(&second, 4243);
  for (const absl::Status& refused : {attach, bind}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_THAT(refused.message(),
                HasSubstr("rank 0 of job " + id + " already has a live consumer (pid 4242)"));
  }
  a->pipeline->Unbind(&first);
}

TEST_F(JobManagerTest, ADeletedJobsConsumerThatKeepsItsBatchesIsToldAfterTheGrace) {
  manager_clock_ = &clock_;  // the manager's and its pipelines' time: the grace is exact
  auto m = Manager({}, true);
  auto job = m->CreateJob(kAlice, "held", TokensSpec(tokens_));
  ASSERT_TRUE(job.ok());
  const std::string id = job->job->identity().id;
  auto a = m->Attach(kAlice, id, 0);
  ASSERT_TRUE(a.ok());
  HoldingConsumer consumer;
  ASSERT_TRUE(a->pipeline->Bind(&consumer, 1).ok());
  ASSERT_TRUE(a->pipeline->StartEpoch(&consumer, 0, 0).ok());
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (consumer.held() == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_GT(consumer.held(), 0);
  ASSERT_TRUE(m->DeleteJob(kAlice, id).ok());
  // Within the grace (5 s by default) the consumer may still give its batches back.
  clock_.Advance(absl::Seconds(5) - absl::Milliseconds(1));
  m->EndOverdueStreams();
  EXPECT_FALSE(consumer.told().WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  // After it, the stream ends though the batches are still held.
  clock_.Advance(absl::Milliseconds(2));
  m->EndOverdueStreams();
  ASSERT_TRUE(consumer.told().WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(consumer.reason().code(), absl::StatusCode::kAborted) << consumer.reason();
  EXPECT_THAT(consumer.reason().message(), HasSubstr("was deleted"));
  a->pipeline->Unbind(&consumer);
}

// A GPU transport whose device ring takes as long as the test wants to make (registering a
// large slab with the driver does take long), then fails.
class SlowGpus final : public GpuProvider {
 public:
  absl::StatusOr<int> Resolve(const std::string& device) const override { return 0; }
  absl::Status CheckJob(const Job&) const override { return absl::OkStatus(); }
  int NumaNode(int) const override { return -1; }
  absl::StatusOr<std::unique_ptr<DeviceStage>> MakeStage(const Job&, int, const SharedSlab&,
                                                         int) override {
    if (calls.fetch_add(1) == 0) entered.Notify();  // one MakeStage at a time per rank
    release.WaitForNotification();
    return absl::UnavailableError("slow fake GPU");
  }
  void FillStatus(ferry::v1::DaemonStatus*) const override {}
  std::atomic<int> calls{0};
  absl::Notification entered, release;
};

TEST_F(JobManagerTest, NoDaemonWideLockIsHeldWhileARankIsCreated) {
  SlowGpus gpus;
  std::unique_ptr<JobManager> manager = GpuManager(&gpus);
  JobManager& m = *manager;
  auto spec = TokensSpec(tokens_);
  spec.set_device("cuda:0");
  auto job = m.CreateJob(kAlice, "gpu-job", spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job->identity().id;
  absl::StatusOr<JobManager::Attachment> first, second;
  std::thread attaching([&] { first = m.Attach(kAlice, id, 0); });
  gpus.entered.WaitForNotification();
  // The slab is being registered: everything else is answered meanwhile (with the lock held
  // across it, these calls would wait for the release below, which comes after 5 s).
  absl::Notification answered;
  std::thread others([&] {
    EXPECT_EQ(m.ListJobs(kAlice).size(), 1u);
    EXPECT_TRUE(m.GetJob(kAlice, id).ok());
    EXPECT_TRUE(m.CreateJob(kAlice, "other", TokensSpec(tokens_)).ok());
    EXPECT_EQ(m.Consumers(), 0);
    EXPECT_TRUE(m.DeleteIdleJobs().empty());
    answered.Notify();
  });
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(5)))
      << "calls waited for a rank's slab registration";
  // A second attach of the same rank waits for the first instead of making a second ring.
  std::thread waiting([&] { second = m.Attach(kAlice, id, 0); });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(gpus.calls.load(), 1);
  gpus.release.Notify();
  attaching.join();
  others.join();
  waiting.join();
  EXPECT_EQ(first.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(first.status().message(), HasSubstr("slow fake GPU"));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(gpus.calls.load(), 2);   // the second tried after the first failed
  EXPECT_EQ(budget_->in_use(), 0u);  // the failed slabs went back
}

TEST_F(JobManagerTest, DefaultPrefetchGrowsForSmallBatchesOnly) {
  auto m = Manager({}, true);
  JobManager::Options defaults;
  // Tiny slots (8 x 17 tokens): the default depth grows to the cap.
  auto small = m->CreateJob(kAlice, "small", TokensSpec(tokens_));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(m->SlotsPerRank(*small->job), JobManager::kMaxDefaultPrefetch);
  auto attached = m->Attach(kAlice, small->job->identity().id, 0);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ(attached->pipeline->num_slots(), static_cast<int>(JobManager::kMaxDefaultPrefetch));
  // A job's own prefetch_depth wins.
  auto spec = TokensSpec(tokens_);
  spec.set_prefetch_depth(3);
  auto own = m->CreateJob(kAlice, "own", spec);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(m->SlotsPerRank(*own->job), 3u);
  // Slots of an eighth of default_prefetch_bytes (and an index field): 8 of them; of four
  // times that: the default depth.
  spec = TokensSpec(tokens_, 2047);
  spec.set_batch_size(static_cast<uint32_t>(defaults.default_prefetch_bytes / 8 / (2048 * 8)));
  auto eighth = m->CreateJob(kAlice, "eighth", spec);
  ASSERT_TRUE(eighth.ok()) << eighth.status();
  EXPECT_EQ(m->SlotsPerRank(*eighth->job), 8u);
  spec.set_batch_size(spec.batch_size() * 4);
  auto big = m->CreateJob(kAlice, "big", spec);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(m->SlotsPerRank(*big->job), defaults.default_prefetch_depth);
}

// A sweep's trainers attach the same rank thousands of times: each attach supersedes the last
// (ferryd kept every attach_id until the job was deleted: +0.2 KiB per trainer in the soak).
TEST_F(JobManagerTest, ANewAttachOfARankSupersedesTheLast) {
  auto m = Manager({}, true);
  auto job = m->CreateJob(kAlice, "sweep", TokensSpec(tokens_));
  ASSERT_TRUE(job.ok());
  const std::string id = job->job->identity().id;
  auto other_rank = m->Attach(kAlice, id, 1);
  ASSERT_TRUE(other_rank.ok());
  std::vector<std::string> ids;
  for (int i = 0; i < 1000; ++i) {
    auto a = m->Attach(kAlice, id, 0);
    ASSERT_TRUE(a.ok()) << a.status();
    ids.push_back(a->attach_id);
  }
  for (size_t i = 0; i + 1 < ids.size(); ++i) {
    ASSERT_EQ(m->FindAttachment(kAlice, ids[i]).status().code(), absl::StatusCode::kNotFound)
        << "attach " << i << " of 1000 is still held";
  }
  EXPECT_TRUE(m->FindAttachment(kAlice, ids.back()).ok());
  EXPECT_TRUE(m->FindAttachment(kAlice, other_rank->attach_id).ok()) << "another rank's attach";
}

TEST_F(JobManagerTest, OnlyTheOwnerOrRootSeesAndAttaches) {
  auto m = Manager({}, true);
  auto job = m->CreateJob(kAlice, "mine", TokensSpec(tokens_));
  ASSERT_TRUE(job.ok());
  const std::string id = job->job->identity().id;
  auto bob = m->Attach(kBob, id, 0);
  EXPECT_EQ(bob.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(bob.status().message(), HasSubstr("uid 1000"));
  EXPECT_EQ(m->GetJob(kBob, id).status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(m->DeleteJob(kBob, id).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(m->ListJobs(kBob).empty());
  EXPECT_EQ(m->ListJobs(kRoot).size(), 1u);

  auto alice = m->Attach(kAlice, id, 1);
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(m->FindAttachment(kBob, alice->attach_id).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(m->FindAttachment(kAlice, alice->attach_id).ok());
  EXPECT_EQ(m->Attach(kAlice, id, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->Attach(kAlice, "jnope", 0).status().code(), absl::StatusCode::kNotFound);

  EXPECT_TRUE(m->DeleteJob(kRoot, id).ok());
  EXPECT_EQ(m->FindAttachment(kAlice, alice->attach_id).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ferry
