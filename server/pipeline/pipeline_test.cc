// RankPipeline against a fake SampleSource: ordering, bounded prefetch, epoch changes,
// reclaiming a vanished consumer's slots and substituting unreadable samples.
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/decode/gpu_decode_split.h"
#include "server/pipeline/job.h"
#include "server/pipeline/rank_pipeline.h"
#include "server/pipeline/worker_pool.h"
#include "server/stats/limiting_stage.h"
#include "server/transport/device_ring.h"
#include "server/transport/device_stage.h"
#include "server/transport/host_ring.h"
#include "testing/jpeg_writer.h"
#include "testing/recording_fs.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

// Sample i has fields value = i * 10 and index = i. Samples in `corrupt` fail to read.
class FakeSource : public SampleSource {
 public:
  FakeSource(int64_t n, absl::flat_hash_set<int64_t> corrupt)
      : n_(n), corrupt_(std::move(corrupt)) {
    fields_.push_back(FieldLayout{"value", ferry::v1::INT64, {}, 8});
    fields_.push_back(FieldLayout{"index", ferry::v1::INT64, {}, 8});
  }
  int64_t size() const override { return n_; }
  const std::vector<FieldLayout>& fields() const override { return fields_; }
  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Scratch>(); }
  absl::Status Fill(int64_t index, uint64_t, absl::Span<uint8_t* const> rows,
                    Scratch*) const override {
    if (corrupt_.contains(index)) {
      bad_reads_.fetch_add(1);
      return absl::DataLossError("corrupt on purpose");
    }
    int64_t value = index * 10;
    if (rows[0] != nullptr) {
      memcpy(rows[0], &value, 8);
    } else {
      null_rows_.fetch_add(1);  // a stage reads "value" itself (DeviceStage::gathered_field)
    }
    memcpy(rows[1], &index, 8);
    return absl::OkStatus();
  }
  std::string Describe(int64_t index) const override { return "fake/" + std::to_string(index); }
  int64_t bad_reads() const { return bad_reads_.load(); }
  int64_t null_rows() const { return null_rows_.load(); }

 private:
  mutable std::atomic<int64_t> bad_reads_{0};
  mutable std::atomic<int64_t> null_rows_{0};
  int64_t n_;
  absl::flat_hash_set<int64_t> corrupt_;
  std::vector<FieldLayout> fields_;
};

// FakeSource whose sample i lives in file "file-<i / per_file>".
class FileBackedSource final : public FakeSource {
 public:
  FileBackedSource(int64_t n, int64_t per_file) : FakeSource(n, {}), per_file_(per_file) {}
  std::string FileOf(int64_t index) const override {
    return absl::StrCat("file-", index / per_file_);
  }

 private:
  const int64_t per_file_;
};

struct EpochEndMsg {
  int64_t epoch;
};
using Message = std::variant<ferry::v1::BatchReady, EpochEndMsg, absl::Status>;

class RecordingConsumer final : public BatchConsumer {
 public:
  void OnBatchReady(const ferry::v1::BatchReady& b) override {
    absl::MutexLock lock(&mutex_);
    messages_.push_back(b);
  }
  void OnEpochEnd(int64_t epoch) override {
    absl::MutexLock lock(&mutex_);
    messages_.push_back(EpochEndMsg{epoch});
  }
  void OnShutdown(const absl::Status& reason) override {
    absl::MutexLock lock(&mutex_);
    messages_.push_back(reason);
  }
  // Waits up to 10 s for the next message.
  std::optional<Message> Next() {
    absl::MutexLock lock(&mutex_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return !messages_.empty(); };
    if (!mutex_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(10))) return std::nullopt;
    Message m = messages_.front();
    messages_.pop_front();
    return m;
  }
  size_t pending() {
    absl::MutexLock lock(&mutex_);
    return messages_.size();
  }

 private:
  absl::Mutex mutex_;
  std::deque<Message> messages_ ABSL_GUARDED_BY(mutex_);
};

class FakeDeviceStage;

// The ring of a rank read on the host (its `slots` host slots are delivered as they are).
RankPipeline::RingFactory HostRingOf(const Job& job, int slots) {
  return [&job, slots](const SharedSlab& slab) -> absl::StatusOr<std::unique_ptr<DeliveryRing>> {
    return std::make_unique<HostRing>(slots, slab.size(), job.clock());
  };
}

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Topology topo = *Topology::Read("/sys");
    pool_ = *WorkerPool::Create(topo, 2);
  }

  std::shared_ptr<RankPipeline> Make(int64_t n, int batch, int world, int rank, int slots,
                                     bool drop_last, absl::flat_hash_set<int64_t> corrupt = {}) {
    ferry::v1::JobSpec spec;
    spec.set_batch_size(batch);
    spec.set_world_size(world);
    spec.set_shuffle(true);
    spec.set_seed(7);
    spec.set_drop_last(drop_last);
    job_ = *Job::Create(JobIdentity{"jtest", "test", 1000, next_serial_++}, spec,
                        std::make_unique<FakeSource>(n, std::move(corrupt)));
    auto p = RankPipeline::Create(job_, rank, slots, -1, pool_.get(), &budget_,
                                  HostRingOf(*job_, slots));
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  }

  // Reads the index field of a delivered batch.
  std::vector<int64_t> Indices(RankPipeline& p, const ferry::v1::BatchReady& b) {
    const SlotLayout& layout = job_->layout();
    const uint8_t* base = p.slab().data() + b.slot() * layout.slot_bytes + layout.offsets[1];
    std::vector<int64_t> out(b.num_samples());
    memcpy(out.data(), base, out.size() * 8);
    return out;
  }

  void ExpectBatchesMadeWhileTheConsumerHoldsMostSlotsAreCopied(int slots, bool gpu_lags);
  // For the gather tests: a shuffled job of 16 batches of 4 FakeSource samples.
  std::shared_ptr<Job> GatherJob(const std::string& id, uint64_t seed, uint64_t serial,
                                 std::unique_ptr<SampleSource> source = nullptr) {
    ferry::v1::JobSpec spec;
    spec.set_batch_size(4);
    spec.set_shuffle(true);
    spec.set_seed(seed);
    spec.set_drop_last(true);
    if (source == nullptr) {
      source = std::make_unique<FakeSource>(64, absl::flat_hash_set<int64_t>{});
    }
    return *Job::Create(JobIdentity{id, id, 1000, serial}, spec, std::move(source));
  }
  // Batch `i` of epoch 0 in its device slot: the right indices, and value = 10 * index
  // (gathered by the stage or written by the workers).
  void ExpectDeviceBatch(const FakeDeviceStage& stage, const ferry::v1::BatchReady& b, int64_t i);

  std::vector<int64_t> Expected(int64_t epoch, int rank, int64_t batch) {
    std::vector<int64_t> ids;
    job_->sampler().BatchIndices(epoch, rank, batch, &ids);
    return ids;
  }

  MemoryBudget budget_{"host memory budget", "host_memory_budget_bytes", 1 << 30, "test.conf"};
  FakeClock clock_;  // for jobs given it: outlives the workers, which may still read it
  std::unique_ptr<WorkerPool> pool_;
  std::shared_ptr<Job> job_;
  uint64_t next_serial_ = 1;
};

TEST_F(PipelineTest, DeliversEveryBatchInOrderThenEpochEnd) {
  auto p = Make(/*n=*/103, /*batch=*/8, /*world=*/2, /*rank=*/1, /*slots=*/3, false);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  const int64_t batches = job_->sampler().batches_per_epoch();
  ASSERT_EQ(batches, 7);  // ceil(ceil(103 / 2) / 8)
  for (int64_t b = 0; b < batches; ++b) {
    auto m = c.Next();
    ASSERT_TRUE(m.has_value());
    auto& batch = std::get<ferry::v1::BatchReady>(*m);
    EXPECT_EQ(batch.seq(), b);
    EXPECT_EQ(batch.epoch(), 0);
    EXPECT_EQ(batch.batch(), b);
    EXPECT_EQ(Indices(*p, batch), Expected(0, 1, b));
    ASSERT_TRUE(p->Release(&c, batch.slot(), batch.seq()).ok());
  }
  auto end = c.Next();
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(std::get<EpochEndMsg>(*end).epoch, 0);
  p->Unbind(&c);
}

TEST_F(PipelineTest, FilesOfTheBatchesAfterTheSlotsAreReadAheadInTheSamplersOrder) {
  ferry::v1::JobSpec spec;
  spec.set_batch_size(4);
  spec.set_world_size(2);
  spec.set_shuffle(true);
  spec.set_seed(11);
  spec.set_drop_last(true);
  // 80 samples, 2 a file: 10 batches a rank and epoch.
  job_ = *Job::Create(JobIdentity{"jahead", "ahead", 1000, next_serial_++}, spec,
                      std::make_unique<FileBackedSource>(80, 2));
  auto fs = std::make_shared<RecordingFs>(RecordingFs::Options{});
  job_->StartReadAhead(fs, {.connections = 1, .max_files = 1000, .max_bytes = 1 << 20, .ranks = 2});
  ASSERT_NE(job_->read_ahead(), nullptr);
  auto p = RankPipeline::Create(job_, /*rank=*/1, /*slots=*/2, -1, pool_.get(), &budget_,
                                HostRingOf(*job_, /*slots=*/2));
  ASSERT_TRUE(p.ok()) << p.status();
  RecordingConsumer c;
  ASSERT_TRUE((*p)->Bind(&c, 1).ok());
  ASSERT_TRUE((*p)->StartEpoch(&c, 3, 0).ok());
  // The two slots take batches 0 and 1 of epoch 3; the read-ahead goes on from batch 2 to
  // the end of epoch 4, and no further, each file once while its first batch is ahead.
  std::vector<std::string> expected;
  std::set<std::string> ahead;
  for (int64_t epoch = 3; epoch <= 4; ++epoch) {
    for (int64_t batch = epoch == 3 ? 2 : 0; batch < 10; ++batch) {
      for (const int64_t index : Expected(epoch, 1, batch)) {
        const std::string file = absl::StrCat("file-", index / 2);
        if (ahead.insert(file).second) expected.push_back(file);
      }
    }
  }
  EXPECT_EQ(fs->Opened(expected.size()), expected);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(fs->Opened(0).size(), expected.size());
  (*p)->Unbind(&c);
}

TEST_F(PipelineTest, PrefetchIsBoundedBySlots) {
  auto p = Make(200, 4, 1, 0, 2, true);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  auto a = std::get<ferry::v1::BatchReady>(*c.Next());
  auto b = std::get<ferry::v1::BatchReady>(*c.Next());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(c.pending(), 0u) << "a third batch was delivered with both slots leased";
  ferry::v1::RankStatus status;
  p->FillStatus(&status);
  EXPECT_EQ(status.slots_leased(), 2u);
  EXPECT_EQ(status.slots(), 2u);
  ASSERT_TRUE(p->Release(&c, a.slot(), a.seq()).ok());
  auto next = std::get<ferry::v1::BatchReady>(*c.Next());
  EXPECT_EQ(next.batch(), 2);
  EXPECT_EQ(next.slot(), a.slot());
  // The time totals: `a` was held for the 100 ms above; three batches were filled.
  p->FillStatus(&status);
  EXPECT_GE(status.lease_seconds(), 0.1);
  EXPECT_GE(status.batches_filled(), 3u);
  EXPECT_GT(status.fill_seconds(), 0.0);
  EXPECT_EQ(status.copy_wait_seconds(), 0.0) << "no GPU stage";
  p->Unbind(&c);
  (void)b;
}

