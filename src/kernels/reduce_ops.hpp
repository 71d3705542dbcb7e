// Element types and reduction operators shared by the host loops (host_reduce.cpp) and the CUDA
// kernels (cuda/*.cu): one definition of every type's arithmetic, so both sides round alike.
// Kept C++17-compatible and free of CUDA headers so g++ and nvcc (any -std) both accept it.
#pragma once

#include <stdint.h>
#include <string.h>  // memcpy: the bit cast that both g++ and nvcc device code accept

#include <array>
#include <type_traits>
#include <utility>

#include "common/datatype.hpp"

#if defined(__CUDACC__)
#define TOPOCCL_HD __host__ __device__
#else
#define TOPOCCL_HD
#endif

namespace topoccl::kernels {

// ---------------------------------------------------------------------------------------------
// Storage types. Plain bit containers: trivially copyable, same size and layout as the wire format,
// so an array of them is exactly the user's buffer. Arithmetic goes through float (see Arith below).

struct Half {  // IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits; has inf and NaN
  uint16_t bits;
};
struct BFloat16 {  // bfloat16: the top 16 bits of a float; has inf and NaN
  uint16_t bits;
};
struct Float8E4M3 {  // OCP E4M3FN: 1/4/3 bits, bias 7, no infinities, NaN only S.1111.111, max 448
  uint8_t bits;
};
struct Float8E5M2 {  // OCP E5M2: 1/5/2 bits, bias 15, IEEE-like inf and NaN, max 57344
  uint8_t bits;
};

namespace detail {

// By value: device code may not take the address of a host constexpr constant.
template <class To, class From>
TOPOCCL_HD inline To bitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "bitCast needs equal sizes");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

constexpr float powerOfTwo(int exponent) {
  float value = 1.0f;
  for (; exponent > 0; --exponent) value *= 2.0f;
  for (; exponent < 0; ++exponent) value *= 0.5f;
  return value;
}

constexpr uint32_t kFloatSignMask = 0x80000000u;
constexpr uint32_t kFloatInfBits = 0x7f800000u;

// A binary format narrower than float with bias 2^(ExpBits-1)-1 (binary16, E5M2, E4M3FN).
// IeeeSpecials: the all-ones exponent encodes inf (mantissa 0) and NaN; otherwise (E4M3FN) only
// the all-ones pattern is NaN and the rest of that exponent holds ordinary numbers.
// Saturate: results beyond the largest finite value, infinities included, clamp to it (what
// CUDA's cvt ... satfinite does for fp8) instead of becoming inf.
// Every value of these formats is exactly a float, so decoding is exact; encoding rounds to
// nearest, ties to even, with select-only code so that host loops vectorize.
template <int ExpBits, int ManBits, bool IeeeSpecials, bool Saturate>
struct NarrowFloatFormat {
  static constexpr int kBias = (1 << (ExpBits - 1)) - 1;
  static constexpr int kDroppedBits = 23 - ManBits;  // float mantissa bits this format lacks
  static constexpr uint32_t kExpMask = (1u << ExpBits) - 1;
  static constexpr uint32_t kManMask = (1u << ManBits) - 1;
  static constexpr uint32_t kSignBit = 1u << (ExpBits + ManBits);
  static constexpr uint32_t kInfBits = kExpMask << ManBits;  // meaningful only with IeeeSpecials
  static constexpr uint32_t kNanBits = IeeeSpecials ? kInfBits | (1u << (ManBits - 1)) : kInfBits | kManMask;
  static constexpr uint32_t kMaxFiniteBits = IeeeSpecials ? kInfBits - 1 : kInfBits | (kManMask - 1);
  static constexpr uint32_t kOverflowBits = Saturate ? kMaxFiniteBits : kInfBits;
  // Float bit patterns of the smallest normal value of this format, and the rebias distance.
  static constexpr uint32_t kMinNormalAsFloatBits = static_cast<uint32_t>(127 - kBias + 1) << 23;
  static constexpr uint32_t kRebias = static_cast<uint32_t>(127 - kBias) << 23;
  // Spacing of subnormals, and a float whose own ulp equals it: adding it to a small magnitude
  // makes the FPU round that magnitude onto the subnormal grid (ties to even) for us.
  static constexpr float kSubnormalStep = powerOfTwo(1 - kBias - ManBits);
  static constexpr float kSubnormalRounder = powerOfTwo(24 - kBias - ManBits);

