// hostReduceFunction against the independent reference (reference.hpp) for every type x op, on
// fresh random data, many sizes, misaligned pointers and every allowed aliasing; plus known answers
// for wrapping, NaN handling and saturation, and the errors for what the kernels do not implement.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
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

constexpr size_t kSizes[] = {0, 1, 2, 3, 7, 31, 64, 1000003};
constexpr unsigned char kGuardByte = 0xa5;

// Elements start one element past a malloc-aligned block, so vector loops meet misaligned
// pointers; one guard element on each side catches writes outside [0, count).
class GuardedBuffer {
 public:
  GuardedBuffer(const ReferenceType& ref, size_t count)
      : elementSize_(ref.size()), bytes_((count + 2) * ref.size(), kGuardByte) {}
  void* data() { return bytes_.data() + elementSize_; }
  const void* data() const { return bytes_.data() + elementSize_; }
  bool guardsIntact() const {
    auto isGuard = [](unsigned char byte) { return byte == kGuardByte; };
    return std::all_of(bytes_.begin(), bytes_.begin() + elementSize_, isGuard) &&
           std::all_of(bytes_.end() - elementSize_, bytes_.end(), isGuard);
  }
  std::vector<unsigned char> copyOfElements() const {
    return {bytes_.begin() + elementSize_, bytes_.end() - elementSize_};
  }

 private:
  size_t elementSize_;
  std::vector<unsigned char> bytes_;
};

struct CaughtError {
  ncclResult_t code = ncclSuccess;
  std::string message;
};

template <class Call>
CaughtError errorOf(Call&& call) {
  try {
    call();
  } catch (const Error& error) {
    return {error.code(), error.what()};
  }
  return {};
}

// Reduces two single elements given as patterns; returns the result pattern.
uint64_t reduceOne(DataType type, ReduceOp op, uint64_t a, uint64_t b) {
  const ReferenceType ref(type);
  std::vector<unsigned char> x(8), y(8), out(8);
  ref.setBits(x.data(), 0, a);
  ref.setBits(y.data(), 0, b);
  hostReduceFunction(type, op)(out.data(), x.data(), y.data(), 1);
  return ref.bitsAt(out.data(), 0);
}

}  // namespace

TEST_CASE("host reduce equals the reference for every type, op and size", "[kernels][reduce]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed << " (TOPOCCL_TEST_SEED=" << seed << " replays it)");
  TestRng rng(seed);
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    for (ReduceOp op : kKernelOps) {
      const ReduceFn reduce = hostReduceFunction(type, op);
      REQUIRE(reduce != nullptr);
      for (size_t count : kSizes) {
        INFO(ref.name() << " " << reduceOpName(op) << " count " << count);
        GuardedBuffer a(ref, count), b(ref, count), dst(ref, count);
        ref.fillRandom(a.data(), count, rng);
        ref.fillRandom(b.data(), count, rng);
        const auto aBefore = a.copyOfElements();
        const auto bBefore = b.copyOfElements();
        reduce(dst.data(), a.data(), b.data(), count);
        std::string firstFailure;
        const size_t mismatches = countMismatches(ref, op, a.data(), b.data(), dst.data(), count, firstFailure);
        INFO(firstFailure);
        CHECK(mismatches == 0);
        CHECK(dst.guardsIntact());
        CHECK(a.copyOfElements() == aBefore);  // inputs are read-only
        CHECK(b.copyOfElements() == bBefore);
      }
    }
  }
}

