// An additive bias on each head's attention scores that depends only on how far the
// key is from the query: bias(head, j - i) for query i and key j. MPNet's bucketed
// relative positions (shared by every layer) are one; ALiBi's slopes (-slope |j - i|)
// are another. Beyond a radius the bias is constant on each side (MPNet's buckets stop
// growing at 128 tokens), so a head's bias is a table of 2 radius + 1 values, O(h L)
// however long the sequence, and a row of scores adds a slice of it.
#ifndef ATTNSERVE_CORE_ATTENTION_RELATIVE_BIAS_H_
#define ATTNSERVE_CORE_ATTENTION_RELATIVE_BIAS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace attnserve::core {

struct RelativeBias {
  // Empty (no bias), or [num_heads, 2 radius + 1]: head h's bias for offset o = j - i
  // is values[h (2 radius + 1) + clamp(o, -radius, radius) + radius].
  absl::Span<const float> values;
  int64_t radius = 0;
  static constexpr int64_t kMaxRadius = int64_t{1} << 24;

  bool empty() const { return values.empty(); }
  int64_t width() const { return 2 * radius + 1; }
  // Head h's table (valid when not empty).
  const float* Head(int64_t head) const { return values.data() + head * width(); }

  // OK, or InvalidArgument naming the field: a negative radius, a size other than
  // num_heads (2 radius + 1), a value that is not finite.
  absl::Status Validate(int64_t num_heads) const {
    if (values.empty()) return absl::OkStatus();
    if (radius < 0 || radius > kMaxRadius) {
      return absl::InvalidArgumentError(absl::StrCat(
          "relative_bias.radius must be in [0, ", kMaxRadius, "], got ", radius));
    }
    if (static_cast<int64_t>(values.size()) != num_heads * width()) {
      return absl::InvalidArgumentError(
          absl::StrCat("relative_bias.values must hold num_heads * (2 radius + 1) = ",
                       num_heads * width(), " floats, got ", values.size()));
    }
    for (size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "relative_bias.values[", i, "] must be finite, got ", values[i]));
      }
    }
    return absl::OkStatus();
  }
};

// row[j] += table[clamp(first_offset + j, -radius, radius) + radius] for j < n: the
// scores of one query row against n consecutive keys, the first of them first_offset
// keys after the query. The constant ends and the sliding middle are separate loops
// (the middle one vectorizes).
inline void AddRelativeBias(float* row, int64_t n, int64_t first_offset,
                            const float* table, int64_t radius) {
  // Keys j with first_offset + j < -radius take table[0]; those past radius take
  // table[2 radius].
  const int64_t low_end = std::clamp<int64_t>(-radius - first_offset, 0, n);
  const int64_t high_begin = std::clamp<int64_t>(radius + 1 - first_offset, low_end, n);
  const float low = table[0];
  const float high = table[2 * radius];
  for (int64_t j = 0; j < low_end; ++j) row[j] += low;
  const int64_t shift = radius + first_offset;
  for (int64_t j = low_end; j < high_begin; ++j) row[j] += table[shift + j];
  for (int64_t j = high_begin; j < n; ++j) row[j] += high;
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ATTENTION_RELATIVE_BIAS_H_
