// All-to-all synthesis (see synthesizer.hpp, README.md): every (source, destination) block is cut into C
// parts, each part routed over a path of rank pairs (store-and-forward through scratch on relay ranks),
// the transfers list-scheduled on the cost model's resources, lowered to lanes and simulated.
//   routings   fixed   every part on the cost model's own route (what the built-in direct plan does)
//              lp      a max-concurrent multi-commodity flow LP over the cost model's resources (COIN-OR
//                      CLP; arcs = all rank pairs, each consuming its route's resources), then min total
//                      resource use at the optimum; per-source flows decomposed into paths, quantized to C
//              lp-rr   lp, then rip-up-and-reroute of single parts (min-max resource load) over the LP's
//                      paths, the fixed route and every 2-hop path of direct pairs
//              greedy  the same rip-up-and-reroute from nothing (least-loaded paths)
//   ordering   longest-remaining-first or earliest-start-first list scheduling (one message per resource)
//   lowering   one send lane per (peer, channel), one receive lane per (peer, channel); channel 0 or, in
//              the "split" variant, channel 1 for relayed (second and later) hops. The last hop of a part
//              waits for the rank's own send of the same chunk, so one plan is valid in place and out of place.
#include <ClpSimplex.hpp>
#include <CoinPackedMatrix.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <tuple>

#include "algorithms/generators.hpp"
#include "algorithms/msccl_xml.hpp"
#include "algorithms/synthesizer/synthesizer.hpp"
#include "algorithms/validator.hpp"
#include "common/error.hpp"

