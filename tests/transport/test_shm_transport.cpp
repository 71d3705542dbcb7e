// The shm transport between forked processes. Rank 0 is the test process, rank 1 a child that
// runs its side of the exchange and reports through its exit status and a pipe; the child always
// leaves with _exit so it never returns into Catch.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "common/config.hpp"
#include "common/error.hpp"
#include "kernels/host_reduce.hpp"
#include "transport/shm/shared_allocation.hpp"
#include "transport/shm/shm_layout.hpp"
#include "transport/shm/shm_transport.hpp"

using namespace topoccl;
using namespace topoccl::transport;
using namespace std::chrono_literals;

namespace {

uint64_t freshCommHash() {
  static std::atomic<uint64_t> counter{0};
  return (uint64_t(std::random_device{}()) << 20) ^ (++counter << 52) ^ uint64_t(::getpid());
}

PeerInfo processPeer(int rank, pid_t pid) {
  PeerInfo info;
  info.rank = rank;
  info.hostId = "test-host";
  info.pid = pid;
  info.processToken = 1000 + uint64_t(rank);
  return info;
}

std::vector<unsigned char> randomBytes(size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> data(bytes);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  for (; i < bytes; ++i) data[i] = static_cast<unsigned char>(rng());
  return data;
}

std::vector<float> randomFloats(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  std::vector<float> data(count);
  for (auto& v : data) v = dist(rng);
  return data;
}

// `bytes` (a multiple of 4) of random floats, never NaN, as bytes.
std::vector<unsigned char> floatBytes(size_t bytes, uint64_t seed) {
  const std::vector<float> floats = randomFloats(bytes / sizeof(float), static_cast<uint32_t>(seed));
  std::vector<unsigned char> data(bytes);
  std::memcpy(data.data(), floats.data(), bytes);
  return data;
}

// Polls until `done` holds; a stuck transfer fails instead of hanging the suite.
void pollUntil(const std::vector<Connection*>& connections, const std::function<bool()>& done,
               std::chrono::seconds limit = 60s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    for (Connection* c : connections) c->progress();
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("timed out waiting for the transfer");
  }
}

// Receives one plain message of `bytes` and returns it.
std::vector<unsigned char> receiveOne(Connection& connection, size_t bytes) {
  std::vector<unsigned char> sink(bytes);
  RecvAction action;
  action.dst = sink.data();
  const Ticket t = connection.postRecv(action, bytes);
  pollUntil({&connection}, [&] { return connection.recvsCompleted() == t; });
  return sink;
}

void childCheck(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

// One message the receiver expects: the bytes the sender sent.
struct ExpectedMessage {
  const unsigned char* source;
  size_t bytes;
};

// Posts a receive for each message (plain, or adding floats drawn from operandSeed + i), waits for all of them
// and checks each against what was sent (reductions bitwise, NaN patterns included).
void receiveAndCheck(Connection& connection, const std::vector<ExpectedMessage>& expected, bool reduce, uint32_t operandSeed) {
  const auto sum = kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum);
  std::vector<std::vector<unsigned char>> outputs;
  std::vector<std::vector<float>> operands;
  Ticket last = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    outputs.emplace_back(expected[i].bytes, 0xEE);
    RecvAction action;
    action.dst = outputs.back().data();
    if (reduce) {
      operands.push_back(randomFloats(expected[i].bytes / sizeof(float), uint32_t(operandSeed + i)));
      action.operand = operands.back().data();
      action.reduce = sum;
      action.elementSize = sizeof(float);
    }
    last = connection.postRecv(action, expected[i].bytes);
  }
  pollUntil({&connection}, [&] { return connection.recvsCompleted() == last; });
  for (size_t i = 0; i < expected.size(); ++i) {
    INFO("message " << i << " of " << expected[i].bytes << " bytes");
    if (!reduce) {
      CHECK(std::memcmp(outputs[i].data(), expected[i].source, expected[i].bytes) == 0);
      continue;
    }
    size_t wrong = 0;
    for (size_t k = 0; k < expected[i].bytes / sizeof(float); ++k) {
      float incoming, got;
      std::memcpy(&incoming, expected[i].source + k * sizeof(float), sizeof(float));
      std::memcpy(&got, outputs[i].data() + k * sizeof(float), sizeof(float));
      const float want = incoming + operands[i][k];
      if (std::memcmp(&got, &want, sizeof(float)) != 0) ++wrong;
    }
    CHECK(wrong == 0);
  }
}

struct Child {
  pid_t pid = -1;
  int reportFd = -1;  // the child's failure text, if any
};

// Forks rank 1. `body(self, peer)` runs in the child; returning means success, throwing means
// failure with the exception's text.
Child startChild(const std::function<void(const PeerInfo& self, const PeerInfo& peer)>& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    int status = 0;
    std::string why;
    try {
      body(processPeer(1, ::getpid()), processPeer(0, parent));
    } catch (const std::exception& e) {
      why = e.what();
      status = 1;
    } catch (...) {
      why = "unknown exception";
      status = 1;
    }
    if (!why.empty()) (void)!::write(fds[1], why.data(), why.size());
    ::_exit(status);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

// Forks rank 1 to post `count` sends on channel 0 at once, message m made by `message(m)`, and wait until all completed.
Child startSendingChild(uint64_t hash, size_t count, const std::function<std::vector<unsigned char>(size_t)>& message,
                        std::chrono::seconds limit = 60s) {
  return startChild([=](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    std::vector<std::vector<unsigned char>> data;
    Ticket last = 0;
    for (size_t m = 0; m < count; ++m) {
      data.push_back(message(m));
      last = connection->postSend(data.back().data(), data.back().size());  // all at once: the slots may run out
    }
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == last; }, limit);
  });
}

// Reaps the child (killing it if it overstays) and returns what it reported: "" on success.
std::string finishChild(const Child& child, std::chrono::seconds limit = 120s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(child.pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child.pid, SIGKILL);
      ::waitpid(child.pid, &status, 0);
      ::close(child.reportFd);
      return "child did not finish in time";
    }
    std::this_thread::sleep_for(5ms);
  }
  std::string report;
  char buffer[512];
  ssize_t n;
  while ((n = ::read(child.reportFd, buffer, sizeof(buffer))) > 0) report.append(buffer, size_t(n));
  ::close(child.reportFd);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (report.empty()) report = WIFSIGNALED(status) ? "child killed by signal " + std::to_string(WTERMSIG(status)) : "child failed";
  return report;
}

std::vector<std::string> leftoverSegments(uint64_t hash) {
  const std::string prefix = shmSegmentName(hash, 0, 0, 0).substr(1, 8 + 1 + 16);  // "topoccl-<hash>"
  std::vector<std::string> found;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (const dirent* entry = ::readdir(dir))
      if (std::string(entry->d_name).rfind(prefix, 0) == 0) found.push_back(entry->d_name);
    ::closedir(dir);
  }
  return found;
}

// A file in /dev/shm under a segment's name that holds no segment: 8 KiB of 0x5a.
void writeJunkSegment(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  std::vector<unsigned char> junk(8192, 0x5a);
  REQUIRE(::write(fd, junk.data(), junk.size()) == ssize_t(junk.size()));
  ::close(fd);
}

// A sender's two shared allocations (ncclMemAlloc) for mirrored sends: `source` holds `content`, randomBytes(bytes,
// seed); `mirror` is 0xA5 throughout. Freed on scope exit.
struct MirroredSendBuffers {
  MirroredSendBuffers(size_t bytes, uint64_t seed)
      : source(static_cast<unsigned char*>(allocateShared(bytes))),
        mirror(static_cast<unsigned char*>(allocateShared(bytes))),
        content(randomBytes(bytes, seed)) {
    std::memcpy(source, content.data(), bytes);
    std::memset(mirror, 0xA5, bytes);
  }
  ~MirroredSendBuffers() {
    freeShared(source);
    freeShared(mirror);
  }
  MirroredSendBuffers(const MirroredSendBuffers&) = delete;
  MirroredSendBuffers& operator=(const MirroredSendBuffers&) = delete;
  unsigned char* const source;
  unsigned char* const mirror;
  const std::vector<unsigned char> content;
};

// Settings that shape the tests: a small FIFO (4 descriptors, a 16 KiB ring in fragments of up to 4 KiB)
// so that messages larger than the FIFO stay below the CMA threshold.
struct SmallFifo {
  explicit SmallFifo(bool cmaDisabled, int descriptors = 4) {
    config::clearOverrides();
    config::setOverride("NCCL_BUFFSIZE", "16384");
    config::setOverride("TOPOCCL_SHM_SLOTS", std::to_string(descriptors));
    config::setOverride("TOPOCCL_SHM_FRAGMENTS", "4");
    config::setOverride("TOPOCCL_SHM_CMA", cmaDisabled ? "0" : "1");
  }
  ~SmallFifo() { config::clearOverrides(); }
};

constexpr size_t kSlot = 4096;
constexpr size_t kFifo = 4 * kSlot;
constexpr size_t kCmaThreshold = 65536;  // params default

std::vector<size_t> awkwardSizes() {
  return {0,         1,         7,          13,       127,      4093 /* prime */, kSlot - 1, kSlot,
          kSlot + 1, kFifo - 1, kFifo,      kFifo + 1, 3 * kFifo + 17, 65521 /* prime */, kCmaThreshold,
          kCmaThreshold + 1,    5 * 1024 * 1024 + 3};
}

// Both ranks send the whole list to each other at the same time and check what arrives.
void exchangeBothWays(Connection& connection, int rank, uint64_t seedBase, std::vector<std::vector<unsigned char>>& received) {
  const auto sizes = awkwardSizes();
  std::vector<std::vector<unsigned char>> outgoing;
  for (size_t i = 0; i < sizes.size(); ++i) outgoing.push_back(randomBytes(sizes[i], seedBase + rank * 100 + i));
  received.assign(sizes.size(), {});
  Ticket lastSend = 0, lastRecv = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    received[i].assign(sizes[i], 0xEE);
    RecvAction action;
    action.dst = received[i].data();
    lastRecv = connection.postRecv(action, sizes[i]);
    lastSend = connection.postSend(outgoing[i].data(), sizes[i]);
  }
  pollUntil({&connection}, [&] { return connection.sendsCompleted() == lastSend && connection.recvsCompleted() == lastRecv; });
}

}  // namespace

TEST_CASE("shm transport reaches other processes of the same host only") {
  auto transport = makeShmTransport({1, 2, 0, 2}, processPeer(0, ::getpid()));
  CHECK(std::string(transport->name()) == "shm");
  PeerInfo self = processPeer(0, ::getpid()), other = processPeer(1, 12345);
  CHECK(transport->canConnect(self, other));
  other.processToken = self.processToken;
  CHECK_FALSE(transport->canConnect(self, other));  // same process: the local transport's job
  other = processPeer(1, 12345);
  other.hostId = "elsewhere";
  CHECK_FALSE(transport->canConnect(self, other));
}

