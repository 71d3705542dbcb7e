#include <catch2/catch.hpp>

#include "api/collective_matrix.hpp"
#include "support/rank_harness.hpp"
#include "topoccl/nccl_ext.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

using namespace topoccl::test;

namespace {

void runMatrix(RankMode mode, int nranks, bool full, const std::map<std::string, std::string>& env = {}) {
  MatrixOptions options;
  options.seed = testSeed() + static_cast<uint64_t>(nranks) * 1000 + static_cast<uint64_t>(mode);
  options.allTypesAndOps = full;
  options.largeSizes = true;
  INFO(rankModeName(mode) << ", " << nranks << " ranks, seed " << options.seed);
  for (const auto& [k, v] : env) INFO(k << "=" << v);
  const RunResult result = runRanks(
      mode, nranks, [&](int rank, int n, ncclComm_t comm) { return runCollectiveMatrix(rank, n, comm, options); },
      env);
  INFO(result.problems);
  CHECK(result.failures == 0);
}

}  // namespace

#define TOPOCCL_MATRIX_TEST(mode, modeName, n, full) \
  TEST_CASE("every collective on " modeName " with " #n " ranks") { runMatrix(mode, n, full); }

TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 1, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 2, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 3, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 4, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 5, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 6, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 7, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 8, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 1, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 2, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 3, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 4, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 5, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 6, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 7, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 8, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 1, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 2, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 3, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 4, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 5, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 6, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 7, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 8, false)

// The same matrix with the selection overridden, several lanes per ring and tiny slices, so every
// generator and the executor's multi-lane and many-slice paths run end to end.
TEST_CASE("every collective with NCCL_ALGO=ring on 3 channels and 4 KiB slices on threads with 5 ranks") {
  runMatrix(RankMode::Threads, 5, false, {{"NCCL_ALGO", "ring"}, {"TOPOCCL_NCHANNELS", "3"}, {"TOPOCCL_SLICE_BYTES", "4096"}});
}
TEST_CASE("every collective with NCCL_ALGO=tree on shm processes with 6 ranks") {
  runMatrix(RankMode::ProcessesShm, 6, false, {{"NCCL_ALGO", "tree"}});
}
TEST_CASE("every collective with NCCL_ALGO=direct on TCP processes with 3 ranks") {
  runMatrix(RankMode::ProcessesTcp, 3, false, {{"NCCL_ALGO", "direct"}, {"TOPOCCL_SLICE_BYTES", "1000"}});
}
TEST_CASE("every collective with NCCL_ALGO=rd on 2 channels on TCP processes with 7 ranks") {
  runMatrix(RankMode::ProcessesTcp, 7, false, {{"NCCL_ALGO", "allreduce:rd"}, {"TOPOCCL_NCHANNELS", "2"}});
}
// Streaming stores on every plain copy and receive (the threshold at 1 byte), over the local transport
// (threads) and shm processes, on sizes that are primes and unaligned, so their heads and tails run.
TEST_CASE("every collective with streaming stores forced (TOPOCCL_STREAMING_STORES_BYTES=1) on threads with 4 ranks") {
  runMatrix(RankMode::Threads, 4, false, {{"TOPOCCL_STREAMING_STORES_BYTES", "1"}});
}
TEST_CASE("every collective with streaming stores forced (TOPOCCL_STREAMING_STORES_BYTES=1) on shm processes with 3 ranks") {
  runMatrix(RankMode::ProcessesShm, 3, false, {{"TOPOCCL_STREAMING_STORES_BYTES", "1"}});
}
// Plain memcpy where the CPU would use its string copy (the default on x86-64 with ERMS), so both paths run.
TEST_CASE("every collective with the string copy off (TOPOCCL_BULK_COPY=0) on shm processes with 2 ranks") {
  runMatrix(RankMode::ProcessesShm, 2, false, {{"TOPOCCL_BULK_COPY", "0"}});
}
// Ranks that sleep on their doorbells (futex) at every wait after one idle poll: results must not change, and a
// publish that forgot to ring would stall each wait for the 1 ms sleep timeout.
TEST_CASE("every collective with ranks asleep at every wait (TOPOCCL_YIELDS_BEFORE_SLEEP=0) on shm processes with 3 ranks") {
  runMatrix(RankMode::ProcessesShm, 3, false, {{"TOPOCCL_SPIN_POLLS", "1"}, {"TOPOCCL_YIELDS_BEFORE_SLEEP", "0"}});
}
TEST_CASE("every collective with ranks asleep at every wait (TOPOCCL_YIELDS_BEFORE_SLEEP=0) on threads with 4 ranks") {
  runMatrix(RankMode::Threads, 4, false, {{"TOPOCCL_SPIN_POLLS", "1"}, {"TOPOCCL_YIELDS_BEFORE_SLEEP", "0"}});
}
TEST_CASE("every collective with ranks asleep at every wait, without futex_waitv, on threads with 4 ranks") {
  runMatrix(RankMode::Threads, 4, false,
            {{"TOPOCCL_SPIN_POLLS", "1"}, {"TOPOCCL_YIELDS_BEFORE_SLEEP", "0"}, {"TOPOCCL_FUTEX_WAITV", "0"}});
}
// Halving-doubling all-reduce on a power of two and on rank counts that fold ranks in and out, in and out of place.
TEST_CASE("every collective with NCCL_ALGO=allreduce:hd on shm processes with 4 ranks") {
  runMatrix(RankMode::ProcessesShm, 4, false, {{"NCCL_ALGO", "allreduce:hd"}});
}
TEST_CASE("every collective with NCCL_ALGO=allreduce:hd and 3 KiB slices on threads with 7 ranks") {
  runMatrix(RankMode::Threads, 7, false, {{"NCCL_ALGO", "allreduce:hd"}, {"TOPOCCL_SLICE_BYTES", "3072"}});
}

