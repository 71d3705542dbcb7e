// Where ranks live relative to each other: same process, same host, or another host. The full
// hardware graph (GPUs, links, NICs) arrives with the topology issue; this is the part the
// runtime needs to choose transports and hierarchical plans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace topoccl::topo {

struct RankPlace {
  std::string hostId;
  uint64_t processToken = 0;
};

enum class Proximity : uint8_t { SameProcess, SameHost, OtherHost };

// The logical CPUs a rank may run on (its affinity), as a bit set: bit c of word c / 64 is CPU c. Empty
// when unknown.
using CpuSet = std::vector<uint64_t>;
// The calling thread's affinity (sched_getaffinity), up to 1024 CPUs; empty when it cannot be read or
// names a CPU beyond that.
CpuSet currentCpuSet();
size_t cpuCount(const CpuSet& cpus);
// Whether a rank whose affinity is `mine` shares cores with other ranks: the ranks whose affinities overlap
// its own (itself included, so `machine` holds every rank on this machine) outnumber the CPUs those ranks
// may use together. 4 unpinned ranks on 2 CPUs share; 4 ranks pinned to 4 CPUs do not; 2 ranks pinned to
// one CPU do, and a rank pinned alone beside them does not. When any affinity is unknown (empty), the
// ranks are counted against `machineCpus` instead.
bool sharesCores(const CpuSet& mine, const std::vector<CpuSet>& machine, size_t machineCpus);
// The CPU to bind the rank at `machineIndex` of `machine` (every rank on this machine, in rank order) to, or -1
// to leave it where the scheduler puts it. Only ranks nobody placed are bound: each in a process of its own
// (`ownProcesses`), every affinity known and the same, and a multiple (2 or more) of those n CPUs in number.
// Rank i then takes the (i mod n)-th CPU, so each CPU runs an equal share; left alone, 4 ranks on 2 CPUs drew a
// 3 + 1 split in about half the launches and ran small collectives at half speed (perf/RESULTS.md).
int oversubscribedRankCpu(const std::vector<CpuSet>& machine, size_t machineIndex, bool ownProcesses);
// A set holding only `cpu`.
CpuSet singleCpu(int cpu);
const char* proximityName(Proximity p) noexcept;

class Locality {
 public:
  explicit Locality(std::vector<RankPlace> places);
  int nranks() const { return static_cast<int>(places_.size()); }
  Proximity between(int a, int b) const;
  int hostIndex(int rank) const { return hostOf_[rank]; }  // hosts numbered by first rank seen
  int nhosts() const { return nhosts_; }
  std::vector<int> ranksOnHost(int host) const;

 private:
  std::vector<RankPlace> places_;
  std::vector<int> hostOf_;
  int nhosts_ = 0;
};

}  // namespace topoccl::topo
