// The CUDA reduce and copy kernels' bandwidth against the device's own copy (cudaMemcpy device to device),
// counting bytes read plus bytes written (reduce: two inputs, one output = 3x the operand; copy: 2x). Times
// with events, median of repeats, buffers rotated so that the L2 cache holds none of them. Checks one result
// of each kernel first. Issue 7 asks for the reduce kernel at >= 85% of the copy bandwidth.
//   gpu_kernel_bandwidth [--bytes N] [--repeats R]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda_reduce.hpp"

using namespace topoccl;
using namespace topoccl::kernels;

namespace {

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "gpu_kernel_bandwidth: %s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

// Median milliseconds of `repeats` runs of `body(i)` (i picks the buffer set).
template <typename Body>
double medianMs(int repeats, Body body) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) body(i);  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    check(cudaEventRecord(start), "cudaEventRecord");
    body(i);
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  check(cudaGetLastError(), "kernel");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t{1} << 30;
  int repeats = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--bytes") == 0) bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "gpu_kernel_bandwidth: unknown argument %s (use --bytes N --repeats R)\n", argv[i]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("# %s, %d SMs, L2 %d MiB; operand %zu MiB, median of %d\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, bytes >> 20, repeats);
  constexpr int kSets = 2;  // two buffer sets, each far larger than L2
  std::vector<char*> a(kSets), b(kSets), d(kSets);
  for (int s = 0; s < kSets; ++s) {
    check(cudaMalloc(&a[s], bytes), "cudaMalloc");
    check(cudaMalloc(&b[s], bytes), "cudaMalloc");
    check(cudaMalloc(&d[s], bytes), "cudaMalloc");
    check(cudaMemset(a[s], 0x3c, bytes), "cudaMemset");  // 0x3c3c3c3c: 0.0115 as float, nonzero data
    check(cudaMemset(b[s], 0x3d, bytes), "cudaMemset");
  }
  // Spot check: float sum of the two patterns, and the copy.
  {
    check(launchReduce(DataType::Float32, ReduceOp::Sum, d[0], a[0], b[0], bytes / 4, nullptr), "launchReduce");
    float x, y, got;
    std::memset(&x, 0x3c, 4);
    std::memset(&y, 0x3d, 4);
    check(cudaMemcpy(&got, d[0] + bytes - 4, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (got != x + y) {
      std::printf("FAILED: reduce gave %g, want %g\n", got, x + y);
      return 1;
    }
    check(launchCopy(d[1], a[1], bytes, nullptr), "launchCopy");
    check(cudaMemcpy(&got, d[1] + bytes / 2, 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (got != x) {
      std::printf("FAILED: copy gave %g, want %g\n", got, x);
      return 1;
    }
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  const double memcpyMs = medianMs(repeats, [&](int i) {
    check(cudaMemcpyAsync(d[i % kSets], a[i % kSets], bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync");
  });
  const double copyBw = 2 * gb / (memcpyMs / 1e3);
  std::printf("%-28s %10s %12s %10s\n", "kernel", "ms", "GB/s (r+w)", "of memcpy");
  std::printf("%-28s %10.3f %12.1f %9.1f%%\n", "cudaMemcpy device->device", memcpyMs, copyBw, 100.0);
  const double kernelCopyMs = medianMs(repeats, [&](int i) {
    check(launchCopy(d[i % kSets], a[i % kSets], bytes, nullptr), "launchCopy");
  });
  std::printf("%-28s %10.3f %12.1f %9.1f%%\n", "launchCopy", kernelCopyMs, 2 * gb / (kernelCopyMs / 1e3),
              100.0 * (2 * gb / (kernelCopyMs / 1e3)) / copyBw);
  struct Case {
    DataType type;
    ReduceOp op;
    const char* name;
  };
  const Case cases[] = {{DataType::Float32, ReduceOp::Sum, "reduce float32 sum"},
                        {DataType::Float16, ReduceOp::Sum, "reduce float16 sum"},
                        {DataType::Bfloat16, ReduceOp::Sum, "reduce bfloat16 sum"},
                        {DataType::Float64, ReduceOp::Sum, "reduce float64 sum"},
                        {DataType::Int32, ReduceOp::Max, "reduce int32 max"},
                        {DataType::Float8e4m3, ReduceOp::Sum, "reduce fp8e4m3 sum"},
                        {DataType::Int8, ReduceOp::Sum, "reduce int8 sum"}};
  double worst = 1e9;
  for (const Case& c : cases) {
    const size_t count = bytes / dataTypeSize(c.type);
    const double ms = medianMs(repeats, [&](int i) {
      check(launchReduce(c.type, c.op, d[i % kSets], a[i % kSets], b[i % kSets], count, nullptr), "launchReduce");
    });
    const double bw = 3 * gb / (ms / 1e3);
    worst = std::min(worst, bw / copyBw);
    std::printf("%-28s %10.3f %12.1f %9.1f%%\n", c.name, ms, bw, 100.0 * bw / copyBw);
  }
  std::printf("# reduce kernels: worst %.1f%% of the device's copy bandwidth (target >= 85%%)\n", 100.0 * worst);
  for (int s = 0; s < kSets; ++s) cudaFree(a[s]), cudaFree(b[s]), cudaFree(d[s]);
  return 0;
}
