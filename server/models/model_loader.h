// Loading one model: a repository folder (config.pbtxt, or the same config as JSON;
// the weights; for an encoder, Hugging Face's files beside them) or the built-in model,
// into a ServedModel with its batcher started and warmed. The registry's loading job; it
// decides nothing about which models are served.
#ifndef ATTNSERVE_SERVER_MODELS_MODEL_LOADER_H_
#define ATTNSERVE_SERVER_MODELS_MODEL_LOADER_H_

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/attention.pb.h"
#include "core/attention/model_spec.h"
#include "server/models/model_registry.h"
#include "server/models/model_repository.h"

namespace attnserve::server {

// A config's precision as the core's (PRECISION_UNSPECIFIED is fp32).
core::Precision ToCorePrecision(v1::Precision precision);

// Parses the text of a model's config.pbtxt (a ModelConfig text proto) from the folder
// `folder_name` and checks what does not need the weights: the name, the precision,
// d_model and num_heads, max_sequence_length (0 = the server's). InvalidArgument naming
// the field or the text proto's first error (line:column).
absl::StatusOr<v1::ModelConfig> ParseModelConfig(const std::string& text,
                                                 absl::string_view folder_name);
// The checks of ParseModelConfig on a config already parsed.
absl::Status CheckModelConfig(const v1::ModelConfig& config,
                              absl::string_view folder_name);

// The model of `model_folder` (named after it), from `files` (FindModelFiles of it):
// its config, from `config_json` when set (a ModelConfig in protobuf's JSON mapping)
// instead of config.pbtxt; its weights; its batcher, started and warmed. Errors name
// the model, its folder and the problem (see ModelRegistry::Create). Blocks: seconds.
absl::StatusOr<std::unique_ptr<ServedModel>> LoadRepositoryModel(
    const std::filesystem::path& model_folder, const ModelFiles& files,
    const ModelRegistry::Options& options,
    const std::optional<std::string>& config_json = std::nullopt);

// The built-in model (kDefaultModelName: d_model=512, 8 heads, weights from seed 0) at
// options.builtin_precision, with the server's batching defaults. Blocks.
absl::StatusOr<std::unique_ptr<ServedModel>> MakeBuiltinModel(
    const ModelRegistry::Options& options);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_MODELS_MODEL_LOADER_H_
