// What every GPU test program starts with: skip (exit 77, "skipped: no GPU") where there is no GPU, else a
// fresh seed, printed so a failure can be replayed with TOPOCCL_TEST_SEED.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <optional>
#include <string>

#include "../kernels/reference.hpp"

namespace topoccl::kernels::test {

// Failures are counted and printed as "FAILED: ..." (ctest's FAIL_REGULAR_EXPRESSION); the program's exit code
// comes from `failures`.
inline int failures = 0;

inline void fail(const std::string& what) {
  std::printf("FAILED: %s\n", what.c_str());
  ++failures;
}

inline bool ok(cudaError_t status, const std::string& what) {
  if (status == cudaSuccess) return true;
  fail(what + ": " + cudaGetErrorString(status));
  return false;
}

// The run's seed, or nothing when this machine has no usable GPU (the caller returns kSkipped).
inline constexpr int kSkipped = 77;
inline std::optional<uint64_t> startGpuTest(int* devices) {
  *devices = 0;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run killed by a timeout still shows how far it got
  if (cudaGetDeviceCount(devices) != cudaSuccess || *devices == 0) {
    std::printf("skipped: no GPU\n");
    return std::nullopt;
  }
  const uint64_t seed = testSeed();
  std::printf("seed %llu (TOPOCCL_TEST_SEED replays it)\n", static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace topoccl::kernels::test
