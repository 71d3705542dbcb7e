// Topology model, loaders and presets. Expected facts come from the files' published contents
// (SOURCES.md and reference/topologies.md), not from the loaders' output.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <set>

#include "common/config.hpp"
#include "common/error.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;
using namespace topoccl::topo;

namespace {

std::string dataFile(const std::string& name) {
  std::string here = __FILE__;
  return here.substr(0, here.rfind('/')) + "/../data/" + name;
}

VertexId byName(const Topology& t, const std::string& name) {
  auto id = t.findByName(name);
  REQUIRE(id);
  return *id;
}

VertexId byBus(const Topology& t, const std::string& bus) {
  auto id = t.findByBusId(bus);
  REQUIRE(id);
  return *id;
}

VertexId gpu(const Topology& t, int index) {
  auto id = t.gpuByIndex(index);
  REQUIRE(id);
  return *id;
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == ncclInvalidArgument);
    return e.what();
  }
  FAIL("expected topoccl::Error");
  return {};
}

// Two GPUs on one PCIe switch, two more behind a second switch, one CPU, a NIC per switch,
// NVLink 0-1 (x2) and 1-2 (x1): small enough to know every answer by hand.
Topology handBuilt() {
  Topology t;
  t.addVertex(Vertex{.kind = VertexKind::Host, .name = "host0"});
  VertexId cpu = t.addVertex(Vertex{.kind = VertexKind::Cpu, .name = "cpu0", .numaId = 0});
  VertexId cpu1 = t.addVertex(Vertex{.kind = VertexKind::Cpu, .name = "cpu1", .numaId = 1});
  t.addLink(cpu, cpu1, Link{.kind = LinkKind::CpuInterconnect, .bandwidthGBs = 10});
  VertexId sw0 = t.addVertex(Vertex{.kind = VertexKind::PciSwitch, .name = "sw0", .busId = "0000:01:00.0"});
  VertexId sw1 = t.addVertex(Vertex{.kind = VertexKind::PciSwitch, .name = "sw1", .busId = "0000:02:00.0"});
  VertexId sw2 = t.addVertex(Vertex{.kind = VertexKind::PciSwitch, .name = "sw2", .busId = "0000:80:00.0"});
  t.addLink(cpu, sw0, Link{.kind = LinkKind::Pcie, .pcieGen = 4, .pcieWidth = 16});
  t.addLink(sw0, sw1, Link{.kind = LinkKind::Pcie, .pcieGen = 4, .pcieWidth = 16});
  t.addLink(cpu1, sw2, Link{.kind = LinkKind::Pcie, .pcieGen = 4, .pcieWidth = 16});
  VertexId g[4];
  VertexId parents[4] = {sw0, sw0, sw1, sw2};
  for (int i = 0; i < 4; ++i) {
    g[i] = t.addVertex(Vertex{.kind = VertexKind::Gpu, .name = "g" + std::to_string(i),
                              .busId = "0000:1" + std::to_string(i) + ":00.0", .gpuIndex = i, .sm = 80});
    t.addLink(parents[i], g[i], Link{.kind = LinkKind::Pcie, .pcieGen = 4, .pcieWidth = 16});
  }
  VertexId nic0 = t.addVertex(Vertex{.kind = VertexKind::Nic, .name = "nic0", .busId = "0000:20:00.0"});
  VertexId nic1 = t.addVertex(Vertex{.kind = VertexKind::Nic, .name = "nic1", .busId = "0000:21:00.0"});
  t.addLink(sw1, nic0, Link{.kind = LinkKind::Pcie, .pcieGen = 4, .pcieWidth = 16});
  t.addLink(sw2, nic1, Link{.kind = LinkKind::Pcie, .pcieGen = 3, .pcieWidth = 16});
  t.addLink(g[0], g[1], Link{.kind = LinkKind::NvLink, .nvlinkCount = 2});
  t.addLink(g[1], g[2], Link{.kind = LinkKind::NvLink, .nvlinkCount = 1});
  return t;
}

}  // namespace

