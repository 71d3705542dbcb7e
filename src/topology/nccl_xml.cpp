// NCCL topology XML: what NCCL_TOPO_FILE reads and NCCL_TOPO_DUMP_FILE writes. Skeleton files from
// cloud vendors carry only <cpu>/<pci>; a GPU or NIC is then recognised by its PCI class alone.
#include <pugixml.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "common/error.hpp"
#include "topology/loaders.hpp"

namespace topoccl::topo {

namespace {

constexpr uint32_t kClassPciBridge = 0x060400;
constexpr uint32_t kClassNvSwitch = 0x068000;
constexpr uint32_t kClassCpu = 0x068001;
constexpr uint32_t kClassGpu = 0x030200;
constexpr uint32_t kClassIbNic = 0x020700;
constexpr uint32_t kClassEthNic = 0x020000;
constexpr uint16_t kVendorAmazonEfa = 0x1d0f;

struct PendingNvLink {
  VertexId gpu;
  std::string target;
  uint32_t targetClass;
  int count;
  int line;
};

class NcclXmlReader {
 public:
  NcclXmlReader(const std::string& text, const std::string& sourceName) : text_(text), source_(sourceName) {}

  Topology read() {
    pugi::xml_document doc;
    parseXmlOrThrow(doc, text_, source_);
    pugi::xml_node system = doc.child("system");
    if (!system) throwParseError(source_, 1, "no <system> element: not an NCCL topology file");
    std::string version = system.attribute("version").as_string("1");
    if (version != "1" && version != "2")
      throwParseError(source_, line(system), "unsupported NCCL topology version '" + version + "' (expected 1 or 2)");

    topo_.source = source_;
    topo_.addVertex(Vertex{.kind = VertexKind::Host, .name = "host0"});
    int cpuOrdinal = 0;
    for (pugi::xml_node cpu : system.children("cpu")) readCpu(cpu, cpuOrdinal++);
    for (pugi::xml_node child : system.children())
      if (child.type() == pugi::node_element && std::string(child.name()) != "cpu")
        throwParseError(source_, line(child), std::string("unexpected <") + child.name() + "> under <system>");

    linkCpus();
    resolveNvLinks();
    topo_.assignGpuIndices();
    return std::move(topo_);
  }

 private:
  const std::string& text_;
  const std::string& source_;
  Topology topo_;
  std::vector<PendingNvLink> nvlinks_;
  std::map<VertexId, VertexId> cpuOfGpu_;

  int line(pugi::xml_node node) const { return lineOfOffset(text_, static_cast<size_t>(node.offset_debug())); }

  uint32_t hexAttribute(pugi::xml_node node, const char* attribute) {
    pugi::xml_attribute a = node.attribute(attribute);
    if (!a || !*a.value()) return 0;
    char* end = nullptr;
    unsigned long value = std::strtoul(a.value(), &end, 16);
    if (*end != '\0')
      throwParseError(source_, line(node), std::string("attribute ") + attribute + "=\"" + a.value() + "\" is not hexadecimal");
    return static_cast<uint32_t>(value);
  }

  int intAttribute(pugi::xml_node node, const char* attribute, int fallback) {
    pugi::xml_attribute a = node.attribute(attribute);
    if (!a || !*a.value()) return fallback;
    char* end = nullptr;
    long value = std::strtol(a.value(), &end, 10);
    if (*end != '\0')
      throwParseError(source_, line(node), std::string("attribute ") + attribute + "=\"" + a.value() + "\" is not a number");
    return static_cast<int>(value);
  }

  void readCpu(pugi::xml_node node, int ordinal) {
    Vertex cpu{.kind = VertexKind::Cpu};
    cpu.numaId = intAttribute(node, "numaid", ordinal);
    cpu.name = "cpu" + std::to_string(cpu.numaId);
    cpu.cpuAffinity = node.attribute("affinity").as_string();
    cpu.arch = node.attribute("arch").as_string();
    cpu.cpuVendor = node.attribute("vendor").as_string();
    cpu.cpuFamily = intAttribute(node, "familyid", 0);
    cpu.cpuModel = intAttribute(node, "modelid", 0);
    if (topo_.findByName(cpu.name)) throwParseError(source_, line(node), "two <cpu> elements with numaid " + std::to_string(cpu.numaId));
    VertexId id = topo_.addVertex(cpu);
    for (pugi::xml_node child : node.children()) {
      if (child.type() != pugi::node_element) continue;
      std::string tag = child.name();
      if (tag == "pci") readPci(child, id, id);
      else if (tag == "nic") readNic(child, id, Vertex{.kind = VertexKind::Nic}, /*linkToParent=*/true, {});
      else throwParseError(source_, line(child), "unexpected <" + tag + "> under <cpu>");
    }
  }

