// AttentionWeights: the parameters of one multi-head attention layer, in the names and
// layout of PyTorch's nn.MultiheadAttention.state_dict(), so a trained module's
// safetensors file loads as is.
#ifndef ATTNSERVE_CORE_ATTENTION_ATTENTION_WEIGHTS_H_
#define ATTNSERVE_CORE_ATTENTION_ATTENTION_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/model_spec.h"
#include "core/io/safetensors.h"

namespace attnserve::core {

// Tensor names in the file, as nn.MultiheadAttention.state_dict() calls them.
inline constexpr char kInProjWeightName[] = "in_proj_weight";
inline constexpr char kInProjBiasName[] = "in_proj_bias";
inline constexpr char kOutProjWeightName[] = "out_proj.weight";
inline constexpr char kOutProjBiasName[] = "out_proj.bias";
// ModelSpec::qk_norm's scales (no nn.MultiheadAttention has them).
inline constexpr char kQueryNormName[] = "q_norm.weight";
inline constexpr char kKeyNormName[] = "k_norm.weight";

// Row-major float32 parameters (bf16 files are widened on load). A value type.
struct AttentionWeights {
  // [w + 2 kv, d] (w = spec.q_width(), d unless head_size is set; kv =
  // spec.kv_width(), w unless grouped-query): rows [0, w) project queries, [w, w + kv)
  // keys, [w + kv, w + 2 kv) values; q = x W_q^T + b_q.
  std::vector<float> in_proj_weight;
  // [w + 2 kv]
  std::vector<float> in_proj_bias;
  // [d, w]: out = concat(heads) W_out^T + b_out.
  std::vector<float> out_proj_weight;
  // [d]
  std::vector<float> out_proj_bias;
  // spec.qk_norm only (else empty): the [head_dim] scales of the queries' and keys'
  // RMS norms, shared by every head.
  std::vector<float> query_norm_weight;
  std::vector<float> key_norm_weight;

  // OK when every tensor has the size `spec` implies; else InvalidArgument naming it.
  absl::Status CheckShapes(const ModelSpec& spec) const;
};

// Deterministic weights from `seed`: the same seed gives the same bits on every
// machine and compiler (integer generator, one exact scaling per value). Scales follow
// PyTorch's initialisation (Xavier-uniform in_proj, uniform(+-1/sqrt(d)) out_proj);
// biases are small non-zero values so that they are exercised. REQUIRES:
// spec.Validate().ok().
AttentionWeights GenerateAttentionWeights(const ModelSpec& spec, uint64_t seed);

// Reads the four tensors from a parsed safetensors file (and, for spec.qk_norm,
// q_norm.weight and k_norm.weight [head_dim]). NotFound naming a missing
// tensor; InvalidArgument for a wrong shape (expected vs found) or a dtype other than
// F32/BF16. Extra tensors are ignored (a whole-model file may hold more layers).
absl::StatusOr<AttentionWeights> LoadAttentionWeights(const SafetensorsFile& file,
                                                      const ModelSpec& spec);

// Reads `path` and loads it as above; the path is named in every error.
absl::StatusOr<AttentionWeights> LoadAttentionWeightsFile(const std::string& path,
                                                          const ModelSpec& spec);

// The four tensors as F32 safetensors bytes, loadable by LoadAttentionWeights and by
// PyTorch (safetensors.torch.load_file).
absl::StatusOr<std::string> SerializeAttentionWeights(const AttentionWeights& weights,
                                                      const ModelSpec& spec);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ATTENTION_ATTENTION_WEIGHTS_H_
