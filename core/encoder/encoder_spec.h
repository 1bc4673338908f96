// What an encoder is, whatever device runs it: its spec (EncoderSpec), its weights as
// a Hugging Face checkpoint names them (EncoderWeights, LoadBertWeights), a packed batch
// of token ids (EncoderBatch) and per-head figures (EncoderHeadStatistic). The CPU
// encoder (core/encoder/transformer_encoder.h) and the CUDA one
// (core/cuda/cuda_encoder.h) compute them behind core/encoder/encoder_backend.h. Includes
// no oneDNN and no CUDA.
#ifndef ATTNSERVE_CORE_ENCODER_ENCODER_SPEC_H_
#define ATTNSERVE_CORE_ENCODER_ENCODER_SPEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/attention/attention_weights.h"
#include "core/attention/model_spec.h"
#include "core/io/safetensors.h"

namespace attnserve::core {

// The shape and recipe of an encoder.
struct EncoderSpec {
  int64_t num_layers = 0;  // >= 1
  int64_t d_model = 0;     // >= 1, a multiple of num_heads
  int64_t num_heads = 0;   // >= 1
  // Grouped-query attention's key/value heads (0: one per head), each head's width
  // when it is not d_model / num_heads (0), and the per-head RMS norms of Q and K
  // (ModelSpec's num_kv_heads, head_size and qk_norm; the norms' epsilon is
  // layer_norm_eps).
  int64_t num_kv_heads = 0;
  int64_t head_size = 0;
  bool qk_norm = false;
  int64_t ffn_dim = 0;  // the feed-forward network's inner width, >= 1
  // The feed-forward activation: GELU with erf (BERT's "gelu"), GELU's tanh
  // approximation ("gelu_new"), ReLU, or SiLU (x sigmoid(x); SwiGLU's, with gated_ffn
  // only).
  enum class Activation { kGeluErf, kGeluTanh, kRelu, kSilu };
  Activation activation = Activation::kGeluErf;
  // Where the layer norms sit: after each residual add and after the embeddings (BERT),
  // or before each sublayer, inside its residual, and once after the last block
  // (Megatron-BERT).
  enum class NormPlacement { kPost, kPre };
  NormPlacement norm_placement = NormPlacement::kPost;
  // The norms: LayerNorm (x - mean) / sqrt(var + eps) * scale + shift, or RMSNorm x /
  // sqrt(mean(x^2) + eps) * scale (the Qwen family's; its shifts are zeros).
  enum class Norm { kLayerNorm, kRms };
  Norm norm = Norm::kLayerNorm;
  // Each token attends to itself and the tokens before it only (a decoder's causal
  // mask: the Qwen family's).
  bool causal = false;
  // The checkpoint's family: its row of the family table (core/encoder/encoder_family.h)
  // names its tensors and says which options it sets and which heads it carries.
  enum class Family {
    kBert,
    kDistilBert,
    kRoberta,
    kElectra,
    kMpnet,
    kModernBert,
    kNomicBert,
    kQwen,
    kGte
  };
  Family family = Family::kBert;
  // The rows of the checkpoint's position table before position 0 (RoBERTa's
  // padding_idx + 1): LoadBertWeights drops them. >= 0.
  int64_t position_offset = 0;
  // MPNet: the buckets of its relative position bias (32; every other family 0). Head
  // h's score of query i and key j gains
  // EncoderWeights::relative_attention_bias[MpnetRelativeBucket(j - i), h].
  int64_t relative_attention_buckets = 0;
  static constexpr int64_t kMpnetBuckets = 32;
  float layer_norm_eps = 1e-12f;  // > 0
  // The longest sequence, >= 1: the rows of the learned position table, or (without
  // absolute_positions) the most positions rotary attention is given.
  int64_t max_positions = 512;
  // Positions from a learned table added to the embeddings (BERT's), or none (rotary
  // positions in attention, ModernBERT's).
  bool absolute_positions = true;
  // A gated feed-forward (GeGLU): W_1 gives 2 ffn_dim values per token, the first
  // ffn_dim the input and the rest the gate, and W_2 takes act(input) * gate.
  bool gated_ffn = false;
  // Per layer: the attention's rotary position embedding (AttentionOptions::Rotary's
  // inverse frequencies; empty: none) and local window (AttentionOptions::window; 0:
  // global). Empty (every layer global without rotary), or num_layers entries.
  struct LayerAttention {
    std::vector<float> rotary_inv_freq;
    bool rotary_interleaved = false;  // GPT-J's pairs (AttentionOptions::Rotary)
    int64_t window = 0;
  };
  std::vector<LayerAttention> layer_attention;
  int64_t vocab_size = 0;       // >= 1
  int64_t type_vocab_size = 2;  // >= 1
  // How the pooled embedding is made from a sequence's last hidden state, as
  // sentence-transformers' Pooling does: the mean over its tokens, its first token
  // ([CLS]), none (only hidden states come out), the element-wise maximum, the sum over
  // the square root of the length, the mean weighted by position (token i weighs
  // i + 1), or its last token.
  enum class Pooling {
    kMean,
    kCls,
    kNone,
    kMax,
    kMeanSqrtLen,
    kWeightedMean,
    kLastToken
  };
  Pooling pooling = Pooling::kMean;
  // L2-normalize the pooled embedding (sentence-transformers' Normalize module).
  bool normalize = false;
  // A sequence-classification head (Hugging Face's BertForSequenceClassification): 0
  // for none; else each sequence's output is num_labels logits instead of a pooled
  // embedding, classifier(tanh(pooler([CLS]'s last hidden state))), and `pooling` and
  // `normalize` do not apply. The head computes in f32 at every precision. Range
  // [0, kMaxLabels].
  int64_t num_labels = 0;
  static constexpr int64_t kMaxLabels = 65536;
  // sentence-transformers' Dense modules after the pooling (and before `normalize`), in
  // order: each a linear layer of in_features -> out_features and an activation. The
  // first takes d_model, each next one the previous one's out_features. Not with a
  // classification head.
  struct Dense {
    int64_t in_features = 0;
    int64_t out_features = 0;  // >= 1
    enum class Activation { kIdentity, kTanh, kRelu, kGelu, kSigmoid };
    Activation activation = Activation::kTanh;
  };
  std::vector<Dense> dense;
  static constexpr int64_t kMaxDenseWidth = 65536;
  // A SPLADE head (sparse embeddings, sentence-transformers' SparseEncoder): the
  // checkpoint's masked-LM head gives each token vocab_size logits (a dense layer [d,
  // d] with the feed-forward's activation, a LayerNorm, then the decoder, tied to the
  // word embeddings unless the checkpoint has its own, plus a bias), each logit becomes
  // log(1 + relu(x)) (that, twice, with sparse_log_twice: SpladePooling's
  // "log1p_relu"), and a sequence's output is their maximum (kMax) or sum (kSum) over
  // its tokens: vocab_size weights, most of them zero for a trained model, instead of
  // a pooled embedding. `pooling`, `normalize` and `dense` do not apply; the head
  // computes in f32 at every precision. BERT's and DistilBERT's heads only
  // (cls.predictions.*, vocab_transform / vocab_layer_norm / vocab_projector).
  enum class Sparse { kNone, kMax, kSum };
  Sparse sparse = Sparse::kNone;
  bool sparse_log_twice = false;
  // The values per sequence Forward's `pooled` receives: num_labels logits, a SPLADE
  // head's vocab_size weights, or the embedding's width (the last Dense's
  // out_features, else d_model).
  int64_t pooled_width() const {
    return num_labels > 0            ? num_labels
           : sparse != Sparse::kNone ? vocab_size
           : dense.empty()           ? d_model
                                     : dense.back().out_features;
  }
  // Whether Forward can fill `pooled` (a head, or a pooling other than none).
  bool pools() const {
    return num_labels > 0 || sparse != Sparse::kNone || pooling != Pooling::kNone;
  }
  // fp32: every product in f32. bf16: the attention and feed-forward weights are
  // rounded to bf16, and their products run in bf16 with f32 accumulation where the
  // CPU has native bf16 (else in f32 on the bf16-valued weights: see
  // TransformerEncoder::Options::bf16_compute); embeddings, layer norms, residuals,
  // softmax and pooling stay f32.
  Precision precision = Precision::kFp32;
  // The heads removed from each layer: empty (none), or num_layers lists, each
  // ascending, in [0, num_heads), leaving at least one head. A removed head is not
  // computed and its weights are dropped at load (ModelSpec::pruned_heads).
  std::vector<std::vector<int64_t>> pruned_heads;
  // Of those, the heads the checkpoint itself lacks, as Hugging Face's prune_heads()
  // saves a model: its Q, K and V rows and output columns hold only the other heads, in
  // order. Empty (none), or num_layers lists, each within that layer's pruned_heads.
  std::vector<std::vector<int64_t>> checkpoint_pruned_heads;

