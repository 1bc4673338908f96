#include "core/text/pipeline_tokenizer.h"

#include <unicode/ubrk.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/utext.h>
// Oniguruma would define UChar, which is ICU's type.
#define ONIG_ESCAPE_UCHAR_COLLISION
#include <oniguruma.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/base/status_macros.h"
#include "core/text/unicode_text.h"
#include "nlohmann/json.hpp"

namespace attnserve::core {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view where, absl::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json ", where, ": ", message));
}

std::string TypeOf(const Json& object) {
  if (object.is_object() && object.contains("type") && object["type"].is_string()) {
    return object["type"].get<std::string>();
  }
  return object.is_null() ? "null" : "(none)";
}

absl::StatusOr<bool> BoolField(const Json& object, const char* key, bool fallback,
                               absl::string_view where) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  if (!object[key].is_boolean()) {
    return Invalid(where, absl::StrCat(key, " must be true or false"));
  }
  return object[key].get<bool>();
}

absl::StatusOr<std::string> StringField(const Json& object, const char* key,
                                        absl::string_view where) {
  if (!object.contains(key) || !object[key].is_string()) {
    return Invalid(where, absl::StrCat(key, " must be a string"));
  }
  std::string value = object[key].get<std::string>();
  ATTN_RETURN_IF_ERROR(CheckUtf8(value));
  return value;
}

// An id as tokenizer.json writes it: an integer in [0, 2^31).
absl::StatusOr<int64_t> IdValue(const Json& value, absl::string_view where) {
  if (!value.is_number_unsigned() || value.get<uint64_t>() >= (uint64_t{1} << 31)) {
    return Invalid(where, "must be an id in [0, 2^31)");
  }
  return static_cast<int64_t>(value.get<uint64_t>());
}

// ----------------------------------------------------------------------------
// Characters as Rust sees them (the predicates `tokenizers` splits with).

bool IsWhitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)) != 0; }

// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation,
// join controls.
bool IsWordChar(char32_t c) {
  const auto u = static_cast<UChar32>(c);
  if (c < 0x80) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_';
  }
  const int32_t mask = U_GET_GC_MASK(u);
  return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) ||
         (mask & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
         u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL);
}

// char::is_numeric: Nd, Nl, No.
bool IsNumeric(char32_t c) {
  return (U_GET_GC_MASK(static_cast<UChar32>(c)) & U_GC_N_MASK) != 0;
}

// ----------------------------------------------------------------------------
// Regular expressions on Oniguruma, found as the onig crate's find_iter finds them.

class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern,
                                                        absl::string_view where) {
    static const bool initialized = [] {
      OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
      return onig_initialize(encodings, 1) == ONIG_NORMAL;
    }();
    if (!initialized) return absl::InternalError("Oniguruma did not initialize");
    OnigRegex regex = nullptr;
    OnigErrorInfo info;
    const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
    const int result = onig_new(&regex, begin, begin + pattern.size(), ONIG_OPTION_NONE,
                                ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
    if (result != ONIG_NORMAL) {
      OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
      onig_error_code_to_str(message, result, &info);
      return Invalid(where,
                     absl::StrCat("pattern \"", pattern, "\" is not a valid regex: ",
                                  reinterpret_cast<const char*>(message)));
    }
    return std::unique_ptr<Regex>(new Regex(regex));
  }
  ~Regex() { onig_free(regex_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [start, end) byte ranges of the matches in `text`, left to right; an empty
  // match right where the previous match ended is skipped.
  void FindAll(absl::string_view text,
               std::vector<std::pair<size_t, size_t>>* out) const {
    out->clear();
    // One match region per thread, freed with the thread.
    struct Region {
      OnigRegion* region = onig_region_new();
      ~Region() { onig_region_free(region, 1); }
    };
    thread_local const Region owned;
    OnigRegion* const region = owned.region;
    const auto* begin = reinterpret_cast<const OnigUChar*>(text.data());
    const auto* end = begin + text.size();
    size_t from = 0;
    std::optional<size_t> last_match_end;
    while (from <= text.size()) {
      onig_region_clear(region);
      const int found =
          onig_search(regex_, begin, end, begin + from, end, region, ONIG_OPTION_NONE);
      if (found < 0) return;  // no match (or a search error: nothing more to find)
      const auto start = static_cast<size_t>(region->beg[0]);
      const auto stop = static_cast<size_t>(region->end[0]);
      if (start == stop && last_match_end == stop) {
        if (from >= text.size()) return;
        size_t next = from;
        DecodeUtf8(text, &next);
        from = next;
        continue;
      }
      from = stop;
      last_match_end = stop;
      out->emplace_back(start, stop);
    }
  }

 private:
  explicit Regex(OnigRegex regex) : regex_(regex) {}
  OnigRegex regex_;
};

// A literal or a regex, as Split and Replace take them ({"String": s} or {"Regex": r}).
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;  // set for a Regex pattern

  void FindAll(absl::string_view text,
               std::vector<std::pair<size_t, size_t>>* out) const {
    if (regex != nullptr) {
      regex->FindAll(text, out);
      return;
    }
    out->clear();
    for (size_t at = text.find(literal); at != absl::string_view::npos;
         at = text.find(literal, at + literal.size())) {
      out->emplace_back(at, at + literal.size());
    }
  }
};

absl::StatusOr<Pattern> ReadPattern(const Json& object, absl::string_view where) {
  if (!object.contains("pattern") || !object["pattern"].is_object() ||
      object["pattern"].size() != 1) {
    return Invalid(where, "pattern must be {\"String\": ...} or {\"Regex\": ...}");
  }
  const Json& pattern = object["pattern"];
  Pattern out;
  if (pattern.contains("String")) {
    ATTN_ASSIGN_OR_RETURN(out.literal, StringField(pattern, "String", where));
  } else if (pattern.contains("Regex")) {
    ATTN_ASSIGN_OR_RETURN(const std::string regex, StringField(pattern, "Regex", where));
    ATTN_ASSIGN_OR_RETURN(out.regex, Regex::Compile(regex, where));
    return out;
  } else {
    return Invalid(where, "pattern must be {\"String\": ...} or {\"Regex\": ...}");
  }
  if (out.literal.empty()) return Invalid(where, "pattern.String must not be empty");
  return out;
}

// A Sequence's parts (json[key], a list), each read by `read` one level deeper.
template <typename Part, typename Read>
absl::StatusOr<std::vector<std::unique_ptr<Part>>> ReadSteps(const Json& json,
                                                             const char* key,
                                                             absl::string_view where,
                                                             int depth, Read read) {
  if (!json.contains(key) || !json[key].is_array()) {
    return Invalid(where, absl::StrCat("Sequence needs a ", key, " list"));
  }
  std::vector<std::unique_ptr<Part>> steps;
  int i = 0;
  for (const Json& step : json[key]) {
    ATTN_ASSIGN_OR_RETURN(
        std::unique_ptr<Part> part,
        read(step, absl::StrCat(where, ".", key, "[", i++, "]"), depth + 1));
    steps.push_back(std::move(part));
  }
  return steps;
}

// ----------------------------------------------------------------------------
// Pieces and how a pattern's matches split them (tokenizers' SplitDelimiterBehavior).

// Where each byte of a normalized text came from: the [start, end) bytes of the input
// text (tokenizers' NormalizedString alignments, kept absolute rather than relative to
// each split; every byte of a character holds the same pair). Tracked only for
// Tokenize; empty on Encode's path.
using Alignments = std::vector<std::pair<int64_t, int64_t>>;

Alignments SliceAlignments(const Alignments& align, size_t start, size_t end) {
  if (align.empty()) return {};
  return Alignments(align.begin() + static_cast<std::ptrdiff_t>(start),
                    align.begin() + static_cast<std::ptrdiff_t>(end));
}

// The bytes of the input text that the normalized bytes [start, end) came from.
std::pair<int64_t, int64_t> OriginalRange(const Alignments& align, size_t start,
                                          size_t end) {
  return {align[start].first, align[end - 1].second};
}

struct Piece {
  std::string text;
  // Whether it starts where the input text starts (Metaspace's prepend_scheme "first").
  bool at_origin = false;
  // One entry per byte of `text` when offsets are tracked, else empty.
  Alignments align;
};

// Each character with the change it makes to the character count at its place:
// tokenizers' (char, isize) transformations (0 replaces a character, n > 0 inserts,
// n < 0 also removes the n characters after the one it replaces).
using Changes = std::vector<std::pair<char32_t, int64_t>>;

// tokenizers' NormalizedString::transform over a whole text: the text becomes the
// characters of `changes`, the first `initial_offset` characters removed; a character
// that replaces another takes its alignment, an inserted one the alignment of the byte
// before it.
void Transform(const Changes& changes, size_t initial_offset, std::string* text,
               Alignments* align) {
  std::vector<size_t> sizes;
  sizes.reserve(text->size());
  for (size_t i = 0; i < text->size();) {
    const size_t at = i;
    DecodeUtf8(*text, &i);
    sizes.push_back(i - at);
  }
  size_t next = 0;    // the next old character
  size_t offset = 0;  // its byte offset
  for (; next < initial_offset && next < sizes.size(); ++next) offset += sizes[next];
  std::string out;
  Alignments out_align;
  out.reserve(text->size());
  out_align.reserve(text->size());
  for (const auto& [c, change] : changes) {
    std::pair<int64_t, int64_t> origin{0, 0};
    if (change > 0) {
      if (offset >= 1) origin = (*align)[offset - 1];
    } else if (offset < align->size()) {
      origin = (*align)[offset];
    } else if (!align->empty()) {
      origin = align->back();
    }
    if (change <= 0 && next < sizes.size()) offset += sizes[next++];
    for (int64_t k = 0; k < -change && next < sizes.size(); ++k) offset += sizes[next++];
    const size_t before = out.size();
    AppendUtf8(c, &out);
    out_align.insert(out_align.end(), out.size() - before, origin);
  }
  text->swap(out);
  align->swap(out_align);
}

// tokenizers' NormalizedString::filter: a kept character absorbs the removed ones after
// it; those before the first kept one are the initial offset.
template <typename Keep>
void FilterAligned(Keep keep, std::string* text, Alignments* align) {
  Changes changes;
  size_t removed = 0, removed_start = 0;
  std::optional<char32_t> last;
  for (size_t i = 0; i < text->size();) {
    const char32_t c = DecodeUtf8(*text, &i);
    if (!keep(c)) {
      ++removed;
      continue;
    }
    if (last) {
      changes.emplace_back(*last, -static_cast<int64_t>(removed));
    } else {
      removed_start = removed;
    }
    last = c;
    removed = 0;
  }
  if (last) changes.emplace_back(*last, -static_cast<int64_t>(removed));
  Transform(changes, removed_start, text, align);
}

// Each character replaced by the ones `map` appends (one or more): the first replaces
// it, the others are inserted (tokenizers' map and lowercase).
template <typename Map>
void MapAligned(Map map, std::string* text, Alignments* align) {
  Changes changes;
  std::u32string each;
  for (size_t i = 0; i < text->size();) {
    each.clear();
    map(DecodeUtf8(*text, &i), &each);
    for (size_t k = 0; k < each.size(); ++k) {
      changes.emplace_back(each[k], k == 0 ? 0 : 1);
    }
  }
  Transform(changes, 0, text, align);
}

// The alignment of a text as given: each byte holds its character's bytes.
Alignments Identity(absl::string_view text, int64_t base) {
  Alignments align;
  align.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    DecodeUtf8(text, &i);
    align.insert(align.end(), i - at,
                 {base + static_cast<int64_t>(at), base + static_cast<int64_t>(i)});
  }
  return align;
}

enum class Behavior {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous
};

absl::StatusOr<Behavior> ReadBehavior(const Json& object, Behavior fallback,
                                      absl::string_view where) {
  if (!object.contains("behavior")) return fallback;
  const std::string name =
      object["behavior"].is_string() ? object["behavior"].get<std::string>() : "";
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return Invalid(where, absl::StrCat("behavior \"", name,
                                     "\" is not one of Removed, Isolated, "
                                     "MergedWithPrevious, MergedWithNext, Contiguous"));
}

struct Span {
  size_t start;
  size_t end;
  bool match;
};

