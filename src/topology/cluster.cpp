// Multi-host topologies: copies of one node (buildCluster) or the fusion of every rank's host report
// (fuseHosts), joined by a network of NetSwitch vertices. See cluster.hpp.
#include "topology/cluster.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "common/error.hpp"
#include "topology/loaders.hpp"

namespace topoccl::topo {

namespace {

using nlohmann::json;

constexpr const char* kReportFormat = "topoccl-host-report";
constexpr int kReportVersion = 1;
constexpr double kUnknownNicGbps = 10;  // NCCL's guess for a NIC whose speed is unknown

std::string numberText(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

void checkNetwork(const NetworkSpec& network) {
  if (network.spines < 0) throwInvalidArgument("cluster: network spines must be >= 0 (got " + std::to_string(network.spines) + ")");
  if (network.shape == NetworkShape::SingleSwitch && network.spines > 0)
    throwInvalidArgument("cluster: spines (" + std::to_string(network.spines) +
                         ") apply only to the rail-optimized network; a single-switch network has none");
  auto nonNegative = [](double value, const char* what) {
    if (!std::isfinite(value) || value < 0)
      throwInvalidArgument(std::string("cluster: network ") + what + " must be a finite number >= 0 (0: default), got " +
                           numberText(value));
  };
  nonNegative(network.nicBandwidthGBs, "nicBandwidthGBs");
  nonNegative(network.spineBandwidthGBs, "spineBandwidthGBs");
  nonNegative(network.latencyUs, "latencyUs");
}

// A graph joins a cluster only if it is one host's: one host index, no network switches, a NIC.
void checkSingleHost(const Topology& graph, const std::string& what) {
  std::set<int> hosts;
  for (const Vertex& v : graph.vertices()) hosts.insert(v.host);
  if (hosts.size() > 1 || hosts.count(kNoHost) || graph.count(VertexKind::NetSwitch) > 0) {
    std::string list;
    for (int h : hosts) list += (list.empty() ? "" : ", ") + std::to_string(h);
    throwInvalidArgument("cluster: " + what + " spans several hosts (host indices " + list +
                         ", " + std::to_string(graph.count(VertexKind::NetSwitch)) +
                         " network switches); a cluster is built from single-host graphs");
  }
}

void checkHasNic(const Topology& graph, const std::string& what) {
  if (graph.nics().empty())
    throwInvalidArgument("cluster: " + what + " has no NIC (" + std::to_string(graph.count(VertexKind::Gpu)) +
                         " GPUs, " + std::to_string(graph.vertexCount()) +
                         " vertices); hosts reach each other only through NICs");
}

std::string describeNode(const Topology& node) {
  std::string label = node.name.empty() ? std::string("(unnamed)") : node.name;
  return "node '" + label + "'" + (node.source.empty() ? "" : " (" + node.source + ")");
}

// Host i holds a copy of hostGraphs[i] (vertices renamed "h<i>/<name>"); then the network joins the NICs.
Topology joinHosts(const std::vector<const Topology*>& hostGraphs, const NetworkSpec& network, std::string name,
                   std::string source) {
  Topology out;
  out.name = std::move(name);
  out.source = std::move(source);
  std::vector<std::vector<VertexId>> nicsOfHost(hostGraphs.size());
  for (size_t h = 0; h < hostGraphs.size(); ++h) {
    const Topology& graph = *hostGraphs[h];
    const std::string prefix = "h" + std::to_string(h) + "/";
    std::vector<VertexId> remap(static_cast<size_t>(graph.vertexCount()));
    for (VertexId id = 0; id < graph.vertexCount(); ++id) {
      Vertex v = graph.vertex(id);
      v.host = static_cast<int>(h);
      v.name = prefix + v.name;
      remap[static_cast<size_t>(id)] = out.addVertex(std::move(v));
    }
    for (Link l : graph.links()) {
      l.from = remap[static_cast<size_t>(l.from)];
      l.to = remap[static_cast<size_t>(l.to)];
      out.addDirectedLink(l);
    }
    for (VertexId nic : graph.nics()) nicsOfHost[h].push_back(remap[static_cast<size_t>(nic)]);
    // Rail k is the host's k-th NIC in bus id order.
    std::sort(nicsOfHost[h].begin(), nicsOfHost[h].end(), [&](VertexId a, VertexId b) {
      return std::tie(out.vertex(a).busId, out.vertex(a).name) < std::tie(out.vertex(b).busId, out.vertex(b).name);
    });
  }

  const double latency = network.latencyUs > 0 ? network.latencyUs : defaultLatencyUs(LinkKind::Network);
  auto netLink = [&](double bandwidth) {
    return Link{.kind = LinkKind::Network, .bandwidthGBs = bandwidth, .latencyUs = latency};
  };
  auto nicBandwidth = [&](VertexId nic) {
    if (network.nicBandwidthGBs > 0) return network.nicBandwidthGBs;
    double gbps = out.vertex(nic).speedGbps > 0 ? out.vertex(nic).speedGbps : kUnknownNicGbps;
    return gbps / 8;
  };
  auto addSwitch = [&](const std::string& switchName) {
    return out.addVertex(Vertex{.kind = VertexKind::NetSwitch, .name = switchName, .host = kNoHost});
  };

  if (network.shape == NetworkShape::SingleSwitch) {
    VertexId sw = addSwitch("netsw0");
    for (const auto& nics : nicsOfHost)
      for (VertexId nic : nics) out.addLink(nic, sw, netLink(nicBandwidth(nic)));
    return out;
  }

  size_t rails = 0;
  for (const auto& nics : nicsOfHost) rails = std::max(rails, nics.size());
  std::vector<VertexId> railSwitch(rails);
  std::vector<double> railLoad(rails, 0);
  for (size_t k = 0; k < rails; ++k) railSwitch[k] = addSwitch("rail" + std::to_string(k));
  for (const auto& nics : nicsOfHost)
    for (size_t k = 0; k < nics.size(); ++k) {
      double bandwidth = nicBandwidth(nics[k]);
      out.addLink(nics[k], railSwitch[k], netLink(bandwidth));
      railLoad[k] += bandwidth;
    }
  for (int s = 0; s < network.spines; ++s) {
    VertexId spine = addSwitch("spine" + std::to_string(s));
    for (size_t k = 0; k < rails; ++k) {
      double bandwidth = network.spineBandwidthGBs > 0 ? network.spineBandwidthGBs : railLoad[k] / network.spines;
      out.addLink(railSwitch[k], spine, netLink(bandwidth));
    }
  }
  return out;
}

// What identifies a device across several reports of one host: its bus id, else what the kind offers.
std::string mergeKey(const Vertex& v) {
  std::string key = std::string(vertexKindName(v.kind)) + "/";
  switch (v.kind) {
    case VertexKind::Host:
    case VertexKind::NvSwitch: return key;  // one per host
    case VertexKind::Cpu:
      if (v.numaId >= 0) return key + "numa" + std::to_string(v.numaId);
      break;
    default: break;
  }
  if (!v.busId.empty()) return key + "bus:" + v.busId;
  if (v.kind == VertexKind::Nic && !v.netName.empty()) return key + "net:" + v.netName;
  return key + "name:" + v.name;
}

// Several reports of one host (each rank's view) united by device. `reports` is sorted and free of
// duplicates, so every rank merges in the same order and the first report's numbers win ties.
Topology mergeHostReports(const std::vector<const Topology*>& reports) {
  if (reports.size() == 1) return *reports.front();
  Topology merged;
  merged.name = reports.front()->name;
  merged.source = reports.front()->source;
  std::map<std::string, VertexId> byKey;
  std::map<VertexId, std::set<int>> indicesSeen;  // GPU -> the CUDA indices the reports gave it
  for (const Topology* report : reports) {
    std::vector<VertexId> remap(static_cast<size_t>(report->vertexCount()));
    for (VertexId id = 0; id < report->vertexCount(); ++id) {
      const Vertex& v = report->vertex(id);
      std::string key = mergeKey(v);
      auto it = byKey.find(key);
      if (it == byKey.end()) {
        Vertex copy = v;
        for (int n = 1; merged.findByName(copy.name); ++n) copy.name = v.name + "-" + std::to_string(n);
        it = byKey.emplace(key, merged.addVertex(std::move(copy))).first;
      }
      remap[static_cast<size_t>(id)] = it->second;
      if (v.kind == VertexKind::Gpu && v.gpuIndex >= 0) indicesSeen[it->second].insert(v.gpuIndex);
    }
    for (Link l : report->links()) {
      l.from = remap[static_cast<size_t>(l.from)];
      l.to = remap[static_cast<size_t>(l.to)];
      if (l.from != l.to && !merged.linkBetween(l.from, l.to)) merged.addDirectedLink(l);
    }
  }
  // Ranks that see only their own GPUs (CUDA_VISIBLE_DEVICES) number them from 0: when one GPU got
  // several indices or two GPUs share one, the host's GPUs are numbered afresh in bus id order.
  bool collision = false;
  std::set<int> taken;
  for (const auto& [gpu, indices] : indicesSeen) {
    if (indices.size() > 1 || taken.count(*indices.begin())) collision = true;
    taken.insert(indices.begin(), indices.end());
  }
  if (collision) {
    std::vector<VertexId> gpus = merged.gpus();
    std::sort(gpus.begin(), gpus.end(), [&](VertexId a, VertexId b) {
      return std::tie(merged.vertex(a).busId, merged.vertex(a).name) < std::tie(merged.vertex(b).busId, merged.vertex(b).name);
    });
    for (size_t i = 0; i < gpus.size(); ++i) merged.vertex(gpus[i]).gpuIndex = static_cast<int>(i);
  }
  merged.assignGpuIndices();
  return merged;
}

void checkIdentities(const std::vector<HostReport>& reports) {
  for (size_t i = 0; i < reports.size(); ++i)
    if (reports[i].host.empty())
      throwInvalidArgument("cluster: host report " + std::to_string(i) + " of " + std::to_string(reports.size()) +
                           " has an empty host identity (" + std::to_string(reports[i].topology.count(VertexKind::Gpu)) +
                           " GPUs, topology '" + reports[i].topology.name + "')");
}

}  // namespace

Topology buildCluster(const Topology& node, const ClusterSpec& spec) {
  if (spec.hosts < 1)
    throwInvalidArgument("cluster: a cluster of " + describeNode(node) + " needs at least 1 host (got " +
                         std::to_string(spec.hosts) + ")");
  checkNetwork(spec.network);
  checkSingleHost(node, describeNode(node));
  checkHasNic(node, describeNode(node));
  std::vector<const Topology*> hostGraphs(static_cast<size_t>(spec.hosts), &node);
  std::string suffix = "-x" + std::to_string(spec.hosts);
  std::string name = spec.name.empty() ? node.name + suffix : spec.name;
  std::string source = "cluster:" + (node.source.empty() ? node.name : node.source) + suffix;
  return joinHosts(hostGraphs, spec.network, name, source);
}

std::vector<std::string> fusedHostOrder(const std::vector<HostReport>& reports) {
  checkIdentities(reports);
  std::vector<std::string> order;
  for (const HostReport& r : reports) order.push_back(r.host);
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  return order;
}

Topology fuseHosts(const std::vector<HostReport>& reports, const FuseOptions& options) {
  if (reports.empty()) throwInvalidArgument("cluster: no host reports to fuse (every rank reports its host)");
  checkNetwork(options.network);
  std::vector<std::string> order = fusedHostOrder(reports);
  std::vector<Topology> hosts;
  hosts.reserve(order.size());
  for (const std::string& identity : order) {
    // This host's reports, each once, in a canonical order (their JSON text) so all ranks merge alike.
    std::vector<std::pair<std::string, const Topology*>> mine;
    for (const HostReport& r : reports) {
      if (r.host != identity) continue;
      checkSingleHost(r.topology, "host report from '" + identity + "'");
      mine.emplace_back(writeJson(r.topology), &r.topology);
    }
    std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    mine.erase(std::unique(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.first == b.first; }),
               mine.end());
    std::vector<const Topology*> graphs;
    for (const auto& [text, graph] : mine) graphs.push_back(graph);
    hosts.push_back(mergeHostReports(graphs));
    checkHasNic(hosts.back(), "host '" + identity + "'");
  }
  std::vector<const Topology*> hostGraphs;
  for (const Topology& t : hosts) hostGraphs.push_back(&t);
  std::string suffix = "-x" + std::to_string(order.size());
  std::string name = options.name.empty() ? "cluster" + suffix : options.name;
  return joinHosts(hostGraphs, options.network, name, "fused:" + std::to_string(order.size()) + " hosts");
}

std::string serializeHostReport(const HostReport& report) {
  if (report.host.empty()) throwInvalidArgument("host report: the host identity is empty");
  json doc = {{"format", kReportFormat},
              {"version", kReportVersion},
              {"host", report.host},
              {"topology", json::parse(writeJson(report.topology))}};
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

HostReport parseHostReport(const std::string& text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number too large
    throwInvalidArgument("host report: malformed JSON (" + std::to_string(text.size()) +
                         " bytes; truncated in transit?): " + e.what());
  }
  if (!doc.is_object()) throwInvalidArgument(std::string("host report: expected a JSON object, got ") + doc.type_name());
  for (const auto& [key, value] : doc.items())
    if (key != "format" && key != "version" && key != "host" && key != "topology")
      throwInvalidArgument("host report: unknown key '" + key + "'");
  if (!doc.contains("format") || !doc["format"].is_string() || doc["format"].get<std::string>() != kReportFormat)
    throwInvalidArgument(std::string("host report: \"format\" must be \"") + kReportFormat + "\", got " +
                         (doc.contains("format") ? doc["format"].dump() : std::string("nothing")));
  if (!doc.contains("version") || !doc["version"].is_number_integer() || doc["version"].get<int64_t>() != kReportVersion)
    throwInvalidArgument("host report: unsupported \"version\" " +
                         (doc.contains("version") ? doc["version"].dump() : std::string("(missing)")) +
                         "; this build reads version " + std::to_string(kReportVersion));
  if (!doc.contains("host") || !doc["host"].is_string() || doc["host"].get<std::string>().empty())
    throwInvalidArgument("host report: \"host\" must be a non-empty string, got " +
                         (doc.contains("host") ? doc["host"].dump() : std::string("nothing")));
  HostReport report;
  report.host = doc["host"].get<std::string>();
  if (!doc.contains("topology") || !doc["topology"].is_object())
    throwInvalidArgument("host report from '" + report.host + "': \"topology\" must be an object, got " +
                         (doc.contains("topology") ? std::string(doc["topology"].type_name()) : std::string("nothing")));
  report.topology = parseJson(doc["topology"].dump(), "host report from '" + report.host + "'");
  return report;
}

}  // namespace topoccl::topo
