// What this process may use of the machine, as a container sees it.
#ifndef ATTNSERVE_SERVER_MODELS_HOST_RESOURCES_H_
#define ATTNSERVE_SERVER_MODELS_HOST_RESOURCES_H_

#include <cstdint>
#include <string>

namespace attnserve::server {

struct HostResources {
  int cores = 1;             // >= 1
  int64_t memory_bytes = 0;  // > 0
};

// The CPUs in this process's affinity mask and the physical memory, each lowered by a
// cgroup limit when one is set: cgroup v2 (cpu.max, memory.max) or v1
// (cpu/cpu.cfs_quota_us over cpu.cfs_period_us, memory/memory.limit_in_bytes). On
// Kubernetes these are the pod's CPU and memory limits. A CPU quota of 1.5 cores counts
// as 2. `cgroup_root` is where cgroupfs is mounted (tests pass a folder of their own).
HostResources DetectHostResources(const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_MODELS_HOST_RESOURCES_H_
