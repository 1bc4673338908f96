#include "core/encoder/encoder_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "core/encoder/encoder_family.h"
#include "core/encoder/transformer_encoder.h"

#ifdef ATTNSERVE_HAVE_CUDA
#include "core/cuda/cuda_encoder.h"
#endif

namespace attnserve::core {
namespace {

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

}  // namespace

absl::StatusOr<std::unique_ptr<EncoderBackend>> CreateEncoderBackend(
    const EncoderSpec& spec, EncoderWeights weights, const Device& device,
    const EncoderBackendOptions& options) {
  if (device.kind == DeviceKind::kCpu) {
    ATTN_RETURN_IF_ERROR(CheckCpuIndex(device));
    ATTN_ASSIGN_OR_RETURN(std::unique_ptr<TransformerEncoder> encoder,
                          TransformerEncoder::Create(spec, std::move(weights), options));
    return std::unique_ptr<EncoderBackend>(std::move(encoder));
  }
  ATTN_RETURN_IF_ERROR(spec.Validate());
  if (spec.precision == Precision::kInt8) return Int8IsCpuOnly(device);
#ifdef ATTNSERVE_HAVE_CUDA
  cuda::CudaEncoderOptions cuda_options;
  cuda_options.allow_tf32 = options.allow_tf32;
  ATTN_ASSIGN_OR_RETURN(
      std::unique_ptr<EncoderBackend> encoder,
      cuda::CreateCudaEncoder(spec, std::move(weights), device.index, cuda_options));
  return encoder;
#else
  return NoCudaInThisBuild(device);
#endif
}

absl::Status CheckEncoderForward(const EncoderSpec& spec, const EncoderBatch& batch,
                                 absl::Span<const float> pooled,
                                 absl::Span<const float> hidden,
                                 absl::Span<const EncoderHeadStatistic> statistics,
                                 absl::Span<const float> attention) {
  const int64_t d = spec.d_model;
  if (batch.lengths.empty()) return Invalid("lengths must not be empty");
  int64_t tokens = 0;
  for (size_t i = 0; i < batch.lengths.size(); ++i) {
    const int64_t length = batch.lengths[i];
    if (length < 1 || length > spec.max_positions) {
      return Invalid(absl::StrCat("lengths[", i, "] must be in [1, ", spec.max_positions,
                                  "] (the model's max_positions), got ", length));
    }
    tokens += length;
  }
  const int64_t heads = spec.num_heads;
  if (!batch.head_mask.empty() &&
      static_cast<int64_t>(batch.head_mask.size()) != spec.num_layers * heads) {
    return Invalid(absl::StrCat(
        "head_mask has ", batch.head_mask.size(),
        " factors, expected num_layers * num_heads = ", spec.num_layers * heads));
  }
  for (size_t i = 0; i < batch.head_mask.size(); ++i) {
    if (!(batch.head_mask[i] >= 0.0f && batch.head_mask[i] <= 1.0f)) {
      return Invalid(
          absl::StrCat("head_mask[", i, "] must be in [0, 1], got ", batch.head_mask[i]));
    }
  }
  const bool from_hidden = !batch.hidden_states.empty();
  if (from_hidden) {
    if (!batch.token_ids.empty() || !batch.token_types.empty()) {
      return Invalid("token_ids and token_types must be empty with hidden_states");
    }
    if (static_cast<int64_t>(batch.hidden_states.size()) != tokens * d) {
      return Invalid(absl::StrCat("hidden_states has ", batch.hidden_states.size(),
                                  " values, expected ", tokens * d));
    }
  } else if (static_cast<int64_t>(batch.token_ids.size()) != tokens) {
    return Invalid(absl::StrCat("token_ids has ", batch.token_ids.size(),
                                " ids, expected the lengths' sum ", tokens));
  }
  if (!batch.token_types.empty() && batch.token_types.size() != batch.token_ids.size()) {
    return Invalid(absl::StrCat("token_types has ", batch.token_types.size(),
                                " entries, expected ", tokens, " (or none)"));
  }
  for (int64_t t = 0; t < (from_hidden ? 0 : tokens); ++t) {
    if (batch.token_ids[t] < 0 || batch.token_ids[t] >= spec.vocab_size) {
      return Invalid(absl::StrCat("token_ids[", t, "] must be in [0, ", spec.vocab_size,
                                  ") (the vocabulary), got ", batch.token_ids[t]));
    }
    if (!batch.token_types.empty() &&
        (batch.token_types[t] < 0 || batch.token_types[t] >= spec.type_vocab_size)) {
      return Invalid(absl::StrCat("token_types[", t, "] must be in [0, ",
                                  spec.type_vocab_size, "), got ", batch.token_types[t]));
    }
  }
  const int64_t sequences = static_cast<int64_t>(batch.lengths.size());
  if (!spec.pools() && !pooled.empty()) {
    return Invalid("pooled must be empty: this encoder's pooling is none");
  }
  const int64_t width = spec.pooled_width();
  if (!pooled.empty() && static_cast<int64_t>(pooled.size()) != sequences * width) {
    return Invalid(absl::StrCat("pooled has ", pooled.size(), " values, expected ",
                                sequences * width));
  }
  if (!hidden.empty() && static_cast<int64_t>(hidden.size()) != tokens * d) {
    return Invalid(
        absl::StrCat("hidden has ", hidden.size(), " values, expected ", tokens * d));
  }
  if (!statistics.empty() &&
      static_cast<int64_t>(statistics.size()) != spec.num_layers * heads) {
    return Invalid(absl::StrCat(
        "statistics has ", statistics.size(),
        " entries, expected num_layers * num_heads = ", spec.num_layers * heads));
  }
  const int64_t first_plane = heads * batch.lengths[0] * batch.lengths[0];
  if (!attention.empty() &&
      static_cast<int64_t>(attention.size()) != spec.num_layers * first_plane) {
    return Invalid(absl::StrCat("attention has ", attention.size(),
                                " values, expected num_layers * num_heads * L0^2 = ",
                                spec.num_layers * first_plane));
  }
  return absl::OkStatus();
}

void PoolTokens(EncoderSpec::Pooling pooling, const float* tokens, int64_t length,
                int64_t d, float* out) {
  const auto bytes = static_cast<size_t>(d) * sizeof(float);
  switch (pooling) {
    case EncoderSpec::Pooling::kCls:
      std::memcpy(out, tokens, bytes);
      return;
    case EncoderSpec::Pooling::kLastToken:
      std::memcpy(out, &tokens[(length - 1) * d], bytes);
      return;
    case EncoderSpec::Pooling::kMax:
      std::memcpy(out, tokens, bytes);
      for (int64_t t = 1; t < length; ++t) {
        for (int64_t c = 0; c < d; ++c) out[c] = std::max(out[c], tokens[t * d + c]);
      }
      return;
    default:
      break;
  }
  // Sums in double: by 1 (mean, mean over the square root of the length) or by the
  // position (weighted mean).
  const bool weighted = pooling == EncoderSpec::Pooling::kWeightedMean;
  const auto n = static_cast<double>(length);
  const double divisor = weighted ? n * (n + 1.0) / 2.0
                         : pooling == EncoderSpec::Pooling::kMeanSqrtLen ? std::sqrt(n)
                                                                         : n;
  for (int64_t c = 0; c < d; ++c) {
    double sum = 0.0;
    for (int64_t t = 0; t < length; ++t) {
      sum += (weighted ? static_cast<double>(t + 1) : 1.0) * tokens[t * d + c];
    }
    out[c] = static_cast<float>(sum / divisor);
  }
}

void FinishEmbedding(const EncoderSpec& spec, const EncoderWeights& weights,
                     std::vector<float>* row, std::vector<float>* scratch) {
  // One row per sequence, summed in double as the pooling is.
  for (size_t n = 0; n < spec.dense.size(); ++n) {
    const EncoderSpec::Dense& layer = spec.dense[n];
    const EncoderWeights::DenseWeights& dense = weights.dense[n];
    scratch->resize(static_cast<size_t>(layer.out_features));
    for (int64_t r = 0; r < layer.out_features; ++r) {
      const float* weight = &dense.weight[r * layer.in_features];
      double sum = dense.bias[r];
      for (int64_t c = 0; c < layer.in_features; ++c) {
        sum += static_cast<double>(weight[c]) * (*row)[c];
      }
      switch (layer.activation) {
        case EncoderSpec::Dense::Activation::kTanh:
          sum = std::tanh(sum);
          break;
        case EncoderSpec::Dense::Activation::kRelu:
          sum = std::max(sum, 0.0);
          break;
        case EncoderSpec::Dense::Activation::kGelu:
          sum = 0.5 * sum * (1.0 + std::erf(sum / std::sqrt(2.0)));
          break;
        case EncoderSpec::Dense::Activation::kSigmoid:
          sum = 1.0 / (1.0 + std::exp(-sum));
          break;
        case EncoderSpec::Dense::Activation::kIdentity:
          break;
      }
      (*scratch)[r] = static_cast<float>(sum);
    }
    row->swap(*scratch);
  }
  if (spec.normalize) NormalizeL2(absl::MakeSpan(*row));
}

void NormalizeL2(absl::Span<float> row) {
  double norm = 0.0;
  for (const float value : row) norm += static_cast<double>(value) * value;
  const double scale = 1.0 / std::max(std::sqrt(norm), 1e-12);
  for (float& value : row) value = static_cast<float>(value * scale);
}

void ClassifyToken(const EncoderSpec& spec, const EncoderWeights& weights,
                   const float* cls, float* logits) {
  // A few products of [d, d] and [labels, d], small beside the encoder's, summed in
  // double as the pooling is.
  const int64_t d = spec.d_model;
  std::vector<float> pooled(static_cast<size_t>(d));
  for (int64_t r = 0; r < d; ++r) {
    const float* row = &weights.pooler_weight[r * d];
    double sum = weights.pooler_bias[r];
    for (int64_t c = 0; c < d; ++c) sum += static_cast<double>(row[c]) * cls[c];
    // BERT's pooler and RoBERTa's head: tanh; ELECTRA's head: GELU (erf).
    pooled[r] =
        static_cast<float>(FamilyOf(spec.family).classifier.gelu
                               ? 0.5 * sum * (1.0 + std::erf(sum / std::sqrt(2.0)))
                               : std::tanh(sum));
  }
  for (int64_t label = 0; label < spec.num_labels; ++label) {
    const float* row = &weights.classifier_weight[label * d];
    double sum = weights.classifier_bias[label];
    for (int64_t c = 0; c < d; ++c) sum += static_cast<double>(row[c]) * pooled[c];
    logits[label] = static_cast<float>(sum);
  }
}

}  // namespace attnserve::core