TEST_F(PipelineTest, NextEpochIsPrefetchedAndASeekDiscardsIt) {
  auto p = Make(64, 8, 1, 0, 4, true);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  for (int i = 0; i < 8; ++i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
  }
  EXPECT_EQ(std::get<EpochEndMsg>(*c.Next()).epoch, 0);
  // The next epoch continues the prefetched order...
  ASSERT_TRUE(p->StartEpoch(&c, 1, 0).ok());
  auto first = std::get<ferry::v1::BatchReady>(*c.Next());
  EXPECT_EQ(first.epoch(), 1);
  EXPECT_EQ(Indices(*p, first), Expected(1, 0, 0));
  ASSERT_TRUE(p->Release(&c, first.slot(), first.seq()).ok());
  // ...and a jump elsewhere (resume) yields exactly the batches asked for. Batches of epoch 1
  // sent before the jump stay leased to the consumer (it may still be reading them); it
  // recognises them by their (epoch, batch) and releases them.
  ASSERT_TRUE(p->StartEpoch(&c, 5, 6).ok());
  for (int64_t batch = 6; batch < 8; ++batch) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    while (b.epoch() == 1) {
      ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
      b = std::get<ferry::v1::BatchReady>(*c.Next());
    }
    EXPECT_EQ(b.epoch(), 5);
    EXPECT_EQ(b.batch(), batch);
    EXPECT_EQ(Indices(*p, b), Expected(5, 0, batch));
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
  }
  EXPECT_EQ(std::get<EpochEndMsg>(*c.Next()).epoch, 5);
  p->Unbind(&c);
}

TEST_F(PipelineTest, VanishedConsumersSlotsAreReclaimed) {
  auto p = Make(100, 5, 1, 0, 2, true);
  {
    RecordingConsumer dead;
    ASSERT_TRUE(p->Bind(&dead, 1).ok());
    ASSERT_TRUE(p->StartEpoch(&dead, 0, 0).ok());
    ASSERT_TRUE(dead.Next().has_value());
    ASSERT_TRUE(dead.Next().has_value());
    RecordingConsumer intruder;
    EXPECT_EQ(p->Bind(&intruder, 2).code(), absl::StatusCode::kFailedPrecondition);
    p->Unbind(&dead);  // never released its two slots
  }
  RecordingConsumer next;
  ASSERT_TRUE(p->Bind(&next, 3).ok());
  ASSERT_TRUE(p->StartEpoch(&next, 0, 2).ok());
  for (int64_t batch = 2; batch < 6; ++batch) {
    auto b = std::get<ferry::v1::BatchReady>(*next.Next());
    EXPECT_EQ(b.batch(), batch);
    EXPECT_EQ(Indices(*p, b), Expected(0, 0, batch));
    ASSERT_TRUE(p->Release(&next, b.slot(), b.seq()).ok());
  }
  p->Unbind(&next);
}

TEST_F(PipelineTest, UnreadableSamplesAreSubstitutedAndCounted) {
  absl::flat_hash_set<int64_t> corrupt = {3, 17, 42};
  auto p = Make(50, 10, 1, 0, 2, true, corrupt);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  int64_t rows = 0;
  for (int i = 0; i < 5; ++i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    EXPECT_EQ(b.num_samples(), 10u);
    for (int64_t idx : Indices(*p, b)) {
      EXPECT_FALSE(corrupt.contains(idx)) << "a corrupt sample was delivered";
      EXPECT_GE(idx, 0);
      ++rows;
    }
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
  }
  EXPECT_EQ(rows, 50);
  // Each bad sample is counted once, then quarantined. Substitutes count what the trainer
  // received: the next epoch's batches prefetched meanwhile (with their own substitutes)
  // count once delivered, not before.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(job_->error_count(), 3);
  EXPECT_EQ(job_->quarantined_count(), 3);
  EXPECT_EQ(job_->substituted_count(), 3);
  std::set<int64_t> reported;
  for (const auto& e : job_->recent_errors()) {
    reported.insert(e.index());
    EXPECT_EQ(e.path(), "fake/" + std::to_string(e.index()));
    EXPECT_THAT(e.message(), HasSubstr("corrupt on purpose"));
  }
  EXPECT_EQ(reported, (std::set<int64_t>{3, 17, 42}));
  const std::vector<ferry::v1::ReasonCount> reasons = job_->errors_by_reason();
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0].reason(), "corrupt");  // DATA_LOSS
  EXPECT_EQ(reasons[0].count(), 3);
  // Every row read counts, the substitutes' and the prefetched next epoch's too.
  EXPECT_GE(job_->samples_decoded(), 50);
  p->Unbind(&c);
}

// With no readable substitute left, a row is zeros with index -1 (no sample), whatever the
// slot held before; the batch keeps its size.
// A job whose every sample is bad would otherwise deliver batches of zeros with index -1
// forever, logging each row. Once more than half its samples are quarantined the job stops,
// with a message that names the bound and the last bad file; no batch of such samples
// arrives.
TEST_F(PipelineTest, AJobWithMoreBadSamplesThanGoodStopsNamingTheLastOne) {
  absl::flat_hash_set<int64_t> corrupt;
  for (int64_t i = 0; i < 8; ++i) corrupt.insert(i);
  auto p = Make(8, 4, 1, 0, 2, true, corrupt);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  auto m = *c.Next();
  ASSERT_TRUE(std::holds_alternative<absl::Status>(m)) << "a batch of bad samples came";
  const absl::Status end = std::get<absl::Status>(m);
  EXPECT_EQ(end.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(end.message(), HasSubstr("stopped: more than 4 of its 8 samples are bad"));
  EXPECT_THAT(end.message(), HasSubstr("'fake/"));
  EXPECT_TRUE(job_->failed());
  EXPECT_EQ(job_->quarantined_count(), 4);
  p->Unbind(&c);
}

TEST_F(PipelineTest, TheQuarantineFromAResumeStateIsBoundedByHalfTheSamples) {
  auto p = Make(10, 2, 1, 0, 2, true);
  auto added = job_->AddToQuarantine({1, 2, 3});
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 3);
  EXPECT_EQ(*job_->AddToQuarantine({1, 2, 3, 4}), 1);
  auto over = job_->AddToQuarantine({5, 6});
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(),
              HasSubstr("would leave job jtest with 6 bad samples of its 10, more than the 5"));
  EXPECT_EQ(job_->quarantined_count(), 4) << "a refused call adds nothing";
}

// A FakeSource whose reads fail as they do when ferryd runs out of file descriptors, while
// `broken` is set.
class OutOfDescriptorsSource final : public SampleSource {
 public:
  explicit OutOfDescriptorsSource(int64_t n) : inner_(n, {}) {}
  int64_t size() const override { return inner_.size(); }
  const std::vector<FieldLayout>& fields() const override { return inner_.fields(); }
  std::unique_ptr<Scratch> NewScratch() const override { return inner_.NewScratch(); }
  absl::Status Fill(int64_t index, uint64_t seed, absl::Span<uint8_t* const> rows,
                    Scratch* scratch) const override {
    if (broken.load()) {
      failed_reads.fetch_add(1);
      return FileErrnoStatus(EMFILE, "cannot open", Describe(index));
    }
    return inner_.Fill(index, seed, rows, scratch);
  }
  std::string Describe(int64_t index) const override { return inner_.Describe(index); }

  mutable std::atomic<bool> broken{true};
  mutable std::atomic<int64_t> failed_reads{0};

 private:
  FakeSource inner_;
};

