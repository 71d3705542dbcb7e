// Multi-host topologies: buildCluster, fuseHosts and the host report wire format. Expected facts come
// from the DGX-1 preset's published layout (4 PCIe switches, each with 2 GPUs and 1 100 Gb/s EDR NIC;
// PCIe Gen3 x16 = 12 GB/s) and from the cluster.hpp contract, not from the code's output.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <iostream>
#include <random>
#include <set>

#include "common/error.hpp"
#include "topology/cluster.hpp"
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
  INFO("vertex " << name);
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

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> namesOf(const Topology& t, const std::vector<VertexId>& ids) {
  std::vector<std::string> names;
  for (VertexId id : ids) names.push_back(t.vertex(id).name);
  return names;
}

bool onRoute(const Topology& t, const Path& p, const std::string& name) {
  std::vector<std::string> names = namesOf(t, p.vertices);
  return std::find(names.begin(), names.end(), name) != names.end();
}

ClusterSpec rails(int hosts, int spines = 0) {
  ClusterSpec spec;
  spec.hosts = hosts;
  spec.network.shape = NetworkShape::RailOptimized;
  spec.network.spines = spines;
  return spec;
}

// The network links of a vertex (NIC or switch), by the name of the other end.
std::multiset<std::string> networkPeers(const Topology& t, VertexId v) {
  std::multiset<std::string> peers;
  for (const Link* l : t.linksFrom(v))
    if (l->kind == LinkKind::Network) peers.insert(t.vertex(l->to).name);
  return peers;
}

Topology withoutNics(Topology t) {
  t.removeVertices([](const Vertex& v, VertexId) { return v.kind == VertexKind::Nic; });
  return t;
}

}  // namespace

TEST_CASE("cluster: two DGX-1 on rails — 16 GPUs, 8 NICs, 4 rail switches, hosts and GPU indices kept", "[cluster]") {
  Topology node = loadPreset("dgx1");
  Topology c = buildCluster(node, rails(2));
  CHECK(c.name == "dgx1-x2");
  CHECK(c.count(VertexKind::Gpu) == 16);
  CHECK(c.count(VertexKind::Nic) == 8);
  CHECK(c.count(VertexKind::NetSwitch) == 4);
  CHECK(c.count(VertexKind::Cpu) == 4);
  CHECK(c.count(VertexKind::Host) == 2);
  CHECK(namesOf(c, c.verticesOfKind(VertexKind::NetSwitch)) == std::vector<std::string>{"rail0", "rail1", "rail2", "rail3"});
  for (VertexId sw : c.verticesOfKind(VertexKind::NetSwitch)) CHECK(c.vertex(sw).host == kNoHost);

  for (int h = 0; h < 2; ++h) {
    for (int g = 0; g < 8; ++g) {
      const Vertex& v = c.vertex(byName(c, "h" + std::to_string(h) + "/gpu" + std::to_string(g)));
      CHECK(v.host == h);
      CHECK(v.gpuIndex == g);  // CUDA order per host, as on the node
      CHECK(v.busId == node.vertex(byName(node, "gpu" + std::to_string(g))).busId);
    }
    CHECK(c.vertex(byName(c, "h" + std::to_string(h) + "/nic3")).host == h);
    CHECK(c.vertex(byName(c, "h" + std::to_string(h) + "/cpu1")).host == h);
  }
  // gpus() is per host, in index order.
  std::vector<VertexId> gpus = c.gpus();
  REQUIRE(gpus.size() == 16);
  CHECK(c.vertex(gpus[7]).name == "h0/gpu7");
  CHECK(c.vertex(gpus[8]).name == "h1/gpu0");

  // NIC k (bus id order: nic0 05:00, nic1 0c:00, nic2 84:00, nic3 8b:00) on rail k, 100 Gb/s = 12.5 GB/s.
  for (int k = 0; k < 4; ++k) {
    std::string rail = "rail" + std::to_string(k), nic = "nic" + std::to_string(k);
    CHECK(networkPeers(c, byName(c, rail)) == std::multiset<std::string>{"h0/" + nic, "h1/" + nic});
    CHECK(networkPeers(c, byName(c, "h1/" + nic)) == std::multiset<std::string>{rail});
    const Link* l = c.linkBetween(byName(c, "h0/" + nic), byName(c, rail));
    REQUIRE(l);
    CHECK(l->kind == LinkKind::Network);
    CHECK(l->bandwidthGBs == Approx(12.5));
    CHECK(l->latencyUs == Approx(defaultLatencyUs(LinkKind::Network)));
  }
  // Inside a host nothing changes: the node's answers still hold.
  CHECK(c.path(byName(c, "h1/gpu0"), byName(c, "h1/gpu1")).cls == PathClass::NVL);
  CHECK(c.path(byName(c, "h1/gpu0"), byName(c, "h1/gpu2")).cls == PathClass::NVL);
  CHECK(c.path(byName(c, "h0/gpu1"), byName(c, "h0/gpu6")).cls == PathClass::NVB);
  CHECK(c.railNic(byName(c, "h1/gpu5")) == byName(c, "h1/nic2"));
}

