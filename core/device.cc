#include "core/device.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve::core {

absl::string_view DeviceKindName(DeviceKind kind) {
  return kind == DeviceKind::kCpu ? "cpu" : "gpu";
}

absl::StatusOr<DeviceKind> ParseDeviceKind(absl::string_view name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "gpu") return DeviceKind::kGpu;
  return absl::InvalidArgumentError(
      absl::StrCat("device must be 'cpu' or 'gpu', got '", name, "'"));
}

absl::StatusOr<dnnl::engine> CreateEngine(DeviceKind kind, int index) {
  const dnnl::engine::kind engine_kind =
      kind == DeviceKind::kCpu ? dnnl::engine::kind::cpu : dnnl::engine::kind::gpu;
  try {
    const size_t count = dnnl::engine::get_count(engine_kind);
    if (index < 0 || static_cast<size_t>(index) >= count) {
      return absl::UnavailableError(absl::StrCat(
          "device ", DeviceKindName(kind), ":", index, " is not available: oneDNN found ",
          count, " ", DeviceKindName(kind), " device(s)",
          kind == DeviceKind::kGpu
              ? " (this oneDNN build drives Intel GPUs through OpenCL)"
              : ""));
    }
    return dnnl::engine(engine_kind, static_cast<size_t>(index));
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN could not create the ",
                                            DeviceKindName(kind), " engine: ", e.what()));
  }
}

}  // namespace attnserve::core
