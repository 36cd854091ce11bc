// nvJPEG batched decode as ferry drives it (GpuJpegDecoder), on a folder of real JPEG files:
// where the time goes (host-side Probe and DecodeBatch calls against the GPU's time) and how
// the rate scales with decoders on threads of their own and with batch sizes that change
// from call to call (the pipeline's case: each batch routes a different number of files).
// Prints a table; never asserts. Needs a GPU and libnvjpeg.
//
//   gpu_jpeg_bench DIR [--files N] [--batch N] [--seconds S] [--preallocate SIDE,SIDE...]
//
// DIR is searched recursively for .jpg/.jpeg files (bench/make_bench_dataset.py writes an
// ImageNet-like corpus); the first --files (default 2048) that the decoder takes are read
// into memory, so the disk is not measured. Rows run on the corpus as it is (mixed chroma
// subsamplings) and on its 4:2:0 and 4:4:4 files alone, and say where a call's time goes:
// groups (nvjpegDecodeBatched calls) and initialisations per batch, milliseconds per batch
// initialising, draining the stream and inside nvJPEG's decode, the device memory the
// decoders took and how long making one took. --preallocate runs every row once per
// GpuJpegDecoder::Options::preallocate_side given (default 0: no preallocation).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "cuda/cuda_resources.h"
#include "server/gpu/jpeg/gpu_jpeg_decoder.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

void Die(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "gpu_jpeg_bench: %s: %s\n", what, std::string(s.message()).c_str());
  std::exit(1);
}

struct Corpus {
  std::vector<std::vector<uint8_t>> files;
  std::vector<GpuJpegVerdict> verdicts;
  size_t max_pixels = 0;
};

Corpus Load(const std::string& dir, size_t max_files, GpuJpegDecoder& probe) {
  Corpus corpus;
  std::map<std::string, int> refused;
  double probe_seconds = 0, rules_seconds = 0;
  size_t probed = 0, bytes = 0, rules_taken = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (corpus.files.size() >= max_files) break;
    if (!entry.is_regular_file()) continue;
    const std::string ext = absl::AsciiStrToLower(entry.path().extension().string());
    if (ext != ".jpg" && ext != ".jpeg") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), {});
    const Clock::time_point rules_start = Clock::now();
    rules_taken += ClassifyForGpuDecode(data, GpuJpegLimits{}).reason == GpuJpegReject::kNone;
    rules_seconds += Seconds(rules_start);
    const Clock::time_point start = Clock::now();
    const GpuJpegVerdict v = probe.Probe(data);
    probe_seconds += Seconds(start);
    ++probed;
    if (v.reason != GpuJpegReject::kNone) {
      ++refused[std::string(GpuJpegRejectName(v.reason))];
      continue;
    }
    bytes += data.size();
    corpus.max_pixels = std::max(corpus.max_pixels, static_cast<size_t>(v.width) * v.height);
    corpus.files.push_back(std::move(data));
    corpus.verdicts.push_back(v);
  }
  std::printf(
      "corpus: %zu files probed, %zu taken (mean %.1f KiB); Probe %.1f us per file, of which "
      "the header rules (ClassifyForGpuDecode, which take %zu) %.1f us\n",
      probed, corpus.files.size(),
      corpus.files.empty() ? 0.0 : bytes / 1024.0 / corpus.files.size(),
      probed == 0 ? 0.0 : 1e6 * probe_seconds / probed, rules_taken,
      probed == 0 ? 0.0 : 1e6 * rules_seconds / probed);
  for (const auto& [reason, n] : refused) std::printf("  refused %-16s %d\n", reason.c_str(), n);
  return corpus;
}

// The files of `corpus` with one chroma subsampling.
Corpus Only(const Corpus& corpus, JpegSubsampling subsampling) {
  Corpus only;
  for (size_t i = 0; i < corpus.files.size(); ++i) {
    if (corpus.verdicts[i].subsampling != subsampling) continue;
    only.files.push_back(corpus.files[i]);
    only.verdicts.push_back(corpus.verdicts[i]);
    only.max_pixels = std::max(
        only.max_pixels, static_cast<size_t>(corpus.verdicts[i].width) * corpus.verdicts[i].height);
  }
  return only;
}

size_t DeviceBytesUsed() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return total - free;
}

