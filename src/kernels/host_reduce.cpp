#include "kernels/host_reduce.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "common/error.hpp"
#include "kernels/reduce_ops.hpp"

namespace topoccl::kernels {
namespace {

static_assert(static_cast<int>(ReduceOp::Sum) == 0 && static_cast<int>(ReduceOp::Prod) == 1 &&
                  static_cast<int>(ReduceOp::Max) == 2 && static_cast<int>(ReduceOp::Min) == 3,
              "the reduce table is indexed by ReduceOp value");

// ---------------------------------------------------------------------------------------------
// Element loops. Each pointer that is known to be distinct is __restrict, so GCC vectorizes without
// runtime overlap checks (which would send the common in-place case down the scalar path); exact
// aliasing gets its own loop instead.

template <class T, class Op>
void reduceDistinct(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t count) {
  const Op op{};
  for (size_t i = 0; i < count; ++i) dst[i] = op(a[i], b[i]);
}

template <class T, class Op>
void reduceIntoFirst(T* __restrict accumulator, const T* __restrict b, size_t count) {
  const Op op{};
  for (size_t i = 0; i < count; ++i) accumulator[i] = op(accumulator[i], b[i]);
}

template <class T, class Op>
void reduceIntoSecond(T* __restrict accumulator, const T* __restrict a, size_t count) {
  const Op op{};
  for (size_t i = 0; i < count; ++i) accumulator[i] = op(a[i], accumulator[i]);  // keep operand order
}

template <class T, class Op>
void reduceWithItself(T* values, size_t count) {
  const Op op{};
  for (size_t i = 0; i < count; ++i) values[i] = op(values[i], values[i]);
}

template <class T, template <class> class Op>
void reduceArrays(void* dst, const void* a, const void* b, size_t count) {
  auto* out = static_cast<T*>(dst);
  const auto* first = static_cast<const T*>(a);
  const auto* second = static_cast<const T*>(b);
  if (dst == a && dst == b) {
    reduceWithItself<T, Op<T>>(out, count);
  } else if (dst == a) {
    reduceIntoFirst<T, Op<T>>(out, second, count);
  } else if (dst == b) {
    reduceIntoSecond<T, Op<T>>(out, first, count);
  } else {
    reduceDistinct<T, Op<T>>(out, first, second, count);
  }
}

struct ReduceTableMaker {
  template <class T>
  static constexpr std::array<ReduceFn, kNumKernelOps> entry() {
    return {&reduceArrays<T, SumOp>, &reduceArrays<T, ProdOp>, &reduceArrays<T, MaxOp>, &reduceArrays<T, MinOp>};
  }
};
constexpr auto kReduceTable = makeTypeTable<ReduceTableMaker>();

// Scaling is a product with a broadcast operand, so it rounds exactly like ProdOp.
template <class T>
void scaleDistinct(T* __restrict dst, const T* __restrict src, size_t count, T scalar) {
  const ProdOp<T> multiply{};
  for (size_t i = 0; i < count; ++i) dst[i] = multiply(src[i], scalar);
}

template <class T>
void scaleInPlace(T* values, size_t count, T scalar) {
  const ProdOp<T> multiply{};
  for (size_t i = 0; i < count; ++i) values[i] = multiply(values[i], scalar);
}

template <class T>
void scaleArrays(void* dst, const void* src, size_t count, T scalar) {
  if (dst == src) {
    scaleInPlace(static_cast<T*>(dst), count, scalar);
  } else {
    scaleDistinct(static_cast<T*>(dst), static_cast<const T*>(src), count, scalar);
  }
}

// Integer division truncating toward zero (divideTowardZero, shared with the GPU). x86 has no SIMD integer
// division, so this loop stays scalar; integer Avg is rare.
template <class T>
void divideIntegers(T* dst, const T* src, size_t count, uint64_t divisor) {
  for (size_t i = 0; i < count; ++i) dst[i] = divideTowardZero<T>(src[i], divisor);
}

// ---------------------------------------------------------------------------------------------
// Conversions from double (tests, tools, scalars).

// float nearest to `value` but, when inexact, the neighbour with an odd last bit. Rounding that to
// a format at least two bits narrower (half, bfloat16, fp8) then equals rounding `value` directly:
// plain double -> float -> half would round twice and get some near-ties wrong.
float roundToOddFloat(double value) {
  const float nearest = static_cast<float>(value);
  if (static_cast<double>(nearest) == value || std::isnan(value)) return nearest;
  auto bits = detail::bitCast<uint32_t>(nearest);
  if ((bits & 1u) == 0) {
    const bool overshot = std::fabs(static_cast<double>(nearest)) > std::fabs(value);
    bits = overshot ? bits - 1 : bits + 1;  // sign-magnitude: -1 shrinks, +1 grows the magnitude
  }
  return detail::bitCast<float>(bits);
}

// Integers: truncate toward zero like a C cast, but saturate out-of-range values and map NaN to 0
// instead of invoking undefined behaviour.
template <class T>
T integerFromDouble(double value) {
  if (std::isnan(value)) return 0;
  const double limit = std::ldexp(1.0, std::numeric_limits<T>::digits);  // max() + 1, exact
  const auto lowest = static_cast<double>(std::numeric_limits<T>::lowest());
  if (value >= limit) return std::numeric_limits<T>::max();
  if (value <= lowest) return std::numeric_limits<T>::lowest();
  return static_cast<T>(value);
}

template <class T>
T elementFromDouble(double value) {
  if constexpr (kIsIntegerElement<T>) {
    return integerFromDouble<T>(value);
  } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return static_cast<T>(value);
  } else {
    return Arith<T>::narrow(roundToOddFloat(value));
  }
}

template <class T>
double elementToDouble(T value) {
  return static_cast<double>(Arith<T>::widen(value));
}

template <class T>
T loadElement(const void* from) {
  T value;
  std::memcpy(&value, from, sizeof(T));
  return value;
}

template <class T>
void storeElement(void* to, T value) {
  std::memcpy(to, &value, sizeof(T));
}

// ---------------------------------------------------------------------------------------------
// Per-call type dispatch for the non-reduce entry points: one switch, then a typed loop.

template <class T>
struct TypeTag {
  using type = T;
};

[[noreturn]] void throwUnknownType(const char* caller, DataType type) {
  throwInvalidArgument(std::string(caller) + ": unknown data type " + std::to_string(static_cast<int>(type)) +
                       " (valid: 0.." + std::to_string(kNumDataTypes - 1) + ")");
}

template <class Visitor>
decltype(auto) visitElementType(DataType type, const char* caller, Visitor&& visit) {
  switch (type) {
    case DataType::Int8: return visit(TypeTag<ElementType<DataType::Int8>>{});
    case DataType::Uint8: return visit(TypeTag<ElementType<DataType::Uint8>>{});
    case DataType::Int32: return visit(TypeTag<ElementType<DataType::Int32>>{});
    case DataType::Uint32: return visit(TypeTag<ElementType<DataType::Uint32>>{});
    case DataType::Int64: return visit(TypeTag<ElementType<DataType::Int64>>{});
    case DataType::Uint64: return visit(TypeTag<ElementType<DataType::Uint64>>{});
    case DataType::Float16: return visit(TypeTag<ElementType<DataType::Float16>>{});
    case DataType::Float32: return visit(TypeTag<ElementType<DataType::Float32>>{});
    case DataType::Float64: return visit(TypeTag<ElementType<DataType::Float64>>{});
    case DataType::Bfloat16: return visit(TypeTag<ElementType<DataType::Bfloat16>>{});
    case DataType::Float8e4m3: return visit(TypeTag<ElementType<DataType::Float8e4m3>>{});
    case DataType::Float8e5m2: return visit(TypeTag<ElementType<DataType::Float8e5m2>>{});
  }
  throwUnknownType(caller, type);
}

void requireCount(const char* caller, size_t count, const void* dst, const void* src) {
  if (count > 0 && (dst == nullptr || src == nullptr))
    throwInvalidArgument(std::string(caller) + ": null buffer with count " + std::to_string(count));
}

}  // namespace

