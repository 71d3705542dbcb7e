// ceilings: what this machine allows a host-memory collective at best, measured the same run as
// the collectives. Prints CSV to stdout: ceiling,variant,threads,best,median,unit
//
//   ceilings membw [-s MiB] [-r reps] [-T maxThreads]   memory streaming, 1..T threads
//       memcpy  memcpy(c, a)   bytes counted 2*S (STREAM convention; write-allocate not counted)
//       stream  c = a with non-temporal stores (x86-64; elsewhere memcpy), 2*S: a copy whose writes bypass
//               the caches, as large copies of the collectives do (kernels::streamingCopy)
//       acc     a[i] += b[i]   bytes counted 3*S (what a reduction step does)
//   ceilings tcp [-m MiB] [-p rounds]   loopback TCP between two processes, TCP_NODELAY
//       uni     one direction, GB/s            bidi   both directions at once, GB/s per direction
//       rtt8    8-byte ping-pong round trip, us
//   ceilings shm [-p rounds]            cross-process cache-line ping-pong, one-way latency, us
//   ceilings copies [-r reps]           the copies every out-of-place all-to-all and all-gather must make, alone: 2 and 4
//                                       ranks' worth on two threads (one per CPU; with 4 ranks each thread does two
//                                       ranks' copies), a barrier per call and nothing else, at 1 MiB-256 MiB. All-to-all:
//                                       each rank's block for each rank, self included, copied once. All-gather: each
//                                       rank's input read once, 32 KiB at a time, and written to every output while in
//                                       L1 (what a mirrored send does). The best of cached and non-temporal stores (and,
//                                       for all-to-all, of three orders of the blocks); us per call (variant
//                                       coll-npN-bytes): what a library that did nothing but these copies would take.
//   ceilings switch [-p rounds]         two processes on one CPU handing a turn back and forth, each yielding while it
//                                       waits: one hand-off (a context switch), us. Ranks that outnumber the CPUs pay
//                                       at least one per CPU and call: every rank on a CPU must run for a call to end.
#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
[[noreturn]] void die(const char* m) {
  perror(m);
  exit(1);
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
void emit(const char* what, const char* variant, int threads, std::vector<double> v,
          bool higherBetter, const char* unit) {
  double best = higherBetter ? *std::max_element(v.begin(), v.end()) : *std::min_element(v.begin(), v.end());
  printf("%s,%s,%d,%.3f,%.3f,%s\n", what, variant, threads, best, median(v), unit);
  fflush(stdout);
}

// ---- memory -------------------------------------------------------------------------------
// dst = src, 16 bytes a store, around the caches; both 16-byte aligned (the callers' slices are).
void streamCopy(float* dst, const float* src, size_t count) {
#if defined(__x86_64__)
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m128i* s = reinterpret_cast<const __m128i*>(src + i);
    __m128i* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i x0 = _mm_load_si128(s), x1 = _mm_load_si128(s + 1), x2 = _mm_load_si128(s + 2), x3 = _mm_load_si128(s + 3);
    _mm_stream_si128(d, x0);
    _mm_stream_si128(d + 1, x1);
    _mm_stream_si128(d + 2, x2);
    _mm_stream_si128(d + 3, x3);
  }
  for (; i < count; ++i) dst[i] = src[i];
  _mm_sfence();
#else
  memcpy(dst, src, count * sizeof(float));
#endif
}

