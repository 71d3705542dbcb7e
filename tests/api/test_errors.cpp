// Every entry point rejects bad input with NCCL's code, and ncclGetLastError names the argument.
#include <catch2/catch.hpp>

#include <climits>
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "nccl.h"
#include "topoccl/nccl_ext.h"

namespace {

std::string lastError() { return ncclGetLastError(nullptr); }

// Expects `code` and a last-error text containing every word in `mentions`.
#define EXPECT_ERROR(call, code, ...)                                   \
  do {                                                                  \
    const ncclResult_t result_ = (call);                                \
    INFO(#call << " -> " << ncclGetErrorString(result_) << ": " << lastError()); \
    CHECK(result_ == (code));                                           \
    for (const char* word : {__VA_ARGS__}) CHECK_THAT(lastError(), Catch::Contains(word)); \
  } while (0)

struct TwoRanks {
  ncclComm_t comms[2] = {nullptr, nullptr};
  TwoRanks() { REQUIRE(ncclCommInitAll(comms, 2, nullptr) == ncclSuccess); }
  ~TwoRanks() {
    for (auto* c : comms)
      if (c) ncclCommDestroy(c);
  }
};

}  // namespace

TEST_CASE("version, unique id and error strings") {
  int version = 0;
  CHECK(ncclGetVersion(&version) == ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);
  EXPECT_ERROR(ncclGetVersion(nullptr), ncclInvalidArgument, "version");
  EXPECT_ERROR(ncclGetUniqueId(nullptr), ncclInvalidArgument, "uniqueId");
  for (int code = 0; code <= ncclNumResults; ++code) {
    const char* text = ncclGetErrorString(static_cast<ncclResult_t>(code));
    REQUIRE(text != nullptr);
    CHECK(std::strlen(text) > 3);
  }
}

TEST_CASE("communicator creation rejects bad arguments") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  EXPECT_ERROR(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument, "comm", "ncclCommInitRank");
  EXPECT_ERROR(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument, "nranks");
  EXPECT_ERROR(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument, "rank 2", "out of range");
  EXPECT_ERROR(ncclCommInitRank(&comm, 2, id, -1), ncclInvalidArgument, "rank -1");
  ncclUniqueId zero;
  std::memset(&zero, 0, sizeof(zero));
  EXPECT_ERROR(ncclCommInitRank(&comm, 1, zero, 0), ncclInvalidArgument, "commId");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0;
  EXPECT_ERROR(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER");
  ncclConfig_t badBlocking = NCCL_CONFIG_INITIALIZER;
  badBlocking.blocking = 7;
  EXPECT_ERROR(ncclCommInitRankConfig(&comm, 1, id, 0, &badBlocking), ncclInvalidArgument, "blocking");
  EXPECT_ERROR(ncclCommInitAll(nullptr, 2, nullptr), ncclInvalidArgument, "comms");
  ncclComm_t one;
  EXPECT_ERROR(ncclCommInitAll(&one, 0, nullptr), ncclInvalidArgument, "ndev");
}

TEST_CASE("collectives reject bad arguments and name them") {
  TwoRanks ranks;
  ncclComm_t comm = ranks.comms[0];
  std::vector<float> a(64), b(64);
  EXPECT_ERROR(ncclAllReduce(a.data(), b.data(), 4, ncclFloat, ncclSum, nullptr, nullptr), ncclInvalidArgument,
               "comm is NULL", "ncclAllReduce");
  EXPECT_ERROR(ncclAllReduce(a.data(), b.data(), 4, static_cast<ncclDataType_t>(99), ncclSum, comm, nullptr),
               ncclInvalidArgument, "datatype 99");
  EXPECT_ERROR(ncclAllReduce(a.data(), b.data(), 4, ncclFloat, static_cast<ncclRedOp_t>(42), comm, nullptr),
               ncclInvalidArgument, "op 42");
  EXPECT_ERROR(ncclAllReduce(nullptr, b.data(), 4, ncclFloat, ncclSum, comm, nullptr), ncclInvalidArgument, "sendbuff");
  EXPECT_ERROR(ncclAllReduce(a.data(), nullptr, 4, ncclFloat, ncclSum, comm, nullptr), ncclInvalidArgument, "recvbuff");
  EXPECT_ERROR(ncclAllReduce(a.data(), a.data() + 1, 4, ncclFloat, ncclSum, comm, nullptr), ncclInvalidArgument,
               "overlap");
  EXPECT_ERROR(ncclAllReduce(a.data(), b.data(), SIZE_MAX / 2, ncclFloat, ncclSum, comm, nullptr), ncclInvalidArgument,
               "count");
  // count x 4 bytes fits, the 2 ranks' blocks together do not.
  EXPECT_ERROR(ncclAllGather(a.data(), b.data(), SIZE_MAX / 6, ncclFloat, comm, nullptr), ncclInvalidArgument, "count",
               "ncclAllGather");
  EXPECT_ERROR(ncclAllGather(a.data(), a.data() + 1, 4, ncclFloat, comm, nullptr), ncclInvalidArgument, "overlap",
               "ncclAllGather");
  EXPECT_ERROR(ncclReduceScatter(a.data(), a.data() + 1, 4, ncclFloat, ncclSum, comm, nullptr), ncclInvalidArgument,
               "overlap");
  EXPECT_ERROR(ncclBroadcast(a.data(), b.data(), 4, ncclFloat, 2, comm, nullptr), ncclInvalidArgument, "root 2");
  EXPECT_ERROR(ncclBcast(a.data(), 4, ncclFloat, -1, comm, nullptr), ncclInvalidArgument, "root -1");
  EXPECT_ERROR(ncclReduce(a.data(), b.data(), 4, ncclFloat, ncclSum, 5, comm, nullptr), ncclInvalidArgument, "root 5");
  EXPECT_ERROR(ncclGather(a.data(), nullptr, 4, ncclFloat, 0, comm, nullptr), ncclInvalidArgument, "recvbuff");
  EXPECT_ERROR(ncclScatter(nullptr, b.data(), 4, ncclFloat, 0, comm, nullptr), ncclInvalidArgument, "sendbuff");
  EXPECT_ERROR(ncclAlltoAll(a.data(), a.data() + 2, 4, ncclFloat, comm, nullptr), ncclInvalidArgument, "overlap");
  EXPECT_ERROR(ncclSend(a.data(), 4, ncclFloat, 2, comm, nullptr), ncclInvalidArgument, "peer 2", "ncclSend");
  EXPECT_ERROR(ncclRecv(nullptr, 4, ncclFloat, 1, comm, nullptr), ncclInvalidArgument, "recvbuff", "ncclRecv");
  EXPECT_ERROR(ncclSend(a.data(), 4, ncclFloat, 0, comm, nullptr), ncclInvalidUsage, "self");
}

TEST_CASE("queries, custom ops, groups and teardown reject bad usage") {
  TwoRanks ranks;
  ncclComm_t comm = ranks.comms[0];
  int value = -1;
  EXPECT_ERROR(ncclCommCount(comm, nullptr), ncclInvalidArgument, "count");
  EXPECT_ERROR(ncclCommUserRank(nullptr, &value), ncclInvalidArgument, "comm is NULL");
  EXPECT_ERROR(ncclCommCuDevice(comm, nullptr), ncclInvalidArgument, "device");
  CHECK(ncclCommCount(comm, &value) == ncclSuccess);
  CHECK(value == 2);
  CHECK(ncclCommUserRank(ranks.comms[1], &value) == ncclSuccess);
  CHECK(value == 1);
  ncclResult_t async;
  EXPECT_ERROR(ncclCommGetAsyncError(comm, nullptr), ncclInvalidArgument, "asyncError");
  CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
  CHECK(async == ncclSuccess);

  ncclRedOp_t op;
  float scalar = 2;
  EXPECT_ERROR(ncclRedOpCreatePreMulSum(&op, nullptr, ncclFloat, ncclScalarHostImmediate, comm), ncclInvalidArgument,
               "scalar");
  EXPECT_ERROR(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, static_cast<ncclScalarResidence_t>(9), comm),
               ncclInvalidArgument, "residence");
  REQUIRE(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm) == ncclSuccess);
  CHECK(static_cast<int>(op) >= ncclNumOps);
  std::vector<double> d(8), e(8);
  EXPECT_ERROR(ncclAllReduce(d.data(), e.data(), 8, ncclDouble, op, comm, nullptr), ncclInvalidArgument, "float",
               "double");
  CHECK(ncclRedOpDestroy(op, comm) == ncclSuccess);
  EXPECT_ERROR(ncclRedOpDestroy(op, comm), ncclInvalidArgument, "not a live custom op");
  EXPECT_ERROR(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument, "built-in");

  EXPECT_ERROR(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
  REQUIRE(ncclGroupStart() == ncclSuccess);
  EXPECT_ERROR(ncclCommDestroy(comm), ncclInvalidUsage, "inside a group");
  EXPECT_ERROR(ncclCommFinalize(comm), ncclInvalidUsage, "inside a group");
  REQUIRE(ncclGroupEnd() == ncclSuccess);

  ncclComm_t child = nullptr;
  EXPECT_ERROR(ncclCommSplit(comm, -5, 0, &child, nullptr), ncclInvalidArgument, "color -5");
  EXPECT_ERROR(ncclCommSplit(comm, 0, 0, nullptr, nullptr), ncclInvalidArgument, "newcomm");
  void* handle = nullptr;
  EXPECT_ERROR(ncclCommRegister(comm, nullptr, 64, &handle), ncclInvalidArgument, "buff");
  float buffer[16];
  REQUIRE(ncclCommRegister(comm, buffer, sizeof(buffer), &handle) == ncclSuccess);
  CHECK(ncclCommDeregister(comm, handle) == ncclSuccess);

  // A destroyed communicator is an error, not a crash.
  ncclComm_t stale = ranks.comms[1];
  REQUIRE(ncclCommDestroy(stale) == ncclSuccess);
  ranks.comms[1] = nullptr;
  EXPECT_ERROR(ncclCommCount(stale, &value), ncclInvalidArgument, "not a live communicator");
  EXPECT_ERROR(ncclCommDestroy(stale), ncclInvalidArgument, "not a live communicator");
}

