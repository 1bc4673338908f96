// The CUDA backend against the fp64 reference on a GPU (skipped, saying why, where
// there is none), and its host-side parts (staging, device errors) everywhere.
#include "core/cuda/cuda_attention.h"

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "core/attention/attention_weights.h"
#include "core/base/bfloat16.h"
#include "core/cuda/staging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/reference_attention.h"
#include "tests/core/test_util.h"

namespace attnserve::core::cuda {
namespace {

using ::attnserve::core::testing::MaxAbsDiff;
using ::attnserve::core::testing::RandomTokens;
using ::testing::HasSubstr;
using Path = CudaAttentionOptions::AttentionPath;

// fp32 with TF32 off: different summation orders only. bf16: weights and activations
// rounded to 8 bits of mantissa, f32 accumulation.
constexpr double kFp32Tolerance = 1e-5;
constexpr double kBf16Tolerance = 1e-2;

TEST(CudaStagingTest, PacksTokensLengthsAndFactorsAtAlignedOffsets) {
  const std::vector<int64_t> lengths = {3, 1}, memory_lengths = {2, 5};
  const std::vector<float> query = RandomTokens(4 * 8, 1),
                           memory = RandomTokens(7 * 8, 2);
  std::vector<uint16_t> memory_bf16(memory.size());
  for (size_t i = 0; i < memory.size(); ++i) memory_bf16[i] = FloatToBf16(memory[i]);
  AttentionBatch batch{query, lengths, {}, memory_lengths};
  batch.memory_bf16 = memory_bf16;
  absl::StatusOr<StagingLayout> layout = PlanStaging(batch, 8, 3);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->query_tokens, 4);
  EXPECT_EQ(layout->key_tokens, 7);
  EXPECT_EQ(layout->max_query_length, 3);
  EXPECT_EQ(layout->max_key_length, 5);
  EXPECT_FALSE(layout->query_bf16);
  EXPECT_TRUE(layout->memory_bf16);
  EXPECT_EQ(layout->query_bytes, 4u * 8 * 4);
  EXPECT_EQ(layout->memory_bytes, 7u * 8 * 2);
  for (size_t offset : {layout->memory, layout->cu_query, layout->cu_key, layout->factors,
                        layout->total_bytes}) {
    EXPECT_EQ(offset % StagingLayout::kAlignment, 0u);
  }
  std::vector<uint8_t> staging(layout->total_bytes);
  const std::vector<float> factors = {1.0f, 0.0f, 0.5f};
  PackStaging(batch, *layout, factors, staging.data());
  EXPECT_EQ(std::memcmp(staging.data(), query.data(), layout->query_bytes), 0);
  EXPECT_EQ(std::memcmp(staging.data() + layout->memory, memory_bf16.data(),
                        layout->memory_bytes),
            0);
  int32_t cu[3];
  std::memcpy(cu, staging.data() + layout->cu_query, sizeof(cu));
  EXPECT_THAT(cu, ::testing::ElementsAre(0, 3, 4));
  std::memcpy(cu, staging.data() + layout->cu_key, sizeof(cu));
  EXPECT_THAT(cu, ::testing::ElementsAre(0, 2, 7));
  float packed[3];
  std::memcpy(packed, staging.data() + layout->factors, sizeof(packed));
  EXPECT_THAT(packed, ::testing::ElementsAre(1.0f, 0.0f, 0.5f));
}

TEST(CudaStagingTest, SelfAttentionKeysAreTheQueries) {
  const std::vector<int64_t> lengths = {2, 2};
  const std::vector<float> query = RandomTokens(4 * 4, 1);
  AttentionBatch batch{query, lengths};
  absl::StatusOr<StagingLayout> layout = PlanStaging(batch, 4, 1);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->memory_bytes, 0u);
  EXPECT_EQ(layout->key_tokens, 4);
  std::vector<uint8_t> staging(layout->total_bytes);
  PackStaging(batch, *layout, std::vector<float>{1.0f}, staging.data());
  int32_t cu[3];
  std::memcpy(cu, staging.data() + layout->cu_key, sizeof(cu));
  EXPECT_THAT(cu, ::testing::ElementsAre(0, 2, 4));
}

TEST(CudaStagingTest, RefusesMoreTokensThanThirtyTwoBitIndexes) {
  const std::vector<int64_t> lengths = {int64_t{1} << 30, int64_t{1} << 30};
  AttentionBatch batch{{}, lengths};
  absl::StatusOr<StagingLayout> layout = PlanStaging(batch, 1, 1);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("2147483648 tokens"));
}

