// The order in which one thread issues a group's GPU collectives over several communicators
// (api/group_order.hpp): every communicator's k-th call before any (k+1)-th, each communicator's own order kept.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "api/group_order.hpp"

namespace {
struct Call {
  int communicator;
  int ordinal;  // its place among its communicator's calls
};
}  // namespace

TEST_CASE("group order: a group over several communicators is issued turn by turn, each communicator's calls in order") {
  const auto communicatorOf = [](const Call& c) { return c.communicator; };
  // nccl-tests' -g shape is already interleaved and stays as it is.
  std::vector<Call> interleaved{{0, 0}, {1, 0}, {0, 1}, {1, 1}};
  CHECK(topoccl::api::interleaveByCommunicator(interleaved, communicatorOf) == std::vector<size_t>{0, 1, 2, 3});
  // One communicator's calls first, then the other's: the second calls wait for every first.
  std::vector<Call> blocked{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}};
  CHECK(topoccl::api::interleaveByCommunicator(blocked, communicatorOf) == std::vector<size_t>{0, 3, 1, 4, 2});

  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 random(seed);
  for (int trial = 0; trial < 200; ++trial) {
    const int communicators = 1 + static_cast<int>(random() % 5);
    std::vector<int> next(static_cast<size_t>(communicators), 0);
    std::vector<Call> calls;
    const size_t n = random() % 20;
    for (size_t i = 0; i < n; ++i) {
      const int c = static_cast<int>(random() % static_cast<uint32_t>(communicators));
      calls.push_back({c, next[static_cast<size_t>(c)]++});
    }
    const std::vector<size_t> order = topoccl::api::interleaveByCommunicator(calls, communicatorOf);
    REQUIRE(order.size() == calls.size());
    std::vector<bool> seen(calls.size(), false);
    std::vector<int> issued(static_cast<size_t>(communicators), 0);
    int lastTurn = 0;
    for (size_t i : order) {
      REQUIRE(i < calls.size());
      CHECK_FALSE(seen[i]);
      seen[i] = true;
      const Call& c = calls[i];
      CHECK(c.ordinal == issued[static_cast<size_t>(c.communicator)]++);  // its own order kept
      CHECK(c.ordinal >= lastTurn);  // no k-th call after a (k+1)-th
      lastTurn = c.ordinal;
    }
  }
}