// The default table's all-reduce on 4 ranks of one host: direct at 32 KiB over shared memory, halving-doubling at
// 64 KiB and two rounds (reduce_scatter_allgather) from 128 KiB; over TCP two rounds at 1 MiB and halving-doubling at 8 MiB; the ring when
// NCCL_ALGO asks for it. Each rank checks the plan it would run.
namespace {
int expectPlan(ncclComm_t comm, size_t bytes, const char* want) {
  topocclPrediction_t p{};
  if (topocclCommPredict(comm, "allreduce", bytes, 0, &p) != ncclSuccess) return 1;
  if (std::string(p.plan) == want) return 0;
  std::fprintf(stderr, "allreduce at %zu B: plan %s, expected %s\n", bytes, p.plan, want);
  return 1;
}
}  // namespace

TEST_CASE("4 ranks on one host: all-reduce direct, by halving-doubling or in two rounds by size and transport, the ring where NCCL_ALGO says") {
  CHECK(runRanks(RankMode::ProcessesShm, 4, [](int, int, ncclComm_t c) {
          return expectPlan(c, 32 << 10, "direct") + expectPlan(c, 64 << 10, "halving_doubling") +
                 expectPlan(c, 128 << 10, "reduce_scatter_allgather") +
                 expectPlan(c, size_t{64} << 20, "reduce_scatter_allgather");
        }).failures == 0);
  CHECK(runRanks(RankMode::ProcessesTcp, 4, [](int, int, ncclComm_t c) {
          return expectPlan(c, 1 << 20, "reduce_scatter_allgather") + expectPlan(c, 8 << 20, "halving_doubling");
        }).failures == 0);
  CHECK(runRanks(RankMode::ProcessesTcp, 4, [](int, int, ncclComm_t c) { return expectPlan(c, 1 << 20, "ring"); },
                 {{"NCCL_ALGO", "allreduce:ring"}}).failures == 0);
}

// Small all-to-all, all-reduce, all-gather and reduce-scatter on 4+ ranks take log2 n rounds over TCP (fewer messages) and
// direct over shm, where the doubling's chained rounds measured slower; the matrices on 4-8 TCP ranks above run them
// at their small sizes.
namespace {
int expectPlanAt(ncclComm_t comm, const char* collective, size_t bytes, const char* want) {
  topocclPrediction_t p{};
  if (topocclCommPredict(comm, collective, bytes, 0, &p) != ncclSuccess) return 1;
  if (std::string(p.plan) == want) return 0;
  std::fprintf(stderr, "%s at %zu B: plan %s, expected %s\n", collective, bytes, p.plan, want);
  return 1;
}
}  // namespace

