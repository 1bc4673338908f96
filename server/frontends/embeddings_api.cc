#include "server/frontends/embeddings_api.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/json_values.h"
#include "core/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/frontends/kserve_http_request.h"
#include "server/frontends/rerank_api.h"

namespace attnserve::server {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// The input of either API: a text, a list of texts, one token array or a list of token
// arrays, into `encode` (text, or input_ids [n, L] padded with an attention_mask).
absl::Status ReadInput(const Json& input, const std::string& field, size_t body_bytes,
                       v1::EncodeRequest* encode) {
  if (const auto* text = input.get_ptr<const Json::string_t*>()) {
    encode->add_text(*text);
    return absl::OkStatus();
  }
  if (!input.is_array()) {
    return Invalid(absl::StrCat(field, " must be a string, a list of strings or token ",
                                "ids ([ids] or [[ids]]), got ", JsonExcerpt(input)));
  }
  if (input.empty()) return Invalid(absl::StrCat(field, " must not be an empty list"));
  const Json& first = input[0];
  if (first.is_string()) {
    for (size_t i = 0; i < input.size(); ++i) {
      const auto* text = input[i].get_ptr<const Json::string_t*>();
      if (text == nullptr) {
        return Invalid(absl::StrCat(field, "[", i, "] must be a string like ", field,
                                    "[0], got ", JsonExcerpt(input[i])));
      }
      encode->add_text(*text);
    }
    return absl::OkStatus();
  }
  // Token ids: one array of integers, or a list of them.
  const bool nested = first.is_array();
  std::vector<const Json*> rows;
  if (nested) {
    for (const Json& row : input) rows.push_back(&row);
  } else {
    rows.push_back(&input);
  }
  size_t longest = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string row_field = nested ? absl::StrCat(field, "[", i, "]") : field;
    if (!rows[i]->is_array()) {
      return Invalid(absl::StrCat(row_field, " must be a list of token ids like ", field,
                                  "[0], got ", JsonExcerpt(*rows[i])));
    }
    if (rows[i]->empty()) {
      return Invalid(absl::StrCat(row_field, " must hold at least one token id"));
    }
    longest = std::max(longest, rows[i]->size());
  }
  // Padded to the longest, the ids take rows * longest slots: never more than the body
  // has bytes, so that padding cannot cost more memory than the request brought.
  if (rows.size() * longest > std::max<size_t>(body_bytes, 1 << 16)) {
    return Invalid(absl::StrCat(
        field, ": ", rows.size(), " token arrays padded to the ", "longest (", longest,
        ") would be ", rows.size() * longest, " ids, more than the body's ", body_bytes,
        " bytes: send arrays of similar lengths together"));
  }
  v1::Tensor* ids = encode->mutable_input_ids();
  ids->set_dtype(v1::DATA_TYPE_INT64);
  ids->add_shape(static_cast<int64_t>(rows.size()));
  ids->add_shape(static_cast<int64_t>(longest));
  std::string raw(rows.size() * longest * sizeof(int64_t), '\0');
  bool ragged = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const Json& row = *rows[i];
    ragged |= row.size() != longest;
    for (size_t j = 0; j < row.size(); ++j) {
      const std::optional<int64_t> id = core::JsonInt64(row[j]);
      if (!id) {
        return Invalid(absl::StrCat(nested ? absl::StrCat(field, "[", i, "]") : field,
                                    "[", j, "] must be an integer token id, got ",
                                    JsonExcerpt(row[j])));
      }
      std::memcpy(raw.data() + (i * longest + j) * sizeof(int64_t), &*id,
                  sizeof(int64_t));
    }
  }
  ids->set_raw(std::move(raw));
  // A mask only when the rows differ in length: each row's ones, then zeros.
  if (ragged) {
    std::string mask_raw(rows.size() * longest * sizeof(int64_t), '\0');
    const int64_t one = 1;
    for (size_t i = 0; i < rows.size(); ++i) {
      for (size_t j = 0; j < rows[i]->size(); ++j) {
        std::memcpy(mask_raw.data() + (i * longest + j) * sizeof(int64_t), &one,
                    sizeof(int64_t));
      }
    }
    v1::Tensor* mask = encode->mutable_attention_mask();
    mask->set_dtype(v1::DATA_TYPE_INT64);
    mask->add_shape(static_cast<int64_t>(rows.size()));
    mask->add_shape(static_cast<int64_t>(longest));
    mask->set_raw(std::move(mask_raw));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> BoolAt(const Json& value, const std::string& field) {
  if (const auto* flag = value.get_ptr<const Json::boolean_t*>()) return *flag;
  return Invalid(absl::StrCat(field, " must be true or false, got ", JsonExcerpt(value)));
}

// TEI's and sentence-transformers' prompt_name: a string (null: the model's default).
// The work checks it against the model's prompts.
absl::Status PromptNameAt(const Json& value, v1::EncodeRequest* encode) {
  if (value.is_null()) return absl::OkStatus();
  const auto* name = value.get_ptr<const Json::string_t*>();
  if (name == nullptr || name->empty() || name->size() > 256) {
    return Invalid(
        absl::StrCat("prompt_name must be a prompt's name (1 to 256 bytes), got ",
                     JsonExcerpt(value)));
  }
  encode->set_prompt_name(*name);
  return absl::OkStatus();
}

// The body's "model": a string.
absl::Status ModelAt(const Json& value, v1::EncodeRequest* encode) {
  const auto* name = value.get_ptr<const Json::string_t*>();
  if (name == nullptr) {
    return Invalid(absl::StrCat("model must be a string, got ", JsonExcerpt(value)));
  }
  encode->set_model(*name);
  return absl::OkStatus();
}

// A positive int32 (larger ones exceed every model's d_model, which the work checks).
absl::StatusOr<int32_t> DimensionsAt(const Json& value) {
  const std::optional<int64_t> count = core::JsonInt64(value);
  if (!count || *count < 1) {
    return Invalid(
        absl::StrCat("dimensions must be a positive integer, got ", JsonExcerpt(value)));
  }
  return static_cast<int32_t>(std::min<int64_t>(*count, INT32_MAX));
}

}  // namespace