// A bad day: out of descriptors, every sample was quarantined and the
// trainer got zeroed rows for good. Now the job pauses and resumes with the right samples.
TEST_F(PipelineTest, ReadsFailingForTheMachineAreRetriedNeverQuarantined) {
  ferry::v1::JobSpec spec;
  spec.set_batch_size(4);
  spec.set_shuffle(true);
  spec.set_seed(3);
  auto owned = std::make_unique<OutOfDescriptorsSource>(32);
  OutOfDescriptorsSource* source = owned.get();
  job_ = *Job::Create(JobIdentity{"jfd", "fd", 1000, next_serial_++}, spec, std::move(owned));
  auto p = *RankPipeline::Create(job_, 0, 3, -1, pool_.get(), &budget_, HostRingOf(*job_, 3));
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (source->failed_reads.load() < 8 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(source->failed_reads.load(), 8);
  EXPECT_EQ(c.pending(), 0u) << "a batch was delivered while no sample could be read";
  EXPECT_THAT(job_->paused_reason(), HasSubstr("Too many open files"));
  EXPECT_THAT(job_->paused_reason(), HasSubstr("fake/"));
  source->broken.store(false);
  for (int64_t i = 0; i < 8; ++i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    EXPECT_EQ(Indices(*p, b), Expected(0, 0, i)) << "batch " << i;
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
  }
  EXPECT_EQ(job_->error_count(), 0);
  EXPECT_EQ(job_->quarantined_count(), 0);
  EXPECT_EQ(job_->substituted_count(), 0);
  EXPECT_EQ(job_->paused_reason(), "");
  EXPECT_GE(job_->transient_error_count(), 8);
  p->Unbind(&c);
}

TEST_F(PipelineTest, ReadsThatKeepFailingForTheMachineFailTheJobWithTheReason) {
  ferry::v1::JobSpec spec;
  spec.set_batch_size(4);
  job_ = *Job::Create(JobIdentity{"jfd2", "fd2", 1000, next_serial_++}, spec,
                      std::make_unique<OutOfDescriptorsSource>(32));
  // The default limit (5 minutes), on a clock this test moves.
  FakeClock& clock = clock_;
  job_->set_clock(&clock);
  auto p = *RankPipeline::Create(job_, 0, 2, -1, pool_.get(), &budget_, HostRingOf(*job_, 2));
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  // A worker waits to read again; a second short of the limit, the job goes on.
  clock.AwaitSleepers(1);
  clock.Advance(Job::kDefaultTransientRetryLimit - absl::Seconds(1));
  clock.AwaitSleepers(1);
  EXPECT_EQ(c.pending(), 0u) << "the job ended before its retry limit";
  EXPECT_EQ(job_->paused_reason().empty(), false);
  // Past it, the job fails (a worker wakes at its next retry, at most a second on).
  for (int second = 0; second < 60 && c.pending() == 0; ++second) {
    clock.Advance(absl::Seconds(1));
    absl::SleepFor(absl::Milliseconds(5));  // real time for the woken worker
  }
  std::optional<Message> m = c.Next();
  ASSERT_TRUE(m.has_value());
  ASSERT_TRUE(std::holds_alternative<absl::Status>(*m)) << "a batch was delivered";
  const absl::Status& end = std::get<absl::Status>(*m);
  EXPECT_EQ(end.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(end.message(), HasSubstr("Too many open files"));
  EXPECT_THAT(end.message(), HasSubstr("failed for 5m"));
  EXPECT_THAT(end.message(), HasSubstr("not of the data"));
  EXPECT_THAT(end.message(), HasSubstr("LimitNOFILE"));
  EXPECT_EQ(job_->quarantined_count(), 0);
  p->Shutdown(absl::AbortedError("test over"));
  clock.Advance(absl::Hours(1));  // the workers still waiting to read again give up
  p->Unbind(&c);
}

// A source whose every allocation fails (std::bad_alloc out of Fill): the job stops naming
// the cause, the process goes on, nothing is quarantined.
class OutOfMemorySource final : public SampleSource {
 public:
  explicit OutOfMemorySource(int64_t n) : inner_(n, {}) {}
  int64_t size() const override { return inner_.size(); }
  const std::vector<FieldLayout>& fields() const override { return inner_.fields(); }
  std::unique_ptr<Scratch> NewScratch() const override { return inner_.NewScratch(); }
  absl::Status Fill(int64_t, uint64_t, absl::Span<uint8_t* const>, Scratch*) const override {
    throw std::bad_alloc();
  }
  std::string Describe(int64_t index) const override { return inner_.Describe(index); }

 private:
  FakeSource inner_;
};

TEST_F(PipelineTest, AFailedAllocationStopsTheJobNotTheProcess) {
  ferry::v1::JobSpec spec;
  spec.set_batch_size(4);
  job_ = *Job::Create(JobIdentity{"joom", "oom", 1000, next_serial_++}, spec,
                      std::make_unique<OutOfMemorySource>(32));
  job_->set_transient_retry_limit(absl::Milliseconds(100));
  auto p = *RankPipeline::Create(job_, 0, 2, -1, pool_.get(), &budget_, HostRingOf(*job_, 2));
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  std::optional<Message> m = c.Next();
  ASSERT_TRUE(m.has_value());
  ASSERT_TRUE(std::holds_alternative<absl::Status>(*m)) << "a batch was delivered";
  const absl::Status& end = std::get<absl::Status>(*m);
  EXPECT_EQ(end.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(end.message(), HasSubstr("out of memory while making sample"));
  EXPECT_EQ(job_->quarantined_count(), 0);
  p->Unbind(&c);
}

// The same through the real filesystem: JPEGs read while the process is out of descriptors.
TEST_F(PipelineTest, AnImageJobOutOfDescriptorsPausesAndRecovers) {
  char dir_template[] = "/tmp/ferry_pipeline_fds_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::filesystem::path dir = dir_template;
  std::filesystem::create_directories(dir / "a");
  for (int i = 0; i < 12; ++i) {
    const std::vector<uint8_t> rgb = testutil::MakeTestPattern(40, 30, i);
    ASSERT_TRUE(testutil::WriteFile((dir / "a" / (std::to_string(i) + ".jpg")).string(),
                                    testutil::EncodeJpeg(rgb.data(), 40, 30, 90))
                    .ok());
  }
  ferry::v1::JobSpec spec;
  spec.mutable_dataset()->mutable_image_folder()->set_root(dir.string());
  spec.mutable_transform()->mutable_center_crop()->set_size(16);
  spec.set_batch_size(4);
  job_ =
      *Job::Create(JobIdentity{"jimg", "img", 1000, next_serial_++}, spec, UnconfinedDatasetFs());
  auto p = *RankPipeline::Create(job_, 0, 3, -1, pool_.get(), &budget_, HostRingOf(*job_, 3));
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());

  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 256);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<UniqueFd> hog;
  for (UniqueFd fd(::dup(0)); fd.valid(); fd = UniqueFd(::dup(0))) hog.push_back(std::move(fd));
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (job_->paused_reason().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  absl::SleepFor(absl::Milliseconds(50));
  const size_t delivered_while_out = c.pending();
  const std::string reason = job_->paused_reason();
  hog.clear();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);

  EXPECT_EQ(delivered_while_out, 0u);
  EXPECT_THAT(reason, HasSubstr("Too many open files"));
  std::set<int64_t> seen;
  for (int i = 0; i < 3; ++i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    const uint8_t* base = p->slab().data() + b.slot() * job_->layout().slot_bytes;
    for (uint32_t r = 0; r < b.num_samples(); ++r) {
      int64_t index;
      memcpy(&index, base + job_->layout().offsets[2] + r * 8, 8);
      EXPECT_GE(index, 0) << "a zeroed row";
      seen.insert(index);
    }
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
  }
  EXPECT_EQ(seen.size(), 12u);
  EXPECT_EQ(job_->error_count(), 0);
  EXPECT_EQ(job_->quarantined_count(), 0);
  p->Unbind(&c);
  p->Shutdown(absl::CancelledError("test over"));
  absl::SleepFor(absl::Milliseconds(50));  // tasks of the next epoch in flight see it
  std::filesystem::remove_all(dir);
}

TEST_F(PipelineTest, QuarantinedSamplesAreNeverReadAgainAndKeepTheirSubstitute) {
  absl::flat_hash_set<int64_t> corrupt = {3, 17, 42};
  auto p = Make(50, 10, 1, 0, 2, true, corrupt);
  const auto& source = static_cast<const FakeSource&>(job_->source());
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  std::vector<std::vector<int64_t>> first;
  for (int pass = 0; pass < 3; ++pass) {
    ASSERT_TRUE(p->StartEpoch(&c, 4, 0).ok());  // the same epoch again: the same batches
    for (int i = 0; i < 5; ++i) {
      auto b = std::get<ferry::v1::BatchReady>(*c.Next());
      std::vector<int64_t> indices = Indices(*p, b);
      if (pass == 0) {
        first.push_back(indices);
      } else {
        EXPECT_EQ(indices, first[i]) << "pass " << pass << " batch " << i;
      }
      ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
    }
    ASSERT_TRUE(std::holds_alternative<EpochEndMsg>(*c.Next()));
  }
  EXPECT_EQ(source.bad_reads(), 3);  // one read per bad sample, ever
  EXPECT_EQ(job_->error_count(), 3);
  p->Unbind(&c);
}

TEST_F(PipelineTest, FailPolicyStopsEveryRankWithTheFileName) {
  ferry::v1::JobSpec spec;
  spec.set_batch_size(5);
  spec.set_world_size(2);
  spec.set_on_corrupt_sample(ferry::v1::FAIL);
  job_ = *Job::Create(JobIdentity{"jfail", "fail", 1000, next_serial_++}, spec,
                      std::make_unique<FakeSource>(40, absl::flat_hash_set<int64_t>{12}));
  auto r0 = *RankPipeline::Create(job_, 0, 2, -1, pool_.get(), &budget_, HostRingOf(*job_, 2));
  auto r1 = *RankPipeline::Create(job_, 1, 2, -1, pool_.get(), &budget_, HostRingOf(*job_, 2));
  RecordingConsumer c0, c1;
  ASSERT_TRUE(r0->Bind(&c0, 1).ok());
  ASSERT_TRUE(r1->Bind(&c1, 2).ok());
  ASSERT_TRUE(r0->StartEpoch(&c0, 0, 0).ok());
  // Sample 12 is position 12 of the unshuffled order: rank 0's batch 1. Batch 0 may or
  // may not arrive (both fill at once); then the stream ends with the failure, never with
  // the bad batch.
  absl::Status end;
  for (;;) {
    auto m = *c0.Next();
    if (auto* s = std::get_if<absl::Status>(&m)) {
      end = *s;
      break;
    }
    auto* batch = std::get_if<ferry::v1::BatchReady>(&m);
    ASSERT_NE(batch, nullptr);
    EXPECT_LT(batch->batch(), 1) << "the batch holding the bad sample was delivered";
    ASSERT_TRUE(r0->Release(&c0, batch->slot(), batch->seq()).ok());
  }
  EXPECT_EQ(end.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(end.message(), HasSubstr("fake/12"));
  EXPECT_THAT(end.message(), HasSubstr("on_corrupt_sample=FAIL"));
  EXPECT_TRUE(job_->failed());
  // The other rank learns it at its next request.
  ASSERT_TRUE(r1->StartEpoch(&c1, 0, 0).ok());
  auto m = *c1.Next();
  ASSERT_TRUE(std::holds_alternative<absl::Status>(m));
  EXPECT_EQ(std::get<absl::Status>(m).code(), absl::StatusCode::kDataLoss);
  r0->Unbind(&c0);
  r1->Unbind(&c1);
}

// Holds every worker of a pool (one task each, parked until Release) so that what is
// submitted meanwhile queues up; the tasks made by Tasks() record their name as they run.
class HeldWorkers {
 public:
  explicit HeldWorkers(WorkerPool& pool) : workers_(pool.total_threads()) {
    std::vector<WorkerPool::Task> blockers;
    for (int i = 0; i < workers_; ++i) {
      blockers.push_back([this](WorkerContext&) {
        parked_.fetch_add(1);
        absl::MutexLock lock(&mutex_);
        mutex_.Await(absl::Condition(&go_));
      });
    }
    pool.Submit(WorkerPool::kAnyGroup, {99}, std::move(blockers));
    while (parked_.load() < workers_) absl::SleepFor(absl::Milliseconds(1));
  }
  int workers() const { return workers_; }
  std::vector<WorkerPool::Task> Tasks(const std::string& name, int n) {
    std::vector<WorkerPool::Task> out;
    for (int i = 0; i < n; ++i) {
      out.push_back([this, name](WorkerContext&) {
        absl::MutexLock lock(&mutex_);
        order_.push_back(name);
      });
    }
    return out;
  }
  void Release() {
    absl::MutexLock lock(&mutex_);
    go_ = true;
  }
  // Once the pool is gone (every task ran).
  std::vector<std::string> order() {
    absl::MutexLock lock(&mutex_);
    return order_;
  }

 private:
  const int workers_;
  std::atomic<int> parked_{0};
  absl::Mutex mutex_;
  bool go_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::string> order_ ABSL_GUARDED_BY(mutex_);
};

TEST(WorkerPoolTest, OwnersAreServedRoundRobin) {
  Topology topo = *Topology::Read("/sys");
  auto pool = *WorkerPool::Create(topo, 1);
  // Hold every worker so the queue builds up, then let go and record the order.
  HeldWorkers held(*pool);
  const int workers = held.workers();
  pool->Submit(WorkerPool::kAnyGroup, {1}, held.Tasks("1", 100));  // a big job first...
  pool->Submit(WorkerPool::kAnyGroup, {2}, held.Tasks("2", 10));   // ...does not starve a small one
  held.Release();
  pool.reset();  // drains the queues, then joins
  const std::vector<std::string> order = held.order();
  ASSERT_EQ(order.size(), 110u);
  // Owner 2's ten tasks all ran among the first 20 + workers (round-robin, a few workers
  // racing), not after owner 1's hundred.
  int last_of_2 = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] == "2") last_of_2 = static_cast<int>(i);
  }
  EXPECT_LT(last_of_2, 20 + 2 * workers);
}

TEST(WorkerPoolTest, WorkersRunAtTheirNiceValueAndOtherThreadsKeepTheirs) {
  Topology topo = *Topology::Read("/sys");
  const int before = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  auto pool = *WorkerPool::Create(topo, 1, /*nice=*/7);
  absl::Mutex mutex;
  std::vector<int> seen;
  std::vector<WorkerPool::Task> tasks;
  for (int i = 0; i < pool->total_threads(); ++i) {
    tasks.push_back([&](WorkerContext&) {
      errno = 0;
      const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
      absl::MutexLock lock(&mutex);
      seen.push_back(errno == 0 ? nice : -100);
    });
  }
  pool->Submit(WorkerPool::kAnyGroup, {1}, std::move(tasks));
  pool.reset();
  ASSERT_EQ(seen.size(), static_cast<size_t>(topo.nodes().size()));
  // Whatever this process's own nice value, a worker adds nothing to 7 (it sets, not adds).
  for (int nice : seen) EXPECT_EQ(nice, std::max(7, before));
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(gettid())), before);
}