TEST(CudaAttentionCreateTest, MissingDeviceIsUnavailableAndSaysWhatWasFound) {
  const int count = CudaDeviceCount();
  ModelSpec spec;
  spec.d_model = 16;
  spec.num_heads = 2;
  auto attention =
      CreateCudaAttention(spec, GenerateAttentionWeights(spec, 1), count, {});
  EXPECT_EQ(attention.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(attention.status().message(),
              HasSubstr("device cuda:" + std::to_string(count) +
                        " is not available: CUDA found " + std::to_string(count)));
  // Through the backend factory too, as the server calls it.
  auto backend = CreateBackend(spec, GenerateAttentionWeights(spec, 1),
                               Device{DeviceKind::kCuda, count}, {});
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable);
}

TEST(CudaAttentionCreateTest, RefusesABadOption) {
  ModelSpec spec;
  spec.d_model = 16;
  spec.num_heads = 2;
  CudaAttentionOptions options;
  options.materialize_min_scores = 0;
  auto attention =
      CreateCudaAttention(spec, GenerateAttentionWeights(spec, 1), 0, options);
  EXPECT_EQ(attention.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(attention.status().message(), HasSubstr("materialize_min_scores"));
}

// Which tensor-core kernel the cases run (the device check runs each):
// ATTNSERVE_TENSOR_CORE_KERNEL=ldmatrix_v_8warps (default), ldmatrix_v or transposed_v.
CudaAttentionOptions::TensorCoreKernel TensorCoreKernelUnderTest() {
  using Kernel = CudaAttentionOptions::TensorCoreKernel;
  const char* name = std::getenv("ATTNSERVE_TENSOR_CORE_KERNEL");
  const std::string kernel = name == nullptr ? "" : name;
  if (kernel == "ldmatrix_v") return Kernel::kLdmatrixV;
  if (kernel == "transposed_v") return Kernel::kTransposedV;
  return Kernel::kLdmatrixV8Warps;
}

// (path, precision)
class CudaAttentionTest : public ::testing::TestWithParam<std::tuple<Path, Precision>> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device here (the device check, tests/gpu/device_check.sh, "
                      "runs these on a GPU)";
    }
    static bool printed = false;
    if (!printed) {
      std::cout << "device: " << CudaDeviceDescription(0) << "\n";
      printed = true;
    }
  }
  Path path() const { return std::get<0>(GetParam()); }
  Precision precision() const { return std::get<1>(GetParam()); }
  double tolerance() const {
    return precision() == Precision::kBf16 ? kBf16Tolerance : kFp32Tolerance;
  }

  std::unique_ptr<CudaAttention> Make(int64_t d_model, int64_t num_heads,
                                      std::vector<int64_t> pruned_heads = {}) {
    spec_.d_model = d_model;
    spec_.num_heads = num_heads;
    spec_.precision = precision();
    spec_.pruned_heads = std::move(pruned_heads);
    weights_ = GenerateAttentionWeights(spec_, 11);
    CudaAttentionOptions options;
    options.path = path();
    options.tensor_core_kernel = TensorCoreKernelUnderTest();
    auto attention = CreateCudaAttention(spec_, weights_, 0, options);
    EXPECT_TRUE(attention.ok()) << attention.status();
    return attention.ok() ? std::move(attention).value() : nullptr;
  }

  // One packed batch, with and without attention weights, each sequence against the
  // fp64 reference on it alone.
  void ExpectMatchesReference(CudaAttention& attention,
                              const std::vector<int64_t>& query_lengths,
                              const std::vector<int64_t>& memory_lengths, bool causal,
                              const std::vector<float>& head_mask,
                              bool bf16_inputs = false) {
    const int64_t d = spec_.d_model, h = spec_.num_heads;
    const int64_t query_tokens =
        std::accumulate(query_lengths.begin(), query_lengths.end(), int64_t{0});
    const int64_t memory_tokens =
        std::accumulate(memory_lengths.begin(), memory_lengths.end(), int64_t{0});
    std::vector<float> query = RandomTokens(query_tokens * d, 5);
    std::vector<float> memory = RandomTokens(memory_tokens * d, 6);
    std::vector<uint16_t> query_bf16, memory_bf16;
    AttentionBatch batch{query, query_lengths, memory, memory_lengths};
    if (bf16_inputs) {
      // The reference sees the same rounded values.
      for (float& value : query) value = Bf16ToFloat(FloatToBf16(value));
      for (float& value : memory) value = Bf16ToFloat(FloatToBf16(value));
      for (float value : query) query_bf16.push_back(FloatToBf16(value));
      for (float value : memory) memory_bf16.push_back(FloatToBf16(value));
      batch =
          AttentionBatch{{}, query_lengths, {}, memory_lengths, query_bf16, memory_bf16};
    }
    std::vector<float> output(query_tokens * d), plain(query_tokens * d);
    std::vector<float> weights(AttentionWeightsSize(h, query_lengths, memory_lengths));
    const AttentionOptions options{causal, head_mask};
    ASSERT_TRUE(
        attention.Forward(batch, options, absl::MakeSpan(output), absl::MakeSpan(weights))
            .ok());
    const absl::Status status =
        attention.Forward(batch, options, absl::MakeSpan(plain), {});
    ASSERT_TRUE(status.ok()) << status;
    double worst_output = 0, worst_weights = 0, worst_plain = 0;
    int64_t query_offset = 0, memory_offset = 0, weights_offset = 0;
    for (size_t i = 0; i < query_lengths.size(); ++i) {
      const int64_t lq = query_lengths[i];
      const int64_t lk = memory_lengths.empty() ? lq : memory_lengths[i];
      const ReferenceResult expected = ReferenceAttention(
          spec_, weights_, absl::MakeConstSpan(query).subspan(query_offset * d, lq * d),
          memory_lengths.empty()
              ? absl::Span<const float>()
              : absl::MakeConstSpan(memory).subspan(memory_offset * d, lk * d),
          causal, head_mask);
      double scale = 1.0;
      for (double value : expected.output) scale = std::max(scale, std::abs(value));
      worst_output = std::max(
          worst_output,
          MaxAbsDiff(absl::MakeConstSpan(output).subspan(query_offset * d, lq * d),
                     absl::MakeConstSpan(expected.output)) /
              scale);
      worst_plain = std::max(
          worst_plain,
          MaxAbsDiff(absl::MakeConstSpan(plain).subspan(query_offset * d, lq * d),
                     absl::MakeConstSpan(expected.output)) /
              scale);
      worst_weights = std::max(
          worst_weights,
          MaxAbsDiff(absl::MakeConstSpan(weights).subspan(weights_offset, h * lq * lk),
                     absl::MakeConstSpan(expected.attention)));
      query_offset += lq;
      memory_offset += memory_lengths.empty() ? 0 : lk;
      weights_offset += h * lq * lk;
    }
    std::cout << ::testing::UnitTest::GetInstance()->current_test_info()->name()
              << ": relative error, output " << worst_output << " (without weights "
              << worst_plain << "), attention weights " << worst_weights << " (tolerance "
              << tolerance() << ")\n";
    EXPECT_LE(worst_output, tolerance());
    EXPECT_LE(worst_plain, tolerance());
    EXPECT_LE(worst_weights, tolerance());
  }

  ModelSpec spec_;
  AttentionWeights weights_;
};

