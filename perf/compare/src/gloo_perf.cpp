// gloo_perf: the nccl-tests measurement of one collective, done with Gloo (Debian's libgloo, TCP
// transport on 127.0.0.1), one process per rank.
//
//   mpirun -np N gloo_perf --coll all_reduce --store DIR [flags]   ranks from OMPI_COMM_WORLD_RANK/SIZE
//                                                                  (or PMI_RANK/SIZE, RANK/WORLD_SIZE);
//                                                                  DIR: a fresh, empty directory
//   gloo_perf -np N --coll all_reduce [flags]                      forks N ranks itself
//
// Gloo is not linked with MPI: mpirun only starts the processes (so they get the same placement and
// binding as the MPI and topoccl runs); the ranks meet through a gloo FileStore in DIR.
//
// What each collective calls (float32, sum):
//   all_reduce      gloo::allreduce (AllreduceOptions, default algorithm = ring), out-of-place
//   all_gather      gloo::allgather, out-of-place
//   reduce_scatter  gloo::ReduceScatterHalvingDoubling<float> (this Gloo's only reduce-scatter;
//                   in place, built once per size outside the timed loop; the rank's block of the
//                   sum lands at the start of its buffer). Its run() can return a wrong result at large
//                   sizes: it sends a reduced block from the caller's buffer and, before that send is
//                   known to be done, copies its own block to offset 0 of the same buffer (every rank
//                   but 0), so the peer may receive the overwritten bytes. A Gloo race, not this
//                   harness's (seen here once at 128 MiB on 4 ranks; jax-ml/jax#40830 reports the same).
//   alltoall        gloo::alltoall, out-of-place
//   broadcast       gloo::broadcast, root's input -> every rank's output
// Each collective is measured in that one form; the CSV's in-place columns repeat it.
// New-style calls build their options (and unbound buffers) per call, as PyTorch's ProcessGroupGloo.
//
// Extra flags: --size-budget S: stop once the next size is projected to need more than S seconds
// (Debian's Gloo runs 4-rank alltoall at ~12 MB/s on 2 cores); --timeout S (gloo context, 300).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>

#include "bench.hpp"

using namespace cmp;

namespace {

std::shared_ptr<gloo::Context> gCtx;
int gRank = 0, gSize = 1;
uint32_t gTag = 1;

void sumDouble(void* c, const void* a, const void* b, size_t n) { gloo::sum<double>(c, a, b, n); }
void sumFloat(void* c, const void* a, const void* b, size_t n) { gloo::sum<float>(c, a, b, n); }

double allSum(double v) {
  gloo::AllreduceOptions o(gCtx);
  o.setOutput(&v, 1);
  o.setReduceFunction(&sumDouble);
  o.setTag(gTag++);
  gloo::allreduce(o);
  return v;
}

void barrier() {
  gloo::BarrierOptions o(gCtx);
  o.setTag(gTag++);
  gloo::barrier(o);
}

struct Bench {
  const CollInfo* ci;
  Options o;
  float* send = nullptr;
  float* recv = nullptr;
  size_t count = 0;
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs;

  void setup(size_t c) {
    count = c;
    if (ci->coll == Coll::ReduceScatter) {
      std::vector<int> recvCounts(gSize, (int)count);
      rs.reset(new gloo::ReduceScatterHalvingDoubling<float>(
          gCtx, std::vector<float*>{recv}, (int)(count * gSize), recvCounts));
    }
  }
  void release() { rs.reset(); }

  void prepare() {
    if (ci->coll == Coll::ReduceScatter) {  // in place: the input is the receive buffer
      fillInput(ci->coll, recv, count, gRank, gSize, o.root);
      return;
    }
    fillInput(ci->coll, send, count, gRank, gSize, o.root);
    poison(recv, recvElems(ci->coll, count, gSize));
  }

  void run() {
    const size_t n = (size_t)gSize;
    switch (ci->coll) {
      case Coll::AllReduce: {
        gloo::AllreduceOptions opt(gCtx);
        opt.setInput(send, count);
        opt.setOutput(recv, count);
        opt.setReduceFunction(&sumFloat);
        opt.setTag(gTag++);
        gloo::allreduce(opt);
        break;
      }
      case Coll::AllGather: {
        gloo::AllgatherOptions opt(gCtx);
        opt.setInput(send, count);
        opt.setOutput(recv, count * n);
        opt.setTag(gTag++);
        gloo::allgather(opt);
        break;
      }
      case Coll::ReduceScatter:
        rs->run();
        break;
      case Coll::AllToAll: {
        gloo::AlltoallOptions opt(gCtx);
        opt.setInput(send, count * n);
        opt.setOutput(recv, count * n);
        opt.setTag(gTag++);
        gloo::alltoall(opt);
        break;
      }
      case Coll::Broadcast: {
        gloo::BroadcastOptions opt(gCtx);
        if (gRank == o.root) opt.setInput(send, count);
        opt.setOutput(recv, count);
        opt.setRoot(o.root);
        opt.setTag(gTag++);
        gloo::broadcast(opt);
        break;
      }
    }
  }

