// markSendRoutes: a Send whose bytes a receive of the same operation may overwrite while it is in flight (in place)
// is posted with postSendCopyOut, so over shm it goes through the FIFO and the receive lands in the buffer at once
// instead of waiting in a bounce slot for the peer to read it; a small send with a receive still to come is posted
// with postSendReadEarly. The rules on hand-built lanes, the default rule, and a 2-rank in-place recursive-doubling
// all-reduce between two processes over the real shm transport.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "core/execution.hpp"
#include "core/resolved_steps.hpp"
#include "kernels/host_reduce.hpp"
#include "transport/shm/shared_allocation.hpp"
#include "transport/shm/shm_transport.hpp"

using namespace topoccl;
using algo::StepKind;

namespace {

constexpr auto step = test::resolvedStep;

core::SendRule overwritten(size_t upTo) { return {upTo, 0}; }

bool copiedOut(const core::ResolvedStep& s) { return s.route == core::SendRoute::CopyOut; }

}  // namespace

TEST_CASE("sends whose bytes a receive of the operation overwrites are copied out, up to the bound") {
  std::vector<char> buffer(1000), other(1000), scratch(1000);
  SECTION("recursive doubling in place: the send of the buffer the receive reduces into") {
    std::vector<core::ResolvedLane> lanes(1);
    lanes[0].steps = {step(StepKind::Send, buffer.data(), nullptr, 1000),
                      step(StepKind::RecvReduceCopy, buffer.data(), buffer.data(), 1000)};
    CHECK(core::markSendRoutes(lanes, overwritten(1000)) == 1);
    CHECK(copiedOut(lanes[0].steps[0]));
    CHECK_FALSE(copiedOut(lanes[0].steps[1]));
    CHECK(core::markSendRoutes(lanes, overwritten(999)) == 0);  // past the bound: read in place as before
    CHECK_FALSE(copiedOut(lanes[0].steps[0]));
  }
  SECTION("a swap: the receive that overwrites the sent block is on another lane, and overlaps it by one byte") {
    std::vector<core::ResolvedLane> lanes(2);
    lanes[0].steps = {step(StepKind::Send, buffer.data() + 100, nullptr, 200), step(StepKind::Send, buffer.data() + 500, nullptr, 100)};
    lanes[1].steps = {step(StepKind::Recv, nullptr, buffer.data() + 299, 1), step(StepKind::RecvCopySend, nullptr, other.data(), 100)};
    CHECK(core::markSendRoutes(lanes, overwritten(1 << 20)) == 1);
    CHECK(copiedOut(lanes[0].steps[0]));
    CHECK_FALSE(copiedOut(lanes[0].steps[1]));  // nothing received into [500, 600)
  }
  SECTION("out of place, local writes, mirrored and empty sends stay as they are") {
    std::vector<core::ResolvedLane> lanes(1);
    lanes[0].steps = {step(StepKind::Send, buffer.data(), nullptr, 100),
                      step(StepKind::Recv, nullptr, other.data(), 100),
                      step(StepKind::Copy, scratch.data(), buffer.data(), 100),  // a local write is not a receive
                      step(StepKind::Send, other.data() + 200, nullptr, 100),
                      step(StepKind::Recv, nullptr, other.data() + 200, 100),
                      step(StepKind::Send, other.data() + 400, nullptr, 0),
                      step(StepKind::Recv, nullptr, other.data() + 400, 10)};
    lanes[0].steps[3].mirror = scratch.data();  // a mirrored send keeps its own road
    CHECK(core::markSendRoutes(lanes, overwritten(1 << 20)) == 0);
    for (const auto& s : lanes[0].steps) CHECK(s.route == core::SendRoute::Plain);
  }
}

