#include "perf_common.hpp"

#include <CLI/CLI.hpp>
#include "topoccl/nccl_ext.h"
#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>

#ifdef TOPOCCL_PERF_CUDA
#include <cuda_runtime_api.h>
#endif

#ifdef TOPOCCL_PERF_MPI
#include <mpi.h>
#endif

namespace topoccl::perf {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int threads = 1, gpus = 1;
  std::string minBytes = "32M", maxBytes = "32M", stepBytes = "1M", stepFactor;
  int iters = 20, warmup = 1, aggIters = 1, cycles = 1, check = 1, blocking = 0, average = 1;
  std::string op = "sum", type = "float", root = "0", output;
  bool csv = false, json = false;
  bool injectError = false;  // perturbs one received element per check: proves the check can fail
  bool predict = false;      // print the cost model's time for the plan that ran (topocclCommPredict)
  bool switches = false;     // context switches per call of all ranks in the timed loop (getrusage)
  bool gpu = false;          // buffers on the GPU (ncclMemAlloc device memory, a stream per rank), as nccl-tests
  bool heap = false;         // host buffers from the C heap (a framework's own tensors), not ncclMemAlloc's shared memory
  int unalign = 0;           // -u: buffers start this many elements past their allocation
  int perIter = 0, perIterSkip = 0;  // -I, -K: per-iteration statistics, skipping the first K iterations
  int timestamps = 0;        // -S: a timestamp column after each row
  int cputime = 0;           // -C: the time to issue the calls, not until they complete
  int localRegister = 0;     // -R: 1 ncclCommRegister, 2 ncclCommWindowRegister (symmetric) on every buffer
  double timeout = 0;        // -T: seconds a call may take before the run aborts its communicators
  int stallRank = -1;        // --stall-rank: that rank stops calling before its first timed loop (tests -T)
  // Accepted for nccl-tests compatibility; they configure GPU-only machinery and change nothing here.
  int parallelInit = 0, streamNull = 0, graph = 0, memory = 0, ctaPolicy = -1, deviceImpl = 0, deviceCtas = 16;
};

// Ends the run with a message. Rank threads may fail together (every thread's first CUDA call on a machine
// without a usable GPU): only the first ends the process; exit() from two threads at once corrupts the heap.
[[noreturn]] void die(const std::string& message) {
  static std::atomic<bool> ending{false};
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  if (ending.exchange(true))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the first failing thread ends the process
#ifdef TOPOCCL_PERF_MPI
  int up = 0;
  MPI_Initialized(&up);
  if (up) MPI_Abort(MPI_COMM_WORLD, 1);
#endif
  std::exit(1);
}

// Where the benchmark's buffers live. Host: plain memory operations. GPU (--gpu): the CUDA runtime, with the
// fills and checks staged through host memory, and each rank's stream synchronized where the host waits.
// Fills wait for the legacy stream they ran on: cudaMemset and a pageable cudaMemcpy may return before the
// device holds the data, and the collectives run on non-blocking streams that do not wait for it (seen on an
// H200: a one-rank all-reduce copied half-written inputs at 512 KiB and 2 MiB).
struct Memory {
  bool gpu = false;
  void zero(void* p, size_t bytes) const {
#ifdef TOPOCCL_PERF_CUDA
    if (gpu) {
      check(cudaMemset(p, 0, bytes), "cudaMemset");
      return check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize after cudaMemset");
    }
#endif
    std::memset(p, 0, bytes);
  }
  void upload(void* dst, const void* src, size_t bytes) const {
#ifdef TOPOCCL_PERF_CUDA
    if (gpu) {
      check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
      return check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize after cudaMemcpy to the GPU");
    }
#endif
    std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) const {
#ifdef TOPOCCL_PERF_CUDA
    if (gpu) return check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU");
#endif
    std::memcpy(dst, src, bytes);
  }
  void sync(cudaStream_t stream) const {
#ifdef TOPOCCL_PERF_CUDA
    if (gpu) check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
#else
    (void)stream;
#endif
  }
#ifdef TOPOCCL_PERF_CUDA
  static void check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    die(std::string("perf: ") + what + " failed: " + cudaGetErrorString(e));
  }
#endif
};

size_t parseSize(const std::string& text, const char* flag) {
  if (text.empty()) throw CLI::ValidationError(flag, "empty size");
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw CLI::ValidationError(flag, "'" + text + "' is not a size (e.g. 8, 64K, 32M, 1G)");
  }
  double scale = 1;
  if (pos < text.size()) {
    const char s = static_cast<char>(std::toupper(static_cast<unsigned char>(text[pos])));
    scale = s == 'K' ? 1024.0 : s == 'M' ? 1024.0 * 1024 : s == 'G' ? 1024.0 * 1024 * 1024 : 0;
    if (scale == 0 || pos + 1 != text.size()) throw CLI::ValidationError(flag, "'" + text + "': suffix must be K, M or G");
  }
  if (value < 0) throw CLI::ValidationError(flag, "'" + text + "' is negative");
  return static_cast<size_t>(value * scale);
}

struct TypeInfo {
  ncclDataType_t type;
  const char* name;
  size_t size;
  double exactLimit;  // largest integer magnitude the type holds exactly (inputs are kept below it)
  bool isFloat;
};
const std::vector<TypeInfo>& types() {
  static const std::vector<TypeInfo> all = {
      {ncclInt8, "int8", 1, 127, false},        {ncclUint8, "uint8", 1, 255, false},
      {ncclInt32, "int32", 4, 2147483647.0, false}, {ncclUint32, "uint32", 4, 4294967295.0, false},
      {ncclInt64, "int64", 8, 9e15, false},     {ncclUint64, "uint64", 8, 9e15, false},
      {ncclHalf, "half", 2, 2048, true},        {ncclFloat, "float", 4, 16777216.0, true},
      {ncclDouble, "double", 8, 9e15, true},    {ncclBfloat16, "bfloat16", 2, 256, true},
  };
  return all;
}
struct OpInfo {
  ncclRedOp_t op;
  const char* name;
};
const std::vector<OpInfo>& ops() {
  static const std::vector<OpInfo> all = {
      {ncclSum, "sum"}, {ncclProd, "prod"}, {ncclMax, "max"}, {ncclMin, "min"}, {ncclAvg, "avg"}};
  return all;
}