TEST_P(CudaAttentionTest, SelfAttentionOfMixedLengths) {
  auto attention = Make(64, 4);
  ASSERT_NE(attention, nullptr);
  ExpectMatchesReference(*attention, {1, 17, 40, 33}, {}, false, {});
  EXPECT_EQ(attention->device_name(), "cuda:0");
  EXPECT_GT(attention->device_memory_bytes(), 0);
}

TEST_P(CudaAttentionTest, CrossAttention) {
  auto attention = Make(96, 6);
  ASSERT_NE(attention, nullptr);
  ExpectMatchesReference(*attention, {5, 33}, {12, 70}, false, {});
}

TEST_P(CudaAttentionTest, CausalOverSeveralKeyTiles) {
  auto attention = Make(128, 2);
  ASSERT_NE(attention, nullptr);
  ExpectMatchesReference(*attention, {300, 3, 64}, {}, true, {});
}

TEST_P(CudaAttentionTest, WideHeadsOfMixedLengths) {
  auto attention = Make(256, 2);  // head_dim 128: the tensor-core kernel's widest
  ASSERT_NE(attention, nullptr);
  ExpectMatchesReference(*attention, {70, 200, 1, 64}, {}, false, {});
  ExpectMatchesReference(*attention, {130, 65}, {}, true, {1.0f, 0.5f});
  ExpectMatchesReference(*attention, {40, 3}, {129, 64}, false, {});
}

TEST_P(CudaAttentionTest, HeadMaskZeroesAndScalesHeads) {
  auto attention = Make(64, 4);
  ASSERT_NE(attention, nullptr);
  ExpectMatchesReference(*attention, {9, 20}, {}, false, {1.0f, 0.0f, 0.5f, 1.0f});
  EXPECT_EQ(attention->computed_heads(), 3);
}

