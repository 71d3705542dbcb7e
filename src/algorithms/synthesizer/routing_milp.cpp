// Routing MILP (TACCL stage (a), synthesizers.md §1.3) on COIN-OR CBC; see synthesizer.hpp.
#include <CbcHeuristic.hpp>
#include <CbcHeuristicLocal.hpp>
#include <CbcHeuristicRINS.hpp>
#include <CbcModel.hpp>
#include <CglClique.hpp>
#include <CglProbing.hpp>
#include <CoinMessageHandler.hpp>
#include <CoinPackedMatrix.hpp>
#include <OsiClpSolverInterface.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <tuple>

#include "algorithms/synthesizer/synthesizer.hpp"
#include "common/error.hpp"

namespace topoccl::algo::synth {
namespace {

size_t idx(int v) { return static_cast<size_t>(v); }

double chunkBytesFor(Collective c, int n, uint64_t bytes, uint32_t C) {
  const uint32_t perBlock = c == Collective::AllReduce ? static_cast<uint32_t>(n) * C : C;
  return blockBytes(c, n, bytes) / static_cast<double>(perBlock);
}

// Per ordered pair: time of one chunk (alpha + bytes beta) and the resources a selected tree arc occupies
// (AG: the route u -> v; RS: v -> u; AR: both).
struct ArcCosts {
  int n = 0;
  double eps = 0;
  std::vector<std::vector<double>> time;                       // forward transfer time u -> v
  std::vector<std::vector<std::vector<std::pair<int, double>>>> occupancy;  // (resource, time held)
};

ArcCosts arcCosts(const CostModel& model, Collective c, uint64_t bytes, uint32_t C) {
  ArcCosts a;
  a.n = model.nranks();
  const int n = a.n;
  const double chunk = chunkBytesFor(c, n, bytes, C);
  a.time.assign(idx(n), std::vector<double>(idx(n), 0.0));
  a.occupancy.assign(idx(n), std::vector<std::vector<std::pair<int, double>>>(idx(n)));
  double minAlpha = std::numeric_limits<double>::infinity();
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (u == v) continue;
      a.time[idx(u)][idx(v)] = model.transferUs(u, v, chunk);
      const double lat = model.route(u, v).latencyUs;
      if (lat > 0) minAlpha = std::min(minAlpha, lat);
      std::map<int, double> occ;
      if (c != Collective::ReduceScatter)
        for (int r : model.route(u, v).resources) occ[r] += model.occupancyUs(u, v, chunk);
      if (c != Collective::AllGather) {
        const double back = model.occupancyUs(v, u, chunk) + model.gammaUsPerByte * chunk;
        for (int r : model.route(v, u).resources) occ[r] += back;
      }
      a.occupancy[idx(u)][idx(v)].assign(occ.begin(), occ.end());
    }
  }
  a.eps = std::isfinite(minAlpha) ? std::max(1e-6, 0.01 * minAlpha) : 1e-3;
  return a;
}

// Zb (max resource occupancy) and Zl (max arrival, eps per hop) of a set of trees.
std::pair<double, double> objectiveParts(const ArcCosts& a, size_t resources, const std::vector<Tree>& trees) {
  std::vector<double> load(resources, 0.0);
  double zl = 0;
  for (const Tree& t : trees) {
    std::vector<double> arrive(idx(a.n), -1.0);
    arrive[idx(t.source)] = 0;
    for (int v = 0; v < a.n; ++v) {
      const int u = t.parent[idx(v)];
      if (u < 0) continue;
      for (const auto& [r, time] : a.occupancy[idx(u)][idx(v)]) load[idx(r)] += time;
    }
    // Arrival times along parent chains (trees are small: walk up).
    for (int v = 0; v < a.n; ++v) {
      double sum = 0;
      for (int w = v; t.parent[idx(w)] >= 0; w = t.parent[idx(w)]) sum += a.time[idx(t.parent[idx(w)])][idx(w)] + a.eps;
      zl = std::max(zl, sum);
    }
  }
  double zb = 0;
  for (double l : load) zb = std::max(zb, l);
  return {zb, zl};
}

