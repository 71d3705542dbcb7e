// Element types and reduction operators, mirroring ncclDataType_t / ncclRedOp_t values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "nccl.h"

namespace topoccl {

enum class DataType : uint8_t {
  Int8 = ncclInt8,
  Uint8 = ncclUint8,
  Int32 = ncclInt32,
  Uint32 = ncclUint32,
  Int64 = ncclInt64,
  Uint64 = ncclUint64,
  Float16 = ncclFloat16,
  Float32 = ncclFloat32,
  Float64 = ncclFloat64,
  Bfloat16 = ncclBfloat16,
  Float8e4m3 = ncclFloat8e4m3,
  Float8e5m2 = ncclFloat8e5m2,
};
inline constexpr int kNumDataTypes = ncclNumTypes;

// The operator the kernels apply. Avg and PreMulSum are lowered by core before kernels see them:
// floating Avg becomes PreMulSum(1/n), integer Avg becomes Sum followed by a division by n.
enum class ReduceOp : uint8_t { Sum = ncclSum, Prod = ncclProd, Max = ncclMax, Min = ncclMin, Avg = ncclAvg, PreMulSum = 5 };
inline constexpr int kNumReduceOps = 6;

size_t dataTypeSize(DataType type) noexcept;
const char* dataTypeName(DataType type) noexcept;       // nccl-tests spelling: "float", "bfloat16", ...
const char* reduceOpName(ReduceOp op) noexcept;         // "sum", "prod", ...
bool isFloatingPoint(DataType type) noexcept;
bool isValidDataType(int raw) noexcept;

}  // namespace topoccl
