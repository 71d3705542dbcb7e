#include "reference.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace topoccl::kernels::test {

static_assert(std::endian::native == std::endian::little, "patterns are stored as the low bytes of a uint64");

uint64_t testSeed() {
  if (const char* fixed = std::getenv("TOPOCCL_TEST_SEED")) return std::strtoull(fixed, nullptr, 0);
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

std::vector<DataType> allDataTypes() {
  std::vector<DataType> types;
  for (int raw = 0; raw < kNumDataTypes; ++raw) types.push_back(static_cast<DataType>(raw));
  return types;
}

ReferenceType::ReferenceType(DataType type) : type_(type), size_(dataTypeSize(type)) {
  switch (type) {
    case DataType::Int8:
    case DataType::Int32:
    case DataType::Int64: isSigned_ = true; break;
    // Format parameters from the specifications: IEEE 754 binary16; bfloat16 = float's top half;
    // OCP 8-bit floating point (E4M3FN: bias 7, no inf, NaN = S.1111.111; E5M2: bias 15, IEEE-like).
    case DataType::Float16: narrow_ = true, expBits_ = 5, manBits_ = 10, bias_ = 15; break;
    case DataType::Bfloat16: narrow_ = true, expBits_ = 8, manBits_ = 7, bias_ = 127; break;
    case DataType::Float8e4m3:
      narrow_ = true, expBits_ = 4, manBits_ = 3, bias_ = 7, ieeeSpecials_ = false, saturates_ = true;
      break;
    case DataType::Float8e5m2: narrow_ = true, expBits_ = 5, manBits_ = 2, bias_ = 15, saturates_ = true; break;
    default: break;
  }
  if (type == DataType::Float32) maxFinite_ = 3.4028234663852886e38;
  if (type == DataType::Float64) maxFinite_ = 1.7976931348623157e308;
  if (!narrow_) return;

  const uint32_t patterns = 1u << (1 + expBits_ + manBits_);
  signBit_ = patterns >> 1;
  const uint32_t expOnes = (1u << expBits_) - 1;
  infBits_ = expOnes << manBits_;
  nanBits_ = ieeeSpecials_ ? infBits_ | (1u << (manBits_ - 1)) : signBit_ - 1;
  decoded_.resize(patterns);
  for (uint32_t bits = 0; bits < patterns; ++bits) {
    decoded_[bits] = decodeFromFields(bits);
    if (bits < signBit_ && std::isfinite(decoded_[bits])) nonNegativeFinite_.emplace_back(decoded_[bits], bits);
  }
  std::sort(nonNegativeFinite_.begin(), nonNegativeFinite_.end());
  for (const auto& entry : nonNegativeFinite_) sortedValues_.push_back(entry.first);
  const auto& top = nonNegativeFinite_.back();
  const auto& belowTop = nonNegativeFinite_[nonNegativeFinite_.size() - 2];
  maxFinite_ = top.first;
  maxFiniteBits_ = top.second;
  overflowThreshold_ = top.first + (top.first - belowTop.first) / 2;
}

double ReferenceType::decodeFromFields(uint32_t bits) const {
  const bool negative = (bits & signBit_) != 0;
  const uint32_t expOnes = (1u << expBits_) - 1;
  const uint32_t exponent = (bits >> manBits_) & expOnes;
  const uint32_t mantissa = bits & ((1u << manBits_) - 1);
  double magnitude;
  if (ieeeSpecials_ && exponent == expOnes) {
    magnitude = mantissa == 0 ? HUGE_VAL : std::nan("");
  } else if (!ieeeSpecials_ && exponent == expOnes && mantissa == (1u << manBits_) - 1) {
    magnitude = std::nan("");
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), 1 - bias_ - manBits_);
  } else {
    magnitude = std::ldexp(static_cast<double>((1u << manBits_) + mantissa), static_cast<int>(exponent) - bias_ - manBits_);
  }
  return negative ? -magnitude : magnitude;
}

uint64_t ReferenceType::bitsAt(const void* data, size_t index) const {
  uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const char*>(data) + index * size_, size_);
  return bits;
}

void ReferenceType::setBits(void* data, size_t index, uint64_t bits) const {
  std::memcpy(static_cast<char*>(data) + index * size_, &bits, size_);
}

double ReferenceType::value(uint64_t bits) const {
  if (narrow_) return decoded_[bits];
  if (type_ == DataType::Float32) return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  if (type_ == DataType::Float64) return std::bit_cast<double>(bits);
  return static_cast<double>(integer(bits));
}

bool ReferenceType::isNan(uint64_t bits) const { return !isInteger() && std::isnan(value(bits)); }

uint64_t ReferenceType::round(double x) const {
  if (type_ == DataType::Float32) return std::bit_cast<uint32_t>(static_cast<float>(x));  // IEEE RNE
  if (type_ == DataType::Float64) return std::bit_cast<uint64_t>(x);
  if (std::isnan(x)) return nanBits_;
  const uint32_t sign = std::signbit(x) ? signBit_ : 0;
  const double magnitude = std::fabs(x);
  if (saturates_ && magnitude >= maxFinite_) return sign | maxFiniteBits_;
  if (!saturates_ && magnitude >= overflowThreshold_) return sign | infBits_;
  // Neighbours below and above, then nearest; exact ties go to the even pattern.
  const size_t index = static_cast<size_t>(std::lower_bound(sortedValues_.begin(), sortedValues_.end(), magnitude) -
                                            sortedValues_.begin());
  if (index == sortedValues_.size()) return sign | maxFiniteBits_;  // (maxFinite, threshold)
  const auto above = nonNegativeFinite_.begin() + static_cast<std::ptrdiff_t>(index);
  if (above->first == magnitude || index == 0) return sign | above->second;
  const auto below = above - 1;
  const double downDistance = magnitude - below->first;
  const double upDistance = above->first - magnitude;
  if (downDistance < upDistance) return sign | below->second;
  if (upDistance < downDistance) return sign | above->second;
  return sign | ((below->second & 1u) == 0 ? below->second : above->second);
}

