// A rank killed in the middle of a collective: the survivors get ncclRemoteError/ncclSystemError
// within a bounded time (no hang), the message names a peer, and ncclCommAbort returns.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "nccl.h"

namespace {

// Survivor exit codes: 0 = got the expected error, 1 = wrong outcome.
int survivor(int rank, int nranks, const ncclUniqueId& id) {
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess) return 1;
  std::vector<float> data(4 << 20, 1.0f);
  for (int iteration = 0; iteration < 100000; ++iteration) {
    const ncclResult_t r = ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclMax, comm, nullptr);
    if (r == ncclSuccess) continue;
    const std::string text = ncclGetLastError(nullptr);
    std::fprintf(stderr, "rank %d survivor saw %s: %s\n", rank, ncclGetErrorString(r), text.c_str());
    const bool good = (r == ncclRemoteError || r == ncclSystemError) && text.find("rank") != std::string::npos;
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    const bool asyncReported = async == r;
    if (ncclCommAbort(comm) != ncclSuccess) return 1;
    return good && asyncReported ? 0 : 1;
  }
  return 1;  // never noticed the death
}

[[noreturn]] void victim(int rank, int nranks, const ncclUniqueId& id) {
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, nranks, id, rank) != ncclSuccess) _exit(3);
  std::vector<float> data(4 << 20, 1.0f);
  std::thread killer([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(getpid(), SIGKILL);  // mid-collective: the main thread is inside ncclAllReduce
  });
  for (;;) ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat, ncclMax, comm, nullptr);
}

void killOneRank(int nranks, bool tcp) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("TOPOCCL_TIMEOUT_MS", "10000", 1);
      if (tcp) setenv("NCCL_SHM_DISABLE", "1", 1);
      if (r == nranks - 1) victim(r, nranks, id);
      std::fflush(nullptr);
      _exit(survivor(r, nranks, id));
    }
    pids.push_back(pid);
  }
  int status = 0;
  REQUIRE(waitpid(pids.back(), &status, 0) == pids.back());
  CHECK(WIFSIGNALED(status));
  const auto died = std::chrono::steady_clock::now();
  for (int r = 0; r + 1 < nranks; ++r) {
    // Bounded: the detection itself, or TOPOCCL_TIMEOUT_MS (10 s) for ranks blocked only on survivors.
    bool exited = false;
    while (std::chrono::steady_clock::now() - died < std::chrono::seconds(60)) {
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        exited = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - died).count();
    INFO("rank " << r << " of " << nranks << (tcp ? " over TCP" : " over shm") << " after " << seconds << " s");
    if (!exited) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status, 0);
    }
    REQUIRE(exited);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    std::fprintf(stderr, "rank %d of %d (%s) reported the failure %.2f s after the kill\n", r, nranks,
                 tcp ? "TCP" : "shm", seconds);
  }
}

}  // namespace

TEST_CASE("a rank killed mid-collective becomes an error on the survivors (shm)") {
  killOneRank(2, false);
  killOneRank(4, false);
}

TEST_CASE("a rank killed mid-collective becomes an error on the survivors (TCP)") {
  killOneRank(2, true);
  killOneRank(4, true);
}
