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

struct GpuPathContext {
  int rank = 0;
  int nranks = 0;
  int nchannels = 1;
  std::vector<transport::PeerInfo> peers;
  std::chrono::milliseconds timeout{60000};
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