  Result measure() {
    Result r;
    prepare();
    for (int w = 0; w < o.warmup; w++) run();
    barrier();
    const long switches0 = contextSwitches();
    double t0 = now_s();
    for (int it = 0; it < o.iters; it++) run();
    double perIter = (now_s() - t0) / o.iters;
    const double switches = static_cast<double>(contextSwitches() - switches0);
    r.timeUs = allSum(perIter) / gSize * 1e6;
    const double allSwitches = allSum(switches);
    if (o.switches) r.switchesPerCall = allSwitches / o.iters;
    if (o.check) {
      prepare();
      barrier();
      run();
      r.wrong = (long)allSum((double)checkOutput(ci->coll, recv, count, gRank, gSize, o.root));
    }
    return r;
  }
};

int runRank(int rank, int size, const std::string& storeDir, const Options& o, const CollInfo* ci,
            double budget, int timeoutS) {
  gRank = rank;
  gSize = size;
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(storeDir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(std::chrono::seconds(timeoutS));
  double t0 = now_s();
  ctx->connectFullMesh(store, dev);
  double tConn = now_s() - t0;
  gCtx = ctx;

  Bench b;
  b.ci = ci;
  b.o = o;
  b.send = (float*)allocBuf(o.maxBytes);
  b.recv = (float*)allocBuf(o.maxBytes);
  FILE* info = o.csv ? stderr : stdout;
  if (rank == 0) {
    fprintf(info, "# gloo_perf %s  nranks %d  gloo %d.%d.%d tcp %s  connectFullMesh %.1f ms  iters %d warmup %d check %d\n",
            ci->name, size, GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH,
            dev->str().c_str(), tConn * 1e3, o.iters, o.warmup, o.check);
    printTableHeader(o);
  }
  long totalWrong = 0;
  std::vector<size_t> sizes = o.sizes();
  try {
    // warm-up at the smallest size before any timing (as mpi_perf)
    for (size_t bytes : {sizes.front()}) {
      size_t count = countFor(ci->coll, bytes, size);
      if (count == 0) continue;
      b.setup(count);
      b.prepare();
      for (int w = 0; w < std::max(1, o.warmup); w++) b.run();
      b.release();
    }
    for (size_t k = 0; k < sizes.size(); k++) {
      size_t count = countFor(ci->coll, sizes[k], size);
      if (count == 0) continue;
      b.setup(count);
      Result r = b.measure();
      b.release();
      totalWrong += std::max(0L, r.wrong);
      if (rank == 0) printRow(o, *ci, size, count, o.root, r, r);
      // r.timeUs is the same on every rank (all-reduced), so all ranks stop together
      if (budget > 0 && k + 1 < sizes.size()) {
        double next = r.timeUs * 1e-6 * (double)sizes[k + 1] / (double)sizes[k] *
                      (o.iters + o.warmup + (o.check ? 1 : 0));
        if (next > budget) {
          if (rank == 0)
            fprintf(info, "# gloo_perf %s: stopping after %zu B, next size projected at %.0f s > --size-budget %.0f s\n",
                    ci->name, sizes[k], next, budget);
          break;
        }
      }
    }
  } catch (const std::exception& e) {
    fprintf(stderr, "gloo_perf rank %d: %s failed: %s\n", rank, ci->name, e.what());
    fflush(stdout);
    _exit(3);  // the mesh is likely unusable: do not wait in a destructor
  }
  if (rank == 0)
    fprintf(info, "# Out of bounds values : %ld %s\n", totalWrong, totalWrong ? "FAILED" : "OK");
  fflush(stdout);
  barrier();
  gCtx.reset();
  free(b.send);
  free(b.recv);
  return totalWrong ? 1 : 0;
}

int envInt(const char* a, const char* b, const char* c) {
  for (const char* k : {a, b, c})
    if (const char* v = getenv(k)) return atoi(v);
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int np = 0, timeoutS = 300;
  double budget = 0;
  std::string coll = stemColl(argv[0]), store;
  std::string err;
  for (int i = 1; i < argc && err.empty(); i++) {
    std::string a = argv[i];
    if (a == "--coll" && i + 1 < argc) coll = argv[++i];
    else if (a == "-np" && i + 1 < argc) np = atoi(argv[++i]);
    else if (a == "--store" && i + 1 < argc) store = argv[++i];
    else if (a == "--size-budget" && i + 1 < argc) budget = atof(argv[++i]);
    else if (a == "--timeout" && i + 1 < argc) timeoutS = atoi(argv[++i]);
    else if (!o.parse(i, argc, argv)) err = "unknown argument " + a;
  }
  if (err.empty()) err = o.validate();
  const CollInfo* ci = findColl(coll);
  if (err.empty() && !ci) err = "need --coll all_reduce|all_gather|reduce_scatter|alltoall|broadcast";
  int rank = envInt("OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK");
  int size = envInt("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE");
  if (err.empty() && np <= 0 && (rank < 0 || size <= 0 || store.empty()))
    err = "launch with -np N, or under mpirun with --store DIR";
  int nr = np > 0 ? np : size;
  if (err.empty() && (o.root < 0 || o.root >= nr)) err = "-r out of range";
  if (!err.empty()) {
    if (rank <= 0)
      fprintf(stderr,
              "gloo_perf: %s\nusage: mpirun -np N gloo_perf --coll NAME --store DIR [flags]\n"
              "       gloo_perf -np N --coll NAME [flags]\n"
              "  --size-budget S  stop before a size projected to take > S s\n"
              "  --timeout S      gloo context timeout (300)\n%s",
              err.c_str(), usageText());
    return 2;
  }
  if (np <= 0) return runRank(rank, size, store, o, ci, budget, timeoutS);

  // fork np ranks that meet through a FileStore in a fresh directory
  char tmpl[] = "/tmp/gloo_perf_store.XXXXXX";
  if (!mkdtemp(tmpl)) {
    perror("mkdtemp");
    return 2;
  }
  fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < np; r++) {
    pid_t p = fork();
    if (p == 0) {
      int rc = runRank(r, np, tmpl, o, ci, budget, timeoutS);
      fflush(stdout);
      _exit(rc);
    }
    pids.push_back(p);
  }
  int worst = 0;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    worst = std::max(worst, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  std::string cmd = std::string("rm -rf '") + tmpl + "'";
  if (system(cmd.c_str()) != 0) fprintf(stderr, "could not remove %s\n", tmpl);
  return worst;
}
