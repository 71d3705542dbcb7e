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

using LaneFn = bool (*)(const DevicePlan*, uint32_t, HostBlock&);

// A launch runs lane `lane` of every plan chained from the first, as the CUDA kernel does.
template <class T, template <class> class Op>
bool runLaneTyped(const DevicePlan* plan, uint32_t lane, HostBlock& block) {
  return runPlanChain<T, Op<T>, HostBlock>(plan, lane, block);
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

// One rank's memory for a call: input and output (overlapping as NCCL's in-place layout), scratch, and its
// lowered program.
struct RankState {
  std::vector<Pack16> store;   // input and output, at a 16-misaligned but element-aligned offset
  std::vector<Pack16> outputStore;
  std::vector<Pack16> scratch;
  unsigned char* input = nullptr;
  unsigned char* output = nullptr;
  size_t inputElements = 0;
  size_t outputElements = 0;
  core::LoweredPlan lowered;
  std::vector<unsigned char> originalInput;
};

// What a rank's communicator keeps from launch to launch: lane completion counters and the status word.
struct RankComm {
  std::vector<uint64_t> laneDone = std::vector<uint64_t>(64, 0);
  uint64_t status = kPlanRunning;
  std::vector<std::vector<Pack16>> images;  // one per launch of the last Harness::launch
};

// Runs each rank's launches in order on its own "stream" thread, each launch a thread group of `workers` per lane
// as the CUDA kernel runs it; a stopped launch ends its rank's stream. `launched`: ranks that run (empty: all).
// Returns how many workers stopped early.
int runRankStreams(std::vector<RankComm>& comms, LaneFn run, size_t workers, const std::vector<bool>& launched = {}) {
  std::atomic<int> stopped{0};
  std::vector<std::thread> streams;
  for (size_t r = 0; r < comms.size(); ++r) {
    if (!launched.empty() && !launched[r]) continue;
    streams.emplace_back([&, r] {
      for (const auto& image : comms[r].images) {
        const auto* plan = reinterpret_cast<const DevicePlan*>(image.data());
        uint32_t lanes = 0;
        for (const DevicePlan* p = plan; p; p = p->next) lanes = std::max(lanes, p->laneCount);
        std::vector<std::unique_ptr<HostBlockGroup>> groups;
        std::vector<std::thread> threads;
        for (uint32_t lane = 0; lane < lanes; ++lane) {
          groups.push_back(std::make_unique<HostBlockGroup>(workers));
          HostBlockGroup* group = groups.back().get();
          for (size_t w = 0; w < workers; ++w)
            threads.emplace_back([=, &stopped] {
              HostBlock block{group, w, workers};
              if (!run(plan, lane, block)) stopped.fetch_add(1);
            });
        }
        for (auto& t : threads) t.join();
        if (comms[r].status != kPlanRunning) break;  // a stopped launch ends the stream
      }
    });
  }
  for (auto& t : streams) t.join();
  return stopped.load();
}

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

// Runs calls (Cases) as a GPU communicator would: every rank lowers each call, chains consecutive calls into
// one launch where ChainedConnections admits them (a fused group) or launches them one by one, and runs its
// launches in order on its own "stream" thread, each launch a thread group per lane. Checks every call.
class Harness {
 public:
  Harness(std::vector<Case> calls, DeviceFifoGeometry geometry, uint64_t seed)
      : calls_(std::move(calls)), ref_(calls_.at(0).type), fabric_(geometry), rng_(seed),
        nranks_(calls_[0].plan->nranks), states_(calls_.size()), comms_(static_cast<size_t>(nranks_)) {
    for (const Case& c : calls_) {
      REQUIRE(c.plan->nranks == nranks_);
      REQUIRE(c.type == calls_[0].type);  // one kernel (type, operator) per launch
      REQUIRE(c.laneOp.value_or(c.op) == calls_[0].laneOp.value_or(calls_[0].op));
      REQUIRE(c.workers == calls_[0].workers);
    }
    for (auto& s : states_) s.resize(static_cast<size_t>(nranks_));
  }
  Harness(const Case& c, DeviceFifoGeometry geometry, uint64_t seed) : Harness(std::vector<Case>{c}, geometry, seed) {}

  // Fresh inputs, lower every rank's program, run every lane on its own workers, check. Empty on success.
  // `fuse`: chain consecutive calls into one launch where allowed. `launched`: ranks that run (others never do).
  std::string launch(DeviceProtocol protocol, const std::vector<bool>& launched = {}, const uint64_t* abortFlag = nullptr,
                     bool fuse = true) {
    const size_t elem = ref_.size();
    for (int r = 0; r < nranks_; ++r) {
      RankComm& comm = comms_[static_cast<size_t>(r)];
      comm.images.clear();
      // Lower every call, then cut the sequence into launches.
      std::vector<std::vector<size_t>> launches;
      std::optional<core::ChainedConnections> chain;
      for (size_t k = 0; k < calls_.size(); ++k) {
        const Case& c = calls_[k];
        RankState& s = states_[k][static_cast<size_t>(r)];
        allocate(c, r, s);
        for (size_t e = 0; e < s.inputElements; ++e) ref_.setBits(s.input, e, encode(ref_, drawValue(ref_, c.op, rng_)));
        s.originalInput.assign(s.input, s.input + s.inputElements * elem);
        const core::PlanBuffers buffers{reinterpret_cast<const char*>(s.input), reinterpret_cast<char*>(s.output),
                                        s.scratch.empty() ? nullptr : reinterpret_cast<char*>(bytesOf(s.scratch)), c.count, elem};
        s.lowered = core::lowerPlan(
            *c.plan, r, buffers,
            [&](int peer, int channel, bool sending) {
              return sending ? fabric_.fifo(r, peer, channel) : fabric_.fifo(peer, r, channel);
            },
            protocol, fabric_.geometry());
        REQUIRE(s.lowered.lanes.size() <= comm.laneDone.size());
        if (!fuse || !chain || !chain->admit(s.lowered)) {
          chain.emplace();
          REQUIRE(chain->admit(s.lowered));
          launches.emplace_back();
        }
        launches.back().push_back(k);
      }
      // One image per launch: the calls' plans back to back, each pointing at the next.
      for (const auto& members : launches) {
        std::vector<size_t> offsets;
        size_t total = 0;
        for (size_t k : members) {
          offsets.push_back(total);
          total += (core::deviceImageBytes(states_[k][static_cast<size_t>(r)].lowered) + 63) / 64 * 64;
        }
        std::vector<Pack16> image(total / sizeof(Pack16), Pack16{});
        auto* base = reinterpret_cast<unsigned char*>(image.data());
        for (size_t i = 0; i < members.size(); ++i) {
          DevicePlan header;
          header.protocol = protocol;
          header.geometry = fabric_.geometry();
          header.laneDone = comm.laneDone.data();
          header.launchBase = ++launchBases_ << 32;
          header.abortFlag = abortFlag;
          header.status = &comm.status;
          header.next = i + 1 < members.size() ? reinterpret_cast<const DevicePlan*>(base + offsets[i + 1]) : nullptr;
          core::writeDeviceImage(states_[members[i]][static_cast<size_t>(r)].lowered, header, base + offsets[i],
                                 reinterpret_cast<uintptr_t>(base + offsets[i]));
        }
        comm.images.push_back(std::move(image));
      }
      fusedCalls_ += calls_.size() - launches.size();
    }
    const Case& first = calls_[0];
    const LaneFn run = kLaneTable[static_cast<size_t>(first.type)][static_cast<size_t>(first.laneOp.value_or(first.op))];
    const int stopped = runRankStreams(comms_, run, first.workers, launched);
    if (stopped > 0) return std::to_string(stopped) + " workers stopped early";
    for (int r = 0; r < nranks_; ++r)
      if (comms_[static_cast<size_t>(r)].status != kPlanRunning) return "rank " + std::to_string(r) + " status is aborted";
    for (size_t k = 0; k < calls_.size(); ++k)
      if (std::string wrong = check(k); !wrong.empty())
        return calls_.size() > 1 ? "call " + std::to_string(k) + ": " + wrong : wrong;
    return {};
  }

  uint64_t status(int r) const { return comms_[static_cast<size_t>(r)].status; }
  // Calls that ran chained after another in the same launch, over every rank and launch() so far.
  size_t fusedCalls() const { return fusedCalls_; }

 private:
  void allocate(const Case& c, int r, RankState& s) {
    const algo::Plan& plan = *c.plan;
    const size_t elem = ref_.size();
    s.inputElements = algo::inputBlocks(plan.collective, plan.nranks, r, plan.root) * c.count;
    s.outputElements = algo::outputBlocks(plan.collective, plan.nranks, r, plan.root) * c.count;
    const size_t shift = elem * (1 + rng_() % 3) % 16;  // element-aligned, not 16-aligned: packs get heads and tails
    const auto sized = [&](size_t bytes) { return (bytes + shift + sizeof(Pack16) - 1) / sizeof(Pack16) + 1; };
    const algo::InPlaceAlias alias = algo::inPlaceAlias(plan.collective, plan.nranks, r, plan.root);
    if (c.inPlace && alias.blocks > 0) {
      const size_t inOffset = alias.outputBlock >= alias.inputBlock ? (alias.outputBlock - alias.inputBlock) * c.count : 0;
      const size_t outOffset = alias.inputBlock > alias.outputBlock ? (alias.inputBlock - alias.outputBlock) * c.count : 0;
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
      if (!(c.inPlace && alias.blocks > 0)) ref_.setBits(s.output, e, encode(ref_, 77));
    s.scratch.assign((core::scratchBytes(plan, c.count, elem) + sizeof(Pack16) - 1) / sizeof(Pack16), Pack16{});
  }

  double input(size_t k, int r, size_t e) const {
    return decode(ref_, ref_.bitsAt(states_[k][static_cast<size_t>(r)].originalInput.data(), e));
  }

  double expected(size_t k, int r, size_t e) const {
    const Case& c = calls_[k];
    const algo::Plan& plan = *c.plan;
    return topoccl::test::collectiveOutput(
        plan.collective, plan.nranks, plan.root, c.count, r, e, [&](int q, size_t i) { return input(k, q, i); },
        [&](double a, double b) { return combine(c.op, a, b); });
  }

  std::string check(size_t k) const {
    const Case& c = calls_[k];
    for (int r = 0; r < nranks_; ++r) {
      const RankState& s = states_[k][static_cast<size_t>(r)];
      for (size_t e = 0; e < s.outputElements; ++e) {
        const double got = decode(ref_, ref_.bitsAt(s.output, e));
        const double want = expected(k, r, e);
        if (!(got == want))
          return "rank " + std::to_string(r) + " output element " + std::to_string(e) + " of " +
                 std::to_string(s.outputElements) + ": got " + std::to_string(got) + ", want " + std::to_string(want);
      }
      const bool aliased = c.inPlace && algo::inPlaceAlias(c.plan->collective, c.plan->nranks, r, c.plan->root).blocks > 0;
      if (!aliased && !s.originalInput.empty() && std::memcmp(s.originalInput.data(), s.input, s.originalInput.size()) != 0)
        return "rank " + std::to_string(r) + ": the input buffer was modified";
    }
    return {};
  }

  std::vector<Case> calls_;
  ReferenceType ref_;
  HostFabric fabric_;
  TestRng rng_;
  int nranks_;
  std::vector<std::vector<RankState>> states_;  // [call][rank]
  std::vector<RankComm> comms_;
  uint64_t launchBases_ = 0;
  size_t fusedCalls_ = 0;
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
                                        algo::Algorithm::Direct, algo::Algorithm::HalvingDoubling,
                                        algo::Algorithm::ReduceScatterAllGather};
  for (algo::Algorithm a : algorithms)
    for (algo::Collective c : collectives) {
      if (!algo::algorithmSupports(a, c)) continue;
      const int root = nranks - 1;
      // Ring and direct all-to-all on 2 channels: the GPU path runs them over many lanes.
      const bool channelled = a == algo::Algorithm::Ring || (a == algo::Algorithm::Direct && c == algo::Collective::AllToAll);
      plans.push_back(algo::makePlan(a, c, nranks, root, channelled ? 2 : 1));
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

TEST_CASE("device interpreter: calls of a group chained into one launch each give their own result") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed);
  TestRng rng(seed);
  const DataType types[] = {DataType::Float32, DataType::Int32, DataType::Float16, DataType::Bfloat16, DataType::Float64};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min};
  const size_t counts[] = {0, 1, 2, 31, 257, 1031};
  size_t fused = 0, groups = 0, split = 0;
  for (int nranks = 2; nranks <= 5; ++nranks) {
    const std::vector<algo::Plan> plans = builtInPlans(nranks);
    for (int group = 0; group < 6; ++group) {
      // 2-5 calls of one type and operator, any collectives and algorithms, as a DDP bucket group or a
      // ZeRO step issues them between ncclGroupStart and ncclGroupEnd.
      const DataType type = types[rng() % std::size(types)];
      const ReduceOp op = ops[rng() % std::size(ops)];
      const size_t workers = 1 + rng() % 2;
      std::vector<Case> calls;
      DeviceFifoGeometry geometry;
      geometry.slotCount = 1;
      geometry.slotBytes = 256;
      geometry.llWordsPerSlot = 32;
      for (size_t k = 0, n = 2 + rng() % 4; k < n; ++k) {
        Case c;
        c.plan = &plans[rng() % plans.size()];
        c.type = type;
        c.op = op;
        c.count = counts[rng() % std::size(counts)] + rng() % 3;
        c.inPlace = c.plan->inPlace && (rng() % 2 == 0 || !c.plan->outOfPlace);
        c.workers = workers;
        geometry.slotCount = std::max<uint64_t>(geometry.slotCount, core::fifoSlotsNeeded(*c.plan));
        calls.push_back(c);
      }
      Harness h(calls, geometry, rng());
      for (DeviceProtocol p : {DeviceProtocol::Simple, DeviceProtocol::LowLatency}) {
        std::string what;
        for (const Case& c : calls) what += describe(c, p) + "; ";
        INFO(what);
        const size_t before = h.fusedCalls();
        REQUIRE(h.launch(p) == "");
        fused += h.fusedCalls() - before;
        split += h.fusedCalls() - before < calls.size() * static_cast<size_t>(nranks) - static_cast<size_t>(nranks);
        REQUIRE(h.launch(p, {}, nullptr, /*fuse=*/false) == "");  // the same calls as separate launches
        ++groups;
      }
    }
  }
  // Most calls chain; some groups need a second launch (a connection another lane drove earlier).
  CHECK(fused > groups);
  CHECK(split > 0);
}

