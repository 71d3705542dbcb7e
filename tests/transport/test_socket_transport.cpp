// Socket transport: ranks in one process (driven from one thread, or one thread per rank) and as
// fork()ed processes, over loopback.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "bootstrap/rank_runner.hpp"
#include "bootstrap/socket.hpp"
#include "common/config.hpp"
#include "common/error.hpp"
#include "kernels/host_reduce.hpp"
#include "transport/socket/socket_transport.hpp"

using namespace topoccl;
using namespace topoccl::transport;
using namespace std::chrono_literals;
using topoccl::testing::Outcome;

namespace {

constexpr uint64_t kSocketTestSecret = 0x5ec12e7ull;

uint64_t socketTestHash() {
  static std::atomic<uint64_t> counter{0};
  return (uint64_t(std::random_device{}()) << 24) ^ (++counter << 56) ^ uint64_t(::getpid());
}

struct SocketRank {
  CommIdentity identity;
  std::unique_ptr<Transport> transport;
  PeerInfo info;
};

SocketRank makeSocketRank(int rank, int nranks, uint64_t hash, uint64_t secret = kSocketTestSecret) {
  SocketRank result;
  result.identity = CommIdentity{hash, secret, rank, nranks};
  result.transport = makeSocketTransport(result.identity, &result.info.socketAddress);
  result.info.rank = rank;
  result.info.hostId = "socket-test-host";
  result.info.pid = ::getpid();
  result.info.processToken = 7000 + uint64_t(rank);
  return result;
}

std::vector<unsigned char> socketRandomBytes(size_t bytes, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::vector<unsigned char> data(bytes);
  for (auto& byte : data) byte = static_cast<unsigned char>(generator() >> 17);
  return data;
}

// Progresses until `done`; a stuck transfer fails instead of hanging the suite.
void driveUntil(const std::vector<Connection*>& connections, const std::function<bool()>& done,
                std::chrono::seconds limit = 60s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    for (Connection* connection : connections) connection->progress();
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("socket test: transfer timed out");
  }
}

// Sets NCCL_NSOCKS_PERTHREAD for one scope.
struct StreamCount {
  explicit StreamCount(int streams) { config::setOverride("NCCL_NSOCKS_PERTHREAD", std::to_string(streams)); }
  ~StreamCount() { config::setOverride("NCCL_NSOCKS_PERTHREAD", std::nullopt); }
};

const std::vector<size_t> kAwkwardSizes = {0, 1, 7919, 65521, (256 << 10) - 1, (256 << 10) + 1, (3 << 20) + 7,
                                           8 << 20};

// Posts every size in both directions on `a` <-> `b` and checks what arrives.
void exchangeAllSizes(Connection& a, Connection& b, uint64_t seed, const std::vector<Connection*>& drive) {
  struct Direction {
    Connection* from;
    Connection* to;
    std::vector<std::vector<unsigned char>> sent, received;
    Ticket lastSend = 0, lastRecv = 0;
  };
  Direction directions[2] = {{&a, &b, {}, {}}, {&b, &a, {}, {}}};
  for (int d = 0; d < 2; ++d) {
    Direction& direction = directions[d];
    for (size_t i = 0; i < kAwkwardSizes.size(); ++i) {
      direction.sent.push_back(socketRandomBytes(kAwkwardSizes[i], seed + uint64_t(d) * 1000 + i));
      direction.received.emplace_back(kAwkwardSizes[i], 0xEE);
    }
  }
  for (size_t i = 0; i < kAwkwardSizes.size(); ++i)
    for (Direction& direction : directions) {
      RecvAction action;
      action.dst = direction.received[i].data();
      direction.lastRecv = direction.to->postRecv(action, kAwkwardSizes[i]);
      direction.lastSend = direction.from->postSend(direction.sent[i].data(), kAwkwardSizes[i]);
    }
  driveUntil(drive, [&] {
    for (const Direction& direction : directions)
      if (direction.from->sendsCompleted() != direction.lastSend || direction.to->recvsCompleted() != direction.lastRecv)
        return false;
    return true;
  });
  for (const Direction& direction : directions)
    for (size_t i = 0; i < kAwkwardSizes.size(); ++i) {
      INFO("size " << kAwkwardSizes[i]);
      CHECK(direction.received[i] == direction.sent[i]);
    }
}

}  // namespace

