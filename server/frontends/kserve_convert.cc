#include "server/frontends/kserve_convert.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/base/status_macros.h"
#include "server/frontends/embeddings_api.h"
#include "server/frontends/rerank_api.h"

namespace attnserve::server {

namespace {

constexpr char kTimeout[] = "timeout";
constexpr char kQuery[] = "query";
constexpr char kMemory[] = "memory";
constexpr char kOutput[] = "output";
constexpr char kAttention[] = "attention";
// An encoder's inputs and outputs (Triton's BERT names for the inputs).
constexpr char kInputIds[] = "input_ids";
constexpr char kAttentionMask[] = "attention_mask";
constexpr char kTokenTypeIds[] = "token_type_ids";
constexpr char kHiddenStates[] = "hidden_states";
constexpr char kText[] = "text";
constexpr char kEmbedding[] = "embedding";
constexpr char kHidden[] = "hidden";
constexpr char kLengths[] = "lengths";
// A classification model's (a cross-encoder's): the second text of each pair, or a
// query [1] and its documents [n] (n pairs); the scores out.
constexpr char kTextPair[] = "text_pair";
constexpr char kDocuments[] = "documents";
constexpr char kScores[] = "scores";

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// The datatypes an input may have.
enum class InputKind { kFloat, kInteger };

// InvalidArgument unless the request sends no raw contents or one per input.
absl::Status CheckRawCount(const inference::ModelInferRequest& infer) {
  if (infer.raw_input_contents().empty() ||
      infer.raw_input_contents_size() == infer.inputs_size()) {
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat("raw_input_contents must have one entry per input (",
                              infer.inputs_size(), "), got ",
                              infer.raw_input_contents_size()));
}

// One input as attnserve's Tensor (shape, dtype, little-endian bytes): FP32 or BF16 for
// a float input, INT64 or INT32 for an integer one. Raw contents move out of `*infer`.
absl::Status ConvertInput(inference::ModelInferRequest* infer, int index, InputKind kind,
                          v1::Tensor* tensor) {
  const inference::ModelInferRequest::InferInputTensor& input = infer->inputs(index);
  const std::string field = absl::StrCat("inputs[", index, "] (\"", input.name(), "\")");
  const std::string& type = input.datatype();
  if (kind == InputKind::kFloat && type == "FP32") {
    tensor->set_dtype(v1::DATA_TYPE_FP32);
  } else if (kind == InputKind::kFloat && type == "BF16") {
    tensor->set_dtype(v1::DATA_TYPE_BF16);
  } else if (kind == InputKind::kInteger && type == "INT64") {
    tensor->set_dtype(v1::DATA_TYPE_INT64);
  } else if (kind == InputKind::kInteger && type == "INT32") {
    tensor->set_dtype(v1::DATA_TYPE_INT32);
  } else {
    return Invalid(
        absl::StrCat(field, ".datatype must be ",
                     kind == InputKind::kFloat ? "FP32 or BF16" : "INT64 or INT32",
                     ", got \"", type, "\""));
  }
  tensor->mutable_shape()->Add(input.shape().begin(), input.shape().end());
  if (!infer->raw_input_contents().empty()) {
    if (input.has_contents()) {
      return Invalid(absl::StrCat(field,
                                  ".contents must be empty when raw_input_contents ",
                                  "is used (the protocol allows one or the other)"));
    }
    tensor->mutable_raw()->swap(*infer->mutable_raw_input_contents(index));
    return absl::OkStatus();
  }
  if (tensor->dtype() == v1::DATA_TYPE_BF16) {
    return Invalid(absl::StrCat(field, ": BF16 values must come as raw_input_contents ",
                                "(the protocol has no typed BF16 contents)"));
  }
  const auto copy = [tensor](const auto& values) {
    using Element = typename std::decay_t<decltype(values)>::value_type;
    std::string raw(static_cast<size_t>(values.size()) * sizeof(Element), '\0');
    if (!raw.empty()) std::memcpy(raw.data(), values.data(), raw.size());
    tensor->set_raw(std::move(raw));
  };
  switch (tensor->dtype()) {
    case v1::DATA_TYPE_INT64:
      copy(input.contents().int64_contents());
      break;
    case v1::DATA_TYPE_INT32:
      copy(input.contents().int_contents());
      break;
    default:
      copy(input.contents().fp32_contents());
  }
  return absl::OkStatus();
}

// A BYTES input of shape [n] (or [n, 1]) appended to `texts`: raw contents hold each
// element as a 4-byte little-endian length and its bytes (Triton's layout); typed
// contents hold bytes_contents.
absl::Status ConvertTextInput(inference::ModelInferRequest* infer, int index,
                              google::protobuf::RepeatedPtrField<std::string>* texts) {
  const inference::ModelInferRequest::InferInputTensor& input = infer->inputs(index);
  const std::string field = absl::StrCat("inputs[", index, "] (\"", input.name(), "\")");
  if (input.datatype() != "BYTES") {
    return Invalid(
        absl::StrCat(field, ".datatype must be BYTES, got \"", input.datatype(), "\""));
  }
  const bool shaped =
      (input.shape_size() == 1 && input.shape(0) >= 1) ||
      (input.shape_size() == 2 && input.shape(0) >= 1 && input.shape(1) == 1);
  if (!shaped) {
    std::vector<std::string> dims;
    for (const int64_t dim : input.shape()) dims.push_back(absl::StrCat(dim));
    return Invalid(absl::StrCat(field, ".shape must be [n] or [n, 1] with n >= 1, got [",
                                absl::StrJoin(dims, ", "), "]"));
  }
  const int64_t count = input.shape(0);
  if (!infer->raw_input_contents().empty()) {
    if (input.has_contents()) {
      return Invalid(absl::StrCat(field,
                                  ".contents must be empty when raw_input_contents ",
                                  "is used (the protocol allows one or the other)"));
    }
    absl::string_view raw = infer->raw_input_contents(index);
    // Each element takes at least its 4-byte length: the count is bounded by the bytes.
    if (count > static_cast<int64_t>(raw.size() / 4)) {
      return Invalid(absl::StrCat(field, " holds ", raw.size(), " bytes, too few for ",
                                  count, " length-prefixed elements"));
    }
    for (int64_t i = 0; i < count; ++i) {
      if (raw.size() < 4) {
        return Invalid(absl::StrCat(field, ": element ", i, " has no 4-byte length"));
      }
      uint32_t length = 0;
      std::memcpy(&length, raw.data(), 4);  // little-endian, as on every served host
      raw.remove_prefix(4);
      if (length > raw.size()) {
        return Invalid(absl::StrCat(field, ": element ", i, " says ", length,
                                    " bytes, but ", raw.size(), " are left"));
      }
      texts->Add(std::string(raw.substr(0, length)));
      raw.remove_prefix(length);
    }
    if (!raw.empty()) {
      return Invalid(absl::StrCat(field, ": ", raw.size(), " bytes left after its ",
                                  count, " elements (shape ", count, ")"));
    }
    return absl::OkStatus();
  }
  const auto& contents = input.contents().bytes_contents();
  if (contents.size() != count) {
    return Invalid(absl::StrCat(field, ".contents.bytes_contents must hold ", count,
                                " elements (the shape), got ", contents.size()));
  }
  for (const std::string& text : contents) texts->Add(std::string(text));
  return absl::OkStatus();
}

// Whether the request ranks documents (its inputs "query" and "documents").
bool RanksDocuments(const inference::ModelInferRequest& infer) {
  return std::any_of(infer.inputs().begin(), infer.inputs().end(),
                     [](const auto& input) { return input.name() == kDocuments; });
}

// parameters["head_mask"]: comma-separated factors ("1,0,0.5"), one per head (per layer
// and head for an encoder); the work checks their count and range.
absl::Status ReadHeadMask(const inference::InferParameter& value,
                          google::protobuf::RepeatedField<float>* mask) {
  constexpr absl::string_view kField = "parameters[\"head_mask\"]";
  if (value.parameter_choice_case() != inference::InferParameter::kStringParam) {
    return Invalid(absl::StrCat(kField, " must be a string_param like \"1,0,0.5\""));
  }
  for (absl::string_view part : absl::StrSplit(value.string_param(), ',')) {
    float factor = 0;
    if (!absl::SimpleAtof(part, &factor)) {
      return Invalid(absl::StrCat(kField, ": \"", part, "\" is not a number"));
    }
    mask->Add(factor);
  }
  return absl::OkStatus();
}

absl::Status ApplyParameter(const std::string& name,
                            const inference::InferParameter& value,
                            v1::AttendRequest* attend) {
  const std::string field = absl::StrCat("parameters[\"", name, "\"]");
  // Triton reserves the "triton_" prefix for its clients' own request options
  // (perf_analyzer sends triton_enable_empty_final_response on every request); they
  // concern decoupled models and responses, not the computation: ignored, as Triton
  // ignores them for models like these.
  if (absl::StartsWith(name, "triton_")) return absl::OkStatus();
  // The request's timeout (Triton's schedule policy), read by DeadlineWithTimeout.
  if (name == kTimeout) return absl::OkStatus();
  if (name == "causal" || name == "return_attention") {
    if (value.parameter_choice_case() != inference::InferParameter::kBoolParam) {
      return Invalid(absl::StrCat(field, " must be a bool_param"));
    }
    if (name == "causal") {
      attend->set_causal(value.bool_param());
    } else {
      attend->set_return_attention(value.bool_param());
    }
    return absl::OkStatus();
  }
  if (name == "head_mask") return ReadHeadMask(value, attend->mutable_head_mask());
  return Invalid(
      absl::StrCat(field,
                   " is not a parameter of attnserve's models (causal, return_attention, "
                   "head_mask)"));
}

// The datatype name of an attnserve tensor.
const char* DatatypeName(const v1::Tensor& tensor) {
  switch (tensor.dtype()) {
    case v1::DATA_TYPE_BF16:
      return "BF16";
    case v1::DATA_TYPE_INT64:
      return "INT64";
    case v1::DATA_TYPE_INT32:
      return "INT32";
    default:
      return "FP32";
  }
}

// The "embedding_type" parameter: Cohere's float, int8, uint8, binary or ubinary
// (float when absent). InvalidArgument for another value or type.
constexpr char kEmbeddingType[] = "embedding_type";
absl::StatusOr<EmbeddingsCall::EmbeddingType> RequestedEmbeddingType(
    const inference::ModelInferRequest& infer) {
  const auto it = infer.parameters().find(kEmbeddingType);
  if (it == infer.parameters().end()) return EmbeddingsCall::EmbeddingType::kFloat;
  const std::optional<EmbeddingsCall::EmbeddingType> type =
      it->second.parameter_choice_case() == inference::InferParameter::kStringParam
          ? EmbeddingTypeNamed(it->second.string_param())
          : std::nullopt;
  if (!type.has_value() || *type == EmbeddingsCall::EmbeddingType::kBase64) {
    return Invalid(
        "parameters[\"embedding_type\"] must be a string_param: \"float\", \"int8\", "
        "\"uint8\", \"binary\" or \"ubinary\"");
  }
  return *type;
}

// The output "embedding" of `response` from the FP32 [n, d] `embedding` as `type`
// (QuantizeEmbedding): INT8 or UINT8 [n, d], or bit-packed INT8 (binary) or UINT8
// (ubinary) [n, ceil(d / 8)].
void AddQuantizedEmbedding(EmbeddingsCall::EmbeddingType type,
                           const v1::Tensor& embedding,
                           inference::ModelInferResponse* response) {
  using Type = EmbeddingsCall::EmbeddingType;
  const int64_t rows = embedding.shape_size() == 2 ? embedding.shape(0) : 0;
  const int64_t width = embedding.shape_size() == 2 ? embedding.shape(1) : 0;
  std::vector<float> row(static_cast<size_t>(width));
  std::string raw;
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(row.data(), embedding.raw().data() + i * width * sizeof(float),
                row.size() * sizeof(float));
    for (const int level : QuantizeEmbedding(row, type)) {
      raw.push_back(static_cast<char>(static_cast<uint8_t>(level)));
    }
  }
  inference::ModelInferResponse::InferOutputTensor* output = response->add_outputs();
  output->set_name(kEmbedding);
  output->set_datatype(type == Type::kInt8 || type == Type::kBinary ? "INT8" : "UINT8");
  output->add_shape(rows);
  output->add_shape(rows > 0 ? static_cast<int64_t>(raw.size()) / rows : 0);
  *response->add_raw_output_contents() = std::move(raw);
}

// The output `name` of `response`, from `tensor`, whose bytes move: no copy of a
// result.
void AddOutput(const char* name, v1::Tensor* tensor,
               inference::ModelInferResponse* response) {
  inference::ModelInferResponse::InferOutputTensor* output = response->add_outputs();
  output->set_name(name);
  output->set_datatype(DatatypeName(*tensor));
  output->mutable_shape()->Add(tensor->shape().begin(), tensor->shape().end());
  response->add_raw_output_contents()->swap(*tensor->mutable_raw());
}

}  // namespace

