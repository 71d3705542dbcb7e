#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <pugixml.hpp>
#include <string>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "algorithms/generators.hpp"
#include "algorithms/simulator.hpp"
#include "algorithms/timeline_svg.hpp"
#include "algorithms/validator.hpp"
#include "common/error.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;
using namespace topoccl::algo;

namespace {

int mod(int x, int n) { return ((x % n) + n) % n; }

ChunkRange input(uint32_t offset, uint32_t count = 1) { return {BufferId::Input, offset, count}; }
ChunkRange output(uint32_t offset, uint32_t count = 1) { return {BufferId::Output, offset, count}; }
ChunkRange scratch(uint32_t offset, uint32_t count = 1) { return {BufferId::Scratch, offset, count}; }

// A small plan builder for hand-written plans (the generators' PlanBuilder is private).
struct Builder {
  Plan plan;
  Builder(const std::string& name, Collective c, int n, uint32_t cpb) {
    plan.name = name;
    plan.collective = c;
    plan.nranks = n;
    plan.chunksPerBlock = cpb;
    plan.ranks.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      plan.inputChunks = std::max(plan.inputChunks, inputBlocks(c, n, r, -1) * cpb);
      plan.outputChunks = std::max(plan.outputChunks, outputBlocks(c, n, r, -1) * cpb);
    }
  }
  uint16_t lane(int rank, int sendPeer, int recvPeer, int channel = 0) {
    auto& lanes = plan.ranks[static_cast<size_t>(rank)].lanes;
    lanes.push_back({sendPeer, recvPeer, channel, {}});
    return static_cast<uint16_t>(lanes.size() - 1);
  }
  StepRef add(int rank, uint16_t laneIndex, StepKind kind, ChunkRange src, ChunkRange dst,
              std::optional<StepRef> dep = std::nullopt) {
    Step step{kind, src, dst, {}};
    if (dep && dep->lane != laneIndex) step.deps.push_back(*dep);  // a lane already runs in order
    auto& steps = plan.ranks[static_cast<size_t>(rank)].lanes[laneIndex].steps;
    steps.push_back(step);
    return {laneIndex, static_cast<uint32_t>(steps.size() - 1)};
  }
};

// Bruck all-gather: rank r keeps blocks r, r+1, ... in scratch slots 0, 1, ...; in round k it sends
// what it has (up to 2^k blocks) to r - 2^k and appends what r + 2^k sends; then it unrotates.
Plan bruckAllGather(int n) {
  Builder b("bruck", Collective::AllGather, n, 1);
  b.plan.scratchChunks = static_cast<uint32_t>(n);
  b.plan.inPlace = false;
  for (int r = 0; r < n; ++r) {
    std::optional<StepRef> ready;
    uint32_t have = 1;
    for (int k = 0; have < static_cast<uint32_t>(n); ++k) {
      const int dist = 1 << k;
      const uint32_t count = std::min<uint32_t>(have, static_cast<uint32_t>(n) - have);
      const uint16_t l = b.lane(r, mod(r - dist, n), mod(r + dist, n));
      if (k == 0) ready = b.add(r, l, StepKind::Copy, input(0), scratch(0));
      b.add(r, l, StepKind::Send, scratch(0, count), {}, ready);
      ready = b.add(r, l, StepKind::Recv, {}, scratch(have, count));
      have += count;
    }
    const uint16_t l = b.lane(r, -1, -1);
    const auto un = static_cast<uint32_t>(n), ur = static_cast<uint32_t>(r);
    b.add(r, l, StepKind::Copy, scratch(0, un - ur), output(ur, un - ur), ready);
    if (r > 0) b.add(r, l, StepKind::Copy, scratch(un - ur, ur), output(0, ur));
  }
  return b.plan;
}

// Recursive-doubling all-gather (n a power of two): in round d exchange the aligned 2^d blocks.
Plan recursiveDoublingAllGather(int n) {
  Builder b("rd_allgather", Collective::AllGather, n, 1);
  b.plan.inPlace = false;
  for (int r = 0; r < n; ++r) {
    std::optional<StepRef> ready;
    for (int d = 0; (1 << d) < n; ++d) {
      const int partner = r ^ (1 << d);
      const uint16_t l = b.lane(r, partner, partner);
      if (d == 0) ready = b.add(r, l, StepKind::Copy, input(0), output(static_cast<uint32_t>(r)));
      const auto count = static_cast<uint32_t>(1 << d);
      b.add(r, l, StepKind::Send, output(static_cast<uint32_t>((r >> d) << d), count), {}, ready);
      ready = b.add(r, l, StepKind::Recv, {}, output(static_cast<uint32_t>((partner >> d) << d), count));
    }
  }
  return b.plan;
}

