// h2d_bench: the copy limits the GPU transport works against, measured on this machine.
//   - H2D cudaMemcpyAsync bandwidth for 1, 4, 16 and 64 MiB chunks from
//       cudaHostAlloc'ed memory (the usual pinned buffer),
//       a memfd slab mapped, NUMA-bound to the GPU's node and cudaHostRegister'ed (what
//       ferryd's host slab is), and
//       pageable malloc'ed memory (what an unpinned loader ships from);
//   - device-to-device copy bandwidth (the ceiling for the normalize kernel);
//   - the normalize kernel, uint8 HWC -> float32 / float16 / bfloat16 CHW, for a batch of
//     256 x 224 x 224 x 3, counting bytes read plus bytes written;
//   - one batch as ferryd will run it on the copy stream: H2D of the uint8 batch from the
//     registered slab, then normalize to bf16;
//   - batches back to back as ferryd issues them (a copy, then the slot's ready event), on
//     one copy stream or two;
//   - the same while host threads copy sample rows the way ferryd's workers fill slots: into
//     memory of their own, or into the slots being copied with ordinary stores (memcpy) or
//     streaming ones (common/streaming_copy.h);
//   - a shuffled batch of 16 KiB records gathered by the copy engine straight from a
//     registered read-only mapping of a file (its page cache), with no CPU copy: one
//     cudaMemcpyBatchAsync per batch, or a cudaMemcpyAsync per row, next to one contiguous
//     copy of the same bytes; and the same rows (and smaller ones) gathered by a kernel
//     that reads the mapping across PCIe (what ferryd does for records), given the
//     indices in device memory or in its launch parameters, on 16 to all SMs' worth of
//     thread blocks, on one stream or two to eight in turn.
// Every copy figure is the median of kReps timed repetitions (CUDA events around each)
// after kWarmup untimed ones; the fill threads' GB/s are their mean over the same reps.
// GB/s are 1e9 bytes per second.
//
//   h2d_bench [device]      (default device 0)
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/random.h"
#include "common/streaming_copy.h"
#include "common/unique_fd.h"
#include "cuda/cuda_resources.h"
#include "server/kernels/normalize.h"
#include "server/memory/shared_slab.h"
#include "server/topology/topology.h"

namespace ferry {
namespace {

constexpr int kWarmup = 3;
constexpr int kReps = 30;
constexpr size_t kMiB = size_t{1} << 20;

[[noreturn]] void Die(const absl::Status& status, const char* what) {
  std::fprintf(stderr, "h2d_bench: %s: %s\n", what, status.ToString().c_str());
  std::exit(1);
}
void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) Die(status, what);
}
template <typename T>
T Take(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Die(v.status(), what);
  return std::move(v).value();
}
void CheckCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "h2d_bench: %s: %s\n", what, cudaGetErrorName(error));
    std::exit(1);
  }
}

class Timer {
 public:
  explicit Timer(const CudaStream& stream)
      : stream_(stream),
        start_(Take(CudaEvent::Create(stream.device(), CudaEvent::kTiming), "event")),
        stop_(Take(CudaEvent::Create(stream.device(), CudaEvent::kTiming), "event")) {}

  // Median milliseconds of `enqueue` (which puts work on the stream), rep = 0, 1, ...
  double MedianMs(const std::function<void(int rep)>& enqueue) {
    std::vector<double> ms;
    for (int rep = 0; rep < kWarmup + kReps; ++rep) {
      Check(stream_.Record(start_), "record");
      enqueue(rep);
      Check(stream_.Record(stop_), "record");
      Check(stop_.Synchronize(), "synchronize");
      if (rep >= kWarmup) ms.push_back(Take(ElapsedMillis(start_, stop_), "elapsed"));
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  }

 private:
  const CudaStream& stream_;
  CudaEvent start_, stop_;
};

double GBps(double bytes, double ms) { return bytes / (ms * 1e6); }

}  // namespace

