// ModelRegistry: the models a server serves, each with its weights and its own dynamic
// batcher: the built-in default plus, optionally, every model of a repository folder.
#ifndef ATTNSERVE_SERVER_MODELS_MODEL_REGISTRY_H_
#define ATTNSERVE_SERVER_MODELS_MODEL_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/attention.pb.h"
#include "core/device.h"
#include "core/model_spec.h"
#include "core/transformer_encoder.h"
#include "core/wordpiece_tokenizer.h"
#include "server/batching/dynamic_batcher.h"
#include "server/batching/encoder_batcher.h"

namespace attnserve::server {

// The one version each model is served as (KServe's model_version).
inline constexpr char kModelVersion[] = "1";

// Name of the built-in model: d_model=512, 8 heads, fp32, weights from seed 0.
inline constexpr char kDefaultModelName[] = "mha-base";

// The ceiling of max_sequence_length: 2^20 tokens. Far above what attention over one
// sequence can compute in a call's lifetime, and low enough that every size derived
// from a shape ([n, h, L, L] weights included) stays far from int64 overflow.
inline constexpr int64_t kMaxSequenceLengthCeiling = int64_t{1} << 20;

// A config's precision as the core's (PRECISION_UNSPECIFIED is fp32).
core::Precision ToCorePrecision(v1::Precision precision);

// Parses the text of a model's config.pbtxt (a ModelConfig text proto) from the folder
// `folder_name` and checks what does not need the weights: the name, the precision,
// d_model and num_heads, max_sequence_length (0 = the server's). InvalidArgument naming
// the field or the text proto's first error (line:column).
absl::StatusOr<v1::ModelConfig> ParseModelConfig(const std::string& text,
                                                 absl::string_view folder_name);

// One served model. Immutable after creation except for its batcher (thread-safe).
struct ServedModel {
  std::string name;
  // What it computes: one attention layer (`spec`, `batcher`) or an encoder
  // (`encoder_spec`, `encoder`); info.kind() says which.
  bool is_encoder() const { return encoder != nullptr; }
  core::ModelSpec spec;  // an encoder's: its attention's d_model and heads
  core::EncoderSpec encoder_spec;
  int64_t max_sequence_length = 0;
  // An encoder's tokenizer (null: it takes token ids only) and the most tokens a text
  // may become.
  std::shared_ptr<const core::WordPieceTokenizer> tokenizer;
  int64_t max_text_tokens = 0;
  // The batcher's byte budget; one request needing more is refused as never fitting.
  int64_t max_queue_bytes = 0;
  // As reported by ListModels / GetModel.
  v1::ModelInfo info;
  std::unique_ptr<DynamicBatcher> batcher;  // attention models
  std::unique_ptr<EncoderBatcher> encoder;  // encoder models
  // The model's batcher, whichever kind.
  BatchQueue* queue() const {
    return encoder != nullptr ? static_cast<BatchQueue*>(encoder.get()) : batcher.get();
  }
};

// Thread-safe after Create (lookups only); owns the models.
class ModelRegistry {
 public:
  struct Options {
    // A folder holding <name>/config.pbtxt + <name>/weights.safetensors per model
    // (an encoder: <name>/config.pbtxt with an `encoder` section, beside Hugging Face's
    // config.json and model.safetensors); empty serves only the built-in model.
    std::string model_repository;
    // Batching settings for models whose config leaves them unset (and for the
    // built-in model). `clock` and `observer` are ignored here (see below).
    DynamicBatcher::Options batching;
    // OpenMP threads per batcher instance; 0 = the cores divided by the model's
    // instances (at least 1).
    int intra_op_threads = 0;
    // Longest sequence accepted unless a config says otherwise. Range
    // [1, kMaxSequenceLengthCeiling] (a config's value too).
    int64_t max_sequence_length = 8192;
    // Where models compute: the CPU, or a CUDA GPU (each instance of each model holds
    // its own copy of the weights there).
    core::Device device;
    // CUDA, fp32 models: allow TF32 tensor cores in cuBLAS products.
    bool allow_tf32 = false;
    // Serve the built-in model (kDefaultModelName, seeded random weights: for trying
    // the server and for benchmarks) unless the repository has a model of that name.
    bool builtin_model = true;
    // The model a request without a model name goes to; empty: the repository's model
    // when it holds exactly one, else the built-in model when served, else none (such
    // requests are refused).
    std::string default_model;
    // Precision of the built-in model (a repository's models set theirs in
    // config.pbtxt).
    core::Precision builtin_precision = core::Precision::kFp32;
    // Run each instance's first forward passes (L=1 and L=128) before the port opens,
    // so readiness waits for them and no client pays the one-time set-up. Off only to
    // measure what it saves.
    bool warm_up = true;
    // Source of time for every batcher; null = real time. Not owned.
    Clock* clock = nullptr;
    // Builds each model's batcher observer (metrics) from its description; may be
    // empty. Called during Create, once per model.
    std::function<BatcherObserver(const v1::ModelInfo& model)> make_observer;
  };

  // Loads every model and starts its batcher. Errors name the file and the problem:
  // NotFound (missing repository, config or weights), InvalidArgument (unparsable or
  // invalid config, weights not matching it), Unavailable (no such device),
  // FailedPrecondition (bf16 on a CPU without AVX512_BF16 or AMX).
  static absl::StatusOr<std::unique_ptr<ModelRegistry>> Create(const Options& options);

  // The model called `name`; the default model when `name` is empty; null if unknown.
  ServedModel* Find(absl::string_view name) const;

  // All models, sorted by name.
  std::vector<const ServedModel*> models() const;

  // The name an empty request model resolves to; empty when there is none.
  const std::string& default_model() const { return default_model_; }

  // Every batcher dispatches without waiting for company from now on (see
  // DynamicBatcher::Flush). Does not block.
  void Flush();

  // Drains every batcher (queued work is computed) and joins their workers. Blocks.
  void Shutdown();

 private:
  ModelRegistry() = default;

  std::map<std::string, std::unique_ptr<ServedModel>, std::less<>> models_;
  std::string default_model_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_MODELS_MODEL_REGISTRY_H_