namespace topoccl::algo::synth {
namespace {

using Clock = std::chrono::steady_clock;
using Path = std::vector<int>;  // ranks from source to destination

size_t at(int v) { return static_cast<size_t>(v); }

ChunkRange inputChunk(uint32_t offset, uint32_t count = 1) { return {BufferId::Input, offset, count}; }
ChunkRange outputChunk(uint32_t offset, uint32_t count = 1) { return {BufferId::Output, offset, count}; }
ChunkRange scratchChunk(uint32_t offset) { return {BufferId::Scratch, offset, 1}; }

// ---- the LP ---------------------------------------------------------------------------------------------

struct Arc {
  int from = -1, to = -1;
};

// The direct pairs (a route through a third rank is that rank's two hops, relayed store-and-forward: cut-through
// routes that hold two links at once pack worse). Every pair when directPairsOnly is false.
std::vector<Arc> arcsOf(const CostModel& model, bool directPairsOnly) {
  const auto direct = directPairs(model);
  std::vector<Arc> arcs;
  for (int u = 0; u < model.nranks(); ++u)
    for (int v = 0; v < model.nranks(); ++v)
      if (u != v && (!directPairsOnly || direct[at(u)][at(v)])) arcs.push_back({u, v});
  return arcs;
}

double betaScale(const CostModel& model) {
  double lo = 0;
  for (const CostResource& r : model.resources())
    if (r.betaUsPerByte > 0 && (lo == 0 || r.betaUsPerByte < lo)) lo = r.betaUsPerByte;
  return lo > 0 ? lo : 1.0;
}

}  // namespace

AllToAllFlow allToAllFlow(const CostModel& model, bool directPairsOnly, double timeLimitSeconds) {
  const auto t0 = Clock::now();
  const int n = model.nranks();
  AllToAllFlow out;
  out.paths.assign(at(n) * at(n), {});
  if (n < 2) return out;
  const std::vector<Arc> arcs = arcsOf(model, directPairsOnly);
  const double scale = betaScale(model);
  const size_t R = model.resources().size();

  std::vector<int> tRow, tCol;
  std::vector<double> tVal, colLb, colUb, obj, rowLb, rowUb;
  const auto addColumn = [&](double objective) {
    colLb.push_back(0);
    colUb.push_back(COIN_DBL_MAX);
    obj.push_back(objective);
    return static_cast<int>(obj.size()) - 1;
  };
  const auto addRow = [&](double lb, double ub) {
    rowLb.push_back(lb);
    rowUb.push_back(ub);
    return static_cast<int>(rowLb.size()) - 1;
  };
  const auto set = [&](int row, int col, double value) {
    tRow.push_back(row);
    tCol.push_back(col);
    tVal.push_back(value);
  };
  const int tColumn = addColumn(1);
  // Resource rows: sum of flow * beta over the arcs through it <= T (one block = 1, beta / the smallest beta).
  std::vector<int> resourceRow(R, -1);
  for (size_t r = 0; r < R; ++r) {
    if (model.resource(static_cast<int>(r)).betaUsPerByte <= 0) continue;
    resourceRow[r] = addRow(-COIN_DBL_MAX, 0);
    set(resourceRow[r], tColumn, -1);
  }
  // Second-phase weight of an arc: the resource time it consumes, plus a quarter link per store-and-forward hop.
  std::vector<double> arcWeight(arcs.size(), 0.25);
  for (size_t a = 0; a < arcs.size(); ++a)
    for (int r : model.route(arcs[a].from, arcs[a].to).resources)
      arcWeight[a] += model.resource(r).betaUsPerByte / scale;
  std::vector<std::vector<int>> column(at(n), std::vector<int>(arcs.size(), -1));
  for (int s = 0; s < n; ++s) {
    std::vector<int> cons(at(n), -1);
    for (int v = 0; v < n; ++v)
      if (v != s) cons[at(v)] = addRow(1, 1);  // inflow - outflow = 1 (every other rank wants one block)
    for (size_t a = 0; a < arcs.size(); ++a) {
      const Arc& arc = arcs[a];
      if (arc.to == s) continue;
      const int f = addColumn(0);
      column[at(s)][a] = f;
      set(cons[at(arc.to)], f, 1);
      if (arc.from != s) set(cons[at(arc.from)], f, -1);
      // A resource may appear once per route; its beta per block of flow.
      for (int r : model.route(arc.from, arc.to).resources) {
        if (resourceRow[at(r)] >= 0) set(resourceRow[at(r)], f, model.resource(r).betaUsPerByte / scale);
      }
    }
  }
  const int rows = static_cast<int>(rowLb.size()), cols = static_cast<int>(obj.size());
  CoinPackedMatrix matrix(true, tRow.data(), tCol.data(), tVal.data(), static_cast<CoinBigIndex>(tVal.size()));
  matrix.setDimensions(rows, cols);
  ClpSimplex lp;
  lp.setLogLevel(0);
  lp.messageHandler()->setLogLevel(0);
  lp.loadProblem(matrix, colLb.data(), colUb.data(), obj.data(), rowLb.data(), rowUb.data());
  lp.setOptimizationDirection(1);
  lp.setMaximumSeconds(timeLimitSeconds);
  lp.primal();
  if (!lp.isProvenOptimal()) {
    out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return out;
  }
  const double best = lp.objectiveValue();
  // Phase 2: at (almost) the optimal T, the least total resource use (no flow cycles, few hops).
  lp.setColumnUpper(tColumn, best * (1 + 1e-7) + 1e-9);
  lp.setObjectiveCoefficient(tColumn, 0);
  for (int s = 0; s < n; ++s)
    for (size_t a = 0; a < arcs.size(); ++a)
      if (column[at(s)][a] >= 0) lp.setObjectiveCoefficient(column[at(s)][a], arcWeight[a]);
  lp.primal();
  if (!lp.isProvenOptimal()) {
    out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return out;
  }
  const double* x = lp.primalColumnSolution();
  out.roundsPerBlock = best;
  out.betaUsPerByte = scale;
  out.ok = true;

  // Path decomposition per source: trace back from each destination along the largest remaining inflow.
  constexpr double kEps = 1e-9;
  for (int s = 0; s < n; ++s) {
    std::vector<std::vector<double>> flow(at(n), std::vector<double>(at(n), 0.0));
    for (size_t a = 0; a < arcs.size(); ++a) {
      const int c = column[at(s)][a];
      if (c >= 0 && x[c] > kEps) flow[at(arcs[a].from)][at(arcs[a].to)] = x[c];
    }
    for (int d = 0; d < n; ++d) {
      if (d == s) continue;
      std::vector<std::pair<Path, double>>& list = out.paths[at(s) * at(n) + at(d)];
      double need = 1;
      for (int guard = 0; need > 1e-6 && guard < 4 * n * n; ++guard) {
        Path back{d};
        std::vector<bool> onPath(at(n), false);
        onPath[at(d)] = true;
        double amount = need;
        bool ok = true;
        while (back.back() != s) {
          const int v = back.back();
          int bestU = -1;
          for (int u = 0; u < n; ++u) {
            if (onPath[at(u)] || flow[at(u)][at(v)] <= kEps) continue;
            if (bestU < 0 || flow[at(u)][at(v)] > flow[at(bestU)][at(v)] + 1e-12) bestU = u;
          }
          if (bestU < 0) {
            ok = false;
            break;
          }
          amount = std::min(amount, flow[at(bestU)][at(v)]);
          onPath[at(bestU)] = true;
          back.push_back(bestU);
        }
        if (!ok) break;
        for (size_t i = back.size() - 1; i > 0; --i) flow[at(back[i])][at(back[i - 1])] -= amount;
        need -= amount;
        Path path(back.rbegin(), back.rend());
        const auto it = std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == path; });
        if (it == list.end()) {
          list.emplace_back(std::move(path), amount);
        } else {
          it->second += amount;
        }
      }
      if (need > 1e-6) list.emplace_back(Path{s, d}, need);  // numerical leftovers: the fixed route
      std::stable_sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
    }
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

namespace {

// ---- routing: C parts per (source, destination) ------------------------------------------------------------

// routes[(s * n + d) * C + p] is the path of part p of the block s sends to d.
using Routing = std::vector<Path>;

struct LoadModel {
  const CostModel& model;
  int n;
  uint32_t C;
  double partBytes;
  std::vector<double> load;  // resource busy time (bandwidth only)

