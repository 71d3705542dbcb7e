#include "algorithms/validator.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <tuple>
#include <unordered_set>

#include "common/error.hpp"

namespace topoccl::algo {
namespace {

constexpr size_t kMaxStoredErrors = 64;
constexpr size_t kMaxStuckLanesReported = 16;

class ErrorSink {
 public:
  explicit ErrorSink(ValidationReport& report) : report_(report) {}

  void add(const std::string& message) {
    if (!seen_.insert(message).second) return;  // the same fault found twice (e.g. in both modes)
    if (report_.errors.size() < kMaxStoredErrors) {
      report_.errors.push_back(message);
    } else {
      ++report_.omittedErrors;
    }
  }
  size_t count() const { return report_.errors.size() + report_.omittedErrors; }
  bool seen(const std::string& message) const { return seen_.count(message) > 0; }

 private:
  ValidationReport& report_;
  std::unordered_set<std::string> seen_;
};

std::string stepLabel(int rank, size_t lane, size_t step, StepKind kind) {
  return "rank " + std::to_string(rank) + " lane " + std::to_string(lane) + " step " + std::to_string(step) +
         " (" + stepKindName(kind) + ")";
}

std::string laneLabel(int rank, size_t lane) {
  return "rank " + std::to_string(rank) + " lane " + std::to_string(lane);
}

std::string chunkCount(uint32_t n) { return std::to_string(n) + (n == 1 ? " chunk" : " chunks"); }

std::string rangeText(const ChunkRange& r) {
  std::string text = bufferName(r.buffer);
  if (r.count == 1) return text + " chunk " + std::to_string(r.offset);
  return text + " chunks [" + std::to_string(r.offset) + "," + std::to_string(uint64_t{r.offset} + r.count) + ")";
}

bool isRooted(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather ||
         c == Collective::Scatter;
}

// The range a step puts on the wire, or nullptr when it sends nothing.
const ChunkRange* sentRange(const Step& s) {
  switch (s.kind) {
    case StepKind::Send:
    case StepKind::RecvReduceSend: return &s.src;
    case StepKind::RecvCopySend:
    case StepKind::RecvReduceCopySend: return &s.dst;
    default: return nullptr;
  }
}

// The local range whose shape the incoming data must have, or nullptr when it receives nothing.
const ChunkRange* receivedShape(const Step& s) {
  switch (s.kind) {
    case StepKind::Recv:
    case StepKind::RecvCopySend: return &s.dst;
    case StepKind::RecvReduceSend:
    case StepKind::RecvReduceCopy:
    case StepKind::RecvReduceCopySend: return &s.src;
    default: return nullptr;
  }
}

// Steps that read src and write dst locally, so the two must have the same shape.
bool hasLocalSrcAndDst(StepKind k) {
  return k == StepKind::RecvReduceCopy || k == StepKind::RecvReduceCopySend || k == StepKind::Copy ||
         k == StepKind::Reduce;
}

uint32_t bufferChunks(const Plan& plan, int rank, BufferId b) {
  switch (b) {
    case BufferId::Input: return inputBlocks(plan.collective, plan.nranks, rank, plan.root) * plan.chunksPerBlock;
    case BufferId::Output: return outputBlocks(plan.collective, plan.nranks, rank, plan.root) * plan.chunksPerBlock;
    case BufferId::Scratch: return plan.scratchChunks;
  }
  return 0;
}

using ConnectionKey = std::tuple<int, int, int>;  // sender, receiver, channel

struct ConnectionEnds {
  int senderLane = -1;
  int receiverLane = -1;
};

std::string connectionText(int peer, int channel) {
  return "rank " + std::to_string(peer) + " channel " + std::to_string(channel);
}

// ---------------------------------------------------------------------------------------------
// Structure: header, lanes, steps, connections and their pairing. Returns false when the plan is
// too broken to simulate.
class StructureCheck {
 public:
  StructureCheck(const Plan& plan, ErrorSink& errors) : plan_(plan), errors_(errors) {}

  bool run() {
    const size_t before = errors_.count();
    if (!checkHeader()) return false;
    for (int r = 0; r < plan_.nranks; ++r) checkRank(r);
    checkPairing();
    return errors_.count() == before;
  }

