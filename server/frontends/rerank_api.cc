#include "server/frontends/rerank_api.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/json_values.h"
#include "core/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/frontends/kserve_http_request.h"

namespace attnserve::server {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<bool> Flag(const Json& value, absl::string_view field) {
  if (const auto* flag = value.get_ptr<const Json::boolean_t*>()) return *flag;
  return Invalid(absl::StrCat(field, " must be true or false, got ", JsonExcerpt(value)));
}

absl::StatusOr<std::string> Text(const Json& value, absl::string_view field) {
  if (const auto* text = value.get_ptr<const Json::string_t*>()) return *text;
  return Invalid(absl::StrCat(field, " must be a string, got ", JsonExcerpt(value)));
}

absl::Status CheckDirection(const Json& value) {
  const auto* direction = value.get_ptr<const Json::string_t*>();
  if (direction == nullptr || (*direction != "Right" && *direction != "right")) {
    return Invalid(absl::StrCat("truncation_direction must be \"Right\" (the end of a ",
                                "text is cut), got ", JsonExcerpt(value)));
  }
  return absl::OkStatus();
}

// Whether `key` names an optional field of one of these bodies.
bool IsOptional(const std::string& key) {
  return key != "query" && key != "texts" && key != "documents" && key != "inputs";
}

// The query once per document: pair i is (query, documents[i]).
void AddPairs(const std::string& query, const std::vector<std::string>& documents,
              v1::EncodeRequest* encode) {
  for (const std::string& document : documents) {
    encode->add_text(query);
    encode->add_text_pair(document);
  }
}

absl::Status CheckCount(size_t count, absl::string_view field) {
  if (count == 0) return Invalid(absl::StrCat(field, " must not be an empty list"));
  if (count > static_cast<size_t>(kMaxRerankDocuments)) {
    return Invalid(absl::StrCat(field, " holds ", count, " entries, over the limit of ",
                                kMaxRerankDocuments, " per request: send fewer"));
  }
  return absl::OkStatus();
}

// The scores tensor [n, labels] as floats.
std::vector<float> Scores(const v1::EncodeResponse& response, int64_t* labels) {
  const v1::Tensor& scores = response.scores();
  *labels = scores.shape_size() == 2 ? scores.shape(1) : 0;
  std::vector<float> values(scores.raw().size() / sizeof(float));
  if (!values.empty()) {
    std::memcpy(values.data(), scores.raw().data(), scores.raw().size());
  }
  return values;
}

}  // namespace

absl::StatusOr<EmbeddingsCall> ParseTeiRerank(absl::string_view body) {
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseJsonObjectBody(body));
  EmbeddingsCall call;
  call.api = EmbeddingsCall::Api::kTeiRerank;
  std::optional<std::string> query;
  std::vector<std::string> texts;
  bool has_texts = false;
  for (const auto& [key, value] : json.items()) {
    // An optional field given as null is absent (clients send null for what they leave
    // unset); a required one (query, texts, documents, inputs) is still required.
    if (value.is_null() && IsOptional(key)) continue;
    if (key == "query") {
      ATTN_ASSIGN_OR_RETURN(query, Text(value, "query"));
    } else if (key == "texts") {
      if (!value.is_array()) {
        return Invalid(
            absl::StrCat("texts must be a list of strings, got ", JsonExcerpt(value)));
      }
      ATTN_RETURN_IF_ERROR(CheckCount(value.size(), "texts"));
      for (size_t i = 0; i < value.size(); ++i) {
        ATTN_ASSIGN_OR_RETURN(std::string text,
                              Text(value[i], absl::StrCat("texts[", i, "]")));
        texts.push_back(std::move(text));
      }
      has_texts = true;
    } else if (key == "truncate") {
      ATTN_ASSIGN_OR_RETURN(const bool truncate, Flag(value, "truncate"));
      call.encode.set_truncate(truncate);
    } else if (key == "truncation_direction") {
      ATTN_RETURN_IF_ERROR(CheckDirection(value));
    } else if (key == "head_mask") {
      ATTN_RETURN_IF_ERROR(HeadMaskAt(value, &call.encode));
    } else if (key == "raw_scores") {
      ATTN_ASSIGN_OR_RETURN(const bool raw, Flag(value, "raw_scores"));
      call.encode.set_raw_scores(raw);
    } else if (key == "return_text") {
      ATTN_ASSIGN_OR_RETURN(call.return_documents, Flag(value, "return_text"));
    } else {
      return Invalid(
          absl::StrCat("unknown field \"", key,
                       "\" (accepted: query, texts, truncate, "
                       "truncation_direction, raw_scores, return_text, head_mask)"));
    }
  }
  if (!query) return Invalid("query is required: the text the texts are ranked for");
  if (!has_texts) return Invalid("texts is required: a list of strings to rank");
  AddPairs(*query, texts, &call.encode);
  return call;
}

