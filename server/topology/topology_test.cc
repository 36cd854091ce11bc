#include "server/topology/topology.h"

#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<int> Range(int lo, int hi_inclusive) {
  std::vector<int> v(hi_inclusive - lo + 1);
  std::iota(v.begin(), v.end(), lo);
  return v;
}

std::vector<int> Concat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A sysfs tree in a fresh temporary directory, removed on destruction.
class FakeSysfs {
 public:
  FakeSysfs() {
    std::string tmpl = (fs::temp_directory_path() / "ferry_topology_XXXXXX").string();
    root_ = ::mkdtemp(tmpl.data());
    EXPECT_FALSE(root_.empty()) << "mkdtemp failed";
  }
  ~FakeSysfs() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  FakeSysfs(const FakeSysfs&) = delete;
  FakeSysfs& operator=(const FakeSysfs&) = delete;

  const std::string& root() const { return root_; }

  void Write(const std::string& rel, const std::string& text) {
    const fs::path path = fs::path(root_) / rel;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  void Node(int id, const std::string& cpulist) {
    Write("devices/system/node/node" + std::to_string(id) + "/cpulist", cpulist + "\n");
  }
  // numa_node / local_cpulist are omitted when empty.
  void Pci(const std::string& bus_id, const std::string& vendor, const std::string& pci_class,
           const std::string& numa_node, const std::string& local_cpulist) {
    const std::string dir = "bus/pci/devices/" + bus_id + "/";
    Write(dir + "vendor", vendor + "\n");
    Write(dir + "class", pci_class + "\n");
    if (!numa_node.empty()) Write(dir + "numa_node", numa_node + "\n");
    if (!local_cpulist.empty()) Write(dir + "local_cpulist", local_cpulist + "\n");
  }
  void Gpu(const std::string& bus_id, const std::string& numa_node,
           const std::string& local_cpulist) {
    Pci(bus_id, "0x10de", "0x030200", numa_node, local_cpulist);
  }

 private:
  std::string root_;
};

// A 2-socket, 8-GPU host like a DGX-style box: SMT siblings give each node two CPU ranges.
void BuildTwoSocketHost(FakeSysfs& sys) {
  sys.Node(0, "0-15,32-47");
  sys.Node(1, "16-31,48-63");
  // Attribute files next to the node directories must not be taken for nodes.
  sys.Write("devices/system/node/possible", "0-1\n");
  sys.Write("devices/system/node/online", "0-1\n");
  sys.Write("devices/system/cpu/online", "0-63\n");
  const std::string n0 = "0-15,32-47", n1 = "16-31,48-63";
  sys.Gpu("0000:18:00.0", "0", n0);
  sys.Gpu("0000:2a:00.0", "0", n0);
  sys.Gpu("0000:3a:00.0", "0", n0);
  sys.Gpu("0000:5d:00.0", "0", n0);
  sys.Gpu("0000:9a:00.0", "1", n1);
  sys.Gpu("0000:ab:00.0", "1", n1);
  sys.Gpu("0000:ba:00.0", "1", n1);
  sys.Gpu("0000:db:00.0", "-1", "");  // firmware gave no locality
  // Not GPUs: a Mellanox NIC, an NVIDIA NVSwitch bridge and an NVIDIA HDMI audio function.
  sys.Pci("0000:17:00.0", "0x15b3", "0x020700", "0", n0);
  sys.Pci("0000:c5:00.0", "0x10de", "0x068000", "1", n1);
  sys.Pci("0000:18:00.1", "0x10de", "0x040300", "0", n0);
}

TEST(TopologyTest, TwoSocketEightGpuHost) {
  FakeSysfs sys;
  BuildTwoSocketHost(sys);
  absl::StatusOr<Topology> topo = Topology::Read(sys.root());
  ASSERT_TRUE(topo.ok()) << topo.status();

  const std::vector<int> node0 = Concat(Range(0, 15), Range(32, 47));
  const std::vector<int> node1 = Concat(Range(16, 31), Range(48, 63));
  ASSERT_EQ(topo->nodes().size(), 2u);
  EXPECT_EQ(topo->nodes()[0].id, 0);
  EXPECT_EQ(topo->nodes()[0].cpus, node0);
  EXPECT_EQ(topo->nodes()[1].id, 1);
  EXPECT_EQ(topo->nodes()[1].cpus, node1);
  EXPECT_EQ(topo->AllCpus(), Range(0, 63));

  ASSERT_EQ(topo->gpus().size(), 8u);
  std::vector<std::string> ids;
  for (const PciGpu& gpu : topo->gpus()) ids.push_back(gpu.bus_id);
  EXPECT_THAT(ids, ElementsAre("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
                               "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(topo->gpus()[i].numa_node, 0) << ids[i];
    EXPECT_EQ(topo->gpus()[i].local_cpus, node0) << ids[i];
  }
  for (int i = 4; i < 7; ++i) {
    EXPECT_EQ(topo->gpus()[i].numa_node, 1) << ids[i];
    EXPECT_EQ(topo->gpus()[i].local_cpus, node1) << ids[i];
  }
  EXPECT_EQ(topo->gpus()[7].numa_node, -1);
  EXPECT_EQ(topo->gpus()[7].local_cpus, Range(0, 63));

  EXPECT_EQ(topo->NumaNodeOfPciDevice("0000:9a:00.0"), 1);
  EXPECT_EQ(topo->CpusForPciDevice("0000:9a:00.0"), node1);
  EXPECT_EQ(topo->NumaNodeOfPciDevice("0000:db:00.0"), -1);
  EXPECT_EQ(topo->CpusForPciDevice("0000:db:00.0"), Range(0, 63));
  // The NIC is not a GPU, so the topology does not know it.
  EXPECT_EQ(topo->NumaNodeOfPciDevice("0000:17:00.0"), -1);
  EXPECT_EQ(topo->NumaNodeOfPciDevice("0000:ff:00.0"), -1);
  EXPECT_EQ(topo->CpusForPciDevice("0000:ff:00.0"), Range(0, 63));

  EXPECT_EQ(topo->CpusForNode(0), node0);
  EXPECT_EQ(topo->CpusForNode(1), node1);
  EXPECT_EQ(topo->CpusForNode(-1), Range(0, 63));
  EXPECT_EQ(topo->CpusForNode(7), Range(0, 63));
}

TEST(TopologyTest, LocalCpulistWinsOverNodeAndNodeOverAll) {
  FakeSysfs sys;
  sys.Node(0, "0-3");
  sys.Node(1, "4-7");
  sys.Gpu("0000:01:00.0", "1", "6-7");  // narrower than its node
  sys.Gpu("0000:02:00.0", "1", "");     // no local_cpulist: its node's CPUs
  absl::StatusOr<Topology> topo = Topology::Read(sys.root());
  ASSERT_TRUE(topo.ok()) << topo.status();
  EXPECT_THAT(topo->CpusForPciDevice("0000:01:00.0"), ElementsAre(6, 7));
  EXPECT_THAT(topo->CpusForPciDevice("0000:02:00.0"), ElementsAre(4, 5, 6, 7));
}

TEST(TopologyTest, SingleNodeMachine) {
  FakeSysfs sys;
  sys.Node(0, "0-7");
  sys.Gpu("0000:01:00.0", "0", "0-7");
  absl::StatusOr<Topology> topo = Topology::Read(sys.root());
  ASSERT_TRUE(topo.ok()) << topo.status();
  ASSERT_EQ(topo->nodes().size(), 1u);
  EXPECT_EQ(topo->nodes()[0].id, 0);
  EXPECT_EQ(topo->nodes()[0].cpus, Range(0, 7));
  ASSERT_EQ(topo->gpus().size(), 1u);
  EXPECT_EQ(topo->gpus()[0].numa_node, 0);
  EXPECT_EQ(topo->CpusForPciDevice("01:00.0"), Range(0, 7));
}

TEST(TopologyTest, NoNodeDirectoriesFallsBackToOnlineCpus) {
  FakeSysfs sys;
  sys.Write("devices/system/cpu/online", "0-3,6\n");
  absl::StatusOr<Topology> topo = Topology::Read(sys.root());
  ASSERT_TRUE(topo.ok()) << topo.status();
  ASSERT_EQ(topo->nodes().size(), 1u);
  EXPECT_EQ(topo->nodes()[0].id, 0);
  EXPECT_THAT(topo->nodes()[0].cpus, ElementsAre(0, 1, 2, 3, 6));
  EXPECT_THAT(topo->gpus(), IsEmpty());
  EXPECT_THAT(topo->AllCpus(), ElementsAre(0, 1, 2, 3, 6));
}

TEST(TopologyTest, EmptyRootIsNotFound) {
  FakeSysfs sys;
  absl::StatusOr<Topology> topo = Topology::Read(sys.root());
  EXPECT_EQ(topo.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(topo.status().message(), HasSubstr(sys.root()));
}

TEST(TopologyTest, MalformedNodeCpulistNamesTheFile) {
  FakeSysfs sys;
  sys.Node(0, "0-15");
  sys.Node(1, "16-x");
  absl::StatusOr<Topology> topo = Topology::Read(sys.root());
  EXPECT_EQ(topo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(topo.status().message(),
              HasSubstr(sys.root() + "/devices/system/node/node1/cpulist"));
  EXPECT_THAT(topo.status().message(), HasSubstr("16-x"));
}

TEST(TopologyTest, MalformedGpuFilesNameTheFile) {
  {
    FakeSysfs sys;
    sys.Node(0, "0-3");
    sys.Gpu("0000:01:00.0", "0", "0-3,,");
    absl::StatusOr<Topology> topo = Topology::Read(sys.root());
    EXPECT_EQ(topo.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(topo.status().message(),
                HasSubstr(sys.root() + "/bus/pci/devices/0000:01:00.0/local_cpulist"));
  }
  {
    FakeSysfs sys;
    sys.Node(0, "0-3");
    sys.Gpu("0000:01:00.0", "zero", "0-3");
    absl::StatusOr<Topology> topo = Topology::Read(sys.root());
    EXPECT_EQ(topo.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(topo.status().message(),
                HasSubstr(sys.root() + "/bus/pci/devices/0000:01:00.0/numa_node"));
  }
}

TEST(TopologyTest, BusIdMatchingIgnoresCaseAndDomain) {
  FakeSysfs sys;
  BuildTwoSocketHost(sys);
  absl::StatusOr<Topology> topo = Topology::Read(sys.root());
  ASSERT_TRUE(topo.ok()) << topo.status();
  for (const char* id : {"0000:ab:00.0", "ab:00.0", "0000:AB:00.0", "AB:00.0", " ab:00.0\n"}) {
    EXPECT_EQ(topo->NumaNodeOfPciDevice(id), 1) << id;
    EXPECT_EQ(topo->CpusForPciDevice(id), topo->CpusForNode(1)) << id;
  }
  EXPECT_EQ(topo->NumaNodeOfPciDevice("0001:ab:00.0"), -1);  // other domain
}

TEST(ParseCpuListTest, AcceptsKernelFormats) {
  EXPECT_THAT(*ParseCpuList(""), IsEmpty());
  EXPECT_THAT(*ParseCpuList("\n"), IsEmpty());
  EXPECT_THAT(*ParseCpuList("0"), ElementsAre(0));
  EXPECT_THAT(*ParseCpuList("0-3,8,10-11\n"), ElementsAre(0, 1, 2, 3, 8, 10, 11));
  EXPECT_THAT(*ParseCpuList(" 1 , 3-4 "), ElementsAre(1, 3, 4));
  EXPECT_THAT(*ParseCpuList("5-5"), ElementsAre(5));
  // Out of order and overlapping input comes back sorted and without duplicates.
  EXPECT_THAT(*ParseCpuList("8,3,1-4"), ElementsAre(1, 2, 3, 4, 8));
  EXPECT_EQ(ParseCpuList("0-63")->size(), 64u);
}

TEST(ParseCpuListTest, RejectsMalformedInput) {
  for (const char* bad : {"a", "1-", "-1", "3-1", "1,,2", "1-2-3", "0x1", "+1", "1 2", "99999999",
                          "0-99999999", ","}) {
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(bad);
    EXPECT_EQ(cpus.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
  }
  EXPECT_THAT(ParseCpuList("3-1").status().message(), HasSubstr("'3-1'"));
}

std::vector<int> ThreadAffinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);  // 0 = the calling thread
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

TEST(PinTest, PinsOnlyTheCallingThread) {
  const std::vector<int> before = ThreadAffinity();
  ASSERT_FALSE(before.empty());
  if (before.size() < 2) GTEST_SKIP() << "the process may run on one CPU only; nothing to narrow";
  // CPU 0 where the cpuset allows it; otherwise the first CPU we may use.
  const int target = before.front();
  std::vector<int> pinned;
  absl::Status status;
  std::thread t([&] {
    status = PinCurrentThreadToCpus({target});
    pinned = ThreadAffinity();
  });
  t.join();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(pinned, ElementsAre(target));
  EXPECT_EQ(ThreadAffinity(), before);  // the test's own thread is untouched
}

TEST(PinTest, EmptyIsNoChangeAndBadCpusFail) {
  const std::vector<int> before = ThreadAffinity();
  std::vector<int> after_empty;
  absl::Status empty, negative, absent;
  std::thread t([&] {
    empty = PinCurrentThreadToCpus({});
    after_empty = ThreadAffinity();
    negative = PinCurrentThreadToCpus({-1});
    absent = PinCurrentThreadToCpus({60000});  // no such CPU on any test machine
  });
  t.join();
  EXPECT_TRUE(empty.ok()) << empty;
  EXPECT_EQ(after_empty, before);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(absent.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(absent.message(), HasSubstr("pthread_setaffinity_np"));
}

// Anonymous pages owned for the duration of a test.
class Pages {
 public:
  explicit Pages(size_t bytes) : bytes_(bytes) {
    addr_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(addr_, MAP_FAILED);
  }
  ~Pages() {
    if (addr_ != MAP_FAILED) munmap(addr_, bytes_);
  }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(addr_); }

 private:
  size_t bytes_;
  void* addr_;
};

TEST(BindMemoryTest, NegativeNodeIsNoOp) {
  Pages pages(4 * 4096);
  EXPECT_TRUE(BindMemoryToNode(pages.get(), 4 * 4096, -1).ok());
}

TEST(BindMemoryTest, BindsToNode) {
  if (numa_available() < 0) GTEST_SKIP() << "kernel without NUMA support; binding is a no-op";
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Pages pages(4 * page);
  absl::Status status = BindMemoryToNode(pages.get(), 4 * page, 0);
  ASSERT_TRUE(status.ok()) << status;
  pages.get()[0] = 1;  // first touch after binding

  int mode = -1;
  std::vector<unsigned long> mask(16, 0);
  ASSERT_EQ(get_mempolicy(&mode, mask.data(), mask.size() * 8 * sizeof(unsigned long), pages.get(),
                          MPOL_F_ADDR),
            0);
  EXPECT_EQ(mode, MPOL_BIND);
  EXPECT_EQ(mask[0] & 1ul, 1ul);  // node 0
}

TEST(BindMemoryTest, RejectsBadArguments) {
  if (numa_available() < 0) GTEST_SKIP() << "kernel without NUMA support; binding is a no-op";
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Pages pages(4 * page);
  absl::Status unaligned = BindMemoryToNode(pages.get() + 1, page, 0);
  EXPECT_EQ(unaligned.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unaligned.message(), HasSubstr("aligned"));
  absl::Status no_node = BindMemoryToNode(pages.get(), page, numa_max_node() + 1);
  EXPECT_EQ(no_node.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_node.message(), HasSubstr("does not exist"));
}

}  // namespace
}  // namespace ferry
