#include "algorithms/synthesizer/synthesizer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "algorithms/generators.hpp"
#include "algorithms/validator.hpp"
#include "common/error.hpp"

namespace topoccl::algo::synth {
namespace {

using Clock = std::chrono::steady_clock;

ChunkRange input(uint32_t offset, uint32_t count = 1) { return {BufferId::Input, offset, count}; }
ChunkRange output(uint32_t offset, uint32_t count = 1) { return {BufferId::Output, offset, count}; }
ChunkRange scratch(uint32_t offset, uint32_t count = 1) { return {BufferId::Scratch, offset, count}; }

size_t idx(int v) { return static_cast<size_t>(v); }

uint32_t chunksPerBlockOf(Collective c, int n, uint32_t chunksPerRank) {
  return c == Collective::AllReduce ? static_cast<uint32_t>(n) * chunksPerRank : chunksPerRank;
}

double chunkBytesOf(Collective c, int n, uint64_t bytes, uint32_t chunksPerRank) {
  return blockBytes(c, n, bytes) / static_cast<double>(chunksPerBlockOf(c, n, chunksPerRank));
}

// Time of one chunk alone on the route u -> v, start to arrival (CostModel::occupancyUs: how long it holds
// the route's resources, without a pipelined link's latency).
double transferTime(const CostModel& model, int u, int v, double chunkBytes) { return model.transferUs(u, v, chunkBytes); }

// ---- ordering: list scheduling of the transfers -----------------------------------------------------

struct Transfer {
  uint32_t chunk = 0;  // k = source * C + part
  int from = -1, to = -1;
  bool reduce = false;  // reduce-scatter phase (towards the tree's root)
  std::vector<uint32_t> preds, succs;
  double cost = 0;       // start to arrival (and the reduction)
  double hold = 0;       // how long the route's resources are busy
  double start = 0, end = 0;
  double remaining = 0;  // longest path from this transfer (inclusive) to the end
  uint32_t topo = 0;     // position in a topological order
};

std::vector<std::vector<int>> childrenOf(const Tree& tree) {
  std::vector<std::vector<int>> children(tree.parent.size());
  for (size_t v = 0; v < tree.parent.size(); ++v) {
    if (tree.parent[v] >= 0) children[idx(tree.parent[v])].push_back(static_cast<int>(v));
  }
  return children;
}

std::vector<Transfer> buildTransfers(Collective c, const std::vector<Tree>& trees, const CostModel& model,
                                     double chunkBytes) {
  const int n = model.nranks();
  std::vector<Transfer> all;
  const auto add = [&](uint32_t k, int from, int to, bool reduce) {
    Transfer t;
    t.chunk = k;
    t.from = from;
    t.to = to;
    t.reduce = reduce;
    t.cost = transferTime(model, from, to, chunkBytes) + (reduce ? model.gammaUsPerByte * chunkBytes : 0.0);
    t.hold = model.occupancyUs(from, to, chunkBytes);
    all.push_back(std::move(t));
    return static_cast<uint32_t>(all.size() - 1);
  };
  for (size_t k = 0; k < trees.size(); ++k) {
    const Tree& tree = trees[k];
    const int s = tree.source;
    const auto children = childrenOf(tree);
    const auto chunk = static_cast<uint32_t>(k);
    std::vector<uint32_t> rs(idx(n), UINT32_MAX), ag(idx(n), UINT32_MAX);
    if (c != Collective::AllGather) {
      for (int v = 0; v < n; ++v)
        if (v != s) rs[idx(v)] = add(chunk, v, tree.parent[idx(v)], true);
      for (int v = 0; v < n; ++v)
        if (v != s)
          for (int ch : children[idx(v)]) all[rs[idx(v)]].preds.push_back(rs[idx(ch)]);
    }
    if (c != Collective::ReduceScatter) {
      for (int v = 0; v < n; ++v)
        if (v != s) ag[idx(v)] = add(chunk, tree.parent[idx(v)], v, false);
      for (int v = 0; v < n; ++v) {
        if (v == s) continue;
        const int u = tree.parent[idx(v)];
        if (u != s) {
          all[ag[idx(v)]].preds.push_back(ag[idx(u)]);
        } else if (c == Collective::AllReduce) {
          for (int ch : children[idx(s)]) all[ag[idx(v)]].preds.push_back(rs[idx(ch)]);
        }
      }
    }
  }
  for (uint32_t t = 0; t < all.size(); ++t)
    for (uint32_t p : all[t].preds) all[p].succs.push_back(t);
  return all;
}

// Topological positions and longest remaining paths; then greedy list scheduling on the resources.
void schedule(std::vector<Transfer>& all, const CostModel& model, Order order) {
  const size_t count = all.size();
  std::vector<uint32_t> pending(count), topoOrder;
  topoOrder.reserve(count);
  for (size_t t = 0; t < count; ++t) pending[t] = static_cast<uint32_t>(all[t].preds.size());
  {
    std::vector<uint32_t> queue;
    for (uint32_t t = 0; t < count; ++t)
      if (pending[t] == 0) queue.push_back(t);
    std::vector<uint32_t> left = pending;
    for (size_t head = 0; head < queue.size(); ++head) {
      const uint32_t t = queue[head];
      all[t].topo = static_cast<uint32_t>(topoOrder.size());
      topoOrder.push_back(t);
      for (uint32_t s : all[t].succs)
        if (--left[s] == 0) queue.push_back(s);
    }
    if (topoOrder.size() != count) throwInternalError("synthesizer: cyclic transfer graph");
  }
  for (size_t i = count; i-- > 0;) {
    Transfer& t = all[topoOrder[i]];
    double best = 0;
    for (uint32_t s : t.succs) best = std::max(best, all[s].remaining);
    t.remaining = t.cost + best;
  }

  std::vector<double> resourceFree(model.resources().size(), 0.0);
  std::vector<double> readyAt(count, 0.0);
  std::vector<uint32_t> ready;
  for (uint32_t t = 0; t < count; ++t)
    if (pending[t] == 0) ready.push_back(t);
  while (!ready.empty()) {
    size_t bestPos = 0;
    std::tuple<double, double, uint32_t> bestKey{};
    double bestStart = 0;
    for (size_t i = 0; i < ready.size(); ++i) {
      const uint32_t t = ready[i];
      double start = readyAt[t];
      for (int r : model.route(all[t].from, all[t].to).resources) start = std::max(start, resourceFree[idx(r)]);
      const auto key = order == Order::LongestRemainingFirst ? std::make_tuple(-all[t].remaining, start, t)
                                                             : std::make_tuple(start, -all[t].remaining, t);
      if (i == 0 || key < bestKey) {
        bestKey = key;
        bestPos = i;
        bestStart = start;
      }
    }
    const uint32_t t = ready[bestPos];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(bestPos));
    Transfer& tr = all[t];
    tr.start = bestStart;
    tr.end = bestStart + tr.cost;
    for (int r : model.route(tr.from, tr.to).resources) resourceFree[idx(r)] = bestStart + tr.hold;
    for (uint32_t s : tr.succs) {
      readyAt[s] = std::max(readyAt[s], tr.end);
      if (--pending[s] == 0) ready.push_back(s);
    }
  }
}

// ---- lowering ----------------------------------------------------------------------------------------

class Lowering {
 public:
  Lowering(Collective c, int n, uint32_t chunksPerRank) {
    plan_.name = "synth";
    plan_.collective = c;
    plan_.nranks = n;
    plan_.root = -1;
    plan_.chunksPerBlock = chunksPerBlockOf(c, n, chunksPerRank);
    plan_.ranks.resize(idx(n));
    for (int r = 0; r < n; ++r) {
      plan_.inputChunks = std::max(plan_.inputChunks, inputBlocks(c, n, r, -1) * plan_.chunksPerBlock);
      plan_.outputChunks = std::max(plan_.outputChunks, outputBlocks(c, n, r, -1) * plan_.chunksPerBlock);
    }
    lanes_.resize(idx(n));
  }