absl::StatusOr<EmbeddingsCall> ParseOpenAiEmbeddings(absl::string_view body) {
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseJsonObjectBody(body));
  EmbeddingsCall call;
  call.api = EmbeddingsCall::Api::kOpenAi;
  bool has_input = false, has_model = false;
  for (const auto& [key, value] : json.items()) {
    if (key == "input") {
      ATTN_RETURN_IF_ERROR(ReadInput(value, "input", body.size(), &call.encode));
      has_input = true;
    } else if (key == "model") {
      ATTN_RETURN_IF_ERROR(ModelAt(value, &call.encode));
      has_model = true;
    } else if (key == "encoding_format") {
      const auto* format = value.get_ptr<const Json::string_t*>();
      if (format == nullptr || (*format != "float" && *format != "base64")) {
        return Invalid(absl::StrCat(
            "encoding_format must be \"float\" or \"base64\", got ", JsonExcerpt(value)));
      }
      call.base64 = *format == "base64";
    } else if (key == "dimensions") {
      ATTN_ASSIGN_OR_RETURN(const int32_t dimensions, DimensionsAt(value));
      call.encode.set_dimensions(dimensions);
    } else if (key == "head_mask") {
      ATTN_RETURN_IF_ERROR(HeadMaskAt(value, &call.encode));
    } else if (key == "prompt_name") {
      ATTN_RETURN_IF_ERROR(PromptNameAt(value, &call.encode));
    } else if (key == "user") {
      if (!value.is_string()) {
        return Invalid(absl::StrCat("user must be a string, got ", JsonExcerpt(value)));
      }
    } else {
      return Invalid(
          absl::StrCat("unrecognized request argument supplied: ", key,
                       " (accepted: input, model, encoding_format, dimensions, "
                       "head_mask, prompt_name, user)"));
    }
  }
  if (!has_input) {
    return Invalid("input is required: a string, a list of strings or token ids");
  }
  if (!has_model) return Invalid("model is required: the name of a served encoder");
  return call;
}

