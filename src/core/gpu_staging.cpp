#include "core/gpu_staging.hpp"

#include <algorithm>
#include <atomic>
#include <deque>
#include <string>
#include <thread>

#include "common/error.hpp"
#include "common/log.hpp"

#if defined(TOPOCCL_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "kernels/cuda_plan.hpp"
#endif

namespace topoccl::core {

#if !defined(TOPOCCL_HAVE_CUDA)

std::unique_ptr<GpuStaging> makeGpuStaging(int, int, std::chrono::milliseconds) {
  throwInvalidUsage("GPU buffers need a topoccl built with CUDA (nvcc was not found when this one was configured)");
}

#else

namespace {

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(ncclUnhandledCudaError, what + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
  }
}

constexpr size_t kAlign = 256;
// Calls in flight (staged, not yet finished by the engine) at most: each has its own "copied in" word, written by
// its waiting kernel, since kernels on different streams may start out of ticket order.
constexpr uint64_t kTicketSlots = 1024;
constexpr size_t kStartedWords = 16;  // flags_ index of the first "copied in" word (its own cache lines)
constexpr size_t kMinBlockBytes = 1 << 20;

size_t alignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// One GPU buffer of an operation and its pinned copy.
struct Transfer {
  const void* device;
  size_t bytes;
  bool in;            // copied to the host before the engine runs
  void** rewritten;   // the operation's pointer, set to the pinned copy
  size_t offset = 0;  // in the job's pinned block
};

class CudaGpuStaging final : public GpuStaging {
 public:
  CudaGpuStaging(int rank, int nranks, std::chrono::milliseconds timeout) : rank_(rank), nranks_(nranks), timeout_(timeout) {
    check(kernels::loadKernels(), "loading topoccl's kernels");  // see loadKernels: lazy loading can deadlock
    const size_t words = kStartedWords + kTicketSlots;
    check(cudaHostAlloc(reinterpret_cast<void**>(&flags_), words * sizeof(uint64_t), cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc of the staging flags");
    std::fill(flags_, flags_ + words, uint64_t{0});  // [0] last ticket the engine finished, [1] abort
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&deviceFlags_), flags_, 0), "cudaHostGetDevicePointer");
  }

  ~CudaGpuStaging() override {
    // The engine has stopped (the communicator joins it first); release anything still waiting, then wait for
    // the streams to be done with our pinned memory.
    abort();
    for (Block& block : blocks_) {
      cudaEventSynchronize(block.done);
      cudaEventDestroy(block.done);
      cudaFreeHost(block.host);
    }
    cudaFreeHost(flags_);
  }

