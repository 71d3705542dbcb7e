#include "core/gpu_path.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include <unistd.h>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/params.hpp"
#include "core/communicator.hpp"
#include "core/device_lowering.hpp"
#include "core/launch_order.hpp"
#include "kernels/reduce_ops.hpp"

#if defined(TOPOCCL_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "kernels/cuda_plan.hpp"
#include "kernels/cuda_reduce.hpp"
#include "kernels/host_reduce.hpp"
#endif

namespace topoccl::core {

namespace {
int powerOfTwoAtMost(int64_t v) {
  int p = 1;
  while (p <= v / 2) p *= 2;
  return p;
}
}  // namespace

kernels::DeviceFifoGeometry gpuFifoGeometry(int nranks) {
  const int64_t slots = params::kGpuFifoSlots.get();
  const int64_t slotBytes = params::kGpuSlotBytes.get();
  if (slots < 0 || slots > 4096)
    throwInvalidArgument(std::string(params::kGpuFifoSlots.name()) + "=" + std::to_string(slots) + " must be 0..4096");
  if (slotBytes < 256 || slotBytes % 16 != 0 || slotBytes > (64 << 20))
    throwInvalidArgument(std::string(params::kGpuSlotBytes.name()) + "=" + std::to_string(slotBytes) +
                         " must be a multiple of 16 between 256 and 64 MiB");
  kernels::DeviceFifoGeometry geometry;
  geometry.slotCount = slots > 0 ? static_cast<uint64_t>(slots) : std::max<uint64_t>(8, 2 * static_cast<uint64_t>(nranks));
  geometry.slotBytes = static_cast<uint64_t>(slotBytes);
  geometry.llWordsPerSlot = 2048;
  return geometry;
}

int gpuMaxRingLanes(int multiprocessors, int ranksOnGpu, size_t fifoBytesPerLane) {
  if (multiprocessors <= 0 || ranksOnGpu <= 0) return 1;
  int lanes = std::min(32, powerOfTwoAtMost(std::max(1, multiprocessors / ranksOnGpu)));
  while (lanes > 8 && static_cast<size_t>(lanes) * fifoBytesPerLane > kGpuFifoBudgetBytes) lanes /= 2;
  return lanes;
}

int gpuRingLanes(size_t callBytes, int nranks, int maxLanes) {
  const int most = std::max(1, maxLanes);
  const int64_t perLane = int64_t{256} << 10;
  const int64_t wanted = static_cast<int64_t>(callBytes / static_cast<size_t>(std::max(1, nranks))) / perLane;
  return std::clamp(powerOfTwoAtMost(std::max<int64_t>(1, wanted)), std::min(8, most), most);
}

uint32_t gpuPointToPointMaxLanes(int nranks, int maxLanes) {
  const int resident = std::clamp(maxLanes, 1, 64);
  const int directions = 2 * std::max(1, nranks) - 1;
  return directions > resident ? 0 : static_cast<uint32_t>(powerOfTwoAtMost(resident / directions));
}

uint32_t gpuPointToPointLanes(const std::string& mode, const GpuPointToPointPlacement& placement, bool everyRankIssuedHere) {
  if (mode != "auto" && mode != "kernel" && mode != "staged")
    throwInvalidArgument(std::string(params::kGpuP2p.name()) + "=" + mode + " must be auto, kernel or staged");
  const uint32_t lanes = gpuPointToPointMaxLanes(placement.nranks, placement.maxLanes);
  if (mode == "staged") return 0;
  if (mode == "kernel") return lanes;
  return placement.processesShareGpuWithoutMps || (placement.threadsShareGpu && !everyRankIssuedHere) ? 0 : lanes;
}

#if !defined(TOPOCCL_HAVE_CUDA)

GpuIdentity currentGpuIdentity() { return {}; }
bool gpuAvailable() { return false; }
bool isGpuPointer(const void*) { return false; }
void* gpuAllocate(size_t) { throwInvalidUsage("GPU memory was asked for (TOPOCCL_MEM_ALLOC=gpu) but this topoccl was built without CUDA"); }
bool gpuFree(void*) { return false; }
int gpuDeviceOf(const void*) { return -1; }
ScopedGpuDevice::ScopedGpuDevice(int) {}
ScopedGpuDevice::~ScopedGpuDevice() = default;
std::unique_ptr<GpuPath> makeGpuPath(const GpuPathContext&) {
  throwInvalidUsage("GPU buffers need a topoccl built with CUDA (nvcc was not found when this one was configured)");
}

#else

namespace {

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls report their own
    throw Error(ncclUnhandledCudaError, what + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
  }
}

// The pool ncclMemAlloc and the GPU path's work buffers come from: one per device, which keeps what is freed
// (release threshold: never). CUDA's default pool hands freed memory back to the driver at every synchronize;
// with ranks as threads of one process a rank may synchronize while a peer's kernel waits for this rank's next
// launch, and if that hand-back waits for the device the ranks deadlock. Suspected, not confirmed, for a 4-rank
// run on an H100 (2026-11-26) whose ring broadcast timed out once. Falls back to the default pool.
cudaMemPool_t retainingPool(int device) {
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;
  std::lock_guard lock(mutex);
  if (auto it = pools.find(device); it != pools.end()) return it->second;
  cudaMemPool_t pool = nullptr;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  if (cudaMemPoolCreate(&pool, &props) == cudaSuccess) {
    uint64_t never = UINT64_MAX;  // cuuint64_t
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &never);
  } else {
    cudaGetLastError();
    if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) {
      cudaGetLastError();
      pool = nullptr;
    }
  }
  pools[device] = pool;
  return pool;
}

// cudaMallocAsync from the retaining pool of the current device.
cudaError_t allocateOnStream(void** pointer, size_t bytes, cudaStream_t stream) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  cudaMemPool_t pool = retainingPool(device);
  return pool ? cudaMallocFromPoolAsync(pointer, bytes, pool, stream) : cudaMallocAsync(pointer, bytes, stream);
}