namespace {

// TEI's /embed body, or (api kTeiEmbedAll, kTeiEmbedSparse) its /embed_all and
// /embed_sparse bodies, which take neither normalize nor dimensions nor head_mask.
absl::StatusOr<EmbeddingsCall> ParseTeiBody(absl::string_view body,
                                            EmbeddingsCall::Api api) {
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseJsonObjectBody(body));
  EmbeddingsCall call;
  call.api = api;
  const bool all = api != EmbeddingsCall::Api::kTei;
  bool has_input = false;
  for (const auto& [key, value] : json.items()) {
    if (all && (key == "normalize" || key == "dimensions" || key == "head_mask")) {
      return Invalid(absl::StrCat("unknown field \"", key,
                                  "\" (accepted: inputs, truncate, "
                                  "truncation_direction, prompt_name)"));
    }
    if (key == "inputs") {
      ATTN_RETURN_IF_ERROR(ReadInput(value, "inputs", body.size(), &call.encode));
      has_input = true;
    } else if (key == "normalize") {
      ATTN_ASSIGN_OR_RETURN(call.normalize, BoolAt(value, "normalize"));
    } else if (key == "truncate") {
      ATTN_ASSIGN_OR_RETURN(const bool truncate, BoolAt(value, "truncate"));
      call.encode.set_truncate(truncate);
    } else if (key == "truncation_direction") {
      const auto* direction = value.get_ptr<const Json::string_t*>();
      if (direction == nullptr || (*direction != "Right" && *direction != "right")) {
        return Invalid(absl::StrCat("truncation_direction must be \"Right\" (the end of ",
                                    "a text is cut), got ", JsonExcerpt(value)));
      }
    } else if (key == "dimensions") {
      ATTN_ASSIGN_OR_RETURN(const int32_t dimensions, DimensionsAt(value));
      call.encode.set_dimensions(dimensions);
    } else if (key == "head_mask") {
      ATTN_RETURN_IF_ERROR(HeadMaskAt(value, &call.encode));
    } else if (key == "prompt_name") {
      ATTN_RETURN_IF_ERROR(PromptNameAt(value, &call.encode));
    } else {
      return Invalid(absl::StrCat("unknown field \"", key, "\" (accepted: inputs, ",
                                  "normalize, truncate, truncation_direction, "
                                  "dimensions, head_mask, prompt_name)"));
    }
  }
  if (!has_input) return Invalid("inputs is required: a string or a list of strings");
  if (api == EmbeddingsCall::Api::kTeiEmbedAll) {
    call.encode.set_return_hidden(true);
  } else if (api == EmbeddingsCall::Api::kTei) {
    call.encode.set_normalize(call.normalize);
  }
  // Token ids carry no text to cut.
  if (call.encode.truncate() && call.encode.text().empty()) {
    call.encode.set_truncate(false);
  }
  return call;
}

}  // namespace

absl::StatusOr<EmbeddingsCall> ParseTeiEmbed(absl::string_view body) {
  return ParseTeiBody(body, EmbeddingsCall::Api::kTei);
}

absl::StatusOr<EmbeddingsCall> ParseTeiEmbedAll(absl::string_view body) {
  return ParseTeiBody(body, EmbeddingsCall::Api::kTeiEmbedAll);
}

absl::StatusOr<EmbeddingsCall> ParseTeiEmbedSparse(absl::string_view body) {
  return ParseTeiBody(body, EmbeddingsCall::Api::kTeiEmbedSparse);
}

namespace {

// Cohere's embedding types by their names in the body and the answer.
constexpr std::pair<const char*, EmbeddingsCall::EmbeddingType> kEmbeddingTypes[] = {
    {"float", EmbeddingsCall::EmbeddingType::kFloat},
    {"int8", EmbeddingsCall::EmbeddingType::kInt8},
    {"uint8", EmbeddingsCall::EmbeddingType::kUint8},
    {"binary", EmbeddingsCall::EmbeddingType::kBinary},
    {"ubinary", EmbeddingsCall::EmbeddingType::kUbinary},
    {"base64", EmbeddingsCall::EmbeddingType::kBase64}};

}  // namespace