 private:
  bool checkHeader() {
    bool simulable = true;
    if (plan_.nranks < 1) {
      errors_.add("plan has nranks " + std::to_string(plan_.nranks) + "; it needs at least 1");
      return false;
    }
    if (plan_.ranks.size() != static_cast<size_t>(plan_.nranks)) {
      errors_.add("plan has nranks " + std::to_string(plan_.nranks) + " but programs for " +
                  std::to_string(plan_.ranks.size()) + " ranks");
      simulable = false;
    }
    if (plan_.chunksPerBlock < 1) {
      errors_.add("plan has chunksPerBlock 0");
      simulable = false;
    }
    if (isRooted(plan_.collective) && (plan_.root < 0 || plan_.root >= plan_.nranks)) {
      errors_.add(std::string(collectiveName(plan_.collective)) + " plan has root " + std::to_string(plan_.root) +
                  ", outside 0.." + std::to_string(plan_.nranks - 1));
      simulable = false;
    }
    if (!plan_.inPlace && !plan_.outOfPlace) {
      errors_.add("plan claims to be valid neither in place nor out of place");
    }
    if (!simulable) return false;
    uint32_t maxIn = 0;
    uint32_t maxOut = 0;
    for (int r = 0; r < plan_.nranks; ++r) {
      maxIn = std::max(maxIn, bufferChunks(plan_, r, BufferId::Input));
      maxOut = std::max(maxOut, bufferChunks(plan_, r, BufferId::Output));
    }
    if (plan_.inputChunks != maxIn) {
      errors_.add("plan header says inputChunks " + std::to_string(plan_.inputChunks) + " but " +
                  collectiveName(plan_.collective) + " with chunksPerBlock " + std::to_string(plan_.chunksPerBlock) +
                  " has " + std::to_string(maxIn));
    }
    if (plan_.outputChunks != maxOut) {
      errors_.add("plan header says outputChunks " + std::to_string(plan_.outputChunks) + " but " +
                  collectiveName(plan_.collective) + " with chunksPerBlock " + std::to_string(plan_.chunksPerBlock) +
                  " has " + std::to_string(maxOut));
    }
    return true;
  }

  void checkRank(int rank) {
    const auto& lanes = plan_.ranks[static_cast<size_t>(rank)].lanes;
    for (size_t l = 0; l < lanes.size(); ++l) {
      const Lane& lane = lanes[l];
      bool peersOk = true;
      for (const auto& [peer, what] : {std::pair{lane.sendPeer, "send"}, std::pair{lane.recvPeer, "receive"}}) {
        if (peer < -1 || peer >= plan_.nranks || peer == rank) {
          errors_.add(laneLabel(rank, l) + ": " + what + " peer " + std::to_string(peer) +
                      (peer == rank ? " is the rank itself" : " is not a rank of this plan"));
          peersOk = false;
        }
      }
      if (lane.channel < 0) {
        errors_.add(laneLabel(rank, l) + ": channel " + std::to_string(lane.channel) + " is negative");
        peersOk = false;
      }
      if (peersOk) registerConnections(rank, l, lane);
      for (size_t s = 0; s < lane.steps.size(); ++s) checkStep(rank, l, s);
    }
  }

  void registerConnections(int rank, size_t l, const Lane& lane) {
    const int laneIndex = static_cast<int>(l);
    if (lane.sendPeer >= 0) {
      auto& ends = connections_[{rank, lane.sendPeer, lane.channel}];
      if (ends.senderLane >= 0) {
        errors_.add(laneLabel(rank, l) + " and lane " + std::to_string(ends.senderLane) + " both send to " +
                    connectionText(lane.sendPeer, lane.channel) + "; a connection has one lane at each end");
      } else {
        ends.senderLane = laneIndex;
      }
    }
    if (lane.recvPeer >= 0) {
      auto& ends = connections_[{lane.recvPeer, rank, lane.channel}];
      if (ends.receiverLane >= 0) {
        errors_.add(laneLabel(rank, l) + " and lane " + std::to_string(ends.receiverLane) + " both receive from " +
                    connectionText(lane.recvPeer, lane.channel) + "; a connection has one lane at each end");
      } else {
        ends.receiverLane = laneIndex;
      }
    }
  }

  void checkRange(const std::string& where, int rank, const ChunkRange& range, const char* role) {
    const uint32_t size = bufferChunks(plan_, rank, range.buffer);
    if (range.count == 0) {
      errors_.add(where + ": " + role + " " + rangeText(range) + " is empty");
    } else if (uint64_t{range.offset} + range.count > size) {
      errors_.add(where + ": " + role + " " + rangeText(range) + " lies outside rank " + std::to_string(rank) + "'s " +
                  bufferName(range.buffer) + ", which holds " + chunkCount(size) + " for " +
                  collectiveName(plan_.collective));
    }
  }

