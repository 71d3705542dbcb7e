#include "common/datatype.hpp"

namespace topoccl {

size_t dataTypeSize(DataType type) noexcept {
  switch (type) {
    case DataType::Int8:
    case DataType::Uint8:
    case DataType::Float8e4m3:
    case DataType::Float8e5m2: return 1;
    case DataType::Float16:
    case DataType::Bfloat16: return 2;
    case DataType::Int32:
    case DataType::Uint32:
    case DataType::Float32: return 4;
    case DataType::Int64:
    case DataType::Uint64:
    case DataType::Float64: return 8;
  }
  return 0;
}

const char* dataTypeName(DataType type) noexcept {
  switch (type) {
    case DataType::Int8: return "int8";
    case DataType::Uint8: return "uint8";
    case DataType::Int32: return "int32";
    case DataType::Uint32: return "uint32";
    case DataType::Int64: return "int64";
    case DataType::Uint64: return "uint64";
    case DataType::Float16: return "half";
    case DataType::Float32: return "float";
    case DataType::Float64: return "double";
    case DataType::Bfloat16: return "bfloat16";
    case DataType::Float8e4m3: return "f8e4m3";
    case DataType::Float8e5m2: return "f8e5m2";
  }
  return "unknown";
}

const char* reduceOpName(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::PreMulSum: return "premulsum";
  }
  return "unknown";
}

bool isFloatingPoint(DataType type) noexcept {
  switch (type) {
    case DataType::Float16:
    case DataType::Float32:
    case DataType::Float64:
    case DataType::Bfloat16:
    case DataType::Float8e4m3:
    case DataType::Float8e5m2: return true;
    default: return false;
  }
}

bool isValidDataType(int raw) noexcept { return raw >= 0 && raw < kNumDataTypes; }

}  // namespace topoccl
