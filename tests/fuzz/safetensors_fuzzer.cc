// libFuzzer target: the safetensors reader (header JSON, offsets, dtypes, conversion).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = attnserve::core::SafetensorsFile::Parse(
      std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  for (const std::string& name : file->Names()) {
    const auto* tensor = file->Find(name);
    if (tensor == nullptr || tensor->data_end > size) __builtin_trap();
    (void)file->ReadFloat32(name);
  }
  return 0;
}
