// CopyTuner (core/copy_tuner.hpp): which copy kernel each call of a shape runs, given the times reported. A model
// machine gives each kernel a cost with noise and can swap them mid-run, as a VM's neighbours do.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>

#include "core/copy_tuner.hpp"

using topoccl::core::CopyKernel;
using topoccl::core::CopyTuner;

namespace {

// Runs `calls` calls of `shape`; costs[k] is kernel k's time, multiplied by up to +-noise. Returns how many calls
// ran the streaming kernel among the calls in [countFrom, calls).
size_t runCalls(CopyTuner& tuner, const CopyTuner::Shape& shape, size_t calls, const double (&costs)[2], double noise,
                std::mt19937& rng, size_t countFrom = 0, CopyKernel fallback = CopyKernel::Cached) {
  std::uniform_real_distribution<double> jitter(1 - noise, 1 + noise);
  size_t streaming = 0;
  for (size_t i = 0; i < calls; ++i) {
    const CopyTuner::Ticket ticket = tuner.begin(shape, fallback);
    if (i >= countFrom && ticket.kernel == CopyKernel::Streaming) ++streaming;
    tuner.finish(ticket, costs[static_cast<size_t>(ticket.kernel)] * jitter(rng));
  }
  return streaming;
}

}  // namespace

TEST_CASE("copy tuner: the first call runs the fallback untimed, then each kernel three times, the last two timed") {
  struct Case {
    double rival[2], fallback[2];
    bool rivalWins;
  };
  // The lower medians (the faster of each pair) decide; the rival must be 5% faster to displace the fallback.
  const Case cases[] = {{{250, 260}, {120, 100}, false}, {{90, 300}, {100, 110}, true}, {{97, 98}, {100, 100}, false}};
  for (const Case& c : cases) {
    for (const CopyKernel fallback : {CopyKernel::Cached, CopyKernel::Streaming}) {
      const CopyKernel rival = fallback == CopyKernel::Cached ? CopyKernel::Streaming : CopyKernel::Cached;
      CopyTuner tuner;
      const CopyTuner::Shape shape{&tuner, 1 << 20};
      const auto first = tuner.begin(shape, fallback);
      CHECK(first.kernel == fallback);
      CHECK_FALSE(first.timed);
      tuner.finish(first, 1.0);  // untimed: ignored, however fast
      // The first call of each run pays for the other kernel's dirty lines and is not counted, however slow.
      const CopyKernel order[] = {rival, rival, rival, fallback, fallback, fallback};
      const double times[] = {5000.0, c.rival[0], c.rival[1], 9000.0, c.fallback[0], c.fallback[1]};
      for (int i = 0; i < 6; ++i) {
        const auto ticket = tuner.begin(shape, fallback);
        CHECK(ticket.kernel == order[i]);
        CHECK(ticket.timed);
        CHECK(ticket.steady == (i % 3 != 0));
        tuner.finish(ticket, times[i]);
      }
      const auto* estimate = tuner.estimate(shape);
      REQUIRE(estimate != nullptr);
      CHECK(estimate->samples[0] == 2);
      CHECK(estimate->samples[1] == 2);
      CHECK(estimate->nanoseconds(fallback) == std::min(c.fallback[0], c.fallback[1]));
      CHECK(estimate->nanoseconds(rival) == std::min(c.rival[0], c.rival[1]));
      const CopyKernel winner = c.rivalWins ? rival : fallback;
      CHECK(estimate->preferred == winner);
      CHECK(tuner.begin(shape, fallback).kernel == winner);
    }
  }
}

TEST_CASE("copy tuner: a kernel's estimate is the lower median of its last four steady times") {
  CopyTuner tuner;
  const CopyTuner::Shape shape{&tuner, 1};
  (void)tuner.begin(shape, CopyKernel::Cached);
  for (int i = 0; i < 6; ++i) {  // streaming three times (1000 counted twice), then cached (100 counted twice)
    const auto ticket = tuner.begin(shape, CopyKernel::Cached);
    tuner.finish(ticket, ticket.kernel == CopyKernel::Streaming ? 1000.0 : 100.0);
  }
  REQUIRE(tuner.estimate(shape)->preferred == CopyKernel::Cached);
  // Cached goes on: 900 (a burst), then 110, 120, 130: the window holds 900 110 120 130 -> 120.
  const double more[] = {900, 110, 120, 130};
  for (size_t i = 0; i < std::size(more); ++i) {
    const auto ticket = tuner.begin(shape, CopyKernel::Cached);
    REQUIRE(ticket.kernel == CopyKernel::Cached);
    REQUIRE(ticket.steady);
    tuner.finish(ticket, more[i]);
    if (i == 0) CHECK(tuner.estimate(shape)->nanoseconds(CopyKernel::Cached) == 100.0);  // {100, 100, 900}
  }
  CHECK(tuner.estimate(shape)->nanoseconds(CopyKernel::Cached) == 120.0);
  CHECK(tuner.estimate(shape)->nanoseconds(CopyKernel::Streaming) == 1000.0);
}

