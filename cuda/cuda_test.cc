// GPU tests of ferry_cuda (CTest label `gpu`): the resource owners, CUDA IPC between two
// processes, and error statuses. Each test skips with the reason when the machine has no
// usable GPU. ferryd's kernels are tested in server/kernels/kernels_test.cc.
//
// The IPC test re-executes this binary as its consumer process (FERRY_CUDA_IPC_CHILD in
// the environment; see main() at the bottom): a process that has initialised CUDA cannot
// use it in a fork()ed child, and the gtest process has initialised it long before.
#include <cuda_runtime_api.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cuda/cuda_resources.h"
#include "cuda/gpu_test_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override { FERRY_SKIP_WITHOUT_GPU(); }
};

// ------------------------------------------------------------------------------ owners

TEST_F(CudaTest, DeviceInfo) {
  const int count = ValueOrDie(DeviceCount());
  for (int d = 0; d < count; ++d) {
    const DeviceInfo info = ValueOrDie(GetDeviceInfo(d));
    std::cout << "device " << d << ": " << info.name << ", " << info.pci_bus_id << ", "
              << info.total_memory / (1 << 20) << " MiB, sm_" << info.compute_capability << ", "
              << info.multiprocessor_count << " SMs\n";
    EXPECT_EQ(info.index, d);
    EXPECT_FALSE(info.name.empty());
    EXPECT_THAT(info.pci_bus_id,
                ::testing::MatchesRegex("[0-9a-f]+:[0-9a-f]+:[0-9a-f]+\\.[0-9a-f]"));
    EXPECT_GT(info.total_memory, 0u);
    EXPECT_GT(info.multiprocessor_count, 0);
  }
  const absl::StatusOr<DeviceInfo> missing = GetDeviceInfo(count);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr(absl::StrCat("CUDA device ", count)));
}

TEST_F(CudaTest, OwnersMoveAndCopy) {
  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  CUstream_st* raw = stream.get();
  CudaStream moved(std::move(stream));
  EXPECT_EQ(stream.get(), nullptr);  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_EQ(moved.get(), raw);
  CudaStream other = ValueOrDie(CudaStream::Create(0));
  other = std::move(moved);  // destroys other's stream
  EXPECT_EQ(other.get(), raw);

  const size_t n = 3 << 20;
  DeviceBuffer a = ValueOrDie(DeviceBuffer::Create(0, n));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 256, 0u);
  DeviceBuffer b = ValueOrDie(DeviceBuffer::Create(0, 16));
  b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(b.size(), n);

  // Host -> device -> host through a registered (pinned) range of an mmap'ed region, as
  // the job's slab will be.
  void* region = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  uint8_t* bytes = static_cast<uint8_t*>(region);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i * 31 + 7);
  {
    HostRegistration pinned = ValueOrDie(HostRegistration::Create(0, region, n));
    const absl::StatusOr<HostRegistration> again = HostRegistration::Create(0, region, n);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
    HostRegistration moved_pin(std::move(pinned));
    EXPECT_EQ(moved_pin.data(), region);

    CudaEvent start = ValueOrDie(CudaEvent::Create(0, CudaEvent::kTiming));
    CudaEvent done = ValueOrDie(CudaEvent::Create(0, CudaEvent::kTiming));
    ASSERT_OK(other.Record(start));
    ASSERT_OK(other.CopyAsync(b.data(), region, n));
    std::vector<uint8_t> back(n, 0);
    ASSERT_OK(other.CopyAsync(back.data(), b.data(), n));  // pageable: returns when done
    ASSERT_OK(other.Record(done));
    ASSERT_OK(done.Synchronize());
    EXPECT_TRUE(ValueOrDie(done.IsComplete()));
    EXPECT_GE(ValueOrDie(ElapsedMillis(start, done)), 0.0f);
    EXPECT_TRUE(std::memcmp(back.data(), region, n) == 0);
  }
  munmap(region, n);

  CudaEvent sync = ValueOrDie(CudaEvent::Create(0, CudaEvent::kSync));
  EXPECT_EQ(sync.IpcHandle().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ElapsedMillis(sync, sync).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ValueOrDie(sync.IsComplete()));  // never recorded
  CudaEvent moved_event(std::move(sync));
  EXPECT_EQ(sync.get(), nullptr);  // NOLINT(bugprone-use-after-move)
  ASSERT_OK(other.Record(moved_event));
  ASSERT_OK(other.Wait(moved_event));
  ASSERT_OK(other.Synchronize());
}