  // The heads removed from `layer` (empty when none are).
  absl::Span<const int64_t> PrunedHeads(int64_t layer) const;
  // Layer `layer`'s attention as the core's ModelSpec: d_model, the heads, their
  // key/value heads and width, qk_norm, the precision and the layer's pruned heads.
  ModelSpec AttentionSpec(int64_t layer) const;
  // Whether the embeddings are normalized before the first block: post-LN, and
  // ModernBERT's pre-LN.
  bool embedding_norm() const;
  // InvalidArgument naming the first field out of its range.
  absl::Status Validate() const;
};

// One block's weights, in PyTorch's nn.Linear layout ([out, in], row-major).
struct EncoderLayerWeights {
  // Q, K and V fused as nn.MultiheadAttention's in_proj ([3d, d]; grouped-query or
  // heads of their own width: AttentionWeights' layout for AttentionSpec), and the
  // output projection.
  AttentionWeights attention;
  // Post-LN: the norm after the attention's residual add, and `output_norm_*` the one
  // after the feed-forward's. Pre-LN: the norms before the attention and before the
  // feed-forward network (ModernBERT's first layer has no attention norm: both empty).
  std::vector<float> attention_norm_scale, attention_norm_shift;  // [d]
  std::vector<float> ffn_in_weight;   // [ffn_dim, d]; gated: [2 ffn_dim, d]
  std::vector<float> ffn_in_bias;     // [ffn_dim]; gated: [2 ffn_dim]
  std::vector<float> ffn_out_weight;  // [d, ffn_dim]
  std::vector<float> ffn_out_bias;    // [d]
  std::vector<float> output_norm_scale, output_norm_shift;  // [d]
};

struct EncoderWeights {
  // [vocab_size, d]; read-only, shared by every copy of the weights (the instances of
  // a model): a big vocabulary's table (XLM-R's 250,002 rows) is most of a small model.
  // Exactly one of the two is set: f32 for fp32 models, bf16 bits for bf16 and int8
  // ones (half the memory; LoadBertWeights reads it so).
  std::shared_ptr<const std::vector<float>> word_embeddings;
  std::shared_ptr<const std::vector<uint16_t>> word_embeddings_bf16;
  std::vector<float> position_embeddings;    // [max_positions, d]; empty without them
  std::vector<float> token_type_embeddings;  // [type_vocab_size, d]
  // Post-LN and ModernBERT ([d]; empty for the other pre-LN encoders).
  std::vector<float> embedding_norm_scale, embedding_norm_shift;
  std::vector<EncoderLayerWeights> layers;  // num_layers
  // MPNet: [relative_attention_buckets, num_heads], shared by every layer (empty for
  // the other families).
  std::vector<float> relative_attention_bias;
  // Pre-LN only: the norm after the last block ([d]; empty for post-LN).
  std::vector<float> final_norm_scale, final_norm_shift;
  // The classification head (empty without one): BERT's pooler, a dense layer + tanh
  // over [CLS] ([d, d], [d]), and the classifier ([num_labels, d], [num_labels]).
  std::vector<float> pooler_weight, pooler_bias;
  std::vector<float> classifier_weight, classifier_bias;
  // One per EncoderSpec::dense: [out_features, in_features] and [out_features] (zeros for
  // a layer without bias).
  struct DenseWeights {
    std::vector<float> weight;
    std::vector<float> bias;
  };
  std::vector<DenseWeights> dense;
  // The SPLADE head (empty without one): the transform [d, d] and [d], its norm [d],
  // the decoder [vocab_size, d] (the word embeddings' own vector when tied, in f32 at
  // every precision) and its bias [vocab_size].
  std::vector<float> mlm_transform_weight, mlm_transform_bias;
  std::vector<float> mlm_norm_scale, mlm_norm_shift;
  std::shared_ptr<const std::vector<float>> mlm_decoder;
  std::vector<float> mlm_decoder_bias;

