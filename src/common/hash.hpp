// FNV-1a 64: a stable, dependency-free hash for fingerprints and cache keys (topology fingerprints, plan
// cache entries, the MSCCL_XML_FILES digest ranks compare). Not for security: anyone can make collisions.
#pragma once

#include <cstdint>
#include <string_view>

namespace topoccl {

inline constexpr uint64_t kFnv1a64Offset = 14695981039346656037ull;  // 0xcbf29ce484222325

// Extends `hash` with `text`; start from kFnv1a64Offset (feeding pieces in turn equals hashing their concatenation).
constexpr uint64_t fnv1a64(std::string_view text, uint64_t hash = kFnv1a64Offset) {
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace topoccl
