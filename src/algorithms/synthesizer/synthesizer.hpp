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
#include <string>
#include <utility>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "algorithms/plan.hpp"
#include "algorithms/simulator.hpp"
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
};

// One broadcast tree of a source chunk: parent[v] sends the chunk to v; parent[source] = -1.
struct Tree {
  int source = 0;
  std::vector<int> parent;
};

enum class Order : uint8_t { LongestRemainingFirst, EarliestStartFirst };

// GPUs in Topology::gpus() order (by host, then GPU index): rank r on the r-th GPU.
std::vector<topo::VertexId> defaultRankDevices(const topo::Topology& topology);

// AllGather, ReduceScatter or AllReduce of `bytes` (nccl-tests size, see simulator.hpp). Throws
// Error(ncclInvalidArgument) for other collectives or an empty model.
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

}  // namespace topoccl::algo::synth