TEST_CASE("socket stripes cover each message exactly, on element-safe boundaries, in proportion to weights") {
  using namespace socket_detail;
  const std::vector<std::vector<uint32_t>> weightSets = {{1}, {1, 1}, {1, 1, 1}, std::vector<uint32_t>(8, 1),
                                                         {1000, 1000, 250, 250}, {4000, 1}, {7, 5, 3}};
  std::mt19937_64 random(std::random_device{}());
  for (const auto& weights : weightSets) {
    const StripePlanner planner(weights);
    const int streams = static_cast<int>(weights.size());
    const bool even = std::all_of(weights.begin(), weights.end(), [&](uint32_t w) { return w == weights.front(); });
    const uint64_t total = std::accumulate(weights.begin(), weights.end(), uint64_t{0});
    for (size_t bytes : {size_t{0}, size_t{1}, kMinStripeBytes - 1, kMinStripeBytes, size_t{(3 << 20) + 7},
                         size_t{1} << 30, (size_t{5} << 31) + 13, size_t(random() % (64u << 20))}) {
      const uint64_t sequence = random() % 1000;
      INFO("weights " << streams << " first " << weights.front() << " bytes " << bytes << " sequence " << sequence);
      const int parts = planner.partCount(bytes);
      CHECK(parts >= 1);
      CHECK(parts <= streams);
      if (bytes < kMinStripeBytes) CHECK(parts == 1);
      if (!even && bytes >= kMinStripeBytes) CHECK(parts == streams);
      size_t covered = 0;
      std::vector<int> partOfStream(static_cast<size_t>(streams), -1);
      for (int part = 0; part < parts; ++part) {
        const auto range = planner.part(bytes, sequence, part);
        CHECK(range.offset == covered);
        CHECK(range.offset % kStripeAlign == 0);
        if (even && bytes > 0) CHECK(range.length > 0);
        if (!even && parts > 1) {
          // Within one alignment unit of the stream's exact share.
          const double share = static_cast<double>(bytes) * weights[static_cast<size_t>(range.stream)] / static_cast<double>(total);
          CHECK(std::abs(static_cast<double>(range.length) - share) <= 2.0 * kStripeAlign);
        }
        CHECK(partOfStream[static_cast<size_t>(range.stream)] == -1);
        partOfStream[static_cast<size_t>(range.stream)] = part;
        covered += range.length;
      }
      CHECK(covered == bytes);
      CHECK(planner.part(bytes, sequence, 0).stream == planner.firstStream(sequence));
      for (int stream = 0; stream < streams; ++stream)
        CHECK(planner.partOnStream(bytes, sequence, stream) == partOfStream[static_cast<size_t>(stream)]);
    }
  }
  CHECK_THROWS(StripePlanner({1, 4}));  // weighted streams come heaviest first
  CHECK_THROWS(StripePlanner({3, 0}));
}

