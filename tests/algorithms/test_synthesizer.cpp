#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

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
      subset("dgx-a100 GPUs 1,4,6 (3 ranks)", a100, {1, 4, 6}),
  };
}

double bestRingUs(Collective c, uint64_t bytes, const CostModel& model) {
  double best = -1;
  for (int ch = 1; ch <= model.nranks(); ++ch) {
    const double t = simulate(ringPlan(c, model.nranks(), -1, ch), bytes, model, {1, false}).finishUs;
    if (best < 0 || t < best) best = t;
  }
  return best;
}

// Communication steps on the plan's data paths: a receive is one step more than the receives its matching
// send waited for (through StepRef deps, transitively), found by pairing the k-th send and the k-th
// receive of every (sender, receiver, channel) connection. (Lane order is not followed: it orders steps
// but moves no data.)
int communicationSteps(const Plan& plan) {
  using Key = std::tuple<int, int, int>;  // sender, receiver, channel
  std::map<Key, std::vector<std::pair<int, StepRef>>> sends, recvs;
  for (int r = 0; r < plan.nranks; ++r) {
    const auto& lanes = plan.ranks[static_cast<size_t>(r)].lanes;
    for (size_t l = 0; l < lanes.size(); ++l) {
      for (size_t s = 0; s < lanes[l].steps.size(); ++s) {
        const StepRef ref{static_cast<uint16_t>(l), static_cast<uint32_t>(s)};
        if (stepSends(lanes[l].steps[s].kind)) sends[{r, lanes[l].sendPeer, lanes[l].channel}].push_back({r, ref});
        if (stepReceives(lanes[l].steps[s].kind)) recvs[{lanes[l].recvPeer, r, lanes[l].channel}].push_back({r, ref});
      }
    }
  }
  // The send matching each receive.
  std::map<std::pair<int, std::pair<uint16_t, uint32_t>>, std::pair<int, StepRef>> matchOf;
  for (const auto& [key, list] : recvs) {
    const auto& sent = sends.at(key);
    REQUIRE(sent.size() == list.size());
    for (size_t i = 0; i < list.size(); ++i) matchOf[{list[i].first, {list[i].second.lane, list[i].second.step}}] = sent[i];
  }
  std::map<std::pair<int, std::pair<uint16_t, uint32_t>>, int> memo;
  std::function<int(int, StepRef)> depth = [&](int rank, StepRef ref) -> int {
    const auto key = std::make_pair(rank, std::make_pair(ref.lane, ref.step));
    if (const auto it = memo.find(key); it != memo.end()) return it->second;
    const Step& step = plan.ranks[static_cast<size_t>(rank)].lanes[ref.lane].steps[ref.step];
    int d = 0;
    for (const StepRef& dep : step.deps) d = std::max(d, depth(rank, dep));
    if (stepReceives(step.kind)) {
      const auto& [srank, sref] = matchOf.at(key);
      d = std::max(d, depth(srank, sref) + 1);
    }
    memo[key] = d;
    return d;
  };
  int deepest = 0;
  for (const auto& [key, list] : recvs)
    for (const auto& [rank, ref] : list) deepest = std::max(deepest, depth(rank, ref));
  return deepest;
}

}  // namespace

TEST_CASE("synthesized AG / RS / AR plans validate, compute correctly, are deterministic and beat the ring",
          "[synth]") {
  const uint32_t seed = std::random_device{}();
  INFO("reference executor seed " << seed);
  WARN("synthesizer test: reference executor seed " << seed);
  uint32_t run = 0;
  for (const Machine& m : machines()) {
    const CostModel model = CostModel::fromTopology(m.topology, m.devices);
    const int n = model.nranks();
    for (Collective c : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce}) {
      for (uint64_t bytes : {uint64_t{16} << 10, uint64_t{256} << 20}) {
        const std::string what = m.name + " " + collectiveName(c) + " " + std::to_string(bytes) + " bytes";
        INFO(what);
        const synth::SynthResult r = synth::synthesize(m.topology, m.devices, c, bytes);
        INFO("strategy " << r.strategy << ", " << r.candidates << " candidates, " << r.seconds << " s");
        CHECK_FALSE(r.budgetExhausted);
        CHECK(r.plan.nranks == n);
        CHECK(r.plan.collective == c);
        testing::checkPlanRuns(r.plan, seed + (run += 2));
        // Deterministic: the same inputs give the same plan, byte for byte.
        const synth::SynthResult again = synth::synthesize(m.topology, m.devices, c, bytes);
        CHECK(writeMscclXml(again.plan) == writeMscclXml(r.plan));
        CHECK(again.timeUs == r.timeUs);
        // The simulated time is what the result says, and no worse than the best built-in ring.
        CHECK(simulate(r.plan, bytes, model).finishUs == Approx(r.timeUs));
        const double ring = bestRingUs(c, bytes, model);
        INFO("synthesized " << r.timeUs << " us, best ring " << ring << " us");
        CHECK(r.timeUs <= ring * (1 + 1e-9));
        CHECK(r.seconds < 10);
      }
    }
  }
}

