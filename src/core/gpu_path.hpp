// Collectives on GPU buffers: the communicator hands a selected plan and the call's arguments to its GpuPath,
// which lowers the plan for this rank (device_lowering.hpp), uploads it, and launches the plan kernel
// (kernels/cuda_plan.hpp) on the caller's stream, returning at once as NCCL does. Peers on this host are
// reached through FIFOs in the receiver's GPU memory (CUDA IPC between processes, plain pointers between
// ranks that are threads, several ranks on one GPU included). A watchdog turns a launch that does not finish
// within TOPOCCL_TIMEOUT_MS into an abort and an asynchronous error. CUDA-free header: builds without CUDA
// compile it too and report that the GPU path is missing.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/plan.hpp"
#include "algorithms/selection.hpp"
#include "common/datatype.hpp"
#include "core/device_lowering.hpp"
#include "kernels/device_plan.hpp"
#include "transport/transport.hpp"

namespace topoccl::core {

struct CollectiveArgs;

// Whether this process can run GPU collectives: a CUDA build and at least one visible device (checked once).
bool gpuAvailable();
// Whether `pointer` is GPU memory (device or managed). False, without touching CUDA, when !gpuAvailable().
bool isGpuPointer(const void* pointer);
// ncclMemAlloc / ncclMemFree on a machine with a GPU: device memory.
void* gpuAllocate(size_t bytes);
// The device that holds `pointer` (-1: not GPU memory, or no GPU).
int gpuDeviceOf(const void* pointer);
// Makes `device` the calling thread's current device for its lifetime, then restores the caller's (NCCL's
// calls leave the current device as they found it). -1: changes nothing.
class ScopedGpuDevice {
 public:
  explicit ScopedGpuDevice(int device);
  ~ScopedGpuDevice();
  ScopedGpuDevice(const ScopedGpuDevice&) = delete;
  ScopedGpuDevice& operator=(const ScopedGpuDevice&) = delete;