TEST_CASE("a receive that finishes before the send starts is no hazard: relays forward in place") {
  std::vector<char> buffer(1000), other(1000);
  SECTION("received earlier in the send's own lane") {
    std::vector<core::ResolvedLane> lanes(1);
    lanes[0].steps = {step(StepKind::Recv, nullptr, buffer.data(), 400), step(StepKind::Send, buffer.data(), nullptr, 400),
                      step(StepKind::Send, buffer.data() + 100, nullptr, 100)};
    CHECK(core::markSendRoutes(lanes, overwritten(1 << 20)) == 0);
  }
  SECTION("received later in the send's own lane: overwritten while it may be in flight") {
    std::vector<core::ResolvedLane> lanes(1);
    lanes[0].steps = {step(StepKind::Recv, nullptr, buffer.data(), 400), step(StepKind::Send, buffer.data(), nullptr, 400),
                      step(StepKind::RecvReduceCopy, buffer.data() + 399, buffer.data() + 399, 1)};
    CHECK(core::markSendRoutes(lanes, overwritten(1 << 20)) == 1);
    CHECK(copiedOut(lanes[0].steps[1]));
  }
  SECTION("received on another lane that the send's lane waits for, directly or through an earlier step") {
    const bool throughEarlierStep = GENERATE(false, true);
    std::vector<core::ResolvedLane> lanes(2);
    lanes[0].steps = {step(StepKind::Recv, nullptr, other.data(), 10), step(StepKind::Recv, nullptr, buffer.data(), 500)};
    lanes[1].steps = {step(StepKind::Copy, other.data() + 500, other.data(), 10), step(StepKind::Send, buffer.data(), nullptr, 500)};
    lanes[1].steps[throughEarlierStep ? 0 : 1].deps = {{0, 1}};
    CHECK(core::markSendRoutes(lanes, overwritten(1 << 20)) == 0);
    lanes[1].steps[throughEarlierStep ? 0 : 1].deps = {{0, 0}};  // waits for the lane's first receive only
    CHECK(core::markSendRoutes(lanes, overwritten(1 << 20)) == 1);
    CHECK(copiedOut(lanes[1].steps[1]));
  }
}

TEST_CASE("sends with a receive still to come are read early, below the bound, a rank's last sends are not") {
  std::vector<char> buffer(1 << 16), other(1 << 16);
  const core::SendRule rule{0, 32768};
  SECTION("a direct all-gather's lanes: each send has the other lanes' receives beside it") {
    std::vector<core::ResolvedLane> lanes(3);
    for (size_t q = 0; q < 3; ++q)
      lanes[q].steps = {step(StepKind::Send, buffer.data(), nullptr, 8192),
                        step(StepKind::Recv, nullptr, other.data() + q * 8192, 8192)};
    lanes[2].steps[0].bytes = 32768;  // at the bound: the connection's default
    CHECK(core::markSendRoutes(lanes, rule) == 2);
    CHECK(lanes[0].steps[0].route == core::SendRoute::ReadEarly);
    CHECK(lanes[1].steps[0].route == core::SendRoute::ReadEarly);
    CHECK(lanes[2].steps[0].route == core::SendRoute::Plain);
    CHECK(core::markSendRoutes(lanes, core::SendRule{}) == 0);  // without the rule
  }
  SECTION("a broadcast's root and relay, and a reduce's leaf: nothing left to receive") {
    std::vector<core::ResolvedLane> root(2), relay(1), leaf(1);
    root[0].steps = {step(StepKind::Send, buffer.data(), nullptr, 8192)};
    root[1].steps = {step(StepKind::Send, buffer.data(), nullptr, 8192)};
    relay[0].steps = {step(StepKind::RecvCopySend, nullptr, other.data(), 8192)};
    leaf[0].steps = {step(StepKind::Recv, nullptr, other.data(), 8192), step(StepKind::Send, other.data(), nullptr, 8192)};
    CHECK(core::markSendRoutes(root, rule) == 0);
    CHECK(core::markSendRoutes(relay, rule) == 0);
    CHECK(core::markSendRoutes(leaf, rule) == 0);  // its receive finished first
    SECTION("a relay with a receive still to come forwards early") {
      relay[0].steps.push_back(step(StepKind::Recv, nullptr, other.data() + 8192, 8192));
      CHECK(core::markSendRoutes(relay, rule) == 1);
      CHECK(relay[0].steps[0].route == core::SendRoute::ReadEarly);
    }
  }
  SECTION("a send whose bytes a later local copy writes (in place, out of a scratch) is not read early") {
    std::vector<core::ResolvedLane> lanes(2);
    lanes[0].steps = {step(StepKind::Send, buffer.data(), nullptr, 8192), step(StepKind::Recv, nullptr, other.data(), 8192),
                      step(StepKind::Copy, other.data(), buffer.data(), 8192)};
    lanes[1].steps = {step(StepKind::Send, buffer.data() + 8192, nullptr, 8192),
                      step(StepKind::Recv, nullptr, other.data() + 8192, 8192)};
    CHECK(core::markSendRoutes(lanes, rule) == 1);
    CHECK(lanes[0].steps[0].route == core::SendRoute::Plain);
    CHECK(lanes[1].steps[0].route == core::SendRoute::ReadEarly);  // nothing writes [8192, 16384) again
    lanes.push_back({});
    lanes[2].steps = {step(StepKind::Copy, buffer.data() + 8192, buffer.data() + 8192, 8192)};  // in place: skipped
    CHECK(core::markSendRoutes(lanes, rule) == 1);
    CHECK(lanes[1].steps[0].route == core::SendRoute::ReadEarly);
  }
  SECTION("an overwritten send is copied out or left as it is, never read early") {
    std::vector<core::ResolvedLane> lanes(1);
    lanes[0].steps = {step(StepKind::Send, buffer.data(), nullptr, 8192),
                      step(StepKind::RecvReduceCopy, buffer.data(), buffer.data(), 8192)};
    CHECK(core::markSendRoutes(lanes, core::SendRule{8192, 32768}) == 1);
    CHECK(copiedOut(lanes[0].steps[0]));
    CHECK(core::markSendRoutes(lanes, core::SendRule{8191, 32768}) == 0);  // past the copy-out bound: never early
    CHECK(lanes[0].steps[0].route == core::SendRoute::Plain);
  }
}

