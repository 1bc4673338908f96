#include "server/frontends/tokenize_api.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/base/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/frontends/kserve_http_request.h"
#include "server/pipeline/proto_convert.h"

namespace attnserve::server {
namespace {

using Json = nlohmann::json;

// The most text one /tokenize call may hold, and the most ids one /decode call may: an
// answer is a few dozen bytes per token, so this bounds it to tens of MiB.
constexpr int64_t kMaxTokenizeBytes = int64_t{256} << 10;
constexpr int64_t kMaxDecodeIds = int64_t{256} << 10;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<bool> Flag(const Json& value, absl::string_view field) {
  if (const auto* flag = value.get_ptr<const Json::boolean_t*>()) return *flag;
  return Invalid(absl::StrCat(field, " must be true or false, got ", JsonExcerpt(value)));
}

// A list of ids from `value` (an array of integers).
absl::StatusOr<std::vector<int64_t>> Ids(const Json& value, absl::string_view field) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < value.size(); ++i) {
    const Json& id = value[i];
    if (const auto* number = id.get_ptr<const Json::number_integer_t*>()) {
      ids.push_back(*number);
    } else if (const auto* positive = id.get_ptr<const Json::number_unsigned_t*>();
               positive != nullptr &&
               *positive <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      ids.push_back(static_cast<int64_t>(*positive));
    } else {
      return Invalid(absl::StrCat(
          field, "[", i, "] must be a token id (an integer), got ", JsonExcerpt(id)));
    }
  }
  return ids;
}

// The character (code point) index of each byte offset of UTF-8 `text`, [0, size]: a
// continuation byte counts as the character it continues.
std::vector<int64_t> CharacterIndex(absl::string_view text) {
  std::vector<int64_t> index(text.size() + 1);
  int64_t characters = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool continues = (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80;
    index[i] = continues ? characters - 1 : characters++;
  }
  index[text.size()] = characters;
  return index;
}

}  // namespace

absl::StatusOr<TokenizeCall> ParseTeiTokenize(absl::string_view body) {
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseJsonObjectBody(body));
  TokenizeCall call;
  bool has_inputs = false;
  int64_t bytes = 0;
  for (const auto& [key, value] : json.items()) {
    if (key == "inputs") {
      has_inputs = true;
      if (const auto* text = value.get_ptr<const Json::string_t*>()) {
        call.inputs.push_back(*text);
      } else if (value.is_array() && !value.empty()) {
        for (size_t i = 0; i < value.size(); ++i) {
          const auto* text = value[i].get_ptr<const Json::string_t*>();
          if (text == nullptr) {
            return Invalid(absl::StrCat("inputs[", i, "] must be a string, got ",
                                        JsonExcerpt(value[i])));
          }
          call.inputs.push_back(*text);
        }
      } else {
        return Invalid(
            absl::StrCat("inputs must be a string or a non-empty list of strings, got ",
                         JsonExcerpt(value)));
      }
    } else if (key == "add_special_tokens") {
      ATTN_ASSIGN_OR_RETURN(call.add_special_tokens, Flag(value, key));
    } else if (key == "prompt_name") {
      if (value.is_null()) continue;
      const auto* name = value.get_ptr<const Json::string_t*>();
      if (name == nullptr || name->empty() || name->size() > 256) {
        return Invalid(
            absl::StrCat("prompt_name must be a prompt's name (1 to 256 bytes), got ",
                         JsonExcerpt(value)));
      }
      call.prompt_name = *name;
    } else {
      return Invalid(absl::StrCat("unknown field \"", key,
                                  "\" (accepted: inputs, add_special_tokens, "
                                  "prompt_name)"));
    }
  }
  if (!has_inputs) return Invalid("inputs is required: a string or a list of strings");
  for (const std::string& text : call.inputs) bytes += static_cast<int64_t>(text.size());
  if (bytes > kMaxTokenizeBytes) {
    return Invalid(absl::StrCat("inputs hold ", bytes, " bytes of text, over the ",
                                kMaxTokenizeBytes, " one /tokenize call may hold"));
  }
  return call;
}

