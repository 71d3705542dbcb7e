// The packed (16-byte) reduction and copy code the CUDA kernels run, run here on the host with the same
// worker arithmetic a grid uses: every type x op against the independent reference, with the operands at
// every offset modulo 16 (co-aligned, so heads, packs and tails all run; and not, so the scalar path
// does), several worker counts (a grid of 1, 3 and 8 threads), aliasing, and guard bytes.
#include <array>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/packed_reduce.hpp"
#include "reference.hpp"

using namespace topoccl;
using namespace topoccl::kernels;
using namespace topoccl::kernels::test;

namespace {

using ShareFn = void (*)(void* dst, const void* a, const void* b, size_t count, size_t worker, size_t workers);

template <class T, template <class> class Op>
void shareTyped(void* dst, const void* a, const void* b, size_t count, size_t worker, size_t workers) {
  reduceShare<T, Op<T>>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), count, worker, workers);
}

struct ShareTableMaker {
  template <class T>
  static constexpr std::array<ShareFn, kNumKernelOps> entry() {
    return {&shareTyped<T, SumOp>, &shareTyped<T, ProdOp>, &shareTyped<T, MaxOp>, &shareTyped<T, MinOp>};
  }
};
constexpr auto kShareTable = makeTypeTable<ShareTableMaker>();

// The GPU's PreMulSum prescale and integer-Avg division, as a grid's worker runs them.
using ScaleShareFn = void (*)(void* dst, const void* src, const void* scalar, size_t count, size_t worker, size_t workers);
using DivideShareFn = void (*)(void* dst, const void* src, uint64_t divisor, size_t count, size_t worker, size_t workers);

template <class T>
void scaleTyped(void* dst, const void* src, const void* scalar, size_t count, size_t worker, size_t workers) {
  T value;
  std::memcpy(&value, scalar, sizeof(T));
  scaleShare<T>(static_cast<T*>(dst), static_cast<const T*>(src), value, count, worker, workers);
}

template <class T>
void divideTyped(void* dst, const void* src, uint64_t divisor, size_t count, size_t worker, size_t workers) {
  if constexpr (kIsIntegerElement<T>)
    divideShare<T>(static_cast<T*>(dst), static_cast<const T*>(src), divisor, count, worker, workers);
}

struct ScaleDivideTableMaker {
  template <class T>
  static constexpr std::array<std::pair<ScaleShareFn, DivideShareFn>, 1> entry() {
    return {{{&scaleTyped<T>, &divideTyped<T>}}};
  }
};
constexpr auto kScaleDivideTable = makeTypeTable<ScaleDivideTableMaker>();

// Runs every worker of a `workers`-thread grid, one after another.
void runGrid(ShareFn share, void* dst, const void* a, const void* b, size_t count, size_t workers) {
  for (size_t worker = 0; worker < workers; ++worker) share(dst, a, b, count, worker, workers);
}

constexpr unsigned char kGuard = 0xa5;
constexpr size_t kSlack = 64;

// A buffer whose data starts `offset` bytes past a 16-byte boundary, with guard bytes around it.
class Placed {
 public:
  Placed(size_t bytes, size_t offset) : storage_(bytes + 2 * kSlack + kPackBytes, kGuard) {
    auto base = reinterpret_cast<uintptr_t>(storage_.data()) + kSlack;
    base = (base + kPackBytes - 1) / kPackBytes * kPackBytes + offset;
    data_ = reinterpret_cast<unsigned char*>(base);
    bytes_ = bytes;
  }
  unsigned char* data() { return data_; }
  bool guardsIntact() const {
    for (const unsigned char* p = storage_.data(); p < data_; ++p)
      if (*p != kGuard) return false;
    for (const unsigned char* p = data_ + bytes_; p < storage_.data() + storage_.size(); ++p)
      if (*p != kGuard) return false;
    return true;
  }