absl::StatusOr<v1::AttendRequest> AttendFromInfer(inference::ModelInferRequest* infer) {
  v1::AttendRequest attend;
  attend.set_model(infer->model_name());
  attend.set_request_id(infer->id());
  ATTN_RETURN_IF_ERROR(CheckRawCount(*infer));
  bool has_query = false;
  for (int i = 0; i < infer->inputs_size(); ++i) {
    const std::string& name = infer->inputs(i).name();
    v1::Tensor* tensor = nullptr;
    if (name == kQuery && !has_query) {
      tensor = attend.mutable_query();
      has_query = true;
    } else if (name == kMemory && !attend.has_memory()) {
      tensor = attend.mutable_memory();
    } else {
      return Invalid(absl::StrCat("inputs[", i, "].name must be \"query\" or \"memory\" ",
                                  "(each once), got \"", name, "\""));
    }
    ATTN_RETURN_IF_ERROR(ConvertInput(infer, i, InputKind::kFloat, tensor));
  }
  if (!has_query) return Invalid("inputs must include \"query\"");
  for (const auto& [name, value] : infer->parameters()) {
    ATTN_RETURN_IF_ERROR(ApplyParameter(name, value, &attend));
  }
  for (int i = 0; i < infer->outputs_size(); ++i) {
    const std::string& name = infer->outputs(i).name();
    if (name == kAttention) {
      attend.set_return_attention(true);
    } else if (name != kOutput) {
      return Invalid(absl::StrCat("outputs[", i, "].name must be \"output\" or ",
                                  "\"attention\", got \"", name, "\""));
    }
  }
  return attend;
}

