#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "algorithms/bounds.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/generators.hpp"
#include "algorithms/simulator.hpp"
#include "common/error.hpp"
#include "topology/cluster.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;
using namespace topoccl::algo;

namespace {

double rpb(const BandwidthBound& b) { return b.roundsPerBlock; }

// Brute force over every vertex set S: max |S ∩ ranks| / B+(S) over S holding some but not all ranks.
double bruteForceAllGather(const BoundGraph& g) {
  const int V = g.vertexCount();
  double best = 0;
  for (uint32_t mask = 1; mask + 1 < (1u << V); ++mask) {
    int in = 0;
    for (int r : g.rankVertices()) in += (mask >> r) & 1;
    if (in == 0 || in == g.rankCount()) continue;
    double out = 0;
    for (const BoundEdge& e : g.edges())
      if (((mask >> e.from) & 1) && !((mask >> e.to) & 1)) out += e.capacity;
    best = std::max(best, out > 0 ? in / out : std::numeric_limits<double>::infinity());
  }
  return best;
}

// Brute force for scatter from `root` (single source, so max-flow min-cut): max over S containing the
// root of |ranks outside S| / B+(S); and for broadcast: 1 / min B+(S) over S containing the root, missing a rank.
void bruteForceRooted(const BoundGraph& g, int root, double& scatter, double& broadcast) {
  const int V = g.vertexCount();
  scatter = 0;
  double minCut = std::numeric_limits<double>::infinity();
  const int rootV = g.rankVertex(root);
  for (uint32_t mask = 1; mask + 1 < (1u << V); ++mask) {
    if (!((mask >> rootV) & 1)) continue;
    int outside = 0;
    for (int r : g.rankVertices()) outside += !((mask >> r) & 1);
    if (outside == 0) continue;
    double out = 0;
    for (const BoundEdge& e : g.edges())
      if (((mask >> e.from) & 1) && !((mask >> e.to) & 1)) out += e.capacity;
    scatter = std::max(scatter, outside / out);
    minCut = std::min(minCut, out);
  }
  broadcast = 1 / minCut;
}

std::vector<topo::VertexId> allGpus(const topo::Topology& t) {
  std::vector<topo::VertexId> gpus;
  for (topo::VertexId v = 0; v < t.vertexCount(); ++v)
    if (t.vertex(v).kind == topo::VertexKind::Gpu) gpus.push_back(v);
  return gpus;
}

}  // namespace

