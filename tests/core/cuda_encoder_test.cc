// The CUDA encoder. Everywhere: what it refuses (before any CUDA call), the staging
// layout of a batch, and the clear error where there is no GPU. On a GPU (the device
// check, tests/gpu/device_check.sh): its answers against PyTorch's goldens, at the CPU
// encoder's tolerances in fp32 and bf16, and against the CPU encoder where the
// goldens have no case (head masks, pruned heads).
#include "core/cuda/cuda_encoder.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "core/cuda/cuda_attention.h"
#include "core/cuda/staging.h"
#include "core/encoder/encoder_backend.h"
#include "core/encoder/transformer_encoder.h"
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

// The device check runs this binary from another checkout: it names the data there.
const std::string kData = std::getenv("ATTNSERVE_TEST_DATA_DIR") != nullptr
                              ? std::getenv("ATTNSERVE_TEST_DATA_DIR")
                              : ATTNSERVE_TEST_DATA_DIR;

EncoderSpec TinySpec() { return testing::TinyEncoderSpec(); }

using Golden = testing::EncoderGolden;

Golden ReadGolden() {
  return testing::ReadEncoderGolden(kData + "/encoder_tiny.io.safetensors");
}

EncoderWeights TinyWeights(const EncoderSpec& spec) {
  auto file = SafetensorsFile::Read(kData + "/encoder_tiny.weights.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  auto weights = LoadBertWeights(*file, spec);
  EXPECT_TRUE(weights.ok()) << weights.status();
  return *std::move(weights);
}

std::unique_ptr<EncoderBackend> Make(const EncoderSpec& spec, const Device& device) {
  auto encoder = CreateEncoderBackend(spec, TinyWeights(spec), device, {});
  EXPECT_TRUE(encoder.ok()) << encoder.status();
  return encoder.ok() ? *std::move(encoder) : nullptr;
}

constexpr Device kGpu{DeviceKind::kCuda, 0};

TEST(CudaEncoderSupportsTest, TakesBertShapedEncodersAndNamesWhatItDoesNot) {
  EXPECT_TRUE(cuda::CudaEncoderSupports(TinySpec()).ok());
  EncoderSpec classifier = TinySpec();
  classifier.num_labels = 3;
  EXPECT_TRUE(cuda::CudaEncoderSupports(classifier).ok());
  const struct {
    const char* what;
    void (*change)(EncoderSpec&);
  } refused[] = {
      {"pre-LN",
       [](EncoderSpec& s) { s.norm_placement = EncoderSpec::NormPlacement::kPre; }},
      {"RMSNorm", [](EncoderSpec& s) { s.norm = EncoderSpec::Norm::kRms; }},
      {"rotary", [](EncoderSpec& s) { s.absolute_positions = false; }},
      {"rotary",
       [](EncoderSpec& s) {
         s.layer_attention.assign(2, {{1.0f, 0.5f}, false, 0});
       }},
      {"sliding-window",
       [](EncoderSpec& s) {
         s.layer_attention.assign(2, {{}, false, 8});
       }},
      {"relative position bias",
       [](EncoderSpec& s) { s.relative_attention_buckets = 32; }},
      {"gated", [](EncoderSpec& s) { s.gated_ffn = true; }},
      {"causal", [](EncoderSpec& s) { s.causal = true; }},
      {"grouped-query", [](EncoderSpec& s) { s.num_kv_heads = 2; }},
      {"qk_norm", [](EncoderSpec& s) { s.qk_norm = true; }},
      {"head_size", [](EncoderSpec& s) { s.head_size = 32; }},
      {"SPLADE", [](EncoderSpec& s) { s.sparse = EncoderSpec::Sparse::kMax; }},
      {"a head of 512 values", [](EncoderSpec& s) { s.d_model = 1024, s.num_heads = 2; }},
  };
  for (const auto& refusal : refused) {
    EncoderSpec spec = TinySpec();
    refusal.change(spec);
    const absl::Status status = cuda::CudaEncoderSupports(spec);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << refusal.what;
    EXPECT_THAT(status.message(), HasSubstr(refusal.what));
    EXPECT_THAT(status.message(), HasSubstr("the CPU encoder has it"));
  }
}

TEST(CudaEncoderCreateTest, RefusesBeforeTouchingTheDevice) {
  // Whether or not there is a GPU: the spec is refused first.
  EncoderSpec pre = TinySpec();
  pre.norm_placement = EncoderSpec::NormPlacement::kPre;
  auto file = SafetensorsFile::Read(kData + "/megatron_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  auto weights = LoadBertWeights(*file, pre);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto encoder = CreateEncoderBackend(pre, *std::move(weights), kGpu, {});
  EXPECT_EQ(encoder.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(encoder.status().message(), HasSubstr("pre-LN"));

  EncoderSpec int8 = TinySpec();
  int8.precision = Precision::kInt8;
  auto quantized = CreateEncoderBackend(int8, TinyWeights(int8), kGpu, {});
  EXPECT_EQ(quantized.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(quantized.status().message(), HasSubstr("int8 runs on the CPU only"));
}

TEST(CudaEncoderCreateTest, NamesTheMissingDevice) {
  const int count = cuda::CudaDeviceCount();
  const Device missing{DeviceKind::kCuda, count};
  auto encoder = CreateEncoderBackend(TinySpec(), TinyWeights(TinySpec()), missing, {});
  EXPECT_EQ(encoder.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(
      encoder.status().message(),
      HasSubstr(absl::StrCat("device cuda:", count, " is not available: CUDA found ",
                             count, " device(s)")));
}

TEST(EncoderStagingTest, PacksIdsTypesPositionsLengthsAndFactors) {
  const std::vector<int64_t> ids = {5, 6, 7, 8, 9, 10}, types = {0, 1, 1, 0, 0, 1};
  const std::vector<int64_t> lengths = {2, 3, 1};
  const std::vector<float> factors = {1.0f, 0.0f, 0.5f};
  EncoderBatch batch{ids, types, lengths};
  auto layout = cuda::PlanEncoderStaging(batch, 64, 3);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->tokens, 6);
  EXPECT_EQ(layout->sequences, 3);
  EXPECT_EQ(layout->max_length, 3);
  EXPECT_FALSE(layout->from_hidden);
  EXPECT_EQ(layout->hidden_bytes, 0u);
  for (const size_t offset :
       {layout->ids, layout->types, layout->positions, layout->cu, layout->factors}) {
    EXPECT_EQ(offset % cuda::StagingLayout::kAlignment, 0u);
  }
  std::vector<uint8_t> staging(layout->total_bytes);
  cuda::PackEncoderStaging(batch, *layout, factors, staging.data());
  const auto ints = [&](size_t offset, size_t count) {
    std::vector<int32_t> values(count);
    std::memcpy(values.data(), staging.data() + offset, count * sizeof(int32_t));
    return values;
  };
  EXPECT_THAT(ints(layout->ids, 6), ::testing::ElementsAre(5, 6, 7, 8, 9, 10));
  EXPECT_THAT(ints(layout->types, 6), ::testing::ElementsAre(0, 1, 1, 0, 0, 1));
  EXPECT_THAT(ints(layout->positions, 6), ::testing::ElementsAre(0, 1, 0, 1, 2, 0));
  EXPECT_THAT(ints(layout->cu, 4), ::testing::ElementsAre(0, 2, 5, 6));
  std::vector<float> staged(3);
  std::memcpy(staged.data(), staging.data() + layout->factors, 3 * sizeof(float));
  EXPECT_EQ(staged, factors);

  // No types: zeros. Hidden states instead of ids: no id bytes, the states staged.
  EncoderBatch untyped{ids, {}, lengths};
  cuda::PackEncoderStaging(untyped, *layout, factors, staging.data());
  EXPECT_THAT(ints(layout->types, 6), ::testing::Each(0));
  const std::vector<float> states(6 * 4, 0.25f);
  EncoderBatch from_hidden{{}, {}, lengths, states};
  auto hidden_layout = cuda::PlanEncoderStaging(from_hidden, 4, 0);
  ASSERT_TRUE(hidden_layout.ok());
  EXPECT_TRUE(hidden_layout->from_hidden);
  EXPECT_EQ(hidden_layout->hidden_bytes, states.size() * sizeof(float));
  EXPECT_EQ(hidden_layout->hidden % cuda::StagingLayout::kAlignment, 0u);
  std::vector<uint8_t> hidden_staging(hidden_layout->total_bytes);
  cuda::PackEncoderStaging(from_hidden, *hidden_layout, {}, hidden_staging.data());
  std::vector<float> back(states.size());
  std::memcpy(back.data(), hidden_staging.data() + hidden_layout->hidden,
              hidden_layout->hidden_bytes);
  EXPECT_EQ(back, states);
}

TEST(CheckEncoderForwardTest, HeadMaskFactorsOutsideZeroToOneAreRefusedByEveryDevice) {
  const std::vector<int64_t> ids = {1, 2, 3}, lengths = {3};
  for (const float bad : {-0.5f, 1.5f, std::nanf("")}) {
    std::vector<float> mask(8, 1.0f);
    mask[3] = bad;
    EncoderBatch batch{ids, {}, lengths};
    batch.head_mask = mask;
    const absl::Status status = CheckEncoderForward(TinySpec(), batch, {}, {}, {}, {});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("head_mask[3] must be in [0, 1]"));
  }
}

class CudaEncoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device here (the device check, tests/gpu/device_check.sh, "
                      "runs these on a GPU)";
    }
  }
};

// The CPU encoder's tolerances against PyTorch (transformer_encoder_test).
constexpr double kHiddenTolerance = 1e-5;
constexpr double kPooledTolerance = 1e-5;
constexpr double kBf16Tolerance = 1e-2;

TEST_F(CudaEncoderTest, MatchesPyTorchOnAPackedBatch) {
  const Golden golden = ReadGolden();
  auto encoder = Make(TinySpec(), kGpu);
  ASSERT_NE(encoder, nullptr);
  EXPECT_EQ(encoder->device_name(), "cuda:0");
  EXPECT_GT(encoder->device_memory_bytes(), 0);
  for (int repeat = 0; repeat < 2; ++repeat) {  // the second reuses every buffer
    testing::ExpectBatchMatches(*encoder, golden, kHiddenTolerance, kPooledTolerance);
  }
  // Pooled alone (no hidden state downloaded), and each sequence alone.
  testing::ExpectBatchMatches(*encoder, golden, -1, kPooledTolerance);
  testing::ExpectEachSequenceAloneMatches(*encoder, golden, 64, kPooledTolerance);
}

TEST_F(CudaEncoderTest, Bf16IsWithinTheCpusBf16Tolerance) {
  const Golden golden = ReadGolden();
  EncoderSpec spec = TinySpec();
  spec.precision = Precision::kBf16;
  auto encoder = Make(spec, kGpu);
  ASSERT_NE(encoder, nullptr);
  std::vector<float> pooled(golden.pooled.size());
  ASSERT_TRUE(encoder
                  ->Forward({golden.token_ids, golden.token_types, golden.lengths},
                            absl::MakeSpan(pooled), {})
                  .ok());
  const double error =
      MaxAbsDiff(absl::MakeConstSpan(pooled), absl::MakeConstSpan(golden.pooled));
  std::cout << "bf16 pooled max abs error vs PyTorch fp32: " << error << "\n";
  EXPECT_LE(error, kBf16Tolerance);
  EXPECT_GT(error, 0.0);  // the weights did take their bf16 values
}

TEST_F(CudaEncoderTest, HiddenStatesAndClsPooling) {
  const Golden golden = ReadGolden();
  EncoderSpec spec = TinySpec();
  spec.pooling = EncoderSpec::Pooling::kCls;
  spec.normalize = false;
  auto encoder = Make(spec, kGpu);
  ASSERT_NE(encoder, nullptr);
  std::vector<float> pooled(golden.lengths.size() * 64);
  ASSERT_TRUE(encoder
                  ->Forward({golden.token_ids, golden.token_types, golden.lengths},
                            absl::MakeSpan(pooled), {})
                  .ok());
  testing::ExpectRowsAreFirstTokens(pooled, golden, 64, kHiddenTolerance);
  // Hidden states in: the same pass on the CPU and the GPU.
  auto cpu = Make(spec, Device{});
  std::vector<float> on_cpu(pooled.size()), on_gpu(pooled.size());
  EncoderBatch batch;
  batch.lengths = golden.lengths;
  batch.hidden_states = golden.hidden;
  ASSERT_TRUE(cpu->Forward(batch, absl::MakeSpan(on_cpu), {}).ok());
  ASSERT_TRUE(encoder->Forward(batch, absl::MakeSpan(on_gpu), {}).ok());
  EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(on_gpu), absl::MakeConstSpan(on_cpu)),
            kHiddenTolerance);
}

