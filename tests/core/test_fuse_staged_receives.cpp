// fuseStagedReceives: a receive into scratch followed by a copy of it to its real place becomes a receive into
// that place, only where that is the same computation (nothing else uses the scratch, the copy waits on nothing).
#include <catch2/catch.hpp>

#include <vector>

#include "core/execution.hpp"
#include "core/resolved_steps.hpp"

using namespace topoccl;
using algo::StepKind;

namespace {

constexpr size_t kSlice = 512 << 10;  // the default TOPOCCL_SLICE_BYTES

constexpr auto step = test::resolvedStep;

struct Buffers {
  std::vector<char> output = std::vector<char>(400);
  std::vector<char> scratch = std::vector<char>(400);
  char* out(size_t at) { return output.data() + at; }
  char* scr(size_t at) { return scratch.data() + at; }
};

// The staged in-place all-to-all lane: send block 1, receive the peer's block 1 into scratch, copy it over.
std::vector<core::ResolvedLane> stagedLane(Buffers& b) {
  core::ResolvedLane lane;
  lane.steps = {step(StepKind::Send, b.out(100), nullptr, 100), step(StepKind::Recv, nullptr, b.scr(100), 100),
                step(StepKind::Copy, b.scr(100), b.out(100), 100)};
  return {lane};
}

}  // namespace

TEST_CASE("a receive into scratch that is only copied to the output receives into the output") {
  Buffers b;
  auto lanes = stagedLane(b);
  CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 1);
  const auto& steps = lanes[0].steps;
  CHECK(steps[0].kind == StepKind::Send);
  CHECK(steps[1].kind == StepKind::Recv);
  CHECK(steps[1].dst == b.out(100));
  CHECK(steps[1].bytes == 100);
  CHECK(steps[1].intoSentBytes);  // the lane's Send reads the same bytes: a peer has just read them
  CHECK(steps[2].kind == StepKind::Nop);  // the step numbers stay, for other lanes' dependencies
  CHECK(steps[2].bytes == 0);
}

TEST_CASE("receives stay staged where fusing would change what the plan computes") {
  Buffers b;
  SECTION("another lane reads the scratch") {
    auto lanes = stagedLane(b);
    core::ResolvedLane reader;
    reader.steps = {step(StepKind::Send, b.scr(150), nullptr, 10)};
    lanes.push_back(reader);
    CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 0);
    CHECK(lanes[0].steps[1].dst == b.scr(100));
    CHECK(lanes[0].steps[2].kind == StepKind::Copy);
  }
  SECTION("a later step of the same lane writes the scratch") {
    auto lanes = stagedLane(b);
    lanes[0].steps.push_back(step(StepKind::Copy, b.out(0), b.scr(199), 1));
    CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 0);
  }
  SECTION("the copy waits on another lane") {
    auto lanes = stagedLane(b);
    lanes[0].steps[2].deps.push_back({1, 0});
    CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 0);
  }
  SECTION("the receive lands in the output, not in scratch") {
    auto lanes = stagedLane(b);
    lanes[0].steps[1].dst = b.out(300);
    lanes[0].steps[2].src = b.out(300);
    CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 0);
  }
  SECTION("the copy moves only part of what was received, or other bytes") {
    auto lanes = stagedLane(b);
    lanes[0].steps[2].bytes = 50;
    CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 0);
    lanes = stagedLane(b);
    lanes[0].steps[2].src = b.scr(101);
    CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 0);
  }
  SECTION("no scratch at all") {
    auto lanes = stagedLane(b);
    CHECK(core::fuseStagedReceives(lanes, nullptr, 0, kSlice) == 0);
  }
  SECTION("slices that may not fit a bounce slot") {
    auto lanes = stagedLane(b);
    CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), core::Execution::kMaxBounceSliceBytes + 1) == 0);
    CHECK(lanes[0].steps[1].dst == b.scr(100));
    CHECK(lanes[0].steps[2].kind == StepKind::Copy);
    CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), core::Execution::kMaxBounceSliceBytes) == 1);
  }
}

TEST_CASE("a fused receive into bytes no send reads is not marked as receiving into sent bytes") {
  Buffers b;
  auto lanes = stagedLane(b);
  lanes[0].steps[0].src = b.out(0);  // the send reads [0, 100), the receive lands in [100, 200)
  CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 1);
  CHECK_FALSE(lanes[0].steps[1].intoSentBytes);
  // A send on another lane that reads the destination counts too.
  auto two = stagedLane(b);
  two[0].steps[0].src = b.out(0);
  core::ResolvedLane other;
  other.steps = {step(StepKind::Send, b.out(150), nullptr, 10)};
  two.push_back(other);
  CHECK(core::fuseStagedReceives(two, b.scr(0), b.scratch.size(), kSlice) == 1);
  CHECK(two[0].steps[1].intoSentBytes);
}

TEST_CASE("a receive-reduce into scratch copied over its own operand reduces in place, a shifted operand stays staged") {
  Buffers b;
  // 2-rank recursive doubling in place: send the buffer, reduce the peer's into scratch with it, copy it back.
  core::ResolvedLane lane;
  lane.steps = {step(StepKind::Send, b.out(0), nullptr, 100), step(StepKind::RecvReduceCopy, b.out(0), b.scr(0), 100),
                step(StepKind::Copy, b.scr(0), b.out(0), 100)};
  std::vector<core::ResolvedLane> lanes{lane};
  CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 1);
  CHECK(lanes[0].steps[1].kind == StepKind::RecvReduceCopy);
  CHECK(lanes[0].steps[1].src == b.out(0));  // the operand, element for element under the result
  CHECK(lanes[0].steps[1].dst == b.out(0));
  CHECK(lanes[0].steps[1].intoSentBytes);
  CHECK(lanes[0].steps[2].kind == StepKind::Nop);
  SECTION("an operand apart from the destination fuses too") {
    lanes = {lane};
    lanes[0].steps[1].src = b.out(200);
    CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 1);
    CHECK(lanes[0].steps[1].dst == b.out(0));
  }
  SECTION("an operand that overlaps the destination shifted: a slice's result would overwrite a later slice's operand") {
    lanes = {lane};
    lanes[0].steps[1].src = b.out(50);
    CHECK(core::fuseStagedReceives(lanes, b.scr(0), b.scratch.size(), kSlice) == 0);
    CHECK(lanes[0].steps[1].dst == b.scr(0));
    CHECK(lanes[0].steps[2].kind == StepKind::Copy);
  }
}
