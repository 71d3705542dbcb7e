// The hardware graph every other layer reads: hosts, CPUs (one per NUMA node), PCIe switches, GPUs,
// NVSwitch fabrics, NICs and the links between them, with per-direction bandwidth and latency. Paths
// between devices are classified in NCCL's terms so results can be compared with NCCL and
// `nvidia-smi topo -m`. Loaders (NCCL XML, hwloc XML, native JSON) and presets fill it; see loaders.hpp.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace topoccl::topo {

enum class VertexKind : uint8_t { Host, Cpu, PciSwitch, Gpu, NvSwitch, Nic, PciDevice, NetSwitch };
enum class LinkKind : uint8_t { NvLink, Pcie, CpuInterconnect, C2C, Network };
enum class LinkLayer : uint8_t { Unknown, InfiniBand, Ethernet };

// NCCL's path types, best to worst (NCCL has no NODE: it folds NODE into PHB).
enum class PathClass : uint8_t { LOC, NVL, NVB, C2C, PIX, PXB, PXN, PHB, SYS, NET, DIS };

const char* vertexKindName(VertexKind kind) noexcept;
const char* linkKindName(LinkKind kind) noexcept;
const char* linkLayerName(LinkLayer layer) noexcept;
const char* pathClassName(PathClass cls) noexcept;
std::optional<VertexKind> vertexKindFromName(const std::string& name);
std::optional<LinkKind> linkKindFromName(const std::string& name);
std::optional<LinkLayer> linkLayerFromName(const std::string& name);

using VertexId = int;

// One flat record per vertex; fields that do not apply to a kind keep their defaults.
struct Vertex {
  VertexKind kind = VertexKind::Host;
  std::string name{};   // unique, e.g. "gpu3", "nic0", "cpu1", "pcisw2"
  int host = 0;       // index of the host this vertex belongs to
  std::string busId{};  // PCI address "dddd:bb:dd.f", lower case; empty when the vertex has none
  uint32_t pciClass = 0;
  uint16_t pciVendor = 0, pciDevice = 0;

  // Cpu
  int numaId = -1;
  std::string cpuAffinity{};  // hex words, most significant first, "00000000,00ffffff" (NCCL's spelling)
  std::string arch{}, cpuVendor{};
  int cpuFamily = 0, cpuModel = 0;

  // Gpu
  int gpuIndex = -1;  // CUDA device order (PCI bus id order unless the source says otherwise)
  int sm = 0;         // compute capability x10, e.g. 70 for V100; 0 when unknown
  std::string gpuModel{};

  // Nic
  std::string netName{};  // "mlx5_0", "eth0"; empty when unknown
  double speedGbps = 0;  // port speed; 0 when unknown
  LinkLayer linkLayer = LinkLayer::Unknown;
  bool gpuDirect = false;

  // NvSwitch: one vertex per host stands for the whole NVLink fabric, however many chips it has.
  int physicalSwitches = 0;
};

// A directed link; the graph stores both directions so each can carry its own numbers.
struct Link {
  VertexId from = -1, to = -1;
  LinkKind kind = LinkKind::Pcie;
  double bandwidthGBs = 0;  // GB/s in this direction
  double latencyUs = 0;     // one-way, this direction
  int nvlinkCount = 0, nvlinkGeneration = 0;
  int pcieGen = 0, pcieWidth = 0;
};

struct Path {
  std::vector<VertexId> vertices;  // from source to destination inclusive
  double bandwidthGBs = 0;         // bottleneck
  int hops = 0;
  PathClass cls = PathClass::DIS;
  bool exists() const { return cls != PathClass::DIS; }
};

// Per-generation facts used by every front end (NCCL's bandwidth tables, so numbers compare).
double nvlinkBandwidthPerLinkGBs(int sm);  // SM60 18, SM70/80 20, SM86 12, SM90 20.6, SM100 40.1
int nvlinkGenerationForSm(int sm);
double pcieBandwidthGBs(int gen, int width);  // width x lane rate / 8, NCCL: Gen3 x16 = 12 GB/s
double cpuInterconnectBandwidthGBs(const std::string& vendor, const std::string& arch, int model);
double defaultLatencyUs(LinkKind kind);

