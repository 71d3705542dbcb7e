// topoccl-topo: print, classify, draw and convert topologies from files, presets or this machine (live).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <iostream>
#include <set>
#include <string>

#include "topoccl/error.hpp"
#include "topology/cluster.hpp"
#include "topology/discovery.hpp"
#include "topology/loaders.hpp"

using namespace topoccl::topo;

namespace {

// --preset, --file, --live (this machine, ignoring any file override), or by default what topoccl
// itself would use: TOPOCCL_TOPO_FILE / NCCL_TOPO_FILE when set, else live discovery.
Topology loadSelected(const std::string& file, const std::string& preset, bool live) {
  if (!preset.empty()) return loadPreset(preset);
  if (!file.empty()) return loadTopologyFile(file);
  if (live) return discoverLiveTopology();
  return loadHostTopology();
}

// Cores in an affinity mask "0000ffff,00000003".
int cpuCount(const std::string& affinity) {
  int n = 0;
  for (char c : affinity) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) continue;
    const unsigned digit = std::isdigit(static_cast<unsigned char>(c)) ? static_cast<unsigned>(c - '0')
                                                                        : static_cast<unsigned>(std::tolower(c) - 'a' + 10);
    n += __builtin_popcount(digit);
  }
  return n;
}

// "GPU3", "mlx5_0"; in a cluster prefixed by the host ("h1:GPU3"), since indices repeat per host.
std::string label(const Topology& t, VertexId id) {
  const Vertex& v = t.vertex(id);
  const bool cluster = std::any_of(t.vertices().begin(), t.vertices().end(), [](const Vertex& u) { return u.host > 0; });
  const std::string prefix = cluster && v.host >= 0 ? "h" + std::to_string(v.host) + ":" : "";
  if (v.kind == VertexKind::Gpu) return prefix + "GPU" + std::to_string(v.gpuIndex);
  if (v.kind == VertexKind::Nic && !v.netName.empty()) return prefix + v.netName;
  return v.name;
}

void show(const Topology& t) {
  std::printf("topology %s%s%s  fingerprint %s  (%d GPUs, %d NICs, %d CPUs/NUMA nodes)\n", t.source.c_str(),
              t.name.empty() ? "" : "  name ", t.name.c_str(), t.fingerprint().c_str(), t.count(VertexKind::Gpu),
              t.count(VertexKind::Nic), t.count(VertexKind::Cpu));
  std::vector<bool> seen(t.vertexCount(), false);
  // The PCIe tree under each CPU, then the links that are not part of it.
  std::function<void(VertexId, int)> tree = [&](VertexId id, int depth) {
    seen[id] = true;
    const Vertex& v = t.vertex(id);
    std::printf("%*s%s %s", depth * 2, "", vertexKindName(v.kind), describeVertex(t, id).c_str());
    if (v.kind == VertexKind::Cpu)
      std::printf(" numa=%d affinity=%s (%d cores) %s", v.numaId, v.cpuAffinity.c_str(), cpuCount(v.cpuAffinity), v.cpuVendor.c_str());
    if (v.kind == VertexKind::Gpu) std::printf(" index=%d sm=%d", v.gpuIndex, v.sm);
    if (v.kind == VertexKind::Nic) {
      std::printf(" %s ", v.netName.c_str());
      if (v.speedGbps > 0) std::printf("%gGb/s", v.speedGbps);
      else std::printf("speed-unknown");
      std::printf(" %s%s pci=%04x:%04x", linkLayerName(v.linkLayer), v.gpuDirect ? " gdr" : "", v.pciVendor, v.pciDevice);
    }
    std::printf("\n");
    for (const Link* l : t.linksFrom(id))
      if (l->kind == LinkKind::Pcie && !seen[l->to] && t.vertex(l->to).kind != VertexKind::Cpu) tree(l->to, depth + 1);
  };
  for (VertexId cpu : t.verticesOfKind(VertexKind::Cpu)) tree(cpu, 0);
  for (const Link& l : t.links()) {
    if (l.kind == LinkKind::Pcie || l.from > l.to) continue;
    std::printf("%s %s <-> %s  %.1f GB/s", linkKindName(l.kind), label(t, l.from).c_str(), label(t, l.to).c_str(), l.bandwidthGBs);
    if (l.kind == LinkKind::NvLink) std::printf(" x%d gen%d", l.nvlinkCount, l.nvlinkGeneration);
    std::printf("\n");
  }
}

