// Tokenizer: text to a model's token ids, equal to Hugging Face tokenizers' for the
// model's own files. One interface for every model; FromFolder picks the
// implementation: WordPieceTokenizer for BERT's recipe (its own fast path), and
// PipelineTokenizer for any other tokenizer.json (BPE, Unigram, WordPiece and WordLevel
// models behind the normalizers, pre-tokenizers and post-processors the file names).
#ifndef ATTNSERVE_CORE_TOKENIZER_H_
#define ATTNSERVE_CORE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnserve::core {

// Immutable after creation; Encode and EncodePair are safe to call from any number of
// threads.
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
  // The special tokens the template adds to one text (pair false) or to a pair.
  virtual int64_t added_tokens(bool pair) const = 0;
  // The largest id it can produce.
  virtual int64_t max_id() const = 0;
  // The token of `id` as the vocabulary writes it ("##ing", "Ġthe", "▁the"); empty for
  // an id it lacks.
  virtual absl::string_view TokenOf(int64_t id) const = 0;
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

#endif  // ATTNSERVE_CORE_TOKENIZER_H_