// Ring all-gather over several rings (rank orders); ring c carries part c of every block on channel
// c. With `bothWays` every ring also runs backwards, carrying its own part.
Plan multiRingAllGather(const std::vector<std::vector<int>>& cycles, bool bothWays) {
  std::vector<std::vector<int>> rings = cycles;
  if (bothWays) {
    for (const auto& cycle : cycles) rings.emplace_back(cycle.rbegin(), cycle.rend());
  }
  const int n = static_cast<int>(rings[0].size());
  const auto cpb = static_cast<uint32_t>(rings.size());
  Builder b("multi_ring", Collective::AllGather, n, cpb);
  for (uint32_t c = 0; c < cpb; ++c) {
    const std::vector<int>& order = rings[c];
    for (int i = 0; i < n; ++i) {
      const int r = order[static_cast<size_t>(i)];
      const auto blockOf = [&](int x) { return output(static_cast<uint32_t>(order[static_cast<size_t>(mod(x, n))]) * cpb + c); };
      const uint16_t l = b.lane(r, order[static_cast<size_t>(mod(i + 1, n))], order[static_cast<size_t>(mod(i - 1, n))],
                                static_cast<int>(c));
      b.add(r, l, StepKind::Send, input(c), {});
      for (int t = 1; t <= n - 2; ++t) b.add(r, l, StepKind::RecvCopySend, {}, blockOf(i - t));
      b.add(r, l, StepKind::Recv, {}, blockOf(i - (n - 1)));
      b.add(r, l, StepKind::Copy, input(c), blockOf(i));
    }
  }
  return b.plan;
}

void requireValid(const Plan& plan) {
  const ValidationReport report = validate(plan);
  INFO(plan.name << ":\n" << report.text());
  REQUIRE(report.ok());
}

std::vector<topo::VertexId> dgx1Gpus(const topo::Topology& t, std::vector<int> indices) {
  std::vector<topo::VertexId> devices;
  for (int i : indices) devices.push_back(t.gpuByIndex(i).value());
  return devices;
}

// The invariant every run keeps: a resource serves one message at a time.
void checkNoOverlap(const SimResult& result) {
  std::map<int, std::vector<std::pair<double, double>>> byResource;
  for (const SimEvent& e : result.events) byResource[e.resource].push_back({e.startUs, e.endUs});
  for (auto& [resource, spans] : byResource) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      INFO("resource " << resource);
      CHECK(spans[i].first >= spans[i - 1].second);
    }
  }
}

}  // namespace

TEST_CASE("ring all-gather N=4, M=4 on unit costs finishes at exactly 6", "[sim]") {
  const Plan plan = ringPlan(Collective::AllGather, 4, 0, 1);
  SimResult r = simulate(plan, 4, CostModel::uniform(4, 1, 1));
  CHECK(r.finishUs == 6.0);
  CHECK(r.messages == 12);
  CHECK(r.events.size() == 24);  // each message holds a send port and a receive port
  checkNoOverlap(r);
  // (N-1)(alpha + (M/N) beta) with alpha 2, beta 0.25, M 8: 3 * 2.5.
  CHECK(simulate(plan, 8, CostModel::uniform(4, 2, 0.25)).finishUs == 7.5);
  // Two channels split each block: the same bandwidth term, but twice the messages on one port.
  const Plan twoChannels = ringPlan(Collective::AllGather, 4, 0, 2);
  CHECK(simulate(twoChannels, 4, CostModel::uniform(4, 0, 1)).finishUs == 3.0);
}

TEST_CASE("ring all-reduce N=8, M=8 takes 14 alpha + 14 beta, plus (N-1)/N M gamma", "[sim]") {
  const Plan plan = ringPlan(Collective::AllReduce, 8, 0, 1);
  CHECK(simulate(plan, 8, CostModel::uniform(8, 1, 1)).finishUs == 28.0);
  // alpha 3, beta 0.5, M 16: 14*3 + 2*7/8*16*0.5 = 42 + 14.
  CHECK(simulate(plan, 16, CostModel::uniform(8, 3, 0.5)).finishUs == 56.0);
  // alpha 0, beta 1, M 8: the bandwidth term alone, 2(N-1)/N M beta = 14.
  CHECK(simulate(plan, 8, CostModel::uniform(8, 0, 1)).finishUs == 14.0);
  // gamma 0.25: + 7/8 * 16 * 0.25 = 3.5.
  CHECK(simulate(plan, 16, CostModel::uniform(8, 3, 0.5, 0.25)).finishUs == 59.5);
}

