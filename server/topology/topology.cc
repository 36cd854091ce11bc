#include "server/topology/topology.h"

#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "common/unique_fd.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

// Linux's NR_CPUS tops out at 8192; anything far beyond that in a cpulist is garbage, and
// accepting it would let one bad file allocate an enormous vector.
constexpr int kMaxCpu = 1 << 16;

// Reads a small sysfs attribute. NOT_FOUND when it does not exist, other errno values map
// through ErrnoToStatus; the message always names the file.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("open '", path, "'"));
  }
  std::string text;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      return absl::ErrnoToStatus(err, absl::StrCat("read '", path, "'"));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

absl::StatusOr<std::vector<int>> ReadCpuListFile(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList(text);
  if (!cpus.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse '", path, "': ", cpus.status().message()));
  }
  return cpus;
}

// Parses a sysfs hex attribute such as "0x10de\n". Returns false when it is absent or
// unparsable: for vendor/class that only means "not a device we care about".
bool ReadHexFile(const std::string& path, uint32_t* value) {
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) return false;
  absl::string_view s = absl::StripAsciiWhitespace(*text);
  if (absl::StartsWith(s, "0x") || absl::StartsWith(s, "0X")) s.remove_prefix(2);
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *value, 16);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// "0000:3b:00.0" form, lower case; a bus id without a domain gets domain 0000.
std::string NormalizeBusId(absl::string_view bus_id) {
  std::string id = absl::AsciiStrToLower(absl::StripAsciiWhitespace(bus_id));
  if (std::count(id.begin(), id.end(), ':') == 1) id = absl::StrCat("0000:", id);
  return id;
}

std::vector<int> MergeSorted(const std::vector<NumaNode>& nodes) {
  std::vector<int> all;
  for (const NumaNode& node : nodes) all.insert(all.end(), node.cpus.begin(), node.cpus.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

absl::Status ReadNodes(const std::string& sysfs_root, std::vector<NumaNode>* nodes) {
  const fs::path node_dir = fs::path(sysfs_root) / "devices/system/node";
  std::error_code ec;
  for (fs::directory_iterator it(node_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int id = 0;
    if (!absl::StartsWith(name, "node") || !absl::SimpleAtoi(name.substr(4), &id) || id < 0) {
      continue;  // "possible", "online", "has_cpu", ... are attributes, not nodes.
    }
    NumaNode node;
    node.id = id;
    // A node without a cpulist (memory-only, e.g. CXL) simply has no CPUs.
    const std::string cpulist = (it->path() / "cpulist").string();
    absl::StatusOr<std::vector<int>> cpus = ReadCpuListFile(cpulist);
    if (cpus.ok()) {
      node.cpus = *std::move(cpus);
    } else if (!absl::IsNotFound(cpus.status())) {
      return cpus.status();
    }
    nodes->push_back(std::move(node));
  }
  std::sort(nodes->begin(), nodes->end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  return absl::OkStatus();
}

absl::Status ReadGpus(const std::string& sysfs_root, std::vector<PciGpu>* gpus) {
  constexpr uint32_t kVendorNvidia = 0x10de;
  constexpr uint32_t kClassDisplay = 0x03;  // base class: VGA (0x0300) or 3D (0x0302)
  const fs::path pci_dir = fs::path(sysfs_root) / "bus/pci/devices";
  std::error_code ec;
  for (fs::directory_iterator it(pci_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path dev = it->path();
    uint32_t vendor = 0, pci_class = 0;
    if (!ReadHexFile((dev / "vendor").string(), &vendor) || vendor != kVendorNvidia) continue;
    if (!ReadHexFile((dev / "class").string(), &pci_class) || (pci_class >> 16) != kClassDisplay) {
      continue;
    }
    PciGpu gpu;
    gpu.bus_id = NormalizeBusId(dev.filename().string());
    const std::string numa_path = (dev / "numa_node").string();
    absl::StatusOr<std::string> numa_text = ReadSmallFile(numa_path);
    if (numa_text.ok()) {
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*numa_text), &gpu.numa_node)) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot parse '", numa_path, "': expected a node number or -1, got '",
                         absl::StripAsciiWhitespace(*numa_text), "'"));
      }
      if (gpu.numa_node < 0) gpu.numa_node = -1;
    } else if (!absl::IsNotFound(numa_text.status())) {
      return numa_text.status();
    }
    absl::StatusOr<std::vector<int>> local = ReadCpuListFile((dev / "local_cpulist").string());
    if (local.ok()) {
      gpu.local_cpus = *std::move(local);
    } else if (!absl::IsNotFound(local.status())) {
      return local.status();
    }
    gpus->push_back(std::move(gpu));
  }
  std::sort(gpus->begin(), gpus->end(),
            [](const PciGpu& a, const PciGpu& b) { return a.bus_id < b.bus_id; });
  return absl::OkStatus();
}

