// Typed reads of nlohmann::json values for the parsers of config files and request
// bodies: through get_ptr, which answers null for another type, where nlohmann's
// converting accessors (get<>) throw. Header-only; its users link nlohmann-json.
#ifndef ATTNSERVE_CORE_BASE_JSON_VALUES_H_
#define ATTNSERVE_CORE_BASE_JSON_VALUES_H_

#include <cstdint>
#include <limits>
#include <optional>

#include "nlohmann/json.hpp"

namespace attnserve::core {

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