ReduceFn hostReduceFunction(DataType type, ReduceOp op) {
  if (!isValidDataType(static_cast<int>(type))) throwUnknownType("hostReduceFunction", type);
  if (!isKernelOp(op)) {
    const int raw = static_cast<int>(op);
    const std::string opText = raw < kNumReduceOps ? std::string("'") + reduceOpName(op) + "'" : std::to_string(raw);
    throwInvalidArgument(std::string("hostReduceFunction: reduction op ") + opText + " is not supported on type '" +
                         dataTypeName(type) + "' (kernels implement sum, prod, max, min; avg and premulsum are "
                         "lowered by core)");
  }
  return kReduceTable[static_cast<size_t>(type)][static_cast<size_t>(op)];
}

void hostScale(DataType type, void* dst, const void* src, size_t count, const void* scalar) {
  requireCount("hostScale", count, dst, src);
  if (scalar == nullptr) throwInvalidArgument("hostScale: null scalar");
  visitElementType(type, "hostScale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    scaleArrays<T>(dst, src, count, loadElement<T>(scalar));
  });
}

void hostDivide(DataType type, void* dst, const void* src, size_t count, uint64_t divisor) {
  requireCount("hostDivide", count, dst, src);
  if (divisor == 0) throwInvalidArgument(std::string("hostDivide: division by zero on type '") + dataTypeName(type) + "'");
  visitElementType(type, "hostDivide", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kIsIntegerElement<T>) {
      divideIntegers<T>(static_cast<T*>(dst), static_cast<const T*>(src), count, divisor);  // dst == src is fine
    } else {
      // Floating types multiply by 1/divisor rounded to T: exactly what PreMulSum(1/n) computes.
      T reciprocal;
      reciprocalScalar(type, divisor, &reciprocal);
      scaleArrays<T>(dst, src, count, reciprocal);
    }
  });
}

void reciprocalScalar(DataType type, uint64_t n, void* scalarOut) {
  if (n == 0) throwInvalidArgument(std::string("reciprocalScalar: 1/0 requested for type '") + dataTypeName(type) + "'");
  if (scalarOut == nullptr) throwInvalidArgument("reciprocalScalar: null output");
  visitElementType(type, "reciprocalScalar", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (kIsIntegerElement<T>) {
      storeElement<T>(scalarOut, static_cast<T>(n == 1 ? 1 : 0));  // 1/n truncated toward zero
    } else {
      storeElement<T>(scalarOut, elementFromDouble<T>(1.0 / static_cast<double>(n)));  // correctly rounded
    }
  });
}

double loadAsDouble(DataType type, const void* data, size_t index) {
  return visitElementType(type, "loadAsDouble", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return elementToDouble(loadElement<T>(static_cast<const char*>(data) + index * sizeof(T)));
  });
}

void storeFromDouble(DataType type, void* data, size_t index, double value) {
  visitElementType(type, "storeFromDouble", [&](auto tag) {
    using T = typename decltype(tag)::type;
    storeElement<T>(static_cast<char*>(data) + index * sizeof(T), elementFromDouble<T>(value));
  });
}

}  // namespace topoccl::kernels
