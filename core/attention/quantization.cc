#include "core/attention/quantization.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/base/thread_sanitizer.h"
#include "dnnl.hpp"

namespace attnserve::core {
namespace {

// Below this many values a loop runs on the calling thread alone: a parallel region
// costs more than it saves.
constexpr int64_t kParallelValues = 1 << 15;
// Parallel regions of our own run on the calling thread under TSan (thread_sanitizer.h).
constexpr bool kParallel = !kThreadSanitizer;

bool HasIsa(dnnl::cpu_isa wanted) {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bits = static_cast<unsigned>(wanted);
  return (isa & bits) == bits;
}

// One row of QuantizeRows. Written so that the compiler vectorizes it: no library
// calls, NaN handled by comparisons that are false for it.
#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void QuantizeRow(const float* in, int64_t width, float levels, uint8_t* out, float* scale,
                 int32_t* zero_point) {
  float lo = 0.0f;
  float hi = 0.0f;
  for (int64_t k = 0; k < width; ++k) {
    lo = in[k] < lo ? in[k] : lo;
    hi = in[k] > hi ? in[k] : hi;
  }
  float step = (hi - lo) / levels;
  if (!(step > 0.0f) || !std::isfinite(step)) {
    // All zeros (or a range too wide to code): every finite value codes as 0 or
    // saturates, and the scale stays positive so that dequantizing stays finite.
    step = step > 0.0f ? std::numeric_limits<float>::max() / levels : 1.0f;
  }
  const float inverse = 1.0f / step;
  // The zero point is an exact code: -lo / step rounded, within [0, levels].
  const float zero = std::min(levels, std::max(0.0f, std::nearbyint(-lo * inverse)));
  for (int64_t k = 0; k < width; ++k) {
    float code = in[k] * inverse + zero + 0.5f;
    code = code >= 0.0f ? code : 0.0f;  // NaN lands here too
    code = code <= levels ? code : levels;
    out[k] = static_cast<uint8_t>(static_cast<int32_t>(code));
  }
  *scale = step;
  *zero_point = static_cast<int32_t>(zero);
}

#if defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void DequantizeRow(const int32_t* acc, int64_t width, const float* column_scales,
                   const float* column_sums, float row_scale, float zero_point,
                   const float* bias, bool accumulate, float* out) {
  // The conditions are the same for every j: the compiler moves them out of the loop.
  for (int64_t j = 0; j < width; ++j) {
    const float product = row_scale * column_scales[j] *
                              (static_cast<float>(acc[j]) - zero_point * column_sums[j]) +
                          (bias != nullptr ? bias[j] : 0.0f);
    out[j] = accumulate ? out[j] + product : product;
  }
}

}  // namespace

Int8Levels Int8LevelsForCpu() {
  Int8Levels levels;
  if (!HasIsa(dnnl::cpu_isa::avx512_core_vnni) && !HasIsa(dnnl::cpu_isa::avx2_vnni)) {
    levels.weight = 63;
  }
  return levels;
}

QuantizedMatrix QuantizeWeights(const float* weights, int64_t out, int64_t in,
                                int levels) {
  QuantizedMatrix matrix;
  matrix.out = out;
  matrix.values.resize(static_cast<size_t>(out * in));
  matrix.scales.resize(static_cast<size_t>(out));
  matrix.column_sums.resize(static_cast<size_t>(out));
  for (int64_t j = 0; j < out; ++j) {
    const float* row = weights + j * in;
    float largest = 0.0f;
    for (int64_t k = 0; k < in; ++k) largest = std::max(largest, std::fabs(row[k]));
    const float scale = largest > 0.0f ? largest / static_cast<float>(levels) : 1.0f;
    int64_t sum = 0;
    int8_t* codes = matrix.values.data() + j * in;
    for (int64_t k = 0; k < in; ++k) {
      // Written so that a NaN weight saturates instead of reaching an undefined
      // float-to-int conversion.
      const float code = std::round(row[k] / scale);
      const float top = static_cast<float>(levels);
      codes[k] = static_cast<int8_t>(code >= -top ? (code <= top ? code : top) : -top);
      sum += codes[k];
    }
    matrix.scales[j] = scale;
    matrix.column_sums[j] = static_cast<float>(sum);
  }
  return matrix;
}

void QuantizeRows(const float* in, int64_t rows, int64_t width, int levels, uint8_t* out,
                  float* scales, int32_t* zero_points) {
  const float top = static_cast<float>(levels);
#pragma omp parallel for schedule(static) if (kParallel && \
                                              rows * width >= kParallelValues)
  for (int64_t i = 0; i < rows; ++i) {
    QuantizeRow(in + i * width, width, top, out + i * width, scales + i, zero_points + i);
  }
}

void Dequantize(const int32_t* acc, int64_t rows, const QuantizedMatrix& weights,
                const float* row_scales, const int32_t* zero_points, const float* bias,
                float* out, bool accumulate) {
  const int64_t width = weights.out;
#pragma omp parallel for schedule(static) if (kParallel && \
                                              rows * width >= kParallelValues)
  for (int64_t i = 0; i < rows; ++i) {
    DequantizeRow(acc + i * width, width, weights.scales.data(),
                  weights.column_sums.data(), row_scales[i],
                  static_cast<float>(zero_points[i]), bias, accumulate, out + i * width);
  }
}

}  // namespace attnserve::core
