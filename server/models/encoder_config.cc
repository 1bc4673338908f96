#include "server/models/encoder_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/json_values.h"
#include "core/base/status_macros.h"
#include "core/encoder/encoder_family.h"
#include "core/text/unicode_text.h"
#include "nlohmann/json.hpp"

namespace attnserve::server {

namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// Deeper nesting than any of these files has is refused before parsing (the parser
// recurses).
constexpr int kMaxDepth = 32;

absl::StatusOr<Json> Parse(const std::string& text, absl::string_view file) {
  if (core::JsonNestingDepth(text, kMaxDepth) > kMaxDepth) {
    return Invalid(absl::StrCat(file, ": nested deeper than ", kMaxDepth, " levels"));
  }
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Invalid(absl::StrCat(file, ": not valid JSON"));
  return json;
}

std::string Shown(const Json& value) {
  return value.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// The integer `key` of `object` (absent: `fallback`), in [1, 2^31).
absl::StatusOr<int64_t> Count(const Json& object, const char* key, int64_t fallback,
                              absl::string_view file) {
  const auto it = object.find(key);
  if (it == object.end()) return fallback;
  if (const auto* value = it->get_ptr<const Json::number_unsigned_t*>()) {
    if (*value >= 1 && *value <= std::numeric_limits<int32_t>::max()) {
      return static_cast<int64_t>(*value);
    }
  } else if (const auto* signed_value = it->get_ptr<const Json::number_integer_t*>()) {
    if (*signed_value >= 1 && *signed_value <= std::numeric_limits<int32_t>::max()) {
      return static_cast<int64_t>(*signed_value);
    }
  }
  return Invalid(absl::StrCat(file, ": ", key, " must be an integer in [1, 2^31), got ",
                              Shown(*it)));
}

absl::StatusOr<std::string> Text(const Json& object, const char* key,
                                 absl::string_view fallback, absl::string_view file) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::string(fallback);
  if (const auto* value = it->get_ptr<const Json::string_t*>()) return *value;
  return Invalid(absl::StrCat(file, ": ", key, " must be a string, got ", Shown(*it)));
}

absl::StatusOr<bool> Flag(const Json& object, const char* key, absl::string_view file) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return false;
  if (const auto* value = it->get_ptr<const Json::boolean_t*>()) return *value;
  return Invalid(
      absl::StrCat(file, ": ", key, " must be true or false, got ", Shown(*it)));
}

// Sets `*field` from `from_file` when unset; refuses a set value that differs.
absl::Status Merge(int64_t from_file, const char* name, int64_t* field) {
  if (*field == 0) {
    *field = from_file;
  } else if (*field != from_file) {
    return Invalid(absl::StrCat(name, " is ", *field, " in config.pbtxt but ", from_file,
                                " in config.json"));
  }
  return absl::OkStatus();
}

// config.json's pruned_heads ({"layer": [heads]}, as prune_heads() records them) into
// encoder.checkpoint_pruned_heads; ranges are checked with the spec.
absl::Status ApplyPrunedHeads(const Json& json, v1::EncoderConfig* encoder) {
  const auto it = json.find("pruned_heads");
  if (it == json.end() || it->is_null() || (it->is_object() && it->empty())) {
    return absl::OkStatus();
  }
  if (!it->is_object()) {
    return Invalid(absl::StrCat(
        "config.json: pruned_heads must map layers to lists of heads, got ", Shown(*it)));
  }
  google::protobuf::RepeatedPtrField<v1::LayerHeads> read;
  for (const auto& [key, heads] : it->items()) {
    int64_t layer = 0;
    if (!absl::SimpleAtoi(key, &layer) || layer < 0 || !heads.is_array()) {
      return Invalid(absl::StrCat("config.json: pruned_heads[\"", key,
                                  "\"] must be a layer number with a list of heads, got ",
                                  Shown(heads)));
    }
    v1::LayerHeads* entry = read.Add();
    entry->set_layer(layer);
    for (const Json& head : heads) {
      // The spec checks the range.
      const std::optional<int64_t> number = core::JsonInt64(head);
      if (!number) {
        return Invalid(absl::StrCat("config.json: pruned_heads[\"", key,
                                    "\"] must list head numbers, got ", Shown(heads)));
      }
      entry->add_heads(*number);
    }
  }
  if (encoder->checkpoint_pruned_heads_size() > 0) {
    // Set in config.pbtxt too: it must say the same.
    std::string pbtxt, file;
    for (const auto& entry : encoder->checkpoint_pruned_heads()) {
      pbtxt += entry.ShortDebugString() + ";";
    }
    for (const auto& entry : read) file += entry.ShortDebugString() + ";";
    if (pbtxt != file) {
      return Invalid(absl::StrCat(
          "encoder.checkpoint_pruned_heads is {", pbtxt,
          "} in config.pbtxt but config.json's pruned_heads say {", file, "}"));
    }
  }
  *encoder->mutable_checkpoint_pruned_heads() = std::move(read);
  return absl::OkStatus();
}

// What a family's layer reader is given besides config.json.
struct LayerShape {
  absl::string_view model_type;
  int64_t layers = 0;
  int64_t d_model = 0;
  int64_t heads = 0;
};

// A finite rope_theta > 0 from `value` (`field` names it).
absl::StatusOr<double> RopeTheta(const Json& value, absl::string_view field) {
  const std::optional<double> theta = core::JsonNumber(value);
  if (!theta || !(*theta > 0.0) || !std::isfinite(*theta)) {
    return Invalid(absl::StrCat("config.json: ", field, " must be a number > 0, got ",
                                Shown(value)));
  }
  return *theta;
}

// One rope_parameters entry at `path`: rope_type "default" (the only one served) and
// its rope_theta into `theta` (left as it is when absent and not `theta_required`).
absl::Status ReadRopeParameters(const Json& entry, absl::string_view path,
                                bool theta_required, double* theta) {
  ATTN_ASSIGN_OR_RETURN(const std::string rope_type,
                        Text(entry, "rope_type", "default", "config.json"));
  if (rope_type != "default") {
    return Invalid(absl::StrCat("config.json: ", path, ".rope_type \"",
                                rope_type.substr(0, 64),
                                "\" is not served (served: default)"));
  }
  const auto value = entry.find("rope_theta");
  if (value == entry.end()) {
    if (!theta_required) return absl::OkStatus();
    return Invalid(absl::StrCat("config.json: ", path, ".rope_theta is required"));
  }
  ATTN_ASSIGN_OR_RETURN(*theta, RopeTheta(*value, absl::StrCat(path, ".rope_theta")));
  return absl::OkStatus();
}

// ModernBERT's layers: global or local (sliding-window) attention, each with its rotary
// base. transformers 5 writes layer_types and rope_parameters; earlier configs (the
// Hub's) global_attn_every_n_layers (layer n is global when n is a multiple of it),
// local_attention (the window's full width) and global_rope_theta / local_rope_theta.
absl::Status ApplyModernBertLayers(const Json& json, const LayerShape& shape,
                                   v1::EncoderConfig* encoder) {
  const int64_t layers = shape.layers;
  constexpr absl::string_view kFile = "config.json";
  ATTN_ASSIGN_OR_RETURN(const int64_t local_attention,
                        Count(json, "local_attention", 128, kFile));
  const int64_t window = local_attention / 2;
  double global_theta = 160000.0, local_theta = 10000.0;
  if (const auto it = json.find("global_rope_theta"); it != json.end()) {
    ATTN_ASSIGN_OR_RETURN(global_theta, RopeTheta(*it, "global_rope_theta"));
  }
  if (const auto it = json.find("local_rope_theta"); it != json.end() && !it->is_null()) {
    ATTN_ASSIGN_OR_RETURN(local_theta, RopeTheta(*it, "local_rope_theta"));
  }
  if (const auto it = json.find("rope_parameters"); it != json.end() && !it->is_null()) {
    for (const auto& [type, field] :
         {std::pair<const char*, double*>{"full_attention", &global_theta},
          std::pair<const char*, double*>{"sliding_attention", &local_theta}}) {
      const auto entry = it->find(type);
      if (entry == it->end()) continue;
      ATTN_RETURN_IF_ERROR(ReadRopeParameters(*entry,
                                              absl::StrCat("rope_parameters.", type),
                                              /*theta_required=*/true, field));
    }
  }
  std::vector<bool> global(static_cast<size_t>(layers));
  if (const auto it = json.find("layer_types"); it != json.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != layers) {
      return Invalid(absl::StrCat("config.json: layer_types must list the ", layers,
                                  " layers' attention types, got ", Shown(*it)));
    }
    for (size_t n = 0; n < global.size(); ++n) {
      const auto* type = (*it)[n].get_ptr<const Json::string_t*>();
      if (type == nullptr ||
          (*type != "full_attention" && *type != "sliding_attention")) {
        return Invalid(absl::StrCat("config.json: layer_types[", n,
                                    "] must be \"full_attention\" or "
                                    "\"sliding_attention\", got ",
                                    Shown((*it)[n])));
      }
      global[n] = *type == "full_attention";
    }
  } else {
    ATTN_ASSIGN_OR_RETURN(const int64_t every,
                          Count(json, "global_attn_every_n_layers", 3, kFile));
    for (size_t n = 0; n < global.size(); ++n) global[n] = n % every == 0;
  }
  for (const bool is_global : global) {
    v1::EncoderConfig::LayerAttention* layer = encoder->add_layer_attention();
    layer->set_rope_theta(is_global ? global_theta : local_theta);
    layer->set_window(is_global ? 0 : window);
  }
  return absl::OkStatus();
}

