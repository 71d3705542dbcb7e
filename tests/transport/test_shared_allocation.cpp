// The shared allocator behind ncclMemAlloc: ranges are found only inside one live allocation.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include <catch2/catch.hpp>

#include "common/error.hpp"
#include "transport/shm/shared_allocation.hpp"

using namespace topoccl;
using namespace topoccl::transport;

TEST_CASE("shared allocations are found by any range that lies inside one of them") {
  std::mt19937_64 rng(std::random_device{}());
  for (const size_t bytes : {size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{65521}, size_t{3} << 20}) {
    INFO(bytes << " bytes");
    auto* base = static_cast<unsigned char*>(allocateShared(bytes));
    REQUIRE(base != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(base) % 4096 == 0);
    std::vector<unsigned char> pattern(bytes);
    for (auto& b : pattern) b = static_cast<unsigned char>(rng());
    std::memcpy(base, pattern.data(), bytes);
    CHECK(std::memcmp(base, pattern.data(), bytes) == 0);

    const auto whole = findShared(base, bytes);
    REQUIRE(whole);
    CHECK(whole->offset == 0);
    CHECK(whole->allocationBytes == bytes);
    struct stat st {};
    REQUIRE(::fstat(whole->fd, &st) == 0);  // the fd peers open through /proc
    CHECK(static_cast<uint64_t>(st.st_ino) == whole->inode);
    CHECK(static_cast<uint64_t>(st.st_size) >= bytes);

    const size_t offset = rng() % bytes;
    const auto inside = findShared(base + offset, bytes - offset);
    REQUIRE(inside);
    CHECK(inside->offset == offset);
    CHECK(findShared(base + bytes, 0));            // the empty range at the end is inside
    CHECK_FALSE(findShared(base + offset, bytes - offset + 1));  // runs past the end
    CHECK_FALSE(findShared(base - 1, 1));          // starts before it
    CHECK_FALSE(findShared(pattern.data(), 1));    // private memory

    CHECK(freeShared(base));
    CHECK_FALSE(findShared(base, 1));
    CHECK_FALSE(freeShared(base));  // twice: not ours any more
  }
  std::vector<char> privateBuffer(64);
  CHECK_FALSE(freeShared(privateBuffer.data()));
  CHECK_THROWS_AS(allocateShared(0), Error);
}
