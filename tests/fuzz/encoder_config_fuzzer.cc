// libFuzzer target: an encoder model's files as the registry reads them (config.json,
// modules.json, 1_Pooling/config.json, split from the input at the first two 0x00
// bytes) after a config.pbtxt's `encoder {}`: ResolveEncoderConfig, then
// EncoderSpecFromConfig. Any input must give a Status or a spec that validates: never a
// crash, an exception or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "server/models/encoder_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  attnserve::server::EncoderFiles files;
  std::string* parts[] = {&files.config_json, &files.modules_json, &files.pooling_json};
  for (int i = 0; i < 3; ++i) {
    const size_t end = i < 2 ? input.find('\0') : absl::string_view::npos;
    *parts[i] = std::string(input.substr(0, end));
    if (end == absl::string_view::npos) break;
    input.remove_prefix(end + 1);
  }
  attnserve::v1::ModelConfig config;
  config.mutable_encoder();
  if (!attnserve::server::ResolveEncoderConfig(files, &config).ok()) return 0;
  auto spec = attnserve::server::EncoderSpecFromConfig(config);
  if (spec.ok() && !spec->Validate().ok()) __builtin_trap();
  return 0;
}
