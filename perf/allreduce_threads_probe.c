/* A quick probe until the nccl-tests-compatible benchmarks land: ranks as threads of one process
 * (ncclCommInitAll), median time of ncclAllReduce (float sum, in place) for one size.
 * Usage: allreduce_threads_probe NRANKS COUNT [ITERATIONS] */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { kMaxRanks = 64 };
static ncclComm_t comms[kMaxRanks];
static int nranks, iterations = 200;
static size_t count;
static double samples[100000];

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void* rank_main(void* arg) {
  const int rank = (int)(long)arg;
  float* buffer = calloc(count ? count : 1, sizeof(float));
  for (int i = -5; i < iterations; ++i) { /* 5 warm-up calls */
    const double t0 = now();
    ncclAllReduce(buffer, buffer, count, ncclFloat, ncclSum, comms[rank], NULL);
    if (rank == 0 && i >= 0) samples[i] = now() - t0;
  }
  free(buffer);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s NRANKS COUNT [ITERATIONS]\n", argv[0]);
    return 2;
  }
  nranks = atoi(argv[1]);
  count = strtoull(argv[2], NULL, 0);
  if (argc > 3) iterations = atoi(argv[3]);
  if (nranks < 1 || nranks > kMaxRanks || iterations < 1 || iterations > 100000) return 2;
  if (ncclCommInitAll(comms, nranks, NULL) != ncclSuccess) return 1;
  pthread_t threads[kMaxRanks];
  for (int r = 0; r < nranks; ++r) pthread_create(&threads[r], NULL, rank_main, (void*)(long)r);
  for (int r = 0; r < nranks; ++r) pthread_join(threads[r], NULL);
  qsort(samples, (size_t)iterations, sizeof(double), compare);
  const double median = samples[iterations / 2];
  const double bytes = (double)count * sizeof(float);
  printf("allreduce threads=%d bytes=%.0f median_us=%.1f algbw_GBps=%.3f busbw_GBps=%.3f\n", nranks, bytes,
         median * 1e6, bytes / median * 1e-9, bytes / median * 1e-9 * 2.0 * (nranks - 1) / nranks);
  for (int r = 0; r < nranks; ++r) ncclCommDestroy(comms[r]);
  return 0;
}
