// Lower bounds on a collective's time over a topology: printed beside synthesized plans and used to prune
// the synthesizer's search (a candidate whose target beats a bound is infeasible). No algorithm can do
// better than these numbers on the graph they were computed on; some are also achievable (noted below).
//
// The graph (BoundGraph): directed edges with a capacity and a latency alpha (us) between vertices; compute
// vertices are the ranks (rank r = the r-th compute vertex added), every other vertex (NVSwitch, PCIe switch,
// CPU, NIC, network switch) only relays. An NVSwitch is one relay vertex whose GPU<->switch edges carry
// each GPU's port capacity: that models the switch's per-GPU hyperedge (one port per GPU per direction).
// Any relay allowed in the graph only loosens a bound, so every bound here stays valid for real routes.
//
// Units. Edge capacities are GB/s (fromTopology) or multiples of one abstract link (link lists, with
// BoundGraph::unitGBs the GB/s of capacity 1; 1 by default). Bandwidth bounds are given as
//   roundsPerBlock: the time to finish when one block is 1 unit of data and capacity 1 moves 1 unit per
//                   unit time. With unit links this is SCCL's "rounds per chunk" R/C at C = 1 chunk per
//                   block (e.g. DGX-1 all-gather 7/6). A block is the simulator's (simulator.hpp
//                   blockBytes): AllGather / ReduceScatter / AllToAll / Gather / Scatter: bytes / N
//                   (for AllToAll one rank->rank piece; bytes = what each rank sends in all), AllReduce /
//                   Broadcast / Reduce: the whole buffer.
//   seconds:        CollectiveBound::bandwidthUs(bytes) = roundsPerBlock * blockBytes / (unitGBs * 1e3).
// Latency: steps (SCCL's synchronous steps) and alpha-weighted microseconds. The lower bound on time is
// max(latencyUs, bandwidthUs): the two terms are separately achievable, not jointly in general.
//
// Bounds per collective (N ranks; B+(S) = capacity leaving vertex set S, B-(S) = entering it):
//   steps          hop diameter over ranks (from / to the root for rooted collectives). A step is one hop
//                  between ranks: passing through relay vertices (switches, NICs, non-rank devices) does
//                  not add a step. latencyUs: the worst shortest alpha-weighted path.
//   AllGather      LP "min T: per source s a tree capacity x_s(e), flows of 1 from s to every rank within
//                  x_s, sum_s x_s(e) <= cap(e) T"; by Edmonds' branching theorem (switch-free graphs, or
//                  relays with in-capacity = out-capacity) it equals the cut bound
//                  max_{S: S ∩ ranks != 0, ranks ⊄ S} |S ∩ ranks| / B+(S) and is achievable by tree packing.
//                  ReduceScatter: the same on the reversed graph.
//   AllToAll       exact max-concurrent multi-commodity flow LP (unicast, no copying), demand 1 block per
//                  ordered pair; Gather / Scatter: the same LP with demands to / from the root.
//   Broadcast      1 / min_v maxflow(root -> v) (Edmonds: achievable); Reduce on the reversed graph.
//   AllReduce      max(AG/N, RS/N, 1/lambda, 2(N-1)/C) per buffer. lambda = min capacity of a cut with ranks
//                  on both sides (the information bound: every rank must receive M bytes about the others'
//                  data). C = min(total rank egress, total rank ingress) capacity: the combining bound (with
//                  reductions at ranks and no coding every element needs 2(N-1) rank-to-rank partial-sum
//                  transmissions; Chan et al.'s 2(N-1)/N M beta on homogeneous single-port graphs).
//                  (AG + RS)/N, what RS followed by AG achieves, is reported beside it as rsAgRoundsPerBlock.
// Large graphs: when an LP would exceed BoundOptions::maxLpNonzeros, or the solver fails or hits its time
// limit, the cheap cut bound is returned instead (exact = false): cuts around single vertices, each host,
// its complement and, for unicast demands, the first half of the ranks. It is valid but may be looser.
// LP sizes (sparse, primal simplex): AG has N(N-1)E flow columns plus as many coupling rows (E = edges);
// 2 x DGX A100 with all links (16 ranks, 90 vertices, 232 edges) is 76k rows x 58k columns, 222k nonzeros,
// about 1-3 s; the MCF LP groups commodities by source (N E columns) and takes milliseconds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/plan.hpp"
#include "topology/topology.hpp"

namespace topoccl::algo {

struct BoundVertex {
  std::string name{};
  bool compute = false;  // a rank
  int host = 0;          // hosts define the cheap host cuts; topo::kNoHost (-1) for the network's switches
};

struct BoundEdge {
  int from = -1, to = -1;
  double capacity = 0;  // per direction, in the graph's capacity unit
  double alphaUs = 0;
};

// Which topology links fromTopology keeps.
struct LinkFilter {
  bool nvlink = true;           // GPU <-> GPU NVLink
  bool nvswitch = true;         // GPU <-> NVSwitch links
  bool c2c = true;
  bool network = true;          // NIC <-> network switch
  bool pcie = true;
  bool cpuInterconnect = true;
  // With pcie or cpuInterconnect off and network on: still keep the links of Topology::path() from each rank's
  // device to every NIC of its host, so the network stays reachable.
  bool nicAccess = true;

  static LinkFilter all();         // every link (the default)
  static LinkFilter nvlinkOnly();  // NVLink and NVSwitch links only
  static LinkFilter fastFabric();  // TACCL's: NVLink + NVSwitch + network (+ each rank's path to its NICs)
};

// One msccl-style link: `multiplicity` parallel unit links between a and b.
struct LinkListEntry {
  int a = 0, b = 0;
  double multiplicity = 1;
};

class BoundGraph {
 public:
  std::string name{};
  std::string capacityUnit = "links";  // "GB/s" from fromTopology
  double unitGBs = 1;                  // GB/s that capacity 1 stands for (for seconds)

