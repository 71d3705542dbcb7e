// Collectives on GPU buffers through nccl.h and topoccl's libnccl.so.2: 2-4 ranks sharing the one GPU, as
// fork()ed processes (CUDA IPC between them) and as threads of one process, buffers from ncclMemAlloc (device
// memory), each call enqueued on the rank's stream. Every collective at 1 element, a prime count and past a
// MiB, in and out of place, against the definition; two calls queued back to back before one synchronize;
// and a rank whose peer never calls stops with an error (watchdog abort) instead of hanging.
// Exits 77 ("skipped: no GPU") where there is none.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "nccl.h"
#include "support/collective_definition.hpp"
#include "support/rank_harness.hpp"

using topoccl::algo::Collective;

namespace {

float inputValue(int rank, size_t i) { return static_cast<float>(static_cast<int>((rank * 131 + i * 7) % 7) - 3); }

struct Call {
  Collective collective;
  const char* name;
  int root;
};


ncclResult_t issue(const Call& call, const void* send, void* recv, size_t count, ncclComm_t comm, cudaStream_t stream) {
  switch (call.collective) {
    case Collective::AllReduce: return ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream);
    case Collective::AllGather: return ncclAllGather(send, recv, count, ncclFloat, comm, stream);
    case Collective::ReduceScatter: return ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, comm, stream);
    case Collective::Broadcast: return ncclBroadcast(send, recv, count, ncclFloat, call.root, comm, stream);
    case Collective::Reduce: return ncclReduce(send, recv, count, ncclFloat, ncclSum, call.root, comm, stream);
    case Collective::AllToAll: return ncclAlltoAll(send, recv, count, ncclFloat, comm, stream);
    case Collective::Gather: return ncclGather(send, recv, count, ncclFloat, call.root, comm, stream);
    case Collective::Scatter: return ncclScatter(send, recv, count, ncclFloat, call.root, comm, stream);
  }
  return ncclInvalidArgument;
}