TEST_P(CudaAttentionTest, ModelPrunedHeadsWithAMask) {
  auto attention = Make(120, 6, {1, 4});
  ASSERT_NE(attention, nullptr);
  ExpectMatchesReference(*attention, {7, 15}, {}, true, {1, 1, 1, 0.25f, 1, 0});
  EXPECT_EQ(attention->computed_heads(), 3);
}

TEST_P(CudaAttentionTest, WideHeadsTakeTheMaterializedPath) {
  auto attention = Make(600, 2);  // head_dim 300 > the fused kernel's 256
  ASSERT_NE(attention, nullptr);
  ExpectMatchesReference(*attention, {9, 4}, {}, false, {});
}

TEST_P(CudaAttentionTest, Bf16Inputs) {
  auto attention = Make(64, 4);
  ASSERT_NE(attention, nullptr);
  ExpectMatchesReference(*attention, {6, 11}, {8, 3}, false, {}, /*bf16_inputs=*/true);
}

TEST_P(CudaAttentionTest, HeadStatisticsMatchTheCpuBackend) {
  auto attention = Make(64, 4, {2});
  ASSERT_NE(attention, nullptr);
  auto cpu = CreateBackend(spec_, weights_, Device{}, {});
  if (precision() == Precision::kBf16 && !cpu.ok()) {
    GTEST_SKIP() << "the CPU here runs no bf16: " << cpu.status();
  }
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const std::vector<int64_t> lengths = {12, 30};
  const std::vector<float> query = RandomTokens(42 * 64, 9);
  std::vector<HeadStatistic> gpu_statistics(4), cpu_statistics(4);
  ASSERT_TRUE(
      attention->HeadStatistics({query, lengths}, true, absl::MakeSpan(gpu_statistics))
          .ok());
  ASSERT_TRUE((*cpu)
                  ->HeadStatistics({query, lengths}, true, absl::MakeSpan(cpu_statistics))
                  .ok());
  const double tolerance = precision() == Precision::kBf16 ? 2e-2 : 1e-4;
  for (int head = 0; head < 4; ++head) {
    EXPECT_NEAR(gpu_statistics[head].mean_entropy, cpu_statistics[head].mean_entropy,
                tolerance);
    EXPECT_NEAR(gpu_statistics[head].mean_max_weight,
                cpu_statistics[head].mean_max_weight, tolerance);
    EXPECT_NEAR(gpu_statistics[head].mean_output_norm,
                cpu_statistics[head].mean_output_norm, tolerance);
  }
  EXPECT_EQ(gpu_statistics[2].mean_entropy, 0.0);
}

TEST_P(CudaAttentionTest, BadRequestIsInvalidArgumentBeforeAnyWork) {
  auto attention = Make(64, 4);
  ASSERT_NE(attention, nullptr);
  const std::vector<int64_t> lengths = {3};
  const std::vector<float> query(2 * 64);
  std::vector<float> output(3 * 64);
  const absl::Status status =
      attention->Forward({query, lengths}, {}, absl::MakeSpan(output), {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("query must hold sum(query_lengths) * d_model"));
}

TEST_P(CudaAttentionTest, RotaryAndWindowAreUnimplemented) {
  // The CPU backend has them; this one refuses them by name instead of ignoring them.
  auto attention = Make(64, 4);
  ASSERT_NE(attention, nullptr);
  const std::vector<int64_t> lengths = {3};
  const std::vector<float> query(3 * 64, 0.5f);
  std::vector<float> output(3 * 64);
  const std::vector<float> inv_freq = {1.0f, 0.5f};
  AttentionOptions rotary;
  rotary.rotary.inv_freq = inv_freq;
  absl::Status status =
      attention->Forward({query, lengths}, rotary, absl::MakeSpan(output));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("rotary is not implemented on CUDA"));
  AttentionOptions window;
  window.window = 2;
  status = attention->Forward({query, lengths}, window, absl::MakeSpan(output));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("window is not implemented on CUDA"));
}

std::string ParamName(const ::testing::TestParamInfo<std::tuple<Path, Precision>>& info) {
  const Path path = std::get<0>(info.param);
  return std::string(path == Path::kAuto         ? "Auto"
                     : path == Path::kFused      ? "Fused"
                     : path == Path::kTensorCore ? "TensorCore"
                                                 : "Materialized") +
         (std::get<1>(info.param) == Precision::kBf16 ? "Bf16" : "Fp32");
}

INSTANTIATE_TEST_SUITE_P(
    Paths, CudaAttentionTest,
    ::testing::Combine(::testing::Values(Path::kAuto, Path::kFused, Path::kTensorCore,
                                         Path::kMaterialized),
                       ::testing::Values(Precision::kFp32, Precision::kBf16)),
    ParamName);

}  // namespace
}  // namespace attnserve::core::cuda