absl::StatusOr<DecodeCall> ParseTeiDecode(absl::string_view body) {
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseJsonObjectBody(body));
  DecodeCall call;
  bool has_ids = false;
  for (const auto& [key, value] : json.items()) {
    if (key == "ids") {
      has_ids = true;
      if (!value.is_array() || value.empty()) {
        return Invalid(
            absl::StrCat("ids must be a non-empty list of ids or of lists of ids, got ",
                         JsonExcerpt(value)));
      }
      if (value[0].is_array()) {
        for (size_t i = 0; i < value.size(); ++i) {
          if (!value[i].is_array()) {
            return Invalid(absl::StrCat("ids[", i, "] must be a list of ids, got ",
                                        JsonExcerpt(value[i])));
          }
          ATTN_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                                Ids(value[i], absl::StrCat("ids[", i, "]")));
          call.ids.push_back(std::move(ids));
        }
      } else {
        ATTN_ASSIGN_OR_RETURN(std::vector<int64_t> ids, Ids(value, "ids"));
        call.ids.push_back(std::move(ids));
      }
    } else if (key == "skip_special_tokens") {
      ATTN_ASSIGN_OR_RETURN(call.skip_special_tokens, Flag(value, key));
    } else {
      return Invalid(absl::StrCat("unknown field \"", key,
                                  "\" (accepted: ids, skip_special_tokens)"));
    }
  }
  if (!has_ids) return Invalid("ids is required: a list of ids or of lists of ids");
  int64_t count = 0;
  for (const auto& ids : call.ids) count += static_cast<int64_t>(ids.size());
  if (count > kMaxDecodeIds) {
    return Invalid(absl::StrCat("ids hold ", count, " ids, over the ", kMaxDecodeIds,
                                " one /decode call may hold"));
  }
  return call;
}

absl::StatusOr<std::string> TokenizeBody(const TokenizeCall& call,
                                         const ServedModel& model) {
  if (model.tokenizer == nullptr) {
    return Invalid(absl::StrCat("model \"", model.name,
                                "\" has no tokenizer (its folder has neither "
                                "tokenizer.json nor vocab.txt)"));
  }
  ATTN_ASSIGN_OR_RETURN(const std::string prompt,
                        PromptNamed(call.prompt_name, &model.info.encoder()));
  Json inputs = Json::array();
  std::vector<core::Tokenizer::Token> tokens;
  for (size_t i = 0; i < call.inputs.size(); ++i) {
    const std::string text = prompt + call.inputs[i];
    if (absl::Status tokenized = model.tokenizer
                                     ->Tokenize(text, std::numeric_limits<int64_t>::max(),
                                                call.add_special_tokens, &tokens)
                                     .status();
        !tokenized.ok()) {
      return Invalid(absl::StrCat("inputs[", i, "]: ", tokenized.message()));
    }
    const std::vector<int64_t> characters = CharacterIndex(text);
    Json list = Json::array();
    for (const core::Tokenizer::Token& token : tokens) {
      // TEI's special tokens are the ones the template adds (no text of the input).
      if (token.start < 0) {
        list.push_back({{"id", token.id},
                        {"text", std::string(model.tokenizer->TokenOf(token.id))},
                        {"special", true},
                        {"start", nullptr},
                        {"stop", nullptr}});
        continue;
      }
      const int64_t start = characters[static_cast<size_t>(token.start)];
      const int64_t stop = characters[static_cast<size_t>(token.end)];
      list.push_back({{"id", token.id},
                      {"text", text.substr(static_cast<size_t>(token.start),
                                           static_cast<size_t>(token.end - token.start))},
                      {"special", false},
                      {"start", start},
                      {"stop", stop}});
    }
    inputs.push_back(std::move(list));
  }
  return JsonText(inputs);
}

absl::StatusOr<std::string> DecodeBody(const DecodeCall& call, const ServedModel& model) {
  if (model.tokenizer == nullptr) {
    return Invalid(absl::StrCat("model \"", model.name,
                                "\" has no tokenizer (its folder has neither "
                                "tokenizer.json nor vocab.txt)"));
  }
  Json texts = Json::array();
  for (size_t i = 0; i < call.ids.size(); ++i) {
    absl::StatusOr<std::string> text =
        model.tokenizer->Decode(call.ids[i], call.skip_special_tokens);
    if (!text.ok()) {
      return absl::Status(text.status().code(),
                          call.ids.size() == 1
                              ? text.status().message()
                              : absl::StrCat("list ", i, ": ", text.status().message()));
    }
    texts.push_back(*std::move(text));
  }
  return JsonText(texts);
}

}  // namespace attnserve::server