  TOPOCCL_HD static float decode(uint32_t bits) {
    const uint32_t sign = (bits & kSignBit) << (31 - ExpBits - ManBits);
    const uint32_t exponent = (bits >> ManBits) & kExpMask;
    const uint32_t mantissa = bits & kManMask;
    const uint32_t normal = ((exponent << 23) + kRebias) | (mantissa << kDroppedBits);
    const uint32_t subnormal = bitCast<uint32_t>(static_cast<float>(mantissa) * kSubnormalStep);
    // Infinities and NaNs keep their payload, so a NaN stays a NaN.
    const bool special = IeeeSpecials ? exponent == kExpMask : (exponent == kExpMask && mantissa == kManMask);
    const uint32_t specialBits = IeeeSpecials ? kFloatInfBits | (mantissa << kDroppedBits) : 0x7fc00000u;
    const uint32_t magnitude = special ? specialBits : (exponent == 0 ? subnormal : normal);
    return bitCast<float>(sign | magnitude);
  }

  TOPOCCL_HD static uint32_t encode(float value) {
    const uint32_t x = bitCast<uint32_t>(value);
    const uint32_t sign = (x & kFloatSignMask) >> (31 - ExpBits - ManBits);
    const uint32_t magnitude = x & ~kFloatSignMask;
    // Normal range: rebias the exponent, then round off the dropped bits, ties to even; a carry out
    // of the mantissa correctly bumps the exponent. (Garbage below the normal range; not selected.)
    const uint32_t keptLsb = (magnitude >> kDroppedBits) & 1u;
    const uint32_t normal = (magnitude - kRebias + ((1u << (kDroppedBits - 1)) - 1u) + keptLsb) >> kDroppedBits;
    const float rounded = bitCast<float>(magnitude) + kSubnormalRounder;
    const uint32_t subnormal = bitCast<uint32_t>(rounded) - bitCast<uint32_t>(kSubnormalRounder);
    uint32_t result = magnitude < kMinNormalAsFloatBits ? subnormal : normal;
    result = result > kOverflowBits ? kOverflowBits : result;  // also catches +-inf inputs
    // NaN: quiet it and keep the top payload bits (what F16C / cvt do); E4M3FN has one NaN.
    const uint32_t nan = IeeeSpecials ? kNanBits | ((magnitude >> kDroppedBits) & kManMask) : kNanBits;
    result = magnitude > kFloatInfBits ? nan : result;
    return sign | result;
  }
};

using HalfFormat = NarrowFloatFormat<5, 10, /*IeeeSpecials=*/true, /*Saturate=*/false>;
using Float8E5M2Format = NarrowFloatFormat<5, 2, /*IeeeSpecials=*/true, /*Saturate=*/true>;
using Float8E4M3Format = NarrowFloatFormat<4, 3, /*IeeeSpecials=*/false, /*Saturate=*/true>;

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Conversions to and from float, round to nearest even. fp8 saturates to its largest finite value
// (inf inputs included), as NCCL's satfinite conversions do; NaN stays NaN everywhere.

// On the GPU the conversions are single cvt instructions (the formats' rounding is the same: nearest even,
// fp8 satfinite), where the bit-level versions cost a reduce kernel 40-70% of its bandwidth (H200, 2026-11-26).
// fp8 cvt exists from sm_89; NaN inputs keep the bit-level path so the NaN's sign survives as on the host.
#if defined(__CUDA_ARCH__)
namespace detail {
__device__ inline float halfBitsToFloat(uint16_t bits) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
  return f;
}
#if __CUDA_ARCH__ >= 890
template <bool E4M3>
__device__ inline float fp8BitsToFloat(uint8_t bits) {
  uint32_t pair;  // two halves; the low one is our byte's
  if constexpr (E4M3) asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(pair) : "h"(static_cast<uint16_t>(bits)));
  else asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(pair) : "h"(static_cast<uint16_t>(bits)));
  return halfBitsToFloat(static_cast<uint16_t>(pair));
}
template <bool E4M3>
__device__ inline uint8_t floatToFp8Bits(float f) {  // not NaN: the caller keeps NaN's sign the bit-level way
  uint16_t pair;  // two bytes; the low one converts `f`
  if constexpr (E4M3) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(f));
  else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(f));
  return static_cast<uint8_t>(pair);
}
#endif
}  // namespace detail
#endif

TOPOCCL_HD inline float toFloat(Half h) {
#if defined(__CUDA_ARCH__)
  return detail::halfBitsToFloat(h.bits);
#else
  return detail::HalfFormat::decode(h.bits);
#endif
}
TOPOCCL_HD inline float toFloat(Float8E5M2 h) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return detail::fp8BitsToFloat</*E4M3=*/false>(h.bits);
#else
  return detail::Float8E5M2Format::decode(h.bits);
#endif
}
TOPOCCL_HD inline float toFloat(Float8E4M3 h) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return detail::fp8BitsToFloat</*E4M3=*/true>(h.bits);
#else
  return detail::Float8E4M3Format::decode(h.bits);
