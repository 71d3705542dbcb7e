/* The drop-in path, as an application uses NCCL: include nccl.h, link libnccl.so.2, launch with
 * mpirun. Rank 0 makes the unique id and MPI broadcasts it; every rank all-reduces its rank number
 * and checks the result. Exit status is non-zero on any mismatch. */
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK_NCCL(call)                                                                  \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess) {                                                              \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                       \
    }                                                                                     \
  } while (0)

int main(int argc, char** argv) {
  int rank, nranks;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  ncclUniqueId id;
  if (rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CHECK_NCCL(ncclCommInitRank(&comm, nranks, id, rank));

  const size_t count = 1 << 20;
  float* data = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) data[i] = (float)(rank + 1) * (float)(i % 7);
  CHECK_NCCL(ncclAllReduce(data, data, count, ncclFloat, ncclSum, comm, NULL)); /* host memory, null stream: done on return */

  const float ranksSum = (float)nranks * (float)(nranks + 1) / 2.0f;
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += data[i] != ranksSum * (float)(i % 7);
  printf("rank %d/%d: allreduce of %zu floats: %s (data[1] = %g, expected %g)\n", rank, nranks, count,
         wrong ? "WRONG" : "correct", data[1], ranksSum);

  CHECK_NCCL(ncclCommDestroy(comm));
  free(data);
  MPI_Finalize();
  return wrong ? 1 : 0;
}