TEST_CASE("socket routes pair NICs by rail, weight streams by the slower end, and honour near and same-host") {
  using socket_detail::planRoutes;
  const std::vector<NicEndpoint> mine = {{"eth0", "10.0.1.1:0", 2, 0, true}, {"eth1", "10.0.2.1:0", 0.5, 1, false}};
  const std::vector<NicEndpoint> theirs = {{"eth1", "10.0.2.2:4001", 0.5, 1, true}, {"eth0", "10.0.1.2:4000", 1, 0, false}};
  auto routes = planRoutes(mine, theirs, false, 2, false);
  REQUIRE(routes.size() == 4);
  CHECK(routes[0].label == "eth0->eth0");
  CHECK(routes[0].weight == 500);  // min(2, 1) Gbit/s over 2 streams
  CHECK(routes[0].remote.toString() == "10.0.1.2:4000");
  CHECK(routes[0].local.host() == "10.0.1.1");
  CHECK(routes[0].local.port() == 0);
  CHECK(routes[2].label == "eth1->eth1");
  CHECK(routes[2].weight == 250);
  CHECK(routes[3].remote.toString() == "10.0.2.2:4001");

  routes = planRoutes(mine, theirs, false, 0, false);  // automatic: one stream per pair over two pairs
  REQUIRE(routes.size() == 2);
  CHECK(routes[0].weight == 1000);
  CHECK(planRoutes(mine, theirs, false, 0, true).size() == 2);  // over one pair: two
  CHECK(planRoutes(mine, theirs, true, 0, false).size() == 1);  // same host: one

  routes = planRoutes(mine, theirs, false, 1, true);  // near only: eth0 is this rank's
  REQUIRE(routes.size() == 1);
  CHECK(routes[0].label == "eth0->eth0");

  routes = planRoutes(mine, theirs, true, 1, false);  // same host: one pair, the first NICs
  REQUIRE(routes.size() == 1);
  CHECK(routes[0].remote.toString() == "10.0.2.2:4001");

  std::vector<NicEndpoint> unknown = mine;
  unknown[1].gbps = 0;  // any unknown speed: even weights
  routes = planRoutes(unknown, theirs, false, 1, false);
  REQUIRE(routes.size() == 2);
  CHECK(routes[0].weight == 1);
  CHECK(routes[1].weight == 1);

  const std::vector<NicEndpoint> otherRail = {{"ib0", "10.9.0.2:5000", 100, 7, true}};
  routes = planRoutes(mine, otherRail, false, 2, false);  // no common rail: first NICs
  REQUIRE(routes.size() == 2);
  CHECK(routes[0].label == "eth0->ib0");
}

TEST_CASE("socket transport over two NICs of unequal speed delivers every byte, striped by weight") {
  // Two loopback addresses stand for two NICs on two rails; the ranks claim different hosts so the
  // connection uses both.
  const uint64_t hash = socketTestHash();
  std::vector<SocketRank> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r].identity = CommIdentity{hash, kSocketTestSecret, r, 2};
    std::vector<NicEndpoint> listening;
    ranks[r].transport = makeSocketTransport(
        ranks[r].identity,
        {LocalNic{"loA", bootstrap::SocketAddress::parse("127.0.0.1:0"), 4, 0, true},
         LocalNic{"loB", bootstrap::SocketAddress::parse("127.0.0." + std::to_string(2 + r) + ":0"), 1, 1, true}},
        &listening, "host" + std::to_string(r));
    REQUIRE(listening.size() == 2);
    ranks[r].info = PeerInfo{r, "host" + std::to_string(r), ::getpid(), 100u + r, listening[0].address, listening};
  }
  auto c0 = ranks[0].transport->connect(ranks[1].info, 0);
  auto c1 = ranks[1].transport->connect(ranks[0].info, 0);
  const std::vector<Connection*> all = {c0.get(), c1.get()};
  exchangeAllSizes(*c0, *c1, 300, all);
  // Automatic stream count: one per NIC pair when there are several.
  CHECK_THAT(c0->describe(), Catch::Contains("2 streams") && Catch::Contains("loA->loA w4000") &&
                                 Catch::Contains("loB->loB w1000"));
  // A receive nobody sends to: the stall report names the stream and its NIC, on both sides.
  CHECK(c0->describeStall() == "every stream idle");
  std::vector<char> sink(64);
  c0->postRecv(RecvAction{sink.data()}, sink.size());
  c1->postRecv(RecvAction{sink.data()}, sink.size());
  for (int i = 0; i < 10; ++i) c0->progress(), c1->progress();
  CHECK_THAT(c0->describeStall(), Catch::Contains("stuck: stream 0 loA->loA receiving message #"));
  CHECK_THAT(c1->describeStall(), Catch::Contains("stuck: stream 0 ->loA receiving message #"));
}