TEST_CASE("cluster: a GPU reaches a GPU on another host over NET through its rail NIC", "[cluster]") {
  Topology c = buildCluster(loadPreset("dgx1"), rails(2));
  VertexId src = byName(c, "h0/gpu0"), dst = byName(c, "h1/gpu1");
  Path p = c.path(src, dst);
  CHECK(p.cls == PathClass::NET);
  CHECK(p.vertices.front() == src);
  CHECK(p.vertices.back() == dst);
  // gpu0 -> pcisw0 -> nic0 -> rail0 -> nic0 -> pcisw0 -> gpu1: both GPUs sit on switch 0 with NIC 0.
  CHECK(namesOf(c, p.vertices) ==
        std::vector<std::string>{"h0/gpu0", "h0/pcisw0", "h0/nic0", "rail0", "h1/nic0", "h1/pcisw0", "h1/gpu1"});
  CHECK(p.hops == 6);
  // The bottleneck of the whole route: PCIe Gen3 x16 (12) is narrower than the 12.5 GB/s NIC.
  CHECK(p.bandwidthGBs == Approx(12));
  // The reverse direction too, and a GPU on another switch leaves through its own rail.
  CHECK(c.path(dst, src).cls == PathClass::NET);
  Path p5 = c.path(byName(c, "h0/gpu5"), byName(c, "h1/gpu5"));
  CHECK(p5.cls == PathClass::NET);
  CHECK(onRoute(c, p5, "h0/nic2"));
  CHECK(onRoute(c, p5, "rail2"));
  CHECK(onRoute(c, p5, "h1/nic2"));

  SECTION("a slower network is the bottleneck") {
    ClusterSpec spec = rails(2);
    spec.network.nicBandwidthGBs = 5;
    spec.network.latencyUs = 2.5;
    Topology slow = buildCluster(loadPreset("dgx1"), spec);
    Path q = slow.path(byName(slow, "h0/gpu0"), byName(slow, "h1/gpu1"));
    CHECK(q.cls == PathClass::NET);
    CHECK(q.bandwidthGBs == Approx(5));
    CHECK(slow.railNic(byName(slow, "h0/gpu0")) == byName(slow, "h0/nic0"));
    const Link* l = slow.linkBetween(byName(slow, "rail0"), byName(slow, "h1/nic0"));
    REQUIRE(l);
    CHECK(l->latencyUs == Approx(2.5));
    CHECK(slow.fingerprint() != c.fingerprint());
  }
  SECTION("a NIC to a NIC on another host crosses only the switch") {
    Path n = c.path(byName(c, "h0/nic3"), byName(c, "h1/nic3"));
    CHECK(n.cls == PathClass::NET);
    CHECK(namesOf(c, n.vertices) == std::vector<std::string>{"h0/nic3", "rail3", "h1/nic3"});
    CHECK(n.bandwidthGBs == Approx(12.5));
  }
}

