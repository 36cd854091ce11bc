// libFuzzer harness: a job request as a trainer sends it, end to end through validation.
// The input is a JobSpec in JSON (as the C ABI and the Python package take it), parsed by
// the client library, then created by a JobManager whose dataset_roots hold small datasets
// of every kind (under kRoot, which the seed corpus names), attached as rank 0 (the slab is
// laid out and allocated) and deleted. Any spec is created or refused with a status; no
// size computed from it may wrap, and nothing may be read outside the roots.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "client/cpp/internal/json.h"
#include "server/memory/memory_budget.h"
#include "server/service/job_manager.h"
#include "testing/jpeg_writer.h"

namespace {

constexpr char kRoot[] = "/tmp/ferry-fuzz-jobspec";

void Put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A fixed tree the corpus refers to: tokens, records, an .npy array and an image folder.
void MakeDatasets() {
  namespace fs = std::filesystem;
  fs::create_directories(fs::path(kRoot) / "images/cat");
  std::string tokens;
  for (uint16_t t = 0; t < 2048; ++t) tokens.append(reinterpret_cast<const char*>(&t), 2);
  Put(std::string(kRoot) + "/tokens.bin", tokens);
  Put(std::string(kRoot) + "/records.bin", std::string(4096, '\x07'));
  std::string npy = "\x93NUMPY\x01\x00";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (8, 4), }";
  header.append(128 - 10 - header.size() - 1, ' ');  // preamble + header: 128 bytes
  header += '\n';
  npy += static_cast<char>(header.size());
  npy += '\0';
  npy += header;
  npy.append(8 * 4 * 4, '\0');
  Put(std::string(kRoot) + "/array.npy", npy);
  const std::vector<uint8_t> rgb = ferry::testutil::MakeTestPattern(24, 16, 1);
  const std::vector<uint8_t> jpeg = ferry::testutil::EncodeJpeg(rgb.data(), 24, 16, 80);
  for (const char* name : {"a.jpg", "b.jpg"}) {
    Put(std::string(kRoot) + "/images/cat/" + name,
        std::string(reinterpret_cast<const char*>(jpeg.data()), jpeg.size()));
  }
  std::filesystem::create_symlink("/etc/passwd", std::string(kRoot) + "/images/cat/c.jpg");
}

struct Daemon {
  std::unique_ptr<ferry::WorkerPool> pool;
  std::unique_ptr<ferry::MemoryBudget> budget;
  std::unique_ptr<ferry::JobManager> jobs;
};

Daemon* TheDaemon() {
  static Daemon* daemon = [] {
    std::filesystem::remove_all(kRoot);
    MakeDatasets();
    auto* d = new Daemon;
    d->pool = *ferry::WorkerPool::Create(*ferry::Topology::Read("/sys"), 1);
    d->budget = std::make_unique<ferry::MemoryBudget>(
        "host memory budget", "host_memory_budget_bytes", 64 << 20, "fuzz.conf");
    ferry::JobManager::Options options;
    options.dataset_roots = {kRoot};
    options.config_path = "fuzz.conf";
    d->jobs = std::make_unique<ferry::JobManager>(options, d->pool.get(), d->budget.get());
    return d;
  }();
  return daemon;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Daemon* d = TheDaemon();
  ferry::v1::JobSpec spec;
  const std::string json(reinterpret_cast<const char*>(data), size);
  if (!ferry::internal::FromJson(json, "JobSpec", &spec).ok()) return 0;
  const ferry::Caller caller{1000, 1};
  auto created = d->jobs->CreateJob(caller, "", spec);
  if (!created.ok()) return 0;
  const std::string id = created->job->identity().id;
  (void)d->jobs->Attach(caller, id, 0);
  (void)d->jobs->DeleteJob(caller, id);
  return 0;
}
