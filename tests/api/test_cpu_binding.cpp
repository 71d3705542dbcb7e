// Ranks that are a multiple of their CPUs and that nobody placed bind themselves one to a CPU in turn at
// communicator creation (TOPOCCL_BIND_OVERSUBSCRIBED); ranks that fit or split unevenly, thread ranks and the
// setting turned off are left as they were. The parent narrows its own affinity to two CPUs (one where it has
// only one) before forking, so the children see the same small machine on any host. Each rank also checks an
// all-reduce against a double-precision sum of every rank's fresh random inputs.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <sched.h>
#include <sys/types.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/rank_harness.hpp"

using namespace topoccl::test;

namespace {

std::vector<int> cpusOf(pid_t task) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(task, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// Narrows the calling thread to at most two of its CPUs for the scope; children forked meanwhile inherit it.
class TwoCpus {
 public:
  TwoCpus() : saved_(cpusOf(0)) {
    REQUIRE(!saved_.empty());
    narrowed_.assign(saved_.begin(), saved_.begin() + std::min<size_t>(2, saved_.size()));
    apply(narrowed_);
  }
  ~TwoCpus() { apply(saved_); }
  const std::vector<int>& cpus() const { return narrowed_; }

 private:
  static void apply(const std::vector<int>& cpus) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) CPU_SET(c, &set);
    sched_setaffinity(0, sizeof(set), &set);
  }
  std::vector<int> saved_;
  std::vector<int> narrowed_;
};

// Threads of this process whose affinity is exactly {cpu}.
int threadsBoundTo(int cpu) {
  int count = 0;
  DIR* tasks = opendir("/proc/self/task");
  if (!tasks) return -1;
  while (const dirent* entry = readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    if (cpusOf(static_cast<pid_t>(std::atoi(entry->d_name))) == std::vector<int>{cpu}) ++count;
  }
  closedir(tasks);
  return count;
}

int allReduceChecked(int rank, int nranks, ncclComm_t comm, uint64_t seed) {
  const size_t count = 4099;  // prime: no slice divides it
  auto inputOf = [&](int r) {
    std::mt19937_64 gen(seed + static_cast<uint64_t>(r));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> v(count);
    for (float& x : v) x = dist(gen);
    return v;
  };
  std::vector<double> expected(count, 0.0);
  for (int r = 0; r < nranks; ++r) {
    const auto v = inputOf(r);
    for (size_t i = 0; i < count; ++i) expected[i] += v[i];
  }
  const auto send = inputOf(rank);
  std::vector<float> recv(count, 0.0f);
  if (ncclAllReduce(send.data(), recv.data(), count, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess) {
    std::fprintf(stderr, "rank %d: all-reduce failed: %s\n", rank, ncclGetLastError(comm));
    return 1;
  }
  int wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += std::fabs(recv[i] - expected[i]) > 1e-5 * nranks ? 1 : 0;
  if (wrong) std::fprintf(stderr, "rank %d: %d of %zu sums wrong\n", rank, wrong, count);
  return wrong ? 1 : 0;
}

// A broadcast from the last rank: with ranks bound round-robin on a power of two, the bit-reversed tree
// (algo::interleavedTreeBroadcast). Every element must arrive exactly.
int broadcastChecked(int rank, int nranks, ncclComm_t comm, uint64_t seed) {
  const size_t count = 1021;  // prime, below the tree's limit
  const int root = nranks - 1;
  std::mt19937_64 gen(seed ^ 0x5bd1e995u);
  std::vector<float> sent(count);
  for (float& x : sent) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen);
  std::vector<float> buffer = rank == root ? sent : std::vector<float>(count, 0.0f);
  if (ncclBroadcast(buffer.data(), buffer.data(), count, ncclFloat, root, comm, nullptr) != ncclSuccess) {
    std::fprintf(stderr, "rank %d: broadcast failed: %s\n", rank, ncclGetLastError(comm));
    return 1;
  }
  if (buffer != sent) {
    std::fprintf(stderr, "rank %d: broadcast from rank %d arrived wrong\n", rank, root);
    return 1;
  }
  return 0;
}

}  // namespace

TEST_CASE("cpu binding: shm process ranks that are a multiple of their CPUs take one each in turn") {
  const TwoCpus machine;
  const std::vector<int> allowed = machine.cpus();
  const int nranks = GENERATE(4, 6);  // 6: not a power of two
  // Grouped, as nccl-tests creates them, the init runs on a helper thread: the caller must be bound all the same.
  const InitCall init = GENERATE(InitCall::Direct, InitCall::Grouped);
  INFO(nranks << " ranks, " << (init == InitCall::Grouped ? "grouped" : "direct") << " init");
  const uint64_t seed = testSeed();
  const RunResult result = runRanks(RankMode::ProcessesShm, nranks, [&](int rank, int n, ncclComm_t comm) {
    const int cpu = allowed[static_cast<size_t>(rank) % allowed.size()];
    int failures = 0;
    if (cpusOf(0) != std::vector<int>{cpu}) {
      std::fprintf(stderr, "rank %d: expected to be bound to CPU %d, has %zu CPUs\n", rank, cpu, cpusOf(0).size());
      ++failures;
    }
    // The caller and the communicator's progress engine, which starts after the binding.
    if (const int bound = threadsBoundTo(cpu); bound < 2) {
      std::fprintf(stderr, "rank %d: %d thread(s) bound to CPU %d, expected the caller and the engine\n", rank, bound, cpu);
      ++failures;
    }
    return failures + allReduceChecked(rank, n, comm, seed) + broadcastChecked(rank, n, comm, seed);
  }, {}, 600, init);
  INFO(result.problems);
  CHECK(result.failures == 0);
}

TEST_CASE("cpu binding: ranks that fit or split unevenly, thread ranks and TOPOCCL_BIND_OVERSUBSCRIBED=0 keep their affinity") {
  const TwoCpus machine;
  const std::vector<int> allowed = machine.cpus();
  const uint64_t seed = testSeed();
  auto unchanged = [&](int rank, int n, ncclComm_t comm) {
    if (cpusOf(0) != allowed) {
      std::fprintf(stderr, "rank %d: affinity changed (%zu CPUs, expected %zu)\n", rank, cpusOf(0).size(), allowed.size());
      return 1 + allReduceChecked(rank, n, comm, seed);
    }
    return allReduceChecked(rank, n, comm, seed);
  };
  SECTION("as many ranks as CPUs") {
    const RunResult result = runRanks(RankMode::ProcessesShm, static_cast<int>(allowed.size()), unchanged);
    INFO(result.problems);
    CHECK(result.failures == 0);
  }
  SECTION("ranks that do not split evenly") {
    if (allowed.size() == 2) {  // on one CPU every count splits evenly
      const RunResult result = runRanks(RankMode::ProcessesShm, 3, unchanged);
      INFO(result.problems);
      CHECK(result.failures == 0);
    }
  }
  SECTION("the setting off") {
    const RunResult result =
        runRanks(RankMode::ProcessesTcp, 4, unchanged, {{"TOPOCCL_BIND_OVERSUBSCRIBED", "0"}});
    INFO(result.problems);
    CHECK(result.failures == 0);
  }
  SECTION("thread ranks of one process") {
    const RunResult result = runRanks(RankMode::Threads, 4, unchanged);
    INFO(result.problems);
    CHECK(result.failures == 0);
    CHECK(cpusOf(0) == allowed);  // the thread that created them too
  }
}