  uint16_t lane(int rank, int sendPeer, int recvPeer) {
    auto& map = lanes_[idx(rank)];
    const auto key = std::make_pair(sendPeer, recvPeer);
    const auto it = map.find(key);
    if (it != map.end()) return it->second;
    auto& lanes = plan_.ranks[idx(rank)].lanes;
    lanes.push_back({sendPeer, recvPeer, 0, {}});
    const auto id = static_cast<uint16_t>(lanes.size() - 1);
    map.emplace(key, id);
    return id;
  }

  StepRef add(int rank, uint16_t laneId, Step step, std::optional<StepRef> dep) {
    if (dep && dep->lane != laneId) step.deps.push_back(*dep);
    auto& steps = plan_.ranks[idx(rank)].lanes[laneId].steps;
    steps.push_back(std::move(step));
    return {laneId, static_cast<uint32_t>(steps.size() - 1)};
  }

  Plan& plan() { return plan_; }

 private:
  Plan plan_;
  std::vector<std::map<std::pair<int, int>, uint16_t>> lanes_;
};

int treeDepth(const Tree& tree) {
  int deepest = 0;
  for (size_t v = 0; v < tree.parent.size(); ++v) {
    int d = 0;
    for (int u = static_cast<int>(v); tree.parent[idx(u)] >= 0; u = tree.parent[idx(u)]) ++d;
    deepest = std::max(deepest, d);
  }
  return deepest;
}

// ---- tree builders -----------------------------------------------------------------------------------

struct Context {
  const CostModel& model;
  int n = 0;
  double chunkBytes = 0;
  std::vector<std::vector<bool>> direct;
  std::vector<std::vector<double>> time;  // transferTime per pair (arrival)
  std::vector<std::vector<double>> hold;  // CostModel::occupancyUs per pair (resource load)
};

enum class Builder : uint8_t { Bfs, Pack };

// Grows a tree from s, Prim style: BFS takes the shallowest attachment, then the least loaded; Pack
// minimises the bottleneck load after the edge plus lambda x the chunk's arrival time there.
// onceHost (rank -> host): the tree enters each host once (no edge into a host it already reaches).
Tree growTree(const Context& ctx, int s, Builder mode, double lambda, int rotation, std::vector<double>& load,
              const std::vector<int>* onceHost = nullptr) {
  const int n = ctx.n;
  Tree tree;
  tree.source = s;
  tree.parent.assign(idx(n), -1);
  std::vector<int> members{s};
  std::vector<bool> in(idx(n), false);
  std::vector<int> depth(idx(n), 0);
  std::vector<double> arrive(idx(n), 0.0);
  in[idx(s)] = true;
  std::set<int> reached;  // hosts the tree has entered (onceHost)
  if (onceHost) reached.insert((*onceHost)[idx(s)]);
  for (int added = 1; added < n; ++added) {
    std::optional<std::tuple<double, double, double, int, int>> best;
    int bu = -1, bv = -1;
    for (int pass = 0; pass < 2 && bu < 0; ++pass) {
      for (int u : members) {
        for (int v = 0; v < n; ++v) {
          if (in[idx(v)] || (pass == 0 && !ctx.direct[idx(u)][idx(v)])) continue;
          if (pass == 0 && onceHost && (*onceHost)[idx(u)] != (*onceHost)[idx(v)] &&
              reached.count((*onceHost)[idx(v)])) {
            continue;
          }
          const double t = ctx.time[idx(u)][idx(v)];
          double bottleneck = 0;
          for (int r : ctx.model.route(u, v).resources) bottleneck = std::max(bottleneck, load[idx(r)]);
          bottleneck += ctx.hold[idx(u)][idx(v)];
          const int tie = ((v - s - rotation) % n + 2 * n) % n;
          const auto key = mode == Builder::Bfs
                               ? std::make_tuple(static_cast<double>(depth[idx(u)] + 1), bottleneck,
                                                 arrive[idx(u)] + t, tie, u)
                               : std::make_tuple(bottleneck + lambda * (arrive[idx(u)] + t),
                                                 static_cast<double>(depth[idx(u)] + 1), 0.0, tie, u);
          if (!best || key < *best) {
            best = key;
            bu = u;
            bv = v;
          }
        }
      }
    }
    tree.parent[idx(bv)] = bu;
    in[idx(bv)] = true;
    if (onceHost) reached.insert((*onceHost)[idx(bv)]);
    depth[idx(bv)] = depth[idx(bu)] + 1;
    arrive[idx(bv)] = arrive[idx(bu)] + ctx.time[idx(bu)][idx(bv)];
    members.push_back(bv);
    for (int r : ctx.model.route(bu, bv).resources) load[idx(r)] += ctx.hold[idx(bu)][idx(bv)];
  }
  return tree;
}

void addLoad(const Context& ctx, const Tree& tree, std::vector<double>& load, double sign) {
  for (int v = 0; v < ctx.n; ++v) {
    const int u = tree.parent[idx(v)];
    if (u < 0) continue;
    for (int r : ctx.model.route(u, v).resources) load[idx(r)] += sign * ctx.hold[idx(u)][idx(v)];
  }
}

std::vector<Tree> buildTrees(const Context& ctx, uint32_t C, Builder mode, double lambda, int passes, int seedRotation) {
  const int n = ctx.n;
  std::vector<Tree> trees(idx(n) * C);
  std::vector<double> load(ctx.model.resources().size(), 0.0);
  for (int pass = 0; pass < passes; ++pass) {
    for (uint32_t p = 0; p < C; ++p) {
      for (int i = 0; i < n; ++i) {
        const int s = i;
        const size_t k = idx(s) * C + p;
        if (pass > 0) addLoad(ctx, trees[k], load, -1.0);
        trees[k] = growTree(ctx, s, mode, lambda, seedRotation + static_cast<int>(p), load);
      }
    }
  }
  return trees;
}

// Hierarchical trees (family "hier", the topology's default for several hosts): each chunk enters every other host
// exactly once, then spreads inside it over that host's direct pairs. rail: the crossing is from the source to the
// rank at the same position on that host (its rail peer: on a rail-optimised cluster, the GPU behind the NIC of the
// same rail). Gateway: every crossing is between the hosts' gateways, the rank of each host with the fastest routes
// off it (one connection per host pair carries everything: few, long messages, and contiguity can batch them).
// Any: any rank the tree has reached may cross, to any rank (the builder picks by load and time). Trees are grown
// as in buildTrees, load-balanced across all trees.
enum class Crossing : uint8_t { Rail, Gateway, Any };

std::vector<Tree> hierTrees(const Context& ctx, const std::vector<int>& host, uint32_t C, Crossing crossing,
                            Builder mode, double lambda, int passes, int seedRotation) {
  const int n = ctx.n;
  std::map<int, std::vector<int>> members;  // host -> its ranks in rank order
  std::vector<size_t> position(idx(n));
  for (int r = 0; r < n; ++r) {
    position[idx(r)] = members[host[idx(r)]].size();
    members[host[idx(r)]].push_back(r);
  }
  std::map<int, int> gateway;  // host -> rank: least (max beta, max latency) over its routes to other hosts
  std::map<int, std::pair<double, double>> gatewayScore;
  for (int u = 0; u < n; ++u) {
    std::pair<double, double> score{0, 0};
    for (int v = 0; v < n; ++v) {
      if (host[idx(v)] == host[idx(u)]) continue;
      score.first = std::max(score.first, ctx.model.route(u, v).betaUsPerByte);
      score.second = std::max(score.second, ctx.model.route(u, v).latencyUs);
    }
    const auto it = gatewayScore.find(host[idx(u)]);
    if (it == gatewayScore.end() || score < it->second) {
      gatewayScore[host[idx(u)]] = score;
      gateway[host[idx(u)]] = u;
    }
  }
  Context sub = ctx;
  std::vector<Tree> trees(idx(n) * C);
  std::vector<double> load(ctx.model.resources().size(), 0.0);
  for (int pass = 0; pass < passes; ++pass) {
    for (uint32_t p = 0; p < C; ++p) {
      for (int s = 0; s < n; ++s) {
        for (int u = 0; u < n && crossing != Crossing::Any; ++u) {
          for (int v = 0; v < n; ++v) {
            const bool sameHost = host[idx(u)] == host[idx(v)];
            const bool cross = crossing == Crossing::Rail
                                   ? u == s && position[idx(v)] == position[idx(s)] % members[host[idx(v)]].size()
                                   : u == gateway[host[idx(u)]] && v == gateway[host[idx(v)]];
            sub.direct[idx(u)][idx(v)] = sameHost ? ctx.direct[idx(u)][idx(v)] : cross;
          }
        }
        const size_t k = idx(s) * C + p;
        if (pass > 0) addLoad(ctx, trees[k], load, -1.0);
        trees[k] = growTree(sub, s, mode, lambda, seedRotation + static_cast<int>(p), load, &host);
      }
    }
  }
  return trees;
}

std::vector<Tree> starTrees(int n, uint32_t C) {
  std::vector<Tree> trees(idx(n) * C);
  for (int s = 0; s < n; ++s) {
    for (uint32_t p = 0; p < C; ++p) {
      Tree& t = trees[idx(s) * C + p];
      t.source = s;
      t.parent.assign(idx(n), s);
      t.parent[idx(s)] = -1;
    }
  }
  return trees;
}

std::vector<Tree> ringTrees(int n, uint32_t C, const std::vector<std::vector<int>>& rings) {
  std::vector<Tree> trees(idx(n) * C);
  for (int s = 0; s < n; ++s) {
    for (uint32_t p = 0; p < C; ++p) {
      const std::vector<int>& ring = rings[p % rings.size()];
      const auto at = static_cast<size_t>(std::find(ring.begin(), ring.end(), s) - ring.begin());
      Tree& t = trees[idx(s) * C + p];
      t.source = s;
      t.parent.assign(idx(n), -1);
      for (size_t j = 1; j < ring.size(); ++j) t.parent[idx(ring[(at + j) % ring.size()])] = ring[(at + j - 1) % ring.size()];
    }
  }
  return trees;
}

}  // namespace

