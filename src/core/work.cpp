#include "core/work.hpp"

namespace topoccl::core {

bool Work::test() const {
  std::lock_guard lock(mutex_);
  return completed_;
}

void Work::wait() const {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return completed_; });
}

ncclResult_t Work::result() const {
  std::lock_guard lock(mutex_);
  return code_;
}

std::string Work::errorMessage() const {
  std::lock_guard lock(mutex_);
  return message_;
}

void Work::complete(ncclResult_t code, std::string message) {
  {
    std::lock_guard lock(mutex_);
    completed_ = true;
    code_ = code;
    message_ = std::move(message);
  }
  done_.notify_all();
}

}  // namespace topoccl::core
