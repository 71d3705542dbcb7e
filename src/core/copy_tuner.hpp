// Chooses, per call shape, whether an operation's copies go through the caches or around them (streaming stores),
// by timing both. Whether a footprint fits the last-level cache depends on what else uses that cache: on a VM other
// tenants and where the vCPUs sit move the edge from one launch to the next, so a fixed threshold was 2x wrong in
// both directions on the same machine kind (perf/RESULTS.md, session 48). CopyTuner itself has no clock and no
// communicator: the caller reports each call's copy time (the timed* copies below keep it per thread), so the
// policy is tested alone.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>

namespace topoccl::core {

enum class CopyKernel : uint8_t { Cached = 0, Streaming = 1 };
const char* copyKernelName(CopyKernel kernel);

// The copies a timed call runs: each adds its time to the calling thread's copyNanoseconds(), so a call is judged
// by its own copies, not by how late its peers came (which made two ranks of one call choose differently).
void timedCachedCopy(void* dst, const void* src, size_t bytes);      // kernels::bulkCopy
void timedMemcpy(void* dst, const void* src, size_t bytes);          // memcpy (TOPOCCL_BULK_COPY=0)
void timedStreamingCopy(void* dst, const void* src, size_t bytes);   // kernels::streamingCopy
uint64_t copyNanoseconds();

class CopyTuner {
 public:
  // A call shape: the plan it runs and its bytes a block. Calls of one shape on every rank come in the same
  // order, so every rank explores on the same calls.
  struct Shape {
    const void* plan = nullptr;
    uint64_t blockBytes = 0;
    bool operator==(const Shape&) const = default;
  };
  // What begin() decided for one call; finish() reports its time.
  struct Ticket {
    CopyKernel kernel = CopyKernel::Cached;
    Shape shape;
    bool timed = false;   // false: the call is not measured (a shape's first call, or the table was full)
    bool steady = false;  // the shape's call before ran the same kernel; only such calls count
  };
  // Times count only for a call whose predecessor ran the same kernel: a streaming call after a cached one pays
  // for writing back the lines that one left dirty (2-rank 8 MiB all-to-all: 0.5-0.7 ms against 0.3). So each
  // kernel runs three times before the first choice (rival first), and every kExploreEvery calls the one not
  // preferred runs twice; with its return that is 3 calls of 64 off the faster kernel.
  static constexpr uint64_t kExploreEvery = 64;
  // Steady times of each kernel before the first choice: cached copies took 2-3 calls to warm up after
  // streaming ones (2-rank 4 MiB all-to-all: 316, 405, 175, 136 us).
  static constexpr uint64_t kFirstSamples = 2;
  // Shapes tracked; calls of further shapes take begin()'s fallback, untimed.
  static constexpr size_t kMaxShapes = 256;
  // A kernel's estimate is the lower median of its last this-many times: one slow call in it (a neighbour's
  // burst) moves nothing, and a changed machine shows in two explorations.
  static constexpr size_t kWindow = 4;
  // The other kernel takes over once its estimate is this much lower, from the first comparison on (the fallback
  // is the static rule's choice, right at either end of the sizes): kernels within the noise of each other do not
  // flip back and forth.
  static constexpr double kSwitchMargin = 0.05;

  // The kernel for the next call of `shape`. `fallback` (the static rule's choice) runs a shape's first call, whose
  // page faults and cold caches say nothing of either kernel, and every call once the table is full.
  Ticket begin(const Shape& shape, CopyKernel fallback);
  // The call of `ticket` took `nanoseconds`.
  void finish(const Ticket& ticket, double nanoseconds);

  struct Estimate {
    uint64_t calls = 0;                                  // begun
    std::array<std::array<double, kWindow>, 2> recent{};  // per kernel, its last times (a ring)
    std::array<uint64_t, 2> samples{};                   // steady calls timed per kernel
    CopyKernel preferred = CopyKernel::Cached;
    CopyKernel last = CopyKernel::Cached;  // the kernel of the last call begun
    // Kernel `k`'s estimated time: the lower median of its recent times; 0 before any.
    double nanoseconds(CopyKernel k) const;
  };
  // What is known of `shape`; null if it was never begun.
  const Estimate* estimate(const Shape& shape) const;
  size_t shapes() const { return table_.size(); }

 private:
  struct ShapeHash {
    size_t operator()(const Shape& s) const noexcept {
      return std::hash<const void*>()(s.plan) ^ (std::hash<uint64_t>()(s.blockBytes) * 0x9e3779b97f4a7c15ull);
    }
  };
  std::unordered_map<Shape, Estimate, ShapeHash> table_;
};

}  // namespace topoccl::core