TEST_CASE("shm FIFO layout follows TOPOCCL_SHM_SLOTS, NCCL_BUFFSIZE and TOPOCCL_SHM_FRAGMENTS") {
  SmallFifo settings(false);
  const ShmFifoLayout layout = shmFifoLayout();
  CHECK(layout.descriptorCount == 4);
  CHECK(layout.payloadBytes == kFifo);
  CHECK(layout.fragmentBytes == kSlot);
  config::setOverride("NCCL_BUFFSIZE", "1000");
  CHECK(shmFifoLayout().payloadBytes == 960);  // rounded down to whole cache lines
  CHECK(shmFifoLayout().fragmentBytes == 192);
  config::setOverride("NCCL_BUFFSIZE", "100");
  CHECK_THROWS_WITH(shmFifoLayout(), Catch::Contains("NCCL_BUFFSIZE=100"));
  config::setOverride("NCCL_BUFFSIZE", "16384");
  config::setOverride("TOPOCCL_SHM_FRAGMENTS", "1");  // a fragment must leave room for the next one
  CHECK_THROWS_WITH(shmFifoLayout(), Catch::Contains("TOPOCCL_SHM_FRAGMENTS=1"));
  config::setOverride("TOPOCCL_SHM_FRAGMENTS", "4");
  config::setOverride("TOPOCCL_SHM_SLOTS", "0");
  CHECK_THROWS_WITH(shmFifoLayout(), Catch::Contains("TOPOCCL_SHM_SLOTS=0"));
}

