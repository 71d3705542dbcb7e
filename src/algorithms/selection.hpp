// Algorithm selection in UCC's style: a table of rows (collective, rank range, message-size range,
// algorithm), searched in order, filtered by what the user allows through NCCL_ALGO.
// Every input to choose() is the same on every rank of a communicator (collective, bytes, nranks,
// nhosts, the table, the environment every rank is started with), so every rank picks the same plan.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "algorithms/generators.hpp"
#include "algorithms/plan.hpp"

namespace topoccl::algo {

// Default thresholds, from the alpha-beta model with alpha = 2..20 us per message (shared memory
// to TCP) and beta = 1 / (2.5..10 GB/s), so alpha / beta ~ 20..50 KB.
// - Recursive doubling AllReduce costs ceil(log2 n) (alpha + S beta), plus two full-size rounds when
//   n is not a power of two; ring costs 2(n-1) alpha + 2 (n-1)/n S beta. On 8 ranks they cross near
//   S = 9 alpha/beta (~200 KB), on 6 ranks (folding) near 2.6 alpha/beta (~60 KB): 64 KiB keeps
//   recursive doubling where it wins on every rank count.
inline constexpr uint64_t kRecursiveDoublingMaxBytes = 64 << 10;
// Two ranks on a memory path keep recursive doubling below 4 KiB; from there each sums half and, where the peer's
// buffer is a shared allocation, writes the sum into both outputs (reduce_scatter_allgather's result mirrors): one
// pass over half the bytes per rank instead of recursive doubling's over all of them, and no send back.
// ncclMemAlloc buffers, 2 vCPUs, session 50: 0.45-0.85x recursive doubling's time at 4-16 KiB, 0.35-0.65x at
// 16-256 KiB out of place and 0.22-0.56x in place (whose sum lands over the buffer the peer reads); 0.75-0.86x the
// ring's at 1-16 MiB out of place and 0.82-0.91x in place. Heap buffers, which the peer cannot map, take the plan's
// sends: 1.5x recursive doubling's time at 4 KiB, 1.28x at 16 KiB, 1.03-1.16x at 64-256 KiB in place, level at 1 MiB,
// 1.0-1.07x the ring's at 4-64 MiB (perf/RESULTS.md).
inline constexpr uint64_t kTwoRankRecursiveDoublingMaxBytes = 4 << 10;
// - Binomial Broadcast / Reduce cost log2 n (alpha + S beta); the pipelined chain (n-1) alpha + S beta.
//   They cross at S = (n-1-log2 n) / (log2 n - 1) alpha/beta: 1x on 4 ranks, 2x on 8, 3.7x on 16.
inline constexpr uint64_t kTreeMaxBytes = 32 << 10;
// On a memory path Broadcast goes direct (the root's buffer read by every peer at once) from there to 256 MiB
// (memoryPathRows): a receiver pulls from the root's buffer, so no rank waits on a relay, and no relay waits on a
// CPU that another rank holds. On 4, 6 and 8 ranks (2 vCPUs) it took 0.4-0.97x the binomial tree's time from
// 32 KiB to 32 MiB, which itself took 0.55-0.99x the chain's (sessions 38 and 40). At 64-128 MiB it took 0.40-0.61x
// the chain's time on 4 and 8 ranks and 0.86-0.98x on 3 (session 49, a Xeon whose chain ran at a third of direct's
// speed from 16 MiB); session 40's Xeon had them level at 128 MiB (1.02x). From 256 MiB, where memory bounds both,
// they were level or the chain ahead (4 ranks: 1.0x here and 1.12x there; 512 MiB 1.06x), so the chain keeps it.
// Beyond 8 ranks, unmeasured, the binomial tree keeps the band to 64 MiB (kMemoryPathTreeBroadcastMaxBytes).
inline constexpr uint64_t kMemoryPathDirectBroadcastMaxBytes = uint64_t{256} << 20;
inline constexpr uint64_t kMemoryPathTreeBroadcastMaxBytes = 64 << 20;
// - Direct AllGather / ReduceScatter move the same bytes per rank as the ring in one round instead
//   of n-1, so they win while latency dominates; beyond that the n-1 simultaneous flows per rank
//   contend for its links, while the ring only ever uses neighbours.
inline constexpr uint64_t kDirectMaxBytes = 64 << 10;
// On a memory path, for Broadcast's reason, AllGather and ReduceScatter on 3-8 ranks go direct past kDirectMaxBytes:
// every pair's bytes cross the same memory, so the ring's relays only add waits on ranks that share a CPU. Direct
// took 0.45-0.85x the ring's time from 256 KiB to 64 MiB for both on 3, 4, 6 and 8 ranks (2 vCPUs), and
// reduce-scatter also 0.86-0.87x at 128-256 MiB; out-of-place all-gather at 128-256 MiB was 9-26% slower than the
// ring, so it keeps the ring there (perf/RESULTS.md, session 40). 64 MiB itself goes direct: 0.67-0.76x the ring's
// time out of place and 0.66x in place on 4 and 8 ranks (session 49); at 128 MiB the two were level (0.89-1.09x).
inline constexpr uint64_t kMemoryPathDirectAllGatherMaxBytes = uint64_t{128} << 20;
inline constexpr int kMemoryPathDirectMaxRanks = 8;
// - On a memory path AllReduce on 3-8 ranks is a direct reduce-scatter then a direct all-gather
//   (reduce_scatter_allgather): two dependent rounds where the ring takes 2 (n-1) and halving-doubling 2 log2 n, each
//   a wait for a rank that may share a CPU with another. Session 49 (2 vCPUs, shm, against the ring on 3, 5, 6 and 7
//   ranks): 0.5-0.9x the ring's time out of place and 0.45-0.9x in place from 256 KiB to 128 MiB; below, in place up
//   to 1.6x slower (5 ranks, 128 KiB). Since session 50 the last summand's peer writes each sum into its owner's
//   output as it reduces (result mirrors, ncclMemAlloc buffers), one gather message in n-1 fewer: on 3 and 6 ranks
//   0.56-0.8x the time of the ring or direct at 64-128 KiB out of place and 0.7-0.9x in place; on 4 ranks 0.65-0.75x
//   halving-doubling's at 128 KiB and 0.52-0.95x from there to 32 MiB both ways, level at 64 MiB, but at 64 KiB
//   level out of place and 1.2-1.4x in place; at 16-32 KiB out of place up to 1.9x slower. 5 and
//   7 ranks were no better at 64-128 KiB (1.08-1.37x), so they start at 256 KiB; 8 ranks took 0.73-0.94x
//   halving-doubling's time from 1 MiB (level at 8 and 64 MiB) and 1.07-1.12x at 256-512 KiB in place, so it starts
//   at 1 MiB (perf/RESULTS.md).
inline constexpr uint64_t kMemoryPathScatterGatherMinBytes = 64 << 10;          // 3 and 6 ranks
inline constexpr uint64_t kMemoryPathScatterGatherFourMinBytes = 128 << 10;     // 4 ranks
inline constexpr uint64_t kMemoryPathScatterGatherOddMinBytes = 256 << 10;      // 5 and 7 ranks
inline constexpr uint64_t kMemoryPathScatterGatherEightMinBytes = 1 << 20;      // 8 ranks
// GPU buffers keep the rows from before result mirrors (memoryPathRows): 2-rank recursive doubling to 1 MiB, and on
// 4 and 8 ranks reduce_scatter_allgather from 64 MiB.
inline constexpr uint64_t kGpuTwoRankRecursiveDoublingMaxBytes = 1 << 20;
inline constexpr uint64_t kGpuScatterGatherPowerOfTwoMinBytes = uint64_t{64} << 20;
// - Direct AllReduce (every rank sends its input to every other and adds all n) is one round where
//   recursive doubling takes log2 n (+2 when folding), at n-1 times the bytes sent. Measured on 3-8
//   ranks sharing 2 cores (perf/RESULTS.md), where every round costs a trip through the scheduler, it
//   took 0.59-0.93x recursive doubling's time up to 64 KiB; on 2 ranks both are one round.
inline constexpr uint64_t kDirectAllReduceMaxBytes = 64 << 10;
inline constexpr int kDirectAllReduceMaxRanks = 8;  // and one host: across NICs the n-1 copies cost bandwidth
// - Where 4-8 ranks share a host's cores (2 CPUs here), recursive doubling's log2 n rounds beat direct's one for
//   AllReduce below 8 KiB (session 46, perf/RESULTS.md): 0.7-0.85x its time at 128 B-4 KiB on 4 ranks and as fast
//   or up to 0.8x at 8-32 B; 0.6-0.9x at 32 B-2 KiB on 5-8 ranks, the same within noise at 8 B. Each rank sends and
//   receives log2 n messages instead of n-1. On 3 ranks direct stays ahead (recursive doubling folds: 1.3x its time
//   at 8-512 B). Launches fall in levels (4 ranks, 32 B: 1.7-1.9 us or 2.3-2.6) by how many context switches a call
//   settles into; direct's do too, less far apart. Direct wins again from 8 KiB, where read-early zero copy pays.
//   AllGather by recursive doubling had the same levels and no better median than direct, so it is not chosen.
inline constexpr int kSharedCoreRecursiveDoublingMinRanks = 4;
inline constexpr int kSharedCoreRecursiveDoublingMaxRanks = kDirectAllReduceMaxRanks;
inline constexpr uint64_t kSharedCoreRecursiveDoublingAllReduceMaxBytes = 8 << 10;
// - Where pairs talk over sockets, 4 ranks and more take recursive doubling's (or halving's) ceil(log2 n) messages a
//   rank where direct sends n - 1, each a syscall and a trip through the stack (socketPathRows). Over loopback TCP (2 vCPUs, 4-8 ranks,
//   session 47, perf/RESULTS.md):
//   - AllReduce below 64 KiB: 0.45-0.8x direct's time (direct stays first on 3 ranks, where recursive doubling folds).
//   - AllGather below 1 MiB: 0.45-0.85x direct's time below 64 KiB and 0.6-0.9x the ring's above; at 4-16 MiB the
//     two are level within noise, so the ring keeps them. On 3 ranks (Bruck's) direct stays ahead.
//   - ReduceScatter by recursive halving below 4 MiB: 0.75-0.92x direct's time on 4 ranks, 0.43-0.6x on 6 and 0.6-0.8x
//     on 8 up to 1 MiB, where the ring took as long as direct; from 4 MiB halving and the ring are level within
//     noise. On 3 ranks it measured no better than direct or the ring.
//   - AllToAll below 16 KiB or so a peer, for log2 n / 2 of the data each way instead of (n-1)/n: 0.5-0.75x direct's
//     time up to 64 KiB in all (and 0.55-0.85x OpenMPI's over its TCP BTL); 1.4-2x from 256 KiB; at 128 KiB, 0.88x
//     on 8 ranks, 1.07x on 6. On 3 ranks (Bruck's two rounds in turn, direct's two messages at once) 1.2-1.4x. Over
//     shared memory, where a message costs little, its chained rounds lose (4-8 ranks: 1.3-1.8x).
//   - AllReduce on one host as reduce_scatter_allgather (its two rounds against the ring's 2 (n-1) and
//     halving-doubling's 2 log2 n; session 49): on 3, 5 and 6 ranks 0.75-0.93x the ring's time from 1 MiB to 4 MiB
//     out of place and 0.79-0.91x in place, level at 16 MiB, 1.06x at 64 MiB on 3 (1.07x at 256 KiB); on 4 ranks
//     0.73-0.80x halving-doubling's at 2 MiB (and in place at 1 MiB), level at 4 MiB, 1.02-1.08x at 8 MiB. 8 ranks
//     were mixed (0.83x at 4 MiB, level elsewhere) and keep halving-doubling.
inline constexpr uint64_t kSocketScatterGatherMinBytes = 1 << 20;
inline constexpr uint64_t kSocketScatterGatherMaxBytes = 16 << 20;
inline constexpr uint64_t kSocketScatterGatherFourRanksMaxBytes = 4 << 20;
inline constexpr int kSocketDoublingMinRanks = 4;
inline constexpr uint64_t kSocketDoublingAllGatherMaxBytes = 1 << 20;
inline constexpr uint64_t kSocketHalvingReduceScatterMaxBytes = 4 << 20;
inline constexpr uint64_t kSocketDoublingAllToAllMaxBytes = 64 << 10;
inline constexpr int kSocketDoublingAllToAllWideRanks = 8;
inline constexpr uint64_t kSocketDoublingAllToAllWideMaxBytes = 128 << 10;
// - Hierarchical AllReduce (RS inside hosts, shards across hosts per rail, AG inside hosts) sends
//   2 (H-1)/H S per host across the network where the flat ring sends 2 (n-1)/n S through each host's
//   boundary rank pair, at 2 (L-1) + 2 (H-1) steps instead of 2 (n-1). From the ring's threshold up.
inline constexpr uint64_t kHierarchicalMinBytes = kRecursiveDoublingMaxBytes;

struct SelectionRow {
  Collective collective = Collective::AllReduce;
  int minRanks = 1;                // inclusive
  int maxRanks = INT32_MAX;        // inclusive
  uint64_t minBytes = 0;           // inclusive
  uint64_t maxBytes = UINT64_MAX;  // exclusive; UINT64_MAX: no upper bound
  Algorithm algorithm = Algorithm::Ring;
  int maxHosts = INT32_MAX;        // inclusive: rows for traffic patterns only one host's memory absorbs
  int minHosts = 1;                // inclusive: rows for plans that only pay off across hosts
  // Measured with host buffers, where the executor's result mirrors apply: calls on GPU buffers skip the row.
  bool hostBuffersOnly = false;
};

// Which algorithms the user allows, per collective. NCCL_ALGO syntax: `[^]list[;coll:[^]list...]`,
// e.g. `ring`, `^ring`, `ring,tree`, `allreduce:ring;broadcast:tree`, `tree;allreduce:^rd`.
// Names are case-insensitive: NCCL's Ring and Tree (Tree = our tree and recursive doubling),
// ours ring, tree, rd / recursive_doubling, direct, hierarchical, hd / halving_doubling. NCCL's CollNetDirect, CollNetChain, NVLS,
// NVLSTree and PAT are accepted but name nothing topoccl implements.
// The list without a collective applies to every collective it leaves an algorithm for, except AllToAll /
// Gather / Scatter, which NCCL's leaves alone too (they are its point-to-point calls); a `coll:` list must
// leave one, else it is an error. Unknown names are errors naming the token.
class AlgorithmFilter {
 public:
  AlgorithmFilter() = default;  // allows everything
  static AlgorithmFilter parse(std::string_view text);  // throws Error(ncclInvalidArgument)