absl::StatusOr<EmbeddingsCall> ParseCohereEmbed(absl::string_view body) {
  using Type = EmbeddingsCall::EmbeddingType;
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseJsonObjectBody(body));
  EmbeddingsCall call;
  call.api = EmbeddingsCall::Api::kCohereEmbed;
  bool has_texts = false, has_model = false;
  call.encode.set_truncate(true);  // Cohere's default: END
  for (const auto& [key, value] : json.items()) {
    if (value.is_null()) continue;  // an optional field sent as null is absent
    if (key == "texts") {
      if (!value.is_array() || value.empty() || !value[0].is_string()) {
        return Invalid(absl::StrCat("texts must be a non-empty list of strings, got ",
                                    JsonExcerpt(value)));
      }
      ATTN_RETURN_IF_ERROR(ReadInput(value, "texts", body.size(), &call.encode));
      has_texts = true;
    } else if (key == "model") {
      ATTN_RETURN_IF_ERROR(ModelAt(value, &call.encode));
      has_model = true;
    } else if (key == "input_type") {
      const auto* type = value.get_ptr<const Json::string_t*>();
      if (type == nullptr || (*type != "search_document" && *type != "search_query" &&
                              *type != "classification" && *type != "clustering")) {
        return Invalid(
            absl::StrCat("input_type must be \"search_document\", \"search_query\", "
                         "\"classification\" or \"clustering\" (text models only), got ",
                         JsonExcerpt(value)));
      }
    } else if (key == "embedding_types") {
      if (!value.is_array() || value.empty()) {
        return Invalid(absl::StrCat("embedding_types must be a non-empty list, got ",
                                    JsonExcerpt(value)));
      }
      for (size_t i = 0; i < value.size(); ++i) {
        const auto* name = value[i].get_ptr<const Json::string_t*>();
        const std::optional<Type> found =
            name == nullptr ? std::nullopt : EmbeddingTypeNamed(*name);
        if (!found.has_value()) {
          return Invalid(absl::StrCat(
              "embedding_types[", i,
              "] must be \"float\", \"int8\", \"uint8\", \"binary\", \"ubinary\" or "
              "\"base64\", got ",
              JsonExcerpt(value[i])));
        }
        if (std::find(call.embedding_types.begin(), call.embedding_types.end(), *found) ==
            call.embedding_types.end()) {
          call.embedding_types.push_back(*found);
        }
      }
    } else if (key == "truncate") {
      const auto* mode = value.get_ptr<const Json::string_t*>();
      if (mode == nullptr || (*mode != "END" && *mode != "NONE")) {
        return Invalid(absl::StrCat(
            "truncate must be \"END\" (cut a long text's end, the default) or \"NONE\" "
            "(refuse it); \"START\" is not served, got ",
            JsonExcerpt(value)));
      }
      call.encode.set_truncate(*mode == "END");
    } else if (key == "output_dimension") {
      ATTN_ASSIGN_OR_RETURN(const int32_t dimensions, DimensionsAt(value));
      call.encode.set_dimensions(dimensions);
    } else if (key == "max_tokens") {
      const std::optional<int64_t> limit = core::JsonInt64(value);
      if (!limit || *limit < 1) {
        return Invalid(absl::StrCat("max_tokens must be a positive integer, got ",
                                    JsonExcerpt(value)));
      }
      call.max_tokens_per_doc = *limit;
    } else if (key == "priority") {
      if (!core::JsonInt64(value)) {
        return Invalid(
            absl::StrCat("priority must be an integer, got ", JsonExcerpt(value)));
      }
    } else if (key == "images" || key == "inputs") {
      return Invalid(absl::StrCat(key, " is not served: the models here take text ",
                                  "(send texts)"));
    } else {
      return Invalid(absl::StrCat("unknown field \"", key,
                                  "\" (accepted: model, texts, input_type, "
                                  "embedding_types, truncate, output_dimension, "
                                  "max_tokens, priority)"));
    }
  }
  if (!has_texts) return Invalid("texts is required: a non-empty list of strings");
  if (!has_model) return Invalid("model is required: the name of a served encoder");
  if (call.embedding_types.empty()) call.embedding_types.push_back(Type::kFloat);
  return call;
}

