// The executor's passes over its lanes, on the local transport between two "ranks" driven from this thread, so
// each progress() call is one observable step.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "core/execution.hpp"
#include "kernels/host_reduce.hpp"
#include "transport/local/local_transport.hpp"

using namespace topoccl;
using topoccl::core::Execution;
using topoccl::core::ResolvedLane;
using topoccl::core::ResolvedStep;

namespace {

uint64_t freshCommHash() {
  static std::atomic<uint64_t> counter{0};
  return (std::random_device{}() * 0x9e3779b97f4a7c15ull) ^ (++counter << 32);
}

transport::PeerInfo localPeer(int rank) {
  transport::PeerInfo info;
  info.rank = rank;
  info.hostId = "host";
  info.pid = 1;
  info.processToken = 42;
  return info;
}

// Two ranks' executions on the local transport, driven in turn from this thread until both finish.
bool runBoth(std::vector<std::unique_ptr<Execution>>& ranks) {
  bool done0 = false, done1 = false;
  for (int i = 0; i < 10000 && !(done0 && done1); ++i) {
    done0 = ranks[0]->progress();
    done1 = ranks[1]->progress();
  }
  return done0 && done1;
}

ResolvedStep step(algo::StepKind kind, const char* src, char* dst, size_t bytes) {
  ResolvedStep s;
  s.kind = kind;
  s.src = src;
  s.dst = dst;
  s.bytes = bytes;
  return s;
}

}  // namespace

TEST_CASE("a receive whose data is already there completes in the call that posts it, run after run") {
  // Local sends complete only once the receiver has read them, so the sender cannot finish first; the receiver
  // then finds the bytes waiting and must finish in one progress() call (post, let the transport move them, and
  // look again), not in the engine's next loop.
  const size_t bytes = GENERATE(size_t{1}, size_t{8}, size_t{4099});
  INFO(bytes << " bytes");
  const uint64_t hash = freshCommHash();
  auto t0 = transport::makeLocalTransport({hash, 0, 0, 2});
  auto t1 = transport::makeLocalTransport({hash, 0, 1, 2});
  auto c0 = t0->connect(localPeer(1), 0);
  auto c1 = t1->connect(localPeer(0), 0);
  std::vector<char> source(bytes), sink(bytes);

  ResolvedLane sendLane;
  sendLane.sendConn = c0.get();
  sendLane.label = "send to rank 1";
  sendLane.steps.push_back(step(algo::StepKind::Send, source.data(), nullptr, bytes));
  std::vector<ResolvedLane> senderLanes;
  senderLanes.push_back(std::move(sendLane));
  Execution sender("test send", std::move(senderLanes), nullptr, 1, 1 << 20);

  ResolvedLane recvLane;
  recvLane.recvConn = c1.get();
  recvLane.label = "receive from rank 0";
  recvLane.steps.push_back(step(algo::StepKind::Recv, nullptr, sink.data(), bytes));
  std::vector<ResolvedLane> receiverLanes;
  receiverLanes.push_back(std::move(recvLane));
  Execution receiver("test receive", std::move(receiverLanes), nullptr, 1, 1 << 20);

  std::mt19937_64 rng(std::random_device{}());
  for (int run = 0; run < 20; ++run) {
    INFO("run " << run);
    for (char& c : source) c = static_cast<char>(rng());
    std::fill(sink.begin(), sink.end(), 0);
    if (run > 0) {
      sender.reset();
      receiver.reset();
    }
    CHECK_FALSE(sender.progress());  // posted; waits for the receiver to read it
    CHECK_FALSE(sender.progress());
    CHECK(receiver.progress());  // one call: the data was there
    CHECK(sink == source);
    CHECK(sender.progress());  // read: the send completed
    CHECK(c0->sendsCompleted() == static_cast<transport::Ticket>(run + 1));
    CHECK(c1->recvsCompleted() == static_cast<transport::Ticket>(run + 1));
  }
}

