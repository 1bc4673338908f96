#include "core/encoder/encoder_family.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve::core {

namespace {

using Family = EncoderSpec::Family;
using Placement = EncoderSpec::NormPlacement;
constexpr Placement kPost = Placement::kPost;
constexpr Placement kPre = Placement::kPre;

// BertModel's names (RoBERTa, ELECTRA and the Hub's GTE embeddings share them).
TensorNames BertNames() {
  TensorNames names;
  names.word_embeddings = "embeddings.word_embeddings.";
  names.position_embeddings = "embeddings.position_embeddings.";
  names.token_types = "embeddings.token_type_embeddings.";
  names.embedding_norm = "embeddings.LayerNorm.";
  names.layer = "encoder.layer.";
  names.query = "attention.self.query.";
  names.key = "attention.self.key.";
  names.value = "attention.self.value.";
  names.attention_out = "attention.output.dense.";
  names.attention_norm = "attention.output.LayerNorm.";
  names.ffn_in = "intermediate.dense.";
  names.ffn_out = "output.dense.";
  names.output_norm = "output.LayerNorm.";
  return names;
}

// RobertaClassificationHead: dense + tanh over <s>, then out_proj; the same computation
// as BERT's pooler and classifier under other names (MPNet's is the same; ELECTRA's
// takes GELU for the tanh).
ClassifierHead RobertaHead(bool gelu = false) {
  ClassifierHead head;
  head.dense = "classifier.dense.";
  head.classifier = "classifier.out_proj.";
  head.gelu = gelu;
  return head;
}

EncoderFamily Bert() {
  EncoderFamily row{Family::kBert, "BERT", 1};
  row.model_types = {{"bert", kPost}, {"megatron-bert", kPre}};
  row.task_prefix = "bert.";
  row.names = BertNames();
  TensorNames megatron = BertNames();  // pre-LN: a norm inside each sublayer, one after
  megatron.embedding_norm = "";
  megatron.final_norm = "encoder.ln.";
  megatron.attention_norm = "attention.ln.";
  megatron.output_norm = "ln.";
  row.pre_ln_names = megatron;
  row.classifier.pooler = true;
  row.classifier.classifier = "classifier.";
  row.masked_lm = {"cls.predictions.transform.dense.",
                   "cls.predictions.transform.LayerNorm.", "cls.predictions.decoder.",
                   "cls.predictions.bias"};
  return row;
}

EncoderFamily DistilBert() {
  EncoderFamily row{Family::kDistilBert, "DistilBERT", 2};
  row.model_types = {{"distilbert", kPost}};
  row.hidden_key = "dim";
  row.heads_key = "n_heads";
  row.layers_key = "n_layers";
  row.ffn_key = "hidden_dim";
  row.activation_key = "activation";
  row.default_layers = 6;
  row.token_types = EncoderFamily::TokenTypes::kNone;
  row.task_prefix = "distilbert.";
  TensorNames& names = row.names;
  names.word_embeddings = "embeddings.word_embeddings.";
  names.position_embeddings = "embeddings.position_embeddings.";
  names.embedding_norm = "embeddings.LayerNorm.";
  names.layer = "transformer.layer.";
  names.query = "attention.q_lin.";
  names.key = "attention.k_lin.";
  names.value = "attention.v_lin.";
  names.attention_out = "attention.out_lin.";
  names.attention_norm = "sa_layer_norm.";
  names.ffn_in = "ffn.lin1.";
  names.ffn_out = "ffn.lin2.";
  names.output_norm = "output_layer_norm.";
  row.masked_lm = {"vocab_transform.", "vocab_layer_norm.", "vocab_projector.", ""};
  return row;
}

EncoderFamily Roberta() {
  EncoderFamily row{Family::kRoberta, "RoBERTa", 3};
  row.model_types = {{"roberta", kPost}, {"xlm-roberta", kPost}, {"camembert", kPost}};
  row.positions_after_pad_token = true;
  row.task_prefix = "roberta.";
  row.names = BertNames();
  row.classifier = RobertaHead();
  return row;
}

EncoderFamily Electra() {
  EncoderFamily row{Family::kElectra, "ELECTRA", 4};
  row.model_types = {{"electra", kPost}};
  row.embedding_size_is_hidden = true;
  row.task_prefix = "electra.";
  row.names = BertNames();
  row.classifier = RobertaHead(/*gelu=*/true);
  return row;
}

EncoderFamily Mpnet() {
  EncoderFamily row{Family::kMpnet, "MPNet", 5};
  row.model_types = {{"mpnet", kPost}};
  row.default_vocab = 30527;
  row.token_types = EncoderFamily::TokenTypes::kNone;
  // MPNetEmbeddings numbers positions after its padding index, 1 whatever pad_token_id
  // says.
  row.fixed_position_offset = 2;
  row.relative_attention_buckets = EncoderSpec::kMpnetBuckets;
  row.task_prefix = "mpnet.";
  TensorNames& names = row.names;
  names = BertNames();
  names.token_types = "";
  names.relative_attention_bias = "encoder.relative_attention_bias.";
  names.query = "attention.attn.q.";
  names.key = "attention.attn.k.";
  names.value = "attention.attn.v.";
  names.attention_out = "attention.attn.o.";
  names.attention_norm = "attention.LayerNorm.";
  row.classifier = RobertaHead();
  return row;
}

EncoderFamily ModernBert() {
  EncoderFamily row{Family::kModernBert, "ModernBERT", 6};
  row.model_types = {{"modernbert", kPre}};
  row.activation_key = "hidden_activation";
  row.eps_key = "norm_eps";
  row.default_layers = 22;
  row.default_vocab = 50368;
  row.default_max_positions = 8192;
  row.default_eps = 1e-5;
  row.token_types = EncoderFamily::TokenTypes::kNone;
  row.rotary = true;
  row.task_prefix = "model.";
  row.layout = BlockLayout::kFusedQkv;
  row.first_block_without_attention_norm = true;
  TensorNames& names = row.names;
  names.word_embeddings = "embeddings.tok_embeddings.";
  names.embedding_norm = "embeddings.norm.";
  names.final_norm = "final_norm.";
  names.layer = "layers.";
  names.qkv = "attn.Wqkv.";
  names.attention_out = "attn.Wo.";
  names.attention_norm = "attn_norm.";
  names.ffn_in = "mlp.Wi.";  // [input (activated); gate]
  names.ffn_out = "mlp.Wo.";
  names.output_norm = "mlp_norm.";
  return row;
}

// As transformers saves NomicBertModel (the Hub's checkpoints carry the same names).
EncoderFamily NomicBert() {
  EncoderFamily row{Family::kNomicBert, "NomicBERT", 7};
  row.model_types = {{"nomic_bert", kPost}};
  row.default_max_positions = 2048;
  row.rotary = true;
  row.silu = true;
  row.task_prefix = "bert.";  // NomicBertForPreTraining's
  row.layout = BlockLayout::kFusedQkv;
  TensorNames& names = row.names;
  names.word_embeddings = "embeddings.word_embeddings.";
  names.token_types = "embeddings.token_type_embeddings.";
  names.embedding_norm = "emb_ln.";
  names.layer = "encoder.layers.";
  names.qkv = "attn.Wqkv.";
  names.attention_out = "attn.out_proj.";
  names.attention_norm = "norm1.";
  names.ffn_gate = "mlp.fc12.";
  names.ffn_up = "mlp.fc11.";
  names.ffn_out = "mlp.fc2.";
  names.output_norm = "norm2.";
  return row;
}

EncoderFamily Qwen() {
  EncoderFamily row{Family::kQwen, "Qwen", 8};
  row.model_types = {{"qwen2", kPre}, {"qwen3", kPre}};
  row.model_type_required = true;
  row.eps_key = "rms_norm_eps";
  row.default_layers = 28;
  row.default_vocab = 151936;
  row.default_max_positions = 32768;
  row.default_eps = 1e-6;
  row.default_activation = "silu";  // Qwen2Config's and Qwen3Config's
  row.token_types = EncoderFamily::TokenTypes::kNone;
  row.norm = EncoderSpec::Norm::kRms;
  row.causal = true;
  row.rotary = true;
  row.silu = true;
  row.task_prefix = "model.";
  row.layout = BlockLayout::kDecoder;
  TensorNames& names = row.names;
  names.word_embeddings = "embed_tokens.";
  names.final_norm = "norm.";
  names.layer = "layers.";
  names.query = "self_attn.q_proj.";
  names.key = "self_attn.k_proj.";
  names.value = "self_attn.v_proj.";
  names.query_norm = "self_attn.q_norm.";
  names.key_norm = "self_attn.k_norm.";
  names.attention_out = "self_attn.o_proj.";
  names.attention_norm = "input_layernorm.";
  names.ffn_gate = "mlp.gate_proj.";
  names.ffn_up = "mlp.up_proj.";
  names.ffn_out = "mlp.down_proj.";
  names.output_norm = "post_attention_layernorm.";
  return row;
}

// Alibaba's gte-base-en-v1.5 and gte-multilingual-base: model_type "new" on the Hub,
// "gte" as transformers saves it, with the same tensor names.
EncoderFamily Gte() {
  EncoderFamily row{Family::kGte, "GTE", 9};
  row.model_types = {{"gte", kPost}, {"new", kPost}};
  row.model_type_required = true;
  row.default_vocab = 250048;
  row.default_max_positions = 8192;
  row.token_types = EncoderFamily::TokenTypes::kOptional;
  row.default_types = 1;
  row.position_embedding_type = "rope";
  row.rotary = true;
  row.task_prefix = "new.";
  row.layout = BlockLayout::kFusedQkv;
  row.ffn_in_up_first = true;
  TensorNames& names = row.names;
  names.word_embeddings = "embeddings.word_embeddings.";
  names.token_types = "embeddings.token_type_embeddings.";
  names.embedding_norm = "embeddings.LayerNorm.";
  names.layer = "encoder.layer.";
  names.qkv = "attention.qkv_proj.";
  names.attention_out = "attention.o_proj.";
  names.attention_norm = "attn_ln.";
  names.ffn_in = "mlp.up_gate_proj.";
  names.ffn_out = "mlp.down_proj.";
  names.output_norm = "mlp_ln.";
  return row;
}

const std::vector<EncoderFamily>& Table() {
  static const auto* const table = new std::vector<EncoderFamily>{
      Bert(),       DistilBert(), Roberta(), Electra(), Mpnet(),
      ModernBert(), NomicBert(),  Qwen(),    Gte()};
  return *table;
}

}  // namespace