TEST_CASE("shm moves random payloads of awkward sizes both ways at once") {
  const bool cmaDisabled = GENERATE(false, true);
  INFO((cmaDisabled ? "FIFO only (TOPOCCL_SHM_CMA=0)" : "CMA for large messages where permitted"));
  SmallFifo settings(cmaDisabled);  // set before fork: the child inherits it
  const uint64_t hash = freshCommHash();
  const uint64_t seed = hash & 0xffff;
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    std::vector<std::vector<unsigned char>> received;
    exchangeBothWays(*connection, 1, seed, received);
    const auto sizes = awkwardSizes();
    for (size_t i = 0; i < sizes.size(); ++i)
      childCheck(received[i] == randomBytes(sizes[i], seed + 0 * 100 + i), "child: message " + std::to_string(i) + " of " +
                                                                               std::to_string(sizes[i]) + " bytes differs");
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  std::vector<std::vector<unsigned char>> received;
  exchangeBothWays(*connection, 0, seed, received);
  const auto sizes = awkwardSizes();
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("message " << i << " of " << sizes[i] << " bytes");
    CHECK(received[i] == randomBytes(sizes[i], seed + 1 * 100 + i));
  }
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  CHECK(stats.established);
  CHECK(stats.fifoMessagesReceived + stats.cmaMessagesReceived == sizes.size());
  if (cmaDisabled) {
    CHECK_FALSE(stats.cmaReceive);
    CHECK(stats.cmaMessagesReceived == 0);
  } else if (stats.cmaReceive) {
    CHECK(stats.cmaMessagesReceived == 3);  // the sizes at or above the threshold
  } else {
    WARN("process_vm_readv is not permitted here; large messages went through the FIFO");
  }
  CHECK(finishChild(child) == "");
  CHECK(connection->describe() == "shm to rank 1 (pid " + std::to_string(child.pid) + ") channel 0");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm receive reduces floats straight out of the FIFO and through CMA") {
  const bool cmaDisabled = GENERATE(false, true);
  INFO((cmaDisabled ? "FIFO only" : "CMA where permitted"));
  SmallFifo settings(cmaDisabled);
  const uint64_t hash = freshCommHash();
  const std::vector<size_t> counts = {1, 1000, 1024, 1025, 5003, 16411, 1 << 20};  // up to 4 MiB
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    std::vector<std::vector<float>> data;
    Ticket last = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      data.push_back(randomFloats(counts[i], uint32_t(10 + i)));
      last = connection->postSend(data.back().data(), counts[i] * sizeof(float));
      last = connection->postSend(data.back().data(), counts[i] * sizeof(float));  // once more, for in place
    }
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == last; });
  });
  const auto sum = kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum);
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  std::vector<std::vector<float>> operands, outputs, inPlace;
  Ticket last = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    operands.push_back(randomFloats(counts[i], uint32_t(500 + i)));
    outputs.emplace_back(counts[i], -1.0f);
    inPlace.push_back(operands.back());
  }
  for (size_t i = 0; i < counts.size(); ++i) {
    connection->postRecv({outputs[i].data(), operands[i].data(), sum, sizeof(float)}, counts[i] * sizeof(float));
    last = connection->postRecv({inPlace[i].data(), inPlace[i].data(), sum, sizeof(float)}, counts[i] * sizeof(float));
  }
  pollUntil({connection.get()}, [&] { return connection->recvsCompleted() == last; });
  for (size_t i = 0; i < counts.size(); ++i) {
    const std::vector<float> incoming = randomFloats(counts[i], uint32_t(10 + i));
    size_t wrong = 0;
    for (size_t k = 0; k < counts[i]; ++k) {
      const float expected = incoming[k] + operands[i][k];
      if (outputs[i][k] != expected || inPlace[i][k] != expected) ++wrong;
    }
    INFO(counts[i] << " floats");
    CHECK(wrong == 0);
  }
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm keeps thousands of small messages in order on two channels") {
  // 4 descriptors: the descriptors run out first. 512: the 16 KiB payload ring does, and wraps
  // hundreds of times, with fragments that would cross its end starting over at its beginning.
  const int descriptors = GENERATE(4, 512);
  INFO(descriptors << " descriptors");
  SmallFifo settings(false, descriptors);
  const uint64_t hash = freshCommHash();
  const int messages = 3000;
  auto payloadOf = [](int channel, int i) {
    const size_t size = i % 7 == 0 ? size_t(1 + (i * 131) % 9000) : size_t(1 + (i * 37) % 300);  // some span fragments
    std::vector<unsigned char> bytes(size, static_cast<unsigned char>(i * 7 + channel));
    std::memcpy(bytes.data(), &i, std::min(sizeof(int), bytes.size()));
    bytes.back() = static_cast<unsigned char>(channel);
    return bytes;
  };
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    std::this_thread::sleep_for(200ms);  // connect late: the parent is already polling
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto ch1 = transport->connect(peer, 1);  // the other order from the parent's
    auto ch0 = transport->connect(peer, 0);
    std::vector<std::vector<unsigned char>> data[2];
    for (int i = 0; i < messages; ++i) {
      for (int c = 0; c < 2; ++c) data[c].push_back(payloadOf(c, i));
      ch0->postSend(data[0].back().data(), data[0].back().size());
      ch1->postSend(data[1].back().data(), data[1].back().size());
    }
    pollUntil({ch0.get(), ch1.get()}, [&] {
      return ch0->sendsCompleted() == Ticket(messages) && ch1->sendsCompleted() == Ticket(messages);
    });
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto ch0 = transport->connect(processPeer(1, child.pid), 0);
  auto ch1 = transport->connect(processPeer(1, child.pid), 1);
  std::vector<std::vector<unsigned char>> got[2];
  for (int c = 0; c < 2; ++c) {
    got[c].resize(messages);
    for (int i = 0; i < messages; ++i) got[c][i].assign(payloadOf(c, i).size(), 0);
  }
  for (int i = 0; i < messages; ++i) {
    RecvAction a0, a1;
    a0.dst = got[0][i].data();
    a1.dst = got[1][i].data();
    CHECK(ch0->postRecv(a0, got[0][i].size()) == Ticket(i + 1));
    ch1->postRecv(a1, got[1][i].size());
  }
  pollUntil({ch0.get(), ch1.get()}, [&] {
    return ch0->recvsCompleted() == Ticket(messages) && ch1->recvsCompleted() == Ticket(messages);
  });
  int wrong = 0;
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < messages; ++i) wrong += got[c][i] != payloadOf(c, i);
  CHECK(wrong == 0);
  CHECK(finishChild(child) == "");
  ch0.reset();
  ch1.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm messages sent and received at post keep their order with queued ones") {
  // postSend publishes a message that fits in slots (up to 536 bytes) itself when nothing is queued before it and its
  // slots are free; postRecv takes one that is already there when no receive is queued before it. Both must
  // interleave with the queues, and with larger messages, which always queue.
  SmallFifo settings(false, 16);  // 16 slots: the sender often finds them full
  const uint64_t hash = freshCommHash();
  const uint64_t seed = std::random_device{}();
  INFO("seed " << seed);
  const int messages = 3000;
  const std::vector<size_t> sizes = {0, 1, 4, 8, 31, 32, 33, 100, 535, 536, 537, 4099};
  constexpr size_t kInSlots = 536;  // 32 bytes in the descriptor and 56 in each of 9 more slots; larger ones use the ring
  const auto sizeOf = [&](int i) { return sizes[std::mt19937_64(seed + uint64_t(i))() % sizes.size()]; };
  const auto payloadOf = [&](int i) { return randomBytes(sizeOf(i), seed * 31 + uint64_t(i)); };
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    std::mt19937_64 rng(seed ^ 0x5eedull);
    std::vector<std::vector<unsigned char>> data;
    data.reserve(messages);
    int atPost = 0, queued = 0;
    for (int i = 0; i < messages; ++i) {
      data.push_back(payloadOf(i));
      const Ticket t = connection->postSend(data.back().data(), data.back().size());
      if (data.back().size() <= kInSlots) (connection->sendsCompleted() >= t ? atPost : queued) += 1;
      if (rng() % 2 == 0) connection->progress();
      if (i % 200 == 199) {  // all out, then a pause: the receiver catches up and waits, so its receives queue
        pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == t; });
        std::this_thread::sleep_for(2ms);
      }
    }
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == Ticket(messages); });
    childCheck(atPost > 0 && queued > 0, "child: " + std::to_string(atPost) + " sends published at post, " +
                                             std::to_string(queued) + " queued: both paths should have run");
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  std::mt19937_64 rng(seed ^ 0xfeedull);
  std::vector<std::vector<unsigned char>> got(messages);
  int atPost = 0, queued = 0;
  for (int i = 0; i < messages;) {
    if (rng() % 16 == 0) std::this_thread::sleep_for(1ms);  // the sender fills the FIFO: the next receives find data
    const int batch = std::min(messages - i, 1 + int(rng() % 3));
    Ticket last = 0;
    for (int k = 0; k < batch; ++k, ++i) {
      got[i].assign(sizeOf(i), 0xee);
      RecvAction action;
      action.dst = got[i].data();
      last = connection->postRecv(action, got[i].size());
      REQUIRE(last == Ticket(i + 1));
      if (got[i].size() <= kInSlots) (connection->recvsCompleted() >= last ? atPost : queued) += 1;
    }
    pollUntil({connection.get()}, [&] { return connection->recvsCompleted() == last; });
  }
  int wrong = 0;
  for (int i = 0; i < messages; ++i) wrong += got[i] != payloadOf(i);
  CHECK(wrong == 0);
  CHECK(atPost > 0);
  CHECK(queued > 0);
  CHECK(shmConnectionStats(*connection).fifoMessagesReceived == uint64_t(messages));
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm small messages span the descriptor slots after their own") {
  // 3 slots: messages of up to 2 continuation slots go in slots, larger ones through the ring. 16: 10-slot messages
  // wrap the descriptor array's end. 256: the default.
  const int descriptors = GENERATE(3, 16, 256);
  const bool reduce = GENERATE(false, true);
  INFO(descriptors << " descriptors, " << (reduce ? "receives that reduce floats" : "plain receives"));
  SmallFifo settings(true, descriptors);
  const uint64_t hash = freshCommHash();
  // Around every slot boundary (32 B in the descriptor, 56 B per continuation slot, at most 536 B), and past it.
  std::vector<size_t> sizes = {0, 4, 32, 36, 88, 92, 144, 148, 200, 480, 532, 536, 540, 1000};
  if (!reduce) sizes.insert(sizes.end(), {1, 31, 33, 87, 89, 143, 145, 535, 537});
  std::vector<size_t> order;
  for (int lap = 0; lap < 40; ++lap)
    for (size_t i = 0; i < sizes.size(); ++i) order.push_back((i * 7 + size_t(lap)) % sizes.size());
  const uint64_t seed = hash & 0xffff;
  const Child child = startSendingChild(hash, order.size(), [&](size_t m) { return randomBytes(sizes[order[m]], seed + m); });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  std::vector<std::vector<unsigned char>> sent;
  std::vector<ExpectedMessage> expected;
  size_t spanning = 0;
  for (size_t m = 0; m < order.size(); ++m) {
    sent.push_back(randomBytes(sizes[order[m]], seed + m));
    expected.push_back({sent.back().data(), sent.back().size()});
    const size_t bytes = sizes[order[m]];
    const size_t continuations = bytes <= 32 ? 0 : (bytes - 32 + 55) / 56;
    spanning += continuations > 0 && continuations <= 9 && continuations < size_t(descriptors);
  }
  receiveAndCheck(*connection, expected, reduce, 1300);
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  CHECK(stats.fifoMessagesReceived == order.size());
  CHECK(stats.slotMessagesReceived == spanning);
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm small messages that span slots are reduced where they land at every element size") {
  // The receiver reduces each slot's piece in place (32 B in the descriptor, 56 B per continuation: whole elements of
  // up to 8 bytes), so an element must never straddle two slots. Integer sums wrap exactly and one double addition
  // rounds the same way everywhere, so the reference below is exact. 11 slots (not a power of two): every message fits
  // in slots, and they wrap the descriptor array.
  struct Case {
    DataType type;
    size_t elementSize;
  };
  const Case c = GENERATE(Case{DataType::Uint8, 1}, Case{DataType::Int32, 4}, Case{DataType::Uint64, 8}, Case{DataType::Float64, 8});
  const int descriptors = GENERATE(11, 256);
  INFO("type " << dataTypeName(c.type) << ", " << descriptors << " descriptors");
  SmallFifo settings(true, descriptors);
  const uint64_t hash = freshCommHash();
  const uint64_t seed = hash & 0xffff;
  // Sizes that end inside a slot (40, 313, 480 B), exactly on a slot boundary (88, 144, 200, 536 B: 32 + k x 56) and
  // one byte past one (89, 145 B, uint8 only), in whole elements.
  std::vector<size_t> sizes;
  for (size_t bytes : {40u, 88u, 89u, 144u, 145u, 200u, 313u, 480u, 536u}) sizes.push_back(bytes / c.elementSize * c.elementSize);
  std::vector<size_t> order;
  for (int lap = 0; lap < 12; ++lap)
    for (size_t i = 0; i < sizes.size(); ++i) order.push_back(sizes[(i * 5 + size_t(lap)) % sizes.size()]);
  // Doubles from random bits could be NaN, whose sum has no single expected bit pattern: draw finite ones.
  const auto payload = [&](size_t bytes, uint64_t at) {
    std::vector<unsigned char> data = randomBytes(bytes, at);
    if (c.type == DataType::Float64) {
      std::mt19937_64 rng(at);
      std::uniform_real_distribution<double> dist(-1e6, 1e6);
      for (size_t k = 0; k < bytes / 8; ++k) {
        const double v = dist(rng);
        std::memcpy(&data[k * 8], &v, 8);
      }
    }
    return data;
  };
  const Child child = startSendingChild(hash, order.size(), [&](size_t m) { return payload(order[m], seed + m); });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  const auto sum = kernels::hostReduceFunction(c.type, ReduceOp::Sum);
  std::vector<std::vector<unsigned char>> outputs, operands;
  Ticket last = 0;
  for (size_t m = 0; m < order.size(); ++m) {
    outputs.emplace_back(order[m], 0xEE);
    operands.push_back(payload(order[m], seed + 7919 * (m + 1)));
    RecvAction action;
    action.dst = outputs.back().data();
    action.operand = operands.back().data();
    action.reduce = sum;
    action.elementSize = c.elementSize;
    last = connection->postRecv(action, order[m]);
  }
  pollUntil({connection.get()}, [&] { return connection->recvsCompleted() == last; });
  size_t wrong = 0;
  for (size_t m = 0; m < order.size(); ++m) {
    const std::vector<unsigned char> sent = payload(order[m], seed + m);
    for (size_t k = 0; k < order[m] / c.elementSize; ++k) {
      const size_t at = k * c.elementSize;
      unsigned char want[8];
      if (c.type == DataType::Uint8) {
        want[0] = static_cast<unsigned char>(sent[at] + operands[m][at]);
      } else if (c.type == DataType::Int32) {
        uint32_t a, b;  // two's-complement wrap: the int32 sum's bits
        std::memcpy(&a, &sent[at], 4);
        std::memcpy(&b, &operands[m][at], 4);
        const uint32_t r = a + b;
        std::memcpy(want, &r, 4);
      } else if (c.type == DataType::Uint64) {
        uint64_t a, b;
        std::memcpy(&a, &sent[at], 8);
        std::memcpy(&b, &operands[m][at], 8);
        const uint64_t r = a + b;
        std::memcpy(want, &r, 8);
      } else {
        double a, b;
        std::memcpy(&a, &sent[at], 8);
        std::memcpy(&b, &operands[m][at], 8);
        const double r = a + b;
        std::memcpy(want, &r, 8);
      }
      if (std::memcmp(want, &outputs[m][at], c.elementSize) != 0) ++wrong;
    }
  }
  CHECK(wrong == 0);
  CHECK(shmConnectionStats(*connection).slotMessagesReceived == order.size());
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm a small message that needs every slot follows ones whose slots the receiver holds back") {
  // 8 slots: the receiver releases small messages' slots 2 at a time, or when it catches up. A 424 B message takes
  // all 8 (its descriptor and 7 continuations), so it is published only once the receiver has handed back the slot
  // of the 8 B message before it, which it does when it finds nothing newer.
  SmallFifo settings(true, 8);
  const uint64_t hash = freshCommHash();
  const uint64_t seed = hash & 0xffff;
  std::vector<size_t> sizes;
  for (int round = 0; round < 50; ++round) sizes.insert(sizes.end(), {8, 424, 8, 8, 424});
  const Child child = startSendingChild(hash, sizes.size(), [&](size_t m) { return randomBytes(sizes[m], seed + m); }, 30s);
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  std::vector<std::vector<unsigned char>> sent;
  std::vector<ExpectedMessage> expected;
  for (size_t m = 0; m < sizes.size(); ++m) {
    sent.push_back(randomBytes(sizes[m], seed + m));
    expected.push_back({sent.back().data(), sent.back().size()});
  }
  for (size_t m = 0; m < sizes.size(); ++m) receiveAndCheck(*connection, {expected[m]}, false, 0);  // one at a time
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  CHECK(stats.fifoMessagesReceived == sizes.size());
  CHECK(stats.slotMessagesReceived == 100);  // the 424 B ones went in slots, not through the ring
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm size mismatch fails the receiver and the sender, naming both sizes") {
  SmallFifo settings(false);
  const uint64_t hash = freshCommHash();
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    std::vector<unsigned char> data(100, 3);
    connection->postSend(data.data(), data.size());
    try {
      pollUntil({connection.get()}, [] { return false; }, 30s);
    } catch (const Error& e) {
      childCheck(e.code() == ncclRemoteError, std::string("child: wrong code for ") + e.what());
      childCheck(std::string(e.what()).find("64") != std::string::npos, std::string("child: ") + e.what());
      return;
    }
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  std::vector<unsigned char> sink(64);
  RecvAction action;
  action.dst = sink.data();
  connection->postRecv(action, sink.size());
  std::string message;
  try {
    pollUntil({connection.get()}, [] { return false; }, 30s);
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    message = e.what();
  }
  CHECK(message.find("64") != std::string::npos);
  CHECK(message.find("100") != std::string::npos);
  CHECK(message.find("rank 1") != std::string::npos);
  CHECK_THROWS_AS(connection->progress(), Error);  // the connection stays failed
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm notices a peer killed while we wait on it") {
  const bool duringSend = GENERATE(false, true);
  const bool cmaDisabled = GENERATE(false, true);
  INFO((duringSend ? "waiting in a large send" : "waiting in a receive") << (cmaDisabled ? ", FIFO only" : ""));
  SmallFifo settings(cmaDisabled);
  const uint64_t hash = freshCommHash();
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    ::close(ready[0]);
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    pollUntil({connection.get()}, [&] { return shmConnectionStats(*connection).established; });
    (void)!::write(ready[1], "r", 1);
    for (;;) ::pause();  // never posts anything: the parent waits until it is killed
  });
  ::close(ready[1]);
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  pollUntil({connection.get()}, [&] { return shmConnectionStats(*connection).established; });
  char byte = 0;
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  ::close(ready[0]);

  std::vector<unsigned char> buffer(4 << 20, 1);
  if (duringSend) {
    connection->postSend(buffer.data(), buffer.size());  // CMA waits for the ack; FIFO fills up
  } else {
    RecvAction action;
    action.dst = buffer.data();
    connection->postRecv(action, 100);
  }
  const auto start = std::chrono::steady_clock::now();
  bool killed = false;
  std::string message;
  ncclResult_t code = ncclSuccess;
  try {
    while (std::chrono::steady_clock::now() - start < 30s) {
      connection->progress();
      if (!killed && std::chrono::steady_clock::now() - start > 200ms) {
        ::kill(child.pid, SIGKILL);  // not reaped yet: the parent must see through the zombie
        killed = true;
      }
    }
  } catch (const Error& e) {
    code = e.code();
    message = e.what();
  }
  CHECK(killed);
  CHECK(code == ncclRemoteError);
  INFO(message);
  CHECK(message.find("rank 1") != std::string::npos);
  CHECK(message.find("pid " + std::to_string(child.pid)) != std::string::npos);
  CHECK(message.find(duringSend ? "exited during send" : "exited during receive") != std::string::npos);
  CHECK(message.find("channel 0") != std::string::npos);
  CHECK(finishChild(child).find("signal 9") != std::string::npos);
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm connect fails, without hanging, when the peer never connects") {
  SmallFifo settings(false);
  const bool peerExits = GENERATE(true, false);
  INFO((peerExits ? "the peer exits" : "the peer lives but stays silent past TOPOCCL_TIMEOUT_MS"));
  if (!peerExits) config::setOverride("TOPOCCL_TIMEOUT_MS", "500");
  const uint64_t hash = freshCommHash();
  const Child child = startChild([&](const PeerInfo&, const PeerInfo&) {
    if (!peerExits) std::this_thread::sleep_for(5s);
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  char byte = 0;
  RecvAction action;
  action.dst = &byte;
  connection->postRecv(action, 1);  // idle connections raise nothing: something must wait
  std::string message;
  try {
    pollUntil({connection.get()}, [] { return false; }, 30s);
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    message = e.what();
  }
  INFO(message);
  CHECK(message.find(peerExits ? "exited during connect" : "did not complete the connection") != std::string::npos);
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
  ::kill(child.pid, SIGKILL);
  finishChild(child);
}

TEST_CASE("shm replaces a segment left behind by a crashed run") {
  SmallFifo settings(false);
  const uint64_t hash = freshCommHash();
  writeJunkSegment(shmSegmentName(hash, 1, 0, 0));  // what a process killed before unlinking its segment leaves
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    const char text[] = "fresh";
    const Ticket t = connection->postSend(text, sizeof(text));
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == t; });
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  char text[6] = {};
  RecvAction action;
  action.dst = text;
  const Ticket t = connection->postRecv(action, sizeof(text));
  pollUntil({connection.get()}, [&] { return connection->recvsCompleted() == t; });
  CHECK(std::string(text) == "fresh");
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm removes the names a receiver that exited before its peer attached left in /dev/shm") {
  SmallFifo settings(false);
  // A live receiver's segment must stay: this process waits on a peer that has not attached yet. (Made first: the
  // first transport of a process sweeps once, and this test wants to call the sweep itself.)
  const uint64_t liveHash = freshCommHash();
  auto transport = makeShmTransport({liveHash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, ::getppid()), 0);
  REQUIRE(leftoverSegments(liveHash).size() == 1);
  const uint64_t hash = freshCommHash();
  // Rank 1 creates its receive segment from rank 0, then leaves without destructors (as _Exit or SIGKILL would).
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto leaving = makeShmTransport({hash, 0, 1, 2}, self);
    auto left = leaving->connect(peer, 0);
    static_cast<void>(left.release());
    static_cast<void>(leaving.release());
  });
  REQUIRE(finishChild(child) == "");
  const std::string orphan = shmSegmentName(hash, 0, 1, 0);
  REQUIRE(leftoverSegments(hash) == std::vector<std::string>{orphan.substr(1)});
  // Not ours to judge: a file of the same prefix that is no segment of this layout.
  const std::string junk = shmSegmentName(hash, 5, 6, 0);
  writeJunkSegment(junk);

  const std::vector<std::string> removed = removeShmSegmentsOfExitedRanks();
  CHECK(std::find(removed.begin(), removed.end(), orphan) != removed.end());
  CHECK(leftoverSegments(hash) == std::vector<std::string>{junk.substr(1)});
  CHECK(leftoverSegments(liveHash).size() == 1);
  ::shm_unlink(junk.c_str());
  connection.reset();
  CHECK(leftoverSegments(liveHash).empty());
}

