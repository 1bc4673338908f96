// Helpers shared by the core tests: deterministic inputs and error measurement.
#ifndef ATTNSERVE_TESTS_CORE_TEST_UTIL_H_
#define ATTNSERVE_TESTS_CORE_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"

namespace attnserve::core::testing {

// Values uniform in [-scale, scale), reproducible from `seed`.
inline std::vector<float> RandomTokens(int64_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(-scale, scale);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

// max_i |a_i - b_i|; infinity when the sizes differ.
template <typename A, typename B>
double MaxAbsDiff(absl::Span<const A> a, absl::Span<const B> b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!(diff <= worst)) worst = diff;  // NaN propagates as a failure
  }
  return worst;
}

}  // namespace attnserve::core::testing

#endif  // ATTNSERVE_TESTS_CORE_TEST_UTIL_H_
