#include "core/text/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "core/base/status_macros.h"
#include "core/text/pipeline_tokenizer.h"
#include "core/text/unicode_text.h"
#include "core/text/wordpiece_tokenizer.h"
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

// ----------------------------------------------------------------------------
// Decoders: each step rewrites the list of tokens (tokenizers' decode_chain); the
// text is the last list joined.

class DecodeStep {
 public:
  virtual ~DecodeStep() = default;
  virtual void Apply(std::vector<std::string>* tokens) const = 0;
};

// transformers' clean_up_tokenization, as tokenizers' WordPiece decoder applies it to
// each token.
std::string Cleanup(absl::string_view token) {
  std::string out(token);
  for (const auto& [from, to] :
       std::initializer_list<std::pair<const char*, const char*>>{{" .", "."},
                                                                  {" ?", "?"},
                                                                  {" !", "!"},
                                                                  {" ,", ","},
                                                                  {" ' ", "'"},
                                                                  {" n't", "n't"},
                                                                  {" 'm", "'m"},
                                                                  {" do not", " don't"},
                                                                  {" 's", "'s"},
                                                                  {" 've", "'ve"},
                                                                  {" 're", "'re"}}) {
    out = absl::StrReplaceAll(out, {{from, to}});
  }
  return out;
}

class WordPieceStep : public DecodeStep {
 public:
  WordPieceStep(std::string prefix, bool cleanup)
      : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void Apply(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      if (i != 0) {
        if (absl::StartsWith(token, prefix_)) {
          token.erase(0, prefix_.size());
        } else {
          token.insert(0, " ");
        }
      }
      if (cleanup_) token = Cleanup(token);
    }
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

// The suffix that ends a word becomes a space (nothing after the last token).
class BpeStep : public DecodeStep {
 public:
  explicit BpeStep(std::string suffix) : suffix_(std::move(suffix)) {}
  void Apply(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      const char* replacement = i + 1 == tokens->size() ? "" : " ";
      if (!suffix_.empty()) {
        (*tokens)[i] = absl::StrReplaceAll((*tokens)[i], {{suffix_, replacement}});
      }
    }
  }

 private:
  std::string suffix_;
};

// Byte-level characters back to their bytes (a token holding any other character
// stays as it is), all tokens as one text, ill-formed UTF-8 as U+FFFD.
class ByteLevelStep : public DecodeStep {
 public:
  ByteLevelStep() {
    const auto& chars = ByteLevelChars();
    for (int b = 0; b < 256; ++b) {
      size_t i = 0;
      bytes_[DecodeUtf8(chars[b], &i)] = static_cast<char>(b);
    }
  }
  void Apply(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) {
      std::string mapped;
      bool all = true;
      for (size_t i = 0; i < token.size() && all;) {
        const auto it = bytes_.find(DecodeUtf8(token, &i));
        if (it == bytes_.end()) {
          all = false;
        } else {
          mapped.push_back(it->second);
        }
      }
      bytes += all ? mapped : token;
    }
    *tokens = {Utf8Lossy(bytes)};
  }

 private:
  absl::flat_hash_map<char32_t, char> bytes_;
};

