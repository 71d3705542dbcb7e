// Live discovery: NVLink observations applied to synthetic graphs (no GPU needed), sysfs NIC facts
// from a fake sysfs tree, and the live machine compared with what the OS says independently (sysfs,
// lstopo). Expected facts come from sysfs / lstopo / published NVLink wiring, not from the loaders.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "common/error.hpp"
#include "topology/discovery.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;
using namespace topoccl::topo;
namespace fs = std::filesystem;

namespace {

std::string dataFile(const std::string& name) {
  std::string here = __FILE__;
  return here.substr(0, here.rfind('/')) + "/../data/" + name;
}

// Sets (or unsets, with nullopt) environment variables for one scope, then restores them.
class ScopedEnv {
 public:
  void set(const std::string& name, const std::optional<std::string>& value) {
    if (!saved_.count(name)) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    if (value) ::setenv(name.c_str(), value->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// Clears every variable that could redirect loadHostTopology().
void clearTopologyEnv(ScopedEnv& env) {
  for (const char* name : {"TOPOCCL_TOPO_FILE", "NCCL_TOPO_FILE", "TOPOCCL_TOPO_DUMP_FILE", "NCCL_TOPO_DUMP_FILE"})
    env.set(name, std::nullopt);
}

fs::path scratchDir(const std::string& tag) {
  fs::path dir = fs::temp_directory_path() / ("topoccl-live-" + tag + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void writeFile(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::optional<std::string> readLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

// 1 host, 2 CPUs, 8 GPUs on PCIe (4 per CPU), bus ids 0000:1N:00.0, sm unknown until NVML says.
Topology eightGpuBox() {
  Topology t;
  t.name = "eight";
  t.addVertex(Vertex{.kind = VertexKind::Host, .name = "host0"});
  VertexId cpu0 = t.addVertex(Vertex{.kind = VertexKind::Cpu, .name = "cpu0", .numaId = 0});
  VertexId cpu1 = t.addVertex(Vertex{.kind = VertexKind::Cpu, .name = "cpu1", .numaId = 1});
  t.addLink(cpu0, cpu1, Link{.kind = LinkKind::CpuInterconnect, .bandwidthGBs = 10});
  for (int i = 0; i < 8; ++i) {
    VertexId g = t.addVertex(Vertex{.kind = VertexKind::Gpu, .name = "gpu" + std::to_string(i),
                                    .busId = "0000:1" + std::to_string(i) + ":00.0", .gpuIndex = i});
    t.addLink(i < 4 ? cpu0 : cpu1, g, Link{.kind = LinkKind::Pcie, .pcieGen = 3, .pcieWidth = 16});
  }
  return t;
}

std::string nvmlBusId(int gpu) { return "00000000:1" + std::to_string(gpu) + ":00.0"; }  // NVML's spelling

// DGX-1V hybrid cube-mesh (nvidia-smi topo -m of a DGX-1 with V100): NV1/NV2 per pair, 6 links per GPU.
const std::map<std::pair<int, int>, int> kDgx1Wiring = {
    {{0, 1}, 1}, {{0, 2}, 1}, {{0, 3}, 2}, {{0, 4}, 2}, {{1, 2}, 2}, {{1, 3}, 1}, {{1, 5}, 2}, {{2, 3}, 2},
    {{2, 6}, 1}, {{3, 7}, 1}, {{4, 5}, 1}, {{4, 6}, 1}, {{4, 7}, 2}, {{5, 6}, 2}, {{5, 7}, 1}, {{6, 7}, 2}};

// What NVML reports on that machine: each GPU's links numbered 0..5, from one or both ends.
std::vector<NvlinkObservation> dgx1Observations(bool bothEnds) {
  std::vector<NvlinkObservation> out;
  std::map<int, int> nextLink;
  for (const auto& [pair, count] : kDgx1Wiring)
    for (int k = 0; k < count; ++k) {
      auto [a, b] = pair;
      out.push_back({.localBusId = nvmlBusId(a), .link = nextLink[a]++, .remoteBusId = nvmlBusId(b), .remote = NvlinkRemote::Gpu, .sm = 70});
      if (bothEnds)
        out.push_back({.localBusId = nvmlBusId(b), .link = nextLink[b]++, .remoteBusId = nvmlBusId(a), .remote = NvlinkRemote::Gpu, .sm = 70});
    }
  return out;
}

// The 0000:00:03.0-style PCI function a /sys/class/net/<if>/device resolves to, or empty.
std::string pciFunctionOf(const fs::path& device) {
  std::error_code ec;
  fs::path real = fs::canonical(device, ec);
  if (ec) return {};
  static const std::regex kBdf("[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\\.[0-7]");
  std::string found;
  for (const fs::path& part : real)
    if (std::regex_match(part.string(), kBdf)) found = part.string();  // the deepest PCI function
  return found;
}

// Bits set in "0-1,4,6-7" (sysfs cpu lists).
std::set<int> parseCpuList(const std::string& text) {
  std::set<int> cpus;
  std::stringstream in(text);
  std::string range;
  while (std::getline(in, range, ',')) {
    if (range.empty()) continue;
    int lo = 0, hi = 0;
    if (std::sscanf(range.c_str(), "%d-%d", &lo, &hi) == 2)
      for (int c = lo; c <= hi; ++c) cpus.insert(c);
    else if (std::sscanf(range.c_str(), "%d", &lo) == 1)
      cpus.insert(lo);
  }
  return cpus;
}

// Bits set in NCCL's affinity spelling "00000000,00000003" (most significant word first).
std::set<int> parseAffinity(const std::string& text) {
  std::vector<std::string> words;
  std::stringstream in(text);
  std::string word;
  while (std::getline(in, word, ',')) words.push_back(word);
  std::set<int> cpus;
  int base = 0;
  for (auto it = words.rbegin(); it != words.rend(); ++it, base += 32) {
    unsigned long bits = std::strtoul(it->c_str(), nullptr, 16);
    for (int b = 0; b < 32; ++b)
      if (bits & (1ul << b)) cpus.insert(base + b);
  }
  return cpus;
}

std::string runCommand(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  if (pclose(pipe) != 0) out.clear();
  return out;
}

std::map<VertexKind, int> countsByKind(const Topology& t) {
  std::map<VertexKind, int> counts;
  for (const Vertex& v : t.vertices()) ++counts[v.kind];
  return counts;
}

std::set<std::string> busIds(const Topology& t, VertexKind kind) {
  std::set<std::string> out;
  for (VertexId id : t.verticesOfKind(kind)) out.insert(t.vertex(id).busId);
  return out;
}

// Live discovery, or nullopt after saying why (built without hwloc: the error must say so).
std::optional<Topology> liveOrExplain() {
  if (!liveDiscoveryBuilt()) {
    try {
      discoverLiveTopology();
      FAIL("discoverLiveTopology() must throw when hwloc support is not built");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("hwloc") != std::string::npos);
    }
    WARN("hwloc support was not built (TOPOCCL_HWLOC): live discovery checked only for its error");
    return std::nullopt;
  }
  return discoverLiveTopology();
}

}  // namespace

TEST_CASE("live: NVML bus ids are canonicalised", "[live]") {
  CHECK(canonicalPciBusId("00000000:07:00.0") == "0000:07:00.0");
  CHECK(canonicalPciBusId("00000001:B7:1F.3") == "0001:b7:1f.3");
  CHECK(canonicalPciBusId("07:00.0") == "0000:07:00.0");
  CHECK(canonicalPciBusId("0000:07:00.0") == "0000:07:00.0");
  CHECK(canonicalPciBusId("ffff:ff:01.0") == "ffff:ff:01.0");
}

TEST_CASE("live: DGX-1 NVLink observations give the hybrid cube-mesh", "[live]") {
  Topology t = eightGpuBox();
  applyNvlinks(t, dgx1Observations(true));
  CHECK(t.count(VertexKind::NvSwitch) == 0);
  int physical = 0;
  std::map<VertexId, int> perGpu;
  for (const Link& l : t.links()) {
    if (l.kind != LinkKind::NvLink) continue;
    perGpu[l.from] += l.nvlinkCount;
    if (l.from < l.to) physical += l.nvlinkCount;
    CHECK(l.bandwidthGBs == Approx(20.0 * l.nvlinkCount));  // V100: 20 GB/s per link
    CHECK(l.nvlinkGeneration == nvlinkGenerationForSm(70));
  }
  CHECK(physical == 24);
  REQUIRE(perGpu.size() == 8);
  for (const auto& [gpu, links] : perGpu) CHECK(links == 6);
  for (VertexId g : t.gpus()) CHECK(t.vertex(g).sm == 70);  // taken from NVML's compute capability
  for (int a = 0; a < 8; ++a)
    for (int b = a + 1; b < 8; ++b) {
      INFO("GPU" << a << " - GPU" << b);
      VertexId ga = *t.gpuByIndex(a), gb = *t.gpuByIndex(b);
      auto wired = kDgx1Wiring.find({a, b});
      if (wired != kDgx1Wiring.end()) {
        REQUIRE(t.linkBetween(ga, gb));
        CHECK(t.linkBetween(ga, gb)->nvlinkCount == wired->second);
        CHECK(t.path(ga, gb).cls == PathClass::NVL);
      } else {
        CHECK_FALSE(t.linkBetween(ga, gb));
        CHECK(t.path(ga, gb).cls == PathClass::NVB);  // two NVLink hops through a neighbour
        CHECK(t.path(ga, gb).hops == 2);
      }
    }
  // Seen from one end only (GPU7 is then never a local end, so its sm comes from elsewhere), the
  // links are the same.
  Topology oneSide = eightGpuBox();
  for (VertexId g : oneSide.gpus()) oneSide.vertex(g).sm = 70;
  applyNvlinks(oneSide, dgx1Observations(false));
  CHECK(oneSide.canonicalText() == t.canonicalText());
}

TEST_CASE("live: NVSwitch observations give one fabric vertex and NVL between all pairs", "[live]") {
  Topology t = eightGpuBox();
  std::vector<NvlinkObservation> obs;
  for (int g = 0; g < 8; ++g)
    for (int link = 0; link < 12; ++link)  // A100: 12 links, 2 to each of 6 NVSwitch chips
      obs.push_back({.localBusId = nvmlBusId(g), .link = link,
                     .remoteBusId = "00000000:c" + std::to_string(link / 2) + ":00.0", .remote = NvlinkRemote::NvSwitch, .sm = 80});
  // Noise NVML can report: a GPU outside this topology, and a GPU peer hidden from this process.
  obs.push_back({.localBusId = "00000000:99:00.0", .link = 0, .remoteBusId = nvmlBusId(0), .remote = NvlinkRemote::Gpu, .sm = 80});
  obs.push_back({.localBusId = nvmlBusId(0), .link = 12, .remoteBusId = "00000000:98:00.0", .remote = NvlinkRemote::Gpu, .sm = 80});
  applyNvlinks(t, obs);
  REQUIRE(t.count(VertexKind::NvSwitch) == 1);
  VertexId fabric = t.verticesOfKind(VertexKind::NvSwitch).front();
  CHECK(t.vertex(fabric).physicalSwitches == 0);  // NVML does not say how many chips there are
  CHECK(t.vertex(fabric).host == 0);
  for (VertexId g : t.gpus()) {
    const Link* l = t.linkBetween(g, fabric);
    REQUIRE(l);
    CHECK(l->nvlinkCount == 12);
    CHECK(l->bandwidthGBs == Approx(12 * nvlinkBandwidthPerLinkGBs(80)));
    CHECK(t.linkBetween(fabric, g));
  }
  for (int a = 0; a < 8; ++a)
    for (int b = a + 1; b < 8; ++b) CHECK(t.path(*t.gpuByIndex(a), *t.gpuByIndex(b)).cls == PathClass::NVL);
  // Applying again reuses the fabric and keeps the existing links.
  const std::string before = t.canonicalText();
  applyNvlinks(t, obs);
  CHECK(t.count(VertexKind::NvSwitch) == 1);
  CHECK(t.canonicalText() == before);
  // A report with GPU facts fills sm and model of GPUs that hwloc could not name.
  Topology named = eightGpuBox();
  NvmlReport report{.available = true, .gpus = {{.busId = nvmlBusId(3), .sm = 90, .model = "NVIDIA H100 80GB HBM3"}}, .nvlinks = {}};
  applyNvml(named, report);
  CHECK(named.vertex(*named.gpuByIndex(3)).sm == 90);
  CHECK(named.vertex(*named.gpuByIndex(3)).gpuModel == "NVIDIA H100 80GB HBM3");
}

TEST_CASE("live: NVML probe without libnvidia-ml reports unavailable, not an error", "[live]") {
  NvmlReport report;
  REQUIRE_NOTHROW(report = probeNvml());
  if (!report.available) {
    CHECK(report.gpus.empty());
    CHECK(report.nvlinks.empty());
  } else {
    WARN("libnvidia-ml is present: NVML reported " << report.gpus.size() << " GPU(s), " << report.nvlinks.size() << " NVLink(s)");
    for (const NvmlGpu& g : report.gpus) CHECK(g.busId == canonicalPciBusId(g.busId));
  }
}

TEST_CASE("live: NIC speed and link layer come from sysfs", "[live]") {
  fs::path sys = scratchDir("sysfs");
  writeFile(sys / "class/infiniband/mlx5_0/ports/1/rate", "200 Gb/sec (4X HDR)\n");
  writeFile(sys / "class/infiniband/mlx5_0/ports/1/link_layer", "InfiniBand\n");
  writeFile(sys / "class/infiniband/mlx5_1/ports/1/rate", "100 Gb/sec (4X EDR)\n");
  writeFile(sys / "class/infiniband/mlx5_1/ports/1/link_layer", "Ethernet\n");  // RoCE on a 0x0207 NIC
  writeFile(sys / "class/net/eth1/speed", "25000\n");
  writeFile(sys / "class/net/eth1/type", "1\n");
  writeFile(sys / "class/net/eth2/speed", "-1\n");  // virtio and links that are down
  writeFile(sys / "class/net/ib0/speed", "100000\n");
  writeFile(sys / "class/net/ib0/type", "32\n");  // IPoIB
  Topology t;
  t.addVertex(Vertex{.kind = VertexKind::Host, .name = "host0"});
  VertexId cpu = t.addVertex(Vertex{.kind = VertexKind::Cpu, .name = "cpu0", .numaId = 0});
  std::map<std::string, VertexId> nic;
  int bus = 0x20;
  for (const char* name : {"mlx5_0", "mlx5_1", "eth1", "eth2", "ib0", "absent0"}) {
    char busId[16];
    std::snprintf(busId, sizeof busId, "0000:%02x:00.0", bus++);
    nic[name] = t.addVertex(Vertex{.kind = VertexKind::Nic, .busId = busId, .netName = name, .linkLayer = LinkLayer::InfiniBand});
    t.addLink(cpu, nic[name], Link{.kind = LinkKind::Pcie, .pcieGen = 4, .pcieWidth = 16});
  }
  t.vertex(nic["eth2"]).linkLayer = LinkLayer::Ethernet;
  enrichNicsFromSysfs(t, sys.string());
  CHECK(t.vertex(nic["mlx5_0"]).speedGbps == Approx(200));
  CHECK(t.vertex(nic["mlx5_0"]).linkLayer == LinkLayer::InfiniBand);
  CHECK(t.vertex(nic["mlx5_1"]).speedGbps == Approx(100));
  CHECK(t.vertex(nic["mlx5_1"]).linkLayer == LinkLayer::Ethernet);
  CHECK(t.vertex(nic["eth1"]).speedGbps == Approx(25));
  CHECK(t.vertex(nic["eth1"]).linkLayer == LinkLayer::Ethernet);
  CHECK(t.vertex(nic["eth2"]).speedGbps == 0);  // unknown stays unknown
  CHECK(t.vertex(nic["ib0"]).speedGbps == Approx(100));
  CHECK(t.vertex(nic["ib0"]).linkLayer == LinkLayer::InfiniBand);
  CHECK(t.vertex(nic["absent0"]).speedGbps == 0);
  fs::remove_all(sys);
}

TEST_CASE("live: a BMC VGA controller is not a GPU", "[live]") {
  // The whole-I/O fixture has 3 Tesla K40m (10de), 1 AMD Radeon (1002) and a Matrox G200 BMC VGA (102b).
  Topology t = loadHwlocXml(dataFile("hwloc-v2_32em64t-k40m-ib-wholeio.xml"));
  CHECK(t.count(VertexKind::Gpu) == 4);
  CHECK_FALSE(t.findByBusId("0000:05:03.0"));
}

TEST_CASE("live: discovery of this machine agrees with sysfs", "[live]") {
  std::optional<Topology> live = liveOrExplain();
  if (!live) return;
  const Topology& t = *live;
  CHECK(t.source == "live");
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof host - 1) == 0);
  CHECK(t.name == host);
  CHECK(t.count(VertexKind::Host) == 1);

  // NUMA nodes: one Cpu vertex per /sys/devices/system/node/nodeN.
  std::set<int> sysNodes;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) == 0 && name.size() > 4 && std::isdigit(static_cast<unsigned char>(name[4])))
      sysNodes.insert(std::atoi(name.c_str() + 4));
  }
  if (sysNodes.empty()) {
    WARN("no /sys/devices/system/node (kernel without NUMA): expecting one NUMA node");
    sysNodes.insert(0);
  }
  std::set<int> liveNodes;
  for (VertexId c : t.verticesOfKind(VertexKind::Cpu)) liveNodes.insert(t.vertex(c).numaId);
  CHECK(liveNodes == sysNodes);