struct CpuSetDeleter {
  void operator()(cpu_set_t* set) const { CPU_FREE(set); }
};

struct BitmaskDeleter {
  void operator()(struct bitmask* mask) const { numa_bitmask_free(mask); }
};

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  std::vector<int> cpus;
  absl::string_view all = absl::StripAsciiWhitespace(text);
  if (all.empty()) return cpus;
  auto parse_cpu = [&](absl::string_view s, int* cpu) -> absl::Status {
    s = absl::StripAsciiWhitespace(s);
    if (!absl::SimpleAtoi(s, cpu) || s.empty() || !absl::ascii_isdigit(s[0])) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid CPU list '", all, "': '", s, "' is not a CPU number"));
    }
    if (*cpu > kMaxCpu) {
      return absl::InvalidArgumentError(absl::StrCat("invalid CPU list '", all, "': CPU ", *cpu,
                                                     " is beyond the supported maximum ", kMaxCpu));
    }
    return absl::OkStatus();
  };
  for (absl::string_view item : absl::StrSplit(all, ',')) {
    std::vector<absl::string_view> bounds = absl::StrSplit(item, '-');
    if (bounds.size() > 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid CPU list '", all, "': '", item, "' is not a CPU or a range"));
    }
    int lo = 0, hi = 0;
    FERRY_RETURN_IF_ERROR(parse_cpu(bounds[0], &lo));
    hi = lo;
    if (bounds.size() == 2) FERRY_RETURN_IF_ERROR(parse_cpu(bounds[1], &hi));
    if (hi < lo) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid CPU list '", all, "': range '", item, "' ends before it starts"));
    }
    for (int cpu = lo; cpu <= hi; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

absl::StatusOr<Topology> Topology::Read(const std::string& sysfs_root) {
  Topology topo;
  topo.sysfs_root_ = sysfs_root;
  FERRY_RETURN_IF_ERROR(ReadNodes(sysfs_root, &topo.nodes_));
  if (topo.nodes_.empty()) {
    // Containers and kernels without CONFIG_NUMA: one node holding every online CPU.
    const std::string online = (fs::path(sysfs_root) / "devices/system/cpu/online").string();
    absl::StatusOr<std::vector<int>> cpus = ReadCpuListFile(online);
    if (!cpus.ok()) {
      if (absl::IsNotFound(cpus.status())) {
        return absl::NotFoundError(absl::StrCat(
            "sysfs root '", sysfs_root,
            "' has neither devices/system/node/node* directories nor devices/system/cpu/online; "
            "is sysfs mounted there?"));
      }
      return cpus.status();
    }
    topo.nodes_.push_back(NumaNode{.id = 0, .cpus = *std::move(cpus)});
  }
  FERRY_RETURN_IF_ERROR(ReadGpus(sysfs_root, &topo.gpus_));
  // Fill in the documented fallback now, so PciGpu::local_cpus is always usable.
  for (PciGpu& gpu : topo.gpus_) {
    if (gpu.local_cpus.empty()) gpu.local_cpus = topo.CpusForNode(gpu.numa_node);
  }
  return topo;
}

std::vector<int> Topology::AllCpus() const { return MergeSorted(nodes_); }

int Topology::NumaNodeOfPciDevice(const std::string& bus_id) const {
  const std::string id = NormalizeBusId(bus_id);
  for (const PciGpu& gpu : gpus_) {
    if (gpu.bus_id == id) return gpu.numa_node;
  }
  return -1;
}

std::vector<int> Topology::CpusForPciDevice(const std::string& bus_id) const {
  const std::string id = NormalizeBusId(bus_id);
  for (const PciGpu& gpu : gpus_) {
    if (gpu.bus_id == id) return gpu.local_cpus;
  }
  return AllCpus();
}

std::vector<int> Topology::CpusForNode(int node) const {
  for (const NumaNode& n : nodes_) {
    if (n.id == node && !n.cpus.empty()) return n.cpus;
  }
  return AllCpus();
}

absl::Status PinCurrentThreadToCpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return absl::OkStatus();
  const int max_cpu = *std::max_element(cpus.begin(), cpus.end());
  const int min_cpu = *std::min_element(cpus.begin(), cpus.end());
  if (min_cpu < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot pin thread: CPU ", min_cpu, " is negative"));
  }
  // Dynamically sized, so machines with more than CPU_SETSIZE (1024) CPUs work.
  const int num_cpus = std::max(max_cpu + 1, CPU_SETSIZE);
  std::unique_ptr<cpu_set_t, CpuSetDeleter> set(CPU_ALLOC(num_cpus));
  if (set == nullptr) return absl::ResourceExhaustedError("CPU_ALLOC failed");
  const size_t set_size = CPU_ALLOC_SIZE(num_cpus);
  CPU_ZERO_S(set_size, set.get());
  for (int cpu : cpus) CPU_SET_S(cpu, set_size, set.get());
  const int err = pthread_setaffinity_np(pthread_self(), set_size, set.get());
  if (err != 0) {
    return absl::Status(
        absl::ErrnoToStatusCode(err),
        absl::StrCat("pthread_setaffinity_np to ", cpus.size(), " CPUs (", min_cpu, "..", max_cpu,
                     ") failed: errno ", err, " (", std::strerror(err),
                     "); are these CPUs online and in this process's cpuset?"));
  }
  return absl::OkStatus();
}