std::vector<std::vector<int>> hopDistances(const std::vector<std::vector<bool>>& graph) {
  const int n = static_cast<int>(graph.size());
  std::vector<std::vector<int>> dist(idx(n), std::vector<int>(idx(n), 1 << 20));
  for (int s = 0; s < n; ++s) {
    std::queue<int> q;
    dist[idx(s)][idx(s)] = 0;
    q.push(s);
    while (!q.empty()) {
      const int u = q.front();
      q.pop();
      for (int v = 0; v < n; ++v) {
        if (!graph[idx(u)][idx(v)] || dist[idx(s)][idx(v)] <= dist[idx(s)][idx(u)] + 1) continue;
        dist[idx(s)][idx(v)] = dist[idx(s)][idx(u)] + 1;
        q.push(v);
      }
    }
  }
  return dist;
}

// Is r -> r + offset (mod n) an automorphism of the model's costs and of the arc graph?
bool rotationSymmetric(const CostModel& model, const std::vector<std::vector<bool>>& graph, int offset) {
  const int n = model.nranks();
  if (offset <= 0 || offset >= n) return false;
  for (int u = 0; u < n; ++u) {
    for (int v = 0; v < n; ++v) {
      if (u == v) continue;
      const int su = (u + offset) % n, sv = (v + offset) % n;
      const CostRoute& a = model.route(u, v);
      const CostRoute& b = model.route(su, sv);
      if (graph[idx(u)][idx(v)] != graph[idx(su)][idx(sv)]) return false;
      if (std::abs(a.latencyUs - b.latencyUs) > 1e-9 * (1 + a.latencyUs) ||
          std::abs(a.holdUs - b.holdUs) > 1e-9 * (1 + a.holdUs) ||
          std::abs(a.betaUsPerByte - b.betaUsPerByte) > 1e-12 * (1 + a.betaUsPerByte) ||
          a.resources.size() != b.resources.size()) {
        return false;
      }
    }
  }
  return true;
}

int treeDepthOf(const Tree& t) {
  int deepest = 0;
  for (size_t v = 0; v < t.parent.size(); ++v) {
    int d = 0;
    for (int u = static_cast<int>(v); t.parent[idx(u)] >= 0; u = t.parent[idx(u)]) ++d;
    deepest = std::max(deepest, d);
  }
  return deepest;
}


struct CbcOutcome {
  std::vector<double> solution;  // empty: none
  bool optimal = false, timeLimit = false, infeasible = false;
  double bestBound = 0;
};

// Solves min obj over the rows / columns (integer columns flagged) with CBC, wall-clock limited.
CbcOutcome runCbc(int rows, const std::vector<int>& tRow, const std::vector<int>& tCol, const std::vector<double>& tVal,
                  const std::vector<double>& colLb, const std::vector<double>& colUb, const std::vector<double>& obj,
                  const std::vector<double>& rowLb, const std::vector<double>& rowUb, const std::vector<bool>& integer,
                  double seconds, const std::vector<double>* warm, double warmObjective) {
  CoinPackedMatrix matrix(true, tRow.data(), tCol.data(), tVal.data(), static_cast<CoinBigIndex>(tVal.size()));
  matrix.setDimensions(rows, static_cast<int>(obj.size()));
  OsiClpSolverInterface solver;
  solver.messageHandler()->setLogLevel(0);
  solver.loadProblem(matrix, colLb.data(), colUb.data(), obj.data(), rowLb.data(), rowUb.data());
  for (size_t j = 0; j < integer.size(); ++j)
    if (integer[j]) solver.setInteger(static_cast<int>(j));
  solver.setHintParam(OsiDoReducePrint, true, OsiHintTry);
  CbcModel cbc(solver);
  cbc.setLogLevel(0);
  cbc.messageHandler()->setLogLevel(0);
  cbc.solver()->messageHandler()->setLogLevel(0);
  cbc.setUseElapsedTime(true);
  cbc.setMaximumSeconds(std::max(0.01, seconds));
  if (warm != nullptr) cbc.setBestSolution(warm->data(), static_cast<int>(warm->size()), warmObjective, true);
  CglProbing probing;
  probing.setUsingObjective(1);
  probing.setMaxPass(1);
  probing.setMaxProbe(50);
  probing.setMaxLook(20);
  cbc.addCutGenerator(&probing, -1, "Probing");
  CglClique clique;
  clique.setStarCliqueReport(false);
  clique.setRowCliqueReport(false);
  cbc.addCutGenerator(&clique, -1, "Clique");
  CbcRounding rounding(cbc);
  cbc.addHeuristic(&rounding);
  CbcHeuristicLocal local(cbc);
  cbc.addHeuristic(&local);
  CbcHeuristicRINS rins(cbc);
  cbc.addHeuristic(&rins);
  cbc.branchAndBound();
  CbcOutcome out;
  out.bestBound = cbc.getBestPossibleObjValue();
  out.optimal = cbc.isProvenOptimal();
  out.timeLimit = cbc.isSecondsLimitReached();
  out.infeasible = cbc.isProvenInfeasible();
  if (const double* best = cbc.bestSolution()) out.solution.assign(best, best + obj.size());
  return out;
}