  static int pcieGenFromSpeed(const std::string& speed) {
    double gts = std::atof(speed.c_str());  // "16 GT/s", "16.0 GT/s PCIe", "" (unknown)
    if (gts >= 60) return 6;
    if (gts >= 30) return 5;
    if (gts >= 15) return 4;
    if (gts >= 7.5) return 3;
    if (gts >= 4.5) return 2;
    if (gts >= 2) return 1;
    return 0;
  }

  Link pcieLinkOf(pugi::xml_node node) {
    Link l{.kind = LinkKind::Pcie};
    l.pcieGen = pcieGenFromSpeed(node.attribute("link_speed").as_string());
    l.pcieWidth = intAttribute(node, "link_width", 0);
    if (l.pcieWidth < 0 || l.pcieWidth > 32)
      throwParseError(source_, line(node), "link_width=\"" + std::to_string(l.pcieWidth) + "\" is not a PCIe width (0..32 lanes)");
    l.bandwidthGBs = pcieBandwidthGBs(l.pcieGen, l.pcieWidth);
    return l;
  }

  void readPci(pugi::xml_node node, VertexId parent, VertexId cpu) {
    std::string busId = node.attribute("busid").as_string();
    if (busId.empty()) throwParseError(source_, line(node), "<pci> without busid");
    if (topo_.findByBusId(busId)) throwParseError(source_, line(node), "bus id " + busId + " appears twice");
    Vertex v;
    v.busId = busId;
    v.pciClass = hexAttribute(node, "class");
    v.pciVendor = static_cast<uint16_t>(hexAttribute(node, "vendor"));
    v.pciDevice = static_cast<uint16_t>(hexAttribute(node, "device"));
    pugi::xml_node gpu = node.child("gpu"), nic = node.child("nic"), childPci = node.child("pci");
    uint32_t base = v.pciClass >> 16;
    if (v.pciClass == kClassCpu) return;  // a POWER NPU stands for the CPU itself; nothing to add
    if (gpu || (!nic && base == 0x03)) v.kind = VertexKind::Gpu;
    else if (nic || (!childPci && base == 0x02)) v.kind = VertexKind::Nic;
    else if (childPci || (v.pciClass & 0xffff00) == kClassPciBridge) v.kind = VertexKind::PciSwitch;
    else v.kind = VertexKind::PciDevice;  // e.g. the class-less leaves of the p5 skeleton

    Link up = pcieLinkOf(node);
    if (v.kind == VertexKind::Nic) {
      readNic(nic, parent, v, true, up);
      return;
    }
    if (v.kind == VertexKind::Gpu) {
      v.sm = intAttribute(gpu, "sm", 0);
      v.gpuIndex = gpu ? intAttribute(gpu, "dev", -1) : -1;
      if (v.pciClass == 0) v.pciClass = kClassGpu;
    }
    VertexId id = topo_.addVertex(v);
    topo_.addLink(parent, id, up);
    if (v.kind == VertexKind::Gpu) {
      cpuOfGpu_[id] = cpu;
      for (pugi::xml_node link : gpu.children("nvlink"))
        nvlinks_.push_back({id, normalizeBusId(link.attribute("target").as_string()), hexAttribute(link, "tclass"),
                            intAttribute(link, "count", 1), line(link)});
      for (pugi::xml_node c2c : gpu.children("c2c")) {
        Link l{.kind = LinkKind::C2C};
        l.bandwidthGBs = intAttribute(c2c, "bw", 0) / 1000.0 * intAttribute(c2c, "count", 1);
        if (l.bandwidthGBs <= 0) continue;
        // One link per pair, as for <nvlink> to a CPU: a GPU hanging from its CPU by PCIe has no C2C to it.
        if (const Link* existing = topo_.linkBetween(id, cpu))
          throwParseError(source_, line(c2c),
                          "c2c from " + describeVertex(topo_, id) + " to " + describeVertex(topo_, cpu) +
                              ", which it is already linked to by " + linkKindName(existing->kind) +
                              "; put the GPU under a <pci> bridge of that CPU");
        topo_.addLink(id, cpu, l);
      }
    }
    for (pugi::xml_node child : node.children("pci")) readPci(child, id, cpu);
  }

