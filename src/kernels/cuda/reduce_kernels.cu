// CUDA elementwise reduction: one grid-stride kernel per (type, op), built from the same operator
// functors as the host loops so both sides produce bit-identical results.
#include <algorithm>
#include <array>

#include "kernels/cuda_reduce.hpp"
#include "kernels/reduce_ops.hpp"

namespace topoccl::kernels {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
// Enough blocks to fill any current GPU several times over; the grid-stride loop covers the rest,
// so huge counts never exceed grid limits.
constexpr size_t kMaxBlocks = 8192;

// No __restrict__: dst may alias a or b exactly (in-place reduction). Each element is read and
// written by the same thread, so that aliasing is safe.
template <class T, class Op>
__global__ void elementwiseReduceKernel(T* dst, const T* a, const T* b, size_t count) {
  const Op op{};
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] = op(a[i], b[i]);
  }
}

using LaunchFn = cudaError_t (*)(void*, const void*, const void*, size_t, cudaStream_t);

template <class T, template <class> class Op>
cudaError_t launchTyped(void* dst, const void* a, const void* b, size_t count, cudaStream_t stream) {
  const size_t blocks = std::min((count + kThreadsPerBlock - 1) / kThreadsPerBlock, kMaxBlocks);
  elementwiseReduceKernel<T, Op<T>><<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count);
  return cudaGetLastError();
}

struct LaunchTableMaker {
  template <class T>
  static constexpr std::array<LaunchFn, kNumKernelOps> entry() {
    return {&launchTyped<T, SumOp>, &launchTyped<T, ProdOp>, &launchTyped<T, MaxOp>, &launchTyped<T, MinOp>};
  }
};
constexpr auto kLaunchTable = makeTypeTable<LaunchTableMaker>();

}  // namespace

cudaError_t launchReduce(DataType type, ReduceOp op, void* dst, const void* a, const void* b, size_t count,
                         cudaStream_t stream) {
  if (!isValidDataType(static_cast<int>(type)) || !isKernelOp(op)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || a == nullptr || b == nullptr) return cudaErrorInvalidValue;
  return kLaunchTable[static_cast<size_t>(type)][static_cast<size_t>(op)](dst, a, b, count, stream);
}

}  // namespace topoccl::kernels
