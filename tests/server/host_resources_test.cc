// DetectHostResources against cgroup folders made by the test (v2 and v1 layouts).
#include "server/models/host_resources.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace attnserve::server {
namespace {

class HostResourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
  }
  void Write(const std::string& file, const std::string& text) {
    const std::filesystem::path path = root_ / file;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
  }
  std::string root() const { return root_.string(); }

  std::filesystem::path root_;
};

TEST_F(HostResourcesTest, WithoutCgroupLimitsItIsTheMachine) {
  const HostResources machine = DetectHostResources(root());
  EXPECT_GE(machine.cores, 1);
  EXPECT_GT(machine.memory_bytes, int64_t{64} << 20);
}

TEST_F(HostResourcesTest, CgroupV2QuotaAndMemoryLimitLowerTheMachine) {
  Write("cpu.max", "100000 100000");  // one core
  Write("memory.max", "1073741824");
  const HostResources limited = DetectHostResources(root());
  EXPECT_EQ(limited.cores, 1);
  EXPECT_EQ(limited.memory_bytes, int64_t{1} << 30);
}

TEST_F(HostResourcesTest, CgroupV2MaxMeansNoLimit) {
  Write("cpu.max", "max 100000");
  Write("memory.max", "max");
  const HostResources machine = DetectHostResources(root() + "/none");
  const HostResources unlimited = DetectHostResources(root());
  EXPECT_EQ(unlimited.cores, machine.cores);
  EXPECT_EQ(unlimited.memory_bytes, machine.memory_bytes);
}

TEST_F(HostResourcesTest, CgroupV1QuotaRoundsUpAndHugeMemoryLimitMeansNone) {
  Write("cpu/cpu.cfs_quota_us", "50000");  // half a core: still one
  Write("cpu/cpu.cfs_period_us", "100000");
  Write("memory/memory.limit_in_bytes", "9223372036854771712");
  const HostResources machine = DetectHostResources(root() + "/none");
  const HostResources limited = DetectHostResources(root());
  EXPECT_EQ(limited.cores, 1);
  EXPECT_EQ(limited.memory_bytes, machine.memory_bytes);
}

TEST_F(HostResourcesTest, CgroupV1MemoryLimit) {
  Write("memory/memory.limit_in_bytes", "536870912");
  EXPECT_EQ(DetectHostResources(root()).memory_bytes, int64_t{512} << 20);
}

}  // namespace
}  // namespace attnserve::server