TEST_CASE("host reduce is correct when dst aliases a, b or both", "[kernels][reduce]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed << " (TOPOCCL_TEST_SEED=" << seed << " replays it)");
  TestRng rng(seed);
  constexpr size_t count = 1001;  // odd, so vector loops leave a tail
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    for (ReduceOp op : kKernelOps) {
      const ReduceFn reduce = hostReduceFunction(type, op);
      INFO(ref.name() << " " << reduceOpName(op));
      GuardedBuffer a(ref, count), b(ref, count), dst(ref, count);
      auto refill = [&] {
        ref.fillRandom(a.data(), count, rng);
        ref.fillRandom(b.data(), count, rng);
      };

      auto expectCorrect = [&](const void* first, const void* second, const void* result, const char* aliasing) {
        std::string firstFailure;
        const size_t mismatches = countMismatches(ref, op, first, second, result, count, firstFailure);
        INFO(aliasing << ": " << firstFailure);
        CHECK(mismatches == 0);
      };

      refill();
      auto aBefore = a.copyOfElements();
      reduce(a.data(), a.data(), b.data(), count);
      expectCorrect(aBefore.data(), b.data(), a.data(), "dst == a");

      refill();
      const auto bBefore = b.copyOfElements();
      reduce(b.data(), a.data(), b.data(), count);  // operand order must be kept
      expectCorrect(a.data(), bBefore.data(), b.data(), "dst == b");

      refill();
      aBefore = a.copyOfElements();
      reduce(a.data(), a.data(), a.data(), count);
      expectCorrect(aBefore.data(), aBefore.data(), a.data(), "dst == a == b");

      refill();
      reduce(dst.data(), a.data(), a.data(), count);
      expectCorrect(a.data(), a.data(), dst.data(), "a == b, separate dst");

      CHECK(a.guardsIntact());
      CHECK(b.guardsIntact());
      CHECK(dst.guardsIntact());
    }
  }
}

TEST_CASE("integer sums and products wrap around", "[kernels][reduce]") {
  CHECK(reduceOne(DataType::Int8, ReduceOp::Sum, 0x7f, 0x01) == 0x80);        // 127 + 1 = -128
  CHECK(reduceOne(DataType::Uint8, ReduceOp::Sum, 0xff, 0x01) == 0x00);       // 255 + 1 = 0
  CHECK(reduceOne(DataType::Int8, ReduceOp::Prod, 0x80, 0xff) == 0x80);       // -128 * -1 = -128
  CHECK(reduceOne(DataType::Uint8, ReduceOp::Prod, 16, 16) == 0);             // 256 mod 256
  CHECK(reduceOne(DataType::Int32, ReduceOp::Sum, 0x7fffffff, 1) == 0x80000000u);
  CHECK(reduceOne(DataType::Uint32, ReduceOp::Prod, 0x10000, 0x10000) == 0);
  CHECK(reduceOne(DataType::Int64, ReduceOp::Prod, uint64_t(1) << 63, ~uint64_t(0)) == uint64_t(1) << 63);
  CHECK(reduceOne(DataType::Uint64, ReduceOp::Prod, ~uint64_t(0), ~uint64_t(0)) == 1);
  CHECK(reduceOne(DataType::Int8, ReduceOp::Max, 0x80, 0x7f) == 0x7f);        // signed comparison
  CHECK(reduceOne(DataType::Uint8, ReduceOp::Max, 0x80, 0x7f) == 0x80);       // unsigned comparison
  CHECK(reduceOne(DataType::Int64, ReduceOp::Min, uint64_t(1) << 63, 0) == uint64_t(1) << 63);
}

TEST_CASE("floating max and min ignore a NaN operand, like NCCL", "[kernels][reduce]") {
  struct Case {
    DataType type;
    uint64_t nan, one, two;
  };
  const Case cases[] = {
      {DataType::Float32, 0x7fc00000, 0x3f800000, 0x40000000},
      {DataType::Float64, 0x7ff8000000000000, 0x3ff0000000000000, 0x4000000000000000},
      {DataType::Float16, 0x7e00, 0x3c00, 0x4000},
      {DataType::Bfloat16, 0x7fc0, 0x3f80, 0x4000},
      {DataType::Float8e4m3, 0x7f, 0x38, 0x40},
      {DataType::Float8e5m2, 0x7e, 0x3c, 0x40},
  };
  for (const Case& c : cases) {
    const ReferenceType ref(c.type);
    INFO(ref.name());
    CHECK(reduceOne(c.type, ReduceOp::Max, c.nan, c.one) == c.one);
    CHECK(reduceOne(c.type, ReduceOp::Max, c.one, c.nan) == c.one);
    CHECK(reduceOne(c.type, ReduceOp::Min, c.nan, c.two) == c.two);
    CHECK(reduceOne(c.type, ReduceOp::Min, c.two, c.nan) == c.two);
    CHECK(ref.isNan(reduceOne(c.type, ReduceOp::Max, c.nan, c.nan)));
    CHECK(reduceOne(c.type, ReduceOp::Max, c.one, c.two) == c.two);
    CHECK(reduceOne(c.type, ReduceOp::Min, c.one, c.two) == c.one);
    // Sum and Prod still propagate NaN.
    CHECK(ref.isNan(reduceOne(c.type, ReduceOp::Sum, c.nan, c.one)));
    CHECK(ref.isNan(reduceOne(c.type, ReduceOp::Prod, c.one, c.nan)));
  }
}