  void apply(const Path& path, double sign) {
    for (size_t h = 0; h + 1 < path.size(); ++h)
      for (int r : model.route(path[h], path[h + 1]).resources)
        load[at(r)] += sign * partBytes * model.resource(r).betaUsPerByte;
  }
  // (max load over the path's resources once the part is added, hops, total resource time of the path)
  std::tuple<double, size_t, double> cost(const Path& path) const {
    double worst = 0, total = 0;
    std::map<int, double> add;
    for (size_t h = 0; h + 1 < path.size(); ++h)
      for (int r : model.route(path[h], path[h + 1]).resources) add[r] += partBytes * model.resource(r).betaUsPerByte;
    for (const auto& [r, extra] : add) {
      worst = std::max(worst, load[at(r)] + extra);
      total += extra;
    }
    return {worst, path.size(), total};
  }
};

Routing fixedRouting(int n, uint32_t C) {
  Routing routes(at(n) * at(n) * C);
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d)
      if (s != d)
        for (uint32_t p = 0; p < C; ++p) routes[(at(s) * at(n) + at(d)) * C + p] = {s, d};
  return routes;
}

// Largest-remainder quantization of each commodity's path weights to C parts.
Routing lpRouting(const AllToAllFlow& flow, int n, uint32_t C) {
  Routing routes(at(n) * at(n) * C);
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      const auto& list = flow.paths[at(s) * at(n) + at(d)];
      double total = 0;
      for (const auto& e : list) total += e.second;
      std::vector<uint32_t> count(list.size(), 0);
      std::vector<std::pair<double, size_t>> rest;
      uint32_t used = 0;
      for (size_t i = 0; i < list.size(); ++i) {
        const double share = list[i].second / total * C;
        count[i] = static_cast<uint32_t>(std::floor(share + 1e-9));
        used += count[i];
        rest.emplace_back(share - count[i], i);
      }
      std::stable_sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      for (size_t i = 0; used < C; ++i, ++used) ++count[rest[i % rest.size()].second];
      uint32_t p = 0;
      for (size_t i = 0; i < list.size(); ++i)
        for (uint32_t k = 0; k < count[i] && p < C; ++k) routes[(at(s) * at(n) + at(d)) * C + p++] = list[i].first;
    }
  }
  return routes;
}

