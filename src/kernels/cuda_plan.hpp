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

// Enqueues the plan at `plan` (device memory, as core::writeDeviceImage laid it out for that address) on
// `stream`: `lanes` thread blocks of `threadsPerLane` threads, all resident at once (a lane may wait for
// another). Plans without a reduction (reduces = false) ignore type and op. Returns the launch status;
// the outcome lands in the plan's status word once the stream reaches it.
cudaError_t launchPlan(DataType type, ReduceOp op, bool reduces, const DevicePlan* plan, uint32_t lanes,
                       unsigned threadsPerLane, cudaStream_t stream);

}  // namespace topoccl::kernels

#endif
