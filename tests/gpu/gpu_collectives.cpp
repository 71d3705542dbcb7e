// Collectives on GPU buffers through nccl.h and topoccl's libnccl.so.2: 2-4 ranks sharing the one GPU, as
// fork()ed processes (CUDA IPC between them) and as threads of one process, buffers from ncclMemAlloc (device
// memory), each call enqueued on the rank's stream. Every collective at 1 element, a prime count and past a
// MiB, in and out of place, against the definition; two calls queued back to back before one synchronize;
// and a rank whose peer never calls stops with an error (watchdog abort) instead of hanging; ncclCommAbort stops
// a kernel stuck on a peer. Then the same collectives through host staging (TOPOCCL_GPU_STAGED=always with
// threads; processes that name different hosts with NCCL_HOSTID, so the bytes go over TCP), and point-to-point on
// GPU buffers (grouped rings and all-to-all with random data, back-to-back calls outside a group, a GPU send
// beside a host-memory receive).
// Exits 77 ("skipped: no GPU") where there is none.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "nccl.h"
#include "support/collective_definition.hpp"
#include "support/rank_harness.hpp"

using topoccl::algo::Collective;

namespace {

float inputValue(int rank, size_t i) { return static_cast<float>(static_cast<int>((rank * 131 + i * 7) % 7) - 3); }

uint64_t gSeed = 0;  // drawn in main before the ranks start (forked children inherit it)
bool gRanksAreThreads = false;  // set in main for each run, before the ranks start
// TOPOCCL_TEST_TRACE=1: every rank prints each call before it issues it, so a hang shows where each rank is.
void trace(int rank, const std::string& what) {
  static const bool on = std::getenv("TOPOCCL_TEST_TRACE") != nullptr;
  if (on) std::printf("trace: rank %d: %s\n", rank, what.c_str());
}

// A random float that floats hold exactly, from (seed, rank, tag, index).
float randomValue(int rank, int tag, size_t i) {
  uint64_t x = gSeed ^ (static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(tag) << 40) ^ (i * 0x9e3779b97f4a7c15ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<int64_t>(x % 2000001) - 1000000);
}

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

// A group, as DDP's gradient buckets or ZeRO's shards issue it: independent calls of several collectives, sizes,
// types and operators between ncclGroupStart and ncclGroupEnd, fresh random inputs. The GPU path runs
// consecutive calls of one type and kernel operator as one launch (TOPOCCL_GPU_FUSE_GROUPS; NCCL_DEBUG=INFO
// NCCL_DEBUG_SUBSYS=COLL logs each fused launch); a call of another type or operator starts a new one.
int groupedChecks(int rank, int n, ncclComm_t comm, cudaStream_t stream) {
  int failures = 0;
  auto fail = [&](const std::string& what) {
    std::printf("FAILED: rank %d: grouped %s\n", rank, what.c_str());
    ++failures;
  };
  struct Grouped {
    Collective collective;
    const char* name;
    int root;
    size_t count;
    ncclDataType_t type;  // ncclFloat or ncclInt32
    ncclRedOp_t op;       // ncclSum or ncclMax
    bool inPlace;
    void* send = nullptr;
    void* recv = nullptr;
    size_t in = 0, out = 0;
  };
  std::vector<Grouped> calls = {
      {Collective::AllReduce, "allreduce", 0, 1, ncclFloat, ncclSum, false},
      {Collective::AllReduce, "allreduce", 0, 4099, ncclFloat, ncclSum, false},
      {Collective::AllReduce, "allreduce", 0, (1 << 20) + 3, ncclFloat, ncclSum, false},
      {Collective::AllGather, "allgather", 0, 4099, ncclFloat, ncclSum, false},
      {Collective::ReduceScatter, "reducescatter", 0, 1031, ncclFloat, ncclSum, false},
      {Collective::Broadcast, "broadcast", n - 1, 777, ncclFloat, ncclSum, false},
      {Collective::AllReduce, "allreduce in place", 0, 12345, ncclFloat, ncclSum, true},
      {Collective::AllReduce, "allreduce max", 0, 2053, ncclFloat, ncclMax, false},
      {Collective::AllReduce, "allreduce int32", 0, 3001, ncclInt32, ncclSum, false},
      {Collective::ReduceScatter, "reducescatter int32", 0, 65537, ncclInt32, ncclSum, false},
      {Collective::AllToAll, "alltoall", 0, 513, ncclFloat, ncclSum, false},
  };
  const auto value = [](int q, int tag, size_t i) { return randomValue(q, 100 + tag, i); };
  for (size_t k = 0; k < calls.size(); ++k) {
    Grouped& c = calls[k];
    c.in = topoccl::algo::inputBlocks(c.collective, n, rank, c.root) * c.count;
    c.out = topoccl::algo::outputBlocks(c.collective, n, rank, c.root) * c.count;
    if (ncclMemAlloc(&c.recv, (c.out + 1) * 4) != ncclSuccess) return fail("ncclMemAlloc"), failures;
    cudaMemset(c.recv, 0xff, (c.out + 1) * 4);
    if (c.inPlace) c.send = c.recv;  // all-reduce in place: input and output are one buffer
    else if (ncclMemAlloc(&c.send, (c.in + 1) * 4) != ncclSuccess) return fail("ncclMemAlloc"), failures;
    std::vector<unsigned char> host(c.in * 4);
    for (size_t i = 0; i < c.in; ++i) {
      const float f = value(rank, static_cast<int>(k), i);
      const int32_t v = static_cast<int32_t>(f);
      std::memcpy(host.data() + i * 4, c.type == ncclFloat ? static_cast<const void*>(&f) : &v, 4);
    }
    cudaMemcpy(c.send, host.data(), c.in * 4, cudaMemcpyHostToDevice);
  }
  cudaStreamSynchronize(cudaStreamLegacy);
  trace(rank, "a group of " + std::to_string(calls.size()) + " collectives");
  ncclGroupStart();
  ncclResult_t r = ncclSuccess;
  for (const Grouped& c : calls) {
    if (r != ncclSuccess) break;
    switch (c.collective) {
      case Collective::AllReduce: r = ncclAllReduce(c.send, c.recv, c.count, c.type, c.op, comm, stream); break;
      case Collective::AllGather: r = ncclAllGather(c.send, c.recv, c.count, c.type, comm, stream); break;
      case Collective::ReduceScatter: r = ncclReduceScatter(c.send, c.recv, c.count, c.type, c.op, comm, stream); break;
      case Collective::Broadcast: r = ncclBroadcast(c.send, c.recv, c.count, c.type, c.root, comm, stream); break;
      case Collective::AllToAll: r = ncclAlltoAll(c.send, c.recv, c.count, c.type, comm, stream); break;
      default: break;
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (r != ncclSuccess || ended != ncclSuccess) fail(std::string("group: ") + ncclGetLastError(comm));
  if (cudaStreamSynchronize(stream) != cudaSuccess) fail("group: stream");
  for (size_t k = 0; k < calls.size(); ++k) {
    const Grouped& c = calls[k];
    std::vector<unsigned char> got(c.out * 4);
    cudaMemcpy(got.data(), c.recv, c.out * 4, cudaMemcpyDeviceToHost);
    for (size_t e = 0; e < c.out; ++e) {
      // Integers of up to 1e6 in magnitude: every sum over 4 ranks is exact in float, int32 and double.
      const double want = topoccl::test::collectiveOutput(
          c.collective, n, c.root, c.count, rank, e,
          [&](int q, size_t i) { return static_cast<double>(value(q, static_cast<int>(k), i)); },
          [&](double a, double b) { return c.op == ncclMax ? std::max(a, b) : a + b; });
      double have;
      if (c.type == ncclFloat) {
        float v;
        std::memcpy(&v, got.data() + e * 4, 4);
        have = v;
      } else {
        int32_t v;
        std::memcpy(&v, got.data() + e * 4, 4);
        have = v;
      }
      if (have != want) {
        fail(std::string(c.name) + " of " + std::to_string(c.count) + " (call " + std::to_string(k) + "): element " +
             std::to_string(e) + " is " + std::to_string(have) + ", want " + std::to_string(want));
        break;
      }
    }
  }
  for (Grouped& c : calls) {
    if (!c.inPlace) ncclMemFree(c.send);
    ncclMemFree(c.recv);
  }
  trace(rank, "the group's results checked");
  return failures;
}

// What fusing a group buys (run "fusion"): groups of 16 all-reduces of distinct buffers, as DDP's buckets
// issue them, timed per group with the fusion on and off (TOPOCCL_GPU_FUSE_GROUPS from the run's
// environment); the last group's results are checked.
int groupTiming(int rank, int n, ncclComm_t comm) {
  int failures = 0;
  cudaSetDevice(0);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const char* fuse = std::getenv("TOPOCCL_GPU_FUSE_GROUPS");
  constexpr int kCalls = 16;
  for (size_t count : {size_t{256}, size_t{16384}}) {
    std::vector<void*> send(kCalls), recv(kCalls);
    for (int k = 0; k < kCalls; ++k) {
      ncclMemAlloc(&send[k], count * 4);
      ncclMemAlloc(&recv[k], count * 4);
      std::vector<float> host(count);
      for (size_t i = 0; i < count; ++i) host[i] = randomValue(rank, 200 + k, i);
      cudaMemcpy(send[k], host.data(), count * 4, cudaMemcpyHostToDevice);
    }
    cudaStreamSynchronize(cudaStreamLegacy);
    const auto group = [&] {
      ncclGroupStart();
      for (int k = 0; k < kCalls; ++k) ncclAllReduce(send[k], recv[k], count, ncclFloat, ncclSum, comm, stream);
      return ncclGroupEnd();
    };
    for (int w = 0; w < 20; ++w) group();
    cudaStreamSynchronize(stream);
    const int iterations = 200;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i)
      if (group() != ncclSuccess) {
        std::printf("FAILED: rank %d: group of all-reduces: %s\n", rank, ncclGetLastError(comm));
        ++failures;
        break;
      }
    cudaStreamSynchronize(stream);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iterations;
    if (rank == 0)
      std::printf("group of %d all-reduces of %zu floats, %d ranks, TOPOCCL_GPU_FUSE_GROUPS=%s: %.1f us per group\n", kCalls, count, n,
                  fuse ? fuse : "(default)", us);
    for (int k = 0; k < kCalls; ++k) {
      std::vector<float> got(count);
      cudaMemcpy(got.data(), recv[k], count * 4, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < count; ++i) {
        double want = 0;
        for (int q = 0; q < n; ++q) want += randomValue(q, 200 + k, i);
        if (got[i] != want) {
          std::printf("FAILED: rank %d: grouped all-reduce %d of %zu: element %zu is %f, want %f\n", rank, k, count, i, got[i], want);
          ++failures;
          break;
        }
      }
      ncclMemFree(send[k]);
      ncclMemFree(recv[k]);
    }
  }
  cudaStreamDestroy(stream);
  return failures;
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
      trace(rank, std::string(call.name) + " of " + std::to_string(count) + ", twice");
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
      trace(rank, c.name);
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
    trace(rank, "in-place allreduce");
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
  failures += groupedChecks(rank, n, comm, stream);
  cudaStreamDestroy(stream);
  return failures;
}

void* deviceFilled(int rank, int tag, size_t count) {
  void* buffer = nullptr;
  if (ncclMemAlloc(&buffer, std::max<size_t>(count, 1) * 4) != ncclSuccess) return nullptr;
  std::vector<float> host(count);
  for (size_t i = 0; i < count; ++i) host[i] = randomValue(rank, tag, i);
  cudaMemcpy(buffer, host.data(), count * 4, cudaMemcpyHostToDevice);
  return buffer;
}

// Compares count floats at `got` (device or host memory) with randomValue(from, tag, first + i).
bool matches(const void* got, bool onDevice, int from, int tag, size_t first, size_t count, std::string& why) {
  std::vector<float> host(count);
  if (onDevice) cudaMemcpy(host.data(), got, count * 4, cudaMemcpyDeviceToHost);
  else std::memcpy(host.data(), got, count * 4);
  for (size_t i = 0; i < count; ++i)
    if (host[i] != randomValue(from, tag, first + i)) {
      why = "element " + std::to_string(i) + " is " + std::to_string(host[i]) + ", want " +
            std::to_string(randomValue(from, tag, first + i)) + " (from rank " + std::to_string(from) + ")";
      return false;
    }
  return true;
}

// ncclSend/ncclRecv on GPU buffers: in the plan kernel or staged through pinned host memory, as TOPOCCL_GPU_P2P
// and the ranks' placement decide (GpuPath::pointToPointLanes).
int pointToPointChecks(int rank, int n, ncclComm_t comm) {
  int failures = 0;
  auto fail = [&](const std::string& what) {
    std::printf("FAILED: rank %d: %s\n", rank, what.c_str());
    ++failures;
  };
  // A launch the watchdog aborted leaves its outputs unwritten: say so rather than compare them.
  auto aborted = [&](const std::string& what) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || state == ncclSuccess) return false;
    fail(what + ": asynchronous error " + std::to_string(state) + ": " + ncclGetLastError(comm));
    return true;
  };
  cudaSetDevice(0);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  std::string why;
  // A ring shift in a group, at 1 element, a prime count and past 4 MiB.
  for (size_t count : {size_t{1}, size_t{4099}, size_t{(1 << 20) + 3}}) {
    void* send = deviceFilled(rank, 1, count);
    void* recv = deviceFilled(-1, 0, count);
    cudaStreamSynchronize(cudaStreamLegacy);
    ncclGroupStart();
    ncclResult_t r = ncclSend(send, count, ncclFloat, next, comm, stream);
    if (r == ncclSuccess) r = ncclRecv(recv, count, ncclFloat, prev, comm, stream);
    const ncclResult_t ended = ncclGroupEnd();
    if (r != ncclSuccess || ended != ncclSuccess) fail("ring shift of " + std::to_string(count) + ": " + ncclGetLastError(comm));
    if (cudaStreamSynchronize(stream) != cudaSuccess) fail("ring shift: stream");
    if (!aborted("ring shift") && !matches(recv, true, prev, 1, 0, count, why)) fail("ring shift of " + std::to_string(count) + ": " + why);
    ncclMemFree(send);
    ncclMemFree(recv);
  }
  // PyTorch's pattern (its batch_isend_irecv hung on 2026-11-26): no stream synchronize; the legacy stream waits
  // for ours through an event, and a pageable copy to the host on it blocks this thread until the staged call
  // is done, while the progress engine must still finish it. Ranks that are processes only: threads share one
  // legacy stream, so a peer's next legacy-stream copy would queue behind this rank's wait for that peer (a
  // deadlock NCCL has too; on the H100 it ended in timeouts and stale outputs).
  if (!gRanksAreThreads) {
    const size_t count = 4099;
    void* send = deviceFilled(rank, 6, count);
    void* recv = deviceFilled(-1, 0, count);
    cudaStreamSynchronize(cudaStreamLegacy);
    ncclGroupStart();
    ncclSend(send, count, ncclFloat, next, comm, stream);
    ncclRecv(recv, count, ncclFloat, prev, comm, stream);
    if (ncclGroupEnd() != ncclSuccess) fail(std::string("ring shift, PyTorch's wait: ") + ncclGetLastError(comm));
    cudaEvent_t done = nullptr;
    cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    cudaEventRecord(done, stream);
    cudaStreamWaitEvent(cudaStreamLegacy, done, 0);
    if (!matches(recv, true, prev, 6, 0, count, why)) fail("ring shift, PyTorch's wait: " + why);  // cudaMemcpy, pageable
    cudaEventDestroy(done);
    cudaStreamSynchronize(stream);
    ncclMemFree(send);
    ncclMemFree(recv);
  }
  // All-to-all from grouped sends and receives, self included; blocks of a prime count.
  {
    const size_t block = 1009;
    void* send = deviceFilled(rank, 2, block * n);
    void* recv = deviceFilled(-1, 0, block * n);
    cudaStreamSynchronize(cudaStreamLegacy);
    ncclGroupStart();
    for (int q = 0; q < n; ++q) {
      ncclSend(static_cast<float*>(send) + q * block, block, ncclFloat, q, comm, stream);
      ncclRecv(static_cast<float*>(recv) + q * block, block, ncclFloat, q, comm, stream);
    }
    if (ncclGroupEnd() != ncclSuccess) fail(std::string("all-to-all by send/recv: ") + ncclGetLastError(comm));
    cudaStreamSynchronize(stream);
    for (int q = 0; q < n && !aborted("all-to-all by send/recv"); ++q)
      if (!matches(static_cast<float*>(recv) + q * block, true, q, 2, rank * block, block, why))
        fail("all-to-all by send/recv, block from rank " + std::to_string(q) + ": " + why);
    ncclMemFree(send);
    ncclMemFree(recv);
  }
  // Outside a group, rank 0 to rank 1: two sends back to back before one synchronize arrive in order.
  if (rank < 2) {
    const size_t count = 12347;
    void* first = deviceFilled(rank, 3, count);
    void* second = deviceFilled(rank, 4, count);
    cudaStreamSynchronize(cudaStreamLegacy);
    ncclResult_t r = ncclSuccess;
    for (void* buffer : {first, second}) {
      if (r != ncclSuccess) break;
      r = rank == 0 ? ncclSend(buffer, count, ncclFloat, 1, comm, stream) : ncclRecv(buffer, count, ncclFloat, 0, comm, stream);
    }
    if (r != ncclSuccess) fail(std::string("send/recv outside a group: ") + ncclGetLastError(comm));
    cudaStreamSynchronize(stream);
    if (rank == 1 && !aborted("send/recv outside a group") && (!matches(first, true, 0, 3, 0, count, why) || !matches(second, true, 0, 4, 0, count, why)))
      fail("send/recv outside a group: " + why);
    ncclMemFree(first);
    ncclMemFree(second);
  }
  // A GPU send beside a receive into host memory in one group: the host buffer is ready when ncclGroupEnd returns.
  // Staged only: the peer's GPU send matches this host receive, and a send in the plan kernel needs a GPU receive.
  if (const char* mode = std::getenv("TOPOCCL_GPU_P2P"); mode != nullptr && std::string(mode) == "staged") {
    const size_t count = 70001;
    void* send = deviceFilled(rank, 5, count);
    std::vector<float> hostRecv(count, -1.0f);
    cudaStreamSynchronize(cudaStreamLegacy);
    ncclGroupStart();
    ncclSend(send, count, ncclFloat, next, comm, stream);
    ncclRecv(hostRecv.data(), count, ncclFloat, prev, comm, stream);
    if (ncclGroupEnd() != ncclSuccess) fail(std::string("GPU send beside a host receive: ") + ncclGetLastError(comm));
    if (!matches(hostRecv.data(), false, prev, 5, 0, count, why)) fail("GPU send beside a host receive: " + why);
    cudaStreamSynchronize(stream);
    ncclMemFree(send);
  }
  cudaStreamDestroy(stream);
  return failures;
}