TEST_CASE("Bruck all-gather N=5 takes 3 alpha + 4/5 M beta", "[sim]") {
  const Plan plan = bruckAllGather(5);
  requireValid(plan);
  CHECK(simulate(plan, 5, CostModel::uniform(5, 1, 1)).finishUs == 7.0);
  CHECK(simulate(plan, 10, CostModel::uniform(5, 2, 0.5)).finishUs == 10.0);  // 6 + 4/5*10*0.5
  // Compare: the ring needs 4 alpha + 4/5 M beta.
  CHECK(simulate(ringPlan(Collective::AllGather, 5, 0, 1), 5, CostModel::uniform(5, 1, 1)).finishUs == 8.0);
}

TEST_CASE("recursive-doubling all-gather N=8 takes 3 alpha + 7/8 M beta", "[sim]") {
  // Built here by hand, and by the generator (its own block sent from the input, not after the copy): both alike.
  for (const Plan& plan : {recursiveDoublingAllGather(8), recursiveDoublingPlan(Collective::AllGather, 8, 0, 1)}) {
    INFO(plan.name);
    requireValid(plan);
    CHECK(simulate(plan, 8, CostModel::uniform(8, 1, 1)).finishUs == 10.0);
    CHECK(simulate(plan, 32, CostModel::uniform(8, 2, 0.25)).finishUs == 13.0);  // 6 + 7/8*32*0.25
  }
  // The generator's recursive-doubling all-reduce: log2 N (alpha + M beta) = 3 * (1 + 8).
  CHECK(simulate(recursiveDoublingPlan(Collective::AllReduce, 8, 0, 1), 8, CostModel::uniform(8, 1, 1)).finishUs ==
        27.0);
}

TEST_CASE("pipelined chain broadcast with k slices takes (N-2+k)(alpha + (M/k) beta)", "[sim]") {
  const int n = 6;
  const double alpha = 1, beta = 0.01, m = 1200;
  const Plan plan = ringPlan(Collective::Broadcast, n, 0, 1, Placement::InPlace);
  const CostModel model = CostModel::uniform(n, alpha, beta);
  double best = 1e300;
  uint32_t bestK = 0;
  for (uint32_t k : {1u, 2u, 3u, 4u, 5u, 6u, 8u, 10u, 12u, 16u, 24u}) {
    const SimResult r = simulate(plan, static_cast<uint64_t>(m), model, {k, false});
    INFO("k = " << k);
    CHECK(r.finishUs == Approx((n - 2 + k) * (alpha + m / k * beta)).epsilon(1e-12));
    CHECK(r.events.empty());
    if (r.finishUs < best) {
      best = r.finishUs;
      bestK = k;
    }
  }
  // Optimum near sqrt((N-2) M beta / alpha) = sqrt(48) ~ 7.
  CHECK(bestK >= 6);
  CHECK(bestK <= 8);
  // The root is rank 2 in another plan: same time.
  CHECK(simulate(ringPlan(Collective::Broadcast, n, 2, 1, Placement::InPlace), 1200, model, {4, true}).finishUs ==
        Approx(8 * (alpha + 3.0)));
}

TEST_CASE("contention: two ranks sending into one receive port take twice as long as one", "[sim]") {
  const double blockBytesValue = 10;
  const SimResult one = simulate(directPlan(Collective::Gather, 2, 0, 1), 2 * 10, CostModel::uniform(2, 1, 1));
  const SimResult two = simulate(directPlan(Collective::Gather, 3, 0, 1), 3 * 10, CostModel::uniform(3, 1, 1));
  CHECK(one.finishUs == 1 + blockBytesValue);
  CHECK(two.finishUs == 2 * one.finishUs);
  checkNoOverlap(two);
  // The root's receive port was busy the whole time; each sender's port half of it.
  const CostModel model = CostModel::uniform(3, 1, 1);
  for (size_t i = 0; i < model.resources().size(); ++i) {
    const std::string& name = model.resources()[i].name;
    if (name == "rank0.recv") CHECK(two.resources[i].utilization == 1.0);
    if (name == "rank1.send" || name == "rank2.send") CHECK(two.resources[i].utilization == 0.5);
    if (name == "rank0.send") CHECK(two.resources[i].busyUs == 0.0);
  }
  // Scatter is the mirror image: one send port, two messages.
  CHECK(simulate(directPlan(Collective::Scatter, 3, 0, 1), 30, CostModel::uniform(3, 1, 1)).finishUs == 22.0);
}