std::optional<EmbeddingsCall::EmbeddingType> EmbeddingTypeNamed(absl::string_view name) {
  for (const auto& [known, type] : kEmbeddingTypes) {
    if (name == known) return type;
  }
  return std::nullopt;
}

std::vector<int> QuantizeEmbedding(absl::Span<const float> values,
                                   EmbeddingsCall::EmbeddingType type) {
  using Type = EmbeddingsCall::EmbeddingType;
  std::vector<int> out;
  if (type == Type::kInt8 || type == Type::kUint8) {
    // sentence-transformers: starts = -1, steps = (1 - -1) / 255, in float32;
    // clip(floor((x - starts) / steps), 0, 255), minus 128 for int8.
    const float step = 2.0f / 255.0f;
    const int shift = type == Type::kInt8 ? 128 : 0;
    out.reserve(values.size());
    for (const float x : values) {
      const float level = std::clamp(std::floor((x + 1.0f) / step), 0.0f, 255.0f);
      out.push_back(static_cast<int>(level) - shift);
    }
    return out;
  }
  // binary / ubinary: numpy's packbits of x > 0.
  out.assign((values.size() + 7) / 8, 0);
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] > 0.0f) out[i / 8] |= 0x80 >> (i % 8);
  }
  if (type == Type::kBinary) {
    for (int& byte : out) byte -= 128;
  }
  return out;
}

absl::Status CheckEmbeddingsCall(const EmbeddingsCall& call, const ServedModel& model) {
  // The model's kind as ListModels reports it (the batcher behind it is the pipeline's
  // business, and SubmitEncode checks it again).
  if (model.info.kind() != v1::MODEL_KIND_ENCODER) {
    return Invalid(absl::StrCat("model \"", model.name,
                                "\" is an attention layer, not an encoder: it makes no "
                                "embeddings"));
  }
  const int64_t labels = model.encoder_spec.num_labels;
  if (call.classifies()) {
    if (labels == 0) {
      return Invalid(absl::StrCat(
          "model \"", model.name,
          "\" embeds and has no classification head: rerank and predict need a "
          "cross-encoder (config.json architectures *ForSequenceClassification)"));
    }
    if (call.max_tokens_per_doc > 0 && call.max_tokens_per_doc < model.max_text_tokens) {
      return Invalid(absl::StrCat(
          "max_tokens_per_doc below the model's max_text_tokens (", model.max_text_tokens,
          ") is not supported, got ", call.max_tokens_per_doc,
          ": each document is cut with the query to ", model.max_text_tokens, " tokens"));
    }
    if (call.reranks()) return CheckReranker(model, "/predict");
    return absl::OkStatus();
  }
  if (labels > 0) {
    return Invalid(absl::StrCat("model \"", model.name,
                                "\" classifies (a cross-encoder) and makes no "
                                "embeddings: call /rerank or /predict"));
  }
  if (call.max_tokens_per_doc > 0 && call.max_tokens_per_doc < model.max_text_tokens) {
    return Invalid(absl::StrCat("max_tokens below the model's max_text_tokens (",
                                model.max_text_tokens, ") is not supported, got ",
                                call.max_tokens_per_doc, ": each text is cut to ",
                                model.max_text_tokens, " tokens"));
  }
  if (call.api == EmbeddingsCall::Api::kTeiEmbedAll) return absl::OkStatus();
  const bool sparse = model.encoder_spec.sparse != core::EncoderSpec::Sparse::kNone;
  if (call.api == EmbeddingsCall::Api::kTeiEmbedSparse) {
    if (sparse) return absl::OkStatus();
    return Invalid(absl::StrCat(
        "model \"", model.name,
        "\" makes dense embeddings: /embed_sparse needs a sparse model (a SPLADE "
        "SparseEncoder, task TASK_SPARSE_EMBED); call /embed"));
  }
  if (sparse) {
    return Invalid(absl::StrCat("model \"", model.name,
                                "\" makes sparse embeddings (SPLADE, one weight per "
                                "vocabulary entry): call /embed_sparse"));
  }
  if (model.encoder_spec.pooling == core::EncoderSpec::Pooling::kNone) {
    return Invalid(absl::StrCat("model \"", model.name,
                                "\" pools nothing (pooling NONE): it has no embedding"));
  }
  const bool model_normalizes =
      model.info.encoder().normalization() == v1::EncoderConfig::NORMALIZATION_L2;
  if (call.api == EmbeddingsCall::Api::kTei && !call.normalize && model_normalizes) {
    return Invalid(absl::StrCat("normalize=false: model \"", model.name,
                                "\" L2-normalizes its embeddings by its recipe "
                                "(modules.json), so unnormalized ones do not exist"));
  }
  return absl::OkStatus();
}

