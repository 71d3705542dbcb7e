#include "algorithms/bounds.hpp"

#include <ClpSimplex.hpp>
#include <CoinPackedMatrix.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <sstream>

#include "algorithms/cost_model.hpp"
#include "algorithms/simulator.hpp"
#include "common/error.hpp"

namespace topoccl::algo {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string fmt(double x) {
  std::ostringstream out;
  out.precision(6);
  out << x;
  return out.str();
}

// ---------------------------------------------------------------------------------------------------
// Max flow (Dinic, double capacities).

class FlowNetwork {
 public:
  explicit FlowNetwork(int n) : adj_(static_cast<size_t>(n)) {}
  void add(int u, int v, double cap) {
    adj_[static_cast<size_t>(u)].push_back({v, cap, static_cast<int>(adj_[static_cast<size_t>(v)].size())});
    adj_[static_cast<size_t>(v)].push_back({u, 0, static_cast<int>(adj_[static_cast<size_t>(u)].size()) - 1});
  }
  double run(int s, int t) {
    if (s == t) return kInf;
    double total = 0;
    const size_t n = adj_.size();
    while (true) {
      std::vector<int> level(n, -1);
      std::queue<int> q;
      level[static_cast<size_t>(s)] = 0;
      q.push(s);
      while (!q.empty()) {
        const int u = q.front();
        q.pop();
        for (const Arc& a : adj_[static_cast<size_t>(u)]) {
          if (a.cap > kEps && level[static_cast<size_t>(a.to)] < 0) {
            level[static_cast<size_t>(a.to)] = level[static_cast<size_t>(u)] + 1;
            q.push(a.to);
          }
        }
      }
      if (level[static_cast<size_t>(t)] < 0) break;
      std::vector<size_t> it(n, 0);
      const std::function<double(int, double)> push = [&](int u, double f) -> double {
        if (u == t) return f;
        auto& arcs = adj_[static_cast<size_t>(u)];
        for (size_t& i = it[static_cast<size_t>(u)]; i < arcs.size(); ++i) {
          Arc& a = arcs[i];
          if (a.cap <= kEps || level[static_cast<size_t>(a.to)] != level[static_cast<size_t>(u)] + 1) continue;
          const double got = push(a.to, std::min(f, a.cap));
          if (got > kEps) {
            a.cap -= got;
            adj_[static_cast<size_t>(a.to)][static_cast<size_t>(a.rev)].cap += got;
            return got;
          }
        }
        return 0;
      };
      while (true) {
        const double f = push(s, kInf);
        if (f <= kEps) break;
        total += f;
      }
    }
    return total;
  }

 private:
  static constexpr double kEps = 1e-12;
  struct Arc {
    int to;
    double cap;
    int rev;
  };
  std::vector<std::vector<Arc>> adj_;
};

// ---------------------------------------------------------------------------------------------------
// Sparse LP in triplets, solved by CLP.

struct SparseLp {
  std::vector<double> rowLb, rowUb, colLb, colUb, obj;
  std::vector<int> tRow, tCol;
  std::vector<double> tVal;
  int addRow(double lb, double ub) {
    rowLb.push_back(lb);
    rowUb.push_back(ub);
    return static_cast<int>(rowLb.size()) - 1;
  }
  int addColumn(double objective, double lb = 0, double ub = kInf) {
    obj.push_back(objective);
    colLb.push_back(lb);
    colUb.push_back(ub);
    return static_cast<int>(obj.size()) - 1;
  }
  void set(int row, int col, double value) {
    tRow.push_back(row);
    tCol.push_back(col);
    tVal.push_back(value);
  }
  // Minimizes; returns false unless proven optimal within the time limit.
  bool solve(double timeLimitSeconds, double& objective, BandwidthBound& info) {
    const auto start = std::chrono::steady_clock::now();
    info.lpRows = static_cast<int>(rowLb.size());
    info.lpColumns = static_cast<int>(obj.size());
    info.lpNonzeros = static_cast<int64_t>(tVal.size());
    std::vector<double> rl = rowLb, ru = rowUb, cl = colLb, cu = colUb;
    for (double& x : rl) if (std::isinf(x)) x = -COIN_DBL_MAX;
    for (double& x : ru) if (std::isinf(x)) x = COIN_DBL_MAX;
    for (double& x : cu) if (std::isinf(x)) x = COIN_DBL_MAX;
    CoinPackedMatrix matrix(true, tRow.data(), tCol.data(), tVal.data(), static_cast<CoinBigIndex>(tVal.size()));
    // Trailing empty columns / rows are not seen by the triplet constructor.
    matrix.setDimensions(info.lpRows, info.lpColumns);
    ClpSimplex model;
    model.setLogLevel(0);
    model.messageHandler()->setLogLevel(0);
    model.loadProblem(matrix, cl.data(), cu.data(), obj.data(), rl.data(), ru.data());
    model.setOptimizationDirection(1);
    model.setMaximumSeconds(timeLimitSeconds);
    // Primal simplex: on the tree-packing LPs of 16-GPU clusters it is 10-30x faster than dual or the default.
    model.primal();
    info.solveSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!model.isProvenOptimal()) return false;
    objective = model.objectiveValue();
    return true;
  }
};

// ---------------------------------------------------------------------------------------------------

