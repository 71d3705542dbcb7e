// Lowering a Plan to the GPU executor's form (kernels/device_plan.hpp) for one rank: steps resolved to
// pointers and byte counts, dependencies flattened, each lane's connections resolved to the FIFOs that
// carry them. The same lowering feeds the CUDA kernel and the host-compiled interpreter in the tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string_view>
#include <vector>

#include "algorithms/plan.hpp"
#include "core/plan_buffers.hpp"
#include "kernels/device_plan.hpp"

namespace topoccl::core {

// The FIFO of the connection to or from `peer` on `channel`: for sending, the peer's receiving FIFO
// (mapped here); for receiving, our own. Throws if there is none.
using DeviceFifoLookup = std::function<kernels::DeviceFifo(int peer, int channel, bool sending)>;

struct LoweredPlan {
  std::vector<kernels::DeviceLane> lanes;
  std::vector<kernels::DeviceStep> steps;
  std::vector<kernels::DeviceDep> deps;
  std::vector<kernels::DeviceSegment> segments;
  uint64_t rounds = 1;
  uint64_t elementSize = 1;
};

// Rank `rank`'s program of `plan` over `buffers`, cut into as many rounds as it takes for the largest chunk's
// part to fit one slot of `protocol`. Throws (naming the plan, rank and lane) where a lane would put more
// chunk parts into one connection per round than the FIFO has slots, or two lanes would share a connection:
// either could deadlock with bounded FIFOs. Every rank checks every rank's lanes, so all refuse alike.
LoweredPlan lowerPlan(const algo::Plan& plan, int rank, const PlanBuffers& buffers, const DeviceFifoLookup& fifo,
                      kernels::DeviceProtocol protocol, const kernels::DeviceFifoGeometry& geometry);

// One send or receive of a group on GPU buffers, as this rank issued it.
struct DevicePointToPoint {
  bool isSend = true;
  int peer = 0;
  const char* send = nullptr;  // isSend
  char* recv = nullptr;        // !isSend
  uint64_t bytes = 0;
};

// The lanes (connections to the peer on channels 0..k-1) one message of `bytes` spreads over: one per 512 KiB, a
// power of two, at most `maxLanes`. A function of the message alone, so both ends agree however each grouped it.
uint32_t pointToPointLanes(uint64_t bytes, uint32_t maxLanes);

// Rank `rank`'s launch for one group of sends and receives, in one round: a lane per peer, direction and channel,
// whose steps carry, in call order, that channel's share of each message to or from the peer, cut into slot-sized
// segments. Each connection then carries the same slices on both ends whatever the groups around them, as NCCL
// matches sends and receives to a peer in order. Lanes never wait for each other, so with every lane resident no
// FIFO depth can deadlock them. Sends to and receives from `rank` itself pair up in order as local copies.
// Throws, naming the call, where those do not pair up, and where the launch would need more than `maxLaunchLanes`.
LoweredPlan lowerPointToPoint(const std::vector<DevicePointToPoint>& ops, int rank, const DeviceFifoLookup& fifo,
                              const kernels::DeviceFifoGeometry& geometry, uint32_t maxLanesPerMessage,
                              uint32_t maxLaunchLanes);

// Which lane drives each connection over the plans chained into one launch (a fused group, DevicePlan::next).
// A lane reads its connections' counters when it starts a plan and each counter has one writer, so a
// connection must stay with one lane index over the whole chain; then each connection carries the plans'
// slices in chain order, as consecutive launches would.
class ChainedConnections {
 public:
  // Records `lowered`'s connections and returns true, or returns false (recording nothing) where one of them
  // is driven by another lane earlier in the chain.
  bool admit(const LoweredPlan& lowered);

 private:
  std::map<const void*, uint32_t> laneOf_;  // a connection's counters -> the lane that drives it
};

// What a call reads and writes on this rank: the caller's buffers, as far as the rank uses them.
struct CallFootprint {
  const void* read = nullptr;
  size_t readBytes = 0;
  const void* written = nullptr;
  size_t writtenBytes = 0;
};

// Whether a call may join `earlier` calls in one launch, where their lanes run side by side: it writes
// nothing they read or write, and reads nothing they write. (Reading what they read is fine.)
bool independentOf(const CallFootprint& call, const std::vector<CallFootprint>& earlier);

// The FIFO slots `plan` needs: the most chunk parts any lane sends per round.
uint64_t fifoSlotsNeeded(const algo::Plan& plan);

// Payload bytes of one slot: the largest chunk part one round may move.
uint64_t slotPayloadBytes(kernels::DeviceProtocol protocol, const kernels::DeviceFifoGeometry& geometry);

// The bytes of the one-block image: DevicePlan, then lanes, steps, dependencies and segments, each 16-byte aligned.
size_t deviceImageBytes(const LoweredPlan& lowered);

// Writes the image into `image` (deviceImageBytes long, 16-byte aligned) as it will sit at address `base`
// (device memory the host copies it to; or `image` itself when the host runs it). `header` supplies the
// protocol, geometry and the per-communicator pointers; the arrays, lane count, rounds and element size
// come from `lowered`. Returns the DevicePlan as written.
kernels::DevicePlan writeDeviceImage(const LoweredPlan& lowered, const kernels::DevicePlan& header, void* image,
                                     uintptr_t base);

}  // namespace topoccl::core