// The matches of `text` and the gaps between them, in order (Pattern::find_matches).
std::vector<Span> Spans(absl::string_view text,
                        const std::vector<std::pair<size_t, size_t>>& matches,
                        bool invert) {
  std::vector<Span> spans;
  if (text.empty()) return spans;
  size_t previous = 0;
  for (const auto& [start, end] : matches) {
    if (previous != start) spans.push_back({previous, start, invert});
    spans.push_back({start, end, !invert});
    previous = end;
  }
  if (previous != text.size()) spans.push_back({previous, text.size(), invert});
  return spans;
}

// Every character for which `is_match` holds is a match of its own.
template <typename Predicate>
std::vector<Span> CharSpans(absl::string_view text, Predicate is_match) {
  std::vector<Span> spans;
  size_t last = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t at = i;
    if (is_match(DecodeUtf8(text, &i))) {
      if (last < at) spans.push_back({last, at, false});
      spans.push_back({at, i, true});
      last = i;
    }
  }
  if (last < text.size()) spans.push_back({last, text.size(), false});
  return spans;
}

// Appends the pieces `spans` cut `piece` into under `behavior`; empty ones are dropped.
void SplitPiece(const Piece& piece, const std::vector<Span>& spans, Behavior behavior,
                std::vector<Piece>* out) {
  std::vector<std::pair<size_t, size_t>> kept;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const Span& span : spans) kept.emplace_back(span.start, span.end);
      break;
    case Behavior::kRemoved:
      for (const Span& span : spans) {
        if (!span.match) kept.emplace_back(span.start, span.end);
      }
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const Span& span : spans) {
        if (span.match == previous && !kept.empty()) {
          kept.back().second = span.end;
        } else {
          kept.emplace_back(span.start, span.end);
        }
        previous = span.match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Span& span : spans) {
        if (span.match && !previous && !kept.empty()) {
          kept.back().second = span.end;
        } else {
          kept.emplace_back(span.start, span.end);
        }
        previous = span.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !previous && !kept.empty()) {
          kept.back().first = it->start;
        } else {
          kept.emplace_back(it->start, it->end);
        }
        previous = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const auto& [start, end] : kept) {
    if (start == end) continue;
    out->push_back({piece.text.substr(start, end - start), piece.at_origin && start == 0,
                    SliceAlignments(piece.align, start, end)});
  }
}

// ----------------------------------------------------------------------------
// Normalizers.

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8 and stays so.
  virtual void Normalize(std::string* text) const = 0;
  // The same text as Normalize makes, with `align` (one entry per byte of *text)
  // following it as tokenizers' alignments follow it.
  virtual void NormalizeAligned(std::string* text, Alignments* align) const = 0;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void Normalize(std::string* text) const override {
    for (const auto& step : steps_) step->Normalize(text);
  }
  void NormalizeAligned(std::string* text, Alignments* align) const override {
    for (const auto& step : steps_) step->NormalizeAligned(text, align);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// Rewrites the text as code points: each kept, dropped or replaced by `map`.
template <typename Map>
void MapChars(std::string* text, Map map) {
  std::u32string chars = ToUtf32(*text);
  std::u32string out;
  out.reserve(chars.size());
  for (const char32_t c : chars) map(c, &out);
  *text = ToUtf8(out);
}

class FormNormalizer : public Normalizer {
 public:
  explicit FormNormalizer(NormalForm form) : form_(form) {}
  void Normalize(std::string* text) const override {
    if (std::all_of(text->begin(), text->end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
      return;  // ASCII is its own normal form in all four
    }
    std::u32string chars = ToUtf32(*text);
    HfNormalize(form_, &chars);
    *text = ToUtf8(chars);
  }
  void NormalizeAligned(std::string* text, Alignments* align) const override {
    if (std::all_of(text->begin(), text->end(),
                    [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
      return;
    }
    Transform(FormChanges(form_, ToUtf32(*text)), 0, text, align);
  }

  // The changes of normalizing `chars`, as the unicode-normalization-alignments crate
  // reports them: normalized one segment at a time (segments start where the form has
  // a boundary), a segment's characters replace its input's one by one, extra ones are
  // inserted, and a shorter segment's last character absorbs the rest. Where each
  // input character normalizes on its own to as many characters as the segment has
  // (decompositions), each one's first output replaces it and the rest are inserted.
  static Changes FormChanges(NormalForm form, const std::u32string& chars) {
    UErrorCode error = U_ZERO_ERROR;
    const UNormalizer2* boundaries =
        form == NormalForm::kNfc    ? unorm2_getNFCInstance(&error)
        : form == NormalForm::kNfd  ? unorm2_getNFDInstance(&error)
        : form == NormalForm::kNfkc ? unorm2_getNFKCInstance(&error)
                                    : unorm2_getNFKDInstance(&error);
    const auto starts_segment = [&](size_t i) {
      if (i == 0 || U_FAILURE(error)) return true;
      // Characters newer than the tables are left alone: segments of their own.
      if ((HfCharFlags(chars[i]) & kNoNfd) || (HfCharFlags(chars[i - 1]) & kNoNfd)) {
        return true;
      }
      return unorm2_hasBoundaryBefore(boundaries, static_cast<UChar32>(chars[i])) != 0;
    };
    Changes changes;
    int64_t carried = 0;  // characters of empty segments, absorbed by the next change
    for (size_t start = 0; start < chars.size();) {
      size_t end = start + 1;
      while (end < chars.size() && !starts_segment(end)) ++end;
      std::u32string segment = chars.substr(start, end - start);
      HfNormalize(form, &segment);
      const auto n = static_cast<int64_t>(end - start);
      const auto m = static_cast<int64_t>(segment.size());
      std::vector<int64_t> own;
      int64_t total = 0;
      for (size_t i = start; i < end; ++i) {
        std::u32string one(1, chars[i]);
        HfNormalize(form, &one);
        own.push_back(static_cast<int64_t>(one.size()));
        total += own.back();
      }
      const size_t first = changes.size();
      if (total == m && std::find(own.begin(), own.end(), 0) == own.end()) {
        size_t k = 0;
        for (const int64_t count : own) {
          for (int64_t j = 0; j < count; ++j) {
            changes.emplace_back(segment[k++], j == 0 ? 0 : 1);
          }
        }
      } else if (m >= n) {
        for (int64_t k = 0; k < m; ++k) changes.emplace_back(segment[k], k < n ? 0 : 1);
      } else if (m > 0) {
        for (int64_t k = 0; k < m; ++k) {
          changes.emplace_back(segment[k], k + 1 < m ? 0 : -(n - m));
        }
      } else {
        carried += n;
      }
      if (carried > 0 && changes.size() > first) {
        changes[first].second -= carried;
        carried = 0;
      }
      start = end;
    }
    return changes;
  }

 private:
  NormalForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override {
    MapChars(text, [](char32_t c, std::u32string* out) { AppendLowercase(c, out); });
  }
  void NormalizeAligned(std::string* text, Alignments* align) const override {
    MapAligned([](char32_t c, std::u32string* out) { AppendLowercase(c, out); }, text,
               align);
  }
};

// Drops combining marks (Mn, Mc, Me) as the unicode-normalization-alignments crate's
// table has them, Unicode 9.0's: marks assigned later are kept, and the two Vedic signs
// that were marks then (U+1CF2, U+1CF3; letters now) are dropped.
bool IsCombiningMarkOf9(char32_t c) {
  if (c == 0x1CF2 || c == 0x1CF3) return true;
  const auto u = static_cast<UChar32>(c);
  if ((U_GET_GC_MASK(u) & U_GC_M_MASK) == 0) return false;
  UVersionInfo age;
  u_charAge(u, age);
  return age[0] != 0 && age[0] <= 9;
}

class StripAccentsNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override {
    MapChars(text, [](char32_t c, std::u32string* out) {
      if (!IsCombiningMarkOf9(c)) out->push_back(c);
    });
  }
  void NormalizeAligned(std::string* text, Alignments* align) const override {
    FilterAligned([](char32_t c) { return !IsCombiningMarkOf9(c); }, text, align);
  }
};

class BertNormalizer : public Normalizer {
 public:
  explicit BertNormalizer(const BertNormalization& how) : how_(how) {}
  void Normalize(std::string* text) const override {
    std::u32string chars;
    HfBertNormalize(*text, how_, &chars);
    *text = ToUtf8(chars);
  }
  // tokenizers' steps, each a transformation: clean_text (filter, then whitespace
  // mapped to ' '), spaces around CJK ideographs, NFD and non-spacing marks dropped,
  // lowercase.
  void NormalizeAligned(std::string* text, Alignments* align) const override {
    if (how_.clean_text) {
      FilterAligned([](char32_t c) { return (HfCharFlags(c) & kRemoved) == 0; }, text,
                    align);
      MapAligned(
          [](char32_t c, std::u32string* out) {
            out->push_back((HfCharFlags(c) & kSpace) ? U' ' : c);
          },
          text, align);
    }
    if (how_.handle_chinese_chars) {
      Changes changes;
      for (size_t i = 0; i < text->size();) {
        const char32_t c = DecodeUtf8(*text, &i);
        if (HfCharFlags(c) & kChinese) {
          changes.insert(changes.end(), {{U' ', 0}, {c, 1}, {U' ', 1}});
        } else {
          changes.emplace_back(c, 0);
        }
      }
      Transform(changes, 0, text, align);
    }
    if (how_.strip_accents) {
      FormNormalizer(NormalForm::kNfd).NormalizeAligned(text, align);
      FilterAligned([](char32_t c) { return (HfCharFlags(c) & kMark) == 0; }, text,
                    align);
    }
    if (how_.lowercase) {
      LowercaseNormalizer().NormalizeAligned(text, align);
    }
  }

 private:
  BertNormalization how_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    const std::u32string chars = ToUtf32(*text);
    size_t begin = 0, end = chars.size();
    if (left_) {
      while (begin < end && IsWhitespace(chars[begin])) ++begin;
    }
    if (right_) {
      while (end > begin && IsWhitespace(chars[end - 1])) --end;
    }
    if (begin == 0 && end == chars.size()) return;
    *text = ToUtf8(chars.substr(begin, end - begin));
  }
  void NormalizeAligned(std::string* text, Alignments* align) const override {
    const std::u32string chars = ToUtf32(*text);
    size_t begin = 0, end = chars.size();
    if (left_) {
      while (begin < end && IsWhitespace(chars[begin])) ++begin;
    }
    if (right_) {
      while (end > begin && IsWhitespace(chars[end - 1])) --end;
    }
    if (begin == 0 && end == chars.size()) return;
    Changes changes;
    for (size_t i = begin; i < end; ++i) changes.emplace_back(chars[i], 0);
    Transform(changes, begin, text, align);
  }

 private:
  bool left_;
  bool right_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    if (text->empty()) return;  // tokenizers finds no match in an empty text
    thread_local std::vector<std::pair<size_t, size_t>> matches;
    pattern_.FindAll(*text, &matches);
    if (matches.empty()) return;
    std::string out;
    size_t last = 0;
    for (const auto& [start, end] : matches) {
      out.append(*text, last, start - last);
      out += content_;
      last = end;
    }
    out.append(*text, last, std::string::npos);
    text->swap(out);
  }
  // Each match's characters are removed and the content's inserted, aligned to the
  // match's last byte (tokenizers' NormalizedString::replace).
  void NormalizeAligned(std::string* text, Alignments* align) const override {
    if (text->empty()) return;
    std::vector<std::pair<size_t, size_t>> matches;
    pattern_.FindAll(*text, &matches);
    if (matches.empty()) return;
    std::string out;
    Alignments out_align;
    size_t last = 0;
    for (const auto& [start, end] : matches) {
      out.append(*text, last, start - last);
      out_align.insert(out_align.end(),
                       align->begin() + static_cast<std::ptrdiff_t>(last),
                       align->begin() + static_cast<std::ptrdiff_t>(start));
      const std::pair<int64_t, int64_t> origin =
          end >= 1 ? (*align)[end - 1] : std::pair<int64_t, int64_t>{0, 0};
      out += content_;
      out_align.insert(out_align.end(), content_.size(), origin);
      last = end;
    }
    out.append(*text, last, std::string::npos);
    out_align.insert(out_align.end(), align->begin() + static_cast<std::ptrdiff_t>(last),
                     align->end());
    text->swap(out);
    align->swap(out_align);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }
  // The prefix and the first character all take the first character's alignment.
  void NormalizeAligned(std::string* text, Alignments* align) const override {
    if (text->empty()) return;
    Changes changes;
    for (const char32_t c : ToUtf32(prefix_)) {
      changes.emplace_back(c, changes.empty() ? 0 : 1);
    }
    bool first = true;
    for (size_t i = 0; i < text->size();) {
      changes.emplace_back(DecodeUtf8(*text, &i), first ? 1 : 0);
      first = false;
    }
    Transform(changes, 0, text, align);
  }

 private:
  std::string prefix_;
};

// SentencePiece's nmt_nfkc clean-up: controls dropped, odd spaces made ' '.
class NmtNormalizer : public Normalizer {
 public:
  void Normalize(std::string* text) const override {
    MapChars(text, [](char32_t c, std::u32string* out) {
      if (!Dropped(c)) out->push_back(Spaced(c));
    });
  }
  void NormalizeAligned(std::string* text, Alignments* align) const override {
    FilterAligned([](char32_t c) { return !Dropped(c); }, text, align);
    MapAligned([](char32_t c, std::u32string* out) { out->push_back(Spaced(c)); }, text,
               align);
  }

 private:
  static bool Dropped(char32_t c) {
    return (c >= 0x01 && c <= 0x08) || c == 0x0B || (c >= 0x0E && c <= 0x1F) ||
           c == 0x7F || c == 0x8F || c == 0x9F;
  }
  static char32_t Spaced(char32_t c) {
    const bool space = c == 0x09 || c == 0x0A || c == 0x0C || c == 0x0D || c == 0x1680 ||
                       (c >= 0x200B && c <= 0x200F) || c == 0x2028 || c == 0x2029 ||
                       c == 0x2581 || c == 0xFEFF || c == 0xFFFD;
    return space ? U' ' : c;
  }
};

// SentencePiece's compiled normalization rules (precompiled_charsmap): a darts-clone
// double-array trie over UTF-8 keys whose values index NUL-terminated replacements.
// Applied per extended grapheme cluster as tokenizers applies it: a cluster of fewer
// than 6 bytes is looked up whole, else (or when that finds nothing) each character;
// a lookup takes the shortest key that is a prefix of what is looked up.
class PrecompiledNormalizer : public Normalizer {
 public:
  static absl::StatusOr<std::unique_ptr<PrecompiledNormalizer>> Parse(
      absl::string_view blob, absl::string_view where) {
    if (blob.size() < 4) {
      return Invalid(where, "precompiled_charsmap is shorter than 4 bytes");
    }
    uint32_t trie_bytes;
    std::memcpy(&trie_bytes, blob.data(), 4);
    if (trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4) {
      return Invalid(where, absl::StrCat("precompiled_charsmap's trie of ", trie_bytes,
                                         " bytes does not fit its ", blob.size(),
                                         " bytes in 4-byte units"));
    }
    if (trie_bytes == 0) return Invalid(where, "precompiled_charsmap's trie is empty");
    auto normalizer = std::unique_ptr<PrecompiledNormalizer>(new PrecompiledNormalizer());
    normalizer->units_.resize(trie_bytes / 4);
    std::memcpy(normalizer->units_.data(), blob.data() + 4, trie_bytes);
    normalizer->pool_ = std::string(blob.substr(4 + trie_bytes));
    if (FirstInvalidUtf8(normalizer->pool_) >= 0) {
      return Invalid(where, "precompiled_charsmap's replacements are not valid UTF-8");
    }
    return normalizer;
  }

  void Normalize(std::string* text) const override {
    if (text->empty()) return;
    std::string out;
    out.reserve(text->size());
    Walk(*text, [&](absl::string_view /*part*/, absl::string_view chosen,
                    bool /*found*/) { out.append(chosen.data(), chosen.size()); });
    text->swap(out);
  }
  // tokenizers' changes for a replacement: its characters replace the old part's one
  // by one, extra ones are inserted, and a shorter one's removed characters go to the
  // last change made so far (the previous part's, when the replacement is empty).
  void NormalizeAligned(std::string* text, Alignments* align) const override {
    if (text->empty()) return;
    Changes changes;
    bool modified = false;
    Walk(*text, [&](absl::string_view part, absl::string_view chosen, bool found) {
      const std::u32string replacement = ToUtf32(chosen);
      for (const char32_t c : replacement) changes.emplace_back(c, 0);
      if (!found) return;
      modified = true;
      const auto diff = static_cast<int64_t>(replacement.size()) -
                        static_cast<int64_t>(ToUtf32(part).size());
      if (diff > 0) {
        for (int64_t k = 0; k < diff; ++k) changes[changes.size() - 1 - k].second = 1;
      } else if (diff < 0 && !changes.empty()) {
        changes.back().second += diff;
      }
    });
    if (modified) Transform(changes, 0, text, align);
  }

 private:
  PrecompiledNormalizer() = default;

  // Calls emit(part, chosen, found) for each part of `text` in order: a grapheme
  // cluster or a character, with its replacement (found) or itself.
  template <typename Emit>
  void Walk(const std::string& text, Emit emit) const {
    UErrorCode error = U_ZERO_ERROR;
    UText* utext =
        utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &error);
    // One break iterator per thread, closed with the thread.
    struct Breaks {
      UBreakIterator* iterator;
      ~Breaks() { ubrk_close(iterator); }
    };
    thread_local const Breaks owned{ubrk_open(UBRK_CHARACTER, "", nullptr, 0, &error)};
    UBreakIterator* const breaks = owned.iterator;
    if (U_FAILURE(error) || breaks == nullptr) {
      utext_close(utext);
      return;  // ICU's data is built in: this does not happen
    }
    ubrk_setUText(breaks, utext, &error);
    const absl::string_view all = text;
    int32_t start = ubrk_first(breaks);
    for (int32_t end = ubrk_next(breaks); end != UBRK_DONE;
         start = end, end = ubrk_next(breaks)) {
      const absl::string_view cluster =
          all.substr(static_cast<size_t>(start), static_cast<size_t>(end - start));
      if (cluster.size() < 6) {
        if (const auto replacement = Replacement(cluster)) {
          emit(cluster, *replacement, true);
          continue;
        }
      }
      for (size_t i = 0; i < cluster.size();) {
        const size_t at = i;
        DecodeUtf8(cluster, &i);
        const absl::string_view one = cluster.substr(at, i - at);
        const auto replacement = Replacement(one);
        emit(one, replacement ? *replacement : one, replacement.has_value());
      }
    }
    utext_close(utext);
  }

  // The replacement of the shortest key that is a prefix of `chunk`, if any.
  std::optional<absl::string_view> Replacement(absl::string_view chunk) const {
    const auto offset = [](uint32_t unit) -> size_t {
      return static_cast<size_t>((unit >> 10) << ((unit & (1u << 9)) >> 6));
    };
    size_t node = offset(units_[0]);
    for (const char byte : chunk) {
      const auto c = static_cast<unsigned char>(byte);
      if (c == 0) return std::nullopt;
      node ^= c;
      if (node >= units_.size()) return std::nullopt;
      const uint32_t unit = units_[node];
      if ((unit & ((1u << 31) | 0xFF)) != c) return std::nullopt;
      node ^= offset(unit);
      if ((unit >> 8) & 1) {
        if (node >= units_.size()) return std::nullopt;
        const size_t at = units_[node] & ((1u << 31) - 1);
        if (at >= pool_.size()) return std::nullopt;
        const size_t stop = pool_.find('\0', at);
        absl::string_view replacement = absl::string_view(pool_).substr(
            at, stop == std::string::npos ? std::string::npos : stop - at);
        // A replacement cut inside a character is not used (the pool is checked
        // whole, not per entry).
        if (FirstInvalidUtf8(replacement) >= 0) return std::nullopt;
        return replacement;
      }
    }
    return std::nullopt;
  }

  std::vector<uint32_t> units_;
  std::string pool_;
};