// One decoder with its stream and targets, decoding batches of the corpus in turn.
struct Lane {
  GpuJpegDecoder decoder;
  CudaStream stream;
  DeviceBuffer out;
  size_t image_bytes = 0;
  double create_seconds = 0;  // in GpuJpegDecoder::Create
  double call_seconds = 0;    // inside DecodeBatch (host)
  int64_t images = 0;
  int64_t calls = 0;
};

Lane MakeLane(const Corpus& corpus, int batch, int preallocate_side) {
  GpuJpegDecoder::Options options;
  options.preallocate_side = preallocate_side;
  const Clock::time_point start = Clock::now();
  absl::StatusOr<GpuJpegDecoder> decoder = GpuJpegDecoder::Create(0, batch, options);
  Die(decoder.status(), "GpuJpegDecoder::Create");
  const double create_seconds = Seconds(start);
  absl::StatusOr<CudaStream> stream = CudaStream::Create(0);
  Die(stream.status(), "CudaStream::Create");
  const size_t image_bytes = (corpus.max_pixels * 3 + 255) / 256 * 256;
  absl::StatusOr<DeviceBuffer> out = DeviceBuffer::Create(0, image_bytes * batch);
  Die(out.status(), "DeviceBuffer::Create");
  return Lane{std::move(*decoder), std::move(*stream), std::move(*out), image_bytes,
              create_seconds};
}

// Decodes batches of `sizes[i % sizes.size()]` images, from `first` on in the corpus, until
// `deadline`.
void Run(Lane& lane, const Corpus& corpus, const std::vector<int>& sizes, size_t first,
         Clock::time_point deadline) {
  std::vector<absl::Span<const uint8_t>> jpegs;
  std::vector<GpuJpegVerdict> verdicts;
  std::vector<GpuJpegDecoder::Target> targets;
  size_t next = first;
  for (size_t call = 0; Clock::now() < deadline; ++call) {
    const int n = sizes[call % sizes.size()];
    jpegs.clear();
    verdicts.clear();
    targets.clear();
    for (int i = 0; i < n; ++i, ++next) {
      const size_t f = next % corpus.files.size();
      const GpuJpegVerdict& v = corpus.verdicts[f];
      jpegs.emplace_back(corpus.files[f]);
      verdicts.push_back(v);
      targets.push_back({static_cast<uint8_t*>(lane.out.data()) + lane.image_bytes * i,
                         static_cast<size_t>(v.width) * 3, lane.image_bytes});
    }
    const Clock::time_point start = Clock::now();
    Die(lane.decoder.DecodeBatch(jpegs, verdicts, targets, lane.stream.get()), "DecodeBatch");
    lane.call_seconds += Seconds(start);
    lane.images += n;
    ++lane.calls;
  }
  Die(lane.stream.Synchronize(), "cudaStreamSynchronize");
}

