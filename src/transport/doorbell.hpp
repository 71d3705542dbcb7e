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
  bool sealed = false;  // by sealArming(): sleeping on a bell that is not would risk a lost wake-up
};

// Arms `bell` and records it. Once every bell is armed, the caller seals them (sealArming), then must look
// for progress once more before sleeping: a publish that raced the arming is seen then, and any later one rings.
inline void arm(Doorbell& bell, std::vector<ArmedDoorbell>& armed) {
  bell.sleeping.store(1, std::memory_order_relaxed);
  armed.push_back({&bell, 0});
}

// Pairs the armed bells' `sleeping` with ring()'s fence: either a ringer sees it, or the caller's next look sees
// the ringer's data. One fence for all the bells, then records each bell's ring count.
void sealArming(std::vector<ArmedDoorbell>& armed);

// Sleeps until one of the armed bells rings (or had rung since arming), the timeout passes or a signal
// arrives, then disarms them all and clears `armed`. Returns at once when `armed` is empty. Throws, having
// disarmed, when a bell was not sealed.
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
  // Pairs with sealArming()'s fence. Not a membarrier on the sleeper's side instead (tried, session 45: no
  // difference measurable in one binary; the stall moves to the stores the fence waited for).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell.sleeping.load(std::memory_order_relaxed) != 0) detail::wake(bell);
}

}  // namespace topoccl::transport
