// A TACCL-style synthesizer for AllGather, and ReduceScatter / AllReduce derived from it (see README.md).
//   routing   every source chunk (source rank s, part p of its block) gets a broadcast tree over the ranks;
//             tree families: load-balanced BFS (fewest hops), greedy tree packing (min-max resource load
//             with a latency penalty, rip-up and reroute), star (every rank straight from the source over
//             its route), and rings from edge-disjoint Hamiltonian cycles of the direct-link graph (both
//             directions; DGX-1: 3 cycles -> 6 rings).
//   ordering  greedy list scheduling of the transfers on the cost model's resources (one message per
//             resource at a time), longest-remaining-path first or earliest-start first.
//   lowering  per rank one send lane per destination peer and one receive lane per source peer (channel
//             0), steps in scheduled order on both ends of every connection, StepRef deps from a send to the
//             receive that brought its data (and along reduction chains).
//   RS        the same trees reversed (reduction trees: receive-reduce-copy into scratch, then send on);
//   AR        RS then AG over the same trees in one plan (AG sends of a chunk wait for its reduction).
// Every candidate (trees x chunks per rank C x ordering, plus the built-in ring with 1..N channels) is
// simulated on the cost model; the fastest wins. Deterministic: same inputs -> the same plan.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "algorithms/plan.hpp"
#include "algorithms/simulator.hpp"
#include "algorithms/synthesizer/sketch.hpp"
#include "topology/topology.hpp"

namespace topoccl::algo::synth {

struct SynthOptions {
  uint32_t minChunksPerRank = 1;  // C: each rank's block is cut into C parts, each with its own tree
  uint32_t maxChunksPerRank = 6;
  // Wall-clock budget. Candidates are tried in a fixed order; past the budget the rest are skipped (the
  // result then depends on the machine's speed: SynthResult::budgetExhausted says so).
  double budgetSeconds = 10;
  uint64_t seed = 1;              // rotates tie-breaks of the tree builders (deterministically)
  bool ringFallback = true;       // the built-in ring plans compete as candidates
  bool validate = true;           // validateOrThrow the winner (ncclInternalError)
  SimOptions sim{1, false};       // how candidates are simulated
  // The routing MILP family "milp" (routing_milp.cpp): off by default, since a time-limited solve depends on the
  // machine's speed (results are then not reproducible); a sketch listing "milp" in its families turns it on.
  bool milp = false;
  double milpSeconds = 2;         // time limit of each MILP solve (one per C)
  bool contiguity = true;         // merge contiguous sends on high-alpha connections of the winner (contiguity.cpp)
  std::optional<Sketch> sketch;   // overrides the fields it sets and restricts families / pairs (sketch.hpp)
};

struct FamilyTime {
  std::string family;  // "bfs", "pack", "star", "rings", "ring"
  double timeUs = 0;   // its best candidate
};

struct SynthResult {
  Plan plan;                 // name "synth-<family>" (or the built-in "ring" when it won)
  double timeUs = 0;         // simulated
  std::string strategy;      // e.g. "rings/6 C=6 order=lrf"
  std::string family;
  uint32_t chunksPerRank = 0;
  int maxHops = 0;           // deepest tree (communication steps on the routing's critical path); ring: N-1
  int candidates = 0;        // simulated
  double seconds = 0;        // synthesis wall time
  bool budgetExhausted = false;
  std::vector<FamilyTime> families;  // best time per family, in first-tried order
  int contiguityMerges = 0;          // sends merged by the contiguity post-pass (0: not applied or not faster)
  double beforeContiguityUs = 0;     // the winner's time before it
  bool hasCandidate = false;         // consider() kept one

