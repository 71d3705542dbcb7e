// Built-in machines. Each is written from published facts, named in the comments; where a fact
// was not available (a bus id, say) the value is marked illustrative.
#include <functional>
#include <map>

#include "common/error.hpp"
#include "topology/loaders.hpp"

namespace topoccl::topo {

namespace {

Link pcie(int gen, int width) { return Link{.kind = LinkKind::Pcie, .pcieGen = gen, .pcieWidth = width}; }

Link nvlink(int count, int sm) {
  return Link{.kind = LinkKind::NvLink, .bandwidthGBs = count * nvlinkBandwidthPerLinkGBs(sm), .nvlinkCount = count,
              .nvlinkGeneration = nvlinkGenerationForSm(sm)};
}

// DGX-1 with V100 (also Azure NDv2's NVLink graph): the hybrid cube-mesh as listed by msccl-tools
// `msccl/topologies/nvidia.py:dgx1` — 24 NVLinks, 6 per GPU, diameter 2. Two Xeon E5-2698 v4
// (Broadwell, model 79) sockets; per socket two PCIe Gen3 switches, each with 2 GPUs and 1 EDR IB NIC.
// GPU0-4 bus ids follow NVIDIA/nccl#671; the other bus ids are illustrative.
Topology dgx1() {
  constexpr int kSm = 70;
  Topology t;
  t.name = "dgx1";
  t.source = "preset:dgx1";
  t.addVertex(Vertex{.kind = VertexKind::Host, .name = "host0"});
  const char* affinity[] = {"00000000,000fffff", "000000ff,fff00000"};
  VertexId cpus[2];
  for (int s = 0; s < 2; ++s)
    cpus[s] = t.addVertex(Vertex{.kind = VertexKind::Cpu, .name = "cpu" + std::to_string(s), .numaId = s,
                                 .cpuAffinity = affinity[s], .arch = "x86_64", .cpuVendor = "GenuineIntel",
                                 .cpuFamily = 6, .cpuModel = 79});
  t.addLink(cpus[0], cpus[1], Link{.kind = LinkKind::CpuInterconnect, .bandwidthGBs = cpuInterconnectBandwidthGBs("GenuineIntel", "x86_64", 79)});
  const char* switchBus[] = {"0000:03:00.0", "0000:08:00.0", "0000:83:00.0", "0000:88:00.0"};
  const char* gpuBus[] = {"0000:06:00.0", "0000:07:00.0", "0000:0a:00.0", "0000:0b:00.0",
                          "0000:85:00.0", "0000:86:00.0", "0000:89:00.0", "0000:8a:00.0"};
  const char* nicBus[] = {"0000:05:00.0", "0000:0c:00.0", "0000:84:00.0", "0000:8b:00.0"};
  VertexId gpus[8];
  for (int s = 0; s < 4; ++s) {
    VertexId sw = t.addVertex(Vertex{.kind = VertexKind::PciSwitch, .name = "pcisw" + std::to_string(s),
                                     .busId = switchBus[s], .pciClass = 0x060400});
    t.addLink(cpus[s / 2], sw, pcie(3, 16));
    for (int k = 0; k < 2; ++k) {
      int g = 2 * s + k;
      gpus[g] = t.addVertex(Vertex{.kind = VertexKind::Gpu, .name = "gpu" + std::to_string(g), .busId = gpuBus[g],
                                   .pciClass = 0x030200, .gpuIndex = g, .sm = kSm, .gpuModel = "Tesla V100-SXM2"});
      t.addLink(sw, gpus[g], pcie(3, 16));
    }
    VertexId nic = t.addVertex(Vertex{.kind = VertexKind::Nic, .name = "nic" + std::to_string(s), .busId = nicBus[s],
                                      .pciClass = 0x020700, .netName = "mlx5_" + std::to_string(s), .speedGbps = 100,
                                      .linkLayer = LinkLayer::InfiniBand, .gpuDirect = true});
    t.addLink(sw, nic, pcie(3, 16));
  }
  const int doubles[][2] = {{0, 1}, {0, 4}, {1, 3}, {2, 3}, {2, 6}, {4, 5}, {5, 7}, {6, 7}};
  const int singles[][2] = {{0, 2}, {0, 3}, {1, 2}, {1, 5}, {3, 7}, {4, 6}, {4, 7}, {5, 6}};
  for (const auto& p : doubles) t.addLink(gpus[p[0]], gpus[p[1]], nvlink(2, kSm));
  for (const auto& p : singles) t.addLink(gpus[p[0]], gpus[p[1]], nvlink(1, kSm));
  return t;
}

const std::map<std::string, std::function<Topology()>>& presets() {
  static const std::map<std::string, std::function<Topology()>> kPresets = {{"dgx1", dgx1}};
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
