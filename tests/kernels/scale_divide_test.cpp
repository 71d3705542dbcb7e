// hostScale, hostDivide, reciprocalScalar, loadAsDouble and storeFromDouble against the independent
// reference, for every type.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "kernels/host_reduce.hpp"
#include "reference.hpp"

using namespace topoccl;
using namespace topoccl::kernels;
using namespace topoccl::kernels::test;

namespace {

constexpr size_t kScaleSizes[] = {0, 1, 7, 1000003};

// One element's pattern as 8 bytes of storage (enough for any type).
struct Scalar {
  unsigned char bytes[8] = {};
};

Scalar scalarOf(const ReferenceType& ref, uint64_t bits) {
  Scalar scalar;
  ref.setBits(scalar.bytes, 0, bits);
  return scalar;
}

ncclResult_t errorCodeOf(void (*call)()) {
  try {
    call();
  } catch (const Error& error) {
    return error.code();
  }
  return ncclSuccess;
}

// Checks dst[i] == src[i] * scalar element by element; scaling rounds exactly like one Prod.
size_t countScaleMismatches(const ReferenceType& ref, const void* src, uint64_t scalarBits, const void* dst,
                            size_t count, std::string& firstFailure) {
  size_t mismatches = 0;
  for (size_t i = 0; i < count; ++i) {
    std::string failure = checkReduced(ref, ReduceOp::Prod, ref.bitsAt(src, i), scalarBits, ref.bitsAt(dst, i));
    if (!failure.empty() && mismatches++ == 0) firstFailure = "element " + std::to_string(i) + ": " + failure;
  }
  return mismatches;
}

}  // namespace

TEST_CASE("hostScale multiplies by the scalar and rounds like the reference", "[kernels][scale]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed << " (TOPOCCL_TEST_SEED=" << seed << " replays it)");
  TestRng rng(seed);
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    for (size_t count : kScaleSizes) {
      INFO(ref.name() << " count " << count);
      // Offset by one element from the allocation, as in the reduce tests.
      std::vector<unsigned char> srcStorage((count + 1) * ref.size()), dstStorage((count + 1) * ref.size());
      void* src = srcStorage.data() + ref.size();
      void* dst = dstStorage.data() + ref.size();
      ref.fillRandom(src, count, rng);
      Scalar scalar;
      ref.fillRandom(scalar.bytes, 1, rng);
      const uint64_t scalarBits = ref.bitsAt(scalar.bytes, 0);
      std::string firstFailure;

      hostScale(type, dst, src, count, scalar.bytes);
      const size_t outOfPlace = countScaleMismatches(ref, src, scalarBits, dst, count, firstFailure);

      const std::vector<unsigned char> before = srcStorage;
      hostScale(type, src, src, count, scalar.bytes);  // in place
      const size_t inPlace = countScaleMismatches(ref, before.data() + ref.size(), scalarBits, src, count, firstFailure);
      INFO("scalar " << ref.describe(scalarBits) << "; " << firstFailure);
      CHECK(outOfPlace == 0);
      CHECK(inPlace == 0);
    }
  }
}

TEST_CASE("hostDivide truncates integers toward zero", "[kernels][divide]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed << " (TOPOCCL_TEST_SEED=" << seed << " replays it)");
  TestRng rng(seed);
  const uint64_t divisors[] = {1, 2, 3, 7, 8, 127, 128, 255, 256, 65537, uint64_t(1) << 31, uint64_t(1) << 32,
                               uint64_t(1) << 63, ~uint64_t(0)};
  constexpr size_t count = 1003;
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    if (!ref.isInteger()) continue;
    for (uint64_t divisor : divisors) {
      INFO(ref.name() << " / " << divisor);
      std::vector<unsigned char> src(count * ref.size()), dst(count * ref.size());
      ref.fillRandom(src.data(), count, rng);
      // The extremes: most negative, -1, 0, most positive.
      const uint64_t signBit = uint64_t(1) << (8 * ref.size() - 1);
      ref.setBits(src.data(), 0, ref.isSigned() ? signBit : ref.wrap(~Uint128(0)));
      ref.setBits(src.data(), 1, ref.wrap(~Uint128(0)));
      ref.setBits(src.data(), 2, 0);
      ref.setBits(src.data(), 3, signBit - 1);

      auto check = [&](const void* input, const void* output) {
        size_t mismatches = 0;
        std::string first;
        for (size_t i = 0; i < count; ++i) {
          const Int128 value = ref.integer(ref.bitsAt(input, i));
          const Int128 quotient = value / static_cast<Int128>(divisor);  // C++ truncates toward zero
          const uint64_t want = ref.wrap(static_cast<Uint128>(quotient));
          const uint64_t got = ref.bitsAt(output, i);
          if (got != want && mismatches++ == 0)
            first = ref.describe(ref.bitsAt(input, i)) + " gave " + ref.describe(got) + ", expected " + ref.describe(want);
        }
        INFO(first);
        CHECK(mismatches == 0);
      };
      hostDivide(type, dst.data(), src.data(), count, divisor);
      check(src.data(), dst.data());
      const std::vector<unsigned char> before = src;
      hostDivide(type, src.data(), src.data(), count, divisor);  // in place
      check(before.data(), src.data());
    }
  }
}

