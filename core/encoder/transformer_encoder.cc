#include "core/encoder/transformer_encoder.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/attention/multi_head_attention.h"
#include "core/attention/primitive_cache.h"
#include "core/attention/quantization.h"
#include "core/base/bfloat16.h"
#include "core/base/row_chunks.h"
#include "core/base/scratch_buffer.h"
#include "core/base/status_macros.h"
#include "core/encoder/encoder_family.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace attnserve::core {

namespace {

using dnnl::memory;

constexpr int kMaxThreads = 1024;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::Status CheckSize(const std::vector<float>& tensor, int64_t expected,
                       absl::string_view name) {
  if (static_cast<int64_t>(tensor.size()) != expected) {
    return Invalid(
        absl::StrCat(name, " has ", tensor.size(), " values, expected ", expected));
  }
  return absl::OkStatus();
}

dnnl::algorithm ActivationAlgorithm(EncoderSpec::Activation activation) {
  switch (activation) {
    case EncoderSpec::Activation::kGeluTanh:
      return dnnl::algorithm::eltwise_gelu_tanh;
    case EncoderSpec::Activation::kRelu:
      return dnnl::algorithm::eltwise_relu;
    case EncoderSpec::Activation::kSilu:
      return dnnl::algorithm::eltwise_swish;
    case EncoderSpec::Activation::kGeluErf:
      break;
  }
  return dnnl::algorithm::eltwise_gelu_erf;
}

// oneDNN's alpha of an eltwise algorithm: swish is x sigmoid(alpha x), SiLU's alpha 1;
// the others here take none.
float EltwiseAlpha(dnnl::algorithm algorithm) {
  return algorithm == dnnl::algorithm::eltwise_swish ? 1.0f : 0.0f;
}

memory::desc Plain(int64_t rows, int64_t columns,
                   memory::data_type type = memory::data_type::f32) {
  return memory::desc({rows, columns}, type, memory::format_tag::ab);
}

memory Wrap(const memory::desc& desc, const dnnl::engine& engine, const float* data) {
  // oneDNN takes a mutable handle; inputs are only read.
  return memory(desc, engine, const_cast<float*>(data));
}

// Adds one layer's figures, from its attention weights ([heads, L, L] per sequence),
// to `statistics` (one per head) as means over the batch's `tokens` query rows.
void AccumulateHeadStatistics(absl::Span<const float> weights,
                              absl::Span<const int64_t> lengths, int64_t heads,
                              int64_t tokens,
                              absl::Span<EncoderHeadStatistic> statistics) {
  const double per_row = 1.0 / static_cast<double>(tokens);
  const float* plane = weights.data();
  for (const int64_t length : lengths) {
    for (int64_t h = 0; h < heads; ++h) {
      EncoderHeadStatistic& figures = statistics[h];
      for (int64_t i = 0; i < length; ++i, plane += length) {
        double entropy = 0.0, largest = 0.0, distance = 0.0;
        for (int64_t j = 0; j < length; ++j) {
          const double p = plane[j];
          if (p > 0.0) entropy -= p * std::log(p);
          largest = std::max(largest, p);
          distance += p * static_cast<double>(std::abs(i - j));
        }
        figures.mean_entropy += entropy * per_row;
        figures.mean_max_weight += largest * per_row;
        figures.mean_distance += distance * per_row;
        figures.share_first += plane[0] * per_row;
        figures.share_last += plane[length - 1] * per_row;
        figures.share_self += plane[i] * per_row;
        if (i > 0) figures.share_previous += plane[i - 1] * per_row;
      }
    }
  }
}

// to = from / sqrt(mean(from^2) + eps) * scale + shift over each row of [rows, width],
// in f32 as transformers' RMSNorm computes it.
void RmsNormRows(int64_t rows, int64_t width, float eps, const float* from,
                 const std::vector<float>& scale, const std::vector<float>& shift,
                 float* to) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = from + r * width;
    float* y = to + r * width;
    float squares = 0.0f;
    for (int64_t c = 0; c < width; ++c) squares += x[c] * x[c];
    const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(width) + eps);
    for (int64_t c = 0; c < width; ++c) y[c] = scale[c] * (x[c] * inverse) + shift[c];
  }
}

// The heads after the pooling: Dense layers, a classification head, a SPLADE head.
absl::Status CheckHeadsOnTop(const EncoderSpec& spec, const EncoderFamily& row) {
  int64_t width = spec.d_model;
  for (size_t i = 0; i < spec.dense.size(); ++i) {
    if (spec.num_labels > 0)
      return Invalid("dense layers cannot follow a classification head");
    if (spec.dense[i].in_features != width || spec.dense[i].out_features < 1 ||
        spec.dense[i].out_features > EncoderSpec::kMaxDenseWidth) {
      return Invalid(absl::StrCat("dense[", i, "] must take ", width,
                                  " features and give 1 to ", EncoderSpec::kMaxDenseWidth,
                                  ", got ", spec.dense[i].in_features, " -> ",
                                  spec.dense[i].out_features));
    }
    width = spec.dense[i].out_features;
  }
  if (spec.sparse != EncoderSpec::Sparse::kNone) {
    if (spec.num_labels > 0 || !spec.dense.empty() || spec.normalize) {
      return Invalid(absl::StrCat("a SPLADE head (sparse) takes no ",
                                  spec.num_labels > 0   ? "classification head"
                                  : !spec.dense.empty() ? "dense layers"
                                                        : "normalize"));
    }
    if (!row.has_masked_lm()) {
      return Invalid(absl::StrCat(
          "a SPLADE head (sparse) is served for ",
          FamilyNames([](const EncoderFamily& f) { return f.has_masked_lm(); }),
          " checkpoints only"));
    }
    if (spec.norm_placement != EncoderSpec::NormPlacement::kPost) {
      return Invalid("a SPLADE head (sparse) is served for post-LN encoders only");
    }
  } else if (spec.sparse_log_twice) {
    return Invalid("sparse_log_twice applies to a SPLADE head (sparse) only");
  }
  return absl::OkStatus();
}

// Each layer's attention options: every layer or none, windows in range, rotary
// frequencies finite and at most half a head.
absl::Status CheckLayerAttention(const EncoderSpec& spec) {
  if (!spec.layer_attention.empty() &&
      static_cast<int64_t>(spec.layer_attention.size()) != spec.num_layers) {
    return Invalid(absl::StrCat("layer_attention must list every one of the ",
                                spec.num_layers, " layers or none, got ",
                                spec.layer_attention.size()));
  }
  for (size_t layer = 0; layer < spec.layer_attention.size(); ++layer) {
    const EncoderSpec::LayerAttention& attention = spec.layer_attention[layer];
    if (attention.window < 0 || attention.window > spec.max_positions) {
      return Invalid(absl::StrCat("layer_attention[", layer, "].window must be in [0, ",
                                  spec.max_positions, "], got ", attention.window));
    }
    const int64_t head_dim = spec.head_size > 0   ? spec.head_size
                             : spec.num_heads > 0 ? spec.d_model / spec.num_heads
                                                  : 0;
    if (static_cast<int64_t>(attention.rotary_inv_freq.size()) * 2 > head_dim) {
      return Invalid(absl::StrCat("layer_attention[", layer, "].rotary_inv_freq has ",
                                  attention.rotary_inv_freq.size(),
                                  " frequencies, more than half the head size ",
                                  head_dim));
    }
    for (const float value : attention.rotary_inv_freq) {
      if (!std::isfinite(value) || value < 0.0f) {
        return Invalid(
            absl::StrCat("layer_attention[", layer,
                         "].rotary_inv_freq must hold finite values >= 0, got ", value));
      }
    }
  }
  return absl::OkStatus();
}