TEST_CASE("algbw and busbw follow nccl-tests", "[sim]") {
  const int n = 4;
  const CostModel model = CostModel::uniform(n, 1, 0.001);
  const uint64_t bytes = 1 << 20;
  struct Case {
    Collective c;
    Algorithm a;
    double factor;
  };
  const Case cases[] = {
      {Collective::AllReduce, Algorithm::Ring, 2.0 * 3 / 4},   {Collective::AllGather, Algorithm::Ring, 3.0 / 4},
      {Collective::ReduceScatter, Algorithm::Ring, 3.0 / 4},   {Collective::Broadcast, Algorithm::Ring, 1.0},
      {Collective::Reduce, Algorithm::Tree, 1.0},              {Collective::AllToAll, Algorithm::Direct, 3.0 / 4},
      {Collective::Gather, Algorithm::Direct, 3.0 / 4},        {Collective::Scatter, Algorithm::Direct, 3.0 / 4},
  };
  for (const Case& k : cases) {
    INFO(collectiveName(k.c));
    const SimResult r = simulate(makePlan(k.a, k.c, n, 1, 1), bytes, model);
    CHECK(r.bytes == bytes);
    CHECK(r.busFactor == k.factor);
    CHECK(busBandwidthFactor(k.c, n) == k.factor);
    CHECK(r.algbwGBs == Approx(static_cast<double>(bytes) / (r.finishUs * 1e3)));
    CHECK(r.busbwGBs == Approx(r.algbwGBs * k.factor));
  }
  // Ring all-reduce at large size: busbw -> 1 / beta = 1 GB/s here.
  const SimResult big = simulate(ringPlan(Collective::AllReduce, n, 0, 1), uint64_t{1} << 30, model);
  CHECK(big.busbwGBs == Approx(1.0).epsilon(1e-3));
  CHECK(blockBytes(Collective::AllGather, 4, 400) == 100);
  CHECK(blockBytes(Collective::AllReduce, 4, 400) == 400);
}

TEST_CASE("a plan where two ranks both receive first is reported as a deadlock, not a hang", "[sim]") {
  Builder b("stuck", Collective::AllReduce, 2, 1);
  for (int r = 0; r < 2; ++r) {
    const uint16_t l = b.lane(r, 1 - r, 1 - r);
    b.add(r, l, StepKind::RecvReduceCopy, input(0), output(0));
    b.add(r, l, StepKind::Send, output(0), {});
  }
  CHECK_FALSE(validate(b.plan).ok());
  try {
    simulate(b.plan, 64, CostModel::uniform(2, 1, 1));
    FAIL("no deadlock reported");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(e.code() == ncclInvalidArgument);
    CHECK(what.find("deadlock") != std::string::npos);
    CHECK(what.find("rank 0 lane 0 step 0 (rrc)") != std::string::npos);
    CHECK(what.find("waits for data from rank 1") != std::string::npos);
  }
  // A dependency cycle across lanes is the same error.
  Builder cyc("cycle", Collective::AllReduce, 1, 1);
  const uint16_t l0 = cyc.lane(0, -1, -1), l1 = cyc.lane(0, -1, -1);
  cyc.add(0, l0, StepKind::Copy, input(0), output(0), StepRef{l1, 0});
  cyc.add(0, l1, StepKind::Nop, {}, {}, StepRef{l0, 0});
  CHECK_THROWS_WITH(simulate(cyc.plan, 8, CostModel::uniform(1, 1, 1)),
                    Catch::Contains("deadlock") && Catch::Contains("waits for its dependency"));
  // A send nobody receives.
  Builder lost("lost", Collective::AllReduce, 2, 1);
  lost.add(0, lost.lane(0, 1, -1), StepKind::Send, input(0), {});
  CHECK_THROWS_WITH(simulate(lost.plan, 8, CostModel::uniform(2, 1, 1)), Catch::Contains("never received"));
  // Malformed plans and options.
  CHECK_THROWS_AS(simulate(ringPlan(Collective::AllGather, 4, 0, 1), 4, CostModel::uniform(3, 1, 1)), Error);
  CHECK_THROWS_AS(simulate(ringPlan(Collective::AllGather, 4, 0, 1), 4, CostModel::uniform(4, 1, 1), {0, true}), Error);
}