  JobHooks stage(std::vector<Operation>& operations, void* streamHandle, const std::vector<void*>& otherStreams) override {
    if (__atomic_load_n(&flags_[1], __ATOMIC_ACQUIRE) != 0)
      throwInvalidUsage("rank " + std::to_string(rank_) + ": GPU staging of this communicator was aborted; create a new communicator");
    auto stream = static_cast<cudaStream_t>(streamHandle);
    std::vector<Transfer> transfers;
    for (Operation& op : operations) collectTransfers(op, transfers);
    size_t total = 0;
    for (Transfer& t : transfers) {
      t.offset = total;
      total += alignUp(std::max<size_t>(t.bytes, 1));
    }
    Block& block = acquire(total);
    for (Transfer& t : transfers) *t.rewritten = block.host + t.offset;

    // Streams of the same group join the first before the copies in, and wait for its copies out.
    for (void* other : otherStreams) {
      if (other == streamHandle) continue;
      cudaEvent_t joined = nullptr;
      check(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventRecord(joined, static_cast<cudaStream_t>(other)), "cudaEventRecord");
      check(cudaStreamWaitEvent(stream, joined, 0), "cudaStreamWaitEvent");
      cudaEventDestroy(joined);
    }
    for (const Transfer& t : transfers)
      if (t.in && t.bytes > 0)
        check(cudaMemcpyAsync(block.host + t.offset, t.device, t.bytes, cudaMemcpyDeviceToHost, stream),
              "copying " + std::to_string(t.bytes) + " bytes of GPU input to host memory");
    // A free "copied in" word for the next ticket: wait for the engine while kTicketSlots calls are in flight.
    const uint64_t ticket = ticketsIssued_ + 1;
    for (const auto deadline = std::chrono::steady_clock::now() + timeout_;
         ticket - __atomic_load_n(&flags_[0], __ATOMIC_ACQUIRE) > kTicketSlots;) {
      if (std::chrono::steady_clock::now() > deadline)
        throwRemoteError("rank " + std::to_string(rank_) + ": " + std::to_string(kTicketSlots) + " staged GPU calls are in " +
                         "flight and none finished within " + std::to_string(timeout_.count()) + " ms (TOPOCCL_TIMEOUT_MS)");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ++ticketsIssued_;
    try {
      check(kernels::launchWaitForHost(deviceFlags_, ticket, deviceFlags_ + 1, deviceFlags_ + kStartedWords + ticket % kTicketSlots,
                                       stream),
            "launching the staging wait");
    } catch (...) {
      --ticketsIssued_;
      throw;
    }
    try {
      for (const Transfer& t : transfers)
        if (!t.in && t.bytes > 0)
          check(cudaMemcpyAsync(const_cast<void*>(t.device), block.host + t.offset, t.bytes, cudaMemcpyHostToDevice, stream),
                "copying " + std::to_string(t.bytes) + " bytes of output back to the GPU");
      check(cudaEventRecord(block.done, stream), "cudaEventRecord");
      for (void* other : otherStreams)
        if (other != streamHandle) check(cudaStreamWaitEvent(static_cast<cudaStream_t>(other), block.done, 0), "cudaStreamWaitEvent");
    } catch (...) {
      // The kernel is on the stream already and no later ticket may pass it early: stop every wait.
      abort();
      throw;
    }

    // The hooks run on the progress engine and make no CUDA call: a CUDA call there can block behind the
    // caller's thread, which may itself be waiting in the driver for this very kernel (PyTorch's `.cpu()`, a
    // pageable copy on the legacy stream, did: NCCL's proxy avoids CUDA for the same reason).
    JobHooks hooks;
    hooks.before = [this, ticket](std::string& message) { return waitForCopiesIn(ticket, message); };
    hooks.after = [this, ticket](ncclResult_t) {
      // The engine finished the job (or gave up on it): its outputs are in pinned memory; let the stream go on.
      __atomic_store_n(&flags_[0], ticket, __ATOMIC_RELEASE);
    };
    return hooks;
  }

  void abort() override { __atomic_store_n(&flags_[1], 1, __ATOMIC_RELEASE); }

 private:
  struct Block {
    char* host = nullptr;  // pinned
    size_t capacity = 0;
    cudaEvent_t done = nullptr;  // recorded after the block's last copy out
  };

  void collectTransfers(Operation& op, std::vector<Transfer>& transfers) {
    if (auto* p2p = std::get_if<PointToPointArgs>(&op)) {
      const size_t bytes = p2p->count * dataTypeSize(p2p->type);
      if (p2p->isSend && isGpuPointer(p2p->send))
        transfers.push_back({p2p->send, bytes, true, const_cast<void**>(&p2p->send)});
      if (!p2p->isSend && isGpuPointer(p2p->recv)) transfers.push_back({p2p->recv, bytes, false, &p2p->recv});
      return;
    }
    auto& c = std::get<CollectiveArgs>(op);
        const size_t elem = dataTypeSize(c.type);
    const size_t inBytes = algo::inputBlocks(c.collective, nranks_, rank_, c.root) * c.count * elem;
    const size_t outBytes = algo::outputBlocks(c.collective, nranks_, rank_, c.root) * c.count * elem;
    // Separate copies even in place: the host path then runs out of place, with the same result.
    if (inBytes > 0 && isGpuPointer(c.send)) transfers.push_back({c.send, inBytes, true, const_cast<void**>(&c.send)});
    if (outBytes > 0 && isGpuPointer(c.recv)) transfers.push_back({c.recv, outBytes, false, &c.recv});
    if (c.reduce.scalarPointer != nullptr && isGpuPointer(c.reduce.scalarPointer))
      transfers.push_back({c.reduce.scalarPointer, dataTypeSize(c.reduce.scalarType), true,
                           const_cast<void**>(&c.reduce.scalarPointer)});
  }

  // The smallest free block that fits, else a new one (pinned memory is freed with the communicator only:
  // cudaFreeHost may wait for the device, where a peer's kernel may be waiting for this rank).
  Block& acquire(size_t bytes) {
    Block* best = nullptr;
    for (Block& block : blocks_) {
      if (block.capacity < bytes || (best && best->capacity <= block.capacity)) continue;
      const cudaError_t state = cudaEventQuery(block.done);
      if (state == cudaSuccess) best = &block;
      else if (state != cudaErrorNotReady) check(state, "a staged copy");
    }
    if (best) return *best;
    Block block;
    block.capacity = std::max(kMinBlockBytes, alignUp(bytes));
    check(cudaHostAlloc(reinterpret_cast<void**>(&block.host), block.capacity, cudaHostAllocPortable),
          "cudaHostAlloc of " + std::to_string(block.capacity) + " bytes of staging memory");
    if (const cudaError_t made = cudaEventCreateWithFlags(&block.done, cudaEventDisableTiming); made != cudaSuccess) {
      cudaFreeHost(block.host);
      check(made, "cudaEventCreate");
    }
    TOPOCCL_INFO(log::kAlloc, "rank %d: GPU staging holds %zu pinned bytes more (%zu blocks)", rank_, block.capacity,
                 blocks_.size() + 1);
    blocks_.push_back(block);
    return blocks_.back();
  }

  // On the engine: the stream has copied the inputs once the waiting kernel of `ticket` started, which it
  // announces in its "copied in" word (the copies before it on the stream are then done and visible).
  ncclResult_t waitForCopiesIn(uint64_t ticket, std::string& message) {
    const uint64_t* started = flags_ + kStartedWords + ticket % kTicketSlots;
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (unsigned polls = 0;; ++polls) {
      if (__atomic_load_n(started, __ATOMIC_ACQUIRE) >= ticket) return ncclSuccess;
      if (__atomic_load_n(&flags_[1], __ATOMIC_ACQUIRE) != 0) {
        message = "rank " + std::to_string(rank_) + ": aborted while waiting for the stream to reach a staged call";
        return ncclInvalidUsage;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        message = "rank " + std::to_string(rank_) + ": the stream did not reach a staged GPU call within " +
                  std::to_string(timeout_.count()) + " ms (TOPOCCL_TIMEOUT_MS): earlier work on it did not finish, "
                  "or copying the GPU input to host memory failed";
        return ncclRemoteError;
      }
      if (polls < 1024) std::this_thread::yield();  // a memory poll: cheap, and the copies take microseconds
      else std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  int rank_;
  int nranks_;
  std::chrono::milliseconds timeout_;
  // Mapped pinned memory: [0] last finished ticket, [1] abort, [kStartedWords + t % kTicketSlots] ticket t copied in.
  uint64_t* flags_ = nullptr;
  uint64_t* deviceFlags_ = nullptr;  // the same, as the device sees it
  uint64_t ticketsIssued_ = 0;
  std::deque<Block> blocks_;  // stable addresses
};

}  // namespace

std::unique_ptr<GpuStaging> makeGpuStaging(int rank, int nranks, std::chrono::milliseconds timeout) {
  if (!gpuAvailable()) throwInvalidUsage("GPU buffers were passed but no GPU is visible to this process");
  return std::make_unique<CudaGpuStaging>(rank, nranks, timeout);
}

#endif

}  // namespace topoccl::core