void paths(const Topology& t) {
  std::vector<VertexId> devices = t.gpus();
  for (VertexId n : t.nics()) devices.push_back(n);
  std::printf("%-10s", "");
  for (VertexId d : devices) std::printf("%-11s", label(t, d).c_str());
  std::printf("  %-26s %s\n", "CPU affinity", "NUMA");
  for (VertexId a : devices) {
    std::printf("%-10s", label(t, a).c_str());
    for (VertexId b : devices) {
      Path p = t.path(a, b);
      char cell[32];
      if (a == b) std::snprintf(cell, sizeof cell, "X");
      else std::snprintf(cell, sizeof cell, "%s/%.0f", pathClassName(p.cls), p.bandwidthGBs);
      std::printf("%-11s", cell);
    }
    auto cpu = t.localCpu(a);
    std::printf("  %-26s %s\n", cpu ? t.vertex(*cpu).cpuAffinity.c_str() : "N/A",
                cpu ? std::to_string(t.vertex(*cpu).numaId).c_str() : "N/A");
  }
  std::printf("\ncells: NCCL path class / bottleneck GB/s\n");
  if (t.gpus().empty()) std::printf("no GPUs in this topology\n");
  for (VertexId g : t.gpus()) {
    std::string names;
    for (VertexId n : t.nearestNics(g)) names += (names.empty() ? "" : ",") + label(t, n);
    std::printf("%s nearest NIC(s): %s\n", label(t, g).c_str(), names.empty() ? "none" : names.c_str());
  }
}

void dot(const Topology& t, FILE* out) {
  std::fprintf(out, "graph topology {\n  node [shape=box, fontname=\"Helvetica\"];\n");
  static const char* kColour[] = {"white", "lightblue", "lightgrey", "palegreen", "gold", "orange", "white", "grey"};
  // One box per host when there are several (a cluster); the network's switches stay outside.
  int hosts = 0;
  for (const Vertex& v : t.vertices()) hosts = std::max(hosts, v.host + 1);
  for (int h = -1; h < hosts; ++h) {
    if (hosts > 1 && h >= 0) std::fprintf(out, "  subgraph cluster_h%d {\n  label=\"host %d\"; style=rounded;\n", h, h);
    for (VertexId id = 0; id < t.vertexCount(); ++id) {
      const Vertex& v = t.vertex(id);
      if (v.kind == VertexKind::Host || (hosts > 1 && v.host != h) || (hosts <= 1 && h != -1)) continue;
      std::fprintf(out, "  \"%s\" [label=\"%s\\n%s\", style=filled, fillcolor=%s];\n", v.name.c_str(), label(t, id).c_str(),
                   v.busId.c_str(), kColour[static_cast<int>(v.kind)]);
    }
    if (hosts > 1 && h >= 0) std::fprintf(out, "  }\n");
  }
  for (const Link& l : t.links()) {
    if (l.from > l.to) continue;
    const char* style = l.kind == LinkKind::NvLink             ? "color=green, penwidth=2"
                        : l.kind == LinkKind::CpuInterconnect ? "style=dashed"
                        : l.kind == LinkKind::Network         ? "color=blue"
                                                              : "color=black";
    std::fprintf(out, "  \"%s\" -- \"%s\" [label=\"%.0f\", %s];\n", t.vertex(l.from).name.c_str(), t.vertex(l.to).name.c_str(),
                l.bandwidthGBs, style);
  }
  std::fprintf(out, "}\n");
}

