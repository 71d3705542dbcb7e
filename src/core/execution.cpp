#include "core/execution.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <sstream>

#include "common/error.hpp"
#include "kernels/host_copy.hpp"

namespace topoccl::core {

using algo::StepKind;

Execution::Execution(std::string operation, std::vector<ResolvedLane> lanes, kernels::ReduceFn reduce,
                     size_t elementSize, size_t sliceBytes, HostArena* stagingArena, size_t slicesPerStep)
    : operation_(std::move(operation)),
      lanes_(std::move(lanes)),
      states_(lanes_.size()),
      reduce_(reduce),
      elementSize_(elementSize == 0 ? 1 : elementSize) {
  // Slices hold whole elements so a slice can be reduced on its own.
  sliceBytes_ = std::max(elementSize_, sliceBytes / elementSize_ * elementSize_);
  slicesPerStep_ = std::max<size_t>(1, slicesPerStep);
  arena_ = stagingArena ? stagingArena : &ownStaging_;
  stagingOf_.resize(lanes_.size());
  bounce_.resize(lanes_.size());
  mirroredBytes_.resize(lanes_.size());
  bool resultMirrors = false;
  for (size_t l = 0; l < lanes_.size(); ++l) {
    stagingOf_[l].assign(lanes_[l].steps.size(), nullptr);
    mirroredBytes_[l].assign(lanes_[l].steps.size(), 0);
    for (ResolvedStep& step : lanes_[l].steps) {
      step.sliceBytes = sliceBytesFor(step.bytes);
      step.slices = step.bytes == 0 ? 0 : (step.bytes + step.sliceBytes - 1) / step.sliceBytes;
      hasStaging_ |= step.kind == StepKind::RecvReduceSend;
      hasMirrors_ |= step.mirror != nullptr;
      resultMirrors |= step.resultMirror != nullptr || step.returnsResult;
    }
  }
  placeStaging();
  if (resultMirrors) {
    mirroredSendTickets_.resize(lanes_.size());
    resultWrittenBack_.resize(lanes_.size());
    for (size_t l = 0; l < lanes_.size(); ++l) {
      mirroredSendTickets_[l].resize(lanes_[l].steps.size());
      resultWrittenBack_[l].resize(lanes_[l].steps.size());
      for (size_t s = 0; s < lanes_[l].steps.size(); ++s) {
        const ResolvedStep& step = lanes_[l].steps[s];
        if (step.resultMirror != nullptr) mirroredSendTickets_[l][s].assign(step.slices, 0);
        if (step.returnsResult) resultWrittenBack_[l][s].assign(step.slices, 0);
      }
    }
  }
  for (const auto& lane : lanes_)
    for (auto* conn : {lane.sendConn, lane.recvConn})
      if (conn && std::find(connections_.begin(), connections_.end(), conn) == connections_.end())
        connections_.push_back(conn);
  // Each lane's connections as bits of unflushed_ (none past kTrackedConnections: flushPosted then takes them all).
  const auto bitOf = [&](const transport::Connection* conn) -> uint64_t {
    const auto at = static_cast<size_t>(std::find(connections_.begin(), connections_.end(), conn) - connections_.begin());
    return conn == nullptr || at >= kTrackedConnections ? 0 : uint64_t{1} << at;
  };
  for (size_t l = 0; l < lanes_.size(); ++l) {
    states_[l].sendBit = bitOf(lanes_[l].sendConn);
    states_[l].recvBit = bitOf(lanes_[l].recvConn);
  }
}

void Execution::placeStaging() {
  size_t stagingBytes = 0;
  for (const auto& lane : lanes_)
    for (const auto& step : lane.steps)
      if (step.kind == StepKind::RecvReduceSend) stagingBytes += step.bytes;
  char* next = stagingBytes == 0 ? nullptr : arena_->reserve(stagingBytes);
  for (size_t l = 0; l < lanes_.size(); ++l)
    for (size_t s = 0; s < lanes_[l].steps.size(); ++s)
      if (lanes_[l].steps[s].kind == StepKind::RecvReduceSend) {
        stagingOf_[l][s] = next;
        next += lanes_[l].steps[s].bytes;
      }
}

void Execution::reset() {
  for (LaneState& state : states_) {
    state.step = 0;
    state.stepStarted = false;
    state.slices = state.slicesPosted = state.slicesDone = 0;
    state.bounced = {};
  }
  if (hasMirrors_)
    for (auto& bytes : mirroredBytes_) std::fill(bytes.begin(), bytes.end(), 0);
  inFlight_.clear();
  unflushed_ = 0;
  copiedOutInFlight_ = false;
  moved_ = finished_ = posted_ = traceStarted_ = false;
  if (hasStaging_) placeStaging();  // another execution may have grown the shared arena
}

size_t Execution::sliceLength(const LaneState& state, const ResolvedStep& step, size_t slice) const {
  const size_t begin = slice * state.sliceBytes;
  return std::min(state.sliceBytes, step.bytes - begin);
}

// A step is cut into at least slicesPerStep_ slices (so that sends, peer reads and reductions overlap)
// of at most sliceBytes_, but none smaller than kMinSliceBytes. Both ends of a transfer see the same step
// size, so they cut it alike.
size_t Execution::sliceBytesFor(size_t stepBytes) const {
  const size_t floor = std::min(kMinSliceBytes, sliceBytes_);
  if (stepBytes <= floor) return std::max(elementSize_, floor / elementSize_ * elementSize_);  // one slice; no divisions
  size_t slice = std::clamp(stepBytes / slicesPerStep_ / 4096 * 4096, floor, sliceBytes_);
  return std::max(elementSize_, slice / elementSize_ * elementSize_);
}

bool Execution::depsSatisfied(const ResolvedStep& step) const {
  for (const auto& dep : step.deps)
    if (states_[dep.lane].step <= dep.step) return false;
  return true;
}

bool Execution::readByPendingSend(const char* begin, const char* end) {
  bool hazard = false;
  std::erase_if(inFlight_, [&](const InFlightSend& s) {
    if (s.conn->sendsCompleted() >= s.ticket) return true;
    if (s.begin < end && begin < s.end) hazard = true;
    return false;
  });
  return hazard;
}

void Execution::postSend(const LaneState& state, transport::Connection* conn, const char* data, size_t bytes, char* mirror,
                         SendRoute route) {
  conn->setPeerCopy(copy_);
  const transport::Ticket ticket = mirror                          ? conn->postSendMirrored(data, mirror, bytes)
                                   : route == SendRoute::CopyOut   ? conn->postSendCopyOut(data, bytes)
                                   : route == SendRoute::ReadEarly ? conn->postSendReadEarly(data, bytes)
                                                                   : conn->postSend(data, bytes);
  inFlight_.push_back({conn, ticket, data, data + bytes});
  copiedOutInFlight_ |= route == SendRoute::CopyOut && mirror == nullptr;
  unflushed_ |= state.sendBit;
  sendsToFlush_ = posted_ = true;
  ++posts_;
}

// The Send steps of result mirrors. One whose peer may write its result back (resultMirror): each slice goes that
// way where the connection can, its ticket noted for the Recv that then skips it. The peer's send of that result
// (sendsResultOf): each slice the reduce already wrote into the peer's memory is skipped.
void Execution::postSendSlices(size_t laneIndex, const ResolvedStep& step) {
  const LaneState& state = states_[laneIndex];
  transport::Connection* conn = lanes_[laneIndex].sendConn;
  std::vector<transport::Ticket>* tickets = step.resultMirror ? &mirroredSendTickets_[laneIndex][state.step] : nullptr;
  const std::vector<uint8_t>* written = step.sendsResultOf ? &resultWrittenBack_[step.sendsResultOf->lane][step.sendsResultOf->step] : nullptr;
  for (size_t slice = 0; slice < state.slices; ++slice) {
    const char* data = step.src + slice * state.sliceBytes;
    const size_t length = sliceLength(state, step, slice);
    if (written != nullptr && (*written)[slice] != 0) {
      ++slicesWrittenToPeer_;
      continue;
    }
    if (tickets != nullptr) {
      transport::Ticket ticket = 0;
      conn->setPeerCopy(copy_);
      if (conn->postSendResultMirrored(data, step.resultMirror + slice * state.sliceBytes, length, ticket)) {
        (*tickets)[slice] = ticket;
        inFlight_.push_back({conn, ticket, data, data + length});
        unflushed_ |= state.sendBit;
        sendsToFlush_ = posted_ = true;
        ++posts_;
        continue;
      }
      (*tickets)[slice] = 0;
    }
    postSend(state, conn, data, length, nullptr, step.route);
  }
}

void Execution::flushPosted() {
  if (connections_.size() > kTrackedConnections) {
    for (auto* conn : connections_) conn->progress();
  } else {
    for (uint64_t bits = unflushed_; bits != 0; bits &= bits - 1) connections_[static_cast<size_t>(std::countr_zero(bits))]->progress();
  }
  unflushed_ = 0;
}

void Execution::startStep(size_t laneIndex) {
  LaneState& state = states_[laneIndex];
  const ResolvedStep& step = lanes_[laneIndex].steps[state.step];
  state.stepStarted = true;
  if (trace_) state.stepStart = state.firstSliceAt = std::chrono::steady_clock::now();
  state.sliceBytes = step.sliceBytes;
  state.slices = step.slices;
  state.slicesPosted = 0;
  state.slicesDone = 0;
}

void Execution::finishStep(size_t laneIndex) {
  LaneState& state = states_[laneIndex];
  if (trace_) {
    const ResolvedLane& lane = lanes_[laneIndex];
    const ResolvedStep& step = lane.steps[state.step];
    trace_->stepDone(traceCall_, static_cast<uint32_t>(laneIndex), static_cast<uint32_t>(state.step), step.kind, step.bytes,
                     lane.sendConn ? lane.sendConn->peer() : -1, lane.recvConn ? lane.recvConn->peer() : -1, state.stepStart,
                     state.firstSliceAt);
  }
  ++state.step;
  state.stepStarted = false;
  moved_ = true;
}

// Posts receives up to the window and forwards each completed slice. Returns true when the step's
// receives are all done.
bool Execution::pumpReceives(size_t laneIndex) {
  LaneState& state = states_[laneIndex];
  ResolvedLane& lane = lanes_[laneIndex];
  const ResolvedStep& step = lane.steps[state.step];
  const bool forwards = algo::stepSends(step.kind);
  const size_t postedBefore = state.slicesPosted;

  while (state.slicesPosted < state.slices && state.slicesPosted - state.slicesDone < kWindow) {
    const size_t offset = state.slicesPosted * state.sliceBytes;
    const size_t length = sliceLength(state, step, state.slicesPosted);
    const size_t slot = state.slicesPosted % kWindow;
    state.bounced[slot] = false;
    state.mirrorTickets[slot] = 0;
    if (step.mirroredBy) {
      // The peer writes this slice into our memory as it reduces what we sent it: nothing comes on the connection.
      const transport::Ticket sent = mirroredSendTickets_[step.mirroredBy->lane][step.mirroredBy->step][state.slicesPosted];
      if (sent != 0) {
        state.mirrorTickets[slot] = sent;
        ++slicesWrittenByPeer_;
        ++state.slicesPosted;
        moved_ = true;
        continue;
      }
    }
    transport::RecvAction action;
    action.elementSize = elementSize_;
    action.copy = step.intoSentBytes ? sentBytesCopy_ : copy_;
    if (step.returnsResult) {
      uint8_t& written = resultWrittenBack_[laneIndex][state.step][state.slicesPosted];
      written = 0;
      action.resultMirrored = &written;
    }
    if (step.kind == StepKind::RecvReduceSend) {
      action.dst = stagingOf_[laneIndex][state.step] + offset;
    } else {
      action.dst = step.dst + offset;
      bool hazard = writeHazard(step.dst + offset, step.dst + offset + length);
      if (hazard && copiedOutInFlight_) {
        // A copied-out send completes once its connection has copied it into the FIFO: let it, then look again.
        flushPosted();
        copiedOutInFlight_ = false;
        hazard = writeHazard(step.dst + offset, step.dst + offset + length);
      }
      if (hazard) {
        if (state.sliceBytes > kMaxBounceSliceBytes || step.waitsOutOwnSends) break;  // wait for the send instead
        std::vector<char>& bounce = bounce_[laneIndex];
        // Grows only at a step's first bounce: no slice of this step is in a slot yet, and earlier steps are done.
        if (bounce.size() < kWindow * state.sliceBytes) bounce.resize(kWindow * state.sliceBytes);
        action.dst = bounce.data() + slot * state.sliceBytes;
        action.copy = nullptr;  // into a slot that stays in cache
        state.bounced[slot] = true;
        ++bouncedSlices_;
      }
    }
    if (step.kind == StepKind::RecvReduceSend || step.kind == StepKind::RecvReduceCopy ||
        step.kind == StepKind::RecvReduceCopySend) {
      action.operand = step.src + offset;
      action.reduce = reduce_;
    }
    state.recvTickets[state.slicesPosted % kWindow] = lane.recvConn->postRecv(action, length);
    unflushed_ |= state.recvBit;
    ++state.slicesPosted;
    moved_ = posted_ = true;
    ++posts_;
  }
  // A one-slice step (a small message) just posted: hand it to the transport now, so a message already there
  // completes in this walk of the lanes rather than in a second one.
  if (state.slices == 1 && postedBefore == 0 && state.slicesPosted == 1) {
    lane.recvConn->progress();
    unflushed_ &= ~state.recvBit;  // that connection took our sends to its peer too
  }

  transport::Connection* mirrorConn = step.mirroredBy ? lanes_[step.mirroredBy->lane].sendConn : nullptr;
  while (state.slicesDone < state.slicesPosted) {
    const size_t slot = state.slicesDone % kWindow;
    if (mirrorConn != nullptr && state.mirrorTickets[slot] != 0) {
      if (mirrorConn->sendsCompleted() < state.mirrorTickets[slot]) break;  // the peer is still writing it
    } else if (lane.recvConn->recvsCompleted() < state.recvTickets[slot]) {
      break;
    }
    const size_t slice = state.slicesDone;
    const size_t length = sliceLength(state, step, slice);
    if (state.bounced[slice % kWindow]) {
      char* dst = step.dst + slice * state.sliceBytes;
      if (writeHazard(dst, dst + length)) break;  // our send still reads it; the slice waits in its slot
      const char* from = bounce_[laneIndex].data() + (slice % kWindow) * state.sliceBytes;
      if (sentBytesCopy_) sentBytesCopy_(dst, from, length);
      else std::memcpy(dst, from, length);
      state.bounced[slice % kWindow] = false;
    }
    // A result the transport already wrote into the sender's memory (a result mirror) is not forwarded back to it.
    if (forwards && step.sendsResultOf && resultWrittenBack_[laneIndex][state.step][slice] != 0) {
      ++slicesWrittenToPeer_;
    } else if (forwards) {
      const char* base = step.kind == StepKind::RecvReduceSend ? stagingOf_[laneIndex][state.step] : step.dst;
      postSend(state, lane.sendConn, base + slice * state.sliceBytes, length, nullptr, step.route);
    }
    if (trace_ && state.slicesDone == 0) state.firstSliceAt = std::chrono::steady_clock::now();
    ++state.slicesDone;
    moved_ = true;
  }
  return state.slicesDone == state.slices;
}

bool Execution::advanceLane(size_t laneIndex) {
  LaneState& state = states_[laneIndex];
  ResolvedLane& lane = lanes_[laneIndex];
  while (state.step < lane.steps.size()) {
    const ResolvedStep& step = lane.steps[state.step];
    if (!state.stepStarted) {
      if (!depsSatisfied(step)) return false;
      startStep(laneIndex);
    }
    switch (step.kind) {
      case StepKind::Nop: break;
      case StepKind::Send: {
        if (step.resultMirror != nullptr || step.sendsResultOf) {
          postSendSlices(laneIndex, step);
          break;
        }
        // Mirrored: every slice, or all but a last one too short to go zero copy (a prime count's tail).
        size_t mirroredSlices = 0;
        if (step.mirror != nullptr && state.slices > 0) {
          const size_t last = sliceLength(state, step, state.slices - 1);
          if (lane.sendConn->canMirror(step.src, step.mirror, step.bytes, std::min(state.sliceBytes, last)))
            mirroredSlices = state.slices;
          else if (state.slices > 1 && lane.sendConn->canMirror(step.src, step.mirror, step.bytes - last, state.sliceBytes))
            mirroredSlices = state.slices - 1;
          mirroredBytes_[laneIndex][step.mirrorCopyStep] = std::min(step.bytes, mirroredSlices * state.sliceBytes);
        }
        for (size_t slice = 0; slice < state.slices; ++slice)
          postSend(state, lane.sendConn, step.src + slice * state.sliceBytes, sliceLength(state, step, slice),
                   slice < mirroredSlices ? step.mirror + slice * state.sliceBytes : nullptr, step.route);
        break;
      }
      case StepKind::Copy:
        if (const size_t mirrored = mirroredBytes_[laneIndex][state.step]; mirrored > 0) {
          // The peer writes the mirrored part (our send completes after it has); the rest is ours.
          if (mirrored < step.bytes) {
            if (writeHazard(step.dst + mirrored, step.dst + step.bytes)) return false;
            if (copy_) copy_(step.dst + mirrored, step.src + mirrored, step.bytes - mirrored);
            else std::memcpy(step.dst + mirrored, step.src + mirrored, step.bytes - mirrored);
          }
          break;
        }
        if (step.bytes > 0 && step.src != step.dst) {
          if (writeHazard(step.dst, step.dst + step.bytes)) return false;
          const bool disjoint = step.dst + step.bytes <= step.src || step.src + step.bytes <= step.dst;
          if (copy_ && disjoint) copy_(step.dst, step.src, step.bytes);
          else std::memmove(step.dst, step.src, step.bytes);
        }
        break;
      case StepKind::Reduce:
        if (step.bytes > 0) {
          if (writeHazard(step.dst, step.dst + step.bytes)) return false;
          reduce_(step.dst, step.dst, step.src, step.bytes / elementSize_);
        }
        break;
      default:
        if (!pumpReceives(laneIndex)) return false;
        break;
    }
    finishStep(laneIndex);
  }
  return true;
}

bool Execution::progress() {
  if (finished_) return true;
  moved_ = false;
  if (trace_ && !traceStarted_) {
    traceCall_ = trace_->callBegin(operation_);
    traceStarted_ = true;
  }
  size_t lane = lanes_.size();  // which lane was advancing, for the error context
  try {
    // Until this run posts something, the connections hold nothing of it (the run before finished every send
    // and receive it posted), so the first pass of a call goes straight to the lanes.
    if (posted_)
      for (auto* conn : connections_) conn->progress();
    unflushed_ = 0;
    sendsToFlush_ = false;
    bool allLanesDone = false;
    // A second pass when the first posted something: the transports take it right away, and a receive whose data
    // is already there (a peer ahead of us) completes in this call instead of the engine's next loop.
    for (int pass = 0; pass < 2; ++pass) {
      const uint64_t postsBefore = posts_;
      allLanesDone = true;
      for (lane = 0; lane < lanes_.size(); ++lane) {
        if (!advanceLane(lane)) allLanesDone = false;
        // Hand new sends to the transports before a later lane's local copy or reduce keeps this thread busy: a
        // zero-copy peer can read them meanwhile. Only the connections posted to: every connection after every lane
        // was half the transport calls of a 4-rank all-to-all (perf/RESULTS.md, session 35).
        if (sendsToFlush_ && lane + 1 < lanes_.size()) {
          sendsToFlush_ = false;
          flushPosted();
        }
      }
      lane = lanes_.size();
      if (allLanesDone || posts_ == postsBefore || pass == 1) break;
      sendsToFlush_ = false;
      unflushed_ = 0;
      for (auto* conn : connections_) conn->progress();
    }
    if (!allLanesDone) return false;
    // Receives are complete once their lanes are; only sends may still be with the transports, and only the
    // connections that hold one need progress.
    transport::Connection* progressed = nullptr;
    for (const InFlightSend& send : inFlight_)
      if (send.conn != progressed && send.conn->sendsCompleted() < send.ticket) {
        progressed = send.conn;
        send.conn->progress();
      }
    sendsToFlush_ = false;
  } catch (const Error& e) {
    const std::string where = lane < lanes_.size() ? lanes_[lane].label + ": " : std::string();
    throw Error(e.code(), operation_ + ": " + where + e.what());
  }
  writeHazard(nullptr, nullptr);  // drops completed sends
  if (!inFlight_.empty()) return false;
  finished_ = true;
  moved_ = true;
  if (trace_) trace_->callDone(traceCall_);
  return true;
}

std::string Execution::describeWaiting() const {
  std::ostringstream out;
  for (size_t i = 0; i < lanes_.size(); ++i) {
    const LaneState& state = states_[i];
    const ResolvedLane& lane = lanes_[i];
    if (state.step >= lane.steps.size()) continue;
    const ResolvedStep& step = lane.steps[state.step];
    out << "\n  " << lane.label << " step " << state.step << " (" << algo::stepKindName(step.kind) << ", "
        << step.bytes << " bytes)";
    if (!state.stepStarted) {
      out << " waits for its dependencies";
    } else if (step.mirroredBy && state.slicesDone < state.slicesPosted && state.mirrorTickets[state.slicesDone % kWindow] != 0) {
      out << " waits for the peer to write its sum into our memory (a result mirror), read over "
          << lanes_[step.mirroredBy->lane].sendConn->describe() << " (" << state.slicesDone << "/" << state.slices
          << " slices written)";
    } else if (algo::stepReceives(step.kind) && lane.recvConn) {
      out << " waits for data from " << lane.recvConn->describe() << " (" << state.slicesDone << "/"
          << state.slices << " slices received)";
      if (const std::string stall = lane.recvConn->describeStall(); !stall.empty()) out << "; " << stall;
    }
  }
  if (!inFlight_.empty()) out << "\n  " << inFlight_.size() << " sends not yet delivered";
  return out.str();
}

namespace {

bool overlaps(const char* a, size_t an, const char* b, size_t bn) { return an > 0 && bn > 0 && a < b + bn && b < a + an; }

// Whether any step of any lane satisfies `matches`.
template <class Predicate>
bool anyStep(const std::vector<ResolvedLane>& lanes, Predicate matches) {
  for (const ResolvedLane& lane : lanes)
    for (const ResolvedStep& s : lane.steps)
      if (matches(s)) return true;
  return false;
}

}  // namespace

size_t fuseStagedReceives(std::vector<ResolvedLane>& lanes, const char* scratch, size_t scratchBytes, size_t maxSliceBytes) {
  if (scratch == nullptr || scratchBytes == 0 || maxSliceBytes > Execution::kMaxBounceSliceBytes) return 0;
  // Whether any step other than lane l's steps i and i + 1 reads or writes [begin, begin + bytes).
  const auto touchedElsewhere = [&](const char* begin, size_t bytes, size_t l, size_t i) {
    for (size_t l2 = 0; l2 < lanes.size(); ++l2)
      for (size_t j = 0; j < lanes[l2].steps.size(); ++j) {
        if (l2 == l && (j == i || j == i + 1)) continue;
        const ResolvedStep& s = lanes[l2].steps[j];
        if (algo::stepReads(s.kind) && overlaps(s.src, s.bytes, begin, bytes)) return true;
        if (algo::stepWrites(s.kind) && overlaps(s.dst, s.bytes, begin, bytes)) return true;
      }
    return false;
  };
  const auto sentElsewhere = [&](const char* begin, size_t bytes) {
    return anyStep(lanes, [&](const ResolvedStep& s) {
      return algo::stepSends(s.kind) && algo::stepReads(s.kind) && overlaps(s.src, s.bytes, begin, bytes);
    });
  };
  size_t fused = 0;
  for (size_t l = 0; l < lanes.size(); ++l) {
    auto& steps = lanes[l].steps;
    for (size_t i = 0; i + 1 < steps.size(); ++i) {
      ResolvedStep& recv = steps[i];
      ResolvedStep& copy = steps[i + 1];
      const bool reduces = recv.kind == StepKind::RecvReduceCopy;
      if ((recv.kind != StepKind::Recv && !reduces) || copy.kind != StepKind::Copy || !copy.deps.empty() || recv.bytes == 0 ||
          copy.bytes != recv.bytes || copy.src != recv.dst)
        continue;
      const bool inScratch = recv.dst >= scratch && recv.dst + recv.bytes <= scratch + scratchBytes;
      if (!inScratch || overlaps(copy.dst, copy.bytes, recv.dst, recv.bytes) || touchedElsewhere(recv.dst, recv.bytes, l, i))
        continue;
      // A reduction reads its operand slice by slice: writing the result over the operand is safe only element for
      // element (the same bytes), never shifted onto operand bytes a later slice still reads.
      if (reduces && recv.src != copy.dst && overlaps(recv.src, recv.bytes, copy.dst, copy.bytes)) continue;
      recv.dst = copy.dst;
      recv.intoSentBytes = sentElsewhere(recv.dst, recv.bytes);
      copy.kind = StepKind::Nop;  // keeps the step numbers other lanes' dependencies use
      copy.src = nullptr;
      copy.dst = nullptr;
      copy.bytes = 0;
      ++fused;
    }
  }
  return fused;
}

size_t fuseMirroredCopies(std::vector<ResolvedLane>& lanes) {
  // Whether a step other than lane l's step `except` reads (when `reads`) or writes [begin, begin + bytes).
  const auto touched = [&](const char* begin, size_t bytes, size_t l, size_t except, bool reads) {
    for (size_t l2 = 0; l2 < lanes.size(); ++l2)
      for (size_t j = 0; j < lanes[l2].steps.size(); ++j) {
        if (l2 == l && j == except) continue;
        const ResolvedStep& s = lanes[l2].steps[j];
        if (reads && algo::stepReads(s.kind) && overlaps(s.src, s.bytes, begin, bytes)) return true;
        if (algo::stepWrites(s.kind) && overlaps(s.dst, s.bytes, begin, bytes)) return true;
      }
    return false;
  };
  size_t fused = 0;
  for (size_t l = 0; l < lanes.size(); ++l) {
    auto& steps = lanes[l].steps;
    std::vector<bool> claimed(steps.size(), false);  // a Copy is mirrored by one send at most
    for (size_t i = 0; i < steps.size(); ++i) {
      ResolvedStep& send = steps[i];
      if (send.kind != StepKind::Send || send.bytes == 0 || send.mirror != nullptr) continue;
      for (size_t j = i + 1; j < steps.size(); ++j) {
        const ResolvedStep& copy = steps[j];
        if (copy.kind != StepKind::Copy || claimed[j] || copy.src != send.src || copy.bytes != send.bytes || !copy.deps.empty() ||
            overlaps(copy.dst, copy.bytes, send.src, send.bytes))
          continue;
        if (touched(copy.dst, copy.bytes, l, j, true) || touched(send.src, send.bytes, l, j, false)) break;
        send.mirror = copy.dst;
        send.mirrorCopyStep = j;
        claimed[j] = true;
        ++fused;
        break;
      }
    }
  }
  return fused;
}

namespace {

// Whether step `i` of lane `a` has finished before step `j` of lane `b` starts: it comes earlier in the same lane, or
// a step of lane b up to j waits for it or for a later step of lane a. Direct dependencies only: an order the plan
// does not state counts as concurrent.
bool finishesBefore(const std::vector<ResolvedLane>& lanes, size_t a, size_t i, size_t b, size_t j) {
  if (a == b) return i < j;
  for (size_t k = 0; k <= j; ++k)
    for (const algo::StepRef& dep : lanes[b].steps[k].deps)
      if (dep.lane == a && dep.step >= i) return true;
  return false;
}

}  // namespace

size_t linkResultMirrors(std::vector<ResolvedLane>& lanes) {
  const auto find = [&](const algo::StepRef& ref) -> ResolvedStep* {
    if (ref.lane >= lanes.size() || ref.step >= lanes[ref.lane].steps.size()) return nullptr;
    return &lanes[ref.lane].steps[ref.step];
  };
  const auto samePeer = [](const transport::Connection* a, const transport::Connection* b) {
    return a != nullptr && b != nullptr && a->peer() == b->peer();
  };
  size_t linked = 0;
  for (size_t l = 0; l < lanes.size(); ++l)
    for (size_t i = 0; i < lanes[l].steps.size(); ++i) {
      ResolvedStep& send = lanes[l].steps[i];
      if (send.resultReturnsIn) {
        const algo::StepRef at = *send.resultReturnsIn;
        ResolvedStep* recv = find(at);
        // The Recv reads which slices the peer wrote back as this send posts them: it must start after.
        const bool fits = send.kind == StepKind::Send && send.bytes > 0 && send.mirror == nullptr && recv != nullptr &&
                          recv->kind == StepKind::Recv && recv->bytes == send.bytes && !recv->mirroredBy &&
                          (recv->dst == send.src || !overlaps(recv->dst, recv->bytes, send.src, send.bytes)) &&
                          samePeer(lanes[l].sendConn, lanes[at.lane].recvConn) && finishesBefore(lanes, l, i, at.lane, at.step);
        if (fits) {
          send.resultMirror = recv->dst;
          recv->mirroredBy = algo::StepRef{static_cast<uint16_t>(l), static_cast<uint32_t>(i)};
          ++linked;
        } else {
          send.resultReturnsIn.reset();
        }
      }
      if (send.sendsResultOf) {
        const algo::StepRef at = *send.sendsResultOf;
        ResolvedStep* reduce = find(at);
        // A Send reads which slices the reduce wrote back: it must start once the reduce is done. A receive that
        // forwards its own result (rrcs) reads each slice's as it completes.
        const bool itself = at.lane == l && at.step == i;
        const bool fits = send.bytes > 0 && reduce != nullptr &&
                          (itself ? send.kind == StepKind::RecvReduceCopySend
                                  : send.kind == StepKind::Send && (reduce->kind == StepKind::RecvReduceCopy || reduce->kind == StepKind::Recv) &&
                                        reduce->bytes == send.bytes && reduce->dst == send.src &&
                                        finishesBefore(lanes, at.lane, at.step, l, i)) &&
                          samePeer(lanes[l].sendConn, lanes[at.lane].recvConn);
        if (fits) {
          reduce->returnsResult = true;
          ++linked;
        } else {
          send.sendsResultOf.reset();
        }
      }
    }
  return linked;
}

size_t markSendRoutes(std::vector<ResolvedLane>& lanes, const SendRule& rule) {
  // Whether a step of the rank (a receive, or with `localWrites` any) writes [begin, begin + bytes) and may still run
  // once step j of lane b starts.
  const auto overwrittenInFlight = [&](size_t b, size_t j, const char* begin, size_t bytes, bool localWrites) {
    for (size_t a = 0; a < lanes.size(); ++a)
      for (size_t i = 0; i < lanes[a].steps.size(); ++i) {
        const ResolvedStep& s = lanes[a].steps[i];
        const bool inPlaceNoop = s.kind == StepKind::Copy && s.src == s.dst;  // skipped when run
        if ((a != b || i != j) && (localWrites || algo::stepReceives(s.kind)) && algo::stepWrites(s.kind) && !inPlaceNoop &&
            overlaps(s.dst, s.bytes, begin, bytes) && !finishesBefore(lanes, a, i, b, j))
          return true;
      }
    return false;
  };
  // Whether the rank has a receive other than step j of lane b that may still run once that step starts.
  const auto receivesRemain = [&](size_t b, size_t j) {
    for (size_t a = 0; a < lanes.size(); ++a)
      for (size_t i = 0; i < lanes[a].steps.size(); ++i)
        if ((a != b || i != j) && algo::stepReceives(lanes[a].steps[i].kind) && !finishesBefore(lanes, a, i, b, j))
          return true;
    return false;
  };
  size_t routed = 0;
  for (size_t b = 0; b < lanes.size(); ++b)
    for (size_t j = 0; j < lanes[b].steps.size(); ++j) {
      ResolvedStep& step = lanes[b].steps[j];
      step.route = SendRoute::Plain;
      if (!algo::stepSends(step.kind) || step.mirror != nullptr || step.bytes == 0) continue;
      if (step.kind == StepKind::Send && overwrittenInFlight(b, j, step.src, step.bytes, false)) {
        if (step.bytes <= rule.overwrittenUpTo) step.route = SendRoute::CopyOut;
      } else if (step.bytes < rule.readEarlyBelow && receivesRemain(b, j)) {
        // Read in place, bytes a later step writes (a receive, or an in-place all-to-all's copy out of its scratch)
        // would hold that step until the peer has read them: never read them early.
        const char* read = step.kind == StepKind::Send ? step.src : step.dst;
        if (!overwrittenInFlight(b, j, read, step.bytes, true)) step.route = SendRoute::ReadEarly;
      }
      routed += step.route != SendRoute::Plain;
    }
  return routed;
}

bool Execution::helpPeers() {
  bool helped = false;
  for (transport::Connection* conn : connections_) helped |= conn->helpPeer();
  return helped;
}

bool Execution::armDoorbells(std::vector<transport::ArmedDoorbell>& armed) {
  for (transport::Connection* conn : connections_)
    if (!conn->armDoorbells(armed)) return false;
  return true;
}

bool Execution::addPollDescriptors(std::vector<pollfd>& fds) const {
  for (const transport::Connection* conn : connections_)
    if (!conn->addPollDescriptors(fds)) return false;
  return true;
}

}  // namespace topoccl::core