TEST_CASE("an execution waits across calls while the peer has not sent, then finishes with the right bytes") {
  const uint64_t hash = freshCommHash();
  auto t0 = transport::makeLocalTransport({hash, 0, 0, 2});
  auto t1 = transport::makeLocalTransport({hash, 0, 1, 2});
  auto c0 = t0->connect(localPeer(1), 0);
  auto c1 = t1->connect(localPeer(0), 0);
  // Rank 1 receives, then sends back what it received plus its own block (a Recv, then a Send of the same bytes on
  // another lane that waits for it, and a local Copy): the dependency crosses lanes.
  std::mt19937_64 rng(std::random_device{}());
  const size_t bytes = 1 + rng() % 3000;
  std::vector<char> source(bytes), middle(bytes), back(bytes), copy(bytes);
  for (char& c : source) c = static_cast<char>(rng());

  std::vector<ResolvedLane> lanes1(2);
  lanes1[0].recvConn = c1.get();
  lanes1[0].steps.push_back(step(algo::StepKind::Recv, nullptr, middle.data(), bytes));
  lanes1[1].sendConn = c1.get();
  ResolvedStep forward = step(algo::StepKind::Send, middle.data(), nullptr, bytes);
  forward.deps.push_back({0, 0});
  lanes1[1].steps.push_back(forward);
  ResolvedStep local = step(algo::StepKind::Copy, middle.data(), copy.data(), bytes);
  local.deps.push_back({0, 0});
  lanes1[1].steps.push_back(local);
  Execution rank1("relay", std::move(lanes1), nullptr, 1, 1 << 20);

  std::vector<ResolvedLane> lanes0(1);
  lanes0[0].sendConn = c0.get();
  lanes0[0].recvConn = c0.get();
  lanes0[0].steps.push_back(step(algo::StepKind::Send, source.data(), nullptr, bytes));
  lanes0[0].steps.push_back(step(algo::StepKind::Recv, nullptr, back.data(), bytes));
  Execution rank0("origin", std::move(lanes0), nullptr, 1, 1 << 20);

  for (int i = 0; i < 5; ++i) CHECK_FALSE(rank1.progress());  // nothing sent yet: it waits, call after call
  bool done0 = false, done1 = false;
  for (int i = 0; i < 1000 && !(done0 && done1); ++i) {
    done0 = rank0.progress();
    done1 = rank1.progress();
  }
  REQUIRE(done0);
  REQUIRE(done1);
  CHECK(middle == source);
  CHECK(copy == source);
  CHECK(back == source);
}

TEST_CASE("a hub exchanges pipelined messages with more peers than the executor tracks connections by bit") {
  // The executor hands new sends to their connections between lanes by a bit per connection, up to 64 of them, and
  // to all of its connections past that: 3 peers, the bits' last one and beyond.
  const int peers = GENERATE(3, 64, 65, 70);
  INFO(peers << " peers");
  const uint64_t hash = freshCommHash();
  const int nranks = peers + 1;
  std::vector<std::unique_ptr<transport::Transport>> transports;
  for (int r = 0; r < nranks; ++r) transports.push_back(transport::makeLocalTransport({hash, 0, r, nranks}));
  std::mt19937_64 rng(std::random_device{}());
  const size_t bytes = 3 * (64 << 10) + 1 + rng() % 4096;  // several slices, the last a short one
  std::vector<std::unique_ptr<transport::Connection>> hubConns, peerConns;
  std::vector<std::vector<char>> sent(peers, std::vector<char>(bytes)), echoed(peers, std::vector<char>(bytes)),
      relayed(peers, std::vector<char>(bytes));
  std::vector<ResolvedLane> hubLanes(peers);
  std::vector<std::unique_ptr<Execution>> echoes;
  for (int p = 0; p < peers; ++p) {
    for (char& c : sent[p]) c = static_cast<char>(rng());
    hubConns.push_back(transports[0]->connect(localPeer(p + 1), 0));
    peerConns.push_back(transports[p + 1]->connect(localPeer(0), 0));
    hubLanes[p].sendConn = hubLanes[p].recvConn = hubConns.back().get();
    hubLanes[p].steps.push_back(step(algo::StepKind::Send, sent[p].data(), nullptr, bytes));
    hubLanes[p].steps.push_back(step(algo::StepKind::Recv, nullptr, echoed[p].data(), bytes));
    std::vector<ResolvedLane> lanes(1);
    lanes[0].sendConn = lanes[0].recvConn = peerConns.back().get();
    lanes[0].steps.push_back(step(algo::StepKind::Recv, nullptr, relayed[p].data(), bytes));
    lanes[0].steps.push_back(step(algo::StepKind::Send, relayed[p].data(), nullptr, bytes));
    echoes.push_back(std::make_unique<Execution>("echo", std::move(lanes), nullptr, 1, 64 << 10));
  }
  Execution hub("hub", std::move(hubLanes), nullptr, 1, 64 << 10);
  bool done = false;
  for (int i = 0; i < 10000 && !done; ++i) {
    done = hub.progress();
    for (auto& echo : echoes) done &= echo->progress();
  }
  REQUIRE(done);
  for (int p = 0; p < peers; ++p) {
    INFO("peer " << p);
    CHECK(relayed[p] == sent[p]);
    CHECK(echoed[p] == sent[p]);
  }
}

