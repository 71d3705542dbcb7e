#include "algorithms/cost_model.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "common/error.hpp"

namespace topoccl::algo {
namespace {

std::string formatNumber(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", value);
  return buf;
}

double betaFromGBs(double gbs) { return gbs > 0 ? 1.0 / (gbs * 1e3) : 0.0; }

std::string linkName(const topo::Topology& topology, const topo::Link& link) {
  const topo::Vertex& from = topology.vertex(link.from);
  const topo::Vertex& to = topology.vertex(link.to);
  std::string name = from.name + "->" + to.name + " " + linkProfiles()[static_cast<size_t>(linkClassOf(topology, link))].name;
  if (link.kind == topo::LinkKind::NvLink && link.nvlinkCount > 1) name += " x" + std::to_string(link.nvlinkCount);
  if (link.kind == topo::LinkKind::Pcie && link.pcieGen > 0) {
    name += " Gen" + std::to_string(link.pcieGen) + " x" + std::to_string(link.pcieWidth);
  }
  if (to.kind == topo::VertexKind::NvSwitch) name += " (switch ingress port of " + from.name + ")";
  if (from.kind == topo::VertexKind::NvSwitch) name += " (switch egress port to " + to.name + ")";
  return name;
}

}  // namespace

const std::vector<LinkProfile>& linkProfiles() {
  // Per-hop latencies in the spirit of NCCL's hwLat tables (simple protocol, rounded). Pipelined: GPU
  // loads/stores and DMA over NVLink/PCIe/C2C and RDMA NICs keep many messages in flight, so a link's
  // latency does not idle it; a TCP message costs the host its syscall and copy time, and a copy-engine
  // launch serialises, so those hold the resource.
  static const std::vector<LinkProfile> kProfiles = {
      {LinkClass::NvLink1, "NVLink1", 0.8, true},     {LinkClass::NvLink2, "NVLink2", 0.7, true},
      {LinkClass::NvLink3, "NVLink3", 0.6, true},     {LinkClass::NvLink4, "NVLink4", 0.5, true},
      {LinkClass::NvLink5, "NVLink5", 0.5, true},     {LinkClass::Pcie, "PCIe", 1.0, true},
      {LinkClass::CpuInterconnect, "CPU-interconnect", 1.0, true}, {LinkClass::C2C, "C2C", 0.5, true},
      {LinkClass::InfiniBand, "IB", 2.0, true},       {LinkClass::RoCE, "RoCE", 3.0, true},
      {LinkClass::Tcp, "TCP", 15.0, false},           {LinkClass::Local, "local-copy", 0.2, false},
  };
  return kProfiles;
}

double defaultAlphaUs(LinkClass cls) { return linkProfiles()[static_cast<size_t>(cls)].alphaUs; }

LinkClass linkClassOf(const topo::Topology& topology, const topo::Link& link) {
  switch (link.kind) {
    case topo::LinkKind::NvLink: {
      int gen = link.nvlinkGeneration;
      if (gen <= 0) {
        const int sm = std::max(topology.vertex(link.from).sm, topology.vertex(link.to).sm);
        gen = sm > 0 ? topo::nvlinkGenerationForSm(sm) : 2;
      }
      gen = std::clamp(gen, 1, 5);
      return static_cast<LinkClass>(static_cast<int>(LinkClass::NvLink1) + gen - 1);
    }
    case topo::LinkKind::Pcie: return LinkClass::Pcie;
    case topo::LinkKind::CpuInterconnect: return LinkClass::CpuInterconnect;
    case topo::LinkKind::C2C: return LinkClass::C2C;
    case topo::LinkKind::Network: {
      for (topo::VertexId v : {link.from, link.to}) {
        const topo::Vertex& vertex = topology.vertex(v);
        if (vertex.kind != topo::VertexKind::Nic) continue;
        if (vertex.linkLayer == topo::LinkLayer::InfiniBand) return LinkClass::InfiniBand;
        if (vertex.linkLayer == topo::LinkLayer::Ethernet && vertex.gpuDirect) return LinkClass::RoCE;
      }
      return LinkClass::Tcp;
    }
  }
  return LinkClass::Pcie;
}

double localCopyGBs(const topo::Vertex& device) {
  if (device.kind != topo::VertexKind::Gpu) return 10.0;  // host memory, one thread's memcpy
  if (device.sm >= 90) return 1500.0;
  if (device.sm >= 80) return 800.0;
  if (device.sm >= 70) return 400.0;
  return 200.0;
}

CostModel::CostModel(int nranks) : localCopyUsPerByte(static_cast<size_t>(std::max(nranks, 0)), 0.0), nranks_(nranks) {
  if (nranks < 1) throwInvalidArgument("cost model: nranks " + std::to_string(nranks) + " must be at least 1");
  routes_.resize(static_cast<size_t>(nranks) * static_cast<size_t>(nranks));
}

CostModel CostModel::uniform(int nranks, double alphaUs, double betaUsPerByte, double gammaUsPerByte) {
  if (alphaUs < 0 || betaUsPerByte < 0 || gammaUsPerByte < 0) {
    throwInvalidArgument("cost model: alpha, beta and gamma must not be negative");
  }
  CostModel model(nranks);
  model.gammaUsPerByte = gammaUsPerByte;
  std::vector<int> sendPort(static_cast<size_t>(nranks)), recvPort(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    sendPort[static_cast<size_t>(r)] = model.addResource({"rank" + std::to_string(r) + ".send", alphaUs, betaUsPerByte});
    recvPort[static_cast<size_t>(r)] = model.addResource({"rank" + std::to_string(r) + ".recv", 0, betaUsPerByte});
  }
  for (int s = 0; s < nranks; ++s) {
    for (int d = 0; d < nranks; ++d) {
      if (s == d) continue;
      model.setRoute(s, d, {sendPort[static_cast<size_t>(s)], recvPort[static_cast<size_t>(d)]}, alphaUs);
    }
  }
  return model;
}

CostModel CostModel::fromTopology(const topo::Topology& topology, std::vector<topo::VertexId> rankDevice) {
  const int n = static_cast<int>(rankDevice.size());
  CostModel model(n);
  for (int r = 0; r < n; ++r) {
    const topo::VertexId v = rankDevice[static_cast<size_t>(r)];
    if (v < 0 || v >= topology.vertexCount()) {
      throwInvalidArgument("cost model: rank " + std::to_string(r) + " runs on vertex " + std::to_string(v) +
                           ", which topology '" + topology.name + "' does not have");
    }
    model.localCopyUsPerByte[static_cast<size_t>(r)] = betaFromGBs(localCopyGBs(topology.vertex(v)));
    model.rankHost.push_back(topology.vertex(v).host);
  }
  std::map<std::pair<topo::VertexId, topo::VertexId>, int> linkResource;
  std::map<topo::VertexId, int> nicTx, nicRx, localCopy;

  const auto nicResource = [&](topo::VertexId nic, bool tx, const topo::Link& netLink) {
    auto& table = tx ? nicTx : nicRx;
    auto it = table.find(nic);
    if (it != table.end()) return it->second;
    const topo::Vertex& vertex = topology.vertex(nic);
    const double gbs = vertex.speedGbps > 0 ? vertex.speedGbps / 8.0 : netLink.bandwidthGBs;
    const int id = model.addResource({vertex.name + (tx ? ".tx" : ".rx") + " (NIC)", 0, betaFromGBs(gbs)});
    table.emplace(nic, id);
    return id;
  };
  const auto linkResourceOf = [&](const topo::Link& link) {
    const auto key = std::make_pair(link.from, link.to);
    auto it = linkResource.find(key);
    if (it != linkResource.end()) return it->second;
    if (link.bandwidthGBs <= 0) {
      throwInvalidArgument("cost model: link " + topology.vertex(link.from).name + "->" + topology.vertex(link.to).name +
                           " has no bandwidth");
    }
    const LinkClass cls = linkClassOf(topology, link);
    const double alpha = link.latencyUs > 0 ? link.latencyUs : defaultAlphaUs(cls);
    const int id = model.addResource({linkName(topology, link), alpha, betaFromGBs(link.bandwidthGBs),
                                      !linkProfiles()[static_cast<size_t>(cls)].pipelined});
    linkResource.emplace(key, id);
    return id;
  };

  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      const topo::VertexId a = rankDevice[static_cast<size_t>(s)];
      const topo::VertexId b = rankDevice[static_cast<size_t>(d)];
      if (a == b) {
        auto it = localCopy.find(a);
        if (it == localCopy.end()) {
          const topo::Vertex& device = topology.vertex(a);
          it = localCopy
                   .emplace(a, model.addResource({device.name + ".local (copy engine)", defaultAlphaUs(LinkClass::Local),
                                                  betaFromGBs(localCopyGBs(device))}))
                   .first;
        }
        model.setRoute(s, d, {it->second}, defaultAlphaUs(LinkClass::Local));
        continue;
      }
      const topo::Path path = topology.path(a, b);
      if (!path.exists() || path.vertices.size() < 2) {
        throwInvalidArgument("cost model: no path from " + topo::describeVertex(topology, a) + " (rank " +
                             std::to_string(s) + ") to " + topo::describeVertex(topology, b) + " (rank " +
                             std::to_string(d) + ")");
      }
      std::vector<int> resources;
      double latency = 0, hold = 0;
      for (size_t i = 0; i + 1 < path.vertices.size(); ++i) {
        const topo::Link* link = topology.linkBetween(path.vertices[i], path.vertices[i + 1]);
        if (!link) {
          throwInternalError("cost model: path " + topology.vertex(path.vertices[i]).name + "->" +
                             topology.vertex(path.vertices[i + 1]).name + " has no link");
        }
        const bool network = link->kind == topo::LinkKind::Network;
        if (network && topology.vertex(link->from).kind == topo::VertexKind::Nic) {
          resources.push_back(nicResource(link->from, true, *link));
        }
        const int id = linkResourceOf(*link);
        resources.push_back(id);
        latency += model.resource(id).alphaUs;
        if (model.resource(id).holdsLatency) hold += model.resource(id).alphaUs;
        if (network && topology.vertex(link->to).kind == topo::VertexKind::Nic) {
          resources.push_back(nicResource(link->to, false, *link));
        }
      }
      model.setRoute(s, d, std::move(resources), latency, hold);
    }
  }
  return model;
}

