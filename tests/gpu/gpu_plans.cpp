// The GPU plan executor (kernels/cuda/plan_kernels.cu) on a real GPU: 2-4 ranks on the one device, each rank's
// kernel on its own stream, FIFOs and buffers in device memory, plans lowered by core/device_lowering.hpp as
// the communicator does. Every built-in algorithm x collective, both protocols, sizes from 1 element to past
// a MiB, outputs against the collective's definition. Also times a large all-reduce per protocol (busbw).
// Exits 77 ("skipped: no GPU") where there is none, so a machine without one never reports it passed.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "algorithms/generators.hpp"
#include "core/device_lowering.hpp"
#include "kernels/cuda_plan.hpp"
#include "../kernels/reference.hpp"
#include "gpu_support.hpp"
#include "../support/collective_definition.hpp"

using namespace topoccl;
using namespace topoccl::kernels;
using namespace topoccl::kernels::test;

namespace {


void* deviceAlloc(size_t bytes) {
  void* p = nullptr;
  if (!ok(cudaMalloc(&p, bytes == 0 ? 16 : bytes), "cudaMalloc")) return nullptr;
  ok(cudaMemset(p, 0, bytes == 0 ? 16 : bytes), "cudaMemset");
  return p;
}

// Every connection's receiving FIFO, in device memory (ranks share the device: no IPC needed).
class DeviceFabric {
 public:
  explicit DeviceFabric(DeviceFifoGeometry g) : geometry_(g) {}
  ~DeviceFabric() {
    for (void* p : owned_) cudaFree(p);
  }
  DeviceFifo fifo(int sender, int receiver, int channel) {
    auto [it, fresh] = fifos_.try_emplace({sender, receiver, channel});
    if (fresh) {
      it->second.counters = static_cast<DeviceFifoCounters*>(keep(deviceAlloc(sizeof(DeviceFifoCounters))));
      it->second.slots = static_cast<char*>(keep(deviceAlloc(geometry_.simpleBytes())));
      it->second.lines = static_cast<uint64_t*>(keep(deviceAlloc(geometry_.lowLatencyBytes())));
      it->second.slotCount = geometry_.slotCount;
    }
    return it->second;
  }
  const DeviceFifoGeometry& geometry() const { return geometry_; }

