// 16-byte packed reductions and copies, written once for host and device (TOPOCCL_HD): the CUDA kernels
// run them with one worker per GPU thread of the grid, and the host tests run the very same code with
// workers as loop indices, so the device's head, body and tail handling is checked without a GPU.
//
// A range splits into a scalar head (up to the destination's first 16-byte boundary), whole 16-byte
// packs (one vector load per operand and one vector store), and a scalar tail. Packs need every
// operand at the destination's offset modulo 16; otherwise the whole range goes element by element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/reduce_ops.hpp"

namespace topoccl::kernels {

inline constexpr size_t kPackBytes = 16;
// Packs a worker loads before it stores any: one GPU thread block with one load in flight per thread moves
// only a few GB/s (memory latency over 4-8 KiB in flight); four keep four times the bytes in flight.
inline constexpr size_t kPacksInFlight = 4;

// Before sm_89 fp8 converts in software, and four packs in flight make its max/min plan kernels spill
// (sm_80: 8 bytes at the 128-register cap of 512 threads); one pack at a time does not.
template <class T>
TOPOCCL_HD constexpr size_t packsInFlightFor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  return std::is_same_v<T, Float8E4M3> || std::is_same_v<T, Float8E5M2> ? 1 : kPacksInFlight;
#else
  return kPacksInFlight;
#endif
}

struct alignas(kPackBytes) Pack16 {
  uint32_t words[4];
};

struct PackSplit {
  size_t head = 0;   // elements before the first pack
  size_t packs = 0;  // whole packs
  size_t tail = 0;   // elements after the last pack
};

// How `count` elements of `elementSize` bytes at dst (read from a and b) split into head, packs and tail.
TOPOCCL_HD inline PackSplit splitForPacks(const void* dst, const void* a, const void* b, size_t count, size_t elementSize) {
  PackSplit split;
  split.head = count;
  const uintptr_t offset = reinterpret_cast<uintptr_t>(dst) % kPackBytes;
  if (elementSize == 0 || kPackBytes % elementSize != 0 || offset % elementSize != 0 ||
      reinterpret_cast<uintptr_t>(a) % kPackBytes != offset || reinterpret_cast<uintptr_t>(b) % kPackBytes != offset)
    return split;
  const size_t head = (kPackBytes - offset) % kPackBytes / elementSize;
  if (head >= count) return split;
  const size_t perPack = kPackBytes / elementSize;
  split.head = head;
  split.packs = (count - head) / perPack;
  split.tail = count - head - split.packs * perPack;
  return split;
}

// op applied to each element of two packs.
template <class T, class Op>
TOPOCCL_HD inline Pack16 reducePack(const Pack16& x, const Pack16& y) {
  constexpr int kElements = static_cast<int>(kPackBytes / sizeof(T));
  union Lanes {
    Pack16 pack;
    T elements[kElements];
  };
  Lanes a, b, out;
  a.pack = x;
  b.pack = y;
  const Op op{};
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (int i = 0; i < kElements; ++i) out.elements[i] = op(a.elements[i], b.elements[i]);
  return out.pack;
}

