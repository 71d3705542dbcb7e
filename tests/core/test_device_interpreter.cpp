// The GPU executor's lane loop (kernels/plan_interpreter.hpp), compiled for the host and run the way the CUDA
// kernel runs it: every lane of every rank is a "thread block" of std::threads (workers) with a barrier for
// __syncthreads, connections are FIFOs in plain memory, and plans are lowered by core/device_lowering.hpp
// exactly as for the GPU. Every built-in algorithm x collective on 2-5 ranks, both protocols, 1 and 3 workers
// per lane, in and out of place, sizes 0 / 1 / primes / many slices, several types and all four operators;
// outputs against the collective's definition computed independently in double. Plans run several times
// over the same FIFOs (counters persist, protocols alternate), and a rank whose peer never launches stops
// on abort instead of hanging.
#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "algorithms/generators.hpp"
#include "common/error.hpp"
#include "core/device_lowering.hpp"
#include "kernels/plan_interpreter.hpp"
#include "kernels/reference.hpp"
#include "support/collective_definition.hpp"

using namespace topoccl;
using namespace topoccl::kernels;
using namespace topoccl::kernels::test;

namespace {

// A lane's workers: a barrier stands in for __syncthreads, and its completion step ORs the workers' votes
// for syncAny (__syncthreads_or).
class HostBlockGroup {
 public:
  explicit HostBlockGroup(size_t workers) : barrier_(static_cast<std::ptrdiff_t>(workers), Completion{this}) {}
  bool syncAny(bool mine) {
    if (mine) any_.store(true, std::memory_order_relaxed);
    barrier_.arrive_and_wait();
    return result_;  // written by the completion, before anyone leaves; rewritten only after all arrive again
  }

 private:
  struct Completion {
    HostBlockGroup* group;
    void operator()() noexcept { group->result_ = group->any_.exchange(false, std::memory_order_relaxed); }
  };
  std::atomic<bool> any_{false};
  bool result_ = false;
  std::barrier<Completion> barrier_;
};

struct HostBlock {
  HostBlockGroup* group;
  size_t index;
  size_t count;
  size_t worker() const { return index; }
  size_t workers() const { return count; }
  void sync() { group->syncAny(false); }
  bool syncAny(bool mine) { return group->syncAny(mine); }
  void pause(uint64_t spins) {
    if (spins > 4) std::this_thread::yield();  // 2 cores, dozens of workers: let the producer run
  }
};

using LaneFn = bool (*)(const DevicePlan&, uint32_t, HostBlock&);

template <class T, template <class> class Op>
bool runLaneTyped(const DevicePlan& plan, uint32_t lane, HostBlock& block) {
  return LaneInterpreter<T, Op<T>, HostBlock>(plan, lane, block).run();
}

struct LaneTableMaker {
  template <class T>
  static constexpr std::array<LaneFn, kNumKernelOps> entry() {
    return {&runLaneTyped<T, SumOp>, &runLaneTyped<T, ProdOp>, &runLaneTyped<T, MaxOp>, &runLaneTyped<T, MinOp>};
  }
};
constexpr auto kLaneTable = makeTypeTable<LaneTableMaker>();

// The receiving FIFO of every connection, created while lowering (one thread) and then only read.
class HostFabric {
 public:
  explicit HostFabric(DeviceFifoGeometry geometry) : geometry_(geometry) {}
  const DeviceFifoGeometry& geometry() const { return geometry_; }

  DeviceFifo fifo(int sender, int receiver, int channel) {
    auto& f = fifos_[{sender, receiver, channel}];
    if (!f) {
      f = std::make_unique<Fifo>();
      f->counters = std::make_unique<DeviceFifoCounters>();
      std::memset(f->counters.get(), 0, sizeof(DeviceFifoCounters));
      f->slots.assign(geometry_.simpleBytes() / sizeof(Pack16), Pack16{});
      f->lines.assign(geometry_.lowLatencyBytes() / sizeof(uint64_t), 0);
    }
    return {f->counters.get(), reinterpret_cast<char*>(f->slots.data()), f->lines.data(), geometry_.slotCount};
  }