TEST_CASE("device lowering: a chain refuses a plan that drives a connection from another lane") {
  std::vector<Pack16> in(64), out(64);
  const core::PlanBuffers buffers{reinterpret_cast<const char*>(in.data()), reinterpret_cast<char*>(out.data()), nullptr, 16, 4};
  DeviceFifoCounters a{}, b{};
  // Two ring lanes: lane 0 on connection `a`, lane 1 on `b`; the same plan again chains, swapped lanes do not.
  const algo::Plan ring = algo::makePlan(algo::Algorithm::Ring, algo::Collective::AllGather, 2, 0, 2);
  const auto lower = [&](bool swapped) {
    return core::lowerPlan(
        ring, 0, buffers,
        [&](int, int channel, bool) { return DeviceFifo{(channel == 0) != swapped ? &a : &b, nullptr, nullptr, 8}; },
        DeviceProtocol::Simple, DeviceFifoGeometry{});
  };
  const core::LoweredPlan straight = lower(false), swapped = lower(true);
  REQUIRE(straight.lanes.size() == 2);
  core::ChainedConnections chain;
  CHECK(chain.admit(straight));
  CHECK(chain.admit(straight));
  CHECK_FALSE(chain.admit(swapped));
  CHECK(chain.admit(straight));  // a refusal recorded nothing
  core::ChainedConnections fresh;
  CHECK(fresh.admit(swapped));
}

