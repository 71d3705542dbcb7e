// The GPU plan executor: one kernel launch per collective or fused group of collectives (a chain of plans),
// one thread block per lane, each running the lane loop of plan_interpreter.hpp with a worker per thread, the
// same code the host tests run on std::threads.
// One kernel per (type, op) for reducing plans, one byte-typed kernel for plans that only move data.
#include <algorithm>
#include <array>

#include "kernels/cuda_plan.hpp"
#include "kernels/plan_interpreter.hpp"
#include "kernels/reduce_ops.hpp"

namespace topoccl::kernels {
namespace {

// The lane's workers are the block's threads; __syncthreads_or is syncAny.
struct CudaBlock {
  __device__ size_t worker() const { return threadIdx.x; }
  __device__ size_t workers() const { return blockDim.x; }
  __device__ void sync() const { __syncthreads(); }
  __device__ bool syncAny(bool mine) const { return __syncthreads_or(mine ? 1 : 0) != 0; }
  // Long waits back off, so a lane waiting for a peer leaves the memory system to the lanes that move data.
  __device__ void pause(uint64_t spins) const {
    if (spins > 64) __nanosleep(128);
  }
};

template <class T, class Op>
__global__ void __launch_bounds__(kPlanThreadsPerLane, 1) planKernel(const DevicePlan* plan) {
  CudaBlock block;
  runPlanChain<T, Op, CudaBlock>(plan, blockIdx.x, block);
}

using PlanLaunchFn = cudaError_t (*)(const DevicePlan*, uint32_t, unsigned, cudaStream_t);

template <class T, template <class> class Op>
cudaError_t launchTypedPlan(const DevicePlan* plan, uint32_t lanes, unsigned threads, cudaStream_t stream) {
  planKernel<T, Op<T>><<<lanes, threads, 0, stream>>>(plan);
  return cudaGetLastError();
}

using PlanLoadFn = cudaError_t (*)();
template <class T>
cudaError_t loadTypedPlan() {
  cudaFuncAttributes attributes;
  const void* kernels[] = {reinterpret_cast<const void*>(&planKernel<T, SumOp<T>>), reinterpret_cast<const void*>(&planKernel<T, ProdOp<T>>),
                           reinterpret_cast<const void*>(&planKernel<T, MaxOp<T>>), reinterpret_cast<const void*>(&planKernel<T, MinOp<T>>)};
  for (const void* kernel : kernels)
    if (const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel); e != cudaSuccess) return e;
  return cudaSuccess;
}
struct PlanLoadTableMaker {
  template <class T>
  static constexpr std::array<PlanLoadFn, 1> entry() {
    return {{&loadTypedPlan<T>}};
  }
};
constexpr auto kPlanLoadTable = makeTypeTable<PlanLoadTableMaker>();

struct PlanLaunchTableMaker {
  template <class T>
  static constexpr std::array<PlanLaunchFn, kNumKernelOps> entry() {
    return {&launchTypedPlan<T, SumOp>, &launchTypedPlan<T, ProdOp>, &launchTypedPlan<T, MaxOp>, &launchTypedPlan<T, MinOp>};
  }
};
constexpr auto kPlanLaunchTable = makeTypeTable<PlanLaunchTableMaker>();

}  // namespace

cudaError_t loadKernels() {
  for (const auto& entry : kPlanLoadTable)
    if (const cudaError_t e = entry[0](); e != cudaSuccess) return e;
  if (const cudaError_t e = loadReduceKernels(); e != cudaSuccess) return e;
  return loadWaitKernel();
}

cudaError_t launchPlan(DataType type, ReduceOp op, bool reduces, const DevicePlan* plan, uint32_t lanes,
                       unsigned threadsPerLane, cudaStream_t stream) {
  if (plan == nullptr || threadsPerLane == 0 || threadsPerLane > kPlanThreadsPerLane || threadsPerLane % 32 != 0)
    return cudaErrorInvalidValue;
  if (lanes == 0) return cudaSuccess;
  if (!reduces) return launchTypedPlan<uint8_t, SumOp>(plan, lanes, threadsPerLane, stream);
  if (!isValidDataType(static_cast<int>(type)) || !isKernelOp(op)) return cudaErrorInvalidValue;
  return kPlanLaunchTable[static_cast<size_t>(type)][static_cast<size_t>(op)](plan, lanes, threadsPerLane, stream);
}

}  // namespace topoccl::kernels