TEST_CASE("cost model: uniform routes, describe, custom resources", "[sim]") {
  const CostModel model = CostModel::uniform(3, 2, 0.5, 0.1);
  CHECK(model.nranks() == 3);
  CHECK(model.resources().size() == 6);
  CHECK(model.route(0, 2).resources.size() == 2);
  CHECK(model.route(0, 2).latencyUs == 2);
  CHECK(model.route(0, 2).betaUsPerByte == 0.5);
  CHECK(model.transferUs(1, 0, 10) == 7);
  const std::string text = model.describe();
  CHECK(text.find("rank0.send") != std::string::npos);
  CHECK(text.find("2->1: latency 2 us") != std::string::npos);
  CHECK_THROWS_AS(model.route(0, 3), Error);

  // A custom model: ranks 0 and 1 share one bus.
  CostModel bus(3);
  const int shared = bus.addResource({"bus", 1, 1});
  const int fast = bus.addResource({"fast", 0, 0.1});
  bus.setRoute(0, 2, {shared}, 1);
  bus.setRoute(1, 2, {shared, fast}, 1);
  CHECK(bus.route(1, 2).betaUsPerByte == 1);
  const SimResult r = simulate(directPlan(Collective::Gather, 3, 2, 1), 30, bus);
  CHECK(r.finishUs == 22);
}

TEST_CASE("DGX-1: a double NVLink pair moves data twice as fast as a single-link pair", "[sim]") {
  const topo::Topology t = topo::loadPreset("dgx1");
  const Plan plan = ringPlan(Collective::Broadcast, 2, 0, 1, Placement::InPlace);
  const CostModel doubled = CostModel::fromTopology(t, dgx1Gpus(t, {0, 1}));
  const CostModel single = CostModel::fromTopology(t, dgx1Gpus(t, {0, 2}));
  REQUIRE(doubled.route(0, 1).resources.size() == 1);
  REQUIRE(single.route(0, 1).resources.size() == 1);
  CHECK(doubled.route(0, 1).betaUsPerByte == Approx(1.0 / 40e3));
  CHECK(single.route(0, 1).betaUsPerByte == Approx(1.0 / 20e3));
  const uint64_t bytes = 100'000'000;
  const SimResult fast = simulate(plan, bytes, doubled);
  const SimResult slow = simulate(plan, bytes, single);
  CHECK((slow.finishUs - single.route(0, 1).latencyUs) / (fast.finishUs - doubled.route(0, 1).latencyUs) ==
        Approx(2.0));
  CHECK(fast.algbwGBs == Approx(40).epsilon(1e-3));
  CHECK(doubled.describe().find("gpu0->gpu1 NVLink2 x2") != std::string::npos);
  // Non-neighbours (0 and 5) go through a relay GPU: two links, cut-through.
  const CostModel far = CostModel::fromTopology(t, dgx1Gpus(t, {0, 5}));
  CHECK(far.route(0, 1).resources.size() == 2);
  // Two ranks on one GPU copy locally.
  const CostModel local = CostModel::fromTopology(t, dgx1Gpus(t, {3, 3}));
  REQUIRE(local.route(0, 1).resources.size() == 1);
  CHECK(local.resource(local.route(0, 1).resources[0]).name.find("local") != std::string::npos);
  CHECK(simulate(plan, bytes, local).finishUs < fast.finishUs);
}

