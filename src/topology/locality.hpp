// Where ranks live relative to each other: same process, same host, or another host. The full
// hardware graph (GPUs, links, NICs) arrives with the topology issue; this is the part the
// runtime needs to choose transports and hierarchical plans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace topoccl::topo {

struct RankPlace {
  std::string hostId;
  uint64_t processToken = 0;
};

enum class Proximity : uint8_t { SameProcess, SameHost, OtherHost };
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