// Rip-up and reroute single parts over candidate paths (min-max resource load; then fewer hops, less use).
void reroute(Routing& routes, const CostModel& model, uint32_t C, double partBytes, const std::vector<std::vector<bool>>& direct,
             const AllToAllFlow* flow, int passes) {
  const int n = model.nranks();
  LoadModel lm{model, n, C, partBytes, std::vector<double>(model.resources().size(), 0.0)};
  for (const Path& p : routes)
    if (!p.empty()) lm.apply(p, 1);
  for (int pass = 0; pass < passes; ++pass) {
    for (uint32_t p = 0; p < C; ++p) {
      for (int k = 0; k < n * n; ++k) {
        // Rotated commodity order so no source is always first.
        const int s = k % n, d = (s + 1 + k / n + static_cast<int>(p)) % n;
        if (s == d) continue;
        Path& cur = routes[(at(s) * at(n) + at(d)) * C + p];
        std::vector<Path> options;
        if (direct[at(s)][at(d)]) options.push_back({s, d});
        if (flow && flow->ok)
          for (const auto& e : flow->paths[at(s) * at(n) + at(d)]) options.push_back(e.first);
        for (int w = 0; w < n; ++w)
          if (w != s && w != d && direct[at(s)][at(w)] && direct[at(w)][at(d)]) options.push_back({s, w, d});
        if (options.empty()) options.push_back({s, d});
        if (!cur.empty()) lm.apply(cur, -1);
        std::optional<std::tuple<double, size_t, double>> best;
        Path chosen;
        for (const Path& o : options) {
          auto key = lm.cost(o);
          std::get<0>(key) = std::round(std::get<0>(key) * 1e9) / 1e9;  // ties across rounding noise
          if (!best || key < *best) {
            best = key;
            chosen = o;
          }
        }
        cur = chosen;
        lm.apply(cur, 1);
      }
    }
  }
}

// ---- ordering ---------------------------------------------------------------------------------------------

struct Transfer {
  int from = -1, to = -1;
  int src = -1, dst = -1;  // the commodity
  uint32_t part = 0;
  uint32_t hop = 0;
  bool last = false;
  bool staged = false;  // last hop of a part whose reverse part is one hop too: lands in scratch, then a Copy
  std::vector<uint32_t> preds, succs;
  double cost = 0, hold = 0, start = 0, end = 0, remaining = 0;  // cost: start to arrival; hold: resources busy
  uint32_t topo = 0;
};

struct Transfers {
  std::vector<Transfer> all;
  std::vector<uint32_t> first, lastOf;  // per route index
};

Transfers buildTransfers(const Routing& routes, const CostModel& model, int n, uint32_t C, double partBytes) {
  Transfers tr;
  tr.first.assign(routes.size(), UINT32_MAX);
  tr.lastOf.assign(routes.size(), UINT32_MAX);
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      for (uint32_t p = 0; p < C; ++p) {
        const size_t k = (at(s) * at(n) + at(d)) * C + p;
        const Path& path = routes[k];
        uint32_t prev = UINT32_MAX;
        for (size_t h = 0; h + 1 < path.size(); ++h) {
          Transfer t;
          t.from = path[h];
          t.to = path[h + 1];
          t.src = s;
          t.dst = d;
          t.part = p;
          t.hop = static_cast<uint32_t>(h);
          t.last = h + 2 == path.size();
          t.cost = model.transferUs(t.from, t.to, partBytes);
          t.hold = model.occupancyUs(t.from, t.to, partBytes);
          if (prev != UINT32_MAX) t.preds.push_back(prev);
          tr.all.push_back(std::move(t));
          prev = static_cast<uint32_t>(tr.all.size() - 1);
          if (h == 0) tr.first[k] = prev;
        }
        tr.lastOf[k] = prev;
      }
    }
  }
  // In place: the part arriving from s into d's output block s overwrites d's input block s, which d sends to s:
  // the receive waits for that send. Where both are single hops that would be a cycle: stage (scratch, then Copy).
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      for (uint32_t p = 0; p < C; ++p) {
        Transfer& last = tr.all[tr.lastOf[(at(s) * at(n) + at(d)) * C + p]];
        const uint32_t reverse = tr.first[(at(d) * at(n) + at(s)) * C + p];
        if (last.hop == 0 && tr.all[reverse].last) {
          last.staged = true;
        } else {
          last.preds.push_back(reverse);
        }
      }
    }
  }
  for (uint32_t t = 0; t < tr.all.size(); ++t)
    for (uint32_t p : tr.all[t].preds) tr.all[p].succs.push_back(t);
  return tr;
}