bool EncoderSpec::embedding_norm() const {
  return norm_placement == NormPlacement::kPost ||
         FamilyOf(family).first_block_without_attention_norm;
}

bool EncoderFamily::Allows(EncoderSpec::NormPlacement placement) const {
  for (const ModelType& type : model_types) {
    if (type.placement == placement) return true;
  }
  return false;
}

absl::Span<const EncoderFamily> EncoderFamilies() { return Table(); }

const EncoderFamily& DefaultFamily() { return Table().front(); }

const EncoderFamily& FamilyOf(EncoderSpec::Family id) {
  for (const EncoderFamily& row : Table()) {
    if (row.id == id) return row;
  }
  return Table().front();  // unreachable: encoder_family_test walks every value
}

const EncoderFamily* FamilyOfModelType(absl::string_view model_type) {
  for (const EncoderFamily& row : Table()) {
    for (const EncoderFamily::ModelType& type : row.model_types) {
      if (model_type == type.name) return &row;
    }
  }
  return nullptr;
}

const EncoderFamily* FamilyOfProtoValue(int proto_value) {
  for (const EncoderFamily& row : Table()) {
    if (row.proto_value == proto_value) return &row;
  }
  return nullptr;
}

std::string ServedModelTypes() {
  std::string served;
  for (const EncoderFamily& row : Table()) {
    for (const EncoderFamily::ModelType& type : row.model_types) {
      absl::StrAppend(&served, served.empty() ? "" : ", ", "\"", type.name, "\"");
    }
  }
  return served;
}

std::string FamilyNames(bool (*has)(const EncoderFamily&)) {
  std::vector<const char*> names;
  for (const EncoderFamily& row : Table()) {
    if (has(row)) names.push_back(row.name);
  }
  std::string joined;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&joined,
                    i == 0                  ? ""
                    : i + 1 == names.size() ? " and "
                                            : ", ",
                    names[i]);
  }
  return joined;
}

}  // namespace attnserve::core
