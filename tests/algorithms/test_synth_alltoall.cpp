#include <catch2/catch.hpp>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "algorithms/bounds.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/generators.hpp"
#include "algorithms/msccl_xml.hpp"
#include "algorithms/simulator.hpp"
#include "algorithms/synthesizer/synthesizer.hpp"
#include "algorithms/validator.hpp"
#include "common/error.hpp"
#include "reference_executor.hpp"
#include "synth_support.hpp"
#include "topology/cluster.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;
using namespace topoccl::algo;

namespace {

using testing::Machine;
using testing::subset;
using testing::wholeMachine;

std::vector<Machine> machines() {
  const topo::Topology dgx1 = topo::loadPreset("dgx1");
  const topo::Topology a100 = topo::loadPreset("dgx-a100");
  return {
      wholeMachine("dgx1", dgx1),
      wholeMachine("dgx-a100", a100),
      wholeMachine("ndv2 x2 hosts", testing::cluster("ndv2", 2)),
      subset("dgx1 GPUs 0-5 (6 ranks)", dgx1, {0, 1, 2, 3, 4, 5}),
      subset("dgx1 GPUs 0,3,5 (3 ranks)", dgx1, {0, 3, 5}),
  };
}

double directUs(uint64_t bytes, const CostModel& model) {
  return simulate(directPlan(Collective::AllToAll, model.nranks(), 0, 1), bytes, model, {1, false}).finishUs;
}

// The max-concurrent-flow bound of bounds.hpp over every link of the topology (valid for any plan).
CollectiveBound allLinksBound(const Machine& m) {
  return collectiveBound(BoundGraph::fromTopology(m.topology, m.devices, LinkFilter::all()), Collective::AllToAll);
}

}  // namespace

TEST_CASE("synthesized all-to-all plans validate, compute correctly, are deterministic and beat direct",
          "[synth-a2a]") {
  const uint32_t seed = std::random_device{}();
  INFO("reference executor seed " << seed);
  WARN("all-to-all synthesizer test: reference executor seed " << seed);
  uint32_t run = 0;
  for (const Machine& m : machines()) {
    const CostModel model = CostModel::fromTopology(m.topology, m.devices);
    const int n = model.nranks();
    const CollectiveBound bound = allLinksBound(m);
    const synth::AllToAllFlow anyPair = synth::allToAllFlow(model, false);
    REQUIRE(anyPair.ok);
    for (uint64_t bytes : {uint64_t{16} << 10, uint64_t{64} << 20}) {
      const std::string what = m.name + " alltoall " + std::to_string(bytes) + " bytes";
      INFO(what);
      const synth::SynthResult r = synth::synthesize(m.topology, m.devices, Collective::AllToAll, bytes);
      INFO("strategy " << r.strategy << ", " << r.candidates << " candidates, " << r.seconds << " s");
      CHECK_FALSE(r.budgetExhausted);
      CHECK(r.plan.nranks == n);
      CHECK(r.plan.collective == Collective::AllToAll);
      testing::checkPlanRuns(r.plan, seed + (run += 2));
      // Deterministic: the same inputs give the same plan, byte for byte.
      const synth::SynthResult again = synth::synthesize(m.topology, m.devices, Collective::AllToAll, bytes);
      CHECK(writeMscclXml(again.plan) == writeMscclXml(r.plan));
      CHECK(again.timeUs == r.timeUs);
      // The simulated time is what the result says; no better than the bounds, no worse than direct.
      CHECK(simulate(r.plan, bytes, model).finishUs == Approx(r.timeUs));
      const double direct = directUs(bytes, model);
      INFO("synthesized " << r.timeUs << " us, direct " << direct << " us, bound " << bound.lowerBoundUs(bytes)
                          << " us, resource LP " << anyPair.boundUs(bytes, n) << " us");
      CHECK(r.timeUs >= bound.lowerBoundUs(bytes) * (1 - 1e-9));
      CHECK(r.timeUs >= anyPair.boundUs(bytes, n) * (1 - 1e-6));
      CHECK(r.timeUs <= direct * (1 + 1e-9));
      // Bandwidth-bound: within 10% of the cost model's own MCF optimum (measured 1.01-1.08x).
      if (bytes >= (uint64_t{64} << 20)) CHECK(r.timeUs <= 1.10 * anyPair.boundUs(bytes, n));
      CHECK(r.seconds < 10);
    }
  }
}

