#include "topology/topology.hpp"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <set>
#include <sstream>
#include <tuple>

#include "common/error.hpp"
#include "common/hash.hpp"
#include "topology/cluster.hpp"

namespace topoccl::topo {

namespace {

constexpr const char* kVertexKindNames[] = {"host", "cpu", "pcisw", "gpu", "nvswitch", "nic", "pci", "netsw"};
constexpr const char* kLinkKindNames[] = {"nvlink", "pcie", "cpu", "c2c", "net"};
constexpr const char* kLinkLayerNames[] = {"unknown", "infiniband", "ethernet"};
constexpr const char* kPathClassNames[] = {"LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "PXN", "PHB", "SYS", "NET", "DIS"};

template <class E, size_t N>
std::optional<E> enumFromName(const char* const (&names)[N], const std::string& name) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

uint32_t bit(LinkKind k) { return 1u << static_cast<unsigned>(k); }
uint32_t bit(VertexKind k) { return 1u << static_cast<unsigned>(k); }

// Search levels, tried in order: each admits more link kinds and more relay vertices, so the first
// level that reaches a target yields the route of the best class (NCCL's order of path types).
struct SearchLevel {
  uint32_t linkKinds;
  uint32_t relayKinds;
};
const SearchLevel kLevels[] = {
    {bit(LinkKind::NvLink), bit(VertexKind::NvSwitch)},                                  // NVL
    {bit(LinkKind::NvLink), bit(VertexKind::NvSwitch) | bit(VertexKind::Gpu)},           // NVB
    {bit(LinkKind::NvLink) | bit(LinkKind::C2C), bit(VertexKind::NvSwitch)},             // C2C
    {bit(LinkKind::Pcie), bit(VertexKind::PciSwitch)},                                   // PIX/PXB
    {bit(LinkKind::Pcie) | bit(LinkKind::C2C) | bit(LinkKind::NvLink),
     bit(VertexKind::PciSwitch) | bit(VertexKind::Cpu) | bit(VertexKind::NvSwitch)},     // PHB
    {bit(LinkKind::Pcie) | bit(LinkKind::C2C) | bit(LinkKind::NvLink) | bit(LinkKind::CpuInterconnect),
     bit(VertexKind::PciSwitch) | bit(VertexKind::Cpu) | bit(VertexKind::NvSwitch)},     // SYS
    {~0u, bit(VertexKind::PciSwitch) | bit(VertexKind::Cpu) | bit(VertexKind::NvSwitch) |
              bit(VertexKind::NetSwitch) | bit(VertexKind::Nic)},                         // NET
};

std::string fmt(double value) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", value);
  return buf;
}

}  // namespace

const char* vertexKindName(VertexKind kind) noexcept { return kVertexKindNames[static_cast<int>(kind)]; }
const char* linkKindName(LinkKind kind) noexcept { return kLinkKindNames[static_cast<int>(kind)]; }
const char* linkLayerName(LinkLayer layer) noexcept { return kLinkLayerNames[static_cast<int>(layer)]; }
const char* pathClassName(PathClass cls) noexcept { return kPathClassNames[static_cast<int>(cls)]; }
std::optional<VertexKind> vertexKindFromName(const std::string& name) { return enumFromName<VertexKind>(kVertexKindNames, name); }
std::optional<LinkKind> linkKindFromName(const std::string& name) { return enumFromName<LinkKind>(kLinkKindNames, name); }
std::optional<LinkLayer> linkLayerFromName(const std::string& name) { return enumFromName<LinkLayer>(kLinkLayerNames, name); }

double nvlinkBandwidthPerLinkGBs(int sm) {
  if (sm >= 100) return 40.1;
  if (sm >= 90) return 20.6;
  if (sm == 86 || sm == 87 || sm == 89) return 12.0;
  if (sm >= 70) return 20.0;
  return 18.0;
}

int nvlinkGenerationForSm(int sm) {
  if (sm >= 100) return 5;
  if (sm >= 90) return 4;
  if (sm >= 80) return 3;
  if (sm >= 70) return 2;
  return sm > 0 ? 1 : 0;
}

double pcieBandwidthGBs(int gen, int width) {
  // Per-lane rate in units of 100 Mb/s after encoding, by generation (unknown -> Gen3, as NCCL).
  static constexpr int kLaneRate[] = {60, 15, 30, 60, 120, 240, 480};
  int rate = (gen >= 1 && gen <= 6) ? kLaneRate[gen] : kLaneRate[0];
  if (width <= 0) width = 16;
  return static_cast<double>(width) * rate / 80.0;  // double: a hostile file's width must not overflow
}

double cpuInterconnectBandwidthGBs(const std::string& vendor, const std::string& arch, int model) {
  if (arch == "ppc64") return 32;
  if (arch == "arm64") return 6;
  if (vendor == "AuthenticAMD") return 16;
  if (vendor == "GenuineIntel") {
    if (model == 85) return 10;   // Skylake / Cascade Lake
    if (model == 143) return 22;  // Sapphire Rapids
    if (model == 207) return 40;  // Emerald Rapids
  }
  return 6;  // Broadwell-class default
}

// Rough one-way latencies for the cost model; loaders that know better overwrite them.
double defaultLatencyUs(LinkKind kind) {
  switch (kind) {
    case LinkKind::NvLink: return 0.7;
    case LinkKind::C2C: return 0.5;
    case LinkKind::Pcie: return 1.0;
    case LinkKind::CpuInterconnect: return 1.0;
    case LinkKind::Network: return 1.3;
  }
  return 1.0;
}

std::string normalizeBusId(const std::string& busId) {
  std::string out;
  for (char c : busId) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // "bb:dd.f" without a domain gets domain 0000, as the kernel spells it.
  if (std::count(out.begin(), out.end(), ':') == 1) out = "0000:" + out;
  return out;
}

std::string describeVertex(const Topology& topo, VertexId id) {
  const Vertex& v = topo.vertex(id);
  return v.busId.empty() ? v.name : v.name + " (" + v.busId + ")";
}

VertexId Topology::addVertex(Vertex vertex) {
  if (vertex.name.empty()) {
    int n = 0;
    do vertex.name = std::string(vertexKindName(vertex.kind)) + std::to_string(n++);
    while (byName_.count(vertex.name));
  }
  if (byName_.count(vertex.name)) throwInvalidArgument("topology: duplicate vertex name '" + vertex.name + "'");
  if (!vertex.busId.empty()) vertex.busId = normalizeBusId(vertex.busId);
  VertexId id = static_cast<VertexId>(vertices_.size());
  byName_[vertex.name] = id;
  vertices_.push_back(std::move(vertex));
  pathCache_.clear();
  return id;
}

void Topology::addDirectedLink(Link link) {
  if (link.from < 0 || link.to < 0 || link.from >= vertexCount() || link.to >= vertexCount() || link.from == link.to)
    throwInvalidArgument("topology: link between invalid vertices " + std::to_string(link.from) + " and " +
                         std::to_string(link.to));
  if (linkBetween(link.from, link.to))
    throwInvalidArgument("topology: duplicate link " + vertex(link.from).name + " -> " + vertex(link.to).name);
  if (link.latencyUs <= 0) link.latencyUs = defaultLatencyUs(link.kind);
  links_.push_back(link);
  pathCache_.clear();
}

void Topology::addLink(VertexId a, VertexId b, Link spec) {
  if (spec.bandwidthGBs <= 0) {
    if (spec.kind == LinkKind::Pcie) spec.bandwidthGBs = pcieBandwidthGBs(spec.pcieGen, spec.pcieWidth);
    if (spec.kind == LinkKind::NvLink && a >= 0 && a < vertexCount())
      spec.bandwidthGBs = std::max(1, spec.nvlinkCount) * nvlinkBandwidthPerLinkGBs(vertex(a).sm ? vertex(a).sm : (b < vertexCount() ? vertex(b).sm : 0));
  }
  spec.from = a;
  spec.to = b;
  addDirectedLink(spec);
  spec.from = b;
  spec.to = a;
  addDirectedLink(spec);
}

void Topology::removeMarked(const std::vector<bool>& dropped) {
  std::vector<VertexId> remap(vertices_.size(), -1);
  std::vector<Vertex> kept;
  for (size_t i = 0; i < vertices_.size(); ++i)
    if (!dropped[i]) {
      remap[i] = static_cast<VertexId>(kept.size());
      kept.push_back(std::move(vertices_[i]));
    }
  std::vector<Link> keptLinks;
  for (Link l : links_)
    if (remap[l.from] >= 0 && remap[l.to] >= 0) {
      l.from = remap[l.from];
      l.to = remap[l.to];
      keptLinks.push_back(l);
    }
  vertices_ = std::move(kept);
  links_ = std::move(keptLinks);
  rebuildIndex();
}

void Topology::rebuildIndex() {
  byName_.clear();
  for (size_t i = 0; i < vertices_.size(); ++i) byName_[vertices_[i].name] = static_cast<VertexId>(i);
  pathCache_.clear();
}

std::vector<const Link*> Topology::linksFrom(VertexId id) const {
  std::vector<const Link*> out;
  for (const Link& l : links_)
    if (l.from == id) out.push_back(&l);
  return out;
}

const Link* Topology::linkBetween(VertexId from, VertexId to) const {
  for (const Link& l : links_)
    if (l.from == from && l.to == to) return &l;
  return nullptr;
}

std::optional<VertexId> Topology::findByName(const std::string& vertexName) const {
  auto it = byName_.find(vertexName);
  if (it == byName_.end()) return std::nullopt;
  return it->second;
}

std::optional<VertexId> Topology::findByBusId(const std::string& busId) const {
  std::string wanted = normalizeBusId(busId);
  for (size_t i = 0; i < vertices_.size(); ++i)
    if (vertices_[i].busId == wanted) return static_cast<VertexId>(i);
  return std::nullopt;
}

std::vector<VertexId> Topology::verticesOfKind(VertexKind kind) const {
  std::vector<VertexId> out;
  for (size_t i = 0; i < vertices_.size(); ++i)
    if (vertices_[i].kind == kind) out.push_back(static_cast<VertexId>(i));
  if (kind == VertexKind::Gpu)
    std::stable_sort(out.begin(), out.end(), [&](VertexId a, VertexId b) {
      return std::tie(vertices_[a].host, vertices_[a].gpuIndex) < std::tie(vertices_[b].host, vertices_[b].gpuIndex);
    });
  return out;
}

std::optional<VertexId> Topology::gpuByIndex(int index) const {
  for (VertexId g : gpus())
    if (vertices_[g].gpuIndex == index) return g;
  return std::nullopt;
}

void Topology::assignGpuIndices() {
  std::set<std::pair<int, int>> used;
  for (const Vertex& v : vertices_)
    if (v.kind == VertexKind::Gpu && v.gpuIndex >= 0) used.insert({v.host, v.gpuIndex});
  std::vector<VertexId> unindexed;
  for (size_t i = 0; i < vertices_.size(); ++i)
    if (vertices_[i].kind == VertexKind::Gpu && vertices_[i].gpuIndex < 0) unindexed.push_back(static_cast<VertexId>(i));
  // CUDA_DEVICE_ORDER=PCI_BUS_ID: bus id order within each host.
  std::sort(unindexed.begin(), unindexed.end(), [&](VertexId a, VertexId b) {
    return std::tie(vertices_[a].host, vertices_[a].busId) < std::tie(vertices_[b].host, vertices_[b].busId);
  });
  for (VertexId g : unindexed) {
    int next = 0;
    while (used.count({vertices_[g].host, next})) ++next;
    vertices_[g].gpuIndex = next;
    used.insert({vertices_[g].host, next});
  }
  pathCache_.clear();
}

namespace {

PathClass classify(const Topology& topo, const std::vector<VertexId>& route) {
  if (route.size() <= 1) return PathClass::LOC;
  bool network = false, sys = false, pcie = false, c2c = false, cpuOnRoute = false, gpuRelay = false;
  int switches = 0;
  for (size_t i = 0; i < route.size(); ++i) {
    const Vertex& v = topo.vertex(route[i]);
    bool relay = i > 0 && i + 1 < route.size();
    if (v.kind == VertexKind::Cpu) cpuOnRoute = true;
    if (v.kind == VertexKind::PciSwitch) ++switches;
    if (relay && v.kind == VertexKind::Gpu) gpuRelay = true;
    if (i + 1 < route.size()) {
      const Link* l = topo.linkBetween(route[i], route[i + 1]);
      switch (l->kind) {
        case LinkKind::Network: network = true; break;
        case LinkKind::CpuInterconnect: sys = true; break;
        case LinkKind::Pcie: pcie = true; break;
        case LinkKind::C2C: c2c = true; break;
        case LinkKind::NvLink: break;
      }
    }
  }
  if (network) return PathClass::NET;
  if (sys) return PathClass::SYS;
  if (cpuOnRoute && (pcie || route.size() > 2)) return PathClass::PHB;
  if (pcie) return switches > 1 ? PathClass::PXB : PathClass::PIX;
  if (c2c) return PathClass::C2C;
  return gpuRelay ? PathClass::NVB : PathClass::NVL;
}

// Widest of the shortest routes from a NIC across the network: network links only, relaying only
// through network switches (so a route never enters a host on the way).
struct NetworkRoutes {
  std::vector<int> dist, parent;
  std::vector<double> width;
};

NetworkRoutes networkRoutesFrom(const Topology& topo, VertexId nic) {
  const int n = topo.vertexCount();
  NetworkRoutes r{std::vector<int>(n, -1), std::vector<int>(n, -1), std::vector<double>(n, 0)};
  std::vector<std::vector<const Link*>> adjacency(n);
  for (const Link& l : topo.links())
    if (l.kind == LinkKind::Network) adjacency[l.from].push_back(&l);
  r.dist[nic] = 0;
  r.width[nic] = 1e300;
  std::deque<VertexId> queue{nic};
  while (!queue.empty()) {
    VertexId u = queue.front();
    queue.pop_front();
    if (u != nic && topo.vertex(u).kind != VertexKind::NetSwitch) continue;
    for (const Link* l : adjacency[u]) {
      double w = std::min(r.width[u], l->bandwidthGBs);
      if (r.dist[l->to] == -1) {
        r.dist[l->to] = r.dist[u] + 1;
        r.parent[l->to] = u;
        r.width[l->to] = w;
        queue.push_back(l->to);
      } else if (r.dist[l->to] == r.dist[u] + 1 && w > r.width[l->to]) {
        r.parent[l->to] = u;
        r.width[l->to] = w;
      }
    }
  }
  return r;
}

// The NIC a device uses to leave (or enter) its host: itself, a GPU's rail NIC, else the nearest.
std::optional<VertexId> hostNicOf(const Topology& topo, VertexId v) {
  if (topo.vertex(v).kind == VertexKind::Nic) return v;
  if (topo.vertex(v).kind == VertexKind::Gpu) return topo.railNic(v);
  std::vector<VertexId> nearest = topo.nearestNics(v);
  if (nearest.empty()) return std::nullopt;
  return nearest.front();
}

// Between hosts: out through the source's NIC, across the switches, in through the destination's NIC.
// When the network cannot reach the destination's NIC from the source's (different rails, no spine),
// the route enters the destination host through the reachable NIC nearest to the destination.
std::optional<Path> crossHostPath(const Topology& topo, VertexId from, VertexId to) {
  std::optional<VertexId> out = hostNicOf(topo, from), in = hostNicOf(topo, to);
  if (!out || !in) return std::nullopt;
  Path first = topo.path(from, *out);
  if (!first.exists() || first.cls == PathClass::NET) return std::nullopt;
  NetworkRoutes net = networkRoutesFrom(topo, *out);
  std::optional<VertexId> entry;
  if (net.dist[*in] >= 0) {
    entry = *in;
  } else {
    std::optional<std::tuple<PathClass, double, int, std::string>> best;
    for (VertexId nic : topo.nics()) {
      if (topo.vertex(nic).host != topo.vertex(to).host || net.dist[nic] < 0) continue;
      Path last = topo.path(nic, to);
      if (!last.exists() || last.cls == PathClass::NET) continue;
      double width = last.hops ? std::min(last.bandwidthGBs, net.width[nic]) : net.width[nic];
      auto score = std::make_tuple(last.cls, -width, net.dist[nic] + last.hops, topo.vertex(nic).busId);
      if (!best || score < *best) {
        best = score;
        entry = nic;
      }
    }
  }
  if (!entry) return std::nullopt;
  Path last = topo.path(*entry, to);
  if (!last.exists() || last.cls == PathClass::NET) return std::nullopt;
  std::vector<VertexId> middle;
  for (VertexId v = *entry; v != -1; v = net.parent[v]) middle.push_back(v);
  std::reverse(middle.begin(), middle.end());
  Path p;
  p.vertices = first.vertices;
  p.vertices.insert(p.vertices.end(), middle.begin() + 1, middle.end());
  p.vertices.insert(p.vertices.end(), last.vertices.begin() + 1, last.vertices.end());
  p.hops = first.hops + net.dist[*entry] + last.hops;
  p.bandwidthGBs = net.width[*entry];
  if (first.hops) p.bandwidthGBs = std::min(p.bandwidthGBs, first.bandwidthGBs);
  if (last.hops) p.bandwidthGBs = std::min(p.bandwidthGBs, last.bandwidthGBs);
  p.cls = PathClass::NET;
  return p;
}

}  // namespace

std::vector<Path> Topology::computePathsFrom(VertexId from) const {
  const int n = vertexCount();
  std::vector<Path> result(n);
  result[from].vertices = {from};
  result[from].cls = PathClass::LOC;
  result[from].bandwidthGBs = 0;
  std::vector<bool> done(n, false);
  done[from] = true;

  std::vector<std::vector<const Link*>> adjacency(n);
  for (const Link& l : links_) adjacency[l.from].push_back(&l);

  for (const SearchLevel& level : kLevels) {
    // BFS over the level's links: fewest hops first; among shortest routes the widest bottleneck
    // (a max-min over the shortest-path DAG, so 0-4-5 beats 0-1-5 on DGX-1).
    std::vector<int> dist(n, -1), parent(n, -1);
    std::vector<double> width(n, 0);
    dist[from] = 0;
    width[from] = 1e300;
    std::deque<VertexId> queue{from};
    while (!queue.empty()) {
      VertexId u = queue.front();
      queue.pop_front();
      if (u != from && !(level.relayKinds & bit(vertices_[u].kind))) continue;  // endpoints only
      for (const Link* l : adjacency[u]) {
        if (!(level.linkKinds & bit(l->kind))) continue;
        double w = std::min(width[u], l->bandwidthGBs);
        if (dist[l->to] == -1) {
          dist[l->to] = dist[u] + 1;
          parent[l->to] = u;
          width[l->to] = w;
          queue.push_back(l->to);
        } else if (dist[l->to] == dist[u] + 1 && w > width[l->to]) {
          parent[l->to] = u;
          width[l->to] = w;
        }
      }
    }
    for (VertexId t = 0; t < n; ++t) {
      if (done[t] || dist[t] < 0) continue;
      Path p;
      for (VertexId v = t; v != -1; v = parent[v]) p.vertices.push_back(v);
      std::reverse(p.vertices.begin(), p.vertices.end());
      p.hops = dist[t];
      p.bandwidthGBs = width[t];
      p.cls = classify(*this, p.vertices);
      result[t] = std::move(p);
      done[t] = true;
    }
  }
  return result;
}

const std::vector<Path>& Topology::pathsFrom(VertexId from) const {
  auto it = pathCache_.find(from);
  if (it == pathCache_.end()) it = pathCache_.emplace(from, computePathsFrom(from)).first;
  return it->second;
}

Path Topology::path(VertexId from, VertexId to) const {
  if (from < 0 || to < 0 || from >= vertexCount() || to >= vertexCount())
    throwInvalidArgument("topology: path between unknown vertices");
  const int fromHost = vertex(from).host, toHost = vertex(to).host;
  if (fromHost != toHost && fromHost != kNoHost && toHost != kNoHost) {
    if (std::optional<Path> p = crossHostPath(*this, from, to)) return *p;
    return pathsFrom(from)[to];
  }
  Path direct = pathsFrom(from)[to];
  if (vertex(from).kind != VertexKind::Gpu || vertex(to).kind != VertexKind::Nic || direct.cls <= PathClass::PXB)
    return direct;
  // PXN: NVLink to a peer GPU that sits next to the NIC, then PCIe from there (NCCL's rail trick).
  std::optional<Path> best;
  for (VertexId peer : gpus()) {
    if (peer == from || vertex(peer).host != vertex(from).host) continue;
    const Path& toPeer = pathsFrom(from)[peer];
    const Path& peerToNic = pathsFrom(peer)[to];
    if (toPeer.cls != PathClass::NVL || peerToNic.cls > PathClass::PXB) continue;
    Path p;
    p.vertices = toPeer.vertices;
    p.vertices.insert(p.vertices.end(), peerToNic.vertices.begin() + 1, peerToNic.vertices.end());
    p.hops = toPeer.hops + peerToNic.hops;
    p.bandwidthGBs = std::min(toPeer.bandwidthGBs, peerToNic.bandwidthGBs);
    p.cls = PathClass::PXN;
    if (!best || p.bandwidthGBs > best->bandwidthGBs || (p.bandwidthGBs == best->bandwidthGBs && p.hops < best->hops))
      best = std::move(p);
  }
  return best ? *best : direct;
}

std::vector<VertexId> Topology::nearestNics(VertexId gpu) const {
  std::vector<VertexId> best;
  std::optional<Path> bestPath;
  for (VertexId nic : nics()) {
    if (vertex(nic).host != vertex(gpu).host) continue;
    Path p = path(gpu, nic);
    if (!p.exists()) continue;
    bool better = !bestPath || p.cls < bestPath->cls || (p.cls == bestPath->cls && p.bandwidthGBs > bestPath->bandwidthGBs);
    bool same = bestPath && p.cls == bestPath->cls && p.bandwidthGBs == bestPath->bandwidthGBs;
    if (better) {
      best = {nic};
      bestPath = p;
    } else if (same) {
      best.push_back(nic);
    }
  }
  auto byBus = [&](VertexId a, VertexId b) { return vertex(a).busId < vertex(b).busId; };
  std::sort(best.begin(), best.end(), byBus);
  return best;
}

std::optional<VertexId> Topology::railNic(VertexId gpu) const {
  std::vector<VertexId> mine = nearestNics(gpu);
  if (mine.empty()) return std::nullopt;
  std::vector<VertexId> sharing;  // GPUs whose nearest set is exactly ours, in bus id order
  for (VertexId g : gpus())
    if (vertex(g).host == vertex(gpu).host && nearestNics(g) == mine) sharing.push_back(g);
  std::sort(sharing.begin(), sharing.end(), [&](VertexId a, VertexId b) { return vertex(a).busId < vertex(b).busId; });
  auto pos = std::find(sharing.begin(), sharing.end(), gpu) - sharing.begin();
  return mine[static_cast<size_t>(pos) % mine.size()];
}

std::optional<VertexId> Topology::localCpu(VertexId device) const {
  if (vertex(device).kind == VertexKind::Cpu) return device;
  std::optional<VertexId> best;
  int bestHops = 0;
  for (VertexId cpu : verticesOfKind(VertexKind::Cpu)) {
    Path p = path(device, cpu);
    if (!p.exists() || p.cls == PathClass::SYS || p.cls == PathClass::NET) continue;
    if (!best || p.hops < bestHops) {
      best = cpu;
      bestHops = p.hops;
    }
  }
  return best;
}

std::string Topology::canonicalText() const {
  // Keys independent of names and insertion order, so every loader and writer agrees.
  auto key = [&](VertexId id) {
    const Vertex& v = vertices_[id];
    std::string k = std::string(vertexKindName(v.kind)) + "/h" + std::to_string(v.host) + "/";
    if (v.kind == VertexKind::NvSwitch) return k;  // one fabric per host, whatever chip it is named after
    if (!v.busId.empty()) return k + v.busId;
    switch (v.kind) {
      case VertexKind::Cpu: return k + "numa" + std::to_string(v.numaId);
      case VertexKind::NvSwitch:
      case VertexKind::Host: return k;
      case VertexKind::Gpu: return k + "gpu" + std::to_string(v.gpuIndex);
      case VertexKind::Nic: return k + (v.netName.empty() ? v.name : v.netName);
      default: return k + v.name;
    }
  };
  std::vector<std::string> lines;
  for (VertexId i = 0; i < vertexCount(); ++i) {
    const Vertex& v = vertices_[i];
    std::ostringstream line;
    line << "V " << key(i);
    switch (v.kind) {
      case VertexKind::Cpu:
        line << " numa=" << v.numaId << " aff=" << v.cpuAffinity << " arch=" << v.arch << " vendor=" << v.cpuVendor
             << " family=" << v.cpuFamily << " model=" << v.cpuModel;
        break;
      case VertexKind::Gpu: line << " index=" << v.gpuIndex << " sm=" << v.sm; break;
      case VertexKind::Nic:
        line << " net=" << v.netName << " speed=" << fmt(v.speedGbps) << " layer=" << linkLayerName(v.linkLayer)
             << " gdr=" << v.gpuDirect;
        break;
      default: break;
    }
    lines.push_back(line.str());
  }
  for (const Link& l : links_) {
    std::ostringstream line;
    line << "L " << key(l.from) << " -> " << key(l.to) << " " << linkKindName(l.kind) << " bw=" << fmt(l.bandwidthGBs)
         << " lat=" << fmt(l.latencyUs);
    if (l.kind == LinkKind::NvLink) line << " count=" << l.nvlinkCount << " gen=" << l.nvlinkGeneration;
    if (l.kind == LinkKind::Pcie) line << " gen=" << l.pcieGen << " width=" << l.pcieWidth;
    lines.push_back(line.str());
  }
  std::sort(lines.begin(), lines.end());
  std::string text;
  for (const std::string& s : lines) text += s + "\n";
  return text;
}

std::string Topology::fingerprint() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, fnv1a64(canonicalText()));
  return buf;
}

}  // namespace topoccl::topo