// Phase 1: trees on shortest hop paths only (dist(s,u) + 1 == dist(s,v)). Any choice of one parent per rank
// among those arcs is a tree of fixed depths, so this is a min-max load assignment with a strong LP and no
// big-M: minimize Zb >= every resource's occupancy. nullopt when a rank is unreachable or CBC finds nothing.
std::optional<std::vector<Tree>> layeredTrees(const ArcCosts& a, size_t R, const std::vector<std::vector<bool>>& graph,
                                              const std::vector<std::vector<int>>& dist, uint32_t C, double seconds) {
  const int n = a.n;
  std::vector<double> colLb{0}, colUb{COIN_DBL_MAX}, obj{1};
  std::vector<bool> integer{false};
  std::vector<double> rowLb, rowUb;
  std::vector<int> tRow, tCol;
  std::vector<double> tVal;
  std::vector<std::map<int, double>> occ(R);
  std::vector<std::tuple<size_t, int, int>> colArc{{0, -1, -1}};  // per column: (tree, u, v)
  for (int s = 0; s < n; ++s) {
    for (uint32_t p = 0; p < C; ++p) {
      const size_t k = idx(s) * C + p;
      for (int v = 0; v < n; ++v) {
        if (v == s) continue;
        if (dist[idx(s)][idx(v)] >= (1 << 20)) return std::nullopt;
        const int row = static_cast<int>(rowLb.size());
        rowLb.push_back(1);
        rowUb.push_back(1);
        for (int u = 0; u < n; ++u) {
          if (u == v || !graph[idx(u)][idx(v)] || dist[idx(s)][idx(u)] + 1 != dist[idx(s)][idx(v)]) continue;
          const int col = static_cast<int>(obj.size());
          colLb.push_back(0);
          colUb.push_back(1);
          obj.push_back(0);
          integer.push_back(true);
          colArc.emplace_back(k, u, v);
          tRow.push_back(row);
          tCol.push_back(col);
          tVal.push_back(1);
          for (const auto& [res, time] : a.occupancy[idx(u)][idx(v)]) occ[idx(res)][col] += time;
        }
      }
    }
  }
  for (size_t res = 0; res < R; ++res) {
    if (occ[res].empty()) continue;
    const int row = static_cast<int>(rowLb.size());
    rowLb.push_back(0);
    rowUb.push_back(COIN_DBL_MAX);
    tRow.push_back(row);
    tCol.push_back(0);
    tVal.push_back(1);
    for (const auto& [col, time] : occ[res]) {
      tRow.push_back(row);
      tCol.push_back(col);
      tVal.push_back(-time);
    }
  }
  const CbcOutcome r = runCbc(static_cast<int>(rowLb.size()), tRow, tCol, tVal, colLb, colUb, obj, rowLb, rowUb, integer,
                              seconds, nullptr, 0);
  if (r.solution.empty()) return std::nullopt;
  std::vector<Tree> trees(idx(n) * C);
  for (int s = 0; s < n; ++s) {
    for (uint32_t p = 0; p < C; ++p) {
      trees[idx(s) * C + p].source = s;
      trees[idx(s) * C + p].parent.assign(idx(n), -1);
    }
  }
  for (size_t col = 1; col < colArc.size(); ++col) {
    const auto [k, u, v] = colArc[col];
    if (r.solution[col] > 0.5) trees[k].parent[idx(v)] = u;
  }
  for (const Tree& t : trees)
    for (int v = 0; v < n; ++v)
      if (v != t.source && t.parent[idx(v)] < 0) return std::nullopt;
  return trees;
}

}  // namespace

double milpObjective(const CostModel& model, Collective c, uint64_t bytes, uint32_t chunksPerRank,
                     const std::vector<Tree>& trees) {
  const ArcCosts a = arcCosts(model, c, bytes, chunksPerRank);
  const auto [zb, zl] = objectiveParts(a, model.resources().size(), trees);
  return zb + zl;
}

