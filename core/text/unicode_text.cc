#include "core/text/unicode_text.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/utf16.h>

#include <algorithm>
#include <array>

#include "absl/strings/str_format.h"

namespace attnserve::core {
namespace {

// Hugging Face tokenizers takes general categories (control, format, private use,
// non-spacing mark, punctuation) from the unicode_categories crate, whose tables are
// Unicode 8.0's: a character assigned later has no category there (it is kept as it
// is, never dropped nor split off). ICU knows each character's age, so these rules
// apply the category only to characters that Unicode 8.0 already had. Whitespace,
// case and NFD come from Rust's own current tables, as here from ICU's.
constexpr uint8_t kCategoriesMajorVersion = 8;

// The characters whose general category Unicode changed after 8.0, with their 8.0
// category, as Hugging Face still sees them. The exhaustive code point test
// (tests/core/wordpiece_tokenizer_test.cc) finds any character this list misses.
struct CategoryChange {
  UChar32 c;
  int8_t type_in_8;
};
constexpr CategoryChange kCategoryChangedSince8[] = {
    {0x166D, U_OTHER_PUNCTUATION},       // CANADIAN SYLLABICS CHI SIGN, So now
    {0x1734, U_NON_SPACING_MARK},        // HANUNOO SIGN PAMUDPOD, Mc now
    {0x1885, U_OTHER_LETTER},            // MONGOLIAN LETTER ALI GALI BALUDA, Mn now
    {0x1886, U_OTHER_LETTER},            // ... THREE BALUDA, Mn now
    {0xA9BD, U_COMBINING_SPACING_MARK},  // JAVANESE CONSONANT SIGN KERET, Mn now
    {0x111C9, U_OTHER_PUNCTUATION},      // SHARADA SANDHI MARK, Mn now
};

// Its NFD tables (the unicode-normalization-alignments crate) are Unicode 12.1's: a
// character assigned later is not decomposed there (U+11938, Dives Akuru, is the one
// ICU 72 knows).
constexpr uint8_t kDecompositionMajorVersion = 12;
constexpr uint8_t kDecompositionMinorVersion = 1;

bool IsChinese(UChar32 c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

bool InOldCategories(UChar32 c) {
  UVersionInfo age;
  u_charAge(c, age);
  // Unassigned characters have age 0.0 and category Cn: nothing applies to them.
  return age[0] != 0 && age[0] <= kCategoriesMajorVersion;
}

uint8_t ComputeFlags(UChar32 c) {
  if (c == '\t' || c == '\n' || c == '\r') return kSpace;
  uint8_t flags = 0;
  UVersionInfo age;
  u_charAge(c, age);
  if (age[0] > kDecompositionMajorVersion ||
      (age[0] == kDecompositionMajorVersion && age[1] > kDecompositionMinorVersion)) {
    flags |= kNoNfd;
  }
  const bool old = InOldCategories(c);
  int8_t type = u_charType(c);
  for (const CategoryChange& change : kCategoryChangedSince8) {
    if (change.c == c) type = change.type_in_8;
  }
  if (c == 0 || c == 0xFFFD ||
      (old &&
       (type == U_CONTROL_CHAR || type == U_FORMAT_CHAR || type == U_PRIVATE_USE_CHAR))) {
    flags |= kRemoved;
  }
  if (u_isUWhiteSpace(c)) flags |= kSpace;
  if (IsChinese(c)) flags |= kChinese;
  const bool ascii_punct = c < 128 && ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) ||
                                       (c >= 91 && c <= 96) || (c >= 123 && c <= 126));
  const bool unicode_punct =
      old && (type == U_CONNECTOR_PUNCTUATION || type == U_DASH_PUNCTUATION ||
              type == U_START_PUNCTUATION || type == U_END_PUNCTUATION ||
              type == U_INITIAL_PUNCTUATION || type == U_FINAL_PUNCTUATION ||
              type == U_OTHER_PUNCTUATION);
  if (ascii_punct || unicode_punct) flags |= kPunct;
  if (old && type == U_NON_SPACING_MARK) flags |= kMark;
  return flags;
}

// The flags of the Basic Multilingual Plane, computed once; others on demand.
uint8_t HfCharFlagsOf(UChar32 c) {
  static const std::array<uint8_t, 0x10000>* const table = [] {
    auto* flags = new std::array<uint8_t, 0x10000>();
    for (UChar32 c = 0; c < 0x10000; ++c) (*flags)[c] = ComputeFlags(c);
    return flags;
  }();
  return c < 0x10000 ? (*table)[c] : ComputeFlags(c);
}

// The offset of the first byte of `text` that does not start a well-formed UTF-8
// sequence (as Python's decoder reports it), or -1.

// The normalizer of `form`, in ICU's UTF-16 API; null if ICU has no data (it is built
// in: this does not happen).
const UNormalizer2* Normalizer(NormalForm form) {
  UErrorCode error = U_ZERO_ERROR;
  switch (form) {
    case NormalForm::kNfc:
      return unorm2_getNFCInstance(&error);
    case NormalForm::kNfd:
      return unorm2_getNFDInstance(&error);
    case NormalForm::kNfkc:
      return unorm2_getNFKCInstance(&error);
    case NormalForm::kNfkd:
      return unorm2_getNFKDInstance(&error);
  }
  return nullptr;
}

// Normalizes a run of characters that the tables all know.
void NormalizeRun(const UNormalizer2* normalizer, std::u32string* text) {
  if (normalizer == nullptr || text->empty()) return;
  std::u16string utf16;
  utf16.reserve(text->size());
  for (const char32_t c : *text) {
    if (c < 0x10000) {
      utf16.push_back(static_cast<char16_t>(c));
    } else {
      utf16.push_back(static_cast<char16_t>(U16_LEAD(c)));
      utf16.push_back(static_cast<char16_t>(U16_TRAIL(c)));
    }
  }
  UErrorCode error = U_ZERO_ERROR;
  const auto* source = reinterpret_cast<const UChar*>(utf16.data());
  const auto length = static_cast<int32_t>(utf16.size());
  // Text already normalized (most of it) is left as it is.
  const int32_t span = unorm2_spanQuickCheckYes(normalizer, source, length, &error);
  if (U_FAILURE(error) || span == length) return;
  // NFKD grows a character to at most 18 (U+FDFA); retried once when that is short.
  std::u16string normalized(static_cast<size_t>(length) * 4 + 16, u'\0');
  int32_t written = unorm2_normalize(normalizer, source, length,
                                     reinterpret_cast<UChar*>(normalized.data()),
                                     static_cast<int32_t>(normalized.size()), &error);
  if (error == U_BUFFER_OVERFLOW_ERROR) {
    error = U_ZERO_ERROR;
    normalized.assign(static_cast<size_t>(written), u'\0');
    written = unorm2_normalize(normalizer, source, length,
                               reinterpret_cast<UChar*>(normalized.data()),
                               static_cast<int32_t>(normalized.size()), &error);
  }
  if (U_FAILURE(error)) return;
  text->clear();
  for (int32_t i = 0; i < written;) {
    UChar32 c;
    U16_NEXT(normalized.data(), i, written, c);
    text->push_back(static_cast<char32_t>(c));
  }
}

}  // namespace

