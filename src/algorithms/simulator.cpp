#include "algorithms/simulator.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <string>
#include <tuple>

#include "common/error.hpp"

namespace topoccl::algo {
namespace {

bool stepReduces(StepKind k) {
  return k == StepKind::RecvReduceSend || k == StepKind::RecvReduceCopy || k == StepKind::RecvReduceCopySend ||
         k == StepKind::Reduce;
}

// The chunks a step moves: what it reads, else what it writes.
const ChunkRange& stepRange(const Step& step) { return stepReads(step.kind) ? step.src : step.dst; }

std::string where(int rank, int lane, uint32_t step, const Step& s) {
  return "rank " + std::to_string(rank) + " lane " + std::to_string(lane) + " step " + std::to_string(step) + " (" +
         stepKindName(s.kind) + ")";
}

struct Message {
  int src = 0, dst = 0, channel = 0;
  uint16_t lane = 0;
  uint32_t step = 0, slice = 0;
  ChunkRange chunks;
  double bytes = 0;
  double readyUs = 0;
  uint64_t seq = 0;
  double arrivalUs = -1;  // < 0: not started
};

struct Connection {
  int src = 0, dst = 0, channel = 0;
  std::vector<size_t> messages;  // indices into Simulator::messages_, in send order
  size_t nextToStart = 0;
  size_t nextToReceive = 0;
};

struct LaneState {
  uint32_t step = 0;
  uint32_t slice = 0;
  double readyUs = 0;  // when the lane may do its next slice
  bool sending = false;  // its current slice's message has not left yet
  size_t recvConn = SIZE_MAX, sendConn = SIZE_MAX;  // connection indices, looked up once
};

class Simulator {
 public:
  Simulator(const Plan& plan, uint64_t bytes, const CostModel& model, const SimOptions& options)
      : plan_(plan), model_(model), options_(options) {
    chunkBytes_ = blockBytes(plan.collective, plan.nranks, bytes) / std::max<uint32_t>(plan.chunksPerBlock, 1);
    result_.bytes = bytes;
    result_.resources.resize(model.resources().size());
    freeAt_.assign(model.resources().size(), 0.0);
    lanes_.resize(plan.ranks.size());
    finish_.resize(plan.ranks.size());
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      lanes_[r].resize(plan.ranks[r].lanes.size());
      finish_[r].resize(plan.ranks[r].lanes.size());
      for (size_t l = 0; l < plan.ranks[r].lanes.size(); ++l) {
        finish_[r][l].assign(plan.ranks[r].lanes[l].steps.size(), -1.0);
      }
    }
  }

  SimResult run() {
    checkPlan();
    // Event-driven: at each event time only the ranks something happened to are advanced (a slice ended,
    // a message left or arrived); a rank's lanes are retried until none moves (same-rank deps).
    dirty_.assign(lanes_.size(), true);
    double t = 0;
    while (true) {
      now_ = t;
      bool progress = true;
      while (progress) {
        progress = false;
        woke_ = false;
        for (size_t r = 0; r < lanes_.size(); ++r) {
          if (!dirty_[r]) continue;
          bool moved = false;
          for (size_t l = 0; l < lanes_[r].size(); ++l) moved = advanceLane(static_cast<int>(r), l, t) || moved;
          dirty_[r] = moved;  // moved: its other lanes may now go (deps), so look again
          progress = progress || moved;
        }
        if (newMessages_ || !startedAt_ || *startedAt_ != t) {  // resources only get busier within one t
          newMessages_ = false;
          startedAt_ = t;
          progress = startMessages(t) || progress;
        }
        progress = progress || woke_;
      }
      std::fill(dirty_.begin(), dirty_.end(), false);
      while (!times_.empty() && times_.top().first <= t) times_.pop();
      if (times_.empty()) break;
      t = times_.top().first;
      while (!times_.empty() && times_.top().first <= t) {
        dirty_[static_cast<size_t>(times_.top().second)] = true;
        times_.pop();
      }
    }
    reportStuck();
    for (const auto& rank : finish_) {
      for (const auto& lane : rank) {
        for (double f : lane) result_.finishUs = std::max(result_.finishUs, f);
      }
    }
    for (const Message& m : messages_) result_.finishUs = std::max(result_.finishUs, m.arrivalUs);
    if (result_.finishUs > 0) {
      result_.algbwGBs = static_cast<double>(result_.bytes) / (result_.finishUs * 1e3);
      for (ResourceUsage& u : result_.resources) u.utilization = u.busyUs / result_.finishUs;
    }
    result_.busFactor = busBandwidthFactor(plan_.collective, plan_.nranks);
    result_.busbwGBs = result_.algbwGBs * result_.busFactor;
    return std::move(result_);
  }

