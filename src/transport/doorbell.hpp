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
  // Set by prepareToWait() before the waiter first arms: its arming then issues membarrier(GLOBAL_EXPEDITED),
  // which stands in for the fence of every ringer registered for it (asymmetricFences()). 0: ringers fence.
  std::atomic<uint32_t> waiterFencesRingers{0};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "a doorbell must be lock-free to live in shared memory");

// Call after the stores that publish something to the doorbell's waiter (data, a flag, a counter).
inline void ring(Doorbell& bell);

// Whether this process takes part in asymmetric fences: registered to receive membarrier(GLOBAL_EXPEDITED) (Linux
// 4.16+) and allowed to issue it. Then a ring is a compiler barrier and a read, where a fence would wait for every
// store in flight, most of them to lines the peer's CPU holds (a 4-rank 8 B broadcast's root spent 43% of its
// time there); the rare sleeper pays instead, with one syscall as it arms. Asks once per process (again after a
// fork); TOPOCCL_ASYMMETRIC_FENCE=0, or a kernel or seccomp filter without membarrier: no.
bool asymmetricFences();

// The bell's waiter (or its process, for a bell in its own memory) calls this once, before it first arms.
inline void prepareToWait(Doorbell& bell) {
  bell.waiterFencesRingers.store(asymmetricFences() ? 1 : 0, std::memory_order_relaxed);
}

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

// Pairs the armed bells' `sleeping` with ring(): either a ringer sees it, or the caller's next look sees the
// ringer's data. One membarrier for them all when a bell's waiter fences for its ringers, else a fence. Then
// records each bell's ring count. False when the membarrier failed: disarm and do not sleep.
bool sealArming(std::vector<ArmedDoorbell>& armed);

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
extern std::atomic<bool> ringersSkipFence;  // asymmetricFences()'s answer, once asked, for ring()
}  // namespace detail

inline void ring(Doorbell& bell) {
  if (detail::ringersSkipFence.load(std::memory_order_relaxed) && bell.waiterFencesRingers.load(std::memory_order_relaxed) != 0)
    std::atomic_signal_fence(std::memory_order_seq_cst);  // keeps the compiler from reading `sleeping` first
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell.sleeping.load(std::memory_order_relaxed) != 0) detail::wake(bell);
}

}  // namespace topoccl::transport