TEST_CASE("DGX-1 all-to-all: the MCF bound is 8/3 rounds per block, synthesis reaches it within 2% at >= 64 MiB",
          "[synth-a2a]") {
  const topo::Topology t = topo::loadPreset("dgx1");
  const std::vector<topo::VertexId> gpus = synth::defaultRankDevices(t);
  REQUIRE(gpus.size() == 8);
  const CostModel model = CostModel::fromTopology(t, gpus);

  double perLinkGBs = 0;
  for (const topo::Link& link : t.links()) {
    if (link.kind == topo::LinkKind::NvLink && t.vertex(link.from).kind == topo::VertexKind::Gpu &&
        t.vertex(link.to).kind == topo::VertexKind::Gpu && link.nvlinkCount > 0) {
      perLinkGBs = link.bandwidthGBs / link.nvlinkCount;
      break;
    }
  }
  REQUIRE(perLinkGBs > 0);
  // synthesizers.md §7 oracle 6: 8/3 single-NVLink rounds per block (the socket cut: 16 blocks over 6 NVLinks).
  const CollectiveBound bound =
      collectiveBound(BoundGraph::fromTopology(t, gpus, LinkFilter::nvlinkOnly()), Collective::AllToAll);
  const uint64_t big = uint64_t{1} << 30;
  const double blockUs = static_cast<double>(big) / 8 / (perLinkGBs * 1e3);
  CHECK(bound.bandwidthUs(big) == Approx(8.0 / 3.0 * blockUs).epsilon(1e-6));
  // The synthesizer's own LP (direct pairs of the cost model) finds the same optimum.
  const synth::AllToAllFlow flow = synth::allToAllFlow(model);
  REQUIRE(flow.ok);
  CHECK(flow.boundUs(big, 8) == Approx(8.0 / 3.0 * blockUs).epsilon(1e-6));

  synth::SynthOptions noFallback;  // the direct plan still competes; it must not be what wins
  for (uint64_t size = 1 << 10; size <= big; size *= 4) {
    const synth::SynthResult r = synth::synthesize(model, Collective::AllToAll, size, noFallback);
    const double direct = directUs(size, model);
    const double lb = bound.lowerBoundUs(size);
    INFO(size << " bytes: " << r.strategy << " " << r.timeUs << " us, direct " << direct << " us, bound " << lb
              << " us (" << r.timeUs / lb << "x), " << r.seconds << " s");
    CHECK(r.timeUs < direct);
    CHECK(r.family != "direct");
    CHECK(r.timeUs >= lb * (1 - 1e-9));
    CHECK(r.seconds < 10);
    if (size >= (uint64_t{64} << 20)) CHECK(r.timeUs <= 1.02 * lb);  // measured: 1.010x at 64 MiB, 1.001x at 1 GiB
    if (size >= (uint64_t{1} << 30)) CHECK(r.timeUs <= 1.005 * lb);
  }
}

TEST_CASE("all-to-all lowering: hand-made relayed routes, one and two ranks, bad routes", "[synth-a2a]") {
  const CostModel model = CostModel::uniform(4, 1, 1e-3);
  const int n = 4;
  const uint32_t C = 2;
  // Part 0 direct, part 1 relayed through the next rank (or two ranks on for 0 -> 2).
  std::vector<std::vector<int>> routes(static_cast<size_t>(n * n) * C);
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) {
      if (s == d) continue;
      const size_t k = static_cast<size_t>(s * n + d) * C;
      routes[k] = {s, d};
      const int w = (d + 1) % n == s ? (d + 2) % n : (d + 1) % n;
      routes[k + 1] = {s, w, d};
    }
  }
  routes[static_cast<size_t>(0 * n + 2) * C + 1] = {0, 1, 3, 2};
  for (synth::Order order : {synth::Order::LongestRemainingFirst, synth::Order::EarliestStartFirst}) {
    for (bool split : {false, true}) {
      const Plan plan = synth::lowerAllToAll(routes, C, model, 1 << 20, order, split);
      const ValidationReport report = validate(plan);
      INFO(report.text());
      CHECK(report.ok());
      CHECK(plan.inPlace);
      CHECK(plan.outOfPlace);
      CHECK(plan.scratchChunks > 0);
      CHECK(testing::runAndCheck(plan, {11, false, 7}).empty());
      CHECK(testing::runAndCheck(plan, {11, true, 8}).empty());
    }
  }
  std::vector<std::vector<int>> bad = routes;
  bad[static_cast<size_t>(1 * n + 3) * C] = {1, 2};  // does not end at 3
  CHECK_THROWS_AS(synth::lowerAllToAll(bad, C, model, 1 << 20, synth::Order::LongestRemainingFirst, false), Error);
  bad = routes;
  bad[static_cast<size_t>(1 * n + 3) * C] = {1, 2, 1, 3};  // visits 1 twice
  CHECK_THROWS_AS(synth::lowerAllToAll(bad, C, model, 1 << 20, synth::Order::LongestRemainingFirst, false), Error);

  for (int ranks : {1, 2}) {
    const synth::SynthResult r = synth::synthesize(CostModel::uniform(ranks, 1, 1e-3), Collective::AllToAll, 1 << 16);
    INFO(ranks << " ranks: " << r.strategy);
    CHECK(validate(r.plan).ok());
    CHECK(testing::runAndCheck(r.plan, {5, false, 3}).empty());
    if (r.plan.inPlace) CHECK(testing::runAndCheck(r.plan, {5, true, 4}).empty());
  }
}