 private:
  const Plan& plan_;
  const CostModel& model_;
  const SimOptions& options_;
  double chunkBytes_ = 0;
  SimResult result_;
  std::vector<double> freeAt_;
  std::vector<std::vector<LaneState>> lanes_;
  std::vector<std::vector<std::vector<double>>> finish_;  // [rank][lane][step], < 0 until finished
  std::vector<Message> messages_;
  std::vector<Connection> connections_;
  std::map<std::tuple<int, int, int>, size_t> connectionIndex_;
  // (time, rank to advance then); a min-heap.
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>> times_;
  std::vector<bool> dirty_;  // ranks to advance at the current time
  double now_ = 0;
  bool woke_ = false;         // a rank was marked for the current time during a pass
  bool newMessages_ = false;  // a message was queued since startMessages last ran
  std::optional<double> startedAt_;  // when startMessages last ran
  std::vector<size_t> pending_;  // connections with a message not yet started

  uint32_t slicesOf(const Step& step) const {
    return step.kind == StepKind::Nop ? 1 : std::max<uint32_t>(options_.slices, 1);
  }

  void at(double time, int rank) {
    if (time <= now_) {
      if (!dirty_[static_cast<size_t>(rank)]) woke_ = true;
      dirty_[static_cast<size_t>(rank)] = true;
    } else {
      times_.emplace(time, rank);
    }
  }

  size_t connectionId(int src, int dst, int channel) {
    const auto key = std::make_tuple(src, dst, channel);
    auto it = connectionIndex_.find(key);
    if (it == connectionIndex_.end()) {
      it = connectionIndex_.emplace(key, connections_.size()).first;
      connections_.push_back({src, dst, channel, {}, 0, 0});
    }
    return it->second;
  }
  Connection& connection(int src, int dst, int channel) { return connections_[connectionId(src, dst, channel)]; }

  void checkPlan() const {
    const std::string name = "simulate: plan '" + plan_.name + "': ";
    if (plan_.nranks < 1 || static_cast<int>(plan_.ranks.size()) != plan_.nranks) {
      throwInvalidArgument(name + "has " + std::to_string(plan_.ranks.size()) + " rank programs for nranks " +
                           std::to_string(plan_.nranks));
    }
    if (model_.nranks() < plan_.nranks) {
      throwInvalidArgument(name + "needs " + std::to_string(plan_.nranks) + " ranks but the cost model has " +
                           std::to_string(model_.nranks()));
    }
    for (int r = 0; r < plan_.nranks; ++r) {
      const auto& lanes = plan_.ranks[static_cast<size_t>(r)].lanes;
      for (size_t l = 0; l < lanes.size(); ++l) {
        const Lane& lane = lanes[l];
        for (uint32_t s = 0; s < lane.steps.size(); ++s) {
          const Step& step = lane.steps[s];
          const auto bad = [&](const std::string& what) {
            throwInvalidArgument(name + where(r, static_cast<int>(l), s, step) + " " + what);
          };
          if (stepSends(step.kind) && (lane.sendPeer < 0 || lane.sendPeer >= plan_.nranks)) {
            bad("sends, but its lane's send peer " + std::to_string(lane.sendPeer) + " is not a rank");
          }
          if (stepReceives(step.kind) && (lane.recvPeer < 0 || lane.recvPeer >= plan_.nranks)) {
            bad("receives, but its lane's receive peer " + std::to_string(lane.recvPeer) + " is not a rank");
          }
          for (const StepRef& dep : step.deps) {
            if (dep.lane >= lanes.size() || dep.step >= lanes[dep.lane].steps.size()) {
              bad("depends on lane " + std::to_string(dep.lane) + " step " + std::to_string(dep.step) +
                  ", which does not exist");
            }
          }
        }
      }
    }
  }

  bool depsMet(int rank, const Step& step, double t) const {
    for (const StepRef& dep : step.deps) {
      const double f = finish_[static_cast<size_t>(rank)][dep.lane][dep.step];
      if (f < 0 || f > t) return false;
    }
    return true;
  }