absl::StatusOr<v1::EncodeRequest> EncodeFromInfer(inference::ModelInferRequest* infer) {
  v1::EncodeRequest encode;
  encode.set_model(infer->model_name());
  encode.set_request_id(infer->id());
  ATTN_RETURN_IF_ERROR(CheckRawCount(*infer));
  bool text = false, text_pair = false, query_seen = false, documents_seen = false;
  google::protobuf::RepeatedPtrField<std::string> query, documents;
  for (int i = 0; i < infer->inputs_size(); ++i) {
    const std::string& name = infer->inputs(i).name();
    v1::Tensor* tensor = nullptr;
    InputKind kind = InputKind::kInteger;
    if (name == kInputIds && !encode.has_input_ids()) {
      tensor = encode.mutable_input_ids();
    } else if (name == kAttentionMask && !encode.has_attention_mask()) {
      tensor = encode.mutable_attention_mask();
    } else if (name == kTokenTypeIds && !encode.has_token_type_ids()) {
      tensor = encode.mutable_token_type_ids();
    } else if (name == kHiddenStates && !encode.has_hidden_states()) {
      tensor = encode.mutable_hidden_states();
      kind = InputKind::kFloat;
    } else if (name == kText && !text) {
      ATTN_RETURN_IF_ERROR(ConvertTextInput(infer, i, encode.mutable_text()));
      text = true;
      continue;
    } else if (name == kTextPair && !text_pair) {
      ATTN_RETURN_IF_ERROR(ConvertTextInput(infer, i, encode.mutable_text_pair()));
      text_pair = true;
      continue;
    } else if (name == kQuery && !query_seen && infer->inputs(i).datatype() == "BYTES") {
      ATTN_RETURN_IF_ERROR(ConvertTextInput(infer, i, &query));
      query_seen = true;
      continue;
    } else if (name == kDocuments && !documents_seen) {
      ATTN_RETURN_IF_ERROR(ConvertTextInput(infer, i, &documents));
      documents_seen = true;
      continue;
    } else {
      return Invalid(absl::StrCat(
          "inputs[", i,
          "].name must be \"input_ids\", \"attention_mask\", \"token_type_ids\", "
          "\"hidden_states\", \"text\", \"text_pair\", or \"query\" with "
          "\"documents\" (each once), got \"",
          name, "\"",
          name == kQuery ? absl::StrCat(" of datatype ", infer->inputs(i).datatype(),
                                        ": an encoder's \"query\" is a rerank's text "
                                        "(BYTES), and an attention layer's query goes "
                                        "to an attention model")
                         : ""));
    }
    ATTN_RETURN_IF_ERROR(ConvertInput(infer, i, kind, tensor));
  }
  if (query_seen || documents_seen) {
    if (!query_seen || !documents_seen) {
      return Invalid(absl::StrCat("input \"", query_seen ? kQuery : kDocuments,
                                  "\" needs input \"", query_seen ? kDocuments : kQuery,
                                  "\": a query [1] and the documents [n] ranked for it"));
    }
    if (text || text_pair) {
      return Invalid(
          absl::StrCat("inputs \"query\" and \"documents\" make the pairs: "
                       "send them without \"",
                       text ? kText : kTextPair, "\""));
    }
    if (query.size() != 1) {
      return Invalid(
          absl::StrCat("input \"query\" must hold 1 text, got ", query.size()));
    }
    if (documents.size() > kMaxRerankDocuments) {
      return Invalid(absl::StrCat("input \"documents\" holds ", documents.size(),
                                  " texts, over the limit of ", kMaxRerankDocuments,
                                  " per request: send fewer"));
    }
    for (std::string& document : documents) {
      encode.add_text(query[0]);
      encode.add_text_pair(std::move(document));
    }
  }
  for (const auto& [name, value] : infer->parameters()) {
    if (absl::StartsWith(name, "triton_") || name == kTimeout) continue;
    if (name == "truncate" || name == "normalize" || name == "raw_scores") {
      if (value.parameter_choice_case() != inference::InferParameter::kBoolParam) {
        return Invalid(absl::StrCat("parameters[\"", name, "\"] must be a bool_param"));
      }
      if (name == "truncate") {
        encode.set_truncate(value.bool_param());
      } else if (name == "normalize") {
        encode.set_normalize(value.bool_param());
      } else {
        encode.set_raw_scores(value.bool_param());
      }
      continue;
    }
    if (name == "dimensions") {
      // The work checks the range against the model's d_model, as on every door.
      if (value.parameter_choice_case() != inference::InferParameter::kInt64Param ||
          value.int64_param() < 0 || value.int64_param() > INT32_MAX) {
        return Invalid(
            "parameters[\"dimensions\"] must be an int64_param, 0 (all) or positive");
      }
      encode.set_dimensions(static_cast<int32_t>(value.int64_param()));
      continue;
    }
    if (name == "head_mask") {
      ATTN_RETURN_IF_ERROR(ReadHeadMask(value, encode.mutable_head_mask()));
      continue;
    }
    if (name == kEmbeddingType) {
      ATTN_RETURN_IF_ERROR(RequestedEmbeddingType(*infer).status());
      continue;
    }
    if (name == "prompt_name") {
      if (value.parameter_choice_case() != inference::InferParameter::kStringParam ||
          value.string_param().empty() || value.string_param().size() > 256) {
        return Invalid(
            "parameters[\"prompt_name\"] must be a string_param naming one of the "
            "model's prompts (1 to 256 bytes)");
      }
      encode.set_prompt_name(value.string_param());
      continue;
    }
    return Invalid(absl::StrCat("parameters[\"", name,
                                "\"] is not a parameter of an encoder model (timeout, "
                                "truncate, dimensions, normalize, raw_scores, head_mask, "
                                "prompt_name, embedding_type)"));
  }
  for (int i = 0; i < infer->outputs_size(); ++i) {
    const std::string& name = infer->outputs(i).name();
    if (name == kHidden) {
      encode.set_return_hidden(true);
    } else if (name != kEmbedding && name != kLengths && name != kScores) {
      return Invalid(absl::StrCat("outputs[", i, "].name must be \"embedding\", ",
                                  "\"scores\", \"hidden\" or \"lengths\", got \"", name,
                                  "\""));
    }
  }
  return encode;
}