void schedule(std::vector<Transfer>& all, const CostModel& model, Order order) {
  const size_t count = all.size();
  std::vector<uint32_t> pending(count), topoOrder;
  topoOrder.reserve(count);
  for (size_t t = 0; t < count; ++t) pending[t] = static_cast<uint32_t>(all[t].preds.size());
  {
    std::vector<uint32_t> left = pending;
    for (uint32_t t = 0; t < count; ++t)
      if (left[t] == 0) topoOrder.push_back(t);
    for (size_t head = 0; head < topoOrder.size(); ++head) {
      const uint32_t t = topoOrder[head];
      all[t].topo = static_cast<uint32_t>(head);
      for (uint32_t s : all[t].succs)
        if (--left[s] == 0) topoOrder.push_back(s);
    }
    if (topoOrder.size() != count) throwInternalError("all-to-all synthesizer: cyclic transfer graph");
  }
  for (size_t i = count; i-- > 0;) {
    Transfer& t = all[topoOrder[i]];
    double best = 0;
    for (uint32_t s : t.succs) best = std::max(best, all[s].remaining);
    t.remaining = t.cost + best;
  }
  std::vector<double> resourceFree(model.resources().size(), 0.0), readyAt(count, 0.0);
  using Key = std::tuple<double, double, uint32_t>;
  std::priority_queue<Key, std::vector<Key>, std::greater<>> heap;
  const auto startOf = [&](uint32_t t) {
    double start = readyAt[t];
    for (int r : model.route(all[t].from, all[t].to).resources) start = std::max(start, resourceFree[at(r)]);
    return start;
  };
  const auto keyOf = [&](uint32_t t) {
    const double start = startOf(t);
    return order == Order::LongestRemainingFirst ? Key{-all[t].remaining, start, t} : Key{start, -all[t].remaining, t};
  };
  for (uint32_t t = 0; t < count; ++t)
    if (pending[t] == 0) heap.push(keyOf(t));
  // Keys only grow (resources only get busier), so a popped key still current is the minimum.
  while (!heap.empty()) {
    const Key top = heap.top();
    heap.pop();
    const uint32_t t = std::get<2>(top);
    const Key now = keyOf(t);
    if (now != top) {
      heap.push(now);
      continue;
    }
    Transfer& tr = all[t];
    tr.start = startOf(t);
    tr.end = tr.start + tr.cost;
    for (int r : model.route(tr.from, tr.to).resources) resourceFree[at(r)] = tr.start + tr.hold;
    for (uint32_t s : tr.succs) {
      readyAt[s] = std::max(readyAt[s], tr.end);
      if (--pending[s] == 0) heap.push(keyOf(s));
    }
  }
}

// ---- lowering ---------------------------------------------------------------------------------------------

