// Shared by mpi_perf and gloo_perf: nccl-tests conventions, test data, CSV output.
//
// Conventions (nccl-tests 2.19, reference/nccl.md section 7):
//   size  = max(send, recv) bytes per rank, as nccl-tests' "size" column:
//             all_reduce, broadcast         count * 4
//             all_gather                    nranks * sendcount * 4   (the output)
//             reduce_scatter                nranks * recvcount * 4   (the input)
//             alltoall                      nranks * count * 4       (count per peer)
//           count = the count argument of the NCCL call; a size whose count is 0 is skipped.
//   time  = wall time of -n back-to-back calls / n, averaged over ranks (nccl-tests -a 1).
//   algbw = size / time (GB/s, 1e9), busbw = algbw * factor:
//           all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall (n-1)/n; broadcast 1.
//   check = after the timed loop, inputs are refilled, outputs poisoned, one more call is made and
//           every output element is compared exactly (inputs are small integers, so any reduction
//           order gives the exact sum); *_wrong = wrong elements summed over ranks, -1 if -c 0.
// CSV (rank 0, stdout, --csv), identical to the topoccl binaries:
//   collective,nranks,bytes,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,
//   ip_time_us,ip_algbw,ip_busbw,ip_wrong[,oop_switches_per_call,ip_switches_per_call]
// --switches: context switches of all ranks' processes during the timed loop, per call (getrusage), a
// '#' line after each row of the table, two more CSV columns.
#pragma once

#include <sys/resource.h>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cmp {

enum class Coll { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast };

struct CollInfo {
  Coll coll;
  const char* name;  // nccl-tests binary stem, also the CSV "collective" column
  bool reduces;
};

inline const CollInfo kColls[] = {
    {Coll::AllReduce, "all_reduce", true},       {Coll::AllGather, "all_gather", false},
    {Coll::ReduceScatter, "reduce_scatter", true}, {Coll::AllToAll, "alltoall", false},
    {Coll::Broadcast, "broadcast", false},
};

inline const CollInfo* findColl(const std::string& name) {
  for (const auto& c : kColls)
    if (name == c.name) return &c;
  return nullptr;
}