TEST_CASE("DGX-1 link list: steps 2, AG 7/6, A2A 8/3, broadcast 1/6, scatter 7/6", "[bounds]") {
  const BoundGraph g = BoundGraph::dgx1LinkList();
  CHECK(stepsLowerBound(g, Collective::AllGather) == 2);
  CHECK(stepsLowerBound(g, Collective::AllToAll) == 2);
  CHECK(stepsLowerBound(g, Collective::ReduceScatter) == 2);
  CHECK(latencyLowerBoundUs(g, Collective::AllGather) == Approx(2));

  const BandwidthBound ag = allGatherBound(g);
  INFO(ag.detail);
  CHECK(ag.method == "lp-tree-packing");
  CHECK(ag.exact);
  CHECK(rpb(ag) == Approx(7.0 / 6).epsilon(1e-9));
  CHECK(rpb(reduceScatterBound(g)) == Approx(7.0 / 6).epsilon(1e-9));
  CHECK(rpb(gatherBound(g, 0)) == Approx(7.0 / 6).epsilon(1e-9));

  const BandwidthBound a2a = allToAllBound(g);
  INFO(a2a.detail);
  CHECK(a2a.method == "lp-mcf");
  CHECK(rpb(a2a) == Approx(8.0 / 3).epsilon(1e-9));
  CHECK(rpb(a2a) >= 8.0 / 3 - 1e-9);  // never SCCL's loose 5/3

  for (int root = 0; root < 8; ++root) {
    CHECK(rpb(broadcastBound(g, root)) == Approx(1.0 / 6));
    CHECK(rpb(reduceBound(g, root)) == Approx(1.0 / 6));
    CHECK(rpb(scatterBound(g, root)) == Approx(7.0 / 6).epsilon(1e-9));
  }
  // AllReduce: every rank must take in M bytes through 6 links (1/6), but every element needs 2(N-1) = 14
  // partial-sum transmissions over the ranks' 8 x 6 links: 14/48, which RS+AG achieves (2 * 7/6 / 8).
  const CollectiveBound ar = collectiveBound(g, Collective::AllReduce);
  CHECK(ar.bandwidth.roundsPerBlock == Approx(14.0 / 48));
  CHECK(ar.rsAgRoundsPerBlock == Approx(2 * 7.0 / 6 / 8));
  CHECK(rpb(cutBound(g, Collective::AllReduce)) == Approx(14.0 / 48));
  {
    // Two 4-rank cliques joined by one slow link: the information bound (1/0.25 across it) rules instead.
    std::vector<LinkListEntry> links;
    for (int h = 0; h < 2; ++h)
      for (int a = 0; a < 4; ++a)
        for (int b = a + 1; b < 4; ++b) links.push_back({4 * h + a, 4 * h + b, 1.0});
    links.push_back({0, 4, 0.25});
    const BoundGraph dumbbell = BoundGraph::fromLinkList(8, links);
    const CollectiveBound d = collectiveBound(dumbbell, Collective::AllReduce);
    CHECK(d.bandwidth.roundsPerBlock == Approx(4.0));
    CHECK(d.bandwidth.detail.find("combining") != std::string::npos);
  }
  std::cout << "[bounds] " << ar.describe() << "\n";

  // Seconds: T >= (7/6) L beta with L the per-rank shard; 8 shards of 6000 bytes at 1 GB/s per link.
  const CollectiveBound agb = collectiveBound(g, Collective::AllGather);
  CHECK(agb.bandwidthUs(48000) == Approx(7.0 / 6 * 6000 / 1e3));
  std::cout << "[bounds] " << agb.describe() << "\n";
  std::cout << "[bounds] " << collectiveBound(g, Collective::AllToAll).describe() << "\n";

  // The cheap cuts: the ingress cut is AG's, the socket cut ({0,1,2,3}) A2A's.
  CHECK(rpb(cutBound(g, Collective::AllGather)) == Approx(7.0 / 6));
  CHECK(rpb(cutBound(g, Collective::AllToAll)) == Approx(8.0 / 3));
  BoundOptions noLp;
  noLp.useLp = false;
  CHECK(allGatherBound(g, noLp).method == "cut");
  CHECK_FALSE(allToAllBound(g, noLp).exact);
}

TEST_CASE("rings, fully connected and hub-and-spoke give the closed forms", "[bounds]") {
  const BoundGraph ring8 = BoundGraph::ring(8, true);
  CHECK(stepsLowerBound(ring8, Collective::AllGather) == 4);
  CHECK(rpb(allGatherBound(ring8)) == Approx(7.0 / 2));
  // A2A on the bidirectional ring of 8: 8 rounds per M/8 piece, i.e. T >= M beta.
  const CollectiveBound a2a = collectiveBound(ring8, Collective::AllToAll);
  CHECK(a2a.bandwidth.roundsPerBlock == Approx(8));
  CHECK(a2a.bandwidthUs(8000) == Approx(8000 / 1e3));
  CHECK(rpb(cutBound(ring8, Collective::AllToAll)) == Approx(8));

  const BoundGraph uni8 = BoundGraph::ring(8, false);
  CHECK(stepsLowerBound(uni8, Collective::AllGather) == 7);
  CHECK(rpb(allGatherBound(uni8)) == Approx(7));

  const BoundGraph fc8 = BoundGraph::fullyConnected(8);
  CHECK(stepsLowerBound(fc8, Collective::AllGather) == 1);
  CHECK(rpb(allGatherBound(fc8)) == Approx(1));

  const BoundGraph ring4 = BoundGraph::ring(4, true);
  CHECK(rpb(allGatherBound(ring4)) == Approx(3.0 / 2));
  CHECK(rpb(allToAllBound(ring4)) == Approx(2));

  for (int n : {4, 8}) {
    const BoundGraph hub = BoundGraph::hubAndSpoke(n);
    CHECK(stepsLowerBound(hub, Collective::AllGather) == 1);
    CHECK(latencyLowerBoundUs(hub, Collective::AllGather) == Approx(1));
    CHECK(rpb(allGatherBound(hub)) == Approx(n - 1));
    CHECK(rpb(allToAllBound(hub)) == Approx(n - 1));
  }

  const BoundGraph one = BoundGraph::ring(1);
  CHECK(stepsLowerBound(one, Collective::AllReduce) == 0);
  CHECK(rpb(allReduceBound(one)) == 0);

  // A disconnected graph, a bad root and a repeated device are errors.
  const BoundGraph cut = BoundGraph::fromLinkList(4, {{0, 1, 1}, {2, 3, 1}});
  CHECK_THROWS_AS(stepsLowerBound(cut, Collective::AllGather), Error);
  CHECK_THROWS_AS(allGatherBound(cut), Error);
  CHECK_THROWS_AS(broadcastBound(ring8, 8), Error);
  const topo::Topology dgx = topo::loadPreset("dgx1");
  CHECK_THROWS_AS(BoundGraph::fromTopology(dgx, {dgx.gpus()[0], dgx.gpus()[0]}), Error);
}