  // Runs as many slices of the lane as can go at time t; true if it did anything.
  bool advanceLane(int rank, size_t laneIndex, double t) {
    const Lane& lane = plan_.ranks[static_cast<size_t>(rank)].lanes[laneIndex];
    LaneState& st = lanes_[static_cast<size_t>(rank)][laneIndex];
    bool did = false;
    while (!st.sending && st.step < lane.steps.size() && st.readyUs <= t) {
      const Step& step = lane.steps[st.step];
      if (st.slice == 0 && !depsMet(rank, step, t)) break;
      if (stepReceives(step.kind)) {
        if (st.recvConn == SIZE_MAX) st.recvConn = connectionId(lane.recvPeer, rank, lane.channel);
        Connection& conn = connections_[st.recvConn];
        if (conn.nextToReceive >= conn.messages.size()) break;
        const Message& m = messages_[conn.messages[conn.nextToReceive]];
        if (m.arrivalUs < 0 || m.arrivalUs > t) break;
        ++conn.nextToReceive;
      }
      const uint32_t slices = slicesOf(step);
      const double bytes = step.kind == StepKind::Nop ? 0.0 : stepRange(step).count * chunkBytes_ / slices;
      double compute = 0;
      if (stepReduces(step.kind)) compute += model_.gammaUsPerByte * bytes;
      if (step.kind == StepKind::Copy || step.kind == StepKind::Reduce) {
        compute += model_.localCopyUsPerByte[static_cast<size_t>(rank)] * bytes;
      }
      const double end = t + compute;
      if (stepSends(step.kind)) {
        if (st.sendConn == SIZE_MAX) st.sendConn = connectionId(rank, lane.sendPeer, lane.channel);
        Connection& conn = connections_[st.sendConn];
        Message m;
        m.src = rank;
        m.dst = lane.sendPeer;
        m.channel = lane.channel;
        m.lane = static_cast<uint16_t>(laneIndex);
        m.step = st.step;
        m.slice = st.slice;
        m.chunks = stepRange(step);
        m.bytes = bytes;
        m.readyUs = end;
        m.seq = messages_.size();
        conn.messages.push_back(messages_.size());
        messages_.push_back(m);
        st.sending = true;  // the slice is done once its message has left (startMessages)
        if (conn.nextToStart + 1 == conn.messages.size()) pending_.push_back(st.sendConn);
        newMessages_ = true;
        if (end > t) at(end, rank);
        did = true;
        break;
      }
      did = true;
      finishSlice(rank, laneIndex, end);
      if (end > t) at(end, rank);
    }
    return did;
  }

  void finishSlice(int rank, size_t laneIndex, double end) {
    const Lane& lane = plan_.ranks[static_cast<size_t>(rank)].lanes[laneIndex];
    LaneState& st = lanes_[static_cast<size_t>(rank)][laneIndex];
    st.readyUs = end;
    if (++st.slice == slicesOf(lane.steps[st.step])) {
      finish_[static_cast<size_t>(rank)][laneIndex][st.step] = end;
      ++st.step;
      st.slice = 0;
    }
  }

