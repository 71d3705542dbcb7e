// What a copy shared by both ends of an shm message can gain: one copy of `size` bytes made by one thread, or split
// in half between two threads on two CPUs (the receiver and the idle sender of a 2-rank broadcast).
// Prints the median time per copy for each size.
//   split_copy [--iters-bytes B]   (each size runs max(5, B / size) copies; default 1 GiB)
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;

void pinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % std::max(1u, std::thread::hardware_concurrency()), &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  size_t iterBytes = size_t{1} << 30;
  if (argc == 3 && std::string(argv[1]) == "--iters-bytes") iterBytes = std::strtoull(argv[2], nullptr, 0);
  std::printf("%12s %14s %14s %8s\n", "size (B)", "one thread us", "two halves us", "speedup");
  for (size_t size : {size_t{1} << 20, size_t{2} << 20, size_t{8} << 20, size_t{32} << 20, size_t{128} << 20}) {
    auto* src = static_cast<char*>(std::aligned_alloc(4096, size));
    auto* dst = static_cast<char*>(std::aligned_alloc(4096, size));
    std::memset(src, 1, size);
    std::memset(dst, 2, size);
    const size_t half = size / 2 / 4096 * 4096;
    const int iters = static_cast<int>(std::max<size_t>(5, iterBytes / size));
    std::atomic<int> round{0}, finished{0};
    std::thread helper([&] {
      pinTo(1);
      for (int seen = 0;;) {
        int r;
        while ((r = round.load(std::memory_order_acquire)) == seen) {}
        if (r < 0) return;
        seen = r;
        std::memcpy(dst + half, src + half, size - half);
        finished.fetch_add(1, std::memory_order_release);
      }
    });
    pinTo(0);
    std::vector<double> one, two;
    for (int i = 1; i <= iters; ++i) {
      auto start = Clock::now();
      std::memcpy(dst, src, size);
      one.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      start = Clock::now();
      round.store(i, std::memory_order_release);
      std::memcpy(dst, src, half);
      while (finished.load(std::memory_order_acquire) < i) {}
      two.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
    round.store(-1, std::memory_order_release);
    helper.join();
    std::printf("%12zu %14.1f %14.1f %7.2fx\n", size, median(one), median(two), median(one) / median(two));
    std::free(src);
    std::free(dst);
  }
  return 0;
}