void SetTimingParameters(int64_t tokenize_us, int64_t queue_us, int64_t compute_us,
                         inference::ModelInferResponse* response) {
  auto& parameters = *response->mutable_parameters();
  parameters[kTokenizeTimeUs].set_int64_param(tokenize_us);
  parameters[kQueueTimeUs].set_int64_param(queue_us);
  parameters[kComputeTimeUs].set_int64_param(compute_us);
}

std::string TimingHeaders(int64_t tokenize_us, int64_t queue_us, int64_t compute_us) {
  return absl::StrCat("x-tokenization-time: ", tokenize_us / 1000,
                      "\r\nx-queue-time: ", queue_us / 1000,
                      "\r\nx-inference-time: ", compute_us / 1000, "\r\n");
}

std::string TimingHeaders(const inference::ModelInferResponse& response) {
  const auto micros = [&](const char* name) -> int64_t {
    const auto it = response.parameters().find(name);
    return it == response.parameters().end() ? 0 : it->second.int64_param();
  };
  return TimingHeaders(micros(kTokenizeTimeUs), micros(kQueueTimeUs),
                       micros(kComputeTimeUs));
}

void InferResponseFromEncode(const inference::ModelInferRequest& infer,
                             v1::EncodeResponse& encode,
                             inference::ModelInferResponse* response) {
  response->set_model_name(encode.model());
  response->set_model_version(encode.model_version());
  response->set_id(infer.id());
  SetTimingParameters(encode.tokenize_time_us(), encode.queue_time_us(),
                      encode.compute_time_us(), response);
  bool want_embedding = infer.outputs().empty(), want_lengths = false;
  bool want_scores = infer.outputs().empty();
  for (const auto& requested : infer.outputs()) {
    want_embedding |= requested.name() == kEmbedding;
    want_lengths |= requested.name() == kLengths;
    want_scores |= requested.name() == kScores;
  }
  if (want_embedding && encode.has_embedding()) {
    // The parameter was checked when the request was read.
    const EmbeddingsCall::EmbeddingType type =
        RequestedEmbeddingType(infer).value_or(EmbeddingsCall::EmbeddingType::kFloat);
    if (type == EmbeddingsCall::EmbeddingType::kFloat) {
      AddOutput(kEmbedding, encode.mutable_embedding(), response);
    } else {
      AddQuantizedEmbedding(type, encode.embedding(), response);
    }
  }
  if (want_scores && encode.has_scores()) {
    v1::Tensor* scores = encode.mutable_scores();
    // Ranked documents get one score each: [n], not [n, 1].
    if (RanksDocuments(infer) && scores->shape_size() == 2 && scores->shape(1) == 1) {
      scores->mutable_shape()->RemoveLast();
    }
    AddOutput(kScores, scores, response);
  }
  if (encode.has_hidden()) AddOutput(kHidden, encode.mutable_hidden(), response);
  if (want_lengths) {
    v1::Tensor lengths;
    lengths.set_dtype(v1::DATA_TYPE_INT64);
    lengths.add_shape(encode.lengths_size());
    std::string raw(static_cast<size_t>(encode.lengths_size()) * sizeof(int64_t), '\0');
    if (!raw.empty()) std::memcpy(raw.data(), encode.lengths().data(), raw.size());
    lengths.set_raw(std::move(raw));
    AddOutput(kLengths, &lengths, response);
  }
}