 private:
  struct Fifo {
    std::unique_ptr<DeviceFifoCounters> counters;
    std::vector<Pack16> slots;
    std::vector<uint64_t> lines;
  };
  DeviceFifoGeometry geometry_;
  std::map<std::tuple<int, int, int>, std::unique_ptr<Fifo>> fifos_;
};

// One rank's memory for a call: input and output (overlapping as NCCL's in-place layout), scratch, and the
// persistent per-communicator state the kernel keeps (lane completion counters, status).
struct RankState {
  std::vector<Pack16> store;   // input and output, at a 16-misaligned but element-aligned offset
  std::vector<Pack16> outputStore;
  std::vector<Pack16> scratch;
  unsigned char* input = nullptr;
  unsigned char* output = nullptr;
  size_t inputElements = 0;
  size_t outputElements = 0;
  std::vector<uint64_t> laneDone = std::vector<uint64_t>(64, 0);
  uint64_t status = kPlanRunning;
  std::vector<Pack16> image;
  DevicePlan plan;
  std::vector<unsigned char> originalInput;
};

unsigned char* bytesOf(std::vector<Pack16>& v) { return reinterpret_cast<unsigned char*>(v.data()); }

// Small integers, so every sum and product is exact in every type and in any order.
double drawValue(const ReferenceType& ref, ReduceOp op, TestRng& rng) {
  const bool isUnsigned = ref.isInteger() && !ref.isSigned();
  if (op == ReduceOp::Prod) {
    static constexpr double kFactors[] = {-2, -1, 1, 2};
    const double f = kFactors[rng() % 4];
    return isUnsigned ? std::abs(f) : f;
  }
  const int64_t span = op == ReduceOp::Sum ? 3 : 12;
  const int64_t v = static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * span + 1)) - span;
  return isUnsigned ? static_cast<double>(v + span) : static_cast<double>(v);
}

uint64_t encode(const ReferenceType& ref, double v) {
  return ref.isInteger() ? ref.wrap(static_cast<Uint128>(static_cast<Int128>(v))) : ref.round(v);
}
double decode(const ReferenceType& ref, uint64_t bits) {
  return ref.isInteger() ? static_cast<double>(ref.integer(bits)) : ref.value(bits);
}

double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::Sum: return a + b;
    case ReduceOp::Prod: return a * b;
    case ReduceOp::Max: return std::max(a, b);
    case ReduceOp::Min: return std::min(a, b);
    default: return 0;
  }
}

struct Case {
  const algo::Plan* plan;
  DataType type = DataType::Float32;
  ReduceOp op = ReduceOp::Sum;
  size_t count = 0;
  bool inPlace = false;
  size_t workers = 1;
  std::optional<ReduceOp> laneOp;  // what the lanes run, when not `op` (to prove the check can fail)
};

class Harness {
 public:
  Harness(const Case& c, DeviceFifoGeometry geometry, uint64_t seed)
      : c_(c), ref_(c.type), fabric_(geometry), rng_(seed), ranks_(static_cast<size_t>(c.plan->nranks)) {}