  void readNic(pugi::xml_node nic, VertexId parent, Vertex v, bool linkToParent, Link up) {
    v.kind = VertexKind::Nic;
    bool gdrKnown = false;
    for (pugi::xml_node net : nic.children("net")) {
      if (v.netName.empty()) v.netName = net.attribute("name").as_string();
      v.speedGbps = std::max(v.speedGbps, intAttribute(net, "speed", 0) / 1000.0);  // Mb/s
      if (net.attribute("gdr")) {
        gdrKnown = true;
        v.gpuDirect = v.gpuDirect || intAttribute(net, "gdr", 0) != 0;
      }
    }
    if ((v.pciClass >> 8) == (kClassIbNic >> 8)) v.linkLayer = LinkLayer::InfiniBand;
    else if ((v.pciClass >> 8) == (kClassEthNic >> 8)) v.linkLayer = LinkLayer::Ethernet;
    // Skeletons say nothing about GPUDirect; IB HCAs and AWS EFA (an Ethernet-class device) do RDMA.
    if (!gdrKnown) v.gpuDirect = v.linkLayer == LinkLayer::InfiniBand || v.pciVendor == kVendorAmazonEfa;
    VertexId id = topo_.addVertex(v);
    if (up.bandwidthGBs <= 0) up = Link{.kind = LinkKind::Pcie, .bandwidthGBs = pcieBandwidthGBs(0, 0)};
    if (linkToParent) topo_.addLink(parent, id, up);
  }

  void linkCpus() {
    std::vector<VertexId> cpus = topo_.verticesOfKind(VertexKind::Cpu);
    for (size_t i = 0; i < cpus.size(); ++i)
      for (size_t j = i + 1; j < cpus.size(); ++j) {
        const Vertex& c = topo_.vertex(cpus[i]);
        Link l{.kind = LinkKind::CpuInterconnect, .bandwidthGBs = cpuInterconnectBandwidthGBs(c.cpuVendor, c.arch, c.cpuModel)};
        topo_.addLink(cpus[i], cpus[j], l);
      }
  }

  void resolveNvLinks() {
    std::map<std::pair<VertexId, VertexId>, int> counts;  // (gpu, peer) -> links, switches merged
    std::map<std::pair<VertexId, VertexId>, int> lineOf;  // (gpu, peer) -> first <nvlink> line
    std::optional<VertexId> fabric;
    std::set<std::string> switchTargets;
    for (const PendingNvLink& p : nvlinks_) {
      const Vertex& gpu = topo_.vertex(p.gpu);
      if (p.target == gpu.busId) continue;  // NC A100 v4 files point a GPU at itself: meaningless
      if (p.count <= 0) throwParseError(source_, p.line, "nvlink count must be positive");
      std::optional<VertexId> peer = topo_.findByBusId(p.target);
      if (p.targetClass == kClassCpu) {
        peer = cpuOfGpu_.at(p.gpu);
      } else if (!(peer && topo_.vertex(*peer).kind == VertexKind::Gpu && p.targetClass != kClassNvSwitch)) {
        // Every NVSwitch of a host is one fabric vertex, as in NCCL.
        if (!fabric) fabric = topo_.addVertex(Vertex{.kind = VertexKind::NvSwitch, .name = "nvswitch0"});
        switchTargets.insert(p.target);
        peer = fabric;
      }
      counts[{p.gpu, *peer}] += p.count;
      lineOf.try_emplace({p.gpu, *peer}, p.line);
    }
    for (auto& [pair, count] : counts) {
      auto [gpu, peer] = pair;
      const Vertex& g = topo_.vertex(gpu);
      if (topo_.vertex(peer).kind == VertexKind::Gpu) {
        if (topo_.linkBetween(gpu, peer)) continue;  // both GPUs list the same link
        auto reverse = counts.find({peer, gpu});
        if (reverse != counts.end()) count = std::max(count, reverse->second);
      }
      // Both ends of a GPU pair give the link the same generation, whichever lists it first: the larger SM, so a GPU
      // whose sm is missing (0) takes its peer's (fuzzer finding: the rewritten file listed the pair the other way).
      const int sm = topo_.vertex(peer).kind == VertexKind::Gpu ? std::max(g.sm, topo_.vertex(peer).sm) : g.sm;
      Link l{.kind = LinkKind::NvLink, .nvlinkCount = count, .nvlinkGeneration = nvlinkGenerationForSm(sm)};
      l.bandwidthGBs = count * nvlinkBandwidthPerLinkGBs(sm);
      // The model holds one link per pair: a GPU hanging from its CPU by PCIe cannot also have an NVLink to it.
      if (topo_.linkBetween(gpu, peer))
        throwParseError(source_, lineOf.at(pair),
                        "nvlink from " + describeVertex(topo_, gpu) + " to " + describeVertex(topo_, peer) +
                            ", which it is already linked to by " + linkKindName(topo_.linkBetween(gpu, peer)->kind) +
                            "; put the GPU under a <pci> bridge of that CPU");
      topo_.addLink(gpu, peer, l);
    }
    if (fabric) topo_.vertex(*fabric).physicalSwitches = static_cast<int>(switchTargets.size());
  }
};

std::string linkSpeedText(int gen) {
  static const char* kSpeeds[] = {"", "2.5 GT/s", "5 GT/s", "8 GT/s", "16 GT/s", "32 GT/s", "64 GT/s"};
  return (gen >= 1 && gen <= 6) ? kSpeeds[gen] : "";
}

std::string hex(uint32_t value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", digits, value);
  return buf;
}

class NcclXmlWriter {
 public:
  explicit NcclXmlWriter(const Topology& topo)
      : topo_(topo), visited_(topo.vertexCount(), false), switchTarget_(busIdNoVertexHas(topo)) {}

