// Out-of-place calls run the out-of-place variant of a built-in plan, which copies straight into the
// output; in-place calls keep staging through scratch (the peer may still be reading the block being
// replaced). Checked through the scratch the communicator reserved, with results checked against the
// definition (fresh random inputs), on thread ranks, for every built-in plan that stages.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "core/communicator.hpp"

using namespace topoccl;

namespace {

struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) { setenv(name.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

struct RankResult {
  size_t scratch = 0;
  std::vector<double> output;
  std::string error;
};

// All-to-all or all-reduce of `count` floats per block on `nranks` thread ranks; input element i of rank r
// is inputs[r][i]. Returns each rank's output and the scratch its communicator reserved.
std::vector<RankResult> run(algo::Collective collective, int nranks, size_t count, bool inPlace,
                            const std::vector<std::vector<float>>& inputs) {
  const bootstrap::UniqueId id = bootstrap::createUniqueId();
  std::vector<RankResult> results(static_cast<size_t>(nranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&, r] {
      RankResult& out = results[static_cast<size_t>(r)];
      try {
        auto comm = core::Communicator::create(id, nranks, r, core::CommOptions{});
        std::vector<float> send = inputs[static_cast<size_t>(r)];
        std::vector<float> recv(send.size(), -1.0f);
        core::CollectiveArgs args;
        args.collective = collective;
        args.count = count;
        args.type = DataType::Float32;
        args.send = inPlace ? recv.data() : send.data();
        args.recv = recv.data();
        if (inPlace) recv = send;
        auto work = comm->runBlocking({args});
        work->wait();
        if (work->result() != ncclSuccess) out.error = work->errorMessage();
        out.output.assign(recv.begin(), recv.end());
        out.scratch = comm->hostMemory().scratch;
        comm->finalize();
      } catch (const std::exception& e) {
        out.error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return results;
}

std::vector<std::vector<float>> randomInputs(int nranks, size_t elements, std::mt19937_64& random) {
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::vector<std::vector<float>> inputs(static_cast<size_t>(nranks), std::vector<float>(elements));
  for (auto& rank : inputs)
    for (float& v : rank) v = value(random);
  return inputs;
}

}  // namespace

TEST_CASE("out-of-place all-to-all copies straight into the output, in place it stages through scratch") {
  const uint64_t seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 random(seed);
  for (int nranks : {2, 3}) {
    for (size_t count : {size_t{1}, size_t{4099}}) {
      const auto inputs = randomInputs(nranks, count * static_cast<size_t>(nranks), random);
      for (bool inPlace : {false, true}) {
        INFO(nranks << " ranks, " << count << " floats a block, " << (inPlace ? "in place" : "out of place"));
        const auto results = run(algo::Collective::AllToAll, nranks, count, inPlace, inputs);
        for (int r = 0; r < nranks; ++r) {
          const RankResult& got = results[static_cast<size_t>(r)];
          INFO("rank " << r << ": " << got.error);
          REQUIRE(got.error.empty());
          // Block q of rank r's output is block r of rank q's input.
          for (int q = 0; q < nranks; ++q)
            for (size_t i = 0; i < count; ++i)
              REQUIRE(got.output[q * count + i] == inputs[static_cast<size_t>(q)][r * count + i]);
          if (inPlace) CHECK(got.scratch > 0);
          else CHECK(got.scratch == 0);
        }
      }
    }
  }
}

TEST_CASE("out-of-place recursive-doubling all-reduce on 2 ranks reduces into the output, not into scratch") {
  const uint64_t seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 random(seed);
  // Recursive doubling stages only where both partners read their input in the last round: 2 ranks.
  ScopedEnv choose("NCCL_ALGO", "allreduce:rd");
  const int nranks = 2;
  for (int repeat = 0; repeat < 2; ++repeat) {
    const size_t count = 1031;
    const auto inputs = randomInputs(nranks, count, random);
    std::vector<double> sum(count, 0.0);
    for (const auto& rank : inputs)
      for (size_t i = 0; i < count; ++i) sum[i] += rank[i];
    for (bool inPlace : {false, true}) {
      INFO((inPlace ? "in place" : "out of place"));
      const auto results = run(algo::Collective::AllReduce, nranks, count, inPlace, inputs);
      for (int r = 0; r < nranks; ++r) {
        const RankResult& got = results[static_cast<size_t>(r)];
        INFO("rank " << r << ": " << got.error);
        REQUIRE(got.error.empty());
        for (size_t i = 0; i < count; ++i) REQUIRE(std::abs(got.output[i] - sum[i]) <= 1e-5 * (1 + std::abs(sum[i])));
        if (inPlace) CHECK(got.scratch > 0);
        else CHECK(got.scratch == 0);
      }
    }
  }
}