// The Hub's nomic-embed-text config.json (its own code's GPT-2-style keys) in
// transformers' NomicBertConfig keys, which the rest reads: n_embd, n_head, n_layer,
// n_inner, n_positions, layer_norm_epsilon, rotary_emb_base, activation_function
// "swiglu" (SiLU). What that code offers and transformers' NomicBertModel does not
// compute (prenorm, parallel blocks, RMSNorm, partial or scaled rotary, a causal mask)
// is refused by name. A config with transformers' keys is left as it is.
absl::Status NomicBertKeys(Json* json) {
  constexpr absl::string_view kFile = "config.json";
  if (!json->contains("n_embd")) {
    return absl::OkStatus();
  }
  for (const auto& [hub, native] :
       {std::pair<const char*, const char*>{"n_embd", "hidden_size"},
        {"n_head", "num_attention_heads"},
        {"n_layer", "num_hidden_layers"},
        {"n_inner", "intermediate_size"},
        {"n_positions", "max_position_embeddings"},
        {"layer_norm_epsilon", "layer_norm_eps"}}) {
    if (const auto it = json->find(hub); it != json->end() && !it->is_null()) {
      (*json)[native] = *it;
    }
  }
  for (const char* flag : {"prenorm", "parallel_block", "use_rms_norm", "causal"}) {
    ATTN_ASSIGN_OR_RETURN(const bool set, Flag(*json, flag, kFile));
    if (set) {
      return Invalid(absl::StrCat("config.json: ", flag, " true is not served (served: ",
                                  "NomicBertModel's post-LN blocks)"));
    }
  }
  if (const auto it = json->find("rotary_emb_fraction"); it != json->end()) {
    const std::optional<double> fraction = core::JsonNumber(*it);
    if (!fraction || *fraction != 1.0) {
      return Invalid(absl::StrCat("config.json: rotary_emb_fraction ", Shown(*it),
                                  " is not served (served: 1.0)"));
    }
  }
  for (const char* scaling : {"rotary_scaling_factor", "rotary_emb_scale_base"}) {
    if (const auto it = json->find(scaling); it != json->end() && !it->is_null()) {
      return Invalid(absl::StrCat("config.json: ", scaling, " ", Shown(*it),
                                  " is not served (served: null)"));
    }
  }
  Json rope = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  if (const auto it = json->find("rotary_emb_base"); it != json->end()) {
    rope["rope_theta"] = *it;
  }
  (*json)["rope_parameters"] = std::move(rope);
  ATTN_ASSIGN_OR_RETURN(const std::string activation,
                        Text(*json, "activation_function", "swiglu", kFile));
  if (activation != "swiglu") {
    return Invalid(absl::StrCat("config.json: activation_function \"",
                                activation.substr(0, 64),
                                "\" is not served (served: swiglu)"));
  }
  (*json)["hidden_act"] = "silu";
  return absl::OkStatus();
}

// NomicBERT's layers: every one global, with rope_parameters' rope_theta (default
// rope_type only) and the Hub's rotary_emb_interleaved.
absl::Status ApplyNomicBertLayers(const Json& json, const LayerShape& shape,
                                  v1::EncoderConfig* encoder) {
  constexpr absl::string_view kFile = "config.json";
  double theta = 1000.0;  // NomicBertConfig's default
  if (const auto it = json.find("rope_parameters"); it != json.end() && !it->is_null()) {
    ATTN_RETURN_IF_ERROR(
        ReadRopeParameters(*it, "rope_parameters", /*theta_required=*/false, &theta));
  }
  ATTN_ASSIGN_OR_RETURN(const bool interleaved,
                        Flag(json, "rotary_emb_interleaved", kFile));
  for (int64_t n = 0; n < shape.layers; ++n) {
    v1::EncoderConfig::LayerAttention* layer = encoder->add_layer_attention();
    layer->set_rope_theta(theta);
    layer->set_rotary_interleaved(interleaved);
  }
  return absl::OkStatus();
}

// Qwen2's and Qwen3's attention: every layer global (use_sliding_window, and a
// layer_types entry other than full_attention, are refused by name) with
// rope_parameters' rope_theta (transformers 5) or rope_theta (earlier configs), default
// rope_type only; the key/value heads (num_key_value_heads) and the heads' width
// (head_dim: Qwen3's, default 128; Qwen2's hidden_size / num_attention_heads); Qwen3's
// q_norm and k_norm.
absl::Status ApplyQwenLayers(const Json& json, const LayerShape& shape,
                             v1::EncoderConfig* encoder) {
  const bool qwen3 = shape.model_type != "qwen2";
  const int64_t layers = shape.layers, d = shape.d_model, heads = shape.heads;
  constexpr absl::string_view kFile = "config.json";
  if (const auto it = json.find("is_causal");
      it != json.end() && it->is_boolean() && !it->get<bool>()) {
    return Invalid(
        "config.json: is_causal false (a bidirectional Qwen) is not served (served: "
        "causal)");
  }
  ATTN_ASSIGN_OR_RETURN(const bool sliding, Flag(json, "use_sliding_window", kFile));
  if (sliding) {
    return Invalid(
        "config.json: use_sliding_window true is not served (served: every layer "
        "full_attention)");
  }
  if (const auto it = json.find("layer_types"); it != json.end() && !it->is_null()) {
    if (!it->is_array()) {
      return Invalid(
          absl::StrCat("config.json: layer_types must be a list, got ", Shown(*it)));
    }
    for (size_t n = 0; n < it->size(); ++n) {
      const auto* type = (*it)[n].get_ptr<const Json::string_t*>();
      if (type == nullptr || *type != "full_attention") {
        return Invalid(absl::StrCat("config.json: layer_types[", n, "] ", Shown((*it)[n]),
                                    " is not served (served: \"full_attention\")"));
      }
    }
  }
  if (const auto it = json.find("rope_scaling"); it != json.end() && !it->is_null()) {
    return Invalid(absl::StrCat("config.json: rope_scaling ", Shown(*it),
                                " is not served (served: null)"));
  }
  double theta = 10000.0;  // Qwen2Config's and Qwen3Config's default
  if (const auto it = json.find("rope_theta"); it != json.end() && !it->is_null()) {
    ATTN_ASSIGN_OR_RETURN(theta, RopeTheta(*it, "rope_theta"));
  }
  if (const auto it = json.find("rope_parameters"); it != json.end() && !it->is_null()) {
    ATTN_RETURN_IF_ERROR(
        ReadRopeParameters(*it, "rope_parameters", /*theta_required=*/false, &theta));
  }
  for (int64_t n = 0; n < layers; ++n) {
    encoder->add_layer_attention()->set_rope_theta(theta);
  }
  ATTN_ASSIGN_OR_RETURN(const int64_t kv_heads,
                        Count(json, "num_key_value_heads", heads, kFile));
  if (kv_heads > heads || heads % kv_heads != 0) {
    return Invalid(absl::StrCat("config.json: num_key_value_heads ", kv_heads,
                                " must divide num_attention_heads ", heads));
  }
  ATTN_ASSIGN_OR_RETURN(
      const int64_t head_dim,
      Count(json, "head_dim", qwen3 ? 128 : (heads > 0 ? d / heads : 0), kFile));
  constexpr int64_t kMaxHeadDim = 65536;
  if (head_dim > kMaxHeadDim) {
    return Invalid(absl::StrCat("config.json: head_dim must be at most ", kMaxHeadDim,
                                ", got ", head_dim));
  }
  if (encoder->num_kv_heads() != 0 || encoder->head_size() != 0 || encoder->qk_norm()) {
    return Invalid(
        "encoder.num_kv_heads, head_size and qk_norm are read from config.json; leave "
        "them unset in config.pbtxt");
  }
  encoder->set_num_kv_heads(kv_heads == heads ? 0 : kv_heads);
  encoder->set_head_size(head_dim * heads == d ? 0 : head_dim);
  encoder->set_qk_norm(qwen3);
  return absl::OkStatus();
}

