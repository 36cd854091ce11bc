// PinnedMappings over a fake registrar: one registration and one reservation per mapping,
// the budget, registrations slower than the caller waits, failures, and unregistering when
// the last Lease goes. No CUDA call is made.
#include "server/gpu/pinned_mappings.h"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

// Registers nothing: hands out ranges that count their destruction, after an optional gate,
// or fails with the status it was told to.
class FakeRegistrar {
 public:
  class Range final : public PinnedRange {
   public:
    Range(FakeRegistrar* owner, void* data) : owner_(owner), data_(data) {}
    ~Range() override { owner_->unregistered_.fetch_add(1); }
    absl::StatusOr<const void*> DeviceData(int device) const override {
      return static_cast<const void*>(static_cast<const uint8_t*>(data_) + device);
    }

   private:
    FakeRegistrar* const owner_;
    void* const data_;
  };

  PinnedRangeRegistrar registrar() {
    return [this](void* data, size_t bytes,
                  int device) -> absl::StatusOr<std::unique_ptr<PinnedRange>> {
      absl::MutexLock lock(&mutex_);
      calls_.push_back({data, bytes, device, std::this_thread::get_id()});
      mutex_.Await(absl::Condition(&open_));
      if (!fail_with_.ok()) return fail_with_;
      return std::make_unique<Range>(this, data);
    };
  }

  void Close() {
    absl::MutexLock lock(&mutex_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mutex_);
    open_ = true;
  }
  void FailWith(absl::Status status) {
    absl::MutexLock lock(&mutex_);
    fail_with_ = std::move(status);
  }

  struct Call {
    void* data;
    size_t bytes;
    int device;
    std::thread::id thread;
  };
  std::vector<Call> calls() const {
    absl::MutexLock lock(&mutex_);
    return calls_;
  }
  int unregistered() const { return unregistered_.load(); }

 private:
  mutable absl::Mutex mutex_;
  bool open_ ABSL_GUARDED_BY(mutex_) = true;
  absl::Status fail_with_ ABSL_GUARDED_BY(mutex_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mutex_);
  std::atomic<int> unregistered_{0};
};

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// A file mapping of `bytes` bytes (the registrar never touches it).
struct FakeFile {
  explicit FakeFile(size_t bytes, std::string path = "/data/train.bin")
      : data(bytes),
        rows{.field = 0,
             .index_field = 1,
             .records = data.data() + 64,
             .num_records = 10,
             .row_bytes = 16,
             .mapping = data.data(),
             .mapping_bytes = bytes,
             .path = std::move(path)} {}
  std::vector<uint8_t> data;
  DirectRows rows;
};

MemoryBudget PinnedBudget(uint64_t limit) {
  return MemoryBudget("pinned memory budget", "pinned_memory_budget_bytes", limit,
                      "/etc/ferry/ferryd.conf");
}

using Lease = PinnedMappings::Lease;

std::unique_ptr<Lease> MustAcquire(PinnedMappings& mappings, const DirectRows& rows,
                                   absl::Duration wait = absl::Seconds(10), int device = 0) {
  absl::StatusOr<Lease> lease = mappings.Acquire(rows, device, wait);
  EXPECT_TRUE(lease.ok()) << lease.status();
  if (!lease.ok()) return nullptr;
  return std::make_unique<Lease>(*std::move(lease));
}

// Waits up to 10 s for the lease's registration to be done.
bool WaitDone(const Lease& lease) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::IsUnavailable(lease.registration().status())) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(PinnedMappingsTest, LeasesOfOneMappingRegisterOnceAndReserveOnce) {
  MemoryBudget budget = PinnedBudget(64 * kPage);
  FakeRegistrar fake;
  PinnedMappings mappings(&budget, fake.registrar());
  FakeFile file(2 * kPage + 100);  // registered as whole pages

  std::unique_ptr<Lease> a = MustAcquire(mappings, file.rows, absl::Seconds(10), /*device=*/1);
  std::unique_ptr<Lease> b = MustAcquire(mappings, file.rows, absl::Seconds(10), /*device=*/1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);

  ASSERT_EQ(fake.calls().size(), 1u);
  const FakeRegistrar::Call call = fake.calls()[0];
  EXPECT_EQ(call.data, file.data.data());
  EXPECT_EQ(call.bytes, 3 * kPage);
  EXPECT_EQ(call.device, 1);
  EXPECT_NE(call.thread, std::this_thread::get_id());  // a thread of its own
  EXPECT_EQ(budget.in_use(), 3 * kPage);
  EXPECT_EQ(a->bytes(), 3 * kPage);
  EXPECT_EQ(b->bytes(), 3 * kPage);

  absl::StatusOr<const PinnedRange*> range_a = a->registration();
  absl::StatusOr<const PinnedRange*> range_b = b->registration();
  ASSERT_TRUE(range_a.ok()) << range_a.status();
  ASSERT_TRUE(range_b.ok()) << range_b.status();
  EXPECT_EQ(*range_a, *range_b);
  absl::StatusOr<const void*> device_data = (*range_a)->DeviceData(1);
  ASSERT_TRUE(device_data.ok());
  EXPECT_EQ(*device_data, file.data.data() + 1);

  // Another file is another registration.
  FakeFile other(kPage, "/data/val.bin");
  std::unique_ptr<Lease> c = MustAcquire(mappings, other.rows);
  EXPECT_EQ(fake.calls().size(), 2u);
  EXPECT_EQ(budget.in_use(), 4 * kPage);
}

