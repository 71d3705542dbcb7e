/* topoccl's extensions to the NCCL C API, exported from libnccl.so.2 next to the nccl* functions. */
#ifndef TOPOCCL_NCCL_EXT_H_
#define TOPOCCL_NCCL_EXT_H_

#include <stddef.h>

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  char plan[64];      /* the plan the communicator runs: "ring", "hierarchical", a synthesized plan's name, ... */
  double predictedUs; /* the simulator's time for it on the communicator's cluster graph */
} topocclPrediction_t;

/* What `comm` would run for `collective` ("allreduce", "allgather", "reducescatter", "broadcast", "reduce",
 * "alltoall", "gather", "scatter") at `bytes` (nccl-tests' size: the all-gather output, the reduce-scatter
 * input, the all-to-all bytes a rank sends), in place or not, and how long the cost model says it takes.
 * ncclInvalidUsage when the communicator has no cluster graph (TOPOCCL_TOPO_FUSE=0). Local: no communication. */
ncclResult_t topocclCommPredict(ncclComm_t comm, const char* collective, size_t bytes, int inPlace,
                                topocclPrediction_t* prediction);

#ifdef __cplusplus
}
#endif

#endif /* TOPOCCL_NCCL_EXT_H_ */