// In place, a receive lands in bytes a peer has just read from us: both the slices that wait in a bounce slot and
// the ones received straight into place move with the copy for sent bytes (cached), not the plain copy (which past
// the caches streams around them). Counted per copy function, on an in-place swap between two ranks.
namespace {
std::atomic<size_t> plainCopied{0}, sentCopied{0};
void countPlain(void* dst, const void* src, size_t bytes) {
  plainCopied += bytes;
  std::memcpy(dst, src, bytes);
}
void countSent(void* dst, const void* src, size_t bytes) {
  sentCopied += bytes;
  std::memcpy(dst, src, bytes);
}
}  // namespace

namespace {
// Two ranks on the local transport, each with a buffer of fresh random bytes (kept in `original`) cut into 9-24
// slices of 64 KiB: past two windows of 4, so later slices find their sends already read.
struct InPlacePair {
  static constexpr size_t kSlice = 64 << 10;
  std::mt19937_64 rng{std::random_device{}()};
  size_t slices = 9 + rng() % 16;
  size_t bytes = (slices - 1) * kSlice + 1 + rng() % kSlice;
  std::vector<std::vector<char>> buffer{2, std::vector<char>(bytes)}, original{2};
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<std::unique_ptr<transport::Connection>> connections;
  InPlacePair() {
    const uint64_t hash = freshCommHash();
    for (int r = 0; r < 2; ++r) {
      for (char& c : buffer[r]) c = static_cast<char>(rng());
      original[r] = buffer[r];
      transports.push_back(transport::makeLocalTransport({hash, 0, r, 2}));
    }
    for (int r = 0; r < 2; ++r) connections.push_back(transports[r]->connect(localPeer(1 - r), 0));
  }
  // One lane that sends the rank's whole buffer to the other and receives with `steps` after it.
  std::vector<ResolvedLane> lanesOf(int r, std::vector<ResolvedStep> steps) {
    std::vector<ResolvedLane> lanes(1);
    lanes[0].sendConn = lanes[0].recvConn = connections[r].get();
    lanes[0].steps = {step(algo::StepKind::Send, buffer[r].data(), nullptr, bytes)};
    for (ResolvedStep& s : steps) lanes[0].steps.push_back(std::move(s));
    return lanes;
  }
};
}  // namespace

