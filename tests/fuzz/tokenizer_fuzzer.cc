// libFuzzer target: the tokenizer's two doors. Input byte 0 picks one:
// - even: the rest is text for Encode, on a small vocabulary with pieces in several
//   scripts; byte 0's bits also pick the normalizer settings and max_tokens. Encode must
//   succeed exactly when the text is valid UTF-8, and then give [CLS] ... [SEP], at
//   most max_tokens ids, each in the vocabulary, and a count no smaller than what it
//   kept; Tokenize the same ids with offsets inside the text, and Decode an answer.
// - odd: the rest is a tokenizer.json for FromTokenizerJson, whose tokenizer (if the
//   file is accepted) must then encode a fixed text within the same rules.
// Never a crash, an exception or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/text/wordpiece_tokenizer.h"

namespace {

using attnserve::core::WordPieceTokenizer;

constexpr char kVocab[] =
    "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\nc\nab\n##b\n##c\n##bc\nthe\n##s\n,\n.\n!\n"
    "caf\n##e\ncafe\n\xc3\xa9\n##"
    "\xc3\xa9\n\xe6\x9d\xb1\n\xe4\xba\xac\n\xd0\xbc\xd0\xb8\xd1\x80\n"
    "##\xd0\xb8\n\xd9\x85\n##\xd8\xb1\ni\n##\xcc\x87\n\xf0\x9f\x91\x8d\n##\n";

void Check(const WordPieceTokenizer& tokenizer, absl::string_view text,
           int64_t max_tokens) {
  std::vector<int64_t> ids;
  const auto encoding = tokenizer.Encode(text, max_tokens, &ids);
  if (!encoding.ok()) {
    if (!ids.empty()) __builtin_trap();
    return;
  }
  if (ids.size() < 2 || static_cast<int64_t>(ids.size()) > max_tokens) __builtin_trap();
  if (encoding->tokens < static_cast<int64_t>(ids.size())) __builtin_trap();
  if (encoding->truncated != (encoding->tokens > max_tokens)) __builtin_trap();
  for (const int64_t id : ids) {
    if (id < 0 || id > tokenizer.max_id()) __builtin_trap();
  }
  // Tokenize gives Encode's ids, each token's bytes inside the text ([CLS] and [SEP]
  // none); Decode of them answers.
  std::vector<attnserve::core::Tokenizer::Token> tokens;
  const auto tokenized = tokenizer.Tokenize(text, max_tokens, true, &tokens);
  if (!tokenized.ok() || tokens.size() != ids.size()) __builtin_trap();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto& token = tokens[i];
    if (token.id != ids[i]) __builtin_trap();
    if (token.start == -1 ? token.end != -1
                          : token.start < 0 || token.start > token.end ||
                                token.end > static_cast<int64_t>(text.size())) {
      __builtin_trap();
    }
  }
  if (!tokenizer.Decode(ids, (max_tokens & 1) != 0).ok()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const absl::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode & 1) {
    auto tokenizer = WordPieceTokenizer::FromTokenizerJson(rest);
    if (tokenizer.ok()) Check(**tokenizer, "Hello [SEP] w\xc3\xb6rld \xe6\x9d\xb1!", 8);
    return 0;
  }
  static const std::vector<std::unique_ptr<WordPieceTokenizer>>* const tokenizers = [] {
    auto* all = new std::vector<std::unique_ptr<WordPieceTokenizer>>();
    for (int variant = 0; variant < 4; ++variant) {
      WordPieceTokenizer::Options options;
      options.lowercase = variant & 1;
      options.strip_accents = (variant & 2) != 0;
      options.clean_text = variant != 3;
      options.max_input_chars_per_word = 12;
      all->push_back(*WordPieceTokenizer::FromVocab(kVocab, options));
    }
    return all;
  }();
  const auto& tokenizer = *(*tokenizers)[(mode >> 1) & 3];
  const int64_t max_tokens = 2 + (mode >> 3);
  // A text valid as UTF-8 must encode; one that is not must be refused.
  Check(tokenizer, rest, max_tokens);
  return 0;
}