TEST(WorkerPoolTest, WorkersMayRunUnderSchedIdle) {
  Topology topo = *Topology::Read("/sys");
  auto pool = *WorkerPool::Create(topo, 1, /*nice=*/0, /*sched_idle=*/true);
  absl::Mutex mutex;
  std::vector<int> policies;
  std::vector<WorkerPool::Task> tasks;
  for (int i = 0; i < pool->total_threads(); ++i) {
    tasks.push_back([&](WorkerContext&) {
      const int policy = sched_getscheduler(0);
      absl::MutexLock lock(&mutex);
      policies.push_back(policy);
    });
  }
  pool->Submit(WorkerPool::kAnyGroup, {1}, std::move(tasks));
  pool.reset();
  ASSERT_FALSE(policies.empty());
  for (int policy : policies) EXPECT_EQ(policy, SCHED_IDLE);
  EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);  // this thread keeps its own
}

TEST(WorkerPoolTest, RanksOfOneJobAreServedRoundRobinAndTheJobTakesOneTurn) {
  // Every worker held while the queue builds up, so the order is the queue's.
  Topology topo = *Topology::Read("/sys");
  auto pool = *WorkerPool::Create(topo, 1);
  ASSERT_GE(pool->total_threads(), 1);
  HeldWorkers held(*pool);
  const int workers = held.workers();
  // Job 1's rank 0 queued 60 rows before its ranks 1 and 2 (their trainers started later,
  // on other GPUs) queued 10 each; job 2, of one rank, queued 20.
  pool->Submit(WorkerPool::kAnyGroup, {1, 0}, held.Tasks("1.0", 60));
  pool->Submit(WorkerPool::kAnyGroup, {1, 1}, held.Tasks("1.1", 10));
  pool->Submit(WorkerPool::kAnyGroup, {1, 2}, held.Tasks("1.2", 10));
  pool->Submit(WorkerPool::kAnyGroup, {2, 0}, held.Tasks("2.0", 20));
  held.Release();
  pool.reset();
  const std::vector<std::string> order = held.order();
  ASSERT_EQ(order.size(), 100u);
  // Each row is one of the last `workers` taken, give or take the workers racing: counted
  // over a prefix, ranks 1 and 2 keep pace with rank 0, and job 2 with job 1 as a whole.
  std::map<std::string, int> first60;
  for (size_t i = 0; i < 60; ++i) ++first60[order[i]];
  const int slack = 2 * workers;
  EXPECT_NEAR(first60["2.0"], 20, slack);  // job 2 is done within the first ~40
  EXPECT_NEAR(first60["1.1"], 10, slack);
  EXPECT_NEAR(first60["1.2"], 10, slack);
  std::map<std::string, int> first30;
  for (size_t i = 0; i < 30; ++i) ++first30[order[i]];
  EXPECT_NEAR(first30["2.0"], 15, slack);  // half the turns go to each job
  EXPECT_NEAR(first30["1.1"], 5, slack);   // a third of job 1's to each of its ranks
  EXPECT_NEAR(first30["1.0"], 5, slack);
}

// A source that routes like an image source of a GPU decode job: it has the plan field, and
// writes into "value" whether the batch of the row was given to the GPU's decoder.
class RoutingSource final : public SampleSource {
 public:
  explicit RoutingSource(int64_t n) : n_(n) {
    fields_.push_back(FieldLayout{"value", ferry::v1::INT64, {}, 8});
    fields_.push_back(FieldLayout{"index", ferry::v1::INT64, {}, 8});
    FieldLayout plan{kGpuDecodePlanField, ferry::v1::UINT8, {72}, 72};
    plan.internal = true;
    fields_.push_back(plan);
  }
  int64_t size() const override { return n_; }
  const std::vector<FieldLayout>& fields() const override { return fields_; }
  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Scratch>(); }
  absl::Status Fill(int64_t index, uint64_t, absl::Span<uint8_t* const> rows,
                    Scratch* scratch) const override {
    const int64_t gpu = scratch->gpu_batch ? 1 : 0;
    memcpy(rows[0], &gpu, 8);
    memcpy(rows[1], &index, 8);
    return absl::OkStatus();
  }
  std::string Describe(int64_t index) const override { return "routing/" + std::to_string(index); }

 private:
  int64_t n_;
  std::vector<FieldLayout> fields_;
};

// The ring of a rank whose device decodes JPEGs as a GPU's decoder does (GpuJpegStage): it
// takes whole batches by its rank's turn at the job's GpuDecodeSplit. Host slots are
// delivered as they are (a HostRing's).
class DecodingRing final : public DeliveryRing {
 public:
  DecodingRing(int slots, uint64_t slab_bytes, GpuDecodeSplit* split)
      : host_(slots, slab_bytes), turn_(split) {}
  BatchPlan PlanBatch() override { return BatchPlan{.gpu_decode = turn_.RouteBatch()}; }
  void ReportConsumerWait(absl::Duration waited, absl::Duration interval) override {
    turn_.ReportConsumerWait(absl::ToDoubleSeconds(waited), absl::ToDoubleSeconds(interval));
  }
  void FillStatus(ferry::v1::RankStatus* status) const override {
    host_.FillStatus(status);
    status->set_gpu_decode_demand(turn_.demand());
  }
  void SetListener(Listener listener) override { host_.SetListener(std::move(listener)); }
  int num_slots() const override { return host_.num_slots(); }
  void Enqueue(const Batch& batch) override { host_.Enqueue(batch); }
  void Filled(uint64_t ticket) override { host_.Filled(ticket); }
  std::optional<uint32_t> TakeReady(uint64_t ticket, int64_t seq) override {
    return host_.TakeReady(ticket, seq);
  }
  void DropQueued(std::vector<int>* freed) override { host_.DropQueued(freed); }
  absl::Status Release(uint32_t slot, int64_t seq, bool complete,
                       std::vector<int>* freed) override {
    return host_.Release(slot, seq, complete, freed);
  }
  int leased() const override { return host_.leased(); }
  absl::Status OpenConsumer(const std::vector<std::string>& released_events) override {
    return host_.OpenConsumer(released_events);
  }
  void CloseConsumer(std::vector<int>* freed) override { host_.CloseConsumer(freed); }
  void Describe(ferry::v1::AttachResponse* response) const override { host_.Describe(response); }

 private:
  HostRing host_;
  GpuDecodeSplit::Rank turn_;
};

// Two ranks of one job, each on its own GPU: the rank whose trainer waits gets its GPU's
// decoder for whole batches (its ring plans them so, and the workers write the files
// instead of decoding them), the rank whose trainer never waits keeps every batch on the
// workers, and each rank's status says so.
TEST_F(PipelineTest, EachRanksGpuDecoderTakesWholeBatchesByItsOwnTrainersWaits) {
  auto split = std::make_shared<GpuDecodeSplit>(GpuDecodeMode::kAuto, 8);
  split->ReportCpuDecode(0.003);
  split->ReportCpuRoute(0.0);
  split->ReportGpuBatch(8, 0.003);  // f = 0.003 / (0.003 + 8 * 0.000375) = 0.5
  ASSERT_NEAR(split->balance(), 0.5, 1e-9);
  ferry::v1::JobSpec spec;
  spec.set_batch_size(16);
  spec.set_seed(5);
  spec.set_drop_last(true);
  spec.set_world_size(2);
  job_ = *Job::Create(JobIdentity{"jroute", "route", 1000, next_serial_++}, spec,
                      std::make_unique<RoutingSource>(2 * 16 * 20), split);
  ASSERT_EQ(job_->gpu_decode(), split.get());
  int gpu_batches[2] = {0, 0};
  for (int rank = 0; rank < 2; ++rank) {
    auto p = *RankPipeline::Create(
        job_, rank, 3, -1, pool_.get(), &budget_,
        [&](const SharedSlab& slab) -> absl::StatusOr<std::unique_ptr<DeliveryRing>> {
          return std::make_unique<DecodingRing>(3, slab.size(), split.get());
        });
    RecordingConsumer c;
    ASSERT_TRUE(p->Bind(&c, 1).ok());
    ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
    // Rank 0's trainer waits a second for every batch; rank 1's never waits.
    const absl::Duration waited = rank == 0 ? absl::Seconds(1) : absl::ZeroDuration();
    for (int b = 0; b < 20; ++b) {
      auto batch = std::get<ferry::v1::BatchReady>(*c.Next());
      const SlotLayout& layout = job_->layout();
      std::vector<int64_t> gpu(16);
      memcpy(gpu.data(), p->slab().data() + batch.slot() * layout.slot_bytes + layout.offsets[0],
             16 * 8);
      // Every row of a batch agrees: the GPU's decoder gets all of it or none.
      for (int64_t g : gpu) EXPECT_EQ(g, gpu[0]) << "rank " << rank << " batch " << b;
      gpu_batches[rank] += static_cast<int>(gpu[0]);
      ASSERT_TRUE(p->Release(&c, batch.slot(), batch.seq(), false, waited).ok());
    }
    ferry::v1::RankStatus status;
    p->FillStatus(&status);
    if (rank == 0) {
      EXPECT_GT(status.gpu_decode_demand(), 0.5);
      EXPECT_GE(status.gpu_decode_batches(), static_cast<uint64_t>(gpu_batches[0]));
    } else {
      EXPECT_EQ(status.gpu_decode_demand(), 0.0);
      EXPECT_EQ(status.gpu_decode_batches(), 0u);
    }
    p->Unbind(&c);
  }
  // Demand rises by 0.1 a waited batch from the second release on: over the batches
  // scheduled by rank 0's first 17 releases, shares of 0.05, 0.10, ... 0.5 (5.75 in all).
  EXPECT_GE(gpu_batches[0], 3);
  EXPECT_EQ(gpu_batches[1], 0);
}

