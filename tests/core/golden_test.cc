// The core against PyTorch's nn.MultiheadAttention: goldens written by
// tests/tools/make_golden.py (torch 1.13, fp32) and committed under tests/data, so this
// test needs no torch. Each case's weights file is the module's own state_dict.
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "core/attention_weights.h"
#include "core/device.h"
#include "core/multi_head_attention.h"
#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "tests/core/test_util.h"

namespace attnserve::core {
namespace {

using ::attnserve::core::testing::MaxAbsDiff;

// fp32 against fp32 with different summation orders.
constexpr double kTolerance = 1e-5;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

int64_t MetadataInt(const SafetensorsFile& file, const std::string& key) {
  int64_t value = -1;
  EXPECT_TRUE(absl::SimpleAtoi(file.metadata().at(key), &value)) << key;
  return value;
}

TEST_P(GoldenTest, MatchesPyTorch) {
  const std::string base = std::string(ATTNSERVE_TEST_DATA_DIR) + "/" + GetParam();
  absl::StatusOr<SafetensorsFile> io = SafetensorsFile::Read(base + ".io.safetensors");
  ASSERT_TRUE(io.ok()) << io.status();
  ModelSpec spec;
  spec.d_model = MetadataInt(*io, "d_model");
  spec.num_heads = MetadataInt(*io, "num_heads");
  const bool causal = MetadataInt(*io, "causal") == 1;

  absl::StatusOr<AttentionWeights> weights =
      LoadAttentionWeightsFile(base + ".weights.safetensors", spec);
  ASSERT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<dnnl::engine> engine = CreateEngine(DeviceKind::kCpu);
  ASSERT_TRUE(engine.ok());
  auto attention = MultiHeadAttention::Create(spec, *weights, *engine);
  ASSERT_TRUE(attention.ok()) << attention.status();

  // torch's [B, L, d] batch is already B sequences packed end to end.
  const SafetensorsFile::Tensor* query_info = io->Find("query");
  ASSERT_NE(query_info, nullptr);
  const int64_t batch = query_info->shape[0];
  const int64_t length = query_info->shape[1];
  const std::vector<float> query = *io->ReadFloat32("query");
  const std::vector<float> expected_output = *io->ReadFloat32("output");
  const std::vector<float> expected_attention = *io->ReadFloat32("attention");
  std::vector<float> memory;
  std::vector<int64_t> memory_lengths;
  if (const SafetensorsFile::Tensor* memory_info = io->Find("memory")) {
    memory = *io->ReadFloat32("memory");
    memory_lengths.assign(batch, memory_info->shape[1]);
  }
  const std::vector<int64_t> query_lengths(batch, length);

  std::vector<float> output(query.size());
  std::vector<float> attention_weights(MultiHeadAttention::AttentionWeightsSize(
      spec.num_heads, query_lengths, memory_lengths));
  AttentionOptions options;
  options.causal = causal;
  const absl::Status status =
      (*attention)
          ->Forward({query, query_lengths, memory, memory_lengths}, options,
                    absl::MakeSpan(output), absl::MakeSpan(attention_weights));
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(output), absl::MakeConstSpan(expected_output)),
            kTolerance);
  // torch returns [B, h, L, L_k]: the same order as our per-sequence [h, L, L_k].
  EXPECT_LE(MaxAbsDiff(absl::MakeConstSpan(attention_weights),
                       absl::MakeConstSpan(expected_attention)),
            kTolerance);
}

INSTANTIATE_TEST_SUITE_P(PyTorch, GoldenTest,
                         ::testing::Values("self_d64_h4", "cross_d96_h6", "causal_d64_h4",
                                           "self_d120_h6"));

}  // namespace
}  // namespace attnserve::core