TEST_CASE("an in-place swap moves every received byte with the copy for sent bytes, bounced or not") {
  InPlacePair pair;
  const size_t bytes = pair.bytes, slices = pair.slices;
  INFO(slices << " slices, " << bytes << " bytes");
  std::vector<std::vector<char>> scratch(2, std::vector<char>(bytes));
  std::vector<std::unique_ptr<Execution>> ranks;
  for (int r = 0; r < 2; ++r) {
    // The staged form the all-to-all generator makes in place, fused as the communicator fuses it.
    std::vector<ResolvedLane> lanes = pair.lanesOf(r, {step(algo::StepKind::Recv, nullptr, scratch[r].data(), bytes),
                                                        step(algo::StepKind::Copy, scratch[r].data(), pair.buffer[r].data(), bytes)});
    REQUIRE(core::fuseStagedReceives(lanes, scratch[r].data(), bytes, InPlacePair::kSlice) == 1);
    ranks.push_back(std::make_unique<Execution>("swap", std::move(lanes), nullptr, 1, InPlacePair::kSlice, nullptr, slices));
    ranks.back()->setCopy(&countPlain, &countSent);
  }
  plainCopied = sentCopied = 0;
  REQUIRE(runBoth(ranks));
  CHECK(pair.buffer[0] == pair.original[1]);
  CHECK(pair.buffer[1] == pair.original[0]);
  // Both ways are exercised: rank 0 goes first and bounces, rank 1 then finds some of its sends already read.
  const size_t bounced = ranks[0]->bouncedSlices() + ranks[1]->bouncedSlices();
  CHECK(bounced > 0);
  CHECK(bounced < 2 * slices);
  CHECK(plainCopied == 0);
  CHECK(sentCopied == 2 * bytes);  // each byte once into its place: straight, or out of its bounce slot
}

// A receive marked waitsOutOwnSends (reduce_scatter_allgather's gather, in place) over bytes its own send still
// reads waits for the peer to read them and never bounces; its peer here receives the same way unmarked, so it
// bounces and reads rank 0's send meanwhile (were both marked, neither send would be read). Fresh random bytes.
TEST_CASE("an in-place receive that waits out its own sends never bounces and gets every byte") {
  InPlacePair pair;
  INFO(pair.slices << " slices, " << pair.bytes << " bytes");
  std::vector<std::unique_ptr<Execution>> ranks;
  for (int r = 0; r < 2; ++r) {
    ResolvedStep receive = step(algo::StepKind::Recv, nullptr, pair.buffer[r].data(), pair.bytes);
    receive.waitsOutOwnSends = r == 0;
    ranks.push_back(std::make_unique<Execution>("swap", pair.lanesOf(r, {receive}), nullptr, 1, InPlacePair::kSlice,
                                                nullptr, pair.slices));
  }
  REQUIRE(runBoth(ranks));
  CHECK(pair.buffer[0] == pair.original[1]);
  CHECK(pair.buffer[1] == pair.original[0]);
  CHECK(ranks[0]->bouncedSlices() == 0);
  CHECK(ranks[1]->bouncedSlices() > 0);  // rank 1 posted while its send was unread: the unmarked way still bounces
}