int checkAll(int rank, int n, ncclComm_t comm) {
  int failures = 0;
  auto fail = [&](const std::string& what) {
    std::printf("FAILED: rank %d: %s\n", rank, what.c_str());
    ++failures;
  };
  if (cudaSetDevice(0) != cudaSuccess) {
    fail("cudaSetDevice(0)");
    return failures;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const Call calls[] = {{Collective::AllReduce, "allreduce", 0}, {Collective::AllGather, "allgather", 0},
                        {Collective::ReduceScatter, "reducescatter", 0}, {Collective::Broadcast, "broadcast", n - 1},
                        {Collective::Reduce, "reduce", n - 1}, {Collective::AllToAll, "alltoall", 0},
                        {Collective::Gather, "gather", 0}, {Collective::Scatter, "scatter", n - 1}};
  for (const Call& call : calls)
    for (size_t count : {size_t{1}, size_t{4099}, size_t{(1 << 20) + 3}}) {
      const size_t in = topoccl::algo::inputBlocks(call.collective, n, rank, call.root) * count;
      const size_t out = topoccl::algo::outputBlocks(call.collective, n, rank, call.root) * count;
      void* send = nullptr;
      void* recv = nullptr;
      if (ncclMemAlloc(&send, (in + 1) * 4) != ncclSuccess || ncclMemAlloc(&recv, (out + 1) * 4) != ncclSuccess) {
        fail("ncclMemAlloc");
        continue;
      }
      cudaPointerAttributes attributes{};
      if (cudaPointerGetAttributes(&attributes, send) != cudaSuccess || attributes.type != cudaMemoryTypeDevice)
        fail("ncclMemAlloc did not return device memory");
      std::vector<float> host(in);
      for (size_t i = 0; i < in; ++i) host[i] = inputValue(rank, i);
      cudaMemcpy(send, host.data(), in * 4, cudaMemcpyHostToDevice);
      cudaMemset(recv, 0xff, (out + 1) * 4);
      // The fills ran on the legacy stream, which the rank's non-blocking stream does not wait for.
      cudaStreamSynchronize(cudaStreamLegacy);
      // Twice back to back on the stream, then one synchronize: the calls return before the GPU is done.
      ncclResult_t r = issue(call, send, recv, count, comm, stream);
      if (r == ncclSuccess) r = issue(call, send, recv, count, comm, stream);
      if (r != ncclSuccess) fail(std::string(call.name) + ": " + ncclGetErrorString(r) + ": " + ncclGetLastError(comm));
      if (cudaStreamSynchronize(stream) != cudaSuccess) fail(std::string(call.name) + ": stream");
      std::vector<float> got(out);
      cudaMemcpy(got.data(), recv, out * 4, cudaMemcpyDeviceToHost);
      for (size_t e = 0; e < out; ++e) {
        const double want = topoccl::test::collectiveOutput(
            call.collective, n, call.root, count, rank, e, [](int q, size_t i) { return static_cast<double>(inputValue(q, i)); },
            [](double a, double b) { return a + b; });
        if (static_cast<double>(got[e]) != want) {
          fail(std::string(call.name) + " of " + std::to_string(count) + ": element " + std::to_string(e) + " is " +
               std::to_string(got[e]) + ", want " + std::to_string(want));
          break;
        }
      }
      ncclMemFree(send);
      ncclMemFree(recv);
    }
  // The lowered operators: Avg (float: a prescale by 1/n; int32: the sum divided by n, truncated) and
  // PreMulSum with a host-immediate and a device-resident scalar, all-reduce of a prime count.
  {
    const size_t count = 4099;
    void* send = nullptr;
    void* recv = nullptr;
    void* deviceScalar = nullptr;
    ncclMemAlloc(&send, count * 4);
    ncclMemAlloc(&recv, count * 4);
    ncclMemAlloc(&deviceScalar, 4);
    const float half = 0.5f;
    cudaMemcpy(deviceScalar, &half, 4, cudaMemcpyHostToDevice);
    std::vector<float> floats(count);
    std::vector<int32_t> ints(count);
    for (size_t i = 0; i < count; ++i) floats[i] = inputValue(rank, i), ints[i] = static_cast<int32_t>(inputValue(rank, i)) * 1000 + rank;
    const float two = 2.0f;
    ncclRedOp_t timesTwo{}, timesHalf{};
    if (ncclRedOpCreatePreMulSum(&timesTwo, const_cast<float*>(&two), ncclFloat, ncclScalarHostImmediate, comm) != ncclSuccess ||
        ncclRedOpCreatePreMulSum(&timesHalf, deviceScalar, ncclFloat, ncclScalarDevice, comm) != ncclSuccess)
      fail("ncclRedOpCreatePreMulSum");
    struct OpCase {
      const char* name;
      ncclRedOp_t op;
      ncclDataType_t type;
      double factor;  // PreMulSum's scalar, or 0 for Avg
    };
    const OpCase cases[] = {{"float avg", ncclAvg, ncclFloat, 0}, {"int32 avg", ncclAvg, ncclInt32, 0},
                            {"premulsum x2 (host scalar)", timesTwo, ncclFloat, 2}, {"premulsum x0.5 (device scalar)", timesHalf, ncclFloat, 0.5}};
    for (const OpCase& c : cases) {
      cudaMemcpy(send, c.type == ncclFloat ? static_cast<const void*>(floats.data()) : ints.data(), count * 4, cudaMemcpyHostToDevice);
      cudaMemset(recv, 0xff, count * 4);
      cudaStreamSynchronize(cudaStreamLegacy);
      if (ncclAllReduce(send, recv, count, c.type, c.op, comm, stream) != ncclSuccess || cudaStreamSynchronize(stream) != cudaSuccess) {
        fail(std::string(c.name) + ": " + ncclGetLastError(comm));
        continue;
      }
      std::vector<unsigned char> got(count * 4);
      cudaMemcpy(got.data(), recv, count * 4, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < count; ++i) {
        double sum = 0;
        long long intSum = 0;
        for (int q = 0; q < n; ++q) sum += inputValue(q, i), intSum += static_cast<long long>(inputValue(q, i)) * 1000 + q;
        bool right;
        double value;
        if (c.type == ncclInt32) {
          int32_t v;
          std::memcpy(&v, got.data() + i * 4, 4);
          value = v;
          right = v == static_cast<int32_t>(intSum / n);  // C++ truncates toward zero, as NCCL's integer Avg
        } else {
          float v;
          std::memcpy(&v, got.data() + i * 4, 4);
          value = v;
          const double want = c.factor == 0 ? sum / n : sum * c.factor;
          right = std::fabs(value - want) <= 1e-5 * (std::fabs(want) + 1);  // 1/n rounds to float once per input
        }
        if (!right) {
          fail(std::string(c.name) + ": element " + std::to_string(i) + " is " + std::to_string(value));
          break;
        }
      }
    }
    ncclRedOpDestroy(timesTwo, comm);
    ncclRedOpDestroy(timesHalf, comm);
    ncclMemFree(send);
    ncclMemFree(recv);
    ncclMemFree(deviceScalar);
  }
  // In place: all-reduce into the send buffer.
  {
    const size_t count = 12345;
    void* buffer = nullptr;
    ncclMemAlloc(&buffer, count * 4);
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = inputValue(rank, i);
    cudaMemcpy(buffer, host.data(), count * 4, cudaMemcpyHostToDevice);
    cudaStreamSynchronize(cudaStreamLegacy);
    if (ncclAllReduce(buffer, buffer, count, ncclFloat, ncclSum, comm, stream) != ncclSuccess) fail("in-place allreduce");
    cudaStreamSynchronize(stream);
    cudaMemcpy(host.data(), buffer, count * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int q = 0; q < n; ++q) want += inputValue(q, i);
      if (host[i] != want) {
        fail("in-place allreduce element " + std::to_string(i));
        break;
      }
    }
    ncclMemFree(buffer);
  }
  cudaStreamDestroy(stream);
  return failures;
}

