// The nine nccl-tests collectives: sizes, nccl-tests' buffer conventions (in place included), busbw factors
// (reference/nccl.md §7) and each output element's expected value, computed from the inputs independently of
// the library. perf_main.cpp picks one by TOPOCCL_PERF_SPEC.
#include "collectives.hpp"

namespace topoccl::perf {
namespace {

using Input = double (*)(int, size_t, void*);

double one(int) { return 1.0; }
double ringFactor(int n) { return n > 0 ? static_cast<double>(n - 1) / n : 0.0; }
double allReduceFactor(int n) { return 2.0 * ringFactor(n); }

// Per-rank count = bytes / eltSize (whole buffer per rank).
void wholeCounts(size_t bytes, size_t elt, int, size_t& pc, size_t& se, size_t& re) { pc = se = re = bytes / elt; }
// Per-peer count = bytes / eltSize / n; `gathered` side holds n of them.
void splitCounts(size_t bytes, size_t elt, int n, size_t& pc, bool sendGathered, bool recvGathered, size_t& se, size_t& re) {
  pc = bytes / elt / static_cast<size_t>(n);
  se = sendGathered ? pc * static_cast<size_t>(n) : pc;
  re = recvGathered ? pc * static_cast<size_t>(n) : pc;
}
double wholeBytes(size_t pc, size_t elt, int) { return static_cast<double>(pc * elt); }
double gatheredBytes(size_t pc, size_t elt, int n) { return static_cast<double>(pc * elt) * n; }

// In place: the runner has placed send and recv (the allocations plus any -u offset); these alias one into
// the other as nccl-tests does.
void sameBuffer(RankContext& c, size_t, size_t) { c.send = c.recv; }
// The rank's own block inside the gathered receive buffer (AllGather, Gather).
void sendInsideRecv(RankContext& c, size_t pc, size_t elt) { c.send = c.recv + static_cast<size_t>(c.rank) * pc * elt; }
// The rank's own block inside the gathered send buffer (ReduceScatter, Scatter).
void recvInsideSend(RankContext& c, size_t pc, size_t elt) { c.recv = c.send + static_cast<size_t>(c.rank) * pc * elt; }

}  // namespace

const CollectiveSpec kAllReduce{
    "all_reduce", true, false,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) { wholeCounts(b, e, n, pc, se, re); },
    wholeBytes, allReduceFactor, sameBuffer,
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t op, int) {
      return ncclAllReduce(c.send, c.recv, pc, t, op, c.comm, c.stream);
    },
    [](int, int n, size_t i, size_t, int, ncclRedOp_t op, Input in, void* st, double& v) {
      v = reduceValues(op, n, in, st, i);
      return true;
    }};

const CollectiveSpec kAllGather{
    "all_gather", false, false,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) { splitCounts(b, e, n, pc, false, true, se, re); },
    gatheredBytes, ringFactor, sendInsideRecv,
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t, int) {
      return ncclAllGather(c.send, c.recv, pc, t, c.comm, c.stream);
    },
    [](int, int, size_t i, size_t pc, int, ncclRedOp_t, Input in, void* st, double& v) {
      v = in(static_cast<int>(i / pc), i % pc, st);
      return true;
    }};

const CollectiveSpec kReduceScatter{
    "reduce_scatter", true, false,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) { splitCounts(b, e, n, pc, true, false, se, re); },
    gatheredBytes, ringFactor, recvInsideSend,
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t op, int) {
      return ncclReduceScatter(c.send, c.recv, pc, t, op, c.comm, c.stream);
    },
    [](int rank, int n, size_t i, size_t pc, int, ncclRedOp_t op, Input in, void* st, double& v) {
      v = reduceValues(op, n, in, st, static_cast<size_t>(rank) * pc + i);
      return true;
    }};

const CollectiveSpec kAlltoAll{
    "alltoall", false, false,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) { splitCounts(b, e, n, pc, true, true, se, re); },
    gatheredBytes, ringFactor, sameBuffer,
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t, int) {
      return ncclAlltoAll(c.send, c.recv, pc, t, c.comm, c.stream);
    },
    [](int rank, int, size_t i, size_t pc, int, ncclRedOp_t, Input in, void* st, double& v) {
      v = in(static_cast<int>(i / pc), static_cast<size_t>(rank) * pc + i % pc, st);
      return true;
    }};

const CollectiveSpec kBroadcast{
    "broadcast", false, true,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) { wholeCounts(b, e, n, pc, se, re); },
    wholeBytes, [](int n) { return one(n); }, sameBuffer,
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t, int root) {
      return ncclBroadcast(c.send, c.recv, pc, t, root, c.comm, c.stream);
    },
    [](int, int, size_t i, size_t, int root, ncclRedOp_t, Input in, void* st, double& v) {
      v = in(root, i, st);
      return true;
    }};

const CollectiveSpec kReduce{
    "reduce", true, true,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) { wholeCounts(b, e, n, pc, se, re); },
    wholeBytes, [](int n) { return one(n); }, sameBuffer,
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t op, int root) {
      return ncclReduce(c.send, c.recv, pc, t, op, root, c.comm, c.stream);
    },
    [](int rank, int n, size_t i, size_t, int root, ncclRedOp_t op, Input in, void* st, double& v) {
      if (rank != root) return false;
      v = reduceValues(op, n, in, st, i);
      return true;
    }};

// Each rank sends to rank + 1 and receives from rank - 1 in one group (nccl-tests' sendrecv).
const CollectiveSpec kSendRecv{
    "sendrecv", false, false,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) { wholeCounts(b, e, n, pc, se, re); },
    wholeBytes, [](int n) { return one(n); },
    [](RankContext&, size_t, size_t) {},  // in place has no meaning for a shift: separate buffers, as out of place
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t, int) {
      ncclResult_t r = ncclGroupStart();
      if (r == ncclSuccess) r = ncclSend(c.send, pc, t, (c.rank + 1) % c.nranks, c.comm, c.stream);
      if (r == ncclSuccess) r = ncclRecv(c.recv, pc, t, (c.rank + c.nranks - 1) % c.nranks, c.comm, c.stream);
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    },
    [](int rank, int n, size_t i, size_t, int, ncclRedOp_t, Input in, void* st, double& v) {
      v = in((rank + n - 1) % n, i, st);
      return true;
    }};

const CollectiveSpec kGather{
    "gather", false, true,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) { splitCounts(b, e, n, pc, false, true, se, re); },
    gatheredBytes, ringFactor, sendInsideRecv,
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t, int root) {
      return ncclGather(c.send, c.recv, pc, t, root, c.comm, c.stream);
    },
    [](int rank, int, size_t i, size_t pc, int root, ncclRedOp_t, Input in, void* st, double& v) {
      if (rank != root) return false;
      v = in(static_cast<int>(i / pc), i % pc, st);
      return true;
    }};

const CollectiveSpec kScatter{
    "scatter", false, true,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) { splitCounts(b, e, n, pc, true, false, se, re); },
    gatheredBytes, ringFactor, recvInsideSend,
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t, int root) {
      return ncclScatter(c.send, c.recv, pc, t, root, c.comm, c.stream);
    },
    [](int rank, int, size_t i, size_t pc, int root, ncclRedOp_t, Input in, void* st, double& v) {
      v = in(root, static_cast<size_t>(rank) * pc + i, st);
      return true;
    }};

}  // namespace topoccl::perf