// ---- the copies of all-to-all and all-gather ---------------------------------------------------------------
// Two threads on CPUs 0 and 1 (when there are two), meeting at a spinning barrier before and after each call.
class TwoThreads {
 public:
  // Runs body(thread) on both threads `calls` times; returns each call's wall time (us), barrier to barrier.
  std::vector<double> run(int calls, const std::function<void(int)>& body) {
    std::vector<double> times;
    std::atomic<int> arrived{0};
    std::atomic<int> generation{0};
    const auto barrier = [&] {
      const int g = generation.load(std::memory_order_acquire);
      if (arrived.fetch_add(1, std::memory_order_acq_rel) == 1) {
        arrived.store(0, std::memory_order_relaxed);
        generation.store(g + 1, std::memory_order_release);
      } else {
        while (generation.load(std::memory_order_acquire) == g) {
        }
      }
    };
    std::thread other([&] {
      pin(1);
      for (int c = 0; c < calls; c++) {
        barrier();
        body(1);
        barrier();
      }
    });
    pin(0);
    for (int c = 0; c < calls; c++) {
      barrier();
      const double t0 = now_s();
      body(0);
      barrier();
      times.push_back((now_s() - t0) * 1e6);
    }
    other.join();
    return times;
  }

 private:
  static void pin(int cpu) {
    if (std::thread::hardware_concurrency() < 2) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
};

// Each of n ranks' source (fromBytes) and destination (toBytes) buffers, first touched by the thread of the two
// that copies into and out of them (rank r: thread r % 2), freed with it.
struct RankBuffers {
  std::vector<char*> from, to;
  RankBuffers(TwoThreads& two, int n, size_t fromBytes, size_t toBytes) : from(n), to(n) {
    for (int r = 0; r < n; r++) {
      from[r] = (char*)aligned_alloc(4096, fromBytes);
      to[r] = (char*)aligned_alloc(4096, toBytes);
      if (!from[r] || !to[r]) die("aligned_alloc");
    }
    two.run(1, [&](int t) {
      for (int r = t; r < n; r += 2) memset(from[r], r + 1, fromBytes), memset(to[r], 0, toBytes);
    });
  }
  ~RankBuffers() {
    for (size_t r = 0; r < from.size(); r++) free(from[r]), free(to[r]);
  }
  RankBuffers(const RankBuffers&) = delete;
  RankBuffers& operator=(const RankBuffers&) = delete;
};

int copies(int reps) {
  using CopyFn = void (*)(void*, const void*, size_t);
  const CopyFn cached = [](void* d, const void* s, size_t b) { memcpy(d, s, b); };
  const CopyFn streaming = [](void* d, const void* s, size_t b) {
    streamCopy(static_cast<float*>(d), static_cast<const float*>(s), b / sizeof(float));
  };
  constexpr size_t kBlock = 32 << 10;
  for (int n : {2, 4}) {
    for (size_t bytes : {size_t{1} << 20, size_t{2} << 20, size_t{8} << 20, size_t{32} << 20, size_t{128} << 20, size_t{256} << 20}) {
      const int calls = (int)std::clamp<size_t>((size_t{1} << 30) / bytes, 3, 20);
      // all-to-all: `bytes` sent and received per rank, a block of bytes / n for each rank
      {
        const size_t block = bytes / n;
        TwoThreads two;
        RankBuffers buffers(two, n, bytes, bytes);
        const std::vector<char*>& send = buffers.from;
        const std::vector<char*>& recv = buffers.to;
        std::vector<double> best;
        const char* bestHow = "";
        // Three orders: own block first, own block last, and every block a 64 KiB piece at a time.
        for (CopyFn copy : {cached, streaming})
          for (int order = 0; order < 3; order++) {
            std::vector<double> medians;
            for (int rep = 0; rep < reps; rep++) {
              const auto times = two.run(calls, [&](int t) {
                for (int r = t; r < n; r += 2) {
                  if (order < 2) {
                    for (int k = 0; k < n; k++) {
                      const int from = (r + k + order) % n;
                      copy(recv[r] + from * block, send[from] + r * block, block);
                    }
                    continue;
                  }
                  for (size_t at = 0; at < block; at += 2 * kBlock)
                    for (int from = 0; from < n; from++)
                      copy(recv[r] + from * block + at, send[from] + r * block + at, std::min(2 * kBlock, block - at));
                }
              });
              medians.push_back(median(times));
            }
            if (best.empty() || median(medians) < median(best)) {
              best = medians;
              static const char* const kHow[2][3] = {{"cached, own block first", "cached, own block last", "cached, in 64 KiB pieces"},
                                                     {"streaming, own block first", "streaming, own block last", "streaming, in 64 KiB pieces"}};
              bestHow = kHow[copy == streaming][order];
            }
          }
        char variant[64];
        snprintf(variant, sizeof(variant), "alltoall-np%d-%zu", n, bytes);
        fprintf(stderr, "copies: %s fastest %s\n", variant, bestHow);
        emit("copies", variant, 2, best, false, "us");
      }
      // all-gather: `bytes` of output per rank, each rank's input bytes / n
      {
        const size_t part = bytes / n;
        TwoThreads two;
        RankBuffers buffers(two, n, part, bytes);
        const std::vector<char*>& in = buffers.from;
        const std::vector<char*>& out = buffers.to;
        std::vector<double> best;
        const char* bestHow = "";
        for (CopyFn copy : {cached, streaming}) {
          std::vector<double> medians;
          for (int rep = 0; rep < reps; rep++) {
            const auto times = two.run(calls, [&](int t) {
              for (int r = t; r < n; r += 2)
                for (size_t at = 0; at < part; at += kBlock) {
                  const size_t piece = std::min(kBlock, part - at);
                  for (int to = 0; to < n; to++) copy(out[to] + r * part + at, in[r] + at, piece);
                }
            });
            medians.push_back(median(times));
          }
          if (best.empty() || median(medians) < median(best)) {
            best = medians;
            bestHow = copy == streaming ? "streaming" : "cached";
          }
        }
        char variant[64];
        snprintf(variant, sizeof(variant), "all_gather-np%d-%zu", n, bytes);
        fprintf(stderr, "copies: %s fastest %s\n", variant, bestHow);
        emit("copies", variant, 2, best, false, "us");
      }
    }
  }
  return 0;
}

int membw(size_t mib, int reps, int maxT) {
  const size_t n = mib * (1ull << 20) / sizeof(float), bytes = n * sizeof(float);
  float* a = (float*)aligned_alloc(4096, bytes);
  float* b = (float*)aligned_alloc(4096, bytes);
  float* c = (float*)aligned_alloc(4096, bytes);
  if (!a || !b || !c) die("aligned_alloc");
  for (int T = 1; T <= maxT; T++) {
    auto par = [&](auto&& body) {  // body(lo, hi) on T threads, returns wall seconds
      std::vector<std::thread> th;
      std::atomic<int> ready{0};
      std::atomic<bool> go{false};
      double t0 = 0;
      for (int t = 0; t < T; t++)
        th.emplace_back([&, t] {
          size_t lo = n * t / T, hi = n * (t + 1) / T;
          ready++;
          while (!go.load(std::memory_order_acquire)) {
          }
          body(lo, hi);
        });
      while (ready.load() < T) {
      }
      t0 = now_s();
      go.store(true, std::memory_order_release);
      for (auto& x : th) x.join();
      return now_s() - t0;
    };
    par([&](size_t lo, size_t hi) {  // first touch by the threads that use the pages
      for (size_t i = lo; i < hi; i++) a[i] = 1.0f, b[i] = 2.0f, c[i] = 0.0f;
    });
    std::vector<double> cp, st, acc;
    for (int r = 0; r <= reps; r++) {
      double t = par([&](size_t lo, size_t hi) { memcpy(c + lo, a + lo, (hi - lo) * sizeof(float)); });
      if (r) cp.push_back(2.0 * bytes / t / 1e9);
      t = par([&](size_t lo, size_t hi) {
        lo &= ~size_t{15};  // 64-byte aligned slices (the buffers are page-aligned)
        hi = hi == n ? n : hi & ~size_t{15};
        streamCopy(c + lo, a + lo, hi - lo);
      });
      if (r) st.push_back(2.0 * bytes / t / 1e9);
      t = par([&](size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; i++) a[i] += b[i];
      });
      if (r) acc.push_back(3.0 * bytes / t / 1e9);
    }
    emit("membw", "memcpy", T, cp, true, "GB/s");
    emit("membw", "stream", T, st, true, "GB/s");
    emit("membw", "acc", T, acc, true, "GB/s");
  }
  volatile float sink = a[n / 2] + c[n / 3];
  (void)sink;
  free(a);
  free(b);
  free(c);
  return 0;
}