TEST_CASE("small collectives on 5 ranks: recursive doubling over TCP, direct over shm and when NCCL_ALGO says so") {
  const auto expect = [](std::vector<std::tuple<const char*, size_t, const char*>> wants) {
    return [wants](int, int, ncclComm_t c) {
      int failures = 0;
      for (const auto& [collective, bytes, want] : wants) failures += expectPlanAt(c, collective, bytes, want);
      return failures;
    };
  };
  CHECK(runRanks(RankMode::ProcessesTcp, 5,
                 expect({{"alltoall", 4095, "recursive_doubling"}, {"alltoall", 64 << 10, "direct"},
                         {"allreduce", 8, "recursive_doubling"}, {"allgather", 512 << 10, "recursive_doubling"},
                         {"allgather", 1 << 20, "ring"}, {"reducescatter", 8 << 10, "halving_doubling"}}))
            .failures == 0);
  CHECK(runRanks(RankMode::ProcessesShm, 5,
                 expect({{"alltoall", 4095, "direct"}, {"allreduce", 16 << 10, "direct"}, {"allgather", 512, "direct"}}))
            .failures == 0);
  CHECK(runRanks(RankMode::ProcessesTcp, 5, expect({{"alltoall", 4095, "direct"}, {"allreduce", 8, "direct"}}),
                 {{"NCCL_ALGO", "alltoall:direct;allreduce:direct"}})
            .failures == 0);
}

// Recursive-doubling all-to-all and halving reduce-scatter forced at every size: the pairwise hypercube on 8 ranks,
// Bruck's and the halving's fold on 6, in and out of place, through the executor over shm and the local transport.
TEST_CASE("every collective with NCCL_ALGO overriding two collectives (alltoall:rd and reducescatter:hd) on shm processes with 6 ranks and threads with 8") {
  runMatrix(RankMode::ProcessesShm, 6, false, {{"NCCL_ALGO", "alltoall:rd;reducescatter:hd"}});
  runMatrix(RankMode::Threads, 8, false, {{"NCCL_ALGO", "alltoall:rd;reducescatter:hd"}});
}

// All-reduce as a direct reduce-scatter then all-gather, forced at every size (including counts below the rank count,
// where some parts are empty): on shm processes (heap buffers through the FIFO), threads with 3 KiB slices (many
// slices a part, so in place the gathers wait out sends slice by slice) and TCP processes, in and out of place.
TEST_CASE("every collective with NCCL_ALGO=allreduce:rsag on shm processes with 5 ranks, threads with 3 and 6, TCP with 4") {
  runMatrix(RankMode::ProcessesShm, 5, false, {{"NCCL_ALGO", "allreduce:rsag"}});
  runMatrix(RankMode::Threads, 3, false, {{"NCCL_ALGO", "allreduce:rsag"}, {"TOPOCCL_SLICE_BYTES", "3072"}});
  runMatrix(RankMode::Threads, 6, false, {{"NCCL_ALGO", "allreduce:rsag"}});
  runMatrix(RankMode::ProcessesTcp, 4, false, {{"NCCL_ALGO", "allreduce:rsag"}});
}