// The collective a program was started as, from its name ("all_reduce_perf" -> "all_reduce"); "" if none.
inline std::string stemColl(const char* argv0) {
  std::string s = argv0;
  const size_t p = s.rfind('/');
  if (p != std::string::npos) s = s.substr(p + 1);
  for (const auto& c : kColls)
    if (s.rfind(std::string(c.name) + "_perf", 0) == 0) return c.name;
  return "";
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double busFactor(Coll c, int n) {
  switch (c) {
    case Coll::AllReduce: return 2.0 * (n - 1) / n;
    case Coll::Broadcast: return 1.0;
    default: return (double)(n - 1) / n;
  }
}

// count argument of the NCCL call for a nominal size (nccl-tests rounding)
inline size_t countFor(Coll c, size_t bytes, int n) {
  size_t elems = bytes / sizeof(float);
  if (c == Coll::AllReduce || c == Coll::Broadcast) return elems;
  return elems / (size_t)n;
}
inline size_t reportedBytes(Coll c, size_t count, int n) {
  if (c == Coll::AllReduce || c == Coll::Broadcast) return count * sizeof(float);
  return count * (size_t)n * sizeof(float);
}
// elements in the send / recv buffer of one rank
inline size_t sendElems(Coll c, size_t count, int n) {
  return (c == Coll::ReduceScatter || c == Coll::AllToAll) ? count * n : count;
}
inline size_t recvElems(Coll c, size_t count, int n) {
  return (c == Coll::AllGather || c == Coll::AllToAll) ? count * n : count;
}

// Test data: small integers in [-30, 30], period 61 in the element index (a prime, so no block
// shift by a power-of-two count maps an element onto an equal value), distinct per rank. Sums over
// up to 2^18 ranks are exact in float32, in any order.
inline float value(int rank, size_t i) {
  return (float)((long)((i % 61) * 7 + (size_t)rank * 13 + 1) % 61) - 30.0f;
}
// p[k] = value(rank, first + k), k < n; period-61 table, no per-element division
inline void fill(float* p, size_t n, int rank, size_t first) {
  float tab[61];
  for (int j = 0; j < 61; j++) tab[j] = value(rank, (size_t)j);
  size_t j = first % 61;
  for (size_t k = 0; k < n; k++) {
    p[k] = tab[j];
    if (++j == 61) j = 0;
  }
}
inline float sumValue(int n, size_t i) {
  float s = 0;
  for (int r = 0; r < n; r++) s += value(r, i);
  return s;
}

// Fill this rank's input. `in` has sendElems(c, count, n) elements; for an in-place all_gather the
// caller passes the rank's slot of the output.
inline void fillInput(Coll c, float* in, size_t count, int rank, int n, int root) {
  switch (c) {
    case Coll::AllReduce: fill(in, count, rank, 0); break;
    case Coll::AllGather: fill(in, count, rank, (size_t)rank * count); break;
    case Coll::ReduceScatter: fill(in, count * n, rank, 0); break;
    case Coll::AllToAll: fill(in, count * n, rank, 0); break;
    case Coll::Broadcast:
      if (rank == root) fill(in, count, rank, 0);
      break;
  }
}

// Count wrong elements of this rank's result `out` (recvElems(c, count, n) elements).
inline long checkOutput(Coll c, const float* out, size_t count, int rank, int n, int root) {
  long wrong = 0;
  auto expect = [&](size_t k) -> float {
    switch (c) {
      case Coll::AllReduce: return sumValue(n, k);
      case Coll::AllGather: return value((int)(k / count), k);
      case Coll::ReduceScatter: return sumValue(n, (size_t)rank * count + k);
      case Coll::AllToAll: return value((int)(k / count), (size_t)rank * count + k % count);
      case Coll::Broadcast: return value(root, k);
    }
    return 0;
  };
  size_t m = recvElems(c, count, n);
  if (c == Coll::AllReduce || c == Coll::ReduceScatter) {
    // sums have period 61 too: tabulate them
    float tab[61];
    size_t base = c == Coll::ReduceScatter ? (size_t)rank * count : 0;
    for (int j = 0; j < 61; j++) tab[j] = sumValue(n, (size_t)j);
    size_t j = base % 61;
    for (size_t k = 0; k < m; k++) {
      if (out[k] != tab[j]) wrong++;
      if (++j == 61) j = 0;
    }
    return wrong;
  }
  for (size_t k = 0; k < m; k++)
    if (out[k] != expect(k)) wrong++;
  return wrong;
}

inline void poison(float* p, size_t n) { std::fill(p, p + n, -1000.0f); }

struct Options {
  size_t minBytes = 32u << 20, maxBytes = 32u << 20;  // nccl-tests defaults
  size_t factor = 0;                                  // 0: additive step
  size_t step = 1u << 20;
  int iters = 20, warmup = 1, check = 1, root = 0;
  bool csv = false;
  bool switches = false;  // --switches: context switches per call
  std::string type = "float", op = "sum";

  static size_t parseSize(const char* s) {
    char* end = nullptr;
    double v = strtod(s, &end);
    size_t mult = 1;
    if (end && *end) switch (*end) {
        case 'k': case 'K': mult = 1ull << 10; break;
        case 'm': case 'M': mult = 1ull << 20; break;
        case 'g': case 'G': mult = 1ull << 30; break;
        default: break;
      }
    return (size_t)(v * (double)mult);
  }
  // true when argv[i] (and its value) was one of the nccl-tests flags we support
  bool parse(int& i, int argc, char** argv) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "missing value for %s\n", a.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (a == "-b" || a == "--minbytes") minBytes = parseSize(next());
    else if (a == "-e" || a == "--maxbytes") maxBytes = parseSize(next());
    else if (a == "-f" || a == "--stepfactor") factor = strtoul(next(), nullptr, 10);
    else if (a == "-i" || a == "--stepbytes") step = parseSize(next());
    else if (a == "-n" || a == "--iters") iters = atoi(next());
    else if (a == "-w" || a == "--warmup_iters") warmup = atoi(next());
    else if (a == "-c" || a == "--check") check = atoi(next());
    else if (a == "-r" || a == "--root") root = atoi(next());
    else if (a == "-d" || a == "--datatype") type = next();
    else if (a == "-o" || a == "--op") op = next();
    else if (a == "--csv") csv = true;
    else if (a == "--switches") switches = true;
    else return false;
    return true;
  }
  // "" when fine, else what is wrong
  std::string validate() const {
    if (type != "float") return "only -d float is supported";
    if (op != "sum") return "only -o sum is supported";
    if (iters < 1) return "-n must be >= 1";
    if (warmup < 0) return "-w must be >= 0";
    if (minBytes < 1 || maxBytes < minBytes) return "need 1 <= -b <= -e";
    if (factor == 1) return "-f must be >= 2";
    if (factor == 0 && step == 0) return "-i must be > 0";
    return "";
  }
  std::vector<size_t> sizes() const {
    std::vector<size_t> v;
    for (size_t s = minBytes; s <= maxBytes; s = factor ? s * factor : s + step) v.push_back(s);
    return v;
  }
};

