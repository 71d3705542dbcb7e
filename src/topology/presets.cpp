// Built-in machines. Each is written from published facts, named in the comments; where a fact
// was not available (a bus id, say) the value is marked illustrative. Where tests/data holds a file
// for the same machine, bus ids, NUMA layout and PCIe structure are copied from it, so the preset and
// the file agree (tests/topology/test_presets.cpp checks that).
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <utility>

#include "common/error.hpp"
#include "topology/loaders.hpp"

namespace topoccl::topo {

namespace {

constexpr uint32_t kClassBridge = 0x060400, kClassGpu = 0x030200, kClassIb = 0x020700, kClassEthernet = 0x020000;
constexpr uint16_t kVendorNvidia = 0x10de, kVendorMellanox = 0x15b3, kVendorAmazon = 0x1d0f;

Link pcie(int gen, int width) { return Link{.kind = LinkKind::Pcie, .pcieGen = gen, .pcieWidth = width}; }

Link nvlink(int count, int sm) {
  return Link{.kind = LinkKind::NvLink, .bandwidthGBs = count * nvlinkBandwidthPerLinkGBs(sm), .nvlinkCount = count,
              .nvlinkGeneration = nvlinkGenerationForSm(sm)};
}

// NCCL's spelling of a CPU set (sysfs cpumap): 32-bit hex words, most significant first.
std::string affinityMask(int totalCpus, std::initializer_list<std::pair<int, int>> ranges) {
  std::vector<uint32_t> words(static_cast<size_t>((totalCpus + 31) / 32), 0);
  for (auto [first, last] : ranges)
    for (int cpu = first; cpu <= last; ++cpu) words[static_cast<size_t>(cpu / 32)] |= 1u << (cpu % 32);
  std::string text;
  for (size_t i = words.size(); i-- > 0;) {
    char buf[10];
    std::snprintf(buf, sizeof buf, "%08x", words[i]);
    text += (text.empty() ? "" : ",") + std::string(buf);
  }
  return text;
}

// A machine as data: one builder turns it into a Topology, so the presets differ only in facts.
struct CpuSpec {
  int numaId = 0;
  std::string affinity{};
};
struct SwitchSpec {  // a PCIe switch (NCCL keeps one node per switch: the upstream port)
  std::string bus{};
  int cpu = 0;      // index into MachineSpec::cpus; the root it hangs from when parent < 0
  int parent = -1;  // index of an earlier switch, or -1 for directly under the CPU's root port
  uint16_t vendor = 0, device = 0;
};
struct DeviceSpec {  // a GPU or a NIC
  std::string bus{};
  int sw = -1;   // index into MachineSpec::switches, or -1 for directly under cpus[cpu]
  int cpu = 0;
  std::string netName{};  // NICs only
};
struct MachineSpec {
  std::string name{};
  std::string cpuVendor{};
  int cpuFamily = 0, cpuModel = 0;
  std::vector<CpuSpec> cpus{};
  int pcieGen = 3, pcieWidth = 16;
  std::vector<SwitchSpec> switches{};
  int sm = 0;
  std::string gpuModel{};
  uint16_t gpuDevice = 0;
  std::vector<DeviceSpec> gpus{};  // CUDA order is bus id order, as NCCL and the file loaders number them
  double nicGbps = 0;
  LinkLayer nicLayer = LinkLayer::InfiniBand;
  uint16_t nicVendor = 0, nicDevice = 0;
  std::vector<DeviceSpec> nics{};
  int nvswitchChips = 0, nvlinksPerGpu = 0;  // 0 chips: no NVSwitch fabric
};

Topology build(const MachineSpec& m) {
  Topology t;
  t.name = m.name;
  t.source = "preset:" + m.name;
  t.addVertex(Vertex{.kind = VertexKind::Host, .name = "host0"});
  std::vector<VertexId> cpus;
  for (const CpuSpec& c : m.cpus)
    cpus.push_back(t.addVertex(Vertex{.kind = VertexKind::Cpu, .name = "cpu" + std::to_string(c.numaId),
                                      .numaId = c.numaId, .cpuAffinity = c.affinity, .arch = "x86_64",
                                      .cpuVendor = m.cpuVendor, .cpuFamily = m.cpuFamily, .cpuModel = m.cpuModel}));
  // Every pair of NUMA nodes, at NCCL's inter-socket rate (what the NCCL XML loader builds too).
  for (size_t i = 0; i < cpus.size(); ++i)
    for (size_t j = i + 1; j < cpus.size(); ++j)
      t.addLink(cpus[i], cpus[j],
                Link{.kind = LinkKind::CpuInterconnect,
                     .bandwidthGBs = cpuInterconnectBandwidthGBs(m.cpuVendor, "x86_64", m.cpuModel)});
  std::vector<VertexId> switches;
  for (const SwitchSpec& s : m.switches) {
    VertexId id = t.addVertex(Vertex{.kind = VertexKind::PciSwitch, .name = "pcisw" + std::to_string(switches.size()),
                                     .busId = s.bus, .pciClass = kClassBridge, .pciVendor = s.vendor, .pciDevice = s.device});
    t.addLink(s.parent >= 0 ? switches.at(static_cast<size_t>(s.parent)) : cpus.at(static_cast<size_t>(s.cpu)), id,
              pcie(m.pcieGen, m.pcieWidth));
    switches.push_back(id);
  }
  auto parentOf = [&](const DeviceSpec& d) {
    return d.sw >= 0 ? switches.at(static_cast<size_t>(d.sw)) : cpus.at(static_cast<size_t>(d.cpu));
  };
  std::vector<DeviceSpec> gpus = m.gpus;
  std::sort(gpus.begin(), gpus.end(), [](const DeviceSpec& a, const DeviceSpec& b) { return a.bus < b.bus; });
  std::vector<VertexId> gpuIds;
  for (const DeviceSpec& g : gpus) {
    int index = static_cast<int>(gpuIds.size());
    VertexId id = t.addVertex(Vertex{.kind = VertexKind::Gpu, .name = "gpu" + std::to_string(index), .busId = g.bus,
                                     .pciClass = kClassGpu, .pciVendor = kVendorNvidia, .pciDevice = m.gpuDevice,
                                     .gpuIndex = index, .sm = m.sm, .gpuModel = m.gpuModel});
    t.addLink(parentOf(g), id, pcie(m.pcieGen, m.pcieWidth));
    gpuIds.push_back(id);
  }
  for (size_t k = 0; k < m.nics.size(); ++k) {
    const DeviceSpec& n = m.nics[k];
    bool ib = m.nicLayer == LinkLayer::InfiniBand;
    // IB HCAs, RoCE ConnectX parts and AWS EFA all do GPUDirect RDMA.
    VertexId id = t.addVertex(Vertex{.kind = VertexKind::Nic, .name = "nic" + std::to_string(k), .busId = n.bus,
                                     .pciClass = ib ? kClassIb : kClassEthernet, .pciVendor = m.nicVendor,
                                     .pciDevice = m.nicDevice, .netName = n.netName, .speedGbps = m.nicGbps,
                                     .linkLayer = m.nicLayer, .gpuDirect = true});
    t.addLink(parentOf(n), id, pcie(m.pcieGen, m.pcieWidth));
  }
  if (m.nvswitchChips > 0) {
    // However many chips the baseboard has, NCCL (and this model) sees one NVSwitch fabric per host.
    VertexId fabric = t.addVertex(Vertex{.kind = VertexKind::NvSwitch, .name = "nvswitch0", .physicalSwitches = m.nvswitchChips});
    for (VertexId g : gpuIds) t.addLink(g, fabric, nvlink(m.nvlinksPerGpu, m.sm));
  }
  return t;
}

// The DGX-1 hybrid cube-mesh as listed by msccl-tools `msccl/topologies/nvidia.py:dgx1` (also TACCL's and
// TE-CCL's NDv2): 24 NVLinks, 6 per GPU, diameter 2. The GPU numbering is msccl's; nvidia-smi on a
// DGX-1V (and NVIDIA/nccl#671) labels the same graph differently (there GPU0 has doubles to GPU3 and
// GPU4), so per-index facts hold for this preset, not for a given machine's CUDA order.
void addCubeMesh(Topology& t, int sm) {
  const int doubles[][2] = {{0, 1}, {0, 4}, {1, 3}, {2, 3}, {2, 6}, {4, 5}, {5, 7}, {6, 7}};
  const int singles[][2] = {{0, 2}, {0, 3}, {1, 2}, {1, 5}, {3, 7}, {4, 6}, {4, 7}, {5, 6}};
  auto gpu = [&](int i) { return *t.gpuByIndex(i); };
  for (const auto& p : doubles) t.addLink(gpu(p[0]), gpu(p[1]), nvlink(2, sm));
  for (const auto& p : singles) t.addLink(gpu(p[0]), gpu(p[1]), nvlink(1, sm));
}

// A common shape: each PCIe switch holds some GPUs and some NICs. Adds one switch and its devices.
// Returns the switch's index.
int addSwitch(MachineSpec& m, int cpu, const std::string& bus, std::initializer_list<std::string> gpus,
              std::initializer_list<std::pair<std::string, std::string>> nics, int parent = -1) {
  int sw = static_cast<int>(m.switches.size());
  m.switches.push_back(SwitchSpec{.bus = bus, .cpu = cpu, .parent = parent});
  for (const std::string& g : gpus) m.gpus.push_back(DeviceSpec{.bus = g, .sw = sw});
  for (const auto& [nicBus, netName] : nics) m.nics.push_back(DeviceSpec{.bus = nicBus, .sw = sw, .netName = netName});
  return sw;
}

std::string busId(int domain, int bus, int device = 0) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.0", domain, bus, device);
  return buf;
}

// DGX-1 with V100. Two Xeon E5-2698 v4 (Broadwell, model 79, 20 cores / 40 threads each); NUMA masks
// 0-19,40-59 and 20-39,60-79 as in NVIDIA/nccl#671. Per socket two PLX PEX8764 PCIe Gen3 switches
// (10b5:8764, nccl#671), each with 2 GPUs and 1 EDR 100 Gb/s IB NIC. Switch 0000:03:00.0 and GPU0-4
// bus ids follow nccl#671; the other bus ids are illustrative.
Topology dgx1() {
  MachineSpec m{.name = "dgx1", .cpuVendor = "GenuineIntel", .cpuFamily = 6, .cpuModel = 79,
                .cpus = {{0, affinityMask(80, {{0, 19}, {40, 59}})}, {1, affinityMask(80, {{20, 39}, {60, 79}})}},
                .pcieGen = 3, .sm = 70, .gpuModel = "Tesla V100-SXM2", .gpuDevice = 0x1db5 /* nccl#671 */,
                .nicGbps = 100, .nicLayer = LinkLayer::InfiniBand, .nicVendor = kVendorMellanox};
  addSwitch(m, 0, "0000:03:00.0", {"0000:06:00.0", "0000:07:00.0"}, {{"0000:05:00.0", "mlx5_0"}});
  addSwitch(m, 0, "0000:08:00.0", {"0000:0a:00.0", "0000:0b:00.0"}, {{"0000:0c:00.0", "mlx5_1"}});
  addSwitch(m, 1, "0000:83:00.0", {"0000:85:00.0", "0000:86:00.0"}, {{"0000:84:00.0", "mlx5_2"}});
  addSwitch(m, 1, "0000:88:00.0", {"0000:89:00.0", "0000:8a:00.0"}, {{"0000:8b:00.0", "mlx5_3"}});
  for (SwitchSpec& s : m.switches) s.vendor = 0x10b5, s.device = 0x8764;
  Topology t = build(m);
  addCubeMesh(t, m.sm);
  return t;
}

// Azure NDv2 (ND40rs_v2): the DGX-1 NVLink graph on 8 V100-SXM2-32GB, but ONE 100 Gb/s EDR IB NIC.
// From tests/data/nccl_azure-ndv2-topo.xml (Azure/azhpc-images topology/ndv2-topo.xml): Skylake
// (family 6, model 85), 2 NUMA nodes of 20 vCPUs with the file's masks, GPUs 0001-0004 on NUMA 0 and
// 0005-0008 on NUMA 1 attached flat to the CPUs (Hyper-V gives each device its own domain, no
// switches), links reported as 16 GT/s x16, the single NIC 0101:00:00.0 on NUMA 0. The file carries
// no NVLink (NCCL adds it from NVML at run time); the cube-mesh is the machine's (TACCL `ndv2`).
// NIC name illustrative (the skeleton has none).
Topology ndv2() {
  MachineSpec m{.name = "ndv2", .cpuVendor = "GenuineIntel", .cpuFamily = 6, .cpuModel = 85,
                .cpus = {{0, "00000000,000fffff"}, {1, "000000ff,fff00000"}}, .pcieGen = 4, .sm = 70,
                .gpuModel = "Tesla V100-SXM2-32GB", .gpuDevice = 0x1db5, .nicGbps = 100, .nicLayer = LinkLayer::InfiniBand};
  for (int g = 1; g <= 8; ++g) m.gpus.push_back(DeviceSpec{.bus = busId(g, 0), .cpu = g <= 4 ? 0 : 1});
  m.nics.push_back(DeviceSpec{.bus = "0101:00:00.0", .cpu = 0, .netName = "mlx5_0"});
  Topology t = build(m);
  addCubeMesh(t, m.sm);
  return t;
}

// NVIDIA DGX-2: 16 V100-SXM3-32GB-H (10de:1db8), 12 NVSwitch chips (6 per baseboard), each GPU with
// 6 NVLinks of 25 GB/s, one to each switch of its baseboard; NCCL's bandwidth table rates SM70 links at
// 20 GB/s. PCIe tree from tests/data/hwloc-v2_nvidia-dgx2.xml (open-mpi/hwloc tests/hwloc/xml/
// nvidiaDGX2.xml) as the hwloc loader collapses it: per host bridge a root port (8086:2030), a PLX
// PEX9781/9797 upstream switch and two PEX9781 leaf switches with 2 GPUs each, all Gen3 x16; 2 Xeon
// Platinum 8174 (Skylake, model 85). CPU masks are the real machine's 0-23,48-71 / 24-47,72-95
// (NVIDIA/nccl-tests#78); the file trims the CPUs. The file's NICs were removed upstream: the machine
// has 8 ConnectX-5 100 Gb/s IB NICs for compute, one per leaf switch (nvidia-smi in nccl-tests#78:
// GPU0/1 PIX to mlx5_0, PXB to mlx5_1). NIC bus ids are illustrative: the bus number each leaf switch's
// range leaves unused in the file (e.g. 0x35 in [33-36]). The 2 storage/management NICs are left out.
Topology dgx2() {
  MachineSpec m{.name = "dgx2", .cpuVendor = "GenuineIntel", .cpuFamily = 6, .cpuModel = 85,
                .cpus = {{0, affinityMask(96, {{0, 23}, {48, 71}})}, {1, affinityMask(96, {{24, 47}, {72, 95}})}},
                .pcieGen = 3, .sm = 70, .gpuModel = "Tesla V100-SXM3-32GB-H", .gpuDevice = 0x1db8,
                .nicGbps = 100, .nicLayer = LinkLayer::InfiniBand, .nicVendor = kVendorMellanox, .nicDevice = 0x1017,
                .nvswitchChips = 12, .nvlinksPerGpu = 6};
  struct HostBridge {
    int cpu;
    const char *rootPort, *upstream;
    uint16_t upstreamDevice;
    const char* leaf[2];
    const char* gpus[2][2];
    const char* nic[2];
  };
  const HostBridge bridges[] = {
      {0, "0000:2b:00.0", "0000:2c:00.0", 0x9781, {"0000:32:00.0", "0000:37:00.0"},
       {{"0000:34:00.0", "0000:36:00.0"}, {"0000:39:00.0", "0000:3b:00.0"}}, {"0000:35:00.0", "0000:3a:00.0"}},
      {0, "0000:4e:00.0", "0000:4f:00.0", 0x9781, {"0000:55:00.0", "0000:5a:00.0"},
       {{"0000:57:00.0", "0000:59:00.0"}, {"0000:5c:00.0", "0000:5e:00.0"}}, {"0000:58:00.0", "0000:5d:00.0"}},
      {1, "0000:ae:00.0", "0000:af:00.0", 0x9797, {"0000:b5:00.0", "0000:ba:00.0"},
       {{"0000:b7:00.0", "0000:b9:00.0"}, {"0000:bc:00.0", "0000:be:00.0"}}, {"0000:b8:00.0", "0000:bd:00.0"}},
      {1, "0000:d7:00.0", "0000:d8:00.0", 0x9781, {"0000:de:00.0", "0000:e3:00.0"},
       {{"0000:e0:00.0", "0000:e2:00.0"}, {"0000:e5:00.0", "0000:e7:00.0"}}, {"0000:e1:00.0", "0000:e6:00.0"}},
  };
  int nic = 0;
  for (const HostBridge& b : bridges) {
    int root = static_cast<int>(m.switches.size());
    m.switches.push_back(SwitchSpec{.bus = b.rootPort, .cpu = b.cpu, .vendor = 0x8086, .device = 0x2030});
    m.switches.push_back(SwitchSpec{.bus = b.upstream, .cpu = b.cpu, .parent = root, .vendor = 0x10b5, .device = b.upstreamDevice});
    for (int l = 0; l < 2; ++l) {
      addSwitch(m, b.cpu, b.leaf[l], {b.gpus[l][0], b.gpus[l][1]}, {{b.nic[l], "mlx5_" + std::to_string(nic++)}}, root + 1);
      m.switches.back().vendor = 0x10b5, m.switches.back().device = 0x9781;
    }
  }
  return build(m);
}

// An HGX baseboard with NVSwitch: the shape shared by DGX A100/H100, Azure NDv4/NDv5 and AWS p4d.
// A100 SXM4: 12 NVLink3 per GPU over 6 NVSwitch chips; H100 SXM5: 18 NVLink4 over 4 chips (NVIDIA
// HGX/DGX data sheets). Bandwidth is NCCL's per-link rate for the SM times the link count.
struct HgxBoard {
  int sm, chips, linksPerGpu;
  const char* gpuModel;
  uint16_t gpuDevice;
};
constexpr HgxBoard kA100{.sm = 80, .chips = 6, .linksPerGpu = 12, .gpuModel = "NVIDIA A100-SXM4-40GB", .gpuDevice = 0x20b0};
constexpr HgxBoard kH100{.sm = 90, .chips = 4, .linksPerGpu = 18, .gpuModel = "NVIDIA H100 80GB HBM3", .gpuDevice = 0x2330};

MachineSpec hgxMachine(const std::string& name, const HgxBoard& b) {
  return MachineSpec{.name = name, .sm = b.sm, .gpuModel = b.gpuModel, .gpuDevice = b.gpuDevice,
                     .nvswitchChips = b.chips, .nvlinksPerGpu = b.linksPerGpu};
}

// NVIDIA DGX A100: 8 A100-SXM4-40GB (10de:20b0, GPU0 at 0000:07:00.0 in the NCCL dump of
// NVIDIA/nccl#1505), 2 AMD EPYC 7742 (Rome, family 23 model 49) in NPS4, so 8 NUMA nodes of which the 4
// holding GPUs appear (NCCL's dump: NUMA 3, 1, 7, 5); masks per nvidia-smi in NVIDIA/DCGM#149
// (NUMA 3 = 48-63,176-191). 8 ConnectX-6 (15b3:101b) 200 Gb/s HDR IB compute NICs; each GPU pair shares
// a Broadcom PEX88096 Gen4 switch (1000:c010) with 2 NICs, every device behind its own second-level
// switch, so nvidia-smi shows GPU0/1 PXB to NIC0/1 (DCGM#149). GPU bus ids 07 0f 47 4e 87 90 b7 bd and
// NIC bus ids 0c 12 4b 54 8d 94 ba cc (mlx5_0-3, 6-9; mlx5_4/5 are the storage NICs, left out) are
// from the DGX A100 user guide's interface names (ibp12s0 ...), recalled rather than read from a file;
// NIC0 at 0c:00.0 under switch 0a:00.0 and switch 0d:00.0 match nccl#1505. Top-level switch bus ids
// are illustrative.
Topology dgxA100() {
  MachineSpec m = hgxMachine("dgx-a100", kA100);
  m.cpuVendor = "AuthenticAMD", m.cpuFamily = 23, m.cpuModel = 49, m.pcieGen = 4;
  m.nicGbps = 200, m.nicLayer = LinkLayer::InfiniBand, m.nicVendor = kVendorMellanox, m.nicDevice = 0x101b;
  struct Group {
    int numa;
    const char* top;
    int gpuBus[2];
    int nicBus[2];
    int netIndex[2];
  };
  const Group groups[] = {{3, "0000:01:00.0", {0x07, 0x0f}, {0x0c, 0x12}, {0, 1}},
                          {1, "0000:41:00.0", {0x47, 0x4e}, {0x4b, 0x54}, {2, 3}},
                          {7, "0000:81:00.0", {0x87, 0x90}, {0x8d, 0x94}, {6, 7}},
                          {5, "0000:b1:00.0", {0xb7, 0xbd}, {0xba, 0xcc}, {8, 9}}};
  auto bus = [](int b) { return busId(0, b); };
  for (const Group& g : groups) {
    int cpu = static_cast<int>(m.cpus.size());
    m.cpus.push_back({g.numa, affinityMask(256, {{16 * g.numa, 16 * g.numa + 15}, {128 + 16 * g.numa, 128 + 16 * g.numa + 15}})});
    int top = static_cast<int>(m.switches.size());
    m.switches.push_back(SwitchSpec{.bus = g.top, .cpu = cpu, .vendor = 0x1000, .device = 0xc010});
    // Second-level switch of each device two buses above it (0a:00.0 above NIC 0c:00.0, as in nccl#1505).
    auto leaf = [&](int deviceBus) {
      m.switches.push_back(SwitchSpec{.bus = bus(deviceBus - 2), .cpu = cpu, .parent = top, .vendor = 0x1000, .device = 0xc010});
      return static_cast<int>(m.switches.size()) - 1;
    };
    for (int k = 0; k < 2; ++k) {
      m.gpus.push_back(DeviceSpec{.bus = bus(g.gpuBus[k]), .sw = leaf(g.gpuBus[k])});
      m.nics.push_back(DeviceSpec{.bus = bus(g.nicBus[k]), .sw = leaf(g.nicBus[k]), .netName = "mlx5_" + std::to_string(g.netIndex[k])});
    }
  }
  return build(m);
}

// NVIDIA DGX H100: 8 H100 SXM5 (10de:2330), 4 NVSwitch chips, 18 NVLink4 per GPU. 2 Xeon Platinum
// 8480C (Sapphire Rapids, family 6 model 143, 56 cores / 112 threads each); NUMA 0 holds GPUs 0-3 with
// 0-55,112-167 (nvidia-smi in vllm-project/vllm#13855). 8 ConnectX-7 (15b3:1021) 400 Gb/s NDR IB compute
// NICs, one per GPU under its PCIe Gen5 switch (nvidia-smi shows PXB because the Broadcom switch has two
// levels, which NCCL flattens into one). nvidia-smi pairs GPU0-3 with NIC0, 3, 4, 5, i.e. mlx5_0, 3, 4,
// 5, 6, 9, 10, 11; GPU bus ids 1b 43 52 61 9d c3 d1 df and NIC bus ids 18 40 4f 5e 9a c0 ce dc
// (ibp24s0 ...) are recalled from the DGX H100 user guide, not read from a file. Switch bus ids are
// illustrative. Storage and in-band NICs are left out.
Topology dgxH100() {
  MachineSpec m = hgxMachine("dgx-h100", kH100);
  m.cpuVendor = "GenuineIntel", m.cpuFamily = 6, m.cpuModel = 143, m.pcieGen = 5;
  m.cpus = {{0, affinityMask(224, {{0, 55}, {112, 167}})}, {1, affinityMask(224, {{56, 111}, {168, 223}})}};
  m.nicGbps = 400, m.nicLayer = LinkLayer::InfiniBand, m.nicVendor = kVendorMellanox, m.nicDevice = 0x1021;
  const char* gpus[] = {"0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                        "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"};
  const char* nics[] = {"0000:18:00.0", "0000:40:00.0", "0000:4f:00.0", "0000:5e:00.0",
                        "0000:9a:00.0", "0000:c0:00.0", "0000:ce:00.0", "0000:dc:00.0"};
  const char* names[] = {"mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"};
  const char* switches[] = {"0000:16:00.0", "0000:3e:00.0", "0000:4d:00.0", "0000:5c:00.0",  // illustrative
                            "0000:98:00.0", "0000:be:00.0", "0000:cc:00.0", "0000:da:00.0"};
  for (int i = 0; i < 8; ++i) {
    addSwitch(m, i / 4, switches[i], {gpus[i]}, {{nics[i], names[i]}});
    m.switches.back().vendor = 0x1000, m.switches.back().device = 0xc030;
  }
  return build(m);
}

// Azure NDv4 (ND96asr_v4): 8 A100-SXM4-40GB with NVSwitch (6 chips, 12 links per GPU), 8 HDR 200 Gb/s
// IB NICs. From tests/data/nccl_azure-ndv4-topo.xml (Azure/azhpc-images topology/ndv4-topo.xml): AMD EPYC
// 7V12 (family 23, model 49) shown as 4 NUMA nodes of 24 vCPUs with the file's masks; one virtual Gen4
// x16 switch ffff:ff:0N.0 per NUMA node holding 2 GPUs and 2 NICs; GPU i and NIC i (domain 0x101 + i)
// share it. NIC names are illustrative (the skeleton has none).
Topology ndv4() {
  MachineSpec m = hgxMachine("ndv4", kA100);
  m.cpuVendor = "AuthenticAMD", m.cpuFamily = 23, m.cpuModel = 49, m.pcieGen = 4;
  m.cpus = {{0, "00000000,00000000,00ffffff"}, {1, "00000000,0000ffff,ff000000"},
            {2, "000000ff,ffff0000,00000000"}, {3, "ffffff00,00000000,00000000"}};
  m.nicGbps = 200, m.nicLayer = LinkLayer::InfiniBand, m.nicVendor = kVendorMellanox;
  // NUMA node -> the GPU domains under its switch, as in the file. GPU i in bus id order (domains 1-4,
  // b-e) shares its switch with NIC domain 0x101 + i (0101-0108; named mlx5_<i> here).
  const int domains[4][2] = {{0x3, 0x4}, {0x1, 0x2}, {0xd, 0xe}, {0xb, 0xc}};
  auto gpuIndex = [](int domain) { return domain <= 4 ? domain - 1 : domain - 0xb + 4; };
  for (int numa = 0; numa < 4; ++numa) {
    std::vector<std::pair<std::string, std::string>> nics;
    for (int d : domains[numa]) nics.emplace_back(busId(0x101 + gpuIndex(d), 0), "mlx5_" + std::to_string(gpuIndex(d)));
    addSwitch(m, numa, busId(0xffff, 0xff, numa + 1), {busId(domains[numa][0], 0), busId(domains[numa][1], 0)},
              {nics[0], nics[1]});
  }
  return build(m);
}

// Azure NDv5 (ND96isr_H100_v5): 8 H100 with NVSwitch (4 chips, 18 links per GPU), 8 NDR 400 Gb/s IB NICs.
// From tests/data/nccl_azure-ndv5-topo.xml (Azure/azhpc-images topology/ndv5-topo.xml): Sapphire Rapids
// (family 6, model 143), 2 NUMA nodes of 48 vCPUs with the file's masks; each GPU alone with one NIC
// under its own virtual Gen5 x16 switch ffff:ff:0N.0, 4 per NUMA node. NIC names are illustrative.
Topology ndv5() {
  MachineSpec m = hgxMachine("ndv5", kH100);
  m.cpuVendor = "GenuineIntel", m.cpuFamily = 6, m.cpuModel = 143, m.pcieGen = 5;
  m.cpus = {{0, "00000000,0000ffff,ffffffff"}, {1, "ffffffff,ffff0000,00000000"}};
  m.nicGbps = 400, m.nicLayer = LinkLayer::InfiniBand, m.nicVendor = kVendorMellanox;
  const int gpuDomains[] = {0x1, 0x2, 0x3, 0x8, 0x9, 0xa, 0xb, 0xc};
  for (int i = 0; i < 8; ++i)
    addSwitch(m, i / 4, busId(0xffff, 0xff, i + 1), {busId(gpuDomains[i], 0)}, {{busId(0x101 + i, 0), "mlx5_" + std::to_string(i)}});
  return build(m);
}

// AWS p4d.24xlarge: 8 A100-SXM4-40GB (10de:20b0) with NVSwitch (6 chips, 12 links per GPU), 4 EFA
// 100 Gb/s NICs (1d0f:efa0, class 0x0200: Ethernet link layer, RDMA-capable). From tests/data/
// nccl_aws-p4d-24xl-topo.xml (aws/aws-ofi-nccl topology/p4d-24xl-topo.xml): Cascade Lake (family 6,
// model 85), 2 NUMA nodes with the file's masks, 2 virtual switches per NUMA node reported as 8 GT/s
// x16, each holding 2 GPUs and 1 EFA. EFA names follow the rdma naming scheme rdmap<bus>s<slot> of
// their bus ids (e.g. 10:1b.0 -> rdmap16s27), derived rather than copied.
Topology p4d() {
  MachineSpec m = hgxMachine("p4d", kA100);
  m.cpuVendor = "GenuineIntel", m.cpuFamily = 6, m.cpuModel = 85, m.pcieGen = 3;
  m.cpus = {{0, "000000ff,ffff0000,00ffffff"}, {1, "ffffff00,0000ffff,ff000000"}};
  m.nicGbps = 100, m.nicLayer = LinkLayer::Ethernet, m.nicVendor = kVendorAmazon, m.nicDevice = 0xefa0;
  const int buses[] = {0x10, 0x20, 0x90, 0xa0};
  for (int s = 0; s < 4; ++s) {
    int sw = addSwitch(m, s / 2, busId(0xffff, 0xff, s + 1), {busId(0, buses[s], 0x1c), busId(0, buses[s], 0x1d)},
                       {{busId(0, buses[s], 0x1b), "rdmap" + std::to_string(buses[s]) + "s27"}});
    m.switches[static_cast<size_t>(sw)].vendor = 0xffff, m.switches[static_cast<size_t>(sw)].device = 0xffff;
  }
  return build(m);
}

// An 8-GPU PCIe-only server, entirely illustrative (typical of L40S boxes): 8 L40S (SM89, 10de:26b9)
// with no NVLink, 2 Xeon sockets (Sapphire Rapids, 32 cores / 64 threads each), per socket 2 PCIe
// Gen4 switches with 2 GPUs each, and one 100 GbE ConnectX-6 Dx (15b3:101d, RoCE) in the first switch
// of each socket. GPU pairs are PIX (same switch), PHB (same socket) or SYS.
Topology pcie8() {
  MachineSpec m{.name = "pcie8", .cpuVendor = "GenuineIntel", .cpuFamily = 6, .cpuModel = 143,
                .cpus = {{0, affinityMask(128, {{0, 31}, {64, 95}})}, {1, affinityMask(128, {{32, 63}, {96, 127}})}},
                .pcieGen = 4, .sm = 89, .gpuModel = "NVIDIA L40S", .gpuDevice = 0x26b9, .nicGbps = 100,
                .nicLayer = LinkLayer::Ethernet, .nicVendor = kVendorMellanox, .nicDevice = 0x101d};
  addSwitch(m, 0, "0000:15:00.0", {"0000:17:00.0", "0000:18:00.0"}, {{"0000:19:00.0", "mlx5_0"}});
  addSwitch(m, 0, "0000:35:00.0", {"0000:37:00.0", "0000:38:00.0"}, {});
  addSwitch(m, 1, "0000:95:00.0", {"0000:97:00.0", "0000:98:00.0"}, {{"0000:99:00.0", "mlx5_1"}});
  addSwitch(m, 1, "0000:b5:00.0", {"0000:b7:00.0", "0000:b8:00.0"}, {});
  return build(m);
}

const std::map<std::string, std::function<Topology()>>& presets() {
  static const std::map<std::string, std::function<Topology()>> kPresets = {
      {"dgx1", dgx1}, {"dgx2", dgx2}, {"dgx-a100", dgxA100}, {"dgx-h100", dgxH100}, {"ndv2", ndv2},
      {"ndv4", ndv4}, {"ndv5", ndv5}, {"p4d", p4d},          {"pcie8", pcie8}};
  return kPresets;
}

}  // namespace

std::vector<std::string> presetNames() {
  std::vector<std::string> names;
  for (const auto& [name, make] : presets()) names.push_back(name);
  return names;
}

Topology loadPreset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string known;
    for (const std::string& n : presetNames()) known += (known.empty() ? "" : ", ") + n;
    throwInvalidArgument("topology: unknown preset '" + name + "' (known: " + known + ")");
  }
  return it->second();
}

}  // namespace topoccl::topo