TEST_F(CudaTest, OutOfMemoryIsResourceExhaustedAndLeavesNoStaleError) {
  const absl::StatusOr<DeviceBuffer> huge = DeviceBuffer::Create(0, size_t{1} << 50);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(huge.status().message(), HasSubstr("cudaMalloc"));
  EXPECT_THAT(huge.status().message(), HasSubstr("cudaErrorMemoryAllocation"));
  EXPECT_THAT(huge.status().message(), HasSubstr("1125899906842624 bytes on device 0"));
  // The failed call must not be reported again by the next check of the runtime's last
  // error (every kernel launch makes one; server/kernels/kernels_test launches one).
  ASSERT_CUDA(cudaPeekAtLastError());
  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  DeviceBuffer buf = ValueOrDie(DeviceBuffer::Create(0, 1024));
  ASSERT_OK(stream.CopyAsync(static_cast<uint8_t*>(buf.data()) + 512, buf.data(), 512));
  ASSERT_OK(stream.Synchronize());
  ASSERT_CUDA(cudaPeekAtLastError());
}

TEST_F(CudaTest, IpcHandlesOfThisProcessAreRejected) {
  DeviceBuffer buf = ValueOrDie(DeviceBuffer::Create(0, 1 << 20));
  const MemIpcHandle handle = ValueOrDie(buf.IpcHandle());
  const absl::StatusOr<DeviceBuffer> same = DeviceBuffer::OpenIpc(0, handle, 1 << 20);
  ASSERT_FALSE(same.ok());
  EXPECT_THAT(same.status().message(), HasSubstr("cudaIpcOpenMemHandle"));
}

// ----------------------------------------------------------------------------------- IPC

constexpr size_t kIpcBytes = 4 << 20;
constexpr char kIpcChildEnv[] = "FERRY_CUDA_IPC_CHILD";

uint8_t Pattern(int which, size_t i) { return static_cast<uint8_t>(i * (2 * which + 5) + which); }

void SleepOnStream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms)));
}

// The consumer: what a trainer does with a slot. Opens the buffer and both events, waits
// for the producer's "ready" record, checks the producer's data, writes its own, records
// "released". Returns the exit status; explains failures on stderr.
int RunIpcChild(const char* spec) {
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts.size() != 5) return 10;
  MemIpcHandle mem;
  EventIpcHandle ready_handle, released_handle;
  const std::string m = absl::HexStringToBytes(parts[0]), r = absl::HexStringToBytes(parts[1]),
                    l = absl::HexStringToBytes(parts[2]);
  if (m.size() != 64 || r.size() != 64 || l.size() != 64) return 11;
  std::memcpy(mem.bytes.data(), m.data(), 64);
  std::memcpy(ready_handle.bytes.data(), r.data(), 64);
  std::memcpy(released_handle.bytes.data(), l.data(), 64);
  const int from_parent = std::atoi(parts[3].c_str()), to_parent = std::atoi(parts[4].c_str());
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "ipc child: %s\n", s.ToString().c_str());
    return 12;
  };
  absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::OpenIpc(0, mem, kIpcBytes);
  if (!buf.ok()) return fail(buf.status());
  absl::StatusOr<CudaEvent> ready = CudaEvent::OpenIpc(0, ready_handle);
  if (!ready.ok()) return fail(ready.status());
  absl::StatusOr<CudaEvent> released = CudaEvent::OpenIpc(0, released_handle);
  if (!released.ok()) return fail(released.status());
  absl::StatusOr<CudaStream> stream = CudaStream::Create(0);
  if (!stream.ok()) return fail(stream.status());
  char go = 0;
  if (read(from_parent, &go, 1) != 1) return 13;  // the producer has recorded "ready"
  std::vector<uint8_t> host(kIpcBytes);
  absl::Status s = stream->Wait(*ready);
  if (s.ok()) s = stream->CopyAsync(host.data(), buf->data(), kIpcBytes);
  if (s.ok()) s = stream->Synchronize();
  if (!s.ok()) return fail(s);
  for (size_t i = 0; i < kIpcBytes; ++i) {
    if (host[i] != Pattern(1, i)) {
      std::fprintf(stderr, "ipc child: byte %zu is %d, want %d (pattern %s)\n", i, host[i],
                   Pattern(1, i),
                   host[i] == Pattern(0, i) ? "before the producer's write" : "unknown");
      return 14;
    }
  }
  for (size_t i = 0; i < kIpcBytes; ++i) host[i] = Pattern(2, i);
  s = stream->CopyAsync(buf->data(), host.data(), kIpcBytes);
  if (s.ok()) s = stream->Record(*released);
  if (!s.ok()) return fail(s);
  if (write(to_parent, "r", 1) != 1) return 15;
  s = stream->Synchronize();  // keep the mapping until the copy is done
  return s.ok() ? 0 : fail(s);
}

