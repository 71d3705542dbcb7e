#include "algorithms/selection.hpp"

#include <algorithm>
#include <cmath>

#include <cctype>
#include <optional>

#include "common/error.hpp"
#include "common/params.hpp"

namespace topoccl::algo {
namespace {

using Mask = uint8_t;

constexpr Mask bit(Algorithm a) { return static_cast<Mask>(1u << static_cast<unsigned>(a)); }
constexpr Mask kAllAlgorithms = (1u << kNumAlgorithms) - 1;

constexpr std::array<Collective, kNumCollectives> kCollectives = {
    Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter, Collective::Broadcast,
    Collective::Reduce,    Collective::AllToAll,  Collective::Gather,        Collective::Scatter};

constexpr std::array<Algorithm, kNumAlgorithms> kAlgorithms = {Algorithm::Ring,   Algorithm::RecursiveDoubling,
                                                               Algorithm::Tree,   Algorithm::Direct,
                                                               Algorithm::Hierarchical, Algorithm::HalvingDoubling,
                                                               Algorithm::ReduceScatterAllGather};

Mask supportedMask(Collective c) {
  Mask m = 0;
  for (Algorithm a : kAlgorithms) {
    if (algorithmSupports(a, c)) m |= bit(a);
  }
  return m;
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

// Algorithms one NCCL_ALGO name stands for; nullopt when the name is unknown.
std::optional<Mask> algorithmsNamed(std::string_view token) {
  const std::string name = lowercase(token);
  if (name == "tree") return bit(Algorithm::Tree) | bit(Algorithm::RecursiveDoubling);  // NCCL's and ours
  if (const auto ours = algorithmFromName(name)) return bit(*ours);
  for (const char* ncclOnly : {"collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"}) {
    if (name == ncclOnly) return Mask{0};
  }
  return std::nullopt;
}

std::optional<Collective> collectiveNamed(std::string_view token) {
  const std::string name = lowercase(token);
  for (Collective c : kCollectives) {
    if (name == collectiveName(c)) return c;
  }
  return std::nullopt;
}

std::string maskText(Mask m) {
  std::string text;
  for (Algorithm a : kAlgorithms) {
    if (m & bit(a)) text += (text.empty() ? "" : ",") + std::string(algorithmName(a));
  }
  return text.empty() ? "none" : text;
}

[[noreturn]] void badAlgo(std::string_view whole, const std::string& why) {
  throwInvalidArgument(std::string(params::kAlgo.name()) + "='" + std::string(whole) + "': " + why);
}

// `[^]name,name,...` -> the allowed mask.
Mask parseList(std::string_view whole, std::string_view list) {
  list = trim(list);
  const bool exclude = !list.empty() && list.front() == '^';
  if (exclude) list.remove_prefix(1);
  Mask named = 0;
  bool any = false;
  for (std::string_view token : split(list, ',')) {
    token = trim(token);
    if (token.empty()) continue;
    const std::optional<Mask> m = algorithmsNamed(token);
    if (!m) {
      badAlgo(whole, "unknown algorithm '" + std::string(token) +
                         "' (known: ring, tree, rd, recursive_doubling, direct, hierarchical, hd, halving_doubling, rsag, "
                         "reduce_scatter_allgather, and NCCL's Ring, Tree, "
                         "CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT)");
    }
    named |= *m;
    any = true;
  }
  if (!any) badAlgo(whole, "an algorithm list is empty");
  return exclude ? static_cast<Mask>(kAllAlgorithms & ~named) : named;
}

std::string bytesText(uint64_t bytes) {
  if (bytes == UINT64_MAX) return "inf";
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && bytes >= 1024 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++unit;
  }
  return std::to_string(bytes) + " " + kUnits[unit];
}

std::string pad(std::string text, size_t width) {
  if (text.size() < width) text.append(width - text.size(), ' ');
  return text;
}

}  // namespace

AlgorithmFilter AlgorithmFilter::parse(std::string_view text) {
  AlgorithmFilter filter;
  filter.text_ = std::string(text);
  if (trim(text).empty()) return filter;
  for (std::string_view element : split(text, ';')) {
    element = trim(element);
    if (element.empty()) continue;
    const size_t colon = element.find(':');
    if (colon == std::string_view::npos) {
      if (filter.global_.set) badAlgo(text, "more than one list without a collective name ('" + std::string(element) + "')");
      filter.global_ = {true, parseList(text, element)};
      continue;
    }
    const std::string_view collectiveToken = trim(element.substr(0, colon));
    const std::optional<Collective> c = collectiveNamed(collectiveToken);
    if (!c) {
      badAlgo(text, "unknown collective '" + std::string(collectiveToken) +
                        "' (known: allreduce, allgather, reducescatter, broadcast, reduce, alltoall, gather, scatter)");
    }
    const Mask allowed = parseList(text, element.substr(colon + 1));
    if ((allowed & supportedMask(*c)) == 0) {
      badAlgo(text, "'" + std::string(element) + "' leaves " + collectiveName(*c) +
                        " no algorithm topoccl implements (it has " + maskText(supportedMask(*c)) + ")");
    }
    filter.perCollective_[static_cast<size_t>(*c)] = {true, allowed};
  }
  return filter;
}

AlgorithmFilter::Mask AlgorithmFilter::effectiveMask(Collective c) const {
  const Entry& own = perCollective_[static_cast<size_t>(c)];
  if (own.set) return own.allowed;
  // NCCL_ALGO leaves NCCL's all-to-all, gather and scatter alone (they are its point-to-point calls); so does ours.
  const bool pointToPoint = c == Collective::AllToAll || c == Collective::Gather || c == Collective::Scatter;
  if (global_.set && !pointToPoint && (global_.allowed & supportedMask(c)) != 0) return global_.allowed;
  return kAllAlgorithms;
}

bool AlgorithmFilter::allows(Collective c, Algorithm a) const { return (effectiveMask(c) & bit(a)) != 0; }

bool AlgorithmFilter::restricts(Collective c) const {
  return (effectiveMask(c) & supportedMask(c)) != supportedMask(c);
}

SelectionTable SelectionTable::defaults() {
  SelectionTable t;
  t.addRow({Collective::AllReduce, 3, kDirectAllReduceMaxRanks, 0, kDirectAllReduceMaxBytes, Algorithm::Direct, 1});
  t.addRow({Collective::AllReduce, 1, INT32_MAX, 0, kRecursiveDoublingMaxBytes, Algorithm::RecursiveDoubling});
  t.addRow({Collective::AllReduce, 1, INT32_MAX, kHierarchicalMinBytes, UINT64_MAX, Algorithm::Hierarchical, INT32_MAX, 2});
  // On one host with 4 or 8 ranks halving-doubling took 0.63-0.96x the ring's time from 64 KiB to 32 MiB over shm,
  // and 0.58-1.05x over loopback TCP (perf/RESULTS.md); other counts fold ranks in and out, and measured no
  // better than the ring at 6.
  for (int ranks : {4, 8})
    t.addRow({Collective::AllReduce, ranks, ranks, kRecursiveDoublingMaxBytes, UINT64_MAX, Algorithm::HalvingDoubling, 1});
  t.addRow({Collective::AllReduce, 1, INT32_MAX, kRecursiveDoublingMaxBytes, UINT64_MAX, Algorithm::Ring});
  t.addRow({Collective::AllGather, 1, INT32_MAX, 0, kDirectMaxBytes, Algorithm::Direct});
  t.addRow({Collective::AllGather, 1, INT32_MAX, kDirectMaxBytes, UINT64_MAX, Algorithm::Ring});
  t.addRow({Collective::ReduceScatter, 1, INT32_MAX, 0, kDirectMaxBytes, Algorithm::Direct});
  t.addRow({Collective::ReduceScatter, 1, INT32_MAX, kDirectMaxBytes, UINT64_MAX, Algorithm::Ring});
  t.addRow({Collective::Broadcast, 1, INT32_MAX, 0, kTreeMaxBytes, Algorithm::Tree});
  t.addRow({Collective::Broadcast, 1, INT32_MAX, kTreeMaxBytes, UINT64_MAX, Algorithm::Ring});
  t.addRow({Collective::Reduce, 1, INT32_MAX, 0, kTreeMaxBytes, Algorithm::Tree});
  t.addRow({Collective::Reduce, 1, INT32_MAX, kTreeMaxBytes, UINT64_MAX, Algorithm::Ring});
  t.addRow({Collective::AllToAll, 1, INT32_MAX, 0, UINT64_MAX, Algorithm::Direct});
  t.addRow({Collective::Gather, 1, INT32_MAX, 0, UINT64_MAX, Algorithm::Direct});
  t.addRow({Collective::Scatter, 1, INT32_MAX, 0, UINT64_MAX, Algorithm::Direct});
  return t;
}

std::vector<SelectionRow> memoryPathRows() {
  // Two ranks: recursive doubling (each reads the other's input and reduces into its own output, one step) below
  // 4 KiB, then reduce_scatter_allgather, whose sums the peer's receive writes into our output as it reduces
  // (kTwoRankRecursiveDoublingMaxBytes). In place recursive doubling's result overwrites the buffer its peer is
  // reading, and every line crosses between the caches twice; a rank cannot choose by placement (peers may differ).
  // Over loopback TCP the ring stays ahead (1.04-1.4x), so these rows are for memory paths only (perf/RESULTS.md).
  // Broadcast on 3 and more ranks goes direct from the tree's limit to 256 MiB (kMemoryPathDirectBroadcastMaxBytes), on
  // up to 8 ranks; more keep the tree to 64 MiB. All-gather (to 128 MiB) and reduce-scatter on 3-8 ranks go direct too.
  // All-reduce on 3-8 ranks: reduce_scatter_allgather from 64 KiB on 3 and 6 ranks, 128 KiB on 4, 256 KiB on 5 and
  // 7, 1 MiB on 8 (kMemoryPathScatterGatherMinBytes); 9 and more, unmeasured, keep the ring.
  // GPU buffers keep the rows from before result mirrors (the executor's, host memory only), unmeasured since on a
  // GPU: recursive doubling on 2 ranks to 1 MiB, reduce_scatter_allgather from 256 KiB on 3 and 5-7 ranks and from
  // 64 MiB on 4 and 8 (and from 256 KiB the GPU path widens its calls to a many-lane ring anyway).
  const auto hostOnly = [](SelectionRow row) {
    row.hostBuffersOnly = true;
    return row;
  };
  return {{Collective::AllReduce, 2, 2, 0, kTwoRankRecursiveDoublingMaxBytes, Algorithm::RecursiveDoubling, 1},
          hostOnly({Collective::AllReduce, 2, 2, kTwoRankRecursiveDoublingMaxBytes, UINT64_MAX, Algorithm::ReduceScatterAllGather, 1}),
          hostOnly({Collective::AllReduce, 3, 3, kMemoryPathScatterGatherMinBytes, UINT64_MAX, Algorithm::ReduceScatterAllGather, 1}),
          hostOnly({Collective::AllReduce, 4, 4, kMemoryPathScatterGatherFourMinBytes, UINT64_MAX, Algorithm::ReduceScatterAllGather, 1}),
          hostOnly({Collective::AllReduce, 6, 6, kMemoryPathScatterGatherMinBytes, UINT64_MAX, Algorithm::ReduceScatterAllGather, 1}),
          hostOnly({Collective::AllReduce, 8, 8, kMemoryPathScatterGatherEightMinBytes, UINT64_MAX, Algorithm::ReduceScatterAllGather, 1}),
          {Collective::AllReduce, 2, 2, kTwoRankRecursiveDoublingMaxBytes, kGpuTwoRankRecursiveDoublingMaxBytes, Algorithm::RecursiveDoubling, 1},
          {Collective::AllReduce, 3, 3, kMemoryPathScatterGatherOddMinBytes, UINT64_MAX, Algorithm::ReduceScatterAllGather, 1},
          {Collective::AllReduce, 5, 7, kMemoryPathScatterGatherOddMinBytes, UINT64_MAX, Algorithm::ReduceScatterAllGather, 1},
          {Collective::AllReduce, 4, 4, kGpuScatterGatherPowerOfTwoMinBytes, UINT64_MAX, Algorithm::ReduceScatterAllGather, 1},
          {Collective::AllReduce, 8, 8, kGpuScatterGatherPowerOfTwoMinBytes, UINT64_MAX, Algorithm::ReduceScatterAllGather, 1},
          {Collective::Broadcast, 3, kMemoryPathDirectMaxRanks, kTreeMaxBytes, kMemoryPathDirectBroadcastMaxBytes,
           Algorithm::Direct, 1},
          {Collective::Broadcast, kMemoryPathDirectMaxRanks + 1, INT32_MAX, kTreeMaxBytes,
           kMemoryPathTreeBroadcastMaxBytes, Algorithm::Tree, 1},
          {Collective::AllGather, 3, kMemoryPathDirectMaxRanks, kDirectMaxBytes, kMemoryPathDirectAllGatherMaxBytes,
           Algorithm::Direct, 1},
          {Collective::ReduceScatter, 3, kMemoryPathDirectMaxRanks, kDirectMaxBytes, UINT64_MAX, Algorithm::Direct, 1}};
}

std::vector<SelectionRow> socketPathRows() {
  return {{Collective::AllReduce, kSocketDoublingMinRanks, INT32_MAX, 0, kRecursiveDoublingMaxBytes, Algorithm::RecursiveDoubling},
          {Collective::AllGather, kSocketDoublingMinRanks, INT32_MAX, 0, kSocketDoublingAllGatherMaxBytes,
           Algorithm::RecursiveDoubling},
          {Collective::ReduceScatter, kSocketDoublingMinRanks, INT32_MAX, 0, kSocketHalvingReduceScatterMaxBytes,
           Algorithm::HalvingDoubling},
          {Collective::AllToAll, kSocketDoublingMinRanks, kSocketDoublingAllToAllWideRanks - 1, 0, kSocketDoublingAllToAllMaxBytes,
           Algorithm::RecursiveDoubling},
          {Collective::AllToAll, kSocketDoublingAllToAllWideRanks, INT32_MAX, 0, kSocketDoublingAllToAllWideMaxBytes,
           Algorithm::RecursiveDoubling},
          // One host over loopback TCP (shm turned off): all-reduce in two rounds at 1-16 MiB (1-4 MiB on 4 ranks).
          {Collective::AllReduce, 3, 3, kSocketScatterGatherMinBytes, kSocketScatterGatherMaxBytes,
           Algorithm::ReduceScatterAllGather, 1},
          {Collective::AllReduce, 5, 7, kSocketScatterGatherMinBytes, kSocketScatterGatherMaxBytes,
           Algorithm::ReduceScatterAllGather, 1},
          {Collective::AllReduce, 4, 4, kSocketScatterGatherMinBytes, kSocketScatterGatherFourRanksMaxBytes,
           Algorithm::ReduceScatterAllGather, 1}};
}

std::vector<SelectionRow> sharedCoreRows() {
  return {{Collective::AllReduce, kSharedCoreRecursiveDoublingMinRanks, kSharedCoreRecursiveDoublingMaxRanks, 0,
           kSharedCoreRecursiveDoublingAllReduceMaxBytes, Algorithm::RecursiveDoubling, 1}};
}

std::vector<SelectionRow> modelledRows(const std::vector<Collective>& collectives, const std::vector<uint64_t>& bandStarts,
                                       int nranks, int minHosts,
                                       const std::function<std::optional<Plan>(Algorithm, Collective)>& planOf,
                                       const std::function<double(const Plan&, uint64_t)>& timeOf,
                                       std::vector<ModelledChoice>* choices) {
  std::vector<SelectionRow> rows;
  for (Collective c : collectives) {
    for (size_t band = 0; band < bandStarts.size(); ++band) {
      const uint64_t lo = bandStarts[band];
      const uint64_t hi = band + 1 < bandStarts.size() ? bandStarts[band + 1] : UINT64_MAX;
      const uint64_t at = band == 0                ? std::min<uint64_t>(1024, hi)
                          : hi == UINT64_MAX       ? lo
                                                   : static_cast<uint64_t>(std::sqrt(static_cast<double>(lo) * static_cast<double>(hi)));
      ModelledChoice choice{c, at, {}, Algorithm::Ring};
      double best = 0;
      for (Algorithm a : kAlgorithms) {
        if (!algorithmSupports(a, c)) continue;
        const std::optional<Plan> plan = planOf(a, c);
        if (!plan) continue;
        const double us = timeOf(*plan, at);
        choice.predictedUs.emplace_back(a, us);
        if (choice.predictedUs.size() == 1 || us < best) best = us, choice.best = a;
      }
      if (choice.predictedUs.empty()) continue;
      if (choices) choices->push_back(choice);
      if (!rows.empty() && rows.back().collective == c && rows.back().algorithm == choice.best &&
          rows.back().maxBytes == lo) {
        rows.back().maxBytes = hi;  // same winner as the band before: one row
        continue;
      }
      rows.push_back({c, nranks, nranks, lo, hi, choice.best, INT32_MAX, minHosts});
    }
  }
  return rows;
}

const char* protocolName(Protocol p) { return p == Protocol::LowLatency ? "LL" : "Simple"; }

ProtocolFilter ProtocolFilter::parse(std::string_view text) {
  ProtocolFilter filter;
  filter.text_ = std::string(text);
  std::string_view list = text;
  const bool exclude = !list.empty() && list.front() == '^';
  if (exclude) list.remove_prefix(1);
  if (list.empty() && !exclude) return filter;
  bool namedLowLatency = false, namedSimple = false;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string token(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    std::transform(token.begin(), token.end(), token.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (token == "ll" || token == "ll128") namedLowLatency = true;
    else if (token == "simple") namedSimple = true;
    else
      throwInvalidArgument(std::string(params::kProto.name()) + "=" + std::string(text) + ": '" + token +
                           "' is not a protocol (LL, LL128, Simple)");
  }
  filter.lowLatency_ = exclude ? !namedLowLatency : namedLowLatency;
  filter.simple_ = exclude ? !namedSimple : namedSimple;
  if (!filter.lowLatency_ && !filter.simple_)
    throwInvalidArgument(std::string(params::kProto.name()) + "=" + std::string(text) + " allows no protocol");
  return filter;
}

void SelectionTable::addDefaultProtocolRows(uint64_t lowLatencyMaxBytes) {
  if (lowLatencyMaxBytes == 0) {  // LL off: only NCCL_PROTO=LL asks for it
    addProtocolRow({std::nullopt, 0, UINT64_MAX, Protocol::Simple});
    return;
  }
  const uint64_t edge = lowLatencyMaxBytes == UINT64_MAX ? UINT64_MAX : lowLatencyMaxBytes + 1;
  addProtocolRow({std::nullopt, 0, edge, Protocol::LowLatency});
  if (edge != UINT64_MAX) addProtocolRow({std::nullopt, edge, UINT64_MAX, Protocol::Simple});
}

Protocol SelectionTable::chooseProtocol(Collective c, uint64_t bytes) const {
  for (const ProtocolRow& row : protocolRows_) {
    if ((!row.collective || *row.collective == c) && bytes >= row.minBytes &&
        (row.maxBytes == UINT64_MAX || bytes < row.maxBytes) && protocolFilter_.allows(row.protocol))
      return row.protocol;
  }
  return protocolFilter_.allows(Protocol::Simple) ? Protocol::Simple : Protocol::LowLatency;
}

SelectionTable SelectionTable::fromConfig() {
  SelectionTable t = defaults();
  t.setFilter(AlgorithmFilter::parse(params::kAlgo.get()));
  return t;
}

Algorithm SelectionTable::choose(Collective c, uint64_t bytes, int nranks, int nhosts, bool gpuBuffers) const {
  if (nranks < 1) throwInvalidArgument("algorithm selection: nranks " + std::to_string(nranks) + " must be at least 1");
  const auto usable = [&](Algorithm a) { return algorithmSupports(a, c) && filter_.allows(c, a); };
  for (const SelectionRow& row : rows_) {
    if (row.hostBuffersOnly && gpuBuffers) continue;
    if (row.collective == c && nranks >= row.minRanks && nranks <= row.maxRanks && nhosts <= row.maxHosts &&
        nhosts >= row.minHosts && bytes >= row.minBytes &&
        (row.maxBytes == UINT64_MAX || bytes < row.maxBytes) && usable(row.algorithm)) {
      return row.algorithm;
    }
  }
  // The row for this size is filtered out: take the usable row whose size range lies nearest (a large
  // message falls back to another bandwidth algorithm, not to a latency one), for this rank count first.
  const auto distance = [&](const SelectionRow& row) -> uint64_t {
    if (bytes < row.minBytes) return row.minBytes - bytes;
    if (row.maxBytes != UINT64_MAX && bytes >= row.maxBytes) return bytes - row.maxBytes + 1;
    return 0;
  };
  for (const bool matchRanks : {true, false}) {
    const SelectionRow* nearest = nullptr;
    for (const SelectionRow& row : rows_) {
      if (row.collective != c || !usable(row.algorithm) || (row.hostBuffersOnly && gpuBuffers)) continue;
      if (matchRanks && (nranks < row.minRanks || nranks > row.maxRanks || nhosts > row.maxHosts || nhosts < row.minHosts))
        continue;
      // Equally near outside their ranges: the later row, which the table means for larger sizes.
      const uint64_t d = distance(row);
      if (!nearest || d < distance(*nearest) || (d > 0 && d == distance(*nearest))) nearest = &row;
    }
    if (nearest) return nearest->algorithm;
  }
  for (Algorithm a : kAlgorithms) {
    if (usable(a)) return a;
  }
  // The filter keeps at least one supported algorithm per collective, so only a hand-made filter
  // combined with an unsupported collective could get here.
  throwInvalidArgument(std::string("no algorithm available for ") + collectiveName(c));
}

std::string SelectionTable::describe() const {
  std::string out = pad("collective", 15) + pad("ranks", 14) + pad("bytes", 24) + "algorithm\n";
  for (const SelectionRow& row : rows_) {
    std::string ranks = row.minRanks <= 1 && row.maxRanks == INT32_MAX
                            ? "any"
                            : std::to_string(row.minRanks) + ".." +
                                  (row.maxRanks == INT32_MAX ? std::string("") : std::to_string(row.maxRanks));
    if (row.maxHosts != INT32_MAX) ranks += row.maxHosts == 1 ? ", 1 host" : ", <=" + std::to_string(row.maxHosts) + " hosts";
    if (row.minHosts > 1) ranks += ", >=" + std::to_string(row.minHosts) + " hosts";
    const std::string bytes = "[" + bytesText(row.minBytes) + ", " + bytesText(row.maxBytes) + ")";
    std::string algorithm = algorithmName(row.algorithm);
    if (row.hostBuffersOnly) algorithm += " (host buffers)";
    if (!filter_.allows(row.collective, row.algorithm)) algorithm += " (excluded by NCCL_ALGO)";
    out += pad(collectiveName(row.collective), 15) + pad(ranks, 14) + pad(bytes, 24) + algorithm + "\n";
  }
  std::string restricted;
  for (Collective c : kCollectives) {
    if (!filter_.restricts(c)) continue;
    std::string allowed;
    for (Algorithm a : kAlgorithms) {
      if (algorithmSupports(a, c) && filter_.allows(c, a)) allowed += (allowed.empty() ? "" : ",") + std::string(algorithmName(a));
    }
    restricted += "  " + pad(collectiveName(c), 15) + allowed + "\n";
  }
  if (!restricted.empty()) out += std::string(params::kAlgo.name()) + "='" + filter_.text() + "' allows:\n" + restricted;
  if (!protocolRows_.empty()) {
    out += "GPU protocols:\n" + pad("collective", 15) + pad("bytes", 24) + "protocol\n";
    for (const ProtocolRow& row : protocolRows_) {
      std::string protocol = protocolName(row.protocol);
      if (!protocolFilter_.allows(row.protocol)) protocol += " (excluded by NCCL_PROTO)";
      out += pad(row.collective ? collectiveName(*row.collective) : "any", 15) +
             pad("[" + bytesText(row.minBytes) + ", " + bytesText(row.maxBytes) + ")", 24) + protocol + "\n";
    }
  }
  return out;
}

}  // namespace topoccl::algo