TEST_CASE("topocclCommPredict names the plan the communicator runs and the model's time, and rejects bad input") {
  TwoRanks ranks;
  topocclPrediction_t p{};
  REQUIRE(topocclCommPredict(ranks.comms[0], "allreduce", 64 << 20, 0, &p) == ncclSuccess);
  CHECK(std::string(p.plan) == "reduce_scatter_allgather");  // two ranks on one host sum halves
  CHECK(p.predictedUs > 0);
  topocclPrediction_t small{};
  REQUIRE(topocclCommPredict(ranks.comms[1], "allreduce", 8, 1, &small) == ncclSuccess);
  CHECK(std::string(small.plan) == "recursive_doubling");
  CHECK(small.predictedUs < p.predictedUs);
  REQUIRE(topocclCommPredict(ranks.comms[0], "allgather", 1 << 20, 0, &p) == ncclSuccess);
  CHECK(p.predictedUs > 0);
  EXPECT_ERROR(topocclCommPredict(ranks.comms[0], "all_reduce", 8, 0, &p), ncclInvalidArgument, "all_reduce",
               "allreduce, allgather");
  EXPECT_ERROR(topocclCommPredict(ranks.comms[0], "allreduce", 8, 0, nullptr), ncclInvalidArgument, "prediction");
  EXPECT_ERROR(topocclCommPredict(nullptr, "allreduce", 8, 0, &p), ncclInvalidArgument, "comm is NULL");
}

