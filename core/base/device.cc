#include "core/base/device.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace attnserve::core {

std::string DeviceName(const Device& device) {
  if (device.kind == DeviceKind::kCpu) return "cpu";
  return absl::StrCat("cuda:", device.index);
}

absl::StatusOr<Device> ParseDevice(absl::string_view name) {
  if (name == "cpu") return Device{DeviceKind::kCpu, 0};
  if (name == "cuda") return Device{DeviceKind::kCuda, 0};
  int index = -1;
  if (absl::StartsWith(name, "cuda:") && absl::SimpleAtoi(name.substr(5), &index) &&
      index >= 0 && index <= 1023) {
    return Device{DeviceKind::kCuda, index};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device must be 'cpu' or 'cuda:N' (N in [0, 1023]), got '", name, "'"));
}

bool BuiltWithCuda() {
#ifdef ATTNSERVE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::Status NoCudaInThisBuild(const Device& device) {
  return absl::UnavailableError(absl::StrCat(
      "device ", DeviceName(device),
      " is not available: this attnserve was built without CUDA (no nvcc at build "
      "time, or ATTNSERVE_CUDA=off)"));
}

absl::Status CheckCpuIndex(const Device& device) {
  if (device.kind == DeviceKind::kCpu && device.index != 0) {
    return absl::UnavailableError(
        absl::StrCat("device cpu:", device.index, " is not available: the CPU is cpu"));
  }
  return absl::OkStatus();
}

absl::Status Int8IsCpuOnly(const Device& device) {
  return absl::FailedPreconditionError(
      absl::StrCat("precision int8 runs on the CPU only; device ", DeviceName(device),
                   " runs fp32 and bf16"));
}

}  // namespace attnserve::core