  // Counts a simulated candidate, lowers its family's best time, and keeps it when it is the fastest so far.
  void consider(Plan candidate, double time, const std::string& family, const std::string& strategy, uint32_t C, int hops);
};

// One broadcast tree of a source chunk: parent[v] sends the chunk to v; parent[source] = -1.
struct Tree {
  int source = 0;
  std::vector<int> parent;
};

// Mirrored (ReduceScatter / AllReduce): the reduce-scatter transfers take the time-reversed schedule of the
// all-gather on the same trees (scheduled earliest-start-first), and AllReduce's all-gather follows it; on links
// with equal cost both ways the reduce-scatter then takes exactly as long as the all-gather.
enum class Order : uint8_t { LongestRemainingFirst, EarliestStartFirst, Mirrored };
const char* orderName(Order order) noexcept;  // "lrf", "esf", "mirror"

// GPUs in Topology::gpus() order (by host, then GPU index): rank r on the r-th GPU.
std::vector<topo::VertexId> defaultRankDevices(const topo::Topology& topology);

// AllGather, ReduceScatter, AllReduce or AllToAll (synthesizeAllToAll) of `bytes` (nccl-tests size, see
// simulator.hpp). Throws Error(ncclInvalidArgument) for other collectives or an empty model.
SynthResult synthesize(const CostModel& model, Collective c, uint64_t bytes, const SynthOptions& options = {});
SynthResult synthesize(const topo::Topology& topology, const std::vector<topo::VertexId>& rankDevice, Collective c,
                       uint64_t bytes, const SynthOptions& options = {});

// The pieces, for tests and tools.
// Rank pairs whose route does not pass through a third rank's device (the "direct link" graph).
std::vector<std::vector<bool>> directPairs(const CostModel& model);
// Edge-disjoint Hamiltonian cycles of the direct-link multigraph (parallel capacity in units of the slowest
// direct pair), at most maxCycles, found by a bounded deterministic search; empty when none.
std::vector<std::vector<int>> hamiltonianCycles(const CostModel& model, int maxCycles);
// trees[s * C + p] is the tree of part p of rank s's block. Lowers with list-scheduled order.
Plan lowerTrees(Collective c, const std::vector<Tree>& trees, uint32_t chunksPerRank, const CostModel& model,
                uint64_t bytes, Order order);

// ---- AllToAll (alltoall.cpp) ----
// Every (source, destination) block is cut into C parts, each routed over a path of ranks (relays store and
// forward through scratch). Routings: fixed (the cost model's route), lp (max-concurrent multi-commodity flow
// over the model's resources, decomposed into paths, quantized to C), lp-rr / greedy (rip-up-and-reroute of
// parts, min-max resource load), each list-scheduled (both orders), lowered (relayed hops on channel 0 or 1)
// and simulated with the built-in direct plan; the fastest wins. Plans are valid in place and out of place.
SynthResult synthesizeAllToAll(const CostModel& model, uint64_t bytes, const SynthOptions& options = {});

// The MCF LP on the cost model (arcs = every rank pair, each using its route's resources; 1 block per ordered
// pair): roundsPerBlock = min over flows of the max resource time, in blocks x betaUsPerByte (the smallest
// beta). A lower bound for any plan on this model. paths[s * n + d]: (path of ranks, fraction of the block).
struct AllToAllFlow {
  bool ok = false;
  double roundsPerBlock = 0;
  double betaUsPerByte = 0;
  std::vector<std::vector<std::pair<std::vector<int>, double>>> paths;
  double seconds = 0;
  double boundUs(uint64_t bytes, int nranks) const {
    return roundsPerBlock * betaUsPerByte * static_cast<double>(bytes) / static_cast<double>(nranks);
  }
};
// directPairsOnly: arcs are the directPairs (a route through a third rank becomes that rank's two hops);
// otherwise every rank pair (a lower bound for any plan on the model).
AllToAllFlow allToAllFlow(const CostModel& model, bool directPairsOnly = true, double timeLimitSeconds = 10);
// routes[(s * n + d) * C + p] = ranks from s to d for part p (empty when s == d). List-scheduled, lowered.
Plan lowerAllToAll(const std::vector<std::vector<int>>& routes, uint32_t chunksPerBlock, const CostModel& model,
                   uint64_t bytes, Order order, bool splitRelayChannel);

// ---- routing MILP (routing_milp.cpp) ----
// TACCL stage (a) on COIN-OR CBC: a binary x[k,u,v] per tree k and candidate direct arc u -> v (arcs on a
// shortest hop path from the tree's source, plus `slack` hops), every non-source rank exactly one parent,
// arrival latencies L[k,v] >= L[k,u] + alpha(u,v) + eps when x = 1 (big-M = the warm start's objective:
// acyclic and rooted). Minimizes Zb + Zl: Zb >= every resource's occupancy (sum of chunk transfer times
// over it), Zl >= every L. Optional rotational symmetry (tree of source s + o = tree of s rotated by o,
// used only when the model is invariant under it). Warm-started from `warmStart`; the best solution found
// within the time limit is returned (the warm start itself when CBC finds nothing better).
struct MilpOptions {
  double timeLimitSeconds = 2;
  int slack = 1;                                 // extra hops over the shortest path allowed
  int symmetry = 0;                              // rotation offset (0: none)
  std::vector<std::vector<bool>> allowedPairs;   // empty: every direct pair
};
struct MilpRouting {
  std::vector<Tree> trees;     // trees[s * C + p]
  double objective = 0;        // of `trees`
  double warmObjective = 0;    // of the warm start
  double bestBound = 0;        // CBC's lower bound
  bool improved = false;       // trees differ from the warm start
  bool optimal = false;
  bool symmetric = false;      // symmetry applied
  int binaries = 0, rows = 0;
  double seconds = 0;
  std::string status;          // "optimal", "time limit", "infeasible (warm start kept)", ...
};
MilpRouting routeMilp(const CostModel& model, Collective c, uint64_t bytes, uint32_t chunksPerRank,
                      const std::vector<Tree>& warmStart, const MilpOptions& options = {});
// The MILP's objective (Zb + Zl) of a set of trees.
double milpObjective(const CostModel& model, Collective c, uint64_t bytes, uint32_t chunksPerRank,
                     const std::vector<Tree>& trees);
// The "milp" family's candidates for one C inside synthesize(): the MILP trees lowered in both orders, plus
// the warm start's plan (lowered in warmOrder, simulated warmUs) when both are slower, so that the family is
// never worse than its warm start. Time limit: min(options.milpSeconds, secondsLeft).
struct MilpCandidate {
  Plan plan;
  std::string strategy;
  int hops = 0;
};
std::vector<MilpCandidate> milpCandidates(const CostModel& model, Collective c, uint64_t bytes, uint32_t chunksPerRank,
                                          const std::vector<Tree>& warmStart, Order warmOrder, double warmUs,
                                          const SynthOptions& options, double secondsLeft);

// ---- contiguity (contiguity.cpp) ----
// TACCL stage (c) as a post-pass on a lowered plan: on connections whose route latency is at least
// minAlphaUs (default: network links, i.e. 2x the smallest route latency), adjacent steps of one lane of
// the same kind whose chunk ranges continue each other, together with the matching adjacent steps at the
// other end, become one step (cnt > 1; deps unioned). A merge is kept only when the plan still simulates
// (no deadlock) and strictly faster; the result is validated (else the input is returned).
struct ContiguityOptions {
  double minAlphaUs = -1;    // < 0: 2 x the smallest latency of the connections the plan uses
  uint32_t maxCount = 6;     // chunks per merged step (TACCL max_contig)
  SimOptions sim{1, false};
  bool validate = true;
  bool keepMscclExportable = true;  // refuse merges that make an exportable plan unexportable as MSCCL XML
  double secondsLimit = std::numeric_limits<double>::infinity();  // wall clock; past it no more attempts
};
struct ContiguityResult {
  Plan plan;
  double beforeUs = 0, afterUs = 0;
  int merges = 0, attempts = 0;
  std::string note;          // why nothing was merged, when so
};
ContiguityResult mergeContiguous(const Plan& plan, const CostModel& model, uint64_t bytes,
                                 const ContiguityOptions& options = {});
// synthesize()'s post-pass: mergeContiguous on the winner, kept when faster (updates plan, timeUs, strategy,
// contiguityMerges, beforeContiguityUs), within secondsLeft of the synthesis budget.
void applyContiguity(SynthResult& result, const CostModel& model, uint64_t bytes, const SynthOptions& options,
                     double secondsLeft);

// The options with a sketch's settings applied (chunks, budget, MILP time, contiguity).
SynthOptions applySketch(const SynthOptions& options);

}  // namespace topoccl::algo::synth
