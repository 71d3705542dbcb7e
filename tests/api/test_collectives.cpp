#include <catch2/catch.hpp>

#include "api/collective_matrix.hpp"
#include "support/rank_harness.hpp"

using namespace topoccl::test;

namespace {

void runMatrix(RankMode mode, int nranks, bool full) {
  MatrixOptions options;
  options.seed = testSeed() + static_cast<uint64_t>(nranks) * 1000 + static_cast<uint64_t>(mode);
  options.allTypesAndOps = full;
  options.largeSizes = true;
  INFO(rankModeName(mode) << ", " << nranks << " ranks, seed " << options.seed);
  const RunResult result = runRanks(mode, nranks, [&](int rank, int n, ncclComm_t comm) {
    return runCollectiveMatrix(rank, n, comm, options);
  });
  INFO(result.problems);
  CHECK(result.failures == 0);
}

}  // namespace

#define TOPOCCL_MATRIX_TEST(mode, modeName, n, full) \
  TEST_CASE("every collective on " modeName " with " #n " ranks") { runMatrix(mode, n, full); }

TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 1, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 2, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 3, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 4, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 5, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 6, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 7, true)
TOPOCCL_MATRIX_TEST(RankMode::Threads, "threads", 8, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 1, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 2, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 3, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 4, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 5, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 6, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 7, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesShm, "shm processes", 8, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 1, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 2, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 3, true)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 4, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 5, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 6, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 7, false)
TOPOCCL_MATRIX_TEST(RankMode::ProcessesTcp, "TCP processes", 8, false)
