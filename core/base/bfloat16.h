// bfloat16 <-> float32: bf16 is the upper half of an IEEE binary32.
#ifndef ATTNSERVE_CORE_BASE_BFLOAT16_H_
#define ATTNSERVE_CORE_BASE_BFLOAT16_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace attnserve::core {

// Exact: every bf16 value is a float32.
inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

// Rounds to nearest, ties to even; NaN stays NaN.
inline uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_BASE_BFLOAT16_H_
