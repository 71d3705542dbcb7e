// Host copies for transfers larger than the caches. A copy whose buffers do not fit the last-level
// cache gains nothing from caching what it writes: non-temporal stores skip the read-for-ownership of
// every destination line and leave the cache to data that will be read again (perf/RESULTS.md:
// 1.1-1.45x on collectives past the cache here, and half the speed in cache, hence the size rule).
#pragma once

#include <cstddef>

namespace topoccl::kernels {

// memcpy's contract (no overlap), with non-temporal stores where the CPU has them (x86-64: SSE2);
// elsewhere plain memcpy. Any alignment and length; the stores are fenced before it returns, so a
// flag published afterwards orders after the data as with memcpy.
void streamingCopy(void* dst, const void* src, size_t bytes);

// memcpy's contract, for copies inside the caches. Where the CPU has fast string copies (x86-64 ERMS), copies
// of at least kBulkCopyMinBytes are one `rep movsb`, which writes whole lines without first reading them: 3x
// faster than glibc's vector loop when another core holds the destination lines (an in-place all-to-all
// overwriting what a peer just read), and equal or faster elsewhere (perf/RESULTS.md). glibc itself stops
// using it above a size tied to the caches. Elsewhere plain memcpy.
void bulkCopy(void* dst, const void* src, size_t bytes);
inline constexpr size_t kBulkCopyMinBytes = 4096;
// Whether bulkCopy differs from memcpy on this CPU.
bool bulkCopyUsesStringCopy();

// The last-level cache this machine's CPUs can count on, in bytes (sysfs, then sysconf), 0 when unknown: the
// reported size, capped at kMaxCacheBytesPerCpu for each online CPU. A VM sees its host's whole cache (this CI's
// 2-vCPU VM: 504 MiB) while it shares it with CPUs it does not have; there copies that should have written around
// the cache from 48 MiB on ran 1.15-1.85x slower (perf/RESULTS.md, session 37).
size_t lastLevelCacheBytes();
// The cache of one core (cpu0's level-2 data or unified cache, sysfs), in bytes; 0 when unknown.
size_t coreCacheBytes();
// More than any CPU has per core (12 MiB on the largest stacked-cache parts).
inline constexpr size_t kMaxCacheBytesPerCpu = size_t{16} << 20;
// The cap itself, for tests: `reported` bytes of cache seen by `cpus` online CPUs.
constexpr size_t usableCacheBytes(size_t reported, size_t cpus) {
  const size_t cap = (cpus > 0 ? cpus : 1) * kMaxCacheBytesPerCpu;
  return reported < cap ? reported : cap;
}

}  // namespace topoccl::kernels
