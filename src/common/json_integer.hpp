// Integers read from JSON with their range checked. nlohmann's get<int>() converts a floating-point or
// out-of-range number without a check (undefined behaviour for a float past the type's range: a fuzzer
// finding), so every reader of integers from a file goes through this. Header-only; the includer links
// nlohmann_json.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

namespace topoccl {

// The value as T when it is a JSON integer within T's range; nothing for floats (3.0 too), strings, ....
template <class T>
std::optional<T> jsonInteger(const nlohmann::json& value) {
  static_assert(std::numeric_limits<T>::is_integer, "jsonInteger reads integer types");
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
    return static_cast<T>(u);
  }
  if (value.is_number_integer()) {
    const int64_t i = value.get<int64_t>();
    if constexpr (std::numeric_limits<T>::is_signed) {
      if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) || i > static_cast<int64_t>(std::numeric_limits<T>::max()))
        return std::nullopt;
    } else {
      if (i < 0 || static_cast<uint64_t>(i) > static_cast<uint64_t>(std::numeric_limits<T>::max())) return std::nullopt;
    }
    return static_cast<T>(i);
  }
  return std::nullopt;
}

}  // namespace topoccl
