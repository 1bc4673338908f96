#include "core/device.h"

#include "dnnl.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

using ::testing::HasSubstr;

TEST(DeviceTest, CreatesCpuEngine) {
  absl::StatusOr<dnnl::engine> engine = CreateEngine(DeviceKind::kCpu);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ(engine->get_kind(), dnnl::engine::kind::cpu);
}

TEST(DeviceTest, MissingGpuIsUnavailableAndNamesTheDevice) {
  if (dnnl::engine::get_count(dnnl::engine::kind::gpu) > 0) {
    GTEST_SKIP() << "this machine has a oneDNN GPU device";
  }
  absl::StatusOr<dnnl::engine> engine = CreateEngine(DeviceKind::kGpu);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(engine.status().message(), HasSubstr("device gpu:0 is not available"));
  EXPECT_THAT(engine.status().message(), HasSubstr("found 0 gpu device"));
}

TEST(DeviceTest, CpuIndexPastTheLastIsUnavailable) {
  absl::StatusOr<dnnl::engine> engine = CreateEngine(DeviceKind::kCpu, 5);
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(engine.status().message(), HasSubstr("cpu:5"));
}

TEST(DeviceTest, ParsesDeviceNames) {
  EXPECT_EQ(*ParseDeviceKind("cpu"), DeviceKind::kCpu);
  EXPECT_EQ(*ParseDeviceKind("gpu"), DeviceKind::kGpu);
  const auto bad = ParseDeviceKind("tpu");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'cpu' or 'gpu', got 'tpu'"));
}

}  // namespace
}  // namespace attnserve::core