TEST_CASE("model: bandwidth tables follow NCCL's") {
  CHECK(pcieBandwidthGBs(3, 16) == Approx(12));
  CHECK(pcieBandwidthGBs(4, 16) == Approx(24));
  CHECK(pcieBandwidthGBs(5, 16) == Approx(48));
  CHECK(pcieBandwidthGBs(0, 0) == Approx(12));  // unknown speed and width 0 fall back to Gen3 x16
  CHECK(nvlinkBandwidthPerLinkGBs(70) == Approx(20));
}

TEST_CASE("model: path classes, bottlenecks and hops on a hand-built graph") {
  Topology t = handBuilt();
  VertexId g0 = byName(t, "g0"), g1 = byName(t, "g1"), g2 = byName(t, "g2"), g3 = byName(t, "g3");
  Path p01 = t.path(g0, g1);
  CHECK(p01.cls == PathClass::NVL);
  CHECK(p01.hops == 1);
  CHECK(p01.bandwidthGBs == Approx(40));  // 2 x 20 GB/s (SM80)
  Path p02 = t.path(g0, g2);
  CHECK(p02.cls == PathClass::NVB);  // through g1, better than the PCIe route
  CHECK(p02.hops == 2);
  CHECK(p02.bandwidthGBs == Approx(20));
  CHECK(p02.vertices == std::vector<VertexId>{g0, g1, g2});
  CHECK(t.path(g0, g3).cls == PathClass::SYS);
  CHECK(t.path(g0, g3).bandwidthGBs == Approx(10));
  CHECK(t.path(g0, g0).cls == PathClass::LOC);
  CHECK(t.path(g0, byName(t, "cpu0")).cls == PathClass::PHB);
  CHECK(t.path(g2, byName(t, "nic0")).cls == PathClass::PIX);
  CHECK(t.path(g0, byName(t, "nic0")).cls == PathClass::PXB);
  CHECK(t.path(g0, byName(t, "host0")).cls == PathClass::DIS);
  // g3's only NIC is nic1 under its own switch; Gen3 x16 is the bottleneck.
  CHECK(t.nearestNics(g3) == std::vector<VertexId>{byName(t, "nic1")});
  CHECK(t.path(g3, byName(t, "nic1")).bandwidthGBs == Approx(12));
  CHECK(t.localCpu(g3) == byName(t, "cpu1"));
}

TEST_CASE("model: a GPU reaches a far NIC by PXN when an NVLink peer sits next to it") {
  Topology t = handBuilt();
  // g1 -> nic1 (other socket) is SYS directly; no NVLink peer of g1 is near nic1, so it stays SYS.
  CHECK(t.path(byName(t, "g1"), byName(t, "nic1")).cls == PathClass::SYS);
  // Link g3 to g1 over NVLink: g1 can now go NVLink to g3, then PCIe to nic1.
  t.addLink(byName(t, "g1"), byName(t, "g3"), Link{.kind = LinkKind::NvLink, .nvlinkCount = 1});
  Path pxn = t.path(byName(t, "g1"), byName(t, "nic1"));
  CHECK(pxn.cls == PathClass::PXN);
  CHECK(pxn.vertices.front() == byName(t, "g1"));
  CHECK(pxn.vertices.back() == byName(t, "nic1"));
}

TEST_CASE("model: the fingerprint ignores names and insertion order but sees bandwidth") {
  Topology a = handBuilt();
  Topology b = handBuilt();
  CHECK(a.fingerprint() == b.fingerprint());
  CHECK(a.fingerprint().size() == 16);
  b.vertex(byName(b, "g0")).name = "renamed";  // names are not part of the canonical form
  CHECK(a.fingerprint() == b.fingerprint());
  b.addLink(byName(b, "g0"), byName(b, "g3"), Link{.kind = LinkKind::NvLink, .nvlinkCount = 1});
  CHECK(a.fingerprint() != b.fingerprint());
}

TEST_CASE("model: duplicate names and links are refused") {
  Topology t = handBuilt();
  CHECK_THROWS_AS(t.addVertex(Vertex{.kind = VertexKind::Gpu, .name = "g0"}), Error);
  CHECK_THROWS_AS(t.addLink(byName(t, "g0"), byName(t, "g1"), Link{.kind = LinkKind::NvLink, .nvlinkCount = 1}), Error);
}