// What the family's row says its encoders are: relative buckets, norm placements, norm,
// mask, positions and token types.
absl::Status CheckAgainstFamily(const EncoderSpec& spec, const EncoderFamily& row) {
  const int64_t buckets = row.relative_attention_buckets;
  if (spec.relative_attention_buckets != buckets) {
    return Invalid(absl::StrCat("relative_attention_buckets must be ", buckets,
                                " for this family, got ",
                                spec.relative_attention_buckets));
  }
  if (spec.activation == EncoderSpec::Activation::kSilu && !spec.gated_ffn) {
    return Invalid("activation SiLU is served in a gated feed-forward (SwiGLU) only");
  }
  // What the family's blocks are: its norm placements, norm, mask and positions.
  if (spec.norm != row.norm || spec.causal != row.causal) {
    return Invalid(absl::StrCat("RMSNorm and a causal mask are served in the ",
                                FamilyNames([](const EncoderFamily& f) {
                                  return f.norm == EncoderSpec::Norm::kRms;
                                }),
                                " family only"));
  }
  if (!row.Allows(spec.norm_placement) ||
      (row.rotary && (spec.absolute_positions || !spec.gated_ffn))) {
    return Invalid(absl::StrCat(
        "a ", row.name, " encoder is ",
        row.Allows(EncoderSpec::NormPlacement::kPost) ? "post-LN" : "pre-LN",
        row.norm == EncoderSpec::Norm::kRms ? " (RMSNorm" : "",
        row.causal ? ", causal" : "", row.norm == EncoderSpec::Norm::kRms ? ")" : "",
        row.rotary ? " with a gated feed-forward and no position table" : ""));
  }
  if (row.token_types == EncoderFamily::TokenTypes::kNone && spec.type_vocab_size != 1) {
    return Invalid(absl::StrCat("type_vocab_size must be 1 for a ", row.name,
                                " encoder (it has no token types), got ",
                                spec.type_vocab_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EncoderSpec::Validate() const {
  const auto at_least_one = [](int64_t value, absl::string_view name) {
    return value >= 1 ? absl::OkStatus()
                      : Invalid(absl::StrCat(name, " must be >= 1, got ", value));
  };
  ATTN_RETURN_IF_ERROR(at_least_one(num_layers, "num_layers"));
  ATTN_RETURN_IF_ERROR(at_least_one(d_model, "d_model"));
  ATTN_RETURN_IF_ERROR(at_least_one(num_heads, "num_heads"));
  ATTN_RETURN_IF_ERROR(at_least_one(ffn_dim, "ffn_dim"));
  ATTN_RETURN_IF_ERROR(at_least_one(max_positions, "max_positions"));
  ATTN_RETURN_IF_ERROR(at_least_one(vocab_size, "vocab_size"));
  ATTN_RETURN_IF_ERROR(at_least_one(type_vocab_size, "type_vocab_size"));
  if (position_offset < 0 || position_offset > (int64_t{1} << 20)) {
    return Invalid(
        absl::StrCat("position_offset must be in [0, 2^20], got ", position_offset));
  }
  const EncoderFamily& row = FamilyOf(family);
  ATTN_RETURN_IF_ERROR(CheckHeadsOnTop(*this, row));
  ATTN_RETURN_IF_ERROR(CheckLayerAttention(*this));
  ATTN_RETURN_IF_ERROR(CheckAgainstFamily(*this, row));
  if (head_size == 0 && d_model % num_heads != 0) {
    return Invalid(absl::StrCat("d_model (", d_model,
                                ") must be a multiple of num_heads (", num_heads, ")"));
  }
  if (absl::Status status = AttentionSpec(0).Validate(); !status.ok()) {
    return Invalid(absl::StrCat("attention: ", status.message()));
  }
  if (num_labels < 0 || num_labels > kMaxLabels) {
    return Invalid(
        absl::StrCat("num_labels must be in [0, ", kMaxLabels, "], got ", num_labels));
  }
  if (!(layer_norm_eps > 0.0f)) {
    return Invalid(absl::StrCat("layer_norm_eps must be > 0, got ", layer_norm_eps));
  }
  for (const auto* lists : {&pruned_heads, &checkpoint_pruned_heads}) {
    const char* name =
        lists == &pruned_heads ? "pruned_heads" : "checkpoint_pruned_heads";
    if (!lists->empty() && static_cast<int64_t>(lists->size()) != num_layers) {
      return Invalid(absl::StrCat(name, " must list every one of the ", num_layers,
                                  " layers or none, got ", lists->size()));
    }
  }
  for (size_t layer = 0; layer < pruned_heads.size(); ++layer) {
    if (absl::Status status = AttentionSpec(static_cast<int64_t>(layer)).Validate();
        !status.ok()) {
      return Invalid(absl::StrCat("layer ", layer, ": ", status.message()));
    }
  }
  for (size_t layer = 0; layer < checkpoint_pruned_heads.size(); ++layer) {
    for (const int64_t head : checkpoint_pruned_heads[layer]) {
      const absl::Span<const int64_t> removed = PrunedHeads(static_cast<int64_t>(layer));
      if (std::find(removed.begin(), removed.end(), head) == removed.end()) {
        return Invalid(absl::StrCat("layer ", layer,
                                    ": checkpoint_pruned_heads has head ", head,
                                    ", which pruned_heads lacks"));
      }
    }
  }
  // int8 sums of 255 * 127 per term stay within int32 up to this many terms.
  constexpr int64_t kMaxInt8Terms = 65536;
  if (precision == Precision::kInt8 && ffn_dim > kMaxInt8Terms) {
    return Invalid(absl::StrCat("ffn_dim must be <= ", kMaxInt8Terms,
                                " for int8 precision (int32 sums), got ", ffn_dim));
  }
  return absl::OkStatus();
}

absl::Span<const int64_t> EncoderSpec::PrunedHeads(int64_t layer) const {
  if (pruned_heads.empty()) return {};
  return pruned_heads[static_cast<size_t>(layer)];
}

ModelSpec EncoderSpec::AttentionSpec(int64_t layer) const {
  ModelSpec attention;
  attention.d_model = d_model;
  attention.num_heads = num_heads;
  attention.num_kv_heads = num_kv_heads;
  attention.head_size = head_size;
  attention.qk_norm = qk_norm;
  attention.qk_norm_eps = layer_norm_eps;
  attention.precision = precision;
  if (layer < static_cast<int64_t>(pruned_heads.size())) {
    attention.pruned_heads = pruned_heads[static_cast<size_t>(layer)];
  }
  return attention;
}

absl::Status EncoderWeights::CheckShapes(const EncoderSpec& spec) const {
  const int64_t d = spec.d_model;
  if ((word_embeddings == nullptr) == (word_embeddings_bf16 == nullptr)) {
    return Invalid("exactly one of word_embeddings and word_embeddings_bf16 must be set");
  }
  if (word_embeddings != nullptr) {
    ATTN_RETURN_IF_ERROR(
        CheckSize(*word_embeddings, spec.vocab_size * d, "word_embeddings"));
  } else if (static_cast<int64_t>(word_embeddings_bf16->size()) != spec.vocab_size * d) {
    return Invalid(absl::StrCat("word_embeddings_bf16 has ", word_embeddings_bf16->size(),
                                " values, expected ", spec.vocab_size * d));
  }
  ATTN_RETURN_IF_ERROR(CheckSize(position_embeddings,
                                 spec.absolute_positions ? spec.max_positions * d : 0,
                                 "position_embeddings"));
  ATTN_RETURN_IF_ERROR(CheckSize(token_type_embeddings, spec.type_vocab_size * d,
                                 "token_type_embeddings"));
  const bool pre = spec.norm_placement == EncoderSpec::NormPlacement::kPre;
  const int64_t embedding_norm = spec.embedding_norm() ? d : 0;
  ATTN_RETURN_IF_ERROR(
      CheckSize(embedding_norm_scale, embedding_norm, "embedding_norm_scale"));
  ATTN_RETURN_IF_ERROR(
      CheckSize(embedding_norm_shift, embedding_norm, "embedding_norm_shift"));
  ATTN_RETURN_IF_ERROR(CheckSize(final_norm_scale, pre ? d : 0, "final_norm_scale"));
  ATTN_RETURN_IF_ERROR(CheckSize(final_norm_shift, pre ? d : 0, "final_norm_shift"));
  ATTN_RETURN_IF_ERROR(CheckSize(relative_attention_bias,
                                 spec.relative_attention_buckets * spec.num_heads,
                                 "relative_attention_bias"));
  for (size_t i = 0; i < relative_attention_bias.size(); ++i) {
    if (!std::isfinite(relative_attention_bias[i])) {
      return Invalid(absl::StrCat("relative_attention_bias[", i, "] must be finite, got ",
                                  relative_attention_bias[i]));
    }
  }
  const int64_t labels = spec.num_labels;
  const int64_t head = labels > 0 ? d : 0;
  ATTN_RETURN_IF_ERROR(CheckSize(pooler_weight, head * d, "pooler_weight"));
  ATTN_RETURN_IF_ERROR(CheckSize(pooler_bias, head, "pooler_bias"));
  ATTN_RETURN_IF_ERROR(CheckSize(classifier_weight, labels * d, "classifier_weight"));
  ATTN_RETURN_IF_ERROR(CheckSize(classifier_bias, labels, "classifier_bias"));
  const bool splade = spec.sparse != EncoderSpec::Sparse::kNone;
  const int64_t mlm = splade ? d : 0;
  ATTN_RETURN_IF_ERROR(CheckSize(mlm_transform_weight, mlm * d, "mlm_transform_weight"));
  ATTN_RETURN_IF_ERROR(CheckSize(mlm_transform_bias, mlm, "mlm_transform_bias"));
  ATTN_RETURN_IF_ERROR(CheckSize(mlm_norm_scale, mlm, "mlm_norm_scale"));
  ATTN_RETURN_IF_ERROR(CheckSize(mlm_norm_shift, mlm, "mlm_norm_shift"));
  ATTN_RETURN_IF_ERROR(
      CheckSize(mlm_decoder_bias, splade ? spec.vocab_size : 0, "mlm_decoder_bias"));
  if (splade != (mlm_decoder != nullptr)) {
    return Invalid("mlm_decoder must be set exactly when the spec has a SPLADE head");
  }
  if (splade) {
    ATTN_RETURN_IF_ERROR(CheckSize(*mlm_decoder, spec.vocab_size * d, "mlm_decoder"));
  }
  if (dense.size() != spec.dense.size()) {
    return Invalid(absl::StrCat("dense has ", dense.size(), " layers, expected ",
                                spec.dense.size()));
  }
  for (size_t i = 0; i < dense.size(); ++i) {
    const EncoderSpec::Dense& layer = spec.dense[i];
    ATTN_RETURN_IF_ERROR(CheckSize(dense[i].weight,
                                   layer.out_features * layer.in_features,
                                   absl::StrCat("dense[", i, "].weight")));
    ATTN_RETURN_IF_ERROR(CheckSize(dense[i].bias, layer.out_features,
                                   absl::StrCat("dense[", i, "].bias")));
  }
  if (static_cast<int64_t>(layers.size()) != spec.num_layers) {
    return Invalid(absl::StrCat("layers has ", layers.size(), " entries, expected ",
                                spec.num_layers));
  }
  const ModelSpec attention = spec.AttentionSpec(0);
  for (size_t i = 0; i < layers.size(); ++i) {
    const EncoderLayerWeights& layer = layers[i];
    const std::string at = absl::StrCat("layers[", i, "].");
    if (absl::Status status = layer.attention.CheckShapes(attention); !status.ok()) {
      return Invalid(absl::StrCat(at, "attention: ", status.message()));
    }
    // ModernBERT's first block reads its input without a norm.
    const int64_t attention_norm =
        FamilyOf(spec.family).first_block_without_attention_norm && i == 0 ? 0 : d;
    ATTN_RETURN_IF_ERROR(CheckSize(layer.attention_norm_scale, attention_norm,
                                   at + "attention_norm_scale"));
    ATTN_RETURN_IF_ERROR(CheckSize(layer.attention_norm_shift, attention_norm,
                                   at + "attention_norm_shift"));
    const int64_t ffn_in = (spec.gated_ffn ? 2 : 1) * spec.ffn_dim;
    ATTN_RETURN_IF_ERROR(
        CheckSize(layer.ffn_in_weight, ffn_in * d, at + "ffn_in_weight"));
    ATTN_RETURN_IF_ERROR(CheckSize(layer.ffn_in_bias, ffn_in, at + "ffn_in_bias"));
    ATTN_RETURN_IF_ERROR(
        CheckSize(layer.ffn_out_weight, d * spec.ffn_dim, at + "ffn_out_weight"));
    ATTN_RETURN_IF_ERROR(CheckSize(layer.ffn_out_bias, d, at + "ffn_out_bias"));
    ATTN_RETURN_IF_ERROR(CheckSize(layer.output_norm_scale, d, at + "output_norm_scale"));
    ATTN_RETURN_IF_ERROR(CheckSize(layer.output_norm_shift, d, at + "output_norm_shift"));
  }
  return absl::OkStatus();
}

int64_t MpnetRelativeBucket(int64_t offset) {
  constexpr int64_t kHalf = EncoderSpec::kMpnetBuckets / 2;  // per direction
  constexpr int64_t kExact = kHalf / 2;
  // transformers: n = -(j - i); keys after the query (n < 0) take the upper half.
  const int64_t n = -offset;
  const int64_t base = n < 0 ? kHalf : 0;
  const int64_t distance = std::min<int64_t>(std::abs(n), kMpnetBucketRadius);
  if (distance < kExact) return base + distance;
  // log(n / 8) / log(128 / 8) * 8, in float32 as torch computes it (exact at 16, 32,
  // 64 and 128, where the bucket steps), then truncated.
  const float scaled =
      std::log(static_cast<float>(distance) / static_cast<float>(kExact)) /
      static_cast<float>(std::log(static_cast<double>(kMpnetBucketRadius) /
                                  static_cast<double>(kExact))) *
      static_cast<float>(kHalf - kExact);
  return base + std::min<int64_t>(kExact + static_cast<int64_t>(scaled), kHalf - 1);
}

namespace {

// Reads one checkpoint's tensors as a family's row names them, under a prefix, and
// keeps the names it read so that LoadBertWeights can refuse any other.
class CheckpointReader {
 public:
  CheckpointReader(const SafetensorsFile& file, const EncoderSpec& spec,
                   absl::string_view prefix)
      : file_(file),
        spec_(spec),
        row_(FamilyOf(spec.family)),
        names_(row_.NamesFor(spec.norm_placement)),
        prefix_(prefix) {}

  const EncoderFamily& row() const { return row_; }
  const TensorNames& names() const { return names_; }
  const std::vector<std::string>& used() const { return used_; }

  // Whether the checkpoint has `name` under the prefix.
  bool Has(absl::string_view name) const {
    return file_.Find(absl::StrCat(prefix_, name)) != nullptr;
  }
  // The full name of tensor `name` (under the prefix unless `outside`), marked used, or
  // the error naming it.
  absl::StatusOr<std::string> Locate(absl::string_view name, bool outside = false) {
    std::string full = outside ? std::string(name) : absl::StrCat(prefix_, name);
    if (file_.Find(full) == nullptr) {
      const bool pre = &names_ != &row_.names;
      return Invalid(
          absl::StrCat("missing tensor ", full, " (a ", row_.name, pre ? " (pre-LN)" : "",
                       " checkpoint with ", spec_.num_layers, " layers",
                       spec_.num_labels > 0 ? " and a classification head"
                       : spec_.sparse != EncoderSpec::Sparse::kNone ? " and a SPLADE head"
                                                                    : "",
                       " names it)"));
    }
    used_.push_back(full);
    return full;
  }
  // Tensor `name` with `shape`, as float32.
  absl::StatusOr<std::vector<float>> Read(absl::string_view name,
                                          std::vector<int64_t> shape,
                                          bool outside = false) {
    ATTN_ASSIGN_OR_RETURN(const std::string full, Locate(name, outside));
    return file_.ReadFloat32(full, shape);
  }
  // `name` + "weight" of `shape` and its bias ([shape[0]]): required in BERT's layout,
  // zeros where the others' checkpoint has none (ModernBERT's attention_bias, mlp_bias,
  // norm_bias; NomicBERT's qkv_proj_bias, mlp_fc1_bias, ...).
  absl::Status Linear(absl::string_view name, std::vector<int64_t> shape,
                      std::vector<float>* weight, std::vector<float>* bias) {
    const int64_t out = shape[0];
    ATTN_ASSIGN_OR_RETURN(*weight, Read(absl::StrCat(name, "weight"), std::move(shape)));
    const std::string bias_name = absl::StrCat(name, "bias");
    if (row_.layout == BlockLayout::kBert || Has(bias_name)) {
      ATTN_ASSIGN_OR_RETURN(*bias, Read(bias_name, {out}));
    } else {
      bias->assign(static_cast<size_t>(out), 0.0f);
    }
    return absl::OkStatus();
  }
  // A norm of width d: LayerNorm's scale and shift, or RMSNorm's scale (shift zeros).
  absl::Status Norm(absl::string_view name, std::vector<float>* scale,
                    std::vector<float>* shift) {
    if (row_.norm == EncoderSpec::Norm::kLayerNorm) {
      return Linear(name, {spec_.d_model}, scale, shift);
    }
    ATTN_ASSIGN_OR_RETURN(*scale, Read(absl::StrCat(name, "weight"), {spec_.d_model}));
    shift->assign(static_cast<size_t>(spec_.d_model), 0.0f);
    return absl::OkStatus();
  }
  const SafetensorsFile& file() const { return file_; }
  const std::string& prefix() const { return prefix_; }

 private:
  const SafetensorsFile& file_;
  const EncoderSpec& spec_;
  const EncoderFamily& row_;
  const TensorNames& names_;
  const std::string prefix_;
  std::vector<std::string> used_;
};

// Appends `from` to `to`.
void Append(const std::vector<float>& from, std::vector<float>* to) {
  to->insert(to->end(), from.begin(), from.end());
}

// A gated feed-forward's first product, fused as [gate (activated); up], the order the
// encoder's gate reads: from one tensor (ModernBERT's mlp.Wi in that order, GTE's
// [up; gate] with its halves swapped) or from two (gate, then up).
absl::Status ReadGatedFfnIn(CheckpointReader& reader, const std::string& at,
                            const EncoderSpec& spec, EncoderLayerWeights* layer) {
  const TensorNames& names = reader.names();
  const int64_t d = spec.d_model;
  if (*names.ffn_in != '\0') {
    ATTN_RETURN_IF_ERROR(reader.Linear(at + names.ffn_in, {2 * spec.ffn_dim, d},
                                       &layer->ffn_in_weight, &layer->ffn_in_bias));
    if (reader.row().ffn_in_up_first) {
      const auto half = static_cast<std::ptrdiff_t>(spec.ffn_dim);
      std::rotate(layer->ffn_in_weight.begin(), layer->ffn_in_weight.begin() + half * d,
                  layer->ffn_in_weight.end());
      std::rotate(layer->ffn_in_bias.begin(), layer->ffn_in_bias.begin() + half,
                  layer->ffn_in_bias.end());
    }
    return absl::OkStatus();
  }
  for (const char* part : {names.ffn_gate, names.ffn_up}) {
    std::vector<float> weight, bias;
    ATTN_RETURN_IF_ERROR(reader.Linear(at + part, {spec.ffn_dim, d}, &weight, &bias));
    Append(weight, &layer->ffn_in_weight);
    Append(bias, &layer->ffn_in_bias);
  }
  return absl::OkStatus();
}

// A gated block's feed-forward half, as the fused and decoder layouts store it: the norm
// of output_norm, the first product (ReadGatedFfnIn) and ffn_out.
absl::Status ReadGatedFeedForward(CheckpointReader& reader, const std::string& at,
                                  const EncoderSpec& spec, EncoderLayerWeights* layer) {
  const TensorNames& names = reader.names();
  ATTN_RETURN_IF_ERROR(reader.Norm(at + names.output_norm, &layer->output_norm_scale,
                                   &layer->output_norm_shift));
  ATTN_RETURN_IF_ERROR(ReadGatedFfnIn(reader, at, spec, layer));
  return reader.Linear(at + names.ffn_out, {spec.d_model, spec.ffn_dim},
                       &layer->ffn_out_weight, &layer->ffn_out_bias);
}

// The norm after the last block, where the row names one (pre-norm layouts).
absl::Status ReadFinalNorm(CheckpointReader& reader, EncoderWeights* weights) {
  const char* name = reader.names().final_norm;
  if (*name == '\0') return absl::OkStatus();
  return reader.Norm(name, &weights->final_norm_scale, &weights->final_norm_shift);
}

// BERT's layout: the norm before the blocks (post-LN: after the embeddings) or after
// them (pre-LN), read first; Q, K and V apart. A layer with checkpoint_pruned_heads
// holds only the heads it kept, in order: a pruned one's rows (Q, K, V) and columns
// (output) are absent, and stay zero here.
absl::Status LoadBertBlocks(const EncoderSpec& spec, CheckpointReader& reader,
                            EncoderWeights* weights) {
  const TensorNames& names = reader.names();
  const int64_t d = spec.d_model;
  const bool pre = spec.norm_placement == EncoderSpec::NormPlacement::kPre;
  ATTN_RETURN_IF_ERROR(pre ? reader.Norm(names.final_norm, &weights->final_norm_scale,
                                         &weights->final_norm_shift)
                           : reader.Norm(names.embedding_norm,
                                         &weights->embedding_norm_scale,
                                         &weights->embedding_norm_shift));
  const int64_t head_dim = d / spec.num_heads;
  for (int64_t n = 0; n < spec.num_layers; ++n) {
    const std::string at = absl::StrCat(names.layer, n, ".");
    EncoderLayerWeights layer;
    std::vector<int64_t> stored;
    const absl::Span<const int64_t> absent =
        spec.checkpoint_pruned_heads.empty()
            ? absl::Span<const int64_t>()
            : absl::Span<const int64_t>(spec.checkpoint_pruned_heads[n]);
    for (int64_t head = 0; head < spec.num_heads; ++head) {
      if (std::find(absent.begin(), absent.end(), head) == absent.end()) {
        stored.push_back(head);
      }
    }
    const auto width = static_cast<int64_t>(stored.size()) * head_dim;
    layer.attention.in_proj_weight.assign(static_cast<size_t>(3 * d * d), 0.0f);
    layer.attention.in_proj_bias.assign(static_cast<size_t>(3 * d), 0.0f);
    for (int64_t part = 0; part < 3; ++part) {
      const char* name = part == 0 ? names.query : part == 1 ? names.key : names.value;
      std::vector<float> weight, bias;
      ATTN_RETURN_IF_ERROR(reader.Linear(at + name, {width, d}, &weight, &bias));
      for (size_t i = 0; i < stored.size(); ++i) {
        const int64_t row = part * d + stored[i] * head_dim;  // in [3d, d]
        std::copy_n(&weight[i * head_dim * d], head_dim * d,
                    &layer.attention.in_proj_weight[row * d]);
        std::copy_n(&bias[i * head_dim], head_dim, &layer.attention.in_proj_bias[row]);
      }
    }
    std::vector<float> out_weight;
    ATTN_RETURN_IF_ERROR(reader.Linear(at + names.attention_out, {d, width}, &out_weight,
                                       &layer.attention.out_proj_bias));
    layer.attention.out_proj_weight.assign(static_cast<size_t>(d * d), 0.0f);
    for (int64_t row = 0; row < d; ++row) {
      for (size_t i = 0; i < stored.size(); ++i) {
        std::copy_n(&out_weight[row * width + i * head_dim], head_dim,
                    &layer.attention.out_proj_weight[row * d + stored[i] * head_dim]);
      }
    }
    ATTN_RETURN_IF_ERROR(reader.Norm(at + names.attention_norm,
                                     &layer.attention_norm_scale,
                                     &layer.attention_norm_shift));
    ATTN_RETURN_IF_ERROR(reader.Linear(at + names.ffn_in, {spec.ffn_dim, d},
                                       &layer.ffn_in_weight, &layer.ffn_in_bias));
    ATTN_RETURN_IF_ERROR(reader.Linear(at + names.ffn_out, {d, spec.ffn_dim},
                                       &layer.ffn_out_weight, &layer.ffn_out_bias));
    ATTN_RETURN_IF_ERROR(reader.Norm(at + names.output_norm, &layer.output_norm_scale,
                                     &layer.output_norm_shift));
    weights->layers.push_back(std::move(layer));
  }
  return absl::OkStatus();
}

// The fused layout (ModernBERT, NomicBERT, GTE): a norm after the embeddings; blocks of
// Q, K and V fused ([3d, d]: Q's heads, then K's, then V's), a gated feed-forward; the
// final norm where the row names one (ModernBERT, pre-LN). ModernBERT's first block
// reads the normed embeddings without an attention norm.
absl::Status LoadFusedQkvBlocks(const EncoderSpec& spec, CheckpointReader& reader,
                                EncoderWeights* weights) {
  const TensorNames& names = reader.names();
  const int64_t d = spec.d_model;
  ATTN_RETURN_IF_ERROR(reader.Norm(names.embedding_norm, &weights->embedding_norm_scale,
                                   &weights->embedding_norm_shift));
  for (int64_t n = 0; n < spec.num_layers; ++n) {
    const std::string at = absl::StrCat(names.layer, n, ".");
    EncoderLayerWeights layer;
    if (n > 0 || !reader.row().first_block_without_attention_norm) {
      ATTN_RETURN_IF_ERROR(reader.Norm(at + names.attention_norm,
                                       &layer.attention_norm_scale,
                                       &layer.attention_norm_shift));
    }
    ATTN_RETURN_IF_ERROR(reader.Linear(at + names.qkv, {3 * d, d},
                                       &layer.attention.in_proj_weight,
                                       &layer.attention.in_proj_bias));
    ATTN_RETURN_IF_ERROR(reader.Linear(at + names.attention_out, {d, d},
                                       &layer.attention.out_proj_weight,
                                       &layer.attention.out_proj_bias));
    ATTN_RETURN_IF_ERROR(ReadGatedFeedForward(reader, at, spec, &layer));
    weights->layers.push_back(std::move(layer));
  }
  return ReadFinalNorm(reader, weights);
}

// The decoder layout (Qwen2, Qwen3): pre-norm blocks of Q, K and V apart (grouped-query
// widths) fused in AttentionWeights' layout, Qwen3's per-head Q and K norms, a gated
// feed-forward; a final norm.
absl::Status LoadDecoderBlocks(const EncoderSpec& spec, CheckpointReader& reader,
                               EncoderWeights* weights) {
  const TensorNames& names = reader.names();
  const int64_t d = spec.d_model;
  const ModelSpec attention = spec.AttentionSpec(0);
  for (int64_t n = 0; n < spec.num_layers; ++n) {
    const std::string at = absl::StrCat(names.layer, n, ".");
    EncoderLayerWeights layer;
    ATTN_RETURN_IF_ERROR(reader.Norm(at + names.attention_norm,
                                     &layer.attention_norm_scale,
                                     &layer.attention_norm_shift));
    AttentionWeights& fused = layer.attention;
    for (const auto& [name, rows] :
         {std::pair<const char*, int64_t>{names.query, attention.q_width()},
          {names.key, attention.kv_width()},
          {names.value, attention.kv_width()}}) {
      std::vector<float> weight, bias;
      ATTN_RETURN_IF_ERROR(reader.Linear(at + name, {rows, d}, &weight, &bias));
      Append(weight, &fused.in_proj_weight);
      Append(bias, &fused.in_proj_bias);
    }
    if (spec.qk_norm) {
      ATTN_ASSIGN_OR_RETURN(fused.query_norm_weight,
                            reader.Read(absl::StrCat(at, names.query_norm, "weight"),
                                        {attention.head_dim()}));
      ATTN_ASSIGN_OR_RETURN(fused.key_norm_weight,
                            reader.Read(absl::StrCat(at, names.key_norm, "weight"),
                                        {attention.head_dim()}));
    }
    ATTN_RETURN_IF_ERROR(reader.Linear(at + names.attention_out, {d, attention.q_width()},
                                       &fused.out_proj_weight, &fused.out_proj_bias));
    ATTN_RETURN_IF_ERROR(ReadGatedFeedForward(reader, at, spec, &layer));
    weights->layers.push_back(std::move(layer));
  }
  return ReadFinalNorm(reader, weights);
}

// The embeddings: the word table (f32, or bf16 for a bf16 or int8 spec: half the memory
// of the biggest tensor of a small multilingual model), the learned position table
// without its first position_offset rows (RoBERTa's padding index and those before it
// are never read), and the token types (a zero one where the family has none).
absl::Status LoadEmbeddings(const EncoderSpec& spec, CheckpointReader& reader,
                            EncoderWeights* weights) {
  const TensorNames& names = reader.names();
  const int64_t d = spec.d_model;
  const std::string table = absl::StrCat(names.word_embeddings, "weight");
  if (spec.precision == Precision::kFp32) {
    ATTN_ASSIGN_OR_RETURN(std::vector<float> word_embeddings,
                          reader.Read(table, {spec.vocab_size, d}));
    weights->word_embeddings =
        std::make_shared<const std::vector<float>>(std::move(word_embeddings));
  } else {
    ATTN_ASSIGN_OR_RETURN(const std::string full, reader.Locate(table));
    ATTN_ASSIGN_OR_RETURN(std::vector<uint16_t> word_embeddings,
                          reader.file().ReadBfloat16(full, {spec.vocab_size, d}));
    weights->word_embeddings_bf16 =
        std::make_shared<const std::vector<uint16_t>>(std::move(word_embeddings));
  }
  if (spec.absolute_positions) {
    ATTN_ASSIGN_OR_RETURN(weights->position_embeddings,
                          reader.Read(absl::StrCat(names.position_embeddings, "weight"),
                                      {spec.position_offset + spec.max_positions, d}));
    weights->position_embeddings.erase(
        weights->position_embeddings.begin(),
        weights->position_embeddings.begin() + spec.position_offset * d);
  }
  const std::string types = absl::StrCat(names.token_types, "weight");
  const EncoderFamily::TokenTypes kind = reader.row().token_types;
  if (kind == EncoderFamily::TokenTypes::kNone ||
      (kind == EncoderFamily::TokenTypes::kOptional && spec.type_vocab_size == 1 &&
       !reader.Has(types))) {
    // One type of zeros (type_vocab_size is 1: EncoderSpec::Validate).
    weights->token_type_embeddings.assign(static_cast<size_t>(d), 0.0f);
    return absl::OkStatus();
  }
  ATTN_ASSIGN_OR_RETURN(weights->token_type_embeddings,
                        reader.Read(types, {spec.type_vocab_size, d}));
  return absl::OkStatus();
}

// The classification head the row names: BERT's pooler (under the prefix) and
// classifier, or RoBERTa's classifier.dense and classifier.out_proj (outside it).
absl::Status LoadClassifier(const EncoderSpec& spec, CheckpointReader& reader,
                            EncoderWeights* weights) {
  const ClassifierHead& head = reader.row().classifier;
  const int64_t d = spec.d_model;
  const bool outside = !head.pooler;
  const std::string dense = head.pooler ? reader.names().pooler : head.dense;
  ATTN_ASSIGN_OR_RETURN(weights->pooler_weight,
                        reader.Read(dense + "weight", {d, d}, outside));
  ATTN_ASSIGN_OR_RETURN(weights->pooler_bias, reader.Read(dense + "bias", {d}, outside));
  ATTN_ASSIGN_OR_RETURN(
      weights->classifier_weight,
      reader.Read(absl::StrCat(head.classifier, "weight"), {spec.num_labels, d}, true));
  ATTN_ASSIGN_OR_RETURN(
      weights->classifier_bias,
      reader.Read(absl::StrCat(head.classifier, "bias"), {spec.num_labels}, true));
  return absl::OkStatus();
}

// The SPLADE head of a masked-LM checkpoint, outside the prefix, by the row's names
// (LoadBertWeights's comment names BERT's and DistilBERT's).
absl::Status LoadSpladeHead(const EncoderSpec& spec, CheckpointReader& reader,
                            EncoderWeights* weights) {
  const MaskedLmHead& head = reader.row().masked_lm;
  const SafetensorsFile& file = reader.file();
  const int64_t d = spec.d_model;
  const std::string transform = head.transform, norm = head.norm, decoder = head.decoder;
  ATTN_ASSIGN_OR_RETURN(weights->mlm_transform_weight,
                        reader.Read(transform + "weight", {d, d}, true));
  ATTN_ASSIGN_OR_RETURN(weights->mlm_transform_bias,
                        reader.Read(transform + "bias", {d}, true));
  ATTN_ASSIGN_OR_RETURN(weights->mlm_norm_scale, reader.Read(norm + "weight", {d}, true));
  ATTN_ASSIGN_OR_RETURN(weights->mlm_norm_shift, reader.Read(norm + "bias", {d}, true));
  // BERT keeps the decoder's bias as cls.predictions.bias; some conversions store it
  // (the same tensor) as the decoder's too.
  const bool elsewhere = *head.decoder_bias != '\0';
  const std::string bias = elsewhere && file.Find(head.decoder_bias) != nullptr
                               ? head.decoder_bias
                               : decoder + "bias";
  ATTN_ASSIGN_OR_RETURN(weights->mlm_decoder_bias,
                        reader.Read(bias, {spec.vocab_size}, true));
  if (elsewhere && file.Find(decoder + "bias") != nullptr && bias != decoder + "bias") {
    ATTN_ASSIGN_OR_RETURN(const std::vector<float> copy,
                          reader.Read(decoder + "bias", {spec.vocab_size}, true));
    if (copy != weights->mlm_decoder_bias) {
      return Invalid(absl::StrCat(head.decoder_bias, " and ", decoder,
                                  "bias must be the same tensor (the decoder's bias)"));
    }
  }
  if (file.Find(decoder + "weight") != nullptr) {
    ATTN_ASSIGN_OR_RETURN(std::vector<float> own,
                          reader.Read(decoder + "weight", {spec.vocab_size, d}, true));
    weights->mlm_decoder = std::make_shared<const std::vector<float>>(std::move(own));
  } else if (weights->word_embeddings != nullptr) {
    weights->mlm_decoder = weights->word_embeddings;  // tied
  } else {
    // Tied, but the table is kept in bf16: the decoder reads an f32 copy.
    ATTN_ASSIGN_OR_RETURN(
        std::vector<float> copy,
        file.ReadFloat32(
            absl::StrCat(reader.prefix(), reader.names().word_embeddings, "weight"),
            {spec.vocab_size, d}));
    weights->mlm_decoder = std::make_shared<const std::vector<float>>(std::move(copy));
  }
  return absl::OkStatus();
}

// What the row cannot load, refused before any tensor is read.
absl::Status CheckServedByRow(const EncoderSpec& spec, const EncoderFamily& row) {
  if (spec.num_labels > 0 && !row.has_classifier()) {
    return Invalid(absl::StrCat(
        "a ", row.name, " classification head is not served (served: ",
        FamilyNames([](const EncoderFamily& f) { return f.has_classifier(); }), ")"));
  }
  if (row.layout != BlockLayout::kBert && !spec.checkpoint_pruned_heads.empty()) {
    return Invalid(absl::StrCat("checkpoint_pruned_heads: a ", row.name,
                                " checkpoint with heads removed is not served"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string EncoderPrefix(const SafetensorsFile& file, const EncoderSpec& spec) {
  const EncoderFamily& row = FamilyOf(spec.family);
  const std::string table =
      absl::StrCat(row.NamesFor(spec.norm_placement).word_embeddings, "weight");
  if (file.Find(table) == nullptr &&
      file.Find(absl::StrCat(row.task_prefix, table)) != nullptr) {
    return row.task_prefix;
  }
  return "";
}

absl::StatusOr<EncoderWeights> LoadBertWeights(const SafetensorsFile& file,
                                               const EncoderSpec& spec,
                                               absl::string_view prefix) {
  ATTN_RETURN_IF_ERROR(spec.Validate());
  CheckpointReader reader(file, spec, prefix);
  const EncoderFamily& row = reader.row();
  ATTN_RETURN_IF_ERROR(CheckServedByRow(spec, row));
  EncoderWeights weights;
  ATTN_RETURN_IF_ERROR(LoadEmbeddings(spec, reader, &weights));
  switch (row.layout) {
    case BlockLayout::kBert:
      ATTN_RETURN_IF_ERROR(LoadBertBlocks(spec, reader, &weights));
      break;
    case BlockLayout::kFusedQkv:
      ATTN_RETURN_IF_ERROR(LoadFusedQkvBlocks(spec, reader, &weights));
      break;
    case BlockLayout::kDecoder:
      ATTN_RETURN_IF_ERROR(LoadDecoderBlocks(spec, reader, &weights));
      break;
  }
  if (spec.relative_attention_buckets > 0) {
    ATTN_ASSIGN_OR_RETURN(
        weights.relative_attention_bias,
        reader.Read(absl::StrCat(reader.names().relative_attention_bias, "weight"),
                    {spec.relative_attention_buckets, spec.num_heads}));
  }
  if (spec.num_labels > 0) ATTN_RETURN_IF_ERROR(LoadClassifier(spec, reader, &weights));
  if (spec.sparse != EncoderSpec::Sparse::kNone) {
    ATTN_RETURN_IF_ERROR(LoadSpladeHead(spec, reader, &weights));
  }
  // Every other tensor under the prefix is an error naming it: a checkpoint of another
  // architecture (or with more layers) must not load as if it were this one.
  const TensorNames& names = reader.names();
  const bool pooler_unused = spec.num_labels == 0 || !row.classifier.pooler;
  for (const std::string& name : file.Names()) {
    if (!absl::StartsWith(name, prefix)) continue;
    const std::vector<std::string>& used = reader.used();
    if (std::find(used.begin(), used.end(), name) != used.end()) continue;
    const absl::string_view local = absl::string_view(name).substr(prefix.size());
    absl::string_view pooler_part = local;
    if (local == names.position_ids ||
        (pooler_unused && absl::ConsumePrefix(&pooler_part, names.pooler) &&
         (pooler_part == "weight" || pooler_part == "bias"))) {
      continue;
    }
    return Invalid(absl::StrCat("unexpected tensor ", name, ": not part of a ", row.name,
                                " encoder of ", spec.num_layers,
                                " layers (set a prefix to load the encoder alone)"));
  }
  return weights;
}

// One nn.Linear's weights, reordered once into the layout the matmul implementation
// runs fastest from (format_tag::any). The layout may depend on the row count on some
// CPUs; each layout asked for is made once, from the first, and kept.
// An int8 model packs the quantized weights (quantization.h), and keeps their scales.
struct PackedLinear {
  int64_t in = 0, out = 0;
  std::vector<std::pair<memory::desc, memory>> layouts;
  std::vector<float> bias;
  QuantizedMatrix quantized;  // int8: the scales and sums (values dropped once packed)
  // Computes in f32 whatever the model's precision (a head's product).
  bool f32 = false;
};

struct TransformerEncoder::State {
  explicit State(dnnl::engine cpu) : engine(std::move(cpu)), stream(engine) {}

  dnnl::engine engine;
  dnnl::stream stream;
  // The feed-forward products take bf16 sources and weights (f32 accumulation).
  bool bf16 = false;
  // The feed-forward products are int8 (quantization.h); everything else is f32.
  bool int8 = false;
  Int8Levels int8_levels;
  // The weights the blocks read as vectors (embeddings, layer norms); the attention
  // and feed-forward weights live packed in `attention` and `ffn_in`/`ffn_out`.
  EncoderWeights weights;
  std::vector<std::unique_ptr<MultiHeadAttention>> attention;  // per layer
  // MPNet: every head's bias by offset, [num_heads, 2 kMpnetBucketRadius + 1] (see
  // RelativeBias); empty for the other families.
  std::vector<float> relative_bias;
  // Per layer. A gated feed-forward's first product in two: ffn_in the gate (activated
  // by the product's post-op), ffn_up the input it multiplies; each writes a dense
  // plane, which the elementwise kernels run fast on (strided halves of one product
  // fell to oneDNN's reference kernels: 3.7 s of a 9.8 s pass at 8,192 tokens).
  std::vector<PackedLinear> ffn_in, ffn_up, ffn_out;
  // A SPLADE head's transform and decoder, in f32.
  PackedLinear mlm_transform, mlm_decoder;
  // Primitives by shape (the row count changes with every batch), bounded.
  PrimitiveCache cache{256};
  // Scratch, grown to the largest batch seen. `inner` holds the feed-forward's inner
  // activations in the compute type; `narrow` x in the compute type (bf16 only).
  ScratchBuffer x, attended, normed, inner, narrow;
  // int8: a product's source codes with their per-row parameters, and its int32 sums.
  ScratchBuffer codes, code_parameters, sums;
  // A SPLADE head's rows (transformed and normed) and logits, for kSpladeRows tokens.
  ScratchBuffer mlm_rows, mlm_logits;
  // A gated feed-forward's activated gate and its input, [2, tokens, ffn_dim] f32.
  ScratchBuffer gate_wide;

  memory::data_type Compute() const {
    return bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  }
  size_t ComputeBytes() const { return bf16 ? 2 : 4; }

  // The matmul for [rows, in] x W^T (+ b, + act, + dst before when accumulate). The
  // source and weights are in the compute type; the destination is f32, or the compute
  // type with `narrow_out` (the first feed-forward product, read only by the second).
  // With `f32`, every operand is f32 whatever the compute type.
  absl::StatusOr<CachedPrimitive*> LinearPrimitive(int64_t rows, int64_t in, int64_t out,
                                                   const dnnl::algorithm* activation,
                                                   bool accumulate, bool narrow_out,
                                                   bool f32 = false) {
    const int64_t act = activation == nullptr ? -1 : static_cast<int64_t>(*activation);
    const bool wide = f32 || !bf16;
    const int64_t flags = (accumulate ? 1 : 0) | (narrow_out ? 2 : 0) | (wide ? 0 : 4);
    const memory::data_type type = wide ? memory::data_type::f32 : Compute();
    return cache.GetOrCreate(
        PrimitiveKey{PrimitiveKind::kLinear, {rows, in, out, act, flags}},
        [&]() -> absl::StatusOr<CachedPrimitive> {
          dnnl::post_ops ops;
          if (accumulate) ops.append_sum(1.0f);
          if (activation != nullptr) {
            ops.append_eltwise(1.0f, *activation, EltwiseAlpha(*activation), 0.0f);
          }
          dnnl::primitive_attr attr;
          attr.set_post_ops(ops);
          const dnnl::matmul::primitive_desc pd(
              dnnl::matmul::desc(
                  Plain(rows, in, type),
                  memory::desc({in, out}, type, memory::format_tag::any), Plain(1, out),
                  Plain(rows, out, narrow_out ? type : memory::data_type::f32)),
              attr, engine);
          CachedPrimitive created;
          created.primitive = dnnl::matmul(pd);
          created.weights_desc = pd.weights_desc();
          return created;
        });
  }

  // [rows, in] u8 x packed [in, out] s8 -> [rows, out] s32.
  absl::StatusOr<CachedPrimitive*> Int8Primitive(int64_t rows, int64_t in, int64_t out) {
    return cache.GetOrCreate(
        PrimitiveKey{PrimitiveKind::kInt8Projection, {rows, in, out, 0, 0}},
        [&]() -> absl::StatusOr<CachedPrimitive> {
          const dnnl::matmul::primitive_desc pd(
              dnnl::matmul::desc(
                  Plain(rows, in, memory::data_type::u8),
                  memory::desc({in, out}, memory::data_type::s8, memory::format_tag::any),
                  Plain(rows, out, memory::data_type::s32)),
              engine);
          CachedPrimitive created;
          created.primitive = dnnl::matmul(pd);
          created.weights_desc = pd.weights_desc();
          return created;
        });
  }

  // An activation applied in place to [rows, width] f32.
  absl::StatusOr<CachedPrimitive*> ActivationPrimitive(int64_t rows, int64_t width,
                                                       dnnl::algorithm activation) {
    return cache.GetOrCreate(
        PrimitiveKey{PrimitiveKind::kActivation,
                     {rows, width, static_cast<int64_t>(activation), 0, 0}},
        [&]() -> absl::StatusOr<CachedPrimitive> {
          CachedPrimitive created;
          created.primitive = dnnl::eltwise_forward(dnnl::eltwise_forward::primitive_desc(
              dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, activation,
                                          Plain(rows, width), EltwiseAlpha(activation),
                                          0.0f),
              engine));
          return created;
        });
  }

  // `linear`'s weights in `layout`, made from its first layout on first use.
  const memory& Layout(PackedLinear& linear, const memory::desc& layout) {
    for (const auto& [desc, packed] : linear.layouts) {
      if (desc == layout) return packed;
    }
    memory packed(layout, engine);
    dnnl::reorder(linear.layouts.front().second, packed)
        .execute(stream, linear.layouts.front().second, packed);
    linear.layouts.emplace_back(layout, packed);
    return linear.layouts.back().second;
  }

  // Packs nn.Linear weights [out, in] for the implementation's layout.
  // With `f32`, for products in f32 whatever the model's precision.
  absl::StatusOr<PackedLinear> Pack(int64_t in, int64_t out,
                                    const std::vector<float>& weight,
                                    const std::vector<float>& bias, bool f32 = false) {
    const bool int8_codes = int8 && !f32;
    ATTN_ASSIGN_OR_RETURN(CachedPrimitive * primitive,
                          int8_codes
                              ? Int8Primitive(1, in, out)
                              : LinearPrimitive(1, in, out, nullptr, false, false, f32));
    PackedLinear linear;
    linear.in = in;
    linear.out = out;
    linear.bias = bias;
    linear.f32 = f32;
    // int8 packs the codes (quantization.h); the others the f32 weights.
    const void* source_data = weight.data();
    if (int8_codes) {
      linear.quantized = QuantizeWeights(weight.data(), out, in, int8_levels.weight);
      source_data = linear.quantized.values.data();
    }
    const memory::desc plain({in, out},
                             int8_codes ? memory::data_type::s8 : memory::data_type::f32,
                             memory::dims{1, in});
    memory packed(primitive->weights_desc, engine);
    memory source(plain, engine, const_cast<void*>(source_data));
    dnnl::reorder(source, packed).execute(stream, source, packed);
    stream.wait();
    // Packed: only the codes' scales and sums are read from here on.
    linear.quantized.values = std::vector<int8_t>();
    linear.layouts.emplace_back(primitive->weights_desc, packed);
    return linear;
  }

  // dst[rows, out] = act(src[rows, in] W^T + b) (+ dst before, when accumulate). `src`
  // holds the compute type; `dst` f32, or the compute type with `narrow_out`.
  absl::Status LinearChunk(int64_t rows, PackedLinear& linear, const void* src,
                           const dnnl::algorithm* activation, bool accumulate,
                           bool narrow_out, void* dst) {
    ATTN_ASSIGN_OR_RETURN(CachedPrimitive * primitive,
                          LinearPrimitive(rows, linear.in, linear.out, activation,
                                          accumulate, narrow_out, linear.f32));
    const memory& weights = Layout(linear, primitive->weights_desc);
    const memory::desc bias_desc = Plain(1, linear.out);
    const memory::data_type in_type = linear.f32 ? memory::data_type::f32 : Compute();
    const memory::data_type out_type = narrow_out ? in_type : memory::data_type::f32;
    primitive->primitive.execute(
        stream, {{DNNL_ARG_SRC, memory(Plain(rows, linear.in, in_type), engine,
                                       const_cast<void*>(src))},
                 {DNNL_ARG_WEIGHTS, weights},
                 {DNNL_ARG_BIAS, Wrap(bias_desc, engine, linear.bias.data())},
                 {DNNL_ARG_DST, memory(Plain(rows, linear.out, out_type), engine, dst)}});
    return absl::OkStatus();
  }

  // LinearChunk for int8 models: `codes` are the chunk's source rows quantized.
  absl::Status Int8LinearChunk(int64_t rows, PackedLinear& linear, const uint8_t* codes,
                               const float* scales, const int32_t* zero_points,
                               const dnnl::algorithm* activation, bool accumulate,
                               float* dst) {
    ATTN_ASSIGN_OR_RETURN(CachedPrimitive * primitive,
                          Int8Primitive(rows, linear.in, linear.out));
    const memory& weights = Layout(linear, primitive->weights_desc);
    auto* acc = static_cast<int32_t*>(sums.Reserve(rows * linear.out * sizeof(int32_t)));
    primitive->primitive.execute(
        stream, {{DNNL_ARG_SRC, memory(Plain(rows, linear.in, memory::data_type::u8),
                                       engine, const_cast<uint8_t*>(codes))},
                 {DNNL_ARG_WEIGHTS, weights},
                 {DNNL_ARG_DST,
                  memory(Plain(rows, linear.out, memory::data_type::s32), engine, acc)}});
    Dequantize(acc, rows, linear.quantized, scales, zero_points, linear.bias.data(), dst,
               accumulate);
    if (activation != nullptr) {
      ATTN_ASSIGN_OR_RETURN(CachedPrimitive * act,
                            ActivationPrimitive(rows, linear.out, *activation));
      memory data = Wrap(Plain(rows, linear.out), engine, dst);
      act->primitive.execute(stream, {{DNNL_ARG_SRC, data}, {DNNL_ARG_DST, data}});
    }
    return absl::OkStatus();
  }

  // dst (the compute type) = src (f32), [rows, width]: a copy for bf16.
  absl::Status NarrowChunk(int64_t rows, int64_t width, const float* src, void* dst) {
    memory from = Wrap(Plain(rows, width), engine, src);
    memory to(Plain(rows, width, Compute()), engine, dst);
    ATTN_ASSIGN_OR_RETURN(
        CachedPrimitive * primitive,
        cache.GetOrCreate(PrimitiveKey{PrimitiveKind::kConvert, {rows, width, 1, 0, 0}},
                          [&]() -> absl::StatusOr<CachedPrimitive> {
                            CachedPrimitive created;
                            created.primitive = dnnl::reorder(from, to);
                            return created;
                          }));
    primitive->primitive.execute(stream, {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}});
    return absl::OkStatus();
  }

  // dst = LayerNorm(src) * scale + shift over each row of [rows, width].
  absl::Status LayerNormChunk(int64_t rows, int64_t width, float epsilon,
                              const float* src, const std::vector<float>& scale,
                              const std::vector<float>& shift, float* dst) {
    const memory::desc data = Plain(rows, width);
    ATTN_ASSIGN_OR_RETURN(
        CachedPrimitive * primitive,
        cache.GetOrCreate(PrimitiveKey{PrimitiveKind::kLayerNorm, {rows, width, 0, 0, 0}},
                          [&]() -> absl::StatusOr<CachedPrimitive> {
                            CachedPrimitive created;
                            created.primitive = dnnl::layer_normalization_forward(
                                dnnl::layer_normalization_forward::primitive_desc(
                                    dnnl::layer_normalization_forward::desc(
                                        dnnl::prop_kind::forward_inference, data, epsilon,
                                        dnnl::normalization_flags::use_scale |
                                            dnnl::normalization_flags::use_shift),
                                    engine));
                            return created;
                          }));
    const memory::desc vector({width}, memory::data_type::f32, memory::format_tag::a);
    primitive->primitive.execute(stream,
                                 {{DNNL_ARG_SRC, Wrap(data, engine, src)},
                                  {DNNL_ARG_DST, Wrap(data, engine, dst)},
                                  {DNNL_ARG_SCALE, Wrap(vector, engine, scale.data())},
                                  {DNNL_ARG_SHIFT, Wrap(vector, engine, shift.data())}});
    return absl::OkStatus();
  }

  // dst = a + b, elementwise over [rows, width] (the residual connection).
  absl::Status AddChunk(int64_t rows, int64_t width, const float* a, const float* b,
                        float* dst) {
    const memory::desc data = Plain(rows, width);
    ATTN_ASSIGN_OR_RETURN(
        CachedPrimitive * primitive,
        cache.GetOrCreate(
            PrimitiveKey{PrimitiveKind::kAdd, {rows, width, 0, 0, 0}},
            [&]() -> absl::StatusOr<CachedPrimitive> {
              CachedPrimitive created;
              created.primitive = dnnl::binary(dnnl::binary::primitive_desc(
                  dnnl::binary::desc(dnnl::algorithm::binary_add, data, data, data),
                  engine));
              return created;
            }));
    primitive->primitive.execute(stream, {{DNNL_ARG_SRC_0, Wrap(data, engine, a)},
                                          {DNNL_ARG_SRC_1, Wrap(data, engine, b)},
                                          {DNNL_ARG_DST, Wrap(data, engine, dst)}});
    return absl::OkStatus();
  }

  // A gated feed-forward's middle: dst [rows, width] (the compute type) = gate * up,
  // both dense [rows, width] f32 (the gate already activated).
  absl::Status GateChunk(int64_t rows, int64_t width, const float* gate, const float* up,
                         void* dst) {
    const memory::desc data = Plain(rows, width);
    const memory::desc out = Plain(rows, width, Compute());
    ATTN_ASSIGN_OR_RETURN(
        CachedPrimitive * product,
        cache.GetOrCreate(
            PrimitiveKey{PrimitiveKind::kGateProduct, {rows, width, bf16 ? 1 : 0, 0, 0}},
            [&]() -> absl::StatusOr<CachedPrimitive> {
              CachedPrimitive created;
              created.primitive = dnnl::binary(dnnl::binary::primitive_desc(
                  dnnl::binary::desc(dnnl::algorithm::binary_mul, data, data, out),
                  engine));
              return created;
            }));
    product->primitive.execute(stream, {{DNNL_ARG_SRC_0, Wrap(data, engine, gate)},
                                        {DNNL_ARG_SRC_1, Wrap(data, engine, up)},
                                        {DNNL_ARG_DST, memory(out, engine, dst)}});
    return absl::OkStatus();
  }

  // The operations over all rows, in chunks of a few row counts (row_chunks.h): the
  // same results, and a bounded number of primitives however the batches vary.

  absl::Status Linear(int64_t rows, PackedLinear& linear, const void* src,
                      const dnnl::algorithm* activation, bool accumulate, bool narrow_out,
                      void* dst) {
    if (int8 && !linear.f32) {
      // The source quantized once, row by row; then the products chunk by chunk.
      auto* code_data = static_cast<uint8_t*>(codes.Reserve(rows * linear.in));
      auto* scales =
          static_cast<float*>(code_parameters.Reserve(rows * 2 * sizeof(float)));
      auto* zero_points = reinterpret_cast<int32_t*>(scales + rows);
      QuantizeRows(static_cast<const float*>(src), rows, linear.in,
                   int8_levels.activation, code_data, scales, zero_points);
      return ForEachRowChunk(rows, [&](int64_t first, int64_t chunk) {
        return Int8LinearChunk(chunk, linear, code_data + first * linear.in,
                               scales + first, zero_points + first, activation,
                               accumulate, static_cast<float*>(dst) + first * linear.out);
      });
    }
    const size_t in_bytes = linear.f32 ? sizeof(float) : ComputeBytes();
    const size_t out_bytes = narrow_out ? in_bytes : sizeof(float);
    return ForEachRowChunk(rows, [&](int64_t first, int64_t chunk) {
      return LinearChunk(chunk, linear,
                         static_cast<const uint8_t*>(src) + first * linear.in * in_bytes,
                         activation, accumulate, narrow_out,
                         static_cast<uint8_t*>(dst) + first * linear.out * out_bytes);
    });
  }

  absl::Status Narrow(int64_t rows, int64_t width, const float* src, void* dst) {
    return ForEachRowChunk(rows, [&](int64_t first, int64_t chunk) {
      return NarrowChunk(chunk, width, src + first * width,
                         static_cast<uint8_t*>(dst) + first * width * ComputeBytes());
    });
  }

  absl::Status LayerNorm(int64_t rows, int64_t width, float epsilon, const float* src,
                         const std::vector<float>& scale, const std::vector<float>& shift,
                         float* dst) {
    return ForEachRowChunk(rows, [&](int64_t first, int64_t chunk) {
      return LayerNormChunk(chunk, width, epsilon, src + first * width, scale, shift,
                            dst + first * width);
    });
  }

  absl::Status Gate(int64_t rows, int64_t width, const float* gate, const float* up,
                    void* dst) {
    return ForEachRowChunk(rows, [&](int64_t first, int64_t chunk) {
      return GateChunk(chunk, width, gate + first * width, up + first * width,
                       static_cast<uint8_t*>(dst) + first * width * ComputeBytes());
    });
  }

  absl::Status Add(int64_t rows, int64_t width, const float* a, const float* b,
                   float* dst) {
    return ForEachRowChunk(rows, [&](int64_t first, int64_t chunk) {
      const int64_t offset = first * width;
      return AddChunk(chunk, width, a + offset, b + offset, dst + offset);
    });
  }
};

TransformerEncoder::TransformerEncoder(const EncoderSpec& spec, const Options& options)
    : spec_(spec), options_(options) {}

TransformerEncoder::~TransformerEncoder() = default;

absl::StatusOr<std::unique_ptr<TransformerEncoder>> TransformerEncoder::Create(
    const EncoderSpec& spec, EncoderWeights weights, const Options& options) {
  ATTN_RETURN_IF_ERROR(spec.Validate());
  ATTN_RETURN_IF_ERROR(weights.CheckShapes(spec));
  if (options.intra_op_threads < 0 || options.intra_op_threads > kMaxThreads) {
    return Invalid(absl::StrCat("intra_op_threads must be in [0, ", kMaxThreads,
                                "], got ", options.intra_op_threads));
  }
  ATTN_ASSIGN_OR_RETURN(dnnl::engine engine, CreateCpuEngine());
  std::unique_ptr<TransformerEncoder> encoder(new TransformerEncoder(spec, options));
  try {
    encoder->state_ = std::make_unique<State>(engine);
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN failed to create a stream: ", e.what()));
  }
  MultiHeadAttention::Options attention_options;
  attention_options.intra_op_threads = options.intra_op_threads;
  using Bf16Compute = TransformerEncoder::Options::Bf16Compute;
  attention_options.bf16_compute =
      options.bf16_compute == Bf16Compute::kNative
          ? MultiHeadAttention::Options::Bf16Compute::kNative
      : options.bf16_compute == Bf16Compute::kFloat32
          ? MultiHeadAttention::Options::Bf16Compute::kFloat32
          : MultiHeadAttention::Options::Bf16Compute::kAuto;
  const bool bf16_model = spec.precision == Precision::kBf16;
  if (bf16_model && options.bf16_compute == Bf16Compute::kNative &&
      !MultiHeadAttention::SupportsBf16()) {
    return absl::FailedPreconditionError(
        "bf16_compute kNative: this CPU has no native bf16 (AVX512_BF16 or AMX)");
  }
  encoder->state_->bf16 = bf16_model && options.bf16_compute != Bf16Compute::kFloat32 &&
                          MultiHeadAttention::SupportsBf16();
  encoder->state_->int8 = spec.precision == Precision::kInt8;
  encoder->state_->int8_levels = Int8LevelsForCpu();
  if (bf16_model) {
    // The feed-forward weights take their bf16 values on every path, so that a bf16
    // model computes the same function whether or not the CPU multiplies in bf16.
    for (EncoderLayerWeights& layer : weights.layers) {
      for (std::vector<float>* tensor : {&layer.ffn_in_weight, &layer.ffn_out_weight}) {
        for (float& value : *tensor) value = Bf16ToFloat(FloatToBf16(value));
      }
    }
  }
  for (int64_t n = 0; n < spec.num_layers; ++n) {
    const EncoderLayerWeights& layer = weights.layers[static_cast<size_t>(n)];
    ATTN_ASSIGN_OR_RETURN(
        std::unique_ptr<MultiHeadAttention> attention,
        MultiHeadAttention::Create(spec.AttentionSpec(n), layer.attention, engine,
                                   attention_options));
    // The layers run one after another on one thread: one set of batch-sized
    // attention buffers serves them all.
    if (!encoder->state_->attention.empty()) {
      attention->ShareScratch(*encoder->state_->attention.front());
    }
    encoder->state_->attention.push_back(std::move(attention));
  }
  State& state = *encoder->state_;
  if (spec.relative_attention_buckets > 0) {
    const int64_t width = 2 * kMpnetBucketRadius + 1;
    state.relative_bias.resize(static_cast<size_t>(spec.num_heads * width));
    for (int64_t h = 0; h < spec.num_heads; ++h) {
      for (int64_t offset = -kMpnetBucketRadius; offset <= kMpnetBucketRadius; ++offset) {
        state.relative_bias[h * width + offset + kMpnetBucketRadius] =
            weights.relative_attention_bias[MpnetRelativeBucket(offset) * spec.num_heads +
                                            h];
      }
    }
  }
  try {
    for (const EncoderLayerWeights& layer : weights.layers) {
      // Gated: rows [0, ffn_dim) of the first product are the gate, the rest its input.
      const auto rows = static_cast<std::ptrdiff_t>(spec.ffn_dim);
      const auto half = [&](const std::vector<float>& fused, int64_t part,
                            int64_t width) {
        return std::vector<float>(fused.begin() + part * rows * width,
                                  fused.begin() + (part + 1) * rows * width);
      };
      ATTN_ASSIGN_OR_RETURN(
          PackedLinear in,
          state.Pack(spec.d_model, spec.ffn_dim,
                     spec.gated_ffn ? half(layer.ffn_in_weight, 0, spec.d_model)
                                    : layer.ffn_in_weight,
                     spec.gated_ffn ? half(layer.ffn_in_bias, 0, 1) : layer.ffn_in_bias));
      state.ffn_in.push_back(std::move(in));
      if (spec.gated_ffn) {
        ATTN_ASSIGN_OR_RETURN(PackedLinear up,
                              state.Pack(spec.d_model, spec.ffn_dim,
                                         half(layer.ffn_in_weight, 1, spec.d_model),
                                         half(layer.ffn_in_bias, 1, 1)));
        state.ffn_up.push_back(std::move(up));
      }
      ATTN_ASSIGN_OR_RETURN(PackedLinear out,
                            state.Pack(spec.ffn_dim, spec.d_model, layer.ffn_out_weight,
                                       layer.ffn_out_bias));
      state.ffn_out.push_back(std::move(out));
    }
    if (spec.sparse != EncoderSpec::Sparse::kNone) {
      ATTN_ASSIGN_OR_RETURN(
          state.mlm_transform,
          state.Pack(spec.d_model, spec.d_model, weights.mlm_transform_weight,
                     weights.mlm_transform_bias, /*f32=*/true));
      ATTN_ASSIGN_OR_RETURN(state.mlm_decoder,
                            state.Pack(spec.d_model, spec.vocab_size,
                                       *weights.mlm_decoder, weights.mlm_decoder_bias,
                                       /*f32=*/true));
    }
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN failed to pack the feed-forward weights: ", e.what()));
  }
  // Packed above (a tied decoder's table stays, as word_embeddings, for the lookup).
  weights.mlm_transform_weight = std::vector<float>();
  weights.mlm_decoder = nullptr;
  state.weights = std::move(weights);
  // Each MultiHeadAttention holds its own (prepacked) copy of its layer's attention
  // weights, and the feed-forward weights are packed above: a second copy here would
  // only take memory.
  for (EncoderLayerWeights& layer : state.weights.layers) {
    layer.attention = AttentionWeights();
    layer.ffn_in_weight = std::vector<float>();
    layer.ffn_out_weight = std::vector<float>();
  }
  return encoder;
}

absl::Status TransformerEncoder::SpladeHead(const float* last,
                                            absl::Span<const int64_t> lengths,
                                            absl::Span<float> weights) {
  State& state = *state_;
  const int64_t d = spec_.d_model;
  const int64_t vocab = spec_.vocab_size;
  const bool sum = spec_.sparse == EncoderSpec::Sparse::kSum;
  const auto activate = [&](float x) {
    const float once = std::log1p(std::max(x, 0.0f));
    return spec_.sparse_log_twice ? std::log1p(once) : once;
  };
  int64_t total = 0;
  for (const int64_t length : lengths) total += length;
  // The logits of a few tokens at a time: [kSpladeRows, vocab] floats at most, however
  // long the batch.
  constexpr int64_t kSpladeRows = 128;
  auto* transformed = static_cast<float*>(
      state.mlm_rows.Reserve(static_cast<size_t>(2 * kSpladeRows * d) * sizeof(float)));
  float* normed = transformed + kSpladeRows * d;
  auto* logits = static_cast<float*>(
      state.mlm_logits.Reserve(static_cast<size_t>(kSpladeRows * vocab) * sizeof(float)));
  const dnnl::algorithm activation = ActivationAlgorithm(spec_.activation);
  // Max: the largest logit per entry, from 0 (relu), made log(1 + x) at the end (the
  // activation rises monotonically, so it commutes with the maximum). Sum: each
  // token's activated logits added up.
  std::fill(weights.begin(), weights.end(), 0.0f);
  int64_t sequence = 0;
  int64_t sequence_end = lengths[0];
  try {
    for (int64_t first = 0; first < total;) {
      const int64_t rows = NextRowChunk(std::min(total - first, kSpladeRows));
      ATTN_RETURN_IF_ERROR(state.Linear(rows, state.mlm_transform, last + first * d,
                                        &activation, false, false, transformed));
      ATTN_RETURN_IF_ERROR(state.LayerNorm(rows, d, spec_.layer_norm_eps, transformed,
                                           state.weights.mlm_norm_scale,
                                           state.weights.mlm_norm_shift, normed));
      ATTN_RETURN_IF_ERROR(
          state.Linear(rows, state.mlm_decoder, normed, nullptr, false, false, logits));
      state.stream.wait();
      for (int64_t r = 0; r < rows; ++r) {
        while (first + r >= sequence_end) sequence_end += lengths[++sequence];
        float* out = &weights[sequence * vocab];
        const float* row = &logits[r * vocab];
        if (sum) {
          for (int64_t j = 0; j < vocab; ++j) {
            if (row[j] > 0.0f) out[j] += activate(row[j]);
          }
        } else {
          for (int64_t j = 0; j < vocab; ++j) out[j] = std::max(out[j], row[j]);
        }
      }
      first += rows;
    }
  } catch (const dnnl::error& e) {
    return absl::InternalError(
        absl::StrCat("oneDNN failed in the SPLADE head: ", e.what()));
  }
  if (!sum) {
    for (float& value : weights) {
      if (value > 0.0f) value = activate(value);
    }
  }
  return absl::OkStatus();
}

std::string TransformerEncoder::ComputePath() const {
  return state_->attention.front()->ComputePath();
}

absl::Status TransformerEncoder::Forward(const EncoderBatch& batch,
                                         absl::Span<float> pooled,
                                         absl::Span<float> hidden,
                                         absl::Span<EncoderHeadStatistic> statistics,
                                         absl::Span<float> attention) {
  ATTN_RETURN_IF_ERROR(
      CheckEncoderForward(spec_, batch, pooled, hidden, statistics, attention));
  const int64_t d = spec_.d_model;
  const int64_t heads = spec_.num_heads;
  const int64_t sequences = static_cast<int64_t>(batch.lengths.size());
  int64_t tokens = 0;
  for (const int64_t length : batch.lengths) tokens += length;
  const bool from_hidden = !batch.hidden_states.empty();
  const int64_t width = spec_.pooled_width();
  const int64_t first_plane = heads * batch.lengths[0] * batch.lengths[0];
  std::fill(statistics.begin(), statistics.end(), EncoderHeadStatistic());
  if (options_.intra_op_threads > 0) omp_set_num_threads(options_.intra_op_threads);

  State& state = *state_;
  const EncoderWeights& weights = state.weights;
  const bool pre = spec_.norm_placement == EncoderSpec::NormPlacement::kPre;
  const float eps = spec_.layer_norm_eps;
  const size_t plane = static_cast<size_t>(tokens * d) * sizeof(float);
  auto* x = static_cast<float*>(state.x.Reserve(plane));
  auto* attended = static_cast<float*>(state.attended.Reserve(plane));
  // Pre-LN: the normed copy of x each sublayer reads (x itself carries the residual).
  auto* normed = pre ? static_cast<float*>(state.normed.Reserve(plane)) : nullptr;
  void* inner = state.inner.Reserve(static_cast<size_t>(tokens * spec_.ffn_dim) *
                                    state.ComputeBytes());
  void* narrow =
      state.bf16
          ? state.narrow.Reserve(static_cast<size_t>(tokens * d) * state.ComputeBytes())
          : nullptr;
  // Embeddings: word + position (within its sequence; none for rotary positions) +
  // token type; post-LN (and ModernBERT) normalizes them on the way into x, pre-LN takes
  // them as they are.
  const bool embedding_norm = spec_.embedding_norm();
  if (!from_hidden) {
    float* sum = embedding_norm ? attended : x;
    const std::vector<float> no_position(
        spec_.absolute_positions ? 0 : static_cast<size_t>(d), 0.0f);
    int64_t t = 0;
    for (const int64_t length : batch.lengths) {
      for (int64_t position = 0; position < length; ++position, ++t) {
        const int64_t type = batch.token_types.empty() ? 0 : batch.token_types[t];
        const float* where = spec_.absolute_positions
                                 ? &weights.position_embeddings[position * d]
                                 : no_position.data();
        const float* kind = &weights.token_type_embeddings[type * d];
        if (weights.word_embeddings != nullptr) {
          const float* word = &(*weights.word_embeddings)[batch.token_ids[t] * d];
          for (int64_t c = 0; c < d; ++c) sum[t * d + c] = word[c] + where[c] + kind[c];
        } else {
          const uint16_t* word = &(*weights.word_embeddings_bf16)[batch.token_ids[t] * d];
          for (int64_t c = 0; c < d; ++c) {
            sum[t * d + c] = Bf16ToFloat(word[c]) + where[c] + kind[c];
          }
        }
      }
    }
  }
  const dnnl::algorithm activation = ActivationAlgorithm(spec_.activation);
  // The feed-forward network over `from` (f32), added into `into` by the second
  // product's sum post-op, so that the residual costs no pass of its own.
  const auto feed_forward = [&](int64_t n, const float* from,
                                float* into) -> absl::Status {
    const void* source = from;
    if (state.bf16) {
      ATTN_RETURN_IF_ERROR(state.Narrow(tokens, d, from, narrow));
      source = narrow;
    }
    if (spec_.gated_ffn) {
      // act(gate) and its input in f32, two dense planes, then their product in the
      // compute type.
      auto* gate = static_cast<float*>(state.gate_wide.Reserve(
          static_cast<size_t>(tokens * 2 * spec_.ffn_dim) * sizeof(float)));
      float* up = gate + tokens * spec_.ffn_dim;
      ATTN_RETURN_IF_ERROR(
          state.Linear(tokens, state.ffn_in[n], source, &activation, false, false, gate));
      ATTN_RETURN_IF_ERROR(
          state.Linear(tokens, state.ffn_up[n], source, nullptr, false, false, up));
      ATTN_RETURN_IF_ERROR(state.Gate(tokens, spec_.ffn_dim, gate, up, inner));
    } else {
      ATTN_RETURN_IF_ERROR(state.Linear(tokens, state.ffn_in[n], source, &activation,
                                        false, state.bf16, inner));
    }
    return state.Linear(tokens, state.ffn_out[n], inner, nullptr, true, false, into);
  };
  // With statistics or attention: each layer's attention weights, [h, L, L] per
  // sequence (the first sequence's first).
  const bool weighs = !statistics.empty() || !attention.empty();
  std::vector<float> weights_scratch(
      weighs ? static_cast<size_t>(AttentionWeightsSize(heads, batch.lengths, {})) : 0);
  const auto attend = [&](int64_t n, const float* from, float* into) -> absl::Status {
    AttentionOptions options;
    options.causal = spec_.causal;
    if (!batch.head_mask.empty()) {
      options.head_mask = batch.head_mask.subspan(n * heads, heads);
    }
    if (!state.relative_bias.empty()) {
      options.relative_bias = {state.relative_bias, kMpnetBucketRadius};
    }
    if (!spec_.layer_attention.empty()) {
      const EncoderSpec::LayerAttention& layer = spec_.layer_attention[n];
      options.rotary.inv_freq = layer.rotary_inv_freq;
      options.rotary.interleaved = layer.rotary_interleaved;
      options.window = layer.window;
    }
    ATTN_RETURN_IF_ERROR(state.attention[n]->Forward(
        AttentionBatch{absl::MakeConstSpan(from, tokens * d), batch.lengths}, options,
        absl::MakeSpan(into, tokens * d), absl::MakeSpan(weights_scratch)));
    if (!statistics.empty()) {
      AccumulateHeadStatistics(weights_scratch, batch.lengths, heads, tokens,
                               statistics.subspan(n * heads, heads));
    }
    if (!attention.empty()) {
      std::copy_n(weights_scratch.begin(), first_plane,
                  attention.begin() + n * first_plane);
    }
    return absl::OkStatus();
  };
  // A pre-norm block's norms and the final one: LayerNorm, or RMSNorm (Qwen's).
  const auto pre_norm = [&](const float* from, const std::vector<float>& scale,
                            const std::vector<float>& shift, float* to) -> absl::Status {
    if (spec_.norm == EncoderSpec::Norm::kRms) {
      RmsNormRows(tokens, d, eps, from, scale, shift, to);
      return absl::OkStatus();
    }
    return state.LayerNorm(tokens, d, eps, from, scale, shift, to);
  };
  // The last hidden state: x, or (pre-LN) its final norm.
  const float* last = x;
  try {
    if (from_hidden) {
      std::memcpy(x, batch.hidden_states.data(), plane);
    } else if (embedding_norm) {
      ATTN_RETURN_IF_ERROR(state.LayerNorm(tokens, d, eps, attended,
                                           weights.embedding_norm_scale,
                                           weights.embedding_norm_shift, x));
    }
    for (int64_t n = 0; n < spec_.num_layers; ++n) {
      const EncoderLayerWeights& layer = weights.layers[n];
      if (pre) {
        // x = x + Attention(LayerNorm(x)); x = x + FFN(LayerNorm(x)). A block without
        // an attention norm (ModernBERT's first) attends to x itself.
        const bool attention_norm = !layer.attention_norm_scale.empty();
        if (attention_norm) {
          ATTN_RETURN_IF_ERROR(pre_norm(x, layer.attention_norm_scale,
                                        layer.attention_norm_shift, normed));
        }
        ATTN_RETURN_IF_ERROR(attend(n, attention_norm ? normed : x, attended));
        ATTN_RETURN_IF_ERROR(state.Add(tokens, d, x, attended, x));
        ATTN_RETURN_IF_ERROR(
            pre_norm(x, layer.output_norm_scale, layer.output_norm_shift, normed));
        ATTN_RETURN_IF_ERROR(feed_forward(n, normed, x));
        continue;
      }
      // x = LayerNorm(x + Attention(x))
      ATTN_RETURN_IF_ERROR(attend(n, x, attended));
      ATTN_RETURN_IF_ERROR(state.Add(tokens, d, attended, x, attended));
      ATTN_RETURN_IF_ERROR(state.LayerNorm(tokens, d, eps, attended,
                                           layer.attention_norm_scale,
                                           layer.attention_norm_shift, x));
      // x = LayerNorm(x + FFN(x)), the FFN adding into a copy of x.
      std::memcpy(attended, x, plane);
      ATTN_RETURN_IF_ERROR(feed_forward(n, x, attended));
      ATTN_RETURN_IF_ERROR(state.LayerNorm(
          tokens, d, eps, attended, layer.output_norm_scale, layer.output_norm_shift, x));
    }
    if (pre) {
      ATTN_RETURN_IF_ERROR(
          pre_norm(x, weights.final_norm_scale, weights.final_norm_shift, normed));
      last = normed;
    }
    state.stream.wait();
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN failed in the encoder: ", e.what()));
  }
  if (!hidden.empty()) std::memcpy(hidden.data(), last, hidden.size() * sizeof(float));
  if (pooled.empty()) return absl::OkStatus();
  if (spec_.sparse != EncoderSpec::Sparse::kNone) {
    return SpladeHead(last, batch.lengths, pooled);
  }
  int64_t first = 0;
  std::vector<float> row, scratch;
  for (int64_t i = 0; i < sequences; ++i) {
    const int64_t length = batch.lengths[i];
    if (spec_.num_labels > 0) {
      ClassifyToken(spec_, state.weights, &last[first * d], &pooled[i * width]);
    } else {
      row.resize(static_cast<size_t>(d));
      PoolTokens(spec_.pooling, &last[first * d], length, d, row.data());
      FinishEmbedding(spec_, state.weights, &row, &scratch);
      std::copy(row.begin(), row.end(), pooled.begin() + i * width);
    }
    first += length;
  }
  return absl::OkStatus();
}

}  // namespace attnserve::core
