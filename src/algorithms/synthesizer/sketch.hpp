// Communication sketches (TACCL §1.2, adapted): a small JSON document a person writes to steer the
// synthesizer. Every key is optional; unknown keys and bad values are errors naming the key
// (topoccl::Error, ncclInvalidArgument, "<source>: sketch key '<key>': ...").
//
//   {
//     "intranode": "nvlink-only" | "any",            // rank pairs on one host: only over NVLink / NVSwitch
//     "internode": "any" | "nearest-nic" |            // rank pairs across hosts: any, only between the GPUs
//                  {"relay": {"0": 1, "2": [3, 4], "5": "nic0"}},  // nearest each NIC, or a relay map:
//                                                     // local GPU -> local GPU(s) of the other host that
//                                                     // it may send to ("nicK": the GPUs nearest NIC K)
//     "chunks_per_rank": 2 | [1, 4],                  // C, or its range
//     "symmetry": 4,                                  // rotation offset r -> r + 4 (mod N) for the MILP
//     "families": ["pack", "milp", "ring"],           // routing families to try (bfs pack star rings hier milp, and
//                                                     // the built-ins ring recursive_doubling tree direct);
//                                                     // empty or absent: all
//     "budget_seconds": 5,                            // SynthOptions::budgetSeconds
//     "milp_seconds": 1,                              // SynthOptions::milpSeconds
//     "contiguity": true                              // SynthOptions::contiguity
//   }
//
// The link restrictions (intranode / internode) need the topology: resolveSketch() turns them into
// Sketch::allowedPairs over the ranks, which the synthesizer ANDs into its direct-pair graph (the tree
// builders fall back to other pairs only where a rank cannot be reached otherwise; the MILP never
// does). synthesize(topology, ...) resolves the sketch itself; callers of synthesize(model, ...)
// call resolveSketch first (or the restrictions are not applied).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace topoccl::algo::synth {

struct Sketch {
  enum class Intranode : uint8_t { Any, NvlinkOnly };
  enum class Internode : uint8_t { Any, NearestNic, Relay };

  std::string source;  // where it came from (file name), for messages
  Intranode intranode = Intranode::Any;
  Internode internode = Internode::Any;
  // Relay: sender local GPU index -> receiver local GPU indices (-1 - K stands for "nicK").
  std::map<int, std::vector<int>> relay;
  std::optional<uint32_t> minChunksPerRank, maxChunksPerRank;
  std::optional<int> symmetry;
  std::vector<std::string> families;  // empty: all
  std::optional<double> budgetSeconds, milpSeconds;
  std::optional<bool> contiguity;

  // Filled by resolveSketch: allowedPairs[u][v] for ranks u != v; empty: no restriction.
  std::vector<std::vector<bool>> allowedPairs;

  bool wantsFamily(const std::string& family) const;
  // Normalized JSON of the fields above (not allowedPairs): equal sketches give equal text.
  std::string canonical() const;
};

// Routing families the synthesizer knows, in its candidate order.
const std::vector<std::string>& sketchFamilies();

Sketch parseSketch(const std::string& text, const std::string& source);
Sketch loadSketch(const std::string& path);

// Fills sketch.allowedPairs for ranks on `rankDevice` of `topology` (an empty list: defaultRankDevices).
void resolveSketch(Sketch& sketch, const topo::Topology& topology, const std::vector<topo::VertexId>& rankDevice);

}  // namespace topoccl::algo::synth