// A collective first (it sets the GPU path up on more than 2 ranks, after which sends and receives may run in the
// plan kernel), then the point-to-point checks.
int pointToPointAfterCollective(int rank, int n, ncclComm_t comm) {
  cudaSetDevice(0);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  void* buffer = deviceFilled(rank, 7, 1024);
  cudaStreamSynchronize(cudaStreamLegacy);
  int failures = 0;
  if (ncclAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream) != ncclSuccess || cudaStreamSynchronize(stream) != cudaSuccess) {
    std::printf("FAILED: rank %d: the all-reduce before the point-to-point checks: %s\n", rank, ncclGetLastError(comm));
    ++failures;
  }
  ncclMemFree(buffer);
  cudaStreamDestroy(stream);
  return failures + pointToPointChecks(rank, n, comm);
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
  if (const ncclResult_t issued = ncclAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream); issued != ncclSuccess) {
    // Ranks that are threads sharing the GPU meet around each launch (core/launch_order.hpp), so there the call
    // itself fails once the timeout passes, naming the rank that never called.
    const std::string text = ncclGetLastError(comm);
    const bool namesPeer = text.find("rank " + std::to_string(n - 1)) != std::string::npos;
    if (!gRanksAreThreads || issued != ncclRemoteError || !namesPeer) {
      std::printf("FAILED: rank %d: the all-reduce the last rank never called returned %s: %s\n", rank, ncclGetErrorString(issued),
                  text.c_str());
      ++failures;
    } else {
      std::printf("rank %d: the call failed: %s\n", rank, text.c_str());
    }
  }
  cudaStreamSynchronize(stream);  // returns once the watchdog (or the failed call) aborted the kernel
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