// ---- loopback TCP ---------------------------------------------------------------------------
void sendAll(int fd, const char* p, size_t n) {
  while (n) {
    ssize_t r = ::send(fd, p, n, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      die("send");
    }
    p += r, n -= (size_t)r;
  }
}
void recvAll(int fd, char* p, size_t n) {
  while (n) {
    ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      die("recv");
    }
    p += r, n -= (size_t)r;
  }
}
void streamSend(int fd, size_t total) {
  std::vector<char> buf(1 << 20, 'x');
  for (size_t left = total; left;) {
    size_t k = std::min(left, buf.size());
    sendAll(fd, buf.data(), k);
    left -= k;
  }
}
void streamRecv(int fd, size_t total) {
  std::vector<char> buf(1 << 20);
  for (size_t left = total; left;) {
    ssize_t r = ::recv(fd, buf.data(), std::min(left, buf.size()), 0);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      die("recv");
    }
    left -= (size_t)r;
  }
}

int tcp(size_t mib, long rounds, int reps) {
  const size_t total = mib << 20;
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(lfd, (sockaddr*)&addr, sizeof(addr)) < 0) die("bind");
  if (listen(lfd, 1) < 0) die("listen");
  socklen_t al = sizeof(addr);
  getsockname(lfd, (sockaddr*)&addr, &al);
  int one = 1;
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {  // the peer: mirrors every phase
    close(lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (sockaddr*)&addr, sizeof(addr)) < 0) die("connect");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char ack = 'a';
    for (int r = 0; r <= reps; r++) {
      streamRecv(fd, total);
      sendAll(fd, &ack, 1);
      std::thread s([&] { streamSend(fd, total); });
      streamRecv(fd, total);
      s.join();
      sendAll(fd, &ack, 1);
    }
    char m[8];
    for (long i = 0; i < rounds; i++) {
      recvAll(fd, m, 8);
      sendAll(fd, m, 8);
    }
    close(fd);
    _exit(0);
  }
  int fd = accept(lfd, nullptr, nullptr);
  if (fd < 0) die("accept");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<double> uni, bidi;
  char ack;
  for (int r = 0; r <= reps; r++) {
    double t0 = now_s();
    streamSend(fd, total);
    recvAll(fd, &ack, 1);  // the receiver has everything
    double t = now_s() - t0;
    if (r) uni.push_back(total / t / 1e9);
    t0 = now_s();
    std::thread s([&] { streamSend(fd, total); });
    streamRecv(fd, total);
    s.join();
    recvAll(fd, &ack, 1);
    t = now_s() - t0;
    if (r) bidi.push_back(total / t / 1e9);
  }
  emit("tcp", "uni", 1, uni, true, "GB/s");
  emit("tcp", "bidi_per_direction", 1, bidi, true, "GB/s");
  char m[8] = {0};
  std::vector<double> rtt;
  long batch = std::max(1L, rounds / 10);
  for (long i = 0; i < rounds;) {
    long k = std::min(batch, rounds - i);
    double t0 = now_s();
    for (long j = 0; j < k; j++) {
      sendAll(fd, m, 8);
      recvAll(fd, m, 8);
    }
    rtt.push_back((now_s() - t0) / k * 1e6);
    i += k;
  }
  emit("tcp", "rtt8", 1, rtt, false, "us");
  close(fd);
  waitpid(child, nullptr, 0);
  return 0;
}

