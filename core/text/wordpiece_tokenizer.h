// WordPieceTokenizer: text to BERT token ids, equal to Hugging Face tokenizers' recipe
// for BERT (BertNormalizer, BertPreTokenizer, WordPiece, a [CLS] $A [SEP] template and
// special tokens matched in the raw text), read from a model folder's tokenizer.json or
// vocab.txt + tokenizer_config.json. Unicode properties and normalization come from ICU.
#ifndef ATTNSERVE_CORE_TEXT_WORDPIECE_TOKENIZER_H_
#define ATTNSERVE_CORE_TEXT_WORDPIECE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/text/tokenizer.h"

namespace attnserve::core {

// Immutable after creation; every call is safe from any number of threads.
class WordPieceTokenizer : public Tokenizer {
 public:
  struct Options {
    // Drop NUL, U+FFFD and control/format/private-use characters; every whitespace
    // character becomes a space.
    bool clean_text = true;
    // Put spaces around CJK ideographs, so that each is a word of its own.
    bool handle_chinese_chars = true;
    // Lowercase every character.
    bool lowercase = true;
    // NFD, then drop non-spacing marks. Unset: follows `lowercase` (BERT's rule).
    std::optional<bool> strip_accents;
    // A word of more characters than this becomes one unk_token; >= 1.
    int64_t max_input_chars_per_word = 100;
    // Marks a piece that continues a word; not empty.
    std::string continuing_subword_prefix = "##";
    // Must be in the vocabulary.
    std::string unk_token = "[UNK]";
    std::string cls_token = "[CLS]";
    std::string sep_token = "[SEP]";
    // Tokens matched in the raw text before normalization (leftmost, longest first),
    // each becoming its own id: the special tokens. Each must be in the vocabulary.
    std::vector<std::string> special_tokens = {"[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                               "[MASK]"};
  };

  // From a model folder: tokenizer.json when present, else vocab.txt with the settings
  // of tokenizer_config.json (when present). NotFound when the folder has neither
  // tokenizer.json nor vocab.txt; InvalidArgument naming the file and field for a
  // recipe other than BERT's (another normalizer, pre-tokenizer, model or template) or
  // a malformed file.
  static absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> FromFolder(
      const std::string& folder);
  // From the text of a tokenizer.json. Errors as FromFolder's.
  static absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> FromTokenizerJson(
      absl::string_view json);
  // From the text of a vocab.txt (one token per line; its id is the line's number).
  // InvalidArgument for an empty or duplicated token or a bad option.
  static absl::StatusOr<std::unique_ptr<WordPieceTokenizer>> FromVocab(
      absl::string_view vocab, const Options& options);

  // Appends the ids of [CLS], the text's pieces and [SEP] to `ids`: at most
  // max_tokens of them (the last pieces are left out, [SEP] stays), while every piece is
  // still counted. REQUIRES: max_tokens >= 2. InvalidArgument "not valid UTF-8 at
  // byte offset N (0xXX)" for the first byte that is not part of a well-formed
  // sequence (overlong forms, surrogates and values past U+10FFFF included); `ids` is
  // then unchanged.
  absl::StatusOr<Encoding> Encode(absl::string_view text, int64_t max_tokens,
                                  std::vector<int64_t>* ids) const override;

  // The pair template BERT's cross-encoders read: [CLS] first [SEP] second [SEP], ids
  // appended to `ids` and token types (0 through the first [SEP], then 1) to `types`.
  // At most max_tokens in all, cut as Hugging Face tokenizers' longest_first cuts a
  // pair: the longer text loses pieces from its end until it is no longer than the
  // other, then both are cut to half the room each. REQUIRES: max_tokens >= 3. Errors
  // as Encode's; `ids` and `types` are then unchanged.
  absl::StatusOr<Encoding> EncodePair(absl::string_view first, absl::string_view second,
                                      int64_t max_tokens, std::vector<int64_t>* ids,
                                      std::vector<int64_t>* types) const override;
  int64_t added_tokens(bool pair) const override { return pair ? 3 : 2; }