  bool allows(Collective c, Algorithm a) const;
  bool restricts(Collective c) const;  // whether anything the user wrote applies to c
  const std::string& text() const { return text_; }

 private:
  using Mask = uint8_t;  // bit per Algorithm
  struct Entry {
    bool set = false;
    Mask allowed = 0;
  };
  Mask effectiveMask(Collective c) const;

  Entry global_;
  std::array<Entry, kNumCollectives> perCollective_{};
  std::string text_;
};

// Rows chosen by a cost model: for each collective and each size band [bandStarts[i], bandStarts[i+1]) (the
// last one open), the candidate algorithm whose plan the model predicts fastest at the band's geometric middle
// (the first band at 1 KiB, the last at its start). `planOf` builds an algorithm's plan for a collective, or
// nullopt when it is no candidate; `timeOf` predicts a plan's time at a size (the simulator on the machine's
// cost model). Adjacent bands with the same winner merge. Rows carry minRanks = maxRanks = nranks and minHosts.
struct ModelledChoice {
  Collective collective;
  uint64_t bytes;                         // where the band was evaluated
  std::vector<std::pair<Algorithm, double>> predictedUs;  // every candidate, in Algorithm order
  Algorithm best;
};
std::vector<SelectionRow> modelledRows(const std::vector<Collective>& collectives, const std::vector<uint64_t>& bandStarts,
                                       int nranks, int minHosts,
                                       const std::function<std::optional<Plan>(Algorithm, Collective)>& planOf,
                                       const std::function<double(const Plan&, uint64_t)>& timeOf,
                                       std::vector<ModelledChoice>* choices = nullptr);

// Rows that go before the defaults when every pair of ranks moves data through memory (shared memory or threads of
// one process, one host), not sockets.
std::vector<SelectionRow> memoryPathRows();
// Rows that go before those when, besides, some of the host's ranks share CPUs (more ranks than cores).
std::vector<SelectionRow> sharedCoreRows();
// Rows that go before the defaults when some pair of ranks talks over sockets (another host, or shm turned off).
std::vector<SelectionRow> socketPathRows();

// The GPU path's protocols (NCCL's): LL moves data and flag in one word, for latency; Simple moves whole slices
// behind one flag, for bandwidth. On the host path every protocol is the same executor.
enum class Protocol : uint8_t { LowLatency, Simple };
const char* protocolName(Protocol p);  // "LL", "Simple"

// Which protocols NCCL_PROTO allows: a comma list of LL, LL128 (topoccl runs it as LL) and Simple,
// case-insensitive, `^` in front excludes them. Empty: all.
class ProtocolFilter {
 public:
  ProtocolFilter() = default;
  static ProtocolFilter parse(std::string_view text);  // throws Error(ncclInvalidArgument), naming the token
  bool allows(Protocol p) const { return p == Protocol::LowLatency ? lowLatency_ : simple_; }
  const std::string& text() const { return text_; }

