// gpu_consume_bench: GB/s a C++ trainer gets from ferryd's GPU transport, next to the
// pinned cudaMemcpyAsync peak of the same chunk size measured in the same run.
//
// The trainer is the leanest one the client library allows: Next, WaitOn(its stream),
// ReleaseOn(its stream), touching nothing. It separates what ferryd can deliver from what a
// Python trainer costs per batch (bench/gpu_bench.py runs both against one ferryd).
//
//   gpu_consume_bench --address SOCK --path FILE [--seq-len 2047] [--batches 64,256]
//                     [--prefetch 0,8,32] [--epochs 2] [--min-seconds 1] [--rounds 3]
//                     [--device 0] [--kinds tokens,records]
//
// FILE is read twice per configuration: as uint16 tokens widened to int64 on the GPU
// (TokensDataset), and as raw int64 records of seq_len + 1 (RecordsDataset, one plain copy
// per batch). GB/s count the int64 bytes in the trainer's GPU memory; "next" is the share
// of the trainer's time spent inside Next, i.e. waiting for ferryd. Rounds interleave the
// peak and ferry's rows; the table prints medians and the min-max of per-round ratios.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cuda/cuda_resources.h"
#include "ferry/client.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

[[noreturn]] void Die(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "gpu_consume_bench: %s: %s\n", what.c_str(), status.ToString().c_str());
  std::exit(1);
}
template <typename T>
T Take(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what, v.status());
  return std::move(v).value();
}
void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Die(what, status);
}
void CheckCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) Die(what, absl::InternalError(cudaGetErrorName(error)));
}

std::vector<int> IntList(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 0) {
      Die("a comma-separated list of non-negative integers", absl::InvalidArgumentError(text));
    }
    out.push_back(v);
  }
  return out;
}

struct FreeHost {
  void operator()(void* p) const { cudaFreeHost(p); }
};

// GB/s of back-to-back cudaMemcpyAsync of `bytes` from cudaMallocHost memory: the copy
// engine's peak for this chunk size.
double PinnedPeak(int device, size_t bytes) {
  CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  void* raw = nullptr;
  CheckCuda(cudaMallocHost(&raw, bytes), "cudaMallocHost");
  std::unique_ptr<void, FreeHost> host(raw);
  DeviceBuffer dst = Take(DeviceBuffer::Create(device, bytes), "device buffer");
  CudaStream stream = Take(CudaStream::Create(device), "stream");
  CudaEvent start = Take(CudaEvent::Create(device, CudaEvent::kTiming), "event");
  CudaEvent stop = Take(CudaEvent::Create(device, CudaEvent::kTiming), "event");
  constexpr int kWarmup = 5;
  const int reps = static_cast<int>(std::max<size_t>(50, (size_t{512} << 20) / bytes));
  for (int i = 0; i < kWarmup; ++i) Check(stream.CopyAsync(dst.data(), host.get(), bytes), "copy");
  Check(stream.Record(start), "record");
  for (int i = 0; i < reps; ++i) Check(stream.CopyAsync(dst.data(), host.get(), bytes), "copy");
  Check(stream.Record(stop), "record");
  Check(stop.Synchronize(), "synchronize");
  const double ms = Take(ElapsedMillis(start, stop), "elapsed");
  return static_cast<double>(bytes) * reps / (ms * 1e6);
}

struct Run {
  double gbps = 0;
  double next_share = 0;  // of the trainer's time, spent inside Next
};

