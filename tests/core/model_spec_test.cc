#include "core/model_spec.h"

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
}

}  // namespace
}  // namespace attnserve::core