const CostRoute& CostModel::route(int src, int dst) const {
  if (src < 0 || src >= nranks_ || dst < 0 || dst >= nranks_) {
    throwInvalidArgument("cost model: no route " + std::to_string(src) + "->" + std::to_string(dst) + " among " +
                         std::to_string(nranks_) + " ranks");
  }
  return routes_[static_cast<size_t>(src) * static_cast<size_t>(nranks_) + static_cast<size_t>(dst)];
}

double CostModel::transferUs(int src, int dst, double bytes) const {
  const CostRoute& r = route(src, dst);
  return r.latencyUs + bytes * r.betaUsPerByte;
}

double CostModel::occupancyUs(int src, int dst, double bytes) const {
  const CostRoute& r = route(src, dst);
  return r.holdUs + bytes * r.betaUsPerByte;
}

int CostModel::addResource(CostResource resource) {
  resources_.push_back(std::move(resource));
  return static_cast<int>(resources_.size() - 1);
}

void CostModel::setRoute(int src, int dst, std::vector<int> resources, double latencyUs, double holdUs) {
  route(src, dst);  // range check
  CostRoute r;
  for (int id : resources) {
    if (id < 0 || id >= static_cast<int>(resources_.size())) {
      throwInvalidArgument("cost model: route " + std::to_string(src) + "->" + std::to_string(dst) +
                           " names unknown resource " + std::to_string(id));
    }
    r.betaUsPerByte = std::max(r.betaUsPerByte, resources_[static_cast<size_t>(id)].betaUsPerByte);
  }
  r.resources = std::move(resources);
  r.latencyUs = latencyUs;
  r.holdUs = holdUs < 0 ? latencyUs : std::min(holdUs, latencyUs);
  routes_[static_cast<size_t>(src) * static_cast<size_t>(nranks_) + static_cast<size_t>(dst)] = std::move(r);
}

