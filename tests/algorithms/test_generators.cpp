#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "algorithms/generators.hpp"
#include "algorithms/validator.hpp"
#include "common/error.hpp"
#include "reference_executor.hpp"

using namespace topoccl;
using namespace topoccl::algo;

namespace {

constexpr Collective kAllCollectives[] = {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                                          Collective::Broadcast, Collective::Reduce,    Collective::AllToAll,
                                          Collective::Gather,    Collective::Scatter};
constexpr Algorithm kAllAlgorithms[] = {Algorithm::Ring, Algorithm::RecursiveDoubling, Algorithm::Tree,
                                        Algorithm::Direct, Algorithm::Hierarchical, Algorithm::HalvingDoubling,
                                        Algorithm::ReduceScatterAllGather};
constexpr int kRankCounts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16};

bool rooted(Collective c) {
  return c == Collective::Broadcast || c == Collective::Reduce || c == Collective::Gather || c == Collective::Scatter;
}

std::vector<int> rootsFor(Collective c, int n) {
  std::vector<int> roots;
  if (!rooted(c)) return {0};
  for (int r = 0; r < n; ++r) roots.push_back(r);
  return roots;
}

std::string describe(Algorithm a, Collective c, int n, int root, int nch, const char* placement) {
  return std::string(algorithmName(a)) + " " + collectiveName(c) + " n=" + std::to_string(n) +
         " root=" + std::to_string(root) + " nchannels=" + std::to_string(nch) + " placement=" + placement;
}

// Validates, then runs in every layout the plan claims, for a few block sizes (including ones
// smaller than chunksPerBlock, so some chunks are empty).
size_t numericRuns = 0;

void proveAndRun(const Plan& plan, const std::string& what, uint64_t seed) {
  const ValidationReport report = validate(plan);
  if (!report.ok()) FAIL_CHECK(what << ": validation failed:\n" << report.text());
  for (size_t count : {size_t{1}, size_t{13}, size_t{64}}) {
    for (bool inPlace : {false, true}) {
      if (inPlace ? !plan.inPlace : !plan.outOfPlace) continue;
      ++numericRuns;
      const std::string error = testing::runAndCheck(plan, {count, inPlace, seed + count});
      if (!error.empty()) {
        FAIL_CHECK(what << " count=" << count << (inPlace ? " in place" : " out of place") << ": " << error);
      }
    }
  }
}

}  // namespace

TEST_CASE("every generator and collective validates and computes the right numbers") {
  size_t plans = 0;
  numericRuns = 0;
  for (Algorithm a : kAllAlgorithms) {
    for (Collective c : kAllCollectives) {
      if (!algorithmSupports(a, c)) continue;
      for (int n : kRankCounts) {
        for (int root : rootsFor(c, n)) {
          for (int nch = 1; nch <= 3; ++nch) {
            const Plan plan = makePlan(a, c, n, root, nch);
            CHECK(plan.inPlace);
            CHECK(plan.outOfPlace);
            proveAndRun(plan, describe(a, c, n, root, nch, "any"), static_cast<uint64_t>(n * 131 + root * 7 + nch));
            ++plans;
          }
        }
      }
    }
  }
  CHECK(plans > 1000);
  CHECK(numericRuns == plans * 6);  // 3 counts x both layouts
}