TEST_CASE("cluster: without spines rails meet only inside hosts, with spines the network changes rails", "[cluster]") {
  // h0/gpu0 uses rail 0, h1/gpu2 uses rail 1 (nic1 on pcisw1).
  SECTION("no spine: still NET, out through rail 0, no spine on the route") {
    Topology c = buildCluster(loadPreset("dgx1"), rails(2, 0));
    CHECK(c.count(VertexKind::NetSwitch) == 4);
    Path p = c.path(byName(c, "h0/gpu0"), byName(c, "h1/gpu2"));
    CHECK(p.cls == PathClass::NET);
    CHECK(onRoute(c, p, "h0/nic0"));
    CHECK(onRoute(c, p, "rail0"));
    CHECK_FALSE(onRoute(c, p, "rail1"));
    CHECK(p.vertices.back() == byName(c, "h1/gpu2"));
  }
  SECTION("two spines: rail 0 -> spine -> rail 1, in through the destination's rail NIC") {
    Topology c = buildCluster(loadPreset("dgx1"), rails(2, 2));
    CHECK(c.count(VertexKind::NetSwitch) == 6);
    CHECK(c.vertex(byName(c, "spine1")).host == kNoHost);
    // Each spine links to every rail; non-blocking: a rail's 2 x 12.5 GB/s over 2 spines = 12.5 each.
    CHECK(networkPeers(c, byName(c, "spine0")) == std::multiset<std::string>{"rail0", "rail1", "rail2", "rail3"});
    const Link* up = c.linkBetween(byName(c, "rail2"), byName(c, "spine1"));
    REQUIRE(up);
    CHECK(up->bandwidthGBs == Approx(12.5));
    Path p = c.path(byName(c, "h0/gpu0"), byName(c, "h1/gpu2"));
    CHECK(p.cls == PathClass::NET);
    std::vector<std::string> names = namesOf(c, p.vertices);
    REQUIRE(names.size() == 9);
    CHECK(std::vector<std::string>(names.begin() + 2, names.begin() + 7) ==
          std::vector<std::string>{"h0/nic0", "rail0", names[4], "rail1", "h1/nic1"});
    CHECK((names[4] == "spine0" || names[4] == "spine1"));
    CHECK(p.bandwidthGBs == Approx(12));
  }
  SECTION("explicit spine bandwidth") {
    ClusterSpec spec = rails(3, 1);
    spec.network.spineBandwidthGBs = 3;
    Topology c = buildCluster(loadPreset("dgx1"), spec);
    Path p = c.path(byName(c, "h0/gpu0"), byName(c, "h2/gpu2"));
    CHECK(onRoute(c, p, "spine0"));
    CHECK(p.bandwidthGBs == Approx(3));
  }
}

TEST_CASE("cluster: single switch, three hosts — one switch with 3 x 4 NIC links", "[cluster]") {
  ClusterSpec spec;
  spec.hosts = 3;
  spec.network.shape = NetworkShape::SingleSwitch;
  spec.name = "trio";
  Topology c = buildCluster(loadPreset("dgx1"), spec);
  CHECK(c.name == "trio");
  CHECK(c.count(VertexKind::Gpu) == 24);
  CHECK(c.count(VertexKind::Nic) == 12);
  REQUIRE(c.count(VertexKind::NetSwitch) == 1);
  VertexId sw = byName(c, "netsw0");
  CHECK(c.vertex(sw).host == kNoHost);
  std::multiset<std::string> peers = networkPeers(c, sw);
  CHECK(peers.size() == 12);
  for (int h = 0; h < 3; ++h)
    for (int k = 0; k < 4; ++k) CHECK(peers.count("h" + std::to_string(h) + "/nic" + std::to_string(k)) == 1);
  CHECK(c.vertex(byName(c, "h2/gpu7")).host == 2);
  Path p = c.path(byName(c, "h0/gpu0"), byName(c, "h2/gpu6"));
  CHECK(p.cls == PathClass::NET);
  // Out through gpu0's NIC (nic0), in through gpu6's (nic3): a single switch joins any two NICs.
  CHECK(namesOf(c, std::vector<VertexId>(p.vertices.begin() + 2, p.vertices.begin() + 5)) ==
        std::vector<std::string>{"h0/nic0", "netsw0", "h2/nic3"});
}

