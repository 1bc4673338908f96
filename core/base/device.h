// Naming the device attention runs on: "cpu", or "cuda:N" for the N-th CUDA GPU.
#ifndef ATTNSERVE_CORE_BASE_DEVICE_H_
#define ATTNSERVE_CORE_BASE_DEVICE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace attnserve::core {

enum class DeviceKind {
  kCpu,
  // An NVIDIA GPU through CUDA (core/cuda/), in builds made with nvcc.
  kCuda,
};

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  // Which GPU, as CUDA numbers them (CUDA_VISIBLE_DEVICES applies); 0 for the CPU.
  int index = 0;
};

// "cpu" or "cuda:N".
std::string DeviceName(const Device& device);

// Parses "cpu", "cuda" (= "cuda:0") or "cuda:N" with N in [0, 1023]; InvalidArgument
// naming what was given otherwise.
absl::StatusOr<Device> ParseDevice(absl::string_view name);

// Whether this build has the CUDA backend (made where nvcc was found, ATTNSERVE_CUDA
// not off).
bool BuiltWithCuda();

// Unavailable naming `device` and why this build has no backend for it (made without
// nvcc, or with ATTNSERVE_CUDA=off).
absl::Status NoCudaInThisBuild(const Device& device);

// OK unless `device` is a CPU other than cpu:0 (Unavailable naming it): what every
// backend checks before building on the CPU.
absl::Status CheckCpuIndex(const Device& device);

// FailedPrecondition naming `device`: int8 models run on the CPU only.
absl::Status Int8IsCpuOnly(const Device& device);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_BASE_DEVICE_H_
