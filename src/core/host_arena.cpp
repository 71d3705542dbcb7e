#include "core/host_arena.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "common/params.hpp"
#include "transport/shm/shared_allocation.hpp"

namespace topoccl::core {

HostArena::~HostArena() { release(); }

void HostArena::release() {
  if (data_ == nullptr) return;
  if (shared_) transport::freeShared(data_);
  else std::free(data_);
  data_ = nullptr;
  size_ = 0;
}

char* HostArena::reserve(size_t bytes) {
  if (bytes <= size_) return data_;
  release();
  // A fresh (shared) allocation costs syscalls and first touches of every page: start at 1 MiB and
  // double, so that a rising size reallocates a handful of times, not on every call.
  constexpr size_t kFirst = size_t{1} << 20;
  size_t want = std::max(kFirst, size_ * 2);
  while (want < bytes) want *= 2;
  shared_ = params::kShmZeroCopy.get();
  if (shared_) {
    data_ = static_cast<char*>(transport::allocateShared(want));
  } else {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, want) != 0) throwSystemError("executor: allocating " + std::to_string(want) + " bytes of staging memory");
    data_ = static_cast<char*>(p);
  }
  size_ = want;
  return data_;
}

}  // namespace topoccl::core
