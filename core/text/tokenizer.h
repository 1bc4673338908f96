// Tokenizer: text to a model's token ids, equal to Hugging Face tokenizers' for the
// model's own files. One interface for every model; FromFolder picks the
// implementation: WordPieceTokenizer for BERT's recipe (its own fast path), and
// PipelineTokenizer for any other tokenizer.json (BPE, Unigram, WordPiece and WordLevel
// models behind the normalizers, pre-tokenizers and post-processors the file names).
// Tokenize adds each token's byte offsets in the text, and Decode turns ids back into
// text with the file's decoder (TokenDecoder), both as TEI's /tokenize and /decode show
// them.
#ifndef ATTNSERVE_CORE_TEXT_TOKENIZER_H_
#define ATTNSERVE_CORE_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace attnserve::core {

// Immutable after creation; Encode, EncodePair, Tokenize and Decode are safe to call
// from any number of threads.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // From a model folder: tokenizer.json when present (with tokenizer_config.json's
  // truncation_side), else vocab.txt with tokenizer_config.json's settings. NotFound
  // when the folder has neither; InvalidArgument naming the file and field for a part
  // that is not supported or a malformed file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFolder(const std::string& folder);

  // What Encode and EncodePair say of one input.
  struct Encoding {
    // Its tokens with the special tokens the template adds, counted before any
    // truncation.
    int64_t tokens = 0;
    // Whether tokens were left out to fit max_tokens.
    bool truncated = false;
  };
  // Appends the ids of one text in the model's single template (BERT's [CLS] text
  // [SEP], RoBERTa's <s> text </s>, ...) to `ids`: at most max_tokens of them, the
  // text's tokens cut from the end (or the start, for a model that truncates on the
  // left) while the template's special tokens stay; every token is still counted.
  // REQUIRES: max_tokens >= added_tokens(false). InvalidArgument "not valid UTF-8 at
  // byte offset N (0xXX)" for the first byte that is not part of a well-formed
  // sequence; `ids` is then unchanged.
  virtual absl::StatusOr<Encoding> Encode(absl::string_view text, int64_t max_tokens,
                                          std::vector<int64_t>* ids) const = 0;
  // Two texts in the model's pair template (BERT's [CLS] a [SEP] b [SEP], RoBERTa's
  // <s> a </s></s> b </s>), ids appended to `ids` and the template's token types to
  // `types`. At most max_tokens in all, cut as tokenizers' longest_first cuts a pair
  // (PairKeep). REQUIRES: max_tokens >= added_tokens(true). Errors as Encode's; `ids`
  // and `types` are then unchanged.
  virtual absl::StatusOr<Encoding> EncodePair(absl::string_view first,
                                              absl::string_view second,
                                              int64_t max_tokens,
                                              std::vector<int64_t>* ids,
                                              std::vector<int64_t>* types) const = 0;

  // One token of a text as TEI's /tokenize shows it.
  struct Token {
    int64_t id = 0;
    // Added by the template (post-processor), or an added token marked special
    // (tokenizer.json's "special": true; every special token of a vocab.txt folder).
    bool special = false;
    // Byte offsets [start, end) into the text as given of the text this token came
    // from: after normalization, mapped back to the original bytes as Hugging Face
    // tokenizers' offsets are (so a token cut from inside a character spans the whole
    // character, and RoBERTa's "Ġworld" leaves out its space). start = end = -1 for a
    // token the template adds, which has no text.
    int64_t start = -1;
    int64_t end = -1;
  };
  // Replaces `tokens` with the tokens of one text: with the single template's special
  // tokens when add_special_tokens (then the same ids as Encode, truncated to
  // max_tokens the same way), else the text's tokens only (at most max_tokens of them,
  // cut as Encode cuts them). Slower than Encode: it tracks where each token came
  // from. REQUIRES: max_tokens >= added_tokens(false) when add_special_tokens, else
  // max_tokens >= 0. Errors as Encode's; `tokens` is then empty.
  virtual absl::StatusOr<Encoding> Tokenize(absl::string_view text, int64_t max_tokens,
                                            bool add_special_tokens,
                                            std::vector<Token>* tokens) const = 0;
  // The text of `ids` as Hugging Face tokenizers' decode writes it with the file's
  // decoder (a vocab.txt folder: the WordPiece decoder with "##" and cleanup, as
  // transformers' BertTokenizerFast); skip_special_tokens leaves out the ids of special
  // tokens (added tokens marked special). An id within [0, max_id()] that the
  // vocabulary lacks is left out, as tokenizers leaves it out. InvalidArgument
  // "ids[i]: id N is not in [0, max_id]" for the first id out of range; Unimplemented
  // naming the decoder when the tokenizer.json's decoder is not supported (see
  // TokenDecoder).
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids,
                                             bool skip_special_tokens) const = 0;

  // The special tokens the template adds to one text (pair false) or to a pair.
  virtual int64_t added_tokens(bool pair) const = 0;
  // The largest id it can produce.
  virtual int64_t max_id() const = 0;
  // The token of `id` as the vocabulary writes it ("##ing", "Ġthe", "▁the"); empty for
  // an id it lacks.
  virtual absl::string_view TokenOf(int64_t id) const = 0;
};

// A tokenizer.json's decoder, as Hugging Face tokenizers runs it: the tokens of some
// ids (as the vocabulary writes them) to text. Supported types: WordPiece, BPEDecoder,
// ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip and Sequence of those; no
// decoder joins the tokens with spaces, as tokenizers does. Immutable after creation;
// Decode is safe to call from any number of threads.
class TokenDecoder {
 public:
  // From a tokenizer.json's "decoder" value as JSON text ("null" for none). Never
  // fails, so that a file whose decoder is not supported still encodes: such a
  // decoder's Decode returns Unimplemented "tokenizer.json decoder<path> type \"T\" is
  // not supported (...)", and a malformed one's Unimplemented naming the field.
  static std::unique_ptr<TokenDecoder> FromJson(absl::string_view decoder_json);
  // tokenizers' WordPiece decoder: pieces starting with `prefix` join the piece before
  // them, others are preceded by a space; `cleanup` removes the spaces before
  // punctuation and in English contractions (" ." -> ".", " n't" -> "n't", ...).
  static std::unique_ptr<TokenDecoder> WordPiece(std::string prefix, bool cleanup);
  virtual ~TokenDecoder() = default;

  // The text of `tokens`; `tokens` is consumed. Unimplemented as FromJson says.
  virtual absl::StatusOr<std::string> Decode(std::vector<std::string> tokens) const = 0;
};

// The whole file at `path`, for the tokenizers' readers; NotFound naming it when it
// cannot be opened.
absl::StatusOr<std::string> ReadTokenizerFile(const std::string& path);

// How many tokens of each text a pair keeps when n1 + n2 tokens must fit in `budget`:
// tokenizers' longest_first. With s <= l the shorter and longer counts, the longer is
// cut to what the shorter leaves (never below it); when both still do not fit, each
// gets half (the longer the odd one).
void PairKeep(int64_t n1, int64_t n2, int64_t budget, int64_t* keep1, int64_t* keep2);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_TEXT_TOKENIZER_H_
