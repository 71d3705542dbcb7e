// The GPU plan executor's lane loop, written once for host and device (TOPOCCL_HD). The CUDA kernel
// (cuda/plan_kernels.cu) runs one lane per thread block with a worker per thread; the tests run the very
// same code on host memory with a lane per group of std::threads, so the executor's plan handling (slicing,
// both protocols, flow control, dependencies between lanes, abort) is proven without a GPU.
//
// A Block is the lane's group of workers: worker(), workers(), sync() (a barrier), syncAny(bool) (a barrier
// that returns whether any worker passed true) and pause(spins) (back off in a wait loop).
//
// Protocols (device_plan.hpp): Simple moves a slice per slot, published by the slot counter `head` after a
// barrier; LowLatency moves 16 payload bytes per worker as four flagged 8-byte words, polled word by word.
// In both, the receiver hands a slot back through `tail` once every worker is done with it.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/device_plan.hpp"
#include "kernels/packed_reduce.hpp"

#if defined(__CUDA_ARCH__)
#define TOPOCCL_UNROLL _Pragma("unroll")
#else
#define TOPOCCL_UNROLL
#endif

namespace topoccl::kernels {
namespace detail {

// Counters and flags live in memory other GPUs (or other threads) read and write: system scope.
TOPOCCL_HD inline uint64_t loadAcquire(const uint64_t* p) {
#if defined(__CUDA_ARCH__)
  uint64_t v;
  asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

TOPOCCL_HD inline void storeRelease(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

TOPOCCL_HD inline uint64_t loadRelaxed(const uint64_t* p) {
#if defined(__CUDA_ARCH__)
  uint64_t v;
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

TOPOCCL_HD inline void storeRelaxed(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.relaxed.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
#endif
}

// A LowLatency word's flag for slice `sequence`: never 0, so zeroed memory never reads as data, and a slot's
// previous use (sequence - slotCount) carries another value.
TOPOCCL_HD inline uint32_t lowLatencyFlag(uint64_t sequence) {
  return static_cast<uint32_t>(sequence % 0xffffffffull) + 1u;
}

}  // namespace detail

inline constexpr size_t kLowLatencyUnitBytes = 16;  // payload per worker per turn: four words
inline constexpr size_t kLowLatencyWordsPerUnit = 4;

template <class T, class Op, class Block>
class LaneInterpreter {
 public:
  TOPOCCL_HD LaneInterpreter(const DevicePlan& plan, uint32_t laneIndex, Block& block)
      : plan_(plan), lane_(plan.lanes[laneIndex]), laneIndex_(laneIndex), block_(block) {}

  // Runs every step of the lane, round after round. False when it stopped early (abort, or another lane
  // gave up); then plan.status is kPlanAborted.
  TOPOCCL_HD bool run() {
    // Only this lane writes its sending head and its receiving tail, so their values are ours to keep.
    sendSeq_ = lane_.send.counters ? detail::loadAcquire(&lane_.send.counters->head) : 0;
    recvSeq_ = lane_.recv.counters ? detail::loadAcquire(&lane_.recv.counters->tail) : 0;
    block_.sync();
    for (uint64_t round = 0; round < plan_.rounds; ++round) {
      for (uint32_t s = 0; s < lane_.stepCount; ++s) {
        const DeviceStep& step = plan_.steps[lane_.stepBegin + s];
        if (!waitForDeps(step, round) || !runStep(step, round)) return false;
        block_.sync();  // every worker's part of the step is written before the lane says it is done
        if (block_.worker() == 0)
          detail::storeRelease(&plan_.laneDone[laneIndex_], plan_.launchBase + round * lane_.stepCount + s + 1);
      }
    }
    return true;
  }

 private:
  TOPOCCL_HD bool stopRequested() const {
    if (plan_.abortFlag != nullptr && detail::loadRelaxed(plan_.abortFlag) != 0) return true;
    return detail::loadRelaxed(plan_.status) != kPlanRunning;
  }

  // Spins until ready() holds; false (and the plan marked aborted) when asked to stop meanwhile.
  template <class Ready>
  TOPOCCL_HD bool waitUntil(Ready ready) {
    for (uint64_t spins = 0;; ++spins) {
      if (ready()) return true;
      if ((spins & 255) == 255 && stopRequested()) {
        detail::storeRelaxed(plan_.status, kPlanAborted);
        return false;
      }
      block_.pause(spins);
    }
  }

  TOPOCCL_HD bool waitForDeps(const DeviceStep& step, uint64_t round) {
    if (step.depCount == 0) return true;
    bool ok = true;
    if (block_.worker() == 0) {
      for (uint32_t d = 0; ok && d < step.depCount; ++d) {
        const DeviceDep dep = plan_.deps[step.depBegin + d];
        const uint64_t want = plan_.launchBase + round * plan_.lanes[dep.lane].stepCount + dep.step + 1;
        ok = waitUntil([&] { return detail::loadAcquire(&plan_.laneDone[dep.lane]) >= want; });
      }
    }
    return !block_.syncAny(!ok);
  }

  TOPOCCL_HD static bool receives(DeviceStepKind k) {
    return k == DeviceStepKind::Recv || k == DeviceStepKind::RecvReduceSend || k == DeviceStepKind::RecvReduceCopy ||
           k == DeviceStepKind::RecvCopySend || k == DeviceStepKind::RecvReduceCopySend;
  }
  TOPOCCL_HD static bool sends(DeviceStepKind k) {
    return k == DeviceStepKind::Send || k == DeviceStepKind::RecvReduceSend || k == DeviceStepKind::RecvCopySend ||
           k == DeviceStepKind::RecvReduceCopySend;
  }

  // Part `round` of every chunk of the step: a local copy or reduction, or one slice through the FIFO.
  TOPOCCL_HD bool runStep(const DeviceStep& step, uint64_t round) {
    const size_t w = block_.worker(), workers = block_.workers();
    for (uint32_t g = 0; g < step.segmentCount; ++g) {
      const DeviceSegment& segment = plan_.segments[step.segmentBegin + g];
      const uint64_t elements = segment.bytes / plan_.elementSize;
      const uint64_t first = roundSliceStart(elements, round), last = roundSliceStart(elements, round + 1);
      const uint64_t offset = first * plan_.elementSize, n = (last - first) * plan_.elementSize;
      if (n == 0) continue;  // both ends of a connection cut the same chunk alike, so both skip it
      const char* src = segment.src ? segment.src + offset : nullptr;
      char* dst = segment.dst ? segment.dst + offset : nullptr;
      switch (step.kind) {
        case DeviceStepKind::Nop: break;
        case DeviceStepKind::Copy:
          // In place, a copy onto itself is a no-op the plan relies on us to skip.
          if (src != dst) copyShare(dst, src, n, w, workers);
          break;
        case DeviceStepKind::Reduce:
          reduceShare<T, Op>(reinterpret_cast<T*>(dst), reinterpret_cast<const T*>(dst), reinterpret_cast<const T*>(src),
                             n / sizeof(T), w, workers);
          break;
        default:
          if (!(plan_.protocol == DeviceProtocol::Simple ? simpleSlice(step.kind, src, dst, n)
                                                         : lowLatencySlice(step.kind, src, dst, n)))
            return false;
      }
    }
    return true;
  }

  // Where round `round` of a chunk of `elements` elements starts: an even share, cut on a 16-byte boundary
  // (relative to the chunk, which starts on one: core::chunkAlignElements) so the slice moves in packs.
  // Both ends of a connection cut the same chunk alike.
  TOPOCCL_HD uint64_t roundSliceStart(uint64_t elements, uint64_t round) const {
    if (round >= plan_.rounds) return elements;
    const uint64_t align = plan_.elementSize != 0 && 16 % plan_.elementSize == 0 ? 16 / plan_.elementSize : 1;
    return round * elements / plan_.rounds / align * align;
  }

  // Worker 0 waits for the incoming slice and a free outgoing slot; everyone moves their share.
  TOPOCCL_HD bool waitForSlots(bool in, bool out, bool waitForData) {
    bool ok = true;
    if (block_.worker() == 0) {
      if (in && waitForData)
        ok = waitUntil([&] { return detail::loadAcquire(&lane_.recv.counters->head) > recvSeq_; });
      if (ok && out)
        ok = waitUntil([&] { return sendSeq_ - detail::loadAcquire(&lane_.send.counters->tail) < lane_.send.slotCount; });
    }
    return !block_.syncAny(!ok);
  }

  // Worker 0 hands the slots on once every worker is done with them (the caller's barrier).
  TOPOCCL_HD void finishSlice(bool in, bool out) {
    if (block_.worker() == 0) {
      if (out) detail::storeRelease(&lane_.send.counters->head, sendSeq_ + 1);
      if (in) detail::storeRelease(&lane_.recv.counters->tail, recvSeq_ + 1);
    }
    sendSeq_ += out ? 1 : 0;
    recvSeq_ += in ? 1 : 0;
  }

  TOPOCCL_HD bool simpleSlice(DeviceStepKind kind, const char* src, char* dst, uint64_t n) {
    const bool in = receives(kind), out = sends(kind);
    if (!waitForSlots(in, out, true)) return false;
    const size_t w = block_.worker(), workers = block_.workers();
    const uint64_t slotBytes = plan_.geometry.slotBytes;
    const char* incoming = in ? lane_.recv.slots + (recvSeq_ % lane_.recv.slotCount) * slotBytes : nullptr;
    char* outgoing = out ? lane_.send.slots + (sendSeq_ % lane_.send.slotCount) * slotBytes : nullptr;
    const size_t count = n / sizeof(T);
    switch (kind) {
      case DeviceStepKind::Send: copyShare(outgoing, src, n, w, workers); break;
      case DeviceStepKind::Recv: copyShare(dst, incoming, n, w, workers); break;
      case DeviceStepKind::RecvReduceSend:
        reduceShare<T, Op>(reinterpret_cast<T*>(outgoing), reinterpret_cast<const T*>(incoming),
                           reinterpret_cast<const T*>(src), count, w, workers);
        break;
      case DeviceStepKind::RecvReduceCopy:
        reduceShare<T, Op>(reinterpret_cast<T*>(dst), reinterpret_cast<const T*>(incoming),
                           reinterpret_cast<const T*>(src), count, w, workers);
        break;
      case DeviceStepKind::RecvCopySend:
        copyShare(dst, incoming, n, w, workers);
        copyShare(outgoing, incoming, n, w, workers);
        break;
      case DeviceStepKind::RecvReduceCopySend:
        reduceShare<T, Op>(reinterpret_cast<T*>(dst), reinterpret_cast<const T*>(incoming),
                           reinterpret_cast<const T*>(src), count, w, workers);
        block_.sync();  // the copy's split of the range differs from the reduction's
        copyShare(outgoing, dst, n, w, workers);
        break;
      default: break;
    }
    block_.sync();
    finishSlice(in, out);
    return true;
  }

  // A unit's 16 payload bytes as elements; constant indices after unrolling keep it in registers.
  union Unit {
    Pack16 pack;
    T elements[kLowLatencyUnitBytes / sizeof(T)];
  };
  static constexpr int kUnitElements = static_cast<int>(kLowLatencyUnitBytes / sizeof(T));

  TOPOCCL_HD bool readUnit(const uint64_t* words, uint32_t flag, Unit& unit) {
    TOPOCCL_UNROLL
    for (int k = 0; k < static_cast<int>(kLowLatencyWordsPerUnit); ++k) {
      uint64_t word = 0;
      if (!waitUntil([&] {
            word = detail::loadRelaxed(words + k);
            return static_cast<uint32_t>(word >> 32) == flag;
          }))
        return false;
      unit.pack.words[k] = static_cast<uint32_t>(word);
    }
    return true;
  }

  TOPOCCL_HD static void writeUnit(uint64_t* words, uint32_t flag, const Unit& unit) {
    TOPOCCL_UNROLL
    for (int k = 0; k < static_cast<int>(kLowLatencyWordsPerUnit); ++k)
      detail::storeRelaxed(words + k, (static_cast<uint64_t>(flag) << 32) | unit.pack.words[k]);
  }

  TOPOCCL_HD bool lowLatencySlice(DeviceStepKind kind, const char* src, char* dst, uint64_t n) {
    const bool in = receives(kind), out = sends(kind);
    if (!waitForSlots(in, out, false)) return false;  // data is polled word by word below
    const uint64_t words = plan_.geometry.llWordsPerSlot;
    const uint64_t* incoming = in ? lane_.recv.lines + (recvSeq_ % lane_.recv.slotCount) * words : nullptr;
    uint64_t* outgoing = out ? lane_.send.lines + (sendSeq_ % lane_.send.slotCount) * words : nullptr;
    const uint32_t inFlag = detail::lowLatencyFlag(recvSeq_), outFlag = detail::lowLatencyFlag(sendSeq_);
    const uint64_t units = (n + kLowLatencyUnitBytes - 1) / kLowLatencyUnitBytes;
    const bool reduces = kind == DeviceStepKind::RecvReduceSend || kind == DeviceStepKind::RecvReduceCopy ||
                         kind == DeviceStepKind::RecvReduceCopySend;
    const bool stores = kind == DeviceStepKind::Recv || kind == DeviceStepKind::RecvCopySend ||
                        kind == DeviceStepKind::RecvReduceCopy || kind == DeviceStepKind::RecvReduceCopySend;
    const Op op{};
    bool ok = true;
    for (uint64_t u = block_.worker(); u < units; u += block_.workers()) {
      const uint64_t at = u * kLowLatencyUnitBytes;
      const uint64_t left = (n - at) / sizeof(T);  // elements from here to the end of the slice
      const int count = left < static_cast<uint64_t>(kUnitElements) ? static_cast<int>(left) : kUnitElements;
      const T* from = src ? reinterpret_cast<const T*>(src + at) : nullptr;
      T* to = dst ? reinterpret_cast<T*>(dst + at) : nullptr;
      Unit unit;
      unit.pack = Pack16{};
      if (in && !readUnit(incoming + u * kLowLatencyWordsPerUnit, inFlag, unit)) {
        ok = false;
        break;
      }
      TOPOCCL_UNROLL
      for (int i = 0; i < kUnitElements; ++i) {
        if (i >= count) break;
        if (kind == DeviceStepKind::Send) unit.elements[i] = from[i];
        if (reduces) unit.elements[i] = op(unit.elements[i], from[i]);
        if (stores) to[i] = unit.elements[i];
      }
      if (out) writeUnit(outgoing + u * kLowLatencyWordsPerUnit, outFlag, unit);
    }
    if (block_.syncAny(!ok)) return false;
    finishSlice(in, out);
    return true;
  }

  const DevicePlan& plan_;
  const DeviceLane& lane_;
  uint32_t laneIndex_;
  Block& block_;
  uint64_t sendSeq_ = 0;
  uint64_t recvSeq_ = 0;
};

// Lane `laneIndex` of every plan chained from `plan` (DevicePlan::next), in order: one launch runs a fused
// group of calls. A plan with fewer lanes leaves this one out. Each connection must be driven by the same lane
// index in every plan of the chain (core::ChainedConnections checks it): a lane reads its connections'
// counters when it starts a plan, and each counter has one writer. False when a lane stopped early.
template <class T, class Op, class Block>
TOPOCCL_HD bool runPlanChain(const DevicePlan* plan, uint32_t laneIndex, Block& block) {
  for (; plan != nullptr; plan = plan->next)
    if (laneIndex < plan->laneCount && !LaneInterpreter<T, Op, Block>(*plan, laneIndex, block).run()) return false;
  return true;
}

}  // namespace topoccl::kernels
