// Send/recv, groups mixing collectives with p2p, split, config versioning, non-blocking mode.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "nccl.h"
#include "support/rank_harness.hpp"

using namespace topoccl::test;

namespace {

size_t pairCount(int from, int to, int message) {
  // Sizes per (sender, receiver, message): 0, 1, primes and a couple of MiB among them.
  static const size_t sizes[] = {0, 1, 7, 4099, 65537, 786433};
  return sizes[(from * 5 + to * 3 + message) % 6];
}

std::vector<int32_t> payload(uint64_t seed, int from, int to, int message, size_t count) {
  std::mt19937 gen(static_cast<uint32_t>(seed + from * 1000003 + to * 1009 + message));
  std::vector<int32_t> v(count);
  for (auto& x : v) x = static_cast<int32_t>(gen());
  return v;
}

int exchangeEverybody(int rank, int nranks, ncclComm_t comm, uint64_t seed) {
  // Every rank sends two messages to every rank (itself included) in one group.
  std::vector<std::vector<int32_t>> out, in;
  std::vector<std::tuple<int, int, size_t>> expected;
  if (ncclGroupStart() != ncclSuccess) return 1;
  for (int peer = 0; peer < nranks; ++peer)
    for (int message = 0; message < 2; ++message) {
      out.push_back(payload(seed, rank, peer, message, pairCount(rank, peer, message)));
      if (ncclSend(out.back().data(), out.back().size(), ncclInt32, peer, comm, nullptr) != ncclSuccess) return 1;
      in.emplace_back(pairCount(peer, rank, message) + 1, 0x7eadbeef);  // one guard element
      expected.push_back({peer, message, pairCount(peer, rank, message)});
      if (ncclRecv(in.back().data(), pairCount(peer, rank, message), ncclInt32, peer, comm, nullptr) != ncclSuccess)
        return 1;
    }
  if (ncclGroupEnd() != ncclSuccess) {
    std::fprintf(stderr, "rank %d: group failed: %s\n", rank, ncclGetLastError(nullptr));
    return 1;
  }
  int failures = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const auto [peer, message, count] = expected[i];
    const auto want = payload(seed, peer, rank, message, count);
    if ((count > 0 && std::memcmp(in[i].data(), want.data(), count * sizeof(int32_t)) != 0) || in[i][count] != 0x7eadbeef) {
      std::fprintf(stderr, "rank %d: message %d from rank %d (%zu ints) is wrong\n", rank, message, peer, count);
      ++failures;
    }
  }
  return failures;
}

int collectiveWithP2pInOneGroup(int rank, int nranks, ncclComm_t comm) {
  std::vector<double> sum(1000, rank + 1.0);
  std::vector<int64_t> ringOut(333, rank), ringIn(333, -1);
  const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  ncclGroupStart();
  ncclAllReduce(sum.data(), sum.data(), sum.size(), ncclDouble, ncclSum, comm, nullptr);
  ncclSend(ringOut.data(), ringOut.size(), ncclInt64, next, comm, nullptr);
  ncclRecv(ringIn.data(), ringIn.size(), ncclInt64, prev, comm, nullptr);
  if (ncclGroupEnd() != ncclSuccess) return 1;
  int failures = 0;
  const double want = nranks * (nranks + 1) / 2.0;
  for (double x : sum) failures += x != want;
  for (int64_t x : ringIn) failures += x != prev;
  if (failures) std::fprintf(stderr, "rank %d: grouped allreduce + ring exchange wrong (%d)\n", rank, failures);
  return failures;
}

int splitAndReduce(int rank, int nranks, ncclComm_t comm) {
  // Even and odd ranks form two communicators, ranked in reverse; the last rank opts out.
  const bool optOut = nranks > 2 && rank == nranks - 1;
  ncclComm_t child = nullptr;
  if (ncclCommSplit(comm, optOut ? NCCL_SPLIT_NOCOLOR : rank % 2, -rank, &child, nullptr) != ncclSuccess) return 1;
  if (optOut) return child == nullptr ? 0 : 1;
  int members = 0, childRank = -1, count = 0;
  for (int r = 0; r < nranks; ++r)
    if (r % 2 == rank % 2 && !(nranks > 2 && r == nranks - 1)) {
      if (r > rank) ++childRank;
      ++members;
    }
  ++childRank;
  int failures = 0;
  int got = -1;
  ncclCommCount(child, &count);
  ncclCommUserRank(child, &got);
  failures += count != members;
  failures += got != childRank;
  int64_t value = rank, total = 0;
  if (ncclAllReduce(&value, &total, 1, ncclInt64, ncclSum, child, nullptr) != ncclSuccess) ++failures;
  int64_t want = 0;
  for (int r = 0; r < nranks; ++r)
    if (r % 2 == rank % 2 && !(nranks > 2 && r == nranks - 1)) want += r;
  failures += total != want;
  if (failures) std::fprintf(stderr, "rank %d: split wrong: size %d/%d rank %d/%d sum %lld/%lld\n", rank, count, members,
                             got, childRank, static_cast<long long>(total), static_cast<long long>(want));
  ncclCommDestroy(child);
  return failures;
}