namespace {

// Cohere's EmbedByTypeResponse: {"id", "response_type": "embeddings_by_type",
// "embeddings": {type: [...]}, "texts", "meta": {"api_version", "billed_units"}}.
std::string CohereEmbedBody(const EmbeddingsCall& call,
                            const v1::EncodeResponse& response) {
  using Type = EmbeddingsCall::EmbeddingType;
  const v1::Tensor& embedding = response.embedding();
  const int64_t count = embedding.shape_size() == 2 ? embedding.shape(0) : 0;
  const int64_t d = embedding.shape_size() == 2 ? embedding.shape(1) : 0;
  std::vector<float> row(static_cast<size_t>(d));
  Json embeddings = Json::object();
  for (const Type type : call.embedding_types) {
    Json rows = Json::array();
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(row.data(), embedding.raw().data() + i * d * sizeof(float),
                  static_cast<size_t>(d) * sizeof(float));
      if (type == Type::kFloat) {
        rows.push_back(row);
      } else if (type == Type::kBase64) {
        rows.push_back(absl::Base64Escape(absl::string_view(
            reinterpret_cast<const char*>(row.data()), row.size() * sizeof(float))));
      } else {
        rows.push_back(QuantizeEmbedding(row, type));
      }
    }
    const auto* entry =
        std::find_if(std::begin(kEmbeddingTypes), std::end(kEmbeddingTypes),
                     [&](const auto& named) { return named.second == type; });
    embeddings[entry->first] = std::move(rows);
  }
  int64_t tokens = 0;
  for (const int64_t length : response.lengths()) tokens += length;
  return JsonText(
      {{"id", response.request_id().empty() ? "attnserve" : response.request_id()},
       {"response_type", "embeddings_by_type"},
       {"embeddings", std::move(embeddings)},
       {"texts",
        std::vector<std::string>(call.encode.text().begin(), call.encode.text().end())},
       {"meta",
        {{"api_version", {{"version", "2"}}},
         {"billed_units", {{"input_tokens", tokens}}}}}});
}

}  // namespace

