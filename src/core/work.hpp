// A Work handle (c10d's idea): the caller's view of one submitted operation or group.
#pragma once

#include <condition_variable>
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

}  // namespace topoccl::core