std::vector<topo::VertexId> defaultRankDevices(const topo::Topology& topology) { return topology.gpus(); }

const char* orderName(Order order) noexcept {
  switch (order) {
    case Order::LongestRemainingFirst: return "lrf";
    case Order::EarliestStartFirst: return "esf";
    case Order::Mirrored: return "mirror";
  }
  return "?";
}

std::vector<std::vector<bool>> directPairs(const CostModel& model) {
  const int n = model.nranks();
  std::vector<std::vector<bool>> direct(idx(n), std::vector<bool>(idx(n), false));
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (u == v) continue;
      const std::vector<int>& uv = model.route(u, v).resources;
      bool through = false;
      for (int w = 0; w < n && !through; ++w) {
        if (w == u || w == v) continue;
        const std::vector<int>& a = model.route(u, w).resources;
        const std::vector<int>& b = model.route(w, v).resources;
        if (a.empty() || b.empty() || a.size() + b.size() != uv.size()) continue;
        through = std::equal(a.begin(), a.end(), uv.begin()) && std::equal(b.begin(), b.end(), uv.begin() + static_cast<std::ptrdiff_t>(a.size()));
      }
      direct[idx(u)][idx(v)] = !through;
    }
  }
  return direct;
}

std::vector<std::vector<int>> hamiltonianCycles(const CostModel& model, int maxCycles) {
  const int n = model.nranks();
  if (n < 3 || maxCycles < 1) return {};
  const auto direct = directPairs(model);
  double betaRef = 0;
  for (int u = 0; u < n; ++u)
    for (int v = 0; v < n; ++v)
      if (u != v && direct[idx(u)][idx(v)]) betaRef = std::max(betaRef, model.route(u, v).betaUsPerByte);
  std::vector<std::vector<int>> cap(idx(n), std::vector<int>(idx(n), 0));
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (u == v || !direct[idx(u)][idx(v)] || !direct[idx(v)][idx(u)]) continue;
      const double beta = std::max(model.route(u, v).betaUsPerByte, model.route(v, u).betaUsPerByte);
      cap[idx(u)][idx(v)] = beta > 0 ? std::clamp(static_cast<int>(std::lround(betaRef / beta)), 0, 4) : 1;
    }
  }
  int limit = maxCycles;
  for (int u = 0; u < n; ++u) {
    int degree = 0;
    for (int v = 0; v < n; ++v) degree += cap[idx(u)][idx(v)];
    limit = std::min(limit, degree / 2);
  }
  std::vector<std::vector<int>> best, current;
  long budget = 200000;
  std::vector<int> path{0};
  std::vector<bool> used(idx(n), false);
  used[0] = true;
  // Enumerates Hamiltonian cycles from rank 0 (path[1] < path[n-1] so each undirected cycle once); for
  // each, takes its edges out and recurses for the next cycle.
  std::function<bool()> extend;
  std::function<bool()> nextCycle = [&]() -> bool {
    if (current.size() > best.size()) best = current;
    if (static_cast<int>(best.size()) >= limit || budget <= 0) return true;
    path.assign(1, 0);
    std::fill(used.begin(), used.end(), false);
    used[0] = true;
    return extend();
  };
  extend = [&]() -> bool {
    if (--budget <= 0) return true;
    const int u = path.back();
    if (static_cast<int>(path.size()) == n) {
      if (cap[idx(u)][0] <= 0 || path[1] > path.back()) return false;
      const std::vector<int> cycle = path;
      for (size_t i = 0; i < cycle.size(); ++i) {
        const int a = cycle[i], b = cycle[(i + 1) % cycle.size()];
        --cap[idx(a)][idx(b)];
        --cap[idx(b)][idx(a)];
      }
      current.push_back(cycle);
      const std::vector<int> savedPath = path;
      const std::vector<bool> savedUsed = used;
      const bool done = nextCycle();
      path = savedPath;
      used = savedUsed;
      current.pop_back();
      for (size_t i = 0; i < cycle.size(); ++i) {
        const int a = cycle[i], b = cycle[(i + 1) % cycle.size()];
        ++cap[idx(a)][idx(b)];
        ++cap[idx(b)][idx(a)];
      }
      return done;
    }
    for (int v = 1; v < n; ++v) {
      if (used[idx(v)] || cap[idx(u)][idx(v)] <= 0) continue;
      used[idx(v)] = true;
      path.push_back(v);
      const bool done = extend();
      path.pop_back();
      used[idx(v)] = false;
      if (done) return true;
    }
    return false;
  };
  nextCycle();
  return best;
}