TEST_CASE("hostDivide on floating types multiplies by the rounded reciprocal", "[kernels][divide]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed << " (TOPOCCL_TEST_SEED=" << seed << " replays it)");
  TestRng rng(seed);
  constexpr size_t count = 1003;
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    if (ref.isInteger()) continue;
    for (uint64_t divisor : {uint64_t(1), uint64_t(2), uint64_t(3), uint64_t(7), uint64_t(8), uint64_t(1000)}) {
      INFO(ref.name() << " / " << divisor);
      std::vector<unsigned char> src(count * ref.size()), dst(count * ref.size());
      ref.fillRandom(src.data(), count, rng);
      hostDivide(type, dst.data(), src.data(), count, divisor);
      const uint64_t reciprocal = ref.round(1.0 / static_cast<double>(divisor));
      std::string firstFailure;
      const size_t mismatches = countScaleMismatches(ref, src.data(), reciprocal, dst.data(), count, firstFailure);
      INFO(firstFailure);
      CHECK(mismatches == 0);
    }
  }
  // Floating Avg lowering in e4m3: a sum of 8 over 2 ranks is exactly 4.
  const ReferenceType e4m3(DataType::Float8e4m3);
  unsigned char sum = static_cast<unsigned char>(e4m3.round(8.0)), average = 0;
  hostDivide(DataType::Float8e4m3, &average, &sum, 1, 2);
  CHECK(e4m3.value(average) == 4.0);
}

TEST_CASE("reciprocalScalar is 1/n correctly rounded (truncated for integers)", "[kernels][divide]") {
  const uint64_t ns[] = {1, 2, 3, 5, 7, 10, 24, 1000, 65535, (uint64_t(1) << 40) + 1, ~uint64_t(0)};
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    for (uint64_t n : ns) {
      INFO(ref.name() << " 1/" << n);
      Scalar out;
      reciprocalScalar(type, n, out.bytes);
      const uint64_t got = ref.bitsAt(out.bytes, 0);
      if (ref.isInteger()) {
        CHECK(got == (n == 1 ? 1u : 0u));
      } else {
        CHECK(got == ref.round(1.0 / static_cast<double>(n)));
      }
    }
  }
  // 1/2^40 underflows e4m3 to +0.
  Scalar tiny;
  reciprocalScalar(DataType::Float8e4m3, uint64_t(1) << 40, tiny.bytes);
  CHECK(tiny.bytes[0] == 0x00);
}

TEST_CASE("divide and reciprocal reject zero, unknown types are rejected", "[kernels][divide][errors]") {
  CHECK(errorCodeOf([] {
          int32_t x = 1;
          hostDivide(DataType::Int32, &x, &x, 1, 0);
        }) == ncclInvalidArgument);
  CHECK(errorCodeOf([] {
          float x = 1;
          hostDivide(DataType::Float32, &x, &x, 1, 0);
        }) == ncclInvalidArgument);
  CHECK(errorCodeOf([] {
          Scalar out;
          reciprocalScalar(DataType::Float16, 0, out.bytes);
        }) == ncclInvalidArgument);
  CHECK(errorCodeOf([] {
          float x = 1, s = 2;
          hostScale(static_cast<DataType>(kNumDataTypes), &x, &x, 1, &s);
        }) == ncclInvalidArgument);
  CHECK(errorCodeOf([] {
          float x = 1;
          loadAsDouble(static_cast<DataType>(99), &x, 0);
        }) == ncclInvalidArgument);
}

