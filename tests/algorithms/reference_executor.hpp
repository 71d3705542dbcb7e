// A numeric reference executor for tests: runs a Plan for all ranks in one thread on float64 data,
// following the executor rules (lanes in order, deps, k-th send matches k-th receive, sends read
// their source when the peer receives, writes to a source still in flight wait), picking the next
// ready lane at random so different interleavings get exercised. Outputs are compared with a
// reference computed straight from the collective's definition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "algorithms/plan.hpp"

namespace topoccl::algo::testing {

struct RunOptions {
  size_t blockCount = 7;  // elements per block (the collective's per-rank count)
  bool inPlace = false;   // alias Input and Output as NCCL's in-place layout does
  uint64_t seed = 1;      // inputs and schedule
};

// Empty on success; otherwise what went wrong (deadlock, wrong element, modified input).
std::string runAndCheck(const Plan& plan, const RunOptions& options);

}  // namespace topoccl::algo::testing
