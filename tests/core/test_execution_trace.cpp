// TOPOCCL_TRACE_FILE: each rank writes, when its communicator goes, a Chrome trace of every call and every step of
// every lane that ran. Thread ranks (3: not a power of two) run ring all-reduces, binomial broadcasts and a ring of
// point-to-point exchanges on fresh random data; the test reads the files back with nlohmann-json and checks them
// against what the ring and the tree must do, and the results against a double-precision reference.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "common/config.hpp"
#include "core/communicator.hpp"
#include "core/execution_trace.hpp"

using namespace topoccl;
using nlohmann::json;

namespace {

constexpr int kRanks = 3;
constexpr int kAllReduces = 4;
constexpr int kBroadcasts = 3;
constexpr size_t kCount = 3 * 4099;  // a prime times the ranks

struct Overrides {
  Overrides(std::initializer_list<std::pair<std::string, std::string>> settings) {
    for (const auto& [name, value] : settings) config::setOverride(name, value);
  }
  ~Overrides() { config::clearOverrides(); }
};

// Runs the calls on thread ranks and returns each rank's all-reduce output and broadcast and receive buffers.
struct RankData {
  std::vector<float> reduced, broadcast, received;
  std::string error;
};

std::vector<RankData> runCalls(const std::vector<std::vector<float>>& inputs, const std::vector<float>& rootData) {
  const bootstrap::UniqueId id = bootstrap::createUniqueId();
  std::vector<RankData> data(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      RankData& out = data[static_cast<size_t>(r)];
      try {
        auto comm = core::Communicator::create(id, kRanks, r, core::CommOptions{});
        out.reduced.assign(kCount, -1.0f);
        out.broadcast.assign(kCount, -1.0f);
        out.received.assign(kCount, -1.0f);
        core::CollectiveArgs reduce;
        reduce.collective = algo::Collective::AllReduce;
        reduce.count = kCount;
        reduce.type = DataType::Float32;
        reduce.send = inputs[static_cast<size_t>(r)].data();
        reduce.recv = out.reduced.data();
        for (int i = 0; i < kAllReduces; ++i) comm->runBlocking({reduce})->wait();
        core::CollectiveArgs broadcast = reduce;
        broadcast.collective = algo::Collective::Broadcast;
        broadcast.root = 1;
        broadcast.send = r == 1 ? rootData.data() : nullptr;
        broadcast.recv = out.broadcast.data();
        for (int i = 0; i < kBroadcasts; ++i) comm->runBlocking({broadcast})->wait();
        core::PointToPointArgs send{true, inputs[static_cast<size_t>(r)].data(), nullptr, kCount, DataType::Float32, (r + 1) % kRanks};
        core::PointToPointArgs recv{false, nullptr, out.received.data(), kCount, DataType::Float32, (r + kRanks - 1) % kRanks};
        auto work = comm->runBlocking({send, recv});
        work->wait();
        if (work->result() != ncclSuccess) out.error = work->errorMessage();
        comm->finalize();
      } catch (const std::exception& e) {
        out.error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return data;
}

json readTrace(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  return json::parse(in);
}

}  // namespace

TEST_CASE("TOPOCCL_TRACE_FILE writes every call and every step each rank ran, inside its call") {
  const auto dir = std::filesystem::temp_directory_path() / ("topoccl-trace-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const uint64_t seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  INFO("seed " << seed);
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::vector<std::vector<float>> inputs(kRanks, std::vector<float>(kCount));
  for (auto& rank : inputs)
    for (float& v : rank) v = value(random);
  std::vector<float> rootData(kCount);
  for (float& v : rootData) v = value(random);

  std::vector<RankData> data;
  {
    Overrides settings{{"TOPOCCL_TRACE_FILE", (dir / "rank-%r.json").string()}, {"NCCL_ALGO", "allreduce:ring;broadcast:tree"}};
    data = runCalls(inputs, rootData);
  }
  for (int r = 0; r < kRanks; ++r) {
    const RankData& out = data[static_cast<size_t>(r)];
    INFO("rank " << r << ": " << out.error);
    REQUIRE(out.error.empty());
    for (size_t i = 0; i < kCount; ++i) {  // tracing changes nothing the ranks compute
      double expected = 0;
      for (int q = 0; q < kRanks; ++q) expected += inputs[static_cast<size_t>(q)][i];
      REQUIRE(std::fabs(out.reduced[i] - expected) <= 1e-5 * (1.0 + std::fabs(expected)) * kRanks);
      REQUIRE(out.broadcast[i] == rootData[i]);
      REQUIRE(out.received[i] == inputs[static_cast<size_t>((r + kRanks - 1) % kRanks)][i]);
    }
  }

  const double whole = static_cast<double>(kCount * sizeof(float));
  std::vector<double> ringSent(kAllReduces, 0.0), ringReceived(kAllReduces, 0.0);  // over all ranks
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r);
    const json trace = readTrace((dir / ("rank-" + std::to_string(r) + ".json")).string());
    CHECK(trace["otherData"]["rank"] == r);
    CHECK(trace["otherData"]["nranks"] == kRanks);
    CHECK(trace["otherData"]["dropped"] == 0);
    std::vector<json> calls, steps;
    for (const json& e : trace["traceEvents"]) {
      if (e["ph"] != "X") continue;
      CHECK(e["pid"] == r);
      CHECK(e["dur"].get<double>() >= 0.0);
      (e["cat"] == "call" ? calls : steps).push_back(e);
    }
    REQUIRE(calls.size() == static_cast<size_t>(kAllReduces + kBroadcasts + 1));
    std::sort(calls.begin(), calls.end(), [](const json& a, const json& b) { return a["args"]["call"] < b["args"]["call"]; });
    for (size_t c = 0; c < calls.size(); ++c) {
      const std::string name = calls[c]["name"];
      INFO("call " << c << ": " << name);
      CHECK(calls[c]["args"]["call"] == c);
      CHECK(name.rfind(c < kAllReduces ? "allreduce (ring" : c < kAllReduces + kBroadcasts ? "broadcast (tree" : "send/recv", 0) == 0);
      if (c > 0) CHECK(calls[c]["ts"].get<double>() >= calls[c - 1]["ts"].get<double>() + calls[c - 1]["dur"].get<double>() - 0.001);
      // Every step of the call lies inside it; what the steps moved is what the algorithm must move.
      double sentBytes = 0, receivedBytes = 0;
      size_t stepCount = 0;
      for (const json& s : steps) {
        if (s["args"]["call"] != c) continue;
        ++stepCount;
        CHECK(s["args"]["operation"] == name);
        CHECK(s["ts"].get<double>() >= calls[c]["ts"].get<double>() - 0.001);
        CHECK(s["ts"].get<double>() + s["dur"].get<double>() <= calls[c]["ts"].get<double>() + calls[c]["dur"].get<double>() + 0.001);
        const std::string kind = s["args"]["kind"];
        const double bytes = s["args"]["bytes"].get<double>();
        if (kind == "r" || kind == "rrs" || kind == "rrc" || kind == "rcs" || kind == "rrcs") {  // its wait, within it
          REQUIRE(s["args"].contains("waited_us"));
          CHECK(s["args"]["waited_us"].get<double>() >= 0.0);
          CHECK(s["args"]["waited_us"].get<double>() <= s["dur"].get<double>() + 0.001);
        } else {
          CHECK_FALSE(s["args"].contains("waited_us"));
        }
        if (kind == "s" || kind == "rrs" || kind == "rcs" || kind == "rrcs") sentBytes += bytes;
        if (kind == "r" || kind == "rrs" || kind == "rrc" || kind == "rcs" || kind == "rrcs") receivedBytes += bytes;
        const std::string stepName = s["name"];
        if (stepName.find(" to ") != std::string::npos)
          CHECK(stepName.find(" to " + std::to_string(r) + " ") == std::string::npos);  // never to itself
      }
      CHECK(stepCount > 0);
      if (c < kAllReduces) {
        // A ring all-reduce moves each of its n chunks n - 1 times in each half: about 2 (n - 1) / n of the buffer
        // per rank (chunks differ by the 16-byte alignment of their edges), exactly 2 (n - 1) of it over all ranks.
        CHECK(std::fabs(sentBytes - 2.0 * (kRanks - 1) * whole / kRanks) <= 2.0 * (kRanks - 1) * 16);
        ringSent[c] += sentBytes;
        ringReceived[c] += receivedBytes;
      } else if (c < kAllReduces + kBroadcasts) {
        // The binomial tree from rank 1 on 3 ranks: 1 sends to 0 and 2, which receive once each and send nothing.
        CHECK(sentBytes == (r == 1 ? 2 * whole : 0.0));
        CHECK(receivedBytes == (r == 1 ? 0.0 : whole));
      } else {
        CHECK(sentBytes == whole);
        CHECK(receivedBytes == whole);
      }
    }
  }

  for (int c = 0; c < kAllReduces; ++c) {
    CHECK(ringSent[static_cast<size_t>(c)] == 2.0 * (kRanks - 1) * whole);
    CHECK(ringReceived[static_cast<size_t>(c)] == 2.0 * (kRanks - 1) * whole);
  }

  // A trace that outgrows TOPOCCL_TRACE_SPANS keeps the first spans and counts the rest.
  const json full = readTrace((dir / "rank-0.json").string());
  const uint64_t total = full["otherData"]["spans"];
  {
    Overrides settings{{"TOPOCCL_TRACE_FILE", (dir / "small-%r.json").string()}, {"TOPOCCL_TRACE_SPANS", "5"},
                       {"NCCL_ALGO", "allreduce:ring;broadcast:tree"}};
    data = runCalls(inputs, rootData);
  }
  REQUIRE(data[0].error.empty());
  const json small = readTrace((dir / "small-0.json").string());
  CHECK(small["otherData"]["spans"] == 5);
  CHECK(small["otherData"]["dropped"] == total - 5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("TOPOCCL_TRACE_SPANS below 1 is refused by name, an unwritable trace path is a warning, not a failure") {
  {
    Overrides settings{{"TOPOCCL_TRACE_FILE", "/tmp/unused-%r.json"}, {"TOPOCCL_TRACE_SPANS", "0"}};
    const bootstrap::UniqueId id = bootstrap::createUniqueId();
    REQUIRE_THROWS_WITH(core::Communicator::create(id, 1, 0, core::CommOptions{}), Catch::Contains("TOPOCCL_TRACE_SPANS=0"));
  }
  core::ExecutionTrace trace(0, 1, 0xabcdefull, 4);
  trace.callDone(trace.callBegin("allreduce (ring, 1 x float)"));
  REQUIRE_THROWS_WITH(trace.write("/nonexistent-dir/trace-%r-%c.json"), Catch::Contains("/nonexistent-dir/trace-0-0000000000abcdef.json"));
  {
    Overrides settings{{"TOPOCCL_TRACE_FILE", "/nonexistent-dir/trace-%r.json"}};
    const bootstrap::UniqueId id = bootstrap::createUniqueId();
    auto comm = core::Communicator::create(id, 1, 0, core::CommOptions{});
    comm.reset();  // the destructor warns and returns
  }
}
