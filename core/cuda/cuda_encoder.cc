#include "core/cuda/cuda_encoder.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/device.h"
#include "core/base/status_macros.h"
#include "core/cuda/device_common.h"
#include "core/cuda/kernels.h"
#include "core/cuda/staging.h"

namespace attnserve::core::cuda {
namespace {

PoolMode ToPoolMode(const EncoderSpec& spec) {
  if (spec.num_labels > 0) return PoolMode::kFirst;  // the classification head's [CLS]
  switch (spec.pooling) {
    case EncoderSpec::Pooling::kCls:
      return PoolMode::kFirst;
    case EncoderSpec::Pooling::kMax:
      return PoolMode::kMax;
    case EncoderSpec::Pooling::kMeanSqrtLen:
      return PoolMode::kMeanSqrtLength;
    case EncoderSpec::Pooling::kWeightedMean:
      return PoolMode::kWeightedMean;
    case EncoderSpec::Pooling::kLastToken:
      return PoolMode::kLast;
    default:
      return PoolMode::kMean;
  }
}

Activation ToActivation(EncoderSpec::Activation activation) {
  switch (activation) {
    case EncoderSpec::Activation::kGeluTanh:
      return Activation::kGeluTanh;
    case EncoderSpec::Activation::kRelu:
      return Activation::kRelu;
    default:
      return Activation::kGeluErf;
  }
}

class CudaEncoderImpl final : public EncoderBackend {
 public:
  CudaEncoderImpl(const EncoderSpec& spec, int device, const CudaEncoderOptions& options)
      : spec_(spec),
        device_(device),
        compute_(ComputeTypeOf(spec.precision)),
        compute_bytes_(BytesOf(compute_)) {
    gemm_.compute = compute_;
    gemm_.allow_tf32 = options.allow_tf32;
  }

  absl::Status Init(EncoderWeights weights);

  absl::Status Forward(const EncoderBatch& batch, absl::Span<float> pooled,
                       absl::Span<float> hidden,
                       absl::Span<EncoderHeadStatistic> statistics,
                       absl::Span<float> attention) override;
  const EncoderSpec& spec() const override { return spec_; }
  std::string ComputePath() const override {
    return absl::StrCat(PrecisionName(spec_.precision), " (cuda:", device_, ")");
  }
  std::string device_name() const override { return absl::StrCat("cuda:", device_); }
  int64_t device_memory_bytes() const override {
    size_t total = 0;
    for (const DeviceBuffer* buffer : {&weights_, &word_, &input_, &results_, &narrow_x_,
                                       &qkv_, &context_, &attended_, &inner_}) {
      total += buffer->capacity();
    }
    return static_cast<int64_t>(total);
  }

 private:
  // One block's weights: offsets into weights_ (matrices in the compute type, the
  // rest f32), its kept heads and where their factors start in the staged factors.
  struct Layer {
    std::vector<int64_t> heads;
    int64_t width = 0;
    size_t qkv = 0, qkv_bias = 0, out = 0, out_bias = 0;
    size_t norm1_scale = 0, norm1_shift = 0;
    size_t ffn_in = 0, ffn_in_bias = 0, ffn_out = 0, ffn_out_bias = 0;
    size_t norm2_scale = 0, norm2_shift = 0;
    int64_t first_factor = 0;
  };
  template <typename T = float>
  const T* At(size_t offset) const {
    return reinterpret_cast<const T*>(weights_.data() + offset);
  }

  const EncoderSpec spec_;
  const int device_;
  const ElementType compute_;
  const int64_t compute_bytes_;
  cudaStream_t stream() const { return device_stream_.stream(); }
  Gemm gemm_;

  // The word table in its own block (f32, or bf16 for a bf16 encoder); the position
  // and type tables, the embedding norm and every layer in weights_.
  DeviceBuffer word_, weights_;
  ElementType word_type_ = ElementType::kF32;
  size_t position_ = 0, type_ = 0, embedding_scale_ = 0, embedding_shift_ = 0;
  std::vector<Layer> layers_;
  int64_t widest_ = 0;   // the widest layer's kept heads, times head_dim
  int64_t factors_ = 0;  // kept heads over all layers
  // On the host: the pooler, classifier and Dense weights (nothing else).
  EncoderWeights heads_;

