#include "core/attention/model_spec.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

using ::testing::HasSubstr;

ModelSpec Spec(int64_t d_model, int64_t num_heads) {
  ModelSpec spec;
  spec.d_model = d_model;
  spec.num_heads = num_heads;
  return spec;
}

TEST(ModelSpecTest, AcceptsDefaultAndComputesHeadDim) {
  const ModelSpec spec;
  EXPECT_TRUE(spec.Validate().ok());
  EXPECT_EQ(spec.head_dim(), 64);
  EXPECT_EQ(Spec(120, 6).head_dim(), 20);
}

TEST(ModelSpecTest, RejectsHeadsThatDoNotDivideDModel) {
  const absl::Status status = Spec(512, 7).Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("num_heads must divide d_model"));
  EXPECT_THAT(status.message(), HasSubstr("num_heads=7"));
}

TEST(ModelSpecTest, RejectsZeroOrNegativeDModel) {
  for (int64_t d : {0, -8}) {
    const absl::Status status = Spec(d, 1).Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("d_model must be in [1, 65536]"));
  }
}

TEST(ModelSpecTest, RejectsZeroOrNegativeHeads) {
  for (int64_t h : {0, -2}) {
    const absl::Status status = Spec(64, h).Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("num_heads must be in [1, d_model=64]"));
  }
}

TEST(ModelSpecTest, DebugStringNamesEveryField) {
  EXPECT_EQ(Spec(64, 4).DebugString(), "d_model=64 num_heads=4 precision=fp32");
  ModelSpec pruned = Spec(64, 4);
  pruned.pruned_heads = {0, 2};
  EXPECT_EQ(pruned.DebugString(),
            "d_model=64 num_heads=4 precision=fp32 pruned_heads=0,2");
}

TEST(ModelSpecTest, AcceptsPrunedHeadsLeavingOne) {
  ModelSpec spec = Spec(64, 4);
  spec.pruned_heads = {0, 1, 3};
  EXPECT_TRUE(spec.Validate().ok());
  EXPECT_TRUE(spec.IsPruned(3));
  EXPECT_FALSE(spec.IsPruned(2));
}

TEST(ModelSpecTest, RejectsPrunedHeadsOutOfRangeRepeatedOrAll) {
  const struct {
    std::vector<int64_t> pruned;
    const char* message;
  } cases[] = {
      {{4}, "pruned_heads[0] must be in [0, 4), got 4"},
      {{1, -1}, "pruned_heads[1] must be in [0, 4), got -1"},
      {{2, 2}, "pruned_heads must be ascending without repeats, got 2,2"},
      {{3, 1}, "pruned_heads must be ascending without repeats, got 3,1"},
      {{0, 1, 2, 3}, "pruned_heads must leave at least one of the 4 heads, got 4 pruned"},
  };
  for (const auto& c : cases) {
    ModelSpec spec = Spec(64, 4);
    spec.pruned_heads = c.pruned;
    const absl::Status status = spec.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace attnserve::core
