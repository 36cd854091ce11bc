#include "server/gpu/cuda_gpu_provider.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "cuda/cuda_resources.h"
#include "server/gpu/cuda_stage.h"
#include "server/gpu/device_slot_layout.h"
#include "server/gpu/jpeg/nvjpeg_library.h"

namespace ferry {

CudaGpuProvider::CudaGpuProvider(const Topology& topology, MemoryBudget* pinned,
                                 uint64_t device_budget_bytes, const std::string& config_path,
                                 GatherOptions gather)
    : pinned_(pinned), mappings_(pinned), gather_(gather) {
  auto count = DeviceCount();
  if (!count.ok()) {
    unavailable_ = std::string(count.status().message());
    return;
  }
  for (int i = 0; i < *count; ++i) {
    auto info = GetDeviceInfo(i);
    if (!info.ok()) continue;
    Gpu gpu;
    gpu.ordinal = i;
    gpu.name = info->name;
    gpu.pci_bus_id = info->pci_bus_id;
    gpu.numa_node = topology.NumaNodeOfPciDevice(info->pci_bus_id);
    // The worker pool runs a GPU's jobs on its node's group (all CPUs without a node).
    gpu.worker_cpus = gpu.numa_node >= 0 ? topology.CpusForNode(gpu.numa_node) : topology.AllCpus();
    const uint64_t budget = device_budget_bytes != 0 ? device_budget_bytes : info->total_memory / 4;
    gpu.device_budget =
        std::make_unique<MemoryBudget>(absl::StrCat("device memory budget of GPU ", i),
                                       "device_memory_budget_bytes", budget, config_path);
    gpus_.push_back(std::move(gpu));
  }
  if (gpus_.empty() && unavailable_.empty()) unavailable_ = "the CUDA runtime reports no GPU";
}

absl::StatusOr<int> CudaGpuProvider::Resolve(const std::string& device) const {
  std::string rest = device.substr(std::min<size_t>(device.size(), 5));  // after "cuda:"
  const Gpu* found = nullptr;
  int ordinal;
  if (absl::SimpleAtoi(rest, &ordinal)) {
    for (const Gpu& g : gpus_) {
      if (g.ordinal == ordinal) found = &g;
    }
  } else {
    std::string want = absl::AsciiStrToLower(rest);
    if (want.size() == 7 && want[2] == ':') want = "0000:" + want;  // "3b:00.0" form
    for (const Gpu& g : gpus_) {
      if (g.pci_bus_id == want) found = &g;
    }
  }
  if (found != nullptr) return found->ordinal;
  return absl::FailedPreconditionError(absl::StrCat(
      "device '", device, "' is not a GPU this ferryd can use; it sees ", Describe(),
      ". Use device=\"cuda:N\" with one of those ordinals (or its PCI bus id), or \"cpu\""));
}

absl::Status CudaGpuProvider::GpuDecodeAvailable() const { return NvJpegLibrary::Load().status(); }

absl::Status CudaGpuProvider::CheckJob(const Job& job) const {
  return DeviceSlotLayout::Make(job.layout(), job.spec().image_output()).status();
}

absl::StatusOr<std::unique_ptr<DeviceStage>> CudaGpuProvider::MakeStage(const Job& job, int ordinal,
                                                                        const SharedSlab& slab,
                                                                        int num_slots) {
  const Gpu& gpu = gpus_.at(ordinal);
  FERRY_ASSIGN_OR_RETURN(
      std::unique_ptr<CudaStage> stage,
      CudaStage::Create(ordinal, gpu.pci_bus_id, job, slab, num_slots, pinned_,
                        gpu.device_budget.get(), gpu.counters, &mappings_, gather_));
  return std::unique_ptr<DeviceStage>(std::move(stage));
}

void CudaGpuProvider::FillStatus(ferry::v1::DaemonStatus* status) const {
  status->set_cuda_available(!gpus_.empty());
  status->set_pinned_memory_in_use_bytes(pinned_->in_use());
  status->set_pinned_memory_budget_bytes(pinned_->limit());
  for (const Gpu& g : gpus_) {
    ferry::v1::GpuStatus* s = status->add_gpus();
    s->set_ordinal(g.ordinal);
    s->set_name(g.name);
    s->set_pci_bus_id(g.pci_bus_id);
    s->set_numa_node(g.numa_node);
    s->set_device_memory_in_use_bytes(g.device_budget->in_use());
    s->set_device_memory_budget_bytes(g.device_budget->limit());
    for (int cpu : g.worker_cpus) s->add_local_cpus(cpu);
    const GpuCounters& c = *g.counters;
    s->set_pinned_memory_in_use_bytes(c.pinned_bytes.load(std::memory_order_relaxed));
    const uint64_t bytes = c.bytes_to_device.load(std::memory_order_relaxed);
    s->set_bytes_to_device(bytes);
    s->set_h2d_bytes_per_second(rates_.Rate(g.ordinal, bytes));
    s->set_batches_in_flight(
        static_cast<uint32_t>(std::max<int64_t>(0, c.in_flight.load(std::memory_order_relaxed))));
    s->set_ranks(static_cast<uint32_t>(c.stages.load(std::memory_order_relaxed)));
    s->set_jpeg_gpu_images(c.jpeg_gpu_images.load(std::memory_order_relaxed));
    s->set_jpeg_cpu_images(c.jpeg_cpu_images.load(std::memory_order_relaxed));
    for (int r = 1; r <= kNumGpuJpegRejects; ++r) {
      const int64_t n = c.jpeg_fallbacks[r].load(std::memory_order_relaxed);
      if (n == 0) continue;
      ferry::v1::ReasonCount* f = s->add_jpeg_fallbacks();
      f->set_reason(r == kNumGpuJpegRejects
                        ? std::string("not_jpeg")
                        : std::string(GpuJpegRejectName(static_cast<GpuJpegReject>(r))));
      f->set_count(n);
    }
  }
}

std::string CudaGpuProvider::Describe() const {
  if (gpus_.empty()) return absl::StrCat("no GPU (", unavailable_, ")");
  std::vector<std::string> parts;
  for (const Gpu& g : gpus_) {
    parts.push_back(absl::StrCat("cuda:", g.ordinal, " = ", g.name, " at ", g.pci_bus_id));
  }
  return absl::StrJoin(parts, ", ");
}

double CudaGpuProvider::RateTracker::Rate(int ordinal, uint64_t bytes) {
  absl::MutexLock lock(&mutex_);
  const absl::Time now = absl::Now();
  std::deque<Sample>& samples = samples_[ordinal];
  if (samples.empty()) samples.push_back({start_, 0});
  while (samples.size() > 1 && now - samples[1].time >= absl::Seconds(1) &&
         now - samples.front().time > absl::Seconds(10)) {
    samples.pop_front();
  }
  const Sample& then = samples.front();
  const double seconds = absl::ToDoubleSeconds(now - then.time);
  const double rate = seconds > 0 ? static_cast<double>(bytes - then.bytes) / seconds : 0;
  // At most two samples a second: about 20 held per GPU.
  if (now - samples.back().time >= absl::Milliseconds(500)) samples.push_back({now, bytes});
  return rate;
}

std::unique_ptr<GpuProvider> MakeCudaGpuProvider(const Topology& topology,
                                                 MemoryBudget* pinned_budget,
                                                 uint64_t device_budget_bytes,
                                                 const std::string& config_path,
                                                 GatherOptions gather) {
  return std::make_unique<CudaGpuProvider>(topology, pinned_budget, device_budget_bytes,
                                           config_path, gather);
}

}  // namespace ferry
