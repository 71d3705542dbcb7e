// The float conversions in reduce_ops.hpp against the independent reference: every 8- and 16-bit
// pattern, every rounding midpoint, a million sampled floats, and the documented special values.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/reduce_ops.hpp"
#include "reference.hpp"

using namespace topoccl;
using namespace topoccl::kernels;
using namespace topoccl::kernels::test;

namespace {

constexpr DataType kNarrowTypes[] = {DataType::Float16, DataType::Bfloat16, DataType::Float8e4m3,
                                     DataType::Float8e5m2};

float decodeWithLibrary(DataType type, uint32_t bits) {
  switch (type) {
    case DataType::Float16: return toFloat(Half{static_cast<uint16_t>(bits)});
    case DataType::Bfloat16: return toFloat(BFloat16{static_cast<uint16_t>(bits)});
    case DataType::Float8e4m3: return toFloat(Float8E4M3{static_cast<uint8_t>(bits)});
    case DataType::Float8e5m2: return toFloat(Float8E5M2{static_cast<uint8_t>(bits)});
    default: FAIL("not a narrow type"); return 0;
  }
}

uint32_t encodeWithLibrary(DataType type, float value) {
  switch (type) {
    case DataType::Float16: return halfFromFloat(value).bits;
    case DataType::Bfloat16: return bfloat16FromFloat(value).bits;
    case DataType::Float8e4m3: return float8E4M3FromFloat(value).bits;
    case DataType::Float8e5m2: return float8E5M2FromFloat(value).bits;
    default: FAIL("not a narrow type"); return 0;
  }
}

std::string show(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

std::string hex(uint64_t bits) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(bits));
  return text;
}

}  // namespace

TEST_CASE("every narrow float pattern decodes exactly and round-trips through float", "[kernels][conversion]") {
  for (DataType type : kNarrowTypes) {
    const ReferenceType ref(type);
    const uint32_t patterns = 1u << (8 * ref.size());
    size_t decodeErrors = 0, roundTripErrors = 0;
    std::string firstFailure;
    for (uint32_t bits = 0; bits < patterns; ++bits) {
      const float decoded = decodeWithLibrary(type, bits);
      const double exact = ref.value(bits);
      const bool decodedOk = std::isnan(exact) ? std::isnan(decoded)
                                               : (decoded == exact && std::signbit(decoded) == std::signbit(exact));
      uint32_t expectedBack = bits;  // identity, except:
      if (type == DataType::Float8e5m2 && std::isinf(exact)) expectedBack = bits - 1;  // inf saturates to +-57344
      const uint32_t back = encodeWithLibrary(type, decoded);
      const bool backOk = std::isnan(exact) ? ref.isNan(back) && (back & (patterns >> 1)) == (bits & (patterns >> 1))
                                            : back == expectedBack;
      if (!decodedOk && decodeErrors++ == 0) firstFailure = hex(bits) + " decoded to " + show(decoded);
      if (!backOk && roundTripErrors++ == 0) firstFailure += " " + hex(bits) + " came back as " + hex(back);
    }
    INFO(ref.name() << ": " << firstFailure);
    CHECK(decodeErrors == 0);
    CHECK(roundTripErrors == 0);
  }
}

TEST_CASE("encoding rounds to nearest, ties to even, at every midpoint", "[kernels][conversion]") {
  for (DataType type : kNarrowTypes) {
    const ReferenceType ref(type);
    const auto& values = ref.nonNegativeFinite();
    const uint32_t negative = 1u << (8 * ref.size() - 1);
    size_t errors = 0;
    std::string firstFailure;
    auto expectEncoding = [&](float value, uint32_t want) {
      for (const float signedValue : {value, -value}) {
        const uint32_t signedWant = std::signbit(signedValue) ? want | negative : want;
        const uint32_t got = encodeWithLibrary(type, signedValue);
        if (got != signedWant && errors++ == 0)
          firstFailure = show(signedValue) + " -> " + hex(got) + ", expected " + hex(signedWant);
      }
    };
    for (size_t i = 0; i + 1 < values.size(); ++i) {
      const auto [low, lowBits] = values[i];
      const auto [high, highBits] = values[i + 1];
      const auto midpoint = static_cast<float>((low + high) / 2);  // exact: one more bit than the format
      REQUIRE(static_cast<double>(midpoint) == (low + high) / 2);
      expectEncoding(static_cast<float>(low), lowBits);
      expectEncoding(midpoint, (lowBits & 1u) == 0 ? lowBits : highBits);
      expectEncoding(std::nextafter(midpoint, 0.0f), lowBits);
      expectEncoding(std::nextafter(midpoint, std::numeric_limits<float>::infinity()), highBits);
    }
    INFO(ref.name() << ": " << errors << " wrong, first: " << firstFailure);
    CHECK(errors == 0);
  }
}

TEST_CASE("a million sampled floats encode like the reference", "[kernels][conversion]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed << " (TOPOCCL_TEST_SEED=" << seed << " replays it)");
  // A random start and an odd stride walk all of float space: signs, subnormals, inf, NaNs.
  const auto start = static_cast<uint32_t>(seed);
  constexpr uint32_t stride = 4099;
  for (DataType type : kNarrowTypes) {
    const ReferenceType ref(type);
    size_t errors = 0;
    std::string firstFailure;
    uint32_t pattern = start;
    for (uint32_t sample = 0; sample < (1u << 20); ++sample, pattern += stride) {
      float value;
      std::memcpy(&value, &pattern, sizeof value);
      const uint32_t got = encodeWithLibrary(type, value);
      const uint64_t want = ref.round(static_cast<double>(value));
      const bool ok = ref.isNan(want) ? ref.isNan(got) : got == want;
      if (!ok && errors++ == 0) firstFailure = hex(pattern) + " -> " + hex(got) + ", expected " + hex(want);
    }
    INFO(ref.name() << ": " << errors << " wrong, first: " << firstFailure);
    CHECK(errors == 0);
  }
}

