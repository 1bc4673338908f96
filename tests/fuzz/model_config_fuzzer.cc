// libFuzzer target: a model repository's config.pbtxt (text proto + field checks).
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/models/model_loader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto config = attnserve::server::ParseModelConfig(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz-model");
  if (config.ok() && (config->d_model() < 1 || config->num_heads() < 1 ||
                      config->d_model() % config->num_heads() != 0)) {
    __builtin_trap();  // accepted a spec the core cannot run
  }
  return 0;
}