void SubmitInfer(
    RequestPipeline& pipeline, const std::shared_ptr<Request>& request,
    const std::shared_ptr<inference::ModelInferRequest>& infer, absl::Time call_deadline,
    const std::shared_ptr<Cancellation>& cancellation,
    const std::function<void(absl::Status, inference::ModelInferResponse)>& done) {
  const auto refuse = [&](const absl::Status& status) {
    request->Finish(status);
    done(status, {});
  };
  const absl::StatusOr<absl::Time> deadline = DeadlineWithTimeout(*infer, call_deadline);
  if (!deadline.ok()) return refuse(deadline.status());
  if (request->model()->is_encoder()) {
    absl::StatusOr<v1::EncodeRequest> encode = EncodeFromInfer(infer.get());
    if (!encode.ok()) return refuse(encode.status());
    if (RanksDocuments(*infer)) {
      if (absl::Status ranks =
              CheckReranker(*request->model(), "inputs \"text\" and \"text_pair\"");
          !ranks.ok()) {
        return refuse(ranks);
      }
    }
    // Levels of an embedding in [-1, 1]: not scores, nor SPLADE's weights.
    const core::EncoderSpec& spec = request->model()->encoder_spec;
    if (RequestedEmbeddingType(*infer).value_or(EmbeddingsCall::EmbeddingType::kFloat) !=
            EmbeddingsCall::EmbeddingType::kFloat &&
        (spec.num_labels > 0 || spec.sparse != core::EncoderSpec::Sparse::kNone)) {
      return refuse(absl::InvalidArgumentError(absl::StrCat(
          "parameters[\"embedding_type\"] quantizes a dense embedding, and model \"",
          request->model()->name, "\" answers ",
          spec.num_labels > 0 ? "scores" : "sparse weights")));
    }
    // The work copies the ids: the converted request may go when SubmitEncode returns.
    pipeline.SubmitEncode(request, *encode, *deadline, cancellation,
                          [infer, done](absl::Status status, v1::EncodeResponse result) {
                            inference::ModelInferResponse response;
                            if (status.ok()) {
                              InferResponseFromEncode(*infer, result, &response);
                            }
                            done(std::move(status), std::move(response));
                          });
    return;
  }
  absl::StatusOr<v1::AttendRequest> attend = AttendFromInfer(infer.get());
  if (!attend.ok()) return refuse(attend.status());
  // The converted request lives until its answer (the queued work views its bytes).
  auto shared = std::make_shared<v1::AttendRequest>(*std::move(attend));
  pipeline.Submit(request, *shared, *deadline, cancellation,
                  [infer, shared, done](absl::Status status, v1::AttendResponse result) {
                    inference::ModelInferResponse response;
                    if (status.ok()) InferResponseFromAttend(*infer, result, &response);
                    done(std::move(status), std::move(response));
                  });
}