 private:
  void* keep(void* p) {
    owned_.push_back(p);
    return p;
  }
  DeviceFifoGeometry geometry_;
  std::map<std::tuple<int, int, int>, DeviceFifo> fifos_;
  std::vector<void*> owned_;
};

struct Rank {
  std::vector<float> input, output;
  char* dIn = nullptr;
  char* dOut = nullptr;
  char* dScratch = nullptr;
  char* dImage = nullptr;
  uint64_t* laneDone = nullptr;
  uint64_t* status = nullptr;  // mapped host memory
  cudaStream_t stream = nullptr;
  uint32_t lanes = 0;
};

// Runs `plan` on float Sum (or no reduction), checks it; returns the seconds of the timed launches.
double runPlan(const algo::Plan& plan, size_t count, DeviceProtocol protocol, TestRng& rng, int timedLaunches = 0) {
  const int n = plan.nranks;
  DeviceFifoGeometry g;
  g.slotCount = std::max<uint64_t>(8, core::fifoSlotsNeeded(plan));
  DeviceFabric fabric(g);
  uint64_t* abortFlag = nullptr;
  ok(cudaHostAlloc(reinterpret_cast<void**>(&abortFlag), sizeof(uint64_t), cudaHostAllocMapped), "cudaHostAlloc");
  *abortFlag = 0;
  std::vector<Rank> ranks(static_cast<size_t>(n));
  const bool reduces = plan.collective == algo::Collective::AllReduce || plan.collective == algo::Collective::ReduceScatter ||
                       plan.collective == algo::Collective::Reduce;
  const std::string what = plan.name + " " + algo::collectiveName(plan.collective) + " on " + std::to_string(n) +
                           " ranks, " + std::to_string(count) + " floats, " +
                           (protocol == DeviceProtocol::Simple ? "Simple" : "LowLatency");
  std::vector<std::vector<unsigned char>> images(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[static_cast<size_t>(r)];
    k.input.resize(algo::inputBlocks(plan.collective, n, r, plan.root) * count);
    k.output.assign(algo::outputBlocks(plan.collective, n, r, plan.root) * count, -777.0f);
    for (float& x : k.input) x = static_cast<float>(static_cast<int>(rng() % 7) - 3);
    k.dIn = static_cast<char*>(deviceAlloc(k.input.size() * 4));
    k.dOut = static_cast<char*>(deviceAlloc(k.output.size() * 4));
    k.dScratch = static_cast<char*>(deviceAlloc(core::scratchBytes(plan, count, 4)));
    ok(cudaMemcpy(k.dIn, k.input.data(), k.input.size() * 4, cudaMemcpyHostToDevice), "upload input");
    ok(cudaMemcpy(k.dOut, k.output.data(), k.output.size() * 4, cudaMemcpyHostToDevice), "upload output");
    k.laneDone = static_cast<uint64_t*>(deviceAlloc(64 * sizeof(uint64_t)));
    ok(cudaHostAlloc(reinterpret_cast<void**>(&k.status), sizeof(uint64_t), cudaHostAllocMapped), "cudaHostAlloc");
    *k.status = kPlanRunning;
    ok(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const core::PlanBuffers buffers{k.dIn, k.dOut, k.dScratch, count, 4};
    const core::LoweredPlan lowered = core::lowerPlan(
        plan, r, buffers,
        [&](int peer, int channel, bool sending) { return sending ? fabric.fifo(r, peer, channel) : fabric.fifo(peer, r, channel); },
        protocol, g);
    images[static_cast<size_t>(r)].resize(core::deviceImageBytes(lowered));
    k.dImage = static_cast<char*>(deviceAlloc(images[static_cast<size_t>(r)].size()));
    k.lanes = static_cast<uint32_t>(lowered.lanes.size());
    DevicePlan header;
    header.protocol = protocol;
    header.geometry = g;
    header.laneDone = k.laneDone;
    header.abortFlag = abortFlag;
    header.status = k.status;
    // Launch-to-launch: each launch needs a fresh launchBase, written into the image before its upload.
    (void)core::writeDeviceImage(lowered, header, images[static_cast<size_t>(r)].data(), reinterpret_cast<uintptr_t>(k.dImage));
  }
  auto launchAll = [&](uint64_t launch) {
    for (int r = 0; r < n; ++r) {
      Rank& k = ranks[static_cast<size_t>(r)];
      auto& image = images[static_cast<size_t>(r)];
      DevicePlan header;
      std::memcpy(&header, image.data(), sizeof(header));
      header.launchBase = launch << 32;
      std::memcpy(image.data(), &header, sizeof(header));
      ok(cudaMemcpyAsync(k.dImage, image.data(), image.size(), cudaMemcpyHostToDevice, k.stream), "upload plan");
      cudaStreamSynchronize(k.stream);  // the host image is reused for the next launch
      ok(launchPlan(DataType::Float32, ReduceOp::Sum, reduces, reinterpret_cast<const DevicePlan*>(k.dImage), k.lanes, 256,
                    k.stream),
         what + ": launch");
    }
  };
  // Wait with a deadline; a hang sets the abort flag, which every lane polls, and is reported.
  auto waitAll = [&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (auto& k : ranks)
      while (cudaStreamQuery(k.stream) == cudaErrorNotReady) {
        if (std::chrono::steady_clock::now() > deadline && *abortFlag == 0) {
          *abortFlag = 1;
          fail(what + ": did not finish in 10 s; aborted");
        }
      }
    for (auto& k : ranks) ok(cudaStreamSynchronize(k.stream), what + ": kernel");
  };
  ok(cudaDeviceSynchronize(), "the fills (legacy stream) before the launches (non-blocking streams)");
  launchAll(1);
  waitAll();
  double seconds = 0;
  if (timedLaunches > 0) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < timedLaunches; ++i) {
      launchAll(2 + static_cast<uint64_t>(i));
      waitAll();
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / timedLaunches;
  }
  for (int r = 0; r < n; ++r) {
    Rank& k = ranks[static_cast<size_t>(r)];
    if (*k.status != kPlanRunning) fail(what + ": rank " + std::to_string(r) + " status " + std::to_string(*k.status));
    ok(cudaMemcpy(k.output.data(), k.dOut, k.output.size() * 4, cudaMemcpyDeviceToHost), "download output");
  }
  for (int r = 0; r < n && failures < 20; ++r) {
    const Rank& k = ranks[static_cast<size_t>(r)];
    for (size_t e = 0; e < k.output.size(); ++e) {
      const double want = topoccl::test::collectiveOutput(
          plan.collective, n, plan.root, count, r, e,
          [&](int q, size_t i) { return static_cast<double>(ranks[static_cast<size_t>(q)].input[i]); },
          [](double a, double b) { return a + b; });
      if (static_cast<double>(k.output[e]) != want) {
        fail(what + ": rank " + std::to_string(r) + " element " + std::to_string(e) + " is " +
             std::to_string(k.output[e]) + ", want " + std::to_string(want));
        break;
      }
    }
  }
  for (auto& k : ranks) {
    cudaFree(k.dIn), cudaFree(k.dOut), cudaFree(k.dScratch), cudaFree(k.dImage), cudaFree(k.laneDone);
    cudaFreeHost(k.status);
    cudaStreamDestroy(k.stream);
  }
  cudaFreeHost(abortFlag);
  return seconds;
}

}  // namespace

