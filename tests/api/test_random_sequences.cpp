// Random sequences of collectives: one communicator takes calls of every kind back to back, at sizes around the
// points where its plans and transports change, under a randomly chosen algorithm, slice and FIFO setting. The
// matrix (test_collectives.cpp) runs fixed cases; this finds what only a mix exposes (cached executions reused
// across kinds, FIFO slots and staging left by one call for the next, collectives and send/recv fused in one group).
// Rank count, settings and sequence come from the test seed, printed for replay with TOPOCCL_TEST_SEED.
#include <catch2/catch.hpp>

#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "api/collective_matrix.hpp"
#include "support/rank_harness.hpp"

using namespace topoccl::test;

namespace {

void runRandom(RankMode mode, int minRanks, int maxRanks, int calls) {
  std::mt19937_64 gen(testSeed() ^ (0x5851f42d4c957f2dull * (static_cast<uint64_t>(mode) + 1)));
  const int nranks = minRanks + static_cast<int>(gen() % static_cast<uint64_t>(maxRanks - minRanks + 1));
  static const char* algos[] = {"", "ring", "rd", "hd", "direct", "tree", "allreduce:rsag"};
  static const char* slices[] = {"", "4096", "65536", "1048576"};
  static const char* fifos[] = {"", "65536", "262144"};
  std::map<std::string, std::string> env;
  if (const char* a = algos[gen() % std::size(algos)]; *a) env["NCCL_ALGO"] = a;
  if (const char* s = slices[gen() % std::size(slices)]; *s) env["TOPOCCL_SLICE_BYTES"] = s;
  if (const char* f = fifos[gen() % std::size(fifos)]; *f) env["NCCL_BUFFSIZE"] = f;
  const uint64_t sequenceSeed = gen();
  std::string settings;
  for (const auto& [k, v] : env) settings += " " + k + "=" + v;
  INFO(rankModeName(mode) << ", " << nranks << " ranks, " << calls << " calls, settings:" << (settings.empty() ? " defaults" : settings)
                          << ", replay with TOPOCCL_TEST_SEED=" << testSeed());
  const RunResult result = runRanks(
      mode, nranks,
      [&](int rank, int n, ncclComm_t comm) { return runRandomSequence(rank, n, comm, sequenceSeed, calls); }, env);
  INFO(result.problems);
  CHECK(result.failures == 0);
}

}  // namespace

TEST_CASE("a random sequence of collectives on 2-7 thread ranks") { runRandom(RankMode::Threads, 2, 7, 60); }
TEST_CASE("a random sequence of collectives on 2-6 shm processes") { runRandom(RankMode::ProcessesShm, 2, 6, 50); }
TEST_CASE("a random sequence of collectives on 2-5 TCP processes") { runRandom(RankMode::ProcessesTcp, 2, 5, 40); }

// A world and the two halves split from it (even and odd ranks, as data- and tensor-parallel groups), taking
// random sequences in turn, a few calls at a time: two communicators' plans, FIFOs and engines on the same ranks.
TEST_CASE("random sequences on a world and its split halves, interleaved") {
  for (RankMode mode : {RankMode::Threads, RankMode::ProcessesShm}) {
    std::mt19937_64 gen(testSeed() ^ 0x2545f4914f6cdd1dull ^ static_cast<uint64_t>(mode));
    const int nranks = 4 + static_cast<int>(gen() % 3);
    const uint64_t worldSeed = gen(), halfSeed = gen();
    INFO(rankModeName(mode) << ", " << nranks << " ranks, replay with TOPOCCL_TEST_SEED=" << testSeed());
    const RunResult result = runRanks(mode, nranks, [&](int rank, int n, ncclComm_t world) {
      ncclComm_t half = nullptr;
      if (ncclCommSplit(world, rank % 2, rank, &half, nullptr) != ncclSuccess || half == nullptr) {
        std::fprintf(stderr, "rank %d: ncclCommSplit failed: %s\n", rank, ncclGetLastError(nullptr));
        return 1;
      }
      int halfRank = 0, halfSize = 0;
      ncclCommUserRank(half, &halfRank);
      ncclCommCount(half, &halfSize);
      int failures = 0;
      for (int turn = 0; turn < 8; ++turn) {
        failures += runRandomSequence(rank, n, world, worldSeed + static_cast<uint64_t>(turn), 3);
        failures += runRandomSequence(halfRank, halfSize, half, halfSeed + static_cast<uint64_t>(turn) * 2 + static_cast<uint64_t>(rank % 2), 3);
      }
      if (ncclCommDestroy(half) != ncclSuccess) ++failures;
      return failures;
    });
    INFO(result.problems);
    CHECK(result.failures == 0);
  }
}

namespace {

// Each rank mode in turn: 2-5 ranks and a sequence seed drawn from the test seed and `salt`.
void inEveryMode(uint64_t salt, const std::function<int(int rank, int n, ncclComm_t comm, uint64_t sequenceSeed)>& body,
                 const std::map<std::string, std::string>& env = {}) {
  for (RankMode mode : {RankMode::Threads, RankMode::ProcessesShm, RankMode::ProcessesTcp}) {
    std::mt19937_64 gen(testSeed() ^ salt ^ static_cast<uint64_t>(mode));
    const int nranks = 2 + static_cast<int>(gen() % 4);
    const uint64_t sequenceSeed = gen();
    INFO(rankModeName(mode) << ", " << nranks << " ranks, replay with TOPOCCL_TEST_SEED=" << testSeed());
    const RunResult result = runRanks(
        mode, nranks, [&](int rank, int n, ncclComm_t comm) { return body(rank, n, comm, sequenceSeed); }, env);
    INFO(result.problems);
    CHECK(result.failures == 0);
  }
}

}  // namespace

// A non-blocking communicator (config.blocking = 0, split from the world): calls return ncclInProgress and queue
// on its engine; 1-4 calls or groups go out back to back, then one wait on ncclCommGetAsyncError, then the checks.
TEST_CASE("a random sequence on a non-blocking communicator, several calls in flight") {
  inEveryMode(0x9e3779b97f4a7c15ull, [](int rank, int n, ncclComm_t world, uint64_t sequenceSeed) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t state = ncclCommSplit(world, 0, rank, &comm, &config);
    while (state == ncclInProgress && comm != nullptr && ncclCommGetAsyncError(comm, &state) == ncclSuccess) std::this_thread::yield();
    if (comm == nullptr || state != ncclSuccess) {
      std::fprintf(stderr, "rank %d: non-blocking ncclCommSplit: %s (%s)\n", rank, ncclGetErrorString(state), ncclGetLastError(nullptr));
      return 1;
    }
    const int failures = runRandomSequence(rank, n, comm, sequenceSeed, 40, true);
    return failures + (ncclCommDestroy(comm) != ncclSuccess);
  });
}

// Buffers from ncclMemAlloc, fresh for every call and freed after it: shared memory that peers may map and write
// directly (the zero-copy and mirrored paths), and addresses that come back for other segments, so a mapping a
// peer kept from an earlier call must not be used for a new one.
TEST_CASE("a random sequence on ncclMemAlloc buffers, allocated and freed per call") {
  inEveryMode(
      0xbf58476d1ce4e5b9ull,
      [](int rank, int n, ncclComm_t comm, uint64_t sequenceSeed) { return runRandomSequence(rank, n, comm, sequenceSeed, 50, false, true); },
      {{"TOPOCCL_MEM_ALLOC", "host"}});  // host memory even where a GPU would make it device memory
}