// The last rank never calls: the others' kernels wait for it until the watchdog aborts them, and the error
// names the collective and the timeout.
int peerNeverCalls(int rank, int n, ncclComm_t comm) {
  cudaSetDevice(0);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  void* buffer = nullptr;
  ncclMemAlloc(&buffer, 4096);
  int failures = 0;
  // One call by everyone first: the GPU path is set up (collectively) and works.
  if (ncclAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream) != ncclSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    std::printf("FAILED: rank %d: the all-reduce every rank called failed: %s\n", rank, ncclGetLastError(comm));
    ++failures;
  }
  if (rank == n - 1) {
    ncclMemFree(buffer);
    cudaStreamDestroy(stream);
    return failures;
  }
  if (ncclAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream) != ncclSuccess) ++failures;
  cudaStreamSynchronize(stream);  // returns once the watchdog aborted the kernel
  ncclResult_t state = ncclSuccess;
  ncclCommGetAsyncError(comm, &state);
  const std::string text = ncclGetLastError(comm);
  if (state == ncclSuccess || state == ncclInProgress) {
    std::printf("FAILED: rank %d: no asynchronous error after the peer never called\n", rank);
    ++failures;
  } else {
    std::printf("rank %d: %s\n", rank, ncclGetErrorString(state));
  }
  ncclMemFree(buffer);
  cudaStreamDestroy(stream);
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run killed by a timeout still shows how far it got
  // Optional: "threads" or "processes" runs that mode alone (the watchdog check runs with "threads").
  const std::string only = argc > 1 ? argv[1] : "";
  // No CUDA call before the forks: a child cannot use a CUDA context its parent created.
  if (access("/dev/nvidiactl", F_OK) != 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  using topoccl::test::RankMode;
  int failures = 0;
  for (RankMode mode : {RankMode::ProcessesShm, RankMode::Threads})
    for (int n : {2, 3, 4}) {
      if ((only == "threads" && mode != RankMode::Threads) || (only == "processes" && mode == RankMode::Threads)) continue;
      const auto result = topoccl::test::runRanks(mode, n, checkAll, {{"TOPOCCL_TIMEOUT_MS", "30000"}}, 900);
      std::printf("%s, %d ranks on one GPU: %d failures %s\n", topoccl::test::rankModeName(mode), n, result.failures,
                  result.problems.c_str());
      failures += result.failures;
    }
  if (only != "processes") {
    const auto stuck = topoccl::test::runRanks(RankMode::Threads, 3, peerNeverCalls, {{"TOPOCCL_TIMEOUT_MS", "3000"}}, 120);
    std::printf("a peer that never calls: %d failures %s\n", stuck.failures, stuck.problems.c_str());
    failures += stuck.failures;
  }
  std::printf("%s\n", failures == 0 ? "gpu collectives: PASSED" : "FAILED");
  return failures == 0 ? 0 : 1;
}
