#include "core/text/wordpiece_tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "core/text/unicode_text.h"
#include "nlohmann/json.hpp"

namespace attnserve::core {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view file, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", message));
}

// A special token as tokenizer_config.json writes it: a string or {"content": ...}.
std::optional<std::string> TokenText(const Json& json, const char* key) {
  if (!json.contains(key)) return std::nullopt;
  const Json& value = json[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

absl::StatusOr<bool> OptionalBool(const Json& object, const char* key, bool fallback,
                                  absl::string_view where) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  if (!object[key].is_boolean()) {
    return Invalid(where, absl::StrCat(key, " must be true or false"));
  }
  return object[key].get<bool>();
}

// Lowercasing, CJK spacing and accent stripping, under the names `object` gives them
// (tokenizer_config.json's and tokenizer.json's differ).
absl::Status ReadCaseAndScripts(const Json& object, const char* lowercase_key,
                                const char* chinese_key, absl::string_view where,
                                WordPieceTokenizer::Options* options) {
  ATTN_ASSIGN_OR_RETURN(options->lowercase,
                        OptionalBool(object, lowercase_key, true, where));
  ATTN_ASSIGN_OR_RETURN(options->handle_chinese_chars,
                        OptionalBool(object, chinese_key, true, where));
  if (object.contains("strip_accents") && !object["strip_accents"].is_null()) {
    ATTN_ASSIGN_OR_RETURN(options->strip_accents,
                          OptionalBool(object, "strip_accents", true, where));
  }
  return absl::OkStatus();
}

// The special token of a TemplateProcessing item ({"SpecialToken": {"id": ...}}).
std::optional<std::string> TemplateSpecial(const Json& item) {
  if (!item.is_object() || !item.contains("SpecialToken")) return std::nullopt;
  const Json& special = item["SpecialToken"];
  if (!special.is_object() || !special.contains("id") || !special["id"].is_string()) {
    return std::nullopt;
  }
  return special["id"].get<std::string>();
}

}  // namespace

absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> WordPieceTokenizer::FromFolder(
    const std::string& folder) {
  const std::string json_path = folder + "/tokenizer.json";
  if (std::ifstream(json_path).good()) {
    ATTN_ASSIGN_OR_RETURN(const std::string json, ReadTokenizerFile(json_path));
    return FromTokenizerJson(json);
  }
  const std::string vocab_path = folder + "/vocab.txt";
  if (!std::ifstream(vocab_path).good()) {
    return absl::NotFoundError(
        absl::StrCat(folder, " holds neither tokenizer.json nor vocab.txt"));
  }
  Options options;
  const std::string config_path = folder + "/tokenizer_config.json";
  if (std::ifstream(config_path).good()) {
    constexpr absl::string_view kFile = "tokenizer_config.json";
    ATTN_ASSIGN_OR_RETURN(const std::string text, ReadTokenizerFile(config_path));
    const Json config = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return Invalid(kFile, "not a JSON object");
    }
    if (config.contains("tokenizer_class") && config["tokenizer_class"].is_string()) {
      const std::string type = config["tokenizer_class"].get<std::string>();
      if (type != "BertTokenizer" && type != "BertTokenizerFast") {
        return Invalid(kFile, absl::StrCat("tokenizer_class \"", type,
                                           "\" is not supported (BertTokenizer only)"));
      }
    }
    ATTN_RETURN_IF_ERROR(ReadCaseAndScripts(config, "do_lower_case",
                                            "tokenize_chinese_chars", kFile, &options));
    options.special_tokens.clear();
    for (const char* key :
         {"pad_token", "unk_token", "cls_token", "sep_token", "mask_token"}) {
      if (const auto token = TokenText(config, key)) {
        options.special_tokens.push_back(*token);
        if (std::string(key) == "unk_token") options.unk_token = *token;
        if (std::string(key) == "cls_token") options.cls_token = *token;
        if (std::string(key) == "sep_token") options.sep_token = *token;
      }
    }
    for (const std::string& token :
         {options.unk_token, options.cls_token, options.sep_token}) {
      if (std::find(options.special_tokens.begin(), options.special_tokens.end(),
                    token) == options.special_tokens.end()) {
        options.special_tokens.push_back(token);
      }
    }
  }
  ATTN_ASSIGN_OR_RETURN(const std::string vocab, ReadTokenizerFile(vocab_path));
  return FromVocab(vocab, options);
}

absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> WordPieceTokenizer::FromTokenizerJson(
    absl::string_view text) {
  constexpr absl::string_view kFile = "tokenizer.json";
  const Json json = Json::parse(text.begin(), text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object())
    return Invalid(kFile, "not a JSON object");
  Options options;

  const auto type_of = [](const Json& object) -> std::string {
    if (object.is_object() && object.contains("type") && object["type"].is_string()) {
      return object["type"].get<std::string>();
    }
    return object.is_null() ? "null" : "(none)";
  };
  const Json empty = Json::object();
  const Json& normalizer = json.contains("normalizer") ? json["normalizer"] : empty;
  if (type_of(normalizer) != "BertNormalizer") {
    return Invalid(kFile, absl::StrCat("normalizer type \"", type_of(normalizer),
                                       "\" is not supported (BertNormalizer only)"));
  }
  const std::string where = absl::StrCat(kFile, " normalizer");
  ATTN_ASSIGN_OR_RETURN(options.clean_text,
                        OptionalBool(normalizer, "clean_text", true, where));
  ATTN_RETURN_IF_ERROR(ReadCaseAndScripts(normalizer, "lowercase", "handle_chinese_chars",
                                          where, &options));
  const Json& pre = json.contains("pre_tokenizer") ? json["pre_tokenizer"] : empty;
  if (type_of(pre) != "BertPreTokenizer") {
    return Invalid(kFile, absl::StrCat("pre_tokenizer type \"", type_of(pre),
                                       "\" is not supported (BertPreTokenizer only)"));
  }

  const Json& model = json.contains("model") ? json["model"] : empty;
  if (type_of(model) != "WordPiece") {
    return Invalid(kFile, absl::StrCat("model type \"", type_of(model),
                                       "\" is not supported (WordPiece only)"));
  }
  if (model.contains("unk_token")) {
    if (!model["unk_token"].is_string())
      return Invalid(kFile, "model.unk_token must be a string");
    options.unk_token = model["unk_token"].get<std::string>();
  }
  if (model.contains("continuing_subword_prefix")) {
    if (!model["continuing_subword_prefix"].is_string()) {
      return Invalid(kFile, "model.continuing_subword_prefix must be a string");
    }
    options.continuing_subword_prefix =
        model["continuing_subword_prefix"].get<std::string>();
  }
  if (model.contains("max_input_chars_per_word")) {
    if (!model["max_input_chars_per_word"].is_number_unsigned()) {
      return Invalid(kFile, "model.max_input_chars_per_word must be a positive integer");
    }
    options.max_input_chars_per_word = static_cast<int64_t>(std::min<uint64_t>(
        model["max_input_chars_per_word"].get<uint64_t>(), uint64_t{1} << 40));
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Invalid(kFile, "model.vocab must be an object of token: id");
  }
  std::vector<std::pair<std::string, int64_t>> vocab;
  vocab.reserve(model["vocab"].size());
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > (uint64_t{1} << 31)) {
      return Invalid(
          kFile, absl::StrCat("model.vocab[\"", token, "\"] must be an id in [0, 2^31]"));
    }
    vocab.emplace_back(token, static_cast<int64_t>(id.get<uint64_t>()));
  }

  // [CLS] $A [SEP]: TemplateProcessing's single template, or BertProcessing.
  const Json& post = json.contains("post_processor") ? json["post_processor"] : empty;
  const std::string post_type = type_of(post);
  if (post_type == "TemplateProcessing") {
    const Json& single = post.contains("single") ? post["single"] : empty;
    const bool shaped = single.is_array() && single.size() == 3 &&
                        TemplateSpecial(single[0]) && TemplateSpecial(single[2]) &&
                        single[1].is_object() && single[1].contains("Sequence");
    if (!shaped) {
      return Invalid(
          kFile,
          "post_processor.single must be [SpecialToken, Sequence, SpecialToken] "
          "(BERT's [CLS] $A [SEP])");
    }
    options.cls_token = *TemplateSpecial(single[0]);
    options.sep_token = *TemplateSpecial(single[2]);
  } else if (post_type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      if (!post.contains(key) || !post[key].is_array() || post[key].empty() ||
          !post[key][0].is_string()) {
        return Invalid(kFile,
                       absl::StrCat("post_processor.", key, " must be [token, id]"));
      }
    }
    options.cls_token = post["cls"][0].get<std::string>();
    options.sep_token = post["sep"][0].get<std::string>();
  } else {
    return Invalid(kFile, absl::StrCat("post_processor type \"", post_type,
                                       "\" is not supported (TemplateProcessing or "
                                       "BertProcessing with [CLS] $A [SEP])"));
  }

  options.special_tokens.clear();
  std::vector<std::string> not_special;
  if (json.contains("added_tokens")) {
    if (!json["added_tokens"].is_array())
      return Invalid(kFile, "added_tokens must be a list");
    for (const Json& token : json["added_tokens"]) {
      if (!token.is_object() || !token.contains("content") ||
          !token["content"].is_string()) {
        return Invalid(kFile, "each of added_tokens needs a content string");
      }
      const std::string content = token["content"].get<std::string>();
      for (const char* flag : {"single_word", "lstrip", "rstrip", "normalized"}) {
        ATTN_ASSIGN_OR_RETURN(
            const bool set,
            OptionalBool(token, flag, false, absl::StrCat(kFile, " added_tokens")));
        if (set) {
          return Invalid(kFile, absl::StrCat("added token \"", content, "\" sets ", flag,
                                             ", which is not supported (BERT's special "
                                             "tokens match the raw text as they are)"));
        }
      }
      ATTN_ASSIGN_OR_RETURN(
          const bool special,
          OptionalBool(token, "special", false, absl::StrCat(kFile, " added_tokens")));
      if (!special) not_special.push_back(content);
      options.special_tokens.push_back(content);
    }
  }
  auto tokenizer = std::unique_ptr<WordPieceTokenizer>(new WordPieceTokenizer(options));
  ATTN_RETURN_IF_ERROR(tokenizer->Build(std::move(vocab)));
  for (const std::string& content : not_special) {
    tokenizer->special_ids_.erase(tokenizer->words_.at(content));
  }
  tokenizer->decoder_ =
      TokenDecoder::FromJson(json.contains("decoder") ? json["decoder"].dump() : "null");
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> WordPieceTokenizer::FromVocab(
    absl::string_view text, const Options& options) {
  std::vector<std::pair<std::string, int64_t>> vocab;
  int64_t id = 0;
  absl::ConsumeSuffix(&text, "\n");
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    absl::ConsumeSuffix(&line, "\r");
    if (line.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab.txt: line ", id + 1, " is empty"));
    }
    vocab.emplace_back(std::string(line), id++);
  }
  auto tokenizer = std::unique_ptr<WordPieceTokenizer>(new WordPieceTokenizer(options));
  ATTN_RETURN_IF_ERROR(tokenizer->Build(std::move(vocab)));
  // transformers' BertTokenizerFast decodes a vocab.txt's ids this way.
  tokenizer->decoder_ = TokenDecoder::WordPiece(options.continuing_subword_prefix,
                                                /*cleanup=*/true);
  return tokenizer;
}

