// A sleeping wait for peers that talk through memory (shm, local). The side that waits arms its
// doorbell and sleeps in the kernel (futex); the side that publishes rings it, and pays for a syscall
// only when the other side is asleep. Spinning and yielding spend CPU time the peer may need: ranks
// that share cores, or a cgroup CPU quota that idle loops would use up (perf/RESULTS.md).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace topoccl::transport {

// One waiter, any number of ringers. Lives in shared memory (one cache line of its own: only sleepers
// write it, so ringers read it from their caches for free while nobody sleeps).
struct alignas(64) Doorbell {
  std::atomic<uint32_t> rings{0};     // the futex word: bumped by each ring that finds a sleeper
  std::atomic<uint32_t> sleeping{0};  // set by the waiter between arm() and disarm()
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "a doorbell must be lock-free to live in shared memory");

// Call after the stores that publish something to the doorbell's waiter (data, a flag, a counter).
inline void ring(Doorbell& bell);

// What a waiter sleeps on: the bell, and its ring count when it was armed.
struct ArmedDoorbell {
  Doorbell* bell = nullptr;
  uint32_t rings = 0;
};

// Arms `bell` and records it. The caller must look for progress once more after arming and before
// sleeping: a publish that raced the arming is seen then, and any later one rings.
inline void arm(Doorbell& bell, std::vector<ArmedDoorbell>& armed) {
  bell.sleeping.store(1, std::memory_order_relaxed);
  // Pairs with ring()'s fence: either the ringer sees `sleeping`, or our next look sees its data.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  armed.push_back({&bell, bell.rings.load(std::memory_order_relaxed)});
}

// Sleeps until one of the armed bells rings (or had rung since arming), the timeout passes or a signal
// arrives, then disarms them all and clears `armed`. Returns at once when `armed` is empty.
void sleepUntilRung(std::vector<ArmedDoorbell>& armed, std::chrono::microseconds timeout);

// Disarms without sleeping (progress was found after arming).
inline void disarm(std::vector<ArmedDoorbell>& armed) {
  for (const ArmedDoorbell& a : armed) a.bell->sleeping.store(0, std::memory_order_relaxed);
  armed.clear();
}

namespace detail {
void wake(Doorbell& bell);  // out of line: the syscall path
}

inline void ring(Doorbell& bell) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell.sleeping.load(std::memory_order_relaxed) != 0) detail::wake(bell);
}

}  // namespace topoccl::transport