void requireRoot(const BoundGraph& graph, int root) {
  if (root < 0 || root >= graph.rankCount()) {
    throwInvalidArgument("bounds: root " + std::to_string(root) + " is not one of the " +
                         std::to_string(graph.rankCount()) + " ranks of graph '" + graph.name + "'");
  }
}

bool rootless(Collective c) {
  return c == Collective::AllReduce || c == Collective::AllGather || c == Collective::ReduceScatter ||
         c == Collective::AllToAll;
}

// Which (src rank, dst rank) pairs must be connected.
std::vector<std::pair<int, int>> neededPairs(int n, Collective c, int root) {
  std::vector<std::pair<int, int>> pairs;
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      const bool fromRoot = c == Collective::Broadcast || c == Collective::Scatter;
      const bool toRoot = c == Collective::Reduce || c == Collective::Gather;
      if ((fromRoot && s != root) || (toRoot && d != root)) continue;
      pairs.emplace_back(s, d);
    }
  }
  return pairs;
}

std::vector<std::vector<const BoundEdge*>> outEdges(const BoundGraph& g) {
  std::vector<std::vector<const BoundEdge*>> out(static_cast<size_t>(g.vertexCount()));
  for (const BoundEdge& e : g.edges())
    if (e.capacity > 0) out[static_cast<size_t>(e.from)].push_back(&e);
  return out;
}

[[noreturn]] void throwUnreachable(const BoundGraph& g, int s, int d) {
  throwInvalidArgument("bounds: rank " + std::to_string(s) + " (" + g.vertex(g.rankVertex(s)).name +
                       ") cannot reach rank " + std::to_string(d) + " (" + g.vertex(g.rankVertex(d)).name +
                       ") in graph '" + g.name + "'");
}

double capacityOut(const BoundGraph& g, const std::vector<bool>& inS) {
  double b = 0;
  for (const BoundEdge& e : g.edges())
    if (inS[static_cast<size_t>(e.from)] && !inS[static_cast<size_t>(e.to)]) b += e.capacity;
  return b;
}

// Candidate cuts of the cheap bound: each rank alone, all but each rank, each host and its complement, and
// (for unicast) the first half of the ranks.
std::vector<std::pair<std::vector<bool>, std::string>> candidateCuts(const BoundGraph& g, bool halves) {
  const auto V = static_cast<size_t>(g.vertexCount());
  std::vector<std::pair<std::vector<bool>, std::string>> cuts;
  for (int r = 0; r < g.rankCount(); ++r) {
    std::vector<bool> s(V, false);
    s[static_cast<size_t>(g.rankVertex(r))] = true;
    cuts.emplace_back(s, "{" + g.vertex(g.rankVertex(r)).name + "}");
    s.flip();
    cuts.emplace_back(s, "all but " + g.vertex(g.rankVertex(r)).name);
  }
  std::set<int> hosts;
  for (int r = 0; r < g.rankCount(); ++r) hosts.insert(g.vertex(g.rankVertex(r)).host);
  if (hosts.size() > 1) {
    for (int h : hosts) {
      std::vector<bool> s(V, false);
      for (size_t v = 0; v < V; ++v) s[v] = g.vertices()[v].host == h;
      cuts.emplace_back(s, "host " + std::to_string(h));
      s.flip();
      cuts.emplace_back(s, "all but host " + std::to_string(h));
    }
  }
  if (halves && g.rankCount() >= 4) {
    std::vector<bool> s(V, false);
    for (int r = 0; r < g.rankCount() / 2; ++r) s[static_cast<size_t>(g.rankVertex(r))] = true;
    cuts.emplace_back(s, "ranks 0.." + std::to_string(g.rankCount() / 2 - 1));
  }
  return cuts;
}

// max over candidate S of (blocks that must leave S) / B+(S). `blocks(S)` gives the numerator.
BandwidthBound cheapCut(const BoundGraph& g, bool halves, const std::function<double(const std::vector<bool>&)>& blocks) {
  BandwidthBound best;
  best.method = "cut";
  for (const auto& [s, label] : candidateCuts(g, halves)) {
    const double need = blocks(s);
    if (need <= 0) continue;
    const double cap = capacityOut(g, s);
    const double value = cap > 0 ? need / cap : kInf;
    if (value > best.roundsPerBlock) {
      best.roundsPerBlock = value;
      best.detail = "cut " + label + ": " + fmt(need) + " blocks over " + fmt(cap);
    }
  }
  return best;
}

std::vector<bool> rankMask(const BoundGraph& g, const std::vector<bool>& s) {
  std::vector<bool> m(static_cast<size_t>(g.rankCount()));
  for (int r = 0; r < g.rankCount(); ++r) m[static_cast<size_t>(r)] = s[static_cast<size_t>(g.rankVertex(r))];
  return m;
}

BandwidthBound allGatherCut(const BoundGraph& g) {
  return cheapCut(g, false, [&](const std::vector<bool>& s) {
    const auto m = rankMask(g, s);
    const auto in = std::count(m.begin(), m.end(), true);
    return (in == 0 || in == static_cast<long>(m.size())) ? 0.0 : static_cast<double>(in);
  });
}

// demand[s][d] blocks from rank s to rank d.
using Demand = std::vector<std::vector<double>>;