absl::StatusOr<absl::Time> DeadlineWithTimeout(const inference::ModelInferRequest& infer,
                                               absl::Time deadline) {
  const auto it = infer.parameters().find(kTimeout);
  if (it == infer.parameters().end()) return deadline;
  if (it->second.parameter_choice_case() != inference::InferParameter::kInt64Param ||
      it->second.int64_param() < 0) {
    return Invalid(absl::StrCat("parameters[\"timeout\"] must be an int64_param of ",
                                "microseconds >= 0 (0: none)"));
  }
  if (it->second.int64_param() == 0) return deadline;
  return std::min(deadline, absl::Now() + absl::Microseconds(it->second.int64_param()));
}

void InferResponseFromAttend(const inference::ModelInferRequest& infer,
                             v1::AttendResponse& attend,
                             inference::ModelInferResponse* response) {
  response->set_model_name(attend.model());
  response->set_model_version(attend.model_version());
  response->set_id(infer.id());
  SetTimingParameters(0, attend.queue_time_us(), attend.compute_time_us(), response);
  bool want_output = infer.outputs().empty();
  bool want_attention = infer.outputs().empty();
  for (const auto& requested : infer.outputs()) {
    want_output |= requested.name() == kOutput;
    want_attention |= requested.name() == kAttention;
  }
  if (want_output) AddOutput(kOutput, attend.mutable_output(), response);
  if (want_attention && attend.has_attention()) {
    AddOutput(kAttention, attend.mutable_attention(), response);
  }
}