  PinnedBuffer host_input_, host_results_;
  // results_ holds the pooled rows, then x (the residual stream, f32 [tokens, d]), so
  // that one copy brings both back.
  DeviceBuffer input_, results_, narrow_x_, qkv_, context_, attended_, inner_;
  std::vector<float> factor_values_;
  // Last, so that it goes first: its stream is drained before the buffers above are
  // freed.
  DeviceStream device_stream_;
};

absl::Status CudaEncoderImpl::Init(EncoderWeights weights) {
  ATTN_RETURN_IF_ERROR(device_stream_.Init(device_));
  gemm_.handle = device_stream_.cublas();

  const bool narrow = compute_ == ElementType::kBf16;
  // The word table as it was loaded: f32 for fp32, bf16 bits for bf16.
  const void* word = weights.word_embeddings_bf16 != nullptr
                         ? static_cast<const void*>(weights.word_embeddings_bf16->data())
                         : weights.word_embeddings->data();
  size_t word_bytes = 0;
  if (weights.word_embeddings_bf16 != nullptr) {
    word_type_ = ElementType::kBf16;
    word_bytes = weights.word_embeddings_bf16->size() * sizeof(uint16_t);
  } else {
    word_type_ = ElementType::kF32;
    word_bytes = weights.word_embeddings->size() * sizeof(float);
  }
  ATTN_ASSIGN_OR_RETURN(uint8_t * device_word, word_.Reserve(word_bytes));
  ATTN_CUDA(cudaMemcpy(device_word, word, word_bytes, cudaMemcpyHostToDevice),
            "upload the word embeddings");

  std::vector<uint8_t> host;
  position_ = AppendAligned(weights.position_embeddings, false, &host);
  type_ = AppendAligned(weights.token_type_embeddings, false, &host);
  embedding_scale_ = AppendAligned(weights.embedding_norm_scale, false, &host);
  embedding_shift_ = AppendAligned(weights.embedding_norm_shift, false, &host);
  for (int64_t n = 0; n < spec_.num_layers; ++n) {
    const EncoderLayerWeights& from = weights.layers[n];
    KeptHeadWeights kept = KeepHeads(spec_.AttentionSpec(n), from.attention);
    Layer layer;
    layer.heads = std::move(kept.heads);
    layer.width = kept.width;
    layer.first_factor = factors_;
    factors_ += static_cast<int64_t>(layer.heads.size());
    widest_ = std::max(widest_, layer.width);
    layer.qkv = AppendAligned(kept.qkv, narrow, &host);
    layer.qkv_bias = AppendAligned(kept.qkv_bias, false, &host);
    layer.out = AppendAligned(kept.out, narrow, &host);
    layer.out_bias = AppendAligned(from.attention.out_proj_bias, false, &host);
    layer.norm1_scale = AppendAligned(from.attention_norm_scale, false, &host);
    layer.norm1_shift = AppendAligned(from.attention_norm_shift, false, &host);
    layer.ffn_in = AppendAligned(from.ffn_in_weight, narrow, &host);
    layer.ffn_in_bias = AppendAligned(from.ffn_in_bias, false, &host);
    layer.ffn_out = AppendAligned(from.ffn_out_weight, narrow, &host);
    layer.ffn_out_bias = AppendAligned(from.ffn_out_bias, false, &host);
    layer.norm2_scale = AppendAligned(from.output_norm_scale, false, &host);
    layer.norm2_shift = AppendAligned(from.output_norm_shift, false, &host);
    layers_.push_back(std::move(layer));
  }
  ATTN_ASSIGN_OR_RETURN(uint8_t * device_weights, weights_.Reserve(host.size()));
  ATTN_CUDA(cudaMemcpy(device_weights, host.data(), host.size(), cudaMemcpyHostToDevice),
            "upload the weights");
  heads_.pooler_weight = std::move(weights.pooler_weight);
  heads_.pooler_bias = std::move(weights.pooler_bias);
  heads_.classifier_weight = std::move(weights.classifier_weight);
  heads_.classifier_bias = std::move(weights.classifier_bias);
  heads_.dense = std::move(weights.dense);
  // The copies above ran on the legacy stream, which the stream (non-blocking) does not
  // wait for, and a pageable copy may return before its DMA ends.
  ATTN_CUDA(cudaDeviceSynchronize(), "finish the upload");
  return absl::OkStatus();
}

absl::Status CudaEncoderImpl::Forward(const EncoderBatch& batch, absl::Span<float> pooled,
                                      absl::Span<float> hidden,
                                      absl::Span<EncoderHeadStatistic> statistics,
                                      absl::Span<float> attention) {
  ATTN_RETURN_IF_ERROR(
      CheckEncoderForward(spec_, batch, pooled, hidden, statistics, attention));
  if (!statistics.empty() || !attention.empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "head statistics and attention weights of an encoder are computed on the CPU "
        "only; device cuda:",
        device_, " has neither (serve the model on --device=cpu to measure its heads)"));
  }
  ATTN_CUDA(cudaSetDevice(device_), absl::StrCat("select device cuda:", device_));
  const int64_t d = spec_.d_model;
  const int64_t heads = spec_.num_heads;
  factor_values_.assign(static_cast<size_t>(factors_), 1.0f);
  if (!batch.head_mask.empty()) {
    for (size_t n = 0; n < layers_.size(); ++n) {
      const Layer& layer = layers_[n];
      for (size_t p = 0; p < layer.heads.size(); ++p) {
        factor_values_[layer.first_factor + p] =
            batch.head_mask[n * heads + layer.heads[p]];
      }
    }
  }
  ATTN_ASSIGN_OR_RETURN(const EncoderStagingLayout layout,
                        PlanEncoderStaging(batch, d, factors_));
  const int64_t tokens = layout.tokens;
  const int sequences = layout.sequences;