// ---- element conversion (host memory; half through _Float16, bfloat16 by its upper 16 bits) ----
void store(char* base, size_t i, ncclDataType_t t, double v) {
  switch (t) {
    case ncclInt8: reinterpret_cast<int8_t*>(base)[i] = static_cast<int8_t>(v); break;
    case ncclUint8: reinterpret_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
    case ncclInt32: reinterpret_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case ncclUint32: reinterpret_cast<uint32_t*>(base)[i] = static_cast<uint32_t>(v); break;
    case ncclInt64: reinterpret_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case ncclUint64: reinterpret_cast<uint64_t*>(base)[i] = static_cast<uint64_t>(v); break;
    case ncclHalf: reinterpret_cast<_Float16*>(base)[i] = static_cast<_Float16>(v); break;
    case ncclFloat: reinterpret_cast<float*>(base)[i] = static_cast<float>(v); break;
    case ncclDouble: reinterpret_cast<double*>(base)[i] = v; break;
    case ncclBfloat16: {
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const auto top = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);  // round to nearest even
      std::memcpy(base + 2 * i, &top, 2);
      break;
    }
    default: break;
  }
}
double load(const char* base, size_t i, ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return reinterpret_cast<const int8_t*>(base)[i];
    case ncclUint8: return reinterpret_cast<const uint8_t*>(base)[i];
    case ncclInt32: return reinterpret_cast<const int32_t*>(base)[i];
    case ncclUint32: return reinterpret_cast<const uint32_t*>(base)[i];
    case ncclInt64: return static_cast<double>(reinterpret_cast<const int64_t*>(base)[i]);
    case ncclUint64: return static_cast<double>(reinterpret_cast<const uint64_t*>(base)[i]);
    case ncclHalf: return static_cast<double>(reinterpret_cast<const _Float16*>(base)[i]);
    case ncclFloat: return reinterpret_cast<const float*>(base)[i];
    case ncclDouble: return reinterpret_cast<const double*>(base)[i];
    case ncclBfloat16: {
      uint16_t top;
      std::memcpy(&top, base + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(top) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default: return 0;
  }
}

// Inputs: small positive integers, so every reduction order gives the same exact result in every type
// (sum of N inputs stays below the type's exact limit); for prod exactly one rank contributes 2 per element.
struct InputState {
  uint64_t seed = 0;
  int nranks = 1;
  int maxValue = 9;
  ncclRedOp_t op = ncclSum;
};
double inputValue(int r, size_t j, void* s) {
  const auto* st = static_cast<const InputState*>(s);
  if (st->op == ncclProd) return (static_cast<size_t>(r) + j) % static_cast<size_t>(st->nranks) == 0 ? 2.0 : 1.0;
  const uint64_t h = (static_cast<uint64_t>(r) * 131u + j * 7u + st->seed) % static_cast<uint64_t>(st->maxValue);
  return 1.0 + static_cast<double>(h);
}

// nccl-tests' number fitting: %.2f, then %.1f, %.0f, then an exponent, within `width`.
std::string fit(double v, int width) {
  char buf[64];
  for (const char* f : {"%.2f", "%.1f", "%.0f"}) {
    std::snprintf(buf, sizeof buf, f, v);
    if (static_cast<int>(std::strlen(buf)) <= width) return buf;
  }
  std::snprintf(buf, sizeof buf, "%.*e", std::max(0, width - 6), v);
  return buf;
}

// Voluntary and involuntary context switches of this process (all its threads) so far.
long processContextSwitches() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_nvcsw + usage.ru_nivcsw;
}

// -I: one row's per-iteration times (max over ranks, per iteration), in seconds.
struct IterStats {
  int skipped = 0, counted = 0;
  double min = 0, max = 0, avg = 0, p50 = 0, p95 = 0, p99 = 0, stdev = 0;
  double cvPercent() const { return avg > 0 ? stdev / avg * 100.0 : 0.0; }
};

// nccl-tests' percentile rank: the ceil(n x p / 100)-th smallest.
size_t percentileIndex(size_t n, int percentile) {
  return std::min(n - 1, (n * static_cast<size_t>(percentile) + 99) / 100 - 1);
}

IterStats iterStats(std::vector<double> times, int skip) {
  IterStats s;
  s.skipped = skip;
  if (static_cast<size_t>(skip) >= times.size()) return s;
  times.erase(times.begin(), times.begin() + skip);
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  s.counted = static_cast<int>(n);
  s.min = times.front();
  s.max = times.back();
  s.p50 = times[n / 2];
  s.p95 = times[percentileIndex(n, 95)];
  s.p99 = times[percentileIndex(n, 99)];
  double sum = 0;
  for (double t : times) sum += t;
  s.avg = sum / static_cast<double>(n);
  double var = 0;
  for (double t : times) var += (t - s.avg) * (t - s.avg);
  s.stdev = std::sqrt(var / static_cast<double>(n));
  return s;
}

std::string nowText() {  // nccl-tests' timestamp: local time, %Y-%m-%d %H:%M:%S
  char buf[64];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &local);
  return buf;
}

struct Row {
  size_t bytes = 0, count = 0;
  std::string type, op;
  int root = -1;
  double time[2] = {0, 0}, algbw[2] = {0, 0}, busbw[2] = {0, 0};
  long long wrong[2] = {-1, -1};
  std::string plan[2];                 // --predict: the plan that ran and the model's time for it
  double predictedUs[2] = {0, 0};
  double switchesPerCall[2] = {-1, -1};  // --switches
  IterStats iter[2];                     // -I
  std::string timestamp;                 // -S
};

class Runner {
 public:
  Runner(const CollectiveSpec& spec, Options o, std::string program) : spec_(spec), o_(std::move(o)), program_(std::move(program)) {}