TEST_CASE("NCCL XML: Azure NDv4 skeleton — 8 A100, 8 IB NICs, each GPU's nearest NIC under its own switch") {
  Topology t = loadNcclXml(dataFile("nccl_azure-ndv4-topo.xml"));
  CHECK(t.count(VertexKind::Gpu) == 8);
  CHECK(t.count(VertexKind::Nic) == 8);
  CHECK(t.count(VertexKind::Cpu) == 4);
  CHECK(t.count(VertexKind::PciSwitch) == 4);
  CHECK(t.count(VertexKind::NvSwitch) == 0);  // skeletons carry no NVLink
  for (VertexId g : t.gpus()) {
    std::vector<VertexId> nearest = t.nearestNics(g);
    REQUIRE(nearest.size() == 2);  // 2 NICs share each switch with 2 GPUs
    for (VertexId n : nearest) CHECK(t.path(g, n).cls == PathClass::PIX);
    // One NIC per GPU, taken from its own switch.
    VertexId rail = *t.railNic(g);
    CHECK(std::find(nearest.begin(), nearest.end(), rail) != nearest.end());
    CHECK(t.vertex(rail).linkLayer == LinkLayer::InfiniBand);
  }
  // The file pairs GPU domains 0001-0004 with NIC domains 0101-0104 under the same switch.
  for (int d = 1; d <= 4; ++d) {
    VertexId g = byBus(t, "000" + std::to_string(d) + ":00:00.0");
    CHECK(t.vertex(*t.railNic(g)).busId == "010" + std::to_string(d) + ":00:00.0");
  }
  // GPUs are numbered in bus id order: GPU0 is 0001:00:00.0, on NUMA node 1.
  CHECK(t.vertex(gpu(t, 0)).busId == "0001:00:00.0");
  CHECK(t.vertex(*t.localCpu(gpu(t, 0))).numaId == 1);
  CHECK(t.path(gpu(t, 0), gpu(t, 1)).cls == PathClass::PIX);
  CHECK(t.path(gpu(t, 0), gpu(t, 2)).cls == PathClass::SYS);
  CHECK(t.path(gpu(t, 0), gpu(t, 1)).bandwidthGBs == Approx(24));  // 16 GT/s x16
}

TEST_CASE("NCCL XML: Azure NDv2 — 8 V100 flat on two CPUs, a single NIC on NUMA 0") {
  Topology t = loadNcclXml(dataFile("nccl_azure-ndv2-topo.xml"));
  CHECK(t.count(VertexKind::Gpu) == 8);
  REQUIRE(t.count(VertexKind::Nic) == 1);
  VertexId nic = t.nics()[0];
  CHECK(t.vertex(*t.localCpu(nic)).numaId == 0);
  for (int i = 0; i < 8; ++i) {
    CHECK(t.nearestNics(gpu(t, i)) == std::vector<VertexId>{nic});
    CHECK(t.path(gpu(t, i), nic).cls == (i < 4 ? PathClass::PHB : PathClass::SYS));
  }
  CHECK(t.path(gpu(t, 0), gpu(t, 1)).cls == PathClass::PHB);
  CHECK(t.path(gpu(t, 0), gpu(t, 4)).bandwidthGBs == Approx(10));  // Skylake inter-socket
}

TEST_CASE("NCCL XML: AWS p4d — comments skipped, 4 EFA NICs each shared by its switch's 2 GPUs") {
  Topology t = loadNcclXml(dataFile("nccl_aws-p4d-24xl-topo.xml"));
  CHECK(t.count(VertexKind::Gpu) == 8);
  CHECK(t.count(VertexKind::Nic) == 4);
  std::map<VertexId, int> users;
  for (VertexId g : t.gpus()) {
    auto nearest = t.nearestNics(g);
    REQUIRE(nearest.size() == 1);
    CHECK(t.path(g, nearest[0]).cls == PathClass::PIX);
    ++users[nearest[0]];
  }
  for (auto [nic, n] : users) {
    CHECK(n == 2);
    CHECK(t.vertex(nic).gpuDirect);  // EFA is Ethernet-class yet RDMA-capable
  }
  CHECK(t.vertex(byBus(t, "0000:10:1b.0")).pciVendor == 0x1d0f);
}