// Draws the graph with graphviz's `dot` (installed by scripts/install-deps.sh) into `output`.
void render(const Topology& t, const std::string& format, const std::string& output) {
  if (output.empty() || output.find('\'') != std::string::npos)
    throw topoccl::Error(ncclInvalidArgument, "--output '" + output + "' must be a non-empty path without quotes");
  const std::string command = "dot -T" + format + " -o '" + output + "'";
  FILE* pipe = popen(command.c_str(), "w");
  if (!pipe) throw topoccl::Error(ncclSystemError, "cannot start graphviz: " + command);
  dot(t, pipe);
  if (pclose(pipe) != 0)
    throw topoccl::Error(ncclSystemError, "graphviz failed: `" + command + "` (is graphviz installed? scripts/install-deps.sh installs it)");
  std::printf("wrote %s\n", output.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"topoccl-topo: show, classify, draw and convert GPU server topologies"};
  app.require_subcommand(1);
  std::string file, preset, format = "json";
  bool live = false;
  int hosts = 1, spines = 0;
  std::string network = "rail";
  auto addSource = [&](CLI::App* sub) {
    CLI::Option* fileOpt = sub->add_option("--file", file, "NCCL XML, hwloc XML v2 or topoccl JSON file");
    CLI::Option* presetOpt = sub->add_option("--preset", preset, "built-in machine")->check(CLI::IsMember(presetNames()));
    sub->add_flag("--live", live, "discover this machine (hwloc, sysfs, NVML), ignoring TOPOCCL_TOPO_FILE/NCCL_TOPO_FILE")
        ->excludes(fileOpt)
        ->excludes(presetOpt);
    sub->add_option("--hosts", hosts, "a cluster of this many copies of the machine")->check(CLI::Range(1, 4096));
    sub->add_option("--network", network, "cluster network: rail (NIC k of every host on switch rail<k>) or switch (one switch)")
        ->check(CLI::IsMember({"rail", "switch"}));
    sub->add_option("--spines", spines, "rail network: spine switches joining the rails")->check(CLI::Range(0, 64));
    sub->footer("Without --file, --preset or --live: TOPOCCL_TOPO_FILE / NCCL_TOPO_FILE when set, else this machine.");
  };
  CLI::App* showCmd = app.add_subcommand("show", "print the graph as a tree plus its links");
  CLI::App* pathsCmd = app.add_subcommand("paths", "GPU/NIC matrix of NCCL path classes and bandwidths");
  CLI::App* dotCmd = app.add_subcommand("dot", "graphviz source of the graph (pipe into `dot -Tsvg`)");
  CLI::App* exportCmd = app.add_subcommand("export", "write the graph as NCCL XML or topoccl JSON");
  CLI::App* svgCmd = app.add_subcommand("svg", "draw the graph as SVG through graphviz");
  CLI::App* pngCmd = app.add_subcommand("png", "draw the graph as PNG through graphviz");
  std::string output;
  for (CLI::App* sub : {svgCmd, pngCmd}) sub->add_option("-o,--output", output, "picture file to write")->required();
  exportCmd->add_option("--format", format, "nccl-xml or json")->check(CLI::IsMember({"nccl-xml", "json"}));
  for (CLI::App* sub : {showCmd, pathsCmd, dotCmd, exportCmd, svgCmd, pngCmd}) addSource(sub);
  CLI11_PARSE(app, argc, argv);
  try {
    Topology t = loadSelected(file, preset, live);
    if (hosts > 1 || spines > 0) {
      ClusterSpec spec{.hosts = hosts};
      spec.network.shape = network == "rail" ? NetworkShape::RailOptimized : NetworkShape::SingleSwitch;
      spec.network.spines = spines;
      t = buildCluster(t, spec);
    }
    if (*showCmd) show(t);
    if (*pathsCmd) paths(t);
    if (*dotCmd) dot(t, stdout);
    if (*svgCmd) render(t, "svg", output);
    if (*pngCmd) render(t, "png", output);
    if (*exportCmd) std::cout << (format == "json" ? writeJson(t) : writeNcclXml(t));
  } catch (const topoccl::Error& e) {
    std::fprintf(stderr, "topoccl-topo: %s\n", e.what());
    return 1;
  }
  return 0;
}