TEST_CASE("the default send rule: copy out up to half the core's own cache alone on a core, read early below 32 KiB where ranks share cores") {
  CHECK(core::defaultSendRule(size_t{2} << 20, false).overwrittenUpTo == size_t{1} << 20);
  CHECK(core::defaultSendRule(size_t{1} << 20, false).overwrittenUpTo == size_t{512} << 10);
  CHECK(core::defaultSendRule(0, false).overwrittenUpTo == size_t{512} << 10);  // unknown
  CHECK(core::defaultSendRule(size_t{2} << 20, false).readEarlyBelow == 0);     // read in place from 8 KiB already
  CHECK(core::defaultSendRule(size_t{2} << 20, true).overwrittenUpTo == 0);
  CHECK(core::defaultSendRule(size_t{2} << 20, true).readEarlyBelow == size_t{32} << 10);
}

namespace {

transport::PeerInfo processPeer(int rank, pid_t pid) {
  transport::PeerInfo info;
  info.rank = rank;
  info.hostId = "test-host";
  info.pid = pid;
  info.processToken = 2000 + uint64_t(rank);
  return info;
}

std::vector<float> rankInput(uint64_t seed, int rank, size_t count) {
  std::mt19937_64 rng(seed * 2 + uint64_t(rank));
  std::uniform_real_distribution<float> value(-1000.0f, 1000.0f);
  std::vector<float> v(count);
  for (float& x : v) x = value(rng);
  return v;
}

struct RunReport {
  size_t wrong = 0;          // elements of the result that differ from the reference, over every run
  size_t laterBounces = 0;   // receive slices that bounced after the first run (whose handshake may still be going)
  std::string failure;
};

// One rank of `runs` in-place 2-rank recursive-doubling all-reduces over shm, as the communicator builds them
// (send the buffer, reduce the peer's into scratch, copy back; fused into a reduction into the buffer), each run on
// fresh random input; `copyOut` marks the sends as the communicator does. Results against a double reference.
RunReport runRank(int rank, pid_t self, pid_t peer, uint64_t hash, uint64_t seed, size_t count, int runs, bool copyOut) {
  RunReport report;
  constexpr size_t kSlice = 64 << 10;
  auto transport = transport::makeShmTransport({hash, 0, rank, 2}, processPeer(rank, self));
  auto connection = transport->connect(processPeer(1 - rank, peer), 0);
  const size_t bytes = count * sizeof(float);
  auto* buffer = static_cast<float*>(transport::allocateShared(bytes));  // zero copy's case: ncclMemAlloc memory
  std::vector<char> scratch(bytes);
  std::vector<core::ResolvedLane> lanes(1);
  char* own = reinterpret_cast<char*>(buffer);
  lanes[0].sendConn = lanes[0].recvConn = connection.get();
  lanes[0].steps = {step(StepKind::Send, own, nullptr, bytes), step(StepKind::RecvReduceCopy, own, scratch.data(), bytes),
                    step(StepKind::Copy, scratch.data(), own, bytes)};
  core::fuseStagedReceives(lanes, scratch.data(), bytes, kSlice);
  if (copyOut && core::markSendRoutes(lanes, core::SendRule{bytes, 0}) != 1) report.failure = "the send was not marked";
  core::Execution execution("allreduce", std::move(lanes), kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum),
                            sizeof(float), kSlice, nullptr, core::Execution::kSlicesPerStep);
  for (int run = 0; run < runs && report.failure.empty(); ++run) {
    const auto mine = rankInput(seed + uint64_t(run), rank, count);
    const auto theirs = rankInput(seed + uint64_t(run), 1 - rank, count);
    std::memcpy(buffer, mine.data(), bytes);
    const size_t bouncedBefore = execution.bouncedSlices();
    execution.reset();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!execution.progress()) {
      if (std::chrono::steady_clock::now() > deadline) {
        report.failure = "run " + std::to_string(run) + " timed out";
        break;
      }
    }
    for (size_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(static_cast<double>(mine[i]) + static_cast<double>(theirs[i]));
      if (std::memcmp(&buffer[i], &want, sizeof(float)) != 0) ++report.wrong;
    }
    if (run > 0) report.laterBounces += execution.bouncedSlices() - bouncedBefore;
  }
  transport::freeShared(buffer);
  return report;
}

}  // namespace

