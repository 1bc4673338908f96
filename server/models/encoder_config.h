// An encoder model's recipe from the files Hugging Face and sentence-transformers save
// beside the weights: config.json (the architecture), modules.json and
// 1_Pooling/config.json (pooling and normalization). Fields the model's config.pbtxt
// sets win; the rest come from these files; what neither says takes BERT's defaults.
#ifndef ATTNSERVE_SERVER_MODELS_ENCODER_CONFIG_H_
#define ATTNSERVE_SERVER_MODELS_ENCODER_CONFIG_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "core/encoder/transformer_encoder.h"

namespace attnserve::server {

// The text of the files (empty: the file is absent).
struct EncoderFiles {
  std::string config_json;         // config.json
  std::string modules_json;        // modules.json
  std::string pooling_json;        // 1_Pooling/config.json (the Pooling module's folder)
  std::string sentence_bert_json;  // sentence_bert_config.json (max_seq_length)
  // config_sentence_transformers.json (a CrossEncoder's activation_fn)
  std::string sentence_transformers_json;
  // tokenizer_config.json (model_max_length: sentence-transformers 6 keeps
  // max_seq_length there)
  std::string tokenizer_config_json;
  // Each Dense module's folder (ModuleFoldersOf) with the text of its config.json.
  std::vector<std::pair<std::string, std::string>> dense_configs;
  // The SpladePooling module's config.json (a SparseEncoder's), when it has one.
  std::string splade_json;
};

// The folders of modules.json's modules that have a config of their own, each one
// folder name inside the model's folder: the Dense modules, in order, and the
// SpladePooling module's (empty when there is none). InvalidArgument for a modules.json
// that is not a list, a module that is not served, or a path that is not a plain
// folder name.
struct ModuleFolders {
  std::vector<std::string> dense;
  std::string splade;
};
absl::StatusOr<ModuleFolders> ModuleFoldersOf(const std::string& modules_json);

// Fills the unset fields of `config` (d_model, num_heads and `config->encoder()`) from
// `files`: the task (SpladePooling in modules.json makes sparse embeddings, a
// *ForSequenceClassification architecture classifies), its labels
// (id2label) and score activation too. InvalidArgument naming the file, the field and the
// value: text that is not JSON, a field of the wrong type, an architecture that is not
// served (a model_type outside the served families, relative position embeddings, a
// decoder), an activation or a pooling mode that is not served, or a config.pbtxt value
// that contradicts config.json. Never throws.
absl::Status ResolveEncoderConfig(const EncoderFiles& files, v1::ModelConfig* config);

// The core's spec of a resolved config (ResolveEncoderConfig) and checks it.
absl::StatusOr<core::EncoderSpec> EncoderSpecFromConfig(const v1::ModelConfig& config);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_MODELS_ENCODER_CONFIG_H_