TEST_CASE("narrow float results round and saturate like NCCL", "[kernels][reduce]") {
  // fp8 saturates to the largest finite value (satfinite), even from an e5m2 infinity.
  CHECK(reduceOne(DataType::Float8e4m3, ReduceOp::Sum, 0x7e, 0x7e) == 0x7e);  // 448 + 448 -> 448
  CHECK(reduceOne(DataType::Float8e4m3, ReduceOp::Prod, 0xfe, 0x7e) == 0xfe);  // -448 * 448 -> -448
  CHECK(reduceOne(DataType::Float8e5m2, ReduceOp::Sum, 0x7b, 0x7b) == 0x7b);  // 57344 * 2 -> 57344
  CHECK(reduceOne(DataType::Float8e5m2, ReduceOp::Sum, 0x7c, 0x3c) == 0x7b);  // inf + 1 -> 57344
  CHECK(reduceOne(DataType::Float8e5m2, ReduceOp::Max, 0x7c, 0x3c) == 0x7c);  // Max returns the operand
  // half and bfloat16 overflow to infinity.
  CHECK(reduceOne(DataType::Float16, ReduceOp::Sum, 0x7bff, 0x7bff) == 0x7c00);
  CHECK(reduceOne(DataType::Bfloat16, ReduceOp::Prod, 0x7f7f, 0xc000) == 0xff80);
  // Ties go to even: 2048 + 1 is halfway between halves 2048 and 2050 -> 2048; 2050 + 1 -> 2052.
  CHECK(reduceOne(DataType::Float16, ReduceOp::Sum, 0x6800, 0x3c00) == 0x6800);
  CHECK(reduceOne(DataType::Float16, ReduceOp::Sum, 0x6801, 0x3c00) == 0x6802);
  // Opposite zeros sum to +0; a negative times zero is -0.
  CHECK(reduceOne(DataType::Float16, ReduceOp::Sum, 0x8000, 0x0000) == 0x0000);
  CHECK(reduceOne(DataType::Float8e4m3, ReduceOp::Prod, 0xb8, 0x00) == 0x80);
}

TEST_CASE("ops the kernels do not implement and unknown types are rejected", "[kernels][reduce][errors]") {
  for (DataType type : allDataTypes()) {
    for (ReduceOp op : {ReduceOp::Avg, ReduceOp::PreMulSum}) {
      const CaughtError error = errorOf([&] { hostReduceFunction(type, op); });
      INFO(error.message);
      CHECK(error.code == ncclInvalidArgument);
      CHECK_THAT(error.message, Catch::Contains(reduceOpName(op)) && Catch::Contains(dataTypeName(type)));
    }
  }
  const CaughtError badOp = errorOf([] { hostReduceFunction(DataType::Float32, static_cast<ReduceOp>(42)); });
  CHECK(badOp.code == ncclInvalidArgument);
  CHECK_THAT(badOp.message, Catch::Contains("42"));
  for (int raw : {kNumDataTypes, 200}) {
    const CaughtError badType = errorOf([&] { hostReduceFunction(static_cast<DataType>(raw), ReduceOp::Sum); });
    CHECK(badType.code == ncclInvalidArgument);
    CHECK_THAT(badType.message, Catch::Contains("unknown data type " + std::to_string(raw)));
  }
}
