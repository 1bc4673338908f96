// libFuzzer target: attnctl's .npy reader.
#include <cstddef>
#include <cstdint>
#include <string>

#include "client/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto array =
      attnserve::client::ParseNpy(std::string(reinterpret_cast<const char*>(data), size));
  if (array.ok()) {
    int64_t count = 1;
    for (int64_t dimension : array->shape) count *= dimension;
    if (count != static_cast<int64_t>(array->values.size())) __builtin_trap();
  }
  return 0;
}
