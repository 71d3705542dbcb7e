// hwloc XML v2 files, read with pugixml so no libhwloc is needed. GPUs and NICs are classified by
// PCI class (OS device names are only hints: the DGX-2 backport calls nvml* COPROC), a switch's
// upstream port and its downstream ports collapse into one switch, and NVLink comes from the
// NVLinkBandwidth distances matrix.
#include <pugixml.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "common/error.hpp"
#include "topology/loaders.hpp"

namespace topoccl::topo {

namespace {

struct PciType {
  uint16_t classId = 0, vendor = 0, device = 0;
};

// "0302 [10de:1db8] [10de:131d] a1"
PciType parsePciType(const std::string& text) {
  PciType t;
  unsigned cls = 0, ven = 0, dev = 0;
  if (std::sscanf(text.c_str(), "%x [%x:%x]", &cls, &ven, &dev) >= 1) {
    t.classId = static_cast<uint16_t>(cls);
    t.vendor = static_cast<uint16_t>(ven);
    t.device = static_cast<uint16_t>(dev);
  }
  return t;
}

// hwloc bitmaps: "0x00000303,0x03030000,,0x0", comma-separated 32-bit words, most significant first.
std::vector<uint32_t> parseBitmapWords(const std::string& text) {
  std::vector<uint32_t> words;  // least significant first
  std::stringstream in(text);
  std::string word;
  std::vector<std::string> parts;
  while (std::getline(in, word, ',')) parts.push_back(word);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it)
    words.push_back(it->empty() ? 0u : static_cast<uint32_t>(std::strtoul(it->c_str(), nullptr, 16)));
  return words;
}

int firstBit(const std::string& bitmap) {
  std::vector<uint32_t> words = parseBitmapWords(bitmap);
  for (size_t w = 0; w < words.size(); ++w)
    for (int b = 0; b < 32; ++b)
      if (words[w] & (1u << b)) return static_cast<int>(w * 32 + b);
  return -1;
}

std::string affinityOf(const std::string& bitmap) {
  std::vector<uint32_t> words = parseBitmapWords(bitmap);
  std::string out;
  for (auto it = words.rbegin(); it != words.rend(); ++it) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", *it);
    out += (out.empty() ? "" : ",") + std::string(buf);
  }
  return out;
}

// hwloc reports aggregate link GB/s; assume x16 to recover the generation (15.75 -> Gen3).
int pcieGenFromGBs(double gbs) {
  double lane = gbs / 16;
  if (lane > 7) return 6;
  if (lane > 3.5) return 5;
  if (lane > 1.7) return 4;
  if (lane > 0.9) return 3;
  if (lane > 0.45) return 2;
  if (lane > 0.2) return 1;
  return 0;
}

// No SM in hwloc files: take it from the marketing name, which NVML always fills in.
int smFromModel(const std::string& model) {
  static const std::pair<const char*, int> kModels[] = {{"B200", 100}, {"B100", 100}, {"H200", 90}, {"H100", 90},
                                                        {"H800", 90},  {"A100", 80}, {"A800", 80}, {"A30", 80},
                                                        {"V100", 70},  {"P100", 60}, {"K80", 37},  {"K40", 35}};
  for (const auto& [needle, sm] : kModels)
    if (model.find(needle) != std::string::npos) return sm;
  return 0;
}

class HwlocXmlReader {
 public:
  HwlocXmlReader(const std::string& text, const std::string& sourceName) : text_(text), source_(sourceName) {}

