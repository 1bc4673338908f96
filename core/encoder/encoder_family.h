// The family table: one row per encoder family attnserve serves (llama.cpp's llm_arch
// with its tensor-name maps is the model). A row says everything that differs between
// families: the config.json model_types it answers to, its number in attention.proto,
// the config keys and their defaults, the checkpoint's prefix and tensor names, the
// block layout, the options it sets on EncoderSpec and the heads it can carry. The
// config reader (server/models/encoder_config.cc), the spec checks, the loader and the
// heads read the row; nothing else branches on the family.
//
// Adding a family: a row here (and its value in attention.proto's EncoderConfig.Family),
// a golden made by a script in tests/tools, a test. New math is an option of the core
// (EncoderSpec) with its fp64 reference first; a new block layout a loader beside the
// others in transformer_encoder.cc.
#ifndef ATTNSERVE_CORE_ENCODER_ENCODER_FAMILY_H_
#define ATTNSERVE_CORE_ENCODER_ENCODER_FAMILY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/encoder/encoder_spec.h"

namespace attnserve::core {

// Where a family's checkpoint keeps each tensor: names under the prefix, a layer's after
// `layer` + N + "."; each weight's name is followed by "weight" (and "bias"). Empty: the
// family has no such tensor.
struct TensorNames {
  // BertModel's [CLS] pooler (a dense layer + tanh), which checkpoints carry whether or
  // not a head reads it, and a buffer that is no weight: both accepted unread.
  const char* pooler = "pooler.dense.";
  const char* position_ids = "embeddings.position_ids";
  const char* word_embeddings = "";
  const char* position_embeddings = "";  // a learned absolute table
  const char* token_types = "";
  const char* embedding_norm = "";  // post-LN, and ModernBERT's
  const char* final_norm = "";      // pre-LN
  const char* relative_attention_bias = "";
  const char* layer = "";
  // Q, K and V apart, or `qkv` fused ([3d, d]: Q's rows, K's, V's).
  const char* query = "";
  const char* key = "";
  const char* value = "";
  const char* qkv = "";
  const char* query_norm = "";  // per-head RMSNorms of Q and K (EncoderSpec::qk_norm)
  const char* key_norm = "";
  const char* attention_out = "";
  const char* attention_norm = "";
  // The feed-forward's first product: one tensor (`ffn_in`; gated: both halves), or a
  // gated one's two (`ffn_gate`, activated, and `ffn_up`).
  const char* ffn_in = "";
  const char* ffn_gate = "";
  const char* ffn_up = "";
  const char* ffn_out = "";
  const char* output_norm = "";
};

// How the blocks sit in the checkpoint, that is which loader reads them.
enum class BlockLayout {
  // BERT's: Q, K and V apart, every tensor with its bias, LayerNorms; pruned heads
  // (checkpoint_pruned_heads) widened; post-LN or pre-LN by the row's names.
  kBert,
  // Q, K and V fused, norms and biases where the checkpoint has them, a gated
  // feed-forward; ModernBERT's first block has no attention norm.
  kFusedQkv,
  // Q, K and V apart (grouped-query), RMSNorms without shifts, a gated feed-forward of
  // gate and up (Qwen's).
  kDecoder,
};

// The classification head a task checkpoint (*ForSequenceClassification) carries.
struct ClassifierHead {
  // BERT's: the pooler (TensorNames::pooler under the prefix, dense + tanh over [CLS])
  // and `classifier.` outside it. RoBERTa's: `dense` (classifier.dense.) + activation,
  // then `classifier` (classifier.out_proj.), both outside the prefix. Empty
  // `classifier`: no head.
  bool pooler = false;
  const char* dense = "";
  const char* classifier = "";
  // The activation after pooler/dense: tanh, or GELU (erf; ELECTRA's).
  bool gelu = false;
};

// The masked-LM head SPLADE reads, outside the prefix (empty `transform`: none).
struct MaskedLmHead {
  const char* transform = "";
  const char* norm = "";
  const char* decoder = "";
  // Where the decoder's bias lives when not at decoder + "bias" (BERT's
  // cls.predictions.bias); empty: only there.
  const char* decoder_bias = "";
};

struct EncoderFamily {
  // Identity.
  EncoderSpec::Family id;
  const char* name;  // in messages: "BERT"
  int proto_value;   // attention.proto's EncoderConfig.Family number (FAMILY_*)