absl::StatusOr<std::unique_ptr<Normalizer>> ReadNormalizer(const Json& json,
                                                           absl::string_view where,
                                                           int depth = 0) {
  if (depth > 8) return Invalid(where, "normalizers nest deeper than 8");
  const std::string type = TypeOf(json);
  if (type == "Sequence") {
    ATTN_ASSIGN_OR_RETURN(auto steps, ReadSteps<Normalizer>(json, "normalizers", where,
                                                            depth, ReadNormalizer));
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "NFC") return std::make_unique<FormNormalizer>(NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<FormNormalizer>(NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(NormalForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Nmt") return std::make_unique<NmtNormalizer>();
  if (type == "BertNormalizer") {
    BertNormalization how;
    ATTN_ASSIGN_OR_RETURN(how.clean_text, BoolField(json, "clean_text", true, where));
    ATTN_ASSIGN_OR_RETURN(how.handle_chinese_chars,
                          BoolField(json, "handle_chinese_chars", true, where));
    ATTN_ASSIGN_OR_RETURN(how.lowercase, BoolField(json, "lowercase", true, where));
    // Unset (null): strip accents when lowercasing, as BERT does.
    ATTN_ASSIGN_OR_RETURN(how.strip_accents,
                          BoolField(json, "strip_accents", how.lowercase, where));
    return std::make_unique<BertNormalizer>(how);
  }
  if (type == "Strip") {
    ATTN_ASSIGN_OR_RETURN(const bool left, BoolField(json, "strip_left", true, where));
    ATTN_ASSIGN_OR_RETURN(const bool right, BoolField(json, "strip_right", true, where));
    return std::make_unique<StripNormalizer>(left, right);
  }
  if (type == "Replace") {
    ATTN_ASSIGN_OR_RETURN(Pattern pattern, ReadPattern(json, where));
    ATTN_ASSIGN_OR_RETURN(std::string content, StringField(json, "content", where));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern), std::move(content));
  }
  if (type == "Prepend") {
    ATTN_ASSIGN_OR_RETURN(std::string prefix, StringField(json, "prepend", where));
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Precompiled") {
    if (!json.contains("precompiled_charsmap") ||
        json["precompiled_charsmap"].is_null()) {
      // An empty charsmap (a SentencePiece model without normalization rules).
      return std::make_unique<SequenceNormalizer>(
          std::vector<std::unique_ptr<Normalizer>>());
    }
    ATTN_ASSIGN_OR_RETURN(const std::string encoded,
                          StringField(json, "precompiled_charsmap", where));
    std::string blob;
    if (!absl::Base64Unescape(encoded, &blob)) {
      return Invalid(where, "precompiled_charsmap is not base64");
    }
    if (blob.empty()) {
      return std::make_unique<SequenceNormalizer>(
          std::vector<std::unique_ptr<Normalizer>>());
    }
    ATTN_ASSIGN_OR_RETURN(std::unique_ptr<PrecompiledNormalizer> normalizer,
                          PrecompiledNormalizer::Parse(blob, where));
    return normalizer;
  }
  return Invalid(where, absl::StrCat("normalizer type \"", type,
                                     "\" is not supported (BertNormalizer, NFC, NFD, "
                                     "NFKC, NFKD, Lowercase, StripAccents, Strip, "
                                     "Replace, Prepend, Nmt, Precompiled, Sequence)"));
}

// ----------------------------------------------------------------------------
// Pre-tokenizers: each turns a piece into pieces.

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void Split(const Piece& piece, std::vector<Piece>* out) const = 0;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    std::vector<Piece> current = {piece}, next;
    for (const auto& step : steps_) {
      next.clear();
      for (const Piece& each : current) step->Split(each, &next);
      current.swap(next);
    }
    for (Piece& each : current) out->push_back(std::move(each));
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<ByteLevelPreTokenizer>> Make(
      bool add_prefix_space, bool use_regex, absl::string_view where) {
    auto made = std::unique_ptr<ByteLevelPreTokenizer>(new ByteLevelPreTokenizer());
    made->add_prefix_space_ = add_prefix_space;
    if (use_regex) {
      ATTN_ASSIGN_OR_RETURN(
          made->regex_,
          Regex::Compile(
              R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
              where));
    }
    return made;
  }
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    Piece prefixed = piece;
    if (add_prefix_space_ && (prefixed.text.empty() || prefixed.text[0] != ' ')) {
      prefixed.text.insert(0, " ");
      // The space takes the first character's alignment (NormalizedString::prepend).
      if (!prefixed.align.empty()) {
        prefixed.align.insert(prefixed.align.begin(), prefixed.align.front());
      }
    }
    std::vector<Piece> split;
    if (regex_ != nullptr) {
      thread_local std::vector<std::pair<size_t, size_t>> matches;
      regex_->FindAll(prefixed.text, &matches);
      SplitPiece(prefixed, Spans(prefixed.text, matches, false), Behavior::kIsolated,
                 &split);
    } else if (!prefixed.text.empty()) {
      split.push_back(std::move(prefixed));
    }
    const auto& chars = ByteLevelChars();
    for (Piece& each : split) {
      std::string mapped;
      mapped.reserve(each.text.size() * 2);
      // Each byte's character keeps the byte's alignment (its character's).
      Alignments mapped_align;
      for (size_t i = 0; i < each.text.size(); ++i) {
        const std::string& c = chars[static_cast<unsigned char>(each.text[i])];
        mapped += c;
        if (!each.align.empty()) {
          mapped_align.insert(mapped_align.end(), c.size(), each.align[i]);
        }
      }
      each.text.swap(mapped);
      each.align.swap(mapped_align);
      out->push_back(std::move(each));
    }
  }

 private:
  ByteLevelPreTokenizer() = default;
  bool add_prefix_space_ = false;
  std::unique_ptr<Regex> regex_;
};

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  MetaspacePreTokenizer(char32_t replacement, Prepend prepend, bool split)
      : replacement_(replacement), prepend_(prepend), split_(split) {
    AppendUtf8(replacement, &replacement_text_);
  }
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    Piece replaced{std::string(), piece.at_origin, {}};
    replaced.text.reserve(piece.text.size() + 3);
    const bool aligned = !piece.align.empty();
    // A replacement takes its space's alignment; a prepended one the first character's.
    for (size_t i = 0; i < piece.text.size(); ++i) {
      const char c = piece.text[i];
      if (c == ' ') {
        replaced.text += replacement_text_;
        if (aligned) {
          replaced.align.insert(replaced.align.end(), replacement_text_.size(),
                                piece.align[i]);
        }
      } else {
        replaced.text.push_back(c);
        if (aligned) replaced.align.push_back(piece.align[i]);
      }
    }
    const bool starts =
        absl::string_view(replaced.text).substr(0, replacement_text_.size()) ==
        replacement_text_;
    if (!starts && (prepend_ == Prepend::kAlways ||
                    (prepend_ == Prepend::kFirst && piece.at_origin))) {
      replaced.text.insert(0, replacement_text_);
      if (aligned) {
        replaced.align.insert(replaced.align.begin(), replacement_text_.size(),
                              replaced.align.front());
      }
    }
    if (!split_) {
      if (!replaced.text.empty()) out->push_back(std::move(replaced));
      return;
    }
    const char32_t replacement = replacement_;
    SplitPiece(
        replaced,
        CharSpans(replaced.text, [replacement](char32_t c) { return c == replacement; }),
        Behavior::kMergedWithNext, out);
  }

 private:
  char32_t replacement_;
  std::string replacement_text_;
  Prepend prepend_;
  bool split_;
};