  // Fresh inputs, lower every rank's program, run every lane on its own workers, check. Empty on success.
  std::string launch(DeviceProtocol protocol, const std::vector<bool>& launched = {}, const uint64_t* abortFlag = nullptr) {
    const algo::Plan& plan = *c_.plan;
    const int n = plan.nranks;
    const size_t elem = ref_.size();
    ++launches_;
    for (int r = 0; r < n; ++r) {
      RankState& s = ranks_[static_cast<size_t>(r)];
      allocate(r, s);
      for (size_t e = 0; e < s.inputElements; ++e) ref_.setBits(s.input, e, encode(ref_, drawValue(ref_, c_.op, rng_)));
      s.originalInput.assign(s.input, s.input + s.inputElements * elem);
      const core::PlanBuffers buffers{reinterpret_cast<const char*>(s.input), reinterpret_cast<char*>(s.output),
                                      s.scratch.empty() ? nullptr : reinterpret_cast<char*>(bytesOf(s.scratch)), c_.count, elem};
      const core::LoweredPlan lowered = core::lowerPlan(
          plan, r, buffers,
          [&](int peer, int channel, bool sending) {
            return sending ? fabric_.fifo(r, peer, channel) : fabric_.fifo(peer, r, channel);
          },
          protocol, fabric_.geometry());
      REQUIRE(lowered.lanes.size() <= s.laneDone.size());
      DevicePlan header;
      header.protocol = protocol;
      header.geometry = fabric_.geometry();
      header.laneDone = s.laneDone.data();
      header.launchBase = launches_ << 32;
      header.abortFlag = abortFlag;
      header.status = &s.status;
      s.image.assign((core::deviceImageBytes(lowered) + sizeof(Pack16) - 1) / sizeof(Pack16), Pack16{});
      s.plan = core::writeDeviceImage(lowered, header, s.image.data(), reinterpret_cast<uintptr_t>(s.image.data()));
    }
    const LaneFn run = kLaneTable[static_cast<size_t>(c_.type)][static_cast<size_t>(c_.laneOp.value_or(c_.op))];
    std::vector<std::unique_ptr<HostBlockGroup>> groups;
    std::vector<std::thread> threads;
    std::atomic<int> stopped{0};
    for (int r = 0; r < n; ++r) {
      if (!launched.empty() && !launched[static_cast<size_t>(r)]) continue;
      const DevicePlan* image = reinterpret_cast<const DevicePlan*>(ranks_[static_cast<size_t>(r)].image.data());
      for (uint32_t lane = 0; lane < image->laneCount; ++lane) {
        groups.push_back(std::make_unique<HostBlockGroup>(c_.workers));
        HostBlockGroup* group = groups.back().get();
        for (size_t w = 0; w < c_.workers; ++w)
          threads.emplace_back([=, this, &stopped] {
            HostBlock block{group, w, c_.workers};
            if (!run(*image, lane, block)) stopped.fetch_add(1);
          });
      }
    }
    for (auto& t : threads) t.join();
    if (stopped.load() > 0) return std::to_string(stopped.load()) + " workers stopped early";
    for (int r = 0; r < n; ++r)
      if (ranks_[static_cast<size_t>(r)].status != kPlanRunning) return "rank " + std::to_string(r) + " status is aborted";
    return check();
  }

  const RankState& rank(int r) const { return ranks_[static_cast<size_t>(r)]; }

 private:
  void allocate(int r, RankState& s) {
    const algo::Plan& plan = *c_.plan;
    const size_t elem = ref_.size();
    s.inputElements = algo::inputBlocks(plan.collective, plan.nranks, r, plan.root) * c_.count;
    s.outputElements = algo::outputBlocks(plan.collective, plan.nranks, r, plan.root) * c_.count;
    const size_t shift = elem * (1 + rng_() % 3) % 16;  // element-aligned, not 16-aligned: packs get heads and tails
    const auto sized = [&](size_t bytes) { return (bytes + shift + sizeof(Pack16) - 1) / sizeof(Pack16) + 1; };
    const algo::InPlaceAlias alias = algo::inPlaceAlias(plan.collective, plan.nranks, r, plan.root);
    if (c_.inPlace && alias.blocks > 0) {
      const size_t inOffset = alias.outputBlock >= alias.inputBlock ? (alias.outputBlock - alias.inputBlock) * c_.count : 0;
      const size_t outOffset = alias.inputBlock > alias.outputBlock ? (alias.inputBlock - alias.outputBlock) * c_.count : 0;
      s.store.assign(sized(std::max(inOffset + s.inputElements, outOffset + s.outputElements) * elem), Pack16{});
      s.input = bytesOf(s.store) + shift + inOffset * elem;
      s.output = bytesOf(s.store) + shift + outOffset * elem;
    } else {
      s.store.assign(sized(s.inputElements * elem), Pack16{});
      s.outputStore.assign(sized(s.outputElements * elem), Pack16{});
      s.input = bytesOf(s.store) + shift;
      s.output = bytesOf(s.outputStore) + shift;
    }
    // Poison the output: an element the plan never writes cannot pass by luck.
    for (size_t e = 0; e < s.outputElements; ++e)
      if (!(c_.inPlace && alias.blocks > 0)) ref_.setBits(s.output, e, encode(ref_, 77));
    s.scratch.assign((core::scratchBytes(plan, c_.count, elem) + sizeof(Pack16) - 1) / sizeof(Pack16), Pack16{});
  }

  double input(int r, size_t e) const {
    return decode(ref_, ref_.bitsAt(ranks_[static_cast<size_t>(r)].originalInput.data(), e));
  }

  double expected(int r, size_t e) const {
    const algo::Plan& plan = *c_.plan;
    return topoccl::test::collectiveOutput(
        plan.collective, plan.nranks, plan.root, c_.count, r, e, [&](int q, size_t i) { return input(q, i); },
        [&](double a, double b) { return combine(c_.op, a, b); });
  }