  // config.json.
  // The model_types it answers to, each with its norm placement (Megatron-BERT is BERT's
  // pre-LN variant). The first is the family's own.
  struct ModelType {
    const char* name;
    EncoderSpec::NormPlacement placement;
  };
  std::vector<ModelType> model_types;
  // Variants differ in defaults only config.json's model_type tells apart (Qwen2 and
  // Qwen3, the Hub's GTE and transformers'): a config.json without one is refused.
  bool model_type_required = false;
  // The keys of the sizes, and transformers' defaults for a key config.json leaves out.
  const char* hidden_key = "hidden_size";
  const char* heads_key = "num_attention_heads";
  const char* layers_key = "num_hidden_layers";
  const char* ffn_key = "intermediate_size";
  const char* activation_key = "hidden_act";
  const char* eps_key = "layer_norm_eps";
  int64_t default_layers = 12;
  int64_t default_vocab = 30522;
  int64_t default_max_positions = 512;
  double default_eps = 1e-12;
  const char* default_activation = "gelu";
  // Token types: a table of type_vocab_size rows (default `default_types`), optional
  // (type_vocab_size 0 or no table: one type of zeros), or none (one type of zeros).
  enum class TokenTypes { kTable, kOptional, kNone };
  TokenTypes token_types = TokenTypes::kTable;
  int64_t default_types = 2;
  // config.json's position_embedding_type it serves.
  const char* position_embedding_type = "absolute";
  // Positions start after the padding index: pad_token_id + 1 (RoBERTa's, pad_token_id
  // default 1), or a fixed offset whatever pad_token_id says (MPNet's 2); 0: at 0.
  bool positions_after_pad_token = false;
  int64_t fixed_position_offset = 0;
  // ELECTRA: embedding_size must equal hidden_size (embeddings_project is not served).
  bool embedding_size_is_hidden = false;

  // The encoder it is (EncoderSpec's options this row sets and requires).
  // The norm placements it comes in (from model_types).
  EncoderSpec::Norm norm = EncoderSpec::Norm::kLayerNorm;
  bool causal = false;
  // Rotary positions (layer_attention from config.json, no position table) and a gated
  // feed-forward.
  bool rotary = false;
  // MPNet's relative position bias: its buckets (0: none).
  int64_t relative_attention_buckets = 0;
  // SiLU served as the activation (in a gated feed-forward, SwiGLU).
  bool silu = false;

  // The checkpoint.
  // The base model's name a task model saves the encoder behind ("bert."); empty: the
  // family's task models keep it at the top.
  const char* task_prefix = "";
  BlockLayout layout = BlockLayout::kBert;
  TensorNames names;
  // Names of the pre-LN variant (Megatron-BERT's), where the family has one.
  std::optional<TensorNames> pre_ln_names;
  // A fused gated feed-forward (`names.ffn_in`) stores [up; gate] (GTE) rather than
  // [gate (activated); up].
  bool ffn_in_up_first = false;
  // ModernBERT: the first block reads the normed embeddings without an attention norm,
  // and the embeddings are normed in a pre-LN encoder.
  bool first_block_without_attention_norm = false;

  // The heads it can carry.
  ClassifierHead classifier;
  MaskedLmHead masked_lm;

  // Which tensor names a checkpoint of `placement` uses.
  const TensorNames& NamesFor(EncoderSpec::NormPlacement placement) const {
    return placement == EncoderSpec::NormPlacement::kPre && pre_ln_names ? *pre_ln_names
                                                                         : names;
  }
  bool has_classifier() const { return *classifier.classifier != '\0'; }
  bool has_masked_lm() const { return *masked_lm.transform != '\0'; }
  // Whether a spec of this family may be `placement`.
  bool Allows(EncoderSpec::NormPlacement placement) const;
};

// Every row, in attention.proto's order.
absl::Span<const EncoderFamily> EncoderFamilies();
// BERT's row: the family of a config.json without a model_type.
const EncoderFamily& DefaultFamily();
// The row of `id` (every EncoderSpec::Family has one).
const EncoderFamily& FamilyOf(EncoderSpec::Family id);
// The row answering to config.json's `model_type`, or nullptr.
const EncoderFamily* FamilyOfModelType(absl::string_view model_type);
// The row of attention.proto's `proto_value`, or nullptr (FAMILY_UNSPECIFIED, unknown).
const EncoderFamily* FamilyOfProtoValue(int proto_value);
// Every served model_type quoted, in table order: "\"bert\", \"megatron-bert\", ...".
std::string ServedModelTypes();
// The names of the families with a row property, joined: "BERT and DistilBERT".
std::string FamilyNames(bool (*has)(const EncoderFamily&));

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ENCODER_ENCODER_FAMILY_H_
