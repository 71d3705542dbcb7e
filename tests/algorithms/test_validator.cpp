#include <catch2/catch.hpp>

#include "algorithms/generators.hpp"
#include "algorithms/validator.hpp"
#include "common/error.hpp"

using namespace topoccl;
using namespace topoccl::algo;

namespace {

ChunkRange in(uint32_t offset, uint32_t count = 1) { return {BufferId::Input, offset, count}; }
ChunkRange out(uint32_t offset, uint32_t count = 1) { return {BufferId::Output, offset, count}; }
ChunkRange scratchChunk(uint32_t offset) { return {BufferId::Scratch, offset, 1}; }

Step step(StepKind kind, ChunkRange src = {}, ChunkRange dst = {}, std::vector<StepRef> deps = {}) {
  return {kind, src, dst, std::move(deps)};
}

// A bare plan for hand-written programs: one block of one chunk per buffer where the collective has one.
Plan emptyPlan(Collective c, int nranks, int root = -1) {
  Plan plan;
  plan.name = "hand-written";
  plan.collective = c;
  plan.nranks = nranks;
  plan.root = root;
  plan.ranks.resize(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    plan.inputChunks = std::max(plan.inputChunks, inputBlocks(c, nranks, r, root));
    plan.outputChunks = std::max(plan.outputChunks, outputBlocks(c, nranks, r, root));
  }
  return plan;
}

Lane& addLane(Plan& plan, int rank, int sendPeer, int recvPeer, int channel = 0) {
  auto& lanes = plan.ranks[static_cast<size_t>(rank)].lanes;
  lanes.push_back({sendPeer, recvPeer, channel, {}});
  return lanes.back();
}

// A correct 2-rank AllReduce: rank 0 sends its input, rank 1 adds and sends the sum back.
Plan twoRankAllReduce() {
  Plan plan = emptyPlan(Collective::AllReduce, 2);
  addLane(plan, 0, 1, 1).steps = {step(StepKind::Send, in(0)), step(StepKind::Recv, {}, out(0))};
  addLane(plan, 1, 0, 0).steps = {step(StepKind::RecvReduceCopySend, in(0), out(0))};
  return plan;
}

bool mentions(const ValidationReport& report, const std::string& a, const std::string& b = "") {
  for (const auto& e : report.errors) {
    if (e.find(a) != std::string::npos && e.find(b) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("a correct hand-written plan validates") {
  const ValidationReport report = validate(twoRankAllReduce());
  INFO(report.text());
  CHECK(report.ok());
  CHECK(report.text() == "ok");
  CHECK_NOTHROW(validateOrThrow(twoRankAllReduce()));
}

TEST_CASE("a missing send is reported on both ends of the connection") {
  Plan plan = ringPlan(Collective::AllReduce, 3, 0, 1);
  auto& steps = plan.ranks[1].lanes[0].steps;
  steps.erase(steps.begin());  // rank 1 never sends its first chunk
  const ValidationReport report = validate(plan);
  INFO(report.text());
  CHECK_FALSE(report.ok());
  CHECK(mentions(report, "rank 2 lane 0 step 4 (r): receive 4 from rank 1 channel 0 has no matching send",
                 "rank 1 lane 0 sends only 3 times"));
}

TEST_CASE("a reduction that adds a contribution twice is rejected") {
  Plan plan = twoRankAllReduce();
  plan.ranks[1].lanes[0].steps.push_back(step(StepKind::Reduce, in(0), out(0)));
  const ValidationReport report = validate(plan);
  INFO(report.text());
  CHECK(mentions(report, "rank 1 lane 0 step 1 (re): the reduction counts rank 1 input chunk 0 twice"));
}

TEST_CASE("a size mismatch between a send and its receive is rejected") {
  Plan plan = ringPlan(Collective::AllGather, 3, 0, 2);
  plan.ranks[1].lanes[0].steps[0].src.count = 2;
  const ValidationReport report = validate(plan);
  INFO(report.text());
  CHECK(mentions(report, "rank 2 lane 0 step 1 (rcs): receive 1 from rank 1 channel 0 takes 1 chunk",
                 "rank 1 lane 0 step 0 (s) sends 2"));
}

TEST_CASE("a receive cycle is reported as a deadlock naming the stuck lanes") {
  Plan plan = emptyPlan(Collective::AllReduce, 2);
  for (int r = 0; r < 2; ++r) {
    addLane(plan, r, 1 - r, 1 - r).steps = {step(StepKind::RecvReduceCopy, in(0), out(0)),
                                            step(StepKind::Send, out(0))};
  }
  const ValidationReport report = validate(plan);
  INFO(report.text());
  CHECK(mentions(report, "deadlock: 2 lanes cannot finish"));
  CHECK(mentions(report, "rank 0 lane 0 step 0 (rrc) waits for receive 1 from rank 1 channel 0"));
  CHECK(mentions(report, "rank 1 lane 0 step 0 (rrc) waits for receive 1 from rank 0 channel 0"));
}

TEST_CASE("a dependency cycle between lanes is a deadlock") {
  Plan plan = twoRankAllReduce();
  Lane& extra = addLane(plan, 0, -1, -1);
  extra.steps = {step(StepKind::Nop, {}, {}, {{0, 0}})};
  plan.ranks[0].lanes[0].steps[0].deps = {{1, 0}};
  const ValidationReport report = validate(plan);
  INFO(report.text());
  CHECK(mentions(report, "rank 0 lane 0 step 0 (s) waits for its dependency lane 1 step 0"));
  CHECK(mentions(report, "rank 0 lane 1 step 0 (nop) waits for its dependency lane 0 step 0"));
}

TEST_CASE("a dependency on a step that does not exist is rejected") {
  Plan plan = ringPlan(Collective::AllReduce, 3, 0, 2);
  plan.ranks[1].lanes[1].steps[2].deps.push_back({0, 99});
  plan.ranks[2].lanes[0].steps[0].deps.push_back({7, 0});
  plan.ranks[0].lanes[0].steps[1].deps.push_back({0, 0});
  const ValidationReport report = validate(plan);
  INFO(report.text());
  CHECK(mentions(report, "rank 1 lane 1 step 2 (rrcs): depends on lane 0 step 99, but that lane has 5 steps"));
  CHECK(mentions(report, "rank 2 lane 0 step 0 (s): depends on lane 7 step 0, but rank 2 has 2 lanes"));
  CHECK(mentions(report, "rank 0 lane 0 step 1 (rrs): depends on step 0 of its own lane"));
}

TEST_CASE("overwriting a send still in flight deadlocks in place") {
  // Both ranks send their input and then reduce into the output: fine apart, but in place the
  // output is the input being sent, so each waits for the other to receive first.
  Plan plan = emptyPlan(Collective::AllReduce, 2);
  for (int r = 0; r < 2; ++r) {
    addLane(plan, r, 1 - r, 1 - r).steps = {step(StepKind::Send, in(0)), step(StepKind::RecvReduceCopy, in(0), out(0))};
  }
  plan.inPlace = false;
  INFO(validate(plan).text());
  CHECK(validate(plan).ok());
  plan.inPlace = true;
  plan.outOfPlace = false;
  const ValidationReport report = validate(plan);
  INFO(report.text());
  CHECK(mentions(report, "(in place) deadlock"));
  CHECK(mentions(report, "rank 0 lane 0 step 1 (rrc) must not overwrite output chunk 0 before its peer receives"));
}

TEST_CASE("structural errors name the rank and lane") {
  SECTION("a send to a rank with no receiving lane") {
    Plan plan = twoRankAllReduce();
    plan.ranks[1].lanes[0].recvPeer = -1;
    const ValidationReport report = validate(plan);
    INFO(report.text());
    CHECK(mentions(report, "rank 0 lane 0 step 0 (s): sends to rank 1 channel 0, but rank 1 has no lane receiving from rank 0"));
    CHECK(mentions(report, "rank 1 lane 0 step 0 (rrcs): receives, but its lane has no receive peer"));
  }
  SECTION("two lanes on one connection") {
    Plan plan = twoRankAllReduce();
    addLane(plan, 0, 1, -1);
    const ValidationReport report = validate(plan);
    INFO(report.text());
    CHECK(mentions(report, "rank 0 lane 1 and lane 0 both send to rank 1 channel 0"));
  }
  SECTION("ranges outside the buffers, writes to the input, bad peers") {
    Plan plan = twoRankAllReduce();
    plan.ranks[0].lanes[0].steps[0].src = in(1);
    plan.ranks[1].lanes[0].steps.push_back(step(StepKind::Copy, out(0), in(0)));
    addLane(plan, 1, 1, 5);
    const ValidationReport report = validate(plan);
    INFO(report.text());
    CHECK(mentions(report, "rank 0 lane 0 step 0 (s): source input chunk 1 lies outside rank 0's input, which holds 1 chunk"));
    CHECK(mentions(report, "rank 1 lane 0 step 1 (cpy): writes input chunk 0; input is the user's read-only send buffer"));
    CHECK(mentions(report, "rank 1 lane 1: send peer 1 is the rank itself"));
    CHECK(mentions(report, "rank 1 lane 1: receive peer 5 is not a rank of this plan"));
  }
  SECTION("a non-root reading an input it does not have") {
    Plan plan = ringPlan(Collective::Broadcast, 3, 0, 1);
    plan.ranks[2].lanes[0].steps.push_back(step(StepKind::Copy, in(0), out(0)));
    const ValidationReport report = validate(plan);
    INFO(report.text());
    CHECK(mentions(report, "rank 2 lane 0 step 1 (cpy): source input chunk 0 lies outside rank 2's input, which holds 0 chunks"));
  }
  SECTION("a bad header") {
    Plan plan = twoRankAllReduce();
    plan.outputChunks = 3;
    CHECK(mentions(validate(plan), "outputChunks 3"));
    plan = ringPlan(Collective::Broadcast, 3, 1, 1);
    plan.root = 3;
    CHECK(mentions(validate(plan), "root 3"));
  }
}

TEST_CASE("data errors: unwritten scratch, missing output, unordered lanes") {
  SECTION("reading scratch nothing wrote") {
    Plan plan = twoRankAllReduce();
    plan.scratchChunks = 1;
    plan.ranks[0].lanes.push_back({-1, -1, 0, {step(StepKind::Copy, scratchChunk(0), out(0), {{0, 1}})}});
    const ValidationReport report = validate(plan);
    INFO(report.text());
    CHECK(mentions(report, "rank 0 lane 1 step 0 (cpy): reads scratch chunk 0, which nothing has written"));
  }
  SECTION("an output never written") {
    Plan plan = twoRankAllReduce();
    plan.ranks[0].lanes[0].steps.pop_back();
    plan.ranks[0].lanes[0].recvPeer = -1;
    plan.ranks[1].lanes[0].steps[0].kind = StepKind::RecvReduceCopy;
    plan.ranks[1].lanes[0].sendPeer = -1;
    const ValidationReport report = validate(plan);
    INFO(report.text());
    CHECK(mentions(report, "rank 0 output chunk 0 is never written"));
  }
  SECTION("a wrong result names what is missing") {
    Plan plan = twoRankAllReduce();
    plan.ranks[1].lanes[0].steps[0] = step(StepKind::RecvCopySend, {}, out(0));
    const ValidationReport report = validate(plan);
    INFO(report.text());
    CHECK(mentions(report, "rank 1 output chunk 0 is wrong for allreduce: lacks rank 1 input chunk 0"));
  }
  SECTION("two lanes writing one chunk with nothing ordering them") {
    Plan plan = directPlan(Collective::AllGather, 3, 0, 1);
    // Rank 0's local lane also writes block 1, which lane 0 receives from rank 1.
    plan.ranks[0].lanes[2].steps.push_back(step(StepKind::Copy, in(0), out(1)));
    const ValidationReport report = validate(plan);
    INFO(report.text());
    CHECK(mentions(report, "rank 0 lane", "output chunk 1 while rank 0 lane"));
    CHECK(mentions(report, "with nothing ordering the two"));
  }
  SECTION("a source and destination that overlap shifted") {
    Plan plan = directPlan(Collective::AllGather, 3, 0, 1);
    plan.ranks[0].lanes[2].steps.push_back(step(StepKind::Copy, out(0, 2), out(1, 2)));
    const ValidationReport report = validate(plan);
    INFO(report.text());
    CHECK(mentions(report, "rank 0 lane 2 step 1 (cpy): source output chunks [0,2) and destination output chunks [1,3) overlap shifted"));
  }
}

TEST_CASE("validateOrThrow raises the requested code with the report") {
  Plan plan = twoRankAllReduce();
  plan.ranks[1].lanes[0].steps[0].src.count = 2;
  try {
    validateOrThrow(plan, ncclInvalidArgument);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ncclInvalidArgument);
    const std::string text = e.what();
    CHECK(text.find("plan 'hand-written' for allreduce on 2 ranks is invalid") != std::string::npos);
    CHECK(text.find("rank 1 lane 0 step 0 (rrcs)") != std::string::npos);
  }
  try {
    validateOrThrow(plan);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ncclInternalError);
  }
}