  void checkStep(int rank, size_t l, size_t s) {
    const auto& lanes = plan_.ranks[static_cast<size_t>(rank)].lanes;
    const Lane& lane = lanes[l];
    const Step& step = lane.steps[s];
    const std::string where = stepLabel(rank, l, s, step.kind);
    const uint32_t cpb = plan_.chunksPerBlock;
    if (stepReads(step.kind)) checkRange(where, rank, step.src, "source");
    if (stepWrites(step.kind)) {
      checkRange(where, rank, step.dst, "destination");
      if (step.dst.buffer == BufferId::Input) {
        errors_.add(where + ": writes " + rangeText(step.dst) + "; input is the user's read-only send buffer");
      }
    }
    if (hasLocalSrcAndDst(step.kind)) {
      if (step.src.count != step.dst.count) {
        errors_.add(where + ": source " + rangeText(step.src) + " and destination " + rangeText(step.dst) +
                    " differ in size");
      } else if (step.src.offset % cpb != step.dst.offset % cpb) {
        errors_.add(where + ": source " + rangeText(step.src) + " and destination " + rangeText(step.dst) +
                    " start at different parts of a block, so their element counts differ");
      }
    }
    if (stepSends(step.kind) && lane.sendPeer < 0) errors_.add(where + ": sends, but its lane has no send peer");
    if (stepReceives(step.kind) && lane.recvPeer < 0) {
      errors_.add(where + ": receives, but its lane has no receive peer");
    }
    for (const StepRef& dep : step.deps) {
      if (dep.lane == l) {
        errors_.add(where + ": depends on step " + std::to_string(dep.step) +
                    " of its own lane; deps name other lanes (a lane already runs in order)");
      } else if (dep.lane >= lanes.size()) {
        errors_.add(where + ": depends on lane " + std::to_string(dep.lane) + " step " + std::to_string(dep.step) +
                    ", but rank " + std::to_string(rank) + " has " + std::to_string(lanes.size()) + " lanes");
      } else if (dep.step >= lanes[dep.lane].steps.size()) {
        errors_.add(where + ": depends on lane " + std::to_string(dep.lane) + " step " + std::to_string(dep.step) +
                    ", but that lane has " + std::to_string(lanes[dep.lane].steps.size()) + " steps");
      }
    }
  }

  std::vector<size_t> stepsWhere(int rank, int lane, bool (*pred)(StepKind)) const {
    std::vector<size_t> out;
    const auto& steps = plan_.ranks[static_cast<size_t>(rank)].lanes[static_cast<size_t>(lane)].steps;
    for (size_t s = 0; s < steps.size(); ++s) {
      if (pred(steps[s].kind)) out.push_back(s);
    }
    return out;
  }

  const Step& stepAt(int rank, int lane, size_t s) const {
    return plan_.ranks[static_cast<size_t>(rank)].lanes[static_cast<size_t>(lane)].steps[s];
  }

  void checkPairing() {
    for (const auto& [key, ends] : connections_) {
      const auto [from, to, channel] = key;
      const std::vector<size_t> sends =
          ends.senderLane >= 0 ? stepsWhere(from, ends.senderLane, stepSends) : std::vector<size_t>{};
      const std::vector<size_t> recvs =
          ends.receiverLane >= 0 ? stepsWhere(to, ends.receiverLane, stepReceives) : std::vector<size_t>{};
      if (ends.receiverLane < 0) {
        if (!sends.empty()) {
          errors_.add(stepLabel(from, static_cast<size_t>(ends.senderLane), sends[0], stepAt(from, ends.senderLane, sends[0]).kind) +
                      ": sends to " + connectionText(to, channel) + ", but rank " + std::to_string(to) +
                      " has no lane receiving from rank " + std::to_string(from) + " on channel " +
                      std::to_string(channel));
        }
        continue;
      }
      if (ends.senderLane < 0) {
        if (!recvs.empty()) {
          errors_.add(stepLabel(to, static_cast<size_t>(ends.receiverLane), recvs[0], stepAt(to, ends.receiverLane, recvs[0]).kind) +
                      ": receives from " + connectionText(from, channel) + ", but rank " + std::to_string(from) +
                      " has no lane sending to rank " + std::to_string(to) + " on channel " + std::to_string(channel));
        }
        continue;
      }
      const size_t senderLane = static_cast<size_t>(ends.senderLane);
      const size_t receiverLane = static_cast<size_t>(ends.receiverLane);
      const size_t paired = std::min(sends.size(), recvs.size());
      for (size_t k = 0; k < paired; ++k) {
        const Step& send = stepAt(from, ends.senderLane, sends[k]);
        const Step& recv = stepAt(to, ends.receiverLane, recvs[k]);
        const ChunkRange& out = *sentRange(send);
        const ChunkRange& in = *receivedShape(recv);
        const std::string both = stepLabel(to, receiverLane, recvs[k], recv.kind) + ": receive " +
                                 std::to_string(k + 1) + " from " + connectionText(from, channel);
        const std::string peer = stepLabel(from, senderLane, sends[k], send.kind);
        if (out.count != in.count) {
          errors_.add(both + " takes " + chunkCount(in.count) + " but " + peer + " sends " + std::to_string(out.count));
        } else if (out.offset % plan_.chunksPerBlock != in.offset % plan_.chunksPerBlock) {
          errors_.add(both + " takes " + rangeText(in) + " but " + peer + " sends " + rangeText(out) +
                      ", which starts at a different part of a block (element counts differ)");
        }
      }
      if (sends.size() > paired) {
        const size_t s = sends[paired];
        errors_.add(stepLabel(from, senderLane, s, stepAt(from, ends.senderLane, s).kind) + ": send " +
                    std::to_string(paired + 1) + " to " + connectionText(to, channel) + " has no matching receive: " +
                    laneLabel(to, receiverLane) + " receives only " + std::to_string(recvs.size()) + " times");
      } else if (recvs.size() > paired) {
        const size_t s = recvs[paired];
        errors_.add(stepLabel(to, receiverLane, s, stepAt(to, ends.receiverLane, s).kind) + ": receive " +
                    std::to_string(paired + 1) + " from " + connectionText(from, channel) + " has no matching send: " +
                    laneLabel(from, senderLane) + " sends only " + std::to_string(sends.size()) + " times");
      }
    }
  }

