// Counts above 2^31: offsets and sizes are size_t all the way through plans, executor and kernels.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "nccl.h"

TEST_CASE("in-place all-reduce of more than 2^31 int8 elements on two thread ranks") {
  const size_t count = (size_t{1} << 31) + 7;
  ncclComm_t comms[2];
  REQUIRE(ncclCommInitAll(comms, 2, nullptr) == ncclSuccess);
  std::unique_ptr<int8_t[]> buffers[2] = {std::make_unique<int8_t[]>(count), std::make_unique<int8_t[]>(count)};
  auto value = [](int rank, size_t i) { return static_cast<int8_t>(((i * 7) ^ (i >> 29)) + rank * 3) & 0x3f; };
  ncclResult_t results[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      int8_t* b = buffers[r].get();
      for (size_t i = 0; i < count; ++i) b[i] = value(r, i);
      results[r] = ncclAllReduce(b, b, count, ncclInt8, ncclSum, comms[r], nullptr);
    });
  for (auto& t : threads) t.join();
  CHECK(results[0] == ncclSuccess);
  CHECK(results[1] == ncclSuccess);
  size_t wrong = 0;
  auto check = [&](size_t i) {
    const auto want = static_cast<int8_t>(value(0, i) + value(1, i));
    wrong += buffers[0][i] != want;
    wrong += buffers[1][i] != want;
  };
  for (size_t i = 0; i < count; i += 4093) check(i);
  for (size_t i = (size_t{1} << 31) - 64; i < count; ++i) check(i);  // around and past the 2^31 boundary
  CHECK(wrong == 0);
  for (auto* c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
}
