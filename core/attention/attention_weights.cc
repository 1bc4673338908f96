#include "core/attention/attention_weights.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"

namespace attnserve::core {

namespace {

// SplitMix64: a tiny integer generator whose output is fully specified, unlike the
// distributions of <random>, which differ between standard libraries.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

// Fills `out` with values uniform in [-bound, bound): a signed 24-bit integer times
// bound / 2^23, a single rounding, so every machine produces the same floats.
void FillUniform(SplitMix64& generator, float bound, std::vector<float>& out,
                 size_t count) {
  const float step = bound / 8388608.0f;  // 2^23
  out.resize(count);
  for (float& value : out) {
    const int32_t integer = static_cast<int32_t>(generator.Next() >> 40) - 8388608;
    value = static_cast<float>(integer) * step;
  }
}

absl::Status CheckSize(absl::string_view name, const std::vector<float>& values,
                       int64_t expected) {
  if (static_cast<int64_t>(values.size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has ", values.size(), " values, expected ", expected));
  }
  return absl::OkStatus();
}

std::string FloatBytes(const std::vector<float>& values) {
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

}  // namespace

absl::Status AttentionWeights::CheckShapes(const ModelSpec& spec) const {
  const int64_t d = spec.d_model;
  const int64_t rows = spec.q_width() + 2 * spec.kv_width();
  ATTN_RETURN_IF_ERROR(CheckSize(kInProjWeightName, in_proj_weight, rows * d));
  ATTN_RETURN_IF_ERROR(CheckSize(kInProjBiasName, in_proj_bias, rows));
  ATTN_RETURN_IF_ERROR(
      CheckSize(kOutProjWeightName, out_proj_weight, d * spec.q_width()));
  ATTN_RETURN_IF_ERROR(CheckSize(kOutProjBiasName, out_proj_bias, d));
  const int64_t norm = spec.qk_norm ? spec.head_dim() : 0;
  ATTN_RETURN_IF_ERROR(CheckSize(kQueryNormName, query_norm_weight, norm));
  ATTN_RETURN_IF_ERROR(CheckSize(kKeyNormName, key_norm_weight, norm));
  return absl::OkStatus();
}

AttentionWeights GenerateAttentionWeights(const ModelSpec& spec, uint64_t seed) {
  const auto d = static_cast<size_t>(spec.d_model);
  const auto rows = static_cast<size_t>(spec.q_width() + 2 * spec.kv_width());
  SplitMix64 generator(seed);
  AttentionWeights weights;
  const float xavier = std::sqrt(6.0f / static_cast<float>(4 * d));
  const float linear = 1.0f / std::sqrt(static_cast<float>(d));
  FillUniform(generator, xavier, weights.in_proj_weight, rows * d);
  FillUniform(generator, 0.1f, weights.in_proj_bias, rows);
  FillUniform(generator, linear, weights.out_proj_weight,
              d * static_cast<size_t>(spec.q_width()));
  FillUniform(generator, 0.1f, weights.out_proj_bias, d);
  if (spec.qk_norm) {
    // Scales around 1, as a trained norm's are.
    const auto head_dim = static_cast<size_t>(spec.head_dim());
    FillUniform(generator, 0.5f, weights.query_norm_weight, head_dim);
    FillUniform(generator, 0.5f, weights.key_norm_weight, head_dim);
    for (float& w : weights.query_norm_weight) w += 1.0f;
    for (float& w : weights.key_norm_weight) w += 1.0f;
  }
  return weights;
}

namespace {

// The file must hold exactly nn.MultiheadAttention's four tensors for the options the
// core computes; anything else is refused by name rather than silently ignored, since
// each of these options changes the answer.
absl::Status CheckSupportedModule(const SafetensorsFile& file, const ModelSpec& spec) {
  if (file.Find("bias_k") != nullptr || file.Find("bias_v") != nullptr) {
    return absl::InvalidArgumentError(
        "add_bias_kv is not supported (the file has bias_k/bias_v): export an "
        "nn.MultiheadAttention built with add_bias_kv=False");
  }
  if (file.Find("q_proj_weight") != nullptr || file.Find("k_proj_weight") != nullptr ||
      file.Find("v_proj_weight") != nullptr) {
    return absl::InvalidArgumentError(
        "kdim/vdim different from embed_dim is not supported (the file has separate "
        "q_proj_weight/k_proj_weight/v_proj_weight): keys and values must have d_model "
        "features");
  }
  if (file.Find(kInProjWeightName) != nullptr && file.Find(kInProjBiasName) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("bias=False is not supported (the file has ", kInProjWeightName,
                     " but no ", kInProjBiasName,
                     "): export an nn.MultiheadAttention built with bias=True, or "
                     "write zero biases"));
  }
  for (const std::string& name : file.Names()) {
    if (name != kInProjWeightName && name != kInProjBiasName &&
        name != kOutProjWeightName && name != kOutProjBiasName &&
        !(spec.qk_norm && (name == kQueryNormName || name == kKeyNormName))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected tensor '", name, "': the file must hold exactly ",
          kInProjWeightName, ", ", kInProjBiasName, ", ", kOutProjWeightName, " and ",
          kOutProjBiasName, " (an nn.MultiheadAttention state_dict; strip any prefix)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttentionWeights> LoadAttentionWeights(const SafetensorsFile& file,
                                                      const ModelSpec& spec) {
  ATTN_RETURN_IF_ERROR(spec.Validate());
  ATTN_RETURN_IF_ERROR(CheckSupportedModule(file, spec));
  const int64_t d = spec.d_model;
  const int64_t rows = spec.q_width() + 2 * spec.kv_width();
  AttentionWeights weights;
  ATTN_ASSIGN_OR_RETURN(weights.in_proj_weight,
                        file.ReadFloat32(kInProjWeightName, {rows, d}));
  ATTN_ASSIGN_OR_RETURN(weights.in_proj_bias, file.ReadFloat32(kInProjBiasName, {rows}));
  ATTN_ASSIGN_OR_RETURN(weights.out_proj_weight,
                        file.ReadFloat32(kOutProjWeightName, {d, spec.q_width()}));
  ATTN_ASSIGN_OR_RETURN(weights.out_proj_bias, file.ReadFloat32(kOutProjBiasName, {d}));
  if (spec.qk_norm) {
    ATTN_ASSIGN_OR_RETURN(weights.query_norm_weight,
                          file.ReadFloat32(kQueryNormName, {spec.head_dim()}));
    ATTN_ASSIGN_OR_RETURN(weights.key_norm_weight,
                          file.ReadFloat32(kKeyNormName, {spec.head_dim()}));
  }
  return weights;
}

absl::StatusOr<AttentionWeights> LoadAttentionWeightsFile(const std::string& path,
                                                          const ModelSpec& spec) {
  ATTN_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(path));
  absl::StatusOr<AttentionWeights> weights = LoadAttentionWeights(file, spec);
  if (!weights.ok()) {
    return absl::Status(weights.status().code(),
                        absl::StrCat(path, ": ", weights.status().message()));
  }
  return weights;
}

absl::StatusOr<std::string> SerializeAttentionWeights(const AttentionWeights& weights,
                                                      const ModelSpec& spec) {
  ATTN_RETURN_IF_ERROR(spec.Validate());
  ATTN_RETURN_IF_ERROR(weights.CheckShapes(spec));
  const int64_t d = spec.d_model;
  const int64_t rows = spec.q_width() + 2 * spec.kv_width();
  std::vector<SafetensorsEntry> entries = {
      {kInProjWeightName, "F32", {rows, d}, FloatBytes(weights.in_proj_weight)},
      {kInProjBiasName, "F32", {rows}, FloatBytes(weights.in_proj_bias)},
      {kOutProjWeightName,
       "F32",
       {d, spec.q_width()},
       FloatBytes(weights.out_proj_weight)},
      {kOutProjBiasName, "F32", {d}, FloatBytes(weights.out_proj_bias)},
  };
  if (spec.qk_norm) {
    entries.push_back({kQueryNormName,
                       "F32",
                       {spec.head_dim()},
                       FloatBytes(weights.query_norm_weight)});
    entries.push_back(
        {kKeyNormName, "F32", {spec.head_dim()}, FloatBytes(weights.key_norm_weight)});
  }
  return SerializeSafetensors(entries);
}

}  // namespace attnserve::core