#endif
}
TOPOCCL_HD inline float toFloat(BFloat16 h) { return detail::bitCast<float>(static_cast<uint32_t>(h.bits) << 16); }

TOPOCCL_HD inline Half halfFromFloat(float f) {
#if defined(__CUDA_ARCH__)
  uint16_t bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f));
  return Half{f != f ? static_cast<uint16_t>(detail::HalfFormat::encode(f)) : bits};
#else
  return Half{static_cast<uint16_t>(detail::HalfFormat::encode(f))};
#endif
}
TOPOCCL_HD inline Float8E5M2 float8E5M2FromFloat(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (f == f) return Float8E5M2{detail::floatToFp8Bits</*E4M3=*/false>(f)};
#endif
  return Float8E5M2{static_cast<uint8_t>(detail::Float8E5M2Format::encode(f))};
}
TOPOCCL_HD inline Float8E4M3 float8E4M3FromFloat(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (f == f) return Float8E4M3{detail::floatToFp8Bits</*E4M3=*/true>(f)};
#endif
  return Float8E4M3{static_cast<uint8_t>(detail::Float8E4M3Format::encode(f))};
}
TOPOCCL_HD inline BFloat16 bfloat16FromFloat(float f) {
  const uint32_t x = detail::bitCast<uint32_t>(f);
  // Adding just under half an ulp plus the kept lsb rounds ties to even; overflow carries into inf.
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quietNan = (x >> 16) | 0x40u;
  return BFloat16{static_cast<uint16_t>((x & 0x7fffffffu) > detail::kFloatInfBits ? quietNan : rounded)};
}

// ---------------------------------------------------------------------------------------------
// Arith<T>: the type arithmetic happens in (Compute) and the conversions in and out. Native types
// compute in themselves; the 8/16-bit floats compute in float and round back once per operation.

template <class T>
struct Arith {
  using Compute = T;
  TOPOCCL_HD static Compute widen(T x) { return x; }
  TOPOCCL_HD static T narrow(Compute x) { return x; }
};
template <>
struct Arith<Half> {
  using Compute = float;
  TOPOCCL_HD static float widen(Half x) { return toFloat(x); }
  TOPOCCL_HD static Half narrow(float x) { return halfFromFloat(x); }
};
template <>
struct Arith<BFloat16> {
  using Compute = float;
  TOPOCCL_HD static float widen(BFloat16 x) { return toFloat(x); }
  TOPOCCL_HD static BFloat16 narrow(float x) { return bfloat16FromFloat(x); }
};
template <>
struct Arith<Float8E4M3> {
  using Compute = float;
  TOPOCCL_HD static float widen(Float8E4M3 x) { return toFloat(x); }
  TOPOCCL_HD static Float8E4M3 narrow(float x) { return float8E4M3FromFloat(x); }
};
template <>
struct Arith<Float8E5M2> {
  using Compute = float;
  TOPOCCL_HD static float widen(Float8E5M2 x) { return toFloat(x); }
  TOPOCCL_HD static Float8E5M2 narrow(float x) { return float8E5M2FromFloat(x); }
};

template <class T>
inline constexpr bool kIsIntegerElement = std::is_integral_v<T>;

