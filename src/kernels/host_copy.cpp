#include "kernels/host_copy.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#include <emmintrin.h>
#endif

namespace topoccl::kernels {

void streamingCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  // Head: up to the destination's first 16-byte boundary (streaming stores need it aligned).
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(out) % 16) % 16);
  std::memcpy(out, in, head);
  out += head;
  in += head;
  bytes -= head;
  // Body: 64 bytes (one line) a round, four loads before four stores.
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(out + i + 48), d);
  }
  _mm_sfence();
  std::memcpy(out + i, in + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

bool bulkCopyUsesStringCopy() {
#if defined(__x86_64__)
  static const bool erms = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    return (ebx & (1u << 9)) != 0;  // CPUID.(EAX=7,ECX=0):EBX bit 9, enhanced REP MOVSB/STOSB
  }();
  return erms;
#else
  return false;
#endif
}

void bulkCopy(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  if (bytes >= kBulkCopyMinBytes && bulkCopyUsesStringCopy()) {
    asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(bytes) : : "memory");
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

namespace {

// cpu0's cache `index` in sysfs: its level and size in bytes, or nullopt when not listed.
struct CacheEntry {
  int level = 0;
  size_t bytes = 0;
  bool instructions = false;
};
std::optional<CacheEntry> sysfsCache(int index) {
  const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
  std::ifstream sizeFile(dir + "size"), levelFile(dir + "level"), typeFile(dir + "type");
  std::string text, type;
  CacheEntry entry;
  if (!(sizeFile >> text) || text.empty()) return std::nullopt;
  if (!(levelFile >> entry.level)) entry.level = 0;
  if (typeFile >> type) entry.instructions = type == "Instruction";
  size_t used = 0;
  try {
    entry.bytes = std::stoull(text, &used);
  } catch (...) {
    return std::nullopt;
  }
  const char unit = used < text.size() ? text[used] : ' ';
  if (unit == 'K') entry.bytes <<= 10;
  else if (unit == 'M') entry.bytes <<= 20;
  else if (unit == 'G') entry.bytes <<= 30;
  return entry;
}

}  // namespace

size_t coreCacheBytes() {
  static const size_t bytes = [] {
    for (int index = 0; index < 8; ++index)
      if (const auto entry = sysfsCache(index); entry && entry->level == 2 && !entry->instructions) return entry->bytes;
    return size_t{0};
  }();
  return bytes;
}

size_t lastLevelCacheBytes() {
  // index3 is the L3 where there is one; take the largest cache sysfs lists for cpu0.
  size_t largest = 0;
  for (int index = 0; index < 8; ++index)
    if (const auto entry = sysfsCache(index)) largest = std::max(largest, entry->bytes);
#ifdef _SC_LEVEL3_CACHE_SIZE
  if (largest == 0) {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 > 0) largest = static_cast<size_t>(l3);
  }
#endif
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return usableCacheBytes(largest, online > 0 ? static_cast<size_t>(online) : 1);
}

}  // namespace topoccl::kernels