 private:
  std::vector<unsigned char> storage_;
  unsigned char* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

TEST_CASE("splitForPacks: head, packs and tail cover the range, and packs start on 16-byte boundaries", "[kernels][packed]") {
  alignas(16) static unsigned char arena[256];
  for (size_t elementSize : {1, 2, 4, 8}) {
    for (size_t dOff = 0; dOff < 16; dOff += elementSize) {
      for (size_t count : {0, 1, 2, 3, 15, 16, 17, 33, 100}) {
        for (size_t aOff : {dOff, (dOff + elementSize) % 16}) {
          const PackSplit split = splitForPacks(arena + dOff, arena + 64 + aOff, arena + 128 + dOff, count, elementSize);
          INFO("element " << elementSize << " dst offset " << dOff << " a offset " << aOff << " count " << count);
          const size_t perPack = 16 / elementSize;
          REQUIRE(split.head + split.packs * perPack + split.tail == count);
          if (aOff != dOff) {
            REQUIRE(split.head == count);  // not co-aligned: all scalar
            continue;
          }
          if (split.packs > 0) {
            REQUIRE((dOff + split.head * elementSize) % 16 == 0);
            REQUIRE(split.head < perPack);
            REQUIRE(split.tail < perPack);
          } else {
            REQUIRE(split.tail + split.head == count);  // too short to reach a whole pack
            REQUIRE((count <= (16 - dOff) % 16 / elementSize || count - (16 - dOff) % 16 / elementSize < perPack));
          }
        }
      }
    }
  }
  // An element not aligned to its own size never packs.
  REQUIRE(splitForPacks(arena + 2, arena + 66, arena + 130, 100, 4).head == 100);
}

TEST_CASE("reduceShare equals the reference for every type and op, aligned or not, on grids of 1, 3 and 8 workers", "[kernels][packed]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed << " (TOPOCCL_TEST_SEED=" << seed << " replays it)");
  TestRng rng(seed);
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    const size_t es = ref.size();
    for (ReduceOp op : kKernelOps) {
      const ShareFn share = kShareTable[static_cast<size_t>(type)][static_cast<size_t>(op)];
      for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{16}, size_t{67}, size_t{4099}}) {
        for (size_t elementOffset = 0; elementOffset * es < 16; elementOffset += (es == 1 ? 5 : 1)) {
          for (bool coAligned : {true, false}) {
            for (size_t workers : {1, 3, 8}) {
              const size_t dOff = elementOffset * es;
              const size_t bOff = coAligned ? dOff : (dOff + es) % 16;
              Placed a(count * es, dOff), b(count * es, bOff), dst(count * es, dOff);
              ref.fillRandom(a.data(), count, rng);
              ref.fillRandom(b.data(), count, rng);
              runGrid(share, dst.data(), a.data(), b.data(), count, workers);
              std::string firstFailure;
              INFO(ref.name() << " " << reduceOpName(op) << " count " << count << " dst offset " << dOff
                              << " b offset " << bOff << " workers " << workers);
              const size_t mismatches = countMismatches(ref, op, a.data(), b.data(), dst.data(), count, firstFailure);
              INFO(firstFailure);
              REQUIRE(mismatches == 0);
              REQUIRE(dst.guardsIntact());
            }
          }
        }
      }
      // In place (dst == a), as the executor reduces into its own buffer.
      const size_t count = 1001;
      Placed a(count * es, 0), b(count * es, 0);
      ref.fillRandom(a.data(), count, rng);
      ref.fillRandom(b.data(), count, rng);
      std::vector<unsigned char> before(a.data(), a.data() + count * es);
      runGrid(share, a.data(), a.data(), b.data(), count, 3);
      std::string firstFailure;
      INFO(ref.name() << " " << reduceOpName(op) << " in place");
      REQUIRE(countMismatches(ref, op, before.data(), b.data(), a.data(), count, firstFailure) == 0);
    }
  }
}

TEST_CASE("copyShare copies every byte at every offset on grids of 1, 3 and 8 workers, and nothing outside", "[kernels][packed]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed);
  TestRng rng(seed);
  for (size_t bytes : {0, 1, 15, 16, 17, 63, 100, 4099}) {
    for (size_t srcOffset = 0; srcOffset < 16; srcOffset += 3) {
      for (size_t dstOffset : {srcOffset, (srcOffset + 1) % 16}) {
        for (size_t workers : {1, 3, 8}) {
          Placed src(bytes, srcOffset), dst(bytes, dstOffset);
          for (size_t i = 0; i < bytes; ++i) src.data()[i] = static_cast<unsigned char>(rng());
          for (size_t worker = 0; worker < workers; ++worker) copyShare(dst.data(), src.data(), bytes, worker, workers);
          INFO("bytes " << bytes << " src offset " << srcOffset << " dst offset " << dstOffset << " workers " << workers);
          REQUIRE(std::memcmp(dst.data(), src.data(), bytes) == 0);
          REQUIRE(dst.guardsIntact());
        }
      }
    }
  }
}