TEST_CASE("hierarchical all-reduce validates and computes the right numbers for any host layout") {
  std::mt19937_64 random(std::random_device{}());
  for (int hosts : {1, 2, 3, 4}) {
    for (int perHost : {1, 2, 3, 5}) {
      const int n = hosts * perHost;
      std::vector<int> contiguous, interleaved, shuffled;
      for (int r = 0; r < n; ++r) {
        contiguous.push_back(r / perHost);
        interleaved.push_back(r % hosts);
      }
      shuffled = contiguous;
      std::shuffle(shuffled.begin(), shuffled.end(), random);
      for (const auto* layout : {&contiguous, &interleaved, &shuffled}) {
        for (int nch : {1, 2}) {
          for (Placement placement : {Placement::Any, Placement::InPlace, Placement::OutOfPlace}) {
            const Plan plan = hierarchicalPlan(Collective::AllReduce, *layout, nch, placement);
            CHECK(plan.name == "hierarchical");
            if (n > 1) CHECK(plan.chunksPerBlock == static_cast<uint32_t>(n * nch));
            std::string what = "hierarchical " + std::to_string(hosts) + "x" + std::to_string(perHost) + " nch " +
                               std::to_string(nch) + " hosts";
            for (int h : *layout) what += " " + std::to_string(h);
            proveAndRun(plan, what, random());
          }
        }
      }
      if (hosts > 1 && n > 1) {
        // Ranks that share a host with a rank of another host exchange only inside it, and each rank's
        // network peers are the ranks with its local index.
        const Plan plan = hierarchicalPlan(Collective::AllReduce, contiguous, 1);
        for (int r = 0; r < n; ++r)
          for (const Lane& lane : plan.ranks[static_cast<size_t>(r)].lanes)
            for (int peer : {lane.sendPeer, lane.recvPeer})
              if (peer >= 0 && contiguous[static_cast<size_t>(peer)] != contiguous[static_cast<size_t>(r)])
                CHECK(peer % perHost == r % perHost);
      }
    }
  }
  // Shards weighted per local rank (as by the speed of each rank's nearest NIC): every layout still computes.
  for (const std::vector<uint32_t>& weights : std::vector<std::vector<uint32_t>>{{4, 1}, {1, 4}, {3, 1, 2}, {7, 1, 1, 2}}) {
    const int perHost = static_cast<int>(weights.size());
    for (int hosts : {1, 2, 3}) {
      std::vector<int> layout;
      for (int r = 0; r < hosts * perHost; ++r) layout.push_back(r / perHost);
      std::shuffle(layout.begin(), layout.end(), random);
      for (int nch : {1, 2})
        for (Placement placement : {Placement::Any, Placement::InPlace, Placement::OutOfPlace}) {
          const Plan plan = hierarchicalPlan(Collective::AllReduce, layout, nch, placement, weights);
          uint32_t total = 0;
          for (uint32_t w : weights) total += w;
          if (hosts * perHost > 1) CHECK(plan.chunksPerBlock == total * static_cast<uint32_t>(hosts * nch));
          proveAndRun(plan, "weighted hierarchical " + std::to_string(hosts) + "x" + std::to_string(perHost), random());
        }
    }
  }
  CHECK_THROWS_WITH(hierarchicalPlan(Collective::AllReduce, {0, 0, 1, 1}, 1, Placement::Any, {1}), Catch::Contains("shard weights"));
  CHECK_THROWS_WITH(hierarchicalPlan(Collective::AllReduce, {0, 0}, 1, Placement::Any, {0, 1}), Catch::Contains("1..64"));
  CHECK_THROWS_WITH(hierarchicalPlan(Collective::AllReduce, {0, 0, 1}, 1), Catch::Contains("same number"));
  CHECK_THROWS_WITH(hierarchicalPlan(Collective::AllGather, {0, 1}, 1), Catch::Contains("does not implement"));
}

TEST_CASE("the reference executor itself catches wrong results, modified inputs and deadlocks") {
  Plan plan;
  plan.name = "hand-written";
  plan.collective = Collective::AllReduce;
  plan.nranks = 2;
  plan.inputChunks = plan.outputChunks = 1;
  plan.ranks.resize(2);
  const ChunkRange in{BufferId::Input, 0, 1};
  const ChunkRange out{BufferId::Output, 0, 1};
  plan.ranks[0].lanes.push_back({1, 1, 0, {{StepKind::Send, in, {}, {}}, {StepKind::Recv, {}, out, {}}}});
  plan.ranks[1].lanes.push_back({0, 0, 0, {{StepKind::RecvReduceCopySend, in, out, {}}}});
  CHECK(testing::runAndCheck(plan, {5, false, 1}).empty());
  CHECK(testing::runAndCheck(plan, {5, true, 1}).empty());

  Plan noReduction = plan;
  noReduction.ranks[1].lanes[0].steps[0].kind = StepKind::RecvCopySend;
  CHECK(testing::runAndCheck(noReduction, {5, false, 1}).find("rank 0 output element 0: got") == 0);

  Plan writesInput = plan;
  writesInput.ranks[1].lanes[0].steps.push_back({StepKind::Copy, out, in, {}});
  CHECK(testing::runAndCheck(writesInput, {5, false, 1}) == "rank 1 input was modified");

  Plan stuck = plan;
  std::swap(stuck.ranks[0].lanes[0].steps[0], stuck.ranks[0].lanes[0].steps[1]);
  stuck.ranks[1].lanes[0].steps[0].kind = StepKind::RecvReduceCopy;
  stuck.ranks[1].lanes[0].steps.push_back({StepKind::Send, out, {}, {}});
  CHECK(testing::runAndCheck(stuck, {5, false, 1}).find("deadlock") == 0);

  // In place, overwriting the input before the peer received it must wait: the executor honours it.
  Plan exchange = plan;
  exchange.ranks[1].lanes[0].steps = {{StepKind::Send, in, {}, {}}, {StepKind::RecvReduceCopy, in, out, {}}};
  exchange.ranks[0].lanes[0].steps = {{StepKind::Send, in, {}, {}}, {StepKind::RecvReduceCopy, in, out, {}}};
  CHECK(testing::runAndCheck(exchange, {5, false, 1}).empty());
  CHECK(testing::runAndCheck(exchange, {5, true, 1}).find("deadlock") == 0);
}

