#include "topology/locality.hpp"

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