TEST_CASE("the DGX-1 preset, NVLink only, gives 7/6 shard per NVLink bandwidth", "[bounds]") {
  const topo::Topology t = topo::loadPreset("dgx1");
  const double link = topo::nvlinkBandwidthPerLinkGBs(70);
  const BoundGraph nv = BoundGraph::fromTopology(t, t.gpus(), LinkFilter::nvlinkOnly());
  CHECK(nv.vertexCount() == 8);
  CHECK(nv.edges().size() == 32);
  CHECK(stepsLowerBound(nv, Collective::AllGather) == 2);
  const CollectiveBound ag = collectiveBound(nv, Collective::AllGather);
  CHECK(ag.bandwidth.roundsPerBlock == Approx(7.0 / 6 / link).epsilon(1e-9));
  // 8 shards of 1 MB: (7/6) * 1 MB / 20 GB/s.
  CHECK(ag.bandwidthUs(8'000'000) == Approx(7.0 / 6 * 1e6 / (link * 1e3)).epsilon(1e-9));
  CHECK(rpb(allToAllBound(nv)) == Approx(8.0 / 3 / link).epsilon(1e-9));
  std::cout << "[bounds] dgx1 preset NVLink: " << ag.describe() << "\n";

  // All links: PCIe adds capacity, so the bound can only drop, and every pair is one step apart.
  const BoundGraph all = BoundGraph::fromTopology(t, t.gpus());
  CHECK(stepsLowerBound(all, Collective::AllGather) == 1);
  CHECK(rpb(allGatherBound(all)) <= ag.bandwidth.roundsPerBlock + 1e-12);
  CHECK(rpb(allGatherBound(all)) > 0);
}