TEST_CASE("in-place-only and out-of-place-only variants are valid for what they claim, and only that") {
  for (Algorithm a : kAllAlgorithms) {
    for (Collective c : kAllCollectives) {
      if (!algorithmSupports(a, c)) continue;
      for (int n : {1, 2, 3, 5, 8}) {
        for (int root : rootsFor(c, n)) {
          for (Placement placement : {Placement::InPlace, Placement::OutOfPlace}) {
            const bool wantInPlace = placement == Placement::InPlace;
            const Plan plan = makePlan(a, c, n, root, 2, placement);
            const std::string what = describe(a, c, n, root, 2, wantInPlace ? "in-place" : "out-of-place");
            CHECK((wantInPlace ? plan.inPlace : plan.outOfPlace));
            proveAndRun(plan, what, static_cast<uint64_t>(n + root));
            // Honest flags: a layout the plan does not claim really fails.
            for (bool layoutInPlace : {false, true}) {
              if (layoutInPlace ? plan.inPlace : plan.outOfPlace) continue;
              Plan forced = plan;
              forced.inPlace = layoutInPlace;
              forced.outOfPlace = !layoutInPlace;
              if (validate(forced).ok()) FAIL_CHECK(what << ": claims not to be valid but is");
            }
          }
        }
      }
    }
  }
}

