#include "core/attention/quantization.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace attnserve::core {
namespace {

using ::attnserve::core::testing::RandomTokens;

TEST(QuantizationTest, RowCodesReconstructWithinHalfAStep) {
  // Rows of different ranges, one all positive, one all negative, one all zero.
  std::vector<float> rows = RandomTokens(5 * 300, 1, 3.0f);
  for (int64_t k = 0; k < 300; ++k) {
    rows[300 + k] = std::fabs(rows[300 + k]) + 0.5f;
    rows[600 + k] = -std::fabs(rows[600 + k]) * 100.0f;
    rows[900 + k] = 0.0f;
  }
  for (const int levels : {255, 127}) {
    std::vector<uint8_t> codes(rows.size());
    std::vector<float> scales(5);
    std::vector<int32_t> zero_points(5);
    QuantizeRows(rows.data(), 5, 300, levels, codes.data(), scales.data(),
                 zero_points.data());
    for (int64_t i = 0; i < 5; ++i) {
      ASSERT_GT(scales[i], 0.0f) << "row " << i;
      ASSERT_GE(zero_points[i], 0);
      ASSERT_LE(zero_points[i], levels);
      for (int64_t k = 0; k < 300; ++k) {
        const float x = rows[i * 300 + k];
        const int code = codes[i * 300 + k];
        ASSERT_LE(code, levels);
        const double back = static_cast<double>(scales[i]) * (code - zero_points[i]);
        // Half a step from rounding, and float rounding of x / step besides.
        EXPECT_LE(std::fabs(back - x), 0.5001 * scales[i] + 1e-6 * std::fabs(x))
            << "row " << i << " column " << k << " levels " << levels;
      }
    }
    // Zero is coded exactly, so an all-zero row dequantizes to zeros.
    EXPECT_EQ(codes[900], zero_points[3]);
  }
}

TEST(QuantizationTest, NonFiniteValuesGiveCodesNotCrashes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> rows = {1.0f, nan, -1.0f, 0.5f, inf, -inf, 2.0f, 3.0f};
  std::vector<uint8_t> codes(8);
  std::vector<float> scales(2);
  std::vector<int32_t> zero_points(2);
  QuantizeRows(rows.data(), 2, 4, 255, codes.data(), scales.data(), zero_points.data());
  EXPECT_EQ(codes[1], 0);  // NaN
  for (float scale : scales) EXPECT_TRUE(std::isfinite(scale) && scale > 0.0f);
}

TEST(QuantizationTest, WeightsQuantizePerOutputChannel) {
  std::vector<float> weights = RandomTokens(6 * 50, 2, 0.2f);
  for (int64_t k = 0; k < 50; ++k) {
    weights[50 + k] *= 100.0f;  // a channel of large weights keeps its own scale
    weights[100 + k] = 0.0f;
  }
  for (const int levels : {127, 63}) {
    const QuantizedMatrix matrix = QuantizeWeights(weights.data(), 6, 50, levels);
    ASSERT_EQ(matrix.values.size(), 300u);
    for (int64_t j = 0; j < 6; ++j) {
      int64_t sum = 0;
      for (int64_t k = 0; k < 50; ++k) {
        const int code = matrix.values[j * 50 + k];
        EXPECT_LE(std::abs(code), levels);
        EXPECT_LE(std::fabs(matrix.scales[j] * code - weights[j * 50 + k]),
                  0.5001 * matrix.scales[j])
            << "channel " << j;
        sum += code;
      }
      EXPECT_EQ(matrix.column_sums[j], static_cast<float>(sum));
    }
    EXPECT_EQ(matrix.scales[2], 1.0f);  // the zero channel
    EXPECT_GT(matrix.scales[1], 50.0f * matrix.scales[0]);
  }
}

TEST(QuantizationTest, DequantizeIsTheProductOfTheCodes) {
  // acc from the codes by hand; Dequantize must give s_x s_w (acc - z sum) + b, which
  // is sum_k (s_x (x_k - z)) (s_w w_k) + b: the product of the dequantized values.
  const int64_t rows = 70, in = 33, out = 40;  // odd sizes: vector tails
  const std::vector<float> x = RandomTokens(rows * in, 3);
  const std::vector<float> w = RandomTokens(out * in, 4, 0.1f);
  const std::vector<float> bias = RandomTokens(out, 5);
  const QuantizedMatrix matrix = QuantizeWeights(w.data(), out, in, 127);
  std::vector<uint8_t> codes(rows * in);
  std::vector<float> scales(rows);
  std::vector<int32_t> zero_points(rows);
  QuantizeRows(x.data(), rows, in, 255, codes.data(), scales.data(), zero_points.data());
  std::vector<int32_t> acc(rows * out);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      int32_t sum = 0;
      for (int64_t k = 0; k < in; ++k) {
        sum += codes[i * in + k] * matrix.values[j * in + k];
      }
      acc[i * out + j] = sum;
    }
  }
  std::vector<float> y(rows * out), unbiased(rows * out);
  Dequantize(acc.data(), rows, matrix, scales.data(), zero_points.data(), bias.data(),
             y.data());
  Dequantize(acc.data(), rows, matrix, scales.data(), zero_points.data(), nullptr,
             unbiased.data());
  double worst_vs_exact = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      double dequantized = 0.0, exact = 0.0;
      for (int64_t k = 0; k < in; ++k) {
        dequantized += static_cast<double>(scales[i]) *
                       (codes[i * in + k] - zero_points[i]) * matrix.scales[j] *
                       matrix.values[j * in + k];
        exact += static_cast<double>(x[i * in + k]) * w[j * in + k];
      }
      EXPECT_NEAR(y[i * out + j], dequantized + bias[j], 1e-5) << i << "," << j;
      EXPECT_NEAR(unbiased[i * out + j], dequantized, 1e-5) << i << "," << j;
      worst_vs_exact = std::max(worst_vs_exact, std::fabs(dequantized - exact));
    }
  }
  // And it approximates the f32 product: |x| <= 1, |w| <= 0.1, 33 terms.
  EXPECT_LT(worst_vs_exact, 0.02);
}

TEST(QuantizationTest, LevelsFollowTheCpu) {
  const Int8Levels levels = Int8LevelsForCpu();
  EXPECT_EQ(levels.activation, 255);
  EXPECT_TRUE(levels.weight == 127 || levels.weight == 63) << levels.weight;
  if (std::getenv("ATTNSERVE_EXPECT_NO_VNNI") != nullptr) {
    EXPECT_EQ(levels.weight, 63);
  }
}

}  // namespace
}  // namespace attnserve::core