TEST_CASE("NCCL XML: Azure NDv5 — strict rails over Gen5 x16") {
  Topology t = loadNcclXml(dataFile("nccl_azure-ndv5-topo.xml"));
  CHECK(t.count(VertexKind::Gpu) == 8);
  CHECK(t.count(VertexKind::Cpu) == 2);
  std::set<VertexId> rails;
  for (VertexId g : t.gpus()) {
    auto nearest = t.nearestNics(g);
    REQUIRE(nearest.size() == 1);
    rails.insert(nearest[0]);
    CHECK(t.path(g, nearest[0]).bandwidthGBs == Approx(48));
  }
  CHECK(rails.size() == 8);
}

TEST_CASE("NCCL XML: NC A100 v4 — self NVLink ignored, NIC directly under a CPU") {
  Topology t = loadNcclXml(dataFile("nccl_azure-ncv4-topo.xml"));
  CHECK(t.count(VertexKind::Gpu) == 4);
  for (const Link& l : t.links()) CHECK(l.kind != LinkKind::NvLink);
  REQUIRE(t.count(VertexKind::Nic) == 1);
  const Vertex& nic = t.vertex(t.nics()[0]);
  CHECK(nic.netName == "eth0");
  CHECK(nic.speedGbps == Approx(100));
  CHECK(nic.busId.empty());
  CHECK(t.vertex(*t.localCpu(t.nics()[0])).numaId == 0);
  CHECK(t.vertex(gpu(t, 2)).sm == 80);
  CHECK(t.vertex(byName(t, "cpu0")).cpuFamily == 175);
}

TEST_CASE("NCCL XML: p5 skeleton — class-less leaves parse, no GPUs") {
  Topology t = loadNcclXml(dataFile("nccl_aws-p5-48xl-topo.xml"));
  CHECK(t.count(VertexKind::Gpu) == 0);
  CHECK(t.count(VertexKind::PciSwitch) == 8);
  CHECK(t.count(VertexKind::PciDevice) == 32);
}

TEST_CASE("NCCL XML: malformed and truncated files name the file and the line") {
  std::string text = readTextFile(dataFile("nccl_azure-ndv4-topo.xml"));
  std::string truncated = text.substr(0, text.find("<cpu numaid=\"2\""));
  std::string message = errorOf([&] { parseNcclXml(truncated, "ndv4-cut.xml"); });
  CHECK(message.rfind("ndv4-cut.xml:", 0) == 0);
  std::string bad = "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\" class=\"zz\"/>\n  </cpu>\n</system>\n";
  CHECK(errorOf([&] { parseNcclXml(bad, "bad.xml"); }).rfind("bad.xml:3:", 0) == 0);
  std::string broken = "<system version=\"1\">\n<cpu numaid=\"0\">\n<pci busid=\"x\" <\n</system>";
  CHECK(errorOf([&] { parseNcclXml(broken, "broken.xml"); }).rfind("broken.xml:3:", 0) == 0);
  CHECK_THROWS_AS(loadNcclXml(dataFile("does-not-exist.xml")), Error);
}

TEST_CASE("hwloc XML: DGX-2 — 16 GPUs, 12 NVSwitch chips merged into one fabric, NVLink between every pair") {
  Topology t = loadHwlocXml(dataFile("hwloc-v2_nvidia-dgx2.xml"));
  CHECK(t.count(VertexKind::Gpu) == 16);
  REQUIRE(t.count(VertexKind::NvSwitch) == 1);
  CHECK(t.vertex(t.verticesOfKind(VertexKind::NvSwitch)[0]).physicalSwitches == 12);
  CHECK(t.count(VertexKind::Nic) == 0);
  CHECK(t.count(VertexKind::Cpu) == 2);
  VertexId fabric = t.verticesOfKind(VertexKind::NvSwitch)[0];
  for (VertexId g : t.gpus()) {
    const Link* l = t.linkBetween(g, fabric);
    REQUIRE(l);
    CHECK(l->nvlinkCount == 6);  // 25000 MB/s to each of its baseboard's 6 switches
    CHECK(t.vertex(g).sm == 70);
    CHECK(t.nearestNics(g).empty());
  }
  for (VertexId a : t.gpus())
    for (VertexId b : t.gpus())
      if (a != b) CHECK(t.path(a, b).cls == PathClass::NVL);
  // GPU0 is 0000:34:00.0; the PCIe classes NVIDIA's tools report for DGX-2.
  VertexId g0 = byBus(t, "0000:34:00.0");
  CHECK(t.vertex(g0).gpuIndex == 0);
  CHECK(t.vertex(g0).gpuModel == "Tesla V100-SXM3-32GB-H");
}