TEST_CASE("plan shapes: chunks per block, lanes and channels") {
  const Plan ring = ringPlan(Collective::AllReduce, 4, 0, 3);
  CHECK(ring.chunksPerBlock == 12);
  CHECK(ring.inputChunks == 12);
  CHECK(ring.outputChunks == 12);
  for (const auto& rank : ring.ranks) {
    REQUIRE(rank.lanes.size() == 3);
    for (int ch = 0; ch < 3; ++ch) {
      CHECK(rank.lanes[static_cast<size_t>(ch)].channel == ch);
      CHECK(rank.lanes[static_cast<size_t>(ch)].steps.size() == 2 * 4 - 1);  // s, 2 rrs, rrcs, 2 rcs, r
    }
  }
  // Odd channels run the ring the other way round.
  CHECK(ring.ranks[0].lanes[0].sendPeer == 1);
  CHECK(ring.ranks[0].lanes[1].sendPeer == 3);

  const Plan gather = ringPlan(Collective::AllGather, 5, 0, 2);
  CHECK(gather.chunksPerBlock == 2);
  CHECK(gather.outputChunks == 10);
  CHECK(gather.inputChunks == 2);

  // Direct all-to-all: a lane per peer and channel, each moving one chunk of the block, plus a copy lane per channel.
  const Plan alltoall = directPlan(Collective::AllToAll, 3, 0, 2, Placement::OutOfPlace);
  CHECK(alltoall.chunksPerBlock == 2);
  CHECK(alltoall.outputChunks == 6);
  for (const auto& rank : alltoall.ranks) {
    REQUIRE(rank.lanes.size() == 2 * 2 + 2);
    for (const auto& lane : rank.lanes) CHECK(lane.steps.size() == (lane.sendPeer >= 0 ? 2u : 1u));
  }
  CHECK(alltoall.ranks[0].lanes[0].sendPeer == 1);
  CHECK(alltoall.ranks[0].lanes[1].sendPeer == 1);
  CHECK(alltoall.ranks[0].lanes[1].channel == 1);
  CHECK(directPlan(Collective::AllToAll, 3, 0, 1).ranks[0].lanes.size() == 3);  // one channel: as before

  const Plan rd = recursiveDoublingPlan(Collective::AllReduce, 8, 0, 1);
  CHECK(rd.ranks[0].lanes.size() == 3);  // log2(8) exchange rounds
  const Plan rd6 = recursiveDoublingPlan(Collective::AllReduce, 6, 0, 1);
  CHECK(rd6.ranks[0].lanes.size() == 3);  // fold lane + 2 rounds
  CHECK(rd6.ranks[5].lanes.size() == 1);  // extra rank: send, then receive the result

  // Recursive-doubling all-gather on a power of two: round k trades the 2^k blocks held with rank r ^ 2^k.
  const Plan rdGather = recursiveDoublingPlan(Collective::AllGather, 8, 0, 1, Placement::OutOfPlace);
  for (int r = 0; r < 8; ++r) {
    const auto& lanes = rdGather.ranks[static_cast<size_t>(r)].lanes;
    REQUIRE(lanes.size() == 3);
    for (int k = 0; k < 3; ++k) {
      const Lane& lane = lanes[static_cast<size_t>(k)];
      CHECK(lane.sendPeer == (r ^ (1 << k)));
      CHECK(lane.recvPeer == (r ^ (1 << k)));
      const Step& arrival = lane.steps.back();
      CHECK(arrival.kind == StepKind::Recv);
      CHECK(arrival.dst == ChunkRange{BufferId::Output, static_cast<uint32_t>((r ^ (1 << k)) & ~((1 << k) - 1)), 1u << k});
    }
  }
  // Elsewhere Bruck's: 5 ranks in 3 rounds. Rank 4 holds blocks 4 and 0 after the first, a span that wraps: two
  // messages to rank 2, while blocks 1-2 come from rank 1 in one.
  const Plan bruck = recursiveDoublingPlan(Collective::AllGather, 5, 0, 1, Placement::InPlace);
  const auto& rank4 = bruck.ranks[4].lanes;
  REQUIRE(rank4.size() == 3);
  CHECK(rank4[1].sendPeer == 2);
  CHECK(rank4[1].recvPeer == 1);
  REQUIRE(rank4[1].steps.size() == 3);
  CHECK(rank4[1].steps[0].src == ChunkRange{BufferId::Output, 4, 1});
  CHECK(rank4[1].steps[1].src == ChunkRange{BufferId::Output, 0, 1});
  CHECK(rank4[1].steps[2].dst == ChunkRange{BufferId::Output, 1, 2});
  CHECK(rank4[2].steps.back().dst == ChunkRange{BufferId::Output, 3, 1});  // the last round only needs one block

  const Plan single = ringPlan(Collective::AllReduce, 1, 0, 2, Placement::InPlace);
  CHECK(single.ranks.size() == 1);
  CHECK(single.ranks[0].lanes.empty());
  const Plan singleCopy = directPlan(Collective::Gather, 1, 0, 1);
  REQUIRE(singleCopy.ranks[0].lanes.size() == 1);
  CHECK(singleCopy.ranks[0].lanes[0].steps[0].kind == StepKind::Copy);
}