BandwidthBound unicastCut(const BoundGraph& g, const Demand& demand) {
  return cheapCut(g, true, [&](const std::vector<bool>& s) {
    const auto m = rankMask(g, s);
    double need = 0;
    for (size_t a = 0; a < m.size(); ++a)
      for (size_t b = 0; b < m.size(); ++b)
        if (m[a] && !m[b]) need += demand[a][b];
    return need;
  });
}

void checkConnected(const BoundGraph& g, Collective c, int root) { (void)stepsLowerBound(g, c, root); }

// The AllGather tree-packing LP (see the header). Returns false when it is too large or not solved.
bool allGatherLp(const BoundGraph& g, const BoundOptions& options, BandwidthBound& out) {
  const int n = g.rankCount();
  const int V = g.vertexCount();
  std::vector<const BoundEdge*> edges;
  for (const BoundEdge& e : g.edges())
    if (e.capacity > 0) edges.push_back(&e);
  const int E = static_cast<int>(edges.size());
  const int64_t estimate = static_cast<int64_t>(n) * (n - 1) * E * 4 + static_cast<int64_t>(n) * E * 2 + E;
  out.lpNonzeros = estimate;
  if (!options.useLp || estimate > options.maxLpNonzeros) return false;

  SparseLp lp;
  const int tCol = lp.addColumn(1);
  std::vector<int> capRow(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    capRow[static_cast<size_t>(e)] = lp.addRow(-kInf, 0);
    lp.set(capRow[static_cast<size_t>(e)], tCol, -edges[static_cast<size_t>(e)]->capacity);
  }
  for (int si = 0; si < n; ++si) {
    const int s = g.rankVertex(si);
    // x_s(e) for edges not entering s.
    std::vector<int> xCol(static_cast<size_t>(E), -1);
    for (int e = 0; e < E; ++e) {
      if (edges[static_cast<size_t>(e)]->to == s) continue;
      xCol[static_cast<size_t>(e)] = lp.addColumn(0);
      lp.set(capRow[static_cast<size_t>(e)], xCol[static_cast<size_t>(e)], 1);
    }
    for (int di = 0; di < n; ++di) {
      if (di == si) continue;
      const int d = g.rankVertex(di);
      // Conservation rows at every vertex but s: inflow - outflow = [v == d].
      std::vector<int> consRow(static_cast<size_t>(V), -1);
      for (int v = 0; v < V; ++v)
        if (v != s) consRow[static_cast<size_t>(v)] = lp.addRow(v == d ? 1 : 0, v == d ? 1 : 0);
      for (int e = 0; e < E; ++e) {
        const BoundEdge& edge = *edges[static_cast<size_t>(e)];
        if (edge.to == s || edge.from == d) continue;
        const int f = lp.addColumn(0);
        const int couple = lp.addRow(-kInf, 0);  // f - x_s(e) <= 0
        lp.set(couple, f, 1);
        lp.set(couple, xCol[static_cast<size_t>(e)], -1);
        lp.set(consRow[static_cast<size_t>(edge.to)], f, 1);
        if (edge.from != s) lp.set(consRow[static_cast<size_t>(edge.from)], f, -1);
      }
    }
  }
  double value = 0;
  const bool ok = lp.solve(options.lpTimeLimitSeconds, value, out);
  if (!ok) return false;
  out.roundsPerBlock = value;
  out.exact = true;
  out.method = "lp-tree-packing";
  return true;
}

// Max-concurrent multi-commodity flow LP, commodities grouped by source (one source, many sinks is a
// single-commodity flow).
bool unicastLp(const BoundGraph& g, const Demand& demand, const BoundOptions& options, BandwidthBound& out) {
  const int n = g.rankCount();
  const int V = g.vertexCount();
  std::vector<const BoundEdge*> edges;
  for (const BoundEdge& e : g.edges())
    if (e.capacity > 0) edges.push_back(&e);
  const int E = static_cast<int>(edges.size());
  std::vector<int> sources;
  for (int s = 0; s < n; ++s) {
    double total = 0;
    for (int d = 0; d < n; ++d) total += demand[static_cast<size_t>(s)][static_cast<size_t>(d)];
    if (total > 0) sources.push_back(s);
  }
  const int64_t estimate = static_cast<int64_t>(sources.size()) * E * 3 + E;
  out.lpNonzeros = estimate;
  if (!options.useLp || estimate > options.maxLpNonzeros) return false;

  SparseLp lp;
  const int tCol = lp.addColumn(1);
  std::vector<int> capRow(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    capRow[static_cast<size_t>(e)] = lp.addRow(-kInf, 0);
    lp.set(capRow[static_cast<size_t>(e)], tCol, -edges[static_cast<size_t>(e)]->capacity);
  }
  std::vector<double> vertexDemand(static_cast<size_t>(V));
  for (int si : sources) {
    const int s = g.rankVertex(si);
    std::fill(vertexDemand.begin(), vertexDemand.end(), 0.0);
    for (int di = 0; di < n; ++di)
      vertexDemand[static_cast<size_t>(g.rankVertex(di))] += demand[static_cast<size_t>(si)][static_cast<size_t>(di)];
    std::vector<int> consRow(static_cast<size_t>(V), -1);
    for (int v = 0; v < V; ++v)
      if (v != s) consRow[static_cast<size_t>(v)] = lp.addRow(vertexDemand[static_cast<size_t>(v)], vertexDemand[static_cast<size_t>(v)]);
    for (int e = 0; e < E; ++e) {
      const BoundEdge& edge = *edges[static_cast<size_t>(e)];
      if (edge.to == s) continue;
      const int f = lp.addColumn(0);
      lp.set(capRow[static_cast<size_t>(e)], f, 1);
      lp.set(consRow[static_cast<size_t>(edge.to)], f, 1);
      if (edge.from != s) lp.set(consRow[static_cast<size_t>(edge.from)], f, -1);
    }
  }
  double value = 0;
  if (!lp.solve(options.lpTimeLimitSeconds, value, out)) return false;
  out.roundsPerBlock = value;
  out.exact = true;
  out.method = "lp-mcf";
  return true;
}

