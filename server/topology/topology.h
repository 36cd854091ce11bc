// The machine's NUMA layout as sysfs describes it, and thread pinning.
//
// Everything is read from a sysfs root directory parameter ("/sys" in production) so tests
// can feed fake trees:
//   <root>/devices/system/node/node<N>/cpulist         CPUs of NUMA node N
//   <root>/bus/pci/devices/<bus id>/numa_node          -1 means "no preference"
//   <root>/bus/pci/devices/<bus id>/local_cpulist      CPUs local to the device
//   <root>/bus/pci/devices/<bus id>/{vendor,class}     0x10de + 0x03xxxx = NVIDIA GPU
// A machine whose sysfs has no node directories (some containers) is one node holding every
// online CPU (<root>/devices/system/cpu/online).
//
//   FERRY_ASSIGN_OR_RETURN(Topology topo, Topology::Read("/sys"));
//   std::vector<int> cpus = topo.CpusForPciDevice("0000:3b:00.0");
#ifndef FERRY_SERVER_TOPOLOGY_TOPOLOGY_H_
#define FERRY_SERVER_TOPOLOGY_TOPOLOGY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ferry {

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // sorted
};

struct PciGpu {
  std::string bus_id;           // "0000:3b:00.0", lower case
  int numa_node = -1;           // -1: no preference
  std::vector<int> local_cpus;  // sorted: local_cpulist, else its node's CPUs, else all
};

class Topology final {
 public:
  // INVALID_ARGUMENT naming the file when a cpulist cannot be parsed; NOT_FOUND when the
  // root has neither node directories nor a cpu/online file.
  static absl::StatusOr<Topology> Read(const std::string& sysfs_root);

  const std::vector<NumaNode>& nodes() const { return nodes_; }
  const std::vector<PciGpu>& gpus() const { return gpus_; }  // sorted by bus id
  std::vector<int> AllCpus() const;                          // sorted

  // NUMA node of a PCI device, -1 when unknown or no preference. `bus_id` is matched case-
  // insensitively and with or without the "0000:" domain.
  int NumaNodeOfPciDevice(const std::string& bus_id) const;
  // CPUs local to a PCI device: its local_cpulist, else its node's CPUs, else all CPUs.
  std::vector<int> CpusForPciDevice(const std::string& bus_id) const;
  // CPUs of node `node`, or all CPUs for -1 or an unknown node.
  std::vector<int> CpusForNode(int node) const;
  // Read from the running kernel's sysfs ("/sys"): its nodes are this machine's, and memory
  // may be bound to them. A topology read from elsewhere (a test's fake sysfs) describes
  // another machine.
  bool describes_this_machine() const { return sysfs_root_ == "/sys"; }

 private:
  std::vector<NumaNode> nodes_;
  std::vector<PciGpu> gpus_;
  std::string sysfs_root_;
};

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}. Whitespace and a trailing newline are ignored; an
// empty string is an empty list.
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text);

// Pins the calling thread to `cpus` (sched_setaffinity). Empty = no change.
absl::Status PinCurrentThreadToCpus(const std::vector<int>& cpus);

// Binds [addr, addr + bytes) to NUMA node `node` with mbind(MPOL_BIND) through libnuma, before
// first touch. node < 0 or a machine without NUMA support is a no-op.
absl::Status BindMemoryToNode(void* addr, size_t bytes, int node);

}  // namespace ferry

#endif  // FERRY_SERVER_TOPOLOGY_TOPOLOGY_H_
