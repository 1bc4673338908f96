#include "core/wordpiece_tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/status_macros.h"
#include "core/unicode_text.h"
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
      options.special_tokens.push_back(content);
    }
  }
  auto tokenizer = std::unique_ptr<WordPieceTokenizer>(new WordPieceTokenizer(options));
  ATTN_RETURN_IF_ERROR(tokenizer->Build(std::move(vocab)));
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
                                                  int64_t* pieces) const {
  ATTN_RETURN_IF_ERROR(CheckUtf8(text));
  thread_local std::u32string normalized;
  // The text between special tokens is normalized and split; each special token is
  // its own id.
  size_t start = 0;
  const auto flush = [&](size_t end) {
    if (end > start) {
      NormalizeInto(text.substr(start, end - start), &normalized);
      AppendPieces(normalized, max_pieces, ids, pieces);
    }
  };
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if ((special_first_bytes_[byte / 64] >> (byte % 64)) & 1) {
      bool matched = false;
      for (const auto& [token, id] : specials_) {
        if (text.substr(i, token.size()) == token) {
          flush(i);
          if (*pieces < max_pieces) ids->push_back(id);
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

void WordPieceTokenizer::AppendPieces(const std::u32string& normalized,
                                      int64_t max_pieces, std::vector<int64_t>* ids,
                                      int64_t* tokens) const {
  thread_local std::string word;
  word.clear();
  int64_t characters = 0;
  const auto end_word = [&] {
    if (characters > 0) AppendWord(word, characters, max_pieces, ids, tokens);
    word.clear();
    characters = 0;
  };
  for (const char32_t c : normalized) {
    const uint8_t flags = HfCharFlags(c);
    if (flags & (kSpace | kPunct)) {
      end_word();
      if ((flags & kPunct) && !(flags & kSpace)) {
        AppendUtf8(c, &word);
        characters = 1;
        end_word();
      }
      continue;
    }
    AppendUtf8(c, &word);
    ++characters;
  }
  end_word();
}

void WordPieceTokenizer::AppendWord(absl::string_view word, int64_t characters,
                                    int64_t max_pieces, std::vector<int64_t>* ids,
                                    int64_t* tokens) const {
  const auto emit = [&](int64_t id) {
    if (*tokens < max_pieces) ids->push_back(id);
    ++*tokens;
  };
  if (characters > options_.max_input_chars_per_word) {
    emit(unk_id_);
    return;
  }
  // Greedy longest match first: the longest vocabulary entry that starts the rest of
  // the word, "##"-continued after the first.
  thread_local std::vector<int64_t> found;
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
      emit(unk_id_);
      return;
    }
    found.push_back(id);
    start = end;
  }
  for (const int64_t id : found) emit(id);
}

}  // namespace attnserve::core
