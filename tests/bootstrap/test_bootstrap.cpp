// Bootstrap with ranks as threads of this process.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <thread>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/rank_runner.hpp"
#include "bootstrap/socket.hpp"
#include "common/config.hpp"
#include "nccl.h"

using namespace topoccl;
using namespace topoccl::bootstrap;
using namespace topoccl::testing;
using namespace std::chrono_literals;

namespace {

constexpr auto kGenerous = std::chrono::milliseconds(30000);

// Rank `rank`'s contribution, reproducible by every other rank.
std::vector<uint8_t> contribution(int rank, size_t bytes, uint32_t salt = 0) {
  std::mt19937 generator(static_cast<uint32_t>(rank * 7919) + salt);
  std::vector<uint8_t> data(bytes);
  for (auto& byte : data) byte = static_cast<uint8_t>(generator());
  return data;
}

// allGather, barrier and tagged send/recv, each checked; throws on a wrong result.
void exerciseCommunicator(Bootstrap& bootstrap) {
  const int rank = bootstrap.rank();
  const int nranks = bootstrap.nranks();
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{4096}, size_t{100003}}) {
    std::vector<uint8_t> all(bytes * static_cast<size_t>(nranks));
    const auto mine = contribution(rank, bytes, static_cast<uint32_t>(bytes));
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(bytes * static_cast<size_t>(rank)));
    bootstrap.allGather(all.data(), bytes);
    for (int peer = 0; peer < nranks; ++peer) {
      const auto expected = contribution(peer, bytes, static_cast<uint32_t>(bytes));
      expectTrue(std::equal(expected.begin(), expected.end(),
                            all.begin() + static_cast<std::ptrdiff_t>(bytes * static_cast<size_t>(peer))),
                 "allGather of " + std::to_string(bytes) + " bytes: slot " + std::to_string(peer) + " is wrong");
    }
    bootstrap.barrier();
  }

  // Tagged messages to every peer (self included), received in the reverse order of sending;
  // two messages with the same tag must arrive in order.
  for (int peer = 0; peer < nranks; ++peer)
    for (int tag = 1; tag <= 3; ++tag) {
      const auto data = contribution(rank * 100 + peer, static_cast<size_t>(tag) * 1000, static_cast<uint32_t>(tag));
      bootstrap.send(peer, tag, data.data(), data.size());
    }
  for (int peer = 0; peer < nranks; ++peer) {
    const int32_t first = rank * 1000 + 1;
    const int32_t second = rank * 1000 + 2;
    bootstrap.send(peer, 9, &first, sizeof(first));
    bootstrap.send(peer, 9, &second, sizeof(second));
  }
  for (int peer = nranks - 1; peer >= 0; --peer)
    for (int tag = 3; tag >= 1; --tag) {
      std::vector<uint8_t> data(static_cast<size_t>(tag) * 1000);
      bootstrap.recv(peer, tag, data.data(), data.size());
      expectTrue(data == contribution(peer * 100 + rank, data.size(), static_cast<uint32_t>(tag)),
                 "tagged message from rank " + std::to_string(peer) + " tag " + std::to_string(tag) + " is wrong");
    }
  for (int peer = 0; peer < nranks; ++peer) {
    int32_t first = 0;
    int32_t second = 0;
    bootstrap.recv(peer, 9, &first, sizeof(first));
    bootstrap.recv(peer, 9, &second, sizeof(second));
    expectTrue(first == peer * 1000 + 1 && second == peer * 1000 + 2, "same-tag messages out of order");
  }
  bootstrap.barrier();
}

bool mentions(const Outcome& outcome, const std::string& text) {
  return outcome.message.find(text) != std::string::npos;
}

}  // namespace