// GTE's layers: every one global, with rope_parameters' rope_theta (transformers'
// "gte", default 160000) or rope_theta (the Hub's "new", default 10000) and the Hub's
// fixed NTK scaling (rope_scaling {"type": "ntk", "factor": f}); what the Hub's code
// offers beyond that (mixed NTK, another scaling, RMSNorm, log-n attention scaling,
// separate Q/K/V projections) is refused by name.
absl::Status ApplyGteLayers(const Json& json, const LayerShape& shape,
                            v1::EncoderConfig* encoder) {
  const bool hub = shape.model_type == "new";
  const int64_t layers = shape.layers;
  constexpr absl::string_view kFile = "config.json";
  double theta = hub ? 10000.0 : 160000.0;
  if (const auto it = json.find("rope_theta"); it != json.end() && !it->is_null()) {
    ATTN_ASSIGN_OR_RETURN(theta, RopeTheta(*it, "rope_theta"));
  }
  if (const auto it = json.find("rope_parameters"); it != json.end() && !it->is_null()) {
    ATTN_RETURN_IF_ERROR(
        ReadRopeParameters(*it, "rope_parameters", /*theta_required=*/false, &theta));
  }
  double ntk = 0.0;
  if (const auto it = json.find("rope_scaling"); it != json.end() && !it->is_null()) {
    const std::string type =
        it->is_object() && it->contains("type") && (*it)["type"].is_string()
            ? (*it)["type"].get<std::string>()
            : "";
    const std::optional<double> factor = it->is_object() && it->contains("factor")
                                             ? core::JsonNumber((*it)["factor"])
                                             : std::nullopt;
    const bool mixed =
        it->is_object() && it->contains("mixed_b") && !(*it)["mixed_b"].is_null();
    if (type != "ntk" || mixed || !factor || !(*factor >= 1.0) || *factor > 1024.0) {
      return Invalid(absl::StrCat(
          "config.json: rope_scaling ", Shown(*it).substr(0, 128),
          " is not served (served: null, or {\"type\": \"ntk\", \"factor\": f} with f "
          "in [1, 1024] and no mixed_b)"));
    }
    ntk = *factor;
  }
  ATTN_ASSIGN_OR_RETURN(const std::string norm,
                        Text(json, "layer_norm_type", "layer_norm", kFile));
  if (norm != "layer_norm") {
    return Invalid(absl::StrCat("config.json: layer_norm_type \"", norm.substr(0, 64),
                                "\" is not served (served: layer_norm)"));
  }
  ATTN_ASSIGN_OR_RETURN(const bool logn, Flag(json, "logn_attention_scale", kFile));
  if (logn) {
    return Invalid("config.json: logn_attention_scale true is not served");
  }
  if (const auto it = json.find("pack_qkv");
      it != json.end() && it->is_boolean() && !it->get<bool>()) {
    return Invalid(
        "config.json: pack_qkv false (separate q_proj, k_proj, v_proj) is not served "
        "(served: attention.qkv_proj)");
  }
  for (int64_t n = 0; n < layers; ++n) {
    v1::EncoderConfig::LayerAttention* layer = encoder->add_layer_attention();
    layer->set_rope_theta(theta);
    layer->set_rope_ntk_factor(ntk);
  }
  return absl::OkStatus();
}

// The config.json side of the families whose layers differ (rotary positions, windows,
// grouped-query heads): a reader of each one's keys into layer_attention (and Qwen's
// heads), and, for NomicBERT, the rewrite of the Hub's keys into transformers' first.
// Every rotary row of the family table has one (encoder_config_test walks the table).
struct FamilyConfigReader {
  core::EncoderSpec::Family family;
  absl::Status (*keys)(Json* json);  // nullptr: transformers' keys only
  absl::Status (*layers)(const Json& json, const LayerShape& shape,
                         v1::EncoderConfig* encoder);
};
constexpr FamilyConfigReader kConfigReaders[] = {
    {core::EncoderSpec::Family::kModernBert, nullptr, ApplyModernBertLayers},
    {core::EncoderSpec::Family::kNomicBert, NomicBertKeys, ApplyNomicBertLayers},
    {core::EncoderSpec::Family::kQwen, nullptr, ApplyQwenLayers},
    {core::EncoderSpec::Family::kGte, nullptr, ApplyGteLayers},
};

const FamilyConfigReader* ConfigReaderOf(core::EncoderSpec::Family family) {
  for (const FamilyConfigReader& reader : kConfigReaders) {
    if (reader.family == family) return &reader;
  }
  return nullptr;
}

// The family and norm placement config.json's model_type names (absent: what
// config.pbtxt says, else BERT's), checked against config.pbtxt's encoder.family and
// norm_placement, and set there. `model_type` is "" when config.json has none.
absl::StatusOr<const core::EncoderFamily*> ResolveFamily(absl::string_view model_type,
                                                         v1::EncoderConfig* encoder) {
  using Placement = core::EncoderSpec::NormPlacement;
  const core::EncoderFamily* row = core::FamilyOfModelType(model_type);
  const core::EncoderFamily* named = core::FamilyOfProtoValue(encoder->family());
  if (model_type.empty()) {
    row = named != nullptr ? named : &core::DefaultFamily();
  } else if (row == nullptr) {
    return Invalid(absl::StrCat("config.json: model_type \"", model_type,
                                "\" is not served (served: ", core::ServedModelTypes(),
                                ")"));
  } else if (named != nullptr && named != row) {
    return Invalid(absl::StrCat(
        "encoder.family is ", v1::EncoderConfig::Family_Name(encoder->family()),
        " in config.pbtxt but config.json's model_type is \"", model_type, "\""));
  }
  const v1::EncoderConfig::Family family =
      static_cast<v1::EncoderConfig::Family>(row->proto_value);
  encoder->set_family(family);
  if (model_type.empty() && row->model_type_required) {
    std::vector<std::string> names;
    for (const auto& type : row->model_types) {
      names.push_back(absl::StrCat("\"", type.name, "\""));
    }
    return Invalid(absl::StrCat("config.json: model_type is required for ",
                                v1::EncoderConfig::Family_Name(family), " (",
                                absl::StrJoin(names, " or "), ")"));
  }
  // The model_type's placement (absent: the family's own model_type's).
  Placement placement = row->model_types.front().placement;
  for (const core::EncoderFamily::ModelType& type : row->model_types) {
    if (model_type == type.name) placement = type.placement;
  }
  const auto to_proto = [](Placement value) {
    return value == Placement::kPre ? v1::EncoderConfig::NORM_PLACEMENT_PRE
                                    : v1::EncoderConfig::NORM_PLACEMENT_POST;
  };
  const v1::EncoderConfig::NormPlacement pbtxt = encoder->norm_placement();
  if (pbtxt != v1::EncoderConfig::NORM_PLACEMENT_UNSPECIFIED) {
    const Placement asked = pbtxt == v1::EncoderConfig::NORM_PLACEMENT_PRE
                                ? Placement::kPre
                                : Placement::kPost;
    if (model_type.empty()) {
      placement = asked;  // no model_type to check it against
    } else if (asked != placement) {
      return Invalid(absl::StrCat(
          "encoder.norm_placement is ", v1::EncoderConfig::NormPlacement_Name(pbtxt),
          " in config.pbtxt but config.json's model_type \"", model_type, "\" has ",
          v1::EncoderConfig::NormPlacement_Name(to_proto(placement))));
    }
  }
  if (!row->Allows(placement)) {
    return Invalid(absl::StrCat(
        "encoder.norm_placement: ", v1::EncoderConfig::Family_Name(family),
        "'s blocks are ", row->Allows(Placement::kPre) ? "pre-LN" : "post-LN"));
  }
  encoder->set_norm_placement(to_proto(placement));
  return row;
}

// RoBERTa's and MPNet's positions start after the padding index: the rows up to it are
// never used (514 rows serve 512 tokens). Sets encoder.position_offset and takes it
// from `*positions`.
absl::Status ApplyPositionOffset(const Json& json, const core::EncoderFamily& row,
                                 int64_t* positions, v1::EncoderConfig* encoder) {
  int64_t offset = row.fixed_position_offset;
  int64_t padding = offset - 1;
  if (row.positions_after_pad_token) {
    padding = 1;
    if (const auto it = json.find("pad_token_id"); it != json.end()) {
      const std::optional<int64_t> value = core::JsonInt64(*it);
      if (!value || *value < 0 || *value >= (int64_t{1} << 20)) {
        return Invalid(absl::StrCat(
            "config.json: pad_token_id must be an integer in [0, 2^20), got ",
            Shown(*it)));
      }
      padding = *value;
    }
    offset = padding + 1;
  }
  if (offset > 0 && *positions <= offset) {
    return Invalid(absl::StrCat(
        "config.json: max_position_embeddings ", *positions, " leaves no position after ",
        row.positions_after_pad_token
            ? absl::StrCat("pad_token_id ", padding, " (", row.name,
                           "'s positions start at pad_token_id + 1)")
            : absl::StrCat(row.name, "'s padding index ", padding)));
  }
  *positions -= offset;
  encoder->set_position_offset(offset);
  return absl::OkStatus();
}