  // InvalidArgument naming the first tensor whose size does not fit `spec`.
  absl::Status CheckShapes(const EncoderSpec& spec) const;
};

// The weights of a Hugging Face checkpoint of spec.family, by the names its row of the
// family table gives (core/encoder/encoder_family.h: BERT's
// `embeddings.word_embeddings.weight`, `encoder.layer.N.attention.self.query.weight`,
// ...; Megatron-BERT's for a pre-LN BERT spec), each behind `prefix` (for example "bert."
// for a checkpoint saved from a task model: EncoderPrefix finds it), read by the row's
// block layout. Every tensor under the prefix is used, or named in the error:
// InvalidArgument for a missing or unexpected tensor or a wrong shape, and for what the
// row cannot carry (a classification head, pruned heads outside BERT's layout) before any
// tensor is read. F32 or BF16 tensors (BF16 widened); the word-embedding table is kept in
// bf16 for a bf16 or int8 spec (rounded to nearest even from F32), f32 otherwise. Biases
// are required in BERT's layout and zeros where the other layouts' checkpoints leave them
// out; RMSNorms have no shift. A layer with checkpoint_pruned_heads has the smaller
// attention matrices prune_heads() saves ([kept * head_dim, d] Q/K/V, [d, kept *
// head_dim] output); they are widened to the full layout, the removed heads' rows and
// columns zero. The position table is read as [position_offset + max_positions, d] and
// its first position_offset rows dropped (RoBERTa's and MPNet's padding index). The
// token-type table is a zero one where the family has none (or, GTE's, where the file has
// none). With a classification head (spec.num_labels > 0): BERT's pooler under the prefix
// and `classifier.*` outside it, or RoBERTa's `classifier.dense.*` and
// `classifier.out_proj.*` outside it; without one, BertModel's pooler, which no served
// pooling uses, is accepted and ignored, as is `embeddings.position_ids` (a buffer).
// A SPLADE head (spec.sparse) is read outside the prefix by the row's masked-LM names
// (BERT's `cls.predictions.*`, DistilBERT's `vocab_transform`, `vocab_layer_norm`,
// `vocab_projector`), its decoder tied to the word embeddings when the checkpoint has
// none of its own. `weights.dense` (sentence-transformers' Dense modules, in their own
// files) is left for the caller to fill.
absl::StatusOr<EncoderWeights> LoadBertWeights(const SafetensorsFile& file,
                                               const EncoderSpec& spec,
                                               absl::string_view prefix = "");

// The prefix `file` keeps the encoder of `spec`'s family behind: "" when its word
// embeddings are at the top, the family's task prefix ("bert.", "roberta.", ...) when
// they are there only (a checkpoint saved from a task model such as
// BertForSequenceClassification), else "" (LoadBertWeights then names what is missing).
std::string EncoderPrefix(const SafetensorsFile& file, const EncoderSpec& spec);

// MPNet's bucket (in [0, 32)) for a key `offset` = j - i tokens from its query, as
// transformers' MPNetEncoder.relative_position_bucket computes it (in float32, as
// torch does): 16 buckets per direction (keys after the query in the upper 16), exact
// below 8 tokens, logarithmic up to 128, the last bucket beyond. Constant for
// |offset| >= kMpnetBucketRadius.
int64_t MpnetRelativeBucket(int64_t offset);
inline constexpr int64_t kMpnetBucketRadius = 128;

// A batch of tokenized sequences, packed: sequence i is the next lengths[i] ids.
struct EncoderBatch {
  absl::Span<const int64_t> token_ids;    // [sum(lengths)], each in [0, vocab_size)
  absl::Span<const int64_t> token_types;  // empty (all 0) or [sum(lengths)]
  absl::Span<const int64_t> lengths;      // each in [1, max_positions]
  // Instead of token_ids (then empty, as token_types): hidden states
  // [sum(lengths), d_model] that enter the first block as they are, skipping the
  // embeddings and their LayerNorm.
  absl::Span<const float> hidden_states;
  // Empty, or one factor in [0, 1] per layer and head, [num_layers * num_heads] layer
  // by layer: each layer's attention head_mask (AttentionOptions::head_mask: 0 leaves
  // the head out of the products, a fraction scales its output, as transformers'
  // head_mask scales its attention weights). Applies to every sequence of the batch.
  absl::Span<const float> head_mask;
};

// One head's attention over a batch: each figure averaged over every query token of
// every sequence (weights p_ij of query i over keys j of its sequence, 0-based).
struct EncoderHeadStatistic {
  double mean_entropy = 0.0;     // -sum_j p_ij ln p_ij, nats: ln(L) when uniform
  double mean_max_weight = 0.0;  // max_j p_ij
  double mean_distance = 0.0;    // sum_j p_ij |i - j|, in tokens
  double share_first = 0.0;      // p_i0: the first token ([CLS] of a text)
  double share_last = 0.0;       // p_i(L-1): the last token ([SEP] of a text)
  double share_self = 0.0;       // p_ii
  double share_previous = 0.0;   // p_i(i-1); 0 for the first token
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ENCODER_ENCODER_SPEC_H_