TEST_CASE("DGX-1: ring all-gather over the 3 edge-disjoint NVLink Hamiltonian cycles vs one ring", "[sim]") {
  const topo::Topology t = topo::loadPreset("dgx1");
  const std::vector<std::vector<int>> cycles = {
      {0, 1, 2, 3, 7, 5, 6, 4}, {0, 1, 3, 2, 6, 7, 5, 4}, {0, 2, 6, 7, 4, 5, 1, 3}};
  // They use every NVLink exactly once.
  std::map<std::pair<int, int>, int> uses;
  for (const auto& c : cycles) {
    for (size_t i = 0; i < c.size(); ++i) {
      const int a = c[i], b = c[(i + 1) % c.size()];
      ++uses[{std::min(a, b), std::max(a, b)}];
    }
  }
  int nvlinks = 0;
  for (const auto& [pair, count] : uses) {
    const topo::Link* link = t.linkBetween(t.gpuByIndex(pair.first).value(), t.gpuByIndex(pair.second).value());
    REQUIRE(link != nullptr);
    CHECK(link->nvlinkCount == count);
    nvlinks += count;
  }
  CHECK(nvlinks == 24);

  const CostModel model = CostModel::fromTopology(t, dgx1Gpus(t, {0, 1, 2, 3, 4, 5, 6, 7}));
  const uint64_t bytes = 8 * 48'000'000ull;  // L = 48 MB per GPU
  const Plan one = multiRingAllGather({cycles[0]}, false);
  const Plan three = multiRingAllGather(cycles, false);
  const Plan six = multiRingAllGather(cycles, true);
  requireValid(one);
  requireValid(three);
  requireValid(six);
  const SimResult r1 = simulate(one, bytes, model);
  const SimResult r3 = simulate(three, bytes, model);
  const SimResult r6 = simulate(six, bytes, model);
  checkNoOverlap(r6);
  // One ring is held back by its single NVLinks (20 GB/s); three rings load every link evenly; six
  // directed rings use both directions: busbw -> 6 links x 20 GB/s = 120 GB/s, the (7/6) L beta
  // all-gather bound (synthesizers.md §7 oracle 2), which no plan may beat.
  CHECK(r1.busbwGBs == Approx(20).epsilon(0.02));
  CHECK(r3.busbwGBs == Approx(60).epsilon(0.02));
  CHECK(r6.busbwGBs == Approx(120).epsilon(0.02));
  CHECK(r6.busbwGBs <= 120.0);
  CHECK(r3.finishUs < r1.finishUs / 2.5);
  // The generator's ring in rank order 0..7 is not an NVLink cycle (3->4 takes two hops).
  const SimResult generated = simulate(ringPlan(Collective::AllGather, 8, 0, 1), bytes, model);
  CHECK(generated.finishUs > r1.finishUs);
}

TEST_CASE("DGX-1: direct all-to-all is slower than on a fully connected machine of the same NVLink bandwidth",
          "[sim]") {
  const topo::Topology t = topo::loadPreset("dgx1");
  const CostModel dgx = CostModel::fromTopology(t, dgx1Gpus(t, {0, 1, 2, 3, 4, 5, 6, 7}));
  // Fully connected single-port ranks with each GPU's total NVLink bandwidth (6 x 20 GB/s).
  const CostModel full = CostModel::uniform(8, 0.7, 1.0 / 120e3);
  const Plan plan = directPlan(Collective::AllToAll, 8, 0, 1, Placement::OutOfPlace);
  const uint64_t bytes = 64'000'000;  // per rank: 8 MB to each peer
  const SimResult onDgx = simulate(plan, bytes, dgx);
  const SimResult onFull = simulate(plan, bytes, full);
  checkNoOverlap(onDgx);
  CHECK(onFull.finishUs == Approx(7 * (0.7 + 8e6 / 120e3)));  // (N-1) alpha + (N-1)/N M beta
  CHECK(onDgx.finishUs > onFull.finishUs);
  // The socket cut (6 NVLinks) carries 4 x 4 blocks of M/8 each way: T >= 2M / 120 GB/s.
  CHECK(onDgx.finishUs >= 2.0 * static_cast<double>(bytes) / 120e3);
  // Busy time adds up.
  double busy = 0, eventTime = 0;
  for (const ResourceUsage& u : onDgx.resources) busy += u.busyUs;
  for (const SimEvent& e : onDgx.events) eventTime += e.endUs - e.startUs;
  CHECK(busy == Approx(eventTime));
}

TEST_CASE("timeline SVG is well-formed XML with one rectangle per event", "[sim]") {
  const CostModel model = CostModel::uniform(4, 1, 1);
  const SimResult r = simulate(ringPlan(Collective::AllReduce, 4, 0, 1), 64, model, {2, true});
  const std::string svg = timelineSvg(r, model);
  pugi::xml_document doc;
  const pugi::xml_parse_result parsed = doc.load_string(svg.c_str());
  INFO(parsed.description());
  REQUIRE(parsed);
  const pugi::xml_node root = doc.child("svg");
  REQUIRE(root);
  CHECK(std::string(root.attribute("xmlns").value()) == "http://www.w3.org/2000/svg");
  CHECK(doc.select_nodes("//rect[@class='event']").size() == r.events.size());
  CHECK(doc.select_nodes("//rect[@class='legend']").size() == 4);
  CHECK(svg.find("rank0.send") != std::string::npos);
  CHECK(svg.find("time (us)") != std::string::npos);

  const topo::Topology t = topo::loadPreset("dgx1");
  const CostModel dgx = CostModel::fromTopology(t, dgx1Gpus(t, {0, 1, 2, 3, 4, 5, 6, 7}));
  const SimResult a2a = simulate(directPlan(Collective::AllToAll, 8, 0, 1), 1 << 20, dgx);
  pugi::xml_document doc2;
  REQUIRE(doc2.load_string(timelineSvg(a2a, dgx).c_str()));
  CHECK(doc2.select_nodes("//rect[@class='event']").size() == a2a.events.size());
}

