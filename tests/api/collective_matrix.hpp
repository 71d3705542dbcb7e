// The collective correctness matrix, run on one rank: every collective x datatype x op x
// in-place/out-of-place x size, each result checked against a reference computed in double (or
// exact integer arithmetic) from inputs every rank can regenerate from the shared seed.
#pragma once

#include <cstdint>

#include "nccl.h"

namespace topoccl::test {

struct MatrixOptions {
  uint64_t seed = 0;
  bool allTypesAndOps = true;  // false: a representative subset (keeps process modes quick)
  bool largeSizes = true;      // add a ~3 MiB prime-sized case per collective
};

// Returns the number of failed checks (0 = all good); prints each failure with its parameters.
int runCollectiveMatrix(int rank, int nranks, ncclComm_t comm, const MatrixOptions& options);

// `calls` collectives drawn from `seed` (the same on every rank): any collective, type, op (PreMulSum too),
// in place or not, any root, 0 elements to 4 MiB with the sizes where plans change met exactly and one element
// either side; about one in four is a group of 2-3 collectives, and now and then a send/recv shift joins in. Each
// is checked as the matrix checks. `nonBlocking`: the communicator was made with config.blocking = 0; 1-4 steps go
// out back to back before one wait on ncclCommGetAsyncError. `ncclMemory`: every case's buffers come from
// ncclMemAlloc (peers may map them) and go back with ncclMemFree after it. Returns the failed checks.
int runRandomSequence(int rank, int nranks, ncclComm_t comm, uint64_t seed, int calls, bool nonBlocking = false,
                      bool ncclMemory = false);

}  // namespace topoccl::test