  // Every online CPU belongs to some NUMA node's affinity.
  auto online = readLine("/sys/devices/system/cpu/online");
  REQUIRE(online);
  std::set<int> onlineCpus = parseCpuList(*online), covered;
  REQUIRE_FALSE(onlineCpus.empty());
  for (VertexId c : t.verticesOfKind(VertexKind::Cpu))
    for (int cpu : parseAffinity(t.vertex(c).cpuAffinity)) covered.insert(cpu);
  for (int cpu : onlineCpus) {
    INFO("online CPU " << cpu);
    CHECK(covered.count(cpu) == 1);
  }

  // Every network interface backed by a PCI function is a NIC with that bus id and one of its names
  // (the RDMA device when the function has one, else a netdev).
  std::map<std::string, std::set<std::string>> namesByBus;
  for (const auto& entry : fs::directory_iterator("/sys/class/net", ec)) {
    const std::string bus = pciFunctionOf(entry.path() / "device");
    if (bus.empty()) continue;  // lo, ifb*, bridges, veth: virtual
    namesByBus[bus].insert(entry.path().filename().string());
    for (const auto& rdma : fs::directory_iterator(entry.path() / "device" / "infiniband", ec))
      namesByBus[bus].insert(rdma.path().filename().string());
  }
  if (namesByBus.empty()) WARN("this machine has no PCI network interface");
  for (const auto& [bus, names] : namesByBus) {
    INFO("PCI network function " << bus);
    auto id = t.findByBusId(bus);
    REQUIRE(id);
    const Vertex& nic = t.vertex(*id);
    CHECK(nic.kind == VertexKind::Nic);
    CHECK(names.count(nic.netName) == 1);
    if (auto speed = readLine("/sys/class/net/" + nic.netName + "/speed"); speed && std::atol(speed->c_str()) > 0)
      CHECK(nic.speedGbps == Approx(std::atol(speed->c_str()) / 1000.0));
  }
  CHECK(static_cast<size_t>(t.count(VertexKind::Nic)) >= namesByBus.size());
}

