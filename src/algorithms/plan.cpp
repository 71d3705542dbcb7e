#include "algorithms/plan.hpp"

namespace topoccl::algo {

const char* collectiveName(Collective c) noexcept {
  switch (c) {
    case Collective::AllReduce: return "allreduce";
    case Collective::AllGather: return "allgather";
    case Collective::ReduceScatter: return "reducescatter";
    case Collective::Broadcast: return "broadcast";
    case Collective::Reduce: return "reduce";
    case Collective::AllToAll: return "alltoall";
    case Collective::Gather: return "gather";
    case Collective::Scatter: return "scatter";
  }
  return "unknown";
}

const char* bufferName(BufferId b) noexcept {
  switch (b) {
    case BufferId::Input: return "input";
    case BufferId::Output: return "output";
    case BufferId::Scratch: return "scratch";
  }
  return "unknown";
}

const char* stepKindName(StepKind k) noexcept {
  switch (k) {
    case StepKind::Nop: return "nop";
    case StepKind::Send: return "s";
    case StepKind::Recv: return "r";
    case StepKind::RecvReduceSend: return "rrs";
    case StepKind::RecvReduceCopy: return "rrc";
    case StepKind::RecvCopySend: return "rcs";
    case StepKind::RecvReduceCopySend: return "rrcs";
    case StepKind::Copy: return "cpy";
    case StepKind::Reduce: return "re";
  }
  return "unknown";
}

ElementRange chunkElements(const Plan& plan, size_t blockCount, uint32_t chunk, size_t align) noexcept {
  const uint64_t cpb = plan.chunksPerBlock;
  const uint64_t block = chunk / cpb;
  const uint64_t part = chunk % cpb;
  // floor(blockCount * p / cpb) without overflow: split blockCount = whole * cpb + rest, so the
  // product that is divided is rest * p < cpb^2, which fits in 64 bits (cpb < 2^32).
  const uint64_t whole = blockCount / cpb;
  const uint64_t rest = blockCount % cpb;
  const size_t step = align == 0 ? 1 : align;
  const auto partStart = [&](uint64_t p) {
    if (p >= cpb) return blockCount;
    const auto start = static_cast<size_t>(whole * p + (rest * p) / cpb);
    return start / step * step;
  };
  const size_t base = static_cast<size_t>(block) * blockCount;
  return {base + partStart(part), base + partStart(part + 1)};
}

ElementRange rangeElements(const Plan& plan, size_t blockCount, const ChunkRange& range, size_t align) noexcept {
  if (range.count == 0) {
    const ElementRange at = chunkElements(plan, blockCount, range.offset, align);
    return {at.begin, at.begin};
  }
  const ElementRange first = chunkElements(plan, blockCount, range.offset, align);
  const ElementRange last = chunkElements(plan, blockCount, range.offset + range.count - 1, align);
  return {first.begin, last.end};
}

uint32_t inputBlocks(Collective c, int nranks, int rank, int root) noexcept {
  switch (c) {
    case Collective::AllReduce:
    case Collective::AllGather:
    case Collective::Reduce:
    case Collective::Gather: return 1;
    case Collective::Broadcast: return rank == root ? 1 : 0;
    case Collective::ReduceScatter:
    case Collective::AllToAll: return static_cast<uint32_t>(nranks);
    case Collective::Scatter: return rank == root ? static_cast<uint32_t>(nranks) : 0;
  }
  return 0;
}

uint32_t outputBlocks(Collective c, int nranks, int rank, int root) noexcept {
  switch (c) {
    case Collective::AllReduce:
    case Collective::ReduceScatter:
    case Collective::Broadcast:
    case Collective::Scatter: return 1;
    case Collective::Reduce: return rank == root ? 1 : 0;
    case Collective::AllGather:
    case Collective::AllToAll: return static_cast<uint32_t>(nranks);
    case Collective::Gather: return rank == root ? static_cast<uint32_t>(nranks) : 0;
  }
  return 0;
}

InPlaceAlias inPlaceAlias(Collective c, int nranks, int rank, int root) noexcept {
  const auto self = static_cast<uint32_t>(rank);
  switch (c) {
    case Collective::AllReduce:
    case Collective::AllToAll: return {0, 0, inputBlocks(c, nranks, rank, root)};
    case Collective::Broadcast:
    case Collective::Reduce: return rank == root ? InPlaceAlias{0, 0, 1} : InPlaceAlias{};
    case Collective::AllGather: return {0, self, 1};
    case Collective::ReduceScatter: return {self, 0, 1};
    case Collective::Gather: return rank == root ? InPlaceAlias{0, self, 1} : InPlaceAlias{};
    case Collective::Scatter: return rank == root ? InPlaceAlias{self, 0, 1} : InPlaceAlias{};
  }
  return {};
}

}  // namespace topoccl::algo