absl::StatusOr<EmbeddingsCall> ParseRerank(absl::string_view body) {
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseJsonObjectBody(body));
  EmbeddingsCall call;
  call.api = EmbeddingsCall::Api::kRerank;
  std::optional<std::string> query;
  std::vector<std::string> documents;
  bool has_documents = false;
  for (const auto& [key, value] : json.items()) {
    // An optional field given as null is absent (clients send null for what they leave
    // unset); a required one (query, texts, documents, inputs) is still required.
    if (value.is_null() && IsOptional(key)) continue;
    if (key == "query") {
      ATTN_ASSIGN_OR_RETURN(query, Text(value, "query"));
    } else if (key == "model") {
      ATTN_ASSIGN_OR_RETURN(const std::string model, Text(value, "model"));
      call.encode.set_model(model);
    } else if (key == "documents") {
      if (!value.is_array()) {
        return Invalid(absl::StrCat("documents must be a list of strings or {\"text\"} ",
                                    "objects, got ", JsonExcerpt(value)));
      }
      ATTN_RETURN_IF_ERROR(CheckCount(value.size(), "documents"));
      for (size_t i = 0; i < value.size(); ++i) {
        const std::string field = absl::StrCat("documents[", i, "]");
        const Json& document = value[i];
        if (document.is_object()) {
          const auto text = document.find("text");
          if (text == document.end() || document.size() != 1) {
            return Invalid(absl::StrCat(field,
                                        " must be a string or {\"text\": string}, ",
                                        "got ", JsonExcerpt(document)));
          }
          ATTN_ASSIGN_OR_RETURN(std::string words, Text(*text, field + ".text"));
          documents.push_back(std::move(words));
        } else {
          ATTN_ASSIGN_OR_RETURN(std::string words, Text(document, field));
          documents.push_back(std::move(words));
        }
      }
      has_documents = true;
    } else if (key == "head_mask") {
      ATTN_RETURN_IF_ERROR(HeadMaskAt(value, &call.encode));
    } else if (key == "top_n") {
      const std::optional<int64_t> top_n = core::JsonInt64(value);
      if (!top_n || *top_n < 1) {
        return Invalid(absl::StrCat("top_n must be a positive integer (the results to ",
                                    "return), got ", JsonExcerpt(value)));
      }
      call.top_n = *top_n;
    } else if (key == "return_documents") {
      ATTN_ASSIGN_OR_RETURN(call.return_documents, Flag(value, "return_documents"));
    } else if (key == "max_tokens_per_doc") {
      const std::optional<int64_t> limit = core::JsonInt64(value);
      if (!limit || *limit < 1) {
        return Invalid(absl::StrCat("max_tokens_per_doc must be a positive integer, got ",
                                    JsonExcerpt(value)));
      }
      call.max_tokens_per_doc = *limit;
    } else {
      return Invalid(absl::StrCat("unknown field \"", key,
                                  "\" (accepted: model, query, documents, top_n, "
                                  "return_documents, max_tokens_per_doc, head_mask)"));
    }
  }
  if (!query) return Invalid("query is required: the text the documents are ranked for");
  if (!has_documents) {
    return Invalid("documents is required: a list of strings or {\"text\"} objects");
  }
  AddPairs(*query, documents, &call.encode);
  // These APIs cut a long document rather than refuse it.
  call.encode.set_truncate(true);
  return call;
}

absl::StatusOr<EmbeddingsCall> ParseTeiPredict(absl::string_view body) {
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseJsonObjectBody(body));
  EmbeddingsCall call;
  call.api = EmbeddingsCall::Api::kTeiPredict;
  bool has_inputs = false;
  // One input: a text, or a pair [text, text].
  const auto add = [&](const Json& input, const std::string& field) -> absl::Status {
    // Typed reads: get_ptr answers null for another type, where get<> would throw.
    if (const auto* text = input.get_ptr<const Json::string_t*>()) {
      call.encode.add_text(*text);
      return absl::OkStatus();
    }
    if (input.is_array() && input.size() == 2) {
      const auto* first = input[0].get_ptr<const Json::string_t*>();
      const auto* second = input[1].get_ptr<const Json::string_t*>();
      if (first != nullptr && second != nullptr) {
        call.encode.add_text(*first);
        call.encode.add_text_pair(*second);
        return absl::OkStatus();
      }
    }
    return Invalid(absl::StrCat(field, " must be a text or a pair [text, text], got ",
                                JsonExcerpt(input)));
  };
  for (const auto& [key, value] : json.items()) {
    // An optional field given as null is absent (clients send null for what they leave
    // unset); a required one (query, texts, documents, inputs) is still required.
    if (value.is_null() && IsOptional(key)) continue;
    if (key == "inputs") {
      has_inputs = true;
      // A batch is a list whose entries are lists, or a list of more than two texts
      // or of one (a pair is exactly two texts).
      call.batch =
          value.is_array() && (value.empty() || value[0].is_array() || value.size() != 2);
      if (!call.batch) {
        ATTN_RETURN_IF_ERROR(add(value, "inputs"));
        continue;
      }
      ATTN_RETURN_IF_ERROR(CheckCount(value.size(), "inputs"));
      for (size_t i = 0; i < value.size(); ++i) {
        ATTN_RETURN_IF_ERROR(add(value[i], absl::StrCat("inputs[", i, "]")));
      }
    } else if (key == "head_mask") {
      ATTN_RETURN_IF_ERROR(HeadMaskAt(value, &call.encode));
    } else if (key == "raw_scores") {
      ATTN_ASSIGN_OR_RETURN(const bool raw, Flag(value, "raw_scores"));
      call.encode.set_raw_scores(raw);
    } else if (key == "truncate") {
      ATTN_ASSIGN_OR_RETURN(const bool truncate, Flag(value, "truncate"));
      call.encode.set_truncate(truncate);
    } else if (key == "truncation_direction") {
      ATTN_RETURN_IF_ERROR(CheckDirection(value));
    } else {
      return Invalid(absl::StrCat("unknown field \"", key,
                                  "\" (accepted: inputs, raw_scores, truncate, "
                                  "truncation_direction, head_mask)"));
    }
  }
  if (!has_inputs) {
    return Invalid("inputs is required: a text, a pair [text, text], or a list of them");
  }
  // Every input a pair, or none: one batch shares one template.
  if (call.encode.text_pair_size() > 0 &&
      call.encode.text_pair_size() != call.encode.text_size()) {
    return Invalid("inputs must be all texts or all pairs [text, text], not a mix");
  }
  return call;
}