  const Plan& plan_;
  ErrorSink& errors_;
  std::map<ConnectionKey, ConnectionEnds> connections_;
};

// ---------------------------------------------------------------------------------------------
// Symbolic execution. A value is the sorted multiset of contributions (rank, input chunk) it sums.
struct Value {
  bool written = false;
  bool poisoned = false;  // derived from an error already reported; stays quiet afterwards
  std::vector<uint32_t> sources;
};

// A sparse vector clock: (global lane, steps of that lane known complete), sorted by lane. Only
// lanes with something complete appear, so clocks stay small for plans whose lanes rarely
// interact (direct AllToAll) and bounded by the lane count otherwise.
using Clock = std::vector<std::pair<uint32_t, uint32_t>>;

uint32_t clockAt(const Clock& clock, uint32_t lane) {
  const auto it = std::lower_bound(clock.begin(), clock.end(), std::pair<uint32_t, uint32_t>{lane, 0});
  return it != clock.end() && it->first == lane ? it->second : 0;
}

void clockSet(Clock& clock, uint32_t lane, uint32_t value) {
  const auto it = std::lower_bound(clock.begin(), clock.end(), std::pair<uint32_t, uint32_t>{lane, 0});
  if (it != clock.end() && it->first == lane) {
    it->second = std::max(it->second, value);
  } else {
    clock.insert(it, {lane, value});
  }
}

void clockJoin(Clock& into, const Clock& other) {
  if (other.empty()) return;
  Clock out;
  out.reserve(into.size() + other.size());
  auto a = into.begin();
  auto b = other.begin();
  while (a != into.end() || b != other.end()) {
    if (b == other.end() || (a != into.end() && a->first < b->first)) {
      out.push_back(*a++);
    } else if (a == into.end() || b->first < a->first) {
      out.push_back(*b++);
    } else {
      out.emplace_back(a->first, std::max(a->second, b->second));
      ++a;
      ++b;
    }
  }
  into = std::move(out);
}

struct Message {
  uint32_t senderLane = 0;  // global lane id and step, for messages
  uint32_t senderStep = 0;
  std::vector<Value> data;
  Clock clock;                      // the sender step's completion clock
  std::vector<size_t> guarded;      // sender cells that must not be written until it is received
  bool received = false;
};

struct Access {
  uint32_t lane;  // global lane id
  uint32_t step;
  bool write;
};

class Simulation {
 public:
  Simulation(const Plan& plan, bool inPlace, ErrorSink& errors)
      : plan_(plan), inPlace_(inPlace), errors_(errors), prefix_(inPlace ? "(in place) " : "") {}

  // In-place findings are prefixed with the layout; one already found out of place is not repeated.
  void fail(const std::string& text) {
    if (!errors_.seen(text)) errors_.add(prefix_ + text);
  }

  void run() {
    layOut();
    bool progress = true;
    while (progress) {
      progress = false;
      for (uint32_t g = 0; g < laneCount_; ++g) {
        while (pc_[g] < laneOf(g).steps.size() && !isBlocked(g)) {
          execute(g);
          progress = true;
        }
      }
    }
    if (!reportDeadlock()) checkOutputs();
  }

