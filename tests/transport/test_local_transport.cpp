// The local transport between ranks that are threads of this process.
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "kernels/host_reduce.hpp"
#include "transport/local/local_transport.hpp"

using namespace topoccl;
using namespace topoccl::transport;

namespace {

uint64_t freshCommHash() {
  static std::atomic<uint64_t> counter{0};
  return (std::random_device{}() * 0x9e3779b97f4a7c15ull) ^ (++counter << 32);
}

PeerInfo localPeer(int rank) {
  PeerInfo info;
  info.rank = rank;
  info.hostId = "host";
  info.pid = 1;
  info.processToken = 42;
  return info;
}

std::vector<unsigned char> randomBytes(size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> data(bytes);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  return data;
}

// Polls until `done` holds; a stuck transfer fails the test instead of hanging it.
void pollUntil(const std::vector<Connection*>& connections, const std::function<bool()>& done,
               std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    for (Connection* c : connections) c->progress();
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("timed out waiting for the transfer");
    std::this_thread::yield();
  }
}

// Runs one body per rank on its own thread; the first exception is rethrown here, where Catch
// assertions are safe.
void runRanks(const std::vector<std::function<void(int)>>& bodies) {
  std::vector<std::exception_ptr> errors(bodies.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < bodies.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        bodies[r](static_cast<int>(r));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

const std::vector<size_t> kSizes = {0, 1, 7, 13, 97, 1021, 4096, 65537, 3 * 1024 * 1024 + 5};

}  // namespace

TEST_CASE("local transport connects threads of one process only") {
  auto transport = makeLocalTransport({freshCommHash(), 0, 0, 2});
  CHECK(std::string(transport->name()) == "local");
  PeerInfo a = localPeer(0), b = localPeer(1);
  CHECK(transport->canConnect(a, b));
  b.processToken = 43;
  CHECK_FALSE(transport->canConnect(a, b));
}

TEST_CASE("local transport moves random payloads both ways at once") {
  const uint64_t hash = freshCommHash();
  std::vector<std::vector<unsigned char>> received[2];
  auto body = [&](int rank) {
    auto transport = makeLocalTransport({hash, 0, rank, 2});
    auto connection = transport->connect(localPeer(1 - rank), 0);
    std::vector<std::vector<unsigned char>> outgoing;
    for (size_t i = 0; i < kSizes.size(); ++i) outgoing.push_back(randomBytes(kSizes[i], rank * 1000 + i));
    received[rank].resize(kSizes.size());
    Ticket lastSend = 0, lastRecv = 0;
    for (size_t i = 0; i < kSizes.size(); ++i) {
      received[rank][i].assign(kSizes[i], 0);
      RecvAction action;
      action.dst = received[rank][i].data();
      lastRecv = connection->postRecv(action, kSizes[i]);
      lastSend = connection->postSend(outgoing[i].data(), outgoing[i].size());
    }
    pollUntil({connection.get()}, [&] {
      return connection->sendsCompleted() == lastSend && connection->recvsCompleted() == lastRecv;
    });
  };
  runRanks({body, body});
  for (int rank = 0; rank < 2; ++rank)
    for (size_t i = 0; i < kSizes.size(); ++i) {
      INFO("rank " << rank << " message " << i << " of " << kSizes[i] << " bytes");
      CHECK(received[rank][i] == randomBytes(kSizes[i], (1 - rank) * 1000 + i));
    }
}

TEST_CASE("local sends complete only once the receiver has read them (zero copy)") {
  const uint64_t hash = freshCommHash();
  auto t0 = makeLocalTransport({hash, 0, 0, 2});
  auto t1 = makeLocalTransport({hash, 0, 1, 2});
  auto c0 = t0->connect(localPeer(1), 0);
  auto c1 = t1->connect(localPeer(0), 0);
  std::vector<unsigned char> source = randomBytes(1000, 7), sink(1000, 0);
  const Ticket sent = c0->postSend(source.data(), source.size());
  for (int i = 0; i < 10; ++i) {
    c0->progress();
    c1->progress();
  }
  CHECK(c0->sendsCompleted() == 0);
  RecvAction action;
  action.dst = sink.data();
  const Ticket got = c1->postRecv(action, sink.size());
  pollUntil({c0.get(), c1.get()}, [&] { return c0->sendsCompleted() == sent && c1->recvsCompleted() == got; });
  CHECK(sink == source);
  CHECK(c1->describe() == "local to rank 0 channel 0");
  CHECK(std::string(c1->transportName()) == "local");
  CHECK(c1->peer() == 0);
}

TEST_CASE("local receive can reduce straight out of the sender's buffer") {
  const uint64_t hash = freshCommHash();
  const auto sum = kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum);
  const size_t count = 100003;
  std::vector<float> incoming(count), operand(count), out(count, -1.0f), inPlace(count);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-10.0f, 10.0f);
  for (size_t i = 0; i < count; ++i) {
    incoming[i] = dist(rng);
    operand[i] = dist(rng);
  }
  inPlace = operand;
  runRanks({[&](int rank) {
              auto transport = makeLocalTransport({hash, 0, rank, 2});
              auto c = transport->connect(localPeer(1), 0);
              c->postSend(incoming.data(), count * sizeof(float));
              const Ticket last = c->postSend(incoming.data(), count * sizeof(float));
              pollUntil({c.get()}, [&] { return c->sendsCompleted() == last; });
            },
            [&](int rank) {
              auto transport = makeLocalTransport({hash, 0, rank, 2});
              auto c = transport->connect(localPeer(0), 0);
              c->postRecv({out.data(), operand.data(), sum, sizeof(float)}, count * sizeof(float));
              const Ticket last = c->postRecv({inPlace.data(), inPlace.data(), sum, sizeof(float)}, count * sizeof(float));
              pollUntil({c.get()}, [&] { return c->recvsCompleted() == last; });
            }});
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const float expected = incoming[i] + operand[i];
    if (out[i] != expected || inPlace[i] != expected) ++wrong;
  }
  CHECK(wrong == 0);
}

