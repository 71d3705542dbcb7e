// Host-callable entry point of the CUDA reduction kernels (kernels/cuda/reduce_kernels.cu).
// Declared only where CUDA exists: in nvcc translation units, and in host code built against a
// topoccl_kernels that was configured with CUDA (TOPOCCL_HAVE_CUDA). Non-CUDA builds see nothing,
// so they never include a CUDA header.
#pragma once

#if defined(__CUDACC__) || defined(TOPOCCL_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/datatype.hpp"

namespace topoccl::kernels {

// Enqueues dst[i] = a[i] (op) b[i], i < count, on `stream` (device pointers; dst may alias a or b
// exactly). Same operators and rounding as the host loops (reduce_ops.hpp). Sum, Prod, Max, Min
// only; any other op or type returns cudaErrorInvalidValue without launching. count == 0 launches
// nothing. Returns the launch status; kernel faults surface later on the stream.
cudaError_t launchReduce(DataType type, ReduceOp op, void* dst, const void* a, const void* b, size_t count,
                         cudaStream_t stream);

// Enqueues dst[i] = src[i] * scalar, i < count (PreMulSum's prescale, floating Avg's 1/n). The scalar is read
// on the device from `deviceScalar` when that is not null (ncclScalarDevice), else it is the value at
// `hostScalar` (host memory, read now). dst may alias src exactly. Every DataType.
cudaError_t launchScale(DataType type, void* dst, const void* src, size_t count, const void* hostScalar,
                        const void* deviceScalar, cudaStream_t stream);

// Enqueues dst[i] = src[i] / divisor truncated toward zero (integer Avg). Integer types only; a floating type
// returns cudaErrorInvalidValue (floating Avg is a prescale). dst may alias src exactly.
cudaError_t launchDivide(DataType type, void* dst, const void* src, size_t count, uint64_t divisor, cudaStream_t stream);

// Enqueues a copy of `bytes` bytes (device or mapped pointers, no overlap) on `stream`, 16 bytes a thread
// where src and dst share their offset modulo 16. 0 bytes launches nothing.
cudaError_t launchCopy(void* dst, const void* src, size_t bytes, cudaStream_t stream);

}  // namespace topoccl::kernels

#endif