namespace {

// Ranks that each send one block to one peer at the same time (no collective meaning).
Plan flows(int n, const std::vector<std::pair<int, int>>& pairs) {
  Builder b("flows", Collective::AllReduce, n, 1);
  for (const auto& [from, to] : pairs) {
    b.add(from, b.lane(from, to, -1), StepKind::Send, input(0), {});
    b.add(to, b.lane(to, -1, from), StepKind::Recv, {}, output(0));
  }
  return b.plan;
}

}  // namespace

TEST_CASE("fromTopology: NVSwitch ports and NICs are shared resources", "[sim]") {
  using topo::Link;
  using topo::LinkKind;
  using topo::Vertex;
  using topo::VertexKind;
  const uint64_t bytes = 100'000'000;

  // One host, four GPUs on an NVSwitch fabric: a GPU's egress port is one resource.
  topo::Topology sw;
  sw.addVertex(Vertex{.kind = VertexKind::Host, .name = "host0"});
  const topo::VertexId fabric = sw.addVertex(Vertex{.kind = VertexKind::NvSwitch, .name = "nvswitch0"});
  std::vector<topo::VertexId> gpus;
  for (int g = 0; g < 4; ++g) {
    gpus.push_back(sw.addVertex(Vertex{.kind = VertexKind::Gpu, .name = "gpu" + std::to_string(g), .gpuIndex = g, .sm = 80}));
    sw.addLink(gpus.back(), fabric, Link{.kind = LinkKind::NvLink, .bandwidthGBs = 100, .nvlinkCount = 4});
  }
  const CostModel model = CostModel::fromTopology(sw, gpus);
  REQUIRE(model.route(1, 0).resources.size() == 2);
  CHECK(model.resource(model.route(1, 0).resources[0]).name.find("switch ingress port of gpu1") != std::string::npos);
  CHECK(model.resource(model.route(1, 0).resources[1]).name.find("switch egress port to gpu0") != std::string::npos);
  const double one = simulate(flows(4, {{1, 0}}), bytes, model).finishUs;
  CHECK(one == Approx(model.route(1, 0).latencyUs + 1e8 / 100e3));
  CHECK(simulate(flows(4, {{1, 0}, {2, 3}}), bytes, model).finishUs == Approx(one));      // disjoint ports
  // NVLink is pipelined: the second message waits for the port's bytes, not for the first one's latency.
  const double busy = model.occupancyUs(1, 0, 1e8);
  CHECK(model.route(1, 0).holdUs == 0);
  CHECK(busy == Approx(1e8 / 100e3));
  CHECK(simulate(flows(4, {{1, 0}, {2, 0}}), bytes, model).finishUs == Approx(one + busy));  // one egress port
  CHECK(simulate(flows(4, {{0, 1}, {0, 2}}), bytes, model).finishUs == Approx(one + busy));  // one ingress port

  // Two hosts, two GPUs each behind one PCIe switch and one 100 Gb/s NIC: the NIC is shared.
  const auto twoHosts = [&](topo::LinkLayer layer, std::vector<topo::VertexId>& devices) {
  topo::Topology net;
  const topo::VertexId spine = net.addVertex(Vertex{.kind = VertexKind::NetSwitch, .name = "netsw0"});
  for (int h = 0; h < 2; ++h) {
    const std::string hs = std::to_string(h);
    net.addVertex(Vertex{.kind = VertexKind::Host, .name = "host" + hs, .host = h});
    const topo::VertexId pci = net.addVertex(Vertex{.kind = VertexKind::PciSwitch, .name = "pcisw" + hs, .host = h});
    const topo::VertexId nic = net.addVertex(Vertex{.kind = VertexKind::Nic, .name = "nic" + hs, .host = h,
                                                    .speedGbps = 100, .linkLayer = layer});
    net.addLink(pci, nic, Link{.kind = LinkKind::Pcie, .pcieGen = 4, .pcieWidth = 16});
    net.addLink(nic, spine, Link{.kind = LinkKind::Network, .bandwidthGBs = 12.5});
    for (int g = 0; g < 2; ++g) {
      const topo::VertexId gpu = net.addVertex(Vertex{.kind = VertexKind::Gpu, .name = "gpu" + hs + std::to_string(g),
                                                      .host = h, .gpuIndex = 2 * h + g, .sm = 80});
      net.addLink(pci, gpu, Link{.kind = LinkKind::Pcie, .pcieGen = 4, .pcieWidth = 16});
      devices.push_back(gpu);
    }
  }
  return net;
  };
  std::vector<topo::VertexId> devices, tcpDevices;
  const topo::Topology net = twoHosts(topo::LinkLayer::InfiniBand, devices);
  const CostModel cluster = CostModel::fromTopology(net, devices);
  INFO(cluster.describe());
  const auto names = [&](int s, int d) {
    std::string all;
    for (int id : cluster.route(s, d).resources) all += cluster.resource(id).name + ";";
    return all;
  };
  CHECK(names(0, 2).find("nic0.tx") != std::string::npos);
  CHECK(names(0, 2).find("nic1.rx") != std::string::npos);
  CHECK(names(1, 3).find("nic0.tx") != std::string::npos);
  CHECK(names(0, 1).find("nic") == std::string::npos);  // same PCIe switch: no NIC
  CHECK(cluster.route(0, 2).betaUsPerByte == Approx(1.0 / 12.5e3));
  const double single = simulate(flows(4, {{0, 2}}), bytes, cluster).finishUs;
  CHECK(simulate(flows(4, {{0, 2}, {1, 3}}), bytes, cluster).finishUs ==
        Approx(single + cluster.occupancyUs(0, 2, 1e8)));  // IB and PCIe are pipelined: one latency
  CHECK(simulate(flows(4, {{0, 2}, {3, 1}}), bytes, cluster).finishUs == Approx(single));  // full duplex

  // Over TCP a message costs the hosts its latency too (syscalls, copies): the NIC is held for it.
  const topo::Topology tcpNet = twoHosts(topo::LinkLayer::Ethernet, tcpDevices);
  const CostModel tcp = CostModel::fromTopology(tcpNet, tcpDevices);
  INFO(tcp.describe());
  CHECK(tcp.route(0, 2).holdUs > 0);
  CHECK(tcp.route(0, 2).holdUs < tcp.route(0, 2).latencyUs);  // the PCIe hops are still pipelined
  const double tcpSingle = simulate(flows(4, {{0, 2}}), bytes, tcp).finishUs;
  CHECK(simulate(flows(4, {{0, 2}, {1, 3}}), bytes, tcp).finishUs ==
        Approx(tcpSingle + tcp.occupancyUs(0, 2, 1e8)));
  CHECK(CostModel::uniform(3, 2.0, 1.0).route(0, 1).holdUs == 2.0);  // the textbook model holds all of it
}