BandwidthBound unicastBound(const BoundGraph& g, const Demand& demand, const BoundOptions& options) {
  BandwidthBound cut = unicastCut(g, demand);
  BandwidthBound lp;
  if (unicastLp(g, demand, options, lp)) {
    // The LP's optimum is never below a valid cut; the max only guards against solver tolerance.
    lp.detail = "max-concurrent flow; best simple " + cut.detail;
    lp.roundsPerBlock = std::max(lp.roundsPerBlock, cut.roundsPerBlock);
    return lp;
  }
  cut.lpNonzeros = lp.lpNonzeros;
  cut.lpRows = lp.lpRows;
  cut.lpColumns = lp.lpColumns;
  cut.solveSeconds = lp.solveSeconds;
  return cut;
}

Demand allToAllDemand(int n) {
  Demand d(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(n), 1.0));
  for (int i = 0; i < n; ++i) d[static_cast<size_t>(i)][static_cast<size_t>(i)] = 0;
  return d;
}

Demand rootedDemand(int n, int root, bool fromRoot) {
  Demand d(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(n), 0.0));
  for (int i = 0; i < n; ++i) {
    if (i == root) continue;
    if (fromRoot) d[static_cast<size_t>(root)][static_cast<size_t>(i)] = 1;
    else d[static_cast<size_t>(i)][static_cast<size_t>(root)] = 1;
  }
  return d;
}

// Min over ranks v != 0 of maxflow(rank 0 -> v) and maxflow(v -> rank 0): the smallest cut with ranks
// on both sides.
double minRankCut(const BoundGraph& g, std::string& where) {
  double best = kInf;
  for (int r = 1; r < g.rankCount(); ++r) {
    const double out = maxFlow(g, g.rankVertex(0), g.rankVertex(r));
    const double in = maxFlow(g, g.rankVertex(r), g.rankVertex(0));
    if (out < best) best = out, where = "rank 0 -> rank " + std::to_string(r);
    if (in < best) best = in, where = "rank " + std::to_string(r) + " -> rank 0";
  }
  return best;
}