// In-place all-to-all receives each peer's block into the very block it is sending that peer. The executor
// lands a slice in a bounce slot while its own send of that slice is unread and copies it over afterwards;
// blocks of 16+ slices reuse every slot several times. Values are a hash of (seed, sender, index), so each
// rank checks what it got against what the sender must have held, without the sender's memory.
namespace {
uint32_t blockValue(uint64_t seed, int sender, size_t index) {
  uint64_t x = seed ^ (static_cast<uint64_t>(sender) << 48) ^ (index * 0x9e3779b97f4a7c15ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x);
}

int inPlaceAllToAll(int rank, int nranks, ncclComm_t comm, size_t count, bool sharedBuffer, uint64_t seed) {
  const size_t total = count * static_cast<size_t>(nranks);
  std::vector<uint32_t> owned;
  uint32_t* buffer = nullptr;
  if (sharedBuffer) {
    void* p = nullptr;
    if (ncclMemAlloc(&p, total * sizeof(uint32_t)) != ncclSuccess) return 1;
    buffer = static_cast<uint32_t*>(p);
  } else {
    owned.resize(total);
    buffer = owned.data();
  }
  int failures = 0;
  for (int round = 0; round < 2; ++round) {  // twice: the second call reuses the execution and its slots
    const uint64_t roundSeed = seed + static_cast<uint64_t>(round);
    for (size_t i = 0; i < total; ++i) buffer[i] = blockValue(roundSeed, rank, i);
    if (ncclAlltoAll(buffer, buffer, count, ncclUint32, comm, nullptr) != ncclSuccess) {
      ++failures;
      break;
    }
    // Block q now holds block `rank` of rank q's input.
    size_t wrong = 0;
    for (int q = 0; q < nranks; ++q)
      for (size_t i = 0; i < count; ++i)
        wrong += buffer[static_cast<size_t>(q) * count + i] != blockValue(roundSeed, q, static_cast<size_t>(rank) * count + i);
    failures += wrong != 0;
  }
  if (sharedBuffer) ncclMemFree(buffer);
  return failures;
}
}  // namespace

TEST_CASE("in-place all-to-all of blocks many slices long on threads and shm processes, plain and ncclMemAlloc buffers") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed);
  struct Setup {
    RankMode mode;
    int nranks;
  };
  for (const Setup setup : {Setup{RankMode::Threads, 2}, Setup{RankMode::Threads, 5}, Setup{RankMode::ProcessesShm, 2},
                            Setup{RankMode::ProcessesShm, 3}}) {
    for (size_t count : {size_t{1}, size_t{4099}, size_t{262147}}) {  // 262147 (prime) x 4 B: 16 slices of 64 KiB
      for (bool shared : {false, true}) {
        INFO(rankModeName(setup.mode) << ", " << setup.nranks << " ranks, " << count << " x uint32 a block, "
                                      << (shared ? "ncclMemAlloc" : "malloc") << " buffers");
        const RunResult result = runRanks(setup.mode, setup.nranks, [&](int rank, int n, ncclComm_t comm) {
          return inPlaceAllToAll(rank, n, comm, count, shared, seed);
        });
        INFO(result.problems);
        CHECK(result.failures == 0);
      }
    }
  }
}

// Out-of-place all-gather and broadcast send a rank's own block and copy it to its output; that copy rides the send
// (a mirrored send), and the rank's own Copy skips it: the peer writes it where it reads the rank's memory (shm with
// ncclMemAlloc buffers and a zero-copy slice; threads with any), the sending rank right after it copies the block into the
// shm FIFO otherwise (a private buffer on either side, a short slice).
// Every rank fills its input with a hash of (seed, rank, index), so each checks every block of its output
// against what its owner must have held.
namespace {
int gatherAndBroadcast(int rank, int nranks, ncclComm_t comm, size_t count, bool sharedInput, bool sharedOutput, uint64_t seed) {
  const size_t total = count * static_cast<size_t>(nranks);
  std::vector<uint32_t> ownedIn, ownedOut;
  const auto get = [](bool shared, std::vector<uint32_t>& owned, size_t n) -> uint32_t* {
    if (!shared) {
      owned.resize(std::max<size_t>(n, 1));
      return owned.data();
    }
    void* p = nullptr;
    return ncclMemAlloc(&p, std::max<size_t>(n, 1) * sizeof(uint32_t)) == ncclSuccess ? static_cast<uint32_t*>(p) : nullptr;
  };
  uint32_t* in = get(sharedInput, ownedIn, count);
  uint32_t* out = get(sharedOutput, ownedOut, total);
  if (in == nullptr || out == nullptr) return 1;
  int failures = 0;
  for (int round = 0; round < 2; ++round) {  // twice: the second call reuses the execution
    const uint64_t roundSeed = seed + static_cast<uint64_t>(round) * 7919;
    for (size_t i = 0; i < count; ++i) in[i] = blockValue(roundSeed, rank, i);
    std::fill(out, out + total, 0xDEADBEEFu);
    if (ncclAllGather(in, out, count, ncclUint32, comm, nullptr) != ncclSuccess) return failures + 1;
    size_t wrong = 0;
    for (int q = 0; q < nranks; ++q)
      for (size_t i = 0; i < count; ++i) wrong += out[static_cast<size_t>(q) * count + i] != blockValue(roundSeed, q, i);
    failures += wrong != 0;
    const int root = (round == 0) ? 0 : nranks - 1;
    std::fill(out, out + count, 0xDEADBEEFu);
    if (ncclBroadcast(in, out, count, ncclUint32, root, comm, nullptr) != ncclSuccess) return failures + 1;
    wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += out[i] != blockValue(roundSeed, root, i);
    failures += wrong != 0;
  }
  if (sharedInput) ncclMemFree(in);
  if (sharedOutput) ncclMemFree(out);
  return failures;
}
}  // namespace