TEST_F(CudaTest, IpcAcrossProcesses) {
  DeviceBuffer buf = ValueOrDie(DeviceBuffer::Create(0, kIpcBytes));
  CudaEvent ready = ValueOrDie(CudaEvent::Create(0, CudaEvent::kInterprocess));
  CudaEvent released = ValueOrDie(CudaEvent::Create(0, CudaEvent::kInterprocess));
  CudaStream stream = ValueOrDie(CudaStream::Create(0));
  std::vector<uint8_t> host(kIpcBytes);
  for (size_t i = 0; i < kIpcBytes; ++i) host[i] = Pattern(0, i);
  ASSERT_OK(stream.CopyAsync(buf.data(), host.data(), kIpcBytes));
  ASSERT_OK(stream.Synchronize());

  const MemIpcHandle mem = ValueOrDie(buf.IpcHandle());
  const EventIpcHandle ready_handle = ValueOrDie(ready.IpcHandle());
  const EventIpcHandle released_handle = ValueOrDie(released.IpcHandle());
  int down[2], up[2];
  ASSERT_EQ(pipe(down), 0);
  ASSERT_EQ(pipe(up), 0);
  auto hex = [](const auto& h) {
    return absl::BytesToHexString(
        absl::string_view(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size()));
  };
  const std::string spec = absl::StrCat(hex(mem), ":", hex(ready_handle), ":", hex(released_handle),
                                        ":", down[0], ":", up[1]);
  // Everything the child needs is built before fork(): between fork and exec it may only
  // make async-signal-safe calls.
  std::vector<std::string> env_strings = {absl::StrCat(kIpcChildEnv, "=", spec)};
  for (char** e = ::environ; *e != nullptr; ++e) env_strings.push_back(*e);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  char arg0[] = "cuda_test";
  char* argv[] = {arg0, nullptr};
  std::signal(SIGPIPE, SIG_IGN);  // a consumer that died early must fail the test, not kill it
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A fresh image: no CUDA state inherited from this process.
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  close(down[0]);
  close(up[1]);

  // Producer: a write that lands only after 300 ms, then "ready". A consumer that did not
  // wait on the event would read pattern 0.
  // The copy's source must be page-locked, or CopyAsync would wait for the sleep itself.
  void* region =
      mmap(nullptr, kIpcBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  uint8_t* next = static_cast<uint8_t*>(region);
  for (size_t i = 0; i < kIpcBytes; ++i) next[i] = Pattern(1, i);
  std::optional<HostRegistration> pinned(ValueOrDie(HostRegistration::Create(0, next, kIpcBytes)));
  ASSERT_CUDA(
      cudaLaunchHostFunc(stream.get(), SleepOnStream, reinterpret_cast<void*>(intptr_t{300})));
  ASSERT_OK(stream.CopyAsync(buf.data(), next, kIpcBytes));
  ASSERT_OK(stream.Record(ready));
  EXPECT_EQ(write(down[1], "g", 1), 1);

  // The consumer writes one byte once it has recorded "released"; 0 bytes: it died.
  pollfd pfd = {up[0], POLLIN, 0};
  ssize_t n = -1;
  if (poll(&pfd, 1, 60'000) == 1) {
    char got = 0;
    n = read(up[0], &got, 1);
  } else {
    ADD_FAILURE() << "consumer silent for 60 s; killing it";
    kill(child, SIGKILL);
  }
  if (n == 1) {
    ASSERT_OK(stream.Wait(released));
    std::vector<uint8_t> back(kIpcBytes);
    ASSERT_OK(stream.CopyAsync(back.data(), buf.data(), kIpcBytes));
    ASSERT_OK(stream.Synchronize());
    size_t wrong = 0;
    for (size_t i = 0; i < kIpcBytes; ++i) wrong += back[i] != Pattern(2, i);
    EXPECT_EQ(wrong, 0u) << "bytes not written by the consumer before its released event";
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  close(down[1]);
  close(up[0]);
  ASSERT_TRUE(WIFEXITED(wstatus)) << "consumer killed by signal " << WTERMSIG(wstatus);
  EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "consumer failed (its stderr says why)";
  EXPECT_EQ(n, 1);
  ASSERT_OK(stream.Synchronize());
  pinned.reset();
  munmap(region, kIpcBytes);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  if (const char* spec = std::getenv(ferry::kIpcChildEnv)) return ferry::RunIpcChild(spec);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