int64_t FirstInvalidUtf8(absl::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t i = 0;
  while (i < size) {
    const unsigned char b = bytes[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t length;
    unsigned char low = 0x80, high = 0xBF;  // the second byte's range
    if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) low = 0xA0;   // overlong
      if (b == 0xED) high = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) low = 0x90;   // overlong
      if (b == 0xF4) high = 0x8F;  // past U+10FFFF
    } else {
      return static_cast<int64_t>(i);
    }
    // A sequence that is cut short or malformed is reported at its first byte.
    if (i + 1 >= size || bytes[i + 1] < low || bytes[i + 1] > high) {
      return static_cast<int64_t>(i);
    }
    for (size_t k = 2; k < length; ++k) {
      if (i + k >= size || (bytes[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
    }
    i += length;
  }
  return -1;
}

char32_t DecodeUtf8(absl::string_view text, size_t* i) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char b = bytes[*i];
  if (b < 0x80) {
    ++*i;
    return b;
  }
  int length = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t c = b & (0x7F >> length);
  for (int k = 1; k < length; ++k) c = (c << 6) | (bytes[*i + k] & 0x3F);
  *i += length;
  return c;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string Utf8Lossy(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const int64_t bad = FirstInvalidUtf8(bytes.substr(i));
    if (bad < 0) {
      out.append(bytes.data() + i, bytes.size() - i);
      break;
    }
    out.append(bytes.data() + i, static_cast<size_t>(bad));
    i += static_cast<size_t>(bad);
    // The maximal subpart: the lead byte and the continuation bytes that are valid
    // after it (the second byte's range depends on the lead, as in FirstInvalidUtf8).
    const auto b = static_cast<unsigned char>(bytes[i]);
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) low = 0xA0;
      if (b == 0xED) high = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) low = 0x90;
      if (b == 0xF4) high = 0x8F;
    }
    size_t taken = 1;
    while (taken < length && i + taken < bytes.size()) {
      const auto next = static_cast<unsigned char>(bytes[i + taken]);
      const bool valid =
          taken == 1 ? (next >= low && next <= high) : (next & 0xC0) == 0x80;
      if (!valid) break;
      ++taken;
    }
    out += "\xEF\xBF\xBD";  // U+FFFD
    i += taken;
  }
  return out;
}