// The same all-reduce on ncclMemAlloc buffers, which peers read in place (zero copy): a part's gather then lands
// over the part this rank sent, which the peer reads in its sum, so the gather waits for that read; and the last
// summand's peer writes the sum into this rank's output as it reduces (result mirrors), where both of this rank's
// buffers are shared allocations. `heapRanks` ranks (the first ones) use private heap buffers instead, which their
// peers cannot map: their sends and receives go the plain way while the others' go mirrored. Parts of many slices,
// three calls of fresh values each way; small integers, so every order of summing gives the exact sum.
namespace {
int scatterGatherAllReduce(int rank, int nranks, ncclComm_t comm, size_t count, uint64_t seed, int heapRanks = 0) {
  void* in = nullptr;
  void* out = nullptr;
  std::vector<float> heapIn, heapOut;
  if (rank < heapRanks) {
    heapIn.resize(count);
    heapOut.resize(count);
    in = heapIn.data();
    out = heapOut.data();
  } else if (ncclMemAlloc(&in, count * sizeof(float)) != ncclSuccess || ncclMemAlloc(&out, count * sizeof(float)) != ncclSuccess) {
    return 1;
  }
  auto* send = static_cast<float*>(in);
  auto* recv = static_cast<float*>(out);
  const auto value = [&](uint64_t s, int r, size_t i) { return static_cast<float>(static_cast<int>(blockValue(s, r, i) % 2001) - 1000); };
  int failures = 0;
  for (int call = 0; call < 6; ++call) {
    const bool inPlace = call % 2 == 1;
    const uint64_t callSeed = seed + static_cast<uint64_t>(call);
    for (size_t i = 0; i < count; ++i) send[i] = value(callSeed, rank, i);
    float* result = inPlace ? send : recv;
    if (ncclAllReduce(send, result, count, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess) return failures + 1;
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      int64_t sum = 0;
      for (int q = 0; q < nranks; ++q) sum += static_cast<int64_t>(value(callSeed, q, i));
      wrong += result[i] != static_cast<float>(sum);
    }
    if (wrong) std::fprintf(stderr, "rank %d: call %d (%s): %zu of %zu wrong\n", rank, call, inPlace ? "in place" : "out of place", wrong, count);
    failures += wrong != 0;
  }
  if (rank >= heapRanks) {
    ncclMemFree(in);
    ncclMemFree(out);
  }
  return failures;
}
}  // namespace