 private:
  bool lowLatency_ = true, simple_ = true;
  std::string text_;
};

// One row of the protocol table: GPU calls of [minBytes, maxBytes) bytes run `protocol`.
struct ProtocolRow {
  std::optional<Collective> collective;  // nullopt: every collective
  uint64_t minBytes = 0;                 // inclusive
  uint64_t maxBytes = UINT64_MAX;        // exclusive; UINT64_MAX: no upper bound
  Protocol protocol = Protocol::Simple;
};

class SelectionTable {
 public:
  static SelectionTable defaults();
  // defaults() filtered by NCCL_ALGO (params::kAlgo); a malformed value throws Error(ncclInvalidArgument).
  static SelectionTable fromConfig();

  void addRow(const SelectionRow& row) { rows_.push_back(row); }
  // Rows that take precedence over the defaults (searched first), e.g. modelledRows().
  void prependRows(const std::vector<SelectionRow>& rows) { rows_.insert(rows_.begin(), rows.begin(), rows.end()); }
  void setFilter(AlgorithmFilter filter) { filter_ = std::move(filter); }
  const std::vector<SelectionRow>& rows() const { return rows_; }
  const AlgorithmFilter& filter() const { return filter_; }

  // bytes: the larger per-rank buffer, as NCCL's tuner counts it (AllReduce, Broadcast, Reduce:
  // count * size; AllGather, ReduceScatter, AllToAll, Gather, Scatter: nranks * count * size).
  // The first allowed row that matches wins; if none does, the first allowed algorithm for the
  // collective in table order, then in Algorithm order. nranks < 1 throws Error(ncclInvalidArgument).
  // gpuBuffers: the call's buffers are GPU memory (rows with hostBuffersOnly do not apply).
  Algorithm choose(Collective c, uint64_t bytes, int nranks, int nhosts = 1, bool gpuBuffers = false) const;

  // The GPU protocol rows, searched in order like the algorithm rows, filtered by NCCL_PROTO. defaults() has
  // none; addDefaultProtocolRows adds LL up to `lowLatencyMaxBytes` (inclusive), Simple above (0: Simple only).
  void addProtocolRow(const ProtocolRow& row) { protocolRows_.push_back(row); }
  void addDefaultProtocolRows(uint64_t lowLatencyMaxBytes);
  void setProtocolFilter(ProtocolFilter filter) { protocolFilter_ = std::move(filter); }
  const std::vector<ProtocolRow>& protocolRows() const { return protocolRows_; }
  // The first allowed row that matches; else Simple if allowed, else LL (NCCL_PROTO allows at least one).
  Protocol chooseProtocol(Collective c, uint64_t bytes) const;

  std::string describe() const;  // the rows as a table, and the filters

 private:
  std::vector<SelectionRow> rows_;
  AlgorithmFilter filter_;
  std::vector<ProtocolRow> protocolRows_;
  ProtocolFilter protocolFilter_;
};

}  // namespace topoccl::algo