  int run() {
    minBytes_ = parseSize(o_.minBytes, "-b");
    maxBytes_ = parseSize(o_.maxBytes, "-e");
    if (!o_.stepFactor.empty()) {
      factor_ = std::stod(o_.stepFactor);
      if (!(factor_ > 1)) die(program_ + ": -f/--stepfactor must be > 1, got " + o_.stepFactor);
    } else {
      step_ = parseSize(o_.stepBytes, "-i");
      if (step_ == 0) die(program_ + ": -i/--stepbytes must be > 0");
    }
    if (maxBytes_ < minBytes_) die(program_ + ": -e/--maxbytes " + o_.maxBytes + " is below -b/--minbytes " + o_.minBytes);
    if (o_.threads < 1 || o_.gpus < 1) die(program_ + ": -t and -g must be at least 1");
#ifndef TOPOCCL_PERF_CUDA
    if (o_.gpu) die(program_ + ": --gpu needs a build with CUDA (nvcc was not found when this one was configured)");
#endif
    mem_.gpu = o_.gpu;
    if (o_.iters < 1 || o_.warmup < 0 || o_.aggIters < 1 || o_.check < 0 || o_.cycles < 0)
      die(program_ + ": -n and -m must be >= 1; -w, -c and -N >= 0");
    if (o_.unalign < 0) die(program_ + ": -u/--unalign " + std::to_string(o_.unalign) + " must be >= 0 elements");
    if (o_.perIterSkip < 0 || (o_.perIter && o_.perIterSkip >= o_.iters))
      die(program_ + ": -K/--per_iter_skip " + std::to_string(o_.perIterSkip) + " must be >= 0 and leave some of the " +
          std::to_string(o_.iters) + " iterations of -n/--iters to summarize");
    if (o_.localRegister < 0 || o_.localRegister > 2)
      die(program_ + ": -R/--local_register " + std::to_string(o_.localRegister) +
          " must be 0, 1 (ncclCommRegister) or 2 (ncclCommWindowRegister, symmetric)");
    if (!(o_.timeout >= 0)) die(program_ + ": -T/--timeout must be >= 0 seconds (0: none)");
    for (const TypeInfo& t : types())
      if (o_.type == "all" || o_.type == t.name) types_.push_back(t);
    if (types_.empty()) die(program_ + ": -d/--datatype '" + o_.type + "' is not one of int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 all");
    if (spec_.reduces) {
      for (const OpInfo& op : ops())
        if (o_.op == "all" || o_.op == op.name) ops_.push_back(op);
      if (ops_.empty()) die(program_ + ": -o/--op '" + o_.op + "' is not one of sum prod max min avg all");
    } else {
      ops_.push_back({ncclSum, "none"});
    }

#ifdef TOPOCCL_PERF_MPI
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs_);
    MPI_Comm_rank(MPI_COMM_WORLD, &proc_);
#endif
    // Every process's pid and host, for the "Using devices" block.
    ProcessName me{static_cast<int64_t>(::getpid()), {}};
    ::gethostname(me.host, sizeof me.host - 1);
    processNames_.assign(static_cast<size_t>(nprocs_), me);
#ifdef TOPOCCL_PERF_MPI
    MPI_Allgather(&me, sizeof me, MPI_BYTE, processNames_.data(), sizeof me, MPI_BYTE, MPI_COMM_WORLD);
#endif
    nranks_ = nprocs_ * o_.threads * o_.gpus;
    if (spec_.ungroupable && (o_.gpus > 1 || o_.aggIters > 1))
      die(program_ + ": its rounds depend on each other and cannot share a group: -g/--ngpus (" + std::to_string(o_.gpus) +
          ") and -m/--agg_iters (" + std::to_string(o_.aggIters) + ") must be 1; use processes or -t threads");
    if (spec_.rooted) {
      if (o_.root == "all") {
        for (int r = 0; r < nranks_; ++r) roots_.push_back(r);
      } else {
        const int r = std::atoi(o_.root.c_str());
        if (r < 0 || r >= nranks_) die(program_ + ": -r/--root " + o_.root + " is not a rank of " + std::to_string(nranks_));
        roots_.push_back(r);
      }
    } else {
      roots_.push_back(-1);
    }
    ncclUniqueId id{};
    if (proc_ == 0 && ncclGetUniqueId(&id) != ncclSuccess) die(program_ + ": ncclGetUniqueId failed: " + ncclGetLastError(nullptr));
#ifdef TOPOCCL_PERF_MPI
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
    id_ = id;
    printHeader();
    threadTimes_.assign(static_cast<size_t>(o_.threads), 0.0);
    threadIterTimes_.assign(static_cast<size_t>(o_.threads), {});
    barrier_ = std::make_unique<std::barrier<>>(o_.threads);
    if (watching()) {
      flights_ = std::make_unique<Flight[]>(static_cast<size_t>(o_.threads));
      watchdog_ = std::thread([this] { watchdogLoop(); });
    }
    std::vector<std::thread> workers;
    for (int t = 1; t < o_.threads; ++t) workers.emplace_back([this, t] { worker(t); });
    worker(0);
    for (std::thread& w : workers) w.join();
    if (watchdog_.joinable()) {
      stopWatchdog_ = true;
      watchdog_.join();
    }
    const bool ok = printFooter();
#ifdef TOPOCCL_PERF_MPI
    MPI_Finalize();
#endif
    return ok ? 0 : 1;
  }

 private:
  const CollectiveSpec& spec_;
  Options o_;
  std::string program_;
  size_t minBytes_ = 0, maxBytes_ = 0, step_ = 0;
  double factor_ = 0;
  int nprocs_ = 1, proc_ = 0, nranks_ = 1;
  struct ProcessName {
    int64_t pid;
    char host[56];
  };
  std::vector<ProcessName> processNames_;
  std::vector<TypeInfo> types_;
  std::vector<OpInfo> ops_;
  std::vector<int> roots_;
  ncclUniqueId id_{};
  std::unique_ptr<std::barrier<>> barrier_;
  std::vector<double> threadTimes_;
  Memory mem_;
  std::atomic<long long> wrong_{0};
  std::vector<Row> rows_;
  long long totalWrong_ = 0;
  std::vector<std::vector<double>> threadIterTimes_;  // -I: each thread's per-iteration times of the last loop

  // -T: what each thread of this process waits on, watched by a thread of its own.
  struct Flight {
    std::atomic<int64_t> sinceNs{0};  // steady clock when the wait began; 0: nothing in flight
    std::atomic<int> iteration{-1};   // the timed iteration, or -1
    std::mutex mutex;
    std::string what;
  };
  std::unique_ptr<Flight[]> flights_;
  std::mutex commsMutex_;
  std::vector<ncclComm_t> comms_;  // this process's communicators, for the watchdog to revoke
  std::atomic<bool> timedOut_{false};
  std::atomic<bool> stopWatchdog_{false};
  std::thread watchdog_;

  bool watching() const { return o_.timeout > 0; }
  static int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  }
  void watch(int thread, std::string what) {
    if (!watching()) return;
    Flight& f = flights_[static_cast<size_t>(thread)];
    {
      std::lock_guard lock(f.mutex);
      f.what = std::move(what);
    }
    f.iteration.store(-1, std::memory_order_relaxed);
    f.sinceNs.store(nowNs(), std::memory_order_release);
  }
  void rewatch(int thread, int iteration) {  // the next timed iteration: cheap, no string work
    Flight& f = flights_[static_cast<size_t>(thread)];
    f.iteration.store(iteration, std::memory_order_relaxed);
    f.sinceNs.store(nowNs(), std::memory_order_release);
  }
  void unwatch(int thread) {
    if (watching()) flights_[static_cast<size_t>(thread)].sinceNs.store(0, std::memory_order_release);
  }

  void watchdogLoop() {
    const auto limitNs = static_cast<int64_t>(o_.timeout * 1e9);
    while (!stopWatchdog_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const int64_t now = nowNs();
      for (int t = 0; t < o_.threads; ++t) {
        Flight& f = flights_[static_cast<size_t>(t)];
        const int64_t since = f.sinceNs.load(std::memory_order_acquire);
        if (since != 0 && now - since >= limitNs) timeOut(t, f, static_cast<double>(now - since) / 1e9);
      }
    }
  }

  // nccl-tests' -T: abort the communicators and report the timeout. Revoked, not destroyed (the waiting threads
  // still use them), so those calls return with an error; the process then ends, which mpirun turns into the
  // end of the job.
  [[noreturn]] void timeOut(int thread, Flight& f, double waited) {
    timedOut_ = true;
    std::string what;
    {
      std::lock_guard lock(f.mutex);
      what = f.what;
    }
    const int iteration = f.iteration.load();
    if (iteration >= 0) what += ", iteration " + std::to_string(iteration + 1) + " of " + std::to_string(o_.iters);
    std::vector<ncclComm_t> comms;
    {
      std::lock_guard lock(commsMutex_);
      comms = comms_;
    }
    std::string ranks;
    for (int g = 0; g < o_.gpus; ++g)
      ranks += (g ? "," : "") + std::to_string((proc_ * o_.threads + thread) * o_.gpus + g);
    std::fprintf(stderr,
                 "%s: Test timeout: rank %s: %s has waited %.1f s, over the -T/--timeout of %g s; aborting this "
                 "process's %zu communicator(s)\n",
                 program_.c_str(), ranks.c_str(), what.c_str(), waited, o_.timeout, comms.size());
    std::fflush(stderr);
    std::thread([comms] {
      for (ncclComm_t comm : comms) ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
    }).detach();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the calls return their errors meanwhile
    std::fflush(stdout);
    std::_Exit(1);
  }

  // --stall-rank: the rank stops calling, as a hung peer would (what -T is for).
  void stallIfAsked(const std::vector<RankContext>& rc) {
    for (const RankContext& c : rc) {
      if (c.rank != o_.stallRank) continue;
      std::fprintf(stderr, "%s: rank %d stops calling (--stall-rank)\n", program_.c_str(), c.rank);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }

  bool printing() const { return proc_ == 0; }

  std::vector<size_t> sizes() const {
    std::vector<size_t> out;
    for (size_t s = minBytes_;; ) {
      out.push_back(s);
      if (s >= maxBytes_) break;
      size_t next = factor_ > 0 ? static_cast<size_t>(std::max(static_cast<double>(s) * factor_, static_cast<double>(s + 1))) : s + step_;
      if (s == 0 && factor_ > 0) next = 1;
      s = std::min(next, maxBytes_);
      if (s == out.back()) break;
    }
    return out;
  }

  void printHeader() {
    if (!printing() || o_.csv || o_.json) return;
    int version = 0;
    ncclGetVersion(&version);
    std::printf("# nccl-tests version 2.19.6 nccl-headers=%d nccl-library=%d (topoccl)\n", NCCL_VERSION_CODE, version);
    std::printf("# Collective test starting: %s\n", program_.c_str());
    std::printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %s warmup iters: %d iters: %d agg iters: %d "
                "validation: %d graph: %d unalign: %d\n",
                o_.threads, o_.gpus, minBytes_, maxBytes_,
                (factor_ > 0 ? std::to_string(static_cast<int>(factor_)) + "(factor)" : std::to_string(step_) + "(bytes)").c_str(),
                o_.warmup, o_.iters, o_.aggIters, o_.check, o_.graph, o_.unalign);
    if (o_.perIter) {
      std::printf("# Per-Iteration Report: host clock timing; i_* uses max over process rows");
      if (o_.perIterSkip) std::printf("; summary skips first %d iterations", o_.perIterSkip);
      std::printf(" \n");
    }
    if (o_.localRegister) std::printf("# Buffers registered: %s\n", o_.localRegister == 1 ? "ncclCommRegister" : "ncclCommWindowRegister (symmetric)");
    if (o_.timeout > 0) std::printf("# Timeout: %g s per call (-T)\n", o_.timeout);
    std::printf("#\n# Using devices\n");
    for (int p = 0; p < nprocs_; ++p)
      for (int t = 0; t < o_.threads; ++t)
        for (int g = 0; g < o_.gpus; ++g) {
          const int rank = (p * o_.threads + t) * o_.gpus + g;
          const ProcessName& name = processNames_[static_cast<size_t>(p)];
          std::printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n", rank, 0,
                      static_cast<int>(name.pid), name.host, t * o_.gpus + g, 0, 0, 0,
                      o_.gpu ? "GPU memory (topoccl)" : "host memory (topoccl, CPU)");
        }
    std::printf("#\n");
    // nccl-tests' table header; -I adds i_min, i_max, i_p99 and i_cv% to each block, -S a timestamp column.
    const char* timeLabel = o_.cputime ? "cputime" : "time";
    if (o_.perIter)
      std::printf("# %51s  %69s  %69s\n", "", "out-of-place (+ per-iteration)", "in-place (+ per-iteration)");
    else
      std::printf("# %51s  %33s  %33s\n", "", "out-of-place", "in-place");
    std::printf("#%11s  %12s  %8s  %6s  %6s", "size", "count", "type", "redop", "root");
    for (int k = 0; k < 2; ++k) {
      std::printf("  %7s  %6s  %6s  %6s", timeLabel, "algbw", "busbw", "#wrong");
      if (o_.perIter) std::printf("  %7s  %7s  %7s  %7s", "i_min", "i_max", "i_p99", "i_cv%");
    }
    if (o_.timestamps) std::printf(" %19s", "timestamp");
    std::printf("\n#%11s  %12s  %8s  %6s  %6s", "(B)", "(elements)", "", "", "");
    for (int k = 0; k < 2; ++k) {
      std::printf("  %7s  %6s  %6s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
      if (o_.perIter) std::printf("  %7s  %7s  %7s  %7s", "(us)", "(us)", "(us)", "(%)");
    }
    if (o_.timestamps) std::printf(" %19s", "%Y-%m-%d %H:%M:%S");
    std::printf("\n");
    std::fflush(stdout);
  }

  // nccl-tests' collective names without underscores are topocclCommPredict's ("all_reduce" -> "allreduce").
  void predictRow(ncclComm_t comm, Row& row) {
    std::string name = spec_.name;
    std::erase(name, '_');
    for (int k = 0; k < 2; ++k) {
      topocclPrediction_t p{};
      if (topocclCommPredict(comm, name.c_str(), row.bytes, k, &p) != ncclSuccess) {
        row.plan[k] = std::string("none: ") + ncclGetLastError(comm);
        continue;
      }
      row.plan[k] = p.plan;
      row.predictedUs[k] = p.predictedUs;
    }
  }

  // One CSV layout for --csv and -J FILE.csv; --predict adds the plan that ran and the model's time for it.
  std::string csvHeader() const {
    // -C reports the time to issue the calls: its columns say cputime instead of time.
    const std::string time = o_.cputime ? "cputime_us" : "time_us";
    std::string h = "collective,nranks,bytes,count,type,redop,root,oop_" + time + ",oop_algbw,oop_busbw,oop_wrong,ip_" + time +
                    ",ip_algbw,ip_busbw,ip_wrong";
    if (o_.perIter)
      for (const char* block : {"oop", "ip"})
        for (const char* stat : {"min", "max", "avg", "p50", "p95", "p99", "stdev"}) h += std::string(",") + block + "_i_" + stat + "_us";
    if (o_.timestamps) h += ",timestamp";
    if (o_.switches) h += ",oop_switches_per_call,ip_switches_per_call";
    if (o_.predict) h += ",oop_plan,oop_predicted_us,ip_plan,ip_predicted_us";
    return h;
  }

  std::string csvRow(const Row& r) const {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s,%d,%zu,%zu,%s,%s,%d", spec_.name, nranks_, r.bytes, r.count, r.type.c_str(), r.op.c_str(), r.root);
    std::string row = buf;
    for (int k = 0; k < 2; ++k) {
      std::snprintf(buf, sizeof buf, ",%.3f,%.4f,%.4f,%lld", r.time[k], r.algbw[k], r.busbw[k], r.wrong[k]);
      row += buf;
    }
    if (o_.perIter)
      for (const IterStats& s : r.iter) {
        for (double v : {s.min, s.max, s.avg, s.p50, s.p95, s.p99, s.stdev}) {
          std::snprintf(buf, sizeof buf, ",%.3f", v * 1e6);
          row += buf;
        }
      }
    if (o_.timestamps) row += "," + r.timestamp;
    if (o_.switches) {
      std::snprintf(buf, sizeof buf, ",%.3f,%.3f", r.switchesPerCall[0], r.switchesPerCall[1]);
      row += buf;
    }
    if (o_.predict)
      for (int k = 0; k < 2; ++k) {
        std::string plan = r.plan[k];
        std::replace(plan.begin(), plan.end(), ',', ';');  // an error message may hold commas
        std::snprintf(buf, sizeof buf, ",%.1f", r.predictedUs[k]);
        row += "," + plan + buf;
      }
    return row;
  }

  void printRow(const Row& r) {
    if (!printing()) return;
    if (o_.csv) {
      static bool header = false;
      if (!header) {
        std::printf("%s\n", csvHeader().c_str());
        header = true;
      }
      std::printf("%s\n", csvRow(r).c_str());
    } else if (!o_.json) {
      std::printf("%12zu  %12zu  %8s  %6s  %6d", r.bytes, r.count, r.type.c_str(), r.op.c_str(), r.root);
      for (int k = 0; k < 2; ++k) {
        std::printf("  %7s  %6s  %6s  %6s", fit(r.time[k], 7).c_str(), fit(r.algbw[k], 6).c_str(), fit(r.busbw[k], 6).c_str(),
                    r.wrong[k] < 0 ? "N/A" : std::to_string(r.wrong[k]).c_str());
        if (o_.perIter) {
          const IterStats& s = r.iter[k];
          std::printf("  %7s  %7s  %7s  %7s", fit(s.min * 1e6, 7).c_str(), fit(s.max * 1e6, 7).c_str(), fit(s.p99 * 1e6, 7).c_str(),
                      fit(s.cvPercent(), 7).c_str());
        }
      }
      if (o_.timestamps) std::printf("%21s", r.timestamp.c_str());
      std::printf("\n");
      if (o_.switches)  // comment lines, so parsers of nccl-tests output skip them
        std::printf("#  context switches per call (all ranks): out-of-place %.3f  in-place %.3f\n", r.switchesPerCall[0],
                    r.switchesPerCall[1]);
      if (o_.predict) {  // a comment line, so parsers of nccl-tests output skip it
        std::printf("#  predicted");
        for (int k = 0; k < 2; ++k) {
          if (r.predictedUs[k] > 0)
            std::printf("  %s: %s %.1f us, measured/predicted %.3f", k ? "in-place" : "out-of-place", r.plan[k].c_str(),
                        r.predictedUs[k], r.time[k] / r.predictedUs[k]);
          else
            std::printf("  %s: %s", k ? "in-place" : "out-of-place", r.plan[k].c_str());
        }
        std::printf("\n");
      }
    }
    std::fflush(stdout);
    // Let the launcher (mpirun) forward the row now, untimed: on a 2-core host it otherwise preempts the
    // printing rank in the next size's timed loop, 60-500 us at once (perf/compare's programs do the same).
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  bool printFooter() {
    double sum = 0;
    int n = 0;
    for (const Row& r : rows_)
      for (int k = 0; k < 2; ++k) sum += r.busbw[k], ++n;
    const double avg = n ? sum / n : 0;
    bool ok = totalWrong_ == 0;
    if (const char* min = std::getenv("NCCL_TESTS_MIN_BW"); min && avg < 0.9 * std::atof(min)) ok = false;
    if (!printing()) return ok;
    if (o_.json || (!o_.output.empty() && o_.output.ends_with(".json"))) {
      nlohmann::json rows = nlohmann::json::array();
      for (const Row& r : rows_) {
        const std::string time = o_.cputime ? "cputime_us" : "time_us";
        rows.push_back({{"collective", spec_.name}, {"nranks", nranks_}, {"bytes", r.bytes}, {"count", r.count}, {"type", r.type},
                        {"redop", r.op}, {"root", r.root}, {"oop_" + time, r.time[0]}, {"oop_algbw", r.algbw[0]},
                        {"oop_busbw", r.busbw[0]}, {"oop_wrong", r.wrong[0]}, {"ip_" + time, r.time[1]}, {"ip_algbw", r.algbw[1]},
                        {"ip_busbw", r.busbw[1]}, {"ip_wrong", r.wrong[1]}});
        if (o_.perIter)
          for (int k = 0; k < 2; ++k) {
            const IterStats& s = r.iter[k];
            rows.back()[k ? "ip_per_iter" : "oop_per_iter"] = {
                {"skipped_iterations", s.skipped}, {"counted_iterations", s.counted}, {"min_us", s.min * 1e6},
                {"max_us", s.max * 1e6}, {"avg_us", s.avg * 1e6}, {"p50_us", s.p50 * 1e6}, {"p95_us", s.p95 * 1e6},
                {"p99_us", s.p99 * 1e6}, {"stdev_us", s.stdev * 1e6}, {"cv_pct", s.cvPercent()}};
          }
        if (o_.timestamps) rows.back()["timestamp"] = r.timestamp;
        if (o_.switches)
          rows.back().update({{"oop_switches_per_call", r.switchesPerCall[0]}, {"ip_switches_per_call", r.switchesPerCall[1]}});
        if (o_.predict)
          rows.back().update({{"oop_plan", r.plan[0]}, {"oop_predicted_us", r.predictedUs[0]}, {"ip_plan", r.plan[1]},
                              {"ip_predicted_us", r.predictedUs[1]}});
      }
      const nlohmann::json doc = {{"program", program_}, {"nranks", nranks_}, {"rows", rows}, {"avg_busbw", avg},
                                  {"out_of_bounds", totalWrong_}};
      if (o_.json) std::printf("%s\n", doc.dump(1).c_str());
      if (!o_.output.empty()) std::ofstream(o_.output) << doc.dump(1) << "\n";
    } else if (!o_.output.empty()) {
      std::ofstream out(o_.output);
      out << csvHeader() << '\n';
      for (const Row& r : rows_) out << csvRow(r) << '\n';
    }
    if (!o_.csv && !o_.json) {
      std::printf("# Out of bounds values : %lld %s\n", totalWrong_, totalWrong_ == 0 ? "OK" : "FAILED");
      std::printf("# Avg bus bandwidth    : %g \n", avg);
      std::printf("#\n# Collective test concluded: %s\n", program_.c_str());
      if (!ok && totalWrong_ == 0) std::printf("# FAILED: average bus bandwidth below 0.9 x NCCL_TESTS_MIN_BW\n");
    }
    std::fflush(stdout);
    return ok;
  }

  // All ranks of all threads and processes: thread barrier, then one MPI barrier, then thread barrier.
  void barrierAll(int thread) {
    barrier_->arrive_and_wait();
#ifdef TOPOCCL_PERF_MPI
    if (thread == 0) MPI_Barrier(MPI_COMM_WORLD);
#else
    (void)thread;
#endif
    barrier_->arrive_and_wait();
  }

  void checkNccl(ncclResult_t r, const char* call, int rank) {
    if (r == ncclSuccess) return;
    while (timedOut_.load()) std::this_thread::sleep_for(std::chrono::seconds(1));  // -T ends the process
    die(program_ + ": rank " + std::to_string(rank) + ": " + call + " failed: " + ncclGetErrorString(r) + ": " +
        ncclGetLastError(nullptr));
  }

  void worker(int thread) {
    const int g = o_.gpus;
    std::vector<RankContext> rc(static_cast<size_t>(g));
    checkNccl(ncclGroupStart(), "ncclGroupStart", 0);
    for (int i = 0; i < g; ++i) {
      rc[i].rank = (proc_ * o_.threads + thread) * g + i;
      rc[i].nranks = nranks_;
      checkNccl(ncclCommInitRank(&rc[i].comm, nranks_, id_, rc[i].rank), "ncclCommInitRank", rc[i].rank);
    }
    checkNccl(ncclGroupEnd(), "ncclGroupEnd (communicator creation)", rc[0].rank);
    {
      std::lock_guard lock(commsMutex_);
      for (const RankContext& c : rc) comms_.push_back(c.comm);
    }

    size_t maxElt = 1;
    for (const TypeInfo& t : types_) maxElt = std::max(maxElt, t.size);
    size_t sendMax = 1, recvMax = 1;
    for (const TypeInfo& t : types_) {
      size_t pc = 0, se = 0, re = 0;
      spec_.counts(maxBytes_, t.size, nranks_, pc, se, re);
      sendMax = std::max(sendMax, se * t.size);
      recvMax = std::max(recvMax, re * t.size);
    }
    // One allocation serves both (in place aliases into it), sized for the larger of the two, plus -u's offset.
    const size_t alloc = std::max(sendMax, recvMax) + static_cast<size_t>(o_.unalign) * maxElt + 64;
    struct Registration {
      void* send = nullptr;
      void* recv = nullptr;
      ncclWindow_t sendWindow = nullptr, recvWindow = nullptr;
    };
    std::vector<Registration> registrations(rc.size());
    for (RankContext& c : rc) {
#ifdef TOPOCCL_PERF_CUDA
      if (o_.gpu) {
        // nccl-tests' placement: this process's ranks over the visible GPUs in turn (one GPU: all on it).
        int devices = 0;
        Memory::check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
        Memory::check(cudaSetDevice((thread * o_.gpus + (c.rank % o_.gpus)) % std::max(1, devices)), "cudaSetDevice");
        Memory::check(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking), "cudaStreamCreate");
      }
#endif
      void* s = nullptr;
      void* r = nullptr;
      if (o_.heap) {
        // Page-aligned like ncclMemAlloc's, but private to the process: peers cannot map it.
        const size_t rounded = (alloc + 4095) / 4096 * 4096;
        s = std::aligned_alloc(4096, rounded);
        r = std::aligned_alloc(4096, rounded);
        if (s == nullptr || r == nullptr) throw std::runtime_error("rank " + std::to_string(c.rank) + ": out of memory for " + std::to_string(rounded) + "-byte buffers (--heap)");
      } else {
        checkNccl(ncclMemAlloc(&s, alloc), "ncclMemAlloc", c.rank);
        checkNccl(ncclMemAlloc(&r, alloc), "ncclMemAlloc", c.rank);
      }
      c.sendBase = static_cast<char*>(s);
      c.recvBase = static_cast<char*>(r);
      mem_.zero(c.sendBase, alloc);
      mem_.zero(c.recvBase, alloc);
      // -R: register the buffers, as nccl-tests does (1: local registration; 2: a symmetric window).
      Registration& reg = registrations[static_cast<size_t>(&c - rc.data())];
      if (o_.localRegister == 1) {
        checkNccl(ncclCommRegister(c.comm, c.sendBase, alloc, &reg.send), "ncclCommRegister (send buffer)", c.rank);
        checkNccl(ncclCommRegister(c.comm, c.recvBase, alloc, &reg.recv), "ncclCommRegister (receive buffer)", c.rank);
      } else if (o_.localRegister == 2) {
        checkNccl(ncclCommWindowRegister(c.comm, c.sendBase, alloc, &reg.sendWindow, NCCL_WIN_COLL_SYMMETRIC),
                  "ncclCommWindowRegister (send buffer)", c.rank);
        checkNccl(ncclCommWindowRegister(c.comm, c.recvBase, alloc, &reg.recvWindow, NCCL_WIN_COLL_SYMMETRIC),
                  "ncclCommWindowRegister (receive buffer)", c.rank);
      }
    }

    std::vector<size_t> sizeList = sizes();
    if (spec_.powerOfTwoRanks && (nranks_ & (nranks_ - 1)) != 0) {
      if (printing() && thread == 0 && !o_.csv && !o_.json) std::printf("nRanks %d is not a power of 2, skipping\n", nranks_);
      sizeList.clear();  // as nccl-tests: nothing to run, the footer still closes the output
    }
    for (int cycle = 0; o_.cycles == 0 || cycle < o_.cycles; ++cycle) {
      for (const TypeInfo& t : types_) {
        for (const OpInfo& op : ops_) {
          for (int root : roots_) {
            for (size_t bytes : sizeList) measure(rc, bytes, t, op, root, thread);
          }
        }
      }
    }
    barrierAll(thread);
    {
      std::lock_guard lock(commsMutex_);
      std::erase_if(comms_, [&](ncclComm_t comm) {
        return std::any_of(rc.begin(), rc.end(), [&](const RankContext& c) { return c.comm == comm; });
      });
    }
    for (RankContext& c : rc) {
      const Registration& reg = registrations[static_cast<size_t>(&c - rc.data())];
      if (reg.send) checkNccl(ncclCommDeregister(c.comm, reg.send), "ncclCommDeregister (send buffer)", c.rank);
      if (reg.recv) checkNccl(ncclCommDeregister(c.comm, reg.recv), "ncclCommDeregister (receive buffer)", c.rank);
      if (reg.sendWindow) checkNccl(ncclCommWindowDeregister(c.comm, reg.sendWindow), "ncclCommWindowDeregister (send buffer)", c.rank);
      if (reg.recvWindow) checkNccl(ncclCommWindowDeregister(c.comm, reg.recvWindow), "ncclCommWindowDeregister (receive buffer)", c.rank);
      if (o_.heap) {
        std::free(c.sendBase);
        std::free(c.recvBase);
      } else {
        ncclMemFree(c.sendBase);
        ncclMemFree(c.recvBase);
      }
      checkNccl(ncclCommDestroy(c.comm), "ncclCommDestroy", c.rank);
#ifdef TOPOCCL_PERF_CUDA
      if (c.stream) cudaStreamDestroy(c.stream);
#endif
    }
  }

  void syncAll(const std::vector<RankContext>& rc) const {
    for (const RankContext& c : rc) mem_.sync(c.stream);
  }

  void placeBuffers(std::vector<RankContext>& rc, size_t paramCount, size_t eltSize, bool inPlace) {
    for (RankContext& c : rc) {
      const size_t offset = static_cast<size_t>(o_.unalign) * eltSize;  // -u: nccl-tests' misaligned buffers
      c.send = c.sendBase + offset;
      c.recv = c.recvBase + offset;
      if (inPlace) spec_.inPlace(c, paramCount, eltSize);
    }
  }

  // One timed iteration: `calls` ops per rank (-m), fused in a group when there is more than one call.
  void iterate(std::vector<RankContext>& rc, size_t bytes, const TypeInfo& t, ncclRedOp_t op, int root, bool inPlace, int thread,
               int calls) {
    size_t pc = 0, se = 0, re = 0;
    spec_.counts(bytes, t.size, nranks_, pc, se, re);
    placeBuffers(rc, pc, t.size, inPlace);
    const bool group = rc.size() > 1 || calls > 1;
    if (group) checkNccl(ncclGroupStart(), "ncclGroupStart", rc[0].rank);
    for (int m = 0; m < calls; ++m) {
      for (const RankContext& c : rc) {
        const ncclResult_t r = spec_.run(c, pc, t.type, op, root);
        if (r != ncclSuccess) checkNccl(r, spec_.name, c.rank);
      }
      if (o_.blocking == 1 || o_.blocking == 2) {
        if (group) checkNccl(ncclGroupEnd(), "ncclGroupEnd", rc[0].rank);
        syncAll(rc);
        if (o_.blocking == 1) barrierAll(thread);
        if (group) checkNccl(ncclGroupStart(), "ncclGroupStart", rc[0].rank);
      }
    }
    if (group) checkNccl(ncclGroupEnd(), "ncclGroupEnd", rc[0].rank);
  }

  void measure(std::vector<RankContext>& rc, size_t bytes, const TypeInfo& t, const OpInfo& op, int root, int thread) {
    size_t pc = 0, se = 0, re = 0;
    spec_.counts(bytes, t.size, nranks_, pc, se, re);
    Row row;
    row.bytes = std::max(se, re) * t.size;  // nccl-tests' size: what the rank really moves after rounding to N

    row.count = pc;
    row.type = t.name;
    row.op = op.name;
    row.root = root;
    stallIfAsked(rc);
    for (int k = 0; k < 2; ++k) {
      const bool inPlace = k == 1;
      const std::string what = std::string(spec_.name) + " of " + std::to_string(row.bytes) + " B " + t.name +
                               (spec_.reduces ? std::string(" ") + op.name : "") +
                               (root >= 0 ? " root " + std::to_string(root) : "") + (inPlace ? " in place" : " out of place");
      // Warm up right before timing, as perf/compare's mpi_perf and gloo_perf do. nccl-tests warms up once before
      // the first size; on a 2-core host the launcher forwarding the last printed row then lands in the first timed
      // call (a 100-500 us stall that doubled 2-rank small-message times, for OpenMPI too when run that way).
      for (int w = 0; w < o_.warmup; ++w) {
        watch(thread, what + ", warm-up call " + std::to_string(w + 1));
        iterate(rc, bytes, t, op.op, root, inPlace, thread, o_.aggIters);
      }
      watch(thread, what + ", waiting for the warm-up to complete");
      syncAll(rc);
      unwatch(thread);
      barrierAll(thread);
      double excluded = 0;
      std::vector<double>& iterTimes = threadIterTimes_[static_cast<size_t>(thread)];
      iterTimes.assign(o_.perIter ? static_cast<size_t>(o_.iters) : 0, 0.0);
      const long switches0 = thread == 0 ? processContextSwitches() : 0;  // the process's threads run the loop together
      if (watching()) watch(thread, what + ", timed iterations");
      const auto t0 = Clock::now();
      for (int i = 0; i < o_.iters; ++i) {
        const auto i0 = o_.perIter ? Clock::now() : t0;
        if (watching()) rewatch(thread, i);
        iterate(rc, bytes, t, op.op, root, inPlace, thread, o_.aggIters);
        if (o_.perIter) {  // -I: each iteration to completion (on a GPU this waits for the streams each time)
          syncAll(rc);
          iterTimes[static_cast<size_t>(i)] = std::chrono::duration<double>(Clock::now() - i0).count();
        }
        if (o_.blocking == 3) {  // barrier after each iteration, not counted
          const auto b0 = Clock::now();
          syncAll(rc);
          unwatch(thread);
          barrierAll(thread);
          excluded += std::chrono::duration<double>(Clock::now() - b0).count();
        }
      }
      const auto issued = Clock::now();  // -C: the calls are issued (host memory: also done)
      syncAll(rc);  // GPU calls return at once; the time is until the streams are done
      unwatch(thread);
      const auto end = o_.cputime ? issued : Clock::now();
      const double seconds = std::chrono::duration<double>(end - t0).count() - excluded;
      double switches = thread == 0 ? static_cast<double>(processContextSwitches() - switches0) : 0;
      threadTimes_[static_cast<size_t>(thread)] = seconds / (o_.iters * o_.aggIters);
      // Every rank's clock stops before any rank starts checking, as in nccl-tests (its Allreduce of the time and
      // Barrier come before the data check): where ranks share CPUs, the host work of a check on a rank that finished
      // first would take the CPU from a rank beside it still in its last timed call (4 ranks on 2 CPUs: 2-3 ms).
      barrierAll(thread);
      if (o_.check > 0) {
        watch(thread, what + ", checking the result");
        verify(rc, bytes, t, op.op, root, inPlace, thread);
        unwatch(thread);
      }
      barrierAll(thread);
      if (thread == 0) {
        double local = 0, worst = 0, best = 1e300;
        for (double v : threadTimes_) local += v, worst = std::max(worst, v), best = std::min(best, v);
        double time = threadTimes_[0];
        long long wrong = wrong_.exchange(0);
        // -I: each iteration's time is its slowest rank's: the max over this process's threads, then over processes.
        std::vector<double> slowest(o_.perIter ? static_cast<size_t>(o_.iters) : 0, 0.0);
        for (const std::vector<double>& times : threadIterTimes_)
          for (size_t i = 0; i < slowest.size(); ++i) slowest[i] = std::max(slowest[i], times[i]);
#ifdef TOPOCCL_PERF_MPI
        double sum = 0, mx = 0, mn = 0;
        MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(&worst, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&best, &mn, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        MPI_Bcast(&time, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        long long allWrong = 0;
        MPI_Allreduce(&wrong, &allWrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        wrong = allWrong;
        double allSwitches = 0;
        MPI_Allreduce(&switches, &allSwitches, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        switches = allSwitches;
        local = sum, worst = mx, best = mn;
        if (!slowest.empty())
          MPI_Allreduce(MPI_IN_PLACE, slowest.data(), static_cast<int>(slowest.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
#endif
        const int threadsAll = nprocs_ * o_.threads;
        time = o_.average == 0 ? time : o_.average == 2 ? best : o_.average == 3 ? worst : local / threadsAll;
        const double us = time * 1e6;
        const double algbw = time > 0 ? spec_.algBytes(pc, t.size, nranks_) / 1e9 / time : 0;
        row.time[k] = us;
        row.algbw[k] = algbw;
        row.busbw[k] = algbw * spec_.busFactor(nranks_);
        row.wrong[k] = o_.check > 0 ? wrong : -1;
        if (o_.switches) row.switchesPerCall[k] = switches / (o_.iters * o_.aggIters);
        // With -m, one iteration is a group of -m calls: per call, as the time column.
        if (o_.perIter) {
          for (double& v : slowest) v /= o_.aggIters;
          row.iter[k] = iterStats(std::move(slowest), o_.perIterSkip);
        }
        totalWrong_ += std::max(0LL, row.wrong[k]);
      }
    }
    if (thread == 0) {
      if (o_.predict && printing()) predictRow(rc[0].comm, row);
      if (o_.timestamps) row.timestamp = nowText();
      rows_.push_back(row);
      printRow(row);
    }
  }

  // What a check zeroes of the receive allocation before the call: the buffer, -u's offset and 64 guard bytes.
  size_t zeroedBytes(size_t se, size_t re, size_t eltSize) const {
    return std::max(se, re) * eltSize + static_cast<size_t>(o_.unalign) * eltSize + 64;
  }

  // Out of place the receive buffer sits alone in its allocation, after -u's offset: a byte the call wrote
  // before it or past its end (up to the zeroed guard) is a wrong value too, counted with the elements.
  long long bytesWrittenAround(const RankContext& c, size_t recvBytes, size_t zeroed, bool injectHere) {
    const size_t before = static_cast<size_t>(c.recv - c.recvBase);
    if (c.recv < c.recvBase || before + recvBytes > zeroed) return 0;  // not inside the receive allocation
    std::vector<char> guard(zeroed - recvBytes);
    mem_.download(guard.data(), c.recvBase, before);
    mem_.download(guard.data() + before, c.recv + recvBytes, zeroed - before - recvBytes);
    if (o_.injectError && injectHere) guard.back() = 1;  // proves this check can fail
    const auto written = std::count_if(guard.begin(), guard.end(), [](char b) { return b != 0; });
    if (written > 0)
      std::fprintf(stderr, "%s: rank %d: %lld byte(s) written outside the %zu-byte receive buffer (%zu guard bytes before, %zu after)\n",
                   program_.c_str(), c.rank, static_cast<long long>(written), recvBytes, before, zeroed - before - recvBytes);
    return written;
  }

  void verify(std::vector<RankContext>& rc, size_t bytes, const TypeInfo& t, ncclRedOp_t op, int root, bool inPlace, int thread) {
    size_t pc = 0, se = 0, re = 0;
    spec_.counts(bytes, t.size, nranks_, pc, se, re);
    for (int iter = 0; iter < o_.check; ++iter) {
      InputState st;
      st.seed = static_cast<uint64_t>(bytes) * 31u + static_cast<uint64_t>(iter) * 977u + (inPlace ? 5u : 0u);
      st.nranks = nranks_;
      st.op = op;
      st.maxValue = static_cast<int>(std::clamp(t.exactLimit / nranks_, 1.0, 9.0));
      placeBuffers(rc, pc, t.size, inPlace);
      std::vector<char> staged;  // one rank's input, built on the host
      for (RankContext& c : rc) {
        mem_.zero(c.recvBase, zeroedBytes(se, re, t.size));
        // In place, the send data lives inside the receive allocation: fill through the placed pointer.
        staged.assign(se * t.size, 0);
        for (size_t j = 0; j < se; ++j) store(staged.data(), j, t.type, inputValue(c.rank, j, &st));
        mem_.upload(c.send, staged.data(), se * t.size);
      }
      barrierAll(thread);
      // One call, as nccl-tests checks: -m calls in place would feed each call the one before's result (an in-place
      // reduce-scatter, reduce or all-to-all is not idempotent).
      iterate(rc, bytes, t, op, root, inPlace, thread, 1);
      syncAll(rc);
      barrierAll(thread);
      long long bad = 0;
      std::vector<char> received;
      for (const RankContext& c : rc) {
        received.assign(re * t.size, 0);
        mem_.download(received.data(), c.recv, re * t.size);
        if (o_.injectError && re > 0 && &c == &rc[0]) store(received.data(), re - 1, t.type, load(received.data(), re - 1, t.type) + 1);
        for (size_t i = 0; i < re; ++i) {
          double want = 0;
          if (!spec_.expected(c.rank, nranks_, i, pc, root, op, inputValue, &st, want)) continue;
          if (t.isFloat && !std::isfinite(want)) continue;
          if (op == ncclAvg && !t.isFloat) want = std::trunc(want);  // integer division, as NCCL's SumPostDiv
          const double got = load(received.data(), i, t.type);
          const double tol = (op == ncclAvg && t.isFloat) ? std::abs(want) * (t.size == 2 ? 1e-2 : 1e-6) : 0.0;
          if (!(std::abs(got - want) <= tol)) ++bad;
        }
        if (!inPlace) bad += bytesWrittenAround(c, re * t.size, zeroedBytes(se, re, t.size), &c == &rc[0]);
      }
      wrong_ += bad;
    }
  }
};

}  // namespace

double reduceValues(ncclRedOp_t op, int nranks, double (*input)(int r, size_t j, void* state), void* state, size_t j) {
  double v = input(0, j, state);
  for (int r = 1; r < nranks; ++r) {
    const double x = input(r, j, state);
    switch (op) {
      case ncclSum:
      case ncclAvg: v += x; break;
      case ncclProd: v *= x; break;
      case ncclMax: v = std::max(v, x); break;
      case ncclMin: v = std::min(v, x); break;
      default: break;
    }
  }
  // The exact average; verify() truncates it for integer types (NCCL divides the integer sum), and
  // compares floating ones with a tolerance.
  return op == ncclAvg ? v / nranks : v;
}

int runPerf(const CollectiveSpec& spec, int argc, char** argv) {
  // These benchmarks fill and check their buffers on the host: ncclMemAlloc must return host memory even
  // on a machine with a GPU (where its default is device memory), unless the caller says otherwise.
  Options o;
  const std::string program = std::string(spec.name) + "_perf";
  CLI::App app{program + ": nccl-tests-compatible benchmark of " + spec.name + " on topoccl (flags and output as nccl-tests)"};
  app.add_option("-t,--nthreads", o.threads, "threads per process (each drives -g ranks)");
  app.add_option("-g,--ngpus", o.gpus, "ranks per thread");
  app.add_option("-b,--minbytes", o.minBytes, "smallest size (K/M/G suffixes, powers of 1024)");
  app.add_option("-e,--maxbytes", o.maxBytes, "largest size");
  app.add_option("-i,--stepbytes", o.stepBytes, "additive step between sizes");
  app.add_option("-f,--stepfactor", o.stepFactor, "multiplicative step between sizes (overrides -i)");
  app.add_option("-n,--iters", o.iters, "timed iterations per size");
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations before each timed loop (each size, out of place and in place)");
  app.add_option("-m,--agg_iters", o.aggIters, "operations fused in one group per iteration");
  app.add_option("-N,--run_cycles", o.cycles, "repeat the sweep (0: forever)");
  app.add_option("-c,--check", o.check, "validation iterations per size (0: no check)");
  app.add_option("-o,--op", o.op, "sum, prod, max, min, avg or all");
  app.add_option("-d,--datatype", o.type, "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 or all");
  app.add_option("-r,--root", o.root, "root rank, or all");
  app.add_option("-z,--blocking", o.blocking, "1: barrier after each -m group; 3: after each iteration, not timed");
  app.add_option("-a,--average", o.average, "time across ranks: 0 rank 0, 1 average, 2 min, 3 max");
  app.add_option("-J,--output_file", o.output, "also write the rows to this file (.json or .csv)");
  app.add_flag("--csv", o.csv, "print CSV rows instead of the table");
  app.add_flag("--json", o.json, "print a JSON document instead of the table");
  app.add_flag("--inject-error", o.injectError, "test the checker: perturb one received element of each check");
  app.add_flag("--gpu", o.gpu, "buffers in GPU memory, a stream per rank (CUDA builds; several ranks may share a GPU)");
  app.add_flag("--heap", o.heap, "host buffers from the C heap (private to each process, as a framework's own tensors) instead of ncclMemAlloc")->excludes("--gpu");
  app.add_flag("--switches", o.switches,
               "after each row, the context switches per call of all ranks' processes in the timed loop (getrusage)");
  app.add_flag("--predict", o.predict,
               "after each row, the plan that ran, the cost model's time for it and measured/predicted");
  app.add_option("-u,--unalign", o.unalign, "buffers start this many elements past their allocation (misaligned)");
  app.add_option("-I,--per_iter_timing", o.perIter,
                 "1: each iteration timed on its own (the slowest rank's), adding i_min, i_max, i_p99 and i_cv% per block");
  app.add_option("-K,--per_iter_skip", o.perIterSkip, "-I's statistics leave out the first K iterations");
  app.add_option("-S,--report_timestamps", o.timestamps, "1: a timestamp column after each row");
  app.add_option("-C,--report_cputime", o.cputime, "1: the time to issue the calls instead of until they complete (--gpu: enqueue time)");
  app.add_option("-R,--local_register", o.localRegister, "1: ncclCommRegister every buffer; 2: ncclCommWindowRegister (symmetric)");
  app.add_option("-T,--timeout", o.timeout,
                 "seconds a call may wait before the run aborts its communicators and fails with 'Test timeout' (0: none)");
  app.add_option("--stall-rank", o.stallRank, "test -T: this rank stops calling before its first size")->group("");
  // GPU-only nccl-tests flags, accepted so existing command lines run; host memory has nothing to configure.
  app.add_option("-p,--parallel_init", o.parallelInit, "accepted; creation is always parallel");
  app.add_option("-y,--stream_null", o.streamNull, "accepted (no streams on host memory)");
  app.add_option("-G,--cudagraph", o.graph, "accepted (no CUDA graphs on host memory)");
  app.add_option("-M,--memory", o.memory, "accepted");
  app.add_option("-x,--cta_policy", o.ctaPolicy, "accepted");
  app.add_option("-D,--device_implementation", o.deviceImpl, "accepted");
  app.add_option("-V,--device_cta_count", o.deviceCtas, "accepted");
  try {
    app.parse(argc, argv);
    // ncclMemAlloc's memory, unless the caller chose: the GPU's with --gpu, else host memory, which these
    // benchmarks fill and check in place (on a machine with a GPU, ncclMemAlloc's default is device memory).
    setenv("TOPOCCL_MEM_ALLOC", o.gpu ? "gpu" : "host", 0);
    Runner runner(spec, o, program);
    return runner.run();
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
}

}  // namespace topoccl::perf
