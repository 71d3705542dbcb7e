// Built-in plan generators: each turns (collective, nranks, root, nchannels) into a Plan.
//   ring               AllReduce (reduce-scatter then all-gather), AllGather, ReduceScatter, and
//                      Broadcast / Reduce as a chain from / to the root. One lane per channel, each
//                      its own ring carrying its share of the chunks; odd channels run the ring the
//                      other way round so both directions of every link carry data.
//   recursive_doubling AllReduce in ceil(log2 n) exchange rounds; ranks beyond the largest power of
//                      two first fold their data into a partner and get the result back at the end.
//                      AllGather in ceil(log2 n) rounds, each sending all a rank holds: a pairwise exchange
//                      with r ^ 2^k on a power of two, Bruck's doubling (to r - 2^k, from r + 2^k) elsewhere.
//                      AllToAll in ceil(log2 n) rounds, each one message a rank carrying the blocks whose path
//                      takes that hop (pairwise r ^ 2^k on a power of two, Bruck's r + 2^k elsewhere), packed
//                      and unpacked through scratch: fewer messages for more copies, for sockets.
//   halving_doubling   AllReduce as Rabenseifner's: reduce-scatter by recursive halving, then all-gather by
//                      recursive doubling, 2 log2 n rounds moving 2 (n-1)/n of the data like the ring's
//                      2 (n-1) steps; ranks beyond the largest power of two fold in and out as in
//                      recursive_doubling. OpenMPI's choice at 1-4 MiB; here 1.5x the ring over TCP.
//                      ReduceScatter as that first half alone, ranks beyond the power of two folding in first
//                      and getting their block at the end.
//   reduce_scatter_allgather
//                      AllReduce as a direct reduce-scatter, then a direct all-gather: rank q sums part q of the
//                      block, pulling it from every peer in turn, and then every rank takes each finished part
//                      from its owner. Two dependent rounds for the ring's bytes, where halving_doubling takes
//                      2 log2 n and the ring 2 (n-1): for ranks that share CPUs, where each round can wait on a
//                      rank the scheduler is not running.
//   tree               binomial-tree Broadcast and Reduce (log2 n hops, for small messages).
//   direct             AllToAll, Gather, Scatter, AllGather, ReduceScatter: every pair talks directly.
// Ring and direct all-to-all use nchannels (a lane per channel, or per peer and channel); the others are
// latency-oriented and run on one channel.
// Arguments out of range (nranks < 1, a root outside the ranks, nchannels outside 1..kMaxChannels,
// a collective the algorithm does not implement) throw topoccl::Error(ncclInvalidArgument).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "algorithms/plan.hpp"

namespace topoccl::algo {

enum class Algorithm : uint8_t { Ring, RecursiveDoubling, Tree, Direct, Hierarchical, HalvingDoubling, ReduceScatterAllGather };
inline constexpr int kNumAlgorithms = 7;
inline constexpr int kMaxChannels = 64;

// "ring", "recursive_doubling", "tree", "direct", "hierarchical", "halving_doubling", "reduce_scatter_allgather"
const char* algorithmName(Algorithm a) noexcept;
// Our names, case-insensitive: ring, recursive_doubling (or rd), tree, direct, hierarchical (or hier),
// halving_doubling (or hd), reduce_scatter_allgather (or rsag).
std::optional<Algorithm> algorithmFromName(std::string_view name) noexcept;
bool algorithmSupports(Algorithm a, Collective c) noexcept;

// Which memory layout the plan must be correct for. Any yields one plan valid both in place and
// out of place; where in place needs a staging copy (direct AllToAll, recursive doubling on 2 or 3
// ranks) Any pays for it, while OutOfPlace skips it. InPlace drops copies that in place would make
// no-ops. Plan::inPlace / Plan::outOfPlace say what the result is valid for.
enum class Placement : uint8_t { Any, InPlace, OutOfPlace };

Plan ringPlan(Collective c, int nranks, int root, int nchannels, Placement placement = Placement::Any);
Plan recursiveDoublingPlan(Collective c, int nranks, int root, int nchannels, Placement placement = Placement::Any);
Plan treePlan(Collective c, int nranks, int root, int nchannels, Placement placement = Placement::Any);
// The binomial Broadcast for ranks dealt round-robin over `places` CPUs (rank r on CPU r mod places, as
// oversubscribed ranks bind themselves): relative ranks are bit-reversed, so each of the root's subtrees lies on one
// CPU and every CPU relays its share. Needs nranks and places powers of two, places dividing nranks; else the plain
// tree. 4 ranks on 2 CPUs: 0.70-0.85x the plain tree's time at 8 B-2 KiB (perf/RESULTS.md, session 46).
Plan interleavedTreeBroadcast(int nranks, int root, int places, Placement placement = Placement::Any);
Plan halvingDoublingPlan(Collective c, int nranks, int root, int nchannels, Placement placement = Placement::Any);
Plan directPlan(Collective c, int nranks, int root, int nchannels, Placement placement = Placement::Any);
Plan reduceScatterAllGatherPlan(Collective c, int nranks, int root, int nchannels, Placement placement = Placement::Any);
// AllReduce over hosts: ring reduce-scatter inside each host (shared memory), then the ranks with the same
// local index (one per host, the rank nearest rail l) all-reduce their shard in a ring across the hosts,
// then ring all-gather inside each host. Each host sends 2 (H-1)/H S across the network in total instead of
// the flat ring's 2 (n-1)/n S through each of its boundary ranks. hostOfRank[r] is rank r's host (0..H-1);
// every host must hold the same number of ranks. makePlan() builds it for one host (plain ring RS + AG).
// shardWeights (one per local rank, 1..64; empty: all 1) sizes local rank l's shard in proportion, e.g. to the
// speed of the NIC nearest it, so that each rank's traffic can stay on its own NIC and the NICs finish together.
Plan hierarchicalPlan(Collective c, const std::vector<int>& hostOfRank, int nchannels,
                      Placement placement = Placement::Any, const std::vector<uint32_t>& shardWeights = {});

// Dispatch by algorithm. `root` is ignored by collectives that have none.
Plan makePlan(Algorithm algorithm, Collective c, int nranks, int root, int nchannels,
              Placement placement = Placement::Any);
// Same, by name (see algorithmFromName); an unknown name throws Error(ncclInvalidArgument).
Plan makePlan(std::string_view algorithmName, Collective c, int nranks, int root, int nchannels,
              Placement placement = Placement::Any);

}  // namespace topoccl::algo