TEST_CASE("device lowering: a call joins a launch only with buffers independent of the earlier calls'") {
  std::vector<char> memory(1000);
  const auto at = [&](size_t offset) { return memory.data() + offset; };
  // The earlier call reads [0, 100) and writes [100, 200).
  const std::vector<core::CallFootprint> earlier{{at(0), 100, at(100), 100}};
  CHECK(core::independentOf({at(0), 100, at(200), 100}, earlier));    // reads what it reads: fine
  CHECK(core::independentOf({at(300), 50, at(200), 100}, earlier));   // adjacent, not overlapping
  CHECK_FALSE(core::independentOf({at(150), 10, at(400), 10}, earlier));  // reads what it writes
  CHECK_FALSE(core::independentOf({at(400), 10, at(99), 1}, earlier));    // writes what it reads
  CHECK_FALSE(core::independentOf({at(400), 10, at(199), 2}, earlier));   // writes what it writes
  CHECK(core::independentOf({at(150), 0, at(150), 0}, earlier));      // a zero-count call touches nothing
  CHECK_FALSE(core::independentOf({at(500), 10, at(600), 10}, {{at(0), 1, at(2), 1}, {at(605), 1, at(700), 1}}));
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
    CHECK(h.status(0) == kPlanAborted);
    CHECK(h.status(1) == kPlanAborted);
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


namespace {

// One message of a point-to-point test: its bytes in the sender's memory and the receiver's, each at an offset
// that is not 16-aligned, between guard bytes the lanes must leave alone.
struct PointToPointMessage {
  int from = 0, to = 0;
  uint64_t bytes = 0;
  std::vector<unsigned char> sendStore, recvStore;
  size_t sendShift = 0, recvShift = 0;
  unsigned char* send() { return sendStore.data() + sendShift; }
  unsigned char* recv() { return recvStore.data() + recvShift; }
};

constexpr unsigned char kGuard = 0xa5;

std::unique_ptr<PointToPointMessage> drawMessage(int from, int to, uint64_t bytes, TestRng& rng) {
  auto m = std::make_unique<PointToPointMessage>();
  m->from = from, m->to = to, m->bytes = bytes;
  m->sendShift = rng() % 16, m->recvShift = rng() % 16;
  m->sendStore.assign(bytes + 32, kGuard);
  m->recvStore.assign(bytes + 32, kGuard);
  for (uint64_t i = 0; i < bytes; ++i) m->send()[i] = static_cast<unsigned char>(rng());
  return m;
}

std::string checkMessage(PointToPointMessage& m, size_t index) {
  const std::string which = "message " + std::to_string(index) + " (" + std::to_string(m.from) + " -> " + std::to_string(m.to) +
                            ", " + std::to_string(m.bytes) + " bytes)";
  if (m.bytes > 0 && std::memcmp(m.send(), m.recv(), m.bytes) != 0) {
    uint64_t i = 0;
    while (m.send()[i] == m.recv()[i]) ++i;
    return which + ": byte " + std::to_string(i) + " differs";
  }
  for (size_t i = 0; i < m.recvStore.size(); ++i)
    if ((i < m.recvShift || i >= m.recvShift + m.bytes) && m.recvStore[i] != kGuard)
      return which + ": the receiver's byte " + std::to_string(i) + " outside the message was written";
  return {};
}

// Each rank's sends and receives of `messages` in an order of its own that keeps NCCL's matching (per peer and
// direction, call order), self messages included.
std::vector<std::vector<core::DevicePointToPoint>> interleavedCalls(int nranks, std::vector<std::unique_ptr<PointToPointMessage>>& messages,
                                                                   TestRng& rng) {
  std::vector<std::vector<core::DevicePointToPoint>> calls(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    // Queues per (peer, direction) in message order, then drained in a random order.
    std::map<std::pair<int, bool>, std::vector<core::DevicePointToPoint>> queues;
    for (auto& m : messages) {
      if (m->from == r) queues[{m->to, true}].push_back({true, m->to, reinterpret_cast<const char*>(m->send()), nullptr, m->bytes});
      if (m->to == r) queues[{m->from, false}].push_back({false, m->from, nullptr, reinterpret_cast<char*>(m->recv()), m->bytes});
    }
    std::vector<std::pair<std::vector<core::DevicePointToPoint>*, size_t>> heads;
    for (auto& [key, queue] : queues) heads.push_back({&queue, 0});
    while (!heads.empty()) {
      const size_t pick = rng() % heads.size();
      auto& [queue, next] = heads[pick];
      calls[static_cast<size_t>(r)].push_back((*queue)[next++]);
      if (next == queue->size()) heads.erase(heads.begin() + static_cast<std::ptrdiff_t>(pick));
    }
  }
  return calls;
}

// Lowers each rank's launches (lists of its calls) with lowerPointToPoint over `fabric` and runs them; "" or what
// went wrong.
std::string runPointToPoint(HostFabric& fabric, std::vector<RankComm>& comms,
                            const std::vector<std::vector<std::vector<core::DevicePointToPoint>>>& launches,
                            uint32_t lanesPerMessage, size_t workers, uint64_t& launchBases) {
  for (size_t r = 0; r < comms.size(); ++r) {
    RankComm& comm = comms[r];
    comm.images.clear();
    for (const auto& calls : launches[r]) {
      const core::LoweredPlan lowered = core::lowerPointToPoint(
          calls, static_cast<int>(r), [&](int peer, int channel, bool sending) {
            return sending ? fabric.fifo(static_cast<int>(r), peer, channel) : fabric.fifo(peer, static_cast<int>(r), channel);
          },
          fabric.geometry(), lanesPerMessage, static_cast<uint32_t>(comm.laneDone.size()));
      std::vector<Pack16> image((core::deviceImageBytes(lowered) + sizeof(Pack16) - 1) / sizeof(Pack16), Pack16{});
      DevicePlan header;
      header.protocol = DeviceProtocol::Simple;
      header.geometry = fabric.geometry();
      header.laneDone = comm.laneDone.data();
      header.launchBase = ++launchBases << 32;
      header.status = &comm.status;
      core::writeDeviceImage(lowered, header, image.data(), reinterpret_cast<uintptr_t>(image.data()));
      comm.images.push_back(std::move(image));
    }
  }
  const LaneFn run = kLaneTable[static_cast<size_t>(DataType::Uint8)][static_cast<size_t>(ReduceOp::Sum)];
  if (const int stopped = runRankStreams(comms, run, workers); stopped > 0) return std::to_string(stopped) + " workers stopped early";
  return {};
}

}  // namespace

TEST_CASE("device lowering: groups of sends and receives on 1-5 ranks move every byte, split over lanes by size") {
  const uint64_t seed = testSeed();
  INFO("seed " << seed);
  TestRng rng(seed);
  const uint64_t small[] = {0, 1, 15, 16, 17, 255, 256, 257, 4099, 65537};
  int launchesRun = 0;
  for (int nranks = 1; nranks <= 5; ++nranks) {
    for (uint32_t lanesPerMessage : {1u, 2u, 4u}) {
      DeviceFifoGeometry geometry;
      geometry.slotCount = 2 + rng() % 3;
      geometry.slotBytes = 16 << (rng() % 2 ? 12 : 4);  // 256 B or 64 KiB slots
      HostFabric fabric(geometry);
      std::vector<RankComm> comms(static_cast<size_t>(nranks));
      uint64_t launchBases = 0;
      const size_t workers = 1 + rng() % 2;
      // Phases over the same FIFOs: one launch per rank each, so counters carry over.
      for (int phase = 0; phase < 3; ++phase) {
        std::vector<std::unique_ptr<PointToPointMessage>> messages;
        for (int a = 0; a < nranks; ++a)
          for (int b = 0; b < nranks; ++b)
            for (uint64_t k = rng() % 3; k > 0; --k) {
              // Past 512 KiB a message spreads over several lanes: 1.25 MiB over 2, 2.5 MiB + 3 over 4.
              const uint64_t bytes = rng() % 16 == 0 ? (rng() % 2 ? (5u << 18) : (5u << 19) + 3) : small[rng() % std::size(small)];
              messages.push_back(drawMessage(a, b, bytes, rng));
            }
        auto calls = interleavedCalls(nranks, messages, rng);
        std::vector<std::vector<std::vector<core::DevicePointToPoint>>> launches(static_cast<size_t>(nranks));
        for (int r = 0; r < nranks; ++r) launches[static_cast<size_t>(r)].push_back(calls[static_cast<size_t>(r)]);
        INFO(nranks << " ranks, " << lanesPerMessage << " lanes a message at most, " << geometry.slotCount << " slots of "
                    << geometry.slotBytes << " bytes, " << workers << " workers, phase " << phase << ", "
                    << messages.size() << " messages");
        REQUIRE(runPointToPoint(fabric, comms, launches, lanesPerMessage, workers, launchBases) == "");
        for (size_t i = 0; i < messages.size(); ++i) REQUIRE(checkMessage(*messages[i], i) == "");
        ++launchesRun;
      }
    }
  }
  CHECK(launchesRun == 45);
  // The split: lanes by size, one per 512 KiB, a power of two, within the limit.
  CHECK(core::pointToPointLanes(0, 8) == 1);
  CHECK(core::pointToPointLanes((1 << 20) - 1, 8) == 1);
  CHECK(core::pointToPointLanes(1 << 20, 8) == 2);
  CHECK(core::pointToPointLanes(3 << 20, 8) == 4);
  CHECK(core::pointToPointLanes(uint64_t{1} << 32, 8) == 8);
  CHECK(core::pointToPointLanes(uint64_t{1} << 32, 6) == 4);
}

TEST_CASE("device lowering: sends and receives arrive alike however each rank cuts its calls into groups") {
  // A sender's group and its receiver's need not match: each connection carries each message's slices alike.
  // Every rank sends before it receives and every message fits the FIFO, so no send waits for its receiver and
  // any cut runs to completion (a receive cut ahead of a send its peer waits for would deadlock, as in NCCL).
  const uint64_t seed = testSeed();
  INFO("seed " << seed);
  TestRng rng(seed);
  for (int trial = 0; trial < 12; ++trial) {
    const int nranks = 2 + trial % 3;
    DeviceFifoGeometry geometry;
    geometry.slotCount = 8;
    geometry.slotBytes = 256;
    HostFabric fabric(geometry);
    std::vector<RankComm> comms(static_cast<size_t>(nranks));
    uint64_t launchBases = 0;
    std::vector<std::unique_ptr<PointToPointMessage>> messages;
    for (int a = 0; a < nranks; ++a)
      for (int b = 0; b < nranks; ++b)
        if (a != b)
          for (int k = 0; k < 2; ++k) messages.push_back(drawMessage(a, b, rng() % 513, rng));  // at most 3 slots
    auto calls = interleavedCalls(nranks, messages, rng);
    std::vector<std::vector<std::vector<core::DevicePointToPoint>>> launches(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; ++r) {
      auto& mine = launches[static_cast<size_t>(r)];
      auto& ordered = calls[static_cast<size_t>(r)];
      std::stable_partition(ordered.begin(), ordered.end(), [](const core::DevicePointToPoint& c) { return c.isSend; });
      for (const auto& call : ordered) {
        if (mine.empty() || rng() % 3 == 0) mine.emplace_back();
        mine.back().push_back(call);
      }
    }
    INFO("trial " << trial << ", " << nranks << " ranks");
    REQUIRE(runPointToPoint(fabric, comms, launches, 1, 1 + trial % 2, launchBases) == "");
    for (size_t i = 0; i < messages.size(); ++i) REQUIRE(checkMessage(*messages[i], i) == "");
  }
}

TEST_CASE("device lowering: sends to self without their receives, or too many lanes, are refused by name") {
  DeviceFifoGeometry geometry;
  HostFabric fabric(geometry);
  const auto fifo = [&](int peer, int channel, bool sending) { return sending ? fabric.fifo(0, peer, channel) : fabric.fifo(peer, 0, channel); };
  std::vector<char> a(64), b(64);
  const core::DevicePointToPoint sendSelf{true, 0, a.data(), nullptr, 64}, recvSelf{false, 0, nullptr, b.data(), 32};
  try {
    core::lowerPointToPoint({sendSelf}, 0, fifo, geometry, 1, 64);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("1 non-empty send(s) to itself and 0 receive(s)"));
  }
  try {
    core::lowerPointToPoint({sendSelf, recvSelf}, 0, fifo, geometry, 1, 64);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("send to itself #1 has 64 bytes but its matching receive 32"));
  }
  std::vector<core::DevicePointToPoint> many;
  for (int peer = 1; peer <= 5; ++peer) many.push_back({true, peer, a.data(), nullptr, 64});
  try {
    core::lowerPointToPoint(many, 0, fifo, geometry, 1, 4);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("needs 5 lanes") && Catch::Contains("at most 4"));
  }
  CHECK(core::lowerPointToPoint(many, 0, fifo, geometry, 1, 5).lanes.size() == 5);
}