TEST_CASE("ncclMemAlloc: TOPOCCL_MEM_ALLOC is checked, and asking for GPU memory without a GPU is a named error") {
  void* p = nullptr;
  setenv("TOPOCCL_MEM_ALLOC", "vram", 1);
  EXPECT_ERROR(ncclMemAlloc(&p, 16), ncclInvalidArgument, "TOPOCCL_MEM_ALLOC=vram", "auto, gpu or host");
  CHECK(p == nullptr);
  setenv("TOPOCCL_MEM_ALLOC", "gpu", 1);
  if (access("/dev/nvidiactl", F_OK) != 0) {
    // This machine has no GPU: the error says what was asked for (cudaMalloc, or a build without CUDA).
    const ncclResult_t result = ncclMemAlloc(&p, 16);
    INFO(ncclGetErrorString(result) << ": " << lastError());
    CHECK(result != ncclSuccess);
    CHECK(p == nullptr);
    CHECK_THAT(lastError(), Catch::Contains("ncclMemAlloc") && (Catch::Contains("cudaMalloc") || Catch::Contains("CUDA")));
  }
  setenv("TOPOCCL_MEM_ALLOC", "host", 1);
  REQUIRE(ncclMemAlloc(&p, 64) == ncclSuccess);
  std::memset(p, 1, 64);  // host memory
  CHECK(ncclMemFree(p) == ncclSuccess);
  unsetenv("TOPOCCL_MEM_ALLOC");
}