void runAllModes(const char* what, int nranks, const RankBody& body) {
  for (RankMode mode : {RankMode::Threads, RankMode::ProcessesShm, RankMode::ProcessesTcp}) {
    INFO(what << " on " << rankModeName(mode) << " with " << nranks << " ranks");
    const RunResult result = runRanks(mode, nranks, body, {}, 300);
    INFO(result.problems);
    CHECK(result.failures == 0);
  }
}

}  // namespace

TEST_CASE("grouped send/recv between every pair, self included") {
  const uint64_t seed = testSeed();
  for (int n : {1, 2, 3, 5})
    runAllModes("all-pairs exchange", n, [&](int r, int nr, ncclComm_t c) { return exchangeEverybody(r, nr, c, seed); });
}

TEST_CASE("a group mixing a collective with send/recv") {
  for (int n : {2, 3})
    runAllModes("allreduce + ring exchange", n, [](int r, int nr, ncclComm_t c) { return collectiveWithP2pInOneGroup(r, nr, c); });
}

TEST_CASE("ncclCommSplit by color and key, with an opt-out") {
  for (int n : {2, 5})
    runAllModes("split", n, [](int r, int nr, ncclComm_t c) { return splitAndReduce(r, nr, c); });
}

TEST_CASE("ncclConfig_t from older and newer callers, and non-blocking mode") {
  // An older caller's struct ends before commName: fields past its size must be ignored.
  struct {
    ncclConfig_t config;
    char newerFields[32];
  } newer;
  for (int variant = 0; variant < 2; ++variant) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclConfig_t* passed = &config;
    if (variant == 0) {
      config.size = offsetof(ncclConfig_t, commName);
      config.CTAPolicy = 12345;  // garbage beyond the older struct's size
    } else {
      std::memset(&newer, 0x33, sizeof(newer));
      newer.config = config;
      newer.config.size = sizeof(newer);
      passed = &newer.config;
    }
    ncclComm_t comm = nullptr;
    REQUIRE(ncclCommInitRankConfig(&comm, 1, id, 0, passed) == ncclSuccess);
    std::vector<float> data(100000, 1.5f), out(100000, 0);
    const ncclResult_t r = ncclAllReduce(data.data(), out.data(), data.size(), ncclFloat, ncclAvg, comm, nullptr);
    CHECK(r == ncclInProgress);
    ncclResult_t state = ncclInProgress;
    for (int spins = 0; state == ncclInProgress && spins < 1000000; ++spins) ncclCommGetAsyncError(comm, &state);
    CHECK(state == ncclSuccess);
    CHECK(out.front() == 1.5f);
    CHECK(out.back() == 1.5f);
    CHECK(ncclCommDestroy(comm) == ncclSuccess);
  }
}

TEST_CASE("ranks that call a collective with different counts get an error, not a hang") {
  for (RankMode mode : {RankMode::Threads, RankMode::ProcessesShm, RankMode::ProcessesTcp}) {
    INFO(rankModeName(mode));
    const RunResult result = runRanks(
        mode, 2,
        [](int rank, int, ncclComm_t comm) {
          std::vector<float> data(rank == 0 ? 300000 : 600000, 1.0f);
          const ncclResult_t r = ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclSum, comm, nullptr);
          const std::string text = ncclGetLastError(nullptr);
          std::fprintf(stderr, "rank %d: %s: %s\n", rank, ncclGetErrorString(r), text.c_str());
          // Expected: an error whose text names the sizes or the stall, on both ranks.
          return r != ncclSuccess && text.find("rank") != std::string::npos ? 0 : 1;
        },
        {{"TOPOCCL_TIMEOUT_MS", "5000"}}, 120);
    INFO(result.problems);
    CHECK(result.failures == 0);
  }
}