constexpr uint32_t kMaxLanes = 64;
constexpr size_t kImageSlots = 8;  // launches in flight per communicator before the host waits for the oldest
constexpr size_t kInitialImageBytes = 64 << 10;  // pinned per image slot; a 64-rank ring's plan needs about 20 KiB

// What each rank tells the others about its receiving FIFOs.
struct FifoExchange {
  cudaIpcMemHandle_t handle;
  uint64_t address;  // for peers in this process
  int32_t device;
  int32_t ipcValid;
  uint64_t slotCount;
  uint64_t slotBytes;
  uint64_t llWordsPerSlot;
  uint64_t launchOrderKey;  // LaunchOrder::key(), for peers in this process
  unsigned char uuid[16];   // the GPU's, which device ordinals (CUDA_VISIBLE_DEVICES) do not identify across processes
  int32_t mpsFound;         // an MPS daemon runs for this rank's process (mpsControlFound)
};

// A device buffer that only grows, in stream order (cudaMallocAsync/cudaFreeAsync): cudaFree and
// cudaDeviceSynchronize wait for the whole device, and where ranks are threads of one process a peer's
// kernel that waits for this rank's next launch would never finish (NCCL's cudaFree hang). The caller has
// ordered `stream` after every launch that may still use the old buffer.
class DeviceArena {
 public:
  ~DeviceArena() {
    if (data_) cudaFreeAsync(data_, cudaStreamPerThread);
  }
  char* reserve(size_t bytes, cudaStream_t stream) {
    if (bytes <= capacity_) return data_;
    if (data_) check(cudaFreeAsync(data_, stream), "freeing a work buffer (cudaFreeAsync)");
    data_ = nullptr;
    capacity_ = 0;
    check(allocateOnStream(reinterpret_cast<void**>(&data_), bytes, stream),
          "cudaMallocAsync of a " + std::to_string(bytes) + "-byte work buffer");
    capacity_ = bytes;
    return data_;
  }

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
};

// Whether an MPS control daemon seems to run (its control pipe exists). Without one, kernels of different processes
// on one GPU do not run at once: a plan kernel spinning on a peer process's FIFO holds the GPU until its time slice ends.
bool mpsControlFound() {
  const char* directory = std::getenv("CUDA_MPS_PIPE_DIRECTORY");  // CUDA's own variable, read where CUDA reads it
  const std::string control = std::string(directory != nullptr && *directory != '\0' ? directory : "/tmp/nvidia-mps") + "/control";
  return ::access(control.c_str(), F_OK) == 0;
}