void FillModelMetadata(const ServedModel& model,
                       inference::ModelMetadataResponse* response) {
  const int64_t d = model.spec.d_model;
  response->set_name(model.name);
  response->add_versions(model.version);
  response->set_platform(model.is_encoder() ? "attnserve_encoder" : "attnserve_mha");
  const auto tensor = [](auto* list, const char* name, std::vector<int64_t> shape,
                         const char* datatype = "FP32") {
    auto* entry = list->Add();
    entry->set_name(name);
    entry->set_datatype(datatype);
    entry->mutable_shape()->Add(shape.begin(), shape.end());
  };
  if (model.is_encoder()) {
    // Token ids [n, L] (INT32 accepted too), or hidden states [n, L, d].
    tensor(response->mutable_inputs(), kInputIds, {-1, -1}, "INT64");
    tensor(response->mutable_inputs(), kAttentionMask, {-1, -1}, "INT64");
    tensor(response->mutable_inputs(), kTokenTypeIds, {-1, -1}, "INT64");
    tensor(response->mutable_inputs(), kHiddenStates, {-1, -1, d});
    const int64_t labels = model.encoder_spec.num_labels;
    if (model.tokenizer != nullptr) {
      tensor(response->mutable_inputs(), kText, {-1}, "BYTES");
      if (labels > 0) tensor(response->mutable_inputs(), kTextPair, {-1}, "BYTES");
      if (labels == 1) {
        tensor(response->mutable_inputs(), kQuery, {1}, "BYTES");
        tensor(response->mutable_inputs(), kDocuments, {-1}, "BYTES");
      }
    }
    if (labels > 0) {
      tensor(response->mutable_outputs(), kScores, {-1, labels});
    } else {
      tensor(response->mutable_outputs(), kEmbedding,
             {-1, model.encoder_spec.pooled_width()});
    }
    tensor(response->mutable_outputs(), kHidden, {-1, d});
    tensor(response->mutable_outputs(), kLengths, {-1}, "INT64");
    return;
  }
  // One sequence [L, d] (a leading n for equal-length batches is accepted too).
  tensor(response->mutable_inputs(), kQuery, {-1, d});
  tensor(response->mutable_inputs(), kMemory, {-1, d});
  tensor(response->mutable_outputs(), kOutput, {-1, d});
  tensor(response->mutable_outputs(), kAttention, {model.spec.num_heads, -1, -1});
}

