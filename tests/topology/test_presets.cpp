// Built-in presets: the documented counts, the NVLink and PCIe facts each machine is known for, save and
// reload through both formats, and agreement with the real files in tests/data for the same machines.
// Expected values come from the machines' published facts (see presets.cpp), not from the builder.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "common/error.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;
using namespace topoccl::topo;

namespace {

std::string dataFile(const std::string& name) {
  std::string here = __FILE__;
  return here.substr(0, here.rfind('/')) + "/../data/" + name;
}

VertexId gpuAt(const Topology& t, int index) {
  auto id = t.gpuByIndex(index);
  REQUIRE(id);
  return *id;
}

// The PCIe switch a GPU or NIC hangs from; nullopt when it sits directly under a CPU.
std::optional<VertexId> parentSwitch(const Topology& t, VertexId device) {
  for (const Link* l : t.linksFrom(device))
    if (l->kind == LinkKind::Pcie && t.vertex(l->to).kind == VertexKind::PciSwitch) return l->to;
  return std::nullopt;
}

int nvlinkPorts(const Topology& t, VertexId gpu) {
  int ports = 0;
  for (const Link* l : t.linksFrom(gpu))
    if (l->kind == LinkKind::NvLink) ports += l->nvlinkCount;
  return ports;
}

std::set<std::string> busIds(const Topology& t, const std::vector<VertexId>& ids) {
  std::set<std::string> out;
  for (VertexId id : ids) out.insert(t.vertex(id).busId);
  return out;
}

// What each preset is documented to be (src/topology/README.md, presets.cpp).
struct Expected {
  const char* name;
  int gpus, nics, cpus, nvswitches, chips, nvlinksPerGpu, sm;
  double nicGbps;
  LinkLayer layer;
};
const Expected kExpected[] = {
    {"dgx1", 8, 4, 2, 0, 0, 6, 70, 100, LinkLayer::InfiniBand},
    {"dgx2", 16, 8, 2, 1, 12, 6, 70, 100, LinkLayer::InfiniBand},
    {"dgx-a100", 8, 8, 4, 1, 6, 12, 80, 200, LinkLayer::InfiniBand},
    {"dgx-h100", 8, 8, 2, 1, 4, 18, 90, 400, LinkLayer::InfiniBand},
    {"ndv2", 8, 1, 2, 0, 0, 6, 70, 100, LinkLayer::InfiniBand},
    {"ndv4", 8, 8, 4, 1, 6, 12, 80, 200, LinkLayer::InfiniBand},
    {"ndv5", 8, 8, 2, 1, 4, 18, 90, 400, LinkLayer::InfiniBand},
    {"p4d", 8, 4, 2, 1, 6, 12, 80, 100, LinkLayer::Ethernet},
    {"pcie8", 8, 2, 2, 0, 0, 0, 89, 100, LinkLayer::Ethernet},
};

}  // namespace

TEST_CASE("presets: every documented preset exists once, loads, and carries its own name", "[presets]") {
  std::vector<std::string> names = presetNames();
  std::set<std::string> unique(names.begin(), names.end());
  CHECK(unique.size() == names.size());
  std::set<std::string> documented;
  for (const Expected& e : kExpected) documented.insert(e.name);
  CHECK(unique == documented);
  std::set<std::string> fingerprints;
  for (const std::string& name : names) {
    INFO(name);
    Topology t = loadPreset(name);
    CHECK(t.name == name);
    CHECK(t.source == "preset:" + name);
    fingerprints.insert(t.fingerprint());
  }
  CHECK(fingerprints.size() == names.size());  // no two presets are the same machine
}