 private:
  // ---- layout -------------------------------------------------------------------------------
  void layOut() {
    const int n = plan_.nranks;
    stride_ = std::max<uint32_t>(plan_.inputChunks, 1);
    rankCellBase_.resize(static_cast<size_t>(n));
    size_t cells = 0;
    for (int r = 0; r < n; ++r) {
      rankCellBase_[static_cast<size_t>(r)] = cells;
      cells += bufferChunks(plan_, r, BufferId::Input) + bufferChunks(plan_, r, BufferId::Output) + plan_.scratchChunks;
    }
    cells_.assign(cells, Value{});
    accesses_.assign(cells, {});
    for (int r = 0; r < n; ++r) {
      for (uint32_t k = 0; k < bufferChunks(plan_, r, BufferId::Input); ++k) {
        Value& v = cells_[cellIndex(r, BufferId::Input, k)];
        v.written = true;
        v.sources = {contribution(r, k)};
      }
    }
    for (int r = 0; r < n; ++r) {
      const auto& lanes = plan_.ranks[static_cast<size_t>(r)].lanes;
      for (size_t l = 0; l < lanes.size(); ++l) {
        laneRank_.push_back(r);
        laneLocal_.push_back(static_cast<uint32_t>(l));
        stepBase_.push_back(stepCount_);
        stepCount_ += lanes[l].steps.size();
      }
      laneBase_.push_back(static_cast<uint32_t>(laneLocal_.size() - lanes.size()));
    }
    laneCount_ = static_cast<uint32_t>(laneRank_.size());
    pc_.assign(laneCount_, 0);
    received_.assign(laneCount_, 0);
    laneClock_.assign(laneCount_, {});
    for (int r = 0; r < n; ++r) {
      const auto& lanes = plan_.ranks[static_cast<size_t>(r)].lanes;
      for (const Lane& lane : lanes) {
        for (const Step& step : lane.steps) {
          for (const StepRef& dep : step.deps) depClock_[stepBase_[globalLane(r, dep.lane)] + dep.step];
        }
      }
    }
    guardCount_.assign(cells, 0);
    sendQueue_.assign(laneCount_, nullptr);
    recvQueue_.assign(laneCount_, nullptr);
    for (uint32_t g = 0; g < laneCount_; ++g) {
      const Lane& lane = laneOf(g);
      // std::map nodes never move, so these stay valid.
      if (lane.sendPeer >= 0) sendQueue_[g] = &messages_[{laneRank_[g], lane.sendPeer, lane.channel}];
      if (lane.recvPeer >= 0) recvQueue_[g] = &messages_[{lane.recvPeer, laneRank_[g], lane.channel}];
    }
  }

  uint32_t contribution(int rank, uint32_t inputChunk) const {
    return static_cast<uint32_t>(rank) * stride_ + inputChunk;
  }

  std::string contributionText(uint32_t id) const {
    return "rank " + std::to_string(id / stride_) + " input chunk " + std::to_string(id % stride_);
  }

  size_t cellIndex(int rank, BufferId buffer, uint32_t chunk) const {
    const size_t base = rankCellBase_[static_cast<size_t>(rank)];
    const uint32_t inChunks = bufferChunks(plan_, rank, BufferId::Input);
    const uint32_t outChunks = bufferChunks(plan_, rank, BufferId::Output);
    switch (buffer) {
      case BufferId::Input: return base + chunk;
      case BufferId::Output: {
        if (inPlace_) {
          const InPlaceAlias alias = inPlaceAlias(plan_.collective, plan_.nranks, rank, plan_.root);
          const uint32_t cpb = plan_.chunksPerBlock;
          const uint32_t first = alias.outputBlock * cpb;
          if (chunk >= first && chunk < first + alias.blocks * cpb) return base + alias.inputBlock * cpb + (chunk - first);
        }
        return base + inChunks + chunk;
      }
      case BufferId::Scratch: return base + inChunks + outChunks + chunk;
    }
    return base;
  }

  std::vector<size_t> cellsOf(int rank, const ChunkRange& range) const {
    std::vector<size_t> out(range.count);
    for (uint32_t i = 0; i < range.count; ++i) out[i] = cellIndex(rank, range.buffer, range.offset + i);
    return out;
  }

  const Lane& laneOf(uint32_t g) const {
    return plan_.ranks[static_cast<size_t>(laneRank_[g])].lanes[laneLocal_[g]];
  }
  uint32_t globalLane(int rank, uint32_t local) const { return laneBase_[static_cast<size_t>(rank)] + local; }

  std::string label(uint32_t g, size_t step) const {
    return stepLabel(laneRank_[g], laneLocal_[g], step, laneOf(g).steps[step].kind);
  }

  // A Copy onto the very same memory (in-place aliasing) is skipped by the executor.
  bool isNoOpCopy(int rank, const Step& step) const {
    return step.kind == StepKind::Copy && cellsOf(rank, step.src) == cellsOf(rank, step.dst);
  }

  std::vector<size_t> writtenCells(int rank, const Step& step) const {
    if (!stepWrites(step.kind) || isNoOpCopy(rank, step)) return {};
    return cellsOf(rank, step.dst);
  }

  bool isBlocked(uint32_t g) { return !blocker(g, false).empty(); }