// Splits on each character `is_match` holds for, under a behavior.
template <typename Predicate>
class CharPreTokenizer : public PreTokenizer {
 public:
  CharPreTokenizer(Predicate is_match, Behavior behavior)
      : is_match_(is_match), behavior_(behavior) {}
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    SplitPiece(piece, CharSpans(piece.text, is_match_), behavior_, out);
  }

 private:
  Predicate is_match_;
  Behavior behavior_;
};

template <typename Predicate>
std::unique_ptr<PreTokenizer> SplitOnChars(Predicate is_match, Behavior behavior) {
  return std::make_unique<CharPreTokenizer<Predicate>>(is_match, behavior);
}

// Digits that are not alone: runs of them kept together.
class DigitsPreTokenizer : public PreTokenizer {
 public:
  explicit DigitsPreTokenizer(bool individual) : individual_(individual) {}
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    SplitPiece(piece, CharSpans(piece.text, IsNumeric),
               individual_ ? Behavior::kIsolated : Behavior::kContiguous, out);
  }

 private:
  bool individual_;
};

// \w+|[^\w\s]+ kept, whitespace removed: runs of word characters and runs of other
// non-space characters.
class WhitespacePreTokenizer : public PreTokenizer {
 public:
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    const absl::string_view text = piece.text;
    size_t start = 0;
    int run = 0;  // 0: none, 1: word characters, 2: others
    size_t i = 0;
    const auto flush = [&](size_t end) {
      if (run != 0) {
        out->push_back({std::string(text.substr(start, end - start)),
                        piece.at_origin && start == 0,
                        SliceAlignments(piece.align, start, end)});
      }
    };
    while (i < text.size()) {
      const size_t at = i;
      const char32_t c = DecodeUtf8(text, &i);
      const int kind = IsWordChar(c) ? 1 : IsWhitespace(c) ? 0 : 2;
      if (kind != run) {
        flush(at);
        start = at;
        run = kind;
      }
    }
    flush(text.size());
  }
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void Split(const Piece& piece, std::vector<Piece>* out) const override {
    thread_local std::vector<std::pair<size_t, size_t>> matches;
    pattern_.FindAll(piece.text, &matches);
    SplitPiece(piece, Spans(piece.text, matches, invert_), behavior_, out);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

bool IsBertPunctuation(char32_t c) { return (HfCharFlags(c) & kPunct) != 0; }

absl::StatusOr<std::unique_ptr<PreTokenizer>> ReadPreTokenizer(const Json& json,
                                                               absl::string_view where,
                                                               int depth = 0) {
  if (depth > 8) return Invalid(where, "pre-tokenizers nest deeper than 8");
  const std::string type = TypeOf(json);
  if (type == "Sequence") {
    ATTN_ASSIGN_OR_RETURN(
        auto steps,
        ReadSteps<PreTokenizer>(json, "pretokenizers", where, depth, ReadPreTokenizer));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "ByteLevel") {
    ATTN_ASSIGN_OR_RETURN(const bool prefix,
                          BoolField(json, "add_prefix_space", true, where));
    ATTN_ASSIGN_OR_RETURN(const bool regex, BoolField(json, "use_regex", true, where));
    ATTN_ASSIGN_OR_RETURN(auto pre, ByteLevelPreTokenizer::Make(prefix, regex, where));
    return pre;
  }
  if (type == "Metaspace") {
    ATTN_ASSIGN_OR_RETURN(const std::string replacement,
                          StringField(json, "replacement", where));
    std::u32string chars = ToUtf32(replacement);
    if (chars.size() != 1) {
      return Invalid(
          where, absl::StrCat("replacement \"", replacement, "\" must be one character"));
    }
    ATTN_ASSIGN_OR_RETURN(const bool split, BoolField(json, "split", true, where));
    MetaspacePreTokenizer::Prepend prepend = MetaspacePreTokenizer::Prepend::kAlways;
    if (json.contains("prepend_scheme")) {
      const std::string scheme = json["prepend_scheme"].is_string()
                                     ? json["prepend_scheme"].get<std::string>()
                                     : "";
      if (scheme == "first") {
        prepend = MetaspacePreTokenizer::Prepend::kFirst;
      } else if (scheme == "never") {
        prepend = MetaspacePreTokenizer::Prepend::kNever;
      } else if (scheme != "always") {
        return Invalid(where, absl::StrCat("prepend_scheme \"", scheme,
                                           "\" is not always, first or never"));
      }
    } else {
      // Files older than prepend_scheme say add_prefix_space.
      ATTN_ASSIGN_OR_RETURN(const bool add,
                            BoolField(json, "add_prefix_space", true, where));
      if (!add) prepend = MetaspacePreTokenizer::Prepend::kNever;
    }
    return std::make_unique<MetaspacePreTokenizer>(chars[0], prepend, split);
  }
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "WhitespaceSplit") return SplitOnChars(IsWhitespace, Behavior::kRemoved);
  if (type == "Punctuation") {
    ATTN_ASSIGN_OR_RETURN(const Behavior behavior,
                          ReadBehavior(json, Behavior::kIsolated, where));
    return SplitOnChars(IsBertPunctuation, behavior);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(SplitOnChars(IsWhitespace, Behavior::kRemoved));
    steps.push_back(SplitOnChars(IsBertPunctuation, Behavior::kIsolated));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Digits") {
    ATTN_ASSIGN_OR_RETURN(const bool individual,
                          BoolField(json, "individual_digits", false, where));
    return std::make_unique<DigitsPreTokenizer>(individual);
  }
  if (type == "CharDelimiterSplit") {
    ATTN_ASSIGN_OR_RETURN(const std::string delimiter,
                          StringField(json, "delimiter", where));
    std::u32string chars = ToUtf32(delimiter);
    if (chars.size() != 1) {
      return Invalid(where,
                     absl::StrCat("delimiter \"", delimiter, "\" must be one character"));
    }
    const char32_t d = chars[0];
    return SplitOnChars([d](char32_t c) { return c == d; }, Behavior::kRemoved);
  }
  if (type == "Split") {
    ATTN_ASSIGN_OR_RETURN(Pattern pattern, ReadPattern(json, where));
    ATTN_ASSIGN_OR_RETURN(const Behavior behavior,
                          ReadBehavior(json, Behavior::kRemoved, where));
    ATTN_ASSIGN_OR_RETURN(const bool invert, BoolField(json, "invert", false, where));
    return std::make_unique<SplitPreTokenizer>(std::move(pattern), behavior, invert);
  }
  return Invalid(where, absl::StrCat("pre_tokenizer type \"", type,
                                     "\" is not supported (ByteLevel, Metaspace, "
                                     "Whitespace, WhitespaceSplit, Punctuation, Split, "
                                     "Digits, CharDelimiterSplit, BertPreTokenizer, "
                                     "Sequence)"));
}

// ----------------------------------------------------------------------------
// Models: a piece to ids.

// Byte ranges of a piece, one per id a model appends.
using TokenSpans = std::vector<std::pair<size_t, size_t>>;

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one pre-tokenized piece (not empty), and when `spans` is not
  // null the [start, end) bytes of the piece each id came from, as tokenizers' models
  // give them. InvalidArgument when a piece needs an unknown token the model does not
  // have.
  virtual absl::Status Tokenize(absl::string_view piece, std::vector<int64_t>* ids,
                                TokenSpans* spans) const = 0;
  // Every token with its id, for TokenOf and the id range.
  virtual void ListTokens(
      const std::function<void(absl::string_view, int64_t)>& each) const = 0;
  // The id of `token` in the vocabulary, if it is there; and how many entries the
  // vocabulary has (where tokenizers numbers added tokens it lacks from).
  virtual std::optional<int64_t> IdOf(absl::string_view token) const = 0;
  virtual int64_t Size() const = 0;
};

// IdOf and Size for a model whose vocabulary is a map of token to id.
template <typename Map>
std::optional<int64_t> FindId(const Map& vocab, absl::string_view token) {
  const auto it = vocab.find(token);
  return it == vocab.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

// A model whose vocabulary is a map of token to id (BPE, WordPiece, WordLevel).
class MapVocabModel : public Model {
 public:
  void ListTokens(
      const std::function<void(absl::string_view, int64_t)>& each) const override {
    for (const auto& [token, id] : vocab_) each(token, id);
  }
  std::optional<int64_t> IdOf(absl::string_view token) const override {
    return FindId(vocab_, token);
  }
  int64_t Size() const override { return static_cast<int64_t>(vocab_.size()); }

 protected:
  absl::flat_hash_map<std::string, int64_t> vocab_;
};

absl::Status NoUnknownToken(absl::string_view piece) {
  return absl::InvalidArgumentError(absl::StrCat(
      "has \"", piece.substr(0, 64),
      "\", which the model's vocabulary cannot spell, and the tokenizer has no unknown "
      "token"));
}

// Reads model.vocab as {token: id}.
absl::Status ReadVocabObject(const Json& model, absl::string_view where,
                             absl::flat_hash_map<std::string, int64_t>* vocab) {
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Invalid(where, "vocab must be an object of token: id");
  }
  vocab->reserve(model["vocab"].size());
  for (const auto& [token, id] : model["vocab"].items()) {
    ATTN_RETURN_IF_ERROR(CheckUtf8(token));
    ATTN_ASSIGN_OR_RETURN(const int64_t value,
                          IdValue(id, absl::StrCat(where, ".vocab[\"", token, "\"]")));
    (*vocab)[token] = value;
  }
  return absl::OkStatus();
}

