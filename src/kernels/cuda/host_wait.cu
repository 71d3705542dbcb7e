// The stream's side of GPU staging (core/gpu_staging.cpp): a kernel that waits for the host's go-ahead.
#include "kernels/cuda_plan.hpp"

namespace topoccl::kernels {
namespace {

__global__ void waitForHostKernel(const uint64_t* published, uint64_t ticket, const uint64_t* abortFlag, uint64_t* started) {
  // The copies before this kernel on the stream are done: tell the host (which polls this, never CUDA).
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(started), "l"(ticket) : "memory");
  for (;;) {
    uint64_t seen, aborted;
    // System scope: the host writes these, and the copies after this kernel read what it wrote before.
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(seen) : "l"(published) : "memory");
    asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(aborted) : "l"(abortFlag) : "memory");
    if (seen >= ticket || aborted != 0) return;
    __nanosleep(1000);  // the host side takes microseconds at best; leave the memory system alone meanwhile
  }
}

}  // namespace

cudaError_t loadWaitKernel() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(&waitForHostKernel));
}

cudaError_t launchWaitForHost(const uint64_t* published, uint64_t ticket, const uint64_t* abortFlag, uint64_t* started,
                              cudaStream_t stream) {
  if (published == nullptr || abortFlag == nullptr || started == nullptr) return cudaErrorInvalidValue;
  waitForHostKernel<<<1, 1, 0, stream>>>(published, ticket, abortFlag, started);
  return cudaGetLastError();
}

}  // namespace topoccl::kernels