TEST_CASE("a send step ends when its message has left, so a dependent step waits for it", "[sim]") {
  // Uniform single-port model, alpha 0, beta 1 us/B; 4 chunks of 1 byte. Rank 0 sends 3 chunks to rank 1 first;
  // rank 2's 1-chunk send to rank 1 waits for rank 1's receive port until t=3 and leaves at 4. Rank 2's second
  // lane sends to rank 0 after that first send step: it starts at 4 and lands at 5 (a queued send that counted
  // as done would let it land at 1, and the run end at 4).
  const CostModel model = CostModel::uniform(3, 0.0, 1.0);
  Builder b("depends-on-a-send", Collective::AllReduce, 3, 4);
  b.add(0, b.lane(0, 1, -1), StepKind::Send, input(0, 3), {});
  b.add(1, b.lane(1, -1, 0), StepKind::Recv, {}, output(0, 3));
  const uint16_t first = b.lane(2, 1, -1);
  const StepRef sent = b.add(2, first, StepKind::Send, input(3), {});
  b.add(1, b.lane(1, -1, 2), StepKind::Recv, {}, output(3));
  b.add(2, b.lane(2, 0, -1), StepKind::Send, input(0), {}, sent);
  b.add(0, b.lane(0, -1, 2), StepKind::Recv, {}, output(3));
  const SimResult r = simulate(b.plan, 4, model);
  CHECK(r.finishUs == Approx(5.0));
}
