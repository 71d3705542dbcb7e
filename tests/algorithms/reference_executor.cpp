#include "reference_executor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

namespace topoccl::algo::testing {
namespace {

constexpr double kUnset = std::numeric_limits<double>::quiet_NaN();

struct Span {
  double* data = nullptr;
  size_t size = 0;
  bool overlaps(const Span& other) const {
    return size > 0 && other.size > 0 && data < other.data + other.size && other.data < data + size;
  }
};

struct RankMemory {
  std::vector<double> inputStore;  // out of place: separate stores; in place: one shared arena
  std::vector<double> outputStore;
  std::vector<double> scratch;
  double* input = nullptr;
  double* output = nullptr;
  size_t inputSize = 0;
  size_t outputSize = 0;
};

// A send in flight. Plain sends and copy-sends read their source when received (as a single-copy
// transport would); a recv-reduce-send has already reduced into its own staging.
struct InFlight {
  Span source;
  std::vector<double> staged;
  bool fromStaging = false;
  bool received = false;
};

using ConnectionKey = std::tuple<int, int, int>;

class Runner {
 public:
  Runner(const Plan& plan, const RunOptions& options) : plan_(plan), options_(options), rng_(options.seed) {}

  std::string run() {
    allocate();
    if (std::string error = execute(); !error.empty()) return error;
    return check();
  }

 private:
  void allocate() {
    const int n = plan_.nranks;
    const size_t c = options_.blockCount;
    std::uniform_int_distribution<int> value(-100, 100);
    memory_.resize(static_cast<size_t>(n));
    originalInputs_.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      RankMemory& m = memory_[static_cast<size_t>(r)];
      m.inputSize = inputBlocks(plan_.collective, n, r, plan_.root) * c;
      m.outputSize = outputBlocks(plan_.collective, n, r, plan_.root) * c;
      const InPlaceAlias alias = inPlaceAlias(plan_.collective, n, r, plan_.root);
      if (options_.inPlace && alias.blocks > 0) {
        // Input block alias.inputBlock and output block alias.outputBlock share their address.
        const size_t inputOffset = alias.outputBlock >= alias.inputBlock ? (alias.outputBlock - alias.inputBlock) * c : 0;
        const size_t outputOffset = alias.inputBlock > alias.outputBlock ? (alias.inputBlock - alias.outputBlock) * c : 0;
        m.inputStore.assign(std::max(inputOffset + m.inputSize, outputOffset + m.outputSize), kUnset);
        m.input = m.inputStore.data() + inputOffset;
        m.output = m.inputStore.data() + outputOffset;
      } else {
        m.inputStore.assign(m.inputSize, kUnset);
        m.outputStore.assign(m.outputSize, kUnset);
        m.input = m.inputStore.data();
        m.output = m.outputStore.data();
      }
      if (plan_.scratchChunks > 0) {
        m.scratch.assign(chunkElements(plan_, c, plan_.scratchChunks - 1).end, kUnset);
      }
      for (size_t e = 0; e < m.inputSize; ++e) m.input[e] = value(rng_);
      originalInputs_[static_cast<size_t>(r)].assign(m.input, m.input + m.inputSize);
    }
  }

  Span span(int rank, const ChunkRange& range) {
    RankMemory& m = memory_[static_cast<size_t>(rank)];
    const ElementRange e = rangeElements(plan_, options_.blockCount, range);
    double* base = range.buffer == BufferId::Input    ? m.input
                   : range.buffer == BufferId::Output ? m.output
                                                      : m.scratch.data();
    return {base + e.begin, e.size()};
  }

  struct LaneState {
    int rank;
    size_t lane;
    size_t next = 0;
    size_t received = 0;
  };

  const Lane& laneOf(const LaneState& s) const {
    return plan_.ranks[static_cast<size_t>(s.rank)].lanes[s.lane];
  }

  bool done(int rank, const StepRef& ref) const {
    const auto& lanes = laneIndex_.at(rank);
    return lanes_[lanes[ref.lane]].next > ref.step;
  }

  bool isSkippedCopy(int rank, const Step& step) {
    return step.kind == StepKind::Copy && span(rank, step.src).data == span(rank, step.dst).data;
  }

  bool ready(const LaneState& s) {
    const Lane& lane = laneOf(s);
    if (s.next >= lane.steps.size()) return false;
    const Step& step = lane.steps[s.next];
    for (const StepRef& dep : step.deps) {
      if (!done(s.rank, dep)) return false;
    }
    if (stepReceives(step.kind) && queues_[{lane.recvPeer, s.rank, lane.channel}].size() <= s.received) return false;
    if (stepWrites(step.kind) && !isSkippedCopy(s.rank, step)) {
      const Span target = span(s.rank, step.dst);
      for (const InFlight* f : inFlight_[s.rank]) {
        if (!f->received && !f->fromStaging && f->source.overlaps(target)) return false;
      }
    }
    return true;
  }

  std::string execute() {
    for (int r = 0; r < plan_.nranks; ++r) {
      for (size_t l = 0; l < plan_.ranks[static_cast<size_t>(r)].lanes.size(); ++l) {
        laneIndex_[r].push_back(lanes_.size());
        lanes_.push_back({r, l});
      }
    }
    std::vector<size_t> candidates;
    while (true) {
      candidates.clear();
      for (size_t i = 0; i < lanes_.size(); ++i) {
        if (ready(lanes_[i])) candidates.push_back(i);
      }
      if (candidates.empty()) break;
      std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
      if (std::string error = step(lanes_[candidates[pick(rng_)]]); !error.empty()) return error;
    }
    for (const LaneState& s : lanes_) {
      if (s.next < laneOf(s).steps.size()) {
        return "deadlock: rank " + std::to_string(s.rank) + " lane " + std::to_string(s.lane) + " stuck at step " +
               std::to_string(s.next);
      }
    }
    return {};
  }