TEST_F(PipelineTest, ShutdownEndsTheStreamOnceHeldBatchesAreBack) {
  auto p = Make(100, 5, 1, 0, 3, true);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  auto held = std::get<ferry::v1::BatchReady>(*c.Next());
  // Drain what was delivered before the shutdown, keeping `held`.
  absl::SleepFor(absl::Milliseconds(50));
  p->Shutdown(absl::UnavailableError("ferryd is shutting down"));
  while (c.pending() > 0) {
    auto m = c.Next();
    ASSERT_TRUE(m.has_value());
    ASSERT_FALSE(std::holds_alternative<absl::Status>(*m)) << "stream ended while a batch was held";
    if (auto* b = std::get_if<ferry::v1::BatchReady>(&*m)) {
      ASSERT_TRUE(p->Release(&c, b->slot(), b->seq()).ok());
    }
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(c.pending(), 0u);
  ASSERT_TRUE(p->Release(&c, held.slot(), held.seq()).ok());
  auto end = c.Next();
  ASSERT_TRUE(end.has_value());
  auto* reason = std::get_if<absl::Status>(&*end);
  ASSERT_NE(reason, nullptr);
  EXPECT_EQ(reason->code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(reason->message(), HasSubstr("shutting down"));
  p->Unbind(&c);
}

TEST_F(PipelineTest, AStoppedStreamEndsOnceOverdueThoughBatchesAreHeld) {
  auto p = Make(100, 5, 1, 0, 3, true);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  ASSERT_TRUE(std::holds_alternative<ferry::v1::BatchReady>(*c.Next()));  // kept
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time before = absl::Now();
  p->Shutdown(absl::AbortedError("job deleted"));
  while (c.pending() > 0) {
    auto m = c.Next();
    ASSERT_TRUE(m.has_value());
    ASSERT_FALSE(std::holds_alternative<absl::Status>(*m)) << "ended while batches were held";
  }
  p->EndStreamIfStoppedBefore(before);  // stopped after this cutoff: not yet
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(c.pending(), 0u);
  p->EndStreamIfStoppedBefore(absl::Now());
  auto end = c.Next();
  ASSERT_TRUE(end.has_value());
  auto* reason = std::get_if<absl::Status>(&*end);
  ASSERT_NE(reason, nullptr);
  EXPECT_EQ(reason->code(), absl::StatusCode::kAborted);
  p->EndStreamIfStoppedBefore(absl::Now());  // told once
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(c.pending(), 0u);
  p->Unbind(&c);
}

// A device stage over host memory: "device" slots are plain buffers, copies are memcpy,
// and every report comes from another thread, as from a real copy engine. Released signals
// fire only when the test says so (the trainer's GPU is still using the slot until then).
class FakeDeviceStage final : public DeviceStage {
 public:
  FakeDeviceStage(const SharedSlab& slab, size_t slot_bytes, int slots)
      : slab_(slab.data()),
        slot_bytes_(slot_bytes),
        device_(slots, std::vector<uint8_t>(slot_bytes)) {}
  ~FakeDeviceStage() override { JoinReports(); }
  // Call after the pipeline's Shutdown and before dropping the test's reference, so that
  // no report thread ends up destroying the pipeline. A report thread may still start a
  // copy ordered before the Shutdown, and with it another report thread: join until none
  // is left.
  void JoinReports() {
    for (;;) {
      std::vector<std::thread> threads;
      {
        absl::MutexLock lock(&threads_mutex_);
        threads.swap(threads_);
      }
      if (threads.empty()) return;
      for (std::thread& t : threads) {
        // A test that ends without Shutdown may leave a report thread holding the last
        // reference to the pipeline, whose destructor then runs here; the thread touches
        // only its own copies after that (as CudaStage's event watcher does).
        if (t.get_id() == std::this_thread::get_id()) {
          t.detach();
        } else {
          t.join();
        }
      }
    }
  }
  int num_device_slots() const override { return static_cast<int>(device_.size()); }
  int gathered_field() const override { return gathered; }
  bool gathers_every_batch() const override { return every_batch; }
  bool gather_ready() const override { return ready.load(); }
  void SetCallbacks(Callbacks callbacks) override { callbacks_ = std::move(callbacks); }
  absl::Status StartCopy(int host_slot, int device_slot, uint32_t num_samples, bool gather,
                         uint64_t token) override {
    EXPECT_FALSE(copies_forbidden.load()) << "asked for a copy after the pipeline's Shutdown";
    if (on_start_copy) on_start_copy();
    EXPECT_TRUE(!gather || gathered == 0) << "asked to gather with no gathered field";
    {
      absl::MutexLock lock(&mutex_);
      for (const auto& [slot, token] : watched_) {
        EXPECT_NE(slot, device_slot)
            << "device slot " << device_slot << " written before its released signal";
      }
    }
    uint8_t* host = slab_ + host_slot * slot_bytes_;
    if (gathered == 0) {
      std::vector<int64_t> indices(num_samples);
      memcpy(indices.data(), host + index_offset, 8 * num_samples);
      absl::MutexLock lock(&mutex_);
      gathered_by_indices_[indices] = gather;
    }
    memcpy(device_[device_slot].data(), host, slot_bytes_);
    if (gather) {
      // FakeSource's field 0 ("value" = 10 * index, at offset 0): read "from the dataset"
      // given each row's index, as CudaStage's gather kernel does; the host rows must be
      // untouched.
      for (uint32_t r = 0; r < num_samples; ++r) {
        int64_t index, unwritten;
        memcpy(&index, host + index_offset + 8 * r, 8);
        memcpy(&unwritten, host + 8 * r, 8);
        if (unwritten != 0) ++host_rows_written;
        const int64_t value = 10 * index;
        memcpy(device_[device_slot].data() + 8 * r, &value, 8);
      }
      ++gathers;
    }
    // Zeroed after each copy: a batch the workers were to fill shows its rows, not those
    // of an earlier batch of the same host slot.
    memset(host, 0, slot_bytes_);
    ++copies;
    // The thread owns copies of the callbacks, so it never touches the stage.
    absl::MutexLock lock(&threads_mutex_);
    threads_.emplace_back(
        [callbacks = callbacks_, host_slot, device_slot, token, delay = report_delay] {
          absl::SleepFor(delay);  // a copy engine behind
          callbacks.host_slot_free(host_slot);
          callbacks.device_slot_ready(device_slot, token);
        });
    return absl::OkStatus();
  }
  void WatchReleased(int device_slot, uint64_t token) override {
    absl::MutexLock lock(&mutex_);
    watched_.emplace_back(device_slot, token);
  }
  bool ReleasedSignalPending(int device_slot) const override {
    absl::MutexLock lock(&mutex_);
    for (const auto& [slot, token] : watched_) {
      if (slot == device_slot) return !completed_unreported_.contains(slot);
    }
    return false;
  }
  // The trainer's GPU finished with every slot it released so far, and the stage has not
  // reported it yet (CudaStage's event watcher polls every 5-100 us).
  void CompleteWatchedUnreported() {
    absl::MutexLock lock(&mutex_);
    for (const auto& [slot, token] : watched_) completed_unreported_.insert(slot);
  }
  // Whether the batch of samples `indices` was last gathered (vs copied); nullopt if no
  // such batch was copied.
  std::optional<bool> Gathered(const std::vector<int64_t>& indices) {
    absl::MutexLock lock(&mutex_);
    auto it = gathered_by_indices_.find(indices);
    if (it == gathered_by_indices_.end()) return std::nullopt;
    return it->second;
  }
  // The trainer's GPU finished with every slot it released so far.
  void SignalReleased() {
    std::vector<std::pair<int, uint64_t>> fire;
    {
      absl::MutexLock lock(&mutex_);
      fire.swap(watched_);
      completed_unreported_.clear();
    }
    for (const auto& [slot, token] : fire) callbacks_.device_slot_released(slot, token);
  }
  // The trainer's GPU finished with the oldest slot it released.
  void SignalOldestReleased() {
    std::pair<int, uint64_t> fire;
    {
      absl::MutexLock lock(&mutex_);
      ASSERT_FALSE(watched_.empty());
      fire = watched_.front();
      watched_.erase(watched_.begin());
      completed_unreported_.erase(fire.first);
    }
    callbacks_.device_slot_released(fire.first, fire.second);
  }
  size_t watched() {
    absl::MutexLock lock(&mutex_);
    return watched_.size();
  }
  void Describe(ferry::v1::AttachResponse*) const override {}
  absl::Status OpenConsumer(const std::vector<std::string>& events) override {
    if (events.size() != device_.size()) return absl::InvalidArgumentError("one event per slot");
    opened = true;
    return absl::OkStatus();
  }
  void CloseConsumer() override {
    absl::MutexLock lock(&mutex_);
    watched_.clear();
    completed_unreported_.clear();
    opened = false;
  }

  uint8_t* slab_;  // the mapping outlives the SharedSlab object, which is moved
  const size_t slot_bytes_;
  int gathered = -1;                    // set before the pipeline is created
  bool every_batch = true;              // likewise
  std::atomic<bool> ready{true};        // the gather can start (a registration is done)
  size_t index_offset = 0;              // of field 1, with gathered == 0
  std::function<void()> on_start_copy;  // set before the pipeline is created
  absl::Duration report_delay;          // before a copy's reports; likewise
  std::atomic<bool> copies_forbidden{false};
  std::atomic<int> host_rows_written{0};
  std::vector<std::vector<uint8_t>> device_;
  Callbacks callbacks_;
  absl::Mutex threads_mutex_;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(threads_mutex_);
  std::atomic<int> copies{0};
  std::atomic<int> gathers{0};
  bool opened = false;
  mutable absl::Mutex mutex_;
  std::vector<std::pair<int, uint64_t>> watched_ ABSL_GUARDED_BY(mutex_);
  absl::flat_hash_set<int> completed_unreported_ ABSL_GUARDED_BY(mutex_);  // device slots
  absl::flat_hash_map<std::vector<int64_t>, bool> gathered_by_indices_ ABSL_GUARDED_BY(mutex_);
};

void PipelineTest::ExpectDeviceBatch(const FakeDeviceStage& stage, const ferry::v1::BatchReady& b,
                                     int64_t i) {
  EXPECT_EQ(b.batch(), i);
  std::vector<int64_t> values(4), indices(4);
  memcpy(values.data(), stage.device_[b.slot()].data(), 32);
  memcpy(indices.data(), stage.device_[b.slot()].data() + job_->layout().offsets[1], 32);
  EXPECT_EQ(indices, Expected(0, 0, i));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(values[r], 10 * indices[r]) << "batch " << i;
}

// A pipeline of `job` whose device stage is a FakeDeviceStage of `device_slots`, returned
// in *stage; `configure` may set the stage's knobs before the pipeline sees it.
absl::StatusOr<std::shared_ptr<RankPipeline>> CreateWithFakeStage(
    std::shared_ptr<Job> job, int host_slots, int device_slots, WorkerPool* pool,
    MemoryBudget* budget, FakeDeviceStage** stage, int gathered_field = -1,
    const std::function<void(FakeDeviceStage&)>& configure = {}) {
  const size_t slot_bytes = job->layout().slot_bytes;
  const size_t index_offset = job->layout().offsets.back();
  return RankPipeline::Create(
      std::move(job), 0, host_slots, -1, pool, budget,
      [=](const SharedSlab& slab) -> absl::StatusOr<std::unique_ptr<DeliveryRing>> {
        auto s = std::make_unique<FakeDeviceStage>(slab, slot_bytes, device_slots);
        s->gathered = gathered_field;
        s->index_offset = index_offset;
        if (configure) configure(*s);
        *stage = s.get();
        return std::make_unique<DeviceRing>(std::move(s));
      });
}

TEST_F(PipelineTest, DeviceStageSlotsAreLeasedAndHostSlotsRecycled) {
  ferry::v1::JobSpec spec;
  spec.set_batch_size(4);
  spec.set_shuffle(true);
  spec.set_seed(3);
  spec.set_drop_last(true);
  job_ = *Job::Create(JobIdentity{"jgpu", "gpu", 1000, 77}, spec,
                      std::make_unique<FakeSource>(64, absl::flat_hash_set<int64_t>{}));
  FakeDeviceStage* stage = nullptr;
  auto created = CreateWithFakeStage(job_, /*host_slots=*/2, /*device_slots=*/3, pool_.get(),
                                     &budget_, &stage);
  ASSERT_TRUE(created.ok()) << created.status();
  auto p = *created;
  EXPECT_EQ(p->num_slots(), 3);
  RecordingConsumer c;
  EXPECT_EQ(p->Bind(&c, 1, {"a"}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(p->Bind(&c, 1, {"a", "b", "c"}).ok());
  EXPECT_TRUE(stage->opened);
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  // Hold all three device slots: no more can be delivered, though host slots refill.
  std::vector<ferry::v1::BatchReady> held;
  for (int i = 0; i < 3; ++i) held.push_back(std::get<ferry::v1::BatchReady>(*c.Next()));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(c.pending(), 0u);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(held[i].batch(), i);
    EXPECT_LT(held[i].slot(), 3u);
    std::vector<int64_t> got(4);
    memcpy(got.data(), stage->device_[held[i].slot()].data() + job_->layout().offsets[1], 32);
    EXPECT_EQ(got, Expected(0, 0, i));
  }
  // Released, but the trainer's GPU is not done with them: still nothing is copied.
  for (auto& b : held) ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(c.pending(), 0u);
  EXPECT_EQ(stage->copies.load(), 3);
  EXPECT_EQ(stage->watched(), 3u);
  stage->SignalReleased();
  for (int64_t i = 3; i < 16; ++i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    EXPECT_EQ(b.batch(), i);
    std::vector<int64_t> got(4);
    memcpy(got.data(), stage->device_[b.slot()].data() + job_->layout().offsets[1], 32);
    EXPECT_EQ(got, Expected(0, 0, i));
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
    stage->SignalReleased();
  }
  EXPECT_EQ(std::get<EpochEndMsg>(*c.Next()).epoch, 0);
  EXPECT_GE(stage->copies.load(), 16);
  // A consumer that goes away holding a released-but-unsignalled slot: the slot is
  // reclaimed, and the next consumer gets every slot.
  ASSERT_TRUE(p->StartEpoch(&c, 1, 0).ok());
  auto b = std::get<ferry::v1::BatchReady>(*c.Next());
  ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
  p->Unbind(&c);
  EXPECT_FALSE(stage->opened);
  EXPECT_EQ(stage->watched(), 0u);
  RecordingConsumer c2;
  ASSERT_TRUE(p->Bind(&c2, 2, {"a", "b", "c"}).ok());
  ASSERT_TRUE(p->StartEpoch(&c2, 1, 1).ok());
  std::set<uint32_t> slots;
  for (int64_t i = 1; i < 4; ++i) {
    auto r = std::get<ferry::v1::BatchReady>(*c2.Next());
    EXPECT_EQ(r.epoch(), 1);
    EXPECT_EQ(r.batch(), i);
    slots.insert(r.slot());
  }
  EXPECT_EQ(slots.size(), 3u);
  p->Unbind(&c2);
  p->Shutdown(absl::CancelledError("test over"));
  stage->JoinReports();
}

// A stage that reads a field from the dataset itself (CudaStage's page-cache gather): the
// workers hand the source a null row for it and never write it into the host slot, and
// every batch still holds the right values once the stage has read them.
TEST_F(PipelineTest, FieldGatheredByTheStageIsNeverWrittenByWorkers) {
  auto source = std::make_unique<FakeSource>(64, absl::flat_hash_set<int64_t>{});
  const FakeSource* fake = source.get();
  job_ = GatherJob("jgather", /*seed=*/9, /*serial=*/78, std::move(source));
  FakeDeviceStage* stage = nullptr;
  auto created = CreateWithFakeStage(job_, /*host_slots=*/2, /*device_slots=*/2, pool_.get(),
                                     &budget_, &stage, /*gathered_field=*/0);
  ASSERT_TRUE(created.ok()) << created.status();
  auto p = *created;
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1, {"a", "b"}).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  for (int64_t i = 0; i < 16; ++i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    ExpectDeviceBatch(*stage, b, i);
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
    stage->SignalReleased();
  }
  EXPECT_EQ(std::get<EpochEndMsg>(*c.Next()).epoch, 0);
  EXPECT_GE(fake->null_rows(), 64);
  EXPECT_EQ(stage->host_rows_written.load(), 0);
  p->Unbind(&c);
  p->Shutdown(absl::CancelledError("test over"));
  stage->JoinReports();
}

// A stage that gathers only while the consumer waits (DeviceStage::gathers_every_batch
// false): batches scheduled while the consumer holds every slot but the one being
// refilled have their rows written by the workers and copied; those scheduled while it
// holds none are gathered. Every batch holds the right values either way. The consumer
// holds slots by keeping them leased, or (gpu_lags) by releasing each at once while its
// GPU, still busy with earlier work, signals the releases only later, oldest first.
void PipelineTest::ExpectBatchesMadeWhileTheConsumerHoldsMostSlotsAreCopied(int slots,
                                                                            bool gpu_lags) {
  SCOPED_TRACE(absl::StrCat(slots, " slots", gpu_lags ? ", GPU lags" : ""));
  job_ = GatherJob("jgather2", /*seed=*/3, /*serial=*/80);
  FakeDeviceStage* stage = nullptr;
  auto created =
      CreateWithFakeStage(job_, slots, slots, pool_.get(), &budget_, &stage,
                          /*gathered_field=*/0, [](FakeDeviceStage& s) { s.every_batch = false; });
  ASSERT_TRUE(created.ok()) << created.status();
  auto p = *created;
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1, std::vector<std::string>(slots, "event")).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());  // batches 0 to slots-1 with nothing held
  auto take = [&](int64_t i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    ExpectDeviceBatch(*stage, b, i);
    return b;
  };
  std::deque<ferry::v1::BatchReady> held;
  for (int64_t i = 0; i < slots; ++i) {  // the consumer takes every slot
    held.push_back(take(i));
    if (gpu_lags) {
      ASSERT_TRUE(p->Release(&c, held.back().slot(), held.back().seq()).ok());
    }
  }
  // From here each batch is scheduled when a host slot frees, right after a copy made
  // room by a released signal, while the consumer holds all the other slots: batches
  // 2 * slots to 15.
  for (int64_t i = slots; i < 16; ++i) {
    if (gpu_lags) {
      stage->SignalOldestReleased();
      const ferry::v1::BatchReady b = take(i);
      ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
    } else {
      ASSERT_TRUE(p->Release(&c, held.front().slot(), held.front().seq()).ok());
      held.pop_front();
      stage->SignalReleased();
      held.push_back(take(i));
    }
  }
  EXPECT_GE(stage->gathers.load(), slots);  // batches 0 to slots-1 at least
  EXPECT_GE(stage->copies.load() - stage->gathers.load(), 16 - 2 * slots);
  EXPECT_EQ(stage->host_rows_written.load(), 0);
  p->Unbind(&c);
  p->Shutdown(absl::CancelledError("test over"));
  stage->JoinReports();
}