TEST_CASE("live: discovery agrees with lstopo's XML", "[live]") {
  std::optional<Topology> live = liveOrExplain();
  if (!live) return;
  std::string xml;
  for (const char* tool : {"lstopo-no-graphics", "lstopo"}) {
    xml = runCommand(std::string(tool) + " --of xml --disallowed - 2>/dev/null");
    if (!xml.empty()) break;
  }
  if (xml.empty()) {
    WARN("lstopo is not installed (apt-get install hwloc): comparison with lstopo skipped");
    return;
  }
  Topology fromLstopo = parseHwlocXml(xml, "lstopo");
  std::map<VertexKind, int> expected = countsByKind(fromLstopo), actual = countsByKind(*live);
  expected.erase(VertexKind::NvSwitch);  // NVLink fabrics come from NVML, which lstopo does not query
  actual.erase(VertexKind::NvSwitch);
  for (const auto& [kind, n] : expected) {
    INFO(vertexKindName(kind));
    CHECK(actual[kind] == n);
  }
  CHECK(actual.size() == expected.size());
  CHECK(busIds(*live, VertexKind::Nic) == busIds(fromLstopo, VertexKind::Nic));
  CHECK(busIds(*live, VertexKind::Gpu) == busIds(fromLstopo, VertexKind::Gpu));
  for (VertexId c : fromLstopo.verticesOfKind(VertexKind::Cpu)) {
    auto mine = live->findByName(fromLstopo.vertex(c).name);
    REQUIRE(mine);
    CHECK(live->vertex(*mine).cpuAffinity == fromLstopo.vertex(c).cpuAffinity);
  }
}