  Topology read() {
    pugi::xml_document doc;
    parseXmlOrThrow(doc, text_, source_);
    pugi::xml_node root = doc.child("topology");
    if (!root) throwParseError(source_, 1, "no <topology> element: not an hwloc XML file");
    std::string version = root.attribute("version").as_string();
    if (version.empty())
      throwParseError(source_, line(root), "hwloc XML v1 (no version attribute) is not supported; re-export it with hwloc 2.x: `lstopo --of xml out.xml`");
    if (version.rfind("2.", 0) != 0)
      throwParseError(source_, line(root),
                      "hwloc XML version " + version + " is not supported (only 2.x); re-export it as v2 with hwloc 3.x: "
                      "`lstopo --of xml --export-xml-flags v2 out.xml`, or hwloc_topology_export_xml() with "
                      "HWLOC_TOPOLOGY_EXPORT_XML_FLAG_V2");
    topo_.source = source_;
    topo_.addVertex(Vertex{.kind = VertexKind::Host, .name = "host0"});
    pugi::xml_node machine = root.child("object");
    if (!machine) throwParseError(source_, line(root), "no Machine object");
    hwlocVersion_ = infoValue(machine, "hwlocVersion");
    arch_ = infoValue(machine, "Architecture");
    createCpus(machine, {});
    walk(machine, -1, {});
    linkCpus();
    pruneEmptySwitches();
    for (pugi::xml_node d : root.children("distances2hetero"))
      if (std::string(d.attribute("name").as_string()) == "NVLinkBandwidth") readNvLinkMatrix(d);
    pruneEmptySwitches();
    topo_.assignGpuIndices();
    return std::move(topo_);
  }

 private:
  const std::string& text_;
  const std::string& source_;
  Topology topo_;
  std::string hwlocVersion_, arch_;
  std::map<int, VertexId> cpuByNuma_;
  std::map<long, VertexId> vertexByGpIndex_;  // for the distances matrix
  std::map<long, std::string> gpKind_;
  std::set<VertexId> nvswitchChips_;  // PCI presence of NVSwitch chips; merged into one fabric
  std::map<VertexId, std::string> osDevNames_;

  int line(pugi::xml_node node) const { return lineOfOffset(text_, static_cast<size_t>(node.offset_debug())); }

  static std::string infoValue(pugi::xml_node obj, const char* name) {
    for (pugi::xml_node info : obj.children("info"))
      if (std::string(info.attribute("name").as_string()) == name) return info.attribute("value").as_string();
    return {};
  }

  // One Cpu vertex per NUMA node; CPU identity comes from the enclosing Package.
  void createCpus(pugi::xml_node obj, pugi::xml_node package) {
    std::string type = obj.attribute("type").as_string();
    if (type == "Package") package = obj;
    if (type == "NUMANode") {
      Vertex cpu{.kind = VertexKind::Cpu};
      cpu.numaId = obj.attribute("os_index").as_int(static_cast<int>(cpuByNuma_.size()));
      cpu.name = "cpu" + std::to_string(cpu.numaId);
      cpu.cpuAffinity = affinityOf(obj.attribute("cpuset").as_string());
      cpu.arch = arch_ == "ppc64le" ? "ppc64" : arch_ == "aarch64" ? "arm64" : arch_;
      if (package) {
        cpu.cpuVendor = infoValue(package, "CPUVendor");
        cpu.cpuFamily = std::atoi(infoValue(package, "CPUFamilyNumber").c_str());
        cpu.cpuModel = std::atoi(infoValue(package, "CPUModelNumber").c_str());
      }
      if (!cpuByNuma_.count(cpu.numaId)) cpuByNuma_[cpu.numaId] = topo_.addVertex(cpu);
    }
    for (pugi::xml_node child : obj.children("object")) createCpus(child, package);
  }

  VertexId cpuForObject(pugi::xml_node obj) {
    int numa = firstBit(obj.attribute("nodeset").as_string());
    auto it = cpuByNuma_.find(numa);
    if (it != cpuByNuma_.end()) return it->second;
    if (cpuByNuma_.empty()) {  // a file with no NUMA objects: make one so devices have a home
      Vertex cpu{.kind = VertexKind::Cpu, .name = "cpu0", .numaId = 0};
      cpuByNuma_[0] = topo_.addVertex(cpu);
    }
    return cpuByNuma_.begin()->second;
  }

  Link pcieLink(pugi::xml_node obj) {
    double gbs = obj.attribute("pci_link_speed").as_double(0);
    Link l{.kind = LinkKind::Pcie};
    l.pcieGen = pcieGenFromGBs(gbs);
    l.pcieWidth = l.pcieGen ? 16 : 0;
    l.bandwidthGBs = pcieBandwidthGBs(l.pcieGen, l.pcieWidth);
    return l;
  }

