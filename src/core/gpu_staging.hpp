// GPU buffers through host memory: the host proxy. stage() enqueues on the caller's stream the copies of the
// operations' GPU inputs into pinned host memory, then a one-thread kernel that waits for the progress engine,
// then the copies of the outputs back; it returns the operations rewritten onto the pinned copies, and the
// hooks the engine runs around them: `before` waits for the copies in, `after` releases the waiting kernel.
// So the host path (shm, TCP, its plans and timeouts) runs the call in the communicator's usual order, and the
// stream sees it as one enqueued operation. Used for point-to-point on GPU buffers and for collectives whose
// peers the GPU path cannot reach (other hosts). CUDA-free header; without CUDA makeGpuStaging throws.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "core/communicator.hpp"
#include "core/work.hpp"

namespace topoccl::core {

class GpuStaging {
 public:
  virtual ~GpuStaging() = default;
  // Rewrites `operations` (GPU pointers become pinned host copies; host pointers stay) and enqueues the
  // stream's side on `stream` (joined by `otherStreams`). The returned hooks must reach the engine with the
  // operations, in the order stage() was called (the waiting kernels are released in that order).
  virtual JobHooks stage(std::vector<Operation>& operations, void* stream,
                         const std::vector<void*>& otherStreams) = 0;
  // ncclCommAbort: every waiting kernel returns (the outputs are then undefined; the error is asynchronous).
  virtual void abort() = 0;
};

// `timeout`: how long `before` waits for the stream to reach the copies (TOPOCCL_TIMEOUT_MS).
std::unique_ptr<GpuStaging> makeGpuStaging(int rank, int nranks, std::chrono::milliseconds timeout);

}  // namespace topoccl::core