TEST_CASE("copy tuner: follows the faster kernel, explores the other one call in 16, and notices a swap") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  CopyTuner tuner;
  const CopyTuner::Shape shape{&tuner, 8 << 20};
  // Streaming twice as fast (a VM whose cache a neighbour thrashes).
  const double streamingFaster[2] = {2000, 1000};
  const size_t streaming = runCalls(tuner, shape, 320, streamingFaster, 0.2, rng, 64);
  // After settling, every call but the exploring ones streams: calls 64..319 hold 4 explorations of 2 calls.
  CHECK(streaming == 256 - 8);
  CHECK(tuner.estimate(shape)->preferred == CopyKernel::Streaming);
  // The neighbour leaves (from call 320): cached copies become twice as fast. The second exploration from then
  // (calls 384 and 385) makes that the median of cached's window, and cached takes over.
  const double cachedFaster[2] = {1000, 2000};
  const size_t streamingAfter = runCalls(tuner, shape, 320, cachedFaster, 0.2, rng, 160);
  CHECK(tuner.estimate(shape)->preferred == CopyKernel::Cached);
  CHECK(streamingAfter == 4);  // calls 480..639: only the explorations at 512-513 and 576-577 stream
}

TEST_CASE("copy tuner: kernels within the noise of each other do not flip back and forth") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  CopyTuner tuner;
  const CopyTuner::Shape shape{&tuner, 4 << 20};
  const double level[2] = {1000, 1000};
  std::uniform_real_distribution<double> jitter(0.99, 1.01);
  int flips = 0;
  CopyKernel last = CopyKernel::Cached;
  for (int i = 0; i < 2000; ++i) {
    const auto ticket = tuner.begin(shape, CopyKernel::Cached);
    tuner.finish(ticket, level[static_cast<size_t>(ticket.kernel)] * jitter(rng));
    const CopyKernel now = tuner.estimate(shape)->preferred;
    flips += i > 6 && now != last;  // the first choice is made at call 6
    last = now;
  }
  CHECK(flips == 0);
}

TEST_CASE("copy tuner: shapes are timed apart, past the table's size new shapes run their fallback untimed") {
  std::mt19937 rng(7);
  CopyTuner tuner;
  int plans[2];
  const CopyTuner::Shape a{&plans[0], 1 << 20}, b{&plans[1], 1 << 20}, c{&plans[0], 2 << 20};
  const double streamingFaster[2] = {2000, 1000}, cachedFaster[2] = {1000, 2000};
  runCalls(tuner, a, 40, streamingFaster, 0.1, rng);
  runCalls(tuner, b, 40, cachedFaster, 0.1, rng);
  runCalls(tuner, c, 40, streamingFaster, 0.1, rng);
  CHECK(tuner.estimate(a)->preferred == CopyKernel::Streaming);
  CHECK(tuner.estimate(b)->preferred == CopyKernel::Cached);
  CHECK(tuner.estimate(c)->preferred == CopyKernel::Streaming);
  CHECK(tuner.shapes() == 3);

  std::vector<char> more(CopyTuner::kMaxShapes);
  for (char& plan : more) (void)tuner.begin(CopyTuner::Shape{&plan, 64}, CopyKernel::Cached);
  CHECK(tuner.shapes() == CopyTuner::kMaxShapes);
  const CopyTuner::Shape late{&more.back(), 65};
  for (int i = 0; i < 5; ++i) {
    const auto ticket = tuner.begin(late, CopyKernel::Streaming);
    CHECK(ticket.kernel == CopyKernel::Streaming);
    CHECK_FALSE(ticket.timed);
    tuner.finish(ticket, 5.0);
  }
  CHECK(tuner.estimate(late) == nullptr);
  // Shapes already known keep being timed.
  CHECK(tuner.begin(a, CopyKernel::Cached).timed);
}

TEST_CASE("copy tuner: a time that is not a number or negative is ignored") {
  CopyTuner tuner;
  const CopyTuner::Shape shape{&tuner, 1};
  (void)tuner.begin(shape, CopyKernel::Cached);
  (void)tuner.begin(shape, CopyKernel::Cached);  // streaming, not steady
  const auto ticket = tuner.begin(shape, CopyKernel::Cached);
  REQUIRE(ticket.steady);
  tuner.finish(ticket, std::numeric_limits<double>::quiet_NaN());
  tuner.finish(ticket, -3.0);
  CHECK(tuner.estimate(shape)->samples[static_cast<size_t>(ticket.kernel)] == 0);
  CHECK(tuner.estimate(shape)->nanoseconds(ticket.kernel) == 0.0);
  tuner.finish(ticket, 10.0);
  CHECK(tuner.estimate(shape)->samples[static_cast<size_t>(ticket.kernel)] == 1);
  CHECK(tuner.estimate(shape)->nanoseconds(ticket.kernel) == 10.0);
}