// What config.json says of the row's options that only some families have: MPNet's
// relative position buckets, ELECTRA's embedding size, the positions' type.
absl::Status CheckFamilyKeys(const Json& json, const core::EncoderFamily& row) {
  constexpr absl::string_view kFile = "config.json";
  ATTN_ASSIGN_OR_RETURN(
      const std::string positions,
      Text(json, "position_embedding_type", row.position_embedding_type, kFile));
  if (positions != row.position_embedding_type) {
    return Invalid(absl::StrCat("config.json: position_embedding_type \"", positions,
                                "\" is not served (served: \"",
                                row.position_embedding_type, "\")"));
  }
  if (row.relative_attention_buckets > 0) {
    // MPNetEncoder buckets offsets into 32 (its relative_position_bucket's default,
    // whatever the config says): a table of another size would be read differently.
    ATTN_ASSIGN_OR_RETURN(const int64_t buckets,
                          Count(json, "relative_attention_num_buckets",
                                row.relative_attention_buckets, kFile));
    if (buckets != row.relative_attention_buckets) {
      return Invalid(absl::StrCat("config.json: relative_attention_num_buckets ", buckets,
                                  " is not served (", row.name, " buckets offsets into ",
                                  row.relative_attention_buckets,
                                  " whatever the table holds)"));
    }
  }
  if (row.embedding_size_is_hidden) {
    ATTN_ASSIGN_OR_RETURN(const int64_t hidden, Count(json, row.hidden_key, 768, kFile));
    ATTN_ASSIGN_OR_RETURN(const int64_t embedding,
                          Count(json, "embedding_size", hidden, kFile));
    if (embedding != hidden) {
      return Invalid(absl::StrCat(
          "config.json: embedding_size ", embedding, " differs from hidden_size ", hidden,
          ": ", row.name,
          "'s embeddings_project (a generator-sized embedding) is not served"));
    }
  }
  ATTN_ASSIGN_OR_RETURN(const bool decoder, Flag(json, "is_decoder", kFile));
  ATTN_ASSIGN_OR_RETURN(const bool cross, Flag(json, "add_cross_attention", kFile));
  if (decoder || cross) {
    return Invalid(
        "config.json: is_decoder / add_cross_attention: decoders are not "
        "served, only encoders");
  }
  return absl::OkStatus();
}

// The feed-forward's activation and the norms' epsilon, by the row's keys and defaults,
// where config.pbtxt leaves them unset.
absl::Status ApplyActivationAndEps(const Json& json, const core::EncoderFamily& row,
                                   v1::EncoderConfig* encoder) {
  constexpr absl::string_view kFile = "config.json";
  if (encoder->activation() == v1::EncoderConfig::ACTIVATION_UNSPECIFIED) {
    ATTN_ASSIGN_OR_RETURN(const std::string act,
                          Text(json, row.activation_key, row.default_activation, kFile));
    if (act == "gelu") {
      encoder->set_activation(v1::EncoderConfig::ACTIVATION_GELU);
    } else if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
      encoder->set_activation(v1::EncoderConfig::ACTIVATION_GELU_TANH);
    } else if (act == "relu") {
      encoder->set_activation(v1::EncoderConfig::ACTIVATION_RELU);
    } else if ((act == "silu" || act == "swish") && row.silu) {
      // SiLU in a gated feed-forward (SwiGLU) only: where the goldens check it.
      encoder->set_activation(v1::EncoderConfig::ACTIVATION_SILU);
    } else {
      return Invalid(absl::StrCat(
          "config.json: ", row.activation_key, " \"", act,
          "\" is not served (served: gelu, gelu_new, gelu_pytorch_tanh, relu; silu in ",
          core::FamilyNames([](const core::EncoderFamily& f) { return f.silu; }),
          "'s SwiGLU)"));
    }
  }
  if (encoder->layer_norm_eps() == 0.0f) {
    const auto it = json.find(row.eps_key);
    double eps = row.default_eps;
    if (it != json.end()) {
      const std::optional<double> number = core::JsonNumber(*it);
      if (!number || !(*number > 0.0) || *number > 1.0) {
        return Invalid(absl::StrCat("config.json: ", row.eps_key,
                                    " must be a number in (0, 1], got ", Shown(*it)));
      }
      eps = *number;
    }
    encoder->set_layer_norm_eps(static_cast<float>(eps));
  }
  return absl::OkStatus();
}

// The sizes by the row's keys and defaults, merged with what config.pbtxt sets.
absl::Status ApplySizes(const Json& json, const core::EncoderFamily& row,
                        const LayerShape& shape, int64_t positions,
                        v1::ModelConfig* config) {
  constexpr absl::string_view kFile = "config.json";
  v1::EncoderConfig* encoder = config->mutable_encoder();
  ATTN_ASSIGN_OR_RETURN(const int64_t ffn, Count(json, row.ffn_key, 3072, kFile));
  ATTN_ASSIGN_OR_RETURN(const int64_t vocab,
                        Count(json, "vocab_size", row.default_vocab, kFile));
  int64_t types = 1;
  if (row.token_types == core::EncoderFamily::TokenTypes::kOptional &&
      json.contains("type_vocab_size") && json["type_vocab_size"] == 0) {
    // gte-base-en-v1.5: no token type table, served as one type of zeros.
  } else if (row.token_types != core::EncoderFamily::TokenTypes::kNone) {
    ATTN_ASSIGN_OR_RETURN(types,
                          Count(json, "type_vocab_size", row.default_types, kFile));
  }
  int64_t value = config->d_model();
  ATTN_RETURN_IF_ERROR(Merge(shape.d_model, "d_model", &value));
  config->set_d_model(value);
  value = config->num_heads();
  ATTN_RETURN_IF_ERROR(Merge(shape.heads, "num_heads", &value));
  config->set_num_heads(value);
  const struct {
    int64_t from_file;
    const char* name;
    int64_t (v1::EncoderConfig::*get)() const;
    void (v1::EncoderConfig::*set)(int64_t);
  } fields[] = {
      {shape.layers, "encoder.num_layers", &v1::EncoderConfig::num_layers,
       &v1::EncoderConfig::set_num_layers},
      {ffn, "encoder.ffn_dim", &v1::EncoderConfig::ffn_dim,
       &v1::EncoderConfig::set_ffn_dim},
      {positions, "encoder.max_positions", &v1::EncoderConfig::max_positions,
       &v1::EncoderConfig::set_max_positions},
      {vocab, "encoder.vocab_size", &v1::EncoderConfig::vocab_size,
       &v1::EncoderConfig::set_vocab_size},
      {types, "encoder.type_vocab_size", &v1::EncoderConfig::type_vocab_size,
       &v1::EncoderConfig::set_type_vocab_size},
  };
  for (const auto& field : fields) {
    value = (encoder->*field.get)();
    ATTN_RETURN_IF_ERROR(Merge(field.from_file, field.name, &value));
    (encoder->*field.set)(value);
  }
  return absl::OkStatus();
}

// config.json's architecture into config->encoder, by its family's row.
absl::Status ApplyArchitecture(const Json& json, v1::ModelConfig* config) {
  constexpr absl::string_view kFile = "config.json";
  if (!json.is_object()) return Invalid("config.json: must be a JSON object");
  ATTN_ASSIGN_OR_RETURN(const std::string model_type,
                        Text(json, "model_type", "", kFile));
  v1::EncoderConfig* encoder = config->mutable_encoder();
  ATTN_ASSIGN_OR_RETURN(const core::EncoderFamily* row,
                        ResolveFamily(model_type, encoder));
  ATTN_RETURN_IF_ERROR(CheckFamilyKeys(json, *row));
  LayerShape shape;
  shape.model_type = model_type;
  ATTN_ASSIGN_OR_RETURN(shape.d_model, Count(json, row->hidden_key, 768, kFile));
  ATTN_ASSIGN_OR_RETURN(shape.heads, Count(json, row->heads_key, 12, kFile));
  ATTN_ASSIGN_OR_RETURN(shape.layers,
                        Count(json, row->layers_key, row->default_layers, kFile));
  ATTN_ASSIGN_OR_RETURN(int64_t positions, Count(json, "max_position_embeddings",
                                                 row->default_max_positions, kFile));
  if (const FamilyConfigReader* reader = ConfigReaderOf(row->id)) {
    if (encoder->layer_attention_size() > 0) {
      return Invalid(
          "encoder.layer_attention is read from config.json; leave it unset in "
          "config.pbtxt");
    }
    ATTN_RETURN_IF_ERROR(reader->layers(json, shape, encoder));
  }
  ATTN_RETURN_IF_ERROR(ApplyPositionOffset(json, *row, &positions, encoder));
  ATTN_RETURN_IF_ERROR(ApplySizes(json, *row, shape, positions, config));
  ATTN_RETURN_IF_ERROR(ApplyActivationAndEps(json, *row, encoder));
  return ApplyPrunedHeads(json, encoder);
}

// Rewrites another dialect's config.json keys into transformers' (the Hub's
// nomic-embed-text), where the model_type's family has such a rewrite.
absl::Status FamilyKeys(Json* json) {
  if (!json->is_object()) return absl::OkStatus();
  const auto it = json->find("model_type");
  if (it == json->end() || !it->is_string()) return absl::OkStatus();
  const core::EncoderFamily* row = core::FamilyOfModelType(it->get<std::string>());
  if (row == nullptr) return absl::OkStatus();
  const FamilyConfigReader* reader = ConfigReaderOf(row->id);
  if (reader == nullptr || reader->keys == nullptr) return absl::OkStatus();
  return reader->keys(json);
}

