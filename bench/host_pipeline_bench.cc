// Host-transport JPEG pipeline throughput, next to the single-thread libjpeg-turbo rates of
// the same files measured in the same run (these machines are noisy: compare the ratios).
//
//   host_pipeline_bench --data DIR [--batch 64] [--size 224] [--epochs 3] [--workers N]
//
// DIR is an imagefolder (examples/make_demo_dataset.py writes one). Measured:
//   1. single-thread full decode (ImageDecoder::DecodeRgb) of every file, bytes in memory;
//   2. single-thread decode + RandomResizedCrop(size) + flip (the per-sample work ferryd does);
//   3. ferryd (in this process, `workers` threads) -> host transport -> a consumer that
//      touches one byte per image row, for `epochs` epochs after one warm-up epoch.
// Reported: images/s of each, ferry / (2) and ferry / (workers x (2)) = scaling efficiency.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/random.h"
#include "ferry/client.h"
#include "server/decode/image_transform.h"
#include "server/service/daemon.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::vector<std::vector<uint8_t>> ReadAll(const std::string& root) {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    std::string ext = e.path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
    if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg")) paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::vector<uint8_t>> files;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return files;
}

[[noreturn]] void Die(const std::string& what) {
  fprintf(stderr, "host_pipeline_bench: %s\n", what.c_str());
  exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string data;
  int batch = 64, size = 224, epochs = 3;
  int workers = static_cast<int>(std::thread::hardware_concurrency());
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--data")
      data = argv[i + 1];
    else if (a == "--batch")
      batch = atoi(argv[i + 1]);
    else if (a == "--size")
      size = atoi(argv[i + 1]);
    else if (a == "--epochs")
      epochs = atoi(argv[i + 1]);
    else if (a == "--workers")
      workers = atoi(argv[i + 1]);
    else
      Die("unknown argument " + a);
  }
  if (data.empty())
    Die("usage: host_pipeline_bench --data DIR [--batch 64] [--size 224] [--epochs 3] [--workers "
        "N]");
  data = std::filesystem::absolute(data).string();

  const auto files = ReadAll(data);
  if (files.empty()) Die("no JPEGs under " + data);
  size_t total_bytes = 0;
  for (const auto& f : files) total_bytes += f.size();

  // 1 and 2: single thread, bytes already in memory.
  ferry::ImageDecoder decoder;
  std::vector<uint8_t> rgb;
  auto t0 = Clock::now();
  for (const auto& f : files) {
    int w, h;
    if (!decoder.DecodeRgb(f, &rgb, &w, &h).ok()) Die("a file does not decode");
  }
  const double full_decode = files.size() / Seconds(t0);
  const ferry::ImageTransform rrc = ferry::ImageTransform::RandomResizedCrop(size, true);
  std::vector<uint8_t> out(static_cast<size_t>(size) * size * 3);
  // File i's crop with transform t (the same draws for every t), into *row.
  auto crop_file = [&](size_t i, const ferry::ImageTransform& t, std::vector<uint8_t>* row) {
    ferry::Rng rng(ferry::MixSeed(1, 0, i));
    if (!ferry::DecodeAndTransform(decoder, files[i], t, rng, absl::MakeSpan(*row)).ok()) {
      Die("a file does not decode");
    }
  };
  t0 = Clock::now();
  for (size_t i = 0; i < files.size(); ++i) crop_file(i, rrc, &out);
  const double crop_decode = files.size() / Seconds(t0);
  // 2b: the same crops decoded at full resolution (RandomResizedCrop.full_decode), and how
  // far the default's reduced-scale pixels lie from them.
  ferry::ImageTransform exact = rrc;
  exact.full_decode = true;
  std::vector<uint8_t> exact_out(out.size());
  t0 = Clock::now();
  for (size_t i = 0; i < files.size(); ++i) crop_file(i, exact, &exact_out);
  const double exact_decode = files.size() / Seconds(t0);
  double sum_abs = 0, worst_file_mean = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    crop_file(i, rrc, &out);
    crop_file(i, exact, &exact_out);
    double file_sum = 0;
    for (size_t k = 0; k < out.size(); ++k) file_sum += std::abs(int{out[k]} - int{exact_out[k]});
    sum_abs += file_sum;
    worst_file_mean = std::max(worst_file_mean, file_sum / static_cast<double>(out.size()));
  }

  // 3: the daemon in this process, a consumer over the real socket and shared memory.
  const std::string dir = absl::StrCat("/tmp/ferry-bench-", getpid());
  ferry::DaemonOptions options;
  options.listen = dir + "/ferryd.sock";
  options.workers = workers;
  auto daemon = ferry::Daemon::Start(options);
  if (!daemon.ok()) Die(daemon.status().ToString());
  auto client = ferry::Client::Connect(options.listen);
  if (!client.ok()) Die(client.status().ToString());
  ferry::v1::JobSpec job;
  job.mutable_dataset()->mutable_image_folder()->set_root(data);
  ferry::v1::RandomResizedCrop* crop = job.mutable_transform()->mutable_random_resized_crop();
  crop->set_size(static_cast<uint32_t>(size));
  crop->set_flip(true);
  job.set_batch_size(static_cast<uint32_t>(batch));
  job.set_shuffle(true);
  job.set_drop_last(true);
  job.set_prefetch_depth(4);
  auto info = (*client)->CreateJob("", job);
  if (!info.ok()) Die(info.status().ToString());
  auto consumer = (*client)->Attach(info->id(), 0);
  if (!consumer.ok()) Die(consumer.status().ToString());
  int64_t images = 0;
  uint64_t checksum = 0;
  double measured_seconds = 0;
  for (int epoch = 0; epoch <= epochs; ++epoch) {  // epoch 0 warms up
    if (!(*consumer)->StartEpoch(epoch, 0).ok()) Die("StartEpoch failed");
    auto start = Clock::now();
    int64_t epoch_images = 0;
    for (;;) {
      auto b = (*consumer)->Next();
      if (!b.ok()) Die(b.status().ToString());
      if (!b->has_value()) break;
      const ferry::BatchField* image = (*b)->field("image");
      const uint8_t* p = static_cast<const uint8_t*>(image->data);
      const size_t row = image->bytes / (*b)->num_samples();
      for (uint32_t r = 0; r < (*b)->num_samples(); ++r) checksum += p[r * row + row / 2];
      epoch_images += (*b)->num_samples();
    }
    if (epoch > 0) {
      measured_seconds += Seconds(start);
      images += epoch_images;
    }
  }
  const double ferry_rate = images / measured_seconds;
  consumer->reset();
  client->reset();
  (*daemon)->Drain();

  printf(
      "host_pipeline_bench: %zu JPEGs (%.1f KiB mean) in %s, batch %d, "
      "RandomResizedCrop(%d)+flip\n",
      files.size(), total_bytes / 1024.0 / files.size(), data.c_str(), batch, size);
  printf("%-58s %12s %8s\n", "measurement", "images/s", "ratio");
  printf("%-58s %12.0f %8s\n", "libjpeg-turbo full decode, 1 thread (baseline)", full_decode,
         "1.00");
  printf("%-58s %12.0f %8.2f\n", "decode + RandomResizedCrop + flip, 1 thread", crop_decode,
         crop_decode / full_decode);
  printf("%-58s %12.0f %8.2f\n", "the same with full_decode (no DCT scaling), 1 thread",
         exact_decode, exact_decode / full_decode);
  printf("reduced-scale vs full_decode pixels: mean |difference| %.3f of 255 (worst file %.3f)\n",
         sum_abs / (static_cast<double>(out.size()) * files.size()), worst_file_mean);
  printf("%-58s %12.0f %8.2f\n",
         absl::StrCat("ferry host transport, ", workers, " worker(s), ", epochs, " epochs").c_str(),
         ferry_rate, ferry_rate / full_decode);
  printf("scaling efficiency: ferry / (%d x single-thread crop decode) = %.2f  (checksum %llu)\n",
         workers, ferry_rate / (workers * crop_decode), static_cast<unsigned long long>(checksum));
  return 0;
}