absl::string_view WordPieceTokenizer::TokenOf(int64_t id) const {
  const auto found = tokens_.find(id);
  return found == tokens_.end() ? absl::string_view() : absl::string_view(found->second);
}

absl::Status WordPieceTokenizer::Build(
    std::vector<std::pair<std::string, int64_t>> vocab) {
  if (options_.max_input_chars_per_word < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_input_chars_per_word must be >= 1, got ",
                     options_.max_input_chars_per_word));
  }
  if (options_.continuing_subword_prefix.empty()) {
    return absl::InvalidArgumentError("continuing_subword_prefix must not be empty");
  }
  if (vocab.empty()) return absl::InvalidArgumentError("the vocabulary is empty");
  strip_accents_ = options_.strip_accents.value_or(options_.lowercase);
  const std::string& prefix = options_.continuing_subword_prefix;
  for (auto& [token, id] : vocab) {
    if (token.empty())
      return absl::InvalidArgumentError("the vocabulary holds an empty token");
    if (FirstInvalidUtf8(token) >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocabulary token ", id, " is not valid UTF-8"));
    }
    max_id_ = std::max(max_id_, id);
    longest_piece_bytes_ = std::max(longest_piece_bytes_, token.size());
    if (token.size() > prefix.size() && absl::StartsWith(token, prefix)) {
      continuations_.emplace(token.substr(prefix.size()), id);
    }
    if (!words_.emplace(token, id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("the vocabulary holds \"", token, "\" twice"));
    }
  }
  tokens_.reserve(vocab.size());
  for (auto& [token, id] : vocab) tokens_.emplace(id, std::move(token));
  const auto id_of = [this](const std::string& token, const char* role,
                            int64_t* id) -> absl::Status {
    const auto found = words_.find(token);
    if (found == words_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(role, " \"", token, "\" is not in the vocabulary"));
    }
    *id = found->second;
    return absl::OkStatus();
  };
  ATTN_RETURN_IF_ERROR(id_of(options_.unk_token, "unk_token", &unk_id_));
  ATTN_RETURN_IF_ERROR(id_of(options_.cls_token, "cls_token", &cls_id_));
  ATTN_RETURN_IF_ERROR(id_of(options_.sep_token, "sep_token", &sep_id_));
  for (const std::string& token : options_.special_tokens) {
    if (token.empty()) return absl::InvalidArgumentError("a special token is empty");
    int64_t id = 0;
    ATTN_RETURN_IF_ERROR(id_of(token, "special token", &id));
    specials_.emplace_back(token, id);
    special_ids_.insert(id);
    const auto first = static_cast<unsigned char>(token[0]);
    special_first_bytes_[first / 64] |= uint64_t{1} << (first % 64);
  }
  std::stable_sort(specials_.begin(), specials_.end(), [](const auto& a, const auto& b) {
    return a.first.size() > b.first.size();
  });
  return absl::OkStatus();
}