  // Why lane g's next step cannot run now; empty when it can. Without `explain` any non-empty
  // text means blocked (the loop asks often; the sentence is only built for the report).
  std::string blocker(uint32_t g, bool explain) {
    const int rank = laneRank_[g];
    const Lane& lane = laneOf(g);
    const Step& step = lane.steps[pc_[g]];
    for (const StepRef& dep : step.deps) {
      const uint32_t depLane = globalLane(rank, dep.lane);
      if (pc_[depLane] <= dep.step) {
        if (!explain) return "x";
        return "waits for its dependency lane " + std::to_string(dep.lane) + " step " + std::to_string(dep.step) +
               ", which has not run";
      }
    }
    if (stepReceives(step.kind)) {
      const auto& queue = *recvQueue_[g];
      if (queue.size() <= received_[g]) {
        if (!explain) return "x";
        return "waits for receive " + std::to_string(received_[g] + 1) + " from " +
               connectionText(lane.recvPeer, lane.channel) + ", which has sent " + std::to_string(queue.size());
      }
    }
    for (size_t cell : writtenCells(rank, step)) {
      if (guardCount_[cell] == 0) continue;
      if (!explain) return "x";
      return "must not overwrite " + rangeText(step.dst) + " before its peer receives " + guardingSend(rank, cell) +
             ", and that receive has not run";
    }
    return {};
  }

  // The send of `rank` not yet received whose source includes `cell` (for the deadlock report).
  std::string guardingSend(int rank, size_t cell) const {
    for (const auto& [key, queue] : messages_) {
      if (std::get<0>(key) != rank) continue;
      for (const Message& m : queue) {
        if (!m.received && std::find(m.guarded.begin(), m.guarded.end(), cell) != m.guarded.end()) {
          return "the send of " + label(m.senderLane, m.senderStep);
        }
      }
    }
    return "a send";
  }

  // ---- values -------------------------------------------------------------------------------
  Value readCell(uint32_t g, size_t step, size_t cell, const ChunkRange& range, uint32_t i) {
    Value v = cells_[cell];
    if (!v.written) {
      ChunkRange one{range.buffer, range.offset + i, 1};
      fail(label(g, step) + ": reads " + rangeText(one) + ", which nothing has written");
      v.written = true;
      v.poisoned = true;
    }
    return v;
  }

  Value reduce(uint32_t g, size_t step, const Value& a, const Value& b, bool& reported) {
    Value out;
    out.written = true;
    out.poisoned = a.poisoned || b.poisoned;
    out.sources.reserve(a.sources.size() + b.sources.size());
    std::merge(a.sources.begin(), a.sources.end(), b.sources.begin(), b.sources.end(),
               std::back_inserter(out.sources));
    const auto twice = std::adjacent_find(out.sources.begin(), out.sources.end());
    if (twice != out.sources.end() && !out.poisoned) {
      if (!reported) {
        fail(label(g, step) + ": the reduction counts " + contributionText(*twice) + " twice");
        reported = true;
      }
      out.poisoned = true;
    }
    return out;
  }

  void recordAccess(uint32_t g, size_t step, const Clock& startClock, size_t cell, bool write,
                    bool& reported) {
    auto& list = accesses_[cell];
    for (const Access& a : list) {
      if (a.lane == g || (!a.write && !write)) continue;
      if (clockAt(startClock, a.lane) > a.step) continue;  // a happens before this step
      if (!reported) {
        const Step& other = laneOf(a.lane).steps[a.step];
        fail(label(g, step) + (write ? " writes " : " reads ") + cellText(cell) + " while " +
                    stepLabel(laneRank_[a.lane], laneLocal_[a.lane], a.step, other.kind) +
                    (a.write ? " writes" : " reads") + " it with nothing ordering the two (add a dep)");
        reported = true;
      }
    }
    list.push_back({g, static_cast<uint32_t>(step), write});
  }

  std::string cellText(size_t cell) const {
    const auto it = std::upper_bound(rankCellBase_.begin(), rankCellBase_.end(), cell);
    const int rank = static_cast<int>(it - rankCellBase_.begin()) - 1;
    const size_t local = cell - rankCellBase_[static_cast<size_t>(rank)];
    const uint32_t inChunks = bufferChunks(plan_, rank, BufferId::Input);
    const uint32_t outChunks = bufferChunks(plan_, rank, BufferId::Output);
    if (local < inChunks) return "input chunk " + std::to_string(local);
    if (local < inChunks + outChunks) return "output chunk " + std::to_string(local - inChunks);
    return "scratch chunk " + std::to_string(local - inChunks - outChunks);
  }