int Main(int argc, char** argv) {
  const int device = argc > 1 ? std::atoi(argv[1]) : 0;
  const absl::StatusOr<int> count = DeviceCount();
  if (!count.ok() || *count == 0) {
    std::fprintf(
        stderr, "h2d_bench: no GPU to measure: %s\n",
        count.ok() ? "cudaGetDeviceCount found 0 devices" : count.status().ToString().c_str());
    return 2;
  }
  const DeviceInfo info = Take(GetDeviceInfo(device), "device");
  int numa_node = -1;
  if (absl::StatusOr<Topology> topo = Topology::Read("/sys"); topo.ok()) {
    numa_node = topo->NumaNodeOfPciDevice(info.pci_bus_id);
  }
  std::printf(
      "h2d_bench: %s (%s, %d SMs, NUMA node %d); median of %d reps after %d warm-ups, "
      "timed with CUDA events; GB/s = 1e9 B/s\n\n",
      info.name.c_str(), info.pci_bus_id.c_str(), info.multiprocessor_count, numa_node, kReps,
      kWarmup);

  CudaStream stream = Take(CudaStream::Create(device), "stream");
  Timer timer(stream);
  const size_t max_chunk = 64 * kMiB;
  // Two device targets alternate so a copy never waits on the previous one's reader.
  DeviceBuffer dev = Take(DeviceBuffer::Create(device, 2 * max_chunk), "device buffer");

  // Sources. Each is written (non-zero) before timing, so every page is resident.
  void* host_alloc = nullptr;
  CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  CheckCuda(cudaHostAlloc(&host_alloc, max_chunk, cudaHostAllocPortable), "cudaHostAlloc");
  SharedSlab slab = Take(SharedSlab::Create("h2d-bench", max_chunk, numa_node), "memfd slab");
  const auto t0 = std::chrono::steady_clock::now();
  // Where registration is refused (a container without the right limits), the slab's
  // column shows what the pipeline would get without it: pageable copies.
  absl::StatusOr<HostRegistration> registered =
      HostRegistration::Create(device, slab.data(), slab.size());
  if (!registered.ok()) {
    std::printf("cudaHostRegister of the memfd slab failed (its column is pageable): %s\n",
                registered.status().ToString().c_str());
  }
  const double register_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<uint8_t> pageable(max_chunk);
  Rng rng(7);
  for (size_t i = 0; i < max_chunk; ++i) {
    const uint8_t b = static_cast<uint8_t>(rng.Next() >> 56);
    static_cast<uint8_t*>(host_alloc)[i] = b;
    slab.data()[i] = b;
    pageable[i] = b;
  }

  std::printf("H2D cudaMemcpyAsync (cudaHostRegister of the %zu MiB memfd slab took %.1f ms)\n",
              max_chunk / kMiB, register_ms);
  std::printf("%-8s %12s %15s %10s %17s %17s\n", "chunk", "hostalloc", "memfd+register", "pageable",
              "register/hostalloc", "pageable/hostalloc");
  double h2d_64 = 0;
  for (size_t chunk : {1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB}) {
    auto h2d = [&](const void* src) {
      return timer.MedianMs([&](int rep) {
        Check(
            stream.CopyAsync(static_cast<uint8_t*>(dev.data()) + (rep % 2) * max_chunk, src, chunk),
            "H2D");
      });
    };
    const double a = GBps(chunk, h2d(host_alloc));
    const double r = GBps(chunk, h2d(slab.data()));
    const double p = GBps(chunk, h2d(pageable.data()));
    if (chunk == 64 * kMiB) h2d_64 = r;
    std::printf("%3zu MiB  %10.1f   %13.1f   %8.1f   %15.2f   %17.2f\n", chunk / kMiB, a, r, p,
                r / a, p / a);
  }

  // Batches as ferryd issues them: back-to-back copies of distinct slots, each followed by
  // the record of the slot's "ready" event. Shows what the per-batch event costs the copy
  // engine, and whether a second copy stream (a second engine) hides it.
  {
    constexpr int kSlots = 16;
    std::vector<CudaEvent> sync_events, ipc_events;
    for (int i = 0; i < kSlots; ++i) {
      sync_events.push_back(Take(CudaEvent::Create(device, CudaEvent::kSync), "event"));
      ipc_events.push_back(Take(CudaEvent::Create(device, CudaEvent::kInterprocess), "event"));
    }
    CudaStream second = Take(CudaStream::Create(device), "stream");
    CudaEvent fork = Take(CudaEvent::Create(device, CudaEvent::kSync), "event");
    CudaEvent join = Take(CudaEvent::Create(device, CudaEvent::kSync), "event");
    std::printf(
        "\nBatches back to back: %d copies of distinct 1 or 4 MiB slots per rep, from the "
        "registered slab; GB/s and ratio to plain copies on one stream\n",
        kSlots);
    std::printf("%-8s %8s %22s %22s %26s\n", "chunk", "plain", "+ event record (sync)",
                "+ record (interprocess)", "two streams, interprocess");
    for (size_t chunk : {1 * kMiB, 4 * kMiB}) {
      auto batches = [&](const std::vector<CudaEvent>* events, bool two_streams) {
        return timer.MedianMs([&](int) {
          if (two_streams) {
            Check(stream.Record(fork), "record");
            Check(second.Wait(fork), "wait");
          }
          for (int i = 0; i < kSlots; ++i) {
            const CudaStream& s = two_streams && i % 2 ? second : stream;
            Check(s.CopyAsync(static_cast<uint8_t*>(dev.data()) + i * chunk,
                              slab.data() + (i * chunk) % slab.size(), chunk),
                  "H2D");
            if (events != nullptr) Check(s.Record((*events)[i]), "record");
          }
          if (two_streams) {
            Check(second.Record(join), "record");
            Check(stream.Wait(join), "wait");
          }
        });
      };
      const double bytes = static_cast<double>(chunk) * kSlots;
      const double plain = GBps(bytes, batches(nullptr, false));
      const double sync = GBps(bytes, batches(&sync_events, false));
      const double ipc = GBps(bytes, batches(&ipc_events, false));
      const double two = GBps(bytes, batches(&ipc_events, true));
      std::printf("%3zu MiB  %8.1f %15.1f (%.2f) %15.1f (%.2f) %19.1f (%.2f)\n", chunk / kMiB,
                  plain, sync, sync / plain, ipc, ipc / plain, two, two / plain);
    }
  }

  // Batches back to back while host threads fill: each of hardware threads - 1 copies
  // 16 KiB rows (a 2048 x int64 record) from random places of a 1 GiB source (the page
  // cache of a shuffled dataset), as ferryd's workers do, either into memory of its own
  // (what the fill's traffic costs the DMA reads) or into the very slab slots the copies
  // read (as in ferryd, where a slot is copied soon after it was written, and lines the
  // CPU still holds dirty must be fetched from its caches), with ordinary stores or with
  // streaming ones (common/streaming_copy.h) that leave nothing dirty in the caches.
  {
    constexpr size_t kRow = 16 * 1024;
    constexpr size_t kSource = 1024 * kMiB;
    constexpr size_t kOwnBytes = 8 * kMiB;
    const int threads =
        std::max(1, std::min(15, static_cast<int>(std::thread::hardware_concurrency()) - 1));
    std::vector<uint8_t> source(kSource, 0x5a);
    std::vector<std::vector<uint8_t>> own(threads, std::vector<uint8_t>(kOwnBytes, 1));
    constexpr int kSlots = 16;
    std::vector<CudaEvent> ipc_events;
    for (int i = 0; i < kSlots; ++i) {
      ipc_events.push_back(Take(CudaEvent::Create(device, CudaEvent::kInterprocess), "event"));
    }
    std::printf(
        "\nBatches back to back (copy + interprocess event) while %d threads copy 16 KiB "
        "rows from random places of 1 GiB; H2D GB/s (ratio to no fill), fill GB/s\n",
        threads);
    std::printf("%-8s %8s %24s %24s %24s\n", "chunk", "no fill", "memcpy, own memory",
                "memcpy, into the slots", "streaming, into slots");
    enum Fill { kNone, kOwnMemcpy, kSlotsMemcpy, kSlotsStreaming };
    for (size_t chunk : {1 * kMiB, 4 * kMiB}) {
      const size_t batch_bytes = chunk * kSlots;  // the slab bytes the copies read
      auto measure = [&](Fill fill) -> std::pair<double, double> {
        std::atomic<bool> stop{false};
        std::atomic<uint64_t> copied{0};
        std::vector<std::thread> workers;
        for (int t = 0; fill != kNone && t < threads; ++t) {
          workers.emplace_back([&, t] {
            // Into the slots: thread t writes its share of the slab bytes the copies read.
            const size_t share = std::max(kRow, batch_bytes / threads / kRow * kRow);
            uint8_t* base =
                fill == kOwnMemcpy ? own[t].data() : slab.data() + (t * share) % batch_bytes;
            const size_t span = fill == kOwnMemcpy ? kOwnBytes : share;
            Rng rng(100 + t);
            uint64_t rows = 0;
            size_t at = 0;
            while (!stop.load(std::memory_order_relaxed)) {
              const uint8_t* src = source.data() + (rng.Next() % (kSource / kRow)) * kRow;
              if (fill == kSlotsStreaming) {
                StreamingCopy(base + at, src, kRow);
              } else {
                std::memcpy(base + at, src, kRow);
              }
              at = at + 2 * kRow <= span ? at + kRow : 0;
              ++rows;
            }
            copied.fetch_add(rows * kRow);
          });
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const auto start = std::chrono::steady_clock::now();
        const double ms = timer.MedianMs([&](int) {
          for (int i = 0; i < kSlots; ++i) {
            Check(stream.CopyAsync(static_cast<uint8_t*>(dev.data()) + i * chunk,
                                   slab.data() + i * chunk, chunk),
                  "H2D");
            Check(stream.Record(ipc_events[i]), "record");
          }
        });
        stop = true;
        for (std::thread& w : workers) w.join();
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return {GBps(static_cast<double>(batch_bytes), ms), copied.load() / seconds / 1e9};
      };
      const auto idle = measure(kNone);
      std::printf("%3zu MiB  %8.1f", chunk / kMiB, idle.first);
      for (Fill fill : {kOwnMemcpy, kSlotsMemcpy, kSlotsStreaming}) {
        const auto r = measure(fill);
        std::printf(" %10.1f (%.2f), %6.1f", r.first, r.first / idle.first, r.second);
      }
      std::printf("\n");
    }
  }

  // Gather from the page cache: a file's read-only mapping registered with the driver, and
  // each batch's rows (random 16 KiB records) copied from it by the copy engine.
#if CUDART_VERSION >= 13000  // cudaMemcpyBatchAsync as of CUDA 13 (12.8 had another form)
  {
    constexpr size_t kRow = 16 * 1024;
    constexpr size_t kFileBytes = 512 * kMiB;
    const char* tmp = std::getenv("TMPDIR");
    std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/h2d-bench-XXXXXX";
    UniqueFd fd(::mkstemp(path.data()));
    bool written = fd.valid();
    if (written) {
      ::unlink(path.c_str());  // the open fd and the mapping keep it
      const std::vector<uint8_t> block(64 * kMiB, 0x3c);
      for (size_t done = 0; written && done < kFileBytes; done += block.size()) {
        written =
            ::write(fd.get(), block.data(), block.size()) == static_cast<ssize_t>(block.size());
      }
    }
    void* map =
        written ? ::mmap(nullptr, kFileBytes, PROT_READ, MAP_SHARED, fd.get(), 0) : MAP_FAILED;
    if (map == MAP_FAILED) {
      std::printf("\nGather from the page cache: cannot write and map %zu MiB at %s: %s\n",
                  kFileBytes / kMiB, path.c_str(), std::strerror(errno));
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      const cudaError_t reg =
          cudaHostRegister(map, kFileBytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
      const double reg_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      constexpr int kBatches = 16;
      if (reg != cudaSuccess) {
        std::printf(
            "\nGather from the page cache: cudaHostRegister of a read-only file mapping "
            "failed: %s\n",
            cudaGetErrorName(reg));
        cudaGetLastError();
      } else {
        std::printf(
            "\nGather from the page cache (cudaHostRegister ReadOnly of a %zu MiB file "
            "mapping: %.1f ms); %d batches of random 16 KiB rows per rep, each followed "
            "by an interprocess event; GB/s and ratio to one contiguous copy per batch\n",
            kFileBytes / kMiB, reg_ms, kBatches);
        std::printf("%-8s %12s %24s %24s\n", "batch", "contiguous", "cudaMemcpyBatchAsync",
                    "cudaMemcpyAsync per row");
        std::vector<CudaEvent> events;
        for (int i = 0; i < kBatches; ++i) {
          events.push_back(Take(CudaEvent::Create(device, CudaEvent::kInterprocess), "event"));
        }
        const auto* file = static_cast<const uint8_t*>(map);
        Rng rng(11);
        for (size_t chunk : {1 * kMiB, 4 * kMiB}) {
          const size_t rows = chunk / kRow;
          // Per batch: random rows of the file, into consecutive rows of a device slot.
          std::vector<std::vector<const void*>> srcs(kBatches);
          std::vector<std::vector<void*>> dsts(kBatches);
          for (int b = 0; b < kBatches; ++b) {
            uint8_t* slot = static_cast<uint8_t*>(dev.data()) + (b * chunk) % (2 * max_chunk);
            for (size_t r = 0; r < rows; ++r) {
              srcs[b].push_back(file + (rng.Next() % (kFileBytes / kRow)) * kRow);
              dsts[b].push_back(slot + r * kRow);
            }
          }
          const std::vector<size_t> sizes(rows, kRow);
          cudaMemcpyAttributes attrs{};
          attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
          size_t attrs_index = 0;
          enum Mode { kContiguous, kBatchApi, kPerRow };
          auto run = [&](Mode mode) {
            return timer.MedianMs([&](int) {
              for (int b = 0; b < kBatches; ++b) {
                if (mode == kContiguous) {
                  Check(stream.CopyAsync(dsts[b][0], file + (b * chunk) % kFileBytes, chunk),
                        "H2D");
                } else if (mode == kBatchApi) {
                  CheckCuda(cudaMemcpyBatchAsync(dsts[b].data(), srcs[b].data(), sizes.data(), rows,
                                                 &attrs, &attrs_index, 1, stream.get()),
                            "cudaMemcpyBatchAsync");
                } else {
                  for (size_t r = 0; r < rows; ++r) {
                    Check(stream.CopyAsync(dsts[b][r], srcs[b][r], kRow), "H2D");
                  }
                }
                Check(stream.Record(events[b]), "record");
              }
            });
          };
          const double bytes = static_cast<double>(chunk) * kBatches;
          const double contiguous = GBps(bytes, run(kContiguous));
          const double batch_api = GBps(bytes, run(kBatchApi));
          const double per_row = GBps(bytes, run(kPerRow));
          std::printf("%3zu MiB  %12.1f %16.1f (%.2f) %16.1f (%.2f)\n", chunk / kMiB, contiguous,
                      batch_api, batch_api / contiguous, per_row, per_row / contiguous);
        }
        // The same, gathered by a kernel reading the mapping across PCIe: per batch one
        // launch, given the batch's record indices in device memory, or in the launch's
        // parameters (read from host memory, as ferryd does), on one stream or taking two
        // to eight in turn (so a batch's kernel may start while the one before drains).
        // More batches per rep than above, so that the streams reach their steady state.
        constexpr int kKernelBatches = 64;
        const int sms = info.multiprocessor_count;
        std::printf(
            "\nGather kernel from the page cache (same mapping, %d batches per rep, each "
            "followed by an interprocess event): GB/s (ratio to one contiguous copy "
            "per batch); indices in device memory (dev) or in the launch's parameters "
            "(param), blocks per launch, streams taken in turn\n",
            kKernelBatches);
        struct Column {
          bool param;
          int blocks;
          int streams;
        };
        const std::vector<Column> columns = {
            {false, 16, 1}, {false, 64, 1}, {false, sms, 1}, {true, 64, 1}, {true, 64, 2},
            {true, 64, 3},  {true, 16, 4},  {true, 32, 4},   {true, 8, 8},  {true, 16, 8}};
        std::printf("%-8s %-6s %10s", "row", "batch", "contiguous");
        for (const Column& c : columns) {
          std::printf(" %13s", absl::StrCat(c.param ? "param " : "dev ", c.blocks, "b",
                                            c.streams > 1 ? absl::StrCat(" x", c.streams) : "")
                                   .c_str());
        }
        std::printf("\n");
        const size_t max_rows = 4 * kMiB / 256;
        DeviceBuffer indices = Take(
            DeviceBuffer::Create(device, kKernelBatches * max_rows * sizeof(int64_t)), "indices");
        std::vector<CudaStream> more_streams;  // besides `stream`
        for (int i = 0; i < 7; ++i) {
          more_streams.push_back(Take(CudaStream::Create(device), "stream"));
        }
        CudaEvent joined = Take(CudaEvent::Create(device, CudaEvent::kSync), "event");
        std::vector<CudaEvent> kernel_events;
        for (int i = 0; i < kKernelBatches; ++i) {
          kernel_events.push_back(
              Take(CudaEvent::Create(device, CudaEvent::kInterprocess), "event"));
        }
        for (auto [row, chunk] : std::vector<std::pair<size_t, size_t>>{{16 * 1024, 1 * kMiB},
                                                                        {16 * 1024, 4 * kMiB},
                                                                        {4096, 4 * kMiB},
                                                                        {1024, 4 * kMiB},
                                                                        {256, 4 * kMiB}}) {
          const size_t rows = chunk / row;
          const GatherSource source{.records = static_cast<const uint8_t*>(map),
                                    .num_records = static_cast<int64_t>(kFileBytes / row),
                                    .row_bytes = row};
          std::vector<int64_t> host_indices(kKernelBatches * rows);
          for (int64_t& i : host_indices) i = static_cast<int64_t>(rng.Next() % (kFileBytes / row));
          CheckCuda(cudaMemcpy(indices.data(), host_indices.data(),
                               host_indices.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
                    "indices");
          const auto* index_base = static_cast<const int64_t*>(indices.data());
          const double bytes = static_cast<double>(chunk) * kKernelBatches;
          auto slot = [&](int b) {
            return static_cast<uint8_t*>(dev.data()) + (b * chunk) % (2 * max_chunk);
          };
          const double contiguous = GBps(bytes, timer.MedianMs([&](int) {
            for (int b = 0; b < kKernelBatches; ++b) {
              Check(stream.CopyAsync(slot(b), file + (b * chunk) % kFileBytes, chunk), "H2D");
              Check(stream.Record(kernel_events[b]), "record");
            }
          }));
          std::printf("%5zu B  %2zu MiB %10.1f", row, chunk / kMiB, contiguous);
          for (const Column& c : columns) {
            if (c.param && static_cast<int64_t>(rows) > kMaxGatherRowsPerLaunch) {
              std::printf(" %13s", "-");
              continue;
            }
            auto on_stream = [&](int b) -> CudaStream& {
              const int turn = b % c.streams;
              return turn == 0 ? stream : more_streams[turn - 1];
            };
            const double gbps = GBps(bytes, timer.MedianMs([&](int) {
              // The other streams start after the timer's start event...
              Check(stream.Record(joined), "record");
              for (int i = 1; i < c.streams; ++i) {
                CheckCuda(cudaStreamWaitEvent(more_streams[i - 1].get(), joined.get(), 0), "wait");
              }
              for (int b = 0; b < kKernelBatches; ++b) {
                CudaStream& on = on_stream(b);
                if (c.param) {
                  Check(LaunchGatherRowsIndexedFromHost(
                            source, absl::MakeConstSpan(host_indices).subspan(b * rows, rows),
                            slot(b), nullptr, c.blocks, on.get()),
                        "gather");
                } else {
                  Check(LaunchGatherRows(source, index_base + b * rows, static_cast<int64_t>(rows),
                                         slot(b), c.blocks, on.get()),
                        "gather");
                }
                Check(on.Record(kernel_events[b]), "record");
              }
              // ... and the timer's stop event waits for each of them.
              for (int turn = 1; turn < c.streams; ++turn) {
                const int last = kKernelBatches - 1 - (kKernelBatches - 1 - turn) % c.streams;
                CheckCuda(cudaStreamWaitEvent(stream.get(), kernel_events[last].get(), 0), "wait");
              }
            }));
            std::printf("   %5.1f (%.2f)", gbps, gbps / contiguous);
          }
          std::printf("\n");
        }
        CheckCuda(cudaHostUnregister(map), "cudaHostUnregister");
      }
      ::munmap(map, kFileBytes);
    }
  }
#endif

  // Device-to-device: the device memory ceiling, read + write.
  const size_t d2d_bytes = 512 * kMiB;
  DeviceBuffer d2d_a = Take(DeviceBuffer::Create(device, d2d_bytes), "d2d buffer");
  DeviceBuffer d2d_b = Take(DeviceBuffer::Create(device, d2d_bytes), "d2d buffer");
  CheckCuda(cudaMemset(d2d_a.data(), 0x5a, d2d_bytes), "cudaMemset");
  const double d2d_ms = timer.MedianMs([&](int rep) {
    if (rep % 2) {
      Check(stream.CopyAsync(d2d_b.data(), d2d_a.data(), d2d_bytes), "D2D");
    } else {
      Check(stream.CopyAsync(d2d_a.data(), d2d_b.data(), d2d_bytes), "D2D");
    }
  });
  const double d2d_rw = GBps(2.0 * d2d_bytes, d2d_ms);
  std::printf(
      "\nD2D cudaMemcpyAsync of %zu MiB: %.3f ms = %.1f GB/s read+write (%.1f GB/s copied)\n",
      d2d_bytes / kMiB, d2d_ms, d2d_rw, d2d_rw / 2);

  // Normalize: two input/output sets alternate, 115 MB or more per pass against 50 MB of L2.
  const int batch = 256, h = 224, w = 224;
  const size_t in_bytes = size_t{batch} * h * w * 3;
  std::vector<DeviceBuffer> inputs, outputs;
  for (int s = 0; s < 2; ++s) {
    inputs.push_back(Take(DeviceBuffer::Create(device, in_bytes), "normalize input"));
    outputs.push_back(Take(DeviceBuffer::Create(device, in_bytes * 4), "normalize output"));
    Check(stream.CopyAsync(inputs.back().data(), slab.data(), std::min(in_bytes, slab.size())),
          "fill input");
  }
  Check(stream.Synchronize(), "fill");
  const auto mean = kImageNetMean;
  const auto std_dev = kImageNetStd;
  std::printf(
      "\nNormalize uint8 HWC -> CHW, batch %dx%dx%dx3 (floor: read %zu B + write "
      "3*%d*%d*%d*sizeof)\n",
      batch, h, w, in_bytes, batch, h, w);
  std::printf("%-6s %9s %14s %10s\n", "dtype", "ms", "GB/s (r+w)", "vs D2D");
  double bf16_ms = 0;
  for (OutputDType dtype : {OutputDType::kBFloat16, OutputDType::kFloat16, OutputDType::kFloat32}) {
    const double ms = timer.MedianMs([&](int rep) {
      Check(LaunchNormalizeImages(static_cast<const uint8_t*>(inputs[rep % 2].data()),
                                  outputs[rep % 2].data(), dtype, batch, h, w, mean.data(),
                                  std_dev.data(), stream.get()),
            "normalize");
    });
    const double bytes = in_bytes + double(in_bytes) * OutputDTypeSize(dtype);
    if (dtype == OutputDType::kBFloat16) bf16_ms = ms;
    std::printf("%-6s %9.3f %14.1f %9.0f%%\n",
                dtype == OutputDType::kBFloat16  ? "bf16"
                : dtype == OutputDType::kFloat16 ? "fp16"
                                                 : "fp32",
                ms, GBps(bytes, ms), 100 * GBps(bytes, ms) / d2d_rw);
  }

  // One batch as ferryd runs it on the copy stream (the slab holds 64 MiB: the uint8 batch
  // of 38.5 MB fits).
  const double batch_ms = timer.MedianMs([&](int rep) {
    Check(stream.CopyAsync(inputs[rep % 2].data(), slab.data(), in_bytes), "H2D batch");
    Check(LaunchNormalizeImages(static_cast<const uint8_t*>(inputs[rep % 2].data()),
                                outputs[rep % 2].data(), OutputDType::kBFloat16, batch, h, w,
                                mean.data(), std_dev.data(), stream.get()),
          "normalize");
  });
  std::printf(
      "\nBatch on the copy stream: H2D %.1f MB uint8 from the registered slab + normalize "
      "-> bf16: %.3f ms (%.0f images/s); normalize is %.0f%% of it; shipping bf16 "
      "instead would take about %.3f ms of H2D at the 64 MiB rate\n",
      in_bytes / 1e6, batch_ms, batch / (batch_ms / 1e3), 100 * bf16_ms / batch_ms,
      2.0 * in_bytes / (h2d_64 * 1e6));

  CheckCuda(cudaFreeHost(host_alloc), "cudaFreeHost");
  return 0;
}

}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