  std::string write() {
    pugi::xml_document doc;
    pugi::xml_node system = doc.append_child("system");
    system.append_attribute("version") = "1";
    for (VertexId cpu : topo_.verticesOfKind(VertexKind::Cpu)) {
      const Vertex& c = topo_.vertex(cpu);
      visited_[cpu] = true;
      pugi::xml_node node = system.append_child("cpu");
      node.append_attribute("numaid") = c.numaId;
      if (!c.cpuAffinity.empty()) node.append_attribute("affinity") = c.cpuAffinity.c_str();
      if (!c.arch.empty()) node.append_attribute("arch") = c.arch.c_str();
      if (!c.cpuVendor.empty()) node.append_attribute("vendor") = c.cpuVendor.c_str();
      if (c.cpuFamily) node.append_attribute("familyid") = c.cpuFamily;
      if (c.cpuModel) node.append_attribute("modelid") = c.cpuModel;
      writeChildren(node, cpu);
    }
    std::ostringstream out;
    doc.save(out, "  ", pugi::format_indent | pugi::format_no_declaration);
    return out.str();
  }

 private:
  const Topology& topo_;
  std::vector<bool> visited_;
  // The <nvlink target> of an NVSwitch without a bus id. The reader drops a link whose target is the GPU's own bus id
  // (vendor files point GPUs at themselves), so a fixed "ffff:ff:ff.0" lost the links of a GPU with that bus id
  // (fuzzer finding); this one belongs to no vertex.
  std::string switchTarget_;

  static std::string busIdNoVertexHas(const Topology& topo) {
    std::set<std::string> used;
    for (VertexId id = 0; id < topo.vertexCount(); ++id) used.insert(normalizeBusId(topo.vertex(id).busId));
    for (int device = 0xff; device >= 0; --device)
      for (int function = 0; function < 8; ++function) {
        char text[16];
        std::snprintf(text, sizeof(text), "ffff:ff:%02x.%x", device, function);
        if (used.count(text) == 0) return text;
      }
    return "ffff:ff:ff.0";  // 2048 bus ids in use: beyond any machine
  }

  void writeChildren(pugi::xml_node parentNode, VertexId parent) {
    std::vector<const Link*> down;
    for (const Link* l : topo_.linksFrom(parent))
      if (l->kind == LinkKind::Pcie && !visited_[l->to] && topo_.vertex(l->to).kind != VertexKind::Cpu) down.push_back(l);
    std::sort(down.begin(), down.end(), [&](const Link* a, const Link* b) {
      return topo_.vertex(a->to).busId < topo_.vertex(b->to).busId;
    });
    for (const Link* l : down) {
      if (visited_[l->to]) continue;
      visited_[l->to] = true;
      writeDevice(parentNode, l->to, *l);
    }
  }