TEST_CASE("live: loadHostTopology honours the topology file and dump variables", "[live]") {
  ScopedEnv env;
  clearTopologyEnv(env);
  fs::path dir = scratchDir("dump");
  const std::string dump = (dir / "dump.xml").string();
  env.set("TOPOCCL_TOPO_FILE", dataFile("nccl_azure-ndv4-topo.xml"));
  env.set("TOPOCCL_TOPO_DUMP_FILE", dump);
  Topology t = loadHostTopology();
  CHECK(t.count(VertexKind::Gpu) == 8);
  CHECK(t.source.find("nccl_azure-ndv4-topo.xml") != std::string::npos);
  REQUIRE(fs::exists(dump));
  Topology reloaded = loadNcclXml(dump);
  CHECK(reloaded.count(VertexKind::Gpu) == 8);
  CHECK(reloaded.fingerprint() == t.fingerprint());

  // NCCL's names work when topoccl's are unset; topoccl's win when both are.
  env.set("TOPOCCL_TOPO_FILE", std::nullopt);
  env.set("TOPOCCL_TOPO_DUMP_FILE", std::nullopt);
  env.set("NCCL_TOPO_FILE", dataFile("nccl_azure-ndv2-topo.xml"));
  const std::string ncclDump = (dir / "nccl-dump.xml").string();
  env.set("NCCL_TOPO_DUMP_FILE", ncclDump);
  Topology ndv2 = loadHostTopology();
  CHECK(ndv2.count(VertexKind::Nic) == 1);  // ND40rs_v2: a single IB NIC
  CHECK(fs::exists(ncclDump));
  env.set("TOPOCCL_TOPO_FILE", dataFile("nccl_azure-ndv4-topo.xml"));
  CHECK(loadHostTopology().count(VertexKind::Nic) == 8);

  // An unwritable dump path is a warning, not a failure.
  env.set("NCCL_TOPO_DUMP_FILE", (dir / "missing-dir" / "dump.xml").string());
  CHECK_NOTHROW(loadHostTopology());
  fs::remove_all(dir);
}

TEST_CASE("live: loadHostTopology without a file discovers this machine", "[live]") {
  ScopedEnv env;
  clearTopologyEnv(env);
  if (!liveDiscoveryBuilt()) {
    CHECK_THROWS_AS(loadHostTopology(), Error);
    WARN("hwloc support was not built: loadHostTopology() without a file must fail, and does");
    return;
  }
  fs::path dir = scratchDir("live-dump");
  env.set("TOPOCCL_TOPO_DUMP_FILE", (dir / "live.xml").string());
  Topology t = loadHostTopology();
  CHECK(t.source == "live");
  CHECK(t.count(VertexKind::Cpu) >= 1);
  // The dump is NCCL XML that loads back into the same CPUs and NICs.
  Topology reloaded = loadNcclXml((dir / "live.xml").string());
  CHECK(reloaded.count(VertexKind::Cpu) == t.count(VertexKind::Cpu));
  CHECK(busIds(reloaded, VertexKind::Nic) == busIds(t, VertexKind::Nic));
  fs::remove_all(dir);
}