// The sending side of a connection played by the test itself, writing the receiver's segment by hand: what a buggy
// or hostile peer could publish.
class ForgedSender {
 public:
  explicit ForgedSender(const std::string& name) {
    fd_ = ::shm_open(name.c_str(), O_RDWR, 0);
    REQUIRE(fd_ >= 0);
    struct stat st {};
    REQUIRE(::fstat(fd_, &st) == 0);
    bytes_ = size_t(st.st_size);
    base_ = static_cast<unsigned char*>(::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    REQUIRE(base_ != MAP_FAILED);
    header = reinterpret_cast<shm_layout::SegmentHeader*>(base_);
    REQUIRE(header->magic == shm_layout::kSegmentMagic);
    REQUIRE(header->state.load() == shm_layout::kReady);
    const auto g = shm_layout::geometryFor(header->descriptorCount, header->payloadBytes);
    REQUIRE(g.totalBytes == bytes_);
    descriptors_ = reinterpret_cast<shm_layout::SlotDescriptor*>(base_ + g.descriptorsOffset);
    header->senderShareProbeFd = -1;  // no zero copy
    header->state.store(shm_layout::kAttached, std::memory_order_release);
  }
  ~ForgedSender() {
    ::munmap(base_, bytes_);
    ::close(fd_);
  }
  ForgedSender(const ForgedSender&) = delete;
  ForgedSender& operator=(const ForgedSender&) = delete;
  shm_layout::SlotDescriptor& slot(uint64_t counter) { return descriptors_[counter % header->descriptorCount]; }
  void publish(uint64_t counter) { slot(counter).sequence.store(counter + 1, std::memory_order_release); }

  shm_layout::SegmentHeader* header = nullptr;

 private:
  int fd_ = -1;
  size_t bytes_ = 0;
  unsigned char* base_ = nullptr;
  shm_layout::SlotDescriptor* descriptors_ = nullptr;
};

TEST_CASE("shm refuses forged slots, naming the fault, and leaves the destination untouched") {
  using namespace shm_layout;
  SmallFifo settings(true, 16);  // no CMA: the forger has no probe to offer
  struct Fault {
    const char* name;
    const char* expected;  // in the error
    std::function<void(ForgedSender&)> write;  // the slots from counter 0; the descriptor is published after
  };
  const auto tiny = [](SlotDescriptor& d, uint64_t messageBytes, uint32_t fragmentBytes) {
    d.kind = kTinyMessage;
    d.messageBytes = messageBytes;
    d.fragmentBytes = fragmentBytes;
    d.offset = 0;
    std::memset(d.tiny, 0x11, sizeof(d.tiny));
  };
  const std::vector<Fault> faults = {
      {"a continuation slot never published", "missing continuation slot",
       [&](ForgedSender& f) {
         tiny(f.slot(0), 100, 100);  // 32 + 2 x 56 bytes: slots 1 and 2 follow
         f.slot(1).sequence.store(2);
         f.slot(2).sequence.store(0);
       }},
      {"an unknown slot kind", "malformed slot (kind 99)",
       [&](ForgedSender& f) {
         tiny(f.slot(0), 100, 100);
         f.slot(0).kind = 99;
       }},
      {"a fragment outside the payload ring", "malformed fragment",
       [&](ForgedSender& f) {
         SlotDescriptor& d = f.slot(0);
         d.kind = kInlineFragment;
         d.messageBytes = 100;
         d.fragmentBytes = 100;
         d.offset = 0;
         d.payloadOffset = f.header->payloadBytes;
       }},
      {"a small message shorter than it says", "malformed small message",
       [&](ForgedSender& f) { tiny(f.slot(0), 100, 40); }},
      {"another size than the receive's", "receive of 100 bytes matched a send of 64 bytes",
       [&](ForgedSender& f) { tiny(f.slot(0), 64, 64); }},
  };
  const size_t which = GENERATE(range(size_t(0), size_t(5)));
  const bool postedFirst = GENERATE(true, false);
  const Fault& fault = faults[which];
  INFO(fault.name << (postedFirst ? ", the receive posted before the slot" : ", the slot there before the receive"));
  const uint64_t hash = freshCommHash();
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, ::getpid()), 0);
  ForgedSender forger(shmSegmentName(hash, 1, 0, 0));
  connection->progress();  // takes the forger's attach
  REQUIRE(forger.header->state.load() == kEstablished);

  std::vector<unsigned char> dst(100, 0xee);
  RecvAction action;
  action.dst = dst.data();
  std::string message;
  try {
    if (postedFirst) {
      connection->postRecv(action, dst.size());
      connection->progress();  // finds nothing yet
    }
    fault.write(forger);
    forger.publish(0);
    if (!postedFirst) connection->postRecv(action, dst.size());  // may refuse the slot itself
    pollUntil({connection.get()}, [] { return false; }, 30s);
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    message = e.what();
  }
  INFO(message);
  CHECK(message.find(fault.expected) != std::string::npos);
  CHECK(message.find("rank 1") != std::string::npos);
  CHECK(std::all_of(dst.begin(), dst.end(), [](unsigned char b) { return b == 0xee; }));
  CHECK_THROWS_AS(connection->progress(), Error);  // the connection stays failed
  if (std::string(fault.expected).find("matched a send") != std::string::npos) {
    // The sender is told why, through the segment.
    CHECK(forger.header->receiverFailed.load() == 1);
    CHECK(std::string(forger.header->failureText).find("100") != std::string::npos);
  }
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm falls back to the FIFO when the kernel refuses CMA for a peer") {
  SmallFifo settings(false);
  const uint64_t hash = freshCommHash();
  const size_t bytes = 3 * 1024 * 1024 + 1;
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    // A non-dumpable process may not be read by a peer that lacks CAP_SYS_PTRACE (EPERM).
    childCheck(::prctl(PR_SET_DUMPABLE, 0) == 0, "child: prctl(PR_SET_DUMPABLE) failed");
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    const auto data = randomBytes(bytes, 99);
    const Ticket t = connection->postSend(data.data(), data.size());
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == t; });
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  CHECK(receiveOne(*connection, bytes) == randomBytes(bytes, 99));
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  CHECK(stats.cmaMessagesReceived + stats.fifoMessagesReceived == 1);
  CHECK(stats.cmaMessagesReceived == (stats.cmaReceive ? 1u : 0u));
  // With CAP_SYS_PTRACE (root in most containers) CMA stays allowed and this checks the CMA
  // path instead; run without it (setpriv --bounding-set=-sys_ptrace) to exercise the fallback.
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm refuses a second connection to the same peer and channel") {
  SmallFifo settings(false);
  const uint64_t hash = freshCommHash();
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto first = transport->connect(processPeer(1, ::getpid() + 1), 0);
  CHECK_THROWS_AS(transport->connect(processPeer(1, ::getpid() + 1), 0), Error);
  first.reset();
  CHECK(leftoverSegments(hash).empty());
}