// 2-rank recursive doubling in place: each rank sends its buffer and reduces the peer's into scratch, then copies
// it over its buffer; fused, the reduction lands in the buffer itself, a slice whose bytes the peer has not read yet
// in a bounce slot. Fresh random floats; a float sum of two is exact against a double reference rounded once.
TEST_CASE("an in-place 2-rank recursive-doubling all-reduce reduces into its own buffer, bounced or not") {
  const uint64_t hash = freshCommHash();
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> value(-1000.0f, 1000.0f);
  constexpr size_t kSlice = 64 << 10;
  const size_t slices = 9 + rng() % 16;
  const size_t count = ((slices - 1) * kSlice + 4 + rng() % kSlice) / sizeof(float);
  const size_t bytes = count * sizeof(float);
  INFO(slices << " slices, " << count << " floats");
  std::vector<std::vector<float>> buffer(2, std::vector<float>(count));
  std::vector<std::vector<char>> scratch(2, std::vector<char>(bytes));
  for (auto& b : buffer)
    for (float& v : b) v = value(rng);
  std::vector<float> expected(count);
  for (size_t i = 0; i < count; ++i)
    expected[i] = static_cast<float>(static_cast<double>(buffer[0][i]) + static_cast<double>(buffer[1][i]));
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<std::unique_ptr<transport::Connection>> connections;
  for (int r = 0; r < 2; ++r) transports.push_back(transport::makeLocalTransport({hash, 0, r, 2}));
  for (int r = 0; r < 2; ++r) connections.push_back(transports[r]->connect(localPeer(1 - r), 0));
  std::vector<std::unique_ptr<Execution>> ranks;
  for (int r = 0; r < 2; ++r) {
    char* own = reinterpret_cast<char*>(buffer[r].data());
    std::vector<ResolvedLane> lanes(1);
    lanes[0].sendConn = lanes[0].recvConn = connections[r].get();
    lanes[0].steps = {step(algo::StepKind::Send, own, nullptr, bytes),
                      step(algo::StepKind::RecvReduceCopy, own, scratch[r].data(), bytes),
                      step(algo::StepKind::Copy, scratch[r].data(), own, bytes)};
    REQUIRE(core::fuseStagedReceives(lanes, scratch[r].data(), bytes, kSlice) == 1);
    REQUIRE(lanes[0].steps[1].dst == own);
    REQUIRE(lanes[0].steps[2].kind == algo::StepKind::Nop);
    ranks.push_back(std::make_unique<Execution>("allreduce", std::move(lanes),
                                                kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum), sizeof(float),
                                                kSlice, nullptr, slices));
  }
  std::fill(scratch[0].begin(), scratch[0].end(), 0);
  REQUIRE(runBoth(ranks));
  CHECK(buffer[0] == expected);
  CHECK(buffer[1] == expected);
  const size_t bounced = ranks[0]->bouncedSlices() + ranks[1]->bouncedSlices();
  CHECK(bounced > 0);  // rank 0 reduced slices rank 1 had not read yet
  CHECK(bounced < 2 * slices);
  CHECK(std::all_of(scratch[0].begin(), scratch[0].end(), [](char c) { return c == 0; }));  // never staged
}

namespace {
// Two ranks' connections to each other on the local transport, rank r's at [r].
struct LocalPair {
  std::vector<std::unique_ptr<transport::Transport>> transports;
  std::vector<std::unique_ptr<transport::Connection>> connections;
  LocalPair() {
    const uint64_t hash = freshCommHash();
    for (int r = 0; r < 2; ++r) transports.push_back(transport::makeLocalTransport({hash, 0, r, 2}));
    for (int r = 0; r < 2; ++r) connections.push_back(transports[r]->connect(localPeer(1 - r), 0));
  }
};

// A 2-rank all-reduce as the generators lay it out with result mirrors (resolved by hand here): rank r sums part
// r of the block (parts [0, half) and [half, count)) from its input and the peer's, the peer sends part r, and the
// sum comes back to it. `ring`: one lane, send, recv-reduce-copy-send, recv (the 2-rank ring). Else two lanes as
// reduce_scatter_allgather makes them: sends (the part, then the sum once reduced) and receives (the reduce, then
// the gather). `marked` says which ranks carry the marks.
std::vector<ResolvedLane> halvesAllReduce(bool ring, int r, transport::Connection* conn, float* in, float* out, size_t count,
                                          bool marked) {
  const size_t half = count / 2;
  const auto part = [&](float* base, int p) { return reinterpret_cast<char*>(base + (p == 0 ? 0 : half)); };
  const auto bytes = [&](int p) { return (p == 0 ? half : count - half) * sizeof(float); };
  const int q = 1 - r;
  using K = algo::StepKind;
  std::vector<ResolvedLane> lanes;
  if (ring) {
    lanes.resize(1);
    lanes[0].sendConn = lanes[0].recvConn = conn;
    lanes[0].steps = {step(K::Send, part(in, q), nullptr, bytes(q)), step(K::RecvReduceCopySend, part(in, r), part(out, r), bytes(r)),
                      step(K::Recv, nullptr, part(out, q), bytes(q))};
    if (marked) {
      lanes[0].steps[0].resultReturnsIn = algo::StepRef{0, 2};
      lanes[0].steps[1].sendsResultOf = algo::StepRef{0, 1};
    }
    return lanes;
  }
  lanes.resize(2);
  lanes[0].sendConn = conn;
  lanes[1].recvConn = conn;
  ResolvedStep sum = step(K::Send, part(out, r), nullptr, bytes(r));
  sum.deps = {algo::StepRef{1, 0}};
  ResolvedStep gather = step(K::Recv, nullptr, part(out, q), bytes(q));
  gather.deps = {algo::StepRef{0, 0}};
  gather.waitsOutOwnSends = true;
  lanes[0].steps = {step(K::Send, part(in, q), nullptr, bytes(q)), sum};
  lanes[1].steps = {step(K::RecvReduceCopy, part(in, r), part(out, r), bytes(r)), gather};
  if (marked) {
    lanes[0].steps[0].resultReturnsIn = algo::StepRef{1, 1};
    lanes[0].steps[1].sendsResultOf = algo::StepRef{1, 0};
  }
  return lanes;
}
}  // namespace