// One job: a warm-up epoch, then `epochs` timed ones, or as many more as take min_seconds
// (an epoch of a 512 MiB file lasts ~12 ms at the pinned peak: too short to time alone).
Run Consume(Client& client, const std::string& path, int seq_len, int batch, int prefetch,
            bool records, int device, int epochs, double min_seconds) {
  v1::JobSpec job;
  if (records) {
    v1::RecordsDataset* r = job.mutable_dataset()->mutable_records();
    r->set_path(path);
    r->set_dtype(v1::INT64);
    r->add_shape(seq_len + 1);
    // The token file's bytes read as whole int64 records: nothing to convert anywhere.
  } else {
    v1::TokensDataset* t = job.mutable_dataset()->mutable_tokens();
    t->set_path(path);
    t->set_seq_len(static_cast<uint32_t>(seq_len));
  }
  job.set_batch_size(static_cast<uint32_t>(batch));
  job.set_shuffle(true);
  job.set_drop_last(true);
  job.set_device("cuda:" + std::to_string(device));
  job.set_prefetch_depth(static_cast<uint32_t>(prefetch));
  const v1::Job info = Take(client.CreateJob("", job), "CreateJob");
  std::unique_ptr<Consumer> consumer = Take(client.Attach(info.id(), 0), "Attach");
  CheckCuda(cudaSetDevice(consumer->device()), "cudaSetDevice");
  CudaStream stream = Take(CudaStream::Create(consumer->device()), "stream");
  const std::string field = records ? "data" : "tokens";
  double bytes = 0, in_next = 0;
  Clock::time_point start = Clock::now();
  // Epoch 0 warms up.
  for (int epoch = 0; epoch <= epochs || SecondsSince(start) < min_seconds; ++epoch) {
    if (epoch == 1) {
      Check(stream.Synchronize(), "synchronize");
      start = Clock::now();
      in_next = 0;
    }
    Check(consumer->StartEpoch(epoch, 0), "StartEpoch");
    for (;;) {
      const Clock::time_point t = Clock::now();
      std::optional<Batch> b = Take(consumer->Next(), "Next");
      in_next += SecondsSince(t);
      if (!b.has_value()) break;
      Check(b->WaitOn(stream.get()), "WaitOn");
      if (epoch > 0) bytes += static_cast<double>(b->field(field)->bytes);
      Check(b->ReleaseOn(stream.get()), "ReleaseOn");
    }
  }
  Check(stream.Synchronize(), "synchronize");
  const double seconds = SecondsSince(start);
  return {bytes / seconds / 1e9, in_next / seconds};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int Main(int argc, char** argv) {
  std::string address, path;
  int seq_len = 2047, epochs = 2, rounds = 3, device = 0;
  double min_seconds = 1.0;
  std::vector<int> batches = {64, 256}, prefetches = {0, 8, 32};
  bool tokens = true, records = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--address")
      address = v;
    else if (a == "--path")
      path = v;
    else if (a == "--seq-len")
      seq_len = std::atoi(v.c_str());
    else if (a == "--batches")
      batches = IntList(v);
    else if (a == "--prefetch")
      prefetches = IntList(v);
    else if (a == "--epochs")
      epochs = std::atoi(v.c_str());
    else if (a == "--min-seconds")
      min_seconds = std::atof(v.c_str());
    else if (a == "--rounds")
      rounds = std::atoi(v.c_str());
    else if (a == "--device")
      device = std::atoi(v.c_str());
    else if (a == "--kinds") {
      tokens = absl::StrContains(v, "tokens");
      records = absl::StrContains(v, "records");
    } else
      Die("unknown argument " + a,
          absl::InvalidArgumentError("see the header of gpu_consume_bench.cc"));
  }
  if (address.empty() || path.empty() || seq_len < 1 || epochs < 1 || rounds < 1) {
    std::fprintf(stderr,
                 "usage: gpu_consume_bench --address SOCK --path FILE [--seq-len 2047] "
                 "[--batches 64,256] [--prefetch 0,8,32] [--epochs 2] [--min-seconds 1] "
                 "[--rounds 3] [--device 0] [--kinds tokens,records]\n");
    return 2;
  }
  const absl::StatusOr<int> count = DeviceCount();
  if (!count.ok() || *count == 0) {
    std::fprintf(
        stderr, "gpu_consume_bench: no GPU: %s\n",
        count.ok() ? "cudaGetDeviceCount found 0 devices" : count.status().ToString().c_str());
    return 2;
  }
  std::unique_ptr<Client> client = Take(Client::Connect(address), "Connect");
  std::printf(
      "C++ trainer (Next, WaitOn, ReleaseOn; touches nothing); %d round(s), %d epochs "
      "each or more to fill %.1f s; ratio to the same round's pinned peak; next = share "
      "of the trainer's time inside Next (waiting for ferryd)\n",
      rounds, epochs, min_seconds);
  std::printf("%-58s %8s %8s %13s %6s\n", "c++ trainer", "GB/s", "vs peak", "(min-max)", "next");
  for (const int batch : batches) {
    const size_t chunk = static_cast<size_t>(batch) * (seq_len + 1) * 8;
    // key: (records, prefetch); -1 = the peak.
    std::map<std::pair<int, int>, std::vector<std::tuple<double, double, double>>> runs;
    for (int round = 0; round < rounds; ++round) {
      const double peak = PinnedPeak(device, chunk);
      runs[{-1, 0}].emplace_back(peak, 1.0, 0.0);
      for (const int prefetch : prefetches) {
        for (const bool raw : {false, true}) {
          if (raw ? !records : !tokens) continue;
          const Run r =
              Consume(*client, path, seq_len, batch, prefetch, raw, device, epochs, min_seconds);
          runs[{raw ? 1 : 0, prefetch}].emplace_back(r.gbps, r.gbps / peak, r.next_share);
        }
      }
    }
    for (const auto& [key, values] : runs) {
      std::vector<double> gbps, ratio, next;
      for (const auto& [g, r, n] : values) {
        gbps.push_back(g);
        ratio.push_back(r);
        next.push_back(n);
      }
      char name[128];
      if (key.first < 0) {
        std::snprintf(name, sizeof name, "pinned cudaMemcpyAsync, %.1f MiB chunks (peak)",
                      chunk / 1048576.0);
      } else {
        std::snprintf(name, sizeof name, "ferry %s (batch %d, prefetch %s)",
                      key.first ? "raw int64 records" : "tokens u16->int64", batch,
                      key.second == 0 ? "default" : std::to_string(key.second).c_str());
      }
      std::printf("%-58s %8.2f %8.2f %6.2f-%-6.2f %6.2f\n", name, Median(gbps), Median(ratio),
                  *std::min_element(ratio.begin(), ratio.end()),
                  *std::max_element(ratio.begin(), ratio.end()), Median(next));
    }
  }
  return 0;
}

}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
