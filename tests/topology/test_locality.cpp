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
