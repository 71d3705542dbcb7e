// Launch order of thread ranks sharing a GPU (core/launch_order.hpp). The GPU deadlock itself needs a GPU (the
// `stall` step of scripts/gpu_proof.sh); here a model of one hardware work queue shows the deadlock without the
// ordering and none with it, and the waits, skips, aborts and timeouts are checked on plain threads.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "common/error.hpp"
#include "core/launch_order.hpp"

using namespace topoccl;
using namespace std::chrono_literals;

namespace {

// One in-order hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1) fed by every rank's stream. Each call puts a plan
// launch on a rank's stream and then a follow-up that depends on it (integer Avg's division; the caller's next
// work). The head item starts once its stream's previous item has finished; a follow-up finishes at once, a
// plan once every rank's plan of that call has started (it waits for its peers).
class OneQueueGpu {
 public:
  explicit OneQueueGpu(int ranks)
      : ranks_(ranks), started_(static_cast<size_t>(ranks), 0), finished_(static_cast<size_t>(ranks), 0),
        plansStarted_(static_cast<size_t>(ranks), 0) {}

  void enqueue(int rank, bool plan) {
    std::lock_guard lock(mutex_);
    queue_.push_back({rank, plan});
  }

  // Runs the queue until every item finished (true) or nothing moved for `patience` (false: deadlocked).
  bool drain(std::chrono::milliseconds patience) {
    auto lastMove = std::chrono::steady_clock::now();
    for (;;) {
      bool moved = false;
      {
        std::lock_guard lock(mutex_);
        while (!queue_.empty()) {
          const Item head = queue_.front();
          const size_t r = static_cast<size_t>(head.rank);
          if (finished_[r] != started_[r]) break;  // its stream's previous item still runs
          queue_.pop_front();
          ++started_[r];
          moved = true;
          if (head.plan) running_.push_back({head.rank, ++plansStarted_[r]});
          else ++finished_[r];
        }
        for (auto it = running_.begin(); it != running_.end();) {
          bool all = true;
          for (uint64_t p : plansStarted_) all = all && p >= it->call;
          if (!all) {
            ++it;
            continue;
          }
          ++finished_[static_cast<size_t>(it->rank)];
          it = running_.erase(it);
          moved = true;
        }
        if (queue_.empty() && running_.empty()) return true;
      }
      const auto now = std::chrono::steady_clock::now();
      if (moved) lastMove = now;
      else if (now - lastMove > patience) return false;
      std::this_thread::sleep_for(50us);
    }
  }

 private:
  struct Item {
    int rank;
    bool plan;
  };
  struct Running {
    int rank;
    uint64_t call;  // 1-based
  };
  int ranks_;
  std::mutex mutex_;
  std::deque<Item> queue_;
  std::vector<Running> running_;
  std::vector<uint64_t> started_, finished_;  // per rank: items of its stream started, finished
  std::vector<uint64_t> plansStarted_;
};

enum class Ordering { None, BeforeLaunch, BeforeAndAfterLaunch };

// Rank threads issue `calls` calls each onto the model as GpuPath does, with random pauses; rank 1 starts late.
bool runRanks(int ranks, uint64_t calls, Ordering ordering, uint32_t seed) {
  std::vector<std::unique_ptr<core::LaunchOrder>> orders;
  for (int r = 0; r < ranks; ++r) orders.push_back(std::make_unique<core::LaunchOrder>(r));
  for (int r = 0; r < ranks; ++r)
    for (int q = 0; q < ranks; ++q)
      if (q != r && ordering != Ordering::None) orders[static_cast<size_t>(r)]->addPeer(q, orders[static_cast<size_t>(q)]->key());
  OneQueueGpu gpu(ranks);
  std::vector<std::thread> threads;
  const auto never = [] { return false; };
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      std::mt19937 random(seed + static_cast<uint32_t>(r));
      core::LaunchOrder& order = *orders[static_cast<size_t>(r)];
      order.drivenByThisThread();
      if (r == 1) std::this_thread::sleep_for(30ms);
      for (uint64_t call = 0; call < calls; ++call) {
        order.waitForPeers(call, 5s, never, "a test call");
        gpu.enqueue(r, true);
        order.published(call + 1);
        if (ordering == Ordering::BeforeAndAfterLaunch) order.waitForPeers(call + 1, 5s, never, "a test call");
        gpu.enqueue(r, false);
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 200));
      }
    });
  for (auto& t : threads) t.join();
  return gpu.drain(300ms);
}

}  // namespace