TEST_CASE("socket transport moves random payloads both ways on two channels, with 1 and 3 streams") {
  for (int streams : {1, 3}) {
    INFO("streams " << streams);
    StreamCount count(streams);
    const uint64_t hash = socketTestHash();
    SocketRank r0 = makeSocketRank(0, 2, hash);
    SocketRank r1 = makeSocketRank(1, 2, hash);
    CHECK(r0.transport->canConnect(r0.info, r1.info));
    // The higher rank may call connect first: it waits for the dialler inside progress().
    auto c1ch0 = r1.transport->connect(r0.info, 0);
    auto c0ch0 = r0.transport->connect(r1.info, 0);
    auto c0ch1 = r0.transport->connect(r1.info, 1);
    auto c1ch1 = r1.transport->connect(r0.info, 1);
    CHECK(std::string(c0ch0->transportName()) == "socket");
    CHECK(c0ch0->peer() == 1);
    CHECK_THAT(c1ch1->describe(), Catch::Contains("rank 0") && Catch::Contains("channel 1"));
    const std::vector<Connection*> all = {c0ch0.get(), c1ch0.get(), c0ch1.get(), c1ch1.get()};
    exchangeAllSizes(*c0ch0, *c1ch0, 100, all);
    exchangeAllSizes(*c0ch1, *c1ch1, 200, all);
    CHECK_THAT(c0ch0->describe(), Catch::Contains(std::to_string(streams) + " streams"));
    CHECK_THAT(c1ch0->describe(), Catch::Contains(std::to_string(streams) + " streams"));
  }
}

TEST_CASE("socket transport keeps many messages in order while they are posted on the fly") {
  StreamCount count(3);
  const uint64_t hash = socketTestHash();
  SocketRank r0 = makeSocketRank(0, 2, hash);
  SocketRank r1 = makeSocketRank(1, 2, hash);
  auto c0 = r0.transport->connect(r1.info, 0);
  auto c1 = r1.transport->connect(r0.info, 0);
  std::mt19937 generator(42);
  constexpr int kMessages = 600;
  std::vector<size_t> sizes(kMessages);
  for (int i = 0; i < kMessages; ++i) sizes[i] = i % 50 == 7 ? 300000 + generator() % 1000 : generator() % 5000;
  std::vector<std::vector<unsigned char>> forward(kMessages), backward(kMessages);
  std::vector<std::vector<unsigned char>> forwardIn(kMessages), backwardIn(kMessages);
  Ticket lastForwardRecv = 0, lastBackwardRecv = 0, lastForwardSend = 0, lastBackwardSend = 0;
  for (int i = 0; i < kMessages; ++i) {
    forward[i] = socketRandomBytes(sizes[i], 5000 + i);
    backward[i] = socketRandomBytes(sizes[kMessages - 1 - i], 9000 + i);
    forwardIn[i].assign(forward[i].size(), 0);
    backwardIn[i].assign(backward[i].size(), 0);
  }
  for (int i = 0; i < kMessages; ++i) {
    // Receives sometimes trail the sends and sometimes lead them.
    RecvAction into1{forwardIn[i].data()};
    RecvAction into0{backwardIn[i].data()};
    lastForwardSend = c0->postSend(forward[i].data(), forward[i].size());
    lastForwardRecv = c1->postRecv(into1, forwardIn[i].size());
    lastBackwardRecv = c0->postRecv(into0, backwardIn[i].size());
    lastBackwardSend = c1->postSend(backward[i].data(), backward[i].size());
    CHECK(lastForwardSend == Ticket(i + 1));
    if (i % 10 == 0) {
      c0->progress();
      c1->progress();
    }
  }
  driveUntil({c0.get(), c1.get()}, [&] {
    return c0->sendsCompleted() == lastForwardSend && c1->recvsCompleted() == lastForwardRecv &&
           c1->sendsCompleted() == lastBackwardSend && c0->recvsCompleted() == lastBackwardRecv;
  });
  int wrong = 0;
  for (int i = 0; i < kMessages; ++i) wrong += (forwardIn[i] != forward[i]) + (backwardIn[i] != backward[i]);
  CHECK(wrong == 0);
}

