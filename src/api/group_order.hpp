// The order in which one thread issues the GPU collectives of a group that spans several communicators
// (it drives several ranks, as nccl-tests' -g): every communicator's first call, then every second, and so on,
// each communicator's calls in their own order. A rank's second launch then never enters the GPU's hardware
// queues ahead of a peer's first, which it may wait for (core/launch_order.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

namespace topoccl::api {

// Indices into `calls`, by turn; `communicatorOf(call)` names a call's communicator.
template <class Call, class CommunicatorOf>
std::vector<size_t> interleaveByCommunicator(const std::vector<Call>& calls, CommunicatorOf communicatorOf) {
  std::map<decltype(communicatorOf(calls.front())), size_t> issued;
  std::vector<std::pair<size_t, size_t>> byTurn;  // (the call's place among its communicator's calls, index)
  for (size_t i = 0; i < calls.size(); ++i) byTurn.push_back({issued[communicatorOf(calls[i])]++, i});
  std::stable_sort(byTurn.begin(), byTurn.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<size_t> order;
  for (const auto& turn : byTurn) order.push_back(turn.second);
  return order;
}

}  // namespace topoccl::api