// Each rank's receive-reduce writes its half's sum into the peer's output too (the local transport lets it), so no
// sum is sent back and no gather receives anything: every slice of the peer's half arrives that way. Fresh random
// floats, a count that cuts the halves into 3-17 slices of 64 KiB with a ragged end, in and out of place, three runs
// of the same executions. A float sum of two is exact against a double reference rounded once.
TEST_CASE("2-rank all-reduce with result mirrors: each rank writes its half's sum into both outputs and sends none back") {
  const bool ring = GENERATE(false, true);
  const bool inPlace = GENERATE(false, true);
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> value(-1000.0f, 1000.0f);
  constexpr size_t kSlice = 64 << 10;
  const size_t slices = 3 + rng() % 15;
  const size_t count = 2 * (slices - 1) * (kSlice / sizeof(float)) + 1 + rng() % (2 * kSlice / sizeof(float));
  INFO((ring ? "ring" : "reduce_scatter_allgather") << ", " << (inPlace ? "in place" : "out of place") << ", " << count << " floats");
  const LocalPair pair;
  const auto& connections = pair.connections;
  std::vector<std::vector<float>> input(2, std::vector<float>(count)), output(2, std::vector<float>(count));
  std::vector<std::unique_ptr<Execution>> ranks;
  for (int r = 0; r < 2; ++r) {
    float* out = inPlace ? input[r].data() : output[r].data();
    std::vector<ResolvedLane> lanes = halvesAllReduce(ring, r, connections[r].get(), input[r].data(), out, count, true);
    REQUIRE(core::linkResultMirrors(lanes) == 2);
    ranks.push_back(std::make_unique<Execution>("allreduce", std::move(lanes), kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum),
                                                sizeof(float), kSlice, nullptr, 16));
  }
  const auto slicesOf = [&](size_t floats) { return (floats * sizeof(float) + kSlice - 1) / kSlice; };
  for (int run = 0; run < 3; ++run) {
    std::vector<float> expected(count);
    for (auto& in : input)
      for (float& v : in) v = value(rng);
    for (size_t i = 0; i < count; ++i) expected[i] = static_cast<float>(static_cast<double>(input[0][i]) + static_cast<double>(input[1][i]));
    for (auto& out : output) std::fill(out.begin(), out.end(), -7.0f);
    if (run > 0)
      for (auto& rank : ranks) rank->reset();
    REQUIRE(runBoth(ranks));
    for (int r = 0; r < 2; ++r) {
      INFO("run " << run << ", rank " << r);
      CHECK((inPlace ? input[r] : output[r]) == expected);
      if (!inPlace) CHECK(input[r] != expected);  // the input is left alone
    }
  }
  const size_t firstHalf = slicesOf(count / 2), secondHalf = slicesOf(count - count / 2);
  CHECK(ranks[0]->slicesWrittenByPeer() == 3 * secondHalf);  // rank 1 sums the second half
  CHECK(ranks[1]->slicesWrittenByPeer() == 3 * firstHalf);
  CHECK(ranks[0]->slicesWrittenToPeer() == 3 * firstHalf);
  CHECK(ranks[1]->slicesWrittenToPeer() == 3 * secondHalf);
}