  void execute(uint32_t g) {
    const int rank = laneRank_[g];
    const Lane& lane = laneOf(g);
    const size_t s = pc_[g];
    const Step& step = lane.steps[s];
    const size_t id = stepBase_[g] + s;

    // Happens-before: everything that completed before this step started.
    Clock clock = laneClock_[g];  // the end of the previous step of this lane
    for (const StepRef& dep : step.deps) clockJoin(clock, depClock_.at(stepBase_[globalLane(rank, dep.lane)] + dep.step));

    const bool noOp = isNoOpCopy(rank, step);
    const std::vector<size_t> srcCells = stepReads(step.kind) && !noOp ? cellsOf(rank, step.src) : std::vector<size_t>{};
    const std::vector<size_t> dstCells = stepWrites(step.kind) && !noOp ? cellsOf(rank, step.dst) : std::vector<size_t>{};
    checkLocalOverlap(g, s, step, srcCells, dstCells);

    bool raceReported = false;
    for (size_t cell : srcCells) recordAccess(g, s, clock, cell, false, raceReported);
    if (step.kind == StepKind::Reduce) {
      for (size_t cell : dstCells) recordAccess(g, s, clock, cell, false, raceReported);
    }
    for (size_t cell : dstCells) recordAccess(g, s, clock, cell, true, raceReported);

    std::vector<Value> src(srcCells.size());
    for (size_t i = 0; i < srcCells.size(); ++i) {
      src[i] = readCell(g, s, srcCells[i], step.src, static_cast<uint32_t>(i));
    }

    Clock endClock = clock;
    std::vector<Value> incoming;
    if (stepReceives(step.kind)) {
      Message& message = (*recvQueue_[g])[received_[g]++];
      message.received = true;
      for (size_t cell : message.guarded) --guardCount_[cell];
      incoming = std::move(message.data);  // each message is received once
      clockJoin(endClock, message.clock);
      Clock().swap(message.clock);  // no longer needed
    }
    clockSet(endClock, g, static_cast<uint32_t>(s + 1));

    std::vector<Value> result;  // what lands in dst (or, for rrs, what is sent)
    bool reported = false;
    switch (step.kind) {
      case StepKind::Nop:
      case StepKind::Send: break;
      case StepKind::Recv:
      case StepKind::RecvCopySend: result = std::move(incoming); break;
      case StepKind::RecvReduceSend:
      case StepKind::RecvReduceCopy:
      case StepKind::RecvReduceCopySend:
        for (size_t i = 0; i < incoming.size(); ++i) result.push_back(reduce(g, s, incoming[i], src[i], reported));
        break;
      case StepKind::Copy: result = src; break;
      case StepKind::Reduce:
        for (size_t i = 0; i < dstCells.size(); ++i) {
          const Value old = readCell(g, s, dstCells[i], step.dst, static_cast<uint32_t>(i));
          result.push_back(reduce(g, s, old, src[i], reported));
        }
        break;
    }
    for (size_t i = 0; i < dstCells.size(); ++i) cells_[dstCells[i]] = result[i];  // copies: result may be sent too

    if (stepSends(step.kind)) {
      Message message;
      message.senderLane = g;
      message.senderStep = static_cast<uint32_t>(s);
      message.clock = endClock;
      switch (step.kind) {
        case StepKind::Send:
          message.data = src;
          message.guarded = srcCells;
          break;
        case StepKind::RecvReduceSend: message.data = result; break;  // staged internally
        default:
          message.data = result;
          message.guarded = dstCells;
          break;
      }
      for (size_t cell : message.guarded) ++guardCount_[cell];
      sendQueue_[g]->push_back(std::move(message));
    }
    if (const auto it = depClock_.find(id); it != depClock_.end()) it->second = endClock;
    laneClock_[g] = std::move(endClock);
    ++pc_[g];
  }

  void checkLocalOverlap(uint32_t g, size_t s, const Step& step, const std::vector<size_t>& srcCells,
                         const std::vector<size_t>& dstCells) {
    if (!hasLocalSrcAndDst(step.kind) || srcCells.empty() || srcCells == dstCells) return;
    for (size_t cell : srcCells) {
      if (std::find(dstCells.begin(), dstCells.end(), cell) != dstCells.end()) {
        fail(label(g, s) + ": source " + rangeText(step.src) + " and destination " + rangeText(step.dst) +
                    " overlap shifted" + (inPlace_ ? " (input and output alias in place)" : ""));
        return;
      }
    }
  }

  // ---- end of run ---------------------------------------------------------------------------
  bool reportDeadlock() {
    std::vector<uint32_t> stuck;
    for (uint32_t g = 0; g < laneCount_; ++g) {
      if (pc_[g] < laneOf(g).steps.size()) stuck.push_back(g);
    }
    if (stuck.empty()) return false;
    std::string summary = "deadlock: " + std::to_string(stuck.size()) + " lane" +
                          (stuck.size() == 1 ? "" : "s") + " cannot finish:";
    for (size_t i = 0; i < stuck.size() && i < kMaxStuckLanesReported; ++i) {
      const uint32_t g = stuck[i];
      summary += "\n  " + label(g, pc_[g]) + " " + blocker(g, true);
    }
    if (stuck.size() > kMaxStuckLanesReported) {
      summary += "\n  ... and " + std::to_string(stuck.size() - kMaxStuckLanesReported) + " more";
    }
    fail(summary);
    return true;
  }

