#include "core/base/device.h"

#include "core/attention/attention_backend.h"
#include "core/attention/attention_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

using ::testing::HasSubstr;

TEST(DeviceTest, ParsesDeviceNames) {
  EXPECT_EQ(ParseDevice("cpu")->kind, DeviceKind::kCpu);
  const absl::StatusOr<Device> cuda = ParseDevice("cuda:3");
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(cuda->kind, DeviceKind::kCuda);
  EXPECT_EQ(cuda->index, 3);
  EXPECT_EQ(DeviceName(*cuda), "cuda:3");
  EXPECT_EQ(ParseDevice("cuda")->index, 0);
  for (const char* bad : {"gpu", "tpu", "cuda:", "cuda:-1", "cuda:1024", "cuda:x"}) {
    const absl::StatusOr<Device> parsed = ParseDevice(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(
        parsed.status().message(),
        HasSubstr(std::string("'cpu' or 'cuda:N' (N in [0, 1023]), got '") + bad + "'"));
  }
}

TEST(DeviceTest, CpuIndexPastTheFirstIsUnavailable) {
  ModelSpec spec;
  spec.d_model = 16;
  spec.num_heads = 2;
  auto backend = CreateBackend(spec, GenerateAttentionWeights(spec, 1),
                               Device{DeviceKind::kCpu, 5}, {});
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(backend.status().message(), HasSubstr("cpu:5"));
}

TEST(DeviceTest, CpuBackendNamesItsDevice) {
  ModelSpec spec;
  spec.d_model = 16;
  spec.num_heads = 2;
  auto backend = CreateBackend(spec, GenerateAttentionWeights(spec, 1), Device{}, {});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->device_name(), "cpu");
  EXPECT_EQ((*backend)->device_memory_bytes(), 0);
}

}  // namespace
}  // namespace attnserve::core