// The served modules of modules.json: sentence-transformers' Transformer, Pooling, Dense
// and Normalize, by the last part of their type (sentence_transformers.models.Normalize,
// or sentence-transformers 6's sentence_transformers.base.modules.normalize.Normalize),
// and a SparseEncoder's MLMTransformer (or Transformer) with SpladePooling.
// A module of another type is refused by name (computing without it would answer other
// vectors), and so is a Dense before the Pooling, a module after Normalize, or a
// SpladePooling beside any module but the transformer.
struct Modules {
  bool normalize = false;
  std::vector<std::string> dense_folders;
  std::string splade_folder;  // SpladePooling's, or empty
};

// A module's path: one plain folder name inside the model's folder.
absl::StatusOr<std::string> ModulePath(const Json& module, size_t i,
                                       absl::string_view type) {
  ATTN_ASSIGN_OR_RETURN(const std::string path, Text(module, "path", "", "modules.json"));
  const bool plain = !path.empty() && path != "." && path != ".." && path.size() <= 128 &&
                     path.find_first_not_of(
                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"
                         "OPQRSTUVWXYZ0123456789_.-") == std::string::npos;
  if (!plain) {
    return Invalid(
        absl::StrCat("modules.json: [", i, "] ", type, " path \"", path.substr(0, 64),
                     "\" must be one folder's name inside the model's folder"));
  }
  return path;
}

absl::StatusOr<Modules> ReadModules(const std::string& modules_json) {
  constexpr absl::string_view kFile = "modules.json";
  ATTN_ASSIGN_OR_RETURN(const Json modules, Parse(modules_json, kFile));
  if (!modules.is_array()) return Invalid("modules.json: must be a JSON array");
  Modules out;
  bool pooled = false;
  bool mlm = false;
  for (size_t i = 0; i < modules.size(); ++i) {
    if (!modules[i].is_object()) {
      return Invalid(absl::StrCat("modules.json: [", i, "] must be an object"));
    }
    ATTN_ASSIGN_OR_RETURN(const std::string type, Text(modules[i], "type", "", kFile));
    const absl::string_view last = absl::string_view(type).substr(type.rfind('.') + 1);
    if (!absl::StartsWith(type, "sentence_transformers.") ||
        (last != "Transformer" && last != "Pooling" && last != "Normalize" &&
         last != "Dense" && last != "MLMTransformer" && last != "SpladePooling")) {
      return Invalid(absl::StrCat(
          "modules.json: [", i, "] type \"", type,
          "\" is not served (served: sentence-transformers' Transformer, Pooling, Dense "
          "and Normalize, and a SparseEncoder's MLMTransformer and SpladePooling)"));
    }
    if (!out.splade_folder.empty() || (last == "SpladePooling" && (pooled || i != 1))) {
      return Invalid(absl::StrCat(
          "modules.json: [", i, "] ", last,
          ": SpladePooling is served only as the second and last module, after the "
          "transformer"));
    }
    if (last == "SpladePooling") {
      ATTN_ASSIGN_OR_RETURN(out.splade_folder, ModulePath(modules[i], i, last));
      continue;
    }
    mlm |= last == "MLMTransformer";
    if (out.normalize) {
      return Invalid(
          absl::StrCat("modules.json: [", i, "] ", last,
                       " after Normalize is not served (Normalize comes last)"));
    }
    pooled |= last == "Pooling";
    out.normalize |= last == "Normalize";
    if (last == "Dense") {
      ATTN_ASSIGN_OR_RETURN(const std::string path, ModulePath(modules[i], i, last));
      if (!pooled) {
        return Invalid(absl::StrCat("modules.json: [", i,
                                    "] Dense before the Pooling is not served"));
      }
      out.dense_folders.push_back(path);
    }
  }
  if (mlm && out.splade_folder.empty()) {
    return Invalid(
        "modules.json: an MLMTransformer (masked-LM logits per token) is served only "
        "with a SpladePooling after it");
  }
  return out;
}

// A SpladePooling module's config.json: pooling_strategy "max" | "sum",
// activation_function "relu" | "log1p_relu", and the width (embedding_dimension, or
// word_embedding_dimension before sentence-transformers 6) null or the vocabulary's.
absl::StatusOr<v1::EncoderConfig::SparsePooling> SparsePoolingOf(
    const std::string& folder, const std::string& json_text, int64_t vocab_size) {
  const std::string file = absl::StrCat(folder, "/config.json");
  ATTN_ASSIGN_OR_RETURN(const Json json, Parse(json_text, file));
  if (!json.is_object()) return Invalid(absl::StrCat(file, ": must be an object"));
  ATTN_ASSIGN_OR_RETURN(const std::string strategy,
                        Text(json, "pooling_strategy", "max", file));
  ATTN_ASSIGN_OR_RETURN(const std::string activation,
                        Text(json, "activation_function", "relu", file));
  if (strategy != "max" && strategy != "sum") {
    return Invalid(absl::StrCat(file, ": pooling_strategy \"", strategy.substr(0, 64),
                                "\" is not served (served: max, sum)"));
  }
  if (activation != "relu" && activation != "log1p_relu") {
    return Invalid(absl::StrCat(file, ": activation_function \"",
                                activation.substr(0, 64),
                                "\" is not served (served: relu, log1p_relu)"));
  }
  for (const char* key : {"embedding_dimension", "word_embedding_dimension"}) {
    if (const auto it = json.find(key); it == json.end() || it->is_null()) continue;
    ATTN_ASSIGN_OR_RETURN(const int64_t width, Count(json, key, 0, file));
    if (width != 0 && width != vocab_size) {
      return Invalid(absl::StrCat(file, ": ", key, " must be the vocabulary's size ",
                                  vocab_size, " (or null), got ", width));
    }
  }
  const bool twice = activation == "log1p_relu";
  if (strategy == "max") {
    return twice ? v1::EncoderConfig::SPARSE_POOLING_MAX_LOG_TWICE
                 : v1::EncoderConfig::SPARSE_POOLING_MAX;
  }
  return twice ? v1::EncoderConfig::SPARSE_POOLING_SUM_LOG_TWICE
               : v1::EncoderConfig::SPARSE_POOLING_SUM;
}

// A Dense module's config.json: in_features, out_features, bias, activation_function.
absl::StatusOr<v1::EncoderConfig::Dense> DenseLayer(const std::string& folder,
                                                    const std::string& json_text) {
  const std::string file = absl::StrCat(folder, "/config.json");
  ATTN_ASSIGN_OR_RETURN(const Json json, Parse(json_text, file));
  if (!json.is_object()) return Invalid(absl::StrCat(file, ": must be an object"));
  v1::EncoderConfig::Dense layer;
  layer.set_folder(folder);
  ATTN_ASSIGN_OR_RETURN(const int64_t in, Count(json, "in_features", 0, file));
  ATTN_ASSIGN_OR_RETURN(const int64_t out, Count(json, "out_features", 0, file));
  if (in == 0 || out == 0) {
    return Invalid(absl::StrCat(file, ": ", in == 0 ? "in_features" : "out_features",
                                " is required (an integer in [1, 2^31))"));
  }
  layer.set_in_features(in);
  layer.set_out_features(out);
  bool bias = true;
  if (const auto it = json.find("bias"); it != json.end() && !it->is_null()) {
    ATTN_ASSIGN_OR_RETURN(bias, Flag(json, "bias", file));
  }
  layer.set_bias(bias);
  ATTN_ASSIGN_OR_RETURN(const bool residual, Flag(json, "use_residual", file));
  if (residual) return Invalid(absl::StrCat(file, ": use_residual true is not served"));
  ATTN_ASSIGN_OR_RETURN(
      const std::string activation,
      Text(json, "activation_function", "torch.nn.modules.activation.Tanh", file));
  const absl::string_view name =
      absl::string_view(activation).substr(activation.rfind('.') + 1);
  using Dense = v1::EncoderConfig::Dense;
  if (!absl::StartsWith(activation, "torch.")) {
    return Invalid(absl::StrCat(file, ": activation_function \"", activation,
                                "\" is not served (served: torch's Identity, Tanh, ReLU, "
                                "GELU, Sigmoid)"));
  }
  if (name == "Identity") {
    layer.set_activation(Dense::DENSE_ACTIVATION_IDENTITY);
  } else if (name == "Tanh") {
    layer.set_activation(Dense::DENSE_ACTIVATION_TANH);
  } else if (name == "ReLU") {
    layer.set_activation(Dense::DENSE_ACTIVATION_RELU);
  } else if (name == "GELU") {
    layer.set_activation(Dense::DENSE_ACTIVATION_GELU);
  } else if (name == "Sigmoid") {
    layer.set_activation(Dense::DENSE_ACTIVATION_SIGMOID);
  } else {
    return Invalid(absl::StrCat(file, ": activation_function \"", activation,
                                "\" is not served (served: torch's Identity, Tanh, ReLU, "
                                "GELU, Sigmoid)"));
  }
  return layer;
}

}  // namespace