TEST_CASE("socket receive with a reduction matches a float sum reference") {
  const auto sum = kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum);
  for (int streams : {1, 3}) {
    StreamCount count(streams);
    const uint64_t hash = socketTestHash();
    SocketRank r0 = makeSocketRank(0, 2, hash);
    SocketRank r1 = makeSocketRank(1, 2, hash);
    auto c0 = r0.transport->connect(r1.info, 0);
    auto c1 = r1.transport->connect(r0.info, 0);
    for (size_t countFloats : {size_t{1}, size_t{1000}, size_t{70001}, size_t{(1 << 20) + 3}}) {
      for (bool inPlace : {false, true}) {
        INFO("streams " << streams << " floats " << countFloats << (inPlace ? " in place" : ""));
        std::mt19937 generator(static_cast<uint32_t>(countFloats));
        std::uniform_real_distribution<float> values(-100.0f, 100.0f);
        std::vector<float> incoming(countFloats), operand(countFloats), expected(countFloats);
        for (auto& v : incoming) v = values(generator);
        for (auto& v : operand) v = values(generator);
        for (size_t i = 0; i < countFloats; ++i) expected[i] = incoming[i] + operand[i];
        std::vector<float> output(countFloats, -1.0f);
        RecvAction action;
        action.dst = inPlace ? operand.data() : output.data();
        action.operand = operand.data();
        action.reduce = sum;
        action.elementSize = sizeof(float);
        const Ticket recv = c1->postRecv(action, countFloats * sizeof(float));
        const Ticket send = c0->postSend(incoming.data(), countFloats * sizeof(float));
        driveUntil({c0.get(), c1.get()}, [&] { return c0->sendsCompleted() == send && c1->recvsCompleted() == recv; });
        CHECK((inPlace ? operand : output) == expected);
      }
    }
  }
}

TEST_CASE("socket size mismatch is an error naming both sizes and the peer") {
  const uint64_t hash = socketTestHash();
  SocketRank r0 = makeSocketRank(0, 2, hash);
  SocketRank r1 = makeSocketRank(1, 2, hash);
  auto c0 = r0.transport->connect(r1.info, 0);
  auto c1 = r1.transport->connect(r0.info, 0);
  std::vector<unsigned char> source(100, 1), sink(64, 0);
  c0->postSend(source.data(), source.size());
  c1->postRecv(RecvAction{sink.data()}, sink.size());
  std::string message;
  try {
    driveUntil({c0.get(), c1.get()}, [] { return false; }, 30s);
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("size mismatch") && Catch::Contains("sent 100 bytes") &&
                          Catch::Contains("receive of 64 bytes") && Catch::Contains("rank 0 (" + r0.info.socketAddress));
  CHECK_THROWS_AS(c1->progress(), Error);  // the connection stays failed
  // The receiver shut its streams down, so a sender still waiting on this connection fails too.
  std::vector<unsigned char> reply(8);
  c0->postRecv(RecvAction{reply.data()}, reply.size());
  CHECK_THROWS_WITH(driveUntil({c0.get()}, [] { return false; }, 30s),
                    Catch::Contains("closed the connection during receive on channel 0"));
}

TEST_CASE("socket receive fails, naming the peer, when the peer closes its connection") {
  const uint64_t hash = socketTestHash();
  SocketRank r0 = makeSocketRank(0, 2, hash);
  SocketRank r1 = makeSocketRank(1, 2, hash);
  auto c0 = r0.transport->connect(r1.info, 1);
  auto c1 = r1.transport->connect(r0.info, 1);
  unsigned char byte = 7, sink = 0;
  const Ticket send = c0->postSend(&byte, 1);
  const Ticket recv = c1->postRecv(RecvAction{&sink}, 1);
  driveUntil({c0.get(), c1.get()}, [&] { return c0->sendsCompleted() == send && c1->recvsCompleted() == recv; });
  CHECK(sink == 7);
  c0.reset();
  c1->postRecv(RecvAction{&sink}, 1);
  try {
    driveUntil({c1.get()}, [] { return false; }, 30s);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    CHECK_THAT(e.what(), Catch::StartsWith("socket peer rank 0 (" + r0.info.socketAddress +
                                           ") closed the connection during receive on channel 1"));
  }
}