void Scenario(const std::string& name, const Corpus& corpus, int lanes_count, int batch,
              int preallocate_side, const std::vector<int>& sizes, double seconds) {
  if (corpus.files.size() < static_cast<size_t>(batch)) {
    std::printf("%-62s skipped: %zu files, fewer than a batch\n", name.c_str(),
                corpus.files.size());
    return;
  }
  const size_t device_bytes_before = DeviceBytesUsed();
  std::vector<Lane> lanes;
  for (int i = 0; i < lanes_count; ++i) lanes.push_back(MakeLane(corpus, batch, preallocate_side));
  const size_t targets_bytes = DeviceBytesUsed() - device_bytes_before;
  // Warm-up: nvJPEG sizes its buffers on the first batches.
  for (Lane& lane : lanes)
    Run(lane, corpus, sizes, 0, Clock::now() + std::chrono::milliseconds(300));
  const size_t decoder_bytes = DeviceBytesUsed() - device_bytes_before - targets_bytes;
  std::vector<GpuJpegDecoder::CallStats> before;
  for (Lane& lane : lanes) {
    lane.call_seconds = 0, lane.images = 0, lane.calls = 0;
    before.push_back(lane.decoder.stats());
  }
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline =
      start + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  std::vector<std::thread> threads;
  for (int i = 0; i < lanes_count; ++i) {
    threads.emplace_back(
        [&, i] { Run(lanes[i], corpus, sizes, static_cast<size_t>(i) * 397, deadline); });
  }
  for (std::thread& t : threads) t.join();
  const double wall = Seconds(start);
  int64_t images = 0, calls = 0;
  double call_seconds = 0;
  GpuJpegDecoder::CallStats spent;
  for (size_t i = 0; i < lanes.size(); ++i) {
    const Lane& lane = lanes[i];
    images += lane.images, calls += lane.calls, call_seconds += lane.call_seconds;
    const GpuJpegDecoder::CallStats& now = lane.decoder.stats();
    spent.groups += now.groups - before[i].groups;
    spent.initializations += now.initializations - before[i].initializations;
    spent.initialize_seconds += now.initialize_seconds - before[i].initialize_seconds;
    spent.drain_seconds += now.drain_seconds - before[i].drain_seconds;
    spent.decode_seconds += now.decode_seconds - before[i].decode_seconds;
  }
  const double per_call = calls == 0 ? 0.0 : 1e3 / static_cast<double>(calls);
  std::printf(
      "%-62s %8.0f img/s  call %6.2f ms: %4.2f groups, %4.2f inits %5.2f ms, drain %5.2f ms, "
      "decode %6.2f ms; %3.0f%% of wall; decoders %5.0f MiB, made in %.0f ms\n",
      (name + ", preallocated " + std::to_string(preallocate_side)).c_str(), images / wall,
      call_seconds * per_call, spent.groups * per_call / 1e3,
      spent.initializations * per_call / 1e3, spent.initialize_seconds * per_call,
      spent.drain_seconds * per_call, spent.decode_seconds * per_call,
      100 * call_seconds / lanes_count / wall, decoder_bytes / 1048576.0,
      1e3 * lanes[0].create_seconds);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  using namespace ferry;                     // NOLINT(build/namespaces)
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they are measured
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: gpu_jpeg_bench DIR [--files N] [--batch N] [--seconds S] "
                 "[--preallocate SIDE,SIDE...]\n");
    return 2;
  }
  size_t files = 2048;
  int batch = 128;
  double seconds = 3;
  std::vector<int> preallocate_sides = {0};
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--files") files = std::strtoul(argv[i + 1], nullptr, 10);
    if (flag == "--batch") batch = std::atoi(argv[i + 1]);
    if (flag == "--seconds") seconds = std::atof(argv[i + 1]);
    if (flag == "--preallocate") {
      preallocate_sides.clear();
      for (absl::string_view side : absl::StrSplit(argv[i + 1], ',')) {
        preallocate_sides.push_back(std::atoi(std::string(side).c_str()));
      }
    }
  }
  absl::StatusOr<GpuJpegDecoder> probe = GpuJpegDecoder::Create(0, batch);
  Die(probe.status(), "GpuJpegDecoder::Create");
  std::printf("nvJPEG %s, %s backend, %d engines\n", std::string(probe->library_version()).c_str(),
              std::string(GpuJpegDecoder::BackendName(probe->backend())).c_str(),
              probe->hardware_engines());
  const Corpus mixed = Load(argv[1], files, *probe);
  if (mixed.files.size() < static_cast<size_t>(batch)) {
    std::fprintf(stderr, "gpu_jpeg_bench: fewer than %d decodable files in %s\n", batch, argv[1]);
    return 1;
  }
  const Corpus only420 = Only(mixed, JpegSubsampling::k420);
  const Corpus only444 = Only(mixed, JpegSubsampling::k444);
  // A batch routes a varying number of files: sizes that change every call.
  std::vector<int> varying;
  for (int i = 0; i < 16; ++i) varying.push_back(batch / 2 + (i * 37) % (batch / 2 + 1));
  std::printf("batch %d, %.1f s per row\n", batch, seconds);
  struct Row {
    std::string name;
    const Corpus* corpus;
    int lanes;
    int batch;
    std::vector<int> sizes;
  };
  const std::vector<Row> rows = {
      {"mixed, fixed size, 1 decoder", &mixed, 1, batch, {batch}},
      {"mixed, size changing per call, 1 decoder", &mixed, 1, batch, varying},
      {"mixed, size changing per call, 2 decoders", &mixed, 2, batch, varying},
      {"mixed, size changing per call, 4 decoders", &mixed, 4, batch, varying},
      {"4:2:0 only, fixed size, 1 decoder", &only420, 1, batch, {batch}},
      {"4:2:0 only, half size, 1 decoder", &only420, 1, batch / 2, {batch / 2}},
      {"4:2:0 only, size changing per call, 1 decoder", &only420, 1, batch, varying},
      {"4:4:4 only, fixed size, 1 decoder", &only444, 1, batch, {batch}},
  };
  for (const Row& row : rows) {
    for (const int side : preallocate_sides) {
      Scenario(row.name, *row.corpus, row.lanes, row.batch, side, row.sizes, seconds);
    }
  }
  return 0;
}