TEST(PinnedMappingsTest, BudgetExhaustedFailsAtOnceNamingTheFile) {
  MemoryBudget budget = PinnedBudget(2 * kPage);
  FakeRegistrar fake;
  PinnedMappings mappings(&budget, fake.registrar());
  FakeFile file(3 * kPage);

  absl::StatusOr<Lease> lease = mappings.Acquire(file.rows, 0, absl::Seconds(10));
  ASSERT_EQ(lease.status().code(), absl::StatusCode::kResourceExhausted) << lease.status();
  EXPECT_THAT(lease.status().message(), HasSubstr("the pinned page cache of '/data/train.bin'"));
  EXPECT_THAT(lease.status().message(), HasSubstr("pinned_memory_budget_bytes"));
  EXPECT_TRUE(fake.calls().empty());
  EXPECT_EQ(budget.in_use(), 0u);

  // Nothing was left behind: a mapping that fits is registered.
  FakeFile small(kPage, "/data/small.bin");
  std::unique_ptr<Lease> ok = MustAcquire(mappings, small.rows);
  ASSERT_NE(ok, nullptr);
  EXPECT_TRUE(ok->registration().ok());
  EXPECT_EQ(fake.calls().size(), 1u);
}

TEST(PinnedMappingsTest, RegistrationSlowerThanTheWaitIsUnavailableUntilDone) {
  MemoryBudget budget = PinnedBudget(64 * kPage);
  FakeRegistrar fake;
  PinnedMappings mappings(&budget, fake.registrar());
  FakeFile file(4 * kPage);
  fake.Close();

  const absl::Time start = absl::Now();
  std::unique_ptr<Lease> lease = MustAcquire(mappings, file.rows, absl::Milliseconds(30));
  const absl::Duration waited = absl::Now() - start;
  ASSERT_NE(lease, nullptr);
  EXPECT_GE(waited, absl::Milliseconds(30));
  EXPECT_LT(waited, absl::Seconds(5));
  absl::StatusOr<const PinnedRange*> range = lease->registration();
  EXPECT_EQ(range.status().code(), absl::StatusCode::kUnavailable) << range.status();
  EXPECT_EQ(lease->bytes(), 4 * kPage);  // reserved meanwhile
  EXPECT_EQ(budget.in_use(), 4 * kPage);

  // A second rank arriving meanwhile waits on the same registration.
  std::unique_ptr<Lease> second = MustAcquire(mappings, file.rows, absl::ZeroDuration());
  EXPECT_TRUE(absl::IsUnavailable(second->registration().status()));

  fake.Open();
  ASSERT_TRUE(WaitDone(*lease));
  EXPECT_TRUE(lease->registration().ok()) << lease->registration().status();
  EXPECT_TRUE(second->registration().ok()) << second->registration().status();
  EXPECT_EQ(fake.calls().size(), 1u);
  EXPECT_EQ(budget.in_use(), 4 * kPage);
}

