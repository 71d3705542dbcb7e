#include "topology/locality.hpp"

#include <sched.h>

#include <algorithm>
#include <bit>
#include <map>

namespace topoccl::topo {

const char* proximityName(Proximity p) noexcept {
  switch (p) {
    case Proximity::SameProcess: return "same-process";
    case Proximity::SameHost: return "same-host";
    case Proximity::OtherHost: return "other-host";
  }
  return "unknown";
}

CpuSet currentCpuSet() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0) return {};  // EINVAL: a kernel mask beyond 1024 CPUs
  CpuSet set(CPU_SETSIZE / 64, 0);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &cpus)) set[static_cast<size_t>(c) / 64] |= uint64_t{1} << (c % 64);
  while (!set.empty() && set.back() == 0) set.pop_back();
  return set;
}

size_t cpuCount(const CpuSet& cpus) {
  size_t count = 0;
  for (uint64_t word : cpus) count += static_cast<size_t>(std::popcount(word));
  return count;
}

bool sharesCores(const CpuSet& mine, const std::vector<CpuSet>& machine, size_t machineCpus) {
  const bool known = !mine.empty() && std::none_of(machine.begin(), machine.end(), [](const CpuSet& s) { return s.empty(); });
  if (!known) return machine.size() > std::max<size_t>(1, machineCpus);
  CpuSet together = mine;
  size_t overlapping = 0;
  for (const CpuSet& other : machine) {
    bool overlaps = false;
    for (size_t w = 0; w < std::min(mine.size(), other.size()); ++w) overlaps = overlaps || (mine[w] & other[w]) != 0;
    if (!overlaps) continue;
    ++overlapping;
    if (together.size() < other.size()) together.resize(other.size(), 0);
    for (size_t w = 0; w < other.size(); ++w) together[w] |= other[w];
  }
  return overlapping > cpuCount(together);
}

namespace {

bool sameCpus(const CpuSet& a, const CpuSet& b) {
  for (size_t w = 0; w < std::max(a.size(), b.size()); ++w)
    if ((w < a.size() ? a[w] : 0) != (w < b.size() ? b[w] : 0)) return false;
  return true;
}

}  // namespace

int oversubscribedRankCpu(const std::vector<CpuSet>& machine, size_t machineIndex, bool ownProcesses) {
  if (!ownProcesses || machineIndex >= machine.size()) return -1;
  const CpuSet& shared = machine.front();
  const size_t cpus = cpuCount(shared);
  // Only an even split: 3 ranks bound 0 1 0 ran their first 8 B all-reduces at up to 190 us and 2 MiB at 1.7x
  // the time of 3 unbound ranks, which the scheduler balances over both CPUs (perf/RESULTS.md).
  if (cpus == 0 || machine.size() <= cpus || machine.size() % cpus != 0) return -1;
  for (const CpuSet& other : machine)
    if (!sameCpus(other, shared)) return -1;  // someone placed the ranks (mpirun --bind-to, taskset, a cpuset): theirs to decide
  size_t wanted = machineIndex % cpus;
  for (size_t w = 0; w < shared.size(); ++w)
    for (uint64_t bits = shared[w]; bits != 0; bits &= bits - 1) {
      if (wanted == 0) return static_cast<int>(w * 64 + static_cast<size_t>(std::countr_zero(bits)));
      --wanted;
    }
  return -1;  // not reached: wanted < cpus
}

CpuSet singleCpu(int cpu) {
  CpuSet set(static_cast<size_t>(cpu) / 64 + 1, 0);
  set.back() |= uint64_t{1} << (cpu % 64);
  return set;
}

Locality::Locality(std::vector<RankPlace> places) : places_(std::move(places)), hostOf_(places_.size()) {
  std::map<std::string, int> hostIndex;
  for (size_t r = 0; r < places_.size(); ++r) {
    auto [it, inserted] = hostIndex.emplace(places_[r].hostId, nhosts_);
    if (inserted) ++nhosts_;
    hostOf_[r] = it->second;
  }
}

Proximity Locality::between(int a, int b) const {
  if (places_[a].hostId != places_[b].hostId) return Proximity::OtherHost;
  if (places_[a].processToken == places_[b].processToken) return Proximity::SameProcess;
  return Proximity::SameHost;
}

std::vector<int> Locality::ranksOnHost(int host) const {
  std::vector<int> ranks;
  for (size_t r = 0; r < hostOf_.size(); ++r)
    if (hostOf_[r] == host) ranks.push_back(static_cast<int>(r));
  return ranks;
}

}  // namespace topoccl::topo