TEST_CASE("socket transport refuses a dialler with the wrong secret, then serves the right one") {
  const uint64_t hash = socketTestHash();
  SocketRank r1 = makeSocketRank(1, 2, hash);
  SocketRank imposter = makeSocketRank(0, 2, hash, kSocketTestSecret + 1);
  auto fromImposter = imposter.transport->connect(r1.info, 0);
  auto waiting = r1.transport->connect(imposter.info, 0);
  unsigned char sink[4] = {};
  const Ticket recv = waiting->postRecv(RecvAction{sink}, sizeof(sink));
  const uint32_t value = 0xabcd1234;
  fromImposter->postSend(&value, sizeof(value));
  unsigned char reply = 0;
  fromImposter->postRecv(RecvAction{&reply}, 1);
  // Garbage on the listener is dropped as well.
  bootstrap::FileDescriptor garbage = bootstrap::connectUntil(
      bootstrap::SocketAddress::parse(r1.info.socketAddress), bootstrap::Clock::now() + 5s, "garbage");
  const std::string noise(64, 'z');
  bootstrap::sendAll(garbage.get(), noise.data(), noise.size(), bootstrap::Clock::now() + 5s, "garbage");

  std::string imposterError;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (imposterError.empty() && std::chrono::steady_clock::now() < deadline) {
    r1.transport->progress();
    waiting->progress();
    try {
      fromImposter->progress();
    } catch (const Error& e) {
      imposterError = e.what();
    }
  }
  CHECK_THAT(imposterError, Catch::Contains("closed the connection"));
  CHECK(waiting->recvsCompleted() == 0);

  // The genuine rank 0 gets through on the same listener.
  SocketRank r0 = makeSocketRank(0, 2, hash);
  auto genuine = r0.transport->connect(r1.info, 0);
  const Ticket send = genuine->postSend(&value, sizeof(value));
  driveUntil({genuine.get(), waiting.get()}, [&] { return genuine->sendsCompleted() == send && waiting->recvsCompleted() == recv; });
  uint32_t got = 0;
  std::memcpy(&got, sink, sizeof(got));
  CHECK(got == value);
}

TEST_CASE("socket ranks as threads: three ranks, every pair, each rank progressing alone") {
  constexpr int kRanks = 3;
  StreamCount count(2);
  const uint64_t hash = socketTestHash();
  std::vector<SocketRank> ranks;
  for (int rank = 0; rank < kRanks; ++rank) ranks.push_back(makeSocketRank(rank, kRanks, hash));
  const auto outcomes = testing::runRankThreads(kRanks, [&](int rank) {
    SocketRank& self = ranks[static_cast<size_t>(rank)];
    std::vector<std::unique_ptr<Connection>> connections(kRanks);
    std::vector<std::vector<unsigned char>> sent(kRanks), received(kRanks);
    std::vector<Ticket> lastSend(kRanks, 0), lastRecv(kRanks, 0);
    for (int peer = kRanks - 1; peer >= 0; --peer) {  // connect in an order that differs per rank
      if (peer == rank) continue;
      connections[peer] = self.transport->connect(ranks[static_cast<size_t>(peer)].info, 0);
      sent[peer] = socketRandomBytes(1 << 20, uint64_t(rank * 10 + peer));
      received[peer].assign(1 << 20, 0);
      lastRecv[peer] = connections[peer]->postRecv(RecvAction{received[peer].data()}, received[peer].size());
      lastSend[peer] = connections[peer]->postSend(sent[peer].data(), sent[peer].size());
    }
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    for (bool done = false; !done;) {
      done = true;
      self.transport->progress();
      for (int peer = 0; peer < kRanks; ++peer) {
        if (!connections[peer]) continue;
        connections[peer]->progress();
        done = done && connections[peer]->sendsCompleted() == lastSend[peer] &&
               connections[peer]->recvsCompleted() == lastRecv[peer];
      }
      testing::expectTrue(std::chrono::steady_clock::now() < deadline, "timed out");
    }
    for (int peer = 0; peer < kRanks; ++peer)
      if (peer != rank)
        testing::expectTrue(received[peer] == socketRandomBytes(1 << 20, uint64_t(peer * 10 + rank)),
                            "data from rank " + std::to_string(peer) + " is wrong");
  });
  CHECK(testing::describeOutcomes(outcomes) == "rank 0: ok\nrank 1: ok\nrank 2: ok\n");
}

TEST_CASE("socket connection to oneself loops back") {
  StreamCount count(3);
  SocketRank r0 = makeSocketRank(0, 1, socketTestHash());
  auto loop = r0.transport->connect(r0.info, 0);
  const auto data = socketRandomBytes((1 << 20) + 5, 77);
  std::vector<unsigned char> back(data.size());
  const Ticket recv = loop->postRecv(RecvAction{back.data()}, back.size());
  const Ticket send = loop->postSend(data.data(), data.size());
  driveUntil({loop.get()}, [&] { return loop->sendsCompleted() == send && loop->recvsCompleted() == recv; });
  CHECK(back == data);
}