// Marks that do not fit the resolved steps are dropped and the steps run as they are; a peer that asks for a result
// the receiving rank's step does not return (ranks running different plans) is an error, not a hang.
TEST_CASE("result mirrors: misfit marks are dropped, and a send asking for a result no receive returns fails") {
  const LocalPair pair;
  const auto& connections = pair.connections;
  constexpr size_t kCount = 100003;  // prime: halves of 50001 and 50002 floats
  std::vector<std::vector<float>> buffer(2, std::vector<float>(kCount, 1.5f));
  {
    std::vector<ResolvedLane> lanes = halvesAllReduce(true, 0, connections[0].get(), buffer[0].data(), buffer[0].data(), kCount, true);
    lanes[0].steps[2].bytes -= sizeof(float);  // the receive no longer matches the send
    CHECK(core::linkResultMirrors(lanes) == 1);  // the rrcs's own mark still fits
    CHECK_FALSE(lanes[0].steps[0].resultReturnsIn);
    CHECK(lanes[0].steps[0].resultMirror == nullptr);
    lanes = halvesAllReduce(false, 0, connections[0].get(), buffer[0].data(), buffer[0].data(), kCount, true);
    lanes[0].steps[1].deps.clear();  // the sum's send could start before the reduce finished
    CHECK(core::linkResultMirrors(lanes) == 1);
    CHECK_FALSE(lanes[0].steps[1].sendsResultOf);
    CHECK_FALSE(lanes[1].steps[0].returnsResult);
  }
  std::vector<std::unique_ptr<Execution>> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<ResolvedLane> lanes = halvesAllReduce(true, r, connections[r].get(), buffer[r].data(), buffer[r].data(), kCount, r == 0);
    core::linkResultMirrors(lanes);
    ranks.push_back(std::make_unique<Execution>("allreduce", std::move(lanes), kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum),
                                                sizeof(float), 64 << 10, nullptr, 16));
  }
  CHECK_THROWS_WITH(runBoth(ranks), Catch::Contains("returns no result") && Catch::Contains("same plan"));
}

// A receive whose slices the peer is to write as result mirrors says so when it stalls: here the peer sends its
// part but never receives, so our result-mirrored send is never read and our receive of the sum never completes.
TEST_CASE("a stalled receive of result mirrors says it waits for the peer to write the sum") {
  const LocalPair pair;
  const auto& connections = pair.connections;
  constexpr size_t kCount = 65536;
  std::vector<std::vector<float>> buffer(2, std::vector<float>(kCount, 1.0f));
  std::vector<ResolvedLane> lanes = halvesAllReduce(true, 0, connections[0].get(), buffer[0].data(), buffer[0].data(), kCount, true);
  REQUIRE(core::linkResultMirrors(lanes) == 2);
  Execution rank0("allreduce", std::move(lanes), kernels::hostReduceFunction(DataType::Float32, ReduceOp::Sum), sizeof(float),
                  64 << 10, nullptr, 16);
  std::vector<ResolvedLane> peer(1);
  peer[0].sendConn = peer[0].recvConn = connections[1].get();
  peer[0].steps = {step(algo::StepKind::Send, reinterpret_cast<char*>(buffer[1].data()), nullptr, kCount / 2 * sizeof(float))};
  Execution rank1("allreduce", std::move(peer), nullptr, sizeof(float), 64 << 10, nullptr, 16);
  for (int i = 0; i < 100; ++i) {
    CHECK_FALSE(rank0.progress());
    rank1.progress();
  }
  CHECK_THAT(rank0.describeWaiting(), Catch::Contains("step 2") && Catch::Contains("write its sum into our memory") &&
                                          Catch::Contains("local to rank 1") && Catch::Contains("0/2 slices written"));
}