// The id of model[key] (a token that must be in `vocab`), or nullopt when unset.
absl::StatusOr<std::optional<int64_t>> OptionalTokenId(
    const Json& model, const char* key,
    const absl::flat_hash_map<std::string, int64_t>& vocab, absl::string_view where,
    bool must_exist) {
  if (!model.contains(key) || model[key].is_null()) return std::optional<int64_t>();
  ATTN_ASSIGN_OR_RETURN(const std::string token, StringField(model, key, where));
  const auto it = vocab.find(token);
  if (it == vocab.end()) {
    if (!must_exist) return std::optional<int64_t>();
    return Invalid(where, absl::StrCat(key, " \"", token, "\" is not in the vocabulary"));
  }
  return std::optional<int64_t>(it->second);
}

class BpeModel : public MapVocabModel {
 public:
  static absl::StatusOr<std::unique_ptr<BpeModel>> Read(const Json& json,
                                                        absl::string_view where) {
    auto model = std::unique_ptr<BpeModel>(new BpeModel());
    ATTN_RETURN_IF_ERROR(ReadVocabObject(json, where, &model->vocab_));
    if (json.contains("dropout") && !json["dropout"].is_null()) {
      if (!json["dropout"].is_number() || json["dropout"].get<double>() != 0.0) {
        return Invalid(where, "dropout is set: a served tokenizer must be deterministic");
      }
    }
    // tokenizers looks the unknown token up when it needs it: a missing one fails
    // only the texts that need it.
    ATTN_ASSIGN_OR_RETURN(
        model->unk_id_, OptionalTokenId(json, "unk_token", model->vocab_, where, false));
    if (!model->unk_id_ && json.contains("unk_token") && json["unk_token"].is_string()) {
      model->missing_unk_ = json["unk_token"].get<std::string>();
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (json.contains(key) && !json[key].is_null()) {
        ATTN_ASSIGN_OR_RETURN(std::string value, StringField(json, key, where));
        (std::string(key) == "continuing_subword_prefix" ? model->prefix_
                                                         : model->suffix_) = value;
      }
    }
    ATTN_ASSIGN_OR_RETURN(model->fuse_unk_, BoolField(json, "fuse_unk", false, where));
    ATTN_ASSIGN_OR_RETURN(model->byte_fallback_,
                          BoolField(json, "byte_fallback", false, where));
    ATTN_ASSIGN_OR_RETURN(model->ignore_merges_,
                          BoolField(json, "ignore_merges", false, where));
    model->byte_ids_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      const auto it = model->vocab_.find(absl::StrFormat("<0x%02X>", b));
      if (it != model->vocab_.end()) model->byte_ids_[b] = it->second;
    }
    if (!json.contains("merges") || !json["merges"].is_array()) {
      return Invalid(where, "merges must be a list");
    }
    int32_t rank = 0;
    for (const Json& merge : json["merges"]) {
      std::string a, b;
      if (merge.is_string()) {
        // The older form: "a b".
        const std::string text = merge.get<std::string>();
        const size_t space = text.find(' ');
        if (space == std::string::npos ||
            text.find(' ', space + 1) != std::string::npos) {
          return Invalid(where, absl::StrCat("merges[", rank, "] \"", text,
                                             "\" is not two tokens split by a space"));
        }
        a = text.substr(0, space);
        b = text.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        a = merge[0].get<std::string>();
        b = merge[1].get<std::string>();
      } else {
        return Invalid(where, absl::StrCat("merges[", rank, "] is not a pair of tokens"));
      }
      const auto ia = model->vocab_.find(a);
      const auto ib = model->vocab_.find(b);
      if (ia == model->vocab_.end() || ib == model->vocab_.end() ||
          b.size() < model->prefix_.size()) {
        return Invalid(where, absl::StrCat("merges[", rank, "] (\"", a, "\", \"", b,
                                           "\") names a token not in the vocabulary"));
      }
      const std::string merged = a + b.substr(model->prefix_.size());
      const auto im = model->vocab_.find(merged);
      if (im == model->vocab_.end()) {
        return Invalid(where, absl::StrCat("merges[", rank, "] makes \"", merged,
                                           "\", which is not in the vocabulary"));
      }
      model->merges_[{ia->second, ib->second}] = {rank, im->second};
      ++rank;
    }
    return model;
  }

  absl::Status Tokenize(absl::string_view piece, std::vector<int64_t>* ids,
                        TokenSpans* spans) const override {
    if (ignore_merges_) {
      if (const auto it = vocab_.find(piece); it != vocab_.end()) {
        ids->push_back(it->second);
        if (spans != nullptr) spans->emplace_back(0, piece.size());
        return absl::OkStatus();
      }
    }
    struct Symbol {
      int64_t id;
      int32_t prev;
      int32_t next;
      size_t bytes;
    };
    thread_local std::vector<Symbol> symbols;
    symbols.clear();
    const auto add = [&](int64_t id, size_t bytes) {
      const auto n = static_cast<int32_t>(symbols.size());
      symbols.push_back({id, n - 1, n + 1, bytes});
    };
    // A pending unknown: its bytes (0: none), added when something known follows.
    size_t unk_bytes = 0;
    std::string key;
    for (size_t i = 0; i < piece.size();) {
      const size_t at = i;
      DecodeUtf8(piece, &i);
      const absl::string_view c = piece.substr(at, i - at);
      key.clear();
      if (at > 0) key += prefix_;
      key.append(c.data(), c.size());
      if (i == piece.size()) key += suffix_;
      if (const auto it = vocab_.find(key); it != vocab_.end()) {
        if (unk_bytes > 0) {
          add(*unk_id_, unk_bytes);
          unk_bytes = 0;
        }
        add(it->second, c.size());
        continue;
      }
      if (byte_fallback_ && std::all_of(key.begin(), key.end(), [&](char b) {
            return byte_ids_[static_cast<unsigned char>(b)] >= 0;
          })) {
        for (const char b : key) add(byte_ids_[static_cast<unsigned char>(b)], 1);
        continue;
      }
      if (!unk_id_) {
        // tokenizers drops what it cannot spell without an unknown token, and fails
        // when the one it names is not in the vocabulary.
        if (!missing_unk_.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "has \"", c, "\", which the vocabulary lacks, and its unknown token \"",
              missing_unk_.substr(0, 64), "\" is not in the vocabulary either"));
        }
        continue;
      }
      if (unk_bytes > 0 && !fuse_unk_) {
        add(*unk_id_, unk_bytes);
        unk_bytes = 0;
      }
      unk_bytes += c.size();
    }
    if (unk_bytes > 0) add(*unk_id_, unk_bytes);
    if (!symbols.empty()) symbols.back().next = -1;
    MergeAll(&symbols);
    // Offsets add up the symbols' bytes, as tokenizers' Word does (characters dropped
    // for want of an unknown token count for nothing).
    size_t offset = 0;
    for (const Symbol& symbol : symbols) {
      if (symbol.bytes == 0) continue;
      ids->push_back(symbol.id);
      if (spans != nullptr) spans->emplace_back(offset, offset + symbol.bytes);
      offset += symbol.bytes;
    }
    return absl::OkStatus();
  }

 private:
  BpeModel() = default;

  // Applies the merges lowest rank first (leftmost first among equal ranks).
  template <typename Symbols>
  void MergeAll(Symbols* symbols) const {
    struct Candidate {
      int32_t rank;
      int32_t pos;
      int64_t new_id;
      bool operator>(const Candidate& other) const {
        return rank != other.rank ? rank > other.rank : pos > other.pos;
      }
    };
    auto& s = *symbols;
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    const auto find = [&](int64_t a, int64_t b) -> const std::pair<int32_t, int64_t>* {
      const auto it = merges_.find(std::make_pair(a, b));
      return it == merges_.end() ? nullptr : &it->second;
    };
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      if (const auto* merge = find(s[i].id, s[i + 1].id)) {
        queue.push({merge->first, static_cast<int32_t>(i), merge->second});
      }
    }
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      auto& current = s[static_cast<size_t>(top.pos)];
      if (current.bytes == 0 || current.next == -1) continue;
      const auto next_pos = static_cast<size_t>(current.next);
      const auto right = s[next_pos];
      const auto* merge = find(current.id, right.id);
      if (merge == nullptr || merge->second != top.new_id) continue;
      current.id = top.new_id;
      current.bytes += right.bytes;
      current.next = right.next;
      s[next_pos].bytes = 0;
      if (right.next > -1 && static_cast<size_t>(right.next) < s.size()) {
        s[static_cast<size_t>(right.next)].prev = top.pos;
      }
      if (current.prev >= 0) {
        const auto& previous = s[static_cast<size_t>(current.prev)];
        if (const auto* m = find(previous.id, current.id)) {
          queue.push({m->first, current.prev, m->second});
        }
      }
      if (current.next > -1 && static_cast<size_t>(current.next) < s.size()) {
        if (const auto* m = find(current.id, s[static_cast<size_t>(current.next)].id)) {
          queue.push({m->first, top.pos, m->second});
        }
      }
    }
  }

  absl::flat_hash_map<std::pair<int64_t, int64_t>, std::pair<int32_t, int64_t>> merges_;
  std::optional<int64_t> unk_id_;
  std::string missing_unk_;  // an unk_token the vocabulary lacks
  std::string prefix_;
  std::string suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<int64_t, 256> byte_ids_{};
};