BandwidthBound zeroBound() {
  BandwidthBound b;
  b.exact = true;
  b.method = "none";
  b.detail = "one rank";
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// LinkFilter, BoundGraph

LinkFilter LinkFilter::all() { return LinkFilter{}; }
LinkFilter LinkFilter::nvlinkOnly() {
  LinkFilter f;
  f.c2c = f.network = f.pcie = f.cpuInterconnect = f.nicAccess = false;
  return f;
}
LinkFilter LinkFilter::fastFabric() {
  LinkFilter f;
  f.c2c = f.pcie = f.cpuInterconnect = false;
  f.nicAccess = true;
  return f;
}

int BoundGraph::addVertex(std::string vertexName, bool compute, int host) {
  const int id = vertexCount();
  if (vertexName.empty()) vertexName = "v" + std::to_string(id);
  vertices_.push_back({std::move(vertexName), compute, host});
  if (compute) ranks_.push_back(id);
  return id;
}

void BoundGraph::addEdge(int from, int to, double capacity, double alphaUs) {
  if (from < 0 || from >= vertexCount() || to < 0 || to >= vertexCount() || from == to || capacity < 0) {
    throwInvalidArgument("bounds: bad edge " + std::to_string(from) + "->" + std::to_string(to) + " (capacity " +
                         fmt(capacity) + ") in graph '" + name + "' of " + std::to_string(vertexCount()) + " vertices");
  }
  for (BoundEdge& e : edges_) {
    if (e.from == from && e.to == to) {
      e.capacity += capacity;
      e.alphaUs = std::min(e.alphaUs, alphaUs);
      return;
    }
  }
  edges_.push_back({from, to, capacity, alphaUs});
}

void BoundGraph::addLink(int a, int b, double capacity, double alphaUs) {
  addEdge(a, b, capacity, alphaUs);
  addEdge(b, a, capacity, alphaUs);
}

BoundGraph BoundGraph::reversed() const {
  BoundGraph r = *this;
  for (BoundEdge& e : r.edges_) std::swap(e.from, e.to);
  return r;
}

std::string BoundGraph::describe() const {
  std::ostringstream out;
  out << "graph '" << name << "': " << vertexCount() << " vertices (" << rankCount() << " ranks), " << edges_.size()
      << " edges, capacity in " << capacityUnit << " (1 = " << unitGBs << " GB/s)\n";
  for (int v = 0; v < vertexCount(); ++v)
    out << "  " << v << " " << vertices_[static_cast<size_t>(v)].name << (vertices_[static_cast<size_t>(v)].compute ? " rank" : " relay")
        << " host " << vertices_[static_cast<size_t>(v)].host << "\n";
  for (const BoundEdge& e : edges_)
    out << "  " << vertex(e.from).name << " -> " << vertex(e.to).name << " " << e.capacity << " alpha " << e.alphaUs << "\n";
  return out.str();
}

BoundGraph BoundGraph::fromTopology(const topo::Topology& topology, const std::vector<topo::VertexId>& rankDevice,
                                    const LinkFilter& filter) {
  std::set<topo::VertexId> seen;
  for (size_t r = 0; r < rankDevice.size(); ++r) {
    const topo::VertexId v = rankDevice[r];
    if (v < 0 || v >= topology.vertexCount()) {
      throwInvalidArgument("bounds: rank " + std::to_string(r) + " runs on vertex " + std::to_string(v) +
                           ", which topology '" + topology.name + "' does not have");
    }
    if (!seen.insert(v).second) {
      throwInvalidArgument("bounds: two ranks run on " + topo::describeVertex(topology, v) +
                           "; the bound graph needs one vertex per rank");
    }
  }
  const auto keepKind = [&](const topo::Link& link) {
    const bool sw = topology.vertex(link.from).kind == topo::VertexKind::NvSwitch ||
                    topology.vertex(link.to).kind == topo::VertexKind::NvSwitch;
    switch (link.kind) {
      case topo::LinkKind::NvLink: return sw ? filter.nvswitch : filter.nvlink;
      case topo::LinkKind::Pcie: return filter.pcie;
      case topo::LinkKind::CpuInterconnect: return filter.cpuInterconnect;
      case topo::LinkKind::C2C: return filter.c2c;
      case topo::LinkKind::Network: return filter.network;
    }
    return false;
  };
  std::set<std::pair<topo::VertexId, topo::VertexId>> kept;
  for (const topo::Link& link : topology.links())
    if (link.bandwidthGBs > 0 && keepKind(link)) kept.insert({link.from, link.to});
  if (filter.network && filter.nicAccess && (!filter.pcie || !filter.cpuInterconnect)) {
    for (topo::VertexId d : rankDevice) {
      for (topo::VertexId nic : topology.nics()) {
        if (topology.vertex(nic).host != topology.vertex(d).host) continue;
        const topo::Path p = topology.path(d, nic);
        if (!p.exists()) continue;
        for (size_t i = 0; i + 1 < p.vertices.size(); ++i) {
          kept.insert({p.vertices[i], p.vertices[i + 1]});
          kept.insert({p.vertices[i + 1], p.vertices[i]});
        }
      }
    }
  }
  // Drop relays that lead nowhere (at most one neighbour), repeatedly.
  std::vector<bool> isRank(static_cast<size_t>(topology.vertexCount()), false);
  for (topo::VertexId d : rankDevice) isRank[static_cast<size_t>(d)] = true;
  while (true) {
    std::map<topo::VertexId, std::set<topo::VertexId>> neighbours;
    for (const auto& [a, b] : kept) neighbours[a].insert(b), neighbours[b].insert(a);
    std::set<topo::VertexId> dead;
    for (const auto& [v, nb] : neighbours)
      if (!isRank[static_cast<size_t>(v)] && nb.size() <= 1) dead.insert(v);
    if (dead.empty()) break;
    for (auto it = kept.begin(); it != kept.end();)
      it = (dead.count(it->first) || dead.count(it->second)) ? kept.erase(it) : std::next(it);
  }

  BoundGraph g;
  g.name = topology.name;
  g.capacityUnit = "GB/s";
  g.unitGBs = 1;
  std::map<topo::VertexId, int> index;
  for (topo::VertexId d : rankDevice) {
    const topo::Vertex& v = topology.vertex(d);
    index[d] = g.addVertex(v.name, true, v.host);
  }
  for (const auto& [a, b] : kept) {
    for (topo::VertexId v : {a, b}) {
      if (!index.count(v)) index[v] = g.addVertex(topology.vertex(v).name, false, topology.vertex(v).host);
    }
  }
  for (const auto& [a, b] : kept) {
    const topo::Link* link = topology.linkBetween(a, b);
    if (!link) continue;
    const double alpha = link->latencyUs > 0 ? link->latencyUs : defaultAlphaUs(linkClassOf(topology, *link));
    g.addEdge(index.at(a), index.at(b), link->bandwidthGBs, alpha);
  }
  return g;
}

BoundGraph BoundGraph::fromLinkList(int n, const std::vector<LinkListEntry>& links, bool bidirectional, double alphaUs) {
  if (n < 1) throwInvalidArgument("bounds: a link list needs at least one rank, got " + std::to_string(n));
  BoundGraph g;
  g.name = "links-" + std::to_string(n);
  for (int r = 0; r < n; ++r) g.addVertex("r" + std::to_string(r), true);
  for (const LinkListEntry& l : links) {
    if (bidirectional) g.addLink(l.a, l.b, l.multiplicity, alphaUs);
    else g.addEdge(l.a, l.b, l.multiplicity, alphaUs);
  }
  return g;
}

BoundGraph BoundGraph::hubAndSpoke(int n, double portCapacity, double alphaUs) {
  BoundGraph g = fromLinkList(n, {});
  g.name = "hub_and_spoke(" + std::to_string(n) + ")";
  const int sw = g.addVertex("switch", false);
  // alpha on the way in only, so a rank-to-rank hop costs alphaUs as a direct link would.
  for (int r = 0; r < n; ++r) {
    g.addEdge(r, sw, portCapacity, alphaUs);
    g.addEdge(sw, r, portCapacity, 0);
  }
  return g;
}

BoundGraph BoundGraph::ring(int n, bool bidirectional, double alphaUs) {
  std::vector<LinkListEntry> links;
  for (int r = 0; r < n && n > 1; ++r)
    if (n > 2 || r == 0 || !bidirectional) links.push_back({r, (r + 1) % n, 1});
  BoundGraph g = fromLinkList(n, links, bidirectional, alphaUs);
  g.name = std::string(bidirectional ? "ring(" : "uniring(") + std::to_string(n) + ")";
  return g;
}

BoundGraph BoundGraph::fullyConnected(int n, double alphaUs) {
  std::vector<LinkListEntry> links;
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b) links.push_back({a, b, 1});
  BoundGraph g = fromLinkList(n, links, true, alphaUs);
  g.name = "fully_connected(" + std::to_string(n) + ")";
  return g;
}