TEST_F(CudaEncoderTest, HeadMasksAndPrunedHeadsAsTheCpuEncoder) {
  const Golden golden = ReadGolden();
  EncoderSpec pruned = TinySpec();
  pruned.pruned_heads = {{1}, {0, 3}};
  const std::vector<float> mask = {1.0f, 0.0f, 0.5f, 1.0f, 0.0f, 1.0f, 0.25f, 1.0f};
  for (const EncoderSpec& spec : {TinySpec(), pruned}) {
    auto gpu = Make(spec, kGpu);
    auto cpu = Make(spec, Device{});
    ASSERT_NE(gpu, nullptr);
    ASSERT_NE(cpu, nullptr);
    for (const bool masked : {false, true}) {
      EncoderBatch batch{golden.token_ids, golden.token_types, golden.lengths};
      if (masked) batch.head_mask = mask;
      std::vector<float> on_gpu(golden.pooled.size()), on_cpu(golden.pooled.size());
      ASSERT_TRUE(gpu->Forward(batch, absl::MakeSpan(on_gpu), {}).ok());
      ASSERT_TRUE(cpu->Forward(batch, absl::MakeSpan(on_cpu), {}).ok());
      EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(on_gpu), absl::MakeConstSpan(on_cpu)),
                kPooledTolerance)
          << "pruned " << !spec.pruned_heads.empty() << " masked " << masked;
      if (masked || !spec.pruned_heads.empty()) {
        EXPECT_GT(
            MaxAbsDiff(absl::MakeConstSpan(on_gpu), absl::MakeConstSpan(golden.pooled)),
            1e-3);  // the mask and the pruning did change the answer
      }
    }
  }
}