// Shutdown waits for a copy that another thread is starting, and once it has returned the
// stage is asked for no more, not even for batches whose copy was ordered before it: the
// stage (and the memory it copies from) may be torn down right after.
TEST_F(PipelineTest, NoCopyStartsAfterShutdownReturns) {
  ferry::v1::JobSpec spec;
  spec.set_batch_size(4);
  spec.set_seed(3);
  job_ = *Job::Create(JobIdentity{"jstop", "gpu", 1000, 91}, spec,
                      std::make_unique<FakeSource>(64, absl::flat_hash_set<int64_t>{}));
  absl::Notification entered, gate;
  std::atomic<int> calls{0};
  FakeDeviceStage* stage = nullptr;
  auto created =
      CreateWithFakeStage(job_, /*host_slots=*/4, /*device_slots=*/4, pool_.get(), &budget_, &stage,
                          -1, [&](FakeDeviceStage& s) {
                            s.on_start_copy = [&] {
                              if (calls.fetch_add(1) != 0) return;
                              entered.Notify();
                              gate.WaitForNotification();  // the first copy is slow to start
                            };
                          });
  ASSERT_TRUE(created.ok()) << created.status();
  auto p = *created;
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1, {"a", "b", "c", "d"}).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  entered.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(50));  // the other three batches fill and are ordered
  std::atomic<bool> returned{false};
  std::thread shutdown([&] {
    p->Shutdown(absl::CancelledError("test over"));
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(returned.load()) << "Shutdown returned while a copy was being started";
  gate.Notify();
  shutdown.join();
  stage->copies_forbidden = true;
  stage->JoinReports();
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(stage->copies.load(), 1);
  p->Unbind(&c);
}

// A stage whose gather is not ready yet (its dataset mapping still registering): the
// batches scheduled until then are copied from rows the workers wrote; the ones
// scheduled after it is ready are gathered.
TEST_F(PipelineTest, BatchesAreCopiedUntilTheGatherIsReady) {
  job_ = GatherJob("jgather3", /*seed=*/5, /*serial=*/81);
  FakeDeviceStage* stage = nullptr;
  auto created =
      CreateWithFakeStage(job_, /*host_slots=*/4, /*device_slots=*/4, pool_.get(), &budget_, &stage,
                          /*gathered_field=*/0, [](FakeDeviceStage& s) { s.ready = false; });
  ASSERT_TRUE(created.ok()) << created.status();
  auto p = *created;
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1, {"a", "b", "c", "d"}).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  for (int64_t i = 0; i < 16; ++i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    ExpectDeviceBatch(*stage, b, i);
    // Batches 0-7 were scheduled before any release (four host slots, and four more once
    // the first four took the device slots); every later one after this.
    if (i == 0) stage->ready = true;
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
    stage->SignalReleased();
  }
  EXPECT_GE(stage->copies.load() - stage->gathers.load(), 4);  // batches 0-3 at least
  EXPECT_GE(stage->gathers.load(), 8);                         // batches 8-15 at least
  EXPECT_EQ(stage->host_rows_written.load(), 0);
  p->Unbind(&c);
  p->Shutdown(absl::CancelledError("test over"));
  stage->JoinReports();
}

TEST_F(PipelineTest, BatchesMadeWhileTheConsumerHoldsMostSlotsAreCopiedNotGathered) {
  ExpectBatchesMadeWhileTheConsumerHoldsMostSlotsAreCopied(/*slots=*/4, /*gpu_lags=*/false);
}

TEST_F(PipelineTest, SlotsReleasedButStillInUseOnTheTrainersGpuCountAsHeld) {
  ExpectBatchesMadeWhileTheConsumerHoldsMostSlotsAreCopied(/*slots=*/4, /*gpu_lags=*/true);
}

// With two or three slots, one of them being refilled, the consumer can hold at most the
// others: that is "most" there too.
TEST_F(PipelineTest, SmallRingsAlsoCopyWhileTheConsumerHoldsTheOtherSlots) {
  ExpectBatchesMadeWhileTheConsumerHoldsMostSlotsAreCopied(/*slots=*/2, /*gpu_lags=*/false);
  ExpectBatchesMadeWhileTheConsumerHoldsMostSlotsAreCopied(/*slots=*/3, /*gpu_lags=*/true);
}