// ncclCommAbort stops a kernel that waits for a peer that will never send (processes: no launch ordering, so the
// call is enqueued and the kernel really waits). The watchdog's timeout is far off, so only the abort can end it.
// The aborted communicator is split from the harness's, which stays usable for a host-memory barrier after.
int abortStopsStuckKernel(int rank, int n, ncclComm_t world) {
  (void)n;
  cudaSetDevice(0);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  int failures = 0;
  const auto fail = [&](const std::string& what) {
    std::printf("FAILED: rank %d: %s\n", rank, what.c_str());
    ++failures;
  };
  ncclComm_t comm = nullptr;
  if (ncclCommSplit(world, 0, rank, &comm, nullptr) != ncclSuccess) {
    fail("ncclCommSplit");
    return failures;
  }
  void* buffer = nullptr;
  ncclMemAlloc(&buffer, 4096);
  // Everyone once: the GPU path is set up and works on the split communicator.
  if (ncclAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream) != ncclSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    fail(std::string("the all-reduce every rank called: ") + ncclGetLastError(comm));
  if (rank == 0) {
    if (ncclAllReduce(buffer, buffer, 1024, ncclFloat, ncclSum, comm, stream) != ncclSuccess)
      fail(std::string("enqueueing the all-reduce rank 1 never calls: ") + ncclGetLastError(comm));
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    if (cudaStreamQuery(stream) != cudaErrorNotReady) fail("the kernel waiting for rank 1 was not running 0.5 s later");
    const auto begin = std::chrono::steady_clock::now();
    if (ncclCommAbort(comm) != ncclSuccess) fail("ncclCommAbort");
    const cudaError_t synced = cudaStreamSynchronize(stream);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    std::printf("rank 0: ncclCommAbort and the stream's synchronize returned after %.3f s (%s)\n", seconds,
                cudaGetErrorString(synced));
    if (synced != cudaSuccess) fail(std::string("the stream after the abort: ") + cudaGetErrorString(synced));
    if (seconds > 10) fail("the abort took " + std::to_string(seconds) + " s, the watchdog's timeout is 60");
  }
  // Rank 1 keeps its end (the FIFOs rank 0's kernel writes to) until rank 0 has aborted.
  int token = 1;
  if (ncclAllReduce(&token, &token, 1, ncclInt32, ncclSum, world, nullptr) != ncclSuccess || token != 2)
    fail("the host barrier after the abort");
  if (rank != 0 && ncclCommAbort(comm) != ncclSuccess) fail("ncclCommAbort of the idle rank");
  ncclMemFree(buffer);
  cudaStreamDestroy(stream);
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run killed by a timeout still shows how far it got
  // Optional: "processes", "threads", "p2p", "p2p-kernel", "staged" or "fusion" (timing only, never by default) runs that group
  // alone (the watchdog check runs with "threads").
  const std::string only = argc > 1 ? argv[1] : "";
  // No CUDA call before the forks: a child cannot use a CUDA context its parent created.
  if (access("/dev/nvidiactl", F_OK) != 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  using topoccl::test::RankMode;
  gSeed = topoccl::test::testSeed();
  int failures = 0;
  // Every run with ranks as processes comes first: once this process has used CUDA (ranks as threads), a
  // forked child cannot.
  struct Run {
    std::string group;  // what `only` selects: p2p, staged, processes, threads
    std::string label;
    RankMode mode;
    int nranks;
    int (*body)(int, int, ncclComm_t);
    std::map<std::string, std::string> env;
    int timeoutSeconds;
  };
  const std::map<std::string, std::string> plain{{"TOPOCCL_TIMEOUT_MS", "30000"}};
  const std::map<std::string, std::string> hosts{{"TOPOCCL_TIMEOUT_MS", "30000"}, {"NCCL_HOSTID", "gpu-host-{rank}"}};
  const std::map<std::string, std::string> staged{{"TOPOCCL_TIMEOUT_MS", "30000"}, {"TOPOCCL_GPU_STAGED", "always"}};
  const std::map<std::string, std::string> p2pStaged{{"TOPOCCL_TIMEOUT_MS", "30000"}, {"TOPOCCL_GPU_P2P", "staged"}};
  const std::map<std::string, std::string> p2pKernel{{"TOPOCCL_TIMEOUT_MS", "30000"}, {"TOPOCCL_GPU_P2P", "kernel"},
                                                     {"NCCL_DEBUG", "INFO"}, {"NCCL_DEBUG_SUBSYS", "INIT"}};
  std::vector<Run> runs;
  for (int n : {2, 3, 4})
    runs.push_back({"processes", "processes over shm, " + std::to_string(n) + " ranks on one GPU", RankMode::ProcessesShm, n, checkAll, plain, 900});
  runs.push_back({"processes", "ncclCommAbort stops a kernel stuck on a peer, 2 processes", RankMode::ProcessesShm, 2,
                  abortStopsStuckKernel, {{"TOPOCCL_TIMEOUT_MS", "60000"}}, 120});
  for (int n : {2, 3})
    runs.push_back({"p2p", "send/recv, processes, " + std::to_string(n) + " ranks, staged", RankMode::ProcessesShm, n,
                    pointToPointChecks, p2pStaged, 300});
  runs.push_back({"p2p", "send/recv, processes on 3 hosts (NCCL_HOSTID)", RankMode::ProcessesShm, 3, pointToPointChecks, hosts, 300});
  // In the plan kernel (forced: without MPS, processes sharing a GPU stage them by default). On 2 ranks the first
  // send sets the GPU path up; on more, a collective must have.
  runs.push_back({"p2p-kernel", "send/recv in the plan kernel, processes, 2 ranks", RankMode::ProcessesShm, 2, pointToPointChecks,
                  p2pKernel, 300});
  for (int n : {2, 3})
    runs.push_back({"p2p-kernel", "send/recv in the plan kernel after a collective, processes, " + std::to_string(n) + " ranks",
                    RankMode::ProcessesShm, n, pointToPointAfterCollective, p2pKernel, 300});
  runs.push_back({"staged", "staged collectives, processes on 3 hosts (NCCL_HOSTID)", RankMode::ProcessesShm, 3, checkAll, hosts, 600});
  for (int n : {2, 3, 4})
    runs.push_back({"threads", "threads, " + std::to_string(n) + " ranks on one GPU", RankMode::Threads, n, checkAll, plain, 900});
  runs.push_back({"threads", "a peer that never calls", RankMode::Threads, 3, peerNeverCalls, {{"TOPOCCL_TIMEOUT_MS", "3000"}}, 120});
  for (int n : {2, 3})
    runs.push_back({"p2p", "send/recv, threads, " + std::to_string(n) + " ranks, staged", RankMode::Threads, n, pointToPointChecks,
                    p2pStaged, 300});
  runs.push_back({"p2p-kernel", "send/recv in the plan kernel, threads, 2 ranks", RankMode::Threads, 2, pointToPointChecks, p2pKernel, 300});
  for (int n : {2, 3, 4})
    runs.push_back({"p2p-kernel", "send/recv in the plan kernel after a collective, threads, " + std::to_string(n) + " ranks",
                    RankMode::Threads, n, pointToPointAfterCollective, p2pKernel, 300});
  for (int n : {2, 3})
    runs.push_back({"staged", "staged collectives, threads (TOPOCCL_GPU_STAGED=always), " + std::to_string(n) + " ranks",
                    RankMode::Threads, n, checkAll, staged, 600});
  runs.push_back({"staged", "staged, a peer that never calls", RankMode::Threads, 3, peerNeverCalls,
                  {{"TOPOCCL_TIMEOUT_MS", "3000"}, {"TOPOCCL_GPU_STAGED", "always"}}, 120});
  for (int n : {2, 4})
    for (const char* fuse : {"1", "0"})
      runs.push_back({"fusion", "group timing, threads, " + std::to_string(n) + " ranks, TOPOCCL_GPU_FUSE_GROUPS=" + fuse,
                      RankMode::Threads, n, groupTiming, {{"TOPOCCL_TIMEOUT_MS", "30000"}, {"TOPOCCL_GPU_FUSE_GROUPS", fuse}}, 120});
  for (const Run& run : runs) {
    if (only.empty() && run.group == "fusion") continue;  // timing: run on request only
    if (!only.empty() && only != run.group) continue;
    gRanksAreThreads = run.mode == RankMode::Threads;
    const auto result = topoccl::test::runRanks(run.mode, run.nranks, run.body, run.env, run.timeoutSeconds);
    std::printf("%s: %d failures %s\n", run.label.c_str(), result.failures, result.problems.c_str());
    failures += result.failures;
  }
  std::printf("%s\n", failures == 0 ? "gpu collectives: PASSED" : "FAILED");
  return failures == 0 ? 0 : 1;
}