TEST_CASE("narrow float special values", "[kernels][conversion]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();

  SECTION("e4m3: max 448, no infinity, saturation, one NaN per sign") {
    CHECK(toFloat(Float8E4M3{0x7e}) == 448.0f);
    CHECK(toFloat(Float8E4M3{0x08}) == std::ldexp(1.0f, -6));  // smallest normal
    CHECK(toFloat(Float8E4M3{0x01}) == std::ldexp(1.0f, -9));  // smallest subnormal
    CHECK(toFloat(Float8E4M3{0x78}) == 256.0f);                // exponent 1111 is still finite
    CHECK(std::isnan(toFloat(Float8E4M3{0x7f})));
    CHECK(std::isnan(toFloat(Float8E4M3{0xff})));
    CHECK(float8E4M3FromFloat(1e6f).bits == 0x7e);
    CHECK(float8E4M3FromFloat(-1e6f).bits == 0xfe);
    CHECK(float8E4M3FromFloat(464.0f).bits == 0x7e);  // tie between 448 and (absent) 480
    CHECK(float8E4M3FromFloat(inf).bits == 0x7e);
    CHECK(float8E4M3FromFloat(-inf).bits == 0xfe);
    CHECK(float8E4M3FromFloat(nan).bits == 0x7f);
    CHECK(float8E4M3FromFloat(-nan).bits == 0xff);
    CHECK(float8E4M3FromFloat(std::ldexp(1.0f, -10)).bits == 0x00);  // half the smallest subnormal: tie to 0
    CHECK(float8E4M3FromFloat(std::ldexp(3.0f, -10)).bits == 0x02);  // 1.5 steps: tie to even 2
  }
  SECTION("e5m2: max 57344, IEEE infinity, saturating conversion") {
    CHECK(toFloat(Float8E5M2{0x7b}) == 57344.0f);
    CHECK(toFloat(Float8E5M2{0x7c}) == inf);
    CHECK(toFloat(Float8E5M2{0xfc}) == -inf);
    CHECK(toFloat(Float8E5M2{0x01}) == std::ldexp(1.0f, -16));
    for (uint8_t nanBits : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) CHECK(std::isnan(toFloat(Float8E5M2{nanBits})));
    CHECK(float8E5M2FromFloat(1e6f).bits == 0x7b);
    CHECK(float8E5M2FromFloat(61440.0f).bits == 0x7b);  // tie above max saturates too
    CHECK(float8E5M2FromFloat(inf).bits == 0x7b);
    CHECK(float8E5M2FromFloat(-inf).bits == 0xfb);
    CHECK(std::isnan(toFloat(float8E5M2FromFloat(nan))));
  }
  SECTION("half: max 65504, overflow to infinity, subnormals, ties to even") {
    CHECK(toFloat(Half{0x7bff}) == 65504.0f);
    CHECK(toFloat(Half{0x0001}) == std::ldexp(1.0f, -24));
    CHECK(toFloat(Half{0x03ff}) == std::ldexp(1023.0f, -24));  // largest subnormal
    CHECK(toFloat(Half{0x0400}) == std::ldexp(1.0f, -14));
    CHECK(toFloat(Half{0x8000}) == 0.0f);
    CHECK(std::signbit(toFloat(Half{0x8000})));
    CHECK(halfFromFloat(65504.0f).bits == 0x7bff);
    CHECK(halfFromFloat(65519.0f).bits == 0x7bff);
    CHECK(halfFromFloat(65520.0f).bits == 0x7c00);  // the tie above max overflows
    CHECK(halfFromFloat(1e6f).bits == 0x7c00);
    CHECK(halfFromFloat(-inf).bits == 0xfc00);
    CHECK(halfFromFloat(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);        // tie -> even
    CHECK(halfFromFloat(1.0f + std::ldexp(3.0f, -11)).bits == 0x3c02);        // tie -> even
    CHECK(halfFromFloat(std::ldexp(1.0f, -25)).bits == 0x0000);               // tie -> 0
    CHECK(halfFromFloat(std::ldexp(1.0f, -25) * 1.0001f).bits == 0x0001);
    CHECK(halfFromFloat(std::ldexp(2047.0f, -25)).bits == 0x0400);            // rounds up into normal
    CHECK(halfFromFloat(std::ldexp(1.0f, -140)).bits == 0x0000);              // float subnormal -> 0
    CHECK(halfFromFloat(-std::ldexp(1.0f, -140)).bits == 0x8000);
    CHECK((halfFromFloat(nan).bits & 0x7fff) > 0x7c00);
  }
  SECTION("bfloat16: top half of a float, ties to even, NaN stays NaN") {
    CHECK(toFloat(BFloat16{0x3f80}) == 1.0f);
    CHECK(toFloat(BFloat16{0x7f7f}) == std::ldexp(255.0f, 120));
    CHECK(bfloat16FromFloat(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);  // tie -> even
    CHECK(bfloat16FromFloat(1.0f + std::ldexp(3.0f, -8)).bits == 0x3f82);
    CHECK(bfloat16FromFloat(std::numeric_limits<float>::max()).bits == 0x7f80);
    CHECK(bfloat16FromFloat(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
    const uint32_t nanWithLowPayloadOnly = 0x7f800001;  // would become inf if simply truncated
    float lowNan;
    std::memcpy(&lowNan, &nanWithLowPayloadOnly, sizeof lowNan);
    CHECK(std::isnan(toFloat(bfloat16FromFloat(lowNan))));
  }
}
