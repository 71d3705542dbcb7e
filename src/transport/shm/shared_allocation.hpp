// Host memory that other processes of the host can map: what ncclMemAlloc hands out. A send from
// such memory lets the shm receiver copy (or reduce) straight out of the sender's buffer, one copy
// at memcpy speed, where the FIFO needs two and cross-memory attach is slow to pin pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace topoccl::transport {

// Where a byte range lies inside one shared allocation of this process.
struct SharedRange {
  int fd = -1;             // the allocation's memfd in this process; peers open /proc/<pid>/fd/<fd>
  uint64_t inode = 0;      // tells a reused fd number apart
  uint64_t allocationBytes = 0;
  uint64_t offset = 0;     // of the range's first byte within the allocation
};

// A page-aligned allocation of `bytes` (> 0) backed by a memfd, its pages populated. Throws
// Error(ncclSystemError) naming what failed (memfd_create, ftruncate, mmap).
void* allocateShared(size_t bytes);
// Releases what allocateShared returned; false (and nothing done) for any other pointer.
bool freeShared(void* base);
// The shared allocation that holds all of [data, data + bytes), if any.
std::optional<SharedRange> findShared(const void* data, size_t bytes);

}  // namespace topoccl::transport
