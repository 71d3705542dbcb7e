// A communicator tells from its ranks' CPU affinities whether they share cores, so that ranks pinned two to a
// core yield to each other instead of spinning through each other's time slices (before, a rank pinned to
// one CPU was taken to own it: 4 ranks bound two to a core took 145 us for an 8-byte all-reduce, 2.8 us now).
// Thread ranks pinned with sched_setaffinity; results checked against a double-precision sum of fresh
// random inputs.
#include <catch2/catch.hpp>

#include <pthread.h>
#include <sched.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "core/communicator.hpp"
#include "topology/locality.hpp"

using namespace topoccl;

namespace {

struct RankOutcome {
  bool sharesCores = false;
  std::string allReduceAlgorithm;  // chosen for this run's size
  std::string smallAllGatherAlgorithm;  // chosen for a 1 KiB all-gather
  std::vector<float> output;
  std::string error;
};

// All-reduce (sum) of inputs[r] on thread ranks, rank r pinned to CPU pins[r].
std::vector<RankOutcome> runPinned(const std::vector<int>& pins, const std::vector<std::vector<float>>& inputs) {
  const int nranks = static_cast<int>(pins.size());
  const bootstrap::UniqueId id = bootstrap::createUniqueId();
  std::vector<RankOutcome> outcomes(pins.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&, r] {
      RankOutcome& out = outcomes[static_cast<size_t>(r)];
      try {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(pins[static_cast<size_t>(r)], &one);
        if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) != 0) throw std::runtime_error("pthread_setaffinity_np failed");
        auto comm = core::Communicator::create(id, nranks, r, core::CommOptions{});
        out.sharesCores = comm->sharesCores();
        out.allReduceAlgorithm = comm->chosenAlgorithm(algo::Collective::AllReduce, inputs[static_cast<size_t>(r)].size() * sizeof(float), false);
        out.smallAllGatherAlgorithm = comm->chosenAlgorithm(algo::Collective::AllGather, 1024, false);
        out.output.assign(inputs[static_cast<size_t>(r)].size(), -1.0f);
        core::CollectiveArgs args;
        args.collective = algo::Collective::AllReduce;
        args.count = out.output.size();
        args.type = DataType::Float32;
        args.send = inputs[static_cast<size_t>(r)].data();
        args.recv = out.output.data();
        for (int call = 0; call < 20; ++call) {  // enough calls that ranks wait on each other
          auto work = comm->runBlocking({args});
          work->wait();
          if (work->result() != ncclSuccess) out.error = work->errorMessage();
        }
        comm->finalize();
      } catch (const std::exception& e) {
        out.error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return outcomes;
}

std::vector<int> usableCpus() {
  const topo::CpuSet available = topo::currentCpuSet();
  std::vector<int> cpus;
  for (int c = 0; c < static_cast<int>(available.size()) * 64; ++c)
    if ((available[static_cast<size_t>(c) / 64] >> (c % 64)) & 1u) cpus.push_back(c);
  return cpus;
}

uint64_t freshSeed() { return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}(); }

std::vector<std::vector<float>> randomInputs(std::mt19937_64& random, size_t nranks, size_t count) {
  std::uniform_real_distribution<float> value(-8.0f, 8.0f);
  std::vector<std::vector<float>> inputs(nranks, std::vector<float>(count));
  for (auto& rank : inputs)
    for (float& v : rank) v = value(random);
  return inputs;
}

// Every rank ran without error, and its output is the sum of every rank's input, within float rounding of a
// double-precision reference.
void checkSums(const std::vector<RankOutcome>& outcomes, const std::vector<std::vector<float>>& inputs) {
  const size_t nranks = inputs.size();
  for (size_t r = 0; r < nranks; ++r) {
    INFO("rank " << r << ": " << outcomes[r].error);
    REQUIRE(outcomes[r].error.empty());
    for (size_t i = 0; i < inputs[r].size(); ++i) {
      double expected = 0;
      for (size_t q = 0; q < nranks; ++q) expected += inputs[q][i];
      REQUIRE(std::fabs(outcomes[r].output[i] - expected) <= 1e-5 * (1.0 + std::fabs(expected)) * static_cast<double>(nranks));
    }
  }
}

}  // namespace

TEST_CASE("ranks pinned two to a CPU know they share it, a rank pinned alone knows it does not") {
  const std::vector<int> cpus = usableCpus();
  REQUIRE(!cpus.empty());
  const uint64_t seed = freshSeed();
  INFO("seed " << seed);
  std::mt19937_64 random(seed);

  struct Case {
    std::vector<int> pins;
    std::vector<bool> shares;
  };
  const int a = cpus[0];
  std::vector<Case> cases = {{{a, a}, {true, true}}};
  if (cpus.size() >= 2) {
    const int b = cpus[1];
    cases.push_back({{a, b}, {false, false}});
    cases.push_back({{a, b, b}, {false, true, true}});
    cases.push_back({{a, a, b, b, b}, {true, true, true, true, true}});
  } else {
    WARN("one CPU in this process's affinity: only the two-ranks-on-one-CPU case runs");
  }
  for (const Case& c : cases) {
    const size_t nranks = c.pins.size();
    const auto inputs = randomInputs(random, nranks, 1009);  // prime
    std::string pinsText;
    for (int p : c.pins) pinsText += std::to_string(p) + " ";
    INFO(nranks << " ranks pinned to CPUs " << pinsText);
    const auto outcomes = runPinned(c.pins, inputs);
    checkSums(outcomes, inputs);
    for (size_t r = 0; r < nranks; ++r) CHECK(outcomes[r].sharesCores == c.shares[r]);
  }
}

// Every rank of a host decides from the same wire data: where some share a CPU, 4 ranks take recursive doubling for
// small all-reduce (algo::sharedCoreRows), all of them alike, and the sums still come out right.
TEST_CASE("4 ranks two to a CPU all choose recursive doubling for small all-reduce, and sum right") {
  const std::vector<int> cpus = usableCpus();
  REQUIRE(!cpus.empty());
  const uint64_t seed = freshSeed();
  INFO("seed " << seed);
  std::mt19937_64 random(seed);

  const int a = cpus[0];
  const int b = cpus.size() >= 2 ? cpus[1] : a;
  struct Case {
    std::vector<int> pins;
    size_t count;
    const char* allReduce;
    const char* allGather;
  };
  std::vector<Case> cases = {{{a, a, b, b}, 3, "recursive_doubling", "direct"},
                             {{a, b, a, b}, 1021, "recursive_doubling", "direct"},  // 4084 B
                             {{a, a, b, b}, 2048, "direct", "direct"}};             // 8 KiB
  if (cpus.size() >= 4) cases.push_back({{cpus[0], cpus[1], cpus[2], cpus[3]}, 3, "direct", "direct"});
  else WARN("fewer than 4 CPUs in this process's affinity: the case of 4 ranks on cores of their own does not run");
  for (const Case& c : cases) {
    const size_t nranks = c.pins.size();
    const auto inputs = randomInputs(random, nranks, c.count);
    std::string pinsText;
    for (int p : c.pins) pinsText += std::to_string(p) + " ";
    INFO(nranks << " ranks pinned to CPUs " << pinsText << ", " << c.count << " floats");
    const auto outcomes = runPinned(c.pins, inputs);
    checkSums(outcomes, inputs);
    for (size_t r = 0; r < nranks; ++r) {
      INFO("rank " << r);
      CHECK(outcomes[r].allReduceAlgorithm == c.allReduce);
      CHECK(outcomes[r].smallAllGatherAlgorithm == c.allGather);
    }
  }
}
