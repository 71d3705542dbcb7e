// Shared by the synthesizer tests (test_synthesizer, test_synth_alltoall, test_synth_milp, test_synth_hier): the
// machines they synthesize for, and the check every synthesized plan must pass.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "algorithms/plan.hpp"
#include "algorithms/synthesizer/synthesizer.hpp"
#include "algorithms/validator.hpp"
#include "reference_executor.hpp"
#include "topology/cluster.hpp"
#include "topology/loaders.hpp"

namespace topoccl::algo::testing {

struct Machine {
  std::string name;
  topo::Topology topology;
  std::vector<topo::VertexId> devices;  // rank r runs on devices[r]
};

// Every GPU of the topology, in Topology::gpus() order.
inline Machine wholeMachine(const std::string& name, const topo::Topology& t) {
  return {name, t, synth::defaultRankDevices(t)};
}

// The GPUs at the given positions of Topology::gpus(), as ranks 0..k-1.
inline Machine subset(const std::string& name, const topo::Topology& t, const std::vector<int>& gpuPositions) {
  const std::vector<topo::VertexId> all = synth::defaultRankDevices(t);
  std::vector<topo::VertexId> devices;
  for (int g : gpuPositions) devices.push_back(all.at(static_cast<size_t>(g)));
  return {name, t, devices};
}

// `hosts` copies of a preset joined by buildCluster's default network.
inline topo::Topology cluster(const char* preset, int hosts) {
  topo::ClusterSpec spec;
  spec.hosts = hosts;
  return topo::buildCluster(topo::loadPreset(preset), spec);
}

// Valid (validator.hpp), and correct on random data (seeds `seed`, `seed + 1`) against the reference executor
// in every placement the plan claims: in place and out of place.
inline void checkPlanRuns(const Plan& plan, uint64_t seed) {
  const ValidationReport report = validate(plan);
  INFO(plan.name << ": " << report.text());
  REQUIRE(report.ok());
  CHECK((plan.inPlace || plan.outOfPlace));
  for (bool inPlace : {false, true}) {
    if (inPlace ? !plan.inPlace : !plan.outOfPlace) continue;
    const uint64_t runSeed = seed + (inPlace ? 1 : 0);
    const std::string error = runAndCheck(plan, {plan.chunksPerBlock * 2 + 3, inPlace, runSeed});
    INFO((inPlace ? "in place" : "out of place") << ", seed " << runSeed << ": " << error);
    CHECK(error.empty());
  }
}

}  // namespace topoccl::algo::testing