TEST_CASE("a unique id survives a trip through ncclUniqueId bytes") {
  const UniqueId id = createUniqueId();
  CHECK(id.magic == kUniqueIdMagic);
  CHECK(id.secret != 0);
  ncclUniqueId opaque{};
  std::memcpy(&opaque, &id, sizeof(id));
  UniqueId back;
  static_assert(std::is_trivially_copyable_v<UniqueId>);
  std::memcpy(static_cast<void*>(&back), &opaque, sizeof(back));
  CHECK(describe(back) == describe(id));
  CHECK(commHash(back) == commHash(id));
  CHECK(commHash(createUniqueId()) != commHash(id));
  // The copy works for joining.
  const auto outcomes = runRankThreads(2, [&](int rank) {
    auto bootstrap = Bootstrap::join(rank == 0 ? id : back, rank, 2, kGenerous);
    bootstrap->barrier();
  });
  CHECK(describeOutcomes(outcomes) == "rank 0: ok\nrank 1: ok\n");
}

TEST_CASE("uniqueIdFromAddress is deterministic and describes its address") {
  const UniqueId a = uniqueIdFromAddress("127.0.0.1:5000");
  const UniqueId b = uniqueIdFromAddress("127.0.0.1:5000");
  CHECK(a.secret == b.secret);
  CHECK(commHash(a) == commHash(b));
  CHECK(describe(a) == "127.0.0.1:5000");
  CHECK(uniqueIdFromAddress("127.0.0.1:5001").secret != a.secret);
  CHECK(describe(uniqueIdFromAddress("[::1]:7000")) == "[::1]:7000");
  CHECK_THROWS_AS(uniqueIdFromAddress("not an address"), Error);
  CHECK(describe(UniqueId{}) == "<invalid unique id>");
  CHECK_THROWS_WITH(Bootstrap::join(UniqueId{}, 0, 1, 1000ms), Catch::Contains("invalid unique id"));
}

TEST_CASE("threads join and exchange data for nranks 1, 2, 3, 5, 8") {
  for (int nranks : {1, 2, 3, 5, 8}) {
    INFO("nranks " << nranks);
    const UniqueId id = createUniqueId();
    const auto outcomes = runRankThreads(nranks, [&](int rank) {
      auto bootstrap = Bootstrap::join(id, rank, nranks, kGenerous);
      expectTrue(bootstrap->rank() == rank && bootstrap->nranks() == nranks, "rank / nranks wrong");
      exerciseCommunicator(*bootstrap);
    });
    for (const auto& outcome : outcomes) CHECK(outcome.text() == "ok");
  }
}

TEST_CASE("NCCL_COMM_ID: rank 0 hosts the root on the fixed address") {
  SocketAddress free;
  {
    Listener probe = listenOn(SocketAddress::parse("127.0.0.1:0"), false, false);
    free = probe.address;
  }
  config::setOverride("NCCL_COMM_ID", free.toString());
  const UniqueId id = createUniqueId();
  CHECK(describe(id) == free.toString());
  // Rank 0 comes last: the others retry connecting until its root exists.
  const auto outcomes = runRankThreads(3, [&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(300ms);
    auto bootstrap = Bootstrap::join(id, rank, 3, kGenerous);
    exerciseCommunicator(*bootstrap);
  });
  config::clearOverrides();
  for (const auto& outcome : outcomes) CHECK(outcome.text() == "ok");
}

TEST_CASE("interfaces: loopback IPv4, and IPv6 when the host has ::1") {
  config::setOverride("NCCL_SOCKET_IFNAME", "=lo");
  std::vector<std::string> families = {"AF_INET"};
  for (const auto& itf : listInterfaces())
    if (itf.name == "lo" && itf.address.family() == AF_INET6) families.push_back("AF_INET6");
  for (const auto& family : families) {
    INFO(family);
    config::setOverride("NCCL_SOCKET_FAMILY", family);
    const UniqueId id = createUniqueId();
    CHECK(describe(id).rfind(family == "AF_INET" ? "127.0.0.1:" : "[::1]:", 0) == 0);
    const auto outcomes = runRankThreads(3, [&](int rank) {
      auto bootstrap = Bootstrap::join(id, rank, 3, kGenerous);
      exerciseCommunicator(*bootstrap);
    });
    for (const auto& outcome : outcomes) CHECK(outcome.text() == "ok");
  }
  config::clearOverrides();
}