void WordPieceTokenizer::NormalizeInto(absl::string_view text,
                                       std::u32string* out) const {
  HfBertNormalize(text,
                  {options_.clean_text, options_.handle_chinese_chars, strip_accents_,
                   options_.lowercase},
                  out);
}

absl::StatusOr<std::string> WordPieceTokenizer::Normalize(absl::string_view text) const {
  ATTN_RETURN_IF_ERROR(CheckUtf8(text));
  std::u32string normalized;
  NormalizeInto(text, &normalized);
  std::string out;
  for (const char32_t c : normalized) AppendUtf8(c, &out);
  return out;
}

std::vector<std::string> WordPieceTokenizer::PreTokenize(
    absl::string_view normalized) const {
  std::vector<std::string> words;
  std::string word;
  for (size_t i = 0; i < normalized.size();) {
    const char32_t c = DecodeUtf8(normalized, &i);
    const uint8_t flags = HfCharFlags(c);
    if (flags & (kSpace | kPunct)) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
      if (flags & kPunct && !(flags & kSpace)) {
        std::string punct;
        AppendUtf8(c, &punct);
        words.push_back(std::move(punct));
      }
      continue;
    }
    AppendUtf8(c, &word);
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

absl::Status WordPieceTokenizer::AppendTextPieces(absl::string_view text,
                                                  int64_t max_pieces,
                                                  std::vector<int64_t>* ids,
                                                  int64_t* pieces,
                                                  std::vector<Token>* tokens) const {
  ATTN_RETURN_IF_ERROR(CheckUtf8(text));
  thread_local std::u32string normalized;
  std::vector<std::pair<int64_t, int64_t>> origins;
  // The text between special tokens is normalized and split; each special token is
  // its own id.
  size_t start = 0;
  const auto flush = [&](size_t end) {
    if (end > start) {
      const absl::string_view span = text.substr(start, end - start);
      NormalizeInto(span, &normalized);
      if (tokens != nullptr) {
        NormalizedOrigins(span, static_cast<int64_t>(start), normalized, &origins);
      }
      AppendPieces(normalized, max_pieces, ids, pieces,
                   tokens != nullptr ? &origins : nullptr, tokens);
    }
  };
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if ((special_first_bytes_[byte / 64] >> (byte % 64)) & 1) {
      bool matched = false;
      for (const auto& [token, id] : specials_) {
        if (text.substr(i, token.size()) == token) {
          flush(i);
          if (*pieces < max_pieces) {
            ids->push_back(id);
            if (tokens != nullptr) {
              tokens->push_back({id, special_ids_.contains(id), static_cast<int64_t>(i),
                                 static_cast<int64_t>(i + token.size())});
            }
          }
          ++*pieces;
          i += token.size();
          start = i;
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    ++i;
  }
  flush(text.size());
  return absl::OkStatus();
}

absl::StatusOr<WordPieceTokenizer::Encoding> WordPieceTokenizer::Encode(
    absl::string_view text, int64_t max_tokens, std::vector<int64_t>* ids) const {
  const size_t before = ids->size();
  ids->push_back(cls_id_);
  // Room for the pieces: everything but [CLS] and [SEP].
  const int64_t max_pieces = std::max<int64_t>(max_tokens - 2, 0);
  int64_t pieces = 0;
  if (absl::Status status = AppendTextPieces(text, max_pieces, ids, &pieces);
      !status.ok()) {
    ids->resize(before);
    return status;
  }
  ids->push_back(sep_id_);
  Encoding encoding;
  encoding.tokens = pieces + 2;
  encoding.truncated = pieces > max_pieces;
  return encoding;
}

absl::StatusOr<WordPieceTokenizer::Encoding> WordPieceTokenizer::Tokenize(
    absl::string_view text, int64_t max_tokens, bool add_special_tokens,
    std::vector<Token>* tokens) const {
  tokens->clear();
  const int64_t added = add_special_tokens ? 2 : 0;
  const int64_t max_pieces = std::max<int64_t>(max_tokens - added, 0);
  if (add_special_tokens) tokens->push_back({cls_id_, true, -1, -1});
  std::vector<int64_t> ids;
  int64_t pieces = 0;
  if (absl::Status status = AppendTextPieces(text, max_pieces, &ids, &pieces, tokens);
      !status.ok()) {
    tokens->clear();
    return status;
  }
  if (add_special_tokens) tokens->push_back({sep_id_, true, -1, -1});
  Encoding encoding;
  encoding.tokens = pieces + added;
  encoding.truncated = pieces > max_pieces;
  return encoding;
}

absl::StatusOr<std::string> WordPieceTokenizer::Decode(absl::Span<const int64_t> ids,
                                                       bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > max_id_) {
      return absl::InvalidArgumentError(
          absl::StrCat("ids[", i, "]: id ", ids[i], " is not in [0, ", max_id_, "]"));
    }
    const auto it = tokens_.find(ids[i]);
    if (it == tokens_.end()) continue;
    if (skip_special_tokens && special_ids_.contains(ids[i])) continue;
    tokens.push_back(it->second);
  }
  return decoder_->Decode(std::move(tokens));
}

absl::StatusOr<WordPieceTokenizer::Encoding> WordPieceTokenizer::EncodePair(
    absl::string_view first, absl::string_view second, int64_t max_tokens,
    std::vector<int64_t>* ids, std::vector<int64_t>* types) const {
  // Room for the pieces: everything but [CLS] and two [SEP]. Neither text keeps more
  // than that, so no more is collected; every piece is counted.
  const int64_t budget = std::max<int64_t>(max_tokens - 3, 0);
  thread_local std::vector<int64_t> a, b;
  a.clear();
  b.clear();
  int64_t n1 = 0, n2 = 0;
  ATTN_RETURN_IF_ERROR(AppendTextPieces(first, budget, &a, &n1));
  ATTN_RETURN_IF_ERROR(AppendTextPieces(second, budget, &b, &n2));
  int64_t keep1 = 0, keep2 = 0;
  PairKeep(n1, n2, budget, &keep1, &keep2);
  ids->push_back(cls_id_);
  ids->insert(ids->end(), a.begin(), a.begin() + keep1);
  ids->push_back(sep_id_);
  types->insert(types->end(), static_cast<size_t>(keep1 + 2), 0);
  ids->insert(ids->end(), b.begin(), b.begin() + keep2);
  ids->push_back(sep_id_);
  types->insert(types->end(), static_cast<size_t>(keep2 + 1), 1);
  Encoding encoding;
  encoding.tokens = n1 + n2 + 3;
  encoding.truncated = keep1 < n1 || keep2 < n2;
  return encoding;
}

void WordPieceTokenizer::AppendPieces(
    const std::u32string& normalized, int64_t max_pieces, std::vector<int64_t>* ids,
    int64_t* count, const std::vector<std::pair<int64_t, int64_t>>* origins,
    std::vector<Token>* tokens) const {
  thread_local std::string word;
  word.clear();
  // One per byte of `word`, on Tokenize's path only.
  std::vector<std::pair<int64_t, int64_t>> word_origins;
  int64_t characters = 0;
  const auto end_word = [&] {
    if (characters > 0) {
      AppendWord(word, characters, max_pieces, ids, count, word_origins, tokens);
    }
    word.clear();
    word_origins.clear();
    characters = 0;
  };
  const auto add = [&](char32_t c, size_t k) {
    const size_t before = word.size();
    AppendUtf8(c, &word);
    if (origins != nullptr) {
      word_origins.insert(word_origins.end(), word.size() - before, (*origins)[k]);
    }
  };
  for (size_t k = 0; k < normalized.size(); ++k) {
    const char32_t c = normalized[k];
    const uint8_t flags = HfCharFlags(c);
    if (flags & (kSpace | kPunct)) {
      end_word();
      if ((flags & kPunct) && !(flags & kSpace)) {
        add(c, k);
        characters = 1;
        end_word();
      }
      continue;
    }
    add(c, k);
    ++characters;
  }
  end_word();
}

void WordPieceTokenizer::AppendWord(
    absl::string_view word, int64_t characters, int64_t max_pieces,
    std::vector<int64_t>* ids, int64_t* count,
    const std::vector<std::pair<int64_t, int64_t>>& word_origins,
    std::vector<Token>* tokens) const {
  // A piece covers the bytes [start, end) of the word.
  const auto emit = [&](int64_t id, size_t start, size_t end) {
    if (*count < max_pieces) {
      ids->push_back(id);
      if (tokens != nullptr) {
        tokens->push_back(
            {id, false, word_origins[start].first, word_origins[end - 1].second});
      }
    }
    ++*count;
  };
  if (characters > options_.max_input_chars_per_word) {
    emit(unk_id_, 0, word.size());
    return;
  }
  // Greedy longest match first: the longest vocabulary entry that starts the rest of
  // the word, "##"-continued after the first.
  thread_local std::vector<std::pair<int64_t, size_t>> found;  // id, end byte
  found.clear();
  size_t start = 0;
  while (start < word.size()) {
    const auto& table = start == 0 ? words_ : continuations_;
    size_t end = std::min(word.size(), start + longest_piece_bytes_);
    // Back to a character boundary.
    while (end > start && end < word.size() &&
           (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80) {
      --end;
    }
    int64_t id = -1;
    while (end > start) {
      const auto hit = table.find(word.substr(start, end - start));
      if (hit != table.end()) {
        id = hit->second;
        break;
      }
      do {
        --end;
      } while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80);
    }
    if (id < 0) {
      emit(unk_id_, 0, word.size());
      return;
    }
    found.emplace_back(id, end);
    start = end;
  }
  size_t piece_start = 0;
  for (const auto& [id, piece_end] : found) {
    emit(id, piece_start, piece_end);
    piece_start = piece_end;
  }
}

void WordPieceTokenizer::NormalizedOrigins(
    absl::string_view text, int64_t base, const std::u32string& normalized,
    std::vector<std::pair<int64_t, int64_t>>* origins) const {
  // BertNormalizer's steps map each character to characters of its own (tokenizers'
  // alignments give each the character's bytes): run them one character at a time.
  origins->clear();
  std::u32string mine, steps, each;
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    char32_t c = DecodeUtf8(text, &i);
    const uint8_t flags = HfCharFlags(c);
    steps.clear();
    if (options_.clean_text && (flags & kRemoved)) continue;
    if (options_.clean_text && (flags & kSpace)) c = U' ';
    if (options_.handle_chinese_chars && (flags & kChinese)) {
      steps = {U' ', c, U' '};
    } else {
      steps = {c};
    }
    if (strip_accents_ && c >= 0x80) {
      HfNormalize(NormalForm::kNfd, &steps);
      steps.erase(
          std::remove_if(steps.begin(), steps.end(),
                         [](char32_t d) { return (HfCharFlags(d) & kMark) != 0; }),
          steps.end());
    }
    if (options_.lowercase) {
      each.clear();
      for (const char32_t d : steps) AppendLowercase(d, &each);
      steps.swap(each);
    }
    mine += steps;
    origins->insert(origins->end(), steps.size(),
                    {base + static_cast<int64_t>(at), base + static_cast<int64_t>(i)});
  }
  // Canonical reordering across characters (marks only) can make the whole text differ
  // from the per-character one: each position keeps its character's bytes then, or
  // the whole span's when even the count differs.
  if (mine.size() != normalized.size()) {
    origins->assign(normalized.size(), {base, base + static_cast<int64_t>(text.size())});
  }
}

}  // namespace attnserve::core