// Worker `worker` of `workers` computes its share of dst[i] = a[i] (op) b[i], i < count: elements and
// packs are dealt round-robin, so neighbouring workers touch neighbouring memory (coalesced on a GPU).
// dst may alias a or b exactly: each element or pack is read and written by the same worker.
template <class T, class Op>
TOPOCCL_HD inline void reduceShare(T* dst, const T* a, const T* b, size_t count, size_t worker, size_t workers) {
  const PackSplit split = splitForPacks(dst, a, b, count, sizeof(T));
  const Op op{};
  for (size_t i = worker; i < split.head; i += workers) dst[i] = op(a[i], b[i]);
  auto* dstPacks = reinterpret_cast<Pack16*>(dst + split.head);
  const auto* aPacks = reinterpret_cast<const Pack16*>(a + split.head);
  const auto* bPacks = reinterpret_cast<const Pack16*>(b + split.head);
  size_t p = worker;
  // All loads of a group before its stores: dst may alias a or b, but only at the same index, which the
  // same worker reads before it writes.
  constexpr size_t kInFlight = packsInFlightFor<T>();
  for (; p + (kInFlight - 1) * workers < split.packs; p += kInFlight * workers) {
    Pack16 x[kInFlight], y[kInFlight];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (size_t k = 0; k < kInFlight; ++k) {
      x[k] = aPacks[p + k * workers];
      y[k] = bPacks[p + k * workers];
    }
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (size_t k = 0; k < kInFlight; ++k) dstPacks[p + k * workers] = reducePack<T, Op>(x[k], y[k]);
  }
  for (; p < split.packs; p += workers) dstPacks[p] = reducePack<T, Op>(aPacks[p], bPacks[p]);
  const size_t tailBegin = split.head + split.packs * (kPackBytes / sizeof(T));
  for (size_t i = tailBegin + worker; i < count; i += workers) dst[i] = op(a[i], b[i]);
}

// Worker `worker` of `workers` computes its share of dst[i] = src[i] * scalar, i < count (PreMulSum's
// prescale; the product rounds like ProdOp, as the host's hostScale). dst may alias src exactly.
template <class T>
TOPOCCL_HD inline void scaleShare(T* dst, const T* src, T scalar, size_t count, size_t worker, size_t workers) {
  const PackSplit split = splitForPacks(dst, src, src, count, sizeof(T));
  const ProdOp<T> multiply{};
  for (size_t i = worker; i < split.head; i += workers) dst[i] = multiply(src[i], scalar);
  union Broadcast {
    Pack16 pack;
    T elements[kPackBytes / sizeof(T)];
  } broadcast;
  for (size_t k = 0; k < kPackBytes / sizeof(T); ++k) broadcast.elements[k] = scalar;
  auto* dstPacks = reinterpret_cast<Pack16*>(dst + split.head);
  const auto* srcPacks = reinterpret_cast<const Pack16*>(src + split.head);
  for (size_t p = worker; p < split.packs; p += workers) dstPacks[p] = reducePack<T, ProdOp<T>>(srcPacks[p], broadcast.pack);
  const size_t tailBegin = split.head + split.packs * (kPackBytes / sizeof(T));
  for (size_t i = tailBegin + worker; i < count; i += workers) dst[i] = multiply(src[i], scalar);
}

// Worker `worker` of `workers` computes its share of dst[i] = src[i] / divisor truncated toward zero (integer
// Avg's last step). Integer types only. dst may alias src exactly.
template <class T>
TOPOCCL_HD inline void divideShare(T* dst, const T* src, uint64_t divisor, size_t count, size_t worker, size_t workers) {
  for (size_t i = worker; i < count; i += workers) dst[i] = divideTowardZero<T>(src[i], divisor);
}

// Worker `worker` of `workers` copies its share of `bytes` bytes (no overlap), in packs where src and dst
// share their offset modulo 16.
TOPOCCL_HD inline void copyShare(void* dst, const void* src, size_t bytes, size_t worker, size_t workers) {
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  const PackSplit split = splitForPacks(out, in, in, bytes, 1);
  for (size_t i = worker; i < split.head; i += workers) out[i] = in[i];
  auto* outPacks = reinterpret_cast<Pack16*>(out + split.head);
  const auto* inPacks = reinterpret_cast<const Pack16*>(in + split.head);
  size_t p = worker;
  for (; p + (kPacksInFlight - 1) * workers < split.packs; p += kPacksInFlight * workers) {
    Pack16 x[kPacksInFlight];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (size_t k = 0; k < kPacksInFlight; ++k) x[k] = inPacks[p + k * workers];
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
    for (size_t k = 0; k < kPacksInFlight; ++k) outPacks[p + k * workers] = x[k];
  }
  for (; p < split.packs; p += workers) outPacks[p] = inPacks[p];
  for (size_t i = split.head + split.packs * kPackBytes + worker; i < bytes; i += workers) out[i] = in[i];
}

}  // namespace topoccl::kernels