  struct BridgeContext {
    VertexId vertex = -1;       // the switch this bridge belongs to
    bool upstreamPort = false;  // true when the bridge started the switch
    PciType type;
  };

  void walk(pugi::xml_node obj, VertexId attach, BridgeContext bridge) {
    std::string type = obj.attribute("type").as_string();
    if (type == "Package" || type == "Machine" || type == "Group" || type == "NUMANode" || type.find("Cache") != std::string::npos ||
        type == "Core" || type == "PU" || type == "Die") {
      long gp = obj.attribute("gp_index").as_llong(-1);
      if (type == "Package" && gp >= 0) {
        vertexByGpIndex_[gp] = cpuForObject(obj);
        gpKind_[gp] = "Package";
      }
      for (pugi::xml_node child : obj.children("object")) walk(child, cpuForObject(obj), {});
      return;
    }
    if (type == "Bridge") {
      std::string bridgeType = obj.attribute("bridge_type").as_string();
      if (bridgeType.rfind("0-", 0) == 0) {  // host bridge: devices below it hang off the CPU
        for (pugi::xml_node child : obj.children("object")) walk(child, attach, {});
        return;
      }
      PciType t = parsePciType(obj.attribute("pci_type").as_string());
      BridgeContext mine;
      mine.type = t;
      bool samePart = bridge.vertex >= 0 && bridge.upstreamPort && bridge.type.vendor == t.vendor && bridge.type.device == t.device;
      if (samePart) {  // a downstream port of the switch whose upstream port is our parent
        mine.vertex = bridge.vertex;
      } else {
        Vertex sw{.kind = VertexKind::PciSwitch, .busId = obj.attribute("pci_busid").as_string(),
                  .pciClass = static_cast<uint32_t>(t.classId) << 8, .pciVendor = t.vendor, .pciDevice = t.device};
        mine.vertex = topo_.addVertex(sw);
        mine.upstreamPort = true;
        topo_.addLink(attach, mine.vertex, pcieLink(obj));
      }
      for (pugi::xml_node child : obj.children("object")) walk(child, mine.vertex, mine);
      return;
    }
    if (type == "PCIDev") {
      readPciDevice(obj, attach);
      return;
    }
    // OSDev and Misc under a CPU object carry nothing the graph needs.
  }

  void readPciDevice(pugi::xml_node obj, VertexId attach) {
    PciType t = parsePciType(obj.attribute("pci_type").as_string());
    std::string subtype = obj.attribute("subtype").as_string();
    long gp = obj.attribute("gp_index").as_llong(-1);
    uint8_t base = static_cast<uint8_t>(t.classId >> 8);
    Vertex v{.busId = obj.attribute("pci_busid").as_string(), .pciClass = static_cast<uint32_t>(t.classId) << 8,
             .pciVendor = t.vendor, .pciDevice = t.device};
    if (subtype == "NVSwitch" || (t.classId == 0x0680 && t.vendor == 0x10de)) {
      // Its PCIe side only manages the chip; the data path is NVLink, merged below into one fabric.
      gpKind_[gp] = "NVSwitch";
      vertexByGpIndex_[gp] = -1;
      return;
    }
    // Display controllers of other vendors (a server's ASPEED/Matrox BMC VGA, a VM's emulated VGA) are
    // not GPUs for collectives; vendor 0 means unknown (sysfs snapshots without ids).
    const bool gpuVendor = t.vendor == 0x10de || t.vendor == 0x1002 || t.vendor == 0;
    if ((base == 0x03 || base == 0x12) && gpuVendor) {
      v.kind = VertexKind::Gpu;
      for (pugi::xml_node os : obj.children("object")) {
        std::string model = infoValue(os, "GPUModel");
        if (!model.empty() && v.gpuModel.empty()) v.gpuModel = model;
      }
      v.sm = smFromModel(v.gpuModel);
    } else if (base == 0x02 || t.classId == 0x0c06) {
      v.kind = VertexKind::Nic;
      v.linkLayer = (t.classId == 0x0207 || t.classId == 0x0c06) ? LinkLayer::InfiniBand : LinkLayer::Ethernet;
      // Prefer the RDMA device name (osdev_type 3, OPENFABRICS) over the netdev name.
      std::string rdmaName, netName;
      for (pugi::xml_node os : obj.children("object")) {
        int osType = os.attribute("osdev_type").as_int(-1);
        if (osType == 3 && rdmaName.empty()) rdmaName = os.attribute("name").as_string();
        if (osType == 2 && netName.empty()) netName = os.attribute("name").as_string();
      }
      v.netName = rdmaName.empty() ? netName : rdmaName;
      v.gpuDirect = !rdmaName.empty();
    } else {
      return;  // storage, USB, DMA engines...: not part of the communication graph
    }
    VertexId id = topo_.addVertex(v);
    topo_.addLink(attach, id, pcieLink(obj));
    if (gp >= 0) {
      vertexByGpIndex_[gp] = id;
      gpKind_[gp] = "PCIDev";
    }
    for (pugi::xml_node os : obj.children("object")) {
      long osGp = os.attribute("gp_index").as_llong(-1);
      if (osGp >= 0) {
        vertexByGpIndex_[osGp] = id;
        gpKind_[osGp] = "OSDev";
      }
    }
  }