namespace detail {
// Integers wrap modulo 2^bits like NCCL; done in unsigned arithmetic (at least unsigned int wide, so
// small types never promote to signed int and overflow) because signed overflow is UB.
template <class T>
using WrapType = std::common_type_t<std::make_unsigned_t<T>, unsigned int>;
template <class T>
TOPOCCL_HD inline T wrappingAdd(T a, T b) {
  return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
}
template <class T>
TOPOCCL_HD inline T wrappingMul(T a, T b) {
  return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
}

// cond ? ifTrue : ifFalse. Storage structs select their bits, not the struct: GCC will not
// vectorize a loop that copies whole aggregates conditionally.
template <class T>
TOPOCCL_HD inline T pick(bool cond, T ifTrue, T ifFalse) {
  if constexpr (std::is_arithmetic_v<T>) {
    return cond ? ifTrue : ifFalse;
  } else {
    return T{cond ? ifTrue.bits : ifFalse.bits};
  }
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Reduction operators: stateless functors, op(a, b), usable in host loops and device kernels.
// Max/Min on floating types follow NCCL (fmaxf/fminf, __hmax/__hmin): a NaN operand is ignored and
// the other one returned; the result is NaN only if both are. Ties (+0 vs -0) return the first.

template <class T>
struct SumOp {
  TOPOCCL_HD T operator()(T a, T b) const {
    if constexpr (kIsIntegerElement<T>) {
      return detail::wrappingAdd(a, b);
    } else {
      return Arith<T>::narrow(Arith<T>::widen(a) + Arith<T>::widen(b));
    }
  }
};

template <class T>
struct ProdOp {
  TOPOCCL_HD T operator()(T a, T b) const {
    if constexpr (kIsIntegerElement<T>) {
      return detail::wrappingMul(a, b);
    } else {
      return Arith<T>::narrow(Arith<T>::widen(a) * Arith<T>::widen(b));
    }
  }
};

// Max and Min return one of their operands unchanged, so narrow types need no rounding back.
template <class T>
struct MaxOp {
  TOPOCCL_HD T operator()(T a, T b) const {
    if constexpr (kIsIntegerElement<T>) {
      return a < b ? b : a;
    } else {
      const auto x = Arith<T>::widen(a);
      const auto y = Arith<T>::widen(b);
      return detail::pick(y > x || x != x, b, a);  // x != x: a is NaN, so take b
    }
  }
};

template <class T>
struct MinOp {
  TOPOCCL_HD T operator()(T a, T b) const {
    if constexpr (kIsIntegerElement<T>) {
      return b < a ? b : a;
    } else {
      const auto x = Arith<T>::widen(a);
      const auto y = Arith<T>::widen(b);
      return detail::pick(y < x || x != x, b, a);
    }
  }
};

// Integer Avg's last step: value / divisor truncated toward zero, on magnitudes in the type's unsigned width
// so the most negative value and divisors wider than the type need no special cases.
template <class T>
TOPOCCL_HD inline T divideTowardZero(T value, uint64_t divisor) {
  using Unsigned = std::make_unsigned_t<T>;
  if (divisor > static_cast<Unsigned>(~Unsigned(0))) return T(0);  // larger than any magnitude
  const auto narrowDivisor = static_cast<Unsigned>(divisor);
  if constexpr (std::is_signed_v<T>) {
    const bool negative = value < 0;
    const auto magnitude =
        static_cast<Unsigned>(negative ? Unsigned(0) - static_cast<Unsigned>(value) : static_cast<Unsigned>(value));
    const auto quotient = static_cast<Unsigned>(magnitude / narrowDivisor);
    return static_cast<T>(negative ? static_cast<Unsigned>(Unsigned(0) - quotient) : quotient);
  } else {
    return static_cast<T>(value / narrowDivisor);
  }
}

// The ops the kernels implement, indexed by ReduceOp's value (Sum, Prod, Max, Min); Avg and
// PreMulSum are lowered by core before kernels see them.
inline constexpr int kNumKernelOps = 4;
constexpr bool isKernelOp(ReduceOp op) { return static_cast<unsigned>(op) < kNumKernelOps; }

// ---------------------------------------------------------------------------------------------
// DataType -> storage type. To add a type: a storage struct, an Arith<> specialization if it is
// computed in another type, a line here, and (when NCCL gains it) the DataType enumerator.

template <DataType>
struct ElementOf;
template <> struct ElementOf<DataType::Int8> { using type = int8_t; };
template <> struct ElementOf<DataType::Uint8> { using type = uint8_t; };
template <> struct ElementOf<DataType::Int32> { using type = int32_t; };
template <> struct ElementOf<DataType::Uint32> { using type = uint32_t; };
template <> struct ElementOf<DataType::Int64> { using type = int64_t; };
template <> struct ElementOf<DataType::Uint64> { using type = uint64_t; };
template <> struct ElementOf<DataType::Float16> { using type = Half; };
template <> struct ElementOf<DataType::Float32> { using type = float; };
template <> struct ElementOf<DataType::Float64> { using type = double; };
template <> struct ElementOf<DataType::Bfloat16> { using type = BFloat16; };
template <> struct ElementOf<DataType::Float8e4m3> { using type = Float8E4M3; };
template <> struct ElementOf<DataType::Float8e5m2> { using type = Float8E5M2; };
template <DataType D>
using ElementType = typename ElementOf<D>::type;

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2 && sizeof(Float8E4M3) == 1 && sizeof(Float8E5M2) == 1,
              "storage types must have the wire size");
static_assert(std::is_trivially_copyable_v<Half> && std::is_trivially_copyable_v<Float8E4M3>,
              "storage types must be plain bits");

// Builds a table indexed by DataType value: table[t] = Make::template entry<ElementType<t>>().
// Host and device launchers use it to pick one function per (type, op) once per call.
template <class Make, size_t... TypeIndex>
constexpr auto makeTypeTable(std::index_sequence<TypeIndex...>) {
  using Entry = decltype(Make::template entry<int8_t>());
  return std::array<Entry, sizeof...(TypeIndex)>{Make::template entry<ElementType<static_cast<DataType>(TypeIndex)>>()...};
}
template <class Make>
constexpr auto makeTypeTable() {
  return makeTypeTable<Make>(std::make_index_sequence<kNumDataTypes>{});
}

}  // namespace topoccl::kernels