  const size_t plane = static_cast<size_t>(tokens * d) * sizeof(float);
  const size_t pooled_bytes =
      pooled.empty() ? 0 : Align(static_cast<size_t>(sequences * d) * sizeof(float));
  ATTN_ASSIGN_OR_RETURN(uint8_t * results, results_.Reserve(pooled_bytes + plane));
  auto* x = reinterpret_cast<float*>(results + pooled_bytes);
  // x in the compute type, for the products: x itself in fp32, a bf16 copy that every
  // kernel writing x also writes in bf16.
  void* x_compute = x;
  void* narrow_copy = nullptr;
  if (compute_ == ElementType::kBf16) {
    ATTN_ASSIGN_OR_RETURN(uint8_t * copy, narrow_x_.Reserve(plane / 2));
    x_compute = narrow_copy = copy;
  }
  ATTN_ASSIGN_OR_RETURN(
      uint8_t * qkv,
      qkv_.Reserve(static_cast<size_t>(tokens * 3 * widest_) * compute_bytes_));
  ATTN_ASSIGN_OR_RETURN(
      uint8_t * context,
      context_.Reserve(static_cast<size_t>(tokens * widest_) * compute_bytes_));
  ATTN_ASSIGN_OR_RETURN(uint8_t * attended_bytes, attended_.Reserve(plane));
  auto* attended = reinterpret_cast<float*>(attended_bytes);
  ATTN_ASSIGN_OR_RETURN(
      uint8_t * inner,
      inner_.Reserve(static_cast<size_t>(tokens * spec_.ffn_dim) * compute_bytes_));

