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
