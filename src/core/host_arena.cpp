#include "core/host_arena.hpp"

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
  // Grow by half again, so a slowly rising size does not reallocate on every call.
  const size_t want = bytes + bytes / 2;
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
