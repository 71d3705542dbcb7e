#include "core/device_lowering.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <set>
#include <utility>
#include <string>

#include "common/error.hpp"
#include "kernels/plan_interpreter.hpp"

namespace topoccl::core {
namespace {

using algo::StepKind;
using kernels::DeviceStepKind;

static_assert(static_cast<int>(DeviceStepKind::Nop) == static_cast<int>(StepKind::Nop) &&
                  static_cast<int>(DeviceStepKind::Send) == static_cast<int>(StepKind::Send) &&
                  static_cast<int>(DeviceStepKind::Recv) == static_cast<int>(StepKind::Recv) &&
                  static_cast<int>(DeviceStepKind::RecvReduceSend) == static_cast<int>(StepKind::RecvReduceSend) &&
                  static_cast<int>(DeviceStepKind::RecvReduceCopy) == static_cast<int>(StepKind::RecvReduceCopy) &&
                  static_cast<int>(DeviceStepKind::RecvCopySend) == static_cast<int>(StepKind::RecvCopySend) &&
                  static_cast<int>(DeviceStepKind::RecvReduceCopySend) == static_cast<int>(StepKind::RecvReduceCopySend) &&
                  static_cast<int>(DeviceStepKind::Copy) == static_cast<int>(StepKind::Copy) &&
                  static_cast<int>(DeviceStepKind::Reduce) == static_cast<int>(StepKind::Reduce),
              "DeviceStepKind must number the step kinds as algo::StepKind does");

constexpr size_t kImageAlign = 16;
size_t alignUp(size_t n) { return (n + kImageAlign - 1) / kImageAlign * kImageAlign; }

struct ImageLayout {
  size_t lanes, steps, deps, segments, total;
};

ImageLayout layoutOf(const LoweredPlan& lowered) {
  ImageLayout l{};
  l.lanes = alignUp(sizeof(kernels::DevicePlan));
  l.steps = l.lanes + alignUp(lowered.lanes.size() * sizeof(kernels::DeviceLane));
  l.deps = l.steps + alignUp(lowered.steps.size() * sizeof(kernels::DeviceStep));
  l.segments = l.deps + alignUp(lowered.deps.size() * sizeof(kernels::DeviceDep));
  l.total = l.segments + alignUp(lowered.segments.size() * sizeof(kernels::DeviceSegment));
  return l;
}

}  // namespace

uint64_t slotPayloadBytes(kernels::DeviceProtocol protocol, const kernels::DeviceFifoGeometry& geometry) {
  return protocol == kernels::DeviceProtocol::Simple
             ? geometry.slotBytes
             : geometry.llWordsPerSlot / kernels::kLowLatencyWordsPerUnit * kernels::kLowLatencyUnitBytes;
}

namespace {

uint64_t chunksSent(const algo::Lane& lane) {
  uint64_t parts = 0;
  for (const algo::Step& step : lane.steps)
    if (algo::stepSends(step.kind)) parts += algo::stepReads(step.kind) ? step.src.count : step.dst.count;
  return parts;
}

// Bounded FIFOs stay deadlock-free when, per round, a lane puts no more chunk parts into its connection than
// it has slots (then the lanes of the earliest unfinished round never wait for space) and no two lanes of a
// rank share a connection (its counters have one writer each).
void checkFifoCapacity(const algo::Plan& plan, const kernels::DeviceFifoGeometry& geometry) {
  for (size_t r = 0; r < plan.ranks.size(); ++r) {
    std::set<std::pair<int, int>> sending, receiving;
    const auto& lanes = plan.ranks[r].lanes;
    for (size_t l = 0; l < lanes.size(); ++l) {
      const algo::Lane& lane = lanes[l];
      const std::string where = "plan '" + plan.name + "' rank " + std::to_string(r) + " lane " + std::to_string(l);
      if (lane.sendPeer >= 0 && !sending.insert({lane.sendPeer, lane.channel}).second)
        throwInvalidUsage(where + " sends to rank " + std::to_string(lane.sendPeer) + " on channel " +
                          std::to_string(lane.channel) + ", which another lane of the rank already does; the GPU " +
                          "executor needs one lane per connection and direction");
      if (lane.recvPeer >= 0 && !receiving.insert({lane.recvPeer, lane.channel}).second)
        throwInvalidUsage(where + " receives from rank " + std::to_string(lane.recvPeer) + " on channel " +
                          std::to_string(lane.channel) + ", which another lane of the rank already does; the GPU " +
                          "executor needs one lane per connection and direction");
      const uint64_t parts = chunksSent(lane);
      if (parts > geometry.slotCount)
        throwInvalidUsage(where + " sends " + std::to_string(parts) + " chunks per round but the GPU FIFOs have " +
                          std::to_string(geometry.slotCount) + " slots; raise TOPOCCL_GPU_FIFO_SLOTS to at least " +
                          std::to_string(parts));
    }
  }
}

}  // namespace

uint64_t fifoSlotsNeeded(const algo::Plan& plan) {
  uint64_t most = 0;
  for (const auto& program : plan.ranks)
    for (const algo::Lane& lane : program.lanes) most = std::max(most, chunksSent(lane));
  return most;
}

LoweredPlan lowerPlan(const algo::Plan& plan, int rank, const PlanBuffers& buffers, const DeviceFifoLookup& fifo,
                      kernels::DeviceProtocol protocol, const kernels::DeviceFifoGeometry& geometry) {
  if (rank < 0 || rank >= plan.nranks || static_cast<size_t>(rank) >= plan.ranks.size())
    throwInternalError("lowering plan '" + plan.name + "': rank " + std::to_string(rank) + " is not in the plan");
  if (buffers.elementSize == 0 || 16 % buffers.elementSize != 0)
    throwInternalError("lowering plan '" + plan.name + "': element size " + std::to_string(buffers.elementSize) +
                       " does not divide 16");
  checkFifoCapacity(plan, geometry);
  LoweredPlan lowered;
  lowered.elementSize = buffers.elementSize;
  // Rounds: enough that the largest chunk's part fits a slot. Chunks only depend on the plan and the count,
  // so every rank computes the same number.
  uint64_t largestChunk = 0;
  const size_t align = chunkAlignElements(buffers.elementSize);
  for (uint32_t part = 0; part < plan.chunksPerBlock; ++part)
    largestChunk = std::max<uint64_t>(largestChunk, algo::chunkElements(plan, buffers.count, part, align).size());
  // The interpreter cuts a chunk's rounds on 16-byte boundaries too (LaneInterpreter::roundSliceStart), which can grow a
  // slice by up to 16 bytes past an even share; 32 bytes of slack keep every slice within a slot.
  const uint64_t payload = slotPayloadBytes(protocol, geometry) - 32;
  lowered.rounds = std::max<uint64_t>(1, (largestChunk * buffers.elementSize + payload - 1) / payload);

  const auto& program = plan.ranks[static_cast<size_t>(rank)];
  for (const algo::Lane& lane : program.lanes) {
    kernels::DeviceLane out;
    if (lane.sendPeer >= 0) out.send = fifo(lane.sendPeer, lane.channel, true);
    if (lane.recvPeer >= 0) out.recv = fifo(lane.recvPeer, lane.channel, false);
    out.stepBegin = static_cast<uint32_t>(lowered.steps.size());
    out.stepCount = static_cast<uint32_t>(lane.steps.size());
    for (const algo::Step& step : lane.steps) {
      kernels::DeviceStep s;
      s.kind = static_cast<DeviceStepKind>(step.kind);
      s.segmentBegin = static_cast<uint32_t>(lowered.segments.size());
      const bool reads = algo::stepReads(step.kind), writes = algo::stepWrites(step.kind);
      // A step pairs its source and destination chunk by chunk (same part index, so the same size).
      const uint32_t chunks = reads ? step.src.count : writes ? step.dst.count : 0;
      for (uint32_t k = 0; k < chunks; ++k) {
        kernels::DeviceSegment segment;
        if (reads) {
          const ResolvedRange src = resolveRange(plan, {step.src.buffer, step.src.offset + k, 1}, buffers, rank);
          segment.src = src.data;
          segment.bytes = src.bytes;
        }
        if (writes) {
          const ResolvedRange dst = resolveRange(plan, {step.dst.buffer, step.dst.offset + k, 1}, buffers, rank);
          segment.dst = dst.data;
          segment.bytes = dst.bytes;
        }
        lowered.segments.push_back(segment);
      }
      s.segmentCount = chunks;
      s.depBegin = static_cast<uint32_t>(lowered.deps.size());
      s.depCount = static_cast<uint32_t>(step.deps.size());
      for (const algo::StepRef& dep : step.deps) {
        if (dep.lane >= program.lanes.size() || dep.step >= program.lanes[dep.lane].steps.size())
          throwInternalError("lowering plan '" + plan.name + "': rank " + std::to_string(rank) +
                             " has a dependency on lane " + std::to_string(dep.lane) + " step " +
                             std::to_string(dep.step) + ", which does not exist");
        lowered.deps.push_back({dep.lane, dep.step});
      }
      lowered.steps.push_back(s);
    }
    lowered.lanes.push_back(out);
  }
  return lowered;
}

uint32_t pointToPointLanes(uint64_t bytes, uint32_t maxLanes) {
  uint32_t lanes = 1;
  while (lanes * 2 <= maxLanes && bytes / (uint64_t{512} << 10) >= lanes * 2) lanes *= 2;
  return lanes;
}

LoweredPlan lowerPointToPoint(const std::vector<DevicePointToPoint>& ops, int rank, const DeviceFifoLookup& fifo,
                              const kernels::DeviceFifoGeometry& geometry, uint32_t maxLanesPerMessage,
                              uint32_t maxLaunchLanes) {
  // Lanes keyed by (peer, direction, channel) in the order they first appear; self copies use direction 2.
  struct LaneSteps {
    int peer, direction, channel;
    std::vector<kernels::DeviceSegment> segments;
    std::vector<uint32_t> stepSegments;  // segments per step
  };
  std::vector<LaneSteps> lanes;
  const auto laneFor = [&](int peer, int direction, int channel) -> LaneSteps& {
    for (LaneSteps& l : lanes)
      if (l.peer == peer && l.direction == direction && l.channel == channel) return l;
    lanes.push_back({peer, direction, channel, {}, {}});
    return lanes.back();
  };
  const uint64_t slot = slotPayloadBytes(kernels::DeviceProtocol::Simple, geometry);
  // A message's share on lane c of k: cut on 16 bytes, so every share but the last moves in whole packs.
  const auto addMessage = [&](int peer, int direction, const char* src, char* dst, uint64_t bytes) {
    const uint32_t k = pointToPointLanes(bytes, std::max<uint32_t>(1, maxLanesPerMessage));
    for (uint32_t c = 0; c < k; ++c) {
      const uint64_t begin = bytes * c / k / 16 * 16, end = c + 1 == k ? bytes : bytes * (c + 1) / k / 16 * 16;
      if (end <= begin) continue;  // both ends cut the same message alike, so both skip it
      LaneSteps& lane = laneFor(peer, direction, static_cast<int>(c));
      // Local copies need no slot: one segment.
      const uint64_t piece = direction == 2 ? end - begin : slot;
      uint32_t count = 0;
      for (uint64_t at = begin; at < end; at += piece, ++count) {
        kernels::DeviceSegment segment;
        segment.src = src ? src + at : nullptr;
        segment.dst = dst ? dst + at : nullptr;
        segment.bytes = std::min(piece, end - at);
        lane.segments.push_back(segment);
      }
      lane.stepSegments.push_back(count);
    }
  };
  std::vector<const DevicePointToPoint*> selfSends, selfRecvs;
  for (const DevicePointToPoint& op : ops) {
    if (op.bytes == 0) continue;
    if (op.peer == rank) {
      (op.isSend ? selfSends : selfRecvs).push_back(&op);
      continue;
    }
    if (op.isSend) addMessage(op.peer, 0, op.send, nullptr, op.bytes);
    else addMessage(op.peer, 1, nullptr, op.recv, op.bytes);
  }
  if (selfSends.size() != selfRecvs.size())
    throwInvalidUsage("rank " + std::to_string(rank) + "'s group has " + std::to_string(selfSends.size()) +
                      " non-empty send(s) to itself and " + std::to_string(selfRecvs.size()) +
                      " receive(s) from itself; each send to self needs a receive from self in the same group");
  for (size_t i = 0; i < selfSends.size(); ++i) {
    if (selfSends[i]->bytes != selfRecvs[i]->bytes)
      throwInvalidUsage("rank " + std::to_string(rank) + "'s send to itself #" + std::to_string(i + 1) + " has " +
                        std::to_string(selfSends[i]->bytes) + " bytes but its matching receive " +
                        std::to_string(selfRecvs[i]->bytes));
    addMessage(rank, 2, selfSends[i]->send, selfRecvs[i]->recv, selfSends[i]->bytes);
  }
  if (lanes.size() > maxLaunchLanes)
    throwInvalidUsage("rank " + std::to_string(rank) + "'s group of sends and receives needs " + std::to_string(lanes.size()) +
                      " lanes; the GPU path runs at most " + std::to_string(maxLaunchLanes) + " in one launch");
  LoweredPlan lowered;
  lowered.rounds = 1;
  lowered.elementSize = 1;
  for (const LaneSteps& l : lanes) {
    kernels::DeviceLane out;
    if (l.direction == 0) out.send = fifo(l.peer, l.channel, true);
    if (l.direction == 1) out.recv = fifo(l.peer, l.channel, false);
    out.stepBegin = static_cast<uint32_t>(lowered.steps.size());
    out.stepCount = static_cast<uint32_t>(l.stepSegments.size());
    uint32_t next = 0;
    for (uint32_t count : l.stepSegments) {
      kernels::DeviceStep s;
      s.kind = l.direction == 0 ? DeviceStepKind::Send : l.direction == 1 ? DeviceStepKind::Recv : DeviceStepKind::Copy;
      s.segmentBegin = static_cast<uint32_t>(lowered.segments.size());
      s.segmentCount = count;
      lowered.segments.insert(lowered.segments.end(), l.segments.begin() + next, l.segments.begin() + next + count);
      next += count;
      lowered.steps.push_back(s);
    }
    lowered.lanes.push_back(out);
  }
  return lowered;
}

size_t deviceImageBytes(const LoweredPlan& lowered) { return layoutOf(lowered).total; }

bool independentOf(const CallFootprint& call, const std::vector<CallFootprint>& earlier) {
  const auto overlaps = [](const void* a, size_t aBytes, const void* b, size_t bBytes) {
    const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return aBytes > 0 && bBytes > 0 && x < y + bBytes && y < x + aBytes;
  };
  for (const CallFootprint& e : earlier)
    if (overlaps(call.written, call.writtenBytes, e.written, e.writtenBytes) ||
        overlaps(call.written, call.writtenBytes, e.read, e.readBytes) || overlaps(call.read, call.readBytes, e.written, e.writtenBytes))
      return false;
  return true;
}

bool ChainedConnections::admit(const LoweredPlan& lowered) {
  for (uint32_t l = 0; l < lowered.lanes.size(); ++l)
    for (const kernels::DeviceFifo* f : {&lowered.lanes[l].send, &lowered.lanes[l].recv})
      if (f->counters != nullptr)
        if (const auto it = laneOf_.find(f->counters); it != laneOf_.end() && it->second != l) return false;
  for (uint32_t l = 0; l < lowered.lanes.size(); ++l)
    for (const kernels::DeviceFifo* f : {&lowered.lanes[l].send, &lowered.lanes[l].recv})
      if (f->counters != nullptr) laneOf_.emplace(f->counters, l);
  return true;
}

kernels::DevicePlan writeDeviceImage(const LoweredPlan& lowered, const kernels::DevicePlan& header, void* image,
                                     uintptr_t base) {
  const ImageLayout l = layoutOf(lowered);
  auto* bytes = static_cast<unsigned char*>(image);
  std::memset(bytes, 0, l.total);
  kernels::DevicePlan plan = header;
  plan.laneCount = static_cast<uint32_t>(lowered.lanes.size());
  plan.lanes = reinterpret_cast<const kernels::DeviceLane*>(base + l.lanes);
  plan.steps = reinterpret_cast<const kernels::DeviceStep*>(base + l.steps);
  plan.deps = reinterpret_cast<const kernels::DeviceDep*>(base + l.deps);
  plan.segments = reinterpret_cast<const kernels::DeviceSegment*>(base + l.segments);
  plan.rounds = lowered.rounds;
  plan.elementSize = lowered.elementSize;
  std::memcpy(bytes, &plan, sizeof(plan));
  if (!lowered.lanes.empty()) std::memcpy(bytes + l.lanes, lowered.lanes.data(), lowered.lanes.size() * sizeof(kernels::DeviceLane));
  if (!lowered.steps.empty()) std::memcpy(bytes + l.steps, lowered.steps.data(), lowered.steps.size() * sizeof(kernels::DeviceStep));
  if (!lowered.deps.empty()) std::memcpy(bytes + l.deps, lowered.deps.data(), lowered.deps.size() * sizeof(kernels::DeviceDep));
  if (!lowered.segments.empty())
    std::memcpy(bytes + l.segments, lowered.segments.data(), lowered.segments.size() * sizeof(kernels::DeviceSegment));
  return plan;
}

}  // namespace topoccl::core