  void linkCpus() {
    std::vector<VertexId> cpus = topo_.verticesOfKind(VertexKind::Cpu);
    for (size_t i = 0; i < cpus.size(); ++i)
      for (size_t j = i + 1; j < cpus.size(); ++j) {
        const Vertex& c = topo_.vertex(cpus[i]);
        topo_.addLink(cpus[i], cpus[j],
                      Link{.kind = LinkKind::CpuInterconnect, .bandwidthGBs = cpuInterconnectBandwidthGBs(c.cpuVendor, c.arch, c.cpuModel)});
      }
  }

  // A switch that leads to no kept device is noise (hwloc's KEEP_IMPORTANT drops it too).
  void pruneEmptySwitches() {
    for (bool changed = true; changed;) {
      changed = false;
      std::vector<bool> leaf(topo_.vertexCount(), false);
      for (VertexId v = 0; v < topo_.vertexCount(); ++v)
        if (topo_.vertex(v).kind == VertexKind::PciSwitch && topo_.linksFrom(v).size() <= 1) leaf[v] = changed = true;
      if (changed) {
        std::map<long, std::string> names;
        for (auto& [gp, id] : vertexByGpIndex_)
          if (id >= 0) names[gp] = topo_.vertex(id).name;
        topo_.removeVertices([&](const Vertex&, VertexId id) { return leaf[id]; });
        for (auto& [gp, id] : vertexByGpIndex_)
          if (id >= 0) id = names.count(gp) ? topo_.findByName(names[gp]).value_or(-1) : -1;
        std::map<int, VertexId> cpus;
        for (VertexId c : topo_.verticesOfKind(VertexKind::Cpu)) cpus[topo_.vertex(c).numaId] = c;
        cpuByNuma_ = cpus;
      }
    }
  }

  static std::vector<std::string> tokens(pugi::xml_node parent, const char* childName) {
    std::vector<std::string> out;
    for (pugi::xml_node n : parent.children(childName)) {
      std::stringstream in(n.child_value());
      std::string tok;
      while (in >> tok) out.push_back(tok);
    }
    return out;
  }

  // hwloc < 2.12 recorded NVLink 3/4 at 50000 MB/s per link (a bug fixed in 2.12).
  double megabytesPerLink(int sm) const {
    if (sm >= 100) return 50000;
    if (sm >= 80) {
      int major = 0, minor = 0;
      bool fixed = std::sscanf(hwlocVersion_.c_str(), "%d.%d", &major, &minor) == 2 && (major > 2 || (major == 2 && minor >= 12));
      return fixed ? 25000 : 50000;
    }
    if (sm >= 70) return 25000;
    return 20000;
  }

