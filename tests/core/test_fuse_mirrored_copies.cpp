// fuseMirroredCopies: a Send and a later Copy of the same bytes in its lane become one mirrored send (the peer
// writes the Copy's destination), only where that is the same computation: nothing else of the rank reads or
// writes the destination, nothing writes the source, and the Copy waits on nothing but its lane.
#include <catch2/catch.hpp>

#include <vector>

#include "core/execution.hpp"
#include "core/resolved_steps.hpp"

using namespace topoccl;
using algo::StepKind;

namespace {

constexpr auto step = test::resolvedStep;

struct Buffers {
  std::vector<char> input = std::vector<char>(100);
  std::vector<char> output = std::vector<char>(400);
  char* in(size_t at) { return input.data() + at; }
  char* out(size_t at) { return output.data() + at; }
};

// A 2-rank ring all-gather lane, out of place: send our block, receive the peer's, copy ours into the output.
std::vector<core::ResolvedLane> allGatherLane(Buffers& b) {
  core::ResolvedLane lane;
  lane.steps = {step(StepKind::Send, b.in(0), nullptr, 100), step(StepKind::Recv, nullptr, b.out(100), 100),
                step(StepKind::Copy, b.in(0), b.out(0), 100)};
  return {lane};
}

}  // namespace

TEST_CASE("an out-of-place all-gather's send of its own block mirrors the copy of that block") {
  Buffers b;
  auto lanes = allGatherLane(b);
  CHECK(core::fuseMirroredCopies(lanes) == 1);
  const auto& steps = lanes[0].steps;
  CHECK(steps[0].mirror == b.out(0));
  CHECK(steps[0].mirrorCopyStep == 2);
  CHECK(steps[2].kind == StepKind::Copy);  // kept: it runs wherever the connection cannot mirror
  CHECK(steps[1].mirror == nullptr);
  CHECK(core::fuseMirroredCopies(lanes) == 0);  // marked once
}

TEST_CASE("sends stay plain where a mirror would change what the plan computes") {
  Buffers b;
  auto lanes = allGatherLane(b);
  SECTION("another lane reads the copy's destination") {
    core::ResolvedLane reader;
    reader.steps = {step(StepKind::Send, b.out(50), nullptr, 10)};
    lanes.push_back(reader);
  }
  SECTION("a step of the same lane writes the copy's destination") {
    lanes[0].steps[1].dst = b.out(0);
  }
  SECTION("a later step writes the source") {
    lanes[0].steps.push_back(step(StepKind::Copy, b.out(300), b.in(99), 1));
  }
  SECTION("the copy waits on another lane") {
    lanes[0].steps[2].deps.push_back({1, 0});
  }
  SECTION("the copy moves other bytes") {
    lanes[0].steps[2].bytes = 99;
  }
  SECTION("the copy comes from elsewhere") {
    lanes[0].steps[2].src = b.in(1);
    lanes[0].steps[2].bytes = 99;
    lanes[0].steps[0].bytes = 99;
  }
  SECTION("the copy is in another lane") {
    core::ResolvedLane other;
    other.steps = {lanes[0].steps[2]};
    lanes[0].steps.pop_back();
    lanes.push_back(other);
  }
  CHECK(core::fuseMirroredCopies(lanes) == 0);
  for (const auto& lane : lanes)
    for (const auto& s : lane.steps) CHECK(s.mirror == nullptr);
}

TEST_CASE("two sends of one block in a lane mirror its copy once") {
  Buffers b;
  core::ResolvedLane lane;
  lane.steps = {step(StepKind::Send, b.in(0), nullptr, 100), step(StepKind::Send, b.in(0), nullptr, 100),
                step(StepKind::Copy, b.in(0), b.out(0), 100)};
  std::vector<core::ResolvedLane> lanes = {lane};
  CHECK(core::fuseMirroredCopies(lanes) == 1);
  CHECK(lanes[0].steps[0].mirror == b.out(0));
  CHECK(lanes[0].steps[1].mirror == nullptr);
}