// ---- shared-memory handshake --------------------------------------------------------------
int shm(long rounds) {
  struct alignas(64) Line {
    std::atomic<long> v;
  };
  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) die("mmap");
  Line* ping = new (mem) Line{{0}};
  Line* pong = new ((char*)mem + 128) Line{{0}};
  pid_t p = fork();
  if (p == 0) {
    for (long i = 1; i <= rounds; i++) {
      while (ping->v.load(std::memory_order_acquire) != i) {
      }
      pong->v.store(i, std::memory_order_release);
    }
    _exit(0);
  }
  std::vector<double> oneWay;
  long batch = std::max(1L, rounds / 10);
  double t0 = now_s();
  for (long i = 1; i <= rounds; i++) {
    ping->v.store(i, std::memory_order_release);
    while (pong->v.load(std::memory_order_acquire) != i) {
    }
    if (i % batch == 0) {
      double t = now_s();
      oneWay.push_back((t - t0) / batch / 2 * 1e6);
      t0 = t;
    }
  }
  waitpid(p, nullptr, 0);
  emit("shm", "cacheline_one_way", 2, oneWay, false, "us");
  munmap(mem, 4096);
  return 0;
}

// ---- context switch between two processes on one CPU ----------------------------------------
int contextSwitch(long rounds) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu() < 0 ? 0 : sched_getcpu(), &one);
  if (sched_setaffinity(0, sizeof(one), &one) != 0) die("sched_setaffinity");  // the child inherits it
  struct alignas(64) Line {
    std::atomic<long> turn;
  };
  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) die("mmap");
  Line* line = new (mem) Line{{0}};
  // Even turns are the parent's, odd ones the child's; the one whose turn it is not yields to the other.
  auto play = [&](long parity, long count, std::vector<double>* handoffs) {
    long batch = std::max(1L, count / 10);
    double t0 = now_s();
    for (long i = 0; i < count; i++) {
      while (line->turn.load(std::memory_order_acquire) % 2 != parity) sched_yield();
      line->turn.fetch_add(1, std::memory_order_acq_rel);
      if (handoffs && (i + 1) % batch == 0) {
        double t = now_s();
        handoffs->push_back((t - t0) / batch / 2 * 1e6);  // two hand-offs per turn of ours
        t0 = t;
      }
    }
  };
  pid_t p = fork();
  if (p == 0) {
    play(1, rounds, nullptr);
    _exit(0);
  }
  std::vector<double> handoffs;
  play(0, rounds, &handoffs);
  waitpid(p, nullptr, 0);
  emit("switch", "yield_handoff_one_cpu", 2, handoffs, false, "us");
  munmap(mem, 4096);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  size_t mib = 0;
  int reps = 5, maxT = (int)std::max(1u, std::thread::hardware_concurrency());
  long rounds = 20000;
  for (int i = 2; i < argc; i++) {
    std::string a = argv[i];
    if ((a == "-s" || a == "-m") && i + 1 < argc) mib = strtoul(argv[++i], nullptr, 10);
    else if (a == "-r" && i + 1 < argc) reps = atoi(argv[++i]);
    else if (a == "-T" && i + 1 < argc) maxT = atoi(argv[++i]);
    else if (a == "-p" && i + 1 < argc) rounds = atol(argv[++i]);
    else mode = "?";
  }
  if (argc > 1 && std::string(argv[1]) == "header") {
    printf("ceiling,variant,threads,best,median,unit\n");
    return 0;
  }
  if (mode == "membw") return membw(mib ? mib : 256, reps, maxT);
  if (mode == "tcp") return tcp(mib ? mib : 512, rounds, reps);
  if (mode == "shm") return shm(rounds * 10);
  if (mode == "switch") return contextSwitch(rounds * 5);
  if (mode == "copies") return copies(reps);
  fprintf(stderr, "usage: %s header | membw [-s MiB] [-r reps] [-T threads] | tcp [-m MiB] [-r reps] [-p rounds] | shm [-p rounds/10] | switch [-p rounds/5] | copies [-r reps]\n", argv[0]);
  return 2;
}
