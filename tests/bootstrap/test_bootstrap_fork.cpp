// Bootstrap with ranks as fork()ed processes: the way real jobs run, and the only way to see
// what survivors observe when a peer process is killed.
#include <catch2/catch.hpp>

#include <signal.h>

#include <random>
#include <thread>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/rank_runner.hpp"

using namespace topoccl;
using namespace topoccl::bootstrap;
using namespace topoccl::testing;
using namespace std::chrono_literals;

namespace {

std::vector<uint64_t> contribution(int rank, size_t words) {
  std::mt19937_64 generator(static_cast<uint64_t>(rank) * 0x9e3779b97f4a7c15ull + 11);
  std::vector<uint64_t> data(words);
  for (auto& word : data) word = generator();
  return data;
}

}  // namespace

TEST_CASE("processes join, allgather random data, barrier and exchange tagged messages") {
  for (int nranks : {2, 5}) {
    INFO("nranks " << nranks);
    const UniqueId id = createUniqueId();  // the root thread lives in this (parent) process
    const auto outcomes = runRankProcesses(nranks, [&](int rank) {
      auto bootstrap = Bootstrap::join(id, rank, nranks, 30000ms);
      const size_t words = 1000 + 17;
      std::vector<uint64_t> all(words * static_cast<size_t>(nranks));
      const auto mine = contribution(rank, words);
      std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(words * static_cast<size_t>(rank)));
      bootstrap->allGather(all.data(), words * sizeof(uint64_t));
      for (int peer = 0; peer < nranks; ++peer) {
        const auto expected = contribution(peer, words);
        expectTrue(std::equal(expected.begin(), expected.end(),
                              all.begin() + static_cast<std::ptrdiff_t>(words * static_cast<size_t>(peer))),
                   "allGather slot " + std::to_string(peer) + " wrong");
      }
      bootstrap->barrier();
      // Everyone sends its rank to everyone on two tags; receive tag 2 before tag 1.
      for (int peer = 0; peer < nranks; ++peer)
        for (int tag : {1, 2}) {
          const int value = rank * 10 + tag;
          bootstrap->send(peer, tag, &value, sizeof(value));
        }
      for (int peer = nranks - 1; peer >= 0; --peer)
        for (int tag : {2, 1}) {
          int value = -1;
          bootstrap->recv(peer, tag, &value, sizeof(value));
          expectTrue(value == peer * 10 + tag, "tagged value from rank " + std::to_string(peer) + " wrong");
        }
      bootstrap->barrier();
    });
    for (const auto& outcome : outcomes) CHECK(outcome.text() == "ok");
  }
}

TEST_CASE("processes: a rank that never arrives is named after the timeout") {
  const UniqueId id = createUniqueId();
  const auto outcomes = runRankProcesses(2, [&](int rank) { Bootstrap::join(id, rank, 3, 1000ms); });
  for (const auto& outcome : outcomes) {
    INFO(outcome.text());
    CHECK(outcome.code == ncclRemoteError);
    CHECK(outcome.message.find("rank 2 never arrived") != std::string::npos);
  }
}

TEST_CASE("processes: a killed peer gives the survivors a remote error, not a hang") {
  const UniqueId id = createUniqueId();
  const auto outcomes = runRankProcesses(
      4,
      [&](int rank) {
        auto bootstrap = Bootstrap::join(id, rank, 4, 60000ms);  // long: the error must not be a timeout
        bootstrap->barrier();
        if (rank == 2) ::raise(SIGKILL);
        std::vector<uint64_t> data(4 * 64);
        for (int round = 0; round < 1000; ++round) bootstrap->allGather(data.data(), 64 * sizeof(uint64_t));
      },
      std::chrono::seconds(90));
  INFO(describeOutcomes(outcomes));
  CHECK(outcomes[2].kind == Outcome::Kind::Died);
  for (int rank : {0, 1, 3}) {
    CHECK(outcomes[static_cast<size_t>(rank)].code == ncclRemoteError);
    CHECK(outcomes[static_cast<size_t>(rank)].seconds < 30);
  }
  // Rank 3 receives from rank 2 in the ring.
  CHECK(outcomes[3].message.find("rank 2 (") != std::string::npos);
}