BoundGraph BoundGraph::dgx1LinkList(double alphaUs) {
  BoundGraph g = fromLinkList(8,
                              {{0, 1, 2}, {0, 4, 2}, {1, 3, 2}, {2, 3, 2}, {2, 6, 2}, {4, 5, 2}, {5, 7, 2}, {6, 7, 2},
                               {0, 2, 1}, {0, 3, 1}, {1, 2, 1}, {1, 5, 1}, {3, 7, 1}, {4, 6, 1}, {4, 7, 1}, {5, 6, 1}},
                              true, alphaUs);
  g.name = "dgx1";
  return g;
}

// ---------------------------------------------------------------------------------------------------
// Bounds

double maxFlow(const BoundGraph& graph, int s, int t) {
  FlowNetwork net(graph.vertexCount());
  for (const BoundEdge& e : graph.edges())
    if (e.capacity > 0) net.add(e.from, e.to, e.capacity);
  return net.run(s, t);
}

int stepsLowerBound(const BoundGraph& graph, Collective c, int root) {
  const int n = graph.rankCount();
  if (n <= 1) return 0;
  if (!rootless(c)) requireRoot(graph, root);
  const auto out = outEdges(graph);
  const auto V = static_cast<size_t>(graph.vertexCount());
  int worst = 0;
  std::vector<std::vector<int>> dist(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    // 0-1 BFS: entering a rank costs a step, entering a relay does not.
    std::vector<int> d(V, std::numeric_limits<int>::max());
    std::deque<int> q;
    d[static_cast<size_t>(graph.rankVertex(s))] = 0;
    q.push_back(graph.rankVertex(s));
    while (!q.empty()) {
      const int u = q.front();
      q.pop_front();
      for (const BoundEdge* e : out[static_cast<size_t>(u)]) {
        const int w = graph.vertex(e->to).compute ? 1 : 0;
        if (d[static_cast<size_t>(u)] + w < d[static_cast<size_t>(e->to)]) {
          d[static_cast<size_t>(e->to)] = d[static_cast<size_t>(u)] + w;
          if (w) q.push_back(e->to);
          else q.push_front(e->to);
        }
      }
    }
    dist[static_cast<size_t>(s)] = std::move(d);
  }
  for (const auto& [s, t] : neededPairs(n, c, root)) {
    const int d = dist[static_cast<size_t>(s)][static_cast<size_t>(graph.rankVertex(t))];
    if (d == std::numeric_limits<int>::max()) throwUnreachable(graph, s, t);
    worst = std::max(worst, d);
  }
  return worst;
}

double latencyLowerBoundUs(const BoundGraph& graph, Collective c, int root) {
  const int n = graph.rankCount();
  if (n <= 1) return 0;
  if (!rootless(c)) requireRoot(graph, root);
  const auto out = outEdges(graph);
  const auto V = static_cast<size_t>(graph.vertexCount());
  std::vector<std::vector<double>> dist(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    std::vector<double> d(V, kInf);
    using Item = std::pair<double, int>;
    std::priority_queue<Item, std::vector<Item>, std::greater<>> q;
    d[static_cast<size_t>(graph.rankVertex(s))] = 0;
    q.push({0, graph.rankVertex(s)});
    while (!q.empty()) {
      const auto [du, u] = q.top();
      q.pop();
      if (du > d[static_cast<size_t>(u)]) continue;
      for (const BoundEdge* e : out[static_cast<size_t>(u)]) {
        const double nd = du + e->alphaUs;
        if (nd < d[static_cast<size_t>(e->to)]) {
          d[static_cast<size_t>(e->to)] = nd;
          q.push({nd, e->to});
        }
      }
    }
    dist[static_cast<size_t>(s)] = std::move(d);
  }
  double worst = 0;
  for (const auto& [s, t] : neededPairs(n, c, root)) {
    const double d = dist[static_cast<size_t>(s)][static_cast<size_t>(graph.rankVertex(t))];
    if (std::isinf(d)) throwUnreachable(graph, s, t);
    worst = std::max(worst, d);
  }
  return worst;
}