  const size_t download = hidden.empty() ? pooled_bytes : pooled_bytes + plane;
  uint8_t* host_results = nullptr;
  if (download > 0) {
    ATTN_ASSIGN_OR_RETURN(host_results, host_results_.Reserve(download));
  }
  ATTN_ASSIGN_OR_RETURN(uint8_t * input, input_.Reserve(layout.total_bytes));
  ATTN_ASSIGN_OR_RETURN(uint8_t * staging, host_input_.Reserve(layout.total_bytes));
  // Every buffer is held: from here on work is queued, and an error must wait for it
  // before the staging buffer can be written again.
  PackEncoderStaging(batch, layout, factor_values_, staging);
  const absl::Status status = [&]() -> absl::Status {
    ATTN_CUDA(cudaMemcpyAsync(input, staging, layout.total_bytes, cudaMemcpyHostToDevice,
                              stream()),
              "upload the batch");
    const auto* cu = reinterpret_cast<const int32_t*>(input + layout.cu);
    const auto* factors = reinterpret_cast<const float*>(input + layout.factors);
    const float eps = spec_.layer_norm_eps;
    if (layout.from_hidden) {
      // Hidden states enter the first block as they are.
      ATTN_CUDA(cudaMemcpyAsync(x, input + layout.hidden, plane, cudaMemcpyDeviceToDevice,
                                stream()),
                "place the hidden states");
      if (narrow_copy != nullptr) {
        ATTN_CUDA(LaunchConvert(x, ElementType::kF32, narrow_copy, ElementType::kBf16,
                                tokens * d, stream()),
                  "narrow the hidden states");
      }
    } else {
      EmbedArgs embed{reinterpret_cast<const int32_t*>(input + layout.ids),
                      reinterpret_cast<const int32_t*>(input + layout.types),
                      reinterpret_cast<const int32_t*>(input + layout.positions),
                      word_.data(),
                      word_type_,
                      At(position_),
                      At(type_),
                      At(embedding_scale_),
                      At(embedding_shift_),
                      eps,
                      tokens,
                      static_cast<int>(d),
                      x,
                      narrow_copy};
      ATTN_CUDA(LaunchEmbed(embed, stream()), "embed the tokens");
    }
    const int head_dim = static_cast<int>(spec_.AttentionSpec(0).head_dim());
    const int64_t ffn = spec_.ffn_dim;
    // x = LayerNorm(x + attended + bias), x's bf16 copy written too.
    const auto add_and_normalize = [&](size_t bias, size_t scale, size_t shift,
                                       absl::string_view sublayer) {
      return CudaError(
          LaunchAddLayerNorm({attended, At(bias), x, At(scale), At(shift), eps, tokens,
                              static_cast<int>(d), x, narrow_copy},
                             stream()),
          absl::StrCat("add and normalize ", sublayer));
    };
    for (const Layer& layer : layers_) {
      const int64_t width = layer.width;
      // [Q K V] = x W_qkv^T + b_qkv, the query's 1/sqrt(head_dim) in W_qkv.
      ATTN_RETURN_IF_ERROR(gemm_.Project(x_compute, d, tokens, d, At<uint8_t>(layer.qkv),
                                         d, 3 * width, qkv, compute_, 3 * width, false));
      ATTN_CUDA(
          LaunchBiasActivation(qkv, compute_, At(layer.qkv_bias), tokens,
                               static_cast<int>(3 * width), Activation::kNone, stream()),
          "add the attention's bias");
      FusedAttentionArgs args{compute_,
                              qkv,
                              3 * width,
                              qkv + width * compute_bytes_,
                              3 * width,
                              qkv + 2 * width * compute_bytes_,
                              3 * width,
                              context,
                              width,
                              cu,
                              cu,
                              factors + layer.first_factor,
                              sequences,
                              static_cast<int>(layer.heads.size()),
                              head_dim,
                              static_cast<int>(layout.max_length),
                              /*causal=*/false};
      if (TensorCoreAttentionFits(args)) {
        ATTN_CUDA(LaunchTensorCoreAttention(args, stream(),
                                            TensorCoreVariant::kLdmatrixV8Warps),
                  "run tensor-core attention");
      } else {
        ATTN_CUDA(LaunchFusedAttention(args, stream()), "run fused attention");
      }
      // x = LayerNorm(x + context W_out^T + b_out)
      ATTN_RETURN_IF_ERROR(gemm_.Project(context, width, tokens, width,
                                         At<uint8_t>(layer.out), width, d, attended,
                                         ElementType::kF32, d, false));
      ATTN_RETURN_IF_ERROR(add_and_normalize(layer.out_bias, layer.norm1_scale,
                                             layer.norm1_shift, "the attention"));
      // x = LayerNorm(x + W_2 act(W_1 x + b_1) + b_2)
      ATTN_RETURN_IF_ERROR(gemm_.Project(x_compute, d, tokens, d,
                                         At<uint8_t>(layer.ffn_in), d, ffn, inner,
                                         compute_, ffn, false));
      ATTN_CUDA(LaunchBiasActivation(inner, compute_, At(layer.ffn_in_bias), tokens,
                                     static_cast<int>(ffn),
                                     ToActivation(spec_.activation), stream()),
                "activate the feed-forward network");
      ATTN_RETURN_IF_ERROR(gemm_.Project(inner, ffn, tokens, ffn,
                                         At<uint8_t>(layer.ffn_out), ffn, d, attended,
                                         ElementType::kF32, d, false));
      ATTN_RETURN_IF_ERROR(add_and_normalize(layer.ffn_out_bias, layer.norm2_scale,
                                             layer.norm2_shift,
                                             "the feed-forward network"));
    }
    if (!pooled.empty()) {
      ATTN_CUDA(LaunchPool(x, cu, sequences, static_cast<int>(d), ToPoolMode(spec_),
                           reinterpret_cast<float*>(results), stream()),
                "pool the sequences");
    }
    // Results: the pooled rows and, when asked, the last hidden state, in one copy.
    if (download > 0) {
      ATTN_CUDA(cudaMemcpyAsync(host_results, results, download, cudaMemcpyDeviceToHost,
                                stream()),
                "download the results");
    }
    return CudaError(cudaStreamSynchronize(stream()), "run the batch");
  }();
  if (!status.ok()) {
    cudaStreamSynchronize(stream());
    return status;
  }
  if (!hidden.empty()) std::memcpy(hidden.data(), host_results + pooled_bytes, plane);
  if (pooled.empty()) return absl::OkStatus();
  const auto* rows = reinterpret_cast<const float*>(host_results);
  const int64_t width = spec_.pooled_width();
  std::vector<float> row, scratch;
  for (int64_t i = 0; i < sequences; ++i) {
    if (spec_.num_labels > 0) {
      ClassifyToken(spec_, heads_, rows + i * d, &pooled[i * width]);
      continue;
    }
    row.assign(rows + i * d, rows + (i + 1) * d);
    FinishEmbedding(spec_, heads_, &row, &scratch);
    std::copy(row.begin(), row.end(), pooled.begin() + i * width);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaEncoderSupports(const EncoderSpec& spec) {
  const auto refuse = [](absl::string_view what) {
    return absl::UnimplementedError(absl::StrCat(
        what,
        " is not computed on CUDA devices yet (the CPU encoder has it); the GPU runs "
        "post-LN encoders of BERT's shape"));
  };
  if (spec.norm_placement != EncoderSpec::NormPlacement::kPost) {
    return refuse("a pre-LN encoder (norm_placement pre)");
  }
  if (spec.norm != EncoderSpec::Norm::kLayerNorm) return refuse("RMSNorm");
  if (!spec.absolute_positions) return refuse("rotary positions (no position table)");
  for (const EncoderSpec::LayerAttention& layer : spec.layer_attention) {
    if (!layer.rotary_inv_freq.empty()) return refuse("rotary positions");
    if (layer.window != 0) return refuse("sliding-window attention");
  }
  if (spec.relative_attention_buckets > 0) {
    return refuse("a relative position bias (MPNet's)");
  }
  if (spec.gated_ffn) return refuse("a gated feed-forward network");
  if (spec.activation == EncoderSpec::Activation::kSilu) return refuse("SiLU");
  if (spec.causal) return refuse("a causal mask");
  if (spec.num_kv_heads > 0) return refuse("grouped-query attention (num_kv_heads)");
  if (spec.qk_norm) return refuse("qk_norm");
  if (spec.head_size > 0) return refuse("head_size");
  if (spec.sparse != EncoderSpec::Sparse::kNone) return refuse("a SPLADE head");
  if (spec.num_heads > 0 && spec.d_model / spec.num_heads > kFusedMaxHeadDim) {
    return refuse(absl::StrCat("a head of ", spec.d_model / spec.num_heads,
                               " values (the kernels take up to ", kFusedMaxHeadDim,
                               ")"));
  }
  if (spec.d_model > kMaxNormWidth) {
    return refuse(absl::StrCat("d_model ", spec.d_model, " (the norm kernel takes up to ",
                               kMaxNormWidth, ")"));
  }
  if (spec.vocab_size > std::numeric_limits<int32_t>::max()) {
    return refuse(absl::StrCat("a vocabulary of ", spec.vocab_size, " ids"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EncoderBackend>> CreateCudaEncoder(
    const EncoderSpec& spec, EncoderWeights weights, int device_index,
    const CudaEncoderOptions& options) {
  ATTN_RETURN_IF_ERROR(spec.Validate());
  ATTN_RETURN_IF_ERROR(weights.CheckShapes(spec));
  ATTN_RETURN_IF_ERROR(CudaEncoderSupports(spec));
  if (spec.precision == Precision::kInt8) {
    return Int8IsCpuOnly(Device{DeviceKind::kCuda, device_index});
  }
  ATTN_RETURN_IF_ERROR(CheckCudaDevice(device_index));
  auto encoder = std::make_unique<CudaEncoderImpl>(spec, device_index, options);
  ATTN_RETURN_IF_ERROR(encoder->Init(std::move(weights)));
  return std::unique_ptr<EncoderBackend>(std::move(encoder));
}

}  // namespace attnserve::core::cuda
