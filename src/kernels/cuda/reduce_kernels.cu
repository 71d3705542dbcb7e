// CUDA reductions and copies: one kernel per (type, op), running the packed code of packed_reduce.hpp with
// one worker per thread of the grid (16-byte loads and stores; scalar heads and tails), built from the same
// operator functors as the host loops so both sides produce bit-identical results.
#include <algorithm>
#include <array>
#include <cstring>

#include "kernels/cuda_reduce.hpp"
#include "kernels/packed_reduce.hpp"
#include "kernels/reduce_ops.hpp"

namespace topoccl::kernels {
namespace {

constexpr unsigned kThreadsPerBlock = 256;
// Enough blocks to fill any current GPU several times over; the workers' strided loops cover the rest,
// so huge counts never exceed grid limits.
constexpr size_t kMaxBlocks = 8192;

// One worker per thread; no __restrict__: dst may alias a or b exactly (in-place reduction).
template <class T, class Op>
__global__ void __launch_bounds__(kThreadsPerBlock) packedReduceKernel(T* dst, const T* a, const T* b, size_t count) {
  const size_t workers = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t worker = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  reduceShare<T, Op>(dst, a, b, count, worker, workers);
}

__global__ void __launch_bounds__(kThreadsPerBlock) packedCopyKernel(void* dst, const void* src, size_t bytes) {
  const size_t workers = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t worker = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  copyShare(dst, src, bytes, worker, workers);
}

template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock) scaleKernel(T* dst, const T* src, T scalar, const T* deviceScalar,
                                                                size_t count) {
  const size_t workers = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t worker = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  scaleShare<T>(dst, src, deviceScalar != nullptr ? *deviceScalar : scalar, count, worker, workers);
}

template <class T>
__global__ void __launch_bounds__(kThreadsPerBlock) divideKernel(T* dst, const T* src, uint64_t divisor, size_t count) {
  const size_t workers = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t worker = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  divideShare<T>(dst, src, divisor, count, worker, workers);
}

// Blocks for `bytes`: a thread per 16-byte pack, at least one block, at most kMaxBlocks.
unsigned blocksFor(size_t bytes) {
  const size_t packs = (bytes + kPackBytes - 1) / kPackBytes;
  return static_cast<unsigned>(std::clamp<size_t>((packs + kThreadsPerBlock - 1) / kThreadsPerBlock, 1, kMaxBlocks));
}

using LaunchFn = cudaError_t (*)(void*, const void*, const void*, size_t, cudaStream_t);

template <class T, template <class> class Op>
cudaError_t launchTyped(void* dst, const void* a, const void* b, size_t count, cudaStream_t stream) {
  packedReduceKernel<T, Op<T>><<<blocksFor(count * sizeof(T)), kThreadsPerBlock, 0, stream>>>(
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

using ScaleFn = cudaError_t (*)(void*, const void*, size_t, const void*, const void*, cudaStream_t);
using DivideFn = cudaError_t (*)(void*, const void*, size_t, uint64_t, cudaStream_t);

template <class T>
cudaError_t launchScaleTyped(void* dst, const void* src, size_t count, const void* hostScalar, const void* deviceScalar,
                             cudaStream_t stream) {
  T scalar{};
  if (hostScalar != nullptr) memcpy(&scalar, hostScalar, sizeof(T));
  scaleKernel<T><<<blocksFor(count * sizeof(T)), kThreadsPerBlock, 0, stream>>>(
      static_cast<T*>(dst), static_cast<const T*>(src), scalar, static_cast<const T*>(deviceScalar), count);
  return cudaGetLastError();
}

template <class T>
cudaError_t launchDivideTyped(void* dst, const void* src, size_t count, uint64_t divisor, cudaStream_t stream) {
  if constexpr (!kIsIntegerElement<T>) {
    return cudaErrorInvalidValue;
  } else {
    divideKernel<T><<<blocksFor(count * sizeof(T)), kThreadsPerBlock, 0, stream>>>(
        static_cast<T*>(dst), static_cast<const T*>(src), divisor, count);
    return cudaGetLastError();
  }
}

// Forces the lazy loader to load every kernel of type T now (cudaFuncGetAttributes loads a kernel).
using LoadFn = cudaError_t (*)();
template <class T>
cudaError_t loadTyped() {
  cudaFuncAttributes attributes;
  const void* kernels[] = {reinterpret_cast<const void*>(&packedReduceKernel<T, SumOp<T>>),
                           reinterpret_cast<const void*>(&packedReduceKernel<T, ProdOp<T>>),
                           reinterpret_cast<const void*>(&packedReduceKernel<T, MaxOp<T>>),
                           reinterpret_cast<const void*>(&packedReduceKernel<T, MinOp<T>>),
                           reinterpret_cast<const void*>(&scaleKernel<T>)};
  for (const void* kernel : kernels)
    if (const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel); e != cudaSuccess) return e;
  if constexpr (kIsIntegerElement<T>) return cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(&divideKernel<T>));
  return cudaSuccess;
}
struct LoadTableMaker {
  template <class T>
  static constexpr std::array<LoadFn, 1> entry() {
    return {{&loadTyped<T>}};
  }
};
constexpr auto kLoadTable = makeTypeTable<LoadTableMaker>();

struct ScaleTableMaker {
  template <class T>
  static constexpr std::array<ScaleFn, 1> entry() {
    return {{&launchScaleTyped<T>}};
  }
};
constexpr auto kScaleTable = makeTypeTable<ScaleTableMaker>();

struct DivideTableMaker {
  template <class T>
  static constexpr std::array<DivideFn, 1> entry() {
    return {{&launchDivideTyped<T>}};
  }
};
constexpr auto kDivideTable = makeTypeTable<DivideTableMaker>();

}  // namespace

cudaError_t loadReduceKernels() {
  for (const auto& entry : kLoadTable)
    if (const cudaError_t e = entry[0](); e != cudaSuccess) return e;
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(&packedCopyKernel));
}

cudaError_t launchScale(DataType type, void* dst, const void* src, size_t count, const void* hostScalar,
                        const void* deviceScalar, cudaStream_t stream) {
  if (!isValidDataType(static_cast<int>(type))) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr || (hostScalar == nullptr && deviceScalar == nullptr)) return cudaErrorInvalidValue;
  return kScaleTable[static_cast<size_t>(type)][0](dst, src, count, hostScalar, deviceScalar, stream);
}

cudaError_t launchDivide(DataType type, void* dst, const void* src, size_t count, uint64_t divisor, cudaStream_t stream) {
  if (!isValidDataType(static_cast<int>(type)) || divisor == 0) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  return kDivideTable[static_cast<size_t>(type)][0](dst, src, count, divisor, stream);
}

cudaError_t launchReduce(DataType type, ReduceOp op, void* dst, const void* a, const void* b, size_t count,
                         cudaStream_t stream) {
  if (!isValidDataType(static_cast<int>(type)) || !isKernelOp(op)) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || a == nullptr || b == nullptr) return cudaErrorInvalidValue;
  return kLaunchTable[static_cast<size_t>(type)][static_cast<size_t>(op)](dst, a, b, count, stream);
}

cudaError_t launchCopy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return cudaErrorInvalidValue;
  packedCopyKernel<<<blocksFor(bytes), kThreadsPerBlock, 0, stream>>>(dst, src, bytes);
  return cudaGetLastError();
}

}  // namespace topoccl::kernels
