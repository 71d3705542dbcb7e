// Whether a rank shares its cores, from the CPU affinities of the ranks on its machine. Expected answers are
// counted by hand: ranks whose affinities overlap a rank's own against the CPUs they can use together.
#include <catch2/catch.hpp>

#include <sched.h>

#include <initializer_list>

#include "topology/locality.hpp"

using namespace topoccl::topo;

namespace {

CpuSet cpus(std::initializer_list<int> list) {
  CpuSet set;
  for (int c : list) {
    if (set.size() <= static_cast<size_t>(c) / 64) set.resize(static_cast<size_t>(c) / 64 + 1, 0);
    set[static_cast<size_t>(c) / 64] |= uint64_t{1} << (c % 64);
  }
  return set;
}

}  // namespace

TEST_CASE("locality: cpuCount counts every word") {
  CHECK(cpuCount({}) == 0);
  CHECK(cpuCount(cpus({0})) == 1);
  CHECK(cpuCount(cpus({0, 1, 63, 64, 200, 1023})) == 6);
}

TEST_CASE("locality: unpinned ranks share when they outnumber the CPUs") {
  const CpuSet two = cpus({0, 1});
  CHECK(sharesCores(two, {two, two, two, two}, 64));  // 4 ranks on 2 CPUs (the machine's 64 do not count)
  CHECK(sharesCores(two, {two, two, two}, 64));       // 3 on 2
  CHECK_FALSE(sharesCores(two, {two, two}, 64));      // 2 on 2
  CHECK_FALSE(sharesCores(two, {two}, 64));           // alone
  const CpuSet sixteen = cpus({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  CHECK_FALSE(sharesCores(sixteen, std::vector<CpuSet>(8, sixteen), 64));
  CHECK(sharesCores(sixteen, std::vector<CpuSet>(17, sixteen), 64));
}

TEST_CASE("locality: pinned ranks share only with ranks pinned to the same CPUs") {
  // One CPU each: nobody shares, though each rank sees a single CPU.
  CHECK_FALSE(sharesCores(cpus({0}), {cpus({0}), cpus({1}), cpus({2}), cpus({3})}, 64));
  // Two to a core (mpirun --bind-to core --oversubscribe, 4 ranks on 2 cores).
  const std::vector<CpuSet> twoPerCore = {cpus({0}), cpus({0}), cpus({1}), cpus({1})};
  for (const CpuSet& mine : twoPerCore) CHECK(sharesCores(mine, twoPerCore, 64));
  // A rank alone on CPU 0 beside two on CPU 1.
  const std::vector<CpuSet> mixed = {cpus({0}), cpus({1}), cpus({1})};
  CHECK_FALSE(sharesCores(mixed[0], mixed, 64));
  CHECK(sharesCores(mixed[1], mixed, 64));
  // CPUs beyond the first word count too.
  CHECK(sharesCores(cpus({100}), {cpus({100}), cpus({100})}, 64));
  CHECK_FALSE(sharesCores(cpus({100}), {cpus({100}), cpus({101})}, 64));
}

TEST_CASE("locality: an unpinned rank beside pinned ones counts every rank it may meet") {
  const std::vector<CpuSet> ranks = {cpus({0, 1}), cpus({0}), cpus({1})};
  CHECK(sharesCores(ranks[0], ranks, 64));        // 3 ranks can reach CPUs 0-1
  CHECK_FALSE(sharesCores(ranks[1], ranks, 64));  // CPU 0 and the unpinned rank: 2 ranks over CPUs 0-1
}

TEST_CASE("locality: an unknown affinity counts the ranks against the machine's CPUs") {
  const CpuSet unknown;
  CHECK(sharesCores(unknown, {unknown, unknown, unknown}, 2));
  CHECK_FALSE(sharesCores(unknown, {unknown, unknown}, 2));
  // One rank's affinity unknown is enough: pinned ranks cannot be told apart from it.
  CHECK_FALSE(sharesCores(cpus({0}), {cpus({0}), unknown, cpus({0})}, 4));
  CHECK(sharesCores(cpus({0}), {cpus({0}), unknown, cpus({0})}, 2));
  CHECK_FALSE(sharesCores(unknown, {unknown}, 0));  // a machine reporting no CPUs counts as one
}

TEST_CASE("locality: currentCpuSet reads this thread's affinity") {
  cpu_set_t expected;
  CPU_ZERO(&expected);
  REQUIRE(sched_getaffinity(0, sizeof(expected), &expected) == 0);
  const CpuSet mine = currentCpuSet();
  REQUIRE(cpuCount(mine) == static_cast<size_t>(CPU_COUNT(&expected)));
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    const bool inSet = static_cast<size_t>(c) / 64 < mine.size() && ((mine[static_cast<size_t>(c) / 64] >> (c % 64)) & 1u);
    CHECK(inSet == static_cast<bool>(CPU_ISSET(c, &expected)));
  }
}

TEST_CASE("locality: ranks nobody placed that outnumber their CPUs take one each in turn") {
  const CpuSet two = cpus({0, 1});
  const std::vector<CpuSet> four(4, two);
  // 4 on 2: 0 1 0 1, so each CPU runs two (never the 3 + 1 the scheduler may draw).
  CHECK(oversubscribedRankCpu(four, 0, true) == 0);
  CHECK(oversubscribedRankCpu(four, 1, true) == 1);
  CHECK(oversubscribedRankCpu(four, 2, true) == 0);
  CHECK(oversubscribedRankCpu(four, 3, true) == 1);
  // 9 on 3 CPUs that are not the first ones, across a word boundary: 5 63 64 5 63 64 5 63 64.
  const CpuSet scattered = cpus({5, 63, 64});
  const std::vector<CpuSet> nine(9, scattered);
  const int expected[] = {5, 63, 64, 5, 63, 64, 5, 63, 64};
  for (size_t i = 0; i < 9; ++i) CHECK(oversubscribedRankCpu(nine, i, true) == expected[i]);
  // 3 on one CPU: all on it.
  for (size_t i = 0; i < 3; ++i) CHECK(oversubscribedRankCpu(std::vector<CpuSet>(3, cpus({7})), i, true) == 7);
  // A set read from the wire carries trailing zero words; it is the same set.
  CpuSet padded = two;
  padded.resize(16, 0);
  CHECK(oversubscribedRankCpu({two, padded, two, padded}, 2, true) == 0);
}

TEST_CASE("locality: ranks someone placed, or that fit, are left alone") {
  const CpuSet two = cpus({0, 1});
  CHECK(oversubscribedRankCpu({two, two}, 0, true) == -1);              // 2 on 2: they fit
  CHECK(oversubscribedRankCpu({two, two, two}, 0, true) == -1);         // 3 on 2: no even split
  CHECK(oversubscribedRankCpu(std::vector<CpuSet>(7, cpus({5, 63, 64})), 0, true) == -1);  // 7 on 3
  CHECK(oversubscribedRankCpu({two}, 0, true) == -1);                   // alone
  CHECK(oversubscribedRankCpu(std::vector<CpuSet>(4, two), 1, false) == -1);  // thread ranks share a process
  // mpirun --bind-to core --oversubscribe, or a launcher's taskset: the affinities differ.
  CHECK(oversubscribedRankCpu({cpus({0}), cpus({0}), cpus({1}), cpus({1})}, 0, true) == -1);
  CHECK(oversubscribedRankCpu({two, two, two, cpus({0})}, 0, true) == -1);
  // An unknown affinity (empty) is not evidence that nobody placed the ranks.
  CHECK(oversubscribedRankCpu({two, {}, two, two}, 0, true) == -1);
  CHECK(oversubscribedRankCpu({{}, {}, {}}, 0, true) == -1);
  CHECK(oversubscribedRankCpu({two, two, two, two}, 4, true) == -1);  // an index past the machine
  CHECK(singleCpu(70) == CpuSet{0, uint64_t{1} << 6});
}
