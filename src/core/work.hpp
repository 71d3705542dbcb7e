// A Work handle (c10d's idea): the caller's view of one submitted operation or group.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "nccl.h"

namespace topoccl::core {

class Work {
 public:
  bool test() const;               // completed (successfully or not)?
  void wait() const;               // blocks until completed
  ncclResult_t result() const;     // ncclInProgress until completed
  std::string errorMessage() const;

  void complete(ncclResult_t code, std::string message = {});

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable done_;
  bool completed_ = false;
  ncclResult_t code_ = ncclInProgress;
  std::string message_;
};

// What runs around a queued job on the progress engine (GPU staging uses it: core/gpu_staging.hpp). `before`
// may wait (for a stream's copies into host memory) and fail the job with a code and message instead of
// running it; `after` runs exactly once, whatever happened, also for a job the communicator never ran.
struct JobHooks {
  std::function<ncclResult_t(std::string& message)> before;
  std::function<void(ncclResult_t)> after;
};

}  // namespace topoccl::core
