// Contiguity post-pass (TACCL stage (c), synthesizers.md §1.5, as a greedy on the lowered plan); see
// synthesizer.hpp. TACCL decides batching with an exact MILP over the fixed per-link orders; here the
// per-connection orders are fixed too, and a merge of two adjacent transfers is kept when the simulator
// says the plan got faster (one alpha instead of two against the lost pipelining).
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <tuple>

#include "algorithms/msccl_xml.hpp"
#include "algorithms/synthesizer/synthesizer.hpp"
#include "algorithms/validator.hpp"
#include "common/error.hpp"

namespace topoccl::algo::synth {
namespace {

size_t idx(int v) { return static_cast<size_t>(v); }

// Whether MSCCL XML export accepts the plan (merged deps can put a signalled step behind the nops that
// carry extra dependencies, which the MSCCL runtimes number differently).
bool exportable(const Plan& plan) {
  try {
    (void)writeMscclXml(plan);
    return true;
  } catch (const Error&) {
    return false;
  }
}

bool continues(const ChunkRange& a, const ChunkRange& b) {
  return a.buffer == b.buffer && a.offset + a.count == b.offset && a.count > 0 && b.count > 0;
}

// Merges step i + 1 of the lane into step i and renumbers the rank's StepRefs.
void mergeInto(Plan& plan, int rank, uint16_t lane, uint32_t i) {
  RankProgram& prog = plan.ranks[idx(rank)];
  std::vector<Step>& steps = prog.lanes[lane].steps;
  Step& a = steps[i];
  const Step& b = steps[i + 1];
  if (stepReads(a.kind)) a.src.count += b.src.count;
  if (stepWrites(a.kind)) a.dst.count += b.dst.count;
  for (const StepRef& d : b.deps)
    if (std::find(a.deps.begin(), a.deps.end(), d) == a.deps.end()) a.deps.push_back(d);
  steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  for (Lane& l : prog.lanes) {
    for (Step& s : l.steps) {
      for (StepRef& d : s.deps) {
        if (d.lane != lane) continue;
        if (d.step == i + 1) {
          d.step = i;
        } else if (d.step > i + 1) {
          --d.step;
        }
      }
      std::vector<StepRef> unique;
      for (const StepRef& d : s.deps)
        if (std::find(unique.begin(), unique.end(), d) == unique.end()) unique.push_back(d);
      s.deps = std::move(unique);
    }
  }
}

struct Connection {
  int from = -1, to = -1, channel = 0;
  uint16_t sendLane = 0, recvLane = 0;
};

}  // namespace

ContiguityResult mergeContiguous(const Plan& plan, const CostModel& model, uint64_t bytes, const ContiguityOptions& options) {
  ContiguityResult out;
  out.plan = plan;
  out.beforeUs = out.afterUs = simulate(plan, bytes, model, options.sim).finishUs;
  const uint32_t maxCount = std::min<uint32_t>(options.maxCount, 71);
  const bool keepExportable = options.keepMscclExportable && exportable(plan);

  // Connections with exactly one sending lane and one receiving lane (the k-th step of one is the k-th of
  // the other when every step of both lanes moves data on it).
  std::map<std::tuple<int, int, int>, std::pair<std::vector<uint16_t>, std::vector<uint16_t>>> lanes;
  for (int r = 0; r < plan.nranks; ++r) {
    const auto& ls = plan.ranks[idx(r)].lanes;
    for (size_t l = 0; l < ls.size(); ++l) {
      if (ls[l].sendPeer >= 0) lanes[{r, ls[l].sendPeer, ls[l].channel}].first.push_back(static_cast<uint16_t>(l));
      if (ls[l].recvPeer >= 0) lanes[{ls[l].recvPeer, r, ls[l].channel}].second.push_back(static_cast<uint16_t>(l));
    }
  }
  double minLatency = std::numeric_limits<double>::infinity();
  for (const auto& [key, pair] : lanes) {
    const auto [from, to, ch] = key;
    if (from != to) minLatency = std::min(minLatency, model.route(from, to).latencyUs);
  }
  const double threshold = options.minAlphaUs >= 0 ? options.minAlphaUs : 2 * minLatency;
  std::vector<Connection> connections;
  for (const auto& [key, pair] : lanes) {
    const auto [from, to, ch] = key;
    if (from == to || pair.first.size() != 1 || pair.second.size() != 1) continue;
    if (model.route(from, to).latencyUs < threshold || !(model.route(from, to).latencyUs > 0)) continue;
    connections.push_back({from, to, ch, pair.first[0], pair.second[0]});
  }
  if (connections.empty()) {
    out.note = "no high-alpha connection";
    return out;
  }

  const auto t0 = std::chrono::steady_clock::now();
  const auto outOfTime = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > options.secondsLimit;
  };
  for (const Connection& cn : connections) {
    uint32_t i = 0;
    for (;;) {
      if (outOfTime()) {
        out.note = "time limit reached";
        break;
      }
      const auto& sendSteps = out.plan.ranks[idx(cn.from)].lanes[cn.sendLane].steps;
      const auto& recvSteps = out.plan.ranks[idx(cn.to)].lanes[cn.recvLane].steps;
      // Every step of both lanes must move data on this connection, so positions pair up.
      const bool pure = std::all_of(sendSteps.begin(), sendSteps.end(), [](const Step& s) { return s.kind == StepKind::Send; }) &&
                        std::all_of(recvSteps.begin(), recvSteps.end(), [](const Step& s) {
                          return s.kind == StepKind::Recv || s.kind == StepKind::RecvReduceCopy;
                        }) &&
                        sendSteps.size() == recvSteps.size();
      if (!pure || i + 1 >= sendSteps.size()) break;
      const Step& s0 = sendSteps[i];
      const Step& s1 = sendSteps[i + 1];
      const Step& r0 = recvSteps[i];
      const Step& r1 = recvSteps[i + 1];
      bool ok = continues(s0.src, s1.src) && r0.kind == r1.kind && continues(r0.dst, r1.dst) &&
                s0.src.count + s1.src.count <= maxCount;
      if (ok && r0.kind == StepKind::RecvReduceCopy) ok = continues(r0.src, r1.src);
      if (!ok) {
        ++i;
        continue;
      }
      ++out.attempts;
      Plan trial = out.plan;
      mergeInto(trial, cn.from, cn.sendLane, i);
      mergeInto(trial, cn.to, cn.recvLane, i);
      double time = 0;
      try {
        time = simulate(trial, bytes, model, options.sim).finishUs;
      } catch (const Error&) {
        ++i;  // the merged step would wait for data that needs its own first chunk: deadlock
        continue;
      }
      if (time < out.afterUs * (1 - 1e-12) && (!options.validate || validate(trial).ok()) &&
          (!keepExportable || exportable(trial))) {
        out.plan = std::move(trial);
        out.afterUs = time;
        ++out.merges;  // try to extend the same run
      } else {
        ++i;
      }
    }
  }
  if (out.merges == 0 && out.note.empty()) {
    out.note = out.attempts == 0 ? "no contiguous adjacent transfers on high-alpha connections"
                                 : "no merge made the plan faster";
  }
  return out;
}

void applyContiguity(SynthResult& result, const CostModel& model, uint64_t bytes, const SynthOptions& options,
                     double secondsLeft) {
  ContiguityOptions co;
  co.sim = options.sim;
  co.validate = true;
  co.secondsLimit = std::max(0.0, secondsLeft);
  ContiguityResult merged = mergeContiguous(result.plan, model, bytes, co);
  if (merged.merges == 0 || !(merged.afterUs < result.timeUs)) return;
  result.beforeContiguityUs = result.timeUs;
  result.contiguityMerges = merged.merges;
  result.timeUs = merged.afterUs;
  result.plan = std::move(merged.plan);
  result.strategy += " +contig(" + std::to_string(merged.merges) + ")";
}

}  // namespace topoccl::algo::synth