  void writeDevice(pugi::xml_node parentNode, VertexId id, const Link& up) {
    const Vertex& v = topo_.vertex(id);
    if (v.kind == VertexKind::Nic && v.busId.empty()) {  // a NIC hanging directly off a CPU
      writeNic(parentNode.append_child("nic"), v);
      return;
    }
    pugi::xml_node pci = parentNode.append_child("pci");
    pci.append_attribute("busid") = v.busId.empty() ? "0000:00:00.0" : v.busId.c_str();
    uint32_t cls = v.pciClass;
    if (!cls && v.kind == VertexKind::PciSwitch) cls = kClassPciBridge;
    if (!cls && v.kind == VertexKind::Gpu) cls = kClassGpu;
    if (!cls && v.kind == VertexKind::Nic) cls = v.linkLayer == LinkLayer::Ethernet ? kClassEthNic : kClassIbNic;
    if (cls) pci.append_attribute("class") = hex(cls, 6).c_str();
    if (v.pciVendor) pci.append_attribute("vendor") = hex(v.pciVendor, 4).c_str();
    if (v.pciDevice) pci.append_attribute("device") = hex(v.pciDevice, 4).c_str();
    pci.append_attribute("link_speed") = linkSpeedText(up.pcieGen).c_str();
    pci.append_attribute("link_width") = up.pcieWidth;
    if (v.kind == VertexKind::Gpu) writeGpu(pci.append_child("gpu"), id);
    // A skeleton NIC (no name, no speed) stays a bare <pci> leaf, as the vendor files have it.
    // Otherwise (a name, a speed, or a class the reader would not take for a NIC) it carries <nic><net>.
    if (v.kind == VertexKind::Nic && (!v.netName.empty() || v.speedGbps > 0 || (cls >> 16) != 0x02))
      writeNic(pci.append_child("nic"), v);
    writeChildren(pci, id);
  }

  void writeGpu(pugi::xml_node gpu, VertexId id) {
    const Vertex& v = topo_.vertex(id);
    gpu.append_attribute("dev") = v.gpuIndex;
    gpu.append_attribute("sm") = v.sm;
    gpu.append_attribute("rank") = v.gpuIndex;
    gpu.append_attribute("gdr") = 1;
    for (const Link* l : topo_.linksFrom(id)) {
      const Vertex& peer = topo_.vertex(l->to);
      if (l->kind == LinkKind::C2C) {
        pugi::xml_node c2c = gpu.append_child("c2c");
        c2c.append_attribute("bw") = static_cast<int>(l->bandwidthGBs * 1000 + 0.5);
        c2c.append_attribute("count") = 1;
        continue;
      }
      if (l->kind != LinkKind::NvLink) continue;
      pugi::xml_node nv = gpu.append_child("nvlink");
      uint32_t tclass = peer.kind == VertexKind::Gpu ? kClassGpu : peer.kind == VertexKind::Cpu ? kClassCpu : kClassNvSwitch;
      nv.append_attribute("target") = peer.busId.empty() ? switchTarget_.c_str() : peer.busId.c_str();
      nv.append_attribute("count") = l->nvlinkCount;
      nv.append_attribute("tclass") = hex(tclass, 6).c_str();
    }
  }

  static void writeNic(pugi::xml_node nic, const Vertex& v) {
    pugi::xml_node net = nic.append_child("net");
    // An unknown name stays unknown (empty): inventing one would change the graph on a round trip.
    net.append_attribute("name") = v.netName.c_str();
    net.append_attribute("dev") = 0;
    net.append_attribute("speed") = static_cast<int>(v.speedGbps * 1000 + 0.5);
    net.append_attribute("port") = 1;
    net.append_attribute("gdr") = v.gpuDirect ? 1 : 0;
  }
};

}  // namespace

Topology parseNcclXml(const std::string& text, const std::string& sourceName) {
  return NcclXmlReader(text, sourceName).read();
}

std::string writeNcclXml(const Topology& topo) { return NcclXmlWriter(topo).write(); }

}  // namespace topoccl::topo
