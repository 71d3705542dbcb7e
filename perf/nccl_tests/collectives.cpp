// The eleven nccl-tests collectives: sizes, nccl-tests' buffer conventions (in place included), busbw factors
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

// alltoallv's count from sender to receiver: count, 3/4 or 1/2 of it.
size_t vcount(size_t pc, int sender, int receiver) {
  return pc - static_cast<size_t>((sender + 2 * receiver) % 3) * (pc / 4);
}

size_t typeBytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;  // ncclInt64, ncclUint64, ncclFloat64
  }
}

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
    },
    false, false};

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
    },
    false, false};

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
    },
    false, false};

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
    },
    false, false};

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
    },
    false, false};

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
    },
    false, false};

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
    },
    false, false};

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
    },
    false, false};

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
    },
    false, false};

// alltoallv: every rank sends to every rank (itself too) with ncclSend/ncclRecv in one group, as nccl-tests'
// alltoallv, into blocks of count elements. The counts vary by pair (count, 3/4 or 1/2 of it, by (sender + 2 x
// receiver) mod 3), so the receiver must not write past what each peer sent: the rest of each block stays zero.
// algbw counts the largest a rank may move (count x n), as nccl-tests. In place has no meaning for it (nccl-tests
// does not check it): separate buffers, as out of place.
const CollectiveSpec kAlltoAllv{
    "alltoallv", false, false,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) { splitCounts(b, e, n, pc, true, true, se, re); },
    gatheredBytes, ringFactor,
    [](RankContext&, size_t, size_t) {},
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t, int) {
      const size_t block = pc * static_cast<size_t>(typeBytes(t));
      ncclResult_t r = ncclGroupStart();
      for (int peer = 0; peer < c.nranks && r == ncclSuccess; ++peer) {
        r = ncclSend(c.send + static_cast<size_t>(peer) * block, vcount(pc, c.rank, peer), t, peer, c.comm, c.stream);
        if (r == ncclSuccess)
          r = ncclRecv(c.recv + static_cast<size_t>(peer) * block, vcount(pc, peer, c.rank), t, peer, c.comm, c.stream);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    },
    [](int rank, int, size_t i, size_t pc, int, ncclRedOp_t, Input in, void* st, double& v) {
      const int sender = static_cast<int>(i / pc);
      const size_t offset = i % pc;
      v = offset < vcount(pc, sender, rank) ? in(sender, static_cast<size_t>(rank) * pc + offset, st) : 0.0;
      return true;
    },
    false, false};

// hypercube: an all-gather by log2(n) rounds of send/recv, round k exchanging 2^k blocks with rank ^ 2^k, each
// round its own group (nccl-tests' hypercube). The own block goes in by a send to itself (nccl-tests copies it
// with cudaMemcpyAsync). Counts are multiples of 4 elements; algbw counts the (n - 1) blocks received, busbw = algbw.
const CollectiveSpec kHyperCube{
    "hypercube", false, false,
    [](size_t b, size_t e, int n, size_t& pc, size_t& se, size_t& re) {
      pc = b / e / (4 * static_cast<size_t>(n)) * 4;
      se = pc;
      re = pc * static_cast<size_t>(n);
    },
    [](size_t pc, size_t elt, int n) { return static_cast<double>(pc * elt) * (n - 1); }, [](int n) { return one(n); },
    sendInsideRecv,
    [](const RankContext& c, size_t pc, ncclDataType_t t, ncclRedOp_t, int) {
      const size_t block = pc * static_cast<size_t>(typeBytes(t));
      ncclResult_t r = ncclSuccess;
      char* own = c.recv + static_cast<size_t>(c.rank) * block;
      if (own != c.send) {
        r = ncclGroupStart();
        if (r == ncclSuccess) r = ncclSend(c.send, pc, t, c.rank, c.comm, c.stream);
        if (r == ncclSuccess) r = ncclRecv(own, pc, t, c.rank, c.comm, c.stream);
        const ncclResult_t end = ncclGroupEnd();
        if (r == ncclSuccess) r = end;
      }
      for (int mask = 1; mask < c.nranks && r == ncclSuccess; mask <<= 1) {
        const int first = c.rank & ~(mask - 1);  // the blocks this rank holds so far
        const int theirs = first ^ mask;
        const size_t n = pc * static_cast<size_t>(mask);
        r = ncclGroupStart();
        if (r == ncclSuccess) r = ncclSend(c.recv + static_cast<size_t>(first) * block, n, t, c.rank ^ mask, c.comm, c.stream);
        if (r == ncclSuccess) r = ncclRecv(c.recv + static_cast<size_t>(theirs) * block, n, t, c.rank ^ mask, c.comm, c.stream);
        const ncclResult_t end = ncclGroupEnd();
        if (r == ncclSuccess) r = end;
      }
      return r;
    },
    [](int, int, size_t i, size_t pc, int, ncclRedOp_t, Input in, void* st, double& v) {
      v = in(static_cast<int>(i / pc), i % pc, st);
      return true;
    },
    true, true};

}  // namespace topoccl::perf