Plan lower(Transfers& tr, int n, uint32_t C, bool splitRelayChannel) {
  Plan plan;
  plan.name = "synth-a2a";
  plan.collective = Collective::AllToAll;
  plan.nranks = n;
  plan.root = -1;
  plan.chunksPerBlock = C;
  plan.inputChunks = static_cast<uint32_t>(n) * C;
  plan.outputChunks = static_cast<uint32_t>(n) * C;
  plan.ranks.resize(at(n));
  std::vector<std::map<std::tuple<int, int, int>, uint16_t>> laneOf(at(n));
  const auto lane = [&](int rank, int sendPeer, int recvPeer, int channel) {
    auto& map = laneOf[at(rank)];
    const auto key = std::make_tuple(sendPeer, recvPeer, channel);
    if (const auto it = map.find(key); it != map.end()) return it->second;
    auto& lanes = plan.ranks[at(rank)].lanes;
    lanes.push_back({sendPeer, recvPeer, channel, {}});
    const auto id = static_cast<uint16_t>(lanes.size() - 1);
    map.emplace(key, id);
    return id;
  };
  const auto add = [&](int rank, uint16_t laneId, Step step, std::optional<StepRef> dep) {
    if (dep && dep->lane != laneId) step.deps.push_back(*dep);
    auto& steps = plan.ranks[at(rank)].lanes[laneId].steps;
    steps.push_back(std::move(step));
    return StepRef{laneId, static_cast<uint32_t>(steps.size() - 1)};
  };
  std::vector<uint32_t> sorted(tr.all.size());
  for (uint32_t t = 0; t < sorted.size(); ++t) sorted[t] = t;
  std::sort(sorted.begin(), sorted.end(), [&](uint32_t a, uint32_t b) {
    return std::tie(tr.all[a].end, tr.all[a].topo) < std::tie(tr.all[b].end, tr.all[b].topo);
  });
  std::vector<StepRef> sendRef(tr.all.size()), recvRef(tr.all.size());
  std::vector<uint32_t> slotOf(tr.all.size(), UINT32_MAX);  // scratch chunk a relayed or staged part landed in
  std::vector<std::vector<uint32_t>> slotsUsed(at(n), std::vector<uint32_t>(C, 0));
  uint32_t scratchChunks = 0;
  // Local copies (the own block, staged parts) on one lane per rank; the own block first.
  for (int r = 0; r < n; ++r) {
    // Out of place the own block is a local copy; in place it is the same memory and the executor skips it.
    const uint16_t l = lane(r, -1, -1, 0);
    add(r, l, Step{StepKind::Copy, inputChunk(static_cast<uint32_t>(r) * C, C), outputChunk(static_cast<uint32_t>(r) * C, C), {}},
        std::nullopt);
  }
  std::vector<uint32_t> staged;
  for (uint32_t t : sorted) {
    const Transfer& x = tr.all[t];
    const int ch = splitRelayChannel && x.hop > 0 ? 1 : 0;
    const uint16_t sendLane = lane(x.from, x.to, -1, ch);
    const uint16_t recvLane = lane(x.to, -1, x.from, ch);
    std::optional<StepRef> sendDep;
    ChunkRange src = inputChunk(static_cast<uint32_t>(x.dst) * C + x.part);
    if (x.hop > 0) {
      const uint32_t prev = x.preds.front();
      src = scratchChunk(slotOf[prev]);
      sendDep = recvRef[prev];
    }
    sendRef[t] = add(x.from, sendLane, Step{StepKind::Send, src, {}, {}}, sendDep);
    ChunkRange dst;
    std::optional<StepRef> recvDep;
    if (x.last && !x.staged) {
      dst = outputChunk(static_cast<uint32_t>(x.src) * C + x.part);
      recvDep = sendRef[tr.first[(at(x.dst) * at(n) + at(x.src)) * C + x.part]];
    } else {
      const uint32_t slot = slotsUsed[at(x.to)][x.part]++ * C + x.part;
      slotOf[t] = slot;
      scratchChunks = std::max(scratchChunks, slot - x.part + C);
      dst = scratchChunk(slot);
      if (x.staged) staged.push_back(t);
    }
    recvRef[t] = add(x.to, recvLane, Step{StepKind::Recv, {}, dst, {}}, recvDep);
  }
  // A staged part is copied to the output once it arrived and the rank's own send of that chunk went.
  const auto reverseOf = [&](const Transfer& x) { return tr.first[(at(x.dst) * at(n) + at(x.src)) * C + x.part]; };
  const auto copyAt = [&](uint32_t t) {
    return std::make_tuple(std::max(tr.all[t].end, tr.all[reverseOf(tr.all[t])].end), tr.all[t].topo);
  };
  std::stable_sort(staged.begin(), staged.end(), [&](uint32_t a, uint32_t b) { return copyAt(a) < copyAt(b); });
  for (uint32_t t : staged) {
    const Transfer& x = tr.all[t];
    const uint16_t l = lane(x.to, -1, -1, 0);
    Step copy{StepKind::Copy, scratchChunk(slotOf[t]), outputChunk(static_cast<uint32_t>(x.src) * C + x.part),
              {recvRef[t], sendRef[reverseOf(x)]}};
    plan.ranks[at(x.to)].lanes[l].steps.push_back(std::move(copy));
  }
  plan.scratchChunks = scratchChunks;
  plan.inPlace = true;
  plan.outOfPlace = true;
  return plan;
}

bool withinMscclLimits(const Plan& plan) {
  for (const RankProgram& rank : plan.ranks) {
    if (rank.lanes.size() > kMscclMaxTbs) return false;
    for (const Lane& lane : rank.lanes)
      if (lane.steps.size() >= kMscclMaxStepsPerTb) return false;
  }
  return true;
}

}  // namespace

Plan lowerAllToAll(const std::vector<std::vector<int>>& routes, uint32_t chunksPerBlock, const CostModel& model,
                   uint64_t bytes, Order order, bool splitRelayChannel) {
  const int n = model.nranks();
  const uint32_t C = chunksPerBlock;
  if (C < 1 || routes.size() != at(n) * at(n) * C) throwInvalidArgument("all-to-all synthesizer: need n * n * C routes");
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      for (uint32_t p = 0; p < C; ++p) {
        const Path& path = routes[(at(s) * at(n) + at(d)) * C + p];
        if (s == d) {
          if (!path.empty()) throwInvalidArgument("all-to-all synthesizer: a route from a rank to itself");
          continue;
        }
        bool ok = path.size() >= 2 && path.front() == s && path.back() == d;
        for (size_t i = 0; ok && i < path.size(); ++i) {
          ok = path[i] >= 0 && path[i] < n && (i == 0 || path[i] != path[i - 1]);
          for (size_t j = 0; ok && j < i; ++j) ok = path[j] != path[i];
        }
        if (!ok) {
          throwInvalidArgument("all-to-all synthesizer: bad route for part " + std::to_string(p) + " of " +
                               std::to_string(s) + "->" + std::to_string(d));
        }
      }
    }
  }
  const double partBytes = blockBytes(Collective::AllToAll, n, bytes) / C;
  Transfers tr = buildTransfers(routes, model, n, C, partBytes);
  schedule(tr.all, model, order);
  return lower(tr, n, C, splitRelayChannel);
}

