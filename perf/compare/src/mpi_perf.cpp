// mpi_perf: the nccl-tests measurement of one collective, done with OpenMPI's collectives
// (MPI_Allreduce, MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Bcast) on host memory.
//
//   mpirun -np N mpi_perf --coll all_reduce -b 8 -e 256M -f 4 -n 20 -w 5 -c 1 -d float -o sum --csv
//
// Flags and output as the topoccl build/perf/<coll>_perf binaries (see bench.hpp). The in-place
// columns use MPI_IN_PLACE (reduce_scatter's in-place result lands at the start of the buffer, as
// MPI defines it); MPI_Bcast has a single buffer, so broadcast's in-place columns repeat the
// out-of-place measurement. Exit status 1 when any element was wrong.
#include <mpi.h>

#include "bench.hpp"

using namespace cmp;

namespace {

int gRank = 0, gSize = 1;

void runOnce(Coll c, float* send, float* recv, size_t count, int root, bool inplace) {
  const int cnt = (int)count;  // <= 64 Mi elements at 256 MiB
  const void* sb = inplace ? MPI_IN_PLACE : send;
  switch (c) {
    case Coll::AllReduce:
      MPI_Allreduce(sb, recv, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case Coll::AllGather:
      MPI_Allgather(sb, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case Coll::ReduceScatter:
      MPI_Reduce_scatter_block(sb, recv, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case Coll::AllToAll:
      MPI_Alltoall(sb, cnt, MPI_FLOAT, recv, cnt, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case Coll::Broadcast:
      MPI_Bcast(gRank == root ? send : recv, cnt, MPI_FLOAT, root, MPI_COMM_WORLD);
      break;
  }
}

// Prepare the buffers for one call: inputs filled, outputs poisoned (where they are not inputs).
void prepare(Coll c, float* send, float* recv, size_t count, int root, bool inplace) {
  const int n = gSize;
  if (!inplace) {
    fillInput(c, send, count, gRank, n, root);
    poison(recv, recvElems(c, count, n));
    return;
  }
  if (c == Coll::AllGather) {
    poison(recv, recvElems(c, count, n));
    fillInput(c, recv + (size_t)gRank * count, count, gRank, n, root);
  } else {
    fillInput(c, recv, count, gRank, n, root);
  }
}

Result measure(const CollInfo& ci, const Options& o, float* send, float* recv, size_t count,
               bool inplace) {
  const Coll c = ci.coll;
  const int n = gSize, root = o.root;
  Result r;
  prepare(c, send, recv, count, root, inplace);
  for (int w = 0; w < o.warmup; w++) runOnce(c, send, recv, count, root, inplace);
  MPI_Barrier(MPI_COMM_WORLD);
  const long switches0 = contextSwitches();
  double t0 = now_s();
  for (int it = 0; it < o.iters; it++) runOnce(c, send, recv, count, root, inplace);
  double perIter = (now_s() - t0) / o.iters;
  double switches = static_cast<double>(contextSwitches() - switches0);
  MPI_Allreduce(MPI_IN_PLACE, &perIter, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &switches, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  r.timeUs = perIter / n * 1e6;
  if (o.switches) r.switchesPerCall = switches / o.iters;
  if (o.check) {
    prepare(c, send, recv, count, root, inplace);
    MPI_Barrier(MPI_COMM_WORLD);
    runOnce(c, send, recv, count, root, inplace);
    const float* out = (c == Coll::Broadcast && gRank == root) ? send : recv;
    long wrong = checkOutput(c, out, count, gRank, n, root);
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    r.wrong = wrong;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &gRank);
  MPI_Comm_size(MPI_COMM_WORLD, &gSize);

  Options o;
  std::string coll = stemColl(argv[0]);
  std::string err;
  for (int i = 1; i < argc && err.empty(); i++) {
    std::string a = argv[i];
    if (a == "--coll" && i + 1 < argc) coll = argv[++i];
    else if (!o.parse(i, argc, argv)) err = "unknown argument " + a;
  }
  if (err.empty()) err = o.validate();
  const CollInfo* ci = findColl(coll);
  if (err.empty() && !ci) err = "need --coll all_reduce|all_gather|reduce_scatter|alltoall|broadcast";
  if (err.empty() && (o.root < 0 || o.root >= gSize)) err = "-r out of range";
  if (!err.empty()) {
    if (gRank == 0) fprintf(stderr, "mpi_perf: %s\nusage: mpi_perf --coll NAME [flags]\n%s", err.c_str(), usageText());
    MPI_Finalize();
    return 2;
  }

  float* send = (float*)allocBuf(o.maxBytes);
  float* recv = (float*)allocBuf(o.maxBytes);
  if (gRank == 0) {
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(ver, &len);
    if (char* nl = strchr(ver, '\n')) *nl = 0;
    if (char* cm = strchr(ver, ',')) *cm = 0;
    // '#' lines go to stderr with --csv so that stdout is pure CSV
    fprintf(o.csv ? stderr : stdout,
            "# mpi_perf %s  nranks %d  %s  iters %d warmup %d check %d\n", ci->name, gSize, ver,
            o.iters, o.warmup, o.check);
    printTableHeader(o);
  }
  // warm-up at the smallest size before any timing (nccl-tests also warms up at the largest; on
  // host memory that only costs time, each size has its own -w warm-up calls)
  for (size_t bytes : {o.sizes().front()}) {
    size_t count = countFor(ci->coll, bytes, gSize);
    if (count == 0) continue;
    prepare(ci->coll, send, recv, count, o.root, false);
    for (int w = 0; w < std::max(1, o.warmup); w++)
      runOnce(ci->coll, send, recv, count, o.root, false);
  }
  long totalWrong = 0;
  for (size_t bytes : o.sizes()) {
    size_t count = countFor(ci->coll, bytes, gSize);
    if (count == 0) continue;
    Result oop = measure(*ci, o, send, recv, count, false);
    Result ip = ci->coll == Coll::Broadcast ? oop : measure(*ci, o, send, recv, count, true);
    totalWrong += std::max(0L, oop.wrong) + (ci->coll == Coll::Broadcast ? 0 : std::max(0L, ip.wrong));
    if (gRank == 0) printRow(o, *ci, gSize, count, o.root, oop, ip);
  }
  if (gRank == 0)
    fprintf(o.csv ? stderr : stdout, "# Out of bounds values : %ld %s\n", totalWrong,
            totalWrong ? "FAILED" : "OK");
  free(send);
  free(recv);
  MPI_Finalize();
  return totalWrong ? 1 : 0;
}