TEST_CASE("cluster: one host, NIC-less nodes, multi-host nodes and bad specs", "[cluster]") {
  Topology node = loadPreset("dgx1");
  SECTION("one host is a cluster with an idle network") {
    Topology one = buildCluster(node, rails(1));
    CHECK(one.count(VertexKind::Gpu) == 8);
    CHECK(one.count(VertexKind::NetSwitch) == 4);
  }
  SECTION("hosts < 1") {
    CHECK(contains(errorOf([&] { buildCluster(node, rails(0)); }), "at least 1 host (got 0)"));
    CHECK(contains(errorOf([&] { buildCluster(node, rails(-3)); }), "dgx1"));
  }
  SECTION("a node without a NIC, named in the message") {
    std::string message = errorOf([&] { buildCluster(withoutNics(node), rails(2)); });
    CHECK(contains(message, "dgx1"));
    CHECK(contains(message, "no NIC"));
  }
  SECTION("a node that already spans hosts") {
    Topology two = buildCluster(node, rails(2));
    CHECK(contains(errorOf([&] { buildCluster(two, rails(2)); }), "several hosts"));
    Topology mixed = node;
    mixed.vertex(byName(mixed, "gpu3")).host = 1;
    CHECK(contains(errorOf([&] { buildCluster(mixed, rails(2)); }), "several hosts"));
  }
  SECTION("inconsistent network specs") {
    ClusterSpec spec = rails(2, -1);
    CHECK(contains(errorOf([&] { buildCluster(node, spec); }), "spines"));
    spec = rails(2, 2);
    spec.network.shape = NetworkShape::SingleSwitch;
    CHECK(contains(errorOf([&] { buildCluster(node, spec); }), "single-switch"));
    spec = rails(2);
    spec.network.nicBandwidthGBs = -1;
    CHECK(contains(errorOf([&] { buildCluster(node, spec); }), "nicBandwidthGBs"));
  }
}

TEST_CASE("cluster: JSON round trip of a cluster keeps the fingerprint", "[cluster]") {
  ClusterSpec spec = rails(3, 2);
  Topology c = buildCluster(loadTopologyFile(dataFile("nccl_azure-ndv4-topo.xml")), spec);
  CHECK(c.count(VertexKind::NetSwitch) == 8 + 2);
  Topology back = parseJson(writeJson(c), "cluster.json");
  CHECK(back.fingerprint() == c.fingerprint());
  CHECK(back.vertexCount() == c.vertexCount());
  CHECK(back.links().size() == c.links().size());
  CHECK(back.vertex(byName(back, "rail7")).host == kNoHost);
  CHECK(back.vertex(byName(back, "h2/nic7")).host == 2);
  CHECK(back.path(byName(back, "h0/gpu0"), byName(back, "h2/gpu0")).cls == PathClass::NET);
  // The fingerprint sees the shape of the network and the number of hosts.
  CHECK(buildCluster(loadPreset("dgx1"), rails(2)).fingerprint() != buildCluster(loadPreset("dgx1"), rails(3)).fingerprint());
  CHECK(buildCluster(loadPreset("dgx1"), rails(2)).fingerprint() != buildCluster(loadPreset("dgx1"), rails(2, 1)).fingerprint());
  CHECK(buildCluster(loadPreset("dgx1"), rails(1)).fingerprint() != loadPreset("dgx1").fingerprint());
}

