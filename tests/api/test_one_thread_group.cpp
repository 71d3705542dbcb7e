// One thread drives several ranks' communicators in one group (nccl-tests' -g, ncclCommInitAll's ranks): small
// groups move a pass at a time on the calling thread, interleaved; large ones go through each rank's engine.
// Both must compute the same results, and a rank that never calls must fail the group within the timeout.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nccl.h"

namespace {

constexpr int kRanks = 3;  // not a power of two

struct Comms {
  ncclComm_t comms[kRanks] = {};
  Comms() { REQUIRE(ncclCommInitAll(comms, kRanks, nullptr) == ncclSuccess); }
  ~Comms() {
    for (ncclComm_t c : comms)
      if (c) ncclCommAbort(c);
  }
};

}  // namespace

TEST_CASE("one thread drives 3 ranks' groups: all-reduce, all-gather and a send/recv ring, small and large, exact") {
  Comms c;
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_int_distribution<int32_t> value(-1000000, 1000000);
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  // 1-1031 elements stay under the interleaving bound; 100003 x 3 ranks x (4 + 12 + 4) bytes is past it.
  for (size_t count : {size_t{1}, size_t{7}, size_t{1031}, size_t{100003}, size_t{2}}) {
    INFO(count << " elements per rank");
    std::vector<std::vector<int32_t>> in(kRanks), sum(kRanks), gathered(kRanks), passed(kRanks);
    std::vector<std::vector<float>> reals(kRanks), realSum(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      in[r].resize(count);
      reals[r].resize(count);
      for (auto& v : in[r]) v = value(rng);
      for (auto& v : reals[r]) v = real(rng);
      sum[r].assign(count, 0);
      gathered[r].assign(count * kRanks, 0);
      passed[r].assign(count, 0);
      realSum[r].assign(count, 0.0f);
    }
    REQUIRE(ncclGroupStart() == ncclSuccess);
    for (int r = 0; r < kRanks; ++r) {
      REQUIRE(ncclAllReduce(in[r].data(), sum[r].data(), count, ncclInt32, ncclSum, c.comms[r], nullptr) == ncclSuccess);
      REQUIRE(ncclAllReduce(reals[r].data(), realSum[r].data(), count, ncclFloat, ncclSum, c.comms[r], nullptr) == ncclSuccess);
      REQUIRE(ncclAllGather(in[r].data(), gathered[r].data(), count, ncclInt32, c.comms[r], nullptr) == ncclSuccess);
      REQUIRE(ncclSend(in[r].data(), count, ncclInt32, (r + 1) % kRanks, c.comms[r], nullptr) == ncclSuccess);
      REQUIRE(ncclRecv(passed[r].data(), count, ncclInt32, (r + kRanks - 1) % kRanks, c.comms[r], nullptr) == ncclSuccess);
    }
    REQUIRE(ncclGroupEnd() == ncclSuccess);
    long long wrong = 0, inexact = 0;
    for (int r = 0; r < kRanks; ++r)
      for (size_t i = 0; i < count; ++i) {
        int64_t want = 0;
        double realWant = 0;
        for (int q = 0; q < kRanks; ++q) want += in[q][i], realWant += reals[q][i];
        wrong += sum[r][i] != want;
        // Three float terms: at most two roundings of about 2^-24 of the largest partial sum (< 3).
        inexact += std::abs(static_cast<double>(realSum[r][i]) - realWant) > 4e-7;
        for (int q = 0; q < kRanks; ++q) wrong += gathered[r][q * count + i] != in[q][i];
        wrong += passed[r][i] != in[(r + kRanks - 1) % kRanks][i];
      }
    CHECK(wrong == 0);
    CHECK(inexact == 0);
  }
}

TEST_CASE("one thread drives 2 of 3 ranks' group while the third never calls: the group fails within the timeout") {
  setenv("TOPOCCL_TIMEOUT_MS", "1500", 1);
  Comms c;
  unsetenv("TOPOCCL_TIMEOUT_MS");
  std::vector<float> in(64, 1.0f), out0(64), out1(64);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(in.data(), out0.data(), in.size(), ncclFloat, ncclSum, c.comms[0], nullptr) == ncclSuccess);
  REQUIRE(ncclAllReduce(in.data(), out1.data(), in.size(), ncclFloat, ncclSum, c.comms[1], nullptr) == ncclSuccess);
  const ncclResult_t result = ncclGroupEnd();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string text = ncclGetLastError(nullptr);
  INFO(text);
  CHECK(result == ncclRemoteError);
  CHECK(text.find("made no progress") != std::string::npos);
  CHECK(text.find("TOPOCCL_TIMEOUT_MS") != std::string::npos);
  CHECK(seconds < 30);  // bounded: 1.5 s of silence, then the error
  // Both communicators carry the failure from here on.
  ncclResult_t async = ncclSuccess;
  CHECK(ncclCommGetAsyncError(c.comms[0], &async) == ncclSuccess);
  CHECK(async != ncclSuccess);
}

TEST_CASE("a communicator whose share of an interleaved group is done is released before the rest of the group") {
  // One thread drives a 1-rank communicator (done at once) and rank 0 of a 2-rank one whose rank 1 never calls (it
  // fails after the timeout). Another thread finalizes the first meanwhile: that must return while the group still
  // waits, as it would with each share on its own engine.
  setenv("TOPOCCL_TIMEOUT_MS", "4000", 1);
  ncclComm_t single = nullptr, pair[2] = {};
  REQUIRE(ncclCommInitAll(&single, 1, nullptr) == ncclSuccess);
  REQUIRE(ncclCommInitAll(pair, 2, nullptr) == ncclSuccess);
  unsetenv("TOPOCCL_TIMEOUT_MS");
  std::vector<float> in(16, 1.0f), out(16), out0(16);
  std::atomic<bool> groupEnded{false}, finalizedDuringGroup{false}, finalizeDone{false};
  ncclResult_t finalizeResult = ncclInternalError;
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    finalizeResult = ncclCommFinalize(single);
    finalizedDuringGroup = !groupEnded.load();
    finalizeDone = true;
  });
  REQUIRE(ncclGroupStart() == ncclSuccess);
  REQUIRE(ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat, ncclSum, single, nullptr) == ncclSuccess);
  REQUIRE(ncclAllReduce(in.data(), out0.data(), in.size(), ncclFloat, ncclSum, pair[0], nullptr) == ncclSuccess);
  const ncclResult_t result = ncclGroupEnd();
  groupEnded = true;
  other.join();
  CHECK(result == ncclRemoteError);  // rank 1 of the pair never called
  CHECK(finalizeResult == ncclSuccess);
  CHECK(finalizeDone);
  CHECK(finalizedDuringGroup);
  CHECK(out == in);  // the 1-rank all-reduce: the input itself
  ncclCommDestroy(single);
  ncclCommAbort(pair[0]);
  ncclCommAbort(pair[1]);
}
