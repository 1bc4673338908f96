// Choosing the oneDNN engine attention runs on.
#ifndef ATTNSERVE_CORE_DEVICE_H_
#define ATTNSERVE_CORE_DEVICE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dnnl.hpp"

namespace attnserve::core {

enum class DeviceKind {
  kCpu,
  // A oneDNN GPU engine. Debian's oneDNN 2.6 drives Intel GPUs through OpenCL.
  kGpu,
};

// "cpu" / "gpu".
absl::string_view DeviceKindName(DeviceKind kind);

// Parses "cpu" or "gpu"; InvalidArgument otherwise.
absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name);

// The oneDNN engine for device `index` of `kind`. Unavailable, naming the device and
// how many oneDNN found, when there is no such device; Internal when oneDNN fails.
absl::StatusOr<dnnl::engine> CreateEngine(DeviceKind kind, int index = 0);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_DEVICE_H_