class UnigramModel : public Model {
 public:
  static absl::StatusOr<std::unique_ptr<UnigramModel>> Read(const Json& json,
                                                            absl::string_view where) {
    auto model = std::unique_ptr<UnigramModel>(new UnigramModel());
    if (!json.contains("vocab") || !json["vocab"].is_array() || json["vocab"].empty()) {
      return Invalid(where, "vocab must be a non-empty list of [piece, score]");
    }
    const Json& vocab = json["vocab"];
    if (vocab.size() >= (size_t{1} << 31)) return Invalid(where, "vocab is too large");
    model->pieces_.reserve(vocab.size());
    model->scores_.reserve(vocab.size());
    model->nodes_.push_back(-1);
    for (size_t id = 0; id < vocab.size(); ++id) {
      const Json& entry = vocab[id];
      if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() ||
          !entry[1].is_number()) {
        return Invalid(where, absl::StrCat("vocab[", id, "] is not [piece, score]"));
      }
      std::string piece = entry[0].get<std::string>();
      ATTN_RETURN_IF_ERROR(CheckUtf8(piece));
      const double score = entry[1].get<double>();
      model->min_score_ = std::min(model->min_score_, score);
      model->ids_[piece] = static_cast<int64_t>(id);
      if (!piece.empty()) model->Insert(piece);
      model->pieces_.push_back(std::move(piece));
      model->scores_.push_back(score);
    }
    if (json.contains("unk_id") && !json["unk_id"].is_null()) {
      ATTN_ASSIGN_OR_RETURN(const int64_t unk, IdValue(json["unk_id"], where));
      if (unk >= static_cast<int64_t>(vocab.size())) {
        return Invalid(where, absl::StrCat("unk_id ", unk, " is past the vocabulary's ",
                                           vocab.size(), " pieces"));
      }
      model->unk_id_ = unk;
    }
    ATTN_ASSIGN_OR_RETURN(model->byte_fallback_,
                          BoolField(json, "byte_fallback", false, where));
    model->byte_ids_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      const auto it = model->ids_.find(absl::StrFormat("<0x%02X>", b));
      if (it != model->ids_.end()) model->byte_ids_[b] = it->second;
    }
    return model;
  }

  absl::Status Tokenize(absl::string_view piece, std::vector<int64_t>* ids,
                        TokenSpans* spans) const override {
    // The best path by score ending at each byte (SentencePiece's optimized Viterbi);
    // a character no piece starts with is an unknown of score min - 10.
    struct Node {
      int64_t id = 0;
      double score = 0;
      int64_t start = -1;
    };
    constexpr double kUnknownPenalty = 10.0;
    thread_local std::vector<Node> best;
    best.assign(piece.size() + 1, Node());
    const double unknown_score = min_score_ - kUnknownPenalty;
    for (size_t start = 0; start < piece.size();) {
      const double here = best[start].score;
      size_t next = start;
      DecodeUtf8(piece, &next);
      const size_t char_bytes = next - start;
      bool single = false;
      int32_t node = 0;
      for (size_t end = start; end < piece.size(); ++end) {
        node = Child(node, static_cast<unsigned char>(piece[end]));
        if (node < 0) break;
        const int64_t id = nodes_[static_cast<size_t>(node)];
        if (id < 0) continue;
        Node& target = best[end + 1];
        const double score = scores_[static_cast<size_t>(id)] + here;
        if (target.start < 0 || score > target.score) {
          target = {id, score, static_cast<int64_t>(start)};
        }
        if (end + 1 - start == char_bytes) single = true;
      }
      if (!single) {
        Node& target = best[next];
        const double score = unknown_score + here;
        if (target.start < 0 || score > target.score) {
          // Only an unknown that would be used needs the unknown token (tokenizers
          // looks it up there).
          if (!unk_id_) return NoUnknownToken(piece.substr(start, char_bytes));
          target = {*unk_id_, score, static_cast<int64_t>(start)};
        }
      }
      start = next;
    }
    // Back from the end; runs of unknowns become one string.
    thread_local std::vector<std::pair<size_t, size_t>> runs;
    runs.clear();
    constexpr size_t kNone = std::numeric_limits<size_t>::max();
    size_t end = piece.size();
    size_t unknown_end = kNone;
    while (end > 0) {
      const Node& node = best[end];
      const auto start = static_cast<size_t>(node.start);
      if (unk_id_ && node.id == *unk_id_) {
        if (unknown_end == kNone) unknown_end = end;
      } else {
        if (unknown_end != kNone) {
          runs.emplace_back(end, unknown_end);
          unknown_end = kNone;
        }
        runs.emplace_back(start, end);
      }
      end = start;
    }
    if (unknown_end != kNone) runs.emplace_back(0, unknown_end);
    for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
      const absl::string_view text = piece.substr(it->first, it->second - it->first);
      // Every id of a span (each byte's, for a byte fallback) covers the whole span.
      const size_t before = ids->size();
      if (const auto found = ids_.find(text); found != ids_.end()) {
        ids->push_back(found->second);
      } else if (byte_fallback_ && std::all_of(text.begin(), text.end(), [&](char b) {
                   return byte_ids_[static_cast<unsigned char>(b)] >= 0;
                 })) {
        for (const char b : text) {
          ids->push_back(byte_ids_[static_cast<unsigned char>(b)]);
        }
      } else {
        if (!unk_id_) return NoUnknownToken(text);
        ids->push_back(*unk_id_);
      }
      if (spans != nullptr) spans->insert(spans->end(), ids->size() - before, *it);
    }
    return absl::OkStatus();
  }

  void ListTokens(
      const std::function<void(absl::string_view, int64_t)>& each) const override {
    for (size_t id = 0; id < pieces_.size(); ++id) {
      each(pieces_[id], static_cast<int64_t>(id));
    }
  }
  std::optional<int64_t> IdOf(absl::string_view token) const override {
    return FindId(ids_, token);
  }
  int64_t Size() const override { return static_cast<int64_t>(pieces_.size()); }

 private:
  UnigramModel() = default;

  // A byte trie over the pieces: node 0 is the root; nodes_[n] is the id of the piece
  // ending at n (the last of equal pieces, as tokenizers' map keeps it), or -1.
  int32_t Child(int32_t node, unsigned char byte) const {
    const auto it = children_.find((static_cast<uint64_t>(node) << 8) | byte);
    return it == children_.end() ? -1 : it->second;
  }
  void Insert(absl::string_view piece) {
    int32_t node = 0;
    for (const char byte : piece) {
      const uint64_t key =
          (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(byte);
      const auto it = children_.find(key);
      if (it != children_.end()) {
        node = it->second;
      } else {
        const auto made = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(-1);
        children_[key] = made;
        node = made;
      }
    }
    nodes_[static_cast<size_t>(node)] = ids_.at(piece);
  }

  std::vector<std::string> pieces_;
  std::vector<double> scores_;
  absl::flat_hash_map<std::string, int64_t> ids_;
  absl::flat_hash_map<uint64_t, int32_t> children_;
  std::vector<int64_t> nodes_;
  double min_score_ = std::numeric_limits<double>::infinity();
  std::optional<int64_t> unk_id_;
  bool byte_fallback_ = false;
  std::array<int64_t, 256> byte_ids_{};
};

class WordPieceModel : public MapVocabModel {
 public:
  static absl::StatusOr<std::unique_ptr<WordPieceModel>> Read(const Json& json,
                                                              absl::string_view where) {
    auto model = std::unique_ptr<WordPieceModel>(new WordPieceModel());
    ATTN_RETURN_IF_ERROR(ReadVocabObject(json, where, &model->vocab_));
    ATTN_ASSIGN_OR_RETURN(
        model->unk_id_, OptionalTokenId(json, "unk_token", model->vocab_, where, false));
    if (json.contains("continuing_subword_prefix")) {
      ATTN_ASSIGN_OR_RETURN(model->prefix_,
                            StringField(json, "continuing_subword_prefix", where));
    }
    if (json.contains("max_input_chars_per_word")) {
      if (!json["max_input_chars_per_word"].is_number_unsigned()) {
        return Invalid(where, "max_input_chars_per_word must be a positive integer");
      }
      model->max_chars_ = static_cast<int64_t>(std::min<uint64_t>(
          json["max_input_chars_per_word"].get<uint64_t>(), uint64_t{1} << 40));
    }
    return model;
  }

  absl::Status Tokenize(absl::string_view piece, std::vector<int64_t>* ids,
                        TokenSpans* spans) const override {
    int64_t chars = 0;
    for (size_t i = 0; i < piece.size(); DecodeUtf8(piece, &i)) ++chars;
    if (chars > max_chars_) return Unknown(piece, ids, spans);
    const size_t before = ids->size();
    const size_t spans_before = spans != nullptr ? spans->size() : 0;
    std::string key;
    for (size_t start = 0; start < piece.size();) {
      size_t end = piece.size();
      bool found = false;
      while (start < end) {
        key.clear();
        if (start > 0) key += prefix_;
        key.append(piece.data() + start, end - start);
        if (const auto it = vocab_.find(key); it != vocab_.end()) {
          ids->push_back(it->second);
          if (spans != nullptr) spans->emplace_back(start, end);
          found = true;
          break;
        }
        // Back one character.
        do {
          --end;
        } while (end > start && (static_cast<unsigned char>(piece[end]) & 0xC0) == 0x80);
      }
      if (!found) {
        ids->resize(before);
        if (spans != nullptr) spans->resize(spans_before);
        return Unknown(piece, ids, spans);
      }
      start = end;
    }
    return absl::OkStatus();
  }

 private:
  WordPieceModel() = default;
  absl::Status Unknown(absl::string_view piece, std::vector<int64_t>* ids,
                       TokenSpans* spans) const {
    if (!unk_id_) return NoUnknownToken(piece);
    ids->push_back(*unk_id_);
    if (spans != nullptr) spans->emplace_back(0, piece.size());
    return absl::OkStatus();
  }

  std::optional<int64_t> unk_id_;
  std::string prefix_ = "##";
  int64_t max_chars_ = 100;
};

class WordLevelModel : public MapVocabModel {
 public:
  static absl::StatusOr<std::unique_ptr<WordLevelModel>> Read(const Json& json,
                                                              absl::string_view where) {
    auto model = std::unique_ptr<WordLevelModel>(new WordLevelModel());
    ATTN_RETURN_IF_ERROR(ReadVocabObject(json, where, &model->vocab_));
    ATTN_ASSIGN_OR_RETURN(
        model->unk_id_, OptionalTokenId(json, "unk_token", model->vocab_, where, false));
    return model;
  }
  absl::Status Tokenize(absl::string_view piece, std::vector<int64_t>* ids,
                        TokenSpans* spans) const override {
    if (spans != nullptr) spans->emplace_back(0, piece.size());
    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
    if (!unk_id_) return NoUnknownToken(piece);
    ids->push_back(*unk_id_);
    return absl::OkStatus();
  }

 private:
  WordLevelModel() = default;
  std::optional<int64_t> unk_id_;
};

absl::StatusOr<std::unique_ptr<Model>> ReadModel(const Json& json) {
  constexpr absl::string_view kWhere = "model";
  const std::string type = TypeOf(json);
  // Files may leave the type out; tokenizers then tells the models by their fields.
  const bool untyped = type == "(none)" && json.is_object();
  if (type == "BPE" || (untyped && json.contains("merges"))) {
    ATTN_ASSIGN_OR_RETURN(auto model, BpeModel::Read(json, kWhere));
    return model;
  }
  if (type == "Unigram" ||
      (untyped && json.contains("vocab") && json["vocab"].is_array())) {
    ATTN_ASSIGN_OR_RETURN(auto model, UnigramModel::Read(json, kWhere));
    return model;
  }
  if (type == "WordPiece" || (untyped && json.contains("continuing_subword_prefix"))) {
    ATTN_ASSIGN_OR_RETURN(auto model, WordPieceModel::Read(json, kWhere));
    return model;
  }
  if (type == "WordLevel") {
    ATTN_ASSIGN_OR_RETURN(auto model, WordLevelModel::Read(json, kWhere));
    return model;
  }
  return Invalid(kWhere, absl::StrCat("type \"", type,
                                      "\" is not supported (BPE, Unigram, WordPiece, "
                                      "WordLevel)"));
}

// ----------------------------------------------------------------------------
// Added tokens.

struct AddedToken {
  std::string content;
  // What is matched: the content, normalized for a token with `normalized`.
  std::string pattern;
  int64_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

struct Segment {
  std::string text;
  int64_t id = -1;  // an added token's id, or -1 for text still to tokenize
  bool at_origin = false;
  bool special = false;  // an added token marked special
  // One entry per byte of `text` when offsets are tracked, else empty.
  Alignments align;
};

// Leftmost-longest matches of `tokens` (longest first) in `text`, as tokenizers'
// AddedVocabulary::find_matches keeps them: a single_word token only between non-word
// characters, lstrip/rstrip taking the spaces beside it. Appends the segments of
// `text`.
// Added tokens matched in one kind of text (raw or normalized), longest first, and the
// bytes any of them starts with (the search skips every other position).
struct AddedTokenSet {
  std::vector<const AddedToken*> tokens;
  std::array<bool, 256> first_bytes{};
  void Add(const AddedToken* token) {
    tokens.push_back(token);
    first_bytes[static_cast<unsigned char>(token->pattern[0])] = true;
  }
};

void SplitOnAddedTokens(const Segment& text, const AddedTokenSet& set,
                        std::vector<Segment>* out) {
  const absl::string_view sentence = text.text;
  const std::vector<const AddedToken*>& tokens = set.tokens;
  if (tokens.empty() || sentence.empty()) {
    if (!sentence.empty()) out->push_back(text);
    return;
  }
  const auto last_char = [&](size_t end) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(sentence[start]) & 0xC0) == 0x80)
      --start;
    size_t i = start;
    return DecodeUtf8(sentence, &i);
  };
  const auto emit = [&](size_t start, size_t end, const AddedToken* token) {
    if (start >= end) return;
    out->push_back({std::string(sentence.substr(start, end - start)),
                    token != nullptr ? token->id : -1, text.at_origin && start == 0,
                    token != nullptr && token->special,
                    SliceAlignments(text.align, start, end)});
  };
  size_t offset = 0;  // where the text not yet emitted starts
  size_t at = 0;      // where the search goes on
  while (at < sentence.size()) {
    const AddedToken* found = nullptr;
    size_t start = at;
    for (; start < sentence.size() && found == nullptr; ++start) {
      if (!set.first_bytes[static_cast<unsigned char>(sentence[start])]) continue;
      for (const AddedToken* token : tokens) {
        if (sentence.substr(start, token->pattern.size()) == token->pattern) {
          found = token;
          break;
        }
      }
      if (found != nullptr) break;
    }
    if (found == nullptr) break;
    size_t stop = start + found->pattern.size();
    at = stop;
    if (found->single_word) {
      const bool space_before = start == 0 || !IsWordChar(last_char(start));
      size_t next = stop;
      const bool space_after =
          stop == sentence.size() || !IsWordChar(DecodeUtf8(sentence, &next));
      if (!space_before || !space_after) continue;
    }
    if (found->lstrip) {
      size_t left = start;
      while (left > 0 && IsWhitespace(last_char(left))) {
        size_t back = left - 1;
        while (back > 0 && (static_cast<unsigned char>(sentence[back]) & 0xC0) == 0x80) {
          --back;
        }
        left = back;
      }
      start = std::max(left, offset);
    }
    if (found->rstrip) {
      // The search goes on from the match's own end, as tokenizers' does.
      while (stop < sentence.size()) {
        size_t next = stop;
        if (!IsWhitespace(DecodeUtf8(sentence, &next))) break;
        stop = next;
      }
    }
    emit(offset, start, nullptr);
    // A match that its stripping left empty is dropped, as tokenizers drops every
    // empty split (a crossed one, where tokenizers panics, likewise).
    emit(start, stop, found);
    offset = std::max(offset, stop);
  }
  emit(offset, sentence.size(), nullptr);
}