TEST_CASE("fuse: reports in any order give the same graph, host index = sorted identity", "[cluster]") {
  Topology dgx1 = loadPreset("dgx1");
  Topology ndv4 = loadTopologyFile(dataFile("nccl_azure-ndv4-topo.xml"));
  Topology ndv2 = loadTopologyFile(dataFile("nccl_azure-ndv2-topo.xml"));
  std::vector<HostReport> reports = {{"node-c", dgx1}, {"node-a", ndv4}, {"node-b", ndv2}, {"node-a", ndv4}};
  CHECK(fusedHostOrder(reports) == std::vector<std::string>{"node-a", "node-b", "node-c"});
  FuseOptions options;
  options.network.spines = 1;
  Topology reference = fuseHosts(reports, options);
  CHECK(reference.name == "cluster-x3");
  CHECK(reference.count(VertexKind::Gpu) == 24);
  CHECK(reference.count(VertexKind::Nic) == 8 + 1 + 4);
  CHECK(reference.count(VertexKind::NetSwitch) == 8 + 1);  // as many rails as the widest host has NICs
  // node-a (NDv4, 8 NICs) is host 0, node-b (NDv2, 1 NIC) host 1, node-c (DGX-1) host 2.
  std::map<int, int> nicsPerHost;
  for (VertexId nic : reference.nics()) ++nicsPerHost[reference.vertex(nic).host];
  CHECK(nicsPerHost == std::map<int, int>{{0, 8}, {1, 1}, {2, 4}});
  CHECK(networkPeers(reference, byName(reference, "rail5")).size() == 2);  // host 0's NIC 5 and the spine
  CHECK(reference.path(byName(reference, "h1/gpu7"), byName(reference, "h2/gpu7")).cls == PathClass::NET);

  const unsigned seed = std::random_device{}();
  std::cout << "fuse order test: shuffle seed " << seed << "\n";
  INFO("shuffle seed " << seed);
  std::mt19937 rng(seed);
  for (int round = 0; round < 6; ++round) {
    std::vector<HostReport> shuffled = reports;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    Topology fused = fuseHosts(shuffled, options);
    CHECK(fused.fingerprint() == reference.fingerprint());
    CHECK(fusedHostOrder(shuffled) == fusedHostOrder(reports));
    CHECK(fused.canonicalText() == reference.canonicalText());
  }
  // A different set of reports is a different graph.
  reports[0].host = "node-0";  // now host 0, ahead of node-a
  CHECK(fuseHosts(reports, options).fingerprint() != reference.fingerprint());
}

TEST_CASE("fuse: identical reports of one host collapse, fusing copies equals buildCluster", "[cluster]") {
  Topology dgx1 = loadPreset("dgx1");
  std::vector<HostReport> many;
  for (int rank = 0; rank < 8; ++rank) many.push_back({"alpha", dgx1});
  for (int rank = 0; rank < 8; ++rank) many.push_back({"beta", dgx1});
  FuseOptions options;
  options.name = "two";
  Topology fused = fuseHosts(many, options);
  CHECK(fused.name == "two");
  CHECK(fusedHostOrder(many) == std::vector<std::string>{"alpha", "beta"});
  CHECK(fused.count(VertexKind::Gpu) == 16);
  CHECK(fused.count(VertexKind::Nic) == 8);
  CHECK(fused.fingerprint() == buildCluster(dgx1, rails(2)).fingerprint());
  CHECK(fuseHosts({{"alpha", dgx1}, {"beta", dgx1}}, options).fingerprint() == fused.fingerprint());
}

