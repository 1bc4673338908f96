#include "core/attention/attention_weights.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

using ::testing::HasSubstr;

ModelSpec Spec(int64_t d, int64_t h) {
  ModelSpec spec;
  spec.d_model = d;
  spec.num_heads = h;
  return spec;
}

// FNV-1a over the float bits: one number that pins every generated value.
uint64_t Fingerprint(const AttentionWeights& weights) {
  uint64_t hash = 1469598103934665603ULL;
  for (const auto* tensor : {&weights.in_proj_weight, &weights.in_proj_bias,
                             &weights.out_proj_weight, &weights.out_proj_bias}) {
    for (float value : *tensor) {
      uint32_t bits;
      std::memcpy(&bits, &value, 4);
      for (int i = 0; i < 4; ++i) {
        hash ^= (bits >> (8 * i)) & 0xFF;
        hash *= 1099511628211ULL;
      }
    }
  }
  return hash;
}

TEST(AttentionWeightsTest, GeneratesTheSameBitsForTheSameSeed) {
  const ModelSpec spec = Spec(64, 4);
  const AttentionWeights a = GenerateAttentionWeights(spec, 42);
  const AttentionWeights b = GenerateAttentionWeights(spec, 42);
  EXPECT_EQ(Fingerprint(a), Fingerprint(b));
  EXPECT_NE(Fingerprint(a), Fingerprint(GenerateAttentionWeights(spec, 43)));
  EXPECT_TRUE(a.CheckShapes(spec).ok());
}

TEST(AttentionWeightsTest, GeneratedBitsArePinnedAcrossMachines) {
  // Recorded once; a change here means a seed no longer names the same model.
  const AttentionWeights weights = GenerateAttentionWeights(Spec(8, 2), 0);
  EXPECT_EQ(Fingerprint(weights), 0xd2b56d8c17fe4467ULL)
      << std::hex << Fingerprint(weights);
  for (float w : weights.in_proj_weight) EXPECT_LE(std::abs(w), std::sqrt(6.0f / 32));
}

TEST(AttentionWeightsTest, RoundTripsThroughSafetensors) {
  const ModelSpec spec = Spec(16, 2);
  const AttentionWeights weights = GenerateAttentionWeights(spec, 3);
  const absl::StatusOr<std::string> bytes = SerializeAttentionWeights(weights, spec);
  ASSERT_TRUE(bytes.ok());
  const auto file = SafetensorsFile::Parse(*bytes);
  ASSERT_TRUE(file.ok());
  const auto loaded = LoadAttentionWeights(*file, spec);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->in_proj_weight, weights.in_proj_weight);
  EXPECT_EQ(loaded->in_proj_bias, weights.in_proj_bias);
  EXPECT_EQ(loaded->out_proj_weight, weights.out_proj_weight);
  EXPECT_EQ(loaded->out_proj_bias, weights.out_proj_bias);
}

TEST(AttentionWeightsTest, LoadNamesTheMissingTensor) {
  const ModelSpec spec = Spec(16, 2);
  const AttentionWeights weights = GenerateAttentionWeights(spec, 3);
  std::vector<SafetensorsEntry> entries = {
      {kInProjWeightName, "F32", {48, 16}, std::string(48 * 16 * 4, '\0')},
      {kInProjBiasName, "F32", {48}, std::string(48 * 4, '\0')},
      {kOutProjWeightName, "F32", {16, 16}, std::string(16 * 16 * 4, '\0')},
  };
  const auto file = SafetensorsFile::Parse(*SerializeSafetensors(entries));
  ASSERT_TRUE(file.ok());
  const auto loaded = LoadAttentionWeights(*file, spec);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(loaded.status().message(), HasSubstr("missing tensor 'out_proj.bias'"));
}

// nn.MultiheadAttention(16, 2)'s four tensors (zeros), plus `extra`, less `drop`.
absl::StatusOr<AttentionWeights> LoadWith(std::vector<SafetensorsEntry> extra,
                                          const std::string& drop = "") {
  std::vector<SafetensorsEntry> entries;
  for (SafetensorsEntry entry : std::vector<SafetensorsEntry>{
           {kInProjWeightName, "F32", {48, 16}, std::string(48 * 16 * 4, '\0')},
           {kInProjBiasName, "F32", {48}, std::string(48 * 4, '\0')},
           {kOutProjWeightName, "F32", {16, 16}, std::string(16 * 16 * 4, '\0')},
           {kOutProjBiasName, "F32", {16}, std::string(16 * 4, '\0')}}) {
    if (entry.name != drop) entries.push_back(entry);
  }
  for (SafetensorsEntry& entry : extra) entries.push_back(std::move(entry));
  const auto file = SafetensorsFile::Parse(*SerializeSafetensors(entries));
  EXPECT_TRUE(file.ok()) << file.status();
  return LoadAttentionWeights(*file, Spec(16, 2));
}

TEST(AttentionWeightsTest, LoadRefusesUnsupportedModuleOptionsByName) {
  // What PyTorch's state_dict holds for each option, which would change the answer.
  const std::string row(16 * 4, '\0');
  struct Case {
    std::vector<SafetensorsEntry> extra;
    std::string drop;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"bias_k", "F32", {1, 1, 16}, row}, {"bias_v", "F32", {1, 1, 16}, row}},
       "",
       "add_bias_kv is not supported"},
      {{{"q_proj_weight", "F32", {16, 16}, std::string(16 * 16 * 4, '\0')}},
       kInProjWeightName,
       "kdim/vdim different from embed_dim is not supported"},
      {{}, kInProjBiasName, "bias=False is not supported"},
      {{{"encoder.norm.weight", "F32", {16}, row}},
       "",
       "unexpected tensor 'encoder.norm.weight'"},
  };
  for (const Case& c : cases) {
    const auto loaded = LoadWith(c.extra, c.drop);
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(loaded.status().message(), HasSubstr(c.message));
  }
  EXPECT_TRUE(LoadWith({}).ok());
}

TEST(AttentionWeightsTest, LoadRejectsWrongShapeForTheSpec) {
  const ModelSpec small = Spec(16, 2);
  const auto bytes = SerializeAttentionWeights(GenerateAttentionWeights(small, 3), small);
  const auto file = SafetensorsFile::Parse(*bytes);
  ASSERT_TRUE(file.ok());
  const auto loaded = LoadAttentionWeights(*file, Spec(32, 2));
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.status().message(),
              HasSubstr("'in_proj_weight' has wrong shape: expected [96, 32], found "
                        "[48, 16]"));
}

TEST(AttentionWeightsTest, LoadFileNamesThePathInErrors) {
  const std::string path = ::testing::TempDir() + "/bad.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    out << "short";
  }
  const auto loaded = LoadAttentionWeightsFile(path, Spec(16, 2));
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.status().message(), HasSubstr(path));
  EXPECT_THAT(loaded.status().message(), HasSubstr("shorter than the 8-byte"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace attnserve::core