// ----------------------------------------------------------------------------
// The template: the single and pair layouts of special tokens and sequences.

struct TemplateItem {
  int sequence = -1;  // 0 for A, 1 for B; -1 for special tokens
  std::vector<int64_t> ids;
  int64_t type_id = 0;
};

struct Template {
  std::vector<TemplateItem> single;
  std::vector<TemplateItem> pair;
  int64_t Added(bool for_pair) const {
    int64_t added = 0;
    for (const TemplateItem& item : for_pair ? pair : single) {
      added += static_cast<int64_t>(item.ids.size());
    }
    return added;
  }
};

// [special, id] as RobertaProcessing and BertProcessing write cls and sep.
absl::StatusOr<int64_t> ProcessingToken(const Json& json, const char* key,
                                        absl::string_view where) {
  if (!json.contains(key) || !json[key].is_array() || json[key].size() != 2 ||
      !json[key][0].is_string()) {
    return Invalid(where, absl::StrCat(key, " must be [token, id]"));
  }
  return IdValue(json[key][1], absl::StrCat(where, ".", key));
}

absl::StatusOr<std::vector<TemplateItem>> ReadTemplateItems(const Json& items,
                                                            const Json& specials,
                                                            absl::string_view where) {
  if (!items.is_array()) return Invalid(where, "must be a list");
  std::vector<TemplateItem> out;
  for (const Json& item : items) {
    TemplateItem entry;
    if (item.is_object() && item.contains("Sequence") && item["Sequence"].is_object()) {
      const Json& sequence = item["Sequence"];
      const std::string id = sequence.contains("id") && sequence["id"].is_string()
                                 ? sequence["id"].get<std::string>()
                                 : "";
      if (id != "A" && id != "B") return Invalid(where, "a Sequence's id must be A or B");
      entry.sequence = id == "A" ? 0 : 1;
      if (sequence.contains("type_id")) {
        ATTN_ASSIGN_OR_RETURN(entry.type_id, IdValue(sequence["type_id"], where));
      }
    } else if (item.is_object() && item.contains("SpecialToken") &&
               item["SpecialToken"].is_object()) {
      const Json& special = item["SpecialToken"];
      ATTN_ASSIGN_OR_RETURN(const std::string name, StringField(special, "id", where));
      if (special.contains("type_id")) {
        ATTN_ASSIGN_OR_RETURN(entry.type_id, IdValue(special["type_id"], where));
      }
      if (!specials.is_object() || !specials.contains(name) ||
          !specials[name].is_object() || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array()) {
        return Invalid(where, absl::StrCat("special token \"", name,
                                           "\" is not in special_tokens with its ids"));
      }
      for (const Json& id : specials[name]["ids"]) {
        ATTN_ASSIGN_OR_RETURN(const int64_t value, IdValue(id, where));
        entry.ids.push_back(value);
      }
    } else {
      return Invalid(where, "each item must be a Sequence or a SpecialToken");
    }
    out.push_back(std::move(entry));
  }
  return out;
}

// What ByteLevel's trim_offsets does to offsets (RobertaProcessing's and the ByteLevel
// post-processor's): each token's leading and trailing spaces ("Ġ" or whitespace) are
// left out of its offsets, except the one space add_prefix_space put before the first.
struct OffsetTrim {
  bool add_prefix_space = true;
};

// Reads trim_offsets and add_prefix_space (both true when unset); appends a trim to
// `trims` when trim_offsets is set.
absl::Status ReadOffsetTrim(const Json& json, absl::string_view where,
                            std::vector<OffsetTrim>* trims) {
  ATTN_ASSIGN_OR_RETURN(const bool trim, BoolField(json, "trim_offsets", true, where));
  OffsetTrim each;
  ATTN_ASSIGN_OR_RETURN(each.add_prefix_space,
                        BoolField(json, "add_prefix_space", true, where));
  if (trim) trims->push_back(each);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Template>> ReadPostProcessor(const Json& json,
                                                          absl::string_view where,
                                                          std::vector<OffsetTrim>* trims,
                                                          int depth = 0) {
  if (depth > 4) return Invalid(where, "post-processors nest deeper than 4");
  const std::string type = TypeOf(json);
  if (type == "null") return std::optional<Template>();
  if (type == "ByteLevel") {
    ATTN_RETURN_IF_ERROR(ReadOffsetTrim(json, where, trims));
    return std::optional<Template>();
  }
  if (type == "Sequence") {
    if (!json.contains("processors") || !json["processors"].is_array()) {
      return Invalid(where, "Sequence needs a processors list");
    }
    std::optional<Template> chosen;
    int i = 0;
    for (const Json& step : json["processors"]) {
      ATTN_ASSIGN_OR_RETURN(
          std::optional<Template> each,
          ReadPostProcessor(step, absl::StrCat(where, ".processors[", i++, "]"), trims,
                            depth + 1));
      if (each && chosen) {
        return Invalid(where, "holds two processors that add tokens; one is supported");
      }
      if (each) chosen = std::move(each);
    }
    return chosen;
  }
  Template out;
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    ATTN_ASSIGN_OR_RETURN(const int64_t cls, ProcessingToken(json, "cls", where));
    ATTN_ASSIGN_OR_RETURN(const int64_t sep, ProcessingToken(json, "sep", where));
    const bool roberta = type == "RobertaProcessing";
    if (roberta) ATTN_RETURN_IF_ERROR(ReadOffsetTrim(json, where, trims));
    out.single = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep}, 0}};
    if (roberta) {
      out.pair = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep}, 0},
                  {-1, {sep}, 0}, {1, {}, 0}, {-1, {sep}, 0}};
    } else {
      out.pair = {{-1, {cls}, 0}, {0, {}, 0}, {-1, {sep}, 0}, {1, {}, 1}, {-1, {sep}, 1}};
    }
    return std::optional<Template>(std::move(out));
  }
  if (type == "TemplateProcessing") {
    const Json specials =
        json.contains("special_tokens") ? json["special_tokens"] : Json();
    ATTN_ASSIGN_OR_RETURN(
        out.single, ReadTemplateItems(json.contains("single") ? json["single"] : Json(),
                                      specials, absl::StrCat(where, ".single")));
    ATTN_ASSIGN_OR_RETURN(out.pair,
                          ReadTemplateItems(json.contains("pair") ? json["pair"] : Json(),
                                            specials, absl::StrCat(where, ".pair")));
    const auto count = [](const std::vector<TemplateItem>& items, int sequence) {
      return std::count_if(items.begin(), items.end(), [&](const TemplateItem& item) {
        return item.sequence == sequence;
      });
    };
    if (count(out.single, 0) != 1 || count(out.single, 1) != 0) {
      return Invalid(where, "single must hold $A once and no $B");
    }
    if (count(out.pair, 0) != 1 || count(out.pair, 1) != 1) {
      return Invalid(where, "pair must hold $A and $B once each");
    }
    return std::optional<Template>(std::move(out));
  }
  return Invalid(where, absl::StrCat("type \"", type,
                                     "\" is not supported (TemplateProcessing, "
                                     "RobertaProcessing, BertProcessing, ByteLevel, "
                                     "Sequence)"));
}

}  // namespace

struct PipelineTokenizer::Parts {
  std::unique_ptr<Normalizer> normalizer;       // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<Model> model;
  Template layout;
  std::vector<AddedToken> added;
  // The added tokens matched in the raw text and in the normalized text, longest first.
  AddedTokenSet raw_tokens;
  AddedTokenSet normalized_tokens;
  // The post-processors' offset trims, in order.
  std::vector<OffsetTrim> trims;
  // The contents of the added tokens marked special (Decode's skip_special_tokens
  // compares the token, as tokenizers does).
  absl::flat_hash_set<std::string> special_contents;
  // What Decode reads for the added tokens that the normalizer changes: their
  // normalized content (tokenizers' normalized_cache), for the decoder to invert.
  absl::flat_hash_map<int64_t, std::string> decoded_as;
  std::unique_ptr<TokenDecoder> decoder;
  absl::flat_hash_map<int64_t, std::string> token_of;
  int64_t max_id = 0;
  bool truncate_left = false;
};

PipelineTokenizer::PipelineTokenizer(std::unique_ptr<const Parts> parts)
    : parts_(std::move(parts)) {}
PipelineTokenizer::~PipelineTokenizer() = default;

absl::StatusOr<std::unique_ptr<PipelineTokenizer>> PipelineTokenizer::FromTokenizerJson(
    absl::string_view text, const Options& options) {
  const Json json = Json::parse(text.begin(), text.end(), nullptr,
                                /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("tokenizer.json: not a JSON object");
  }
  auto parts = std::make_unique<Parts>();
  parts->truncate_left = options.truncate_left;
  const Json null;
  const auto field = [&](const char* key) -> const Json& {
    return json.contains(key) ? json[key] : null;
  };
  if (!field("normalizer").is_null()) {
    ATTN_ASSIGN_OR_RETURN(parts->normalizer,
                          ReadNormalizer(field("normalizer"), "normalizer"));
  }
  if (!field("pre_tokenizer").is_null()) {
    ATTN_ASSIGN_OR_RETURN(parts->pre_tokenizer,
                          ReadPreTokenizer(field("pre_tokenizer"), "pre_tokenizer"));
  }
  ATTN_ASSIGN_OR_RETURN(parts->model, ReadModel(field("model")));
  ATTN_ASSIGN_OR_RETURN(
      std::optional<Template> layout,
      ReadPostProcessor(field("post_processor"), "post_processor", &parts->trims));
  parts->decoder = TokenDecoder::FromJson(field("decoder").dump());
  if (layout) {
    parts->layout = *std::move(layout);
  } else {
    // tokenizers without a post-processor: the texts as they are, the second of a pair
    // with token type 1.
    parts->layout.single = {{0, {}, 0}};
    parts->layout.pair = {{0, {}, 0}, {1, {}, 1}};
  }

  const Json& added = field("added_tokens");
  if (!added.is_null() && !added.is_array()) {
    return absl::InvalidArgumentError("tokenizer.json added_tokens: must be a list");
  }
  if (added.is_array()) {
    parts->added.reserve(added.size());
    int i = 0;
    for (const Json& token : added) {
      const std::string where = absl::StrCat("added_tokens[", i++, "]");
      if (!token.is_object()) return Invalid(where, "must be an object");
      AddedToken entry;
      ATTN_ASSIGN_OR_RETURN(entry.content, StringField(token, "content", where));
      // The file's id is checked, not used: tokenizers numbers added tokens itself
      // (below).
      if (!token.contains("id")) return Invalid(where, "needs an id");
      ATTN_RETURN_IF_ERROR(IdValue(token["id"], where + ".id").status());
      ATTN_ASSIGN_OR_RETURN(entry.special, BoolField(token, "special", false, where));
      const bool special = entry.special;
      ATTN_ASSIGN_OR_RETURN(entry.single_word,
                            BoolField(token, "single_word", false, where));
      ATTN_ASSIGN_OR_RETURN(entry.lstrip, BoolField(token, "lstrip", false, where));
      ATTN_ASSIGN_OR_RETURN(entry.rstrip, BoolField(token, "rstrip", false, where));
      ATTN_ASSIGN_OR_RETURN(entry.normalized,
                            BoolField(token, "normalized", !special, where));
      entry.pattern = entry.content;
      if (entry.normalized && parts->normalizer != nullptr) {
        parts->normalizer->Normalize(&entry.pattern);
      }
      if (entry.content.empty()) continue;  // tokenizers ignores it
      parts->added.push_back(std::move(entry));
    }
  }
  // tokenizers' numbering: a content seen before keeps its id, one the vocabulary has
  // takes the vocabulary's, any other the next id from the vocabulary's size, in file
  // order.
  {
    int64_t next = parts->model->Size();
    absl::flat_hash_map<std::string, int64_t> assigned;
    for (AddedToken& token : parts->added) {
      if (const auto it = assigned.find(token.content); it != assigned.end()) {
        token.id = it->second;
      } else if (const auto id = parts->model->IdOf(token.content)) {
        token.id = *id;
      } else {
        token.id = next++;
      }
      assigned[token.content] = token.id;
    }
  }
  // Later entries with the same content win, as in tokenizers' map.
  absl::flat_hash_map<std::string, size_t> latest;
  for (size_t i = 0; i < parts->added.size(); ++i) latest[parts->added[i].content] = i;
  std::vector<const AddedToken*> matched;
  for (size_t i = 0; i < parts->added.size(); ++i) {
    const AddedToken& token = parts->added[i];
    // A pattern normalized to nothing never matches here (tokenizers' own behaviour
    // with one is undefined: it panics on multibyte text).
    if (latest[token.content] != i || token.pattern.empty()) continue;
    matched.push_back(&token);
  }
  std::stable_sort(matched.begin(), matched.end(),
                   [](const AddedToken* a, const AddedToken* b) {
                     return a->pattern.size() > b->pattern.size();
                   });
  for (const AddedToken* token : matched) {
    (token->normalized ? parts->normalized_tokens : parts->raw_tokens).Add(token);
  }

  parts->model->ListTokens([&](absl::string_view token, int64_t id) {
    parts->token_of.try_emplace(id, std::string(token));
    parts->max_id = std::max(parts->max_id, id);
  });
  for (const AddedToken& token : parts->added) {
    parts->token_of[token.id] = token.content;
    parts->max_id = std::max(parts->max_id, token.id);
    if (token.special) parts->special_contents.insert(token.content);
    if (token.normalized && token.pattern != token.content) {
      parts->decoded_as[token.id] = token.pattern;
    }
  }
  for (const auto* items : {&parts->layout.single, &parts->layout.pair}) {
    for (const TemplateItem& item : *items) {
      for (const int64_t id : item.ids) parts->max_id = std::max(parts->max_id, id);
    }
  }
  return std::unique_ptr<PipelineTokenizer>(new PipelineTokenizer(std::move(parts)));
}