absl::Status BindMemoryToNode(void* addr, size_t bytes, int node) {
  if (node < 0 || bytes == 0) return absl::OkStatus();
  if (numa_available() < 0) return absl::OkStatus();
  const long page = ::sysconf(_SC_PAGESIZE);
  if (reinterpret_cast<uintptr_t>(addr) % static_cast<uintptr_t>(page) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("BindMemoryToNode: address ",
                                                   absl::Hex(reinterpret_cast<uintptr_t>(addr)),
                                                   " is not aligned to the page size ", page));
  }
  if (node > numa_max_node()) {
    return absl::InvalidArgumentError(absl::StrCat("BindMemoryToNode: NUMA node ", node,
                                                   " does not exist (highest node is ",
                                                   numa_max_node(), ")"));
  }
  std::unique_ptr<struct bitmask, BitmaskDeleter> mask(numa_allocate_nodemask());
  if (mask == nullptr) return absl::ResourceExhaustedError("numa_allocate_nodemask failed");
  numa_bitmask_setbit(mask.get(), static_cast<unsigned int>(node));
  // The kernel reads maxnode - 1 bits (a historical off-by-one), hence the + 1.
  if (mbind(addr, bytes, MPOL_BIND, mask->maskp, mask->size + 1, 0) != 0) {
    int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("mbind(MPOL_BIND, node ", node, ", ", bytes,
                                     " bytes) failed: errno ", err, " (", std::strerror(err), ")"));
  }
  return absl::OkStatus();
}

}  // namespace ferry