 private:
  int saved_ = -1;
};
bool gpuFree(void* pointer);  // false: not GPU memory (the caller frees it otherwise)

// The calling thread's current GPU: its UUID and multiprocessor count (zeros without a CUDA build or device).
struct GpuIdentity {
  unsigned char uuid[16] = {};
  int32_t multiprocessors = 0;
};
GpuIdentity currentGpuIdentity();

// The FIFO geometry of a communicator of `nranks` (TOPOCCL_GPU_FIFO_SLOTS, TOPOCCL_GPU_SLOT_BYTES); throws,
// naming the setting, on a bad value.
kernels::DeviceFifoGeometry gpuFifoGeometry(int nranks);
// Receiving FIFO memory per rank above which rings stop gaining lanes (past the 8 they always may have).
inline constexpr size_t kGpuFifoBudgetBytes = size_t{1} << 30;

// Lanes of the GPU path's rings. The most a rank may run: every lane of every rank sharing a GPU must be
// resident at once (a lane may wait for another), so the GPU's multiprocessors over those ranks, a power
// of two from 1 to 32 (processes sharing a GPU take turns rather than run side by side; counted alike),
// and above 8 only while a rank's receiving FIFOs, `fifoBytesPerLane` a lane, stay within kGpuFifoBudgetBytes.
int gpuMaxRingLanes(int multiprocessors, int ranksOnGpu, size_t fifoBytesPerLane);
// For one call: a lane per 256 KiB each rank's share of the call brings, a power of two, from 8 (or the most,
// if lower) up to the most. Every rank computes the same from the same call.
int gpuRingLanes(size_t callBytes, int nranks, int maxLanes);

// Where the ranks of a communicator sit, as sends and receives on GPU buffers care (every rank computes the same).
struct GpuPointToPointPlacement {
  int nranks = 1;
  int maxLanes = 8;  // lanes a rank's launch may run with every lane of the ranks on its GPU resident
  bool threadsShareGpu = false;           // two ranks that are threads of one process use one GPU
  bool processesShareGpuWithoutMps = false;
};
// The lanes one message of a group may spread over in the plan kernel: a group with every peer in both directions
// and a self copy, 2 x nranks - 1 connections, must fit the resident lanes (and the kernel's 64). 0: it may not.
uint32_t gpuPointToPointMaxLanes(int nranks, int maxLanes);
// How one group of sends and receives runs: its lanes a message in the plan kernel, or 0 through host memory.
// `mode`: TOPOCCL_GPU_P2P (auto, kernel or staged). Auto stages them where processes share a GPU without MPS (a
// time slice every hand-off) and where ranks that are threads of one process share a GPU, unless
// `everyRankIssuedHere` (one thread issues the group of every rank, nccl-tests' -g, which orders their launches):
// their launches are ordered for collectives, not for sends, and a send's kernel could hold a hardware queue a
// peer's receive waits in (perf/RESULTS.md, session 43: stalls with CUDA_DEVICE_MAX_CONNECTIONS=1).
uint32_t gpuPointToPointLanes(const std::string& mode, const GpuPointToPointPlacement& placement, bool everyRankIssuedHere);

struct GpuPathContext {
  int rank = 0;
  int nranks = 0;
  int nchannels = 1;
  std::vector<transport::PeerInfo> peers;
  std::chrono::milliseconds timeout{60000};
  int maxLanes = 8;  // lanes one launch of this rank may run with every lane of the ranks on its GPU resident
  // Collective over the communicator: every rank's `bytesPerRank` bytes, in rank order, in place.
  std::function<void(void* data, size_t bytesPerRank)> allGather;
};

// One collective for the GPU path: its plan (alive until enqueue returns), arguments, whether its buffers are
// NCCL's in-place layout, and the selection table's protocol (every rank makes the same choices).
struct GpuCall {
  const algo::Plan* plan = nullptr;
  const CollectiveArgs* args = nullptr;
  bool inPlace = false;
  algo::Protocol protocol = algo::Protocol::Simple;
};

class GpuPath {
 public:
  virtual ~GpuPath() = default;
  // Enqueues the calls on `stream` (a cudaStream_t), in order, and returns. Calls of one group go together:
  // consecutive ones run as one launch (a chain of plans) where they can (TOPOCCL_GPU_FUSE_GROUPS): same
  // element type and reduction kernel, no buffer one writes that another reads or writes, and every
  // connection on one lane. Throws on bad input (unsupported operators) before enqueuing anything.
  virtual void enqueue(const std::vector<GpuCall>& calls, void* stream) = 0;
  // Over how many lanes one message of a group of sends and receives spreads where they run in the plan kernel
  // (enqueuePointToPoint), or 0 where they go through host memory instead (TOPOCCL_GPU_P2P). Every rank of the
  // communicator decides alike, from what all exchanged at set-up and `everyRankIssuedHere`: the calling thread
  // issues this group for every rank of the communicator (nccl-tests' -g), which orders their launches itself.
  virtual uint32_t pointToPointLanes(bool everyRankIssuedHere) const = 0;
  // Enqueues this rank's sends and receives of one group (in call order) on `stream` as one launch, and returns.
  // `otherStreams` join `stream` before the launch and wait for it after.
  virtual void enqueuePointToPoint(const std::vector<DevicePointToPoint>& calls, void* stream,
                                   const std::vector<void*>& otherStreams) = 0;
  // The calling thread now issues this rank's calls (a group that spans several communicators): peers it also
  // drives are not waited for (launch_order.hpp), since it issues their calls in call order itself.
  virtual void drivenByThisThread() = 0;
  // ncclCommAbort: every running lane stops at its next wait.
  virtual void abort() = 0;
  // The first failure a launch reported (abort, watchdog), or ncclSuccess.
  virtual ncclResult_t asyncError(std::string& message) const = 0;
};

// Sets up this rank's FIFOs and exchanges them with the peers: collective, on the first GPU call of every rank.
// Throws (naming the reason) without a CUDA build or a device, or when a peer is on another host.
std::unique_ptr<GpuPath> makeGpuPath(const GpuPathContext& context);

}  // namespace topoccl::core