TEST_CASE("hwloc XML: DGX-2 PCIe tree collapses switch port pairs") {
  Topology t = loadHwlocXml(dataFile("hwloc-v2_nvidia-dgx2.xml"));
  // Compare over PCIe only: drop NVLink so path() has to use the tree.
  t.removeVertices([](const Vertex& v, VertexId) { return v.kind == VertexKind::NvSwitch; });
  VertexId g0 = byBus(t, "0000:34:00.0"), g1 = byBus(t, "0000:36:00.0");
  Path p = t.path(g0, g1);
  CHECK(p.cls == PathClass::PIX);  // same PEX9781, one switch after collapsing its ports
  CHECK(p.hops == 2);
  CHECK(t.path(g0, t.gpus()[2]).cls == PathClass::PXB);
  CHECK(t.path(g0, t.gpus()[4]).cls == PathClass::PHB);  // other host bridge, same socket
  CHECK(t.path(g0, t.gpus()[8]).cls == PathClass::SYS);
}

TEST_CASE("hwloc XML: POWER8 Minsky — NVLink to CPUs and between GPU pairs") {
  Topology t = loadHwlocXml(dataFile("hwloc-v2_power8-minsky-4p100.xml"));
  CHECK(t.count(VertexKind::Gpu) == 4);
  CHECK(t.count(VertexKind::NvSwitch) == 0);
  VertexId g0 = gpu(t, 0), g1 = gpu(t, 1), g2 = gpu(t, 2);
  REQUIRE(t.linkBetween(g0, g1));
  CHECK(t.linkBetween(g0, g1)->nvlinkCount == 2);  // 40000 MB/s at 20000 per P100 link
  CHECK(t.path(g0, g1).cls == PathClass::NVL);
  const Link* toCpu = t.linkBetween(g0, byName(t, "cpu0"));
  REQUIRE(toCpu);
  CHECK(toCpu->kind == LinkKind::NvLink);
  CHECK(toCpu->nvlinkCount == 2);
  CHECK(t.path(g0, g2).cls == PathClass::SYS);
}

TEST_CASE("hwloc XML: whole-I/O fixture classifies by PCI class") {
  Topology t = loadHwlocXml(dataFile("hwloc-v2_32em64t-k40m-ib-wholeio.xml"));
  bool sawAmd = false, sawIb = false;
  for (VertexId g : t.gpus()) sawAmd = sawAmd || t.vertex(g).pciVendor == 0x1002;
  for (VertexId n : t.nics())
    if (t.vertex(n).netName == "mlx5_0") sawIb = t.vertex(n).linkLayer == LinkLayer::InfiniBand && t.vertex(n).gpuDirect;
  CHECK(sawAmd);
  CHECK(sawIb);
}

TEST_CASE("hwloc XML: a v3 file is refused with the version and how to export v2") {
  std::string message = errorOf([] { loadHwlocXml(dataFile("hwloc-v3_nvidia-dgx2.xml")); });
  CHECK(message.find("3.0") != std::string::npos);
  CHECK(message.find("--export-xml-flags v2") != std::string::npos);
  CHECK(message.find("hwloc-v3_nvidia-dgx2.xml:3:") != std::string::npos);
  std::string text = readTextFile(dataFile("hwloc-v2_nvidia-dgx2.xml"));
  std::string cut = text.substr(0, text.size() / 2);
  CHECK(errorOf([&] { parseHwlocXml(cut, "cut.xml"); }).rfind("cut.xml:", 0) == 0);
}