TEST_CASE("in-place 2-rank all-reduce over shm, sends copied out: exact, none bounce") {
  const bool copyOut = GENERATE(true, false);
  INFO((copyOut ? "sends copied out" : "sends read in place (zero copy)"));
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t hash = rng() | 1;
  const uint64_t seed = rng();
  // 1 to 16 slices of 64 KiB and a ragged tail; 1 float too (one slice, below the zero-copy threshold).
  const bool single = GENERATE(true, false);
  const size_t count = single ? 1 : 4 + rng() % (1 << 18);
  INFO(count << " floats");
  constexpr int kRuns = 5;
  struct Counts {
    size_t wrong, laterBounces;
  };
  auto* shared = static_cast<Counts*>(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(shared != MAP_FAILED);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    RunReport r;
    try {
      r = runRank(1, ::getpid(), parent, hash, seed, count, kRuns, copyOut);
    } catch (const std::exception& e) {
      r.failure = e.what();
    }
    shared->wrong = r.wrong;
    shared->laterBounces = r.laterBounces;
    ::_exit(r.failure.empty() ? 0 : 1);
  }
  RunReport mine;
  try {
    mine = runRank(0, parent, child, hash, seed, count, kRuns, copyOut);
  } catch (const std::exception& e) {
    mine.failure = e.what();
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(mine.failure == "");
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(mine.wrong == 0);
  CHECK(shared->wrong == 0);
  if (copyOut) {
    CHECK(mine.laterBounces == 0);
    CHECK(shared->laterBounces == 0);
  }
  ::munmap(shared, 4096);
}
