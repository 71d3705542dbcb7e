// The Plan IR: one data structure from generators / synthesizer / MSCCL import to the executor.
// A plan is data. It names chunks of three buffers (input, output, scratch) and, per rank, a few
// lanes of ordered steps. The executor (src/core) runs it; the validator proves it first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace topoccl::algo {

enum class Collective : uint8_t {
  AllReduce,
  AllGather,
  ReduceScatter,
  Broadcast,
  Reduce,
  AllToAll,
  Gather,
  Scatter,
};
inline constexpr int kNumCollectives = 8;
const char* collectiveName(Collective c) noexcept;  // "allreduce", "allgather", ...

enum class BufferId : uint8_t { Input, Output, Scratch };
const char* bufferName(BufferId b) noexcept;

// What one step does. "incoming" is the data received on the lane's receive connection.
enum class StepKind : uint8_t {
  Nop,                 // only waits for its dependencies
  Send,                // send src
  Recv,                // dst = incoming
  RecvReduceSend,      // send (incoming (+) src); nothing stored locally
  RecvReduceCopy,      // dst = incoming (+) src
  RecvCopySend,        // dst = incoming; send dst
  RecvReduceCopySend,  // dst = incoming (+) src; send dst
  Copy,                // dst = src (local)
  Reduce,              // dst = dst (+) src (local)
};
const char* stepKindName(StepKind k) noexcept;  // MSCCL spelling: "s", "r", "rrs", "rrc", "rcs", "rrcs", "cpy", "re", "nop"
// Inline: the executor asks on every step of every call.
constexpr bool stepSends(StepKind k) noexcept {
  return k == StepKind::Send || k == StepKind::RecvReduceSend || k == StepKind::RecvCopySend ||
         k == StepKind::RecvReduceCopySend;
}
constexpr bool stepReceives(StepKind k) noexcept {
  return k == StepKind::Recv || k == StepKind::RecvReduceSend || k == StepKind::RecvReduceCopy ||
         k == StepKind::RecvCopySend || k == StepKind::RecvReduceCopySend;
}
constexpr bool stepReads(StepKind k) noexcept {  // reads src
  return k == StepKind::Send || k == StepKind::RecvReduceSend || k == StepKind::RecvReduceCopy ||
         k == StepKind::RecvReduceCopySend || k == StepKind::Copy || k == StepKind::Reduce;
}
constexpr bool stepWrites(StepKind k) noexcept {  // writes dst
  return k == StepKind::Recv || k == StepKind::RecvReduceCopy || k == StepKind::RecvCopySend ||
         k == StepKind::RecvReduceCopySend || k == StepKind::Copy || k == StepKind::Reduce;
}

// A run of `count` consecutive chunks of one buffer, starting at chunk `offset`.
struct ChunkRange {
  BufferId buffer = BufferId::Input;
  uint32_t offset = 0;
  uint32_t count = 0;
  bool operator==(const ChunkRange&) const = default;
};

struct StepRef {
  uint16_t lane = 0;
  uint32_t step = 0;
  bool operator==(const StepRef&) const = default;
};

struct Step {
  StepKind kind = StepKind::Nop;
  ChunkRange src;               // meaningful when stepReads(kind)
  ChunkRange dst;               // meaningful when stepWrites(kind); for Send/RecvReduceSend unused
  std::vector<StepRef> deps;    // steps of other lanes of this rank that must finish first
  // A receive over bytes that a send of this rank may still be reading (in place) waits for that send to be read,
  // instead of landing in a bounce slot and crossing the caches again. Set only by a generator that knows the peer
  // reads that send without waiting on this receive (reduce_scatter_allgather's gather): where both sides of an
  // in-place exchange each waited for their own send, neither would be read. Plans from files never set it.
  bool waitsOutOwnSends = false;
  // Result mirrors, marked in pairs by a generator that knows what the peer does with a send (plans from files never
  // set them; the validator proves the plan without them). On a Send: the peer reduces these bytes into a result it
  // then sends back to this rank's Recv `resultReturnsIn`, unchanged. On the peer's Send of that result:
  // `sendsResultOf` is the receive-reduce that produced it (on a RecvReduceCopySend that forwards it back: itself). Where the connection lets the receiver write our memory
  // (shm zero copy, one process), it writes each result slice straight into that Recv's destination as it reduces,
  // and both the send back and the Recv skip the slice.
  std::optional<StepRef> resultReturnsIn{};
  std::optional<StepRef> sendsResultOf{};
};

