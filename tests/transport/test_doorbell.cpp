// Doorbells: a sleeper wakes when a bell it armed rings, also when the ring came between arming and
// sleeping, and not otherwise; ringing a bell nobody sleeps on makes no syscall (rings stays put).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "common/config.hpp"
#include "transport/doorbell.hpp"

using namespace topoccl::transport;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Sleeps on `bells` (armed in order) with a long timeout; returns how long the sleep took.
Clock::duration sleepOn(const std::vector<Doorbell*>& bells, std::chrono::microseconds timeout = 30s) {
  std::vector<ArmedDoorbell> armed;
  for (Doorbell* bell : bells) arm(*bell, armed);
  const auto start = Clock::now();
  sleepUntilRung(armed, timeout);
  CHECK(armed.empty());
  for (Doorbell* bell : bells) CHECK(bell->sleeping.load() == 0);  // disarmed on the way out
  return Clock::now() - start;
}

}  // namespace

TEST_CASE("a ring with nobody asleep changes nothing") {
  Doorbell bell;
  for (int i = 0; i < 1000; ++i) ring(bell);
  CHECK(bell.rings.load() == 0);
  CHECK(bell.sleeping.load() == 0);
}

TEST_CASE("a ring between arming and sleeping is not lost") {
  Doorbell bell;
  std::vector<ArmedDoorbell> armed;
  arm(bell, armed);
  REQUIRE(armed.size() == 1);
  CHECK(bell.sleeping.load() == 1);
  ring(bell);  // the peer published just after we armed: the sleep must return at once
  CHECK(bell.rings.load() == 1);
  const auto start = Clock::now();
  sleepUntilRung(armed, 30s);
  CHECK(Clock::now() - start < 10s);
  CHECK(bell.sleeping.load() == 0);
  ring(bell);  // disarmed again: no more wake-ups
  CHECK(bell.rings.load() == 1);
}

TEST_CASE("an unrung sleep ends at its timeout") {
  Doorbell bell;
  const auto slept = sleepOn({&bell}, 20ms);
  CHECK(slept >= 15ms);  // futex timeouts may end a little early on a coarse clock, never much
  CHECK(bell.rings.load() == 0);
}

TEST_CASE("a sleeper on one or several bells wakes when any of them rings") {
  const int count = GENERATE(1, 2, 5);
  const int rung = GENERATE_COPY(range(0, count));
  INFO(count << " bells, ringing bell " << rung);
  std::vector<Doorbell> bells(static_cast<size_t>(count));
  std::vector<Doorbell*> pointers;
  for (auto& b : bells) pointers.push_back(&b);
  std::thread ringer([&] {
    // Ring once the sleeper has armed (it sets `sleeping` before it sleeps).
    while (bells[static_cast<size_t>(rung)].sleeping.load() == 0) std::this_thread::yield();
    std::this_thread::sleep_for(20ms);
    ring(bells[static_cast<size_t>(rung)]);
  });
  const auto slept = sleepOn(pointers);
  ringer.join();
  CHECK(slept < 10s);  // a lost wake-up would sleep the full 30 s
  CHECK(bells[static_cast<size_t>(rung)].rings.load() == 1);
}

TEST_CASE("a bell in shared memory wakes a sleeper in another process") {
  void* page = ::mmap(nullptr, sizeof(Doorbell), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(page != MAP_FAILED);
  auto* bell = new (page) Doorbell{};
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    while (bell->sleeping.load() == 0) std::this_thread::yield();
    std::this_thread::sleep_for(20ms);
    ring(*bell);
    ::_exit(0);
  }
  const auto slept = sleepOn({bell});
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(slept < 10s);
  CHECK(bell->rings.load() == 1);
  ::munmap(page, sizeof(Doorbell));
}

TEST_CASE("without futex_waitv a sleeper on several bells naps on the first, in turns of at most 50 us") {
  topoccl::config::clearOverrides();
  topoccl::config::setOverride("TOPOCCL_FUTEX_WAITV", "0");  // as on kernels before 5.16 or under a seccomp filter
  Doorbell first, second;
  const auto napped = sleepOn({&first, &second}, 30s);  // nobody rings: only the nap's own bound ends it
  CHECK(napped < 5s);
  // An engine's loop around it: a peer publishing 20 ms later is seen after some naps, not after 30 s.
  std::atomic<bool> published{false};
  std::thread ringer([&] {
    while (first.sleeping.load() == 0) std::this_thread::yield();
    std::this_thread::sleep_for(20ms);
    published = true;
    ring(second);  // the bell the sleeper does not sleep on
  });
  const auto start = Clock::now();
  int naps = 0;
  std::vector<ArmedDoorbell> armed;
  while (!published) {
    arm(first, armed);
    arm(second, armed);
    if (published) {
      disarm(armed);
      break;
    }
    sleepUntilRung(armed, 30s);
    ++naps;
  }
  ringer.join();
  CHECK(Clock::now() - start < 10s);
  CHECK(naps >= 2);
  topoccl::config::clearOverrides();
}