  std::vector<uint32_t> expectedSources(int rank, uint32_t outChunk) const {
    const int n = plan_.nranks;
    const uint32_t cpb = plan_.chunksPerBlock;
    const int block = static_cast<int>(outChunk / cpb);
    const uint32_t part = outChunk % cpb;
    const uint32_t ownBlockChunk = static_cast<uint32_t>(rank) * cpb + part;
    std::vector<uint32_t> all;
    auto everyRank = [&](uint32_t chunk) {
      for (int q = 0; q < n; ++q) all.push_back(contribution(q, chunk));
    };
    switch (plan_.collective) {
      case Collective::AllReduce: everyRank(outChunk); break;
      case Collective::Reduce: everyRank(part); break;
      case Collective::ReduceScatter: everyRank(ownBlockChunk); break;
      case Collective::AllGather:
      case Collective::Gather: all.push_back(contribution(block, part)); break;
      case Collective::Broadcast: all.push_back(contribution(plan_.root, part)); break;
      case Collective::AllToAll: all.push_back(contribution(block, ownBlockChunk)); break;
      case Collective::Scatter: all.push_back(contribution(plan_.root, ownBlockChunk)); break;
    }
    std::sort(all.begin(), all.end());
    return all;
  }

  std::string listSources(const std::vector<uint32_t>& ids) const {
    std::string text;
    for (size_t i = 0; i < ids.size() && i < 3; ++i) text += (i ? ", " : "") + contributionText(ids[i]);
    if (ids.size() > 3) text += " and " + std::to_string(ids.size() - 3) + " more";
    return text;
  }

  void checkOutputs() {
    for (int r = 0; r < plan_.nranks; ++r) {
      for (uint32_t k = 0; k < bufferChunks(plan_, r, BufferId::Output); ++k) {
        const Value& v = cells_[cellIndex(r, BufferId::Output, k)];
        if (v.poisoned) continue;
        const std::string where = "rank " + std::to_string(r) + " output chunk " + std::to_string(k);
        if (!v.written) {
          fail(where + " is never written");
          continue;
        }
        const std::vector<uint32_t> want = expectedSources(r, k);
        if (v.sources == want) continue;
        std::vector<uint32_t> missing;
        std::vector<uint32_t> extra;
        std::set_difference(want.begin(), want.end(), v.sources.begin(), v.sources.end(), std::back_inserter(missing));
        std::set_difference(v.sources.begin(), v.sources.end(), want.begin(), want.end(), std::back_inserter(extra));
        std::string text = where + " is wrong for " + collectiveName(plan_.collective) + ":";
        if (!missing.empty()) text += " lacks " + listSources(missing) + ";";
        if (!extra.empty()) text += " holds unwanted " + listSources(extra) + ";";
        text.pop_back();
        fail(text);
      }
    }
  }

  const Plan& plan_;
  const bool inPlace_;
  ErrorSink& errors_;
  const std::string prefix_;

  uint32_t stride_ = 1;                       // contribution id = rank * stride + input chunk
  std::vector<size_t> rankCellBase_;          // first cell of each rank
  std::vector<Value> cells_;
  std::vector<std::vector<Access>> accesses_;  // per cell, for race detection

  std::vector<int> laneRank_;  // global lane id -> rank, local lane index
  std::vector<uint32_t> laneLocal_;
  std::vector<uint32_t> laneBase_;  // rank -> first global lane id
  std::vector<size_t> stepBase_;    // global lane id -> first global step id
  size_t stepCount_ = 0;
  uint32_t laneCount_ = 0;

  std::vector<size_t> pc_;        // next step per lane
  std::vector<uint32_t> received_;  // receives done per lane
  std::vector<Clock> laneClock_;              // per lane, the clock when its last run step completed
  std::map<size_t, Clock> depClock_;         // completion clocks of steps that others depend on
  std::map<ConnectionKey, std::vector<Message>> messages_;
  std::vector<std::vector<Message>*> sendQueue_;  // per lane, its connections' message lists
  std::vector<std::vector<Message>*> recvQueue_;
  std::vector<uint32_t> guardCount_;  // per cell, sends from it not yet received (writes must wait)
};

}  // namespace

std::string ValidationReport::text() const {
  if (errors.empty()) return "ok";
  std::string out;
  for (const auto& e : errors) out += e + "\n";
  if (omittedErrors > 0) out += "... and " + std::to_string(omittedErrors) + " more errors\n";
  out.pop_back();
  return out;
}

ValidationReport validate(const Plan& plan) {
  ValidationReport report;
  ErrorSink errors(report);
  if (!StructureCheck(plan, errors).run()) return report;
  if (plan.outOfPlace) Simulation(plan, false, errors).run();
  if (plan.inPlace) Simulation(plan, true, errors).run();
  return report;
}

void validateOrThrow(const Plan& plan, ncclResult_t code) {
  const ValidationReport report = validate(plan);
  if (!report.ok()) {
    throw Error(code, "plan '" + plan.name + "' for " + collectiveName(plan.collective) + " on " +
                          std::to_string(plan.nranks) + " ranks is invalid:\n" + report.text());
  }
}

}  // namespace topoccl::algo
