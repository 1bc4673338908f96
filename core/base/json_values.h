// Typed reads of nlohmann::json values for the parsers of config files and request
// bodies: through get_ptr, which answers null for another type, where nlohmann's
// converting accessors (get<>) throw. Header-only; its users link nlohmann-json.
#ifndef ATTNSERVE_CORE_BASE_JSON_VALUES_H_
#define ATTNSERVE_CORE_BASE_JSON_VALUES_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace attnserve::core {

// The deepest nesting of arrays and objects in the JSON `text`, counting only brackets
// outside strings; stops counting once past `limit`. Parsers check it before parsing
// (nlohmann's recurses) to refuse a body nested past their limit by name.
inline int JsonNestingDepth(absl::string_view text, int limit) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Any JSON number as a double; nullopt for anything else.
inline std::optional<double> JsonNumber(const nlohmann::json& value) {
  using Json = nlohmann::json;
  if (const auto* real = value.get_ptr<const Json::number_float_t*>()) return *real;
  if (const auto* integer = value.get_ptr<const Json::number_integer_t*>()) {
    return static_cast<double>(*integer);
  }
  if (const auto* count = value.get_ptr<const Json::number_unsigned_t*>()) {
    return static_cast<double>(*count);
  }
  return std::nullopt;
}

// A JSON integer that fits int64 (nlohmann keeps non-negative ones as unsigned); a
// float, a larger number or another type is nullopt.
inline std::optional<int64_t> JsonInt64(const nlohmann::json& value) {
  using Json = nlohmann::json;
  if (const auto* integer = value.get_ptr<const Json::number_integer_t*>()) {
    return *integer;
  }
  if (const auto* count = value.get_ptr<const Json::number_unsigned_t*>();
      count != nullptr &&
      *count <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(*count);
  }
  return std::nullopt;
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_BASE_JSON_VALUES_H_