// The replacement character becomes a space, except in the first token when a space
// was prepended at encoding, where it is dropped.
class MetaspaceStep : public DecodeStep {
 public:
  MetaspaceStep(char32_t replacement, bool prepended)
      : replacement_(replacement), prepended_(prepended) {}
  void Apply(std::vector<std::string>* tokens) const override {
    for (size_t t = 0; t < tokens->size(); ++t) {
      const std::string& token = (*tokens)[t];
      std::string out;
      for (size_t i = 0; i < token.size();) {
        const char32_t c = DecodeUtf8(token, &i);
        if (c != replacement_) {
          AppendUtf8(c, &out);
        } else if (t != 0 || !prepended_) {
          out.push_back(' ');
        }
      }
      (*tokens)[t] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool prepended_;
};

// Every occurrence of a literal, left to right, becomes `content`.
class ReplaceStep : public DecodeStep {
 public:
  ReplaceStep(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Apply(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      token = absl::StrReplaceAll(token, {{pattern_, content_}});
    }
  }

 private:
  std::string pattern_;
  std::string content_;
};

// Runs of <0xNN> tokens become their bytes when those are valid UTF-8, else one
// U+FFFD per byte.
class ByteFallbackStep : public DecodeStep {
 public:
  void Apply(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    size_t pending = 0;
    const auto flush = [&] {
      if (pending == 0) return;
      if (FirstInvalidUtf8(bytes) < 0) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < pending; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      bytes.clear();
      pending = 0;
    };
    for (std::string& token : *tokens) {
      int value = -1;
      if (token.size() == 6 && absl::StartsWith(token, "<0x") && token[5] == '>') {
        value = HexByte(token[3], token[4]);
      }
      if (value >= 0) {
        bytes.push_back(static_cast<char>(value));
        ++pending;
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    tokens->swap(out);
  }

 private:
  // The byte two hex digits (either case) write, or -1.
  static int HexByte(char high, char low) {
    const auto digit = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    const int h = digit(high), l = digit(low);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class FuseStep : public DecodeStep {
 public:
  void Apply(std::vector<std::string>* tokens) const override {
    *tokens = {absl::StrJoin(*tokens, "")};
  }
};

// Up to `start` leading and `stop` trailing `content` characters come off each token.
class StripStep : public DecodeStep {
 public:
  StripStep(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void Apply(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      std::u32string chars = ToUtf32(token);
      size_t begin = 0;
      while (begin < start_ && begin < chars.size() && chars[begin] == content_) ++begin;
      size_t end = chars.size();
      for (size_t i = 0; i < stop_ && end > begin && chars[end - 1] == content_; ++i) {
        --end;
      }
      token = ToUtf8(chars.substr(begin, end - begin));
    }
  }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

class ChainDecoder : public TokenDecoder {
 public:
  // `none`: the file names no decoder, and tokens are joined with spaces.
  ChainDecoder(std::vector<std::unique_ptr<DecodeStep>> steps, absl::Status unsupported,
               bool none)
      : steps_(std::move(steps)), unsupported_(std::move(unsupported)), none_(none) {}
  absl::StatusOr<std::string> Decode(std::vector<std::string> tokens) const override {
    if (!unsupported_.ok()) return unsupported_;
    if (none_) return absl::StrJoin(tokens, " ");
    for (const auto& step : steps_) step->Apply(&tokens);
    return absl::StrJoin(tokens, "");
  }

 private:
  std::vector<std::unique_ptr<DecodeStep>> steps_;
  absl::Status unsupported_;
  bool none_;
};

absl::Status DecoderError(absl::string_view where, absl::string_view message) {
  return absl::UnimplementedError(absl::StrCat("tokenizer.json ", where, ": ", message,
                                               "; decoding is not available"));
}

absl::StatusOr<std::string> DecoderString(const Json& json, const char* key,
                                          const char* fallback, absl::string_view where) {
  if (!json.contains(key) || json[key].is_null()) {
    if (fallback != nullptr) return std::string(fallback);
    return DecoderError(where, absl::StrCat(key, " is missing"));
  }
  if (!json[key].is_string() || FirstInvalidUtf8(json[key].get<std::string>()) >= 0) {
    return DecoderError(where, absl::StrCat(key, " must be a string"));
  }
  return json[key].get<std::string>();
}

absl::StatusOr<char32_t> DecoderChar(const Json& json, const char* key,
                                     absl::string_view where) {
  ATTN_ASSIGN_OR_RETURN(const std::string text, DecoderString(json, key, nullptr, where));
  const std::u32string chars = ToUtf32(text);
  if (chars.size() != 1) {
    return DecoderError(where, absl::StrCat(key, " \"", text, "\" is not one character"));
  }
  return chars[0];
}

absl::StatusOr<bool> DecoderBool(const Json& json, const char* key, bool fallback,
                                 absl::string_view where) {
  if (!json.contains(key) || json[key].is_null()) return fallback;
  if (!json[key].is_boolean()) {
    return DecoderError(where, absl::StrCat(key, " must be true or false"));
  }
  return json[key].get<bool>();
}

absl::StatusOr<size_t> DecoderCount(const Json& json, const char* key,
                                    absl::string_view where) {
  if (!json.contains(key) || !json[key].is_number_unsigned()) {
    return DecoderError(where, absl::StrCat(key, " must be a count"));
  }
  return static_cast<size_t>(std::min<uint64_t>(json[key].get<uint64_t>(), 1u << 20));
}

// Appends the steps of one decoder (a Sequence's, flattened).
absl::Status ReadDecodeSteps(const Json& json, const std::string& where, int depth,
                             std::vector<std::unique_ptr<DecodeStep>>* steps) {
  if (depth > 8) return DecoderError(where, "decoders nest deeper than 8");
  const std::string type =
      json.is_object() && json.contains("type") && json["type"].is_string()
          ? json["type"].get<std::string>()
          : "(none)";
  if (type == "Sequence") {
    if (!json.contains("decoders") || !json["decoders"].is_array()) {
      return DecoderError(where, "Sequence needs a decoders list");
    }
    int i = 0;
    for (const Json& step : json["decoders"]) {
      ATTN_RETURN_IF_ERROR(ReadDecodeSteps(
          step, absl::StrCat(where, ".decoders[", i++, "]"), depth + 1, steps));
    }
    return absl::OkStatus();
  }
  if (type == "WordPiece") {
    ATTN_ASSIGN_OR_RETURN(std::string prefix, DecoderString(json, "prefix", "##", where));
    ATTN_ASSIGN_OR_RETURN(const bool cleanup, DecoderBool(json, "cleanup", true, where));
    steps->push_back(std::make_unique<WordPieceStep>(std::move(prefix), cleanup));
    return absl::OkStatus();
  }
  if (type == "BPEDecoder") {
    ATTN_ASSIGN_OR_RETURN(std::string suffix,
                          DecoderString(json, "suffix", "</w>", where));
    steps->push_back(std::make_unique<BpeStep>(std::move(suffix)));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    steps->push_back(std::make_unique<ByteLevelStep>());
    return absl::OkStatus();
  }
  if (type == "Metaspace") {
    ATTN_ASSIGN_OR_RETURN(const char32_t replacement,
                          DecoderChar(json, "replacement", where));
    bool prepended = true;
    if (json.contains("prepend_scheme") && !json["prepend_scheme"].is_null()) {
      const std::string scheme = json["prepend_scheme"].is_string()
                                     ? json["prepend_scheme"].get<std::string>()
                                     : "";
      if (scheme != "always" && scheme != "first" && scheme != "never") {
        return DecoderError(where, absl::StrCat("prepend_scheme \"", scheme,
                                                "\" is not always, first or never"));
      }
      prepended = scheme != "never";
    }
    // Files older than prepend_scheme say add_prefix_space; false means never.
    ATTN_ASSIGN_OR_RETURN(const bool add,
                          DecoderBool(json, "add_prefix_space", true, where));
    if (!add) prepended = false;
    steps->push_back(std::make_unique<MetaspaceStep>(replacement, prepended));
    return absl::OkStatus();
  }
  if (type == "Replace") {
    if (!json.contains("pattern") || !json["pattern"].is_object() ||
        !json["pattern"].contains("String")) {
      return DecoderError(where,
                          "Replace with a Regex pattern is not supported ({\"String\": "
                          "...} only)");
    }
    ATTN_ASSIGN_OR_RETURN(std::string pattern,
                          DecoderString(json["pattern"], "String", nullptr, where));
    ATTN_ASSIGN_OR_RETURN(std::string content,
                          DecoderString(json, "content", nullptr, where));
    if (pattern.empty()) return DecoderError(where, "pattern.String is empty");
    steps->push_back(
        std::make_unique<ReplaceStep>(std::move(pattern), std::move(content)));
    return absl::OkStatus();
  }
  if (type == "ByteFallback") {
    steps->push_back(std::make_unique<ByteFallbackStep>());
    return absl::OkStatus();
  }
  if (type == "Fuse") {
    steps->push_back(std::make_unique<FuseStep>());
    return absl::OkStatus();
  }
  if (type == "Strip") {
    ATTN_ASSIGN_OR_RETURN(const char32_t content, DecoderChar(json, "content", where));
    ATTN_ASSIGN_OR_RETURN(const size_t start, DecoderCount(json, "start", where));
    ATTN_ASSIGN_OR_RETURN(const size_t stop, DecoderCount(json, "stop", where));
    steps->push_back(std::make_unique<StripStep>(content, start, stop));
    return absl::OkStatus();
  }
  return DecoderError(where, absl::StrCat("type \"", type,
                                          "\" is not supported (WordPiece, BPEDecoder, "
                                          "ByteLevel, Metaspace, Replace, ByteFallback, "
                                          "Fuse, Strip, Sequence)"));
}

}  // namespace

std::unique_ptr<TokenDecoder> TokenDecoder::FromJson(absl::string_view decoder_json) {
  const Json json = Json::parse(decoder_json.begin(), decoder_json.end(), nullptr,
                                /*allow_exceptions=*/false);
  std::vector<std::unique_ptr<DecodeStep>> steps;
  if (json.is_null()) {
    return std::make_unique<ChainDecoder>(std::move(steps), absl::OkStatus(), true);
  }
  absl::Status status = json.is_discarded() || !json.is_object()
                            ? DecoderError("decoder", "not a JSON object")
                            : ReadDecodeSteps(json, "decoder", 0, &steps);
  if (!status.ok()) steps.clear();
  return std::make_unique<ChainDecoder>(std::move(steps), std::move(status), false);
}

std::unique_ptr<TokenDecoder> TokenDecoder::WordPiece(std::string prefix, bool cleanup) {
  std::vector<std::unique_ptr<DecodeStep>> steps;
  steps.push_back(std::make_unique<WordPieceStep>(std::move(prefix), cleanup));
  return std::make_unique<ChainDecoder>(std::move(steps), absl::OkStatus(), false);
}

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
