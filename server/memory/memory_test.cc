#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/memory/memory_budget.h"
#include "server/memory/shared_slab.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

TEST(SharedSlabTest, SecondMappingOfTheFdSeesWrites) {
  auto slab = SharedSlab::Create("test", 10000, -1);
  ASSERT_TRUE(slab.ok()) << slab.status();
  EXPECT_EQ(slab->size() % sysconf(_SC_PAGESIZE), 0u);
  EXPECT_GE(slab->size(), 10000u);
  slab->data()[123] = 42;
  void* view = mmap(nullptr, slab->size(), PROT_READ, MAP_SHARED, slab->fd(), 0);
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_EQ(static_cast<uint8_t*>(view)[123], 42);
  munmap(view, slab->size());
}

// The trainer holds the fd: it must not be able to resize the file under ferryd's mapping,
// nor (kernel 5.1+) write into the slab ferryd fills.
TEST(SharedSlabTest, TheFdCannotResizeOrWriteTheSlab) {
  auto slab = SharedSlab::Create("test", 8192, -1);
  ASSERT_TRUE(slab.ok()) << slab.status();
  EXPECT_NE(ftruncate(slab->fd(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(slab->fd(), 1 << 20), 0);
  slab->data()[0] = 7;  // ferryd's own mapping stays writable
  const int seals = fcntl(slab->fd(), F_GET_SEALS);
  ASSERT_GE(seals, 0);
  EXPECT_TRUE(seals & F_SEAL_SEAL) << "nobody may lift the seals";
#ifdef F_SEAL_FUTURE_WRITE
  if (seals & F_SEAL_FUTURE_WRITE) {
    EXPECT_EQ(mmap(nullptr, slab->size(), PROT_READ | PROT_WRITE, MAP_SHARED, slab->fd(), 0),
              MAP_FAILED);
  }
#endif
}

TEST(SharedSlabTest, MoveKeepsOneOwner) {
  auto slab = SharedSlab::Create("test", 4096, -1);
  ASSERT_TRUE(slab.ok());
  uint8_t* data = slab->data();
  SharedSlab moved = std::move(*slab);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(slab->data(), nullptr);
  EXPECT_EQ(slab->fd(), -1);
}

TEST(SharedSlabTest, ZeroBytesIsAnError) {
  EXPECT_EQ(SharedSlab::Create("test", 0, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemoryBudgetTest, ReservationsAddUpAndComeBack) {
  MemoryBudget budget("host memory budget", "host_memory_budget_bytes", 1000, "/etc/x.conf");
  {
    auto a = budget.Reserve(600, "job a");
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(budget.in_use(), 600u);
    auto b = budget.Reserve(500, "job b rank 0");
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(b.status().message(), HasSubstr("job b rank 0 needs 500 bytes"));
    EXPECT_THAT(b.status().message(), HasSubstr("400 of 1000 bytes free"));
    EXPECT_THAT(b.status().message(), HasSubstr("host_memory_budget_bytes in /etc/x.conf"));
    auto c = budget.Reserve(400, "job c");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(budget.in_use(), 1000u);
  }
  EXPECT_EQ(budget.in_use(), 0u);
}

TEST(MemoryBudgetTest, HugeRequestDoesNotOverflow) {
  MemoryBudget budget("b", "s", 1000, "c");
  auto a = budget.Reserve(10, "x");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(budget.Reserve(UINT64_MAX - 5, "y").ok());
}

}  // namespace
}  // namespace ferry
