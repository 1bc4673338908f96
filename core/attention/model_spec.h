// ModelSpec: the shape and precision of one multi-head attention model.
#ifndef ATTNSERVE_CORE_ATTENTION_MODEL_SPEC_H_
#define ATTNSERVE_CORE_ATTENTION_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attnserve::core {

// Arithmetic precision of the weights and of the matrix products.
enum class Precision {
  kFp32,
  kBf16,
  // Dynamic quantization: weights int8 per output channel, activations uint8 per token
  // at run time, int32 accumulation; attention scores, softmax and outputs in f32.
  kInt8,
};

// "fp32" / "bf16" / "int8".
absl::string_view PrecisionName(Precision precision);

// A value type describing a multi-head attention layer. Plain data; copy freely.
struct ModelSpec {
  // Model (embedding) dimension d: the length of every token vector. Range [1, 65536].
  int64_t d_model = 512;
  // Number of heads h; must divide d_model (unless head_size is set). Range [1,
  // d_model].
  int64_t num_heads = 8;
  // Each head's width when it is not d_model / num_heads (Qwen3-0.6B: 16 heads of 128
  // in a model of 1024): Q holds num_heads * head_size values per token, and W_out
  // takes them back to d_model. 0: d_model / num_heads. Range [0, 65536].
  int64_t head_size = 0;
  // Grouped-query attention: the heads of keys and values, each shared by
  // num_heads / num_kv_heads consecutive query heads (query head i reads key/value head
  // i / (num_heads / num_kv_heads), as transformers' repeat_kv pairs them); 0: one per
  // query head (num_heads). Must divide num_heads. K and V are projected once per
  // key/value head, never copied per query head.
  int64_t num_kv_heads = 0;
  // Each head's query and key RMS-normalized over its head_dim values after their
  // projection (and bias) and before rotary positions (Qwen3's q_norm and k_norm):
  // x / sqrt(mean(x^2) + qk_norm_eps) times a learned [head_dim] scale
  // (AttentionWeights::query_norm_weight, key_norm_weight).
  bool qk_norm = false;
  float qk_norm_eps = 1e-6f;  // > 0
  // Arithmetic precision.
  Precision precision = Precision::kFp32;
  // Heads removed from the model, ascending, each in [0, num_heads), at least one head
  // left. A pruned head is not computed: its weights are dropped at load, its output
  // counts as zero, and its attention weights read as zeros.
  std::vector<int64_t> pruned_heads;

  // head_size, or d_model / num_heads. REQUIRES: Validate().ok().
  int64_t head_dim() const { return head_size > 0 ? head_size : d_model / num_heads; }
  // Width of the queries (and of the concatenated heads): num_heads * head_dim().
  int64_t q_width() const { return num_heads * head_dim(); }
  // num_kv_heads, or num_heads when it is 0. REQUIRES: Validate().ok().
  int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  // The key (and value) head that query `head` reads.
  int64_t KvHead(int64_t head) const { return head / (num_heads / kv_heads()); }
  // Width of the keys and of the values: kv_heads() * head_dim().
  int64_t kv_width() const { return kv_heads() * head_dim(); }
  // Whether `head` is in pruned_heads.
  bool IsPruned(int64_t head) const;

  // OK, or InvalidArgument naming the bad field and the expected value.
  absl::Status Validate() const;

  // For logs and errors, e.g. "d_model=512 num_heads=8 precision=fp32" (plus
  // " num_kv_heads=2", " qk_norm" and " pruned_heads=1,3" when set).
  std::string DebugString() const;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ATTENTION_MODEL_SPEC_H_
