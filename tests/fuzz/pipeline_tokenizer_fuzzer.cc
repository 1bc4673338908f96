// libFuzzer target: PipelineTokenizer, the reader of any tokenizer.json. Input byte 0
// picks what the rest is:
// - 0 (mod 3): text, through the six tokenizers of tests/data/tokenizers (byte-level BPE,
//   Unigram, XLM-R's SentencePiece conversion, a BPE through many normalizers and
//   pre-tokenizers, a byte-fallback BPE, a WordPiece). Bytes after a 0xFF are a second
//   text, encoded as a pair. Each must succeed exactly when the texts are valid UTF-8
//   (every one of these tokenizers can spell any text), keep at most max_tokens ids,
//   each within max_id, with a count no smaller than what it kept, token types for
//   each id;
// - 1: a tokenizer.json, whose tokenizer (if the file is accepted) must then encode
//   fixed texts within the same rules, or refuse them with a status;
// - 2: a SentencePiece precompiled charsmap (its length in the next 4 bytes, little
//   endian) and a text it normalizes (the bytes after it), in a Unigram tokenizer.
// A single text is also Tokenized (Encode's ids, offsets inside the text) and its ids
// Decoded. Never a crash, a hang, an exception or undefined behaviour.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"
#include "core/text/pipeline_tokenizer.h"
#include "core/text/unicode_text.h"

namespace {

using attnserve::core::PipelineTokenizer;
using attnserve::core::Tokenizer;

void Check(const Tokenizer& tokenizer, absl::string_view text, absl::string_view second,
           bool pair, int64_t max_tokens, bool must_encode) {
  std::vector<int64_t> ids, types;
  const auto encoding = pair
                            ? tokenizer.EncodePair(text, second, max_tokens, &ids, &types)
                            : tokenizer.Encode(text, max_tokens, &ids);
  if (!encoding.ok()) {
    if (must_encode || !ids.empty() || !types.empty()) __builtin_trap();
    return;
  }
  if (static_cast<int64_t>(ids.size()) > max_tokens) __builtin_trap();
  if (encoding->tokens < static_cast<int64_t>(ids.size())) __builtin_trap();
  if (encoding->truncated != (encoding->tokens > max_tokens)) __builtin_trap();
  if (pair && types.size() != ids.size()) __builtin_trap();
  for (const int64_t id : ids) {
    if (id < 0 || id > tokenizer.max_id()) __builtin_trap();
  }
  if (pair) return;
  // Tokenize gives Encode's ids, each token's bytes inside the text (the template's
  // none); Decode of them answers, or says its decoder is not served.
  std::vector<Tokenizer::Token> tokens;
  const auto tokenized = tokenizer.Tokenize(text, max_tokens, true, &tokens);
  if (!tokenized.ok() || tokens.size() != ids.size()) __builtin_trap();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const Tokenizer::Token& token = tokens[i];
    if (token.id != ids[i]) __builtin_trap();
    if (token.start == -1 ? token.end != -1
                          : token.start < 0 || token.start > token.end ||
                                token.end > static_cast<int64_t>(text.size())) {
      __builtin_trap();
    }
  }
  const auto decoded = tokenizer.Decode(ids, (max_tokens & 1) != 0);
  if (!decoded.ok() && decoded.status().code() != absl::StatusCode::kUnimplemented) {
    __builtin_trap();
  }
}

bool ValidUtf8(absl::string_view text) {
  return attnserve::core::FirstInvalidUtf8(text) < 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const absl::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t split = rest.find('\xFF');
  const absl::string_view first = rest.substr(0, split);
  const absl::string_view second =
      split == absl::string_view::npos ? absl::string_view() : rest.substr(split + 1);
  const int64_t max_tokens = 4 + (mode >> 2);
  switch (mode % 3) {
    case 0: {
      static const std::vector<std::unique_ptr<PipelineTokenizer>>* const tokenizers =
          [] {
            auto* all = new std::vector<std::unique_ptr<PipelineTokenizer>>();
            for (const char* name : {"bytelevel_bpe", "unigram_metaspace", "xlmr_spm",
                                     "bpe_mixed", "bpe_bytefallback", "wordpiece_nfkc"}) {
              auto made = PipelineTokenizer::FromTokenizerJson(
                  ReadFile(std::string(ATTNSERVE_TEST_DATA_DIR "/tokenizers/") + name +
                           "/tokenizer.json"),
                  {.truncate_left = all->size() % 2 == 1});
              if (!made.ok()) __builtin_trap();
              all->push_back(*std::move(made));
            }
            return all;
          }();
      const bool pair = split != absl::string_view::npos;
      const bool valid = ValidUtf8(first) && (!pair || ValidUtf8(second));
      for (const auto& tokenizer : *tokenizers) {
        Check(*tokenizer, first, second, pair, max_tokens, valid);
      }
      return 0;
    }
    case 1: {
      auto tokenizer = PipelineTokenizer::FromTokenizerJson(rest, {});
      if (!tokenizer.ok()) return 0;
      const int64_t room =
          std::max((*tokenizer)->added_tokens(true), (*tokenizer)->added_tokens(false)) +
          8;
      Check(**tokenizer, "Hello <s> w\xc3\xb6rld \xe6\x9d\xb1! 42", "", false, room,
            false);
      Check(**tokenizer, "  a  b ", "\xe2\x96\x81x\t", true, room, false);
      return 0;
    }
    default: {
      if (rest.size() < 4) return 0;
      const size_t length = std::min<size_t>(
          rest.size() - 4, static_cast<uint8_t>(rest[0]) |
                               static_cast<uint8_t>(rest[1]) << 8 |
                               static_cast<uint8_t>(rest[2]) << 16 |
                               static_cast<size_t>(static_cast<uint8_t>(rest[3])) << 24);
      const absl::string_view charsmap = rest.substr(4, length);
      const absl::string_view text = rest.substr(4 + length);
      std::string json =
          R"({"normalizer": {"type": "Precompiled", "precompiled_charsmap": ")" +
          absl::Base64Escape(charsmap) +
          R"("}, "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"},
              "model": {"type": "Unigram", "unk_id": 0,
                        "vocab": [["<unk>", 0.0], ["\u2581", -1.0], ["a", -2.0]]}})";
      auto tokenizer = PipelineTokenizer::FromTokenizerJson(json, {});
      if (!tokenizer.ok()) return 0;
      Check(**tokenizer, text, "", false, max_tokens, ValidUtf8(text));
      return 0;
    }
  }
}
