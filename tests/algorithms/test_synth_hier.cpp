// The synthesizer across hosts: the hierarchical family (each chunk enters every other host once), the mirrored
// reduce-scatter order, and the built-in generators competing as candidates.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "algorithms/bounds.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/generators.hpp"
#include "algorithms/simulator.hpp"
#include "algorithms/synthesizer/sketch.hpp"
#include "algorithms/synthesizer/synthesizer.hpp"
#include "algorithms/validator.hpp"
#include "reference_executor.hpp"
#include "synth_support.hpp"
#include "topology/cluster.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;
using namespace topoccl::algo;

namespace {

using testing::cluster;

// Chunks (in chunk units) each rank sends to ranks of other hosts, summed over the plan.
uint64_t crossHostChunks(const Plan& plan, const std::vector<int>& host) {
  uint64_t chunks = 0;
  for (int r = 0; r < plan.nranks; ++r) {
    for (const Lane& lane : plan.ranks[static_cast<size_t>(r)].lanes) {
      if (lane.sendPeer < 0 || host[static_cast<size_t>(lane.sendPeer)] == host[static_cast<size_t>(r)]) continue;
      for (const Step& step : lane.steps)
        if (stepSends(step.kind)) chunks += step.src.count;
    }
  }
  return chunks;
}

double boundUs(const topo::Topology& t, const std::vector<topo::VertexId>& devices, Collective c, uint64_t bytes) {
  return collectiveBound(BoundGraph::fromTopology(t, devices, LinkFilter::fastFabric()), c).lowerBoundUs(bytes);
}

void checkRuns(const Plan& plan, uint64_t seed) { testing::checkPlanRuns(plan, seed); }

}  // namespace

TEST_CASE("hierarchical family: every chunk enters every other host exactly once", "[synth-hier]") {
  const uint32_t seed = std::random_device{}();
  WARN("synth-hier: reference executor seed " << seed);
  for (const auto& [preset, hosts] : {std::pair{"ndv2", 2}, std::pair{"dgx-a100", 2}, std::pair{"ndv2", 3}}) {
    const topo::Topology t = cluster(preset, hosts);
    const std::vector<topo::VertexId> devices = synth::defaultRankDevices(t);
    const CostModel model = CostModel::fromTopology(t, devices);
    const int n = model.nranks();
    REQUIRE(model.rankHost.size() == static_cast<size_t>(n));
    for (Collective c : {Collective::AllGather, Collective::ReduceScatter}) {
      for (uint32_t C : {1u, 2u}) {
        INFO(preset << " x" << hosts << " " << collectiveName(c) << " C=" << C);
        synth::SynthOptions o;
        o.sketch = synth::parseSketch(R"({"families": ["hier"], "chunks_per_rank": )" + std::to_string(C) + "}", "hier.json");
        o.contiguity = false;
        const synth::SynthResult r = synth::synthesize(model, c, 64 << 20, o);
        CHECK(r.family == "hier");
        // AG: each of the n*C chunks is sent into each of the other hosts once; RS: the same, reversed.
        CHECK(crossHostChunks(r.plan, model.rankHost) == static_cast<uint64_t>(n) * C * static_cast<uint64_t>(hosts - 1));
        checkRuns(r.plan, seed + C);
      }
    }
  }
}

TEST_CASE("two NDv2 hosts: AG, RS and AR within 1.10x of the cut bound at 64 MiB and above, never slower than rings",
          "[synth-hier]") {
  const topo::Topology t = cluster("ndv2", 2);
  const std::vector<topo::VertexId> devices = synth::defaultRankDevices(t);
  const CostModel model = CostModel::fromTopology(t, devices);
  for (Collective c : {Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce}) {
    for (uint64_t bytes : {uint64_t{64} << 20, uint64_t{1} << 30}) {
      const synth::SynthResult r = synth::synthesize(model, c, bytes);
      const double bound = boundUs(t, devices, c, bytes);
      INFO(collectiveName(c) << " " << bytes << " B: " << r.strategy << " " << r.timeUs << " us, bound " << bound);
      CHECK(r.timeUs <= 1.10 * bound);
      CHECK(r.timeUs >= bound * (1 - 1e-9));  // a plan faster than the bound would disprove the bound
      for (int ch = 1; ch <= 4; ++ch) CHECK(r.timeUs <= simulate(ringPlan(c, model.nranks(), -1, ch), bytes, model).finishUs);
    }
  }
}

TEST_CASE("mirrored order: reduce-scatter as fast as the all-gather on the same machine", "[synth-hier]") {
  for (const auto& [preset, hosts] : {std::pair{"ndv2", 2}, std::pair{"dgx1", 1}}) {
    const topo::Topology t = hosts > 1 ? cluster(preset, hosts) : topo::loadPreset(preset);
    const CostModel model = CostModel::fromTopology(t, synth::defaultRankDevices(t));
    for (uint64_t bytes : {uint64_t{1} << 20, uint64_t{64} << 20}) {
      const synth::SynthResult ag = synth::synthesize(model, Collective::AllGather, bytes);
      const synth::SynthResult rs = synth::synthesize(model, Collective::ReduceScatter, bytes);
      INFO(preset << " x" << hosts << " " << bytes << " B: AG " << ag.strategy << " " << ag.timeUs << " us, RS "
                  << rs.strategy << " " << rs.timeUs << " us");
      CHECK(rs.timeUs <= ag.timeUs * 1.001);
      checkRuns(rs.plan, bytes);
    }
  }
}

TEST_CASE("built-in generators compete: one-round direct beats recursive doubling on DGX-1 all-reduce at 1 KiB, and a sketch can exclude them",
          "[synth-hier]") {
  const topo::Topology t = topo::loadPreset("dgx1");
  const CostModel model = CostModel::fromTopology(t, synth::defaultRankDevices(t));
  const synth::SynthResult r = synth::synthesize(model, Collective::AllReduce, 1024);
  const double rd = simulate(makePlan(Algorithm::RecursiveDoubling, Collective::AllReduce, 8, 0, 1), 1024, model).finishUs;
  const double direct = simulate(makePlan(Algorithm::Direct, Collective::AllReduce, 8, 0, 1), 1024, model).finishUs;
  INFO("recursive doubling " << rd << " us, direct " << direct << " us");
  CHECK(direct < rd);  // 1 round of 7 parallel 1 KiB messages against 3 dependent rounds
  CHECK(r.timeUs <= direct);
  CHECK(r.family == "direct");
  synth::SynthOptions o;
  o.sketch = synth::parseSketch(R"({"families": ["bfs", "pack"]})", "trees.json");
  const synth::SynthResult trees = synth::synthesize(model, Collective::AllReduce, 1024, o);
  CHECK((trees.family == "bfs" || trees.family == "pack"));
  CHECK(trees.timeUs > r.timeUs);
  for (const synth::FamilyTime& f : trees.families) CHECK((f.family == "bfs" || f.family == "pack"));
}