// A lane (MSCCL thread block, NCCL channel) talks to at most one send peer and one receive peer.
// The pair (sender rank, receiver rank, channel) names one ordered connection; steps of a lane run
// in order, and the slices inside one step pipeline.
struct Lane {
  int sendPeer = -1;
  int recvPeer = -1;
  int channel = 0;
  std::vector<Step> steps;
};

struct RankProgram {
  std::vector<Lane> lanes;
};

// How chunks map to elements. The collective's per-rank count `c` (AllReduce count, AllGather
// sendcount, ReduceScatter recvcount, AllToAll per-peer count, ...) is one block. A buffer of B
// blocks holds B * chunksPerBlock chunks; chunk k is part (k % chunksPerBlock) of block
// (k / chunksPerBlock), and part p of a block covers elements [p*c/cpb, (p+1)*c/cpb) of it.
// Steps may only move data between chunks of the same part index, so sizes always agree.
struct Plan {
  std::string name;                 // generator name: "ring", "recursive_doubling", "direct", ...
  Collective collective = Collective::AllReduce;
  int nranks = 0;
  int root = -1;                    // rooted collectives only
  uint32_t chunksPerBlock = 1;
  uint32_t inputChunks = 0;         // per rank: the largest over ranks (the root's where only it has one)
  uint32_t outputChunks = 0;        // likewise; rank r's own size is xxxBlocks(..., r, root) * chunksPerBlock
  uint32_t scratchChunks = 0;
  bool inPlace = true;              // valid when input and output are the NCCL in-place layout
  bool outOfPlace = true;           // valid when input and output are distinct
  uint64_t minBytes = 0;            // size range this plan is meant for (selection hint)
  uint64_t maxBytes = UINT64_MAX;
  std::string topologyFingerprint;  // topology it was made for; empty means any
  double predictedMicros = 0;       // from the simulator, 0 when not simulated
  std::vector<RankProgram> ranks;   // ranks[r] is rank r's program
};

// Element range of a chunk range, given the per-rank count `c` (see Plan).
struct ElementRange {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};
// Part boundaries inside a block fall on multiples of `align` elements (the last part ends where the block
// does), so a chunk starts 16-byte aligned wherever its block does when align = 16 / element size: the GPU's
// copies and reductions move 16 bytes a thread only between co-aligned ranges (an H200 ring over 24 lanes,
// whose chunks fell off 16 bytes, ran at 28 GB/s against 135-210 over 16 and 32).
ElementRange chunkElements(const Plan& plan, size_t blockCount, uint32_t chunk, size_t align = 1) noexcept;
ElementRange rangeElements(const Plan& plan, size_t blockCount, const ChunkRange& range, size_t align = 1) noexcept;

// Blocks per buffer for a collective: how many per-rank counts the input / output hold.
uint32_t inputBlocks(Collective c, int nranks, int rank, int root) noexcept;
uint32_t outputBlocks(Collective c, int nranks, int rank, int root) noexcept;

// In-place aliasing. The executor treats Input and Output as the user's send and receive pointers,
// and in the NCCL in-place layout they overlap: on `rank`, Input blocks [inputBlock, inputBlock +
// blocks) are the same memory as Output blocks [outputBlock, outputBlock + blocks) (blocks == 0: no
// overlap on this rank). AllReduce, AllToAll, and Broadcast / Reduce at the root: the whole buffer;
// AllGather: input = output block `rank`; ReduceScatter: output = input block `rank`; Gather at the
// root: input = output block `root`; Scatter at the root: output = input block `root`.
// Conventions a plan valid in place relies on (the validator proves them, the executor honours them):
// - A Copy whose source and destination are the same memory is a no-op and must be skipped.
// - Steps never write Input (the user's send buffer is const); in place they write Output, which may
//   be the same memory as part of Input.
// - A step may read and write the same chunks exactly (rrc/rrcs/re with src == dst, element by
//   element), never ranges that overlap shifted.
struct InPlaceAlias {
  uint32_t inputBlock = 0;
  uint32_t outputBlock = 0;
  uint32_t blocks = 0;
};
InPlaceAlias inPlaceAlias(Collective c, int nranks, int rank, int root) noexcept;

}  // namespace topoccl::algo
