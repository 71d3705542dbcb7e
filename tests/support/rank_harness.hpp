// Runs a function on every rank of a fresh communicator: ranks as threads of this process, or as
// fork()ed processes (over shm, or over TCP with shm disabled). Workers return a failure count and
// print their own diagnostics; Catch assertions stay in the main thread.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "nccl.h"

namespace topoccl::test {

enum class RankMode { Threads, ProcessesShm, ProcessesTcp };
const char* rankModeName(RankMode mode);

using RankBody = std::function<int(int rank, int nranks, ncclComm_t comm)>;

struct RunResult {
  int failures = 0;        // sum of the workers' returns, plus ranks that crashed or timed out
  std::string problems;    // crashed / timed-out ranks, for the test log
};

// How a process rank creates its communicator: ncclCommInitRank alone, or inside ncclGroupStart / ncclGroupEnd as
// nccl-tests does (the init then runs on a helper thread).
enum class InitCall { Direct, Grouped };

// Environment changes apply to the child processes only (and, for threads, are set around the run). In a
// child, "{rank}" in a value becomes its rank (for threads it stays as written). `init` applies to processes.
RunResult runRanks(RankMode mode, int nranks, const RankBody& body,
                   const std::map<std::string, std::string>& env = {}, int timeoutSeconds = 600,
                   InitCall init = InitCall::Direct);

// A fresh random seed per run, printed so a failure can be replayed with TOPOCCL_TEST_SEED.
uint64_t testSeed();

}  // namespace topoccl::test
