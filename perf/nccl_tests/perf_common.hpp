// nccl-tests-compatible benchmark driver: the flags, launch model, timing and output of NVIDIA's nccl-tests
// (reference/nccl.md §7), on the public nccl.h API only, so existing scripts run and parse topoccl the same
// way. Each <collective>_perf.cpp describes one collective (sizes, buffers, the call, the expected result)
// and calls runPerf. Ranks = MPI processes x -t threads x -g ranks per thread; without MPI, one process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nccl.h>

namespace topoccl::perf {

// One rank's buffers and identity for one call.
struct RankContext {
  ncclComm_t comm = nullptr;
  int rank = 0, nranks = 1;
  char* send = nullptr;  // the op's send buffer (out of place) or the in-place alias
  char* recv = nullptr;
  char* sendBase = nullptr;  // allocations
  char* recvBase = nullptr;
  cudaStream_t stream = nullptr;  // --gpu: the rank's own stream (ranks sharing a GPU must not share one)
};

// The per-collective description (nccl-tests' testColl / testEngine).
struct CollectiveSpec {
  const char* name;          // "all_reduce" (csv/json) ; the program is <name>_perf
  bool reduces = false;      // -o applies
  bool rooted = false;       // -r applies
  // From the nccl-tests size (bytes) and element size: the count passed to NCCL and the elements of each
  // rank's send and receive buffers.
  void (*counts)(size_t bytes, size_t eltSize, int nranks, size_t& paramCount, size_t& sendElts, size_t& recvElts);
  // algbw's S in bytes and the busbw factor.
  double (*algBytes)(size_t paramCount, size_t eltSize, int nranks);
  double (*busFactor)(int nranks);
  // In place: moves send or recv, as placed for out of place (allocation + the -u offset), so that one aliases
  // into the other (nccl-tests' conventions).
  void (*inPlace)(RankContext& rc, size_t paramCount, size_t eltSize);
  // The call (inside the caller's group when -m > 1).
  ncclResult_t (*run)(const RankContext& rc, size_t paramCount, ncclDataType_t type, ncclRedOp_t op, int root);
  // Expected value of rank `rank`'s receive element `i` (double), given input(r, j): rank r's send element j.
  // Returns false where the element is not defined by the collective (e.g. a non-root's reduce output).
  bool (*expected)(int rank, int nranks, size_t i, size_t paramCount, int root, ncclRedOp_t op,
                   double (*input)(int r, size_t j, void* state), void* state, double& value);
  // hypercube: rank counts that are not a power of two are skipped (nccl-tests prints so and runs nothing).
  bool powerOfTwoRanks;
  // hypercube: run() issues rounds that depend on each other, so it cannot sit inside a group (-g or -m > 1).
  bool ungroupable;
};

int runPerf(const CollectiveSpec& spec, int argc, char** argv);

// Helpers the specs share.
double reduceValues(ncclRedOp_t op, int nranks, double (*input)(int r, size_t j, void* state), void* state, size_t j);

}  // namespace topoccl::perf