TEST_CASE("shm receivers copy and reduce straight out of a sender's shared allocation") {
  const bool reduce = GENERATE(false, true);
  INFO((reduce ? "receives that reduce floats" : "plain receives"));
  SmallFifo settings(true);  // FIFO of 16 KiB, no CMA: only zero copy is single-copy here
  config::setOverride("TOPOCCL_SHM_ZERO_COPY_THRESHOLD", "32768");
  const uint64_t hash = freshCommHash();
  const size_t arena = 6 * 1024 * 1024 + 4096;
  // (offset, bytes) inside the allocation; multiples of 4 for the float variant. Below the threshold
  // and from a private buffer go through the FIFO.
  struct Piece {
    size_t offset, bytes;
    bool zeroCopy;
  };
  const std::vector<Piece> pieces = {{0, 32768, true},        {4, 32764, false},   {64, 65540, true},
                                     {4092, 5 * 1024 * 1024 + 12, true}, {0, arena, true}, {arena - 40000, 40000, true}};
  const uint64_t seed = hash & 0xffff;
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    auto* shared = static_cast<unsigned char*>(allocateShared(arena));
    const auto content = randomBytes(arena, seed);
    std::memcpy(shared, content.data(), arena);
    Ticket last = 0;
    for (const Piece& p : pieces) last = connection->postSend(shared + p.offset, p.bytes);
    const auto privateCopy = randomBytes(100000, seed + 1);
    last = connection->postSend(privateCopy.data(), privateCopy.size());
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == last; });
    // A fresh allocation may get the freed one's fd number: the receiver must see the new bytes.
    freeShared(shared);
    auto* again = static_cast<unsigned char*>(allocateShared(arena));
    const auto newContent = randomBytes(arena, seed + 2);
    std::memcpy(again, newContent.data(), arena);
    last = connection->postSend(again + 4096, 1 << 20);
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == last; });
    freeShared(again);
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  const auto content = randomBytes(arena, seed);
  const auto privateCopy = randomBytes(100000, seed + 1);
  const auto newContent = randomBytes(arena, seed + 2);
  std::vector<ExpectedMessage> expected;
  for (const Piece& p : pieces) expected.push_back({content.data() + p.offset, p.bytes});
  expected.push_back({privateCopy.data(), privateCopy.size()});
  expected.push_back({newContent.data() + 4096, size_t{1} << 20});
  receiveAndCheck(*connection, expected, reduce, 700);
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  if (stats.zeroCopyReceive) {
    size_t zeroCopies = 1;  // the fresh allocation's message
    for (const Piece& p : pieces) zeroCopies += p.zeroCopy ? 1 : 0;
    CHECK(stats.zeroCopyMessagesReceived == zeroCopies);
    CHECK(stats.fifoMessagesReceived == expected.size() - zeroCopies);
  } else {
    WARN("this process may not open the peer's /proc/<pid>/fd; everything went through the FIFO");
    CHECK(stats.fifoMessagesReceived == expected.size());
  }
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

// A mirrored send has the receiver also write the bytes into a shared allocation of the sender's, in the pass
// that reads them. The sender checks its mirrors after the sends complete (and that the bytes around them are
// untouched); the receiver checks what it got, plain or reduced, and that every message was mirrored.
TEST_CASE("shm mirrored sends: the receiver also writes the bytes into the sender's mirror") {
  const bool reduce = GENERATE(false, true);
  INFO((reduce ? "receives that reduce floats" : "plain receives"));
  SmallFifo settings(true);
  config::setOverride("TOPOCCL_SHM_ZERO_COPY_THRESHOLD", "32768");
  const uint64_t hash = freshCommHash();
  const size_t arena = 6 * 1024 * 1024 + 4096;
  struct Piece {
    size_t offset, bytes, mirrorOffset;
  };
  // Odd sizes and offsets, one above kZeroCopyPiece (1 MiB) and not a multiple of the 32 KiB mirror block.
  const std::vector<Piece> pieces = {{0, 32768, 100 * 1024}, {64, 65540, 4},
                                     {4092, 5 * 1024 * 1024 + 12, 1024 * 1024 + 8}, {arena - 40000, 40000, 0}};
  const uint64_t seed = hash & 0xffff;
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    const MirroredSendBuffers buffers(arena, seed);
    std::vector<unsigned char> privateBuffer(65536);
    // Any disjoint ranges can be mirrored (who writes the mirror is decided at publish); overlapping ones cannot.
    pollUntil({connection.get()}, [&] { return shmConnectionStats(*connection).established; });
    childCheck(connection->canMirror(privateBuffer.data(), buffers.mirror, 65536, 65536), "cannot mirror from a private buffer");
    childCheck(!connection->canMirror(buffers.source, buffers.source + 4096, 65536, 65536), "mirrored onto the source itself");
    childCheck(!connection->canMirror(buffers.source + 4096, buffers.source, 65536, 65536), "mirrored onto the source itself");
    childCheck(!connection->canMirror(buffers.source, buffers.mirror, 0, 0), "mirrored an empty range");
    Ticket last = 0;
    for (const Piece& p : pieces) {
      childCheck(connection->canMirror(buffers.source + p.offset, buffers.mirror + p.mirrorOffset, p.bytes, p.bytes), "cannot mirror a piece");
      last = connection->postSendMirrored(buffers.source + p.offset, buffers.mirror + p.mirrorOffset, p.bytes);
    }
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == last; });
    // Pieces are checked in order; a later piece may overwrite an earlier one's mirror, as the expected image does.
    std::vector<unsigned char> expected(arena, 0xA5);
    for (const Piece& p : pieces) std::memcpy(expected.data() + p.mirrorOffset, buffers.content.data() + p.offset, p.bytes);
    childCheck(std::memcmp(buffers.mirror, expected.data(), arena) == 0, "the mirror does not hold the sent bytes (or more was written)");
    childCheck(shmConnectionStats(*connection).senderMirroredMessages == 0, "the sender wrote mirrors the receiver could have");
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  const auto content = randomBytes(arena, seed);
  std::vector<ExpectedMessage> expected;
  for (const Piece& p : pieces) expected.push_back({content.data() + p.offset, p.bytes});
  receiveAndCheck(*connection, expected, reduce, 900);
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  CHECK(stats.mirroredMessagesReceived == pieces.size());
  CHECK(stats.zeroCopyMessagesReceived == pieces.size());
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

// Where the receiver cannot write the mirror (a private buffer on either side, a message below the zero-copy
// threshold, or one it reads in place from a shared source into a private mirror), the sender writes it, right
// after publishing each slot. Tiny messages, prime sizes that wrap the 16 KiB FIFO
// many times, and every mix of private and shared buffers; one piece the receiver mirrors sits among them. The
// mirrors are disjoint, and the bytes around them must stay untouched.
TEST_CASE("shm mirrored sends the receiver cannot write: the sender writes the mirror as it copies") {
  const bool reduce = GENERATE(false, true);
  INFO((reduce ? "receives that reduce floats" : "plain receives"));
  SmallFifo settings(true);
  config::setOverride("TOPOCCL_SHM_ZERO_COPY_THRESHOLD", "32768");
  const uint64_t hash = freshCommHash();
  const size_t arena = 12 * 1024 * 1024;
  enum Memory { kPrivate, kShared };
  struct Piece {
    Memory source, mirror;
    size_t offset, bytes, mirrorOffset;
    bool receiverMirrors;  // both shared and at least the threshold
  };
  // Sizes in multiples of 4 where the float variant reduces them; 1, 31 and 33 only go in the plain variant.
  std::vector<Piece> pieces = {
      {kPrivate, kPrivate, 0, 32, 100, false},              // tiny: inside the descriptor
      {kPrivate, kPrivate, 4, 4100, 4096 + 12, false},      // two FIFO fragments
      {kPrivate, kPrivate, 8192, 100004, 16384, false},     // wraps the FIFO six times
      {kShared, kPrivate, 4, 65540, 200000, false},         // the receiver reads the source in place
      {kShared, kPrivate, 4096, 5 * 1024 * 1024 + 12, 300000, false},
      {kShared, kShared, 12, 32764, 20, false},             // below the zero-copy threshold
      {kShared, kShared, 65536, 65536, 40000, true},        // the receiver mirrors this one
      {kPrivate, kShared, 100, 40000, 110000, false},
      {kShared, kShared, 200000, 4, 160000, false},
      {kPrivate, kShared, 16, 88, 180000, false},           // in three descriptor slots
      {kShared, kPrivate, 20, 140, 190000, false},
  };
  if (!reduce) {
    pieces.push_back({kPrivate, kPrivate, 3, 1, 6 * 1024 * 1024, false});
    pieces.push_back({kPrivate, kShared, 5, 31, 170001, false});
    pieces.push_back({kShared, kPrivate, 7, 33, 6 * 1024 * 1024 + 7, false});
  }
  const uint64_t seed = hash & 0xffff;
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    const auto content = randomBytes(arena, seed);
    std::vector<unsigned char> privateSource(content), privateMirror(arena, 0xA5);
    auto* sharedSource = static_cast<unsigned char*>(allocateShared(arena));
    auto* sharedMirror = static_cast<unsigned char*>(allocateShared(arena));
    std::memcpy(sharedSource, content.data(), arena);
    std::memset(sharedMirror, 0xA5, arena);
    Ticket last = 0;
    for (const Piece& p : pieces) {
      const unsigned char* from = (p.source == kShared ? sharedSource : privateSource.data()) + p.offset;
      unsigned char* to = (p.mirror == kShared ? sharedMirror : privateMirror.data()) + p.mirrorOffset;
      childCheck(connection->canMirror(from, to, p.bytes, p.bytes), "cannot mirror a piece");
      last = connection->postSendMirrored(from, to, p.bytes);
    }
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == last; });
    std::vector<unsigned char> expectPrivate(arena, 0xA5), expectShared(arena, 0xA5);
    size_t receiverMirrored = 0;
    for (const Piece& p : pieces) {
      std::memcpy((p.mirror == kShared ? expectShared : expectPrivate).data() + p.mirrorOffset, content.data() + p.offset, p.bytes);
      receiverMirrored += p.receiverMirrors ? 1 : 0;
    }
    childCheck(std::memcmp(privateMirror.data(), expectPrivate.data(), arena) == 0,
               "the private mirror does not hold the sent bytes (or more was written)");
    childCheck(std::memcmp(sharedMirror, expectShared.data(), arena) == 0,
               "the shared mirror does not hold the sent bytes (or more was written)");
    // Without zero copy (a peer that may not map ours), the sender writes every mirror.
    const ShmConnectionStats stats = shmConnectionStats(*connection);
    const size_t senderMirrored = pieces.size() - (stats.zeroCopySend ? receiverMirrored : 0);
    childCheck(stats.senderMirroredMessages == senderMirrored,
               "the sender wrote " + std::to_string(stats.senderMirroredMessages) + " mirrors, expected " + std::to_string(senderMirrored));
    freeShared(sharedSource);
    freeShared(sharedMirror);
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  const auto content = randomBytes(arena, seed);
  std::vector<ExpectedMessage> expected;
  size_t receiverMirrored = 0;
  for (const Piece& p : pieces) {
    expected.push_back({content.data() + p.offset, p.bytes});
    receiverMirrored += p.receiverMirrors ? 1 : 0;
  }
  receiveAndCheck(*connection, expected, reduce, 1100);
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  CHECK(stats.mirroredMessagesReceived == (stats.zeroCopyReceive ? receiverMirrored : 0u));
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