TEST_CASE("loadAsDouble gives the exact value of every 8- and 16-bit pattern", "[kernels][convert]") {
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    if (ref.size() > 2) continue;
    INFO(ref.name());
    size_t mismatches = 0;
    for (uint32_t bits = 0; bits < (1u << (8 * ref.size())); ++bits) {
      Scalar element = scalarOf(ref, bits);
      const double got = loadAsDouble(type, element.bytes, 0);
      const double want = ref.isInteger() ? static_cast<double>(ref.integer(bits)) : ref.value(bits);
      const bool ok = std::isnan(want) ? std::isnan(got) : (got == want && std::signbit(got) == std::signbit(want));
      mismatches += ok ? 0 : 1;
    }
    CHECK(mismatches == 0);
  }
  const int64_t wide[] = {-5, std::numeric_limits<int64_t>::min(), int64_t(1) << 52};
  CHECK(loadAsDouble(DataType::Int64, wide, 0) == -5.0);
  CHECK(loadAsDouble(DataType::Int64, wide, 1) == -9223372036854775808.0);
  CHECK(loadAsDouble(DataType::Int64, wide, 2) == 4503599627370496.0);
  const double doubles[] = {0.1, -2.5};
  CHECK(loadAsDouble(DataType::Float64, doubles, 1) == -2.5);
}

TEST_CASE("storeFromDouble rounds once, correctly, even next to a tie", "[kernels][convert]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed << " (TOPOCCL_TEST_SEED=" << seed << " replays it)");
  TestRng rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    if (ref.isInteger()) continue;
    INFO(ref.name());
    size_t mismatches = 0;
    std::string first;
    auto check = [&](double x) {
      Scalar element;
      storeFromDouble(type, element.bytes, 0, x);
      const uint64_t got = ref.bitsAt(element.bytes, 0);
      const uint64_t want = ref.round(x);
      if (got != want && mismatches++ == 0) {
        char text[40];
        std::snprintf(text, sizeof text, "%.17g", x);
        first = std::string(text) + " -> " + ref.describe(got) + ", expected " + ref.describe(want);
      }
    };
    if (ref.size() <= 2) {
      // Midpoints nudged by far less than a float ulp: double -> float -> type would see an exact tie
      // and round to even; correct rounding follows the nudge.
      const auto& values = ref.nonNegativeFinite();
      std::uniform_int_distribution<size_t> pick(0, values.size() - 2);
      for (int i = 0; i < 20000; ++i) {
        const size_t k = pick(rng);
        const double midpoint = (values[k].first + values[k + 1].first) / 2;
        const double nudge = midpoint == 0 ? 1e-300 : midpoint * std::ldexp(1.0, -40);
        for (double x : {midpoint, midpoint + nudge, midpoint - nudge}) {
          check(x);
          check(-x);
        }
      }
    }
    for (int i = 0; i < 20000; ++i) check(std::ldexp(unit(rng) - 0.5, static_cast<int>(rng() % 600) - 300));
    check(std::numeric_limits<double>::infinity());
    check(-1e300);
    INFO(first);
    CHECK(mismatches == 0);
  }
  // The nudged tie above, spelled out: half(1 + 2^-11 + 2^-40) is 1 + 2^-10, not 1.
  uint16_t half = 0;
  storeFromDouble(DataType::Float16, &half, 0, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40));
  CHECK(half == 0x3c01);
}

TEST_CASE("storeFromDouble truncates integers and saturates out-of-range values", "[kernels][convert]") {
  int8_t int8s[6];
  for (auto [index, value] : {std::pair{0, 2.9}, {1, -2.9}, {2, 300.0}, {3, -300.0}, {4, std::nan("")}, {5, -128.0}})
    storeFromDouble(DataType::Int8, int8s, static_cast<size_t>(index), value);
  CHECK(int8s[0] == 2);
  CHECK(int8s[1] == -2);
  CHECK(int8s[2] == 127);
  CHECK(int8s[3] == -128);
  CHECK(int8s[4] == 0);
  CHECK(int8s[5] == -128);
  uint64_t u64s[3];
  storeFromDouble(DataType::Uint64, u64s, 0, 1e30);
  storeFromDouble(DataType::Uint64, u64s, 1, -5.0);
  storeFromDouble(DataType::Uint64, u64s, 2, 18446744073709549568.0);  // largest double below 2^64
  CHECK(u64s[0] == std::numeric_limits<uint64_t>::max());
  CHECK(u64s[1] == 0);
  CHECK(u64s[2] == 18446744073709549568ull);
  int64_t i64s[2];
  storeFromDouble(DataType::Int64, i64s, 0, 9223372036854775808.0);  // 2^63
  storeFromDouble(DataType::Int64, i64s, 1, -9223372036854775808.0);
  CHECK(i64s[0] == std::numeric_limits<int64_t>::max());
  CHECK(i64s[1] == std::numeric_limits<int64_t>::min());
}