TEST(PinnedMappingsTest, FailedRegistrationReturnsTheBudgetAndReportsWhy) {
  MemoryBudget budget = PinnedBudget(64 * kPage);
  FakeRegistrar fake;
  PinnedMappings mappings(&budget, fake.registrar());
  FakeFile file(4 * kPage);
  fake.FailWith(absl::AlreadyExistsError(
      "cudaHostRegister(read-only): cudaErrorHostMemoryAlreadyRegistered"));

  std::unique_ptr<Lease> lease = MustAcquire(mappings, file.rows);
  ASSERT_NE(lease, nullptr);
  ASSERT_TRUE(WaitDone(*lease));
  absl::StatusOr<const PinnedRange*> range = lease->registration();
  EXPECT_EQ(range.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(range.status().message(), HasSubstr("cudaErrorHostMemoryAlreadyRegistered"));
  EXPECT_EQ(lease->bytes(), 0u);
  EXPECT_EQ(budget.in_use(), 0u);
  EXPECT_EQ(fake.unregistered(), 0);
}

TEST(PinnedMappingsTest, LastLeaseUnregistersAndANewAcquireRegistersAgain) {
  MemoryBudget budget = PinnedBudget(64 * kPage);
  FakeRegistrar fake;
  PinnedMappings mappings(&budget, fake.registrar());
  FakeFile file(2 * kPage);

  std::unique_ptr<Lease> a = MustAcquire(mappings, file.rows);
  std::unique_ptr<Lease> b = MustAcquire(mappings, file.rows);
  ASSERT_TRUE(a->registration().ok());
  a.reset();
  EXPECT_EQ(fake.unregistered(), 0);  // b still reads it
  EXPECT_EQ(budget.in_use(), 2 * kPage);
  EXPECT_TRUE(b->registration().ok());
  b.reset();
  EXPECT_EQ(fake.unregistered(), 1);
  EXPECT_EQ(budget.in_use(), 0u);

  std::unique_ptr<Lease> c = MustAcquire(mappings, file.rows);
  EXPECT_EQ(fake.calls().size(), 2u);
  EXPECT_TRUE(c->registration().ok());
  EXPECT_EQ(budget.in_use(), 2 * kPage);
  c.reset();
  EXPECT_EQ(fake.unregistered(), 2);
}

TEST(PinnedMappingsTest, LastLeaseGoingWhileRegisteringWaitsForTheRegistration) {
  MemoryBudget budget = PinnedBudget(64 * kPage);
  FakeRegistrar fake;
  PinnedMappings mappings(&budget, fake.registrar());
  FakeFile file(2 * kPage);
  fake.Close();

  std::unique_ptr<Lease> lease = MustAcquire(mappings, file.rows, absl::ZeroDuration());
  ASSERT_TRUE(absl::IsUnavailable(lease->registration().status()));
  std::thread opener([&fake] {
    absl::SleepFor(absl::Milliseconds(50));
    fake.Open();
  });
  const absl::Time start = absl::Now();
  lease.reset();  // joins the registering thread, then unregisters what it registered
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(40));
  opener.join();
  EXPECT_EQ(fake.unregistered(), 1);
  EXPECT_EQ(budget.in_use(), 0u);
}

// The last Lease of a mapping that is still registering waits for the registration, then
// unregisters it: that holds up no other mapping's Acquire, and an Acquire of the same
// mapping registers it again once the old registration is gone.
TEST(PinnedMappingsTest, ALastLeaseUnregisteringHoldsUpOnlyItsOwnMapping) {
  MemoryBudget budget = PinnedBudget(64 * kPage);
  FakeRegistrar fake;
  PinnedMappings mappings(&budget, fake.registrar());
  FakeFile first(2 * kPage, "/data/a.bin");
  FakeFile second(2 * kPage, "/data/b.bin");
  fake.Close();
  std::unique_ptr<Lease> lease = MustAcquire(mappings, first.rows, absl::ZeroDuration());
  absl::Notification released;
  std::thread releaser([&] {
    lease.reset();  // joins the registering thread, held by the closed registrar
    released.Notify();
  });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_FALSE(released.HasBeenNotified());
  absl::Notification other_acquired, again_acquired;
  std::unique_ptr<Lease> other, again;
  std::thread other_thread([&] {
    other = MustAcquire(mappings, second.rows, absl::ZeroDuration());
    other_acquired.Notify();
  });
  const bool other_went_on = other_acquired.WaitForNotificationWithTimeout(absl::Seconds(10));
  std::thread again_thread([&] {
    again = MustAcquire(mappings, first.rows, absl::ZeroDuration());
    again_acquired.Notify();
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(again_acquired.HasBeenNotified()) << "acquired while the old one was going";
  fake.Open();
  releaser.join();
  other_thread.join();
  again_thread.join();
  EXPECT_TRUE(other_went_on) << "another mapping's Acquire waited for the unregistering";
  EXPECT_EQ(fake.unregistered(), 1);
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(WaitDone(*again));
  EXPECT_TRUE(again->registration().ok());
  EXPECT_EQ(fake.calls().size(), 3u);  // first, second, first again
  other.reset();
  again.reset();
  EXPECT_EQ(fake.unregistered(), 3);
  EXPECT_EQ(budget.in_use(), 0u);
}

}  // namespace
}  // namespace ferry
