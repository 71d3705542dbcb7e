#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "common/hash.hpp"

using topoccl::fnv1a64;

TEST_CASE("fnv1a64 matches the published FNV-1a 64 vectors and hashes pieces like their concatenation", "[hash]") {
  // Vectors from the FNV reference test suite (draft-eastlake-fnv).
  CHECK(fnv1a64("") == 0xcbf29ce484222325ull);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a64("foobar") == 0x85944171f73967e8ull);
  static_assert(fnv1a64("a") == 0xaf63dc4c8601ec8cull);  // usable at compile time

  std::mt19937_64 rng(std::random_device{}());
  for (int i = 0; i < 100; ++i) {
    std::string text(rng() % 200, '\0');
    for (char& c : text) c = static_cast<char>(rng());
    const size_t cut = text.empty() ? 0 : rng() % text.size();
    INFO("length " << text.size() << ", cut at " << cut);
    CHECK(fnv1a64(text.substr(cut), fnv1a64(text.substr(0, cut))) == fnv1a64(text));
    if (!text.empty()) {
      std::string flipped = text;
      flipped[cut] = static_cast<char>(flipped[cut] ^ 1);
      CHECK(fnv1a64(flipped) != fnv1a64(text));  // one bit changes the hash (FNV-1a is a bijection per byte)
    }
  }
}
