#include "transport/doorbell.hpp"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <ctime>

#include "common/error.hpp"
#include "common/params.hpp"

namespace topoccl::transport {
namespace {

// Not FUTEX_PRIVATE_FLAG: the word may live in memory shared between processes.
long futexWait(std::atomic<uint32_t>& word, uint32_t expected, const timespec* relative) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, relative, nullptr, 0);
}

timespec toTimespec(std::chrono::nanoseconds d) {
  return {static_cast<time_t>(d.count() / 1000000000), static_cast<long>(d.count() % 1000000000)};
}

std::atomic<bool> waitvMissing{false};  // kernels before 5.16 (ENOSYS), or a seccomp filter

long membarrier(int command) { return ::syscall(SYS_membarrier, command, 0u, 0); }

// asymmetricFences(): 0 not asked yet, 1 yes, 2 no. Asking twice at once is harmless: registration is idempotent.
std::atomic<int> asymmetric{0};

// A forked child is a new process: it registers itself before it relies on it.
[[maybe_unused]] const int resetInForkedChildren = ::pthread_atfork(nullptr, nullptr, [] {
  detail::ringersSkipFence.store(false, std::memory_order_relaxed);
  asymmetric.store(0, std::memory_order_relaxed);
});

}  // namespace

bool asymmetricFences() {
  const int known = asymmetric.load(std::memory_order_acquire);
  if (known != 0) return known == 1;
  bool ok = false;
  if (params::kAsymmetricFence.get()) {
    const long commands = membarrier(MEMBARRIER_CMD_QUERY);
    const long needed = MEMBARRIER_CMD_GLOBAL_EXPEDITED | MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED;
    ok = commands > 0 && (commands & needed) == needed && membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0;
  }
  detail::ringersSkipFence.store(ok, std::memory_order_relaxed);
  asymmetric.store(ok ? 1 : 2, std::memory_order_release);
  return ok;
}

bool sealArming(std::vector<ArmedDoorbell>& armed) {
  bool ringersMaySkipFence = false;
  for (const ArmedDoorbell& a : armed) ringersMaySkipFence |= a.bell->waiterFencesRingers.load(std::memory_order_relaxed) != 0;
  // The syscall is a full barrier here too, and one on the CPU of every registered ringer that is running.
  if (!ringersMaySkipFence) std::atomic_thread_fence(std::memory_order_seq_cst);
  else if (membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0) return false;
  for (ArmedDoorbell& a : armed) {
    a.rings = a.bell->rings.load(std::memory_order_acquire);
    a.sealed = true;
  }
  return true;
}

namespace detail {
std::atomic<bool> ringersSkipFence{false};

void wake(Doorbell& bell) {
  bell.rings.fetch_add(1, std::memory_order_release);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell.rings), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}
}  // namespace detail

void sleepUntilRung(std::vector<ArmedDoorbell>& armed, std::chrono::microseconds timeout) {
  if (armed.empty()) return;
  for (const ArmedDoorbell& a : armed)
    if (!a.sealed) {
      disarm(armed);
      throwInvalidUsage("sleepUntilRung: a doorbell armed but not sealed (sealArming() comes before the last look)");
    }
#ifdef SYS_futex_waitv
  if (armed.size() > 1 && armed.size() <= FUTEX_WAITV_MAX && !waitvMissing.load(std::memory_order_relaxed) &&
      params::kFutexWaitv.get()) {
    futex_waitv waiters[FUTEX_WAITV_MAX];
    for (size_t i = 0; i < armed.size(); ++i) {
      waiters[i] = {};
      waiters[i].val = armed[i].rings;
      waiters[i].uaddr = reinterpret_cast<uintptr_t>(&armed[i].bell->rings);
      waiters[i].flags = FUTEX_32;
    }
    timespec deadline{};
    ::clock_gettime(CLOCK_MONOTONIC, &deadline);
    const timespec add = toTimespec(timeout);
    deadline.tv_sec += add.tv_sec;
    deadline.tv_nsec += add.tv_nsec;
    if (deadline.tv_nsec >= 1000000000) {
      deadline.tv_sec += 1;
      deadline.tv_nsec -= 1000000000;
    }
    const long rc = ::syscall(SYS_futex_waitv, waiters, static_cast<unsigned>(armed.size()), 0u, &deadline, CLOCK_MONOTONIC);
    if (rc < 0 && (errno == ENOSYS || errno == EPERM)) waitvMissing.store(true, std::memory_order_relaxed);
    else {
      disarm(armed);
      return;
    }
  }
#endif
  // One bell (or no futex_waitv): sleep on the first. With several, the others are not watched, so the
  // sleep is kept short, as the yield-and-nap loop it replaces.
  const auto wait = armed.size() == 1 ? timeout : std::min<std::chrono::microseconds>(timeout, std::chrono::microseconds(50));
  const timespec relative = toTimespec(wait);
  futexWait(armed.front().bell->rings, armed.front().rings, &relative);
  disarm(armed);
}

}  // namespace topoccl::transport
