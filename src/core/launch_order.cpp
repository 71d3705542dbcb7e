#include "core/launch_order.hpp"

#include <map>
#include <mutex>

#include "common/error.hpp"

namespace topoccl::core {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<uint64_t, std::weak_ptr<LaunchOrder::RankState>> ranks;
  uint64_t nextKey = 1;
};

Registry& registry() {
  static Registry r;  // never destroyed before the communicators that use it (function-local static)
  return r;
}

}  // namespace

LaunchOrder::LaunchOrder(int rank) : rank_(rank), mine_(std::make_shared<RankState>()) {
  mine_->driver.store(std::this_thread::get_id());
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  key_ = r.nextKey++;
  r.ranks[key_] = mine_;
}

LaunchOrder::~LaunchOrder() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.ranks.erase(key_);
}

void LaunchOrder::addPeer(int rank, uint64_t key) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.ranks.find(key);
  std::shared_ptr<RankState> state = it == r.ranks.end() ? nullptr : it->second.lock();
  if (!state)
    throwInternalError("rank " + std::to_string(rank_) + ": rank " + std::to_string(rank) +
                       " says it is a thread of this process on the same GPU, but its launch-order key " +
                       std::to_string(key) + " is not registered here");
  peers_.push_back({rank, std::move(state)});
}

void LaunchOrder::drivenByThisThread() { mine_->driver.store(std::this_thread::get_id(), std::memory_order_relaxed); }

void LaunchOrder::published(uint64_t calls) { mine_->callsEnqueued.store(calls, std::memory_order_release); }

void LaunchOrder::waitForPeers(uint64_t calls, std::chrono::milliseconds timeout, const std::function<bool()>& stopped,
                               const std::string& what) const {
  if (calls == 0) return;
  const std::thread::id self = std::this_thread::get_id();
  for (const Peer& peer : peers_) {
    const RankState& state = *peer.state;
    auto ready = [&] {
      return state.callsEnqueued.load(std::memory_order_acquire) >= calls ||
             state.driver.load(std::memory_order_relaxed) == self;
    };
    if (ready()) continue;
    const auto start = std::chrono::steady_clock::now();
    // Peers are other threads, usually a few microseconds behind: yield first, then nap.
    for (int turn = 0; !ready(); ++turn) {
      if (turn < 256) {
        std::this_thread::yield();
        continue;
      }
      if (stopped())
        throwRemoteError("rank " + std::to_string(rank_) + ": " + what + " was not enqueued: the communicator was aborted " +
                         "while it waited for rank " + std::to_string(peer.rank) + " to enqueue its earlier GPU calls");
      if (std::chrono::steady_clock::now() - start > timeout)
        throwRemoteError("rank " + std::to_string(rank_) + ": " + what + " (GPU call #" + std::to_string(calls) +
                         ") waits for rank " + std::to_string(peer.rank) +
                         ", a thread of this process on the same GPU, to enqueue its GPU calls before it (it has " +
                         std::to_string(state.callsEnqueued.load()) + " of " + std::to_string(calls) + ") and it did not within " +
                         std::to_string(timeout.count()) + " ms (TOPOCCL_TIMEOUT_MS). Ranks must issue the same collectives " +
                         "in the same order; TOPOCCL_GPU_LAUNCH_ORDER=0 turns this ordering off");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace topoccl::core