void FillModelConfig(const ServedModel& model, inference::ModelConfig* config) {
  const int64_t d = model.spec.d_model;
  config->set_name(model.name);
  config->set_platform(model.is_encoder() ? "attnserve_encoder" : "attnserve_mha");
  config->set_backend("attnserve");
  config->set_max_batch_size(0);
  if (model.is_encoder()) {
    const auto add = [](auto* entry, const char* name, inference::DataType type,
                        std::vector<int64_t> dims) {
      entry->set_name(name);
      entry->set_data_type(type);
      entry->mutable_dims()->Add(dims.begin(), dims.end());
      return entry;
    };
    add(config->add_input(), kInputIds, inference::TYPE_INT64, {-1, -1})
        ->set_optional(true);  // or hidden_states
    add(config->add_input(), kAttentionMask, inference::TYPE_INT64, {-1, -1})
        ->set_optional(true);
    add(config->add_input(), kTokenTypeIds, inference::TYPE_INT64, {-1, -1})
        ->set_optional(true);
    add(config->add_input(), kHiddenStates, inference::TYPE_FP32, {-1, -1, d})
        ->set_optional(true);
    const int64_t labels = model.encoder_spec.num_labels;
    if (model.tokenizer != nullptr) {
      add(config->add_input(), kText, inference::TYPE_STRING, {-1})->set_optional(true);
      if (labels > 0) {
        add(config->add_input(), kTextPair, inference::TYPE_STRING, {-1})
            ->set_optional(true);
      }
      if (labels == 1) {
        add(config->add_input(), kQuery, inference::TYPE_STRING, {1})->set_optional(true);
        add(config->add_input(), kDocuments, inference::TYPE_STRING, {-1})
            ->set_optional(true);
      }
    }
    if (labels > 0) {
      add(config->add_output(), kScores, inference::TYPE_FP32, {-1, labels});
    } else {
      add(config->add_output(), kEmbedding, inference::TYPE_FP32,
          {-1, model.encoder_spec.pooled_width()});
    }
    add(config->add_output(), kHidden, inference::TYPE_FP32, {-1, d});
    add(config->add_output(), kLengths, inference::TYPE_INT64, {-1});
    return;
  }
  const auto input = [&](const char* name, bool optional) {
    inference::ModelInput* entry = config->add_input();
    entry->set_name(name);
    entry->set_data_type(inference::TYPE_FP32);
    entry->add_dims(-1);
    entry->add_dims(d);
    entry->set_optional(optional);
  };
  input(kQuery, false);
  input(kMemory, true);
  inference::ModelOutput* output = config->add_output();
  output->set_name(kOutput);
  output->set_data_type(inference::TYPE_FP32);
  output->add_dims(-1);
  output->add_dims(d);
  inference::ModelOutput* attention = config->add_output();
  attention->set_name(kAttention);
  attention->set_data_type(inference::TYPE_FP32);
  attention->add_dims(model.spec.num_heads);
  attention->add_dims(-1);
  attention->add_dims(-1);
}

void FillModelStatistics(const ServerMetrics& metrics,
                         absl::Span<const std::shared_ptr<const ServedModel>> models,
                         inference::ModelStatisticsResponse* response) {
  const auto duration = [](inference::StatisticDuration* out, uint64_t count,
                           uint64_t nanoseconds) {
    out->set_count(count);
    out->set_ns(nanoseconds);
  };
  for (const auto& model : models) {
    const std::optional<ServerMetrics::InferenceTotals> totals =
        metrics.Totals(model->name);
    inference::ModelStatistics* stats = response->add_model_stats();
    stats->set_name(model->name);
    stats->set_version(model->version);
    if (!totals.has_value()) continue;
    stats->set_last_inference(totals->last_inference_ms);
    stats->set_inference_count(totals->inference_count);
    stats->set_execution_count(totals->execution_count);
    inference::InferStatistics* infer = stats->mutable_inference_stats();
    duration(infer->mutable_success(), totals->success_count, totals->success_ns);
    duration(infer->mutable_fail(), totals->fail_count, totals->fail_ns);
    duration(infer->mutable_queue(), totals->queue_count, totals->queue_ns);
    duration(infer->mutable_compute_infer(), totals->compute_count, totals->compute_ns);
    // Inputs are viewed and outputs moved, not staged: no time of their own, but the
    // same count, as clients (perf_analyzer) require of the three compute figures.
    duration(infer->mutable_compute_input(), totals->compute_count, 0);
    duration(infer->mutable_compute_output(), totals->compute_count, 0);
  }
}

absl::StatusOr<std::optional<std::string>> LoadConfigFromParameters(
    const inference::RepositoryModelLoadRequest& request) {
  std::optional<std::string> config;
  for (const auto& [name, parameter] : request.parameters()) {
    if (name != "config") {
      return Invalid(
          absl::StrCat("unknown parameter \"", name, "\" (load takes: config)"));
    }
    if (parameter.parameter_choice_case() !=
        inference::ModelRepositoryParameter::kStringParam) {
      return Invalid(
          "parameters[\"config\"] must be a string_param holding the ModelConfig as "
          "JSON");
    }
    config = parameter.string_param();
  }
  return config;
}

absl::Status CheckUnloadParameters(
    const inference::RepositoryModelUnloadRequest& request) {
  for (const auto& [name, parameter] : request.parameters()) {
    if (name != "unload_dependents" ||
        parameter.parameter_choice_case() !=
            inference::ModelRepositoryParameter::kBoolParam) {
      return Invalid(absl::StrCat("unknown parameter \"", name,
                                  "\" (unload takes: unload_dependents, a bool_param)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace attnserve::server