class CudaGpuPath final : public GpuPath {
 public:
  explicit CudaGpuPath(const GpuPathContext& context) : context_(context), launchOrder_(context.rank) {
    check(cudaGetDevice(&device_), "cudaGetDevice");
    check(kernels::loadKernels(), "loading topoccl's kernels");  // before any of ours runs: see loadKernels
    const int n = context.nranks;
    channels_ = std::max(1, context.nchannels);
    geometry_ = gpuFifoGeometry(n);
    threads_ = static_cast<unsigned>(params::kGpuThreads.get());
    if (threads_ == 0 || threads_ % 32 != 0 || threads_ > kernels::kPlanThreadsPerLane)
      throwInvalidArgument(std::string(params::kGpuThreads.name()) + "=" + std::to_string(threads_) +
                           " must be a multiple of 32 up to " + std::to_string(kernels::kPlanThreadsPerLane));

    // Our receiving FIFOs, one per (sender, channel), in one allocation the peers map.
    const size_t total = fifoBytes() * static_cast<size_t>(n) * static_cast<size_t>(channels_);
    check(cudaMalloc(reinterpret_cast<void**>(&receiveBlock_), total), "cudaMalloc of the GPU FIFOs (" + std::to_string(total) + " bytes)");
    check(cudaMemset(receiveBlock_, 0, total), "clearing the GPU FIFOs");
    check(cudaMalloc(reinterpret_cast<void**>(&laneDone_), kMaxLanes * sizeof(uint64_t)), "cudaMalloc of the lane counters");
    check(cudaMemset(laneDone_, 0, kMaxLanes * sizeof(uint64_t)), "clearing the lane counters");
    check(cudaHostAlloc(reinterpret_cast<void**>(&hostFlags_), 2 * sizeof(uint64_t), cudaHostAllocMapped), "cudaHostAlloc of the abort flag");
    hostFlags_[0] = 0;  // abort
    hostFlags_[1] = kernels::kPlanRunning;
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&deviceFlags_), hostFlags_, 0), "cudaHostGetDevicePointer");
    check(cudaDeviceSynchronize(), "setting up the GPU path");

    std::vector<FifoExchange> all(static_cast<size_t>(n));
    FifoExchange& mine = all[static_cast<size_t>(context.rank)];
    std::memset(&mine, 0, sizeof(mine));
    mine.ipcValid = cudaIpcGetMemHandle(&mine.handle, receiveBlock_) == cudaSuccess ? 1 : 0;
    cudaGetLastError();
    mine.address = reinterpret_cast<uint64_t>(receiveBlock_);
    mine.device = device_;
    mine.slotCount = geometry_.slotCount;
    mine.slotBytes = geometry_.slotBytes;
    mine.llWordsPerSlot = geometry_.llWordsPerSlot;
    mine.launchOrderKey = launchOrder_.key();
    std::memcpy(mine.uuid, currentGpuIdentity().uuid, sizeof(mine.uuid));
    mine.mpsFound = mpsControlFound() ? 1 : 0;
    context.allGather(all.data(), sizeof(FifoExchange));

    const transport::PeerInfo& me = context.peers[static_cast<size_t>(context.rank)];
    peerBlocks_.assign(static_cast<size_t>(n), nullptr);
    opened_.assign(static_cast<size_t>(n), false);
    std::string processesOnThisGpu;  // ranks in other processes that share our GPU
    for (int q = 0; q < n; ++q) {
      const FifoExchange& peer = all[static_cast<size_t>(q)];
      const transport::PeerInfo& info = context.peers[static_cast<size_t>(q)];
      const std::string who = "rank " + std::to_string(q);
      if (peer.slotCount != geometry_.slotCount || peer.slotBytes != geometry_.slotBytes)
        throwInvalidUsage(who + " set its GPU FIFOs up with " + std::to_string(peer.slotCount) + " slots of " +
                          std::to_string(peer.slotBytes) + " bytes, rank " + std::to_string(context.rank) + " with " +
                          std::to_string(geometry_.slotCount) + " of " + std::to_string(geometry_.slotBytes) +
                          "; set TOPOCCL_GPU_FIFO_SLOTS and TOPOCCL_GPU_SLOT_BYTES alike on every rank");
      if (q == context.rank) {
        peerBlocks_[static_cast<size_t>(q)] = receiveBlock_;
        continue;
      }
      if (info.hostId != me.hostId)
        throwInvalidUsage(who + " is on another host (" + info.hostId + "): GPU buffers across hosts are not " +
                          "supported yet; pass host buffers, which go over the network transports");
      if (peer.device != device_) {
        int canAccess = 0;
        check(cudaDeviceCanAccessPeer(&canAccess, device_, peer.device), "cudaDeviceCanAccessPeer");
        if (!canAccess)
          throwInvalidUsage(who + " uses GPU " + std::to_string(peer.device) + ", which GPU " + std::to_string(device_) +
                            " cannot access directly (no P2P); staging through host memory is not built yet");
        const cudaError_t enabled = cudaDeviceEnablePeerAccess(peer.device, 0);
        if (enabled != cudaErrorPeerAccessAlreadyEnabled) check(enabled, "cudaDeviceEnablePeerAccess to GPU " + std::to_string(peer.device));
        cudaGetLastError();
      }
      if (info.processToken == me.processToken) {
        peerBlocks_[static_cast<size_t>(q)] = reinterpret_cast<char*>(peer.address);  // same address space
        if (peer.device == device_ && params::kGpuLaunchOrder.get()) launchOrder_.addPeer(q, peer.launchOrderKey);
      } else {
        if (std::memcmp(peer.uuid, mine.uuid, sizeof(mine.uuid)) == 0)
          processesOnThisGpu += (processesOnThisGpu.empty() ? "" : ", ") + std::to_string(q);
        if (!peer.ipcValid) throwInvalidUsage(who + " could not export its GPU FIFOs through CUDA IPC");
        void* mapped = nullptr;
        check(cudaIpcOpenMemHandle(&mapped, peer.handle, cudaIpcMemLazyEnablePeerAccess),
              "cudaIpcOpenMemHandle of " + who + "'s GPU FIFOs");
        peerBlocks_[static_cast<size_t>(q)] = static_cast<char*>(mapped);
        opened_[static_cast<size_t>(q)] = true;
      }
    }
    for (auto& slot : slots_) {
      check(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming), "cudaEventCreate");
      // Pinned now, while no launch of a peer in this process can be waiting on us (see DeviceArena).
      check(cudaHostAlloc(reinterpret_cast<void**>(&slot.host), kInitialImageBytes, cudaHostAllocDefault), "cudaHostAlloc of a plan image");
      slot.hostCapacity = kInitialImageBytes;
    }
    check(cudaEventCreateWithFlags(&singleRankDone_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&joinEvent_, cudaEventDisableTiming), "cudaEventCreate");
    if (!processesOnThisGpu.empty() && !mpsControlFound())
      TOPOCCL_WARN("GPU path: rank %d shares GPU %d with rank(s) %s of other processes and no MPS daemon was found "
                   "($CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps): the GPU time-slices between processes, so each "
                   "hand-off between them waits for a slice, milliseconds a call. Start MPS (nvidia-cuda-mps-control -d) "
                   "or run these ranks as threads of one process",
                   context.rank, device_, processesOnThisGpu.c_str());
    placePointToPoint(all);
    watchdog_ = std::thread([this] { watch(); });
    TOPOCCL_INFO(log::kInit, "GPU path: rank %d on GPU %d, %llu-slot FIFOs of %llu bytes, %d channel(s), %u threads a lane%s",
                 context.rank, device_, static_cast<unsigned long long>(geometry_.slotCount),
                 static_cast<unsigned long long>(geometry_.slotBytes), channels_, threads_,
                 launchOrder_.hasPeers() ? ", launches ordered with the thread ranks sharing its GPU" : "");
  }

  ~CudaGpuPath() override {
    // Let what is in flight finish (or stop, once the timeout passes), then give everything back.
    const auto deadline = std::chrono::steady_clock::now() + context_.timeout;
    for (;;) {
      {
        std::lock_guard lock(mutex_);
        if (watched_.empty()) break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stop_.store(true);
    if (watchdog_.joinable()) watchdog_.join();
    // Our launches only (they run in order); not the device, which other ranks of this process may use.
    if (lastDone_) cudaEventSynchronize(lastDone_);
    for (auto& w : watched_) cudaEventDestroy(w.event);
    if (singleRankDone_) cudaEventDestroy(singleRankDone_);
    if (joinEvent_) cudaEventDestroy(joinEvent_);
    for (auto& slot : slots_) {
      if (slot.done) cudaEventDestroy(slot.done);
      if (slot.host) cudaFreeHost(slot.host);
      if (slot.device) cudaFreeAsync(slot.device, cudaStreamPerThread);
    }
    for (char* host : retiredHost_) cudaFreeHost(host);
    cudaStreamSynchronize(cudaStreamPerThread);
    for (size_t q = 0; q < peerBlocks_.size(); ++q)
      if (opened_[q]) cudaIpcCloseMemHandle(peerBlocks_[q]);
    if (receiveBlock_) cudaFree(receiveBlock_);
    if (laneDone_) cudaFree(laneDone_);
    if (hostFlags_) cudaFreeHost(hostFlags_);
  }

  void enqueue(const std::vector<GpuCall>& calls, void* streamHandle) override {
    std::string failure;
    if (asyncError(failure) != ncclSuccess) throwInvalidUsage("the GPU path of this communicator failed earlier: " + failure);
    const ScopedGpuDevice onOurDevice(device_);
    auto stream = static_cast<cudaStream_t>(streamHandle);
    // Every call is checked before anything is enqueued.
    std::vector<PreparedCall> prepared;
    prepared.reserve(calls.size());
    for (const GpuCall& call : calls)
      if (PreparedCall p = prepare(call); call.args->count > 0) prepared.push_back(std::move(p));
    if (prepared.empty()) return;
    // Nothing goes on the stream before the peers sharing our GPU from this process have enqueued the calls
    // before ours (launch_order.hpp): an input copy queued ahead of a peer's launch would block it too. After
    // each launch they meet again (launchChain), so this wait finds them there unless a call failed.
    launchOrder_.drivenByThisThread();
    const uint64_t firstCall = callsEnqueued_;
    waitForPeers(firstCall, prepared.front());
    // Launches of one communicator run in call order whatever streams they are on: they share the FIFO
    // counters, the lane counters and the work buffers (which the copies and reallocations below touch).
    if (lastStream_ != nullptr && lastStream_ != stream) check(cudaStreamWaitEvent(stream, lastDone_, 0), "ordering after the previous launch");
    if (context_.nranks == 1) {
      for (const PreparedCall& p : prepared) runSingleRank(p, stream);
      check(cudaEventRecord(singleRankDone_, stream), "cudaEventRecord");
      lastDone_ = singleRankDone_;
      lastStream_ = stream;
      return;
    }
    // Work buffers for every call at once: each call's input copy and scratch lie apart from the others'.
    size_t inputTotal = 0, scratchTotal = 0;
    for (PreparedCall& p : prepared) {
      p.inputOffset = inputTotal;
      inputTotal += alignUp(p.inputCopyBytes);
      p.scratchOffset = scratchTotal;
      scratchTotal += alignUp(p.scratchBytes);
    }
    char* inputBase = inputTotal ? inputCopy_.reserve(inputTotal, stream) : nullptr;
    char* scratchBase = scratchTotal ? scratch_.reserve(scratchTotal, stream) : nullptr;
    for (PreparedCall& p : prepared) lowerCall(p, inputBase, scratchBase, stream);

    // Consecutive calls share a launch while they can: one kernel (type, operator), independent buffers and
    // every connection on one lane (ChainedConnections).
    const bool fuse = params::kGpuFuseGroups.get();
    for (size_t begin = 0; begin < prepared.size();) {
      ChainedConnections connections;
      connections.admit(prepared[begin].lowered);
      size_t end = begin + 1;
      while (fuse && end < prepared.size() && chainable(prepared, begin, end) && connections.admit(prepared[end].lowered)) ++end;
      launchChain(prepared, begin, end, stream, firstCall + end);
      begin = end;
    }
  }

  uint32_t pointToPointLanes(bool everyRankIssuedHere) const override {
    return gpuPointToPointLanes(p2pMode_, p2pPlacement_, everyRankIssuedHere);
  }

  void enqueuePointToPoint(const std::vector<DevicePointToPoint>& calls, void* streamHandle,
                           const std::vector<void*>& otherStreams) override {
    std::string failure;
    if (asyncError(failure) != ncclSuccess) throwInvalidUsage("the GPU path of this communicator failed earlier: " + failure);
    const uint32_t lanes = gpuPointToPointMaxLanes(p2pPlacement_.nranks, p2pPlacement_.maxLanes);
    if (lanes == 0) throwInternalError("sends and receives reached the GPU path of a communicator that stages them");
    const ScopedGpuDevice onOurDevice(device_);
    auto stream = static_cast<cudaStream_t>(streamHandle);
    const LoweredPlan lowered = lowerPointToPoint(
        calls, context_.rank, [&](int peer, int channel, bool sending) { return fifo(peer, channel, sending); }, geometry_,
        lanes, kMaxLanes);
    if (lowered.lanes.empty()) return;  // nothing but empty messages
    // After this communicator's earlier launches, which share the FIFO counters and lane counters. Not ordered
    // with the thread ranks sharing our GPU (launch_order.hpp counts collectives, which every rank calls alike):
    // pointToPointLanes stages sends and receives where such ranks issue their own calls, unless TOPOCCL_GPU_P2P=kernel.
    if (lastStream_ != nullptr && lastStream_ != stream) check(cudaStreamWaitEvent(stream, lastDone_, 0), "ordering after the previous launch");
    for (void* other : otherStreams) {
      if (other == streamHandle) continue;
      check(cudaEventRecord(joinEvent_, static_cast<cudaStream_t>(other)), "cudaEventRecord");
      check(cudaStreamWaitEvent(stream, joinEvent_, 0), "joining the group's other streams");
    }
    size_t sends = 0, receives = 0;
    uint64_t bytes = 0;
    std::string to, from;  // the peers, for the watchdog's message
    for (const DevicePointToPoint& c : calls) {
      if (c.bytes == 0) continue;
      (c.isSend ? sends : receives) += 1;
      bytes += c.isSend ? c.bytes : 0;
      std::string& list = c.isSend ? to : from;
      const std::string peer = std::to_string(c.peer);
      if ((", " + list + ",").find(", " + peer + ",") == std::string::npos) list += (list.empty() ? "" : ", ") + peer;
    }
    const std::string what = std::to_string(sends) + " send(s) (" + std::to_string(bytes) + " bytes" +
                             (to.empty() ? "" : " to rank " + to) + ") and " + std::to_string(receives) + " receive(s)" +
                             (from.empty() ? "" : " from rank " + from) + " of a group";
    const size_t imageBytes = (deviceImageBytes(lowered) + 63) / 64 * 64;
    ImageSlot& slot = reserveImageSlot(imageBytes, stream);
    kernels::DevicePlan header;
    header.protocol = kernels::DeviceProtocol::Simple;
    header.geometry = geometry_;
    header.laneDone = laneDone_;
    header.launchBase = ++launches_ << 32;
    header.abortFlag = deviceFlags_;
    header.status = deviceFlags_ + 1;
    writeDeviceImage(lowered, header, slot.host, reinterpret_cast<uintptr_t>(slot.device));
    check(cudaMemcpyAsync(slot.device, slot.host, imageBytes, cudaMemcpyHostToDevice, stream), "uploading the plan");
    check(kernels::launchPlan(DataType::Uint8, ReduceOp::Sum, false, reinterpret_cast<const kernels::DevicePlan*>(slot.device),
                              static_cast<uint32_t>(lowered.lanes.size()), threads_, stream),
          "launching " + what);
    finishLaunch(slot, what, stream,
                 "A peer may have died, not posted the matching receive or send, or posted it on a host buffer (a send in "
                 "the plan kernel needs its receive on a GPU buffer; TOPOCCL_GPU_P2P=staged mixes them).");
    for (void* other : otherStreams)
      if (other != streamHandle) check(cudaStreamWaitEvent(static_cast<cudaStream_t>(other), slot.done, 0), "ordering the group's other streams");
  }

  void drivenByThisThread() override { launchOrder_.drivenByThisThread(); }

  void abort() override { __atomic_store_n(&hostFlags_[0], 1, __ATOMIC_RELAXED); }

  ncclResult_t asyncError(std::string& message) const override {
    std::lock_guard lock(mutex_);
    message = failure_;
    return failure_.empty() ? ncclSuccess : failureCode_;
  }

 private:
  // A call, checked and with its reduction lowered as the host path does: PreMulSum and floating Avg scale
  // each input once up front (into the input copy), integer Avg sums and divides the result; the plan
  // kernel sees Sum/Prod/Max/Min.
  struct PreparedCall {
    const GpuCall* call = nullptr;
    bool reduces = false;
    ReduceOp op = ReduceOp::Sum;
    ReduceOp kernelOp = ReduceOp::Sum;
    unsigned char hostScalar[8] = {};
    const void* deviceScalar = nullptr;
    size_t elem = 0;
    uint32_t inBlocks = 0, outBlocks = 0;
    const char* input = nullptr;  // what the plan reads: the caller's input, or its copy
    char* output = nullptr;
    size_t inputBytes = 0, outputBytes = 0;  // the caller's buffers, as this rank uses them
    size_t inputCopyBytes = 0;  // scaled or set-apart input (0: the plan reads the caller's)
    size_t scratchBytes = 0;
    size_t inputOffset = 0, scratchOffset = 0;  // in the launch's shared work buffers
    LoweredPlan lowered;
    CallFootprint footprint() const { return {call->args->send, inputBytes, output, outputBytes}; }
  };

  static size_t alignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

  void waitForPeers(uint64_t calls, const PreparedCall& p) const {
    if (!launchOrder_.hasPeers()) return;
    launchOrder_.waitForPeers(calls, context_.timeout, [this] { return __atomic_load_n(&hostFlags_[0], __ATOMIC_RELAXED) != 0; },
                              std::string(algo::collectiveName(p.call->args->collective)) + " on GPU buffers");
  }

  PreparedCall prepare(const GpuCall& call) const {
    const CollectiveArgs& args = *call.args;
    const algo::Collective c = args.collective;
    PreparedCall p;
    p.call = &call;
    p.reduces = c == algo::Collective::AllReduce || c == algo::Collective::ReduceScatter || c == algo::Collective::Reduce;
    if (p.reduces && !kernels::isKernelOp(args.reduce.op) && args.reduce.op != ReduceOp::Avg && args.reduce.op != ReduceOp::PreMulSum)
      throwInvalidArgument(std::string(algo::collectiveName(c)) + " on GPU buffers: operator " + reduceOpName(args.reduce.op) +
                           " is not supported on the GPU path");
    const int rank = context_.rank, n = context_.nranks;
    p.elem = dataTypeSize(args.type);
    p.inBlocks = algo::inputBlocks(c, n, rank, args.root);
    p.outBlocks = algo::outputBlocks(c, n, rank, args.root);
    p.input = static_cast<const char*>(args.send);
    p.output = static_cast<char*>(args.recv);
    p.inputBytes = static_cast<size_t>(p.inBlocks) * args.count * p.elem;
    p.outputBytes = static_cast<size_t>(p.outBlocks) * args.count * p.elem;
    p.op = p.reduces ? args.reduce.op : ReduceOp::Sum;
    std::memcpy(p.hostScalar, args.reduce.scalar, sizeof(p.hostScalar));
    if (p.op == ReduceOp::Avg && isFloatingPoint(args.type)) {
      kernels::reciprocalScalar(args.type, static_cast<uint64_t>(n), p.hostScalar);
      p.op = ReduceOp::PreMulSum;
    } else if (p.op == ReduceOp::PreMulSum && args.reduce.scalarPointer != nullptr) {
      // ncclScalarDevice: read on the device when the scale runs; a host pointer is read now.
      if (isGpuPointer(args.reduce.scalarPointer)) p.deviceScalar = args.reduce.scalarPointer;
      else std::memcpy(p.hostScalar, args.reduce.scalarPointer, p.elem);
    }
    p.kernelOp = p.op == ReduceOp::PreMulSum || p.op == ReduceOp::Avg ? ReduceOp::Sum : p.op;
    if (n > 1 && args.count > 0) {
      const algo::Plan& plan = *call.plan;
      if ((p.op == ReduceOp::PreMulSum || (call.inPlace && !plan.inPlace)) && p.inBlocks > 0) p.inputCopyBytes = p.inputBytes;
      else if (!call.inPlace && !plan.outOfPlace)
        throwInternalError("plan '" + plan.name + "' for " + algo::collectiveName(c) + " supports only in-place buffers");
      p.scratchBytes = core::scratchBytes(plan, args.count, p.elem);
    }
    return p;
  }

  // One rank: the result is the input (PreMulSum: scaled; an Avg over one rank is the value itself).
  void runSingleRank(const PreparedCall& p, cudaStream_t stream) {
    const CollectiveArgs& args = *p.call->args;
    if (p.op == ReduceOp::PreMulSum)
      check(kernels::launchScale(args.type, p.output, p.input, args.count, p.hostScalar, p.deviceScalar, stream), "scaling a one-rank PreMulSum");
    else if (p.output != p.input)
      check(cudaMemcpyAsync(p.output, p.input, args.count * p.elem, cudaMemcpyDeviceToDevice, stream), "copying a one-rank collective");
  }

  // Enqueues the call's input scaling or copy into its share of the input buffer, and lowers its plan.
  void lowerCall(PreparedCall& p, char* inputBase, char* scratchBase, cudaStream_t stream) {
    const CollectiveArgs& args = *p.call->args;
    if (p.inputCopyBytes > 0) {
      char* copy = inputBase + p.inputOffset;
      if (p.op == ReduceOp::PreMulSum)
        check(kernels::launchScale(args.type, copy, p.input, static_cast<size_t>(p.inBlocks) * args.count, p.hostScalar,
                                   p.deviceScalar, stream),
              "scaling the input (PreMulSum)");
      else  // the plan needs its input apart from its output
        check(cudaMemcpyAsync(copy, p.input, p.inputCopyBytes, cudaMemcpyDeviceToDevice, stream), "copying the input");
      p.input = copy;
    }
    const PlanBuffers buffers{p.input, p.output, p.scratchBytes ? scratchBase + p.scratchOffset : nullptr, args.count, p.elem};
    const kernels::DeviceProtocol protocol = p.call->protocol == algo::Protocol::LowLatency ? kernels::DeviceProtocol::LowLatency
                                                                                             : kernels::DeviceProtocol::Simple;
    p.lowered = lowerPlan(
        *p.call->plan, context_.rank, buffers, [&](int peer, int channel, bool sending) { return fifo(peer, channel, sending); },
        protocol, geometry_);
    if (p.lowered.lanes.size() > kMaxLanes)
      throwInvalidUsage("plan '" + p.call->plan->name + "' gives rank " + std::to_string(context_.rank) + " " +
                        std::to_string(p.lowered.lanes.size()) + " lanes; the GPU path runs at most " + std::to_string(kMaxLanes));
  }

  // Whether call `next` may run in the launch of calls [begin, next): the same kernel (type, operator) and
  // buffers independent of theirs.
  static bool chainable(const std::vector<PreparedCall>& prepared, size_t begin, size_t next) {
    const PreparedCall& c = prepared[next];
    std::vector<CallFootprint> earlier;
    for (size_t k = begin; k < next; ++k) {
      const PreparedCall& e = prepared[k];
      if (e.call->args->type != c.call->args->type || (e.reduces && c.reduces && e.kernelOp != c.kernelOp)) return false;
      earlier.push_back(e.footprint());
    }
    return independentOf(c.footprint(), earlier);
  }

  // One launch for calls [begin, end): their plan images back to back in one slot, each pointing at the next.
  // `callsAfter`: this rank's GPU calls once these are enqueued.
  void launchChain(const std::vector<PreparedCall>& prepared, size_t begin, size_t end, cudaStream_t stream, uint64_t callsAfter) {
    std::vector<size_t> offsets;
    size_t imageBytes = 0;
    for (size_t k = begin; k < end; ++k) {
      offsets.push_back(imageBytes);
      imageBytes += (deviceImageBytes(prepared[k].lowered) + 63) / 64 * 64;
    }
    ImageSlot& slot = reserveImageSlot(imageBytes, stream);
    uint32_t lanes = 0;
    bool reduces = false;
    ReduceOp kernelOp = ReduceOp::Sum;
    for (size_t k = begin; k < end; ++k) {
      const PreparedCall& p = prepared[k];
      const size_t i = k - begin;
      kernels::DevicePlan header;
      header.protocol = p.call->protocol == algo::Protocol::LowLatency ? kernels::DeviceProtocol::LowLatency
                                                                        : kernels::DeviceProtocol::Simple;
      header.geometry = geometry_;
      header.laneDone = laneDone_;
      header.launchBase = ++launches_ << 32;
      header.abortFlag = deviceFlags_;
      header.status = deviceFlags_ + 1;
      header.next = k + 1 < end ? reinterpret_cast<const kernels::DevicePlan*>(slot.device + offsets[i + 1]) : nullptr;
      writeDeviceImage(p.lowered, header, slot.host + offsets[i], reinterpret_cast<uintptr_t>(slot.device + offsets[i]));
      lanes = std::max(lanes, static_cast<uint32_t>(p.lowered.lanes.size()));
      if (p.reduces && !reduces) kernelOp = p.kernelOp;
      reduces = reduces || p.reduces;
    }
    const PreparedCall& first = prepared[begin];
    const CollectiveArgs& firstArgs = *first.call->args;
    std::string what = std::string(algo::collectiveName(firstArgs.collective)) + " (" + first.call->plan->name + ", " +
                       std::to_string(firstArgs.count) + " x " + dataTypeName(firstArgs.type) + ")";
    if (end - begin > 1) {
      what += " and " + std::to_string(end - begin - 1) + " more call(s) of its group in the same launch";
      TOPOCCL_INFO(log::kColl, "rank %d: %zu GPU calls of a group fused into one launch of %u lanes", context_.rank, end - begin, lanes);
    }

    check(cudaMemcpyAsync(slot.device, slot.host, imageBytes, cudaMemcpyHostToDevice, stream), "uploading the plan");
    check(kernels::launchPlan(firstArgs.type, kernelOp, reduces, reinterpret_cast<const kernels::DevicePlan*>(slot.device), lanes,
                              threads_, stream),
          "launching " + what);
    // What follows on this stream waits for the plan (the division below, the caller's next work), so it may
    // not enter a shared hardware queue ahead of a peer's launch of the same calls (launch_order.hpp): the
    // thread ranks sharing our GPU meet here. On an H200 the division alone stalled every run with one queue.
    callsEnqueued_ = callsAfter;
    launchOrder_.published(callsAfter);
    std::exception_ptr orderFailure;
    try {
      waitForPeers(callsAfter, first);
    } catch (const Error& e) {
      fail(e.code(), e.what());
      abort();  // the plan we launched would wait for that peer forever
      orderFailure = std::current_exception();
    }
    for (size_t k = begin; k < end && !orderFailure; ++k) {
      const PreparedCall& p = prepared[k];
      if (p.op == ReduceOp::Avg && p.outBlocks > 0)  // integer Avg: the sum divided by the ranks, truncated
        check(kernels::launchDivide(p.call->args->type, p.output, p.output, static_cast<size_t>(p.outBlocks) * p.call->args->count,
                                    static_cast<uint64_t>(context_.nranks), stream),
              "dividing the sum (integer Avg)");
    }
    finishLaunch(slot, what, stream);
    if (orderFailure) std::rethrow_exception(orderFailure);
  }

  struct ImageSlot {
    cudaEvent_t done = nullptr;
    char* host = nullptr;  // pinned
    size_t hostCapacity = 0;
    char* device = nullptr;
    size_t capacity = 0;
    bool used = false;
  };
  struct Watched {
    cudaEvent_t event;
    std::chrono::steady_clock::time_point since;
    std::string what;
    std::string hint;  // what to look at when it times out
  };

  // The next of the image slots, once the launch that last used it is done, grown to `imageBytes`.
  ImageSlot& reserveImageSlot(size_t imageBytes, cudaStream_t stream) {
    ImageSlot& slot = slots_[nextSlot_++ % kImageSlots];
    if (slot.used) check(cudaEventSynchronize(slot.done), "waiting for an earlier launch");
    if (imageBytes > slot.hostCapacity) {
      // Rare (a plan of many steps): freeing pinned memory may wait for the device, so the old buffer is kept.
      retiredHost_.push_back(slot.host);
      slot.host = nullptr;
      slot.hostCapacity = 0;
      const size_t grown = std::max(imageBytes, 2 * kInitialImageBytes);
      check(cudaHostAlloc(reinterpret_cast<void**>(&slot.host), grown, cudaHostAllocDefault), "cudaHostAlloc of a plan image");
      slot.hostCapacity = grown;
    }
    if (imageBytes > slot.capacity) {
      if (slot.device) check(cudaFreeAsync(slot.device, stream), "cudaFreeAsync of a plan image");
      slot.device = nullptr;
      slot.capacity = 0;
      check(allocateOnStream(reinterpret_cast<void**>(&slot.device), imageBytes, stream), "cudaMallocAsync of a plan image");
      slot.capacity = imageBytes;
    }
    return slot;
  }

  // After a launch on `stream`: the slot's event, the ordering of later launches, and the watchdog's entry.
  void finishLaunch(ImageSlot& slot, const std::string& what, cudaStream_t stream,
                    const std::string& hint = "A peer may have died or not called the same collective.") {
    check(cudaEventRecord(slot.done, stream), "cudaEventRecord");
    slot.used = true;
    lastDone_ = slot.done;
    lastStream_ = stream;
    cudaEvent_t watched = nullptr;
    check(cudaEventCreateWithFlags(&watched, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(watched, stream), "cudaEventRecord");
    std::lock_guard lock(mutex_);
    watched_.push_back({watched, std::chrono::steady_clock::now(), what, hint});
  }

  // Where the ranks sit, as sends and receives care (gpuPointToPointLanes), alike on every rank from what all
  // exchanged; says at set-up how they will run.
  void placePointToPoint(const std::vector<FifoExchange>& all) {
    p2pMode_ = params::kGpuP2p.get();
    const int n = context_.nranks;
    p2pPlacement_.nranks = n;
    p2pPlacement_.maxLanes = std::min<int>(static_cast<int>(kMaxLanes), context_.maxLanes);
    for (int q = 0; q < n; ++q)
      for (int p = q + 1; p < n; ++p) {
        const FifoExchange &a = all[static_cast<size_t>(q)], &b = all[static_cast<size_t>(p)];
        if (std::memcmp(a.uuid, b.uuid, sizeof(a.uuid)) != 0) continue;
        if (context_.peers[static_cast<size_t>(q)].processToken == context_.peers[static_cast<size_t>(p)].processToken)
          p2pPlacement_.threadsShareGpu = true;
        else if (!a.mpsFound || !b.mpsFound)
          p2pPlacement_.processesShareGpuWithoutMps = true;
      }
    const uint32_t alone = gpuPointToPointLanes(p2pMode_, p2pPlacement_, false);  // validates the mode
    const uint32_t driven = gpuPointToPointLanes(p2pMode_, p2pPlacement_, true);
    const char* where = "sends and receives on GPU buffers";
    if (alone > 0)
      TOPOCCL_INFO(log::kInit, "rank %d: %s run in the plan kernel, up to %u lane(s) a message", context_.rank, where, alone);
    else if (driven > 0)
      TOPOCCL_INFO(log::kInit, "rank %d: %s run in the plan kernel, up to %u lane(s) a message, where one thread issues every "
                   "rank's calls; else through host memory, since ranks that are threads share a GPU (TOPOCCL_GPU_P2P)",
                   context_.rank, where, driven);
    else
      TOPOCCL_INFO(log::kInit, "rank %d: %s go through host memory (TOPOCCL_GPU_P2P=%s%s)", context_.rank, where, p2pMode_.c_str(),
                   gpuPointToPointMaxLanes(n, p2pPlacement_.maxLanes) == 0 ? "; a group could need more lanes than stay resident"
                   : p2pPlacement_.processesShareGpuWithoutMps ? "; processes share a GPU without MPS" : "");
  }

  size_t fifoBytes() const {
    return sizeof(kernels::DeviceFifoCounters) + geometry_.simpleBytes() + geometry_.lowLatencyBytes();
  }

  // Sending: our FIFO in the peer's block; receiving: the peer's FIFO in ours.
  kernels::DeviceFifo fifo(int peer, int channel, bool sending) const {
    if (channel < 0 || channel >= channels_)
      throwInvalidUsage("the plan uses channel " + std::to_string(channel) + "; the GPU path set up " +
                        std::to_string(channels_) + " (TOPOCCL_NCHANNELS)");
    const int sender = sending ? context_.rank : peer;
    char* block = sending ? peerBlocks_[static_cast<size_t>(peer)] : receiveBlock_;
    char* base = block + (static_cast<size_t>(sender) * static_cast<size_t>(channels_) + static_cast<size_t>(channel)) * fifoBytes();
    kernels::DeviceFifo f;
    f.counters = reinterpret_cast<kernels::DeviceFifoCounters*>(base);
    f.slots = base + sizeof(kernels::DeviceFifoCounters);
    f.lines = reinterpret_cast<uint64_t*>(f.slots + geometry_.simpleBytes());
    f.slotCount = geometry_.slotCount;
    return f;
  }

  void fail(ncclResult_t code, const std::string& message) {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) {
      failure_ = message;
      failureCode_ = code;
    }
  }

  // Retires finished launches; turns one that outlives the timeout, or a lane that gave up, into an abort.
  void watch() {
    cudaSetDevice(device_);
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (__atomic_load_n(&hostFlags_[1], __ATOMIC_RELAXED) != kernels::kPlanRunning)
        fail(ncclRemoteError, "rank " + std::to_string(context_.rank) + ": a GPU collective stopped early (ncclCommAbort or a timeout)");
      for (;;) {
        cudaEvent_t event = nullptr;
        {
          std::lock_guard lock(mutex_);
          if (watched_.empty()) break;
          event = watched_.front().event;  // only this thread pops, so the front stays
        }
        // Outside the lock: a CUDA call may wait in the driver behind another thread, and asyncError() (PyTorch's
        // watchdog calls it) must not wait with it.
        const cudaError_t state = cudaEventQuery(event);
        {
          std::lock_guard lock(mutex_);
          const Watched& oldest = watched_.front();
          if (state == cudaErrorNotReady) {
            if (std::chrono::steady_clock::now() - oldest.since > context_.timeout && failure_.empty()) {
              failure_ = "rank " + std::to_string(context_.rank) + ": " + oldest.what + " on the GPU did not finish within " +
                         std::to_string(context_.timeout.count()) + " ms (TOPOCCL_TIMEOUT_MS); aborted. " + oldest.hint;
              failureCode_ = ncclRemoteError;
              __atomic_store_n(&hostFlags_[0], 1, __ATOMIC_RELAXED);
            }
            break;
          }
          if (state != cudaSuccess && failure_.empty()) {
            failure_ = "rank " + std::to_string(context_.rank) + ": " + oldest.what + " failed on the GPU: " + cudaGetErrorString(state);
            failureCode_ = ncclUnhandledCudaError;
          }
          watched_.pop_front();
        }
        cudaEventDestroy(event);
      }
    }
  }

  GpuPathContext context_;
  int device_ = 0;
  int channels_ = 1;
  unsigned threads_ = 256;
  kernels::DeviceFifoGeometry geometry_;
  char* receiveBlock_ = nullptr;
  std::vector<char*> peerBlocks_;
  std::vector<bool> opened_;
  uint64_t* laneDone_ = nullptr;
  uint64_t* hostFlags_ = nullptr;    // [0] abort, [1] status: mapped host memory the kernels poll and write
  uint64_t* deviceFlags_ = nullptr;  // the same, as the device sees it
  DeviceArena scratch_;
  DeviceArena inputCopy_;
  std::array<ImageSlot, kImageSlots> slots_{};
  std::vector<char*> retiredHost_;  // outgrown pinned image buffers, freed with the communicator
  size_t nextSlot_ = 0;
  uint64_t launches_ = 0;
  std::string p2pMode_ = "auto";  // placePointToPoint
  GpuPointToPointPlacement p2pPlacement_;
  LaunchOrder launchOrder_;
  uint64_t callsEnqueued_ = 0;  // this rank's non-empty GPU calls so far (every rank counts the same)
  cudaStream_t lastStream_ = nullptr;
  cudaEvent_t lastDone_ = nullptr;
  cudaEvent_t singleRankDone_ = nullptr;  // one-rank communicators copy instead of launching
  cudaEvent_t joinEvent_ = nullptr;       // a group's other streams, joined before a launch
  mutable std::mutex mutex_;
  std::deque<Watched> watched_;
  std::string failure_;
  ncclResult_t failureCode_ = ncclSuccess;
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

}  // namespace