std::string EmbeddingsBody(const EmbeddingsCall& call, const v1::EncodeResponse& response,
                           const ServedModel& model) {
  if (call.classifies()) return ScoresBody(call, response, model);
  if (call.api == EmbeddingsCall::Api::kTeiEmbedAll) {
    // Each input's tokens, [L_i, d] from the packed [sum(L_i), d].
    const v1::Tensor& hidden = response.hidden();
    const int64_t d = hidden.shape_size() == 2 ? hidden.shape(1) : 0;
    std::vector<float> row(static_cast<size_t>(d));
    Json inputs = Json::array();
    int64_t token = 0;
    for (const int64_t length : response.lengths()) {
      Json tokens = Json::array();
      for (int64_t t = 0; t < length; ++t, ++token) {
        std::memcpy(row.data(), hidden.raw().data() + token * d * sizeof(float),
                    static_cast<size_t>(d) * sizeof(float));
        tokens.push_back(row);
      }
      inputs.push_back(std::move(tokens));
    }
    return JsonText(inputs);
  }
  if (call.api == EmbeddingsCall::Api::kTeiEmbedSparse) {
    // Each input's nonzero weights, [n, vocab_size] dense in the answer.
    const v1::Tensor& weights = response.embedding();
    const int64_t vocab = weights.shape_size() == 2 ? weights.shape(1) : 0;
    const auto* values = reinterpret_cast<const float*>(weights.raw().data());
    Json inputs = Json::array();
    for (int64_t i = 0; vocab > 0 && i < weights.shape(0); ++i) {
      Json pairs = Json::array();
      for (int64_t j = 0; j < vocab; ++j) {
        float value;
        std::memcpy(&value, values + i * vocab + j, sizeof(float));
        if (value != 0.0f) pairs.push_back({{"index", j}, {"value", value}});
      }
      inputs.push_back(std::move(pairs));
    }
    return JsonText(inputs);
  }
  const v1::Tensor& embedding = response.embedding();
  const int64_t count = embedding.shape_size() == 2 ? embedding.shape(0) : 0;
  const int64_t d = embedding.shape_size() == 2 ? embedding.shape(1) : 0;
  std::vector<float> row(static_cast<size_t>(d));
  Json data = Json::array();
  for (int64_t i = 0; i < count; ++i) {
    if (d > 0) {
      std::memcpy(row.data(), embedding.raw().data() + i * d * sizeof(float),
                  static_cast<size_t>(d) * sizeof(float));
    }
    if (call.api == EmbeddingsCall::Api::kTei) {
      data.push_back(row);
      continue;
    }
    Json values;
    if (call.base64) {
      values = absl::Base64Escape(absl::string_view(
          reinterpret_cast<const char*>(row.data()), row.size() * sizeof(float)));
    } else {
      values = row;
    }
    data.push_back(
        {{"object", "embedding"}, {"index", i}, {"embedding", std::move(values)}});
  }
  if (call.api == EmbeddingsCall::Api::kTei) return JsonText(data);
  if (call.api == EmbeddingsCall::Api::kCohereEmbed) {
    return CohereEmbedBody(call, response);
  }
  int64_t tokens = 0;
  for (const int64_t length : response.lengths()) tokens += length;
  return JsonText({{"object", "list"},
                   {"data", std::move(data)},
                   {"model", response.model()},
                   {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}});
}

std::pair<int, std::string> EmbeddingsError(EmbeddingsCall::Api api,
                                            const absl::Status& status, int http_status) {
  const std::string message(status.message());
  if (api == EmbeddingsCall::Api::kRerank || api == EmbeddingsCall::Api::kCohereEmbed) {
    return {http_status, JsonText({{"message", message}})};
  }
  if (api != EmbeddingsCall::Api::kOpenAi) {
    const char* type = "Backend";
    switch (status.code()) {
      case absl::StatusCode::kInvalidArgument:
        return {422, JsonText({{"error", message}, {"error_type", "Validation"}})};
      case absl::StatusCode::kResourceExhausted:
        type = "Overloaded";
        break;
      case absl::StatusCode::kUnavailable:
        type = "Unhealthy";
        break;
      default:
        break;
    }
    return {http_status, JsonText({{"error", message}, {"error_type", type}})};
  }
  Json code = nullptr;
  const char* type = "invalid_request_error";
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
      code = "model_not_found";
      break;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      code = "invalid_api_key";
      break;
    case absl::StatusCode::kResourceExhausted:
      type = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      break;
    default:
      type = "server_error";
  }
  return {http_status, JsonText({{"error",
                                  {{"message", message},
                                   {"type", type},
                                   {"param", nullptr},
                                   {"code", code}}}})};
}

}  // namespace attnserve::server
