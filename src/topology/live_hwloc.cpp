// Live discovery: hwloc loads this machine (I/O devices included), exports it as hwloc XML v2, and
// the hwloc XML parser builds the graph, so live and file topologies share one model and one parser.
// Sysfs then fills what hwloc does not know (NIC speed and link layer) and NVML adds NVLink.
// Also here: loadHostTopology(), which picks a file override or live discovery and honours the dump
// file. Only the hwloc calls depend on TOPOCCL_HAVE_HWLOC.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "topology/discovery.hpp"
#include "topology/loaders.hpp"

#if defined(TOPOCCL_HAVE_HWLOC)
#include <hwloc.h>
#endif

namespace topoccl::topo {

namespace fs = std::filesystem;

namespace {

// First line of a small sysfs file, trimmed; nullopt when it cannot be read (sysfs read() may fail
// with EINVAL, e.g. `speed` of a link that is down).
std::optional<std::string> readSysfsLine(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

LinkLayer linkLayerFromSysfs(const std::string& text) {
  if (text == "InfiniBand") return LinkLayer::InfiniBand;
  if (text == "Ethernet") return LinkLayer::Ethernet;
  return LinkLayer::Unknown;
}

// "100 Gb/sec (4X EDR)" -> 100; "2.5 Gb/sec (1X SDR)" -> 2.5.
double rateGbps(const std::string& text) { return std::atof(text.c_str()); }

void enrichRdmaNic(Vertex& nic, const fs::path& device) {
  std::error_code ec;
  double bestRate = 0;
  LinkLayer bestLayer = LinkLayer::Unknown;
  std::vector<fs::path> ports;
  for (const auto& entry : fs::directory_iterator(device / "ports", ec)) ports.push_back(entry.path());
  std::sort(ports.begin(), ports.end());
  for (const fs::path& port : ports) {
    double rate = rateGbps(readSysfsLine(port / "rate").value_or(""));
    LinkLayer layer = linkLayerFromSysfs(readSysfsLine(port / "link_layer").value_or(""));
    if (bestLayer == LinkLayer::Unknown) bestLayer = layer;
    if (rate > bestRate) {
      bestRate = rate;
      if (layer != LinkLayer::Unknown) bestLayer = layer;
    }
  }
  if (nic.speedGbps <= 0 && bestRate > 0) nic.speedGbps = bestRate;
  if (bestLayer != LinkLayer::Unknown) nic.linkLayer = bestLayer;  // RoCE NICs are PCI class 0x0207 too
}

void enrichNetdevNic(Vertex& nic, const fs::path& netdev) {
  if (nic.speedGbps <= 0) {
    if (auto speed = readSysfsLine(netdev / "speed")) {
      long mbps = std::atol(speed->c_str());
      if (mbps > 0) nic.speedGbps = static_cast<double>(mbps) / 1000.0;
    }
  }
  // ARPHRD_ETHER = 1, ARPHRD_INFINIBAND = 32 (IPoIB).
  if (auto type = readSysfsLine(netdev / "type")) {
    if (*type == "1") nic.linkLayer = LinkLayer::Ethernet;
    if (*type == "32") nic.linkLayer = LinkLayer::InfiniBand;
  }
}

}  // namespace

void enrichNicsFromSysfs(Topology& topo, const std::string& sysRoot) {
  const fs::path root(sysRoot);
  std::error_code ec;
  for (VertexId id : topo.nics()) {
    Vertex& nic = topo.vertex(id);
    if (nic.netName.empty()) continue;
    const fs::path rdma = root / "class" / "infiniband" / nic.netName;
    const fs::path netdev = root / "class" / "net" / nic.netName;
    if (fs::exists(rdma, ec)) enrichRdmaNic(nic, rdma);
    else if (fs::exists(netdev, ec)) enrichNetdevNic(nic, netdev);
    TOPOCCL_TRACE(log::kGraph, "topology: NIC %s: %.1f Gb/s, %s", nic.netName.c_str(), nic.speedGbps,
                  linkLayerName(nic.linkLayer));
  }
}

#if defined(TOPOCCL_HAVE_HWLOC)

bool liveDiscoveryBuilt() noexcept { return true; }

namespace {
std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}
}  // namespace

std::string exportLiveHwlocXml() {
  hwloc_topology_t topology = nullptr;
  if (hwloc_topology_init(&topology) != 0) throwSystemError("topology: hwloc_topology_init failed");
  struct Guard {
    hwloc_topology_t t;
    ~Guard() { hwloc_topology_destroy(t); }
  } guard{topology};
  // Describe the machine, not this process's cgroup: NCCL reads NUMA cpumaps from sysfs the same way.
  if (hwloc_topology_set_flags(topology, HWLOC_TOPOLOGY_FLAG_INCLUDE_DISALLOWED) != 0)
    throwSystemError("topology: hwloc_topology_set_flags failed");
  // Without this filter hwloc keeps no PCI devices at all; it must be set before loading.
  if (hwloc_topology_set_io_types_filter(topology, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0)
    throwSystemError("topology: hwloc_topology_set_io_types_filter failed");
  if (hwloc_topology_load(topology) != 0) throwSystemError("topology: hwloc_topology_load failed");
  char* buffer = nullptr;
  int length = 0;
#if HWLOC_API_VERSION >= 0x00030000
  const unsigned long flags = HWLOC_TOPOLOGY_EXPORT_XML_FLAG_V2;  // hwloc 3 writes v3 by default
#else
  const unsigned long flags = 0;  // hwloc 2.x writes v2
#endif
  if (hwloc_topology_export_xmlbuffer(topology, &buffer, &length, flags) != 0 || buffer == nullptr)
    throwSystemError("topology: hwloc_topology_export_xmlbuffer failed");
  std::string xml(buffer, length > 0 ? static_cast<size_t>(length) - 1 : 0);  // length counts the NUL
  hwloc_free_xmlbuffer(topology, buffer);
  return xml;
}

Topology discoverLiveTopology() {
  Topology topo = parseHwlocXml(exportLiveHwlocXml(), "live:hwloc");
  enrichNicsFromSysfs(topo);
  applyNvml(topo, probeNvml());
  topo.name = hostName();
  topo.source = "live";
  TOPOCCL_INFO(log::kGraph | log::kInit, "topology: live discovery of %s: %d CPU(s)/NUMA node(s), %d GPU(s), %d NIC(s), %d NVSwitch fabric(s)",
               topo.name.c_str(), topo.count(VertexKind::Cpu), topo.count(VertexKind::Gpu), topo.count(VertexKind::Nic),
               topo.count(VertexKind::NvSwitch));
  return topo;
}

#else  // !TOPOCCL_HAVE_HWLOC

bool liveDiscoveryBuilt() noexcept { return false; }

namespace {
[[noreturn]] void throwNoHwloc() {
  throwInvalidUsage(
      "topology: live discovery needs hwloc support, which was not built (configured with TOPOCCL_HWLOC=OFF or "
      "without libhwloc; install libhwloc-dev and reconfigure with -DTOPOCCL_HWLOC=ON), or set TOPOCCL_TOPO_FILE to a "
      "topology file");
}
}  // namespace

std::string exportLiveHwlocXml() { throwNoHwloc(); }
Topology discoverLiveTopology() { throwNoHwloc(); }

#endif  // TOPOCCL_HAVE_HWLOC

std::string topologyDumpFile() {
  if (params::kTopoDumpFile.isSet()) return params::kTopoDumpFile.get();
  return params::kNcclTopoDumpFile.get();
}

Topology loadHostTopology() {
  Topology topo;
  const std::string file = topologyFileOverride();
  if (!file.empty()) {
    TOPOCCL_INFO(log::kGraph | log::kInit, "topology: loading %s instead of discovering this host", file.c_str());
    topo = loadTopologyFile(file);
  } else {
    topo = discoverLiveTopology();
  }
  const std::string dump = topologyDumpFile();
  if (!dump.empty()) {
    std::ofstream out(dump, std::ios::binary | std::ios::trunc);
    out << writeNcclXml(topo);
    out.close();
    if (!out) TOPOCCL_WARN("topology: cannot write the topology dump to '%s'", dump.c_str());
    else TOPOCCL_INFO(log::kGraph, "topology: dumped %s to %s", topo.source.c_str(), dump.c_str());
  }
  return topo;
}

}  // namespace topoccl::topo
