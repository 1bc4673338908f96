// A naive fp64 implementation of the same multi-head attention math, written from the
// definition with plain loops. For tests only (target attnserve_core_reference): it is
// the independent oracle the oneDNN core is checked against.
#ifndef ATTNSERVE_TESTS_CORE_REFERENCE_ATTENTION_H_
#define ATTNSERVE_TESTS_CORE_REFERENCE_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "core/attention/attention_backend.h"
#include "core/attention/attention_weights.h"
#include "core/attention/model_spec.h"
#include "core/attention/relative_bias.h"

namespace attnserve::core {

// Result for one sequence.
struct ReferenceResult {
  std::vector<double> output;     // [L_q, d]
  std::vector<double> attention;  // [h, L_q, L_k]
};

// One sequence: `query` [L_q, d]; `memory` [L_k, d] or empty for self-attention;
// `head_mask` empty or h factors. A head with factor 0, or in spec.pruned_heads, is
// pruned: it adds nothing to the output and its attention weights are zeros.
// `relative_bias` (self-attention) is added to head h's scaled score of query i and key
// j as relative_bias(h, j - i), each offset clamped here with std::clamp. REQUIRES:
// consistent sizes (checked by assert-free arithmetic only; callers are tests).
ReferenceResult ReferenceAttention(const ModelSpec& spec, const AttentionWeights& weights,
                                   absl::Span<const float> query,
                                   absl::Span<const float> memory, bool causal,
                                   absl::Span<const float> head_mask,
                                   const RelativeBias& relative_bias = {});

// The same with every option of AttentionOptions, as its comments define them: the
// causal mask, head mask and relative bias as above; `options.rotary` rotates each
// head's projected query and key (after their bias) by angles float(t) * inv_freq[i]
// taken in f32 (as transformers takes them), whose cos and sin and the rotation are in
// fp64; spec.num_kv_heads and spec.qk_norm as ModelSpec defines them; `options.window` >
// 0 leaves keys with |j - i| > window out of query i's softmax (their weights read 0).
ReferenceResult ReferenceAttention(const ModelSpec& spec, const AttentionWeights& weights,
                                   absl::Span<const float> query,
                                   absl::Span<const float> memory,
                                   const AttentionOptions& options);

}  // namespace attnserve::core

#endif  // ATTNSERVE_TESTS_CORE_REFERENCE_ATTENTION_H_
