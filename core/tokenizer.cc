#include "core/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/pipeline_tokenizer.h"
#include "core/status_macros.h"
#include "core/wordpiece_tokenizer.h"
#include "nlohmann/json.hpp"

namespace attnserve::core {
namespace {

using Json = nlohmann::json;

std::string TypeOf(const Json& json, const char* key) {
  if (!json.contains(key)) return "";
  const Json& part = json[key];
  if (part.is_object() && part.contains("type") && part["type"].is_string()) {
    return part["type"].get<std::string>();
  }
  return "";
}

}  // namespace

absl::StatusOr<std::string> ReadTokenizerFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void PairKeep(int64_t n1, int64_t n2, int64_t budget, int64_t* keep1, int64_t* keep2) {
  *keep1 = n1;
  *keep2 = n2;
  if (n1 + n2 <= budget) return;
  int64_t shorter = std::min(n1, n2);
  int64_t longer = shorter > budget ? shorter : std::max(shorter, budget - shorter);
  if (shorter + longer > budget) {
    shorter = budget / 2;
    longer = shorter + budget % 2;
  }
  *keep1 = std::min(n1, n1 > n2 ? longer : shorter);
  *keep2 = std::min(n2, n1 > n2 ? shorter : longer);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFolder(
    const std::string& folder) {
  const std::string json_path = folder + "/tokenizer.json";
  if (!std::ifstream(json_path).good()) {
    ATTN_ASSIGN_OR_RETURN(auto wordpiece, WordPieceTokenizer::FromFolder(folder));
    return std::unique_ptr<Tokenizer>(std::move(wordpiece));
  }
  ATTN_ASSIGN_OR_RETURN(const std::string text, ReadTokenizerFile(json_path));
  const Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: not a JSON object");
  }
  // BERT's recipe keeps its own implementation (as fast as it is exact), as long as
  // its pairs and added tokens are BERT's too (MPNet's RobertaProcessing and <mask>
  // with lstrip go through the pipeline).
  const std::string post = TypeOf(json, "post_processor");
  bool plain_added_tokens = true;
  if (json.contains("added_tokens") && json["added_tokens"].is_array()) {
    for (const Json& token : json["added_tokens"]) {
      for (const char* flag : {"single_word", "lstrip", "rstrip", "normalized"}) {
        if (token.is_object() && token.contains(flag) && token[flag].is_boolean() &&
            token[flag].get<bool>()) {
          plain_added_tokens = false;
        }
      }
    }
  }
  if (TypeOf(json, "normalizer") == "BertNormalizer" &&
      TypeOf(json, "pre_tokenizer") == "BertPreTokenizer" &&
      TypeOf(json, "model") == "WordPiece" && plain_added_tokens &&
      (post == "BertProcessing" || post == "TemplateProcessing")) {
    ATTN_ASSIGN_OR_RETURN(auto wordpiece, WordPieceTokenizer::FromTokenizerJson(text));
    return std::unique_ptr<Tokenizer>(std::move(wordpiece));
  }
  PipelineTokenizer::Options options;
  const std::string config_path = folder + "/tokenizer_config.json";
  if (std::ifstream(config_path).good()) {
    ATTN_ASSIGN_OR_RETURN(const std::string config_text, ReadTokenizerFile(config_path));
    const Json config = Json::parse(config_text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: not a JSON object");
    }
    if (config.contains("truncation_side")) {
      const Json& side = config["truncation_side"];
      if (!side.is_string() ||
          (side.get<std::string>() != "left" && side.get<std::string>() != "right")) {
        return absl::InvalidArgumentError(
            "tokenizer_config.json: truncation_side must be \"left\" or \"right\"");
      }
      options.truncate_left = side.get<std::string>() == "left";
    }
  }
  ATTN_ASSIGN_OR_RETURN(auto pipeline,
                        PipelineTokenizer::FromTokenizerJson(text, options));
  return std::unique_ptr<Tokenizer>(std::move(pipeline));
}

}  // namespace attnserve::core
