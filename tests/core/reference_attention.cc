#include "tests/core/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace attnserve::core {

namespace {

// y[rows, n_out] = x[rows, n_in] W^T + b, W row-major [n_out, n_in] (a slice of a
// larger matrix starting at row `first_row`).
std::vector<double> Linear(absl::Span<const float> x, int64_t rows, int64_t n_in,
                           const std::vector<float>& weight,
                           const std::vector<float>& bias, int64_t first_row,
                           int64_t n_out) {
  std::vector<double> y(rows * n_out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < n_out; ++o) {
      double sum = bias[first_row + o];
      for (int64_t i = 0; i < n_in; ++i) {
        sum += static_cast<double>(x[r * n_in + i]) *
               static_cast<double>(weight[(first_row + o) * n_in + i]);
      }
      y[r * n_out + o] = sum;
    }
  }
  return y;
}

// Rotates each head's first 2 inv_freq.size() values of every row of x [rows, d] by
// the angles of the row's position: pairs (c, c + n) for rotate_half, (2c, 2c + 1)
// when interleaved, with n = inv_freq.size() and c < n.
void Rotate(const AttentionOptions::Rotary& rotary, int64_t rows, int64_t width,
            int64_t head_dim, std::vector<double>& x) {
  const int64_t heads = width / head_dim;
  const auto pairs = static_cast<int64_t>(rotary.inv_freq.size());
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      double* head = &x[t * width + h * head_dim];
      for (int64_t c = 0; c < pairs; ++c) {
        // The angle as transformers forms it: an f32 product of an f32 position.
        const float angle = static_cast<float>(t) * rotary.inv_freq[c];
        const double cosine = std::cos(static_cast<double>(angle));
        const double sine = std::sin(static_cast<double>(angle));
        double& first = rotary.interleaved ? head[2 * c] : head[c];
        double& second = rotary.interleaved ? head[2 * c + 1] : head[c + pairs];
        const double a = first;
        const double b = second;
        first = a * cosine - b * sine;
        second = b * cosine + a * sine;
      }
    }
  }
}

// RMS-normalizes each head_dim slice of every row of x [rows, width], times `scale`.
void RmsNormHeads(const std::vector<float>& scale, double eps, int64_t head_dim,
                  std::vector<double>& x) {
  for (size_t first = 0; first < x.size(); first += static_cast<size_t>(head_dim)) {
    double squares = 0.0;
    for (int64_t c = 0; c < head_dim; ++c) squares += x[first + c] * x[first + c];
    const double inverse = 1.0 / std::sqrt(squares / static_cast<double>(head_dim) + eps);
    for (int64_t c = 0; c < head_dim; ++c) x[first + c] *= inverse * scale[c];
  }
}

}  // namespace

ReferenceResult ReferenceAttention(const ModelSpec& spec, const AttentionWeights& weights,
                                   absl::Span<const float> query,
                                   absl::Span<const float> memory, bool causal,
                                   absl::Span<const float> head_mask,
                                   const RelativeBias& relative_bias) {
  AttentionOptions options;
  options.causal = causal;
  options.head_mask = head_mask;
  options.relative_bias = relative_bias;
  return ReferenceAttention(spec, weights, query, memory, options);
}

ReferenceResult ReferenceAttention(const ModelSpec& spec, const AttentionWeights& weights,
                                   absl::Span<const float> query,
                                   absl::Span<const float> memory,
                                   const AttentionOptions& options) {
  const bool causal = options.causal;
  const absl::Span<const float> head_mask = options.head_mask;
  const RelativeBias& relative_bias = options.relative_bias;
  const int64_t window = options.window;
  const int64_t d = spec.d_model;
  const int64_t heads = spec.num_heads;
  const int64_t head_dim = spec.head_dim();
  const int64_t w = heads * head_dim;
  const absl::Span<const float> source = memory.empty() ? query : memory;
  const int64_t lq = static_cast<int64_t>(query.size()) / d;
  const int64_t lk = static_cast<int64_t>(source.size()) / d;

  // Grouped-query attention: kv key/value columns, query head h reading key/value head
  // h / (heads / kv_heads).
  const int64_t kv_heads = spec.num_kv_heads > 0 ? spec.num_kv_heads : heads;
  const int64_t kv = kv_heads * head_dim;
  const int64_t group = heads / kv_heads;
  std::vector<double> q =
      Linear(query, lq, d, weights.in_proj_weight, weights.in_proj_bias, 0, w);
  std::vector<double> k =
      Linear(source, lk, d, weights.in_proj_weight, weights.in_proj_bias, w, kv);
  if (spec.qk_norm) {
    RmsNormHeads(weights.query_norm_weight, spec.qk_norm_eps, head_dim, q);
    RmsNormHeads(weights.key_norm_weight, spec.qk_norm_eps, head_dim, k);
  }
  if (!options.rotary.empty()) {
    Rotate(options.rotary, lq, w, head_dim, q);
    Rotate(options.rotary, lk, kv, head_dim, k);
  }
  const std::vector<double> v =
      Linear(source, lk, d, weights.in_proj_weight, weights.in_proj_bias, w + kv, kv);

  ReferenceResult result;
  result.attention.assign(heads * lq * lk, 0.0);
  std::vector<double> concat(lq * w, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  for (int64_t h = 0; h < heads; ++h) {
    const double factor =
        spec.IsPruned(h) ? 0.0 : (head_mask.empty() ? 1.0 : head_mask[h]);
    // A head with factor 0 is pruned: not computed, attention weights all zero.
    if (factor == 0.0) continue;
    for (int64_t i = 0; i < lq; ++i) {
      double* row = &result.attention[(h * lq + i) * lk];
      // Whether query i sees key j: the causal mask and the window.
      const auto visible = [&](int64_t j) {
        return !(causal && j > i) && !(window > 0 && std::abs(j - i) > window);
      };
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < lk; ++j) {
        if (!visible(j)) {
          continue;
        }
        double dot = 0.0;
        for (int64_t c = 0; c < head_dim; ++c) {
          dot += q[i * w + h * head_dim + c] * k[j * kv + (h / group) * head_dim + c];
        }
        row[j] = dot * scale;
        if (!relative_bias.empty()) {
          const int64_t offset =
              std::clamp(j - i, -relative_bias.radius, relative_bias.radius);
          row[j] +=
              relative_bias
                  .values[h * relative_bias.width() + offset + relative_bias.radius];
        }
        max_score = std::max(max_score, row[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < lk; ++j) {
        row[j] = visible(j) ? std::exp(row[j] - max_score) : 0.0;
        sum += row[j];
      }
      for (int64_t j = 0; j < lk; ++j) row[j] /= sum;
      for (int64_t c = 0; c < head_dim; ++c) {
        double value = 0.0;
        for (int64_t j = 0; j < lk; ++j) {
          value += row[j] * v[j * kv + (h / group) * head_dim + c];
        }
        concat[i * w + h * head_dim + c] = factor * value;
      }
    }
  }

  result.output.assign(lq * d, 0.0);
  for (int64_t i = 0; i < lq; ++i) {
    for (int64_t o = 0; o < d; ++o) {
      double sum = weights.out_proj_bias[o];
      for (int64_t c = 0; c < w; ++c) {
        sum +=
            concat[i * w + c] * static_cast<double>(weights.out_proj_weight[o * w + c]);
      }
      result.output[i * d + o] = sum;
    }
  }
  return result;
}

}  // namespace attnserve::core