absl::StatusOr<ModuleFolders> ModuleFoldersOf(const std::string& modules_json) {
  ATTN_ASSIGN_OR_RETURN(const Modules modules, ReadModules(modules_json));
  return ModuleFolders{modules.dense_folders, modules.splade_folder};
}

namespace {

// 1_Pooling/config.json's mode: sentence-transformers' pooling_mode_* flags, or
// sentence-transformers 6's "pooling_mode" name.
absl::StatusOr<v1::EncoderConfig::Pooling> PoolingMode(const std::string& pooling_json) {
  constexpr absl::string_view kFile = "1_Pooling/config.json";
  ATTN_ASSIGN_OR_RETURN(const Json pooling, Parse(pooling_json, kFile));
  if (!pooling.is_object()) return Invalid("1_Pooling/config.json: must be an object");
  // sentence-transformers' names: the 6.x "pooling_mode" values and the older flags.
  struct Mode {
    const char* name;
    const char* flag;
    v1::EncoderConfig::Pooling pooling;
  };
  constexpr Mode kModes[] = {
      {"cls", "pooling_mode_cls_token", v1::EncoderConfig::POOLING_CLS},
      {"max", "pooling_mode_max_tokens", v1::EncoderConfig::POOLING_MAX},
      {"mean", "pooling_mode_mean_tokens", v1::EncoderConfig::POOLING_MEAN},
      {"mean_sqrt_len_tokens", "pooling_mode_mean_sqrt_len_tokens",
       v1::EncoderConfig::POOLING_MEAN_SQRT_LEN},
      {"weightedmean", "pooling_mode_weightedmean_tokens",
       v1::EncoderConfig::POOLING_WEIGHTED_MEAN},
      {"lasttoken", "pooling_mode_lasttoken", v1::EncoderConfig::POOLING_LAST_TOKEN},
  };
  if (pooling.contains("pooling_mode")) {
    if (!pooling["pooling_mode"].is_string()) {
      return Invalid(absl::StrCat(kFile, ": pooling_mode must be one mode's name, got ",
                                  Shown(pooling["pooling_mode"]),
                                  " (several modes concatenated are not served)"));
    }
    const std::string mode = pooling["pooling_mode"].get<std::string>();
    for (const Mode& each : kModes) {
      if (mode == each.name) return each.pooling;
    }
    return Invalid(absl::StrCat(kFile, ": pooling_mode \"", mode,
                                "\" is not served (served: cls, max, mean, "
                                "mean_sqrt_len_tokens, weightedmean, lasttoken)"));
  }
  std::vector<const Mode*> on;
  for (const Mode& each : kModes) {
    ATTN_ASSIGN_OR_RETURN(const bool set, Flag(pooling, each.flag, kFile));
    if (set) on.push_back(&each);
  }
  if (on.size() != 1) {
    return Invalid(
        absl::StrCat(kFile, ": exactly one pooling_mode_* flag must be true, and ",
                     on.size(), " are (several modes concatenated are not served)"));
  }
  return on[0]->pooling;
}

absl::Status ApplySentenceTransformers(const EncoderFiles& files,
                                       v1::ModelConfig* config) {
  v1::EncoderConfig* encoder = config->mutable_encoder();
  Modules modules;
  if (!files.modules_json.empty()) {
    ATTN_ASSIGN_OR_RETURN(modules, ReadModules(files.modules_json));
  }
  const bool normalize = modules.normalize;
  if (encoder->dense_size() > 0) {
    return Invalid(
        "encoder.dense is read from modules.json and the Dense modules' folders; leave "
        "it unset in config.pbtxt");
  }
  {
    for (const std::string& folder : modules.dense_folders) {
      const auto it =
          std::find_if(files.dense_configs.begin(), files.dense_configs.end(),
                       [&](const auto& entry) { return entry.first == folder; });
      if (it == files.dense_configs.end() || it->second.empty()) {
        return Invalid(absl::StrCat(folder,
                                    "/config.json: modules.json lists a Dense "
                                    "module there, and its config.json is missing"));
      }
      ATTN_ASSIGN_OR_RETURN(*encoder->add_dense(), DenseLayer(folder, it->second));
    }
  }
  if (encoder->dense_size() > 0 && encoder->task() == v1::EncoderConfig::TASK_CLASSIFY) {
    return Invalid("Dense modules after a classification head are not served");
  }
  if (encoder->normalization() == v1::EncoderConfig::NORMALIZATION_UNSPECIFIED) {
    encoder->set_normalization(normalize ? v1::EncoderConfig::NORMALIZATION_L2
                                         : v1::EncoderConfig::NORMALIZATION_NONE);
  }
  if (encoder->pooling() == v1::EncoderConfig::POOLING_UNSPECIFIED) {
    encoder->set_pooling(v1::EncoderConfig::POOLING_MEAN);
    if (!files.pooling_json.empty()) {
      ATTN_ASSIGN_OR_RETURN(const v1::EncoderConfig::Pooling mode,
                            PoolingMode(files.pooling_json));
      encoder->set_pooling(mode);
    }
  }
  return absl::OkStatus();
}

// The task from config.json's architectures, and for a classification head its labels
// (id2label) and the activation of its scores (sentence-transformers' CrossEncoder
// records it in config.json).
absl::Status ApplyTask(const Json& json, const EncoderFiles& files,
                       v1::ModelConfig* config) {
  constexpr absl::string_view kFile = "config.json";
  v1::EncoderConfig* encoder = config->mutable_encoder();
  Modules modules;
  if (!files.modules_json.empty()) {
    ATTN_ASSIGN_OR_RETURN(modules, ReadModules(files.modules_json));
  }
  const bool splade = !modules.splade_folder.empty();
  if (encoder->task() == v1::EncoderConfig::TASK_UNSPECIFIED) {
    bool classify = false;
    if (const auto it = json.find("architectures"); it != json.end() && !it->is_null()) {
      if (!it->is_array()) {
        return Invalid(
            absl::StrCat(kFile, ": architectures must be a list, got ", Shown(*it)));
      }
      for (const Json& name : *it) {
        const auto* text = name.get_ptr<const Json::string_t*>();
        if (text == nullptr) {
          return Invalid(absl::StrCat(kFile, ": architectures must hold strings, got ",
                                      Shown(name)));
        }
        classify |= absl::EndsWith(*text, "ForSequenceClassification");
      }
    }
    encoder->set_task(splade     ? v1::EncoderConfig::TASK_SPARSE_EMBED
                      : classify ? v1::EncoderConfig::TASK_CLASSIFY
                                 : v1::EncoderConfig::TASK_EMBED);
  }
  const bool sparse = encoder->task() == v1::EncoderConfig::TASK_SPARSE_EMBED;
  if (splade && !sparse) {
    return Invalid(absl::StrCat(
        "encoder.task ", v1::EncoderConfig::Task_Name(encoder->task()),
        ": modules.json lists a SpladePooling, whose answer is a sparse embedding "
        "(TASK_SPARSE_EMBED)"));
  }
  if (!sparse &&
      encoder->sparse_pooling() != v1::EncoderConfig::SPARSE_POOLING_UNSPECIFIED) {
    return Invalid("encoder.sparse_pooling applies to task TASK_SPARSE_EMBED only");
  }
  if (sparse &&
      encoder->sparse_pooling() == v1::EncoderConfig::SPARSE_POOLING_UNSPECIFIED) {
    encoder->set_sparse_pooling(v1::EncoderConfig::SPARSE_POOLING_MAX);
    if (!files.splade_json.empty()) {
      ATTN_ASSIGN_OR_RETURN(const v1::EncoderConfig::SparsePooling pooling,
                            SparsePoolingOf(modules.splade_folder, files.splade_json,
                                            encoder->vocab_size()));
      encoder->set_sparse_pooling(pooling);
    }
  }
  if (encoder->task() != v1::EncoderConfig::TASK_CLASSIFY) {
    if (encoder->labels_size() > 0 ||
        encoder->score_activation() != v1::EncoderConfig::SCORE_ACTIVATION_UNSPECIFIED) {
      return Invalid(
          "encoder.labels and encoder.score_activation apply to task TASK_CLASSIFY only");
    }
    return absl::OkStatus();
  }
  if (encoder->labels_size() == 0) {
    const auto it = json.find("id2label");
    if (it == json.end() || it->is_null()) {
      encoder->add_labels("LABEL_0");
    } else {
      if (!it->is_object() || it->empty() ||
          it->size() > static_cast<size_t>(core::EncoderSpec::kMaxLabels)) {
        return Invalid(absl::StrCat(kFile, ": id2label must be an object of 1 to ",
                                    core::EncoderSpec::kMaxLabels, " labels"));
      }
      std::vector<std::string> labels(it->size());
      std::vector<bool> seen(it->size(), false);
      for (const auto& [key, value] : it->items()) {
        size_t id = 0;
        const bool number = !key.empty() && key.size() <= 6 &&
                            key.find_first_not_of("0123456789") == std::string::npos;
        if (number) id = std::stoul(key);
        const auto* label = value.get_ptr<const Json::string_t*>();
        if (!number || id >= labels.size() || seen[id] || label == nullptr) {
          return Invalid(absl::StrCat(kFile, ": id2label must map each id 0 to ",
                                      labels.size() - 1, " once to a string, got \"", key,
                                      "\": ", Shown(value)));
        }
        seen[id] = true;
        labels[id] = *label;
      }
      for (const std::string& label : labels) encoder->add_labels(label);
    }
  }
  if (encoder->labels_size() > core::EncoderSpec::kMaxLabels) {
    return Invalid(absl::StrCat("encoder.labels must hold at most ",
                                core::EncoderSpec::kMaxLabels, " labels, got ",
                                encoder->labels_size()));
  }
  if (encoder->score_activation() == v1::EncoderConfig::SCORE_ACTIVATION_UNSPECIFIED) {
    std::string recorded;
    if (!files.sentence_transformers_json.empty()) {
      constexpr absl::string_view kStFile = "config_sentence_transformers.json";
      ATTN_ASSIGN_OR_RETURN(const Json st,
                            Parse(files.sentence_transformers_json, kStFile));
      if (!st.is_object()) return Invalid(absl::StrCat(kStFile, ": must be an object"));
      ATTN_ASSIGN_OR_RETURN(recorded, Text(st, "activation_fn", "", kStFile));
    }
    if (const auto st = json.find("sentence_transformers");
        recorded.empty() && st != json.end() && st->is_object()) {
      ATTN_ASSIGN_OR_RETURN(recorded, Text(*st, "activation_fn", "", kFile));
    }
    if (recorded.empty()) {  // sentence-transformers before v4
      ATTN_ASSIGN_OR_RETURN(
          recorded, Text(json, "sbert_ce_default_activation_function", "", kFile));
    }
    v1::EncoderConfig::ScoreActivation activation =
        encoder->labels_size() == 1 ? v1::EncoderConfig::SCORE_ACTIVATION_SIGMOID
                                    : v1::EncoderConfig::SCORE_ACTIVATION_SOFTMAX;
    if (absl::EndsWith(recorded, ".Sigmoid")) {
      activation = v1::EncoderConfig::SCORE_ACTIVATION_SIGMOID;
    } else if (absl::EndsWith(recorded, ".Softmax")) {
      activation = v1::EncoderConfig::SCORE_ACTIVATION_SOFTMAX;
    } else if (absl::EndsWith(recorded, ".Identity")) {
      activation = v1::EncoderConfig::SCORE_ACTIVATION_NONE;
    } else if (!recorded.empty()) {
      return Invalid(
          absl::StrCat(kFile, ": activation_fn \"", recorded,
                       "\" is not served (served: Sigmoid, Softmax, Identity)"));
    }
    encoder->set_score_activation(activation);
  }
  return absl::OkStatus();
}

// max_text_tokens: config.pbtxt's, else sentence-transformers' max_seq_length
// (sentence_bert_config.json's, or for a folder sentence-transformers 6 saved,
// tokenizer_config.json's model_max_length, as sentence-transformers reads it), else
// max_positions; never above max_positions (no position embedding exists past it).
absl::Status ApplyTextLimit(const EncoderFiles& files, v1::ModelConfig* config) {
  v1::EncoderConfig* encoder = config->mutable_encoder();
  const int64_t positions = encoder->max_positions();
  if (encoder->max_text_tokens() == 0) {
    int64_t limit = positions;
    bool found = false;
    if (!files.sentence_bert_json.empty()) {
      constexpr absl::string_view kFile = "sentence_bert_config.json";
      ATTN_ASSIGN_OR_RETURN(const Json json, Parse(files.sentence_bert_json, kFile));
      if (!json.is_object()) return Invalid(absl::StrCat(kFile, ": must be an object"));
      found = json.contains("max_seq_length") && !json["max_seq_length"].is_null();
      if (found) {
        ATTN_ASSIGN_OR_RETURN(limit, Count(json, "max_seq_length", positions, kFile));
      }
    }
    if (!found && !files.tokenizer_config_json.empty()) {
      constexpr absl::string_view kFile = "tokenizer_config.json";
      ATTN_ASSIGN_OR_RETURN(const Json json, Parse(files.tokenizer_config_json, kFile));
      if (!json.is_object()) return Invalid(absl::StrCat(kFile, ": must be an object"));
      // transformers writes a huge number (1e30) for "no limit": then the positions
      // decide.
      if (const auto it = json.find("model_max_length"); it != json.end()) {
        const std::optional<int64_t> value = core::JsonInt64(*it);
        if (value && *value >= 2 && *value < positions) limit = *value;
      }
    }
    encoder->set_max_text_tokens(std::min(limit, positions));
  }
  if (encoder->max_text_tokens() < 2 || encoder->max_text_tokens() > positions) {
    return Invalid(absl::StrCat("encoder.max_text_tokens must be in [2, ", positions,
                                "] (max_positions), got ", encoder->max_text_tokens()));
  }
  return absl::OkStatus();
}

// The config's per-layer head lists into the spec: pruned_heads is the union of both.
absl::Status ApplyHeads(const v1::EncoderConfig& encoder, core::EncoderSpec* spec) {
  const int64_t layers = encoder.num_layers();
  if (encoder.checkpoint_pruned_heads_size() == 0 && encoder.pruned_heads_size() == 0) {
    return absl::OkStatus();
  }
  spec->pruned_heads.assign(static_cast<size_t>(layers), {});
  spec->checkpoint_pruned_heads.assign(static_cast<size_t>(layers), {});
  for (const auto* lists :
       {&encoder.checkpoint_pruned_heads(), &encoder.pruned_heads()}) {
    const bool checkpoint = lists == &encoder.checkpoint_pruned_heads();
    const char* name =
        checkpoint ? "encoder.checkpoint_pruned_heads" : "encoder.pruned_heads";
    for (const v1::LayerHeads& entry : *lists) {
      if (entry.layer() < 0 || entry.layer() >= layers) {
        return Invalid(absl::StrCat(name, ": layer ", entry.layer(), " is not in [0, ",
                                    layers, ") (num_layers)"));
      }
      for (const int64_t head : entry.heads()) {
        if (head < 0 || head >= spec->num_heads) {
          return Invalid(absl::StrCat(name, ": layer ", entry.layer(), " head ", head,
                                      " is not in [0, ", spec->num_heads,
                                      ") (num_heads)"));
        }
        const auto layer = static_cast<size_t>(entry.layer());
        if (checkpoint) spec->checkpoint_pruned_heads[layer].push_back(head);
        spec->pruned_heads[layer].push_back(head);
      }
    }
  }
  for (auto* lists : {&spec->pruned_heads, &spec->checkpoint_pruned_heads}) {
    for (std::vector<int64_t>& heads : *lists) {
      std::sort(heads.begin(), heads.end());
      heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
    }
  }
  return absl::OkStatus();
}

// The prompts: config.pbtxt's, else config_sentence_transformers.json's "prompts" (name
// -> text) and "default_prompt_name". A Pooling module that leaves the prompt's tokens
// out of its pooling (include_prompt false) is refused by name.
absl::Status ApplyPrompts(const EncoderFiles& files, v1::ModelConfig* config) {
  v1::EncoderConfig* encoder = config->mutable_encoder();
  constexpr absl::string_view kFile = "config_sentence_transformers.json";
  if (!files.sentence_transformers_json.empty()) {
    ATTN_ASSIGN_OR_RETURN(const Json st, Parse(files.sentence_transformers_json, kFile));
    if (!st.is_object()) return Invalid(absl::StrCat(kFile, ": must be an object"));
    // config.pbtxt's prompts replace the file's; the file's default stays unless
    // config.pbtxt names one.
    const bool file_prompts = encoder->prompts().empty();
    if (const auto it = st.find("prompts");
        file_prompts && it != st.end() && !it->is_null()) {
      if (!it->is_object()) {
        return Invalid(absl::StrCat(
            kFile, ": prompts must be an object of name: text, got ", Shown(*it)));
      }
      for (const auto& [name, text] : it->items()) {
        const auto* value = text.get_ptr<const Json::string_t*>();
        if (value == nullptr) {
          return Invalid(absl::StrCat(kFile, ": prompts[\"", name,
                                      "\"] must be a string, got ", Shown(text)));
        }
        (*encoder->mutable_prompts())[name] = *value;
      }
    }
    if (encoder->default_prompt_name().empty()) {
      if (const auto it = st.find("default_prompt_name");
          it != st.end() && !it->is_null()) {
        const auto* name = it->get_ptr<const Json::string_t*>();
        if (name == nullptr) {
          return Invalid(absl::StrCat(
              kFile, ": default_prompt_name must be a string, got ", Shown(*it)));
        }
        encoder->set_default_prompt_name(*name);
      }
    }
  }
  if (!encoder->default_prompt_name().empty() &&
      !encoder->prompts().contains(encoder->default_prompt_name())) {
    std::vector<std::string> names;
    for (const auto& [name, unused] : encoder->prompts()) names.push_back(name);
    std::sort(names.begin(), names.end());
    return Invalid(
        absl::StrCat("default_prompt_name \"", encoder->default_prompt_name(),
                     "\" is not one of the prompts (",
                     names.empty() ? "there are none" : absl::StrJoin(names, ", "), ")"));
  }

  for (const auto& [name, text] : encoder->prompts()) {
    if (name.empty() || name.size() > 256 || text.size() > 65536 ||
        core::FirstInvalidUtf8(text) >= 0) {
      return Invalid(absl::StrCat("prompts[\"", name.substr(0, 64),
                                  "\"]: a name of 1 to 256 bytes and a text of at most "
                                  "65,536 bytes of UTF-8"));
    }
  }
  if (!encoder->prompts().empty() && !files.pooling_json.empty()) {
    ATTN_ASSIGN_OR_RETURN(const Json pooling,
                          Parse(files.pooling_json, "1_Pooling/config.json"));
    if (pooling.is_object()) {
      const bool excluded = pooling.contains("include_prompt") &&
                            pooling["include_prompt"].is_boolean() &&
                            !pooling["include_prompt"].get<bool>();
      if (excluded) {
        return Invalid(
            "1_Pooling/config.json: include_prompt false (pooling that leaves the "
            "prompt's tokens out) is not served");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveEncoderConfig(const EncoderFiles& files, v1::ModelConfig* config) {
  Json architecture = Json::object();  // no config.json: BERT-base's defaults
  if (!files.config_json.empty()) {
    ATTN_ASSIGN_OR_RETURN(architecture, Parse(files.config_json, "config.json"));
  }
  try {
    ATTN_RETURN_IF_ERROR(FamilyKeys(&architecture));
    ATTN_RETURN_IF_ERROR(ApplyArchitecture(architecture, config));
    ATTN_RETURN_IF_ERROR(ApplyTask(architecture, files, config));
    ATTN_RETURN_IF_ERROR(ApplySentenceTransformers(files, config));
    ATTN_RETURN_IF_ERROR(ApplyTextLimit(files, config));
    ATTN_RETURN_IF_ERROR(ApplyPrompts(files, config));
  } catch (const std::exception& e) {
    // Typed accessors only above; this guards the promise never to throw.
    return Invalid(absl::StrCat("the encoder's files could not be read: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<core::EncoderSpec> EncoderSpecFromConfig(const v1::ModelConfig& config) {
  const v1::EncoderConfig& encoder = config.encoder();
  core::EncoderSpec spec;
  spec.num_layers = encoder.num_layers();
  spec.d_model = config.d_model();
  spec.num_heads = config.num_heads();
  spec.ffn_dim = encoder.ffn_dim();
  switch (encoder.activation()) {
    case v1::EncoderConfig::ACTIVATION_GELU_TANH:
      spec.activation = core::EncoderSpec::Activation::kGeluTanh;
      break;
    case v1::EncoderConfig::ACTIVATION_RELU:
      spec.activation = core::EncoderSpec::Activation::kRelu;
      break;
    case v1::EncoderConfig::ACTIVATION_SILU:
      spec.activation = core::EncoderSpec::Activation::kSilu;
      break;
    default:
      spec.activation = core::EncoderSpec::Activation::kGeluErf;
  }
  spec.norm_placement = encoder.norm_placement() == v1::EncoderConfig::NORM_PLACEMENT_PRE
                            ? core::EncoderSpec::NormPlacement::kPre
                            : core::EncoderSpec::NormPlacement::kPost;
  // The family's row sets what every checkpoint of it is (FAMILY_UNSPECIFIED: BERT's).
  const core::EncoderFamily* row = core::FamilyOfProtoValue(encoder.family());
  if (row == nullptr) row = &core::DefaultFamily();
  spec.family = row->id;
  spec.relative_attention_buckets = row->relative_attention_buckets;
  spec.norm = row->norm;
  spec.causal = row->causal;
  if (row->rotary) {  // positions from layer_attention, a gated feed-forward
    spec.absolute_positions = false;
    spec.gated_ffn = true;
  }
  spec.position_offset = encoder.position_offset();
  spec.num_kv_heads = encoder.num_kv_heads();
  spec.head_size = encoder.head_size();
  spec.qk_norm = encoder.qk_norm();
  // Rotary inverse frequencies as transformers computes them, in f32:
  // 1 / theta^(2i / head_dim).
  const int64_t head_dim = encoder.head_size() > 0 ? encoder.head_size()
                           : config.num_heads() > 0
                               ? config.d_model() / config.num_heads()
                               : 0;
  for (const v1::EncoderConfig::LayerAttention& layer : encoder.layer_attention()) {
    core::EncoderSpec::LayerAttention attention;
    attention.window = layer.window();
    attention.rotary_interleaved = layer.rotary_interleaved();
    if (layer.rope_theta() > 0.0) {
      // Fixed NTK scaling: the base times the factor, each frequency divided by
      // factor^(2 / head_dim) (GTE's Hub code, in f32 as it computes them).
      const double ntk = layer.rope_ntk_factor();
      const auto base =
          static_cast<float>(ntk > 0.0 ? layer.rope_theta() * ntk : layer.rope_theta());
      const auto divisor = static_cast<float>(
          ntk > 0.0 ? std::pow(ntk, 2.0 / static_cast<double>(head_dim)) : 1.0);
      for (int64_t i = 0; 2 * i < head_dim; ++i) {
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
        attention.rotary_inv_freq.push_back(1.0f / std::pow(base, exponent) / divisor);
      }
    }
    spec.layer_attention.push_back(std::move(attention));
  }
  for (const v1::EncoderConfig::Dense& layer : encoder.dense()) {
    core::EncoderSpec::Dense dense;
    dense.in_features = layer.in_features();
    dense.out_features = layer.out_features();
    using Activation = core::EncoderSpec::Dense::Activation;
    switch (layer.activation()) {
      case v1::EncoderConfig::Dense::DENSE_ACTIVATION_IDENTITY:
        dense.activation = Activation::kIdentity;
        break;
      case v1::EncoderConfig::Dense::DENSE_ACTIVATION_RELU:
        dense.activation = Activation::kRelu;
        break;
      case v1::EncoderConfig::Dense::DENSE_ACTIVATION_GELU:
        dense.activation = Activation::kGelu;
        break;
      case v1::EncoderConfig::Dense::DENSE_ACTIVATION_SIGMOID:
        dense.activation = Activation::kSigmoid;
        break;
      default:
        dense.activation = Activation::kTanh;
    }
    spec.dense.push_back(dense);
  }
  spec.layer_norm_eps = encoder.layer_norm_eps();
  spec.max_positions = encoder.max_positions();
  spec.vocab_size = encoder.vocab_size();
  spec.type_vocab_size = encoder.type_vocab_size();
  switch (encoder.pooling()) {
    case v1::EncoderConfig::POOLING_CLS:
      spec.pooling = core::EncoderSpec::Pooling::kCls;
      break;
    case v1::EncoderConfig::POOLING_NONE:
      spec.pooling = core::EncoderSpec::Pooling::kNone;
      break;
    case v1::EncoderConfig::POOLING_MAX:
      spec.pooling = core::EncoderSpec::Pooling::kMax;
      break;
    case v1::EncoderConfig::POOLING_MEAN_SQRT_LEN:
      spec.pooling = core::EncoderSpec::Pooling::kMeanSqrtLen;
      break;
    case v1::EncoderConfig::POOLING_WEIGHTED_MEAN:
      spec.pooling = core::EncoderSpec::Pooling::kWeightedMean;
      break;
    case v1::EncoderConfig::POOLING_LAST_TOKEN:
      spec.pooling = core::EncoderSpec::Pooling::kLastToken;
      break;
    default:
      spec.pooling = core::EncoderSpec::Pooling::kMean;
  }
  spec.normalize = encoder.normalization() == v1::EncoderConfig::NORMALIZATION_L2;
  if (encoder.task() == v1::EncoderConfig::TASK_CLASSIFY) {
    spec.num_labels = encoder.labels_size();
  }
  if (encoder.task() == v1::EncoderConfig::TASK_SPARSE_EMBED) {
    using Pooling = v1::EncoderConfig;
    const v1::EncoderConfig::SparsePooling pooling = encoder.sparse_pooling();
    spec.sparse = pooling == Pooling::SPARSE_POOLING_SUM ||
                          pooling == Pooling::SPARSE_POOLING_SUM_LOG_TWICE
                      ? core::EncoderSpec::Sparse::kSum
                      : core::EncoderSpec::Sparse::kMax;
    spec.sparse_log_twice = pooling == Pooling::SPARSE_POOLING_MAX_LOG_TWICE ||
                            pooling == Pooling::SPARSE_POOLING_SUM_LOG_TWICE;
  }
  ATTN_RETURN_IF_ERROR(ApplyHeads(encoder, &spec));
  if (absl::Status status = spec.Validate(); !status.ok()) {
    return Invalid(absl::StrCat("encoder: ", status.message()));
  }
  return spec;
}

}  // namespace attnserve::server
