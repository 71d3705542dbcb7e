// What a mirrored send saves: a 2-rank out-of-place all-gather as two threads, the way the shm transport moves it.
//   pull:   each rank copies its own block and the peer's block into its output (two reads, two writes)
//   mirror: each rank reads the peer's block once, 32 KiB at a time, and writes it into its own output and,
//           while the block is still in L1, into the peer's output (one read, two writes; the peer's own copy
//           is gone)
//   whole:  the same reads and writes as mirror, each destination written in one copy of the whole block (the
//           piece size's part of the floor: session 39 measured it against the transport's 105 us at 2 MiB)
// Prints the median time per call for each size (bytes = the whole output, as nccl-tests counts all-gather).
//   copy_twice [--iters-bytes B]   (each size runs max(5, B / size) calls; default 1 GiB)
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {
constexpr size_t kBlock = 32 << 10;  // the transport's kMirrorBlock

void copyTwice(char* first, char* second, const char* src, size_t bytes, size_t piece) {
  for (size_t at = 0; at < bytes; at += piece) {
    const size_t n = std::min(piece, bytes - at);
    std::memcpy(first + at, src + at, n);
    std::memcpy(second + at, src + at, n);
  }
}
}  // namespace

int main(int argc, char** argv) {
  size_t budget = size_t{1} << 30;
  if (argc == 3 && std::string(argv[1]) == "--iters-bytes") budget = std::strtoull(argv[2], nullptr, 10);
  std::printf("%12s %12s %12s %12s %8s\n", "bytes", "pull us", "mirror us", "whole us", "ratio");
  for (size_t total = size_t{1} << 20; total <= size_t{256} << 20; total *= 2) {
    const size_t half = total / 2;
    char* in[2];
    char* out[2];
    for (int r = 0; r < 2; ++r) {
      in[r] = static_cast<char*>(std::aligned_alloc(4096, half));
      out[r] = static_cast<char*>(std::aligned_alloc(4096, total));
      std::memset(in[r], r + 1, half);
      std::memset(out[r], 0, total);
    }
    double median[3];
    for (int mirror = 0; mirror < 3; ++mirror) {
      const int iters = static_cast<int>(std::max<size_t>(5, budget / total));
      std::barrier sync(2);
      std::vector<double> times;
      const auto rank = [&](int r) {
        const int p = 1 - r;
        for (int it = 0; it < iters; ++it) {
          sync.arrive_and_wait();
          const auto t0 = std::chrono::steady_clock::now();
          if (mirror) {
            copyTwice(out[r] + p * half, out[p] + p * half, in[p], half, mirror == 1 ? kBlock : half);
          } else {
            std::memcpy(out[r] + r * half, in[r], half);
            std::memcpy(out[r] + p * half, in[p], half);
          }
          sync.arrive_and_wait();
          if (r == 0) times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
      };
      std::thread other(rank, 1);
      rank(0);
      other.join();
      std::sort(times.begin(), times.end());
      median[mirror] = times[times.size() / 2];
    }
    std::printf("%12zu %12.1f %12.1f %12.1f %8.2f\n", total, median[0], median[1], median[2], median[1] / median[0]);
    for (int r = 0; r < 2; ++r) {
      std::free(in[r]);
      std::free(out[r]);
    }
  }
  return 0;
}