// Ranks dealt round-robin over CPUs (rank r on CPU r mod places): the bit-reversed tree crosses between CPUs only
// on the edges from one subtree's CPU to the next, places - 1 of them, where the plain tree crosses on most.
TEST_CASE("interleaved broadcast tree: valid, right, and one CPU per subtree of the root's") {
  const auto crossings = [](const Plan& plan, int places) {
    int cross = 0;
    for (int r = 0; r < plan.nranks; ++r)
      for (const Lane& lane : plan.ranks[static_cast<size_t>(r)].lanes)
        if (lane.recvPeer >= 0 && (lane.recvPeer - r) % places != 0) ++cross;
    return cross;
  };
  for (int n : {2, 4, 8, 16}) {
    for (int places : {2, 4}) {
      if (places > n) continue;
      for (int root = 0; root < n; ++root) {
        for (Placement placement : {Placement::Any, Placement::InPlace, Placement::OutOfPlace}) {
          const Plan plan = interleavedTreeBroadcast(n, root, places, placement);
          const std::string what = "interleaved tree broadcast n=" + std::to_string(n) + " places=" + std::to_string(places) +
                                   " root=" + std::to_string(root);
          proveAndRun(plan, what, static_cast<uint64_t>(n * 17 + places * 5 + root));
          INFO(what);
          CHECK(crossings(plan, places) == places - 1);
        }
      }
    }
  }
  // The plain tree on 4 ranks over 2 CPUs crosses twice (0 -> 1 and 2 -> 3); the interleaved one once (0 -> 1).
  CHECK(crossings(treePlan(Collective::Broadcast, 4, 0, 1), 2) == 2);
  const Plan four = interleavedTreeBroadcast(4, 0, 2);
  CHECK(four.ranks[3].lanes[0].recvPeer == 1);
  CHECK(four.ranks[2].lanes[0].recvPeer == 0);
  // Outside what it is for (not powers of two, one CPU), the plain tree.
  for (auto [n, places] : {std::pair{6, 2}, std::pair{4, 3}, std::pair{4, 1}, std::pair{2, 4}}) {
    const Plan plain = treePlan(Collective::Broadcast, n, 1, 1);
    const Plan same = interleavedTreeBroadcast(n, 1, places);
    for (int r = 0; r < n; ++r)
      for (size_t l = 0; l < plain.ranks[static_cast<size_t>(r)].lanes.size(); ++l)
        CHECK(same.ranks[static_cast<size_t>(r)].lanes[l].recvPeer == plain.ranks[static_cast<size_t>(r)].lanes[l].recvPeer);
  }
}

TEST_CASE("generators reject bad arguments with ncclInvalidArgument") {
  const auto code = [](auto&& make) {
    try {
      make();
    } catch (const Error& e) {
      return e.code();
    }
    return ncclSuccess;
  };
  CHECK(code([] { ringPlan(Collective::AllToAll, 4, 0, 1); }) == ncclInvalidArgument);
  CHECK(code([] { ringPlan(Collective::AllReduce, 0, 0, 1); }) == ncclInvalidArgument);
  CHECK(code([] { treePlan(Collective::Broadcast, 4, 4, 1); }) == ncclInvalidArgument);
  CHECK(code([] { treePlan(Collective::Broadcast, 4, -1, 1); }) == ncclInvalidArgument);
  CHECK(code([] { ringPlan(Collective::AllReduce, 4, 0, 0); }) == ncclInvalidArgument);
  CHECK(code([] { ringPlan(Collective::AllReduce, 4, 0, kMaxChannels + 1); }) == ncclInvalidArgument);
  CHECK(code([] { makePlan("butterfly", Collective::AllReduce, 4, 0, 1); }) == ncclInvalidArgument);
  CHECK(code([] { makePlan("direct", Collective::Reduce, 4, 0, 1); }) == ncclInvalidArgument);
  CHECK(code([] { directPlan(Collective::Broadcast, 4, 4, 1); }) == ncclInvalidArgument);
  // Non-rooted collectives ignore the root.
  CHECK(code([] { ringPlan(Collective::AllReduce, 4, 99, 1); }) == ncclSuccess);
}

TEST_CASE("makePlan accepts our names case-insensitively") {
  CHECK(makePlan("RD", Collective::AllReduce, 5, 0, 1).name == "recursive_doubling");
  CHECK(makePlan("Recursive_Doubling", Collective::AllReduce, 5, 0, 1).name == "recursive_doubling");
  CHECK(makePlan("Ring", Collective::Broadcast, 5, 3, 2).name == "ring");
  CHECK(makePlan("tree", Collective::Reduce, 5, 3, 1).root == 3);
  CHECK(makePlan("direct", Collective::AllToAll, 5, 0, 1).root == -1);
}

TEST_CASE("chunkElements splits blocks exactly, even for huge counts") {
  Plan plan;
  plan.chunksPerBlock = 7;
  for (size_t count : {size_t{0}, size_t{3}, size_t{7}, size_t{100}, (size_t{1} << 40) + 5}) {
    size_t expectedBegin = 0;
    for (uint32_t chunk = 0; chunk < 14; ++chunk) {
      const ElementRange e = chunkElements(plan, count, chunk);
      CHECK(e.begin == expectedBegin);
      CHECK(e.end >= e.begin);
      expectedBegin = e.end;
    }
    CHECK(expectedBegin == 2 * count);
  }
  const ElementRange mid = chunkElements(plan, (size_t{1} << 40) + 5, 3);
  CHECK(mid.begin == (((uint64_t{1} << 40) + 5) * 3) / 7);
}

