// A plan lowered for one rank's GPU kernel, or for its host-compiled twin in the tests: plain data laid out
// in one block (DevicePlan, then lanes, steps, dependencies), so the host copies it to device memory in one
// transfer and the kernel runs it with one thread block per lane. core/device_lowering.hpp builds it from an
// algo::Plan; plan_interpreter.hpp runs it. Kept C++17 and free of CUDA headers, like reduce_ops.hpp.
#pragma once

#include <stddef.h>
#include <stdint.h>

namespace topoccl::kernels {

// Simple: a slice is copied into the peer's slot, then one flag (the slot counter) publishes it: few
// flags, full-width copies, for bandwidth. LowLatency (NCCL's LL): every 8-byte word carries 4 payload
// bytes and a 32-bit flag, written together, so the receiver polls the data itself: no fence and no
// separate flag round trip, at half the link's efficiency, for small messages.
enum class DeviceProtocol : uint32_t { Simple = 0, LowLatency = 1 };

// Numbered as algo::StepKind (the lowering checks it at compile time).
enum class DeviceStepKind : uint32_t {
  Nop,
  Send,
  Recv,
  RecvReduceSend,
  RecvReduceCopy,
  RecvCopySend,
  RecvReduceCopySend,
  Copy,
  Reduce,
};

// The two counters of one ordered connection (sender rank, receiver rank, channel), on separate cache
// lines: head = slices the sender published, tail = slices the receiver is done with. Both only grow,
// across launches and protocols, so neither side ever resets them.
struct alignas(128) DeviceFifoCounters {
  uint64_t head;
  char headLine[120];
  uint64_t tail;
  char tailLine[120];
};

// Where slice k of a connection lives: slot k % slotCount of `slots` (Simple, slotBytes each) or of
// `lines` (LowLatency, llWordsPerSlot words each). All of it is in the receiver's memory, mapped into the
// sender (CUDA IPC between processes; plain pointers between ranks that are threads).
struct DeviceFifo {
  DeviceFifoCounters* counters = nullptr;  // null: the lane has no such connection
  char* slots = nullptr;
  uint64_t* lines = nullptr;
  uint64_t slotCount = 0;
};

// The geometry every FIFO of a communicator shares; both ends of a connection cut slices from it alike.
struct DeviceFifoGeometry {
  uint64_t slotCount = 8;
  uint64_t slotBytes = 128 << 10;  // Simple payload per slice, a multiple of 16
  uint64_t llWordsPerSlot = 2048;  // LowLatency words per slice (4 payload bytes each), a multiple of 4
  uint64_t simpleBytes() const { return slotCount * slotBytes; }
  uint64_t lowLatencyBytes() const { return slotCount * llWordsPerSlot * sizeof(uint64_t); }
};

struct DeviceDep {
  uint32_t lane;
  uint32_t step;
};

// One chunk of a step: its memory on this rank. Round r of the plan moves part r of every segment:
// elements [r*e/R, (r+1)*e/R) of its e elements, R = DevicePlan::rounds.
struct DeviceSegment {
  const char* src = nullptr;  // null where the step does not read
  char* dst = nullptr;        // null where the step does not write
  uint64_t bytes = 0;
};

struct DeviceStep {
  DeviceStepKind kind = DeviceStepKind::Nop;
  uint32_t depCount = 0;
  uint32_t depBegin = 0;      // index into DevicePlan::deps
  uint32_t segmentCount = 0;  // one per chunk of the step's range
  uint32_t segmentBegin = 0;  // index into DevicePlan::segments
  uint32_t reserved = 0;
};

struct DeviceLane {
  DeviceFifo send;
  DeviceFifo recv;
  uint32_t stepBegin = 0;  // index into DevicePlan::steps
  uint32_t stepCount = 0;
};

// Written to DevicePlan::status by the first lane that stops early.
enum DevicePlanStatus : uint64_t { kPlanRunning = 0, kPlanAborted = 1 };

// The plan runs in `rounds` rounds (MSCCL's chunk loop): in round r every lane runs all its steps on part r
// of their chunks, one FIFO slot per chunk part, so a round's traffic on a connection never exceeds the
// slots a lowering checked for, and lanes stay deadlock-free with bounded FIFOs. Dependencies hold per round.
struct DevicePlan {
  const DeviceLane* lanes = nullptr;
  const DeviceStep* steps = nullptr;
  const DeviceDep* deps = nullptr;
  const DeviceSegment* segments = nullptr;
  uint32_t laneCount = 0;
  DeviceProtocol protocol = DeviceProtocol::Simple;
  uint64_t rounds = 1;
  uint64_t elementSize = 1;
  DeviceFifoGeometry geometry;
  // Per lane, launchBase + round * stepCount + the steps it finished in that round: how lanes wait for each
  // other's steps. Persistent memory
  // (one array per communicator); a fresh launchBase per launch makes old values read as "not yet".
  uint64_t* laneDone = nullptr;
  uint64_t launchBase = 0;
  // Set (non-zero) by ncclCommAbort or the host's watchdog; every wait loop reads it. May be null.
  const uint64_t* abortFlag = nullptr;
  // kPlanAborted once a lane gave up; other lanes then stop at their next wait. Must not be null.
  uint64_t* status = nullptr;
  // The next plan of the same launch (a fused group, runPlanChain), or null. Its launchBase is larger, so a
  // lane that moved on to it still reads as done to the lanes of this one.
  const DevicePlan* next = nullptr;
};

}  // namespace topoccl::kernels
