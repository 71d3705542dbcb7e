// The communicator reuses the last collective's resolved execution when the next call has the same plan,
// buffers, count and type (the per-call path of a training loop). Repeated calls with fresh data, calls that
// alternate between sizes, ops and buffers (so the cached execution is replaced, and the staging arena grows
// underneath it) must all stay correct.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "nccl.h"

TEST_CASE("repeated and alternating all-reduces reuse executions and stay correct (3 thread ranks)") {
  constexpr int kRanks = 3;
  const uint32_t seed = std::random_device{}();
  WARN("repeat test seed " << seed);
  ncclComm_t comms[kRanks];
  REQUIRE(ncclCommInitAll(comms, kRanks, nullptr) == ncclSuccess);
  const size_t small = 1031, large = 300007;  // primes: unaligned slices
  std::vector<std::vector<int32_t>> a(kRanks), b(kRanks), out(kRanks);
  long long wrong[kRanks] = {};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      a[r].resize(large);
      b[r].resize(large);
      out[r].resize(large);
      for (int round = 0; round < 12; ++round) {
        // Rounds 0-3 repeat one call; then calls alternate between buffers, sizes and ops.
        const bool useB = round >= 4 && round % 2 == 1;
        const size_t count = round >= 4 && round % 3 == 0 ? large : small;
        const ncclRedOp_t op = round >= 8 && round % 2 == 0 ? ncclMax : ncclSum;
        std::vector<int32_t>& in = useB ? b[r] : a[r];
        for (size_t i = 0; i < count; ++i)
          in[i] = static_cast<int32_t>((i * 2654435761u + static_cast<uint32_t>(round) * 97u + static_cast<uint32_t>(r) * 31u + seed) % 1000);
        if (ncclAllReduce(in.data(), out[r].data(), count, ncclInt32, op, comms[r], nullptr) != ncclSuccess) {
          wrong[r] += 1000000;
          return;
        }
        for (size_t i = 0; i < count; ++i) {
          int64_t want = op == ncclMax ? INT64_MIN : 0;
          for (int q = 0; q < kRanks; ++q) {
            const auto v = static_cast<int64_t>((i * 2654435761u + static_cast<uint32_t>(round) * 97u + static_cast<uint32_t>(q) * 31u + seed) % 1000);
            want = op == ncclMax ? std::max(want, v) : want + v;
          }
          wrong[r] += out[r][i] != want;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(wrong[r] == 0);
  }
  for (auto* c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
}

// The same call again skips plan selection and reuses its execution outright, unless the last call needed
// per-call work. In-place all-to-all (it stages through scratch) repeated, then a larger one that regrows the
// scratch under the cached execution, then the small one again; all-reduces whose operator carries a per-call
// scalar (PreMulSum, which prescales the input each call) or a final division (Avg), repeated on the same buffers.
TEST_CASE("the same call reuses its execution, scratch regrowth and per-call scalars stay correct (3 thread ranks)") {
  constexpr int kRanks = 3;
  const uint32_t seed = std::random_device{}();
  WARN("repeat test seed " << seed);
  ncclComm_t comms[kRanks];
  REQUIRE(ncclCommInitAll(comms, kRanks, nullptr) == ncclSuccess);
  const size_t small = 257, large = 100003;  // elements per block
  long long wrong[kRanks] = {};
  auto value = [&](int rank, size_t i, int round) {
    return static_cast<int32_t>((i * 2654435761u + static_cast<uint32_t>(round) * 97u + static_cast<uint32_t>(rank) * 31u + seed) % 1000);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<int32_t> buffer(large * kRanks);
      const size_t counts[] = {small, small, small, large, small, small};
      for (int round = 0; round < 6; ++round) {
        const size_t count = counts[round];
        for (size_t i = 0; i < count * kRanks; ++i) buffer[i] = value(r, i, round);
        if (ncclAlltoAll(buffer.data(), buffer.data(), count, ncclInt32, comms[r], nullptr) != ncclSuccess) {
          wrong[r] += 1000000;
          return;
        }
        // Block q of rank r's output is block r of rank q's input.
        for (int q = 0; q < kRanks; ++q)
          for (size_t i = 0; i < count; ++i) wrong[r] += buffer[q * count + i] != value(q, r * count + i, round);
      }
      std::vector<int32_t> in(small), out(small);
      for (int round = 0; round < 6; ++round) {
        for (size_t i = 0; i < small; ++i) in[i] = value(r, i, round);
        // Avg twice, PreMulSum by 2, by 3 twice (the same call, but its input is prescaled per call), Avg.
        const int32_t scalar = round == 2 ? 2 : 3;
        ncclRedOp_t op = ncclAvg;
        const bool premul = round >= 2 && round <= 4;
        if (premul && ncclRedOpCreatePreMulSum(&op, const_cast<int32_t*>(&scalar), ncclInt32, ncclScalarHostImmediate, comms[r]) != ncclSuccess) {
          wrong[r] += 1000000;
          return;
        }
        if (ncclAllReduce(in.data(), out.data(), small, ncclInt32, op, comms[r], nullptr) != ncclSuccess) wrong[r] += 1000000;
        if (premul) ncclRedOpDestroy(op, comms[r]);
        for (size_t i = 0; i < small; ++i) {
          int64_t sum = 0;
          for (int q = 0; q < kRanks; ++q) sum += value(q, i, round);
          const int64_t want = premul ? sum * scalar : sum / kRanks;
          wrong[r] += out[i] != want;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(wrong[r] == 0);
  }
  for (auto* c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
}

// With TOPOCCL_COPY_TUNING_BYTES=1 every out-of-place call without a reduction is timed (core/copy_tuner.hpp): a
// shape's calls 1-3 copy with the kernel its first did not, 4-6 with that one, then the faster, so over 40 calls
// of each shape both kernels run on one reused execution. In place (not timed) follows. Fresh data each call.
// Both cached copies: the CPU's string copy and, with TOPOCCL_BULK_COPY=0, memcpy.
TEST_CASE("timed copies switch kernels between calls of one shape and stay correct (3 thread ranks)") {
  constexpr int kRanks = 3, kRounds = 40, kRoot = 1;
  const uint32_t seed = std::random_device{}();
  WARN("timed copies test seed " << seed);
  const char* bulkCopy = GENERATE("1", "0");
  INFO("TOPOCCL_BULK_COPY=" << bulkCopy);
  setenv("TOPOCCL_COPY_TUNING_BYTES", "1", 1);
  setenv("TOPOCCL_BULK_COPY", bulkCopy, 1);
  ncclComm_t comms[kRanks];
  REQUIRE(ncclCommInitAll(comms, kRanks, nullptr) == ncclSuccess);
  unsetenv("TOPOCCL_COPY_TUNING_BYTES");
  unsetenv("TOPOCCL_BULK_COPY");
  const size_t count = 10007;  // elements per block: a prime, so slices end unaligned
  auto value = [&](int rank, size_t i, int round) {
    return static_cast<int32_t>((i * 2654435761u + static_cast<uint32_t>(round) * 7919u + static_cast<uint32_t>(rank) * 31u) ^ seed);
  };
  long long wrong[kRanks] = {};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<int32_t> in(count * kRanks), out(count * kRanks);
      for (const bool inPlace : {false, true}) {
        for (int round = 0; round < kRounds; ++round) {
          // All-to-all: block q of rank r's output is block r of rank q's input.
          int32_t* data = inPlace ? out.data() : in.data();
          for (size_t i = 0; i < count * kRanks; ++i) data[i] = value(r, i, round);
          if (ncclAlltoAll(data, out.data(), count, ncclInt32, comms[r], nullptr) != ncclSuccess) wrong[r] += 1000000;
          for (int q = 0; q < kRanks; ++q)
            for (size_t i = 0; i < count; ++i) wrong[r] += out[q * count + i] != value(q, r * count + i, round);
          // All-gather: block q of the output is rank q's input (in place: already at block r).
          int32_t* mine = inPlace ? out.data() + r * count : in.data();
          for (size_t i = 0; i < count; ++i) mine[i] = value(r, i, round + kRounds);
          if (ncclAllGather(mine, out.data(), count, ncclInt32, comms[r], nullptr) != ncclSuccess) wrong[r] += 1000000;
          for (int q = 0; q < kRanks; ++q)
            for (size_t i = 0; i < count; ++i) wrong[r] += out[q * count + i] != value(q, i, round + kRounds);
          // Broadcast from kRoot.
          int32_t* source = inPlace ? out.data() : in.data();
          for (size_t i = 0; i < count; ++i) source[i] = value(r, i, round + 2 * kRounds);
          if (ncclBroadcast(source, out.data(), count, ncclInt32, kRoot, comms[r], nullptr) != ncclSuccess) wrong[r] += 1000000;
          for (size_t i = 0; i < count; ++i) wrong[r] += out[i] != value(kRoot, i, round + 2 * kRounds);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    CHECK(wrong[r] == 0);
  }
  for (auto* c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
}