MilpRouting routeMilp(const CostModel& model, Collective c, uint64_t bytes, uint32_t chunksPerRank,
                      const std::vector<Tree>& warmStart, const MilpOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = model.nranks();
  const uint32_t C = chunksPerRank;
  if (warmStart.size() != idx(n) * C) throwInvalidArgument("routeMilp: need one warm-start tree per rank and part");
  const ArcCosts a = arcCosts(model, c, bytes, C);
  const size_t R = model.resources().size();
  MilpRouting out;
  out.trees = warmStart;
  {
    const auto [zb, zl] = objectiveParts(a, R, warmStart);
    out.objective = out.warmObjective = zb + zl;
  }
  const auto finish = [&](const std::string& status) {
    out.status = status;
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
  };
  if (n < 3) return finish("trivial (warm start kept)");

  // Arc graph: direct pairs (restricted by the sketch), and for each source the arcs that lie within
  // `slack` hops of a shortest path: dist(s, u) + 1 <= dist(s, v) + slack.
  std::vector<std::vector<bool>> graph = directPairs(model);
  if (options.allowedPairs.size() == idx(n)) {
    for (int u = 0; u < n; ++u)
      for (int v = 0; v < n; ++v) graph[idx(u)][idx(v)] = graph[idx(u)][idx(v)] && options.allowedPairs[idx(u)][idx(v)];
  }
  const auto dist = hopDistances(graph);

  // Phase 1 (shortest-path sets, no slack): a third of the time; its trees replace the warm start when better.
  std::string phase1 = "layered: none";
  std::vector<Tree> start = warmStart;
  if (const auto layered = layeredTrees(a, R, graph, dist, C, options.timeLimitSeconds / 3)) {
    const auto [lb, ll] = objectiveParts(a, R, *layered);
    char text[64];
    std::snprintf(text, sizeof text, "layered %.4g", lb + ll);
    phase1 = text;
    if (lb + ll < out.warmObjective) start = *layered;
  }

  // Symmetry: sources in orbits of r -> r + o; trees of a representative's orbit are its rotations.
  const int offset = options.symmetry > 0 && rotationSymmetric(model, graph, options.symmetry % n) ? options.symmetry % n : 0;
  out.symmetric = offset > 0;
  std::vector<int> repOf(idx(n), -1), shiftOf(idx(n), 0);  // s = rep + shift * offset
  for (int s = 0; s < n; ++s) {
    if (repOf[idx(s)] >= 0) continue;
    repOf[idx(s)] = s;
    if (offset == 0) continue;
    int j = 1;
    for (int t = (s + offset) % n; t != s; t = (t + offset) % n, ++j) {
      repOf[idx(t)] = s;
      shiftOf[idx(t)] = j;
    }
  }
  const auto rot = [&](int v, int times) { return ((v + times * offset) % n + n) % n; };
  // Warm start as the MILP sees it: representatives' trees, rotated over their orbits.
  std::vector<Tree> warm = start;
  if (offset > 0) {
    for (int s = 0; s < n; ++s) {
      for (uint32_t p = 0; p < C; ++p) {
        const Tree& base = start[idx(repOf[idx(s)]) * C + p];
        Tree& t = warm[idx(s) * C + p];
        t.source = s;
        t.parent.assign(idx(n), -1);
        for (int v = 0; v < n; ++v)
          if (base.parent[idx(v)] >= 0) t.parent[idx(rot(v, shiftOf[idx(s)]))] = rot(base.parent[idx(v)], shiftOf[idx(s)]);
      }
    }
  }
  const auto [warmZb, warmZl] = objectiveParts(a, R, warm);
  const double W = warmZb + warmZl;  // incumbent: the big-M and the L bounds come from it

  // Columns.
  std::vector<double> colLb, colUb, obj;
  std::vector<bool> integer;
  const auto addCol = [&](double lb, double ub, double cost, bool isInt) {
    colLb.push_back(lb);
    colUb.push_back(ub);
    obj.push_back(cost);
    integer.push_back(isInt);
    return static_cast<int>(obj.size()) - 1;
  };
  const int zb = addCol(0, COIN_DBL_MAX, 1, false);
  const int zl = addCol(0, COIN_DBL_MAX, 1, false);
  // Per representative tree k = rep * C + p: arc columns and L columns.
  std::vector<std::map<std::pair<int, int>, int>> arcCol(idx(n) * C);
  std::vector<std::vector<int>> lCol(idx(n) * C);
  for (int r = 0; r < n; ++r) {
    if (repOf[idx(r)] != r) continue;
    for (uint32_t p = 0; p < C; ++p) {
      const size_t k = idx(r) * C + p;
      const Tree& w = warm[k];
      for (int u = 0; u < n; ++u) {
        for (int v = 0; v < n; ++v) {
          if (u == v || v == r) continue;
          const bool candidate = graph[idx(u)][idx(v)] && dist[idx(r)][idx(u)] + 1 <= dist[idx(r)][idx(v)] + options.slack;
          if (candidate || w.parent[idx(v)] == u) arcCol[k][{u, v}] = addCol(0, 1, 0, true);
        }
      }
      lCol[k].assign(idx(n), -1);
      for (int v = 0; v < n; ++v) lCol[k][idx(v)] = addCol(0, v == r ? 0 : W, 0, false);
    }
  }
  out.binaries = 0;
  for (const auto& m : arcCol) out.binaries += static_cast<int>(m.size());

  // Rows (triplets).
  std::vector<double> rowLb, rowUb;
  std::vector<int> tRow, tCol;
  std::vector<double> tVal;
  const auto addRow = [&](double lb, double ub) {
    rowLb.push_back(lb);
    rowUb.push_back(ub);
    return static_cast<int>(rowLb.size()) - 1;
  };
  const auto set = [&](int row, int col, double v) {
    tRow.push_back(row);
    tCol.push_back(col);
    tVal.push_back(v);
  };
  for (int r = 0; r < n; ++r) {
    if (repOf[idx(r)] != r) continue;
    for (uint32_t p = 0; p < C; ++p) {
      const size_t k = idx(r) * C + p;
      std::vector<int> parentRow(idx(n), -1);
      for (int v = 0; v < n; ++v)
        if (v != r) parentRow[idx(v)] = addRow(1, 1);  // exactly one parent
      for (const auto& [arc, col] : arcCol[k]) {
        const auto [u, v] = arc;
        set(parentRow[idx(v)], col, 1);
        // x = 1  =>  L_v >= L_u + t(u,v) + eps:   L_v - L_u - M x >= t + eps - M,  M = W + t + eps.
        const double t = a.time[idx(u)][idx(v)] + a.eps;
        const double M = W + t;
        const int row = addRow(t - M, COIN_DBL_MAX);
        set(row, lCol[k][idx(v)], 1);
        set(row, lCol[k][idx(u)], -1);
        set(row, col, -M);
      }
      for (int v = 0; v < n; ++v) {
        if (v == r) continue;
        const int row = addRow(0, COIN_DBL_MAX);  // Zl >= L_v
        set(row, zl, 1);
        set(row, lCol[k][idx(v)], -1);
      }
    }
  }
  // Occupancy: every tree (rotations included) adds its arcs' times to their resources.
  std::vector<std::map<int, double>> occ(R);
  for (int s = 0; s < n; ++s) {
    const int r = repOf[idx(s)];
    const int j = shiftOf[idx(s)];
    for (uint32_t p = 0; p < C; ++p) {
      const size_t k = idx(r) * C + p;
      for (const auto& [arc, col] : arcCol[k]) {
        const int u = rot(arc.first, j), v = rot(arc.second, j);
        for (const auto& [res, time] : a.occupancy[idx(u)][idx(v)]) occ[idx(res)][col] += time;
      }
    }
  }
  for (size_t res = 0; res < R; ++res) {
    if (occ[res].empty()) continue;
    const int row = addRow(0, COIN_DBL_MAX);  // Zb >= occupancy
    set(row, zb, 1);
    for (const auto& [col, time] : occ[res]) set(row, col, -time);
  }
  out.rows = static_cast<int>(rowLb.size());

  // Warm solution vector.
  std::vector<double> warmSol(obj.size(), 0.0);
  warmSol[idx(zb)] = warmZb;
  warmSol[idx(zl)] = warmZl;
  for (int r = 0; r < n; ++r) {
    if (repOf[idx(r)] != r) continue;
    for (uint32_t p = 0; p < C; ++p) {
      const size_t k = idx(r) * C + p;
      const Tree& w = warm[k];
      for (int v = 0; v < n; ++v) {
        if (v == r) continue;
        warmSol[idx(arcCol[k].at({w.parent[idx(v)], v}))] = 1;
        double sum = 0;
        for (int x = v; w.parent[idx(x)] >= 0; x = w.parent[idx(x)]) sum += a.time[idx(w.parent[idx(x)])][idx(x)] + a.eps;
        warmSol[idx(lCol[k][idx(v)])] = sum;
      }
    }
  }

  const double elapsedSoFar = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const CbcOutcome cbc = runCbc(static_cast<int>(rowLb.size()), tRow, tCol, tVal, colLb, colUb, obj, rowLb, rowUb, integer,
                                options.timeLimitSeconds - elapsedSoFar, &warmSol, W);
  out.bestBound = cbc.bestBound;
  if (cbc.solution.empty()) {
    return finish(cbc.infeasible ? "infeasible (warm start kept)" : "no solution (warm start kept)");
  }
  const double* best = cbc.solution.data();
  // Read the trees back (rotations included) and score them exactly.
  std::vector<Tree> trees(idx(n) * C);
  bool complete = true;
  for (int s = 0; s < n && complete; ++s) {
    const int r = repOf[idx(s)];
    const int j = shiftOf[idx(s)];
    for (uint32_t p = 0; p < C; ++p) {
      const size_t k = idx(r) * C + p;
      Tree& t = trees[idx(s) * C + p];
      t.source = s;
      t.parent.assign(idx(n), -1);
      for (const auto& [arc, col] : arcCol[k])
        if (best[col] > 0.5) t.parent[idx(rot(arc.second, j))] = rot(arc.first, j);
      for (int v = 0; v < n; ++v)
        if (v != s && t.parent[idx(v)] < 0) complete = false;
    }
  }
  if (!complete) return finish("incomplete solution (warm start kept)");
  const auto [bz, lz] = objectiveParts(a, R, trees);
  out.optimal = cbc.optimal;
  if (bz + lz < out.warmObjective - 1e-9 * (1 + out.warmObjective)) {
    out.trees = std::move(trees);
    out.objective = bz + lz;
    out.improved = true;
  }
  const std::string how = out.optimal ? "optimal" : cbc.timeLimit ? "time limit" : "stopped";
  char numbers[160];
  std::snprintf(numbers, sizeof numbers, " obj %.4g warm %.4g bound %.4g, %s", bz + lz, out.warmObjective, out.bestBound,
                phase1.c_str());
  return finish((out.improved ? how : how + " (warm start kept)") + numbers);
}

