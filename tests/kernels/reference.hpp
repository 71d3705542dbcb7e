// Independent reference model of every DataType for the kernel tests. It shares no code with
// src/kernels: narrow floats are decoded from their bit fields with ldexp (as the format specs
// define them) and rounded by searching a sorted table of all their finite values, so a bug in the
// library's bit tricks cannot hide in the reference too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/datatype.hpp"

namespace topoccl::kernels::test {

__extension__ typedef __int128 Int128;
__extension__ typedef unsigned __int128 Uint128;

// Seed for one test case: TOPOCCL_TEST_SEED when set (to replay a failure), else std::random_device.
uint64_t testSeed();

// SplitMix64: a fast, well-mixed 64-bit generator (tests draw hundreds of millions of numbers;
// mt19937_64 dominated their run time). Satisfies UniformRandomBitGenerator.
class TestRng {
 public:
  using result_type = uint64_t;
  explicit TestRng(uint64_t seed) : state_(seed) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type(0); }
  result_type operator()() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

class ReferenceType {
 public:
  explicit ReferenceType(DataType type);

  DataType type() const { return type_; }
  const char* name() const { return dataTypeName(type_); }
  size_t size() const { return size_; }
  bool isInteger() const { return !isFloatingPoint(type_); }
  bool isSigned() const { return isSigned_; }

  // Raw element patterns, zero-extended to 64 bits.
  uint64_t bitsAt(const void* data, size_t index) const;
  void setBits(void* data, size_t index, uint64_t bits) const;

  // Floating types: the exact value of a pattern; and the pattern nearest to `x`, ties to even
  // (fp8 saturates to its largest finite value, inf included; NaN gives a NaN pattern).
  double value(uint64_t bits) const;
  uint64_t round(double x) const;
  bool isNan(uint64_t bits) const;

  // Integer types: the exact value of a pattern; and a value reduced modulo 2^bits.
  Int128 integer(uint64_t bits) const;
  uint64_t wrap(Uint128 x) const;

  // Largest finite value of a floating type, and the patterns of every finite value >= 0 in
  // increasing order (narrow floats only).
  double maxFinite() const { return maxFinite_; }
  const std::vector<std::pair<double, uint32_t>>& nonNegativeFinite() const { return nonNegativeFinite_; }

  // Fresh random elements: integers uniformly; floats mostly moderate values (so that sums and
  // products round, tie and overflow) plus a quarter of raw bit patterns (NaN, inf, subnormals).
  void fillRandom(void* data, size_t count, TestRng& rng) const;

  std::string describe(uint64_t bits) const;  // "0x3c00 (1)" for messages

 private:
  DataType type_;
  size_t size_;
  bool isSigned_ = false;
  // Narrow floats (half, bfloat16, fp8): format parameters and precomputed tables.
  bool narrow_ = false;
  int expBits_ = 0, manBits_ = 0, bias_ = 0;
  bool ieeeSpecials_ = true, saturates_ = false;
  std::vector<double> decoded_;                                     // value of every pattern
  std::vector<std::pair<double, uint32_t>> nonNegativeFinite_;      // sorted by value
  std::vector<double> sortedValues_;                                // the same values alone, to search
  double maxFinite_ = 0;
  double overflowThreshold_ = 0;  // non-saturating: |x| >= this rounds to inf
  uint32_t maxFiniteBits_ = 0, infBits_ = 0, nanBits_ = 0, signBit_ = 0;

  double decodeFromFields(uint32_t bits) const;
};

// The four operators the kernels implement, and all the data types, for loops in tests.
inline constexpr ReduceOp kKernelOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min};
std::vector<DataType> allDataTypes();

// Checks got == a (op) b for one element. Sum/Prod: exact pattern of the correctly rounded result
// (any NaN matches any NaN). Max/Min: one of the operands, unchanged, with the right value; NaN
// operands are ignored like NCCL's fmaxf/__hmax (NaN only if both are); +0/-0 ties may return either.
// Returns an empty string when correct, else a description of the failure.
std::string checkReduced(const ReferenceType& ref, ReduceOp op, uint64_t a, uint64_t b, uint64_t got);

// Checks every element of dst against a, b; returns the number of mismatches and describes the first.
size_t countMismatches(const ReferenceType& ref, ReduceOp op, const void* a, const void* b, const void* dst,
                       size_t count, std::string& firstFailure);

}  // namespace topoccl::kernels::test