  int addVertex(std::string vertexName, bool compute, int host = 0);
  // A parallel edge (same from, to) adds its capacity to the existing one and keeps the smaller alpha.
  void addEdge(int from, int to, double capacity, double alphaUs = 0);
  void addLink(int a, int b, double capacity, double alphaUs = 0);  // both directions

  int vertexCount() const { return static_cast<int>(vertices_.size()); }
  const BoundVertex& vertex(int v) const { return vertices_.at(static_cast<size_t>(v)); }
  const std::vector<BoundVertex>& vertices() const { return vertices_; }
  const std::vector<BoundEdge>& edges() const { return edges_; }
  int rankCount() const { return static_cast<int>(ranks_.size()); }
  int rankVertex(int rank) const { return ranks_.at(static_cast<size_t>(rank)); }
  const std::vector<int>& rankVertices() const { return ranks_; }
  BoundGraph reversed() const;  // every edge turned around (ReduceScatter, Reduce, Gather duals)
  std::string describe() const;  // vertices and edges, one per line

  // Rank r runs on rankDevice[r] (distinct vertices). Capacities in GB/s, alpha = the link's latency or the
  // cost model's default for its class (so latency bounds compare with CostModel::fromTopology). Relay
  // vertices that lead nowhere (one neighbour) are dropped. Throws Error(ncclInvalidArgument) for an
  // unknown or repeated device.
  static BoundGraph fromTopology(const topo::Topology& topology, const std::vector<topo::VertexId>& rankDevice,
                                 const LinkFilter& filter = LinkFilter::all());
  // n ranks 0..n-1 (all compute); bidirectional: each entry in both directions.
  static BoundGraph fromLinkList(int n, const std::vector<LinkListEntry>& links, bool bidirectional = true,
                                 double alphaUs = 1);
  // msccl's hub_and_spoke(n): n ranks and one switch vertex, each rank <-> switch edge of `portCapacity`
  // (one chunk per round in and out of every GPU port).
  static BoundGraph hubAndSpoke(int n, double portCapacity = 1, double alphaUs = 1);
  static BoundGraph ring(int n, bool bidirectional = true, double alphaUs = 1);
  static BoundGraph fullyConnected(int n, double alphaUs = 1);
  static BoundGraph dgx1LinkList(double alphaUs = 1);  // reference §2.6: 8 doubles, 8 singles

 private:
  std::vector<BoundVertex> vertices_;
  std::vector<BoundEdge> edges_;
  std::vector<int> ranks_;
};

struct BoundOptions {
  double lpTimeLimitSeconds = 60;     // per LP; past it the cut bound is used
  int64_t maxLpNonzeros = 4'000'000;  // larger LPs are not built; the cut bound is used
  bool useLp = true;                  // false: cheap cut bounds only
};

struct BandwidthBound {
  double roundsPerBlock = 0;  // see Units above
  bool exact = false;         // an LP / max-flow optimum, not a cheap cut
  std::string method{};       // "lp-tree-packing", "lp-mcf", "maxflow", "cut", "none"
  std::string detail{};       // the binding cut or term
  int lpRows = 0, lpColumns = 0;
  int64_t lpNonzeros = 0;
  double solveSeconds = 0;    // wall time of the LP (0 without one)
};

// Hops (see above); 0 for one rank. Throws Error(ncclInvalidArgument) when a needed rank is unreachable.
int stepsLowerBound(const BoundGraph& graph, Collective c, int root = 0);
double latencyLowerBoundUs(const BoundGraph& graph, Collective c, int root = 0);

BandwidthBound allGatherBound(const BoundGraph& graph, const BoundOptions& options = {});
BandwidthBound reduceScatterBound(const BoundGraph& graph, const BoundOptions& options = {});
BandwidthBound allToAllBound(const BoundGraph& graph, const BoundOptions& options = {});
BandwidthBound broadcastBound(const BoundGraph& graph, int root);
BandwidthBound reduceBound(const BoundGraph& graph, int root);
BandwidthBound scatterBound(const BoundGraph& graph, int root, const BoundOptions& options = {});
BandwidthBound gatherBound(const BoundGraph& graph, int root, const BoundOptions& options = {});
BandwidthBound allReduceBound(const BoundGraph& graph, const BoundOptions& options = {});
// The cheap closed cut bound alone (never an LP).
BandwidthBound cutBound(const BoundGraph& graph, Collective c, int root = 0);
BandwidthBound bandwidthLowerBound(const BoundGraph& graph, Collective c, int root = 0,
                                   const BoundOptions& options = {});
// Max flow from vertex s to vertex t (capacities as in the graph).
double maxFlow(const BoundGraph& graph, int s, int t);

struct CollectiveBound {
  Collective collective = Collective::AllReduce;
  int nranks = 0;
  int root = 0;
  int steps = 0;
  double latencyUs = 0;
  BandwidthBound bandwidth{};
  double rsAgRoundsPerBlock = 0;  // AllReduce only: what RS then AG achieves (per buffer), not a bound
  double unitGBs = 1;
  std::string capacityUnit{};

  double bandwidthUs(uint64_t bytes) const;  // roundsPerBlock * blockBytes / (unitGBs * 1e3)
  double lowerBoundUs(uint64_t bytes) const;  // max(latencyUs, bandwidthUs(bytes))
  std::string describe() const;               // one line
};

CollectiveBound collectiveBound(const BoundGraph& graph, Collective c, int root = 0, const BoundOptions& options = {});

}  // namespace topoccl::algo
