// Where a plan's chunk ranges lie in one rank's memory: shared by the host executor's resolution
// (Communicator::buildCollective) and the GPU lowering (device_lowering.hpp), so both read a plan alike.
#pragma once

#include <cstddef>

#include "algorithms/plan.hpp"

namespace topoccl::core {

// One rank's three buffers for one call. count is the collective's per-rank count (one block).
struct PlanBuffers {
  const char* input = nullptr;
  char* output = nullptr;
  char* scratch = nullptr;
  size_t count = 0;
  size_t elementSize = 0;
};

struct ResolvedRange {
  char* data = nullptr;  // null only when bytes == 0
  size_t bytes = 0;
};

// Elements a chunk boundary is a multiple of (algo::chunkElements): 16 bytes' worth where the element size
// divides 16, so chunks start where vector loads and stores can.
inline size_t chunkAlignElements(size_t elementSize) {
  return elementSize != 0 && 16 % elementSize == 0 ? 16 / elementSize : 1;
}

// The memory of `range` on `rank`. A non-empty range in a buffer the rank lacks is an internal error
// (the plan is wrong for this call), named with the plan.
ResolvedRange resolveRange(const algo::Plan& plan, const algo::ChunkRange& range, const PlanBuffers& buffers, int rank);

// Scratch bytes the plan needs for a call of `count` elements of `elementSize` bytes (whole blocks).
size_t scratchBytes(const algo::Plan& plan, size_t count, size_t elementSize);

}  // namespace topoccl::core