// A result-mirrored send has the receiver write what its receive makes of the bytes (here: incoming + its operand)
// into the sender's memory as it reduces: apart from the source, or over the source itself (in place). The sender
// is told at post whether it went that way: not from a private buffer, into a private mirror, below the zero-copy
// threshold, or onto a range that overlaps the source shifted. Each receive's flag says which it wrote; the sender
// checks its mirrors (and that the bytes around them are untouched) against the receiver's operands, fresh floats.
TEST_CASE("shm result mirrors: the receiver writes its reduced result into the sender's memory, apart or in place") {
  SmallFifo settings(true);
  config::setOverride("TOPOCCL_SHM_ZERO_COPY_THRESHOLD", "32768");
  const uint64_t hash = freshCommHash();
  const size_t arena = 4 * 1024 * 1024;
  struct Piece {
    bool sharedSource, sharedMirror;
    size_t offset, bytes, mirrorOffset;  // mirrorOffset == offset with a shared source and mirror: in place
    bool mirrored;
  };
  // Sizes in floats; one above kZeroCopyPiece (1 MiB) and off the 32 KiB block; two in place.
  const std::vector<Piece> pieces = {
      {true, true, 0, 32768, 2 * 1024 * 1024, true},
      {true, true, 65536, 1024 * 1024 + 4100, 65536, true},          // in place
      {true, true, 1200 * 1024, 40000, 2600 * 1024, true},
      {true, true, 3 * 1024 * 1024, 32768 + 4, 3 * 1024 * 1024, true},  // in place
      {false, true, 0, 65536, 3500 * 1024, false},                      // a private source
      {true, false, 1100 * 1024, 65536, 0, false},                      // a private mirror
      {true, true, 1150 * 1024, 16384, 3600 * 1024, false},             // below the threshold
      {true, true, 1180 * 1024, 65536, 1180 * 1024 + 4096, false},      // overlapping, shifted
  };
  const uint64_t seed = hash & 0xffff;
  const auto operandOf = [](size_t i, size_t bytes) { return randomFloats(bytes / sizeof(float), uint32_t(2000 + i)); };
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    pollUntil({connection.get()}, [&] { return shmConnectionStats(*connection).established; });
    const auto content = floatBytes(arena, seed);
    std::vector<unsigned char> privateBuffer(content);
    auto* shared = static_cast<unsigned char*>(allocateShared(arena));
    std::memcpy(shared, content.data(), arena);
    std::vector<unsigned char> expected(content);  // the shared buffer once every send completed
    Ticket last = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      const unsigned char* from = (p.sharedSource ? shared : privateBuffer.data()) + p.offset;
      unsigned char* to = (p.sharedMirror ? shared : privateBuffer.data()) + p.mirrorOffset;
      Ticket ticket = 0;
      const bool mirrored = connection->postSendResultMirrored(from, to, p.bytes, ticket);
      childCheck(mirrored == p.mirrored, "piece " + std::to_string(i) + (mirrored ? " went" : " did not go") + " result-mirrored");
      if (!mirrored) ticket = connection->postSend(from, p.bytes);
      last = ticket;
      if (!mirrored) continue;
      const std::vector<float> operand = operandOf(i, p.bytes);
      for (size_t k = 0; k < p.bytes / sizeof(float); ++k) {
        float incoming;
        std::memcpy(&incoming, content.data() + p.offset + k * sizeof(float), sizeof(float));
        const float sum = incoming + operand[k];
        std::memcpy(expected.data() + p.mirrorOffset + k * sizeof(float), &sum, sizeof(float));
      }
    }
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == last; });
    childCheck(std::memcmp(shared, expected.data(), arena) == 0, "the shared buffer does not hold the results (or more was written)");
    childCheck(privateBuffer == content, "a private buffer was written");
    freeShared(shared);
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  const auto content = floatBytes(arena, seed);
  const auto sum = kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum);
  std::vector<std::vector<float>> outputs, operands;
  std::vector<uint8_t> written(pieces.size(), 7);
  Ticket last = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    outputs.emplace_back(pieces[i].bytes / sizeof(float), -1.0f);
    operands.push_back(operandOf(i, pieces[i].bytes));
    RecvAction action;
    action.dst = outputs.back().data();
    action.operand = operands.back().data();
    action.reduce = sum;
    action.elementSize = sizeof(float);
    action.resultMirrored = &written[i];
    written[i] = 0;
    last = connection->postRecv(action, pieces[i].bytes);
  }
  pollUntil({connection.get()}, [&] { return connection->recvsCompleted() == last; });
  for (size_t i = 0; i < pieces.size(); ++i) {
    INFO("piece " << i << " of " << pieces[i].bytes << " bytes");
    CHECK(written[i] == (pieces[i].mirrored ? 1 : 0));
    size_t wrong = 0;
    for (size_t k = 0; k < outputs[i].size(); ++k) {
      float incoming;
      std::memcpy(&incoming, content.data() + pieces[i].offset + k * sizeof(float), sizeof(float));
      wrong += outputs[i][k] != incoming + operands[i][k];
    }
    CHECK(wrong == 0);
  }
  CHECK(shmConnectionStats(*connection).resultMirrorsWritten == 4);
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

// A result-mirrored send that meets a receive which returns no result (ranks running different plans) fails both
// ends, naming what happened, instead of leaving the sender waiting for a result that never comes.
TEST_CASE("shm a result-mirrored send into a receive that returns none fails both ends") {
  SmallFifo settings(true);
  config::setOverride("TOPOCCL_SHM_ZERO_COPY_THRESHOLD", "32768");
  const uint64_t hash = freshCommHash();
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    pollUntil({connection.get()}, [&] { return shmConnectionStats(*connection).established; });
    auto* shared = static_cast<unsigned char*>(allocateShared(65536));
    Ticket ticket = 0;
    childCheck(connection->postSendResultMirrored(shared, shared, 65536, ticket), "not result-mirrored");
    try {
      pollUntil({connection.get()}, [] { return false; }, 30s);
    } catch (const Error& e) {
      childCheck(e.code() == ncclRemoteError, std::string("child: wrong code for ") + e.what());
      childCheck(std::string(e.what()).find("same plan") != std::string::npos, std::string("child: ") + e.what());
    }
    freeShared(shared);
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  std::vector<float> sink(65536 / sizeof(float), 1.0f), operand(sink.size(), 2.0f);
  RecvAction action;
  action.dst = sink.data();
  action.operand = operand.data();
  action.reduce = kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum);
  action.elementSize = sizeof(float);
  connection->postRecv(action, 65536);
  std::string message;
  try {
    pollUntil({connection.get()}, [] { return false; }, 30s);
  } catch (const Error& e) {
    CHECK(e.code() == ncclRemoteError);
    message = e.what();
  }
  CHECK_THAT(message, Catch::Contains("rank 1") && Catch::Contains("65536 bytes") && Catch::Contains("same plan"));
  CHECK(std::all_of(sink.begin(), sink.end(), [](float v) { return v == 1.0f; }));  // nothing landed
  CHECK(finishChild(child) == "");
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

// postSendCopyOut: bytes the sender will overwrite in the same operation (an in-place exchange). From a shared
// allocation they still go through the FIFO, never read in place (zero copy or CMA), so each send completes while the
// receiver is not even polling, and the sender may overwrite its buffer at once. A plain send from the same buffer,
// the control, goes zero copy and must still wait for the receiver.
TEST_CASE("shm copied-out sends go through the FIFO and complete before the receiver reads them") {
  const bool cma = GENERATE(false, true);
  INFO((cma ? "CMA on" : "CMA off"));
  config::clearOverrides();
  config::setOverride("TOPOCCL_SHM_CMA", cma ? "1" : "0");
  config::setOverride("TOPOCCL_SHM_ZERO_COPY_THRESHOLD", "32768");
  const uint64_t hash = freshCommHash();
  const uint64_t seed = hash & 0xffff;
  struct Piece {
    size_t offset, bytes;
  };
  // Exactly the threshold, a prime, unaligned, past a FIFO fragment (NCCL_BUFFSIZE / 8 = 512 KiB): 1.2 MiB in all,
  // within the 4 MiB ring.
  const std::vector<Piece> pieces = {{0, 32768}, {64, 100003}, {4, 40000}, {200000, (1 << 20) + 12}};
  const size_t arena = 2 << 20;
  const size_t controlBytes = 65536;
  auto* flags = static_cast<std::atomic<int>*>(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(flags != MAP_FAILED);
  std::atomic<int>& receiverIdle = flags[0];
  std::atomic<int>& senderDone = flags[16];
  receiverIdle = 0;
  senderDone = 0;
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    const unsigned char hello = 7;
    const Ticket first = connection->postSend(&hello, 1);
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == first; });
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (receiverIdle.load() == 0) {
      childCheck(std::chrono::steady_clock::now() < deadline, "the receiver never went idle");
      std::this_thread::sleep_for(1ms);
    }
    auto* shared = static_cast<unsigned char*>(allocateShared(arena));
    const auto content = randomBytes(arena, seed);
    std::memcpy(shared, content.data(), arena);
    Ticket last = 0;
    for (const Piece& p : pieces) last = connection->postSendCopyOut(shared + p.offset, p.bytes);
    try {
      pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == last; }, 10s);
    } catch (const std::exception&) {
      senderDone = 2;
      childCheck(false, "copied-out sends did not complete while the receiver was idle");
    }
    const auto overwritten = randomBytes(arena, seed + 1);
    std::memcpy(shared, overwritten.data(), arena);  // the receiver must still get `content`
    const Ticket control = connection->postSend(shared, controlBytes);
    if (shmConnectionStats(*connection).zeroCopySend) {
      const auto until = std::chrono::steady_clock::now() + 300ms;
      while (std::chrono::steady_clock::now() < until) connection->progress();
      childCheck(connection->sendsCompleted() < control, "a zero-copy send completed while its receiver was idle");
    }
    senderDone = 1;
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == control; });
    freeShared(shared);
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  CHECK(receiveOne(*connection, 1) == std::vector<unsigned char>{7});
  receiverIdle = 1;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (senderDone.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  if (senderDone.load() != 1) {
    FAIL_CHECK("the sender did not finish its copied-out sends: " << finishChild(child));
    ::munmap(flags, 4096);
    return;
  }
  const auto content = randomBytes(arena, seed);
  const auto overwritten = randomBytes(arena, seed + 1);
  std::vector<ExpectedMessage> expected;
  for (const Piece& p : pieces) expected.push_back({content.data() + p.offset, p.bytes});
  expected.push_back({overwritten.data(), controlBytes});
  receiveAndCheck(*connection, expected, false, 0);
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  CHECK(stats.cmaMessagesReceived == 0);
  if (stats.zeroCopyReceive) {
    CHECK(stats.zeroCopyMessagesReceived == 1);  // the control
  } else {
    WARN("this process may not open the peer's /proc/<pid>/fd; everything went through the FIFO");
  }
  CHECK(finishChild(child) == "");
  ::munmap(flags, 4096);
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
  config::clearOverrides();
}