class Topology {
 public:
  std::string name{};    // e.g. "azure-ndv4"
  std::string source;  // where it came from: a file path or "preset:dgx1"

  VertexId addVertex(Vertex vertex);  // names must be unique; an empty name gets one generated
  // Adds both directions with the same numbers (bandwidth derived from the kind when 0).
  void addLink(VertexId a, VertexId b, Link spec);
  void addDirectedLink(Link link);
  // Drops vertices for which `drop` is true, and their links; ids are renumbered.
  template <class Pred>
  void removeVertices(Pred drop);

  int vertexCount() const { return static_cast<int>(vertices_.size()); }
  const Vertex& vertex(VertexId id) const { return vertices_.at(id); }
  Vertex& vertex(VertexId id) { return vertices_.at(id); }
  const std::vector<Vertex>& vertices() const { return vertices_; }
  const std::vector<Link>& links() const { return links_; }
  std::vector<const Link*> linksFrom(VertexId id) const;
  const Link* linkBetween(VertexId from, VertexId to) const;
  std::optional<VertexId> findByName(const std::string& name) const;
  std::optional<VertexId> findByBusId(const std::string& busId) const;

  std::vector<VertexId> verticesOfKind(VertexKind kind) const;  // GPUs by gpuIndex, others by id
  std::vector<VertexId> gpus() const { return verticesOfKind(VertexKind::Gpu); }
  std::vector<VertexId> nics() const { return verticesOfKind(VertexKind::Nic); }
  int count(VertexKind kind) const { return static_cast<int>(verticesOfKind(kind).size()); }
  std::optional<VertexId> gpuByIndex(int index) const;

  // Best route: best NCCL class first, then fewest hops, then widest bottleneck (so a direct single
  // NVLink stays NVL as NCCL and nvidia-smi report it, and DGX-1 non-neighbours get 2-hop NVB). GPUs relay only NVLink to NVLink;
  // NICs and PCI endpoints never relay except across the network. GPU->NIC may be PXN.
  Path path(VertexId from, VertexId to) const;
  // NICs on the GPU's host with the best (class, bandwidth); all ties are returned.
  std::vector<VertexId> nearestNics(VertexId gpu) const;
  // One NIC per GPU: among the nearest NICs, GPUs sharing the same set are paired in bus id order.
  std::optional<VertexId> railNic(VertexId gpu) const;
  // The CPU (NUMA node) closest to a device.
  std::optional<VertexId> localCpu(VertexId device) const;

  // Canonical text: every vertex and link in a sorted, loader-independent spelling.
  std::string canonicalText() const;
  std::string fingerprint() const;  // 16 hex digits, FNV-1a 64 of canonicalText()

  // Gives GPUs without an index one in bus id order after the indexed ones.
  void assignGpuIndices();

 private:
  std::vector<Vertex> vertices_;
  std::vector<Link> links_;
  std::map<std::string, VertexId> byName_;
  mutable std::map<VertexId, std::vector<Path>> pathCache_;
  const std::vector<Path>& pathsFrom(VertexId from) const;
  std::vector<Path> computePathsFrom(VertexId from) const;
  void rebuildIndex();
  void removeMarked(const std::vector<bool>& dropped);
};

template <class Pred>
void Topology::removeVertices(Pred drop) {
  std::vector<bool> dropped(vertices_.size());
  for (size_t i = 0; i < vertices_.size(); ++i) dropped[i] = drop(vertices_[i], static_cast<VertexId>(i));
  removeMarked(dropped);
}

// Helpers shared by the loaders.
std::string normalizeBusId(const std::string& busId);  // lower case, "dddd:bb:dd.f"
std::string describeVertex(const Topology& topo, VertexId id);  // "gpu0 (0000:34:00.0)"

}  // namespace topoccl::topo
