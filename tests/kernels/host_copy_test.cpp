// streamingCopy and bulkCopy against the source bytes they copy: fresh random data, lengths around the
// 16-byte store, 64-byte round and 4 KiB string-copy boundaries (and a prime above a MiB), every source and
// destination offset modulo 16, and guard bytes on both sides of the destination.
#include <unistd.h>
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/host_copy.hpp"
#include "reference.hpp"

namespace {

using CopyFn = void (*)(void*, const void*, size_t);

void checkCopy(CopyFn copy) {
  const uint64_t seed = topoccl::kernels::test::testSeed();
  INFO("seed " << seed);
  std::mt19937_64 random(seed);
  constexpr unsigned char kGuard = 0x5a;
  constexpr size_t kSlack = 64;
  const size_t lengths[] = {0, 1, 2, 15, 16, 17, 31, 47, 63, 64, 65, 127, 128, 129, 191, 4095, 4096, 4099, 65537, 1048583};
  for (size_t length : lengths) {
    std::vector<unsigned char> source(length + 2 * kSlack);
    for (auto& byte : source) byte = static_cast<unsigned char>(random());
    std::vector<unsigned char> target(length + 2 * kSlack);
    for (size_t srcOffset = 0; srcOffset < 16; srcOffset += (length > 4096 ? 5 : 1)) {
      for (size_t dstOffset = 0; dstOffset < 16; dstOffset += (length > 4096 ? 3 : 1)) {
        std::fill(target.begin(), target.end(), kGuard);
        unsigned char* dst = target.data() + kSlack + dstOffset;
        const unsigned char* src = source.data() + kSlack + srcOffset;
        copy(dst, src, length);
        INFO("length " << length << ", source offset " << srcOffset << ", destination offset " << dstOffset);
        REQUIRE(std::equal(src, src + length, dst));
        for (unsigned char* p = target.data(); p < dst; ++p) REQUIRE(*p == kGuard);
        for (unsigned char* p = dst + length; p < target.data() + target.size(); ++p) REQUIRE(*p == kGuard);
      }
    }
  }
}

}  // namespace

TEST_CASE("streamingCopy copies every byte at every alignment and length, and nothing outside") {
  checkCopy(&topoccl::kernels::streamingCopy);
}

TEST_CASE("bulkCopy copies every byte at every alignment and length, and nothing outside") {
  INFO("string copy on this CPU: " << topoccl::kernels::bulkCopyUsesStringCopy());
  checkCopy(&topoccl::kernels::bulkCopy);
}

TEST_CASE("the last-level cache copies plan for is the reported one, capped per online CPU") {
  using topoccl::kernels::kMaxCacheBytesPerCpu;
  using topoccl::kernels::usableCacheBytes;
  constexpr size_t MiB = size_t{1} << 20;
  CHECK(usableCacheBytes(32 * MiB, 2) == 32 * MiB);    // a VM on one CCD of an EPYC: as reported
  CHECK(usableCacheBytes(504 * MiB, 2) == 32 * MiB);   // a 2-vCPU VM shown its host's 504 MiB
  CHECK(usableCacheBytes(504 * MiB, 64) == 504 * MiB); // the host itself
  CHECK(usableCacheBytes(0, 4) == 0);                  // unknown stays unknown
  CHECK(usableCacheBytes(504 * MiB, 0) == kMaxCacheBytesPerCpu);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  REQUIRE(online > 0);
  CHECK(topoccl::kernels::lastLevelCacheBytes() <= size_t(online) * kMaxCacheBytesPerCpu);
}