namespace {

struct SharedSend {
  size_t bytes = 0;
  bool readEarly = false;  // postSendReadEarly instead of postSend
};

// A child sends `sends` from one shared allocation (as from ncclMemAlloc) over a transport made with
// `zeroCopyThreshold`; this process receives them, checks every byte, and counts zero-copy and FIFO receives.
// Returns false (with a warning) where the receiver may not map the sender's memory: everything went through the FIFO.
bool countZeroCopyReceives(const std::vector<SharedSend>& sends, size_t zeroCopyThreshold, uint64_t& zeroCopy, uint64_t& fifo) {
  const uint64_t hash = freshCommHash();
  const uint64_t seed = hash & 0xfff;
  const size_t arena = 64 << 10;
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self, zeroCopyThreshold);
    auto connection = transport->connect(peer, 0);
    auto* shared = static_cast<unsigned char*>(allocateShared(arena));
    const auto content = randomBytes(arena, seed);
    std::memcpy(shared, content.data(), arena);
    Ticket last = 0;
    for (const SharedSend& send : sends)
      last = send.readEarly ? connection->postSendReadEarly(shared, send.bytes) : connection->postSend(shared, send.bytes);
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == last; });
    freeShared(shared);
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()), zeroCopyThreshold);
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  const auto content = randomBytes(arena, seed);
  std::vector<ExpectedMessage> expected;
  for (const SharedSend& send : sends) expected.push_back({content.data(), send.bytes});
  receiveAndCheck(*connection, expected, false, 0);
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  zeroCopy = stats.zeroCopyMessagesReceived;
  fifo = stats.fifoMessagesReceived;
  CHECK(finishChild(child) == "");
  if (!stats.zeroCopyReceive) WARN("this process may not open the peer's /proc/<pid>/fd; everything went through the FIFO");
  return stats.zeroCopyReceive;
}

}  // namespace

// The communicator gives the transport its zero-copy size (8 KiB where ranks have cores of their own, 32 KiB where
// they share); the receiver offers it, and TOPOCCL_SHM_ZERO_COPY_THRESHOLD, when set, overrides it. Messages just
// below and at the size, from a shared allocation: only those at or above it go zero copy.
TEST_CASE("shm zero copy starts at the size the transport was made with, unless the setting says otherwise") {
  const bool overridden = GENERATE(false, true);
  const size_t given = GENERATE(kZeroCopyBytesOwnCores, kZeroCopyBytesSharingCores);
  config::clearOverrides();
  config::setOverride("TOPOCCL_SHM_CMA", "0");
  if (overridden) config::setOverride("TOPOCCL_SHM_ZERO_COPY_THRESHOLD", "20000");
  const size_t threshold = overridden ? 20000 : given;
  INFO("made with " << given << ", threshold " << threshold);
  std::vector<SharedSend> sends;
  for (size_t bytes : {threshold - 1, threshold, threshold + 4093, size_t{8191}, size_t{32767}, size_t{32768}})
    sends.push_back({bytes, false});
  uint64_t zeroCopy = 0, fifo = 0;
  if (countZeroCopyReceives(sends, given, zeroCopy, fifo)) {
    const auto atOrAbove = static_cast<uint64_t>(std::count_if(sends.begin(), sends.end(), [&](const SharedSend& s) { return s.bytes >= threshold; }));
    CHECK(zeroCopy == atOrAbove);
    CHECK(fifo == sends.size() - atOrAbove);
  }
  config::clearOverrides();
}

// A send posted read early (postSendReadEarly: its rank has receives to do meanwhile) goes zero copy from
// kZeroCopyBytesOwnCores even on a connection made with the larger size ranks that share cores get; a plain send of
// the same size does not. TOPOCCL_SHM_ZERO_COPY_THRESHOLD, when set, holds for both. Every byte is checked.
TEST_CASE("shm read-early sends go zero copy from 8 KiB on a connection made with 32 KiB, unless the setting names a size") {
  const bool overridden = GENERATE(false, true);
  config::clearOverrides();
  config::setOverride("TOPOCCL_SHM_CMA", "0");
  if (overridden) config::setOverride("TOPOCCL_SHM_ZERO_COPY_THRESHOLD", "20000");
  INFO((overridden ? "TOPOCCL_SHM_ZERO_COPY_THRESHOLD=20000" : "the transport's own sizes"));
  // Just below and at 8 KiB, a prime between, and the same sizes plainly.
  const std::vector<SharedSend> sends = {{8191, true}, {8192, true}, {12289, true}, {32767, true},
                                         {8192, false}, {12289, false}, {32768, false}, {32768, true}};
  uint64_t zeroCopy = 0, fifo = 0;
  if (countZeroCopyReceives(sends, kZeroCopyBytesSharingCores, zeroCopy, fifo)) {
    const auto expected = static_cast<uint64_t>(std::count_if(sends.begin(), sends.end(), [&](const SharedSend& send) {
      const size_t from = overridden ? 20000 : send.readEarly ? kZeroCopyBytesOwnCores : kZeroCopyBytesSharingCores;
      return send.bytes >= from;
    }));
    CHECK(expected == (overridden ? 3u : 5u));  // the expectation itself, so that it cannot drift into agreeing
    CHECK(zeroCopy == expected);
    CHECK(fifo == sends.size() - expected);
  }
  config::clearOverrides();
}

TEST_CASE("shm zero copy stays off when TOPOCCL_SHM_ZERO_COPY=0") {
  SmallFifo settings(true);
  config::setOverride("TOPOCCL_SHM_ZERO_COPY", "0");
  const uint64_t hash = freshCommHash();
  const size_t bytes = 3 * 1024 * 1024 + 5;
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    auto* shared = static_cast<unsigned char*>(allocateShared(bytes));
    const auto content = randomBytes(bytes, 31);
    std::memcpy(shared, content.data(), bytes);
    const Ticket t = connection->postSend(shared, bytes);
    pollUntil({connection.get()}, [&] { return connection->sendsCompleted() == t; });
    freeShared(shared);
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  CHECK(receiveOne(*connection, bytes) == randomBytes(bytes, 31));
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  CHECK_FALSE(stats.zeroCopyReceive);
  CHECK_FALSE(stats.zeroCopySend);
  CHECK(stats.zeroCopyMessagesReceived == 0);
  CHECK(finishChild(child) == "");
}

// A receiver offers to share the copy of a large zero-copy message into a shared buffer of its own (CopyOffer); the
// sender, idle meanwhile, claims blocks and copies them into that buffer through its own mapping (and into its mirror).
// The last message is far above the receiver's per-progress budget (8 MiB): the receiver stops polling after its
// first call until the sender reports the rest copied. Odd sizes (a short last block), odd offsets, guard bytes around every
// destination and mirror. Offers are made only for plain copies into shared buffers, at or above the setting.
TEST_CASE("shm large zero-copy messages into a shared buffer are copied by both ends") {
  enum Mode { kPlain, kMirrored, kPrivateDestination, kDisabled };
  const Mode mode = GENERATE(kPlain, kMirrored, kPrivateDestination, kDisabled);
  const char* names[] = {"plain sends", "mirrored sends", "a private destination", "TOPOCCL_SHM_SHARED_COPY_BYTES=0"};
  INFO(names[mode]);
  SmallFifo settings(true, 16);
  config::setOverride("TOPOCCL_SHM_ZERO_COPY_THRESHOLD", "32768");
  config::setOverride("TOPOCCL_SHM_SHARED_COPY_BYTES", mode == kDisabled ? "0" : "131072");
  const uint64_t hash = freshCommHash();
  const uint64_t seed = hash & 0xffff;
  // Below the setting, at it, a prime size above it, and 24 MiB + 5 (385 blocks of 64 KiB, the last 5 bytes).
  const std::vector<size_t> sizes = {131071, 131072, 200003, 24 * 1024 * 1024 + 5};
  const size_t blocksOfLast = (sizes.back() + (64 << 10) - 1) >> 16;
  std::vector<size_t> at;  // each message's offset in the source, the mirror and the destination: 4 KiB + 3 apart
  size_t arena = 8;
  for (size_t bytes : sizes) {
    at.push_back(arena);
    arena += bytes + 4096 + 3;
  }
  // The sender tells the receiver, through this pipe, once it has copied the blocks the receiver leaves it: the
  // receiver's pause ends on that, not on a clock.
  int senderDone[2];
  REQUIRE(::pipe(senderDone) == 0);
  const size_t leftToSender = blocksOfLast - 128;  // the receiver's first call copies at most 8 MiB, 128 blocks
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    const MirroredSendBuffers buffers(arena, seed);
    Ticket last = 0;
    for (size_t i = 0; i < sizes.size(); ++i)
      last = mode == kMirrored ? connection->postSendMirrored(buffers.source + at[i], buffers.mirror + at[i], sizes[i])
                               : connection->postSend(buffers.source + at[i], sizes[i]);
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    bool told = false;
    while (connection->sendsCompleted() != last) {  // as an idle engine: progress, then help
      connection->progress();
      if (connection->helpPeer() && !told && shmConnectionStats(*connection).blocksCopiedForReceiver >= leftToSender)
        told = ::write(senderDone[1], "x", 1) == 1;
      childCheck(std::chrono::steady_clock::now() < deadline, "the sends did not complete");
    }
    std::vector<unsigned char> expected(arena, 0xA5);
    if (mode == kMirrored)
      for (size_t i = 0; i < sizes.size(); ++i) std::memcpy(expected.data() + at[i], buffers.content.data() + at[i], sizes[i]);
    childCheck(std::memcmp(buffers.mirror, expected.data(), arena) == 0, "the mirror does not hold exactly the sent bytes");
    childCheck(std::memcmp(buffers.source, buffers.content.data(), arena) == 0, "the source changed");
    const ShmConnectionStats stats = shmConnectionStats(*connection);
    if (mode == kPrivateDestination || mode == kDisabled)
      childCheck(stats.blocksCopiedForReceiver == 0, "the sender copied blocks nobody offered");
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  std::vector<unsigned char> privateDestination;
  unsigned char* destination = nullptr;
  if (mode == kPrivateDestination) {
    privateDestination.assign(arena, 0xEE);
    destination = privateDestination.data();
  } else {
    destination = static_cast<unsigned char*>(allocateShared(arena));
    std::memset(destination, 0xEE, arena);
  }
  Ticket last = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    RecvAction action;
    action.dst = destination + at[i];
    last = connection->postRecv(action, sizes[i]);
  }
  // Until the last message is under way (its offer made, or its first 8 MiB copied), then a pause in which only the
  // sender can move it, until it says it has.
  pollUntil({connection.get()}, [&] {
    const ShmConnectionStats s = shmConnectionStats(*connection);
    return s.sharedCopyOffers == 3 || connection->recvsCompleted() >= 3 || (s.established && !s.zeroCopyReceive);
  });
  if ((mode == kPlain || mode == kMirrored) && shmConnectionStats(*connection).zeroCopyReceive) {
    pollfd ready{senderDone[0], POLLIN, 0};
    CHECK(::poll(&ready, 1, 60000) == 1);  // a sender that never helps fails here, after a minute
  }
  ::close(senderDone[0]);
  ::close(senderDone[1]);
  pollUntil({connection.get()}, [&] { return connection->recvsCompleted() == last; });
  const auto content = randomBytes(arena, seed);
  std::vector<unsigned char> expected(arena, 0xEE);
  for (size_t i = 0; i < sizes.size(); ++i) std::memcpy(expected.data() + at[i], content.data() + at[i], sizes[i]);
  CHECK(std::memcmp(destination, expected.data(), arena) == 0);  // every message, and not a byte around them
  const ShmConnectionStats stats = shmConnectionStats(*connection);
  if (!stats.zeroCopyReceive) {
    WARN("this process may not open the peer's /proc/<pid>/fd; everything went through the FIFO");
  } else if (mode == kPlain || mode == kMirrored) {
    CHECK(stats.zeroCopyMessagesReceived == sizes.size());
    CHECK(stats.mirroredMessagesReceived == (mode == kMirrored ? sizes.size() : 0));
    CHECK(stats.sharedCopyOffers == 3);
    // The receiver's first call copies at most 8 MiB (128 blocks) of the last message; the sender, the rest.
    CHECK(stats.blocksCopiedBySender >= leftToSender);
  } else {
    CHECK(stats.sharedCopyOffers == 0);
    CHECK(stats.blocksCopiedBySender == 0);
  }
  CHECK(finishChild(child) == "");
  if (mode != kPrivateDestination) freeShared(destination);
  connection.reset();
  CHECK(leftoverSegments(hash).empty());
}

