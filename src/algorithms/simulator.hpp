// Event-driven simulation of a Plan on a CostModel: predicts the collective's time, its algbw and
// busbw (nccl-tests conventions), how busy every resource was, and every transfer.
//
// Sizes. `bytes` is the collective's size as nccl-tests reports it: the AllReduce / Broadcast /
// Reduce buffer; the AllGather output, ReduceScatter input, Gather output, Scatter input (N blocks);
// the AllToAll bytes each rank sends in all (N blocks). One block (the plan's per-rank count c,
// see Plan) is therefore `bytes` for AllReduce / Broadcast / Reduce and bytes / N for the others;
// a chunk is block / chunksPerBlock bytes (fractional bytes are fine: this is a model).
//
// Semantics.
// - Steps of a lane run in order. Each step's chunk range is cut into SimOptions::slices equal
//   slices that pipeline: slice j of a step goes once slice j-1 of it went.
// - A step starts once its deps (steps of other lanes of the rank) have finished and its lane's
//   previous step has finished; a receiving slice also waits for its data to arrive. Reducing
//   kinds then spend gammaUsPerByte per byte, Copy / Reduce steps localCopyUsPerByte (plus gamma
//   for Reduce); a sending slice is then handed to the network, and the lane moves on once its
//   message has left (its resources released: a GPU lane copies the data out before its next step);
//   sends never wait for the receiver to post its receive.
// - The k-th message on a connection (sender, receiver, channel) is the k-th slice received on it;
//   messages of one connection start in order (FIFO).
// - A message of s bytes on route src->dst starts when all of the route's resources are free (and
//   the previous message of its connection started), holds all of them, cut-through, for
//   holdUs + s * betaUsPerByte, and arrives at start + latencyUs + s * betaUsPerByte (CostRoute:
//   a pipelined link's latency delays the message without keeping the link busy). A resource serves one message at a time; among
//   messages waiting for resources the one ready first (then issued first) goes first.
// - Nothing can progress while work remains: Error(ncclInvalidArgument) naming a blocked rank,
//   lane and step. Data sent and never received is the same error.
// With CostModel::uniform these rules reproduce the closed forms of the alpha-beta model exactly:
// ring all-gather (N-1)(alpha + (M/N) beta), ring all-reduce 2(N-1)(alpha + (M/N) beta) +
// (N-1)(M/N) gamma, pipelined chain broadcast with k slices (N-2+k)(alpha + (M/k) beta).
#pragma once

#include <cstdint>
#include <vector>

#include "algorithms/cost_model.hpp"
#include "algorithms/plan.hpp"

namespace topoccl::algo {

struct SimOptions {
  uint32_t slices = 1;       // pipelined slices per step (>= 1)
  bool recordEvents = true;  // fill SimResult::events
};

// One message holding one resource.
struct SimEvent {
  int resource = -1;      // CostModel resource index
  int srcRank = -1;
  int dstRank = -1;
  int channel = 0;
  uint16_t lane = 0;      // the sending lane and step
  uint32_t step = 0;
  uint32_t slice = 0;     // slice index inside the step
  ChunkRange chunks;      // what the sending step sends (the whole step's range)
  double bytes = 0;       // this slice's bytes
  double startUs = 0;
  double endUs = 0;
};

struct ResourceUsage {
  double busyUs = 0;       // sum of the times it was held
  double utilization = 0;  // busyUs / finishUs (0 when finishUs is 0)
  uint64_t messages = 0;
};

struct SimResult {
  double finishUs = 0;     // when the last step finished
  uint64_t bytes = 0;      // the size simulated (nccl-tests terms)
  double algbwGBs = 0;     // bytes / finishUs
  double busbwGBs = 0;     // algbwGBs * busBandwidthFactor
  double busFactor = 0;
  uint64_t messages = 0;   // messages sent (slices)
  double bytesSent = 0;    // over all messages
  std::vector<ResourceUsage> resources;  // by CostModel resource index
  std::vector<SimEvent> events;          // by start time (when recorded)
};

// nccl-tests bus bandwidth factor: AllReduce 2(n-1)/n; AllGather, ReduceScatter, AllToAll,
// Gather, Scatter (n-1)/n; Broadcast, Reduce 1.
double busBandwidthFactor(Collective c, int nranks) noexcept;
// Bytes of one block of the plan for a collective of `bytes` (see above).
double blockBytes(Collective c, int nranks, uint64_t bytes) noexcept;

// The model must have at least plan.nranks ranks. Throws Error(ncclInvalidArgument) on a malformed
// plan (peer out of range, bad dep) or a deadlock.
SimResult simulate(const Plan& plan, uint64_t bytes, const CostModel& model, const SimOptions& options = {});

}  // namespace topoccl::algo