int main() {
  int devices = 0;
  const std::optional<uint64_t> seed = startGpuTest(&devices);
  if (!seed) return kSkipped;
  TestRng rng(*seed);
  size_t cases = 0;
  const algo::Collective collectives[] = {algo::Collective::AllReduce, algo::Collective::AllGather, algo::Collective::ReduceScatter,
                                          algo::Collective::Broadcast, algo::Collective::Reduce, algo::Collective::AllToAll,
                                          algo::Collective::Gather, algo::Collective::Scatter};
  const algo::Algorithm algorithms[] = {algo::Algorithm::Ring, algo::Algorithm::RecursiveDoubling, algo::Algorithm::Tree,
                                        algo::Algorithm::Direct, algo::Algorithm::HalvingDoubling,
                                        algo::Algorithm::ReduceScatterAllGather};
  for (int n = 2; n <= 4; ++n)
    for (algo::Algorithm a : algorithms)
      for (algo::Collective c : collectives) {
        if (!algo::algorithmSupports(a, c)) continue;
        if (failures >= 10) break;  // stop early: every hang costs its deadline
        const algo::Plan plan = algo::makePlan(a, c, n, n - 1, a == algo::Algorithm::Ring ? 2 : 1);
        const auto start = std::chrono::steady_clock::now();
        const int before = failures;
        for (DeviceProtocol p : {DeviceProtocol::Simple, DeviceProtocol::LowLatency})
          for (size_t count : {size_t{1}, size_t{4099}, size_t{(1 << 20) + 3}}) {
            runPlan(plan, count, p, rng);
            ++cases;
          }
        std::printf("%d ranks, %s %s: %s (%.0f ms)\n", n, plan.name.c_str(), algo::collectiveName(c),
                    failures == before ? "ok" : "FAILED",
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
  // Bandwidth of the all-reduce the selection would run for large messages (ring, 2 channels), 64 MiB a rank.
  for (int n : {2, 4}) {
    const algo::Plan ring = algo::makePlan(algo::Algorithm::Ring, algo::Collective::AllReduce, n, 0, 2);
    for (DeviceProtocol p : {DeviceProtocol::Simple, DeviceProtocol::LowLatency}) {
      const size_t count = size_t{16} << 20;
      const double s = runPlan(ring, count, p, rng, 5);
      const double busbw = count * 4.0 / s * 2.0 * (n - 1) / n / 1e9;
      std::printf("ring all-reduce, %d ranks on one GPU, 64 MiB, %s: %.3f ms, busbw %.1f GB/s\n", n,
                  p == DeviceProtocol::Simple ? "Simple" : "LowLatency", s * 1e3, busbw);
    }
  }
  std::printf("%zu plan cases on %d GPU(s): %s\n", cases, devices, failures == 0 ? "gpu plans: PASSED" : "FAILED");
  return failures == 0 ? 0 : 1;
}