TEST_CASE("host memory from ncclMemAlloc works in collectives") {
  void* p = nullptr;
  EXPECT_ERROR(ncclMemAlloc(nullptr, 16), ncclInvalidArgument, "ptr");
  REQUIRE(ncclMemAlloc(&p, 1 << 20) == ncclSuccess);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
  ncclComm_t comm;
  REQUIRE(ncclCommInitAll(&comm, 1, nullptr) == ncclSuccess);
  auto* f = static_cast<float*>(p);
  for (int i = 0; i < 1000; ++i) f[i] = static_cast<float>(i);
  REQUIRE(ncclAllReduce(f, f + 1000, 1000, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess);
  for (int i = 0; i < 1000; ++i) CHECK(f[1000 + i] == static_cast<float>(i));
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(ncclMemFree(p) == ncclSuccess);
}

// PyTorch (2.11, NCCL 2.28 headers) links the device API's host entry points: without them `import torch`
// fails with an undefined symbol. They exist, and a call says the device API is not supported.
extern "C" ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* requirements, void* outDevComm);
extern "C" ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm);

TEST_CASE("the NCCL device API entry points exist and refuse by name") {
  TwoRanks two;
  char requirements[256] = {};
  char devComm[256] = {};
  EXPECT_ERROR(ncclDevCommCreate(two.comms[0], requirements, devComm), ncclInvalidUsage, "ncclDevCommCreate", "device API");
  EXPECT_ERROR(ncclDevCommDestroy(two.comms[0], devComm), ncclInvalidUsage, "ncclDevCommDestroy", "device API");
  EXPECT_ERROR(ncclDevCommCreate(nullptr, requirements, devComm), ncclInvalidArgument, "ncclDevCommCreate", "comm");
}

TEST_CASE("a repeated call skips no check: each changed argument, a destroyed op or comm, is still refused") {
  // The per-call path remembers the last call whose checks passed; every field it keys on is changed here once.
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitAll(&comm, 1, nullptr) == ncclSuccess);
  std::mt19937 rng(std::random_device{}());
  std::vector<float> a(61), b(61);
  auto refill = [&] {
    for (float& x : a) x = static_cast<float>(rng() % 2001) - 1000.0f;
    std::fill(b.begin(), b.end(), -7.0f);
  };
  for (int round = 0; round < 2; ++round) {
    INFO("round " << round);
    refill();
    REQUIRE(ncclBroadcast(a.data(), b.data(), 61, ncclFloat, 0, comm, nullptr) == ncclSuccess);
    CHECK(b == a);
    EXPECT_ERROR(ncclBroadcast(a.data(), b.data(), 61, ncclFloat, 1, comm, nullptr), ncclInvalidArgument, "root 1");
    EXPECT_ERROR(ncclBroadcast(a.data(), a.data() + 1, 60, ncclFloat, 0, comm, nullptr), ncclInvalidArgument, "overlap");
    EXPECT_ERROR(ncclBroadcast(a.data(), nullptr, 61, ncclFloat, 0, comm, nullptr), ncclInvalidArgument, "recvbuff");
    EXPECT_ERROR(ncclBroadcast(a.data(), b.data(), 61, static_cast<ncclDataType_t>(99), 0, comm, nullptr),
                 ncclInvalidArgument, "datatype 99");
    EXPECT_ERROR(ncclBroadcast(a.data(), b.data(), SIZE_MAX / 2, ncclFloat, 0, comm, nullptr), ncclInvalidArgument, "count");
    EXPECT_ERROR(ncclAllReduce(a.data(), b.data(), 61, ncclFloat, static_cast<ncclRedOp_t>(42), comm, nullptr),
                 ncclInvalidArgument, "op 42");
  }

  // A custom op is looked up on every call: once destroyed, the same call is refused.
  ncclRedOp_t op;
  const float scalar = 3;
  REQUIRE(ncclRedOpCreatePreMulSum(&op, const_cast<float*>(&scalar), ncclFloat, ncclScalarHostImmediate, comm) == ncclSuccess);
  refill();
  REQUIRE(ncclAllReduce(a.data(), b.data(), 61, ncclFloat, op, comm, nullptr) == ncclSuccess);
  for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == 3.0f * a[i]);  // exact: |a| <= 1000, integers
  REQUIRE(ncclRedOpDestroy(op, comm) == ncclSuccess);
  EXPECT_ERROR(ncclAllReduce(a.data(), b.data(), 61, ncclFloat, op, comm, nullptr), ncclInvalidArgument, "nor a live custom op");

  // A destroyed communicator: the same call on its handle is refused, not run on freed memory.
  REQUIRE(ncclBroadcast(a.data(), b.data(), 61, ncclFloat, 0, comm, nullptr) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  EXPECT_ERROR(ncclBroadcast(a.data(), b.data(), 61, ncclFloat, 0, comm, nullptr), ncclInvalidArgument,
               "not a live communicator");
}
