// Host reduction and copy primitives over contiguous arrays: one function per (type, op) chosen
// once per call, with vectorizable inner loops; never a per-element virtual call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/datatype.hpp"

namespace topoccl::kernels {

// dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b (exactly, not partially).
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);

// Sum, Prod, Max, Min for every DataType. Avg and PreMulSum are lowered by core (see datatype.hpp);
// asking for them throws topoccl::Error(ncclInvalidArgument).
ReduceFn hostReduceFunction(DataType type, ReduceOp op);

// dst[i] = src[i] * scalar, where `scalar` points at one value of `type` (PreMulSum's factor).
void hostScale(DataType type, void* dst, const void* src, size_t count, const void* scalar);

// dst[i] = src[i] / divisor (integer Avg: divide the sum by nranks, rounding toward zero like C).
// For floating types this multiplies by 1/divisor in the type's arithmetic.
void hostDivide(DataType type, void* dst, const void* src, size_t count, uint64_t divisor);

// Builds the PreMulSum factor 1/n in `type`'s representation (floating Avg lowering).
void reciprocalScalar(DataType type, uint64_t n, void* scalarOut);

// Element conversions used by tests and tools: value of element i of `data` as double, and back.
double loadAsDouble(DataType type, const void* data, size_t index);
void storeFromDouble(DataType type, void* data, size_t index, double value);

}  // namespace topoccl::kernels