// A trainer whose GPU runs behind its host: it takes every batch as soon as it comes and
// releases it at once, while its GPU is still busy with the two batches before (their
// released signals pending). It holds few slots, yet it is not waiting for batches: once
// the ring's first batches are made, every batch is copied, none gathered.
TEST_F(PipelineTest, BatchesMadeWhileTheTrainersGpuIsBehindItsHostAreCopied) {
  job_ = GatherJob("jgather5", /*seed=*/11, /*serial=*/83,
                   std::make_unique<FakeSource>(256, absl::flat_hash_set<int64_t>{}));
  FakeDeviceStage* stage = nullptr;
  auto created = CreateWithFakeStage(job_, /*host_slots=*/4, /*device_slots=*/16, pool_.get(),
                                     &budget_, &stage, /*gathered_field=*/0,
                                     [](FakeDeviceStage& s) { s.every_batch = false; });
  ASSERT_TRUE(created.ok()) << created.status();
  auto p = *created;
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1, std::vector<std::string>(16, "event")).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  const int64_t batches = job_->sampler().batches_per_epoch();
  ASSERT_EQ(batches, 64);
  for (int64_t i = 0; i < batches; ++i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    ExpectDeviceBatch(*stage, b, i);
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
    while (stage->watched() > 2) stage->SignalOldestReleased();
  }
  // Batches 0-19 fill the 16 device slots and 4 host slots before any release; each later
  // one is scheduled once a released signal was reported, with two still pending.
  for (int64_t i = 20; i < batches; ++i) {
    EXPECT_EQ(stage->Gathered(Expected(0, 0, i)), false) << "batch " << i;
  }
  EXPECT_EQ(stage->Gathered(Expected(0, 0, 0)), true);
  EXPECT_EQ(stage->host_rows_written.load(), 0);
  // A new consumer starts with a policy of its own: its first batch is gathered (the old
  // one's GPU being behind says nothing about it), here one the ring holds no copy of.
  p->Unbind(&c);
  stage->SignalReleased();  // nothing: Unbind forgot the old consumer's signals
  RecordingConsumer c2;
  ASSERT_TRUE(p->Bind(&c2, 2, std::vector<std::string>(16, "event")).ok());
  ASSERT_TRUE(p->StartEpoch(&c2, 0, 40).ok());
  auto b = std::get<ferry::v1::BatchReady>(*c2.Next());
  ExpectDeviceBatch(*stage, b, 40);
  EXPECT_EQ(stage->Gathered(Expected(0, 0, 40)), true);
  p->Unbind(&c2);
  p->Shutdown(absl::CancelledError("test over"));
  stage->JoinReports();
}

// A slot whose released signal has completed is no longer the trainer's, even before the
// stage reports it: the pipeline asks the stage when it decides. Here the trainer took and
// released every slot and its GPU finished with all of them, but only one release was
// reported when batch 8 was scheduled: the trainer waits, so batch 8 is gathered.
TEST_F(PipelineTest, ReleasesCompletedButNotYetReportedDoNotCountAsHeld) {
  job_ = GatherJob("jgather6", /*seed=*/13, /*serial=*/84);
  FakeDeviceStage* stage = nullptr;
  auto created =
      CreateWithFakeStage(job_, /*host_slots=*/4, /*device_slots=*/4, pool_.get(), &budget_, &stage,
                          /*gathered_field=*/0, [](FakeDeviceStage& s) { s.every_batch = false; });
  ASSERT_TRUE(created.ok()) << created.status();
  auto p = *created;
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1, {"a", "b", "c", "d"}).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  std::vector<ferry::v1::BatchReady> taken;
  for (int64_t i = 0; i < 4; ++i) {
    taken.push_back(std::get<ferry::v1::BatchReady>(*c.Next()));
    ExpectDeviceBatch(*stage, taken.back(), i);
  }
  // Batches 4-7 wait in the host slots for device slots.
  for (const auto& b : taken) ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
  stage->CompleteWatchedUnreported();
  // Batch 0's slot takes batch 4, whose host slot then takes batch 8, while the releases
  // of batches 1-3 are complete but not reported.
  stage->SignalOldestReleased();
  auto b4 = std::get<ferry::v1::BatchReady>(*c.Next());
  ExpectDeviceBatch(*stage, b4, 4);
  stage->SignalReleased();
  ASSERT_TRUE(p->Release(&c, b4.slot(), b4.seq(), /*complete=*/true).ok());
  for (int64_t i = 5; i <= 8; ++i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    ExpectDeviceBatch(*stage, b, i);
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq(), /*complete=*/true).ok());
  }
  EXPECT_EQ(stage->Gathered(Expected(0, 0, 8)), true);
  p->Unbind(&c);
  p->Shutdown(absl::CancelledError("test over"));
  stage->JoinReports();
}

// FakeSource whose sample `gated` blocks in Fill until `gate` is notified: a straggler.
class GatedSource final : public SampleSource {
 public:
  GatedSource(int64_t n, int64_t gated, absl::Notification* gate)
      : inner_(n, {}), gated_(gated), gate_(gate) {}
  int64_t size() const override { return inner_.size(); }
  const std::vector<FieldLayout>& fields() const override { return inner_.fields(); }
  std::unique_ptr<Scratch> NewScratch() const override { return inner_.NewScratch(); }
  absl::Status Fill(int64_t index, uint64_t seed, absl::Span<uint8_t* const> rows,
                    Scratch* scratch) const override {
    if (index == gated_) gate_->WaitForNotification();
    return inner_.Fill(index, seed, rows, scratch);
  }
  std::string Describe(int64_t index) const override { return inner_.Describe(index); }

 private:
  FakeSource inner_;
  const int64_t gated_;
  absl::Notification* const gate_;
};

// A batch still filling does not hold the copies of the filled ones behind it, but they
// leave it a device slot (else they could take all, and it never be copied), and delivery
// stays in order.
TEST_F(PipelineTest, FilledBatchesAreCopiedPastAStragglerThatKeepsADeviceSlot) {
  ferry::v1::JobSpec spec;
  spec.set_batch_size(4);
  spec.set_drop_last(true);
  absl::Notification gate;
  job_ = *Job::Create(JobIdentity{"jgpu3", "gpu3", 1000, 79}, spec,
                      std::make_unique<GatedSource>(64, /*gated=*/0, &gate));  // in batch 0
  FakeDeviceStage* stage = nullptr;
  auto p = *CreateWithFakeStage(job_, /*host_slots=*/4, /*device_slots=*/4, pool_.get(), &budget_,
                                &stage);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1, {"a", "b", "c", "d"}).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  // Batches 1-3 fill on the other worker and take three device slots; their host slots
  // refill (batches 4-6), but the last device slot stays for batch 0.
  auto filled = [&] {
    ferry::v1::RankStatus status;
    p->FillStatus(&status);
    return status.batches_filled();
  };
  for (int i = 0; i < 500 && (stage->copies.load() < 3 || filled() < 6); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(stage->copies.load(), 3);
  EXPECT_EQ(filled(), 6u);     // batches 1-6: the copied ones' host slots were filled again
  EXPECT_EQ(c.pending(), 0u);  // nothing delivered ahead of batch 0
  gate.Notify();
  for (int64_t i = 0; i < 16; ++i) {
    const std::optional<Message> m = c.Next();
    ASSERT_TRUE(m.has_value()) << "batch " << i << " never came";
    const auto* ready = std::get_if<ferry::v1::BatchReady>(&*m);
    ASSERT_NE(ready, nullptr) << "batch " << i;
    const ferry::v1::BatchReady b = *ready;
    EXPECT_EQ(b.batch(), i);
    std::vector<int64_t> got(4);
    memcpy(got.data(), stage->device_[b.slot()].data() + job_->layout().offsets[1], 32);
    EXPECT_EQ(got, Expected(0, 0, i));
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq(), /*complete=*/true).ok());
  }
  EXPECT_EQ(std::get<EpochEndMsg>(*c.Next()).epoch, 0);
  p->Unbind(&c);
  p->Shutdown(absl::CancelledError("test over"));
  stage->JoinReports();
}

// A release marked complete (the trainer's stream was idle: no GPU work can still read
// the slot) frees the device slot at once; nothing waits for a released signal.
TEST_F(PipelineTest, CompleteReleaseFreesTheDeviceSlotWithoutASignal) {
  ferry::v1::JobSpec spec;
  spec.set_batch_size(4);
  spec.set_drop_last(true);
  job_ = *Job::Create(JobIdentity{"jgpu2", "gpu2", 1000, 78}, spec,
                      std::make_unique<FakeSource>(64, absl::flat_hash_set<int64_t>{}));
  FakeDeviceStage* stage = nullptr;
  auto p = *CreateWithFakeStage(job_, /*host_slots=*/2, /*device_slots=*/2, pool_.get(), &budget_,
                                &stage);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1, {"a", "b"}).ok());
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  for (int64_t i = 0; i < 16; ++i) {
    auto b = std::get<ferry::v1::BatchReady>(*c.Next());
    EXPECT_EQ(b.batch(), i);
    std::vector<int64_t> got(4);
    memcpy(got.data(), stage->device_[b.slot()].data() + job_->layout().offsets[1], 32);
    EXPECT_EQ(got, Expected(0, 0, i));
    ASSERT_TRUE(p->Release(&c, b.slot(), b.seq(), /*complete=*/true).ok());
    EXPECT_EQ(stage->watched(), 0u);
  }
  EXPECT_EQ(std::get<EpochEndMsg>(*c.Next()).epoch, 0);
  // A complete release of a slot not leased is refused like any other.
  EXPECT_EQ(p->Release(&c, 0, 99, true).code(), absl::StatusCode::kInvalidArgument);
  ferry::v1::RankStatus status;
  p->FillStatus(&status);
  EXPECT_EQ(status.releases(), 16u);
  EXPECT_EQ(status.releases_complete(), 16u);
  EXPECT_GE(status.batches_filled(), 16u);
  EXPECT_GT(status.lease_seconds(), 0.0);
  EXPECT_GT(status.device_slot_idle_seconds(), 0.0);
  p->Unbind(&c);
  p->Shutdown(absl::CancelledError("test over"));
  stage->JoinReports();
}