TEST_CASE("a rank with the wrong secret is refused and the rendezvous still completes") {
  const UniqueId id = createUniqueId();
  UniqueId forged = id;
  forged.secret ^= 0x5a5a5a5a;
  const Outcome stranger = runCaught([&] { Bootstrap::join(forged, 0, 2, 5000ms); });
  CHECK(stranger.kind == Outcome::Kind::Error);
  CHECK(stranger.code == ncclInvalidUsage);
  CHECK_THAT(stranger.message, Catch::Contains("wrong secret") && Catch::Contains(describe(id)));

  // Garbage and silent connections do not disturb the root either.
  {
    FileDescriptor garbage = connectUntil(SocketAddress::parse(describe(id)), Clock::now() + 5s, "garbage");
    std::vector<char> noise(300, 'x');
    sendAll(garbage.get(), noise.data(), noise.size(), Clock::now() + 5s, "garbage");
    FileDescriptor silent = connectUntil(SocketAddress::parse(describe(id)), Clock::now() + 5s, "silent");
  }
  const auto outcomes = runRankThreads(2, [&](int rank) {
    auto bootstrap = Bootstrap::join(id, rank, 2, kGenerous);
    exerciseCommunicator(*bootstrap);
  });
  CHECK(describeOutcomes(outcomes) == "rank 0: ok\nrank 1: ok\n");
}

TEST_CASE("inconsistent join arguments reach every rank as an error naming the problem") {
  SECTION("nranks mismatch") {
    const UniqueId id = createUniqueId();
    const auto outcomes = runRankThreads(2, [&](int rank) {
      if (rank == 1) std::this_thread::sleep_for(100ms);  // rank 0 fixes nranks first
      Bootstrap::join(id, rank, rank == 0 ? 2 : 3, 10000ms);
    });
    INFO(describeOutcomes(outcomes));
    for (const auto& outcome : outcomes) {
      CHECK(outcome.code == ncclInvalidUsage);
      CHECK(mentions(outcome, "nranks mismatch: rank 1"));
      CHECK(mentions(outcome, "nranks=3"));
      CHECK(mentions(outcome, "nranks=2"));
      CHECK(outcome.seconds < 8);  // told at once, not at the timeout
    }
  }
  SECTION("duplicate rank") {
    const UniqueId id = createUniqueId();
    const auto outcomes = runRankThreads(2, [&](int) { Bootstrap::join(id, 0, 2, 10000ms); });
    INFO(describeOutcomes(outcomes));
    for (const auto& outcome : outcomes) {
      CHECK(outcome.code == ncclInvalidUsage);
      CHECK(mentions(outcome, "duplicate rank: rank 0"));
    }
  }
  SECTION("rank out of range") {
    const UniqueId id = createUniqueId();
    const auto outcomes = runRankThreads(2, [&](int rank) {
      if (rank == 1) std::this_thread::sleep_for(100ms);
      Bootstrap::join(id, rank == 0 ? 0 : 7, 2, 10000ms);
    });
    INFO(describeOutcomes(outcomes));
    for (const auto& outcome : outcomes) {
      CHECK(outcome.code == ncclInvalidArgument);
      CHECK(mentions(outcome, "rank 7"));
      CHECK(mentions(outcome, "out of range for nranks=2"));
    }
  }
}

TEST_CASE("ranks that never arrive are named to the ones that did") {
  const UniqueId id = createUniqueId();
  // Ranks 2 and 4 of 5 never come.
  const auto outcomes = runRankThreads(3, [&](int index) {
    const int rank = std::vector<int>{0, 1, 3}[static_cast<size_t>(index)];
    Bootstrap::join(id, rank, 5, 1500ms);
  });
  INFO(describeOutcomes(outcomes));
  for (const auto& outcome : outcomes) {
    CHECK(outcome.code == ncclRemoteError);
    CHECK(mentions(outcome, "ranks 2, 4 never arrived within"));
    CHECK(outcome.seconds < 30);
  }
}

TEST_CASE("an unreachable root is a remote error naming its address") {
  SocketAddress free;
  {
    Listener probe = listenOn(SocketAddress::parse("127.0.0.1:0"), false, false);
    free = probe.address;
  }
  UniqueId id = uniqueIdFromAddress(free.toString());  // nobody hosts it (NCCL_COMM_ID is unset)
  const Outcome outcome = runCaught([&] { Bootstrap::join(id, 1, 2, 500ms); });
  CHECK(outcome.code == ncclRemoteError);
  CHECK_THAT(outcome.message, Catch::Contains(free.toString()));
}

