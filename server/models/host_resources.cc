#include "server/models/host_resources.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnserve::server {

namespace {

// The first line of `path`, or nothing when it cannot be read.
std::optional<std::string> FirstLine(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  if (!file || !std::getline(file, line)) return std::nullopt;
  return line;
}

std::optional<int64_t> ReadInt(const std::string& path) {
  const std::optional<std::string> line = FirstLine(path);
  int64_t value = 0;
  if (!line || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*line), &value)) {
    return std::nullopt;
  }
  return value;
}

// Cores granted by a CFS quota (rounded up), if one is set.
std::optional<int> QuotaCores(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return static_cast<int>(std::max<int64_t>(1, (quota + period - 1) / period));
}

std::optional<int> CgroupCores(const std::string& root) {
  if (const std::optional<std::string> line = FirstLine(root + "/cpu.max")) {
    // cgroup v2: "max 100000" or "<quota> <period>".
    const std::vector<std::string> parts =
        absl::StrSplit(*line, ' ', absl::SkipWhitespace());
    int64_t quota = 0, period = 0;
    if (parts.size() == 2 && absl::SimpleAtoi(parts[0], &quota) &&
        absl::SimpleAtoi(parts[1], &period)) {
      return QuotaCores(quota, period);
    }
    return std::nullopt;
  }
  const std::optional<int64_t> quota = ReadInt(root + "/cpu/cpu.cfs_quota_us");
  const std::optional<int64_t> period = ReadInt(root + "/cpu/cpu.cfs_period_us");
  if (quota && period) return QuotaCores(*quota, *period);
  return std::nullopt;
}

std::optional<int64_t> CgroupMemory(const std::string& root) {
  // v2's memory.max holds "max" when there is no limit (it does not parse); v1 writes a
  // huge number instead.
  const std::optional<std::string> v2 = FirstLine(root + "/memory.max");
  std::optional<int64_t> limit;
  int64_t value = 0;
  if (v2) {
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(*v2), &value)) limit = value;
  } else {
    limit = ReadInt(root + "/memory/memory.limit_in_bytes");
  }
  if (!limit || *limit <= 0 || *limit >= (int64_t{1} << 60)) return std::nullopt;
  return limit;
}

}  // namespace

HostResources DetectHostResources(const std::string& cgroup_root) {
  HostResources resources;
  cpu_set_t set;
  CPU_ZERO(&set);
  const int affinity = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  resources.cores = std::max(
      1, affinity > 0 ? affinity : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  if (const std::optional<int> quota = CgroupCores(cgroup_root)) {
    resources.cores = std::min(resources.cores, *quota);
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  resources.memory_bytes = pages > 0 && page_size > 0
                               ? static_cast<int64_t>(pages) * page_size
                               : int64_t{4} << 30;
  if (const std::optional<int64_t> limit = CgroupMemory(cgroup_root)) {
    resources.memory_bytes = std::min(resources.memory_bytes, *limit);
  }
  return resources;
}

}  // namespace attnserve::server