TEST_CASE("scaleShare (PreMulSum's prescale on the GPU) rounds like one product, at every offset and grid", "[kernels][packed]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed << " (TOPOCCL_TEST_SEED=" << seed << " replays it)");
  TestRng rng(seed);
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    const size_t es = ref.size();
    const ScaleShareFn scale = kScaleDivideTable[static_cast<size_t>(type)][0].first;
    for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{16}, size_t{67}, size_t{4099}}) {
      for (size_t elementOffset = 0; elementOffset * es < 16; elementOffset += (es == 1 ? 5 : 1)) {
        for (bool inPlace : {false, true}) {
          for (size_t workers : {1, 3, 8}) {
            const size_t off = elementOffset * es;
            Placed src(count * es, off), dst(count * es, (off + (inPlace ? 0 : es)) % 16);
            ref.fillRandom(src.data(), count, rng);
            unsigned char scalar[8] = {};
            ref.fillRandom(scalar, 1, rng);
            const std::vector<unsigned char> before(src.data(), src.data() + count * es);
            unsigned char* out = inPlace ? src.data() : dst.data();
            for (size_t worker = 0; worker < workers; ++worker) scale(out, src.data(), scalar, count, worker, workers);
            INFO(ref.name() << " count " << count << " offset " << off << (inPlace ? " in place" : "") << " workers " << workers);
            size_t mismatches = 0;
            std::string first;
            for (size_t i = 0; i < count; ++i) {
              const std::string failure =
                  checkReduced(ref, ReduceOp::Prod, ref.bitsAt(before.data(), i), ref.bitsAt(scalar, 0), ref.bitsAt(out, i));
              if (!failure.empty() && mismatches++ == 0) first = "element " + std::to_string(i) + ": " + failure;
            }
            INFO(first);
            REQUIRE(mismatches == 0);
            REQUIRE(src.guardsIntact());
            REQUIRE(dst.guardsIntact());
          }
        }
      }
    }
  }
}

TEST_CASE("divideShare (integer Avg on the GPU) truncates toward zero on every grid", "[kernels][packed]") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed << " (TOPOCCL_TEST_SEED=" << seed << " replays it)");
  TestRng rng(seed);
  for (DataType type : allDataTypes()) {
    const ReferenceType ref(type);
    if (!ref.isInteger()) continue;
    const size_t es = ref.size();
    const DivideShareFn divide = kScaleDivideTable[static_cast<size_t>(type)][0].second;
    for (uint64_t divisor : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{7}, uint64_t{255}, uint64_t{1} << 40, ~uint64_t{0}}) {
      for (size_t workers : {1, 3, 8}) {
        const size_t count = 1003;
        Placed src(count * es, 0);
        ref.fillRandom(src.data(), count, rng);
        const uint64_t signBit = uint64_t(1) << (8 * es - 1);
        ref.setBits(src.data(), 0, ref.isSigned() ? signBit : ref.wrap(~Uint128(0)));  // most negative / largest
        const std::vector<unsigned char> before(src.data(), src.data() + count * es);
        for (size_t worker = 0; worker < workers; ++worker) divide(src.data(), src.data(), divisor, count, worker, workers);
        INFO(ref.name() << " / " << divisor << ", workers " << workers);
        for (size_t i = 0; i < count; ++i) {
          const Int128 quotient = ref.integer(ref.bitsAt(before.data(), i)) / static_cast<Int128>(divisor);
          REQUIRE(ref.bitsAt(src.data(), i) == ref.wrap(static_cast<Uint128>(quotient)));
        }
        REQUIRE(src.guardsIntact());
      }
    }
  }
}
