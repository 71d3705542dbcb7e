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

struct GpuPathContext {
  int rank = 0;
  int nranks = 0;
  int nchannels = 1;
  std::vector<transport::PeerInfo> peers;
  std::chrono::milliseconds timeout{60000};
  // Collective over the communicator: every rank's `bytesPerRank` bytes, in rank order, in place.
  std::function<void(void* data, size_t bytesPerRank)> allGather;
};

class GpuPath {
 public:
  virtual ~GpuPath() = default;
  // Enqueues the collective on `stream` (a cudaStream_t) and returns. `inPlace`: the call's buffers are the
  // NCCL in-place layout. Throws on bad input (host buffers, unsupported operators) before enqueuing anything.
  // `protocol`: the selection table's choice (every rank makes the same).
  virtual void enqueue(const algo::Plan& plan, const CollectiveArgs& args, bool inPlace, void* stream,
                       algo::Protocol protocol) = 0;
  // ncclCommAbort: every running lane stops at its next wait.
  virtual void abort() = 0;
  // The first failure a launch reported (abort, watchdog), or ncclSuccess.
  virtual ncclResult_t asyncError(std::string& message) const = 0;
};

// Sets up this rank's FIFOs and exchanges them with the peers: collective, on the first GPU call of every rank.
// Throws (naming the reason) without a CUDA build or a device, or when a peer is on another host.
std::unique_ptr<GpuPath> makeGpuPath(const GpuPathContext& context);

}  // namespace topoccl::core
