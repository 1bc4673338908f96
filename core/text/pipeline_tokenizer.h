// PipelineTokenizer: any Hugging Face tokenizer.json, run as the file describes it and as
// the `tokenizers` package runs it (its Rust source is the reference for every rule
// here): added tokens matched in the raw text, a normalizer, a pre-tokenizer, a model
// and a post-processor's template.
//
// What is whose: Unicode properties, case and normalization forms come from ICU (with
// the version rules of core/text/unicode_text.h), regular expressions (ByteLevel's,
// Split's, Replace's) from Oniguruma, the engine `tokenizers` itself runs them on; the
// models, SentencePiece's precompiled character map and the splitting rules are this
// file's.
//
// Supported parts (anything else is refused at load, naming it):
// - normalizers: NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Strip, Replace, Prepend,
//   Nmt, Precompiled, Sequence;
// - pre-tokenizers: ByteLevel, Metaspace, Whitespace, WhitespaceSplit, Punctuation,
//   Split, Digits, CharDelimiterSplit, BertPreTokenizer, Sequence;
// - models: BPE (merges, byte_fallback, continuing_subword_prefix, end_of_word_suffix,
//   fuse_unk, ignore_merges; no dropout), Unigram (Viterbi over the scores,
//   byte_fallback), WordPiece, WordLevel;
// - post-processors: TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel
//   (it changes only offsets), Sequence of those;
// - added tokens with their normalized, lstrip, rstrip and single_word flags;
// - decoders (Decode only; see TokenDecoder): WordPiece, BPEDecoder, ByteLevel,
//   Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence of those, or none.
// Tokenize's offsets follow tokenizers' alignments through every normalizer and
// pre-tokenizer above and its post-processors' trim_offsets.
#ifndef ATTNSERVE_CORE_TEXT_PIPELINE_TOKENIZER_H_
#define ATTNSERVE_CORE_TEXT_PIPELINE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/text/tokenizer.h"

namespace attnserve::core {

// Immutable after creation; every call is safe from any number of threads.
class PipelineTokenizer : public Tokenizer {
 public:
  struct Options {
    // Cut a text over the limit at its start rather than its end (transformers'
    // truncation_side "left").
    bool truncate_left = false;
  };
  // From the text of a tokenizer.json. InvalidArgument "tokenizer.json <field>: ..."
  // for a malformed file or a part that is not supported.
  static absl::StatusOr<std::unique_ptr<PipelineTokenizer>> FromTokenizerJson(
      absl::string_view json, const Options& options);
  ~PipelineTokenizer() override;

  absl::StatusOr<Encoding> Encode(absl::string_view text, int64_t max_tokens,
                                  std::vector<int64_t>* ids) const override;
  absl::StatusOr<Encoding> EncodePair(absl::string_view first, absl::string_view second,
                                      int64_t max_tokens, std::vector<int64_t>* ids,
                                      std::vector<int64_t>* types) const override;
  absl::StatusOr<Encoding> Tokenize(absl::string_view text, int64_t max_tokens,
                                    bool add_special_tokens,
                                    std::vector<Token>* tokens) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int64_t> ids,
                                     bool skip_special_tokens) const override;
  int64_t added_tokens(bool pair) const override;
  int64_t max_id() const override;
  absl::string_view TokenOf(int64_t id) const override;

  struct Parts;
  struct TextToken;

 private:
  explicit PipelineTokenizer(std::unique_ptr<const Parts> parts);
  // Appends the ids of one text without the template's tokens.
  absl::Status AppendTextIds(absl::string_view text, std::vector<int64_t>* ids) const;
  // Appends the tokens of one text without the template's, with their offsets.
  absl::Status AppendTextTokens(absl::string_view text,
                                std::vector<TextToken>* tokens) const;

  std::unique_ptr<const Parts> parts_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_TEXT_PIPELINE_TOKENIZER_H_