  std::string check() const {
    for (int r = 0; r < c_.plan->nranks; ++r) {
      const RankState& s = ranks_[static_cast<size_t>(r)];
      for (size_t e = 0; e < s.outputElements; ++e) {
        const double got = decode(ref_, ref_.bitsAt(s.output, e));
        const double want = expected(r, e);
        if (!(got == want))
          return "rank " + std::to_string(r) + " output element " + std::to_string(e) + " of " +
                 std::to_string(s.outputElements) + ": got " + std::to_string(got) + ", want " + std::to_string(want);
      }
      const bool aliased = c_.inPlace && algo::inPlaceAlias(c_.plan->collective, c_.plan->nranks, r, c_.plan->root).blocks > 0;
      if (!aliased && std::memcmp(s.originalInput.data(), s.input, s.originalInput.size()) != 0)
        return "rank " + std::to_string(r) + ": the input buffer was modified";
    }
    return {};
  }

  Case c_;
  ReferenceType ref_;
  HostFabric fabric_;
  TestRng rng_;
  std::vector<RankState> ranks_;
  uint64_t launches_ = 0;
};

// Small slots, so that even small counts cut into many rounds; exactly as many as the plan needs, so the FIFOs
// run full and wrap around.
DeviceFifoGeometry smallGeometry(const algo::Plan& plan) {
  DeviceFifoGeometry g;
  g.slotCount = std::max<uint64_t>(1, core::fifoSlotsNeeded(plan));
  g.slotBytes = 256;
  g.llWordsPerSlot = 32;  // 128 payload bytes a slice
  return g;
}

std::string describe(const Case& c, DeviceProtocol protocol) {
  return c.plan->name + " " + algo::collectiveName(c.plan->collective) + " on " + std::to_string(c.plan->nranks) +
         " ranks (root " + std::to_string(c.plan->root) + "), " + std::to_string(c.count) + " x " + dataTypeName(c.type) +
         ", op " + std::to_string(static_cast<int>(c.op)) + (c.inPlace ? ", in place" : ", out of place") + ", " +
         std::to_string(c.workers) + " workers, " + (protocol == DeviceProtocol::Simple ? "Simple" : "LowLatency");
}

std::vector<algo::Plan> builtInPlans(int nranks) {
  std::vector<algo::Plan> plans;
  const algo::Collective collectives[] = {algo::Collective::AllReduce, algo::Collective::AllGather,
                                          algo::Collective::ReduceScatter, algo::Collective::Broadcast,
                                          algo::Collective::Reduce, algo::Collective::AllToAll,
                                          algo::Collective::Gather, algo::Collective::Scatter};
  const algo::Algorithm algorithms[] = {algo::Algorithm::Ring, algo::Algorithm::RecursiveDoubling, algo::Algorithm::Tree,
                                        algo::Algorithm::Direct, algo::Algorithm::HalvingDoubling};
  for (algo::Algorithm a : algorithms)
    for (algo::Collective c : collectives) {
      if (!algo::algorithmSupports(a, c)) continue;
      const int root = nranks - 1;
      plans.push_back(algo::makePlan(a, c, nranks, root, a == algo::Algorithm::Ring ? 2 : 1));
    }
  return plans;
}

}  // namespace

TEST_CASE("device interpreter: every built-in plan on 2-5 ranks, both protocols, against the definition") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed);
  TestRng rng(seed);
  const DataType types[] = {DataType::Float32, DataType::Int8, DataType::Float16, DataType::Float64,
                            DataType::Uint8, DataType::Bfloat16, DataType::Int64, DataType::Float8e4m3};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min};
  const size_t counts[] = {0, 1, 2, 31, 257, 1031};
  int cases = 0;
  for (int nranks = 2; nranks <= 5; ++nranks) {
    for (const algo::Plan& plan : builtInPlans(nranks)) {
      for (int variant = 0; variant < 4; ++variant) {
        Case c;
        c.plan = &plan;
        c.type = types[rng() % std::size(types)];
        c.op = ops[rng() % std::size(ops)];
        c.count = variant == 0 ? counts[rng() % 3] : counts[3 + rng() % 3] + rng() % 5;
        c.inPlace = (variant & 1) != 0 && plan.inPlace;
        if (!c.inPlace && !plan.outOfPlace) c.inPlace = true;
        c.workers = variant >= 2 ? 3 : 1;
        Harness h(c, smallGeometry(plan), rng());
        // Twice per protocol over the same FIFOs: counters and flags carry over from launch to launch.
        for (DeviceProtocol p : {DeviceProtocol::Simple, DeviceProtocol::LowLatency, DeviceProtocol::LowLatency,
                                 DeviceProtocol::Simple}) {
          INFO(describe(c, p));
          REQUIRE(h.launch(p) == "");
          ++cases;
        }
      }
    }
  }
  CHECK(cases > 400);
}

