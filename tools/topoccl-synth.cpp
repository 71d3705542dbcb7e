// topoccl-synth: synthesizes AllGather / ReduceScatter / AllReduce / AllToAll plans for a topology over a range of
// sizes and compares them, on the same cost model, with the built-in ring (1..N channels), the other
// built-in generator for the collective (direct for AG/RS, recursive doubling for AR) and the lower bound.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/bounds.hpp"
#include "algorithms/cost_model.hpp"
#include "algorithms/generators.hpp"
#include "algorithms/msccl_xml.hpp"
#include "algorithms/simulator.hpp"
#include "algorithms/synthesizer/plan_cache.hpp"
#include "algorithms/synthesizer/sketch.hpp"
#include "algorithms/synthesizer/synthesizer.hpp"
#include "algorithms/timeline_svg.hpp"
#include "common/error.hpp"
#include "topology/cluster.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;
using namespace topoccl::algo;

namespace {

uint64_t parseSize(std::string text) {
  if (text.empty()) throw CLI::ValidationError("size", "empty size");
  uint64_t mult = 1;
  const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
  if (last == 'B') {
    text.pop_back();
    return parseSize(text);
  }
  if (last == 'K') mult = 1ull << 10;
  if (last == 'M') mult = 1ull << 20;
  if (last == 'G') mult = 1ull << 30;
  if (mult != 1) text.pop_back();
  try {
    return static_cast<uint64_t>(std::stoull(text)) * mult;
  } catch (const std::exception&) {
    throw CLI::ValidationError("size", "bad size '" + text + "'");
  }
}

std::string humanBytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) {
    std::snprintf(buf, sizeof buf, "%lluG", static_cast<unsigned long long>(b >> 30));
  } else if (b >= (1ull << 20) && b % (1ull << 20) == 0) {
    std::snprintf(buf, sizeof buf, "%lluM", static_cast<unsigned long long>(b >> 20));
  } else if (b >= (1ull << 10) && b % (1ull << 10) == 0) {
    std::snprintf(buf, sizeof buf, "%lluK", static_cast<unsigned long long>(b >> 10));
  } else {
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(b));
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"topoccl-synth: TACCL-style synthesis of all-gather / reduce-scatter / all-reduce plans"};
  std::string topoArg, collArg = "allgather", sizesArg = "1K:1G", outPath, timelinePath, gpusArg;
  int hosts = 1, factor = 4;
  double budget = 10, milpSeconds = 2;
  uint32_t maxChunks = 6;
  bool json = false, quiet = false, useCache = false, milp = false, noContiguity = false;
  std::string sketchPath;
  app.add_option("--topo", topoArg, "preset name (dgx1, dgx-a100, ndv2, ...) or topology file")->required();
  app.add_option("--hosts", hosts, "copies of the node joined by a network (buildCluster)")->check(CLI::Range(1, 64));
  app.add_option("--gpus", gpusArg, "comma-separated GPU positions (Topology::gpus() order) to use as ranks");
  app.add_option("--coll", collArg, "allgather | reducescatter | allreduce | alltoall")
      ->check(CLI::IsMember({"allgather", "reducescatter", "allreduce", "alltoall"}));
  app.add_option("--sizes", sizesArg, "MIN:MAX (K/M/G suffixes, powers of 1024) or one size");
  app.add_option("--factor", factor, "step between sizes (2 or 4)")->check(CLI::IsMember({2, 4}));
  app.add_option("--out", outPath, "MSCCL XML of the plan for the largest size");
  app.add_option("--timeline", timelinePath, "SVG timeline of the plan for the largest size");
  app.add_option("--budget", budget, "synthesis budget per size, seconds");
  app.add_option("--max-chunks", maxChunks, "largest chunks per rank C to try (1..C)")->check(CLI::Range(1, 12));
  app.add_flag("--json", json, "print a JSON list of rows");
  app.add_option("--sketch", sketchPath, "communication sketch (JSON, see src/algorithms/synthesizer/sketch.hpp)");
  app.add_flag("--cache", useCache, "read / write the plan cache (TOPOCCL_PLAN_CACHE_DIR); hits print \"cached\"");
  app.add_flag("--milp", milp, "add the routing MILP family (CBC, time-limited: results depend on the machine)");
  app.add_option("--milp-seconds", milpSeconds, "time limit of each routing MILP solve");
  app.add_flag("--no-contiguity", noContiguity, "skip the contiguity post-pass");
  app.add_flag("--quiet", quiet, "no progress on stderr");
  CLI11_PARSE(app, argc, argv);

  try {
    topo::Topology node;
    const std::vector<std::string> presets = topo::presetNames();
    if (std::find(presets.begin(), presets.end(), topoArg) != presets.end()) {
      node = topo::loadPreset(topoArg);
    } else {
      node = topo::loadTopologyFile(topoArg);
    }
    topo::Topology topology = node;
    if (hosts > 1) {
      topo::ClusterSpec spec;
      spec.hosts = hosts;
      topology = topo::buildCluster(node, spec);
    }
    std::vector<topo::VertexId> devices = synth::defaultRankDevices(topology);
    if (!gpusArg.empty()) {
      std::vector<topo::VertexId> chosen;
      size_t pos = 0;
      while (pos <= gpusArg.size()) {
        const size_t comma = std::min(gpusArg.find(',', pos), gpusArg.size());
        const int g = std::stoi(gpusArg.substr(pos, comma - pos));
        if (g < 0 || g >= static_cast<int>(devices.size())) throwInvalidArgument("--gpus: no GPU " + std::to_string(g));
        chosen.push_back(devices[static_cast<size_t>(g)]);
        pos = comma + 1;
      }
      devices = chosen;
    }
    const int n = static_cast<int>(devices.size());
    if (n < 1) throwInvalidArgument("the topology has no GPU");
    const Collective coll = collArg == "allgather"       ? Collective::AllGather
                            : collArg == "reducescatter" ? Collective::ReduceScatter
                            : collArg == "alltoall"      ? Collective::AllToAll  // bound: allToAllBound (MCF LP)
                                                         : Collective::AllReduce;
    const CostModel model = CostModel::fromTopology(topology, devices);

    uint64_t lo = 0, hi = 0;
    const size_t colon = sizesArg.find(':');
    if (colon == std::string::npos) {
      lo = hi = parseSize(sizesArg);
    } else {
      lo = parseSize(sizesArg.substr(0, colon));
      hi = parseSize(sizesArg.substr(colon + 1));
    }
    if (lo < 1 || hi < lo) throwInvalidArgument("--sizes: need 1 <= MIN <= MAX");
    std::vector<uint64_t> sizes;
    for (uint64_t s = lo; s <= hi; s *= static_cast<uint64_t>(factor)) {
      sizes.push_back(s);
      if (s > hi / static_cast<uint64_t>(factor)) break;
    }
    if (sizes.back() != hi) sizes.push_back(hi);

    // Lower bound (bounds.hpp): computed once per topology, scaled per size.
    // The NVLink graph when it connects every rank, else TACCL's fast fabric (NVLink, NVSwitch, network and each
    // rank's path to its NICs), else every link: the cost model routes over Topology::path(), which prefers
    // NVLink (GPUs relay only NVLink to NVLink), so a bound over the links it can use applies to its plans.
    std::optional<CollectiveBound> bound;
    std::string boundGraph = "n/a";
    for (const auto& [filter, label] : {std::pair{LinkFilter::nvlinkOnly(), "NVLink"}, std::pair{LinkFilter::fastFabric(), "fast fabric"},
                                       std::pair{LinkFilter::all(), "all links"}}) {
      try {
        bound = collectiveBound(BoundGraph::fromTopology(topology, devices, filter), coll);
        boundGraph = label;
        break;
      } catch (const std::exception& e) {
        if (!quiet) std::cerr << "(no bound over the " << label << " graph: " << e.what() << ")\n";
      }
    }

    const std::optional<Algorithm> other = coll == Collective::AllReduce ? std::optional(Algorithm::RecursiveDoubling)
                                                                         : std::optional(Algorithm::Direct);
    nlohmann::json rows = nlohmann::json::array();
    if (!json) {
      std::printf("# %s, %d ranks, %s; times in us (simulated on CostModel::fromTopology)\n", topology.name.c_str(), n,
                  collectiveName(coll));
      std::printf("%8s %12s %12s %12s %12s %12s %12s %8s %8s %9s  %s\n", "bytes", "synth_us", "own_us", "ring_us", "hcring_us",
                  "other_us", "bound_us", "ring/syn", "syn/bnd", "synth_s", "strategy");
    }
    synth::SynthOptions options;
    options.budgetSeconds = budget;
    options.maxChunksPerRank = maxChunks;
    options.milp = milp;
    options.milpSeconds = milpSeconds;
    options.contiguity = !noContiguity;
    if (!sketchPath.empty()) {
      options.sketch = synth::loadSketch(sketchPath);
      synth::resolveSketch(*options.sketch, topology, devices);
    }
    const synth::PlanCache cache = useCache ? synth::PlanCache::fromParams() : synth::PlanCache("off");
    synth::SynthResult last;
    for (uint64_t bytes : sizes) {
      if (!quiet) std::cerr << "synthesizing " << collectiveName(coll) << " " << humanBytes(bytes) << " ..." << std::flush;
      // The built-ins (rings with 1..N channels, RD / tree / direct) compete inside the synthesizer; "own" is the best of
      // its own routing families.
      bool cached = false;
      synth::SynthResult r;
      if (useCache) {
        synth::CachedSynthesis cs = synth::synthesizeCached(topology, devices, coll, bytes, options, cache);
        cached = cs.hit;
        r = std::move(cs.result);
        if (cached) r.strategy = "cached " + r.strategy;
      } else {
        r = synth::synthesize(model, coll, bytes, options);
      }
      double ring = -1, own = -1;
      for (const synth::FamilyTime& f : r.families) {
        if (f.family == "ring") {
          ring = f.timeUs;
        } else if (f.family == "recursive_doubling" || f.family == "tree" || f.family == "direct") {
          continue;  // built-ins: shown in the "other" column
        } else if (own < 0 || f.timeUs < own) {
          own = f.timeUs;
        }
      }
      double nvring = -1;
      for (const synth::FamilyTime& f : r.families)
        if (f.family == "rings") nvring = f.timeUs;
      double otherUs = -1;
      if (other) otherUs = simulate(makePlan(*other, coll, n, 0, 1), bytes, model, {1, false}).finishUs;
      const double boundUs = bound ? bound->lowerBoundUs(bytes) : -1;
      if (!quiet) std::cerr << (cached ? " cached\n" : " " + std::to_string(r.seconds) + " s\n");
      const double algbw = r.timeUs > 0 ? static_cast<double>(bytes) / (r.timeUs * 1e3) : 0;
      if (json) {
        nlohmann::json row{{"bytes", bytes},
                           {"time_us", r.timeUs},
                           {"algbw_GBps", algbw},
                           {"busbw_GBps", algbw * busBandwidthFactor(coll, n)},
                           {"ring_time_us", ring},
                           {"own_time_us", own},
                           {"synth_seconds", r.seconds},
                           {"strategy", r.strategy},
                           {"family", r.family},
                           {"chunks_per_rank", r.chunksPerRank},
                           {"max_hops", r.maxHops},
                           {"cached", cached},
                           {"contiguity_merges", r.contiguityMerges}};
        row["bound_time_us"] = bound ? nlohmann::json(boundUs) : nlohmann::json(nullptr);
        row["hamiltonian_rings_time_us"] = nvring >= 0 ? nlohmann::json(nvring) : nlohmann::json(nullptr);
        row[other ? std::string(algorithmName(*other)) + "_time_us" : "other_time_us"] =
            otherUs >= 0 ? nlohmann::json(otherUs) : nlohmann::json(nullptr);
        rows.push_back(row);
      } else {
        char nv[32] = "n/a", ot[32] = "n/a", bd[32] = "n/a", sb[32] = "n/a", rg[32] = "n/a", rs[32] = "n/a";
        if (ring >= 0) {  // no ring family for alltoall
          std::snprintf(rg, sizeof rg, "%.2f", ring);
          std::snprintf(rs, sizeof rs, "%.3f", ring / r.timeUs);
        }
        if (nvring >= 0) std::snprintf(nv, sizeof nv, "%.2f", nvring);
        if (otherUs >= 0) std::snprintf(ot, sizeof ot, "%.2f", otherUs);
        if (boundUs >= 0) {
          std::snprintf(bd, sizeof bd, "%.2f", boundUs);
          std::snprintf(sb, sizeof sb, "%.3f", r.timeUs / boundUs);
        }
        std::printf("%8s %12.2f %12.2f %12s %12s %12s %12s %8s %8s %9.3f  %s\n", humanBytes(bytes).c_str(), r.timeUs, own, rg, nv,
                    ot, bd, rs, sb, r.seconds, r.strategy.c_str());
      }
      last = std::move(r);
    }
    if (json) std::cout << rows.dump(2) << "\n";
    if (!json) {
      std::printf(bound ? "# bound: bounds.hpp collectiveBound over the %s graph: max(latency, bandwidth)\n"
                        : "# bound: %s (bounds.hpp failed for this topology)\n", boundGraph.c_str());
    }
    if (!outPath.empty()) {
      std::ofstream out(outPath);
      out << writeMscclXml(last.plan);
      if (!out) throwInvalidArgument("cannot write " + outPath);
    }
    if (!timelinePath.empty()) {
      const SimResult sim = simulate(last.plan, sizes.back(), model, {1, true});
      std::ofstream out(timelinePath);
      out << timelineSvg(sim, model);
      if (!out) throwInvalidArgument("cannot write " + timelinePath);
    }
  } catch (const std::exception& e) {
    std::cerr << "topoccl-synth: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