TEST_CASE("chunkElements with an alignment: boundaries on its multiples, still an exact split") {
  std::mt19937_64 rng(std::random_device{}());
  for (uint32_t cpb : {1u, 3u, 16u, 24u, 64u}) {
    Plan plan;
    plan.chunksPerBlock = cpb;
    for (size_t align : {size_t{1}, size_t{2}, size_t{4}, size_t{16}}) {
      const size_t drawn = std::uniform_int_distribution<size_t>(0, size_t{1} << 22)(rng);
      for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{16} * cpb - 1, size_t{1048579}, drawn, (size_t{1} << 40) + 5}) {
        INFO("cpb " << cpb << ", align " << align << ", count " << count);
        size_t expectedBegin = 0;
        for (uint32_t chunk = 0; chunk < 2 * cpb; ++chunk) {
          const ElementRange e = chunkElements(plan, count, chunk, align);
          REQUIRE(e.begin == expectedBegin);
          REQUIRE(e.end >= e.begin);
          const size_t blockBase = (chunk / cpb) * count;
          if (chunk % cpb != 0) REQUIRE((e.begin - blockBase) % align == 0);
          // Never more than an even share plus the alignment: no chunk swallows its neighbours.
          REQUIRE(e.size() <= count / cpb + 1 + align);
          expectedBegin = e.end;
        }
        REQUIRE(expectedBegin == 2 * count);
      }
    }
  }
}

TEST_CASE("mutated plans: whatever the validator accepts computes the right numbers") {
  std::mt19937_64 rng(2024);
  const auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  size_t mutants = 0;
  size_t rejected = 0;
  for (Algorithm a : kAllAlgorithms) {
    for (Collective c : kAllCollectives) {
      if (!algorithmSupports(a, c)) continue;
      for (int n : {2, 3, 4, 5}) {
        const Plan original = makePlan(a, c, n, n - 1, 2);
        for (int trial = 0; trial < 40; ++trial) {
          Plan plan = original;
          auto& lanes = plan.ranks[pick(static_cast<size_t>(n))].lanes;
          if (lanes.empty()) continue;
          Lane& lane = lanes[pick(lanes.size())];
          if (lane.steps.empty()) continue;
          const size_t s = pick(lane.steps.size());
          Step& step = lane.steps[s];
          // Only mutations that change what the plan does count.
          switch (pick(6)) {
            case 0:
              if (!stepReads(step.kind)) continue;
              step.src.offset ^= 1;
              break;
            case 1:
              if (!stepWrites(step.kind)) continue;
              step.dst.offset ^= 1;
              break;
            case 2:
              if (step.deps.empty()) continue;
              step.deps.clear();
              break;
            case 3: lane.steps.erase(lane.steps.begin() + static_cast<long>(s)); break;
            case 4:
              if (s + 1 >= lane.steps.size()) continue;
              std::swap(lane.steps[s], lane.steps[s + 1]);
              break;
            case 5: {
              constexpr StepKind kinds[] = {StepKind::Send, StepKind::Recv, StepKind::RecvReduceSend,
                                            StepKind::RecvReduceCopy, StepKind::RecvCopySend,
                                            StepKind::RecvReduceCopySend, StepKind::Copy, StepKind::Reduce};
              const StepKind kind = kinds[pick(8)];
              if (kind == step.kind) continue;
              step.kind = kind;
              break;
            }
          }
          ++mutants;
          if (!validate(plan).ok()) {
            ++rejected;
            continue;
          }
          for (bool inPlace : {false, true}) {
            if (inPlace ? !plan.inPlace : !plan.outOfPlace) continue;
            for (uint64_t seed : {1, 2, 3}) {
              const std::string error = testing::runAndCheck(plan, {5, inPlace, seed});
              if (!error.empty()) {
                FAIL_CHECK(describe(a, c, n, n - 1, 2, inPlace ? "in place" : "out of place")
                           << " mutant " << trial << " passed validation but computes wrongly: " << error);
              }
            }
          }
        }
      }
    }
  }
  INFO(rejected << " of " << mutants << " mutants rejected");
  CHECK(rejected * 10 > mutants * 7);
}