TEST_CASE("NDv2 x2: the all-gather bound is the single NIC of each host", "[bounds]") {
  const topo::Topology node = topo::loadPreset("ndv2");
  const topo::Topology cluster = topo::buildCluster(node, topo::ClusterSpec{.hosts = 2});
  const std::vector<topo::VertexId> ranks = allGpus(cluster);
  REQUIRE(ranks.size() == 16);
  double nicGBs = 0;
  for (const topo::Link& l : cluster.links())
    if (l.kind == topo::LinkKind::Network && cluster.vertex(l.from).kind == topo::VertexKind::Nic) nicGBs = l.bandwidthGBs;
  REQUIRE(nicGBs > 0);
  for (const LinkFilter& filter : {LinkFilter::all(), LinkFilter::fastFabric()}) {
    const BoundGraph g = BoundGraph::fromTopology(cluster, ranks, filter);
    const BandwidthBound ag = allGatherBound(g);
    INFO(ag.detail);
    CHECK(ag.exact);
    // Each host must receive the other host's 8 shards over one NIC.
    CHECK(rpb(ag) == Approx(8 / nicGBs).epsilon(1e-7));
    CHECK(rpb(cutBound(g, Collective::AllGather)) == Approx(8 / nicGBs).epsilon(1e-9));
    // A2A: 8 x 8 pieces each way over one NIC.
    CHECK(rpb(allToAllBound(g)) == Approx(64 / nicGBs).epsilon(1e-7));
    // Past the LP size threshold the cheap host cut gives the same number here.
    BoundOptions small;
    small.maxLpNonzeros = 1000;
    const BandwidthBound cheap = allGatherBound(g, small);
    CHECK(cheap.method == "cut");
    CHECK_FALSE(cheap.exact);
    CHECK(rpb(cheap) == Approx(8 / nicGBs));
    std::cout << "[bounds] ndv2 x2 (" << g.vertexCount() << " vertices, " << g.edges().size() << " edges): AG "
              << rpb(ag) << " (" << ag.detail << "), LP " << ag.lpRows << "x" << ag.lpColumns << " nnz "
              << ag.lpNonzeros << " in " << ag.solveSeconds << " s\n";
  }
}

TEST_CASE("random small graphs: the AG LP equals the brute-force cut bound", "[bounds]") {
  const uint32_t seed = std::random_device{}();
  std::cout << "[bounds] random graphs seed " << seed << "\n";
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 24; ++trial) {
    const int mode = trial % 3;  // 0: directed, all ranks; 1: symmetric with relays; 2: directed with relays
    const int V = uniform(3, 8);
    const int nRanks = mode == 0 ? V : uniform(2, V);
    BoundGraph g;
    g.name = "random" + std::to_string(trial);
    // Ranks first (vertex id = rank), relays after.
    for (int v = 0; v < V; ++v) g.addVertex("", v < nRanks);
    if (mode == 1) {
      for (int v = 1; v < V; ++v) g.addLink(v, uniform(0, v - 1), uniform(1, 4));  // a spanning tree
      for (int k = uniform(0, V); k > 0; --k) {
        const int a = uniform(0, V - 1), b = uniform(0, V - 1);
        if (a != b) g.addLink(a, b, uniform(1, 4));
      }
    } else {
      std::vector<int> order(static_cast<size_t>(V));
      for (int v = 0; v < V; ++v) order[static_cast<size_t>(v)] = v;
      std::shuffle(order.begin(), order.end(), rng);
      for (int v = 0; v < V; ++v)  // a directed Hamiltonian cycle keeps it strongly connected
        g.addEdge(order[static_cast<size_t>(v)], order[static_cast<size_t>((v + 1) % V)], uniform(1, 4));
      for (int k = uniform(0, 2 * V); k > 0; --k) {
        const int a = uniform(0, V - 1), b = uniform(0, V - 1);
        if (a != b) g.addEdge(a, b, uniform(1, 4));
      }
    }
    INFO("trial " << trial << " mode " << mode << "\n" << g.describe());
    const double brute = bruteForceAllGather(g);
    const BandwidthBound lp = allGatherBound(g);
    REQUIRE(lp.exact);
    // Edmonds: equal on rank-only graphs and with balanced relays; the LP is never below a cut.
    if (mode != 2) CHECK(rpb(lp) == Approx(brute).epsilon(1e-7));
    else CHECK(rpb(lp) >= brute * (1 - 1e-7));
    CHECK(rpb(cutBound(g, Collective::AllGather)) <= rpb(lp) * (1 + 1e-9));
    if (mode != 2) CHECK(rpb(reduceScatterBound(g)) == Approx(bruteForceAllGather(g.reversed())).epsilon(1e-7));

    // Rooted: scatter is a single-source flow (exact min cut), broadcast Edmonds' max-flow.
    const int root = uniform(0, nRanks - 1);
    double scatter = 0, broadcast = 0;
    bruteForceRooted(g, root, scatter, broadcast);
    CHECK(rpb(scatterBound(g, root)) == Approx(scatter).epsilon(1e-7));
    CHECK(rpb(broadcastBound(g, root)) == Approx(broadcast).epsilon(1e-9));
    // Every cheap cut and the A2A LP are consistent.
    CHECK(rpb(cutBound(g, Collective::AllToAll)) <= rpb(allToAllBound(g)) * (1 + 1e-9));
    CHECK(rpb(allToAllBound(g)) >= rpb(lp) * (1 - 1e-9) - 1e-12);  // unicast carries at least AG's data
  }
}

