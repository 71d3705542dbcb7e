// The progress engine's job hooks, which GPU staging (core/gpu_staging.hpp) relies on: `before` runs first and
// may hold the job (waiting for a stream's copies) or fail it without running it; `after` runs exactly once for
// every job, after its operations, also when the job failed, was dropped by an abort, or came after one.
// Thread ranks; results against a double-precision sum of fresh random inputs.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "core/communicator.hpp"

using namespace topoccl;

namespace {

core::CollectiveArgs allReduce(const std::vector<float>& in, std::vector<float>& out) {
  core::CollectiveArgs args;
  args.collective = algo::Collective::AllReduce;
  args.count = in.size();
  args.type = DataType::Float32;
  args.send = in.data();
  args.recv = out.data();
  return args;
}

// A before-hook that holds its job in the engine until release(): the engine stays busy, and later work queues.
class Gate {
 public:
  std::function<ncclResult_t(std::string&)> hook() {
    return [this](std::string&) {
      held_.store(true);
      while (!released_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return ncclSuccess;
    };
  }
  void waitUntilHeld() const {
    while (!held_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void release() { released_.store(true); }

 private:
  std::atomic<bool> held_{false}, released_{false};
};

// What one thread rank recorded: its events in order, and the text of an exception that ended it (empty: none).
struct RankLog {
  std::vector<std::string> events;
  std::string error;
};
using Note = std::function<void(std::string)>;

// Runs body(comm, rank, note) on `nranks` thread ranks of one new communicator. `note` may be called from the
// rank's thread and from its engine's (hooks).
std::vector<RankLog> onThreadRanks(int nranks, const std::function<void(core::Communicator&, int, const Note&)>& body) {
  std::vector<RankLog> logs(nranks);
  const bootstrap::UniqueId id = bootstrap::createUniqueId();
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; ++r)
    threads.emplace_back([&, r] {
      std::mutex eventsMutex;
      const Note note = [&](std::string e) {
        std::lock_guard lock(eventsMutex);
        logs[r].events.push_back(std::move(e));
      };
      try {
        auto comm = core::Communicator::create(id, nranks, r, core::CommOptions{});
        body(*comm, r, note);
      } catch (const std::exception& e) {
        logs[r].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return logs;
}

}  // namespace

TEST_CASE("core: job hooks hold a job until its input is ready, and release it after, in submission order", "[core][hooks]") {
  const int nranks = 3, jobs = 4;
  const size_t count = 4099;
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  // inputs[r][j]: what the "stream" writes into rank r's staging buffer of job j, only after the job is queued.
  std::vector<std::vector<std::vector<float>>> inputs(nranks, std::vector<std::vector<float>>(jobs, std::vector<float>(count)));
  for (auto& rank : inputs)
    for (auto& job : rank)
      for (float& x : job) x = value(rng);
  std::vector<std::vector<std::vector<float>>> staged(nranks, std::vector<std::vector<float>>(jobs, std::vector<float>(count, 0.0f)));
  std::vector<std::vector<std::vector<float>>> outputs(nranks, std::vector<std::vector<float>>(jobs, std::vector<float>(count, -7.0f)));
  std::vector<std::string> errors(nranks);
  const std::vector<RankLog> logs = onThreadRanks(nranks, [&](core::Communicator& comm, int r, const Note& note) {
    std::vector<std::atomic<bool>> ready(jobs);
    std::vector<std::shared_ptr<core::Work>> works;
    for (int j = 0; j < jobs; ++j) {
      core::JobHooks hooks;
      hooks.before = [&, j](std::string&) {
        while (!ready[j].load(std::memory_order_acquire)) std::this_thread::sleep_for(std::chrono::microseconds(200));
        note("before " + std::to_string(j));
        return ncclSuccess;
      };
      hooks.after = [&, j](ncclResult_t code) {
        // The operations ran before this: the output is final.
        bool written = outputs[r][j][0] != -7.0f;
        note("after " + std::to_string(j) + (code == ncclSuccess && written ? " ok" : " bad"));
      };
      works.push_back(comm.submit({allReduce(staged[r][j], outputs[r][j])}, std::move(hooks)));
    }
    // The "copies in" land after every job is queued, last job first: the engine still runs them in order.
    for (int j = jobs - 1; j >= 0; --j) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      staged[r][j] = inputs[r][j];
      ready[j].store(true, std::memory_order_release);
    }
    for (auto& w : works) {
      w->wait();
      if (w->result() != ncclSuccess) errors[r] = w->errorMessage();
    }
  });
  for (int r = 0; r < nranks; ++r) {
    INFO("rank " << r);
    CHECK(errors[r].empty());
    CHECK(logs[r].error.empty());
    const std::vector<std::string>& events = logs[r].events;
    std::vector<std::string> want;
    for (int j = 0; j < jobs; ++j) {
      want.push_back("before " + std::to_string(j));
      want.push_back("after " + std::to_string(j) + " ok");
    }
    CHECK(events == want);
    for (int j = 0; j < jobs; ++j) {
      size_t wrong = 0;
      for (size_t i = 0; i < count; ++i) {
        double sum = 0;
        for (int q = 0; q < nranks; ++q) sum += inputs[q][j][i];
        if (std::abs(outputs[r][j][i] - sum) > 1e-5 * (1 + std::abs(sum))) ++wrong;
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("a failing before-hook fails its job without running it, after runs for every job, dropped ones too",
          "[core][hooks]") {
  const bootstrap::UniqueId id = bootstrap::createUniqueId();
  auto comm = core::Communicator::create(id, 1, 0, core::CommOptions{});
  std::mt19937_64 rng(std::random_device{}());
  std::vector<float> in(1031), out(1031, -7.0f);
  for (float& x : in) x = static_cast<float>(rng() % 1000);

  std::vector<ncclResult_t> afterCodes;
  std::mutex afterMutex;
  auto recordAfter = [&](ncclResult_t code) {
    std::lock_guard lock(afterMutex);
    afterCodes.push_back(code);
  };

  SECTION("a before-hook's failure") {
    core::JobHooks hooks;
    hooks.before = [](std::string& message) {
      message = "rank 0: the stream did not reach a staged GPU call";
      return ncclRemoteError;
    };
    hooks.after = recordAfter;
    auto work = comm->submit({allReduce(in, out)}, std::move(hooks));
    work->wait();
    CHECK(work->result() == ncclRemoteError);
    CHECK(work->errorMessage().find("did not reach") != std::string::npos);
    CHECK(out[0] == -7.0f);  // the operation did not run
    CHECK(afterCodes == std::vector<ncclResult_t>{ncclRemoteError});
    CHECK(comm->asyncError() == ncclRemoteError);
    CHECK(comm->asyncErrorMessage().find("did not reach") != std::string::npos);
    // Later jobs fail at once (the communicator failed), and still release their waiters.
    core::JobHooks later;
    later.after = recordAfter;
    auto next = comm->submit({allReduce(in, out)}, std::move(later));
    next->wait();
    CHECK(next->result() == ncclRemoteError);
    CHECK(afterCodes.size() == 2);
  }

  SECTION("an abort drops queued jobs, and their after-hooks still run") {
    Gate gate;
    core::JobHooks first;
    first.before = gate.hook();
    first.after = recordAfter;
    auto held = comm->submit({allReduce(in, out)}, std::move(first));
    std::vector<float> out2(in.size(), -7.0f), out3(in.size(), -7.0f);
    core::JobHooks second, third;
    second.after = recordAfter;
    third.after = recordAfter;
    auto dropped1 = comm->submit({allReduce(in, out2)}, std::move(second));
    auto dropped2 = comm->submit({allReduce(in, out3)}, std::move(third));
    gate.waitUntilHeld();
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      gate.release();
    });
    comm->abort();  // drops the two queued jobs, then waits for the running one
    releaser.join();
    held->wait();
    CHECK(dropped1->result() == ncclInvalidUsage);
    CHECK(dropped2->result() == ncclInvalidUsage);
    CHECK(out2[0] == -7.0f);
    CHECK(out3[0] == -7.0f);
    REQUIRE(afterCodes.size() == 3);
    CHECK(afterCodes[0] == ncclInvalidUsage);  // the dropped ones, released by abort()
    CHECK(afterCodes[1] == ncclInvalidUsage);
    // After an abort, a new job is refused and its after-hook runs at once.
    core::JobHooks late;
    late.after = recordAfter;
    auto refused = comm->submit({allReduce(in, out)}, std::move(late));
    CHECK(refused->result() == ncclInvalidUsage);
    CHECK(afterCodes.size() == 4);
  }
}

TEST_CASE("core: ncclCommGetAsyncError counts a staged (hooked) job as enqueued, not in progress", "[core][hooks]") {
  // NCCL reports ncclInProgress on non-blocking communicators only, for host-side work; PyTorch's watchdog and
  // its waitReady() take anything else as failure or a reason to wait. A staged GPU call is on its stream.
  for (const bool blocking : {true, false}) {
    INFO("blocking " << blocking);
    core::CommOptions options;
    options.blocking = blocking;
    auto comm = core::Communicator::create(bootstrap::createUniqueId(), 1, 0, options);
    std::mt19937_64 rng(std::random_device{}());
    std::vector<float> in(257), out(257, -7.0f), out2(257, -7.0f);
    for (float& x : in) x = static_cast<float>(rng() % 100);
    Gate gate;
    core::JobHooks hooks;
    hooks.before = gate.hook();
    hooks.after = [](ncclResult_t) {};
    auto staged = comm->submit({allReduce(in, out)}, std::move(hooks));
    gate.waitUntilHeld();
    CHECK(comm->asyncError() == ncclSuccess);
    auto host = comm->submit({allReduce(in, out2)});  // host work queued behind it
    CHECK(comm->asyncError() == (blocking ? ncclSuccess : ncclInProgress));
    gate.release();
    staged->wait();
    host->wait();
    CHECK(staged->result() == ncclSuccess);
    CHECK(host->result() == ncclSuccess);
    comm->finalize();
    CHECK(comm->asyncError() == ncclSuccess);
    CHECK(out == in);  // one rank: the sum is the input
    CHECK(out2 == in);
  }
}

TEST_CASE("core: runCollective (the blocking per-call path) waits behind queued jobs and reports a failed communicator",
          "[core][hooks]") {
  const int nranks = 3;
  const size_t count = 1543;  // prime
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::vector<float>> queuedIn(nranks, std::vector<float>(count)), directIn = queuedIn;
  for (int r = 0; r < nranks; ++r)
    for (size_t i = 0; i < count; ++i) queuedIn[r][i] = value(rng), directIn[r][i] = value(rng);
  std::vector<std::vector<float>> queuedOut(nranks, std::vector<float>(count, -7.0f)), directOut = queuedOut;
  std::atomic<int> finishedCalls{0};
  const std::vector<RankLog> logs = onThreadRanks(nranks, [&](core::Communicator& comm, int r, const Note& note) {
    Gate gate;
    core::JobHooks hooks;
    hooks.before = gate.hook();
    hooks.after = [&](ncclResult_t code) { note(code == ncclSuccess ? "queued done" : "queued failed"); };
    auto queued = comm.submit({allReduce(queuedIn[r], queuedOut[r])}, std::move(hooks));
    gate.waitUntilHeld();
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      gate.release();
    });
    // The engine holds the queued job: this call must go behind it, not run on this thread now.
    std::string message;
    const ncclResult_t code = comm.runCollective(allReduce(directIn[r], directOut[r]), message);
    note(code == ncclSuccess ? "direct done" : "direct failed: " + message);
    releaser.join();
    queued->wait();
    finishedCalls.fetch_add(1);
    while (finishedCalls.load() < nranks) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // no peer mid-call
    // Aborted: the per-call path refuses with a message, and loses no memory or thread.
    comm.abort();
    std::vector<float> untouched(count, -7.0f);
    const ncclResult_t refused = comm.runCollective(allReduce(directIn[r], untouched), message);
    note(refused == ncclInvalidUsage && message.find("aborted") != std::string::npos && untouched[0] == -7.0f
             ? "refused after abort"
             : "accepted after abort");
  });
  for (int r = 0; r < nranks; ++r) {
    INFO("rank " << r);
    CHECK(logs[r].error.empty());
    CHECK(logs[r].events == std::vector<std::string>{"queued done", "direct done", "refused after abort"});
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      double queuedSum = 0, directSum = 0;
      for (int q = 0; q < nranks; ++q) queuedSum += queuedIn[q][i], directSum += directIn[q][i];
      if (std::abs(queuedOut[r][i] - queuedSum) > 1e-5 * (1 + std::abs(queuedSum))) ++wrong;
      if (std::abs(directOut[r][i] - directSum) > 1e-5 * (1 + std::abs(directSum))) ++wrong;
    }
    CHECK(wrong == 0);
  }
}