TEST_CASE("local transport keeps many messages in order on two independent channels") {
  const uint64_t hash = freshCommHash();
  const int messages = 2000;
  std::vector<uint32_t> got[2];
  runRanks({[&](int rank) {
              auto transport = makeLocalTransport({hash, 0, rank, 2});
              auto ch0 = transport->connect(localPeer(1), 0);
              auto ch1 = transport->connect(localPeer(1), 1);
              std::vector<uint32_t> values(2 * messages);
              for (int i = 0; i < messages; ++i) {
                values[2 * i] = static_cast<uint32_t>(i);
                values[2 * i + 1] = static_cast<uint32_t>(1000000 + i);
                ch0->postSend(&values[2 * i], sizeof(uint32_t));
                ch1->postSend(&values[2 * i + 1], sizeof(uint32_t));
              }
              pollUntil({ch0.get(), ch1.get()}, [&] {
                return ch0->sendsCompleted() == Ticket(messages) && ch1->sendsCompleted() == Ticket(messages);
              });
            },
            [&](int rank) {
              auto transport = makeLocalTransport({hash, 0, rank, 2});
              auto ch1 = transport->connect(localPeer(0), 1);  // the other order on purpose
              auto ch0 = transport->connect(localPeer(0), 0);
              got[0].assign(messages, 0);
              got[1].assign(messages, 0);
              for (int i = 0; i < messages; ++i) {
                RecvAction a0, a1;
                a0.dst = &got[0][i];
                a1.dst = &got[1][i];
                ch0->postRecv(a0, sizeof(uint32_t));
                ch1->postRecv(a1, sizeof(uint32_t));
              }
              pollUntil({ch0.get(), ch1.get()}, [&] {
                return ch0->recvsCompleted() == Ticket(messages) && ch1->recvsCompleted() == Ticket(messages);
              });
            }});
  bool inOrder = true;
  for (int i = 0; i < messages; ++i)
    inOrder = inOrder && got[0][i] == uint32_t(i) && got[1][i] == uint32_t(1000000 + i);
  CHECK(inOrder);
}