BandwidthBound allGatherBound(const BoundGraph& graph, const BoundOptions& options) {
  if (graph.rankCount() <= 1) return zeroBound();
  checkConnected(graph, Collective::AllGather, 0);
  BandwidthBound cut = allGatherCut(graph);
  BandwidthBound lp;
  if (allGatherLp(graph, options, lp)) {
    lp.detail = "tree packing; best simple " + cut.detail;
    lp.roundsPerBlock = std::max(lp.roundsPerBlock, cut.roundsPerBlock);
    return lp;
  }
  cut.lpNonzeros = lp.lpNonzeros;
  cut.lpRows = lp.lpRows;
  cut.lpColumns = lp.lpColumns;
  cut.solveSeconds = lp.solveSeconds;
  return cut;
}

BandwidthBound reduceScatterBound(const BoundGraph& graph, const BoundOptions& options) {
  return allGatherBound(graph.reversed(), options);
}

BandwidthBound allToAllBound(const BoundGraph& graph, const BoundOptions& options) {
  if (graph.rankCount() <= 1) return zeroBound();
  checkConnected(graph, Collective::AllToAll, 0);
  return unicastBound(graph, allToAllDemand(graph.rankCount()), options);
}

BandwidthBound scatterBound(const BoundGraph& graph, int root, const BoundOptions& options) {
  requireRoot(graph, root);
  if (graph.rankCount() <= 1) return zeroBound();
  checkConnected(graph, Collective::Scatter, root);
  return unicastBound(graph, rootedDemand(graph.rankCount(), root, true), options);
}

BandwidthBound gatherBound(const BoundGraph& graph, int root, const BoundOptions& options) {
  requireRoot(graph, root);
  if (graph.rankCount() <= 1) return zeroBound();
  checkConnected(graph, Collective::Gather, root);
  return unicastBound(graph, rootedDemand(graph.rankCount(), root, false), options);
}

BandwidthBound broadcastBound(const BoundGraph& graph, int root) {
  requireRoot(graph, root);
  if (graph.rankCount() <= 1) return zeroBound();
  checkConnected(graph, Collective::Broadcast, root);
  double best = kInf;
  int where = -1;
  for (int r = 0; r < graph.rankCount(); ++r) {
    if (r == root) continue;
    const double f = maxFlow(graph, graph.rankVertex(root), graph.rankVertex(r));
    if (f < best) best = f, where = r;
  }
  BandwidthBound b;
  b.roundsPerBlock = 1 / best;
  b.exact = true;
  b.method = "maxflow";
  b.detail = "maxflow rank " + std::to_string(root) + " -> rank " + std::to_string(where) + " = " + fmt(best);
  return b;
}

BandwidthBound reduceBound(const BoundGraph& graph, int root) { return broadcastBound(graph.reversed(), root); }

namespace {

// The combining bound: with reductions only at ranks and no coding, every element of the buffer needs at
// least 2(N-1) rank-to-rank transmissions of a partial sum before all N ranks hold the total (one-way
// gossip needs 2N-2 calls), each leaving some rank and entering another. So T >= 2(N-1) blocks over the
// ranks' total egress (and ingress) capacity: Chan et al.'s 2(N-1)/N M beta on a homogeneous single-port
// graph, and the cut-set bound of Zhou & Sun (2026) restricted to ranks.
double combiningRoundsPerBlock(const BoundGraph& graph) {
  const int n = graph.rankCount();
  std::vector<bool> rank(static_cast<size_t>(graph.vertexCount()), false);
  for (int v : graph.rankVertices()) rank[static_cast<size_t>(v)] = true;
  double out = 0, in = 0;
  for (const BoundEdge& e : graph.edges()) {
    if (rank[static_cast<size_t>(e.from)]) out += e.capacity;
    if (rank[static_cast<size_t>(e.to)]) in += e.capacity;
  }
  const double capacity = std::min(out, in);
  return capacity > 0 ? 2.0 * (n - 1) / capacity : kInf;
}

BandwidthBound allReduceFrom(const BoundGraph& graph, const BandwidthBound& ag, const BandwidthBound& rs) {
  const int n = graph.rankCount();
  std::string where;
  const double lambda = minRankCut(graph, where);
  BandwidthBound b;
  const double agPer = ag.roundsPerBlock / n, rsPer = rs.roundsPerBlock / n, cutPer = 1 / lambda;
  const double combinePer = combiningRoundsPerBlock(graph);
  b.roundsPerBlock = std::max({agPer, rsPer, cutPer, combinePer});
  b.exact = ag.exact && rs.exact;
  b.method = ag.method;
  b.lpRows = ag.lpRows + rs.lpRows;
  b.lpColumns = ag.lpColumns + rs.lpColumns;
  b.lpNonzeros = ag.lpNonzeros + rs.lpNonzeros;
  b.solveSeconds = ag.solveSeconds + rs.solveSeconds;
  b.detail = "max(AG/N " + fmt(agPer) + ", RS/N " + fmt(rsPer) + ", 1/mincut " + fmt(cutPer) + " at " + where +
             ", combining 2(N-1)/rank capacity " + fmt(combinePer) + ")";
  return b;
}

}  // namespace