TEST_CASE("a receive of the wrong size names both sizes") {
  const UniqueId id = createUniqueId();
  const auto outcomes = runRankThreads(2, [&](int rank) {
    auto bootstrap = Bootstrap::join(id, rank, 2, kGenerous);
    std::vector<char> data(64);
    if (rank == 0) bootstrap->send(1, 5, data.data(), 40);
    else bootstrap->recv(0, 5, data.data(), 64);
  });
  CHECK(outcomes[0].ok());
  CHECK(outcomes[1].code == ncclInvalidUsage);
  CHECK_THAT(outcomes[1].message, Catch::Contains("sent 40 bytes") && Catch::Contains("expected 64"));
}

TEST_CASE("a peer that goes away is an error naming it, not a hang") {
  const UniqueId id = createUniqueId();
  const auto outcomes = runRankThreads(3, [&](int rank) {
    auto bootstrap = Bootstrap::join(id, rank, 3, kGenerous);
    bootstrap->barrier();
    if (rank == 1) return;  // destroys its bootstrap: sockets close like a crashed process's
    std::this_thread::sleep_for(200ms);
    std::vector<char> data(3 * 16);
    for (int round = 0; round < 100; ++round) bootstrap->allGather(data.data(), 16);
  });
  INFO(describeOutcomes(outcomes));
  CHECK(outcomes[1].ok());
  for (int rank : {0, 2}) {
    CHECK(outcomes[static_cast<size_t>(rank)].code == ncclRemoteError);
    CHECK(outcomes[static_cast<size_t>(rank)].seconds < 30);
  }
  // Rank 2 receives from rank 1 directly.
  CHECK(mentions(outcomes[2], "rank 1 ("));
  CHECK(mentions(outcomes[2], "closed the connection"));
}

TEST_CASE("a silent peer times out with its rank named") {
  const UniqueId id = createUniqueId();
  const auto outcomes = runRankThreads(2, [&](int rank) {
    auto bootstrap = Bootstrap::join(id, rank, 2, 800ms);
    if (rank == 0) {
      int value = 0;
      bootstrap->recv(1, 3, &value, sizeof(value));  // rank 1 never sends
    } else {
      std::this_thread::sleep_for(1500ms);
    }
  });
  CHECK(outcomes[0].code == ncclRemoteError);
  CHECK_THAT(outcomes[0].message, Catch::Contains("timed out") && Catch::Contains("rank 1 (") &&
                                      Catch::Contains("message tag 3"));
}

TEST_CASE("abort() unblocks a call in progress") {
  const UniqueId id = createUniqueId();
  std::vector<std::unique_ptr<Bootstrap>> bootstraps(2);
  const auto joined = runRankThreads(2, [&](int rank) { bootstraps[static_cast<size_t>(rank)] = Bootstrap::join(id, rank, 2, kGenerous); });
  REQUIRE(describeOutcomes(joined) == "rank 0: ok\nrank 1: ok\n");

  Outcome blocked;
  std::thread waiter([&] {
    blocked = runCaught([&] {
      int value = 0;
      bootstraps[1]->recv(0, 1, &value, sizeof(value));
    });
  });
  std::this_thread::sleep_for(200ms);
  bootstraps[1]->abort();
  waiter.join();
  CHECK(blocked.kind == Outcome::Kind::Error);
  CHECK_THAT(blocked.message, Catch::Contains("aborted"));
  CHECK(blocked.seconds < 10);
  // Every later call fails at once as well.
  CHECK_THROWS_WITH(bootstraps[1]->barrier(), Catch::Contains("aborted"));
}

TEST_CASE("peer arguments out of range are invalid arguments") {
  const UniqueId id = createUniqueId();
  auto bootstrap = Bootstrap::join(id, 0, 1, kGenerous);
  int value = 0;
  CHECK_THROWS_WITH(bootstrap->send(1, 0, &value, sizeof(value)), Catch::Contains("out of range for nranks=1"));
  CHECK_THROWS_WITH(bootstrap->recv(-1, 0, &value, sizeof(value)), Catch::Contains("out of range"));
}
