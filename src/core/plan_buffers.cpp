#include "core/plan_buffers.hpp"

#include <string>

#include "common/error.hpp"

namespace topoccl::core {

ResolvedRange resolveRange(const algo::Plan& plan, const algo::ChunkRange& range, const PlanBuffers& buffers, int rank) {
  const algo::ElementRange elements = algo::rangeElements(plan, buffers.count, range, chunkAlignElements(buffers.elementSize));
  ResolvedRange resolved;
  resolved.bytes = elements.size() * buffers.elementSize;
  char* base = nullptr;
  switch (range.buffer) {
    case algo::BufferId::Input: base = const_cast<char*>(buffers.input); break;
    case algo::BufferId::Output: base = buffers.output; break;
    case algo::BufferId::Scratch: base = buffers.scratch; break;
  }
  if (!base && resolved.bytes > 0)
    throwInternalError(std::string("plan '") + plan.name + "' touches the " + algo::bufferName(range.buffer) +
                       " buffer of rank " + std::to_string(rank) + ", which has none");
  resolved.data = base ? base + elements.begin * buffers.elementSize : nullptr;
  return resolved;
}

size_t scratchBytes(const algo::Plan& plan, size_t count, size_t elementSize) {
  const size_t scratchBlocks = (plan.scratchChunks + plan.chunksPerBlock - 1) / plan.chunksPerBlock;
  return scratchBlocks * count * elementSize;
}

}  // namespace topoccl::core