TEST_CASE("DGX-1 all-gather: 2 steps when small, within 1.05x of the (7/6) L beta bound at 1 GiB, beats the ring",
          "[synth]") {
  const topo::Topology t = topo::loadPreset("dgx1");
  const std::vector<topo::VertexId> gpus = synth::defaultRankDevices(t);
  REQUIRE(gpus.size() == 8);
  const CostModel model = CostModel::fromTopology(t, gpus);

  // DGX-1's NVLink graph: 3 edge-disjoint Hamiltonian cycles (synthesizers.md §7 oracle 5).
  const auto cycles = synth::hamiltonianCycles(model, 3);
  CHECK(cycles.size() == 3);
  const auto direct = synth::directPairs(model);
  int directPairs = 0;
  for (const auto& row : direct) directPairs += static_cast<int>(std::count(row.begin(), row.end(), true));
  CHECK(directPairs == 2 * 16);  // 16 GPU pairs share an NVLink, 8 double and 8 single

  // Small: the diameter (2) bounds the steps from below; the plan uses no more.
  const synth::SynthResult small = synth::synthesize(model, Collective::AllGather, 4 << 10);
  INFO("small: " << small.strategy << " " << small.timeUs << " us");
  CHECK(small.maxHops <= 2);
  CHECK(communicationSteps(small.plan) <= 2);
  CHECK(communicationSteps(small.plan) >= 1);

  // 1 GiB: per-GPU shard L = 1 GiB / 8, one NVLink's beta from the preset.
  double perLinkGBs = 0;
  for (const topo::Link& link : t.links()) {
    if (link.kind == topo::LinkKind::NvLink && t.vertex(link.from).kind == topo::VertexKind::Gpu &&
        t.vertex(link.to).kind == topo::VertexKind::Gpu && link.nvlinkCount > 0) {
      perLinkGBs = link.bandwidthGBs / link.nvlinkCount;
      break;
    }
  }
  REQUIRE(perLinkGBs > 0);
  const uint64_t bytes = uint64_t{1} << 30;
  const double shard = static_cast<double>(bytes) / 8;
  const double bound = 7.0 / 6.0 * shard / (perLinkGBs * 1e3);
  const synth::SynthResult large = synth::synthesize(model, Collective::AllGather, bytes);
  INFO("large: " << large.strategy << " " << large.timeUs << " us, bound " << bound << " us");
  CHECK(large.timeUs >= bound * (1 - 1e-9));  // nothing beats the bound
  CHECK(large.timeUs <= 1.05 * bound);
  CHECK(large.seconds < 10);

  // Faster than the best built-in ring at every size from 1 KiB to 1 GiB (x4), without the ring fallback.
  synth::SynthOptions noRing;
  noRing.ringFallback = false;
  for (uint64_t size = 1 << 10; size <= bytes; size *= 4) {
    const synth::SynthResult r = synth::synthesize(model, Collective::AllGather, size, noRing);
    INFO(size << " bytes: " << r.strategy << " " << r.timeUs << " us");
    CHECK(r.timeUs < bestRingUs(Collective::AllGather, size, model));
  }
}

TEST_CASE("synthesizer: lowering of hand-made trees, one rank, and unsupported collectives", "[synth]") {
  const CostModel model = CostModel::uniform(5, 1, 1e-3);
  // A chain 0-1-2-3-4 from every source (paths along the ring), two parts per rank.
  std::vector<synth::Tree> trees;
  for (int s = 0; s < 5; ++s) {
    for (int p = 0; p < 2; ++p) {
      synth::Tree tree{s, std::vector<int>(5, -1)};
      for (int j = 1; j < 5; ++j) tree.parent[static_cast<size_t>((s + j) % 5)] = (s + j - 1) % 5;
      trees.push_back(tree);
    }
  }
  for (Collective c : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce}) {
    for (synth::Order order : {synth::Order::LongestRemainingFirst, synth::Order::EarliestStartFirst}) {
      INFO(collectiveName(c));
      const Plan plan = synth::lowerTrees(c, trees, 2, model, 1 << 20, order);
      const ValidationReport report = validate(plan);
      INFO(report.text());
      CHECK(report.ok());
      CHECK(testing::runAndCheck(plan, {11, false, 7}).empty());
      CHECK(testing::runAndCheck(plan, {11, true, 8}).empty());
      CHECK(communicationSteps(plan) == (c == Collective::AllReduce ? 8 : 4));
    }
  }
  const synth::SynthResult one = synth::synthesize(CostModel::uniform(1, 1, 1), Collective::AllReduce, 1024);
  CHECK(validate(one.plan).ok());
  const synth::SynthResult two = synth::synthesize(CostModel::uniform(2, 1, 1e-3), Collective::AllGather, 1024);
  CHECK(validate(two.plan).ok());
  CHECK(testing::runAndCheck(two.plan, {5, true, 3}).empty());
  CHECK_THROWS_AS(synth::synthesize(model, Collective::Broadcast, 1024), Error);
  CHECK_THROWS_AS(synth::synthesize(model, Collective::Gather, 1024), Error);  // AllToAll: test_synth_alltoall.cpp
}