// A receiver that forges the segment (the parent here) and offers a copy the sender must refuse: another size, a
// destination past its allocation, blocks of 0 bytes, an fd the sender cannot open. The sender claims nothing,
// writes nothing, and its send completes once the receiver releases the slot.
TEST_CASE("shm senders refuse malformed copy offers and write nothing") {
  using namespace shm_layout;
  struct Fault {
    const char* name;
    std::function<void(CopyOffer&)> spoil;
  };
  const std::vector<Fault> faults = {
      {"another size", [](CopyOffer& o) { o.messageBytes += 64; }},
      {"a destination past its allocation", [](CopyOffer& o) { o.offset = o.allocationBytes - 1000; }},
      {"blocks of 0 bytes", [](CopyOffer& o) { o.blockBytes = 0; }},
      {"an fd the sender cannot open", [](CopyOffer& o) { o.fd = 1 << 20; }},
  };
  const Fault& fault = faults[GENERATE(range(size_t(0), size_t(4)))];
  INFO(fault.name);
  SmallFifo settings(true, 16);
  config::setOverride("TOPOCCL_SHM_ZERO_COPY_THRESHOLD", "32768");
  const uint64_t hash = freshCommHash();
  const size_t bytes = 1 << 20;
  // The segment the child's sends go to, made by hand as its receiver would.
  const std::string name = shmSegmentName(hash, 1, 0, 0);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  const size_t descriptors = 16, payload = 16384;
  const SegmentGeometry g = geometryFor(descriptors, payload);
  REQUIRE(::ftruncate(fd, off_t(g.totalBytes)) == 0);
  auto* base = static_cast<unsigned char*>(::mmap(nullptr, g.totalBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  REQUIRE(base != MAP_FAILED);
  auto* header = new (base) SegmentHeader{};
  header->magic = kSegmentMagic;
  header->version = kLayoutVersion;
  header->descriptorCount = descriptors;
  header->payloadBytes = payload;
  header->fragmentBytes = 4096;
  header->totalBytes = g.totalBytes;
  header->commHash = hash;
  header->receiverPid = ::getpid();
  header->senderRank = 1;
  header->receiverRank = 0;
  header->channel = 0;
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    auto* source = static_cast<unsigned char*>(allocateShared(bytes));
    std::memset(source, 0x3C, bytes);
    const Ticket t = connection->postSend(source, bytes);
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (connection->sendsCompleted() != t) {
      connection->progress();
      connection->helpPeer();
      childCheck(std::chrono::steady_clock::now() < deadline, "the send did not complete");
    }
    childCheck(shmConnectionStats(*connection).blocksCopiedForReceiver == 0, "copied blocks of a malformed offer");
    freeShared(source);
  });
  header->senderPid = child.pid;  // before kReady: the sender attaches only to a segment that names it
  header->state.store(kReady, std::memory_order_release);
  const auto descriptorAt = [&](size_t i) -> SlotDescriptor& {
    return reinterpret_cast<SlotDescriptor*>(base + g.descriptorsOffset)[i];
  };
  const auto waitFor = [&](const std::function<bool()>& done, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) FAIL(what);
      std::this_thread::sleep_for(1ms);
    }
  };
  waitFor([&] { return header->state.load(std::memory_order_acquire) == kAttached; }, "the sender never attached");
  header->cmaThreshold = 0;
  header->zeroCopyThreshold = 32768;
  header->state.store(kEstablished, std::memory_order_release);
  ::shm_unlink(name.c_str());
  SlotDescriptor& slot = descriptorAt(0);
  waitFor([&] { return slot.sequence.load(std::memory_order_acquire) == 1; }, "the sender never published");
  REQUIRE(slot.kind == kSharedBuffer);  // the sender's buffer is an ncclMemAlloc one
  auto* destination = static_cast<unsigned char*>(allocateShared(2 * bytes));
  std::memset(destination, 0xEE, 2 * bytes);
  const std::optional<SharedRange> range = findShared(destination, bytes);
  REQUIRE(range);
  CopyOffer& offer = header->copyOffer;
  offer.fd = range->fd;
  offer.flags = 0;
  offer.inode = range->inode;
  offer.allocationBytes = range->allocationBytes;
  offer.offset = range->offset;
  offer.messageBytes = bytes;
  offer.blockBytes = 64 << 10;
  fault.spoil(offer);
  header->copyBlocksBySender.store(0);
  header->copyClaims.store(copyClaimsTag(1));
  offer.sequence.store(1, std::memory_order_release);
  std::this_thread::sleep_for(300ms);  // the sender spins on it meanwhile
  CHECK(header->copyClaims.load() == copyClaimsTag(1));  // not one block claimed
  CHECK(header->copyBlocksBySender.load() == 0);
  CHECK(std::all_of(destination, destination + 2 * bytes, [](unsigned char b) { return b == 0xEE; }));
  header->tail.store(1, std::memory_order_release);  // the message taken: the sender's buffer is free
  ring(header->senderBell);
  CHECK(finishChild(child) == "");
  freeShared(destination);
  ::munmap(base, g.totalBytes);
  ::close(fd);
  CHECK(leftoverSegments(hash).empty());
}

namespace {

// Waits like an idle engine: arm the connection's doorbells, look once more, sleep until rung. The sleep's
// timeout is far longer than the test allows, so a publish or release that forgot to ring shows as a stall.
// Returns the number of sleeps.
int sleepUntilDone(Connection& connection, const std::function<bool()>& done) {
  std::vector<ArmedDoorbell> armed;
  int sleeps = 0;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  for (;;) {
    connection.progress();
    if (done()) return sleeps;
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("a sleeper was never woken");
    if (!connection.armDoorbells(armed)) {  // still connecting: the handshake does not ring
      disarm(armed);
      std::this_thread::yield();
      continue;
    }
    sealArming(armed);
    connection.progress();
    if (done()) {
      disarm(armed);
      return sleeps;
    }
    sleepUntilRung(armed, 60s);
    ++sleeps;
  }
}

// One side posts everything at once and sleeps until it is done; the other starts 100 ms later and polls.
// Messages: tiny (inside the descriptor), fragments, three laps of the ring, and one at the CMA threshold.
void sleepyExchange(Connection& connection, int rank, bool sleeper, uint64_t seed, bool handshake = false) {
  const std::vector<size_t> sizes = {8, 3000, 3 * kFifo + 17, kCmaThreshold + 5};
  if (handshake) {  // connected both ways first: a handshake still under way cannot be slept on
    unsigned char ping = 1, pong = 0;
    RecvAction action;
    action.dst = &pong;
    const Ticket r = connection.postRecv(action, 1);
    const Ticket s = connection.postSend(&ping, 1);
    pollUntil({&connection}, [&] { return connection.recvsCompleted() == r && connection.sendsCompleted() == s; });
  }
  if (!sleeper) std::this_thread::sleep_for(100ms);
  std::vector<std::vector<unsigned char>> outgoing, incoming(sizes.size());
  Ticket lastSend = 0, lastRecv = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    outgoing.push_back(randomBytes(sizes[i], seed + uint64_t(rank) * 100 + i));
    incoming[i].assign(sizes[i], 0xEE);
    RecvAction action;
    action.dst = incoming[i].data();
    lastRecv = connection.postRecv(action, sizes[i]);
    lastSend = connection.postSend(outgoing[i].data(), sizes[i]);
  }
  const auto done = [&] { return connection.sendsCompleted() == lastSend && connection.recvsCompleted() == lastRecv; };
  if (sleeper) {
    const int sleeps = sleepUntilDone(connection, done);
    childCheck(sleeps > 0, "the sleeper never slept: the test did not test the wake-ups");
  } else {
    pollUntil({&connection}, done);
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    childCheck(incoming[i] == randomBytes(sizes[i], seed + uint64_t(1 - rank) * 100 + i),
               "rank " + std::to_string(rank) + ": message of " + std::to_string(sizes[i]) + " bytes differs");
}

}  // namespace

TEST_CASE("shm ranks asleep on their doorbells are woken by every publish and release of the peer") {
  const bool cmaDisabled = GENERATE(false, true);
  INFO((cmaDisabled ? "FIFO only" : "CMA where permitted"));
  SmallFifo settings(cmaDisabled);
  const uint64_t hash = freshCommHash();
  const uint64_t seed = hash & 0xffff;
  const Child child = startChild([&](const PeerInfo& self, const PeerInfo& peer) {
    auto transport = makeShmTransport({hash, 0, 1, 2}, self);
    auto connection = transport->connect(peer, 0);
    sleepyExchange(*connection, 1, /*sleeper=*/false, seed, /*handshake=*/true);  // the parent sleeps first
    sleepyExchange(*connection, 1, /*sleeper=*/true, seed + 7);
  });
  auto transport = makeShmTransport({hash, 0, 0, 2}, processPeer(0, ::getpid()));
  auto connection = transport->connect(processPeer(1, child.pid), 0);
  std::vector<ArmedDoorbell> armed;
  CHECK(connection->armDoorbells(armed));
  CHECK(armed.empty());  // nothing posted: nothing to wait for
  const auto start = std::chrono::steady_clock::now();
  CHECK_NOTHROW(sleepyExchange(*connection, 0, /*sleeper=*/true, seed, /*handshake=*/true));
  CHECK_NOTHROW(sleepyExchange(*connection, 0, /*sleeper=*/false, seed + 7));
  CHECK(finishChild(child) == "");
  CHECK(std::chrono::steady_clock::now() - start < 20s);  // a lost wake-up sleeps 60 s
}
