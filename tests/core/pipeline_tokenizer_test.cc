// PipelineTokenizer against Hugging Face tokenizers' own ids:
// - tests/data/tokenizers/<type>/: tokenizers trained offline by
//   tests/tools/make_pipeline_tokenizer_golden.py (byte-level BPE as RoBERTa's, Unigram
//   with Metaspace, XLM-R's SentencePiece conversion with its precompiled charsmap, a
//   BPE through many normalizers and pre-tokenizers, a byte-fallback BPE as Llama's, a
//   WordPiece behind NFKC), each with the ids of >= 3,000 real texts in many scripts
//   (the whole corpus of tests/data/tokenizer for every model type) and of an
//   adversarial set, whole, truncated on either side, and in pairs;
// - the seeded RoBERTa and XLM-R folders of tests/tools/make_roberta_golden.py, with the
//   ids sentence-transformers fed their models.
#include "core/pipeline_tokenizer.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/tokenizer.h"
#include "core/wordpiece_tokenizer.h"
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

}  // namespace
}  // namespace attnserve::core
