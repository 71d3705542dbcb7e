#include "transport/doorbell.hpp"

#include <linux/futex.h>
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

}  // namespace

void sealArming(std::vector<ArmedDoorbell>& armed) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (ArmedDoorbell& a : armed) {
    a.rings = a.bell->rings.load(std::memory_order_acquire);
    a.sealed = true;
  }
}

namespace detail {
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