TEST_CASE("local size mismatch fails both ends with both sizes named") {
  const uint64_t hash = freshCommHash();
  auto t0 = makeLocalTransport({hash, 0, 0, 2});
  auto t1 = makeLocalTransport({hash, 0, 1, 2});
  auto sender = t0->connect(localPeer(1), 0);
  auto receiver = t1->connect(localPeer(0), 0);
  std::vector<unsigned char> source(100, 1), sink(64, 0);
  sender->postSend(source.data(), source.size());
  RecvAction action;
  action.dst = sink.data();
  receiver->postRecv(action, sink.size());
  try {
    receiver->progress();
    FAIL("expected a size mismatch error");
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    const std::string what = e.what();
    CHECK(what.find("64") != std::string::npos);
    CHECK(what.find("100") != std::string::npos);
    CHECK(what.find("rank 0") != std::string::npos);
  }
  CHECK_THROWS_AS(sender->progress(), Error);
}

TEST_CASE("local receive fails when the peer closes its connection") {
  const uint64_t hash = freshCommHash();
  auto t0 = makeLocalTransport({hash, 0, 0, 2});
  auto t1 = makeLocalTransport({hash, 0, 1, 2});
  auto c0 = t0->connect(localPeer(1), 0);
  auto c1 = t1->connect(localPeer(0), 0);
  std::vector<unsigned char> sink(10);
  RecvAction action;
  action.dst = sink.data();
  c0->postRecv(action, sink.size());
  c0->progress();
  c1.reset();
  try {
    c0->progress();
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    CHECK(std::string(e.what()).find("rank 1") != std::string::npos);
  }
}

TEST_CASE("local transport refuses a second connection on the same channel") {
  const uint64_t hash = freshCommHash();
  auto t0 = makeLocalTransport({hash, 0, 0, 2});
  auto first = t0->connect(localPeer(1), 0);
  CHECK_THROWS_AS(t0->connect(localPeer(1), 0), Error);
  auto other = t0->connect(localPeer(1), 1);  // another channel is fine
  first.reset();
  auto again = t0->connect(localPeer(1), 0);  // and the channel is free again once closed
  CHECK(again->peer() == 1);
}

TEST_CASE("local ranks asleep on their doorbells are woken by every post and consume of the peer") {
  const uint64_t hash = freshCommHash();
  const std::vector<size_t> sizes = {0, 13, 4096, 65537};
  // Round 0: rank 0 sleeps while rank 1 starts 100 ms late; round 1 the other way round.
  const auto body = [&](int rank) {
              auto transport = makeLocalTransport({hash, 0, rank, 2});
              auto connection = transport->connect(localPeer(1 - rank), 0);
              for (int round = 0; round < 2; ++round) {
                const bool sleeper = rank == round;
                if (!sleeper) std::this_thread::sleep_for(std::chrono::milliseconds(100));
                std::vector<std::vector<unsigned char>> outgoing, incoming(sizes.size());
                Ticket lastSend = 0, lastRecv = 0;
                for (size_t i = 0; i < sizes.size(); ++i) {
                  outgoing.push_back(randomBytes(sizes[i], hash + uint64_t(round * 1000 + rank * 100) + i));
                  incoming[i].assign(sizes[i], 0xEE);
                  RecvAction action;
                  action.dst = incoming[i].data();
                  lastRecv = connection->postRecv(action, sizes[i]);
                  lastSend = connection->postSend(outgoing[i].data(), sizes[i]);
                }
                const auto done = [&] { return connection->sendsCompleted() == lastSend && connection->recvsCompleted() == lastRecv; };
                if (sleeper) {
                  // Arm, look once more, sleep: a post or consume that forgot to ring would sleep the full minute.
                  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
                  int sleeps = 0;
                  std::vector<ArmedDoorbell> armed;
                  for (connection->progress(); !done(); connection->progress()) {
                    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("a sleeper was never woken");
                    if (!connection->armDoorbells(armed)) throw std::runtime_error("local connections can always be slept on");
                    sealArming(armed);
                    connection->progress();
                    if (done()) {
                      disarm(armed);
                      break;
                    }
                    sleepUntilRung(armed, std::chrono::seconds(60));
                    ++sleeps;
                  }
                  if (sleeps == 0) throw std::runtime_error("the sleeper never slept: the test did not test the wake-ups");
                } else {
                  pollUntil({connection.get()}, done);
                }
                for (size_t i = 0; i < sizes.size(); ++i)
                  if (incoming[i] != randomBytes(sizes[i], hash + uint64_t(round * 1000 + (1 - rank) * 100) + i))
                    throw std::runtime_error("rank " + std::to_string(rank) + ": message of " + std::to_string(sizes[i]) + " bytes differs");
              }
  };
  runRanks({body, body});
}