absl::Status CheckReranker(const ServedModel& model, absl::string_view instead) {
  const int64_t labels = model.encoder_spec.num_labels;
  if (model.info.kind() != v1::MODEL_KIND_ENCODER || labels == 0) {
    return Invalid(absl::StrCat(
        "model \"", model.name,
        "\" has no classification head: ranking needs a cross-encoder (config.json "
        "architectures *ForSequenceClassification)"));
  }
  if (labels != 1) {
    return Invalid(
        absl::StrCat("model \"", model.name, "\" has ", labels,
                     " labels, and reranking needs a one-label cross-encoder's "
                     "score: use ",
                     instead));
  }
  return absl::OkStatus();
}

std::vector<int64_t> RankScores(absl::Span<const float> scores, int64_t top_n) {
  std::vector<int64_t> order(scores.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  if (top_n > 0 && static_cast<size_t>(top_n) < order.size()) {
    order.resize(static_cast<size_t>(top_n));
  }
  return order;
}

std::string ScoresBody(const EmbeddingsCall& call, const v1::EncodeResponse& response,
                       const ServedModel& model) {
  int64_t labels = 0;
  const std::vector<float> scores = Scores(response, &labels);
  if (call.api == EmbeddingsCall::Api::kTeiPredict) {
    // Each input's labels, best first.
    Json inputs = Json::array();
    const auto& names = model.info.encoder().labels();
    const size_t count = labels > 0 ? scores.size() / static_cast<size_t>(labels) : 0;
    for (size_t i = 0; i < count; ++i) {
      const absl::Span<const float> row =
          absl::MakeConstSpan(scores).subspan(i * labels, static_cast<size_t>(labels));
      Json ranked = Json::array();
      for (const int64_t label : RankScores(row, 0)) {
        ranked.push_back({{"label", label < names.size() ? names[static_cast<int>(label)]
                                                         : absl::StrCat("LABEL_", label)},
                          {"score", row[static_cast<size_t>(label)]}});
      }
      inputs.push_back(std::move(ranked));
    }
    if (!call.batch && inputs.size() == 1) return JsonText(inputs[0]);
    return JsonText(inputs);
  }
  // Rerank: one score per document.
  Json results = Json::array();
  for (const int64_t index : RankScores(scores, call.top_n)) {
    const std::string& text = call.encode.text_pair(static_cast<int>(index));
    if (call.api == EmbeddingsCall::Api::kTeiRerank) {
      Json result = {{"index", index}, {"score", scores[index]}};
      if (call.return_documents) result["text"] = text;
      results.push_back(std::move(result));
      continue;
    }
    Json result = {{"index", index}, {"relevance_score", scores[index]}};
    if (call.return_documents) result["document"] = {{"text", text}};
    results.push_back(std::move(result));
  }
  if (call.api == EmbeddingsCall::Api::kTeiRerank) return JsonText(results);
  int64_t tokens = 0;
  for (const int64_t length : response.lengths()) tokens += length;
  return JsonText({{"id", response.request_id()},
                   {"model", response.model()},
                   {"results", std::move(results)},
                   {"usage", {{"total_tokens", tokens}}},
                   {"meta",
                    {{"api_version", {{"version", "2"}}},
                     {"billed_units", {{"search_units", 1}}},
                     {"tokens", {{"input_tokens", tokens}, {"output_tokens", 0}}}}}});
}

}  // namespace attnserve::server