  std::string step(LaneState& s) {
    const Lane& lane = laneOf(s);
    const Step& step = lane.steps[s.next];
    const std::string where = "rank " + std::to_string(s.rank) + " lane " + std::to_string(s.lane) + " step " +
                              std::to_string(s.next) + " (" + stepKindName(step.kind) + ")";
    std::vector<double> incoming;
    if (stepReceives(step.kind)) {
      InFlight& f = *queues_[{lane.recvPeer, s.rank, lane.channel}][s.received++];
      incoming = f.fromStaging ? f.staged : std::vector<double>(f.source.data, f.source.data + f.source.size);
      f.received = true;
    }
    const Span src = stepReads(step.kind) ? span(s.rank, step.src) : Span{};
    const Span dst = stepWrites(step.kind) ? span(s.rank, step.dst) : Span{};
    const size_t expected = stepReads(step.kind) ? src.size : dst.size;
    if (stepReceives(step.kind) && incoming.size() != expected) {
      return where + ": received " + std::to_string(incoming.size()) + " elements, expected " + std::to_string(expected);
    }
    std::vector<double> result;
    switch (step.kind) {
      case StepKind::Nop:
      case StepKind::Send: break;
      case StepKind::Recv:
      case StepKind::RecvCopySend: result = incoming; break;
      case StepKind::RecvReduceSend:
      case StepKind::RecvReduceCopy:
      case StepKind::RecvReduceCopySend:
        result.resize(src.size);
        for (size_t i = 0; i < src.size; ++i) result[i] = incoming[i] + src.data[i];
        break;
      case StepKind::Copy: result.assign(src.data, src.data + src.size); break;
      case StepKind::Reduce:
        result.resize(dst.size);
        for (size_t i = 0; i < dst.size; ++i) result[i] = dst.data[i] + src.data[i];
        break;
    }
    if (stepWrites(step.kind) && !isSkippedCopy(s.rank, step)) std::copy(result.begin(), result.end(), dst.data);
    if (stepSends(step.kind)) {
      auto f = std::make_unique<InFlight>();
      if (step.kind == StepKind::Send) {
        f->source = src;
      } else if (step.kind == StepKind::RecvReduceSend) {
        f->fromStaging = true;
        f->staged = std::move(result);
      } else {
        f->source = dst;
      }
      auto& pending = inFlight_[s.rank];
      std::erase_if(pending, [](const InFlight* p) { return p->received; });
      pending.push_back(f.get());
      queues_[{s.rank, lane.sendPeer, lane.channel}].push_back(f.get());
      owned_.push_back(std::move(f));
    }
    ++s.next;
    return {};
  }

  double expectedOutput(int r, size_t e) const {
    const int n = plan_.nranks;
    const size_t c = options_.blockCount;
    const size_t block = e / c;
    const size_t within = e % c;
    const auto in = [&](int rank, size_t index) { return originalInputs_[static_cast<size_t>(rank)][index]; };
    const auto sum = [&](size_t index) {
      double total = 0;
      for (int q = 0; q < n; ++q) total += in(q, index);
      return total;
    };
    const size_t own = static_cast<size_t>(r) * c + within;
    switch (plan_.collective) {
      case Collective::AllReduce:
      case Collective::Reduce: return sum(e);
      case Collective::ReduceScatter: return sum(own);
      case Collective::AllGather:
      case Collective::Gather: return in(static_cast<int>(block), within);
      case Collective::Broadcast: return in(plan_.root, e);
      case Collective::AllToAll: return in(static_cast<int>(block), own);
      case Collective::Scatter: return in(plan_.root, own);
    }
    return kUnset;
  }

  std::string check() const {
    for (int r = 0; r < plan_.nranks; ++r) {
      const RankMemory& m = memory_[static_cast<size_t>(r)];
      for (size_t e = 0; e < m.outputSize; ++e) {
        const double want = expectedOutput(r, e);
        if (!(m.output[e] == want)) {
          return "rank " + std::to_string(r) + " output element " + std::to_string(e) + ": got " +
                 std::to_string(m.output[e]) + ", want " + std::to_string(want);
        }
      }
      if (!options_.inPlace) {
        const auto& original = originalInputs_[static_cast<size_t>(r)];
        if (!std::equal(original.begin(), original.end(), m.input)) return "rank " + std::to_string(r) + " input was modified";
      }
    }
    return {};
  }

  const Plan& plan_;
  const RunOptions options_;
  std::mt19937_64 rng_;
  std::vector<RankMemory> memory_;
  std::vector<std::vector<double>> originalInputs_;
  std::vector<LaneState> lanes_;
  std::map<int, std::vector<size_t>> laneIndex_;  // rank -> indices into lanes_
  std::map<ConnectionKey, std::vector<InFlight*>> queues_;
  std::map<int, std::vector<InFlight*>> inFlight_;  // per sender rank
  std::vector<std::unique_ptr<InFlight>> owned_;
};

}  // namespace

std::string runAndCheck(const Plan& plan, const RunOptions& options) { return Runner(plan, options).run(); }

}  // namespace topoccl::algo::testing
