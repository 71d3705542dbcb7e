#include <catch2/catch.hpp>

#include "algorithms/cost_model.hpp"
#include "algorithms/selection.hpp"
#include "algorithms/simulator.hpp"
#include "algorithms/validator.hpp"
#include "common/config.hpp"
#include "common/error.hpp"

using namespace topoccl;
using namespace topoccl::algo;

namespace {

constexpr uint64_t kSmall = 1 << 10;
constexpr uint64_t kLarge = 64 << 20;

SelectionTable withAlgo(const std::string& text) {
  SelectionTable table = SelectionTable::defaults();
  table.setFilter(AlgorithmFilter::parse(text));
  return table;
}

// The error's message when parsing `text` fails, or "" when it does not.
std::string parseError(const std::string& text) {
  try {
    (void)AlgorithmFilter::parse(text);
  } catch (const Error& e) {
    CHECK(e.code() == ncclInvalidArgument);
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("the default table: latency algorithms for small messages, ring for large, direct for personalized") {
  const SelectionTable t = SelectionTable::defaults();
  CHECK(t.choose(Collective::AllReduce, kSmall, 8) == Algorithm::Direct);  // one round on 3..8 ranks
  CHECK(t.choose(Collective::AllReduce, kSmall, 3) == Algorithm::Direct);
  CHECK(t.choose(Collective::AllReduce, kDirectAllReduceMaxBytes - 1, kDirectAllReduceMaxRanks) == Algorithm::Direct);
  CHECK(t.choose(Collective::AllReduce, kSmall, 2) == Algorithm::RecursiveDoubling);
  CHECK(t.choose(Collective::AllReduce, kSmall, kDirectAllReduceMaxRanks + 1) == Algorithm::RecursiveDoubling);
  CHECK(t.choose(Collective::AllReduce, kSmall, 8, 2) == Algorithm::RecursiveDoubling);  // across hosts
  CHECK(t.choose(Collective::AllReduce, kSmall, 8, 1) == Algorithm::Direct);
  CHECK(t.choose(Collective::AllReduce, kRecursiveDoublingMaxBytes - 1, 16) == Algorithm::RecursiveDoubling);
  CHECK(t.choose(Collective::AllReduce, kRecursiveDoublingMaxBytes, 8) == Algorithm::HalvingDoubling);  // 4 or 8, one host
  CHECK(t.choose(Collective::AllReduce, kLarge, 4) == Algorithm::HalvingDoubling);
  CHECK(t.choose(Collective::AllReduce, kLarge, 8) == Algorithm::HalvingDoubling);
  CHECK(t.choose(Collective::AllReduce, kLarge, 6) == Algorithm::Ring);  // folding ranks in and out does not pay
  CHECK(t.choose(Collective::AllReduce, kLarge, 2) == Algorithm::Ring);
  CHECK(t.choose(Collective::AllReduce, kRecursiveDoublingMaxBytes, 16) == Algorithm::Ring);
  CHECK(t.choose(Collective::AllReduce, kLarge, 8, 2) == Algorithm::Hierarchical);  // across hosts
  CHECK(t.choose(Collective::AllReduce, kHierarchicalMinBytes, 4, 4) == Algorithm::Hierarchical);
  CHECK(t.choose(Collective::AllGather, kLarge, 8, 2) == Algorithm::Ring);
  CHECK(t.choose(Collective::Broadcast, kSmall, 8) == Algorithm::Tree);
  CHECK(t.choose(Collective::Broadcast, kLarge, 8) == Algorithm::Ring);
  CHECK(t.choose(Collective::Reduce, kTreeMaxBytes - 1, 8) == Algorithm::Tree);
  CHECK(t.choose(Collective::Reduce, kTreeMaxBytes, 8) == Algorithm::Ring);
  CHECK(t.choose(Collective::AllGather, kSmall, 8) == Algorithm::Direct);
  CHECK(t.choose(Collective::AllGather, kLarge, 8) == Algorithm::Ring);
  CHECK(t.choose(Collective::ReduceScatter, kLarge, 8) == Algorithm::Ring);
  CHECK(t.choose(Collective::AllToAll, kLarge, 8) == Algorithm::Direct);
  CHECK(t.choose(Collective::Gather, kSmall, 8) == Algorithm::Direct);
  CHECK(t.choose(Collective::Scatter, kLarge, 8) == Algorithm::Direct);
  CHECK_THROWS_AS(t.choose(Collective::AllReduce, kSmall, 0), Error);
}

TEST_CASE("every choice of the default table makes a valid plan") {
  const SelectionTable t = SelectionTable::defaults();
  for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter, Collective::Broadcast,
                       Collective::Reduce, Collective::AllToAll, Collective::Gather, Collective::Scatter}) {
    for (uint64_t bytes : {uint64_t{0}, kSmall, kLarge, UINT64_MAX - 1}) {
      for (int n : {1, 3, 8}) {
        const Algorithm a = t.choose(c, bytes, n);
        const ValidationReport report = validate(makePlan(a, c, n, n - 1, 2));
        INFO(collectiveName(c) << " " << bytes << " bytes on " << n << " ranks -> " << algorithmName(a));
        CHECK(report.ok());
      }
    }
  }
}

TEST_CASE("NCCL_ALGO: one list applies wherever it leaves an algorithm") {
  const SelectionTable ring = withAlgo("ring");
  CHECK(ring.choose(Collective::AllReduce, kSmall, 8) == Algorithm::Ring);
  CHECK(ring.choose(Collective::Broadcast, kSmall, 8) == Algorithm::Ring);
  CHECK(ring.choose(Collective::AllGather, kSmall, 8) == Algorithm::Ring);
  CHECK(ring.choose(Collective::AllToAll, kSmall, 8) == Algorithm::Direct);  // NCCL ignores it there too

  const SelectionTable upper = withAlgo("  RING ");
  CHECK(upper.choose(Collective::AllReduce, kSmall, 8) == Algorithm::Ring);

  const SelectionTable tree = withAlgo("Tree");  // NCCL's Tree = our tree and recursive doubling
  CHECK(tree.choose(Collective::AllReduce, kLarge, 8) == Algorithm::RecursiveDoubling);
  CHECK(tree.choose(Collective::Reduce, kLarge, 8) == Algorithm::Tree);
  // NCCL has no tree AllGather (it fails the call); ours are the log-depth algorithms, and AllGather has recursive
  // doubling. Collectives with neither stay unrestricted.
  CHECK(tree.choose(Collective::AllGather, kLarge, 8) == Algorithm::RecursiveDoubling);
  CHECK(tree.choose(Collective::ReduceScatter, kLarge, 8) == Algorithm::Ring);
  // All-to-all has recursive doubling too, but a list for every collective leaves it alone, as NCCL's does.
  CHECK(tree.choose(Collective::AllToAll, kSmall, 8) == Algorithm::Direct);
  CHECK(withAlgo("alltoall:tree").choose(Collective::AllToAll, kLarge, 8) == Algorithm::RecursiveDoubling);

  const SelectionTable ncclOnly = withAlgo("NVLS,CollNetDirect");
  CHECK(ncclOnly.choose(Collective::AllReduce, kLarge, 6) == Algorithm::Ring);
  CHECK(ncclOnly.choose(Collective::AllReduce, kLarge, 8) == Algorithm::HalvingDoubling);
  CHECK_FALSE(ncclOnly.filter().restricts(Collective::AllReduce));
  const SelectionTable mixed = withAlgo("nvls,ring");
  CHECK(mixed.choose(Collective::AllReduce, kSmall, 8) == Algorithm::Ring);
}

TEST_CASE("NCCL_ALGO can force the ring or the hierarchical plan across hosts") {
  SelectionTable t = SelectionTable::defaults();
  t.setFilter(AlgorithmFilter::parse("ring"));
  CHECK(t.choose(Collective::AllReduce, kLarge, 4, 2) == Algorithm::Ring);
  t.setFilter(AlgorithmFilter::parse("allreduce:hierarchical"));
  CHECK(t.choose(Collective::AllReduce, kLarge, 4, 2) == Algorithm::Hierarchical);
  CHECK(t.choose(Collective::AllReduce, kSmall, 4, 2) == Algorithm::Hierarchical);
  CHECK(t.choose(Collective::AllReduce, kLarge, 4, 1) == Algorithm::Hierarchical);  // one host: RS + AG ring
}

TEST_CASE("NCCL_ALGO: exclusion and lists") {
  const SelectionTable noRing = withAlgo("^ring");
  CHECK(noRing.choose(Collective::AllReduce, kLarge, 8) == Algorithm::HalvingDoubling);
  CHECK(noRing.choose(Collective::AllReduce, kLarge, 6) == Algorithm::RecursiveDoubling);  // nearest size range, not direct
  CHECK(noRing.choose(Collective::AllReduce, kSmall, 8) == Algorithm::Direct);
  CHECK(noRing.choose(Collective::AllGather, kLarge, 8) == Algorithm::Direct);
  CHECK(noRing.choose(Collective::Broadcast, kLarge, 8) == Algorithm::Tree);
  CHECK(noRing.choose(Collective::AllToAll, kLarge, 8) == Algorithm::Direct);

  const SelectionTable list = withAlgo("ring,tree");
  CHECK(list.choose(Collective::AllReduce, kSmall, 8) == Algorithm::RecursiveDoubling);
  CHECK(list.choose(Collective::AllGather, kSmall, 8) == Algorithm::Ring);
  CHECK(list.filter().allows(Collective::Broadcast, Algorithm::Tree));
  CHECK_FALSE(list.filter().allows(Collective::AllGather, Algorithm::Direct));

  const SelectionTable noDirect = withAlgo("^direct");
  CHECK(noDirect.choose(Collective::Gather, kSmall, 8) == Algorithm::Direct);  // nothing else implements it
}

TEST_CASE("NCCL_ALGO: per-collective lists override the global one") {
  const SelectionTable t = withAlgo("allreduce:ring;broadcast:tree");
  CHECK(t.choose(Collective::AllReduce, kSmall, 8) == Algorithm::Ring);
  CHECK(t.choose(Collective::Broadcast, kLarge, 8) == Algorithm::Tree);
  CHECK(t.choose(Collective::AllGather, kSmall, 8) == Algorithm::Direct);
  CHECK(t.choose(Collective::Reduce, kLarge, 8) == Algorithm::Ring);

  const SelectionTable both = withAlgo("tree; AllReduce:^rd,direct");
  CHECK(both.choose(Collective::AllReduce, kSmall, 8) == Algorithm::Ring);
  CHECK(withAlgo("tree; AllReduce:^rd").choose(Collective::AllReduce, kSmall, 8) == Algorithm::Direct);
  CHECK(both.choose(Collective::Broadcast, kLarge, 8) == Algorithm::Tree);

  const SelectionTable ours = withAlgo("allreduce:recursive_doubling;alltoall:direct");
  CHECK(ours.choose(Collective::AllReduce, kLarge, 8) == Algorithm::RecursiveDoubling);
}

TEST_CASE("NCCL_ALGO: malformed values name the bad token") {
  CHECK(parseError("ring,butterfly").find("'butterfly'") != std::string::npos);
  CHECK(parseError("allreduce:hypercube").find("'hypercube'") != std::string::npos);
  CHECK(parseError("allgatherv:ring").find("unknown collective 'allgatherv'") != std::string::npos);
  CHECK(parseError("alltoall:ring").find("leaves alltoall no algorithm") != std::string::npos);
  CHECK(parseError("allreduce:^ring,tree,direct,hier,hd,rsag").find("leaves allreduce no algorithm") != std::string::npos);
  CHECK(parseError("ring;tree").find("more than one list") != std::string::npos);
  CHECK(parseError("^").find("empty") != std::string::npos);
  CHECK(parseError("allreduce:").find("empty") != std::string::npos);
  CHECK(parseError("ring,butterfly").find("NCCL_ALGO") != std::string::npos);
  CHECK(parseError("").empty());
  CHECK(parseError(" ; ").empty());
}

TEST_CASE("fromConfig reads NCCL_ALGO through the config registry") {
  config::clearOverrides();
  config::setOverride("NCCL_ALGO", "allreduce:ring");
  CHECK(SelectionTable::fromConfig().choose(Collective::AllReduce, kSmall, 4) == Algorithm::Ring);
  config::setOverride("NCCL_ALGO", "");
  CHECK(SelectionTable::fromConfig().choose(Collective::AllReduce, kSmall, 4) == Algorithm::Direct);
  config::setOverride("NCCL_ALGO", "sideways");
  CHECK_THROWS_AS(SelectionTable::fromConfig(), Error);
  config::clearOverrides();
}

TEST_CASE("describe prints the table and the filter") {
  const std::string plain = SelectionTable::defaults().describe();
  INFO(plain);
  CHECK(plain.find("allreduce      3..8, 1 host  [0 B, 64 KiB)           direct") != std::string::npos);
  CHECK(plain.find("allreduce      any           [0 B, 64 KiB)           recursive_doubling") != std::string::npos);
  CHECK(plain.find("[64 KiB, inf)") != std::string::npos);
  CHECK(plain.find("alltoall") != std::string::npos);
  CHECK(plain.find("NCCL_ALGO") == std::string::npos);

  const std::string filtered = withAlgo("allreduce:ring").describe();
  INFO(filtered);
  CHECK(filtered.find("recursive_doubling (excluded by NCCL_ALGO)") != std::string::npos);
  CHECK(filtered.find("NCCL_ALGO='allreduce:ring' allows:") != std::string::npos);
}

TEST_CASE("extra rows with a rank range take precedence when listed first") {
  SelectionTable t;
  t.addRow({Collective::AllReduce, 2, 2, 0, UINT64_MAX, Algorithm::RecursiveDoubling});
  const SelectionTable defaults = SelectionTable::defaults();
  for (const SelectionRow& row : defaults.rows()) t.addRow(row);
  CHECK(t.choose(Collective::AllReduce, kLarge, 2) == Algorithm::RecursiveDoubling);
  CHECK(t.choose(Collective::AllReduce, kLarge, 3) == Algorithm::Ring);
  CHECK(t.describe().find("2..2") != std::string::npos);
}

TEST_CASE("modelled rows pick each band's fastest candidate, merge equal neighbours and take precedence") {
  // A made-up model: latency algorithms win below 64 KiB, the ring above; the bands' evaluation points are
  // recorded, so the test also sees where each band was judged.
  std::vector<uint64_t> asked;
  const auto planOf = [](Algorithm a, Collective c) -> std::optional<Plan> {
    if (a == Algorithm::Hierarchical) return std::nullopt;  // no candidate here
    return makePlan(a, c, 4, 0, 1);
  };
  const auto timeOf = [&](const Plan& plan, uint64_t bytes) {
    asked.push_back(bytes);
    const bool latency = plan.name == "recursive_doubling" || plan.name == "direct" || plan.name == "tree";
    return (latency ? 10.0 : 40.0) + static_cast<double>(bytes) * (latency ? 1e-3 : 1e-4);
  };
  std::vector<ModelledChoice> choices;
  const auto rows = modelledRows({Collective::AllReduce, Collective::AllGather}, {0, 4 << 10, 64 << 10, 1 << 20}, 4, 2,
                                 planOf, timeOf, &choices);
  REQUIRE(choices.size() == 8);
  CHECK(choices[0].bytes == 1024);                 // first band: at 1 KiB
  CHECK(choices[1].bytes == 16384);                // geometric middle of [4 KiB, 64 KiB)
  CHECK(choices[3].bytes == (1u << 20));           // last band: at its start
  CHECK(choices[3].best == Algorithm::Ring);
  CHECK(choices[0].best != Algorithm::Ring);
  for (const auto& choice : choices)
    for (const auto& [algorithm, us] : choice.predictedUs) CHECK(algorithm != Algorithm::Hierarchical);
  // All-reduce: one latency row (RD or direct, the first in Algorithm order at equal time) up to where the
  // ring wins, then one ring row to the end.
  std::vector<SelectionRow> allReduce;
  for (const auto& row : rows)
    if (row.collective == Collective::AllReduce) allReduce.push_back(row);
  REQUIRE(allReduce.size() == 2);
  CHECK(allReduce[0].minBytes == 0);
  CHECK(allReduce[0].maxBytes == allReduce[1].minBytes);
  CHECK(allReduce[1].algorithm == Algorithm::Ring);
  CHECK(allReduce[1].maxBytes == UINT64_MAX);
  CHECK(allReduce[0].minRanks == 4);
  CHECK(allReduce[0].maxRanks == 4);
  CHECK(allReduce[0].minHosts == 2);

  SelectionTable t = SelectionTable::defaults();
  t.prependRows(rows);
  CHECK(t.choose(Collective::AllReduce, 8 << 20, 4, 2) == Algorithm::Ring);          // modelled, not hierarchical
  CHECK(t.choose(Collective::AllReduce, 8 << 20, 4, 1) == Algorithm::HalvingDoubling);  // one host: the defaults
  CHECK(t.choose(Collective::AllReduce, 8 << 20, 8, 2) == Algorithm::Hierarchical);  // other rank count: defaults
  t.setFilter(AlgorithmFilter::parse("allreduce:hierarchical"));                     // NCCL_ALGO still wins
  CHECK(t.choose(Collective::AllReduce, 8 << 20, 4, 2) == Algorithm::Hierarchical);
}

TEST_CASE("modelled rows on the simulator: recursive doubling or direct for small all-reduce, halving-doubling for large") {
  const CostModel model = CostModel::uniform(8, 20.0, 1.0 / 1e3);  // 20 us, 1 GB/s: alpha / beta = 20 KB
  const auto rows = modelledRows({Collective::AllReduce}, {0, 64 << 10, 1 << 20}, 8, 2,
                                 [](Algorithm a, Collective c) -> std::optional<Plan> {
                                   if (a == Algorithm::Hierarchical) return std::nullopt;
                                   return makePlan(a, c, 8, 0, 1);
                                 },
                                 [&](const Plan& plan, uint64_t bytes) { return simulate(plan, bytes, model).finishUs; });
  REQUIRE(!rows.empty());
  CHECK(rows.front().algorithm != Algorithm::Ring);
  // Both move 2 (n-1)/n of the data; on a uniform model halving-doubling's 2 log2 n rounds beat the ring's 2 (n-1).
  CHECK(rows.back().algorithm == Algorithm::HalvingDoubling);
  CHECK(rows.back().maxBytes == UINT64_MAX);
}

TEST_CASE("modelled rows on the simulator: a direct broadcast pays for the root's link, so large ones pipeline") {
  const CostModel model = CostModel::uniform(8, 20.0, 1.0 / 1e3);  // 20 us, 1 GB/s
  std::vector<ModelledChoice> choices;
  const auto rows = modelledRows({Collective::Broadcast}, {0, 64 << 10, 16 << 20}, 8, 2,
                                 [](Algorithm a, Collective c) -> std::optional<Plan> { return makePlan(a, c, 8, 0, 1); },
                                 [&](const Plan& plan, uint64_t bytes) {
                                   return simulate(plan, bytes, model, SimOptions{16, false}).finishUs;  // pipelined, as the communicator models
                                 },
                                 &choices);
  REQUIRE(choices.size() == 3);
  for (const ModelledChoice& choice : choices) {
    double direct = 0, ring = 0;
    for (const auto& [algorithm, us] : choice.predictedUs) {
      if (algorithm == Algorithm::Direct) direct = us;
      if (algorithm == Algorithm::Ring) ring = us;
    }
    REQUIRE(direct > 0);
    REQUIRE(ring > 0);
    // From 16 MiB the root's one link carries 7 copies: about 7x the pipelined chain's time.
    if (choice.bytes >= (16u << 20)) CHECK(direct > 4 * ring);
  }
  CHECK(rows.back().algorithm != Algorithm::Direct);
}

TEST_CASE("GPU protocols: LL up to the threshold, Simple above, within NCCL_PROTO, printed with the table") {
  using P = Protocol;
  constexpr uint64_t kLowLatencyMaxBytes = 64 << 10;
  SelectionTable table = SelectionTable::defaults();
  CHECK(table.chooseProtocol(Collective::AllReduce, 8) == P::Simple);  // no rows: Simple
  table.addDefaultProtocolRows(kLowLatencyMaxBytes);
  CHECK(table.chooseProtocol(Collective::AllReduce, 8) == P::LowLatency);
  CHECK(table.chooseProtocol(Collective::AllGather, kLowLatencyMaxBytes) == P::LowLatency);  // inclusive, as NCCL
  CHECK(table.chooseProtocol(Collective::AllGather, kLowLatencyMaxBytes + 1) == P::Simple);
  CHECK(table.chooseProtocol(Collective::Broadcast, uint64_t{1} << 40) == P::Simple);

  const auto with = [&](const char* proto) {
    SelectionTable t = table;
    t.setProtocolFilter(ProtocolFilter::parse(proto));
    return t;
  };
  CHECK(with("Simple").chooseProtocol(Collective::AllReduce, 8) == P::Simple);
  CHECK(with("^ll").chooseProtocol(Collective::AllReduce, 8) == P::Simple);
  CHECK(with("LL128").chooseProtocol(Collective::AllReduce, uint64_t{1} << 30) == P::LowLatency);  // only LL: even large
  CHECK(with("ll,simple").chooseProtocol(Collective::AllReduce, uint64_t{1} << 30) == P::Simple);
  CHECK(with("^Simple").chooseProtocol(Collective::AllReduce, 8) == P::LowLatency);
  CHECK(with("^Simple").chooseProtocol(Collective::AllReduce, uint64_t{1} << 30) == P::LowLatency);
  CHECK_THROWS_WITH(ProtocolFilter::parse("LL,fast"), Catch::Contains("NCCL_PROTO") && Catch::Contains("'fast' is not a protocol"));
  CHECK_THROWS_WITH(ProtocolFilter::parse("^LL,Simple"), Catch::Contains("allows no protocol"));

  // A row for one collective goes before the defaults (searched in order).
  SelectionTable custom;
  custom.addProtocolRow({Collective::AllToAll, 0, UINT64_MAX, P::Simple});
  custom.addDefaultProtocolRows(1024);
  CHECK(custom.chooseProtocol(Collective::AllToAll, 8) == P::Simple);
  CHECK(custom.chooseProtocol(Collective::AllReduce, 8) == P::LowLatency);
  CHECK(custom.chooseProtocol(Collective::AllReduce, 1025) == P::Simple);
  SelectionTable noLowLatency;  // TOPOCCL_GPU_LL_BYTES=0: LL only where NCCL_PROTO leaves nothing else
  noLowLatency.addDefaultProtocolRows(0);
  CHECK(noLowLatency.chooseProtocol(Collective::AllReduce, 0) == P::Simple);
  CHECK(noLowLatency.chooseProtocol(Collective::AllReduce, 8) == P::Simple);
  noLowLatency.setProtocolFilter(ProtocolFilter::parse("LL"));
  CHECK(noLowLatency.chooseProtocol(Collective::AllReduce, 8) == P::LowLatency);
  SelectionTable limitless;
  limitless.addDefaultProtocolRows(UINT64_MAX);
  CHECK(limitless.protocolRows().size() == 1);
  CHECK(limitless.chooseProtocol(Collective::AllReduce, uint64_t{1} << 50) == P::LowLatency);

  const std::string text = with("^LL").describe();
  CHECK_THAT(text, Catch::Contains("GPU protocols:") && Catch::Contains("LL (excluded by NCCL_PROTO)") &&
                       Catch::Contains("Simple"));
}

TEST_CASE("memory-path rows: two ranks on one host keep recursive doubling to 4 KiB then sum halves, broadcast, all-gather and reduce-scatter go direct, sockets keep the ring") {
  SelectionTable table = SelectionTable::defaults();
  CHECK(table.choose(Collective::AllReduce, 512 << 10, 2) == Algorithm::Ring);  // without them (sockets)
  table.prependRows(memoryPathRows());
  for (uint64_t bytes : {uint64_t{0}, uint64_t{8}, uint64_t{1} << 10, (uint64_t{4} << 10) - 4})
    CHECK(table.choose(Collective::AllReduce, bytes, 2) == Algorithm::RecursiveDoubling);
  for (uint64_t bytes : {uint64_t{4} << 10, uint64_t{512} << 10, uint64_t{1} << 20, uint64_t{8} << 20, uint64_t{1} << 30})
    CHECK(table.choose(Collective::AllReduce, bytes, 2) == Algorithm::ReduceScatterAllGather);
  // All-reduce on 3-8 ranks: a direct reduce-scatter and all-gather from 64 KiB on 3 and 6 ranks, 128 KiB on 4,
  // 256 KiB on 5 and 7, 1 MiB on 8; 9 and more keep the ring; two hosts take the hierarchical plan.
  for (const auto& [ranks, from, before] : {std::tuple{3, uint64_t{64} << 10, Algorithm::Direct}, std::tuple{4, uint64_t{128} << 10, Algorithm::HalvingDoubling},
                                            std::tuple{6, uint64_t{64} << 10, Algorithm::Direct}, std::tuple{5, uint64_t{256} << 10, Algorithm::Ring},
                                            std::tuple{7, uint64_t{256} << 10, Algorithm::Ring}, std::tuple{8, uint64_t{1} << 20, Algorithm::HalvingDoubling}}) {
    INFO(ranks << " ranks");
    CHECK(table.choose(Collective::AllReduce, from - 4, ranks) == before);
    for (uint64_t bytes : {from, uint64_t{1} << 20, uint64_t{64} << 20, uint64_t{1} << 30})
      CHECK(table.choose(Collective::AllReduce, bytes, ranks) == Algorithm::ReduceScatterAllGather);
    CHECK(table.choose(Collective::AllReduce, 1 << 20, ranks, 2) == Algorithm::Hierarchical);  // two hosts
  }
  CHECK(table.choose(Collective::AllReduce, 1 << 20, 9) == Algorithm::Ring);
  // GPU buffers, where the executor's result mirrors do not apply, keep the rows from before them: recursive doubling
  // on 2 ranks to 1 MiB then the ring, two rounds from 256 KiB on 3 and 5-7 ranks and from 64 MiB on 4 and 8.
  const auto onGpu = [&](uint64_t bytes, int ranks) { return table.choose(Collective::AllReduce, bytes, ranks, 1, true); };
  CHECK(onGpu(64 << 10, 2) == Algorithm::RecursiveDoubling);
  CHECK(onGpu((1 << 20) - 4, 2) == Algorithm::RecursiveDoubling);
  CHECK(onGpu(1 << 20, 2) == Algorithm::Ring);
  for (int ranks : {3, 5, 6, 7}) {
    CHECK(onGpu(128 << 10, ranks) != Algorithm::ReduceScatterAllGather);
    CHECK(onGpu(256 << 10, ranks) == Algorithm::ReduceScatterAllGather);
  }
  for (int ranks : {4, 8}) {
    CHECK(onGpu(1 << 20, ranks) == Algorithm::HalvingDoubling);
    CHECK(onGpu(uint64_t{64} << 20, ranks) == Algorithm::ReduceScatterAllGather);
  }
  CHECK_THAT(table.describe(), Catch::Contains("reduce_scatter_allgather (host buffers)"));
  CHECK(table.choose(Collective::AllReduce, 1 << 20, 2, 2) != Algorithm::RecursiveDoubling);  // two hosts
  CHECK(table.choose(Collective::AllGather, 1 << 20, 2) == Algorithm::Ring);
  // Broadcast on 3-8 ranks goes direct from 32 KiB to 256 MiB, on one host only; more ranks keep the tree to 64 MiB.
  for (int ranks : {3, 4, 8, 9, 17}) {
    CHECK(table.choose(Collective::Broadcast, (uint64_t{32} << 10) - 1, ranks) == Algorithm::Tree);
    for (uint64_t bytes : {uint64_t{32} << 10, uint64_t{1} << 20, (uint64_t{64} << 20) - 1})
      CHECK(table.choose(Collective::Broadcast, bytes, ranks) == (ranks <= 8 ? Algorithm::Direct : Algorithm::Tree));
    for (uint64_t bytes : {uint64_t{64} << 20, (uint64_t{256} << 20) - 1})
      CHECK(table.choose(Collective::Broadcast, bytes, ranks) == (ranks <= 8 ? Algorithm::Direct : Algorithm::Ring));
    CHECK(table.choose(Collective::Broadcast, uint64_t{256} << 20, ranks) == Algorithm::Ring);
  }
  // All-gather and reduce-scatter on 3-8 ranks go direct past 64 KiB (all-gather to 128 MiB); two ranks and more
  // than 8 keep the ring, and so do sockets.
  for (int ranks : {2, 3, 5, 8, 9}) {
    const Algorithm wide = ranks >= 3 && ranks <= 8 ? Algorithm::Direct : Algorithm::Ring;
    for (uint64_t bytes : {uint64_t{64} << 10, uint64_t{1} << 20, uint64_t{64} << 20, (uint64_t{128} << 20) - 1}) {
      CHECK(table.choose(Collective::AllGather, bytes, ranks) == wide);
      CHECK(table.choose(Collective::ReduceScatter, bytes, ranks) == wide);
    }
    CHECK(table.choose(Collective::AllGather, uint64_t{128} << 20, ranks) == Algorithm::Ring);
    CHECK(table.choose(Collective::ReduceScatter, uint64_t{1} << 30, ranks) == wide);
    CHECK(table.choose(Collective::AllGather, 1 << 20, ranks, 2) == Algorithm::Ring);  // two hosts
  }
  CHECK(table.choose(Collective::Broadcast, 1 << 20, 4, 2) == Algorithm::Ring);  // two hosts
  // NCCL_ALGO still rules.
  table.setFilter(AlgorithmFilter::parse("allreduce:ring"));
  CHECK(table.choose(Collective::AllReduce, 1 << 20, 2) == Algorithm::Ring);
}

TEST_CASE("shared-core rows: 4-8 ranks sharing CPUs take recursive doubling for small all-reduce, 3 keep direct") {
  SelectionTable table = SelectionTable::defaults();
  table.prependRows(memoryPathRows());
  CHECK(table.choose(Collective::AllReduce, 8, 4) == Algorithm::Direct);  // cores of their own
  CHECK(table.choose(Collective::AllGather, 512, 4) == Algorithm::Direct);
  table.prependRows(sharedCoreRows());
  for (int ranks : {4, 5, 6, 7, 8}) {
    for (uint64_t bytes : {uint64_t{0}, uint64_t{8}, uint64_t{4} << 10, (uint64_t{8} << 10) - 4})
      CHECK(table.choose(Collective::AllReduce, bytes, ranks) == Algorithm::RecursiveDoubling);
    CHECK(table.choose(Collective::AllReduce, uint64_t{8} << 10, ranks) == Algorithm::Direct);
    CHECK(table.choose(Collective::AllGather, 512, ranks) == Algorithm::Direct);  // measured no better: not chosen
  }
  CHECK(table.choose(Collective::AllReduce, uint64_t{1} << 20, 4) == Algorithm::ReduceScatterAllGather);  // memory-path rows
  CHECK(table.choose(Collective::AllReduce, 8, 3) == Algorithm::Direct);
  CHECK(table.choose(Collective::AllReduce, 8, 2) == Algorithm::RecursiveDoubling);  // the memory-path row, as before
  CHECK(table.choose(Collective::AllToAll, 512, 4) == Algorithm::Direct);
  // NCCL_ALGO still rules.
  table.setFilter(AlgorithmFilter::parse("allreduce:direct;allgather:direct"));
  CHECK(table.choose(Collective::AllReduce, 8, 4) == Algorithm::Direct);
  CHECK(table.choose(Collective::AllGather, 512, 4) == Algorithm::Direct);
  table.setFilter(AlgorithmFilter::parse("allgather:rd"));
  CHECK(table.choose(Collective::AllGather, uint64_t{1} << 20, 4) == Algorithm::RecursiveDoubling);  // wherever asked
}

TEST_CASE("socket-path rows: 4 ranks and more take log2 n rounds for small all-to-all, all-reduce, all-gather, reduce-scatter, one host's mid-size all-reduce two") {
  SelectionTable table = SelectionTable::defaults();
  CHECK(table.choose(Collective::AllToAll, 512, 4) == Algorithm::Direct);  // no socket pairs: not prepended
  table.prependRows(socketPathRows());
  for (int ranks : {4, 5, 6, 7}) {
    for (uint64_t bytes : {uint64_t{0}, uint64_t{8}, uint64_t{4099}, (uint64_t{64} << 10) - 1})
      CHECK(table.choose(Collective::AllToAll, bytes, ranks) == Algorithm::RecursiveDoubling);
    CHECK(table.choose(Collective::AllToAll, uint64_t{64} << 10, ranks) == Algorithm::Direct);
  }
  for (int ranks : {8, 9, 16, 64}) {
    CHECK(table.choose(Collective::AllToAll, (uint64_t{128} << 10) - 8, ranks) == Algorithm::RecursiveDoubling);
    CHECK(table.choose(Collective::AllToAll, uint64_t{128} << 10, ranks) == Algorithm::Direct);
  }
  for (int ranks : {2, 3}) CHECK(table.choose(Collective::AllToAll, 8, ranks) == Algorithm::Direct);
  CHECK(table.choose(Collective::AllToAll, 8, 8, 2) == Algorithm::RecursiveDoubling);  // across hosts too
  // All-reduce below 64 KiB and all-gather below 1 MiB likewise, from 4 ranks; 3 keep direct.
  for (int ranks : {4, 5, 6, 8, 9}) {
    for (uint64_t bytes : {uint64_t{0}, uint64_t{8}, (uint64_t{64} << 10) - 4}) {
      CHECK(table.choose(Collective::AllReduce, bytes, ranks) == Algorithm::RecursiveDoubling);
      CHECK(table.choose(Collective::AllGather, bytes, ranks) == Algorithm::RecursiveDoubling);
    }
    CHECK(table.choose(Collective::AllGather, (uint64_t{1} << 20) - 4, ranks) == Algorithm::RecursiveDoubling);
    CHECK(table.choose(Collective::AllGather, uint64_t{1} << 20, ranks) == Algorithm::Ring);
    CHECK(table.choose(Collective::ReduceScatter, 512, ranks) == Algorithm::HalvingDoubling);
    CHECK(table.choose(Collective::ReduceScatter, (uint64_t{4} << 20) - 8, ranks) == Algorithm::HalvingDoubling);
    CHECK(table.choose(Collective::ReduceScatter, uint64_t{4} << 20, ranks) == Algorithm::Ring);
  }
  CHECK(table.choose(Collective::ReduceScatter, 512, 3) == Algorithm::Direct);
  CHECK(table.choose(Collective::AllReduce, 8, 3) == Algorithm::Direct);
  CHECK(table.choose(Collective::AllGather, 8, 3) == Algorithm::Direct);
  CHECK(table.choose(Collective::AllReduce, uint64_t{64} << 10, 6) == Algorithm::Ring);
  // All-reduce on one host in two rounds at 1-16 MiB on 3 and 5-7 ranks, at 1-4 MiB on 4; 8, 2 and two hosts keep theirs.
  for (int ranks : {3, 4, 5, 6, 7}) {
    CHECK(table.choose(Collective::AllReduce, (uint64_t{1} << 20) - 4, ranks) != Algorithm::ReduceScatterAllGather);
    CHECK(table.choose(Collective::AllReduce, uint64_t{1} << 20, ranks) == Algorithm::ReduceScatterAllGather);
    const uint64_t end = ranks == 4 ? uint64_t{4} << 20 : uint64_t{16} << 20;
    CHECK(table.choose(Collective::AllReduce, end - 4, ranks) == Algorithm::ReduceScatterAllGather);
    CHECK(table.choose(Collective::AllReduce, end, ranks) == (ranks == 4 ? Algorithm::HalvingDoubling : Algorithm::Ring));
    CHECK(table.choose(Collective::AllReduce, uint64_t{2} << 20, ranks, 2) == Algorithm::Hierarchical);  // two hosts
  }
  for (int ranks : {2, 8}) CHECK(table.choose(Collective::AllReduce, uint64_t{2} << 20, ranks) != Algorithm::ReduceScatterAllGather);
  CHECK(table.choose(Collective::AllReduce, uint64_t{4} << 20, 4) == Algorithm::HalvingDoubling);  // nothing else moved
  // A per-collective NCCL_ALGO rules; a global list, as NCCL's, leaves all-to-all alone.
  table.setFilter(AlgorithmFilter::parse("alltoall:direct"));
  CHECK(table.choose(Collective::AllToAll, 8, 4) == Algorithm::Direct);
  table.setFilter(AlgorithmFilter::parse("^rd"));
  CHECK(table.choose(Collective::AllToAll, 8, 4) == Algorithm::RecursiveDoubling);
  CHECK(table.choose(Collective::AllReduce, 8, 4) == Algorithm::Direct);
  CHECK(table.choose(Collective::AllGather, 8, 4) == Algorithm::Direct);
  table.setFilter(AlgorithmFilter::parse("Tree"));
  CHECK(table.choose(Collective::AllToAll, uint64_t{1} << 20, 4) == Algorithm::Direct);
}