std::vector<MilpCandidate> milpCandidates(const CostModel& model, Collective c, uint64_t bytes, uint32_t chunksPerRank,
                                          const std::vector<Tree>& warmStart, Order warmOrder, double warmUs,
                                          const SynthOptions& options, double secondsLeft) {
  MilpOptions mo;
  mo.timeLimitSeconds = std::max(0.05, std::min(options.milpSeconds, secondsLeft));
  if (options.sketch) {
    if (options.sketch->symmetry) mo.symmetry = *options.sketch->symmetry;
    mo.allowedPairs = options.sketch->allowedPairs;
  }
  const MilpRouting milp = routeMilp(model, c, bytes, chunksPerRank, warmStart, mo);
  std::vector<MilpCandidate> out;
  const std::string base = "milp(" + milp.status + (milp.symmetric ? ", sym" : "") + ") C=" + std::to_string(chunksPerRank);
  double best = -1;
  if (milp.improved) {
    int hops = 0;
    for (const Tree& t : milp.trees) hops = std::max(hops, treeDepthOf(t));
    for (Order order : {Order::LongestRemainingFirst, Order::EarliestStartFirst, Order::Mirrored}) {
      if (order == Order::Mirrored && c == Collective::AllGather) continue;
      Plan plan = lowerTrees(c, milp.trees, chunksPerRank, model, bytes, order);
      plan.name = "synth-milp";
      const double us = simulate(plan, bytes, model, options.sim).finishUs;
      best = best < 0 ? us : std::min(best, us);
      out.push_back({std::move(plan), base + " order=" + orderName(order), hops});
    }
  }
  if (best < 0 || best > warmUs) {
    // The warm start is a solution the MILP found too: the family is never worse than it.
    int hops = 0;
    for (const Tree& t : warmStart) hops = std::max(hops, treeDepthOf(t));
    Plan plan = lowerTrees(c, warmStart, chunksPerRank, model, bytes, warmOrder);
    plan.name = "synth-milp";
    out.push_back({std::move(plan),
                   "milp(warm start: " + milp.status + ") C=" + std::to_string(chunksPerRank) +
                       " order=" + orderName(warmOrder),
                   hops});
  }
  return out;
}

}  // namespace topoccl::algo::synth