std::string CostModel::describe() const {
  std::string out = "cost model: " + std::to_string(nranks_) + " ranks, " + std::to_string(resources_.size()) +
                    " resources, gamma " + formatNumber(gammaUsPerByte) + " us/B\n";
  out += "resources:\n";
  for (size_t i = 0; i < resources_.size(); ++i) {
    const CostResource& r = resources_[i];
    out += "  [" + std::to_string(i) + "] " + r.name + ": alpha " + formatNumber(r.alphaUs) + " us, beta " +
           formatNumber(r.betaUsPerByte) + " us/B";
    if (r.betaUsPerByte > 0) out += " (" + formatNumber(1.0 / (r.betaUsPerByte * 1e3)) + " GB/s)";
    if (!r.holdsLatency) out += ", pipelined";
    out += "\n";
  }
  out += "routes:\n";
  for (int s = 0; s < nranks_; ++s) {
    for (int d = 0; d < nranks_; ++d) {
      if (s == d) continue;
      const CostRoute& r = route(s, d);
      out += "  " + std::to_string(s) + "->" + std::to_string(d) + ": latency " + formatNumber(r.latencyUs) +
             " us (held " + formatNumber(r.holdUs) + "), beta " + formatNumber(r.betaUsPerByte) + " us/B via";
      if (r.resources.empty()) out += " (nothing)";
      for (size_t k = 0; k < r.resources.size(); ++k) {
        out += (k ? ", " : " ") + resources_[static_cast<size_t>(r.resources[k])].name;
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace topoccl::algo