TEST_F(PipelineTest, BadRequestsAreRefused) {
  auto p = Make(40, 4, 1, 0, 2, true);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  EXPECT_EQ(p->StartEpoch(&c, -1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p->StartEpoch(&c, 0, 11).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(p->StartEpoch(&c, 0, 0).ok());
  auto b = std::get<ferry::v1::BatchReady>(*c.Next());
  EXPECT_EQ(p->Release(&c, b.slot(), b.seq() + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p->Release(&c, 99, 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(p->Release(&c, b.slot(), b.seq()).ok());
  EXPECT_EQ(p->Release(&c, b.slot(), b.seq()).code(), absl::StatusCode::kInvalidArgument);
  p->Unbind(&c);
}

TEST_F(PipelineTest, SlabCountsAgainstTheBudget) {
  MemoryBudget tiny("host memory budget", "host_memory_budget_bytes", 4096,
                    "/etc/ferry/ferryd.conf");
  ferry::v1::JobSpec spec;
  spec.set_batch_size(1000);
  auto job = *Job::Create(JobIdentity{"jbig", "big", 1000, 99}, spec,
                          std::make_unique<FakeSource>(5000, absl::flat_hash_set<int64_t>{}));
  auto p = RankPipeline::Create(job, 0, 4, -1, pool_.get(), &tiny, HostRingOf(*job, 4));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(p.status().message(), HasSubstr("host_memory_budget_bytes"));
  EXPECT_THAT(p.status().message(), HasSubstr("needs 65536 bytes"));
}

// ---- Stall attribution: fakes that make each stage the slow one, and the limiting stage
// the rank's status names. Only the stage is asserted, never a timing.

// FakeSource's samples, each taking `cost` of reading (sleeping, counted as a dataset read
// as RealFile::ReadAt counts one) or of decoding (spinning the CPU, no read).
class SlowSource final : public SampleSource {
 public:
  enum class Slow { kRead, kRemoteRead, kDecode };
  SlowSource(int64_t n, Slow slow, absl::Duration cost) : n_(n), slow_(slow), cost_(cost) {
    fields_.push_back(FieldLayout{"value", ferry::v1::INT64, {}, 8});
    fields_.push_back(FieldLayout{"index", ferry::v1::INT64, {}, 8});
  }
  int64_t size() const override { return n_; }
  const std::vector<FieldLayout>& fields() const override { return fields_; }
  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Scratch>(); }
  absl::Status Fill(int64_t index, uint64_t, absl::Span<uint8_t* const> rows,
                    Scratch*) const override {
    const absl::Time start = absl::Now();
    if (slow_ == Slow::kRead) {
      absl::SleepFor(cost_);
      TallyRead(4096, absl::ToInt64Nanoseconds(absl::Now() - start));
    } else if (slow_ == Slow::kRemoteRead) {  // an object comes into the cache, then is read
      absl::SleepFor(cost_);
      TallyRemoteWait(absl::ToInt64Nanoseconds(absl::Now() - start));
      TallyRead(4096, 1000);
    } else {
      volatile uint64_t x = 0;
      while (absl::Now() - start < cost_) x = x + 1;
    }
    const int64_t value = index * 10;
    if (rows[0] != nullptr) memcpy(rows[0], &value, 8);
    memcpy(rows[1], &index, 8);
    return absl::OkStatus();
  }
  std::string Describe(int64_t index) const override { return "slow/" + std::to_string(index); }

 private:
  const int64_t n_;
  const Slow slow_;
  const absl::Duration cost_;
  std::vector<FieldLayout> fields_;
};

class StallTest : public PipelineTest {
 protected:
  std::shared_ptr<Job> StallJob(std::unique_ptr<SampleSource> source) {
    ferry::v1::JobSpec spec;
    spec.set_batch_size(4);
    spec.set_seed(5);
    return *Job::Create(JobIdentity{"jstall", "stall", 1000, next_serial_++}, spec,
                        std::move(source));
  }

  // Consumes batches for a little over kMinObservedSeconds (epoch after epoch), holding
  // each for `hold`, releasing it with the time Next blocked when `report`, and returns
  // the rank's status taken while still bound. Times are of `clock` when given (the job's:
  // holding a batch then advances it), else real.
  ferry::v1::RankStatus Consume(RankPipeline& p, absl::Duration hold, bool report,
                                bool complete = false, int device_slots = 0,
                                FakeClock* clock = nullptr) {
    const Clock& time = clock != nullptr ? static_cast<const Clock&>(*clock) : Clock::Real();
    RecordingConsumer c;
    EXPECT_TRUE(p.Bind(&c, 1, std::vector<std::string>(device_slots, "event")).ok());
    int64_t epoch = 0;
    EXPECT_TRUE(p.StartEpoch(&c, epoch, 0).ok());
    const absl::Time until = time.Now() + absl::Seconds(kMinObservedSeconds) * 1.5;
    while (time.Now() < until) {
      const absl::Time asked = time.Now();
      std::optional<Message> m = c.Next();
      if (!m.has_value()) {
        ADD_FAILURE() << "no batch within 10 s";
        break;
      }
      const absl::Duration waited = time.Now() - asked;
      if (std::holds_alternative<EpochEndMsg>(*m)) {
        EXPECT_TRUE(p.StartEpoch(&c, ++epoch, 0).ok());
        continue;
      }
      const auto& b = std::get<ferry::v1::BatchReady>(*m);
      if (clock != nullptr) {
        clock->Advance(hold);
      } else {
        absl::SleepFor(hold);
      }
      EXPECT_TRUE(
          p.Release(&c, b.slot(), b.seq(), complete, report ? std::optional(waited) : std::nullopt)
              .ok());
    }
    ferry::v1::RankStatus status;
    p.FillStatus(&status);
    p.Unbind(&c);
    return status;
  }
};

TEST_F(StallTest, ReadsWaitingForARemoteStoreAreNamedRemoteRead) {
  std::shared_ptr<Job> job = StallJob(
      std::make_unique<SlowSource>(64, SlowSource::Slow::kRemoteRead, absl::Milliseconds(5)));
  auto p = *RankPipeline::Create(job, 0, 2, -1, pool_.get(), &budget_, HostRingOf(*job, 2));
  const ferry::v1::RankStatus s = Consume(*p, absl::ZeroDuration(), /*report=*/true);
  EXPECT_EQ(s.limiting_stage(), ferry::v1::LIMITED_BY_REMOTE_READ) << s.limiting_stage_note();
  EXPECT_THAT(s.limiting_stage_note(), HasSubstr("waited for the remote store"));
}

TEST_F(StallTest, SlowReadsAreNamedRead) {
  std::shared_ptr<Job> job =
      StallJob(std::make_unique<SlowSource>(64, SlowSource::Slow::kRead, absl::Milliseconds(5)));
  auto p = *RankPipeline::Create(job, 0, 2, -1, pool_.get(), &budget_, HostRingOf(*job, 2));
  const ferry::v1::RankStatus s = Consume(*p, absl::ZeroDuration(), /*report=*/true);
  EXPECT_EQ(s.limiting_stage(), ferry::v1::LIMITED_BY_READ) << s.limiting_stage_note();
  EXPECT_THAT(s.limiting_stage_note(), HasSubstr("(as it measured)"));
  EXPECT_GE(s.stall_ratio(), kStalledRatio);
  EXPECT_GE(s.stall_window_seconds(), kMinObservedSeconds);
  EXPECT_GT(s.handoff_latency().count(), 0u);
  EXPECT_EQ(s.handoff_latency().counts_size(), s.handoff_latency().bounds_size() + 1);
  EXPECT_EQ(s.copy_latency().count(), 0u);  // the host transport copies nothing
  EXPECT_GT(job->samples_decoded(), 0);
  EXPECT_EQ(job->bytes_read(), 4096u * static_cast<uint64_t>(job->samples_decoded()));
}

TEST_F(StallTest, SaturatedWorkersNotReadingAreNamedDecode) {
  std::shared_ptr<Job> job =
      StallJob(std::make_unique<SlowSource>(64, SlowSource::Slow::kDecode, absl::Milliseconds(5)));
  auto p = *RankPipeline::Create(job, 0, 2, -1, pool_.get(), &budget_, HostRingOf(*job, 2));
  const ferry::v1::RankStatus s = Consume(*p, absl::ZeroDuration(), /*report=*/false);
  EXPECT_EQ(s.limiting_stage(), ferry::v1::LIMITED_BY_DECODE) << s.limiting_stage_note();
  EXPECT_THAT(s.limiting_stage_note(), HasSubstr("(ferryd's estimate)"));
  EXPECT_GE(s.stall_ratio(), kStalledRatio);
  EXPECT_EQ(job->bytes_read(), 0u);
  EXPECT_GT(pool_->busy_fraction(), 0.0);
}

TEST_F(StallTest, BatchesWaitingForLateCopiesAreNamedCopy) {
  std::shared_ptr<Job> job =
      StallJob(std::make_unique<FakeSource>(64, absl::flat_hash_set<int64_t>{}));
  FakeDeviceStage* stage = nullptr;
  auto p =
      *CreateWithFakeStage(job, 4, 2, pool_.get(), &budget_, &stage, -1,
                           [](FakeDeviceStage& s) { s.report_delay = absl::Milliseconds(20); });
  const ferry::v1::RankStatus s =
      Consume(*p, absl::ZeroDuration(), /*report=*/true, /*complete=*/true, /*device_slots=*/2);
  EXPECT_EQ(s.limiting_stage(), ferry::v1::LIMITED_BY_COPY) << s.limiting_stage_note();
  EXPECT_GE(s.stall_ratio(), kStalledRatio);
  EXPECT_GT(s.copy_latency().count(), 0u);
  p->Shutdown(absl::CancelledError("test over"));
  stage->JoinReports();
}

TEST_F(StallTest, ATrainerHoldingBatchesWhileFerryIsAheadIsNamedTrainer) {
  std::shared_ptr<Job> job =
      StallJob(std::make_unique<FakeSource>(64, absl::flat_hash_set<int64_t>{}));
  auto p = *RankPipeline::Create(job, 0, 3, -1, pool_.get(), &budget_, HostRingOf(*job, 3));
  const ferry::v1::RankStatus s = Consume(*p, absl::Milliseconds(20), /*report=*/false);
  EXPECT_EQ(s.limiting_stage(), ferry::v1::LIMITED_BY_TRAINER) << s.limiting_stage_note();
  EXPECT_LT(s.stall_ratio(), kStalledRatio);
}

TEST_F(StallTest, OnTheJobsClockATrainerThatNeverWaitsHasNoStallWhateverTheLoad) {
  // The pipeline reads the job's clock only: a trainer that holds each batch 20 ms of it
  // and, on it, never waits for one, stalled for exactly none of the window, however long
  // the workers took in real time.
  std::shared_ptr<Job> job =
      StallJob(std::make_unique<FakeSource>(64, absl::flat_hash_set<int64_t>{}));
  job->set_clock(&clock_);
  auto p = *RankPipeline::Create(job, 0, 3, -1, pool_.get(), &budget_, HostRingOf(*job, 3));
  const ferry::v1::RankStatus s = Consume(*p, absl::Milliseconds(20), /*report=*/true,
                                          /*complete=*/false, /*device_slots=*/0, &clock_);
  EXPECT_EQ(s.limiting_stage(), ferry::v1::LIMITED_BY_TRAINER) << s.limiting_stage_note();
  EXPECT_EQ(s.stall_ratio(), 0);
  EXPECT_GE(s.stall_window_seconds(), kMinObservedSeconds);
  EXPECT_GT(s.batches_per_second(), 0);
}

TEST_F(StallTest, NoConsumerOrTooLittleObservedIsUnspecified) {
  std::shared_ptr<Job> job =
      StallJob(std::make_unique<FakeSource>(64, absl::flat_hash_set<int64_t>{}));
  auto p = *RankPipeline::Create(job, 0, 2, -1, pool_.get(), &budget_, HostRingOf(*job, 2));
  ferry::v1::RankStatus s;
  p->FillStatus(&s);
  EXPECT_EQ(s.limiting_stage(), ferry::v1::LIMITING_STAGE_UNSPECIFIED);
  EXPECT_EQ(s.limiting_stage_note(), "no consumer attached");
  EXPECT_EQ(s.stall_ratio(), 0);
  RecordingConsumer c;
  ASSERT_TRUE(p->Bind(&c, 1).ok());
  s.Clear();
  p->FillStatus(&s);
  EXPECT_EQ(s.limiting_stage(), ferry::v1::LIMITING_STAGE_UNSPECIFIED);
  EXPECT_THAT(s.limiting_stage_note(), HasSubstr("observed for"));
  p->Unbind(&c);
}

TEST(SampleErrorReasonTest, StatusCodesMapToAFewReasons) {
  EXPECT_EQ(SampleErrorReason(absl::DataLossError("bad")), "corrupt");
  EXPECT_EQ(SampleErrorReason(absl::InvalidArgumentError("cannot decode JPEG")), "corrupt");
  EXPECT_EQ(SampleErrorReason(absl::InvalidArgumentError(
                "refused: 9 bytes, over decode_limits.max_sample_bytes (8)")),
            "too_large");
  EXPECT_EQ(SampleErrorReason(absl::NotFoundError("gone")), "missing");
  EXPECT_EQ(SampleErrorReason(absl::PermissionDeniedError("no")), "unreadable");
  EXPECT_EQ(SampleErrorReason(absl::InternalError("?")), "other");
}

}  // namespace
}  // namespace ferry