GpuIdentity currentGpuIdentity() {
  GpuIdentity identity;
  if (!gpuAvailable()) return identity;
  int device = 0;
  cudaDeviceProp props{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&props, device) != cudaSuccess) {
    cudaGetLastError();
    return identity;
  }
  std::memcpy(identity.uuid, props.uuid.bytes, sizeof(identity.uuid));
  identity.multiprocessors = props.multiProcessorCount;
  return identity;
}

bool gpuAvailable() {
  static const bool available = [] {
    int devices = 0;
    const bool ok = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
    cudaGetLastError();
    return ok;
  }();
  return available;
}

bool isGpuPointer(const void* pointer) {
  if (pointer == nullptr || !gpuAvailable()) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

int gpuDeviceOf(const void* pointer) {
  if (pointer == nullptr || !gpuAvailable()) return -1;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged ? attributes.device : -1;
}

ScopedGpuDevice::ScopedGpuDevice(int device) {
  if (device < 0) return;
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current == device) return;
  check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  saved_ = current;
}

ScopedGpuDevice::~ScopedGpuDevice() {
  if (saved_ >= 0) cudaSetDevice(saved_);
}

// Stream-ordered, on this thread's own stream: cudaFree would wait for the whole device, including a peer
// rank's kernel (ranks as threads of one process) that waits for this rank's next call.
void* gpuAllocate(size_t bytes) {
  void* pointer = nullptr;
  check(allocateOnStream(&pointer, bytes, cudaStreamPerThread), "cudaMallocAsync of " + std::to_string(bytes) + " bytes of GPU memory");
  check(cudaStreamSynchronize(cudaStreamPerThread), "cudaMallocAsync of " + std::to_string(bytes) + " bytes of GPU memory");
  return pointer;
}

bool gpuFree(void* pointer) {
  if (!isGpuPointer(pointer)) return false;
  check(cudaFreeAsync(pointer, cudaStreamPerThread), "cudaFreeAsync");
  check(cudaStreamSynchronize(cudaStreamPerThread), "cudaFreeAsync");
  return true;
}

std::unique_ptr<GpuPath> makeGpuPath(const GpuPathContext& context) {
  if (!gpuAvailable()) throwInvalidUsage("GPU buffers were passed but no GPU is visible to this process");
  return std::make_unique<CudaGpuPath>(context);
}

#endif

}  // namespace topoccl::core