TEST_CASE("fuse: partial reports of one host unite by bus id", "[cluster]") {
  Topology dgx1 = loadPreset("dgx1");
  Topology expected = buildCluster(dgx1, rails(2));
  // Ranks on "alpha" each see 4 of the 8 GPUs (and the whole PCIe tree and the NICs). A view keeps the
  // NVLinks among its own GPUs only, so the four views together cover every NVLink of the cube-mesh:
  // {0-3} and {4-7} the two quads, {0,1,4,5} and {2,3,6,7} the links between them (0-4 1-5 2-6 3-7).
  auto view = [&](std::set<int> keep) {
    Topology t = dgx1;
    t.removeVertices([&](const Vertex& v, VertexId) { return v.kind == VertexKind::Gpu && !keep.count(v.gpuIndex); });
    REQUIRE(t.count(VertexKind::Gpu) == 4);
    return t;
  };
  std::vector<Topology> views = {view({0, 1, 2, 3}), view({4, 5, 6, 7}), view({0, 1, 4, 5}), view({2, 3, 6, 7})};

  SECTION("two disjoint halves: all 8 GPUs, but no NVLink between the halves") {
    Topology fused = fuseHosts({{"alpha", views[0]}, {"beta", dgx1}, {"alpha", views[1]}}, {});
    CHECK(fused.count(VertexKind::Gpu) == 16);
    CHECK(fused.count(VertexKind::Nic) == 8);
    CHECK(fused.count(VertexKind::PciSwitch) == 8);  // shared devices once, not once per report
    CHECK(fused.linkBetween(byName(fused, "h0/gpu0"), byName(fused, "h0/gpu1")));
    CHECK_FALSE(fused.linkBetween(byName(fused, "h0/gpu0"), byName(fused, "h0/gpu4")));
    CHECK(fused.linkBetween(byName(fused, "h1/gpu0"), byName(fused, "h1/gpu4")));
    CHECK(fused.fingerprint() != expected.fingerprint());
  }
  SECTION("indices that agree are kept; the union is the whole machine, in any order") {
    std::vector<HostReport> reports = {{"beta", dgx1}};
    for (const Topology& v : views) reports.push_back({"alpha", v});
    Topology fused = fuseHosts(reports, {});
    CHECK(fused.count(VertexKind::Gpu) == 16);
    CHECK(fused.count(VertexKind::Nic) == 8);
    CHECK(fused.fingerprint() == expected.fingerprint());
    std::reverse(reports.begin(), reports.end());
    CHECK(fuseHosts(reports, {}).fingerprint() == expected.fingerprint());
  }
  SECTION("each rank numbering its own GPUs from 0 (CUDA_VISIBLE_DEVICES): renumbered in bus id order") {
    std::vector<HostReport> reports = {{"beta", dgx1}};
    for (Topology v : views) {
      // This view's GPUs become 0..3 in bus id order, named after the new index: indices and names collide.
      std::vector<VertexId> gpus = v.gpus();
      std::sort(gpus.begin(), gpus.end(), [&](VertexId a, VertexId b) { return v.vertex(a).busId < v.vertex(b).busId; });
      for (size_t i = 0; i < gpus.size(); ++i) {
        v.vertex(gpus[i]).gpuIndex = static_cast<int>(i);
        v.vertex(gpus[i]).name = "gpu" + std::to_string(i) + "_local";
      }
      reports.push_back({"alpha", v});
    }
    Topology fused = fuseHosts(reports, {});
    CHECK(fused.count(VertexKind::Gpu) == 16);
    // DGX-1's CUDA order is its bus id order, so renumbering restores the whole machine.
    CHECK(fused.fingerprint() == expected.fingerprint());
    std::set<int> indices;
    for (VertexId g : fused.gpus())
      if (fused.vertex(g).host == 0) indices.insert(fused.vertex(g).gpuIndex);
    CHECK(indices == std::set<int>{0, 1, 2, 3, 4, 5, 6, 7});
    VertexId at85 = *fused.findByBusId("0000:85:00.0");  // DGX-1 GPU 4; host 0 holds the first vertex with it
    CHECK(fused.vertex(at85).host == 0);
    CHECK(fused.vertex(at85).gpuIndex == 4);
    std::swap(reports[1], reports[4]);
    std::swap(reports[0], reports[2]);
    CHECK(fuseHosts(reports, {}).fingerprint() == fused.fingerprint());
  }
}

TEST_CASE("fuse: no reports, empty identities and NIC-less hosts are refused by name", "[cluster]") {
  Topology dgx1 = loadPreset("dgx1");
  CHECK(contains(errorOf([&] { fuseHosts({}, {}); }), "no host reports"));
  CHECK(fusedHostOrder({}).empty());
  CHECK(contains(errorOf([&] { fuseHosts({{"a", dgx1}, {"", dgx1}}, {}); }), "empty host identity"));
  CHECK(contains(errorOf([&] { fusedHostOrder({{"", dgx1}}); }), "empty host identity"));
  std::string message = errorOf([&] { fuseHosts({{"a", dgx1}, {"gpu-box-7", withoutNics(dgx1)}}, {}); });
  CHECK(contains(message, "gpu-box-7"));
  CHECK(contains(message, "no NIC"));
  Topology two = buildCluster(dgx1, rails(2));
  CHECK(contains(errorOf([&] { fuseHosts({{"a", two}}, {}); }), "several hosts"));
}