TEST_CASE("socket ranks as processes exchange data, and a killed peer is an error, not a hang") {
  const uint64_t hash = socketTestHash();
  // Both transports exist before the fork, so each side knows the other's address.
  SocketRank r0 = makeSocketRank(0, 2, hash);
  SocketRank r1 = makeSocketRank(1, 2, hash);
  const PeerInfo info0 = r0.info;
  const PeerInfo info1 = r1.info;
  std::fflush(nullptr);
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Rank 1: exchange, report, then die the hard way.
    r0.transport.reset();
    ::close(ready[0]);
    int status = 1;
    try {
      auto connection = r1.transport->connect(info0, 0);
      const auto outgoing = socketRandomBytes((2 << 20) + 1, 11);
      std::vector<unsigned char> incoming((2 << 20) + 3);
      const Ticket recv = connection->postRecv(RecvAction{incoming.data()}, incoming.size());
      const Ticket send = connection->postSend(outgoing.data(), outgoing.size());
      driveUntil({connection.get()}, [&] { return connection->sendsCompleted() == send && connection->recvsCompleted() == recv; });
      status = incoming == socketRandomBytes((2 << 20) + 3, 10) ? 0 : 2;
    } catch (...) {
      status = 3;
    }
    const char report = static_cast<char>('0' + status);
    (void)!::write(ready[1], &report, 1);
    ::raise(SIGKILL);
    ::_exit(99);
  }
  ::close(ready[1]);
  r1.transport.reset();

  auto connection = r0.transport->connect(info1, 0);
  const auto outgoing = socketRandomBytes((2 << 20) + 3, 10);
  std::vector<unsigned char> incoming((2 << 20) + 1);
  const Ticket recv = connection->postRecv(RecvAction{incoming.data()}, incoming.size());
  const Ticket send = connection->postSend(outgoing.data(), outgoing.size());
  driveUntil({connection.get()}, [&] { return connection->sendsCompleted() == send && connection->recvsCompleted() == recv; });
  CHECK(incoming == socketRandomBytes((2 << 20) + 1, 11));

  char report = 'x';
  CHECK(::read(ready[0], &report, 1) == 1);
  ::close(ready[0]);
  CHECK(report == '0');
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));

  unsigned char sink[16];
  connection->postRecv(RecvAction{sink}, sizeof(sink));
  const auto start = std::chrono::steady_clock::now();
  try {
    driveUntil({connection.get()}, [] { return false; }, 30s);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    CHECK_THAT(e.what(), Catch::StartsWith("socket peer rank 1 (" + info1.socketAddress +
                                           ") closed the connection during receive on channel 0"));
  }
  CHECK(std::chrono::steady_clock::now() - start < 30s);
}

TEST_CASE("socket handshake gives up after TOPOCCL_TIMEOUT_MS, naming the peer") {
  config::setOverride("TOPOCCL_TIMEOUT_MS", "300");
  const uint64_t hash = socketTestHash();
  SocketRank r0 = makeSocketRank(0, 2, hash);
  SocketRank r1 = makeSocketRank(1, 2, hash);
  SECTION("the dialler never comes") {
    auto waiting = r1.transport->connect(r0.info, 0);
    CHECK_THROWS_WITH(driveUntil({waiting.get()}, [] { return false; }, 30s),
                      Catch::Contains("socket peer rank 0 (" + r0.info.socketAddress + ") never connected"));
  }
  SECTION("nobody listens where the peer said it would") {
    PeerInfo gone = r1.info;
    r1.transport.reset();  // closes its listener
    auto dialling = r0.transport->connect(gone, 0);
    CHECK_THROWS_WITH(driveUntil({dialling.get()}, [] { return false; }, 30s),
                      Catch::Contains("cannot connect to socket peer rank 1 (" + gone.socketAddress + ")"));
  }
  config::setOverride("TOPOCCL_TIMEOUT_MS", std::nullopt);
}