  // Starts every waiting message whose connection head it is and whose resources are free at t.
  bool startMessages(double t) {
    std::vector<size_t> candidates;
    for (size_t c : pending_) {
      const Connection& conn = connections_[c];
      if (messages_[conn.messages[conn.nextToStart]].readyUs <= t) candidates.push_back(c);
    }
    if (candidates.empty()) return false;
    std::sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
      const Message& ma = messages_[connections_[a].messages[connections_[a].nextToStart]];
      const Message& mb = messages_[connections_[b].messages[connections_[b].nextToStart]];
      return std::tie(ma.readyUs, ma.seq) < std::tie(mb.readyUs, mb.seq);
    });
    bool started = false;
    for (size_t c : candidates) {
      Connection& conn = connections_[c];
      Message& m = messages_[conn.messages[conn.nextToStart]];
      const CostRoute& route = model_.route(m.src, m.dst);
      const bool free = std::all_of(route.resources.begin(), route.resources.end(),
                                    [&](int id) { return freeAt_[static_cast<size_t>(id)] <= t; });
      if (!free) continue;
      const double duration = route.holdUs + m.bytes * route.betaUsPerByte;  // resources busy
      const double end = t + duration;
      for (int id : route.resources) {
        freeAt_[static_cast<size_t>(id)] = end;
        ResourceUsage& usage = result_.resources[static_cast<size_t>(id)];
        usage.busyUs += duration;
        ++usage.messages;
        if (options_.recordEvents) {
          result_.events.push_back({id, m.src, m.dst, m.channel, m.lane, m.step, m.slice, m.chunks, m.bytes, t, end});
        }
      }
      m.arrivalUs = t + route.latencyUs + m.bytes * route.betaUsPerByte;
      ++conn.nextToStart;
      lanes_[static_cast<size_t>(m.src)][m.lane].sending = false;  // the sender's slice is done once it has left
      finishSlice(m.src, m.lane, end);
      ++result_.messages;
      result_.bytesSent += m.bytes;
      at(end, m.src);
      at(m.arrivalUs, m.dst);
      started = true;
    }
    std::erase_if(pending_, [&](size_t c) { return connections_[c].nextToStart == connections_[c].messages.size(); });
    return started;
  }

  // Work left with nothing in flight: name the first blocked step and why.
  void reportStuck() {
    int blocked = 0;
    std::string first;
    for (int r = 0; r < plan_.nranks; ++r) {
      const auto& lanes = plan_.ranks[static_cast<size_t>(r)].lanes;
      for (size_t l = 0; l < lanes.size(); ++l) {
        const LaneState& st = lanes_[static_cast<size_t>(r)][l];
        if (st.step >= lanes[l].steps.size()) continue;
        ++blocked;
        if (!first.empty()) continue;
        const Step& step = lanes[l].steps[st.step];
        first = where(r, static_cast<int>(l), st.step, step);
        if (st.slice > 0) first += " slice " + std::to_string(st.slice);
        std::string why;
        if (st.slice == 0) {
          for (const StepRef& dep : step.deps) {
            if (finish_[static_cast<size_t>(r)][dep.lane][dep.step] < 0) {
              why = "waits for its dependency lane " + std::to_string(dep.lane) + " step " + std::to_string(dep.step);
              break;
            }
          }
        }
        if (why.empty() && stepReceives(step.kind)) {
          const Connection& conn = connection(lanes[l].recvPeer, r, lanes[l].channel);
          why = "waits for data from rank " + std::to_string(lanes[l].recvPeer) + " on channel " +
                std::to_string(lanes[l].channel) + " (message " + std::to_string(conn.nextToReceive + 1) + ", " +
                std::to_string(conn.messages.size()) + " ever sent)";
        }
        first += " " + (why.empty() ? std::string("cannot start") : why);
      }
    }
    if (blocked > 0) {
      throwInvalidArgument("simulate: plan '" + plan_.name + "' deadlocks: " + first + "; " + std::to_string(blocked) +
                           " lane(s) blocked");
    }
    for (const Connection& conn : connections_) {
      if (conn.nextToReceive < conn.messages.size()) {
        const Message& m = messages_[conn.messages[conn.nextToReceive]];
        throwInvalidArgument("simulate: plan '" + plan_.name + "': rank " + std::to_string(conn.src) + " lane " +
                             std::to_string(m.lane) + " step " + std::to_string(m.step) + " sends to rank " +
                             std::to_string(conn.dst) + " on channel " + std::to_string(conn.channel) + " " +
                             std::to_string(conn.messages.size() - conn.nextToReceive) +
                             " message(s) that are never received");
      }
    }
  }
};

}  // namespace

double busBandwidthFactor(Collective c, int nranks) noexcept {
  if (nranks < 1) return 0;
  const double n = nranks;
  switch (c) {
    case Collective::AllReduce: return 2 * (n - 1) / n;
    case Collective::Broadcast:
    case Collective::Reduce: return 1;
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll:
    case Collective::Gather:
    case Collective::Scatter: return (n - 1) / n;
  }
  return 1;
}

double blockBytes(Collective c, int nranks, uint64_t bytes) noexcept {
  const double total = static_cast<double>(bytes);
  switch (c) {
    case Collective::AllReduce:
    case Collective::Broadcast:
    case Collective::Reduce: return total;
    default: return nranks > 0 ? total / nranks : total;
  }
}

SimResult simulate(const Plan& plan, uint64_t bytes, const CostModel& model, const SimOptions& options) {
  if (options.slices < 1) throwInvalidArgument("simulate: slices must be at least 1");
  return Simulator(plan, bytes, model, options).run();
}

}  // namespace topoccl::algo