TEST_CASE("presets: an unknown name throws and lists the known ones", "[presets]") {
  try {
    loadPreset("nope");
    FAIL("loadPreset(\"nope\") did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == ncclInvalidArgument);
    std::string message = e.what();
    CHECK(message.find("'nope'") != std::string::npos);
    for (const Expected& x : kExpected) CHECK(message.find(x.name) != std::string::npos);
  }
}

TEST_CASE("presets: documented GPU, NIC, CPU and NVSwitch counts, GPU generation and NIC speed", "[presets]") {
  for (const Expected& e : kExpected) {
    INFO(e.name);
    Topology t = loadPreset(e.name);
    CHECK(t.count(VertexKind::Host) == 1);
    CHECK(t.count(VertexKind::Gpu) == e.gpus);
    CHECK(t.count(VertexKind::Nic) == e.nics);
    CHECK(t.count(VertexKind::Cpu) == e.cpus);
    REQUIRE(t.count(VertexKind::NvSwitch) == e.nvswitches);
    if (e.nvswitches) CHECK(t.vertex(t.verticesOfKind(VertexKind::NvSwitch)[0]).physicalSwitches == e.chips);
    for (int i = 0; i < e.gpus; ++i) {
      VertexId g = gpuAt(t, i);
      CHECK(t.vertex(g).sm == e.sm);
      CHECK(nvlinkPorts(t, g) == e.nvlinksPerGpu);
      CHECK(t.localCpu(g));
    }
    for (VertexId n : t.nics()) {
      CHECK(t.vertex(n).speedGbps == Approx(e.nicGbps));
      CHECK(t.vertex(n).linkLayer == e.layer);
      CHECK(t.vertex(n).gpuDirect);
      CHECK(!t.vertex(n).netName.empty());
    }
    // GPUs are numbered 0..n-1 in bus id order, as CUDA_DEVICE_ORDER=PCI_BUS_ID and the file loaders do.
    for (int i = 1; i < e.gpus; ++i) CHECK(t.vertex(gpuAt(t, i - 1)).busId < t.vertex(gpuAt(t, i)).busId);
  }
}

TEST_CASE("presets: GPU pairs are NVL through NVSwitch, NVL/NVB on the cube-mesh, PCIe-only on pcie8", "[presets]") {
  for (const Expected& e : kExpected) {
    INFO(e.name);
    Topology t = loadPreset(e.name);
    std::vector<VertexId> gpus = t.gpus();
    for (VertexId a : gpus)
      for (VertexId b : gpus) {
        if (a == b) continue;
        PathClass cls = t.path(a, b).cls;
        if (e.nvswitches) {
          CHECK(cls == PathClass::NVL);
          // Through the fabric the bottleneck is one GPU's NVLink ports: count x NCCL's per-link rate.
          CHECK(t.path(a, b).bandwidthGBs == Approx(e.nvlinksPerGpu * nvlinkBandwidthPerLinkGBs(e.sm)));
        } else if (e.nvlinksPerGpu) {
          CHECK((cls == PathClass::NVL || cls == PathClass::NVB));
        } else {
          CHECK((cls == PathClass::PIX || cls == PathClass::PXB || cls == PathClass::PHB || cls == PathClass::SYS));
        }
      }
  }
}

TEST_CASE("presets: DGX-1 and NDv2 share the hybrid cube-mesh: 24 NVLinks, 6 per GPU, diameter 2, NVB otherwise",
          "[presets]") {
  for (const char* name : {"dgx1", "ndv2"}) {
    INFO(name);
    Topology t = loadPreset(name);
    int total = 0, pairs = 0, doubles = 0;
    for (VertexId g : t.gpus()) {
      CHECK(nvlinkPorts(t, g) == 6);
      total += nvlinkPorts(t, g);
    }
    for (const Link& l : t.links())
      if (l.kind == LinkKind::NvLink && l.from < l.to) {
        CHECK(t.vertex(l.from).kind == VertexKind::Gpu);
        CHECK(t.vertex(l.to).kind == VertexKind::Gpu);
        CHECK(l.bandwidthGBs == Approx(l.nvlinkCount * 20.0));  // SM70: 20 GB/s per link
        ++pairs;
        doubles += l.nvlinkCount == 2;
      }
    CHECK(total / 2 == 24);  // sum of nvlinkCount over undirected GPU-GPU links: 8 doubles x 2 + 8 singles
    CHECK(pairs == 16);
    CHECK(doubles == 8);
    int diameter = 0, nvb = 0;
    for (VertexId a : t.gpus())
      for (VertexId b : t.gpus()) {
        if (a == b) continue;
        Path p = t.path(a, b);
        const Link* direct = t.linkBetween(a, b);
        bool linked = direct && direct->kind == LinkKind::NvLink;
        CHECK(p.cls == (linked ? PathClass::NVL : PathClass::NVB));  // never PCIe
        for (VertexId v : p.vertices) CHECK(t.vertex(v).kind == VertexKind::Gpu);
        nvb += !linked;
        diameter = std::max(diameter, p.hops);
      }
    CHECK(diameter == 2);
    CHECK(nvb == 2 * 12);  // 28 pairs, 16 linked
  }
  // The graphs are the same; only the machines around them differ.
  Topology dgx1 = loadPreset("dgx1"), ndv2 = loadPreset("ndv2");
  for (int a = 0; a < 8; ++a)
    for (int b = 0; b < 8; ++b) {
      const Link* x = dgx1.linkBetween(gpuAt(dgx1, a), gpuAt(dgx1, b));
      const Link* y = ndv2.linkBetween(gpuAt(ndv2, a), gpuAt(ndv2, b));
      int cx = x && x->kind == LinkKind::NvLink ? x->nvlinkCount : 0;
      int cy = y && y->kind == LinkKind::NvLink ? y->nvlinkCount : 0;
      CHECK(cx == cy);
    }
}

TEST_CASE("presets: NDv2 has one NIC, on NUMA 0, nearest to every GPU", "[presets]") {
  Topology t = loadPreset("ndv2");
  REQUIRE(t.count(VertexKind::Nic) == 1);
  VertexId nic = t.nics()[0];
  REQUIRE(t.localCpu(nic));
  CHECK(t.vertex(*t.localCpu(nic)).numaId == 0);
  CHECK(t.vertex(nic).busId == "0101:00:00.0");
  for (int i = 0; i < 8; ++i) {
    CHECK(t.railNic(gpuAt(t, i)) == nic);
    CHECK(t.vertex(*t.localCpu(gpuAt(t, i))).numaId == (i < 4 ? 0 : 1));
  }
  CHECK(t.path(gpuAt(t, 0), nic).cls == PathClass::PHB);  // GPU and NIC hang off the same root complex
}

TEST_CASE("presets: NDv4, NDv5 and DGX H100 give each GPU its own rail NIC under its own PCIe switch", "[presets]") {
  for (const char* name : {"ndv4", "ndv5", "dgx-h100"}) {
    INFO(name);
    Topology t = loadPreset(name);
    std::set<VertexId> rails;
    for (VertexId g : t.gpus()) {
      auto rail = t.railNic(g);
      REQUIRE(rail);
      rails.insert(*rail);
      auto sw = parentSwitch(t, g);
      REQUIRE(sw);
      CHECK(parentSwitch(t, *rail) == sw);
      CHECK(t.path(g, *rail).cls == PathClass::PIX);
      CHECK(t.vertex(*t.localCpu(g)).numaId == t.vertex(*t.localCpu(*rail)).numaId);
    }
    CHECK(rails.size() == 8);
  }
  // NDv4: 2 GPUs and 2 NICs per switch, so each GPU has two nearest NICs and takes the one in its slot.
  Topology ndv4 = loadPreset("ndv4");
  for (int i = 0; i < 8; ++i) {
    VertexId g = gpuAt(ndv4, i);
    CHECK(ndv4.nearestNics(g).size() == 2);
    CHECK(ndv4.vertex(*ndv4.railNic(g)).netName == "mlx5_" + std::to_string(i));
  }
  // NDv5 and DGX H100: exactly one NIC per switch, over Gen5 x16 (48 GB/s).
  for (const char* name : {"ndv5", "dgx-h100"}) {
    Topology t = loadPreset(name);
    for (VertexId g : t.gpus()) {
      CHECK(t.nearestNics(g).size() == 1);
      CHECK(t.path(g, t.nearestNics(g)[0]).bandwidthGBs == Approx(48));
    }
  }
}

TEST_CASE("presets: DGX A100 pairs GPUs on a switch with 2 NICs, both PXB, one rail each", "[presets]") {
  Topology t = loadPreset("dgx-a100");
  std::set<VertexId> rails;
  for (int i = 0; i < 8; ++i) {
    VertexId g = gpuAt(t, i);
    std::vector<VertexId> nearest = t.nearestNics(g);
    REQUIRE(nearest.size() == 2);
    for (VertexId n : nearest) CHECK(t.path(g, n).cls == PathClass::PXB);
    // GPU 2k and 2k+1 share their NICs; the GPU's NUMA node is the NICs' one.
    CHECK(nearest == t.nearestNics(gpuAt(t, i ^ 1)));
    CHECK(t.localCpu(nearest[0]) == t.localCpu(g));
    rails.insert(*t.railNic(g));
  }
  CHECK(rails.size() == 8);
  // nvidia-smi on DGX A100 (NVIDIA/DCGM#149): GPU0/1 on NUMA 3, GPU2/3 on NUMA 1, GPU4/5 on NUMA 7.
  CHECK(t.vertex(*t.localCpu(gpuAt(t, 0))).numaId == 3);
  CHECK(t.vertex(*t.localCpu(gpuAt(t, 2))).numaId == 1);
  CHECK(t.vertex(*t.localCpu(gpuAt(t, 4))).numaId == 7);
  CHECK(t.vertex(gpuAt(t, 0)).busId == "0000:07:00.0");  // NVIDIA/nccl#1505
}

TEST_CASE("presets: p4d shares each EFA between the 2 GPUs of its switch", "[presets]") {
  Topology t = loadPreset("p4d");
  std::map<VertexId, std::set<int>> users;
  for (int i = 0; i < 8; ++i) {
    VertexId g = gpuAt(t, i);
    std::vector<VertexId> nearest = t.nearestNics(g);
    REQUIRE(nearest.size() == 1);
    CHECK(t.path(g, nearest[0]).cls == PathClass::PIX);
    CHECK(t.railNic(g) == nearest[0]);
    users[nearest[0]].insert(i);
  }
  REQUIRE(users.size() == 4);
  std::set<std::set<int>> groups;
  for (const auto& [nic, gpus] : users) {
    groups.insert(gpus);
    CHECK(t.vertex(nic).pciVendor == 0x1d0f);  // Amazon EFA
    CHECK(t.vertex(nic).linkLayer == LinkLayer::Ethernet);
    CHECK(t.vertex(nic).gpuDirect);
  }
  CHECK(groups == std::set<std::set<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
}

TEST_CASE("presets: pcie8 has no NVLink, pairs are PIX on a switch, PHB on a socket, SYS across", "[presets]") {
  Topology t = loadPreset("pcie8");
  for (const Link& l : t.links()) CHECK(l.kind != LinkKind::NvLink);
  CHECK(t.path(gpuAt(t, 0), gpuAt(t, 1)).cls == PathClass::PIX);
  CHECK(t.path(gpuAt(t, 0), gpuAt(t, 2)).cls == PathClass::PHB);
  CHECK(t.path(gpuAt(t, 0), gpuAt(t, 4)).cls == PathClass::SYS);
  CHECK(t.path(gpuAt(t, 0), gpuAt(t, 1)).bandwidthGBs == Approx(24));  // Gen4 x16
  for (int i = 0; i < 8; ++i) {
    auto rail = t.railNic(gpuAt(t, i));
    REQUIRE(rail);
    CHECK(t.localCpu(*rail) == t.localCpu(gpuAt(t, i)));  // each socket uses its own NIC
  }
}

TEST_CASE("presets: JSON and NCCL XML round trips keep every preset's fingerprint", "[presets]") {
  for (const std::string& name : presetNames()) {
    INFO(name);
    Topology t = loadPreset(name);
    Topology fromJson = parseJson(writeJson(t), name + ".json");
    CHECK(fromJson.fingerprint() == t.fingerprint());
    CHECK(fromJson.count(VertexKind::Gpu) == t.count(VertexKind::Gpu));
    Topology fromXml = parseNcclXml(writeNcclXml(t), name + ".xml");
    CHECK(fromXml.fingerprint() == t.fingerprint());
    CHECK(fromXml.count(VertexKind::Nic) == t.count(VertexKind::Nic));
  }
}

TEST_CASE("presets: agree with the real files in tests/data for the same machines", "[presets]") {
  struct Twin {
    const char* preset;
    const char* file;
    bool fileHasNics;    // the DGX-2 hwloc file had its NICs removed upstream
    bool fileHasNvlink;  // cloud skeletons carry no NVLink; NCCL adds it from NVML at run time
  };
  const Twin twins[] = {{"ndv2", "nccl_azure-ndv2-topo.xml", true, false},
                        {"ndv4", "nccl_azure-ndv4-topo.xml", true, false},
                        {"ndv5", "nccl_azure-ndv5-topo.xml", true, false},
                        {"p4d", "nccl_aws-p4d-24xl-topo.xml", true, false},
                        {"dgx2", "hwloc-v2_nvidia-dgx2.xml", false, true}};
  for (const Twin& twin : twins) {
    INFO(twin.preset << " vs " << twin.file);
    Topology p = loadPreset(twin.preset);
    Topology f = loadTopologyFile(dataFile(twin.file));
    REQUIRE(p.count(VertexKind::Gpu) == f.count(VertexKind::Gpu));
    CHECK(p.count(VertexKind::Cpu) == f.count(VertexKind::Cpu));
    for (int i = 0; i < f.count(VertexKind::Gpu); ++i) {
      INFO("GPU " << i);
      VertexId pg = gpuAt(p, i), fg = gpuAt(f, i);
      CHECK(p.vertex(pg).busId == f.vertex(fg).busId);
      REQUIRE(p.localCpu(pg));
      REQUIRE(f.localCpu(fg));
      CHECK(p.vertex(*p.localCpu(pg)).numaId == f.vertex(*f.localCpu(fg)).numaId);
      if (twin.fileHasNics) {
        CHECK(busIds(p, p.nearestNics(pg)) == busIds(f, f.nearestNics(fg)));
        CHECK(p.vertex(*p.railNic(pg)).busId == f.vertex(*f.railNic(fg)).busId);
      }
    }
    if (twin.fileHasNics) {
      CHECK(p.count(VertexKind::Nic) == f.count(VertexKind::Nic));
      CHECK(busIds(p, p.nics()) == busIds(f, f.nics()));
      for (VertexId n : f.nics()) {
        auto pn = p.findByBusId(f.vertex(n).busId);
        REQUIRE(pn);
        CHECK(p.vertex(*pn).linkLayer == f.vertex(n).linkLayer);
      }
    } else {
      CHECK(f.count(VertexKind::Nic) == 0);
    }
    Path pp = p.path(gpuAt(p, 0), gpuAt(p, 1));
    if (twin.fileHasNvlink) {
      Path fp = f.path(gpuAt(f, 0), gpuAt(f, 1));
      CHECK(pp.cls == fp.cls);
      CHECK(pp.bandwidthGBs == Approx(fp.bandwidthGBs));
      CHECK(p.vertex(p.verticesOfKind(VertexKind::NvSwitch)[0]).physicalSwitches ==
            f.vertex(f.verticesOfKind(VertexKind::NvSwitch)[0]).physicalSwitches);
    } else {
      for (const Link& l : f.links()) CHECK(l.kind != LinkKind::NvLink);
      CHECK(pp.cls == PathClass::NVL);  // the preset adds what the skeleton leaves to NVML
    }
  }
  // Over PCIe alone the DGX-2 preset has the file's tree: drop the NVSwitch fabric and compare classes.
  Topology p = loadPreset("dgx2"), f = loadTopologyFile(dataFile("hwloc-v2_nvidia-dgx2.xml"));
  auto isFabric = [](const Vertex& v, VertexId) { return v.kind == VertexKind::NvSwitch; };
  p.removeVertices(isFabric);
  f.removeVertices(isFabric);
  for (int a = 0; a < 16; ++a)
    for (int b = 0; b < 16; ++b) {
      if (a == b) continue;
      INFO("GPU " << a << " - GPU " << b);
      CHECK(p.path(gpuAt(p, a), gpuAt(p, b)).cls == f.path(gpuAt(f, a), gpuAt(f, b)).cls);
    }
}
