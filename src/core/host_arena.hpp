// Grow-only host memory for the executor's own buffers (staging, scratch, prescaled inputs). It comes
// from the shared allocator when zero copy is on, so that sends out of it reach shm peers with one
// copy, exactly like sends out of a user's ncclMemAlloc buffer.
#pragma once

#include <cstddef>

namespace topoccl::core {

class HostArena {
 public:
  HostArena() = default;
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;
  ~HostArena();

  // At least `bytes` bytes (page aligned); contents are not kept when it has to grow.
  char* reserve(size_t bytes);
  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void release();

  char* data_ = nullptr;
  size_t size_ = 0;
  bool shared_ = false;
};

}  // namespace topoccl::core
