// How many batches a second one rank's data plane carries: the shared-memory batch channel
// (default) next to the gRPC stream (FERRY_BATCH_CHANNEL=grpc, the data plane before it),
// measured in the same run, interleaved, with batches small enough that moving the bytes
// costs nothing and the per-batch messages are all that is left.
//
//   batch_rate_bench [--batches 20000] [--rounds 3] [--batch 1] [--seq-len 255]
//                    [--prefetch 0] [--workers N]
//
// ferryd runs in this process (its workers, gRPC and channel threads compete with the
// trainer for this machine's cores); the trainer is the C++ client taking batches in order
// and releasing each one right after touching one byte of it. Reported per round: batches/s
// over `batches` batches after 1,000 warm-up batches, the mean time the trainer spent
// inside Next(), and channel / gRPC.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/client.h"
#include "server/service/daemon.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  fprintf(stderr, "batch_rate_bench: %s\n", what.c_str());
  exit(1);
}

struct Rate {
  double batches_per_second = 0;
  double next_us = 0;  // mean time inside Next()
};

// One attach of rank 0 of `job_id`, with batches on the channel or the gRPC stream.
Rate Measure(ferry::Client& client, const std::string& job_id, bool channel, int64_t batches,
             int64_t batches_per_epoch, int64_t* epoch) {
  setenv("FERRY_BATCH_CHANNEL", channel ? "shm" : "grpc", 1);
  absl::StatusOr<std::unique_ptr<ferry::Consumer>> consumer;
  // The previous round's stream of this job may still be ending on ferryd's side.
  for (int attempt = 0;; ++attempt) {
    consumer = client.Attach(job_id, 0);
    if (consumer.ok() || attempt == 100) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!consumer.ok()) Die(consumer.status().ToString());
  constexpr int64_t kWarmup = 1000;
  int64_t taken = 0, in_epoch = batches_per_epoch;
  uint64_t checksum = 0;
  Clock::duration in_next{};
  Clock::time_point start;
  while (taken < kWarmup + batches) {
    if (in_epoch == batches_per_epoch) {
      // An epoch's end: start the next one (the EpochEnd is read by StartEpoch).
      if (!(*consumer)->StartEpoch((*epoch)++, 0).ok()) Die("StartEpoch failed");
      in_epoch = 0;
    }
    if (taken == kWarmup) {
      start = Clock::now();
      in_next = {};
    }
    const auto before = Clock::now();
    auto b = (*consumer)->Next();
    in_next += Clock::now() - before;
    if (!b.ok()) Die(b.status().ToString());
    if (!b->has_value()) Die("an epoch ended early");
    checksum += *static_cast<const uint8_t*>((*b)->fields()[0].data);
    if (!(*b)->Release().ok()) Die("Release failed");
    ++taken;
    ++in_epoch;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (checksum == 1) printf(" ");  // keeps the reads
  return Rate{batches / seconds,
              std::chrono::duration<double, std::micro>(in_next).count() / batches};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batches = 20000;
  int rounds = 3, batch = 1, seq_len = 255, prefetch = 0;
  int workers = static_cast<int>(std::thread::hardware_concurrency());
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--batches")
      batches = atoll(argv[i + 1]);
    else if (a == "--rounds")
      rounds = atoi(argv[i + 1]);
    else if (a == "--batch")
      batch = atoi(argv[i + 1]);
    else if (a == "--seq-len")
      seq_len = atoi(argv[i + 1]);
    else if (a == "--prefetch")
      prefetch = atoi(argv[i + 1]);
    else if (a == "--workers")
      workers = atoi(argv[i + 1]);
    else
      Die("unknown argument " + a);
  }
  const std::string dir = absl::StrCat("/tmp/ferry-rate-", getpid());
  std::filesystem::create_directories(dir);
  // Enough uint16 tokens for 50,000 samples; the values do not matter.
  const std::string tokens = dir + "/tokens.bin";
  {
    std::vector<uint16_t> data(static_cast<size_t>(seq_len) * 50000 + 1);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint16_t>(i * 2654435761u);
    std::ofstream(tokens, std::ios::binary)
        .write(reinterpret_cast<const char*>(data.data()),
               static_cast<std::streamsize>(data.size() * sizeof(uint16_t)));
  }
  ferry::DaemonOptions options;
  options.listen = dir + "/ferryd.sock";
  options.workers = workers;
  auto daemon = ferry::Daemon::Start(options);
  if (!daemon.ok()) Die(daemon.status().ToString());
  auto client = ferry::Client::Connect(options.listen);
  if (!client.ok()) Die(client.status().ToString());

  ferry::v1::JobSpec job;
  job.mutable_dataset()->mutable_tokens()->set_path(tokens);
  job.mutable_dataset()->mutable_tokens()->set_seq_len(static_cast<uint32_t>(seq_len));
  job.set_batch_size(static_cast<uint32_t>(batch));
  job.set_drop_last(true);
  job.set_prefetch_depth(static_cast<uint32_t>(prefetch));
  // One job per data plane, so one's ending stream never delays the other's attach.
  auto channel_job = (*client)->CreateJob("rate-channel", job);
  auto grpc_job = (*client)->CreateJob("rate-grpc", job);
  if (!channel_job.ok()) Die(channel_job.status().ToString());
  if (!grpc_job.ok()) Die(grpc_job.status().ToString());
  const int64_t per_epoch = channel_job->batches_per_epoch();
  const uint64_t batch_bytes = static_cast<uint64_t>(batch) * (seq_len + 1) * 8;

  printf(
      "batch_rate_bench: tokens, batch %d x %d int64 (%llu bytes), %lld batches per row, "
      "%d workers, prefetch %s, %u cores\n",
      batch, seq_len + 1, static_cast<unsigned long long>(batch_bytes),
      static_cast<long long>(batches), workers,
      prefetch == 0 ? "daemon default" : std::to_string(prefetch).c_str(),
      std::thread::hardware_concurrency());
  printf("%-6s %-34s %12s %12s %8s\n", "round", "data plane", "batches/s", "us in Next", "ratio");
  int64_t channel_epoch = 0, grpc_epoch = 0;
  for (int round = 1; round <= rounds; ++round) {
    const Rate grpc = Measure(**client, grpc_job->id(), false, batches, per_epoch, &grpc_epoch);
    const Rate shm = Measure(**client, channel_job->id(), true, batches, per_epoch, &channel_epoch);
    printf("%-6d %-34s %12.0f %12.1f %8s\n", round, "gRPC stream (baseline)",
           grpc.batches_per_second, grpc.next_us, "1.00");
    printf("%-6d %-34s %12.0f %12.1f %8.2f\n", round, "shared-memory batch channel",
           shm.batches_per_second, shm.next_us, shm.batches_per_second / grpc.batches_per_second);
  }
  client->reset();
  (*daemon)->Drain();
  std::filesystem::remove_all(dir);
  return 0;
}