BandwidthBound allReduceBound(const BoundGraph& graph, const BoundOptions& options) {
  if (graph.rankCount() <= 1) return zeroBound();
  checkConnected(graph, Collective::AllReduce, 0);
  return allReduceFrom(graph, allGatherBound(graph, options), reduceScatterBound(graph, options));
}

BandwidthBound cutBound(const BoundGraph& graph, Collective c, int root) {
  const int n = graph.rankCount();
  if (n <= 1) return zeroBound();
  if (!rootless(c)) requireRoot(graph, root);
  checkConnected(graph, c, root);
  switch (c) {
    case Collective::AllGather: return allGatherCut(graph);
    case Collective::ReduceScatter: return allGatherCut(graph.reversed());
    case Collective::AllToAll: return unicastCut(graph, allToAllDemand(n));
    case Collective::Scatter: return unicastCut(graph, rootedDemand(n, root, true));
    case Collective::Gather: return unicastCut(graph, rootedDemand(n, root, false));
    case Collective::Broadcast:
    case Collective::Reduce: {
      // Every rank must receive (Reduce: send) the whole block; the root must send (receive) it.
      const BoundGraph g = c == Collective::Broadcast ? graph : graph.reversed();
      BandwidthBound b = cheapCut(g, false, [&](const std::vector<bool>& s) {
        const auto m = rankMask(g, s);
        if (!m[static_cast<size_t>(root)]) return 0.0;
        return std::count(m.begin(), m.end(), false) > 0 ? 1.0 : 0.0;
      });
      return b;
    }
    case Collective::AllReduce: {
      BandwidthBound ag = allGatherCut(graph), rs = allGatherCut(graph.reversed());
      BandwidthBound one = cheapCut(graph, false, [&](const std::vector<bool>& s) {
        const auto m = rankMask(graph, s);
        const auto in = std::count(m.begin(), m.end(), true);
        return (in == 0 || in == static_cast<long>(m.size())) ? 0.0 : 1.0;
      });
      BandwidthBound b = one;
      b.roundsPerBlock = std::max({ag.roundsPerBlock / n, rs.roundsPerBlock / n, one.roundsPerBlock,
                                   combiningRoundsPerBlock(graph)});
      return b;
    }
  }
  return zeroBound();
}

BandwidthBound bandwidthLowerBound(const BoundGraph& graph, Collective c, int root, const BoundOptions& options) {
  switch (c) {
    case Collective::AllGather: return allGatherBound(graph, options);
    case Collective::ReduceScatter: return reduceScatterBound(graph, options);
    case Collective::AllToAll: return allToAllBound(graph, options);
    case Collective::Broadcast: return broadcastBound(graph, root);
    case Collective::Reduce: return reduceBound(graph, root);
    case Collective::Scatter: return scatterBound(graph, root, options);
    case Collective::Gather: return gatherBound(graph, root, options);
    case Collective::AllReduce: return allReduceBound(graph, options);
  }
  return zeroBound();
}

double CollectiveBound::bandwidthUs(uint64_t bytes) const {
  return bandwidth.roundsPerBlock * blockBytes(collective, nranks, bytes) / (unitGBs * 1e3);
}

double CollectiveBound::lowerBoundUs(uint64_t bytes) const { return std::max(latencyUs, bandwidthUs(bytes)); }

std::string CollectiveBound::describe() const {
  std::ostringstream out;
  out << collectiveName(collective) << " on " << nranks << " ranks: >= " << steps << " steps, >= " << fmt(latencyUs)
      << " us latency, >= " << fmt(bandwidth.roundsPerBlock) << " rounds/block (capacity in " << capacityUnit << ", "
      << bandwidth.method << (bandwidth.exact ? ", exact" : ", cut only") << ": " << bandwidth.detail << ")";
  if (collective == Collective::AllReduce) out << "; RS+AG achievable " << fmt(rsAgRoundsPerBlock);
  if (bandwidth.lpColumns > 0)
    out << "; LP " << bandwidth.lpRows << "x" << bandwidth.lpColumns << " nnz " << bandwidth.lpNonzeros << " in "
        << fmt(bandwidth.solveSeconds) << " s";
  return out.str();
}

CollectiveBound collectiveBound(const BoundGraph& graph, Collective c, int root, const BoundOptions& options) {
  CollectiveBound b;
  b.collective = c;
  b.nranks = graph.rankCount();
  b.root = root;
  b.unitGBs = graph.unitGBs;
  b.capacityUnit = graph.capacityUnit;
  b.steps = stepsLowerBound(graph, c, root);
  b.latencyUs = latencyLowerBoundUs(graph, c, root);
  if (c == Collective::AllReduce && graph.rankCount() > 1) {
    const BandwidthBound ag = allGatherBound(graph, options);
    const BandwidthBound rs = reduceScatterBound(graph, options);
    b.rsAgRoundsPerBlock = (ag.roundsPerBlock + rs.roundsPerBlock) / graph.rankCount();
    b.bandwidth = allReduceFrom(graph, ag, rs);
  } else {
    b.bandwidth = bandwidthLowerBound(graph, c, root, options);
  }
  return b;
}

}  // namespace topoccl::algo