TEST_F(CudaEncoderTest, RerankerScoresAreSentenceTransformers) {
  // reranker_tiny: BertForSequenceClassification, one label, scored by a sigmoid.
  std::ifstream in(kData + "/reranker_tiny.golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  EncoderSpec spec = TinySpec();
  spec.d_model = 32;
  spec.ffn_dim = 64;
  spec.vocab_size = 600;
  spec.num_labels = 1;
  spec.normalize = false;
  auto file = SafetensorsFile::Read(kData + "/reranker_tiny/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  auto weights = LoadBertWeights(*file, spec, "bert.");
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto encoder = CreateEncoderBackend(spec, *std::move(weights), kGpu, {});
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  std::vector<int64_t> ids, types, lengths;
  for (const auto& pair : golden["token_ids"]) {
    int64_t type = 0;
    for (const int64_t id : pair) {
      ids.push_back(id);
      types.push_back(type);
      if (id == 3) type = 1;  // [SEP] ends the query
    }
    lengths.push_back(static_cast<int64_t>(pair.size()));
  }
  std::vector<float> logits(lengths.size());
  ASSERT_TRUE(
      (*encoder)->Forward({ids, types, lengths}, absl::MakeSpan(logits), {}).ok());
  for (size_t i = 0; i < lengths.size(); ++i) {
    const double score = 1.0 / (1.0 + std::exp(-double{logits[i]}));
    EXPECT_NEAR(score, golden["scores"][i].get<double>(), 1e-5) << "pair " << i;
  }
}

TEST_F(CudaEncoderTest, HeadStatisticsAreTheCpusAndSaySo) {
  const Golden golden = ReadGolden();
  auto encoder = Make(TinySpec(), kGpu);
  ASSERT_NE(encoder, nullptr);
  std::vector<EncoderHeadStatistic> statistics(8);
  std::vector<float> pooled(golden.pooled.size());
  const absl::Status status =
      encoder->Forward({golden.token_ids, golden.token_types, golden.lengths},
                       absl::MakeSpan(pooled), {}, absl::MakeSpan(statistics));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("--device=cpu"));
  // Bad input is refused with the CPU encoder's words.
  const std::vector<int64_t> ids = {1, 2, 300}, lengths = {3};
  std::vector<float> one(64);
  const absl::Status bad = encoder->Forward({ids, {}, lengths}, absl::MakeSpan(one), {});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("token_ids[2] must be in [0, 100)"));
}

}  // namespace
}  // namespace attnserve::core
