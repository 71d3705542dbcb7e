// Launch order among ranks that are threads of one process and share a GPU. CUDA feeds a device's streams
// through a few hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default) that run in order: a rank's
// next launch that lands in a queue ahead of a peer's current one waits there for its own previous launch,
// which waits for that peer, whose launch is stuck behind it. Found on an H200 (2026-11-26): with one
// connection 3 of 3 runs of four thread ranks stalled, with 32 none. So before a rank puts call N on its
// stream, every such peer must have put calls 0..N-1 on theirs. Processes have queues of their own, and one
// thread driving every rank (nccl-tests' -g) issues in that order already. CUDA-free, so host tests run it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace topoccl::core {

class LaunchOrder {
 public:
  // Registers this rank's state process-wide under key(), which the rank exchanges with its peers.
  explicit LaunchOrder(int rank);
  ~LaunchOrder();
  LaunchOrder(const LaunchOrder&) = delete;
  LaunchOrder& operator=(const LaunchOrder&) = delete;

  uint64_t key() const { return key_; }
  // `rank`, a thread of this process on our GPU, registered under `key` (throws if no such rank lives here).
  void addPeer(int rank, uint64_t key);
  bool hasPeers() const { return !peers_.empty(); }

  // The calling thread now drives this rank (each enqueue says so).
  void drivenByThisThread();
  // Returns once every peer has enqueued `calls` calls. A peer last driven by this same thread is not waited
  // for: its calls come in the order this thread issues them. Throws when `stopped()` turns true (abort) or
  // after `timeout`, naming the peer and `what` (the call about to be enqueued).
  void waitForPeers(uint64_t calls, std::chrono::milliseconds timeout, const std::function<bool()>& stopped,
                    const std::string& what) const;
  // This rank has enqueued `calls` calls.
  void published(uint64_t calls);

  struct RankState {
    std::atomic<uint64_t> callsEnqueued{0};
    std::atomic<std::thread::id> driver;
  };

 private:
  struct Peer {
    int rank;
    std::shared_ptr<RankState> state;
  };
  int rank_;
  uint64_t key_;
  std::shared_ptr<RankState> mine_;
  std::vector<Peer> peers_;
};

}  // namespace topoccl::core