  void readNvLinkMatrix(pugi::xml_node d) {
    int n = d.attribute("nbobjs").as_int(0);
    std::vector<std::string> indexes = tokens(d, "indexes");
    std::vector<std::string> values = tokens(d, "u64values");
    if (n <= 0 || n > 65536 || static_cast<int64_t>(indexes.size()) != n ||
        static_cast<int64_t>(values.size()) != static_cast<int64_t>(n) * n)
      throwParseError(source_, line(d), "NVLinkBandwidth matrix: expected " + std::to_string(n) + " indexes and " +
                                            std::to_string(n * n) + " values, found " + std::to_string(indexes.size()) +
                                            " and " + std::to_string(values.size()));
    // Rows: GPU (OSDev or PCIDev), NVSwitch (PCIDev), or CPU (Package, POWER).
    std::vector<VertexId> endpoint(n, -1);
    std::vector<bool> isSwitch(n, false);
    for (int i = 0; i < n; ++i) {
      size_t colon = indexes[i].find(':');
      long gp = colon == std::string::npos ? -1 : std::atol(indexes[i].c_str() + colon + 1);
      if (gpKind_.count(gp) && gpKind_[gp] == "NVSwitch") isSwitch[i] = true;
      else if (vertexByGpIndex_.count(gp)) endpoint[i] = vertexByGpIndex_[gp];
      else throwParseError(source_, line(d), "NVLinkBandwidth names unknown object " + indexes[i]);
    }
    std::optional<VertexId> fabric;
    std::map<std::pair<VertexId, VertexId>, double> mbs;  // summed over switch chips
    int chips = 0;
    for (int i = 0; i < n; ++i) chips += isSwitch[i];
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        if (i == j) continue;
        const std::string& text = values[static_cast<size_t>(i) * n + j];
        double v = std::atof(text.c_str());
        // No link is faster than 1e9 MB/s (1 PB/s): beyond that the file is wrong, and the count would overflow.
        if (!std::isfinite(v) || v > 1e9)
          throwParseError(source_, line(d), "NVLinkBandwidth value '" + text + "' (row " + std::to_string(i) + ", column " +
                                                std::to_string(j) + ") is not a bandwidth in MB/s");
        if (v <= 0 || isSwitch[i]) continue;  // read each link from its GPU/CPU side
        VertexId from = endpoint[i];
        if (from < 0 || topo_.vertex(from).kind != VertexKind::Gpu) continue;
        VertexId to;
        if (isSwitch[j]) {
          if (!fabric) fabric = topo_.addVertex(Vertex{.kind = VertexKind::NvSwitch, .name = "nvswitch0", .physicalSwitches = chips});
          to = *fabric;
        } else {
          to = endpoint[j];
        }
        if (to < 0) continue;
        if (to == from)
          throwParseError(source_, line(d), "NVLinkBandwidth row " + std::to_string(i) + " (" + indexes[i] + ") and column " +
                                                std::to_string(j) + " (" + indexes[j] + ") are the same GPU, " +
                                                describeVertex(topo_, from) + ", with " + text + " MB/s between them");
        mbs[{from, to}] += v;
      }
    for (const auto& [pair, total] : mbs) {
      auto [from, to] = pair;
      if (topo_.linkBetween(from, to)) continue;
      const Vertex& gpu = topo_.vertex(from);
      const double links = total / megabytesPerLink(gpu.sm) + 0.5;
      if (links > 4096)
        throwParseError(source_, line(d), "NVLinkBandwidth gives " + describeVertex(topo_, from) + " " + std::to_string(total) +
                                        " MB/s to one peer: more than 4096 NVLinks");
      int count = static_cast<int>(links);
      if (count <= 0) continue;
      Link l{.kind = LinkKind::NvLink, .nvlinkCount = count, .nvlinkGeneration = nvlinkGenerationForSm(gpu.sm)};
      l.bandwidthGBs = count * nvlinkBandwidthPerLinkGBs(gpu.sm);
      topo_.addLink(from, to, l);
    }
  }
};

}  // namespace

Topology parseHwlocXml(const std::string& text, const std::string& sourceName) {
  return HwlocXmlReader(text, sourceName).read();
}

}  // namespace topoccl::topo
