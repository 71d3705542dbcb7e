// MSCCL_XML_FILES: plans from outside (the synthesizer's, TACCL's) run in the real executor with the
// right number of ranks (threads of this process), and their results match a reference computed
// independently in double precision from fresh random inputs.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/msccl_xml.hpp"
#include "algorithms/synthesizer/synthesizer.hpp"
#include "bootstrap/bootstrap.hpp"
#include "core/communicator.hpp"
#include "topology/cluster.hpp"
#include "topology/loaders.hpp"

using namespace topoccl;

namespace {

std::string dataFile(const std::string& name) {
  std::string here = __FILE__;
  return here.substr(0, here.rfind('/')) + "/../data/" + name;
}

// Sets an environment variable for the scope (ranks are threads: they read the process's environment).
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) { setenv(name.c_str(), value.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

std::string writeTemp(const std::string& stem, const std::string& text) {
  const std::string path = "/tmp/topoccl-plan-" + std::to_string(getpid()) + "-" + stem + ".xml";
  std::ofstream(path) << text;
  return path;
}

uint64_t freshSeed() {
  const uint64_t seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  std::printf("plan files: seed %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

struct Outcome {
  std::string chosen;  // what the communicator said it would run
  std::string error;
  std::vector<float> output;
};

// Runs `collective` on `nranks` thread ranks with per-rank `count` floats (NCCL's count for the collective),
// in place or not; input of rank r element i is inputs[r][i].
std::vector<Outcome> runCollective(algo::Collective collective, int nranks, size_t count, bool inPlace,
                                   const std::vector<std::vector<float>>& inputs) {
  const bootstrap::UniqueId id = bootstrap::createUniqueId();
  std::vector<Outcome> outcomes(nranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = core::Communicator::create(id, nranks, r, core::CommOptions{});
        const size_t inCount = collective == algo::Collective::ReduceScatter ? count * nranks : count;
        const size_t outCount = collective == algo::Collective::AllGather ? count * nranks : count;
        const size_t bytes = (collective == algo::Collective::AllReduce ? count : count * nranks) * sizeof(float);
        outcomes[r].chosen = comm->chosenAlgorithm(collective, bytes, inPlace);
        std::vector<float> send(inputs[r].begin(), inputs[r].begin() + static_cast<long>(inCount));
        std::vector<float> recv(std::max(inCount, outCount), -1.0f);
        core::CollectiveArgs args;
        args.collective = collective;
        args.count = count;
        args.type = DataType::Float32;
        if (inPlace) {
          // NCCL's in-place layout: all-gather input = output block r; reduce-scatter output = input block r.
          if (collective == algo::Collective::AllGather) {
            std::copy(send.begin(), send.end(), recv.begin() + static_cast<long>(r * count));
            args.send = recv.data() + r * count;
          } else {
            std::copy(send.begin(), send.end(), recv.begin());
            args.send = recv.data();
          }
          args.recv = collective == algo::Collective::ReduceScatter ? recv.data() + r * count : recv.data();
        } else {
          args.send = send.data();
          args.recv = recv.data();
        }
        auto work = comm->runBlocking({args});
        work->wait();
        if (work->result() != ncclSuccess) outcomes[r].error = work->errorMessage();
        const float* result = static_cast<const float*>(args.recv);
        outcomes[r].output.assign(result, result + outCount);
        comm->finalize();
      } catch (const std::exception& e) {
        outcomes[r].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return outcomes;
}

// Checks every rank's output against the double-precision reference; returns the mismatches.
int checkOutcomes(algo::Collective collective, int nranks, size_t count, const std::vector<std::vector<float>>& inputs,
                  const std::vector<Outcome>& outcomes) {
  int bad = 0;
  for (int r = 0; r < nranks; ++r) {
    if (!outcomes[r].error.empty()) {
      UNSCOPED_INFO("rank " << r << ": " << outcomes[r].error);
      ++bad;
      continue;
    }
    const std::vector<float>& out = outcomes[r].output;
    for (size_t i = 0; i < out.size(); ++i) {
      double expected = 0;
      if (collective == algo::Collective::AllGather) {
        expected = inputs[i / count][i % count];
      } else {
        const size_t at = collective == algo::Collective::ReduceScatter ? r * count + i : i;
        for (int p = 0; p < nranks; ++p) expected += inputs[p][at];
      }
      if (std::fabs(out[i] - expected) > 1e-5 * (1 + std::fabs(expected))) {
        if (bad < 5) UNSCOPED_INFO("rank " << r << " element " << i << ": " << out[i] << " expected " << expected);
        ++bad;
      }
    }
  }
  return bad;
}

std::vector<std::vector<float>> randomInputs(int nranks, size_t perRank, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::vector<float>> inputs(nranks, std::vector<float>(perRank));
  for (auto& v : inputs)
    for (float& x : v) x = value(rng);
  return inputs;
}

}  // namespace

TEST_CASE("plan files: synthesized DGX-1 and 2-node plans run in the executor and give the right results",
          "[plan-files]") {
  std::mt19937_64 rng(freshSeed());
  struct Machine {
    std::string name;
    topo::Topology topology;
  };
  std::vector<Machine> machines;
  machines.push_back({"dgx1", topo::loadPreset("dgx1")});
  machines.push_back({"ndv2x2", topo::buildCluster(topo::loadPreset("ndv2"), topo::ClusterSpec{.hosts = 2})});
  for (const Machine& m : machines) {
    const int nranks = m.topology.count(topo::VertexKind::Gpu);
    for (algo::Collective c : {algo::Collective::AllGather, algo::Collective::ReduceScatter, algo::Collective::AllReduce}) {
      // 1 MiB of nccl-tests size: bandwidth-bound trees with several chunks per rank.
      const uint64_t planBytes = 1 << 20;
      algo::synth::SynthResult synthesized =
          algo::synth::synthesize(m.topology, algo::synth::defaultRankDevices(m.topology), c, planBytes);
      synthesized.plan.name = "synth-" + m.name + "-" + algo::collectiveName(c);
      const std::string path = writeTemp(m.name + "-" + algo::collectiveName(c), algo::writeMscclXml(synthesized.plan));
      ScopedEnv files("MSCCL_XML_FILES", path);
      // Counts that do not divide by the chunks: a prime and an unaligned one.
      for (size_t count : {size_t{1021}, size_t{4099}}) {
        for (bool inPlace : {false, true}) {
          if (inPlace && !synthesized.plan.inPlace && !synthesized.plan.outOfPlace) continue;
          INFO(m.name << " " << algo::collectiveName(c) << " count " << count << (inPlace ? " in place" : " out of place")
                      << " plan " << synthesized.strategy);
          const auto inputs = randomInputs(nranks, count * nranks, rng);
          const auto outcomes = runCollective(c, nranks, count, inPlace, inputs);
          CHECK(checkOutcomes(c, nranks, count, inputs, outcomes) == 0);
          for (const Outcome& o : outcomes) CHECK(o.chosen == synthesized.plan.name);
        }
      }
      std::remove(path.c_str());
    }
  }
}

TEST_CASE("plan files: published TACCL all-gather plans run in place, plans for other rank counts are skipped",
          "[plan-files]") {
  std::mt19937_64 rng(freshSeed());
  const std::string two = dataFile("msccl/taccl_allgather.A.n1.gpu2.i3.xml");
  const std::string four = dataFile("msccl/taccl_allgather.A.n1.gpu4.i3.xml");
  ScopedEnv files("MSCCL_XML_FILES", two + ":" + four);
  for (int nranks : {2, 4}) {
    const algo::Plan plan = algo::loadMscclXml(nranks == 2 ? two : four);
    for (size_t count : {size_t{3}, size_t{997}, size_t{12288}}) {
      const uint64_t bytes = count * nranks * sizeof(float);
      if (bytes < plan.minBytes || bytes >= plan.maxBytes) continue;
      INFO(nranks << " ranks, count " << count);
      const auto inputs = randomInputs(nranks, count, rng);
      const auto outcomes = runCollective(algo::Collective::AllGather, nranks, count, true, inputs);
      CHECK(checkOutcomes(algo::Collective::AllGather, nranks, count, inputs, outcomes) == 0);
      for (const Outcome& o : outcomes) CHECK(o.chosen == plan.name);
    }
  }
  // Three ranks: neither file applies, the built-in table decides and the result is still right.
  const auto inputs = randomInputs(3, 101, rng);
  const auto outcomes = runCollective(algo::Collective::AllGather, 3, 101, true, inputs);
  CHECK(checkOutcomes(algo::Collective::AllGather, 3, 101, inputs, outcomes) == 0);
  for (const Outcome& o : outcomes) {
    CHECK(o.chosen != algo::loadMscclXml(two).name);
    CHECK(o.chosen != algo::loadMscclXml(four).name);
  }
}

TEST_CASE("plan files: a file that is missing or malformed fails communicator creation with its name",
          "[plan-files]") {
  const std::string bad = writeTemp("malformed", "<algo name=\"x\" proto=\"Simple\" nchannels=\"1\">\n<gpu id=\"0\">\n");
  for (const std::string& path : {bad, std::string("/nonexistent/plan.xml")}) {
    ScopedEnv files("MSCCL_XML_FILES", path);
    const std::vector<std::vector<float>> inputs(2, std::vector<float>(4, 1.0f));
    const auto outcomes = runCollective(algo::Collective::AllGather, 2, 4, false, inputs);
    for (const Outcome& o : outcomes) CHECK_THAT(o.error, Catch::Contains(path));
  }
  std::remove(bad.c_str());
}

TEST_CASE("TOPOCCL_SYNTHESIZE: rank 0 synthesizes on the live cluster graph, every rank runs the same plans",
          "[plan-files]") {
  std::mt19937_64 rng(freshSeed());
  ScopedEnv cache("TOPOCCL_PLAN_CACHE_DIR", "off");
  ScopedEnv budget("TOPOCCL_SYNTH_BUDGET_MS", "300");
  ScopedEnv synth("TOPOCCL_SYNTHESIZE", "allgather,reducescatter,allreduce");
  for (int nranks : {3, 5}) {
    for (algo::Collective c : {algo::Collective::AllGather, algo::Collective::ReduceScatter, algo::Collective::AllReduce}) {
      // Counts landing in the small and the middle size band; a prime and an unaligned one.
      for (size_t count : {size_t{13}, size_t{40009}}) {
        for (bool inPlace : {false, true}) {
          INFO(nranks << " ranks " << algo::collectiveName(c) << " count " << count << (inPlace ? " in place" : ""));
          const auto inputs = randomInputs(nranks, count * nranks, rng);
          const auto outcomes = runCollective(c, nranks, count, inPlace, inputs);
          CHECK(checkOutcomes(c, nranks, count, inputs, outcomes) == 0);
          for (const Outcome& o : outcomes) {
            CHECK(o.chosen.rfind("synth/", 0) == 0);
            CHECK(o.chosen == outcomes[0].chosen);
          }
        }
      }
    }
  }
  // A collective the synthesizer does not know is an error at creation that names the variable.
  ScopedEnv bad("TOPOCCL_SYNTHESIZE", "allgather,broadcastt");
  const auto outcomes = runCollective(algo::Collective::AllGather, 2, 8, false, randomInputs(2, 16, rng));
  for (const Outcome& o : outcomes) {
    CHECK(o.error.find("TOPOCCL_SYNTHESIZE") != std::string::npos);
    CHECK(o.error.find("broadcastt") != std::string::npos);
  }
}