inline const char* usageText() {
  return "nccl-tests flags:\n"
         "  -b/--minbytes N   -e/--maxbytes N   (K/M/G = 1024^k; default 32M..32M)\n"
         "  -f/--stepfactor F | -i/--stepbytes N   (default -i 1M)\n"
         "  -n/--iters N (20)  -w/--warmup_iters N (1)  -c/--check 0|1 (1)  -r/--root R (0)\n"
         "  -d float  -o sum   (the only type and op supported)\n"
         "  --csv             machine-readable output (rank 0, stdout)\n"
         "  --switches        context switches per call of all ranks in the timed loop (getrusage)\n";
}

inline const char* kCsvHeader =
    "collective,nranks,bytes,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,"
    "ip_time_us,ip_algbw,ip_busbw,ip_wrong";

struct Result {
  double timeUs = 0;
  long wrong = -1;
  double switchesPerCall = -1;  // --switches
};

// Voluntary and involuntary context switches of this process (all its threads) so far.
inline long contextSwitches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_nvcsw + u.ru_nivcsw;
}

inline void printRow(const Options& o, const CollInfo& ci, int n, size_t count, int root, const Result& oop,
                     const Result& ip) {
  const bool csv = o.csv;
  size_t bytes = reportedBytes(ci.coll, count, n);
  double f = busFactor(ci.coll, n);
  auto bw = [&](double us) { return us > 0 ? (double)bytes / 1e3 / us : 0.0; };  // GB/s
  const char* redop = ci.reduces ? "sum" : "none";
  int rootCol = ci.coll == Coll::Broadcast ? root : -1;
  if (csv) {
    printf("%s,%d,%zu,%zu,float,%s,%d,%.3f,%.6f,%.6f,%ld,%.3f,%.6f,%.6f,%ld", ci.name, n, bytes,
           count, redop, rootCol, oop.timeUs, bw(oop.timeUs), bw(oop.timeUs) * f, oop.wrong,
           ip.timeUs, bw(ip.timeUs), bw(ip.timeUs) * f, ip.wrong);
    if (o.switches) printf(",%.3f,%.3f", oop.switchesPerCall, ip.switchesPerCall);
    printf("\n");
  } else {
    auto wr = [](long w) { return w < 0 ? std::string("N/A") : std::to_string(w); };
    printf("%12zu  %12zu  %8s  %6s  %6d  %9.2f  %7.3f  %7.3f  %6s  %9.2f  %7.3f  %7.3f  %6s\n",
           bytes, count, "float", redop, rootCol, oop.timeUs, bw(oop.timeUs),
           bw(oop.timeUs) * f, wr(oop.wrong).c_str(), ip.timeUs, bw(ip.timeUs),
           bw(ip.timeUs) * f, wr(ip.wrong).c_str());
    if (o.switches)
      printf("#  context switches per call (all ranks): out-of-place %.3f  in-place %.3f\n", oop.switchesPerCall,
             ip.switchesPerCall);
  }
  fflush(stdout);
  // Let the launcher forward the row now, untimed: on a 2-core host it otherwise preempts the printing
  // rank during the next size's timed loop (topoccl's perf programs do the same).
  usleep(1000);
}

inline void printTableHeader(const Options& o) {
  const bool csv = o.csv;
  if (csv) {
    printf("%s%s\n", kCsvHeader, o.switches ? ",oop_switches_per_call,ip_switches_per_call" : "");
  } else {
    printf("#%84s%46s\n", "out-of-place", "in-place");
    printf("# %10s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s  %9s  %7s  %7s  %6s\n", "size", "count",
           "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
           "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %9s  %7s  %7s  %6s  %9s  %7s  %7s  %6s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
           "");
  }
  fflush(stdout);
}

inline void* allocBuf(size_t bytes) {
  size_t a = (bytes + 4096 + 4095) / 4096 * 4096;
  void* p = aligned_alloc(4096, a);
  if (!p) {
    fprintf(stderr, "out of memory allocating %zu bytes\n", a);
    exit(1);
  }
  memset(p, 0, a);  // fault the pages in before timing
  return p;
}

}  // namespace cmp