TEST_CASE("reduce_scatter_allgather all-reduce on ncclMemAlloc buffers, in and out of place, on shm processes and threads") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed);
  struct Setup {
    RankMode mode;
    int nranks;
    const char* algorithm;  // the 2-rank ring carries the same result mirrors
    int heapRanks;
  };
  for (const Setup setup : {Setup{RankMode::ProcessesShm, 2, "allreduce:rsag", 0}, Setup{RankMode::ProcessesShm, 2, "allreduce:ring", 0},
                            Setup{RankMode::ProcessesShm, 2, "allreduce:rsag", 1}, Setup{RankMode::ProcessesShm, 3, "allreduce:rsag", 0},
                            Setup{RankMode::ProcessesShm, 4, "allreduce:rsag", 1}, Setup{RankMode::Threads, 2, "allreduce:ring", 0},
                            Setup{RankMode::Threads, 5, "allreduce:rsag", 0}}) {
    // 786433 x 4 B: parts of 3-5 slices; on 2 ranks 131 x 4 B: halves below 1 KiB (no result mirror), 1031 x 4 B:
    // halves below the zero-copy threshold (8 KiB) but result-mirrored, 4099 x 4 B just above it
    for (size_t count : {size_t{2}, size_t{131}, size_t{1031}, size_t{4099}, size_t{65537}, size_t{786433}}) {
      INFO(rankModeName(setup.mode) << ", " << setup.nranks << " ranks, " << setup.algorithm << ", " << setup.heapRanks
                                    << " on the heap, " << count << " floats");
      const RunResult result = runRanks(
          setup.mode, setup.nranks,
          [&](int rank, int n, ncclComm_t comm) { return scatterGatherAllReduce(rank, n, comm, count, seed, setup.heapRanks); },
          {{"NCCL_ALGO", setup.algorithm}});
      INFO(result.problems);
      CHECK(result.failures == 0);
    }
  }
}

TEST_CASE("out-of-place all-gather and broadcast where peers, or the sending rank as it sends, write each rank's own block") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed);
  struct Setup {
    RankMode mode;
    int nranks;
  };
  for (const Setup setup : {Setup{RankMode::ProcessesShm, 2}, Setup{RankMode::ProcessesShm, 3}, Setup{RankMode::ProcessesShm, 5},
                            Setup{RankMode::Threads, 2}, Setup{RankMode::Threads, 5}}) {
    // 0; 1; 4099 (one slice, below the zero-copy threshold); 262147 (prime, 16 slices); 2M + 5 (several 512 KiB slices)
    for (size_t count : {size_t{0}, size_t{1}, size_t{4099}, size_t{262147}, (size_t{2} << 20) + 5}) {
      for (const auto& [sharedIn, sharedOut] : {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}, std::pair{false, false}}) {
        INFO(rankModeName(setup.mode) << ", " << setup.nranks << " ranks, " << count << " x uint32 a block, input "
                                      << (sharedIn ? "ncclMemAlloc" : "malloc") << ", output " << (sharedOut ? "ncclMemAlloc" : "malloc"));
        const RunResult result = runRanks(setup.mode, setup.nranks, [&](int rank, int n, ncclComm_t comm) {
          return gatherAndBroadcast(rank, n, comm, count, sharedIn, sharedOut, seed);
        });
        INFO(result.problems);
        CHECK(result.failures == 0);
      }
    }
  }
}

// Slices larger than the bounce slots (TOPOCCL_SLICE_BYTES above Execution::kMaxBounceSliceBytes) cannot bounce,
// and a receive into place would wait on our own send, which waits on the peer's receive: those plans stay staged.
// Over TCP a 16 MiB block is two 8 MiB slices; fused, the in-place call stalled for 190 ms a call (12 ms staged).
TEST_CASE("in-place all-to-all with slices larger than the bounce slots, over shm and TCP") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed);
  const size_t count = (size_t{16} << 20) / sizeof(uint32_t) + 3;  // blocks of 16 MiB + 12 B
  for (const RankMode mode : {RankMode::ProcessesShm, RankMode::ProcessesTcp}) {
    for (bool shared : {false, true}) {
      INFO(rankModeName(mode) << ", " << (shared ? "ncclMemAlloc" : "malloc") << " buffers");
      const RunResult result = runRanks(
          mode, 2, [&](int rank, int n, ncclComm_t comm) { return inPlaceAllToAll(rank, n, comm, count, shared, seed); },
          {{"TOPOCCL_SLICE_BYTES", std::to_string(8 << 20)}, {"TOPOCCL_TIMEOUT_MS", "20000"}}, 120);
      INFO(result.problems);
      CHECK(result.failures == 0);
    }
  }
}