Plan lowerTrees(Collective c, const std::vector<Tree>& trees, uint32_t chunksPerRank, const CostModel& model,
                uint64_t bytes, Order order) {
  const int n = model.nranks();
  const uint32_t C = chunksPerRank;
  if (c != Collective::AllGather && c != Collective::ReduceScatter && c != Collective::AllReduce) {
    throwInvalidArgument(std::string("synthesizer: ") + collectiveName(c) + " is not supported");
  }
  if (trees.size() != idx(n) * C) throwInvalidArgument("synthesizer: need one tree per rank and part");
  const double chunkBytes = chunkBytesOf(c, n, bytes, C);
  std::vector<Transfer> all = buildTransfers(c, trees, model, chunkBytes);
  schedule(all, model, order == Order::Mirrored ? Order::EarliestStartFirst : order);  // also numbers topo
  if (order == Order::Mirrored && c != Collective::AllGather) {
    std::vector<Transfer> ag = buildTransfers(Collective::AllGather, trees, model, chunkBytes);
    schedule(ag, model, Order::EarliestStartFirst);
    double span = 0;
    std::map<std::tuple<uint32_t, int, int>, const Transfer*> mirror;  // (chunk, from, to) of the AG
    for (const Transfer& t : ag) {
      span = std::max(span, t.end);
      mirror.emplace(std::make_tuple(t.chunk, t.from, t.to), &t);
    }
    for (Transfer& t : all) {
      const Transfer* m = t.reduce ? mirror.at({t.chunk, t.to, t.from}) : mirror.at({t.chunk, t.from, t.to});
      t.start = t.reduce ? span - m->end : span + m->start;
      t.end = t.reduce ? span - m->start : span + m->end;
    }
  }
  std::vector<uint32_t> sorted(all.size());
  for (uint32_t t = 0; t < sorted.size(); ++t) sorted[t] = t;
  std::sort(sorted.begin(), sorted.end(), [&](uint32_t a, uint32_t b) {
    return std::tie(all[a].end, all[a].topo) < std::tie(all[b].end, all[b].topo);
  });

  Lowering low(c, n, C);
  const size_t slots = trees.size() * idx(n);
  std::vector<std::optional<StepRef>> lastReduce(slots), agRecv(slots), rsSend(slots);
  const auto at = [&](uint32_t k, int r) { return idx(static_cast<int>(k)) * idx(n) + idx(r); };
  bool usesScratch = false;
  for (uint32_t t : sorted) {
    const Transfer& tr = all[t];
    const uint32_t k = tr.chunk;
    const int s = trees[k].source;
    const uint32_t part = k % C;
    const int u = tr.from, v = tr.to;
    const uint16_t sendLane = low.lane(u, v, -1);
    const uint16_t recvLane = low.lane(v, -1, u);
    if (tr.reduce) {
      const std::optional<StepRef> mine = lastReduce[at(k, u)];
      if (mine) usesScratch = true;
      rsSend[at(k, u)] = low.add(u, sendLane, Step{StepKind::Send, mine ? scratch(k) : input(k), {}, {}}, mine);
      const ChunkRange accum = v == s ? output(c == Collective::ReduceScatter ? part : k) : scratch(k);
      const std::optional<StepRef> prev = lastReduce[at(k, v)];
      lastReduce[at(k, v)] =
          low.add(v, recvLane, Step{StepKind::RecvReduceCopy, prev ? accum : input(k), accum, {}}, prev);
    } else {
      ChunkRange src = output(k);
      std::optional<StepRef> dep;
      if (u == s) {
        if (c == Collective::AllGather) {
          src = input(part);
        } else {
          dep = lastReduce[at(k, s)];
        }
      } else {
        dep = agRecv[at(k, u)];
      }
      low.add(u, sendLane, Step{StepKind::Send, src, {}, {}}, dep);
      agRecv[at(k, v)] = low.add(v, recvLane, Step{StepKind::Recv, {}, output(k), {}},
                                 c == Collective::AllReduce ? rsSend[at(k, v)] : std::nullopt);
    }
  }
  Plan& plan = low.plan();
  if (c == Collective::AllGather) {
    // Out of place the own block is a local copy; in place it is the same memory and the executor skips it.
    for (int r = 0; r < n; ++r) {
      const uint16_t l = low.lane(r, -1, -1);
      low.add(r, l, Step{StepKind::Copy, input(0, C), output(static_cast<uint32_t>(r) * C, C), {}}, std::nullopt);
    }
  }
  if (usesScratch) plan.scratchChunks = static_cast<uint32_t>(trees.size());
  plan.inPlace = true;
  plan.outOfPlace = true;
  return std::move(plan);
}