SynthResult synthesizeAllToAll(const CostModel& model, uint64_t bytes, const SynthOptions& options) {
  const auto t0 = Clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const int n = model.nranks();
  if (n < 1) throwInvalidArgument("synthesizer: the cost model has no ranks");
  if (options.minChunksPerRank < 1 || options.maxChunksPerRank < options.minChunksPerRank) {
    throwInvalidArgument("synthesizer: chunks per rank must satisfy 1 <= min <= max");
  }
  SynthResult result;
  const auto consider = [&](Plan plan, const std::string& family, const std::string& strategy, uint32_t C, int hops) {
    const double time = simulate(plan, bytes, model, options.sim).finishUs;
    result.consider(std::move(plan), time, family, strategy, C, hops);
  };
  const auto outOfTime = [&] {
    if (result.hasCandidate && elapsed() > options.budgetSeconds) {
      result.budgetExhausted = true;
      return true;
    }
    return false;
  };
  // The built-in direct plan (valid in place and out of place) is the first candidate and the fallback.
  consider(directPlan(Collective::AllToAll, n, 0, 1), "direct", "builtin direct", 1, n > 1 ? 1 : 0);
  if (n > 1) {
    const auto direct = directPairs(model);
    const AllToAllFlow flow = allToAllFlow(model, true, std::max(1.0, options.budgetSeconds / 2));
    for (uint32_t C = options.minChunksPerRank; C <= options.maxChunksPerRank && !outOfTime(); ++C) {
      const double partBytes = blockBytes(Collective::AllToAll, n, bytes) / C;
      struct Candidate {
        std::string family;
        Routing routes;
      };
      std::vector<Candidate> candidates;
      candidates.push_back({"fixed", fixedRouting(n, C)});
      if (flow.ok) {
        candidates.push_back({"lp", lpRouting(flow, n, C)});
        Routing refined = candidates.back().routes;
        reroute(refined, model, C, partBytes, direct, &flow, 3);
        candidates.push_back({"lp-rr", std::move(refined)});
      }
      Routing greedy(at(n) * at(n) * C);
      reroute(greedy, model, C, partBytes, direct, nullptr, 3);
      candidates.push_back({"greedy", std::move(greedy)});
      for (size_t i = 0; i < candidates.size(); ++i) {
        const Candidate& cand = candidates[i];
        bool duplicate = false;
        for (size_t j = 0; j < i && !duplicate; ++j) duplicate = candidates[j].routes == cand.routes;
        if (duplicate) continue;
        int hops = 0;
        bool relays = false;
        for (const Path& p : cand.routes) {
          hops = std::max(hops, static_cast<int>(p.size()) - 1);
          relays = relays || p.size() > 2;
        }
        for (Order order : {Order::LongestRemainingFirst, Order::EarliestStartFirst}) {
          for (bool split : {false, true}) {
            if (split && !relays) continue;
            if (outOfTime()) break;
            Plan plan = lowerAllToAll(cand.routes, C, model, bytes, order, split);
            if (!withinMscclLimits(plan)) continue;
            plan.name = "synth-a2a-" + cand.family;
            const std::string strategy = cand.family + " C=" + std::to_string(C) +
                                         (order == Order::LongestRemainingFirst ? " order=lrf" : " order=esf") +
                                         (split ? " relay-channel" : "");
            consider(std::move(plan), cand.family, strategy, C, hops);
          }
        }
      }
    }
  }
  result.plan.predictedMicros = result.timeUs;
  if (options.validate) validateOrThrow(result.plan, ncclInternalError);
  result.seconds = elapsed();
  return result;
}

}  // namespace topoccl::algo::synth
