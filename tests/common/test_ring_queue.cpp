#include <catch2/catch.hpp>

#include <deque>
#include <memory>
#include <random>

#include "common/ring_queue.hpp"

using topoccl::RingQueue;

TEST_CASE("RingQueue behaves as std::deque under random pushes and pops, across growth and wrap-around", "[ring_queue]") {
  std::mt19937_64 rng(std::random_device{}());
  RingQueue<uint64_t> ring;
  std::deque<uint64_t> reference;
  for (int i = 0; i < 200000; ++i) {
    // Phases that mostly push, then mostly pop, so the backlog grows past several capacities and drains again.
    const bool pushing = (i / 5000) % 2 == 0 ? rng() % 4 != 0 : rng() % 4 == 0;
    if (pushing || reference.empty()) {
      const uint64_t v = rng();
      ring.push_back(v);
      reference.push_back(v);
    } else {
      REQUIRE(ring.front() == reference.front());
      ring.pop_front();
      reference.pop_front();
    }
    REQUIRE(ring.size() == reference.size());
    REQUIRE(ring.empty() == reference.empty());
    if (!reference.empty()) {
      const size_t k = rng() % reference.size();
      REQUIRE(ring[k] == reference[k]);
    }
  }
  ring.clear();
  CHECK(ring.empty());
  CHECK(ring.size() == 0);
}

TEST_CASE("RingQueue releases what a popped element holds at once, and moves elements when it grows", "[ring_queue]") {
  RingQueue<std::shared_ptr<int>> ring;
  auto held = std::make_shared<int>(7);
  ring.push_back(held);
  CHECK(held.use_count() == 2);
  ring.pop_front();
  CHECK(held.use_count() == 1);  // not kept alive in its slot until the slot is reused
  for (int i = 0; i < 100; ++i) ring.push_back(std::make_shared<int>(i));  // grows from 16 to 128 slots
  for (int i = 0; i < 100; ++i) {
    REQUIRE(*ring.front() == i);
    REQUIRE(ring.front().use_count() == 1);  // moved, never copied
    ring.pop_front();
  }
  CHECK(ring.empty());
}