TEST_CASE("device interpreter: hierarchical all-reduce over 2 hosts x 2 ranks, 2 channels") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed);
  TestRng rng(seed);
  const algo::Plan plan = algo::hierarchicalPlan(algo::Collective::AllReduce, {0, 0, 1, 1}, 2);
  for (DeviceProtocol p : {DeviceProtocol::Simple, DeviceProtocol::LowLatency}) {
    Case c;
    c.plan = &plan;
    c.type = DataType::Float32;
    c.op = ReduceOp::Sum;
    c.count = 4099;
    c.workers = 2;
    Harness h(c, smallGeometry(plan), rng());
    INFO(describe(c, p));
    REQUIRE(h.launch(p) == "");
  }
}

TEST_CASE("device interpreter: lanes that reduce with the wrong operator fail the check") {
  TestRng rng(testSeed());
  const algo::Plan plan = algo::makePlan(algo::Algorithm::Ring, algo::Collective::AllReduce, 3, 0, 1);
  for (DeviceProtocol p : {DeviceProtocol::Simple, DeviceProtocol::LowLatency}) {
    Case c;
    c.plan = &plan;
    c.type = DataType::Int32;
    c.op = ReduceOp::Sum;
    c.laneOp = ReduceOp::Max;  // the definition says Sum; the lanes compute Max
    c.count = 300;
    Harness h(c, smallGeometry(plan), rng());
    CHECK(h.launch(p).find("output element") != std::string::npos);
  }
}

TEST_CASE("device interpreter: a rank whose peer never launches stops on abort, within a bounded time") {
  TestRng rng(testSeed());
  const algo::Plan plan = algo::makePlan(algo::Algorithm::Ring, algo::Collective::AllReduce, 3, 0, 2);
  for (DeviceProtocol p : {DeviceProtocol::Simple, DeviceProtocol::LowLatency}) {
    Case c;
    c.plan = &plan;
    c.type = DataType::Float32;
    c.op = ReduceOp::Sum;
    c.count = 5000;
    c.workers = 2;
    Harness h(c, smallGeometry(plan), rng());
    uint64_t abortFlag = 0;
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      __atomic_store_n(&abortFlag, 1, __ATOMIC_RELAXED);
    });
    const auto start = std::chrono::steady_clock::now();
    const std::string result = h.launch(p, {true, true, false}, &abortFlag);  // rank 2 never runs
    const auto elapsed = std::chrono::steady_clock::now() - start;
    aborter.join();
    INFO(result);
    CHECK(result.find("stopped early") != std::string::npos);
    CHECK(h.rank(0).status == kPlanAborted);
    CHECK(h.rank(1).status == kPlanAborted);
    CHECK(elapsed < std::chrono::seconds(20));
  }
}

TEST_CASE("device lowering: a plan needing more FIFO slots than there are is refused, naming the setting") {
  const algo::Plan plan = algo::makePlan(algo::Algorithm::Ring, algo::Collective::AllReduce, 4, 0, 1);
  REQUIRE(core::fifoSlotsNeeded(plan) == 6);  // send, 2 x rrs, rrcs, 2 x rcs
  DeviceFifoGeometry g;
  g.slotCount = 5;
  std::vector<Pack16> in(8), out(8);
  const core::PlanBuffers buffers{reinterpret_cast<const char*>(in.data()), reinterpret_cast<char*>(out.data()), nullptr, 8, 4};
  const auto noFifo = [](int, int, bool) { return DeviceFifo{}; };
  try {
    core::lowerPlan(plan, 0, buffers, noFifo, DeviceProtocol::Simple, g);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("sends 6 chunks per round") && Catch::Contains("TOPOCCL_GPU_FIFO_SLOTS"));
  }
  g.slotCount = 6;
  CHECK(core::lowerPlan(plan, 0, buffers, noFifo, DeviceProtocol::Simple, g).lanes.size() == 1);
}