TEST_CASE("host report: serialize then parse keeps the identity and the fingerprint", "[cluster]") {
  HostReport report{"node-17.cluster \"east\"\tboot=3f2a", loadTopologyFile(dataFile("nccl_azure-ndv4-topo.xml"))};
  std::string text = serializeHostReport(report);
  CHECK(text.find('\n') == std::string::npos);  // one line
  CHECK(contains(text, "\"format\":\"topoccl-host-report\""));
  CHECK(contains(text, "\"version\":1"));
  HostReport back = parseHostReport(text);
  CHECK(back.host == report.host);
  CHECK(back.topology.fingerprint() == report.topology.fingerprint());
  CHECK(back.topology.count(VertexKind::Nic) == 8);
  // What ranks gather and fuse from the wire equals what they would fuse locally.
  CHECK(fuseHosts({back, parseHostReport(serializeHostReport({"b", loadPreset("dgx1")}))}, {}).fingerprint() ==
        fuseHosts({report, {"b", loadPreset("dgx1")}}, {}).fingerprint());
  CHECK(contains(errorOf([&] { serializeHostReport({"", loadPreset("dgx1")}); }), "empty"));
}

TEST_CASE("host report: malformed, truncated and foreign reports are clear errors", "[cluster]") {
  std::string good = serializeHostReport({"node-a", loadPreset("dgx1")});
  // Edits at the report's top level, made on the parsed JSON (the embedded topology has a "version" too).
  auto edited = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json doc = nlohmann::json::parse(good);
    edit(doc);
    return doc.dump();
  };
  CHECK(contains(errorOf([&] { parseHostReport(good.substr(0, good.size() / 2)); }), "malformed JSON"));
  CHECK(contains(errorOf([&] { parseHostReport(good.substr(0, good.size() - 1)); }), "truncated"));
  CHECK(contains(errorOf([&] { parseHostReport(""); }), "malformed JSON"));
  CHECK(contains(errorOf([&] { parseHostReport("[1,2]"); }), "expected a JSON object"));
  CHECK(contains(errorOf([&] { parseHostReport(edited([](auto& d) { d["format"] = "topoccl-topology"; })); }),
                 "\"format\" must be \"topoccl-host-report\", got \"topoccl-topology\""));
  CHECK(contains(errorOf([&] { parseHostReport(edited([](auto& d) { d.erase("format"); })); }), "\"format\""));
  CHECK(contains(errorOf([&] { parseHostReport(edited([](auto& d) { d["version"] = 2; })); }),
                 "unsupported \"version\" 2"));
  CHECK(contains(errorOf([&] { parseHostReport(edited([](auto& d) { d["version"] = "1"; })); }), "\"version\""));
  CHECK(contains(errorOf([&] { parseHostReport(edited([](auto& d) { d["host"] = ""; })); }), "\"host\""));
  CHECK(contains(errorOf([&] { parseHostReport(edited([](auto& d) { d["host"] = 7; })); }), "\"host\""));
  CHECK(contains(errorOf([&] { parseHostReport(edited([](auto& d) { d["hostname"] = "x"; })); }),
                 "unknown key 'hostname'"));
  CHECK(contains(errorOf([&] { parseHostReport(edited([](auto& d) { d.erase("topology"); })); }), "\"topology\""));
  // Errors inside the embedded topology name the reporting host.
  std::string broken = errorOf([&] {
    parseHostReport(edited([](auto& d) { d["topology"]["vertices"][3]["kind"] = "tpu"; }));
  });
  CHECK(contains(broken, "node-a"));
  CHECK(contains(broken, "tpu"));
  // The untouched report still parses.
  CHECK(parseHostReport(edited([](auto&) {})).host == "node-a");
}
