/* How ranks wait for a late peer: NRANKS processes (fork, shm transport) run ncclAllReduce ITERATIONS times;
 * before each call rank 0 sleeps DELAY_US, so the others wait for it. Prints the median time from rank 0's
 * arrival to the last rank's return (how fast the waiting ranks notice it arrived), and the CPU time the waiting
 * ranks spent per second inside their calls. With `busy`, rank 0 computes for DELAY_US of its own CPU time instead
 * of sleeping, so waiting ranks that share its core slow it down; then also the median wall time of rank 0's
 * iteration (compute + call).
 * Usage: late_peer_probe NRANKS BYTES DELAY_US [ITERATIONS [busy]] */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { kMaxRanks = 16, kMaxIterations = 10000 };

struct Shared {
  ncclUniqueId id;
  double arrival[kMaxIterations];   /* when rank 0 called, CLOCK_MONOTONIC seconds */
  double iteration[kMaxIterations]; /* rank 0's compute + call, seconds */
  double finish[kMaxRanks][kMaxIterations];  /* when each rank returned */
  double waiterCpu[kMaxRanks];      /* CPU seconds of each waiting rank inside its calls */
  double waiterWall[kMaxRanks];     /* wall seconds of the same */
  int failed;
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double cpuSeconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec * 1e-6 + (double)u.ru_stime.tv_sec +
         (double)u.ru_stime.tv_usec * 1e-6;
}

static int compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double threadCpuSeconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int rankMain(struct Shared* shared, int rank, int nranks, size_t bytes, long delayUs, int iterations, int busy) {
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, nranks, shared->id, rank) != ncclSuccess) return 1;
  const size_t count = bytes / sizeof(float);
  float* buffer = calloc(count ? count : 1, sizeof(float));
  double cpu = 0, wall = 0;
  for (int i = -3; i < iterations; ++i) { /* 3 warm-up calls */
    const double begin = now();
    if (rank == 0 && busy) {
      const double until = threadCpuSeconds() + (double)delayUs * 1e-6;
      while (threadCpuSeconds() < until) {
      }
    } else if (rank == 0) {
      struct timespec d = {delayUs / 1000000, (delayUs % 1000000) * 1000};
      nanosleep(&d, NULL);
    }
    const double c0 = cpuSeconds(), t0 = now();
    if (ncclAllReduce(buffer, buffer, count, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) return 1;
    const double t1 = now(), c1 = cpuSeconds();
    if (i < 0) continue;
    if (rank == 0) shared->arrival[i] = t0;
    if (rank == 0) shared->iteration[i] = t1 - begin;
    shared->finish[rank][i] = t1;
    cpu += c1 - c0;
    wall += t1 - t0;
  }
  shared->waiterCpu[rank] = cpu;
  shared->waiterWall[rank] = wall;
  free(buffer);
  ncclCommDestroy(comm);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s NRANKS BYTES DELAY_US [ITERATIONS]\n", argv[0]);
    return 2;
  }
  const int nranks = atoi(argv[1]);
  const size_t bytes = strtoull(argv[2], NULL, 0);
  const long delayUs = atol(argv[3]);
  const int iterations = argc > 4 ? atoi(argv[4]) : 200;
  const int busy = argc > 5 && argv[5][0] == 'b';
  if (nranks < 2 || nranks > kMaxRanks || iterations < 1 || iterations > kMaxIterations || delayUs < 0) return 2;
  struct Shared* shared = mmap(NULL, sizeof(struct Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED || ncclGetUniqueId(&shared->id) != ncclSuccess) return 1;
  for (int r = 0; r < nranks; ++r) {
    if (fork() == 0) _exit(rankMain(shared, r, nranks, bytes, delayUs, iterations, busy));
  }
  int status = 0, failed = 0;
  while (wait(&status) > 0) failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  if (failed) {
    fprintf(stderr, "late_peer_probe: a rank failed\n");
    return 1;
  }
  static double reaction[kMaxIterations];
  for (int i = 0; i < iterations; ++i) {
    double last = shared->finish[0][i];
    for (int r = 1; r < nranks; ++r) last = last > shared->finish[r][i] ? last : shared->finish[r][i];
    reaction[i] = last - shared->arrival[i];
  }
  qsort(reaction, (size_t)iterations, sizeof(double), compare);
  qsort(shared->iteration, (size_t)iterations, sizeof(double), compare);
  double cpu = 0, wall = 0;
  for (int r = 1; r < nranks; ++r) {
    cpu += shared->waiterCpu[r];
    wall += shared->waiterWall[r];
  }
  printf("late_peer ranks=%d bytes=%zu delay_us=%ld%s arrival_to_done_median_us=%.1f p90_us=%.1f waiter_cpu_per_wait_s=%.3f "
         "late_iteration_median_us=%.1f\n",
         nranks, bytes, delayUs, busy ? " busy" : "", reaction[iterations / 2] * 1e6, reaction[iterations * 9 / 10] * 1e6,
         wall > 0 ? cpu / wall : 0.0, shared->iteration[iterations / 2] * 1e6);
  return 0;
}