  // Encode's tokens with their offsets (see Tokenizer::Tokenize); REQUIRES: max_tokens
  // >= 2 when add_special_tokens. The special tokens matched in the text are special
  // unless tokenizer.json's added_tokens say "special": false.
  absl::StatusOr<Encoding> Tokenize(absl::string_view text, int64_t max_tokens,
                                    bool add_special_tokens,
                                    std::vector<Token>* tokens) const override;
  // With tokenizer.json's decoder (none: the tokens joined by spaces), or for a
  // vocab.txt the WordPiece decoder with cleanup. Errors as Tokenizer::Decode's.
  absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids,
                                     bool skip_special_tokens) const override;

  // The steps, for tests: the normalized text (UTF-8) of a text holding no special
  // token, and the words a normalized text is split into.
  absl::StatusOr<std::string> Normalize(absl::string_view text) const;
  std::vector<std::string> PreTokenize(absl::string_view normalized) const;

  // The largest id in the vocabulary.
  int64_t max_id() const override { return max_id_; }
  // The vocabulary's token of `id` (a continuing piece with its prefix, "##ing"); empty
  // for an id the vocabulary lacks.
  absl::string_view TokenOf(int64_t id) const override;
  const Options& options() const { return options_; }

 private:
  explicit WordPieceTokenizer(Options options) : options_(std::move(options)) {}
  absl::Status Build(std::vector<std::pair<std::string, int64_t>> vocab);
  // Appends the pieces of `text` without [CLS] and [SEP]: at most max_pieces of them,
  // each counted in *pieces. InvalidArgument for text that is not valid UTF-8 (nothing
  // appended).
  // With `tokens` (Tokenize's path), each id kept is also appended there with its
  // offsets; null on Encode's path, which then tracks nothing.
  absl::Status AppendTextPieces(absl::string_view text, int64_t max_pieces,
                                std::vector<int64_t>* ids, int64_t* pieces,
                                std::vector<Token>* tokens = nullptr) const;
  // The code points of `text` (valid UTF-8) after normalization, into `out`.
  void NormalizeInto(absl::string_view text, std::u32string* out) const;
  // For each code point of `normalized` (NormalizeInto's result for `text`), the bytes
  // of the character of `text` it came from, shifted by `base`, into `origins`.
  void NormalizedOrigins(absl::string_view text, int64_t base,
                         const std::u32string& normalized,
                         std::vector<std::pair<int64_t, int64_t>>* origins) const;
  // Appends the pieces of one normalized span; counts every piece in *count. With
  // `origins` (one per code point) and `tokens`, the kept pieces go there too.
  void AppendPieces(const std::u32string& normalized, int64_t max_pieces,
                    std::vector<int64_t>* ids, int64_t* count,
                    const std::vector<std::pair<int64_t, int64_t>>* origins,
                    std::vector<Token>* tokens) const;
  // `word_origins`: one per byte of `word` when `tokens` is set.
  void AppendWord(absl::string_view word, int64_t characters, int64_t max_pieces,
                  std::vector<int64_t>* ids, int64_t* count,
                  const std::vector<std::pair<int64_t, int64_t>>& word_origins,
                  std::vector<Token>* tokens) const;

  Options options_;
  bool strip_accents_ = true;
  // Whole words, and pieces that continue a word (keyed without the prefix).
  absl::flat_hash_map<std::string, int64_t> words_;
  absl::flat_hash_map<std::string, int64_t> continuations_;
  // The longest vocabulary entry in bytes (no piece looked up is longer).
  size_t longest_piece_bytes_ = 0;
  int64_t unk_id_ = 0;
  int64_t cls_id_ = 0;
  int64_t sep_id_ = 0;
  int64_t max_id_ = 0;
  // Each id's token (a map: ids may be sparse, up to 2^31).
  absl::flat_hash_map<int64_t, std::string> tokens_;
  // special_tokens with their ids, longest first.
  std::vector<std::pair<std::string, int64_t>> specials_;
  // Bit b of special_first_bytes_[c / 64] says whether a special token starts with c.
  uint64_t special_first_bytes_[4] = {0, 0, 0, 0};
  // The ids of the special tokens that count as special (Tokenize's `special`,
  // Decode's skip_special_tokens).
  absl::flat_hash_set<int64_t> special_ids_;
  std::unique_ptr<TokenDecoder> decoder_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_TEXT_WORDPIECE_TOKENIZER_H_