TEST_CASE("launch order: one shared work queue deadlocks thread ranks unless they meet around each launch") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  // Unordered: rank 0's follow-up and next plan block the queue ahead of rank 1's first plan.
  CHECK_FALSE(runRanks(2, 4, Ordering::None, seed));
  // Waiting only before a launch is not enough: rank 0's follow-up still gets ahead of rank 1's plan (on an
  // H200, integer Avg's division stalled every run this way).
  CHECK_FALSE(runRanks(2, 4, Ordering::BeforeLaunch, seed));
  for (int ranks : {2, 3, 4, 5}) {
    INFO(ranks << " ranks");
    CHECK(runRanks(ranks, 40, Ordering::BeforeAndAfterLaunch, seed));
  }
}

TEST_CASE("launch order: a rank waits for a peer's earlier calls, and not for a peer this thread drives") {
  core::LaunchOrder a(0), b(1);
  a.addPeer(1, b.key());
  b.addPeer(0, a.key());
  CHECK(a.hasPeers());
  // Call 0 never waits.
  a.waitForPeers(0, 10ms, [] { return false; }, "call 0");

  // A peer driven by another thread: call 2 waits until that peer has published 2 calls.
  std::atomic<bool> publishedTwo{false}, claimed{false};
  std::thread driverOfB([&] {
    b.drivenByThisThread();
    claimed = true;
    b.published(1);
    std::this_thread::sleep_for(50ms);
    publishedTwo = true;
    b.published(2);
  });
  while (!claimed) std::this_thread::yield();
  a.drivenByThisThread();
  a.waitForPeers(2, 10s, [] { return false; }, "call 2");
  CHECK(publishedTwo.load());
  driverOfB.join();

  // Now this thread drives b too (one thread, every rank, as nccl-tests' -g): waiting for it could only time out.
  b.drivenByThisThread();
  CHECK_NOTHROW(a.waitForPeers(7, 50ms, [] { return false; }, "call 7"));
}

TEST_CASE("launch order: a peer that never enqueues is an error naming it within the timeout, abort stops the wait") {
  core::LaunchOrder a(2), b(5);
  a.addPeer(5, b.key());
  std::thread other([&] { b.drivenByThisThread(); });
  other.join();  // b's last driver is another thread, which is gone
  const auto start = std::chrono::steady_clock::now();
  try {
    a.waitForPeers(3, 100ms, [] { return false; }, "allreduce on GPU buffers");
    FAIL("no error");
  } catch (const Error& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find("rank 2") != std::string::npos);
    CHECK(message.find("rank 5") != std::string::npos);
    CHECK(message.find("allreduce on GPU buffers") != std::string::npos);
    CHECK(message.find("0 of 3") != std::string::npos);
    CHECK(message.find("TOPOCCL_TIMEOUT_MS") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < 5s);

  std::atomic<bool> aborted{false};
  std::thread aborter([&] {
    std::this_thread::sleep_for(20ms);
    aborted = true;
  });
  try {
    a.waitForPeers(3, 60s, [&] { return aborted.load(); }, "broadcast on GPU buffers");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("aborted") != std::string::npos);
  }
  aborter.join();
}

TEST_CASE("launch order: a key that no rank of this process registered is refused") {
  std::unique_ptr<core::LaunchOrder> gone = std::make_unique<core::LaunchOrder>(1);
  const uint64_t key = gone->key();
  gone.reset();
  core::LaunchOrder a(0);
  CHECK_THROWS_WITH(a.addPeer(1, key), Catch::Contains("rank 1") && Catch::Contains("not registered"));
  CHECK_FALSE(a.hasPeers());
}
