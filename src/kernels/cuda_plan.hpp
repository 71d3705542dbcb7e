// Host-callable entry point of the GPU plan executor (kernels/cuda/plan_kernels.cu). Declared only where
// CUDA exists, like cuda_reduce.hpp.
#pragma once

#if defined(__CUDACC__) || defined(TOPOCCL_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/datatype.hpp"
#include "kernels/device_plan.hpp"

namespace topoccl::kernels {

// Threads per lane (thread block) at most; a launch may use fewer, in whole warps.
inline constexpr unsigned kPlanThreadsPerLane = 512;

// Enqueues the plan at `plan` (device memory, as core::writeDeviceImage laid it out for that address) and the
// plans chained after it (DevicePlan::next) on `stream`: `lanes` thread blocks of `threadsPerLane` threads,
// all resident at once (a lane may wait for another); `lanes` is the most any plan of the chain has. Chains
// without a reduction (reduces = false) ignore type and op. Returns the launch status;
// the outcome lands in the plan's status word once the stream reaches it.
cudaError_t launchPlan(DataType type, ReduceOp op, bool reduces, const DevicePlan* plan, uint32_t lanes,
                       unsigned threadsPerLane, cudaStream_t stream);

// Loads every topoccl kernel into the current device's context now. Under CUDA's lazy loading (the default) a
// kernel's first launch loads it, and loading may wait for the kernels already running in the context: a plan
// kernel that waits for a peer rank (a thread of this process) whose next launch is stuck behind that load
// never finishes. So the GPU path and GPU staging load everything at set-up, as NCCL does.
cudaError_t loadKernels();
cudaError_t loadReduceKernels();  // reduce_kernels.cu's share of loadKernels
cudaError_t loadWaitKernel();     // host_wait.cu's

// Enqueues on `stream` a one-thread kernel that first writes `ticket` to *started (the stream's earlier work is
// done), then returns once *published reaches `ticket` or *abortFlag is non-zero; all three in mapped host
// memory. The stream waits there for the host (GPU staging, core/gpu_staging.hpp), and the host learns that the
// stream got there without a CUDA call.
cudaError_t launchWaitForHost(const uint64_t* published, uint64_t ticket, const uint64_t* abortFlag, uint64_t* started,
                              cudaStream_t stream);

}  // namespace topoccl::kernels

#endif