const std::array<std::string, 256>& ByteLevelChars() {
  static const std::array<std::string, 256>* const table = [] {
    auto* chars = new std::array<std::string, 256>();
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      AppendUtf8(printable ? static_cast<char32_t>(b) : next++, &(*chars)[b]);
    }
    return chars;
  }();
  return *table;
}

absl::Status CheckUtf8(absl::string_view text) {
  if (const int64_t bad = FirstInvalidUtf8(text); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not valid UTF-8 at byte offset %d (0x%02X)", bad,
                        static_cast<unsigned char>(text[static_cast<size_t>(bad)])));
  }
  return absl::OkStatus();
}

std::u32string ToUtf32(absl::string_view valid_utf8) {
  std::u32string out;
  out.reserve(valid_utf8.size());
  for (size_t i = 0; i < valid_utf8.size();) out.push_back(DecodeUtf8(valid_utf8, &i));
  return out;
}

std::string ToUtf8(const std::u32string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char32_t c : text) AppendUtf8(c, &out);
  return out;
}

uint8_t HfCharFlags(char32_t c) { return HfCharFlagsOf(static_cast<UChar32>(c)); }

void HfNormalize(NormalForm form, std::u32string* text) {
  const UNormalizer2* normalizer = Normalizer(form);
  const auto newer = std::find_if(text->begin(), text->end(), [](char32_t c) {
    return (HfCharFlags(c) & kNoNfd) != 0;
  });
  if (newer == text->end()) {
    NormalizeRun(normalizer, text);
    return;
  }
  // Runs between the newer characters are normalized each on their own.
  std::u32string out, run;
  for (const char32_t c : *text) {
    if (HfCharFlags(c) & kNoNfd) {
      NormalizeRun(normalizer, &run);
      out += run;
      run.clear();
      out.push_back(c);
    } else {
      run.push_back(c);
    }
  }
  NormalizeRun(normalizer, &run);
  out += run;
  text->swap(out);
}

void AppendLowercase(char32_t c, std::u32string* out) {
  if (c < 0x80) {
    out->push_back(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
  } else if (c == 0x130) {
    // Capital I with dot above: its full lowercase is two characters (i + U+0307),
    // the one unconditional lowercase mapping that is not one-to-one.
    out->push_back(U'i');
    out->push_back(U'\u0307');
  } else {
    out->push_back(static_cast<char32_t>(u_tolower(static_cast<UChar32>(c))));
  }
}

void HfBertNormalize(absl::string_view text, const BertNormalization& how,
                     std::u32string* out) {
  out->clear();
  bool ascii = true;
  for (size_t i = 0; i < text.size();) {
    char32_t c = DecodeUtf8(text, &i);
    const uint8_t flags = HfCharFlags(c);
    if (how.clean_text) {
      if (flags & kRemoved) continue;
      if (flags & kSpace) c = ' ';
    }
    if (how.handle_chinese_chars && (flags & kChinese)) {
      out->push_back(U' ');
      out->push_back(c);
      out->push_back(U' ');
      ascii = false;
      continue;
    }
    if (c >= 0x80) ascii = false;
    out->push_back(c);
  }
  if (how.strip_accents && !ascii) {
    HfNormalize(NormalForm::kNfd, out);
    out->erase(std::remove_if(out->begin(), out->end(),
                              [](char32_t c) { return (HfCharFlags(c) & kMark) != 0; }),
               out->end());
  }
  if (how.lowercase) {
    if (ascii) {
      for (char32_t& c : *out) {
        if (c >= 'A' && c <= 'Z') c += 'a' - 'A';
      }
    } else {
      std::u32string lowered;
      lowered.reserve(out->size());
      for (const char32_t c : *out) AppendLowercase(c, &lowered);
      out->swap(lowered);
    }
  }
}

}  // namespace attnserve::core
