// MSCCL XML (<algo><gpu><tb><step>), the exchange format with TACCL, msccl-tools / MSCCLang and
// MSCCL's two runtimes (microsoft/msccl and the msccl-executor-nccl parser). Import turns a file into
// a Plan; export writes a Plan as XML that both runtimes' parsers accept. Neither validates the plan
// semantically: call validate() (validator.hpp) before running an imported plan.
//
// Chunk counts. An MSCCL chunk and a Plan chunk are the same unit, and offsets map one to one.
// MSCCL cuts the *largest* buffer of the collective into `nchunksperloop` chunks: the executor's
// chunk size is count * sizeMultiplier / nchunksperloop, where count is the per-rank count (NCCL's
// sendcount for AllGather, recvcount for ReduceScatter, per-peer count for AllToAll) and
// sizeMultiplier is ngpus for allgather / reducescatter / alltoall, else 1. In Plan terms the
// per-rank count is one block of chunksPerBlock chunks, so
//     nchunksperloop = chunksPerBlock * B,   B = max over ranks of max(inputBlocks, outputBlocks)
// i.e. B = ngpus for allgather, reducescatter, alltoall, gather and scatter, and 1 for allreduce,
// broadcast and reduce. Per GPU, i_chunks = inputBlocks(c, n, rank, root) * chunksPerBlock and
// o_chunks = outputBlocks(...) * chunksPerBlock (so allgather: i_chunks * ngpus = nchunksperloop and
// reducescatter: o_chunks * ngpus = nchunksperloop, exactly the old runtime's consistency check);
// s_chunks = Plan::scratchChunks. Plan::inputChunks / outputChunks are the largest over ranks.
// Import refuses an nchunksperloop that is not a multiple of B, and an i_chunks / o_chunks other
// than 0 (buffer unused), the rank's own size, or the largest over ranks (a rooted collective's
// unused buffer declared full size). A step touching chunks beyond its GPU's declared count is refused.
//
// Import.
// - <algo>: ngpus, coll, nchunksperloop, nchannels, proto, inplace are required; coll accepts
//   both spellings of reduce-scatter (reduce_scatter, reducescatter), plus allreduce, allgather,
//   broadcast, reduce, alltoall, gather, scatter. outofplace defaults to 0 (the old runtime never
//   reads it); minBytes / maxBytes default to 0 / unlimited (maxBytes = INT64_MAX reads as
//   unlimited). An optional root="r" names the root of a rooted collective (our extension, which both
//   runtimes ignore); without it the root is the only GPU declaring the rooted buffer (broadcast,
//   scatter: input; reduce, gather: output), else the only GPU whose steps use it.
// - <gpu id i_chunks o_chunks s_chunks>: one per rank, ids 0..ngpus-1 each exactly once. <copy>
//   children (TACCL) are ignored.
// - <tb id send recv chan>: ids contiguous from 0, in any order; tb id = lane index; send / recv =
//   Lane::sendPeer / recvPeer (-1 or another rank, never the GPU itself); chan = Lane::channel.
// - <step s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep> (all required, as the runtimes
//   require them), s = 0, 1, 2, ... in document order. type s/r/rcs/rrs/rrc/rrcs/cpy/re/nop maps to
//   StepKind; buffers i/o/s to Input/Output/Scratch; a used side (stepReads: src, stepWrites: dst)
//   becomes ChunkRange{buffer, off, cnt} with 1 <= cnt < 72, an unused side is left default.
//   The newer MSCCLang spelling <op step type buf off [cnt=1] [depid] [deps] [hasdep]> is accepted:
//   buf/off is the source of sending types and the destination of the others, and the other side of
//   rrc / rrcs / rcs is the same chunks; cpy and re need explicit srcbuf/srcoff/dstbuf/dstoff. Without
//   nchunksperloop (as MSCCLang's new format writes) it is the largest i_chunks / o_chunks.
// - depid / deps name (tb id, step s) on the same GPU. Both runtimes fold a run of nop steps into
//   the next real step, which then waits for every nop's dependency; import does the same (the real
//   step gets all the deps, nops first), keeping only trailing nops as StepKind::Nop steps. A
//   dependency on an earlier step of the step's own tb is dropped (lane order implies it); a
//   dependency on a nop, on a step with hasdep=0, or on a later step of its own tb is refused.
// Errors throw topoccl::Error(ncclInvalidArgument) with "<source>:<line>: " and the element and
// attribute at fault; malformed XML reports pugixml's reason at its line.
//
// Export writes every attribute either runtime requires (name, proto, nchannels, nchunksperloop,
// ngpus, coll, inplace, outofplace, minBytes, maxBytes; per step all ten), tb ids 0.. in lane
// order, offsets -1 on unused sides, hasdep=1 exactly on steps something depends on, and a step with
// k > 1 deps as k-1 nop steps carrying one dep each followed by the step carrying the last. It
// refuses (Error(ncclInvalidArgument)) what MSCCL cannot express: more than 256 steps in a tb (nops
// included), cnt outside 1..71, channels >= 32, more than 216 tbs per GPU or 32 sending / receiving
// tbs per channel, a lane peer equal to its own rank, a step whose src and dst counts differ, a
// dependency on a Nop step, and a dependency on a step after nops or fused re steps in its lane:
// the runtimes number dependency flags by real (fused) transmissions, not by s, so there the two
// numberings would disagree.
#pragma once

#include <cstdint>
#include <string>

#include "algorithms/plan.hpp"

namespace topoccl::algo {

inline constexpr uint32_t kMscclMaxCount = 72;             // cnt < 72
inline constexpr size_t kMscclMaxStepsPerTb = 256;         // s < 256, nops included
inline constexpr int kMscclMaxChannels = 32;               // chan < MAXCHANNELS
inline constexpr size_t kMscclMaxTbs = 216;                // tbs per GPU (108 * 2)
inline constexpr size_t kMscclMaxTbsPerChannel = 32;       // sending (or receiving) tbs per channel

struct MscclWriteOptions {
  std::string protocol = "Simple";   // proto: Simple, LL or LL128
  int nthreads = 0;                  // 0: omit; else written as nthreads (a multiple of 32, <= 1024)
  bool oldReduceScatterName = false; // coll="reduce_scatter" (microsoft/msccl) instead of "reducescatter"
  std::string name;                  // algo name; empty: the plan's name
};

Plan parseMscclXml(const std::string& text, const std::string& sourceName);
Plan loadMscclXml(const std::string& path);
std::string writeMscclXml(const Plan& plan, const MscclWriteOptions& options = {});

// MSCCL's nchunksperloop for a plan: chunksPerBlock * max over ranks of max(input, output) blocks.
uint32_t mscclChunksPerLoop(const Plan& plan) noexcept;

}  // namespace topoccl::algo
