#include "support/rank_harness.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

namespace topoccl::test {

const char* rankModeName(RankMode mode) {
  switch (mode) {
    case RankMode::Threads: return "threads";
    case RankMode::ProcessesShm: return "processes over shm";
    case RankMode::ProcessesTcp: return "processes over TCP";
  }
  return "?";
}

uint64_t testSeed() {
  static const uint64_t seed = [] {
    if (const char* fixed = std::getenv("TOPOCCL_TEST_SEED")) return static_cast<uint64_t>(std::strtoull(fixed, nullptr, 0));
    std::random_device rd;
    const uint64_t s = (static_cast<uint64_t>(rd()) << 32) | rd();
    std::fprintf(stderr, "test seed: TOPOCCL_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

namespace {

RunResult runThreads(int nranks, const RankBody& body) {
  RunResult result;
  std::vector<ncclComm_t> comms(nranks);
  if (ncclCommInitAll(comms.data(), nranks, nullptr) != ncclSuccess) {
    result.failures = 1;
    result.problems = std::string("ncclCommInitAll failed: ") + ncclGetLastError(nullptr);
    return result;
  }
  std::vector<int> failures(nranks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r) threads.emplace_back([&, r] { failures[r] = body(r, nranks, comms[r]); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < nranks; ++r) {
    result.failures += failures[r];
    if (ncclCommDestroy(comms[r]) != ncclSuccess) ++result.failures;
  }
  return result;
}

RunResult runProcesses(int nranks, const RankBody& body, const std::map<std::string, std::string>& env,
                       int timeoutSeconds, InitCall init) {
  RunResult result;
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    result.failures = 1;
    result.problems = "ncclGetUniqueId failed";
    return result;
  }
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int r = 0; r < nranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      for (const auto& [k, v] : env) {
        // "{rank}" in a value becomes the child's rank (per-rank settings, such as NCCL_HOSTID).
        std::string value = v;
        for (size_t at = value.find("{rank}"); at != std::string::npos; at = value.find("{rank}"))
          value.replace(at, 6, std::to_string(r));
        setenv(k.c_str(), value.c_str(), 1);
      }
      ncclComm_t comm = nullptr;
      int failed = 0;
      const bool grouped = init == InitCall::Grouped;
      if ((grouped && ncclGroupStart() != ncclSuccess) || ncclCommInitRank(&comm, nranks, id, r) != ncclSuccess ||
          (grouped && ncclGroupEnd() != ncclSuccess)) {
        std::fprintf(stderr, "rank %d: ncclCommInitRank%s failed: %s\n", r, grouped ? " in a group" : "",
                     ncclGetLastError(nullptr));
        failed = 1;
      } else {
        failed = body(r, nranks, comm);
        if (ncclCommDestroy(comm) != ncclSuccess) failed += 1;
      }
      std::fflush(nullptr);
      _exit(failed > 100 ? 100 : failed);
    }
    children.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds);
  std::vector<bool> done(nranks, false);
  int remaining = nranks;
  while (remaining > 0) {
    for (int r = 0; r < nranks; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(children[r], &status, WNOHANG) == children[r]) {
        done[r] = true;
        --remaining;
        if (WIFEXITED(status)) {
          result.failures += WEXITSTATUS(status);
        } else {
          result.failures += 1;
          result.problems += "rank " + std::to_string(r) + " died with signal " + std::to_string(WTERMSIG(status)) + "; ";
        }
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < nranks; ++r)
        if (!done[r]) {
          kill(children[r], SIGKILL);
          waitpid(children[r], nullptr, 0);
          result.failures += 1;
          result.problems += "rank " + std::to_string(r) + " timed out; ";
        }
      break;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return result;
}

}  // namespace

RunResult runRanks(RankMode mode, int nranks, const RankBody& body, const std::map<std::string, std::string>& env,
                   int timeoutSeconds, InitCall init) {
  if (mode == RankMode::Threads) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    RunResult r = runThreads(nranks, body);
    for (const auto& [k, v] : env) unsetenv(k.c_str());
    return r;
  }
  std::map<std::string, std::string> childEnv = env;
  if (mode == RankMode::ProcessesTcp) childEnv["NCCL_SHM_DISABLE"] = "1";
  return runProcesses(nranks, body, childEnv, timeoutSeconds, init);
}

}  // namespace topoccl::test