TEST_CASE("device lowering: messages past 4 GiB are cut into slot-sized segments that cover them exactly once") {
  // Lowering only computes addresses, so the buffers need not exist: the segments must tile each message, lane by
  // lane, in order, each within a slot, and the lanes' shares must meet on 16-byte boundaries.
  DeviceFifoGeometry geometry;  // 128 KiB slots
  HostFabric fabric(geometry);
  const auto fifo = [&](int peer, int channel, bool sending) { return sending ? fabric.fifo(0, peer, channel) : fabric.fifo(peer, 0, channel); };
  const uintptr_t sendBase = uintptr_t{1} << 44, recvBase = uintptr_t{3} << 44;
  for (const uint64_t bytes : {(uint64_t{5} << 30) + 3, (uint64_t{1} << 32) + 1, (uint64_t{1} << 31) - 1}) {
    const std::vector<core::DevicePointToPoint> calls{
        {true, 1, reinterpret_cast<const char*>(sendBase), nullptr, bytes},
        {false, 1, nullptr, reinterpret_cast<char*>(recvBase), bytes}};
    const core::LoweredPlan lowered = core::lowerPointToPoint(calls, 0, fifo, geometry, 8, 64);
    INFO(bytes << " bytes");
    REQUIRE(lowered.lanes.size() == 16);  // 8 lanes each way
    for (bool sending : {true, false}) {
      uint64_t covered = 0;
      for (const DeviceLane& lane : lowered.lanes) {
        if ((lane.send.counters != nullptr) != sending) continue;
        REQUIRE(lane.stepCount == 1);
        const DeviceStep& step = lowered.steps[lane.stepBegin];
        CHECK(step.kind == (sending ? DeviceStepKind::Send : DeviceStepKind::Recv));
        for (uint32_t g = 0; g < step.segmentCount; ++g) {
          const DeviceSegment& s = lowered.segments[step.segmentBegin + g];
          const uintptr_t at = sending ? reinterpret_cast<uintptr_t>(s.src) - sendBase : reinterpret_cast<uintptr_t>(s.dst) - recvBase;
          REQUIRE(at == covered);  // lanes in channel order, segments in order: one tiling of the message
          REQUIRE(s.bytes > 0);
          REQUIRE(s.bytes <= geometry.slotBytes);
          if (g == 0) CHECK(at % 16 == 0);
          covered += s.bytes;
        }
      }
      CHECK(covered == bytes);
    }
  }
}