void SynthResult::consider(Plan candidate, double time, const std::string& familyName, const std::string& strategyName,
                           uint32_t C, int hops) {
  ++candidates;
  auto fam = std::find_if(families.begin(), families.end(), [&](const FamilyTime& f) { return f.family == familyName; });
  if (fam == families.end()) families.push_back({familyName, time});
  else fam->timeUs = std::min(fam->timeUs, time);
  if (hasCandidate && time >= timeUs) return;
  hasCandidate = true;
  plan = std::move(candidate);
  timeUs = time;
  family = familyName;
  strategy = strategyName;
  chunksPerRank = C;
  maxHops = hops;
}

SynthResult synthesize(const CostModel& model, Collective c, uint64_t bytes, const SynthOptions& requested) {
  const SynthOptions options = applySketch(requested);  // sketch.cpp: chunks, budget, MILP time, contiguity
  if (c == Collective::AllToAll) return synthesizeAllToAll(model, bytes, options);  // alltoall.cpp
  const auto t0 = Clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const int n = model.nranks();
  if (c != Collective::AllGather && c != Collective::ReduceScatter && c != Collective::AllReduce) {
    throwInvalidArgument(std::string("synthesizer: ") + collectiveName(c) + " is not supported");
  }
  if (n < 1) throwInvalidArgument("synthesizer: the cost model has no ranks");
  if (options.minChunksPerRank < 1 || options.maxChunksPerRank < options.minChunksPerRank) {
    throwInvalidArgument("synthesizer: chunks per rank must satisfy 1 <= min <= max");
  }
  SynthResult result;
  if (n == 1) {
    result.plan = ringPlan(c, 1, -1, 1);
    result.timeUs = simulate(result.plan, bytes, model, options.sim).finishUs;
    result.strategy = result.family = "ring";
    result.chunksPerRank = 1;
    result.candidates = 1;
    result.seconds = elapsed();
    return result;
  }

  const auto consider = [&](Plan plan, const std::string& family, const std::string& strategy, uint32_t C, int hops) {
    const double time = simulate(plan, bytes, model, options.sim).finishUs;
    result.consider(std::move(plan), time, family, strategy, C, hops);
    return time;
  };
  double slowestCandidate = 0;  // seconds: one candidate's lowering + simulation (grows with C and N)
  const auto outOfTime = [&] {
    // Stops before a candidate that would likely end past the budget (64 ranks: one takes tens of seconds).
    if (result.hasCandidate && elapsed() + slowestCandidate > options.budgetSeconds) {
      result.budgetExhausted = true;
      return true;
    }
    return false;
  };

  auto direct = directPairs(model);
  if (options.sketch && options.sketch->allowedPairs.size() == idx(n)) {  // sketch.hpp: intranode / internode
    for (int u = 0; u < n; ++u)
      for (int v = 0; v < n; ++v) direct[idx(u)][idx(v)] = direct[idx(u)][idx(v)] && options.sketch->allowedPairs[idx(u)][idx(v)];
  }
  std::vector<std::vector<int>> rings;
  for (const std::vector<int>& cycle : hamiltonianCycles(model, 3)) {
    rings.push_back(cycle);
    rings.emplace_back(cycle.rbegin(), cycle.rend());
  }
  const int rotation = static_cast<int>(options.seed % static_cast<uint64_t>(n));
  const bool multiHost = model.rankHost.size() == idx(n) &&
                         std::any_of(model.rankHost.begin(), model.rankHost.end(), [&](int h) { return h != model.rankHost[0]; });

  // The built-in generators compete first, so a tight budget (or a long MILP) never leaves them out: rings with
  // 1..N channels, and recursive doubling / tree / direct where they implement the collective (they win at small
  // sizes, where latency rules).
  const auto builtinWanted = [&](const char* family) { return !options.sketch || options.sketch->wantsFamily(family); };
  if (options.ringFallback) {
    // Channel counts 1, 2, 4, .. 16 (a 64-channel ring on 64 ranks takes seconds to simulate and never wins on a
    // model where channels share links); past the first, only while the budget lasts.
    for (int ch = 1; ch <= std::min({n, kMaxChannels, 16}) && builtinWanted("ring") && (ch == 1 || !outOfTime()); ch *= 2) {
      consider(ringPlan(c, n, -1, ch), "ring", "builtin ring " + std::to_string(ch) + "ch",
               static_cast<uint32_t>(ch), n - 1);
    }
    for (Algorithm a : {Algorithm::RecursiveDoubling, Algorithm::Tree, Algorithm::Direct}) {
      if (!algorithmSupports(a, c) || !builtinWanted(algorithmName(a))) continue;
      try {
        int log2n = 0;
        while ((1 << log2n) < n) ++log2n;
        const int hops = a == Algorithm::Direct ? 1 : a == Algorithm::Tree ? 2 * log2n : log2n;
        consider(makePlan(a, c, n, 0, 1), algorithmName(a), std::string("builtin ") + algorithmName(a), 1, hops);
      } catch (const Error&) {
        // a generator that does not cover this rank count is simply not a candidate
      }
    }
  }

  double slowestBuild = 0;  // seconds: growing one family's trees (grows faster than C: rip-up passes)
  for (uint32_t C = options.minChunksPerRank; C <= options.maxChunksPerRank && !outOfTime(); ++C) {
    Context ctx{model, n, chunkBytesOf(c, n, bytes, C), direct, {}, {}};
    ctx.time.assign(idx(n), std::vector<double>(idx(n), 0.0));
    ctx.hold = ctx.time;
    for (int u = 0; u < n; ++u) {
      for (int v = 0; v < n; ++v) {
        if (u == v) continue;
        ctx.time[idx(u)][idx(v)] = transferTime(model, u, v, ctx.chunkBytes);
        ctx.hold[idx(u)][idx(v)] = model.occupancyUs(u, v, ctx.chunkBytes);
      }
    }
    // Trees are grown lazily, family by family, so the budget also bounds the growing (64 ranks: seconds each).
    struct Candidate {
      std::string family, label;
      std::function<std::vector<Tree>()> grow;
      std::vector<Tree> trees;
    };
    std::vector<Candidate> candidates;
    candidates.push_back({"bfs", "bfs", [&] { return buildTrees(ctx, C, Builder::Bfs, 0, 2, rotation); }, {}});
    for (double lambda : {0.0, 0.5, 2.0}) {
      char label[32];
      std::snprintf(label, sizeof label, "pack(l=%.1f)", lambda);
      candidates.push_back({"pack", label, [&, lambda] { return buildTrees(ctx, C, Builder::Pack, lambda, 3, rotation); }, {}});
    }
    candidates.push_back({"star", "star", [&] { return starTrees(n, C); }, {}});
    if (multiHost) {
      const std::vector<int>& host = model.rankHost;
      candidates.push_back({"hier", "hier-rail-bfs",
                            [&] { return hierTrees(ctx, host, C, Crossing::Rail, Builder::Bfs, 0, 2, rotation); }, {}});
      candidates.push_back({"hier", "hier-rail-pack(l=0.5)",
                            [&] { return hierTrees(ctx, host, C, Crossing::Rail, Builder::Pack, 0.5, 3, rotation); }, {}});
      candidates.push_back({"hier", "hier-gw-bfs",
                            [&] { return hierTrees(ctx, host, C, Crossing::Gateway, Builder::Bfs, 0, 2, rotation); }, {}});
      candidates.push_back({"hier", "hier-pack(l=0.5)",
                            [&] { return hierTrees(ctx, host, C, Crossing::Any, Builder::Pack, 0.5, 3, rotation); }, {}});
    }
    if (!rings.empty()) {
      candidates.push_back({"rings", "rings/" + std::to_string(rings.size()), [&] { return ringTrees(n, C, rings); }, {}});
    }
    const bool wantMilp = options.milp;
    const std::vector<Tree>* warm = nullptr;  // the fastest heuristic trees of this C: the MILP's warm start
    double warmUs = 0;
    Order warmOrder = Order::LongestRemainingFirst;
    for (Candidate& cand : candidates) {
      const bool wanted = !options.sketch || options.sketch->wantsFamily(cand.family);
      if (!wanted && !wantMilp) continue;
      if (result.hasCandidate && elapsed() + slowestBuild + slowestCandidate > options.budgetSeconds) {
        result.budgetExhausted = true;
        break;
      }
      const double growStart = elapsed();
      cand.trees = cand.grow();
      slowestBuild = std::max(slowestBuild, elapsed() - growStart);
      int hops = 0;
      for (const Tree& t : cand.trees) hops = std::max(hops, treeDepth(t));
      for (Order order : {Order::LongestRemainingFirst, Order::EarliestStartFirst, Order::Mirrored}) {
        if (outOfTime()) break;
        if (order == Order::Mirrored && c == Collective::AllGather) continue;
        const double candidateStart = elapsed();
        Plan plan = lowerTrees(c, cand.trees, C, model, bytes, order);
        plan.name = "synth-" + cand.family;
        const std::string strategy = cand.label + " C=" + std::to_string(C) + " order=" + orderName(order);
        const double us = wanted ? consider(std::move(plan), cand.family, strategy, C, hops)
                                 : simulate(plan, bytes, model, options.sim).finishUs;
        if (warm == nullptr || us < warmUs) std::tie(warm, warmUs, warmOrder) = std::make_tuple(&cand.trees, us, order);
        slowestCandidate = std::max(slowestCandidate, elapsed() - candidateStart);
      }
    }
    if (wantMilp && warm != nullptr && !outOfTime()) {  // routing_milp.cpp
      for (MilpCandidate& m : milpCandidates(model, c, bytes, C, *warm, warmOrder, warmUs, options,
                                             options.budgetSeconds - elapsed())) {
        consider(std::move(m.plan), "milp", m.strategy, C, m.hops);
      }
    }
  }
  if (options.contiguity && result.hasCandidate) {  // contiguity.cpp
    applyContiguity(result, model, bytes, options, options.budgetSeconds - elapsed());
  }
  result.plan.predictedMicros = result.timeUs;
  if (options.validate) validateOrThrow(result.plan, ncclInternalError);
  result.seconds = elapsed();
  return result;
}

SynthResult synthesize(const topo::Topology& topology, const std::vector<topo::VertexId>& rankDevice, Collective c,
                       uint64_t bytes, const SynthOptions& options) {
  const std::vector<topo::VertexId> devices = rankDevice.empty() ? defaultRankDevices(topology) : rankDevice;
  SynthOptions resolved = options;
  if (resolved.sketch) resolveSketch(*resolved.sketch, topology, devices);  // sketch.cpp
  SynthResult result = synthesize(CostModel::fromTopology(topology, devices), c, bytes, resolved);
  result.plan.topologyFingerprint = topology.fingerprint();
  return result;
}

}  // namespace topoccl::algo::synth
