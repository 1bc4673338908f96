// ModelSpec: the shape and precision of one multi-head attention model.
#ifndef ATTNSERVE_CORE_MODEL_SPEC_H_
#define ATTNSERVE_CORE_MODEL_SPEC_H_

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
  // Number of heads h; must divide d_model. Range [1, d_model].
  int64_t num_heads = 8;
  // Arithmetic precision.
  Precision precision = Precision::kFp32;
  // Heads removed from the model, ascending, each in [0, num_heads), at least one head
  // left. A pruned head is not computed: its weights are dropped at load, its output
  // counts as zero, and its attention weights read as zeros.
  std::vector<int64_t> pruned_heads;

  // d_model / num_heads. REQUIRES: Validate().ok().
  int64_t head_dim() const { return d_model / num_heads; }
  // Whether `head` is in pruned_heads.
  bool IsPruned(int64_t head) const;

  // OK, or InvalidArgument naming the bad field and the expected value.
  absl::Status Validate() const;

  // For logs and errors, e.g. "d_model=512 num_heads=8 precision=fp32" (plus
  // " pruned_heads=1,3" when some are).
  std::string DebugString() const;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_MODEL_SPEC_H_