namespace {

// The segments of `text` after the added tokens and the normalizer; with their
// alignments when `aligned`.
std::vector<Segment> ExtractAndNormalize(const PipelineTokenizer::Parts& parts,
                                         absl::string_view text, bool aligned = false) {
  std::vector<Segment> raw;
  Segment whole{std::string(text), -1, true, false, {}};
  if (aligned) whole.align = Identity(text, 0);
  SplitOnAddedTokens(whole, parts.raw_tokens, &raw);
  std::vector<Segment> out;
  for (Segment& segment : raw) {
    if (segment.id >= 0) {
      out.push_back(std::move(segment));
      continue;
    }
    if (parts.normalizer != nullptr) {
      if (aligned) {
        parts.normalizer->NormalizeAligned(&segment.text, &segment.align);
      } else {
        parts.normalizer->Normalize(&segment.text);
      }
    }
    SplitOnAddedTokens(segment, parts.normalized_tokens, &out);
  }
  return out;
}

}  // namespace

absl::Status PipelineTokenizer::AppendTextIds(absl::string_view text,
                                              std::vector<int64_t>* ids) const {
  ATTN_RETURN_IF_ERROR(CheckUtf8(text));
  thread_local std::vector<Piece> pieces;
  for (const Segment& segment : ExtractAndNormalize(*parts_, text)) {
    if (segment.id >= 0) {
      ids->push_back(segment.id);
      continue;
    }
    pieces.clear();
    if (parts_->pre_tokenizer != nullptr) {
      parts_->pre_tokenizer->Split({segment.text, segment.at_origin}, &pieces);
    } else {
      pieces.push_back({segment.text, segment.at_origin});
    }
    for (const Piece& piece : pieces) {
      ATTN_RETURN_IF_ERROR(parts_->model->Tokenize(piece.text, ids, nullptr));
    }
  }
  return absl::OkStatus();
}

namespace {

// Keeps `keep` of `ids` (the first ones, or the last ones when cutting on the left).
void Cut(std::vector<int64_t>* ids, int64_t keep, bool left) {
  if (static_cast<int64_t>(ids->size()) <= keep) return;
  if (left) {
    ids->erase(ids->begin(), ids->end() - keep);
  } else {
    ids->resize(static_cast<size_t>(keep));
  }
}

void Emit(const std::vector<TemplateItem>& layout,
          const std::vector<int64_t>* sequences[2], std::vector<int64_t>* ids,
          std::vector<int64_t>* types) {
  for (const TemplateItem& item : layout) {
    const std::vector<int64_t>& part =
        item.sequence >= 0 ? *sequences[item.sequence] : item.ids;
    ids->insert(ids->end(), part.begin(), part.end());
    if (types != nullptr) types->insert(types->end(), part.size(), item.type_id);
  }
}

}  // namespace

absl::StatusOr<Tokenizer::Encoding> PipelineTokenizer::Encode(
    absl::string_view text, int64_t max_tokens, std::vector<int64_t>* ids) const {
  thread_local std::vector<int64_t> a;
  a.clear();
  ATTN_RETURN_IF_ERROR(AppendTextIds(text, &a));
  const int64_t added = parts_->layout.Added(false);
  const auto n = static_cast<int64_t>(a.size());
  const int64_t budget = std::max<int64_t>(max_tokens - added, 0);
  Cut(&a, budget, parts_->truncate_left);
  const std::vector<int64_t>* sequences[2] = {&a, &a};
  Emit(parts_->layout.single, sequences, ids, nullptr);
  return Encoding{n + added, n > budget};
}

absl::StatusOr<Tokenizer::Encoding> PipelineTokenizer::EncodePair(
    absl::string_view first, absl::string_view second, int64_t max_tokens,
    std::vector<int64_t>* ids, std::vector<int64_t>* types) const {
  thread_local std::vector<int64_t> a, b;
  a.clear();
  b.clear();
  ATTN_RETURN_IF_ERROR(AppendTextIds(first, &a));
  ATTN_RETURN_IF_ERROR(AppendTextIds(second, &b));
  const int64_t added = parts_->layout.Added(true);
  const auto n1 = static_cast<int64_t>(a.size());
  const auto n2 = static_cast<int64_t>(b.size());
  int64_t keep1 = n1, keep2 = n2;
  PairKeep(n1, n2, std::max<int64_t>(max_tokens - added, 0), &keep1, &keep2);
  Cut(&a, keep1, parts_->truncate_left);
  Cut(&b, keep2, parts_->truncate_left);
  const std::vector<int64_t>* sequences[2] = {&a, &b};
  Emit(parts_->layout.pair, sequences, ids, types);
  return Encoding{n1 + n2 + added, keep1 < n1 || keep2 < n2};
}

// A token of one text before the template, with the text tokenizers keeps for it (the
// vocabulary's token; an added token's matched text), which the offset trims read.
struct PipelineTokenizer::TextToken {
  Tokenizer::Token token;
  std::string value;
};

namespace {

// tokenizers' ByteLevel process_offsets over the tokens of one text.
void TrimOffsets(const OffsetTrim& trim,
                 std::vector<PipelineTokenizer::TextToken>* tokens) {
  using TextToken = PipelineTokenizer::TextToken;
  const auto is_space = [](char32_t c) { return c == U'\u0120' || IsWhitespace(c); };
  for (size_t i = 0; i < tokens->size(); ++i) {
    TextToken& each = (*tokens)[i];
    const std::u32string chars = ToUtf32(each.value);
    int64_t leading = 0;
    while (leading < static_cast<int64_t>(chars.size()) && is_space(chars[leading])) {
      ++leading;
    }
    int64_t trailing = 0;
    while (trailing < static_cast<int64_t>(chars.size()) &&
           is_space(chars[chars.size() - 1 - trailing])) {
      ++trailing;
    }
    int64_t& start = each.token.start;
    int64_t& end = each.token.end;
    if (leading > 0) {
      const bool first = i == 0 || start == 0;
      if (first && trim.add_prefix_space && leading == 1) leading = 0;
      start = std::min(start + leading, end);
    }
    if (trailing > 0 && end >= trailing) end = std::max(end - trailing, start);
  }
}

}  // namespace

absl::Status PipelineTokenizer::AppendTextTokens(absl::string_view text,
                                                 std::vector<TextToken>* tokens) const {
  ATTN_RETURN_IF_ERROR(CheckUtf8(text));
  std::vector<Piece> pieces;
  std::vector<int64_t> ids;
  TokenSpans spans;
  for (Segment& segment : ExtractAndNormalize(*parts_, text, /*aligned=*/true)) {
    if (segment.id >= 0) {
      const auto [start, end] = OriginalRange(segment.align, 0, segment.text.size());
      tokens->push_back(
          {{segment.id, segment.special, start, end}, std::move(segment.text)});
      continue;
    }
    pieces.clear();
    if (parts_->pre_tokenizer != nullptr) {
      parts_->pre_tokenizer->Split({segment.text, segment.at_origin, segment.align},
                                   &pieces);
    } else {
      pieces.push_back({segment.text, segment.at_origin, segment.align});
    }
    for (const Piece& piece : pieces) {
      ids.clear();
      spans.clear();
      ATTN_RETURN_IF_ERROR(parts_->model->Tokenize(piece.text, &ids, &spans));
      for (size_t k = 0; k < ids.size(); ++k) {
        const auto [start, end] =
            OriginalRange(piece.align, spans[k].first, spans[k].second);
        tokens->push_back({{ids[k], false, start, end}, std::string(TokenOf(ids[k]))});
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tokenizer::Encoding> PipelineTokenizer::Tokenize(
    absl::string_view text, int64_t max_tokens, bool add_special_tokens,
    std::vector<Token>* tokens) const {
  tokens->clear();
  std::vector<TextToken> a;
  ATTN_RETURN_IF_ERROR(AppendTextTokens(text, &a));
  const int64_t added = add_special_tokens ? parts_->layout.Added(false) : 0;
  const auto n = static_cast<int64_t>(a.size());
  const int64_t budget = std::max<int64_t>(max_tokens - added, 0);
  if (n > budget) {
    if (parts_->truncate_left) {
      a.erase(a.begin(), a.end() - budget);
    } else {
      a.resize(static_cast<size_t>(budget));
    }
  }
  for (const OffsetTrim& trim : parts_->trims) TrimOffsets(trim, &a);
  const auto append_text = [&] {
    for (const TextToken& each : a) tokens->push_back(each.token);
  };
  if (!add_special_tokens) {
    append_text();
  } else {
    for (const TemplateItem& item : parts_->layout.single) {
      if (item.sequence >= 0) {
        append_text();
        continue;
      }
      for (const int64_t id : item.ids) tokens->push_back({id, true, -1, -1});
    }
  }
  return Encoding{n + added, n > budget};
}

absl::StatusOr<std::string> PipelineTokenizer::Decode(absl::Span<const int64_t> ids,
                                                      bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > parts_->max_id) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ids[", i, "]: id ", ids[i], " is not in [0, ", parts_->max_id, "]"));
    }
    const auto normalized = parts_->decoded_as.find(ids[i]);
    const auto it = parts_->token_of.find(ids[i]);
    if (it == parts_->token_of.end()) continue;
    const std::string& token =
        normalized != parts_->decoded_as.end() ? normalized->second : it->second;
    if (skip_special_tokens && parts_->special_contents.contains(token)) continue;
    tokens.push_back(token);
  }
  return parts_->decoder->Decode(std::move(tokens));
}

int64_t PipelineTokenizer::added_tokens(bool pair) const {
  return parts_->layout.Added(pair);
}

int64_t PipelineTokenizer::max_id() const { return parts_->max_id; }

absl::string_view PipelineTokenizer::TokenOf(int64_t id) const {
  const auto it = parts_->token_of.find(id);
  return it == parts_->token_of.end() ? absl::string_view() : it->second;
}

}  // namespace attnserve::core