TEST_CASE("round trips: NCCL XML and JSON give the same fingerprint") {
  for (const char* name : {"nccl_azure-ndv4-topo.xml", "nccl_azure-ndv2-topo.xml", "nccl_aws-p4d-24xl-topo.xml",
                           "nccl_azure-ndv5-topo.xml", "nccl_azure-ncv4-topo.xml"}) {
    INFO(name);
    Topology original = loadNcclXml(dataFile(name));
    CHECK(parseNcclXml(writeNcclXml(original), "rewritten.xml").fingerprint() == original.fingerprint());
    CHECK(parseJson(writeJson(original), "rewritten.json").fingerprint() == original.fingerprint());
  }
  for (const char* name : {"hwloc-v2_nvidia-dgx2.xml", "hwloc-v2_power8-minsky-4p100.xml"}) {
    INFO(name);
    Topology original = loadHwlocXml(dataFile(name));
    CHECK(parseJson(writeJson(original), "rewritten.json").fingerprint() == original.fingerprint());
    CHECK(parseNcclXml(writeNcclXml(original), "rewritten.xml").fingerprint() == original.fingerprint());
  }
  Topology dgx1 = loadPreset("dgx1");
  CHECK(parseNcclXml(writeNcclXml(dgx1), "dgx1.xml").fingerprint() == dgx1.fingerprint());
  CHECK(parseJson(writeJson(dgx1), "dgx1.json").fingerprint() == dgx1.fingerprint());
}

TEST_CASE("JSON: malformed input and unknown keys are clear errors") {
  CHECK(errorOf([] { parseJson("{\n  \"format\": \"topoccl-topology\",\n  \"version\": 1,\n  \"vertices\": [ }", "t.json"); })
            .rfind("t.json:4:", 0) == 0);
  std::string unknownKey = R"({"format":"topoccl-topology","version":1,"vertices":[{"name":"g","kind":"gpu","colour":1}],"links":[]})";
  std::string message = errorOf([&] { parseJson(unknownKey, "k.json"); });
  CHECK(message.find("vertices[0]") != std::string::npos);
  CHECK(message.find("colour") != std::string::npos);
}

TEST_CASE("preset DGX-1: hybrid cube-mesh with 24 NVLinks, 6 per GPU, diameter 2, NVB for non-neighbours") {
  Topology t = loadPreset("dgx1");
  CHECK(t.count(VertexKind::Gpu) == 8);
  int total = 0;
  for (VertexId g : t.gpus()) {
    int ports = 0;
    for (const Link* l : t.linksFrom(g))
      if (l->kind == LinkKind::NvLink) ports += l->nvlinkCount;
    CHECK(ports == 6);
    total += ports;
  }
  CHECK(total / 2 == 24);
  int diameter = 0, nvbPairs = 0;
  for (VertexId a : t.gpus())
    for (VertexId b : t.gpus()) {
      if (a == b) continue;
      Path p = t.path(a, b);
      bool direct = t.linkBetween(a, b) && t.linkBetween(a, b)->kind == LinkKind::NvLink;
      CHECK(p.cls == (direct ? PathClass::NVL : PathClass::NVB));
      nvbPairs += !direct;
      diameter = std::max(diameter, p.hops);
    }
  CHECK(diameter == 2);
  CHECK(nvbPairs == 2 * 12);  // 28 pairs, 16 of them linked
  // 0-5 relays through 4 (0-4 x2, 4-5 x2): 40 GB/s beats 0-1-5 (1-5 is a single link).
  CHECK(t.path(gpu(t, 0), gpu(t, 5)).bandwidthGBs == Approx(40));
  CHECK_THROWS_AS(loadPreset("nope"), Error);
}

TEST_CASE("TOPOCCL_TOPO_FILE overrides NCCL_TOPO_FILE") {
  config::setOverride("NCCL_TOPO_FILE", "/nccl.xml");
  CHECK(topologyFileOverride() == "/nccl.xml");
  config::setOverride("TOPOCCL_TOPO_FILE", "/ours.json");
  CHECK(topologyFileOverride() == "/ours.json");
  config::clearOverrides();
}

TEST_CASE("format detection") {
  CHECK(loadTopologyFile(dataFile("hwloc-v2_nvidia-dgx2.xml")).count(VertexKind::Gpu) == 16);
  CHECK(loadTopologyFile(dataFile("nccl_azure-ndv4-topo.xml")).count(VertexKind::Gpu) == 8);
  CHECK_THROWS_AS(parseNcclXml("", "empty.xml"), Error);
}
