#include "core/copy_tuner.hpp"

#include <time.h>

#include <algorithm>
#include <cstring>

#include "kernels/host_copy.hpp"

namespace topoccl::core {

const char* copyKernelName(CopyKernel kernel) { return kernel == CopyKernel::Streaming ? "streaming stores" : "cached"; }

namespace {
thread_local uint64_t threadCopyNanoseconds = 0;

uint64_t nowNanoseconds() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

template <void (*Copy)(void*, const void*, size_t)>
void timed(void* dst, const void* src, size_t bytes) {
  const uint64_t start = nowNanoseconds();
  Copy(dst, src, bytes);
  threadCopyNanoseconds += nowNanoseconds() - start;
}

void plainMemcpy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

CopyKernel other(CopyKernel kernel) { return kernel == CopyKernel::Cached ? CopyKernel::Streaming : CopyKernel::Cached; }
size_t index(CopyKernel kernel) { return static_cast<size_t>(kernel); }
}  // namespace

void timedCachedCopy(void* dst, const void* src, size_t bytes) { timed<&kernels::bulkCopy>(dst, src, bytes); }
void timedMemcpy(void* dst, const void* src, size_t bytes) { timed<&plainMemcpy>(dst, src, bytes); }
void timedStreamingCopy(void* dst, const void* src, size_t bytes) { timed<&kernels::streamingCopy>(dst, src, bytes); }
uint64_t copyNanoseconds() { return threadCopyNanoseconds; }

CopyTuner::Ticket CopyTuner::begin(const Shape& shape, CopyKernel fallback) {
  auto found = table_.find(shape);
  if (found == table_.end()) {
    if (table_.size() >= kMaxShapes) return Ticket{fallback, shape, false};
    Estimate& fresh = table_[shape];
    fresh.preferred = fallback;
    fresh.last = fallback;
    fresh.calls = 1;
    return Ticket{fallback, shape, false};
  }
  Estimate& e = found->second;
  const uint64_t call = e.calls++;
  const CopyKernel rival = other(e.preferred);
  CopyKernel kernel = e.preferred;
  if (e.samples[index(rival)] < kFirstSamples) kernel = rival;  // choosing first: the fallback's rival, then it
  else if (e.samples[index(e.preferred)] < kFirstSamples) kernel = e.preferred;
  else if (call % kExploreEvery < 2) kernel = rival;  // two in a row: the second is timed
  Ticket ticket{kernel, shape, true, kernel == e.last};
  e.last = kernel;
  return ticket;
}

void CopyTuner::finish(const Ticket& ticket, double nanoseconds) {
  if (!ticket.timed || !ticket.steady || !(nanoseconds >= 0)) return;
  auto found = table_.find(ticket.shape);
  if (found == table_.end()) return;
  Estimate& e = found->second;
  const size_t k = index(ticket.kernel);
  e.recent[k][e.samples[k] % kWindow] = nanoseconds;
  ++e.samples[k];
  if (e.samples[0] < kFirstSamples || e.samples[1] < kFirstSamples) return;
  // The first comparison too keeps the fallback (the static rule's choice) unless the rival is clearly faster.
  if (e.nanoseconds(other(e.preferred)) < (1 - kSwitchMargin) * e.nanoseconds(e.preferred)) e.preferred = other(e.preferred);
}

double CopyTuner::Estimate::nanoseconds(CopyKernel k) const {
  const size_t n = static_cast<size_t>(std::min<uint64_t>(samples[index(k)], kWindow));
  if (n == 0) return 0;
  std::array<double, kWindow> sorted = recent[index(k)];
  std::sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(n));
  return sorted[(n - 1) / 2];
}

const CopyTuner::Estimate* CopyTuner::estimate(const Shape& shape) const {
  auto found = table_.find(shape);
  return found == table_.end() ? nullptr : &found->second;
}

}  // namespace topoccl::core