TEST_CASE("every bound is below the simulated ring / direct plan on DGX-1 and on 2 DGX-1s", "[bounds]") {
  const topo::Topology dgx = topo::loadPreset("dgx1");
  const topo::Topology two = topo::buildCluster(dgx, topo::ClusterSpec{.hosts = 2});
  for (const topo::Topology* t : {&dgx, &two}) {
    const std::vector<topo::VertexId> ranks = allGpus(*t);
    const int n = static_cast<int>(ranks.size());
    const BoundGraph g = BoundGraph::fromTopology(*t, ranks);
    const CostModel model = CostModel::fromTopology(*t, ranks);
    const Collective all[] = {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                              Collective::Broadcast, Collective::Reduce,    Collective::AllToAll,
                              Collective::Gather,    Collective::Scatter};
    for (Collective c : all) {
      const auto start = std::chrono::steady_clock::now();
      const CollectiveBound b = collectiveBound(g, c, 0);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::cout << "[bounds] " << t->name << " (" << g.vertexCount() << " vertices, " << g.edges().size()
                << " edges, " << seconds << " s): " << b.describe() << "\n";
      const bool ring = algorithmSupports(Algorithm::Ring, c);
      for (int channels : {1, 2}) {
        const Plan plan = ring ? ringPlan(c, n, 0, channels) : directPlan(c, n, 0, 1);
        for (uint64_t bytes : {uint64_t{1} << 10, uint64_t{1} << 20, uint64_t{64} << 20}) {
          const double sim = simulate(plan, bytes, model, {.slices = 4, .recordEvents = false}).finishUs;
          INFO(t->name << " " << collectiveName(c) << " " << plan.name << " " << bytes << " bytes: bound "
                       << b.lowerBoundUs(bytes) << " us, simulated " << sim << " us");
          CHECK(b.lowerBoundUs(bytes) <= sim * (1 + 1e-9));
          CHECK(b.bandwidthUs(bytes) > 0);
        }
        if (!ring) break;
      }
    }
  }
}

TEST_CASE("timing: the LPs on two DGX A100s (16 GPUs)", "[bounds]") {
  const topo::Topology cluster = topo::buildCluster(topo::loadPreset("dgx-a100"), topo::ClusterSpec{.hosts = 2});
  const std::vector<topo::VertexId> ranks = allGpus(cluster);
  REQUIRE(ranks.size() == 16);
  for (const LinkFilter& filter : {LinkFilter::fastFabric(), LinkFilter::all()}) {
    const BoundGraph g = BoundGraph::fromTopology(cluster, ranks, filter);
    const BandwidthBound ag = allGatherBound(g);
    const BandwidthBound a2a = allToAllBound(g);
    const BandwidthBound cut = cutBound(g, Collective::AllGather);
    std::cout << "[bounds] dgx-a100 x2 " << (filter.pcie ? "all links" : "fast fabric") << " (" << g.vertexCount()
              << " vertices, " << g.edges().size() << " edges):\n  AG " << rpb(ag) << " s/GB per shard ("
              << ag.method << ", LP " << ag.lpRows << " rows x " << ag.lpColumns << " cols, nnz " << ag.lpNonzeros
              << ", " << ag.solveSeconds << " s; " << ag.detail << ")\n  A2A " << rpb(a2a) << " (" << a2a.method
              << ", LP " << a2a.lpRows << " x " << a2a.lpColumns << ", " << a2a.solveSeconds << " s)\n  AG cut "
              << rpb(cut) << "\n";
    CHECK(rpb(ag) >= rpb(cut) * (1 - 1e-9));
    CHECK(rpb(a2a) >= rpb(cutBound(g, Collective::AllToAll)) * (1 - 1e-9));
  }
}
