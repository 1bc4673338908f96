// UTF-8 and the Unicode properties the tokenizers need, as Hugging Face tokenizers sees
// them (its Rust crates carry tables of older Unicode versions than ICU's; the rules
// below say where that shows). Shared by WordPieceTokenizer and PipelineTokenizer.
#ifndef ATTNSERVE_CORE_TEXT_UNICODE_TEXT_H_
#define ATTNSERVE_CORE_TEXT_UNICODE_TEXT_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attnserve::core {

// The offset of the first byte of `text` that does not start a well-formed UTF-8
// sequence (as Python's decoder reports it), or -1.
int64_t FirstInvalidUtf8(absl::string_view text);
// OK, or InvalidArgument "not valid UTF-8 at byte offset N (0xXX)" naming the first
// bad byte (overlong forms, surrogates and values past U+10FFFF included).
absl::Status CheckUtf8(absl::string_view text);
// Decodes one code point of valid UTF-8 at text[*i], advancing *i.
char32_t DecodeUtf8(absl::string_view text, size_t* i);
void AppendUtf8(char32_t c, std::string* out);
std::u32string ToUtf32(absl::string_view valid_utf8);
std::string ToUtf8(const std::u32string& text);

// `bytes` as UTF-8 with each ill-formed part replaced by U+FFFD, as Rust's
// String::from_utf8_lossy replaces it (one U+FFFD per maximal ill-formed subpart).
std::string Utf8Lossy(absl::string_view bytes);

// GPT-2's bytes-to-characters table (ByteLevel pre-tokenizer and decoder): printable
// bytes stand for themselves, the rest for U+0100 onwards, in byte order; each entry
// is the character's UTF-8.
const std::array<std::string, 256>& ByteLevelChars();

// What a character is to Hugging Face's BERT normalizer and pre-tokenizer.
enum HfCharFlag : uint8_t {
  kRemoved = 1,  // dropped by clean_text (control, format, private use, NUL, U+FFFD)
  kSpace = 2,    // whitespace (becomes ' ' under clean_text; splits words)
  kChinese = 4,  // a CJK ideograph: a word of its own
  kPunct = 8,    // punctuation (ASCII's, or a P* category as of Unicode 8.0)
  kMark = 16,    // a non-spacing mark (Mn as of Unicode 8.0)
  kNoNfd = 32,   // newer than the normalization tables (12.1): left as it is
};
uint8_t HfCharFlags(char32_t c);

// Unicode normalization in place, as the unicode-normalization-alignments crate does
// it: characters newer than its tables (Unicode 12.1) are left as they are.
enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
void HfNormalize(NormalForm form, std::u32string* text);

// Appends the full lowercase of `c` (Rust's char::to_lowercase: no context, so a
// capital sigma is always a small sigma).
void AppendLowercase(char32_t c, std::u32string* out);

// tokenizers' BertNormalizer: clean_text (drop kRemoved characters, whitespace becomes
// ' '), handle_chinese_chars (spaces around each CJK ideograph), strip_accents (NFD,
// then drop kMark characters), lowercase, in that order. `text` is valid UTF-8; `out`
// receives the result.
struct BertNormalization {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  bool strip_accents = true;
  bool lowercase = true;
};
void HfBertNormalize(absl::string_view text, const BertNormalization& how,
                     std::u32string* out);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_TEXT_UNICODE_TEXT_H_