Int128 ReferenceType::integer(uint64_t bits) const {
  const int width = static_cast<int>(size_ * 8);
  if (!isSigned_ || width == 64) return isSigned_ ? Int128(static_cast<int64_t>(bits)) : Int128(bits);
  const uint64_t signBit = uint64_t(1) << (width - 1);
  return (bits & signBit) ? Int128(bits) - (Int128(1) << width) : Int128(bits);
}

uint64_t ReferenceType::wrap(Uint128 x) const {
  const int width = static_cast<int>(size_ * 8);
  const uint64_t low = static_cast<uint64_t>(x);
  return width == 64 ? low : low & ((uint64_t(1) << width) - 1);
}

void ReferenceType::fillRandom(void* data, size_t count, TestRng& rng) const {
  for (size_t i = 0; i < count; ++i) {
    const uint64_t draw = rng();
    if (isInteger() || draw % 4 == 0) {
      setBits(data, i, rng());
    } else {
      // A moderate value: random sign and mantissa, exponent in 2^-4 .. 2^6, built from one draw.
      const int scale = static_cast<int>((draw >> 2) % 11) - 4;
      if (narrow_) {
        const uint64_t mantissa = (draw >> 8) & ((uint64_t(1) << manBits_) - 1);
        const auto exponent = static_cast<uint64_t>(bias_ + scale);
        setBits(data, i, ((draw >> 63) ? signBit_ : 0) | exponent << manBits_ | mantissa);
      } else {
        const double unit = static_cast<double>(static_cast<int64_t>(draw) >> 10) * 0x1p-53;  // [-1, 1)
        setBits(data, i, round(std::ldexp(unit, scale)));
      }
    }
  }
}

std::string ReferenceType::describe(uint64_t bits) const {
  std::ostringstream text;
  text << "0x" << std::hex << bits << std::dec << " (";
  if (isInteger()) {
    const Int128 v = integer(bits);
    text << (v < 0 ? "-" : "") << static_cast<uint64_t>(v < 0 ? -v : v);
  } else {
    text.precision(17);
    text << value(bits);
  }
  text << ")";
  return text.str();
}

namespace {

// NCCL semantics for floating Max/Min: NaN operands are ignored.
double referenceMaxMin(ReduceOp op, double a, double b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  return op == ReduceOp::Max ? std::max(a, b) : std::min(a, b);
}

}  // namespace

std::string checkReduced(const ReferenceType& ref, ReduceOp op, uint64_t a, uint64_t b, uint64_t got) {
  // Fast path decides; the text is built only for a failure (this runs for millions of elements).
  bool ok = true;
  uint64_t wantBits = 0;
  double wantValue = 0;
  bool describeAsValue = false;
  if (ref.isInteger()) {
    const Int128 x = ref.integer(a);
    const Int128 y = ref.integer(b);
    switch (op) {
      case ReduceOp::Sum: wantBits = ref.wrap(static_cast<Uint128>(x) + static_cast<Uint128>(y)); break;
      case ReduceOp::Prod: wantBits = ref.wrap(static_cast<Uint128>(x) * static_cast<Uint128>(y)); break;
      case ReduceOp::Max: wantBits = x < y ? b : a; break;
      case ReduceOp::Min: wantBits = y < x ? b : a; break;
      default: return "unexpected op";
    }
    ok = got == wantBits;
  } else if (op == ReduceOp::Sum || op == ReduceOp::Prod) {
    // Exact in double (or, for sums of far-apart floats, rounded once with >= 2p+2 bits, which is
    // innocuous), then rounded once to the type: the correctly rounded result.
    const double x = ref.value(a);
    const double y = ref.value(b);
    wantBits = ref.round(op == ReduceOp::Sum ? x + y : x * y);
    ok = ref.isNan(wantBits) ? ref.isNan(got) : got == wantBits;
  } else {
    wantValue = referenceMaxMin(op, ref.value(a), ref.value(b));
    describeAsValue = true;
    ok = std::isnan(wantValue) ? ref.isNan(got) : (got == a || got == b) && ref.value(got) == wantValue;
  }
  if (ok) return {};
  std::ostringstream text;
  text.precision(17);
  text << ref.name() << " " << reduceOpName(op) << "(" << ref.describe(a) << ", " << ref.describe(b) << ") gave "
       << ref.describe(got) << ", expected ";
  if (describeAsValue) {
    text << wantValue << ", one of the operands unchanged";
  } else {
    text << ref.describe(wantBits);
  }
  return text.str();
}

size_t countMismatches(const ReferenceType& ref, ReduceOp op, const void* a, const void* b, const void* dst,
                       size_t count, std::string& firstFailure) {
  size_t mismatches = 0;
  for (size_t i = 0; i < count; ++i) {
    std::string failure = checkReduced(ref, op, ref.bitsAt(a, i), ref.bitsAt(b, i), ref.bitsAt(dst, i));
    if (failure.empty()) continue;
    if (mismatches++ == 0) firstFailure = "element " + std::to_string(i) + ": " + failure;
  }
  return mismatches;
}

}  // namespace topoccl::kernels::test
