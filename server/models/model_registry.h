// ModelRegistry: the models a server serves, each with its weights and its own dynamic
// batcher: the built-in default plus, optionally, the models of a repository folder,
// loaded at start and, under a model control mode, loaded, replaced and unloaded while
// the server runs.
#ifndef ATTNSERVE_SERVER_MODELS_MODEL_REGISTRY_H_
#define ATTNSERVE_SERVER_MODELS_MODEL_REGISTRY_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention.pb.h"
#include "core/attention/model_spec.h"
#include "core/base/device.h"
#include "core/encoder/transformer_encoder.h"
#include "core/text/tokenizer.h"
#include "server/batching/attention_executor.h"
#include "server/batching/encoder_executor.h"
#include "server/models/model_repository.h"

namespace attnserve::server {

// How models may change while the server runs (Triton's --model-control-mode).
// kNone: the models loaded at start are served until exit. kExplicit: the repository
// API loads, replaces and unloads them. kPoll: the registry rescans the repository and
// follows its folders (a folder's files must be unchanged for one whole interval before
// they load); the API's load and unload are refused.
enum class ModelControlMode { kNone, kExplicit, kPoll };
// "none", "explicit" or "poll"; InvalidArgument naming the flag otherwise.
absl::StatusOr<ModelControlMode> ParseModelControlMode(absl::string_view text);

// Name of the built-in model: d_model=512, 8 heads, fp32, weights from seed 0.
inline constexpr char kDefaultModelName[] = "mha-base";

// The ceiling of max_sequence_length: 2^20 tokens. Far above what attention over one
// sequence can compute in a call's lifetime, and low enough that every size derived
// from a shape ([n, h, L, L] weights included) stays far from int64 overflow.
inline constexpr int64_t kMaxSequenceLengthCeiling = int64_t{1} << 20;

// One served model. Immutable after creation except for its batcher (thread-safe).
// Requests hold it by shared_ptr until answered, so a replaced or unloaded model
// finishes what it was given and is freed when its last request is (by the registry's
// own thread, never by a batcher's).
struct ServedModel {
  std::string name;
  // Its version: the number of the version folder it was loaded from, else kModelVersion.
  std::string version = kModelVersion;
  // What it computes: one attention layer (`spec`, `attention_batcher`) or an encoder
  // (`encoder_spec`, `encoder_batcher`); info.kind() says which.
  bool is_encoder() const { return encoder_batcher != nullptr; }
  core::ModelSpec spec;  // an encoder's: its attention's d_model and heads
  core::EncoderSpec encoder_spec;
  int64_t max_sequence_length = 0;
  // An encoder's tokenizer (null: it takes token ids only) and the most tokens a text
  // may become.
  std::shared_ptr<const core::Tokenizer> tokenizer;
  int64_t max_text_tokens = 0;
  // Cut every text over max_text_tokens, whatever the request says (EncoderConfig's
  // auto_truncate, else the server's default).
  bool auto_truncate = false;
  // A classification model's (encoder_spec.num_labels > 0): what makes its scores
  // from the logits (its labels, in id order, are info.encoder().labels()).
  EncoderWork::ScoreActivation score_activation = EncoderWork::ScoreActivation::kNone;
  // The batcher's byte budget; one request needing more is refused as never fitting.
  int64_t max_queue_bytes = 0;
  // As reported by ListModels / GetModel.
  v1::ModelInfo info;
  // When it was made (OpenAI's model "created").
  absl::Time loaded_at = absl::Now();
  // The model's batcher: one of the two, by kind.
  std::unique_ptr<AttentionBatcher> attention_batcher;
  std::unique_ptr<EncoderBatcher> encoder_batcher;
  BatchQueue* queue() const {
    return encoder_batcher != nullptr ? static_cast<BatchQueue*>(encoder_batcher.get())
                                      : attention_batcher.get();
  }
};

// What happened to a repository model, for logs and metrics.
struct ModelEvent {
  enum class Kind { kLoaded, kLoadFailed, kUnloaded, kFreed };
  Kind kind;
  std::string model, version;
  std::string reason;  // kLoadFailed: why
};

// Thread-safe; owns the models.
class ModelRegistry {
 public:
  struct Options {
    // A folder holding <name>/config.pbtxt + <name>/weights.safetensors per model
    // (an encoder: <name>/config.pbtxt with an `encoder` section, beside Hugging Face's
    // config.json and model.safetensors); empty serves only the built-in model.
    // Versions: numbered folders <name>/<N>/ hold the files of version N, the highest
    // with files is served (a config.pbtxt there overrides <name>/config.pbtxt).
    std::string model_repository;
    ModelControlMode control_mode = ModelControlMode::kNone;
    // kPoll: how often the repository is rescanned. Range [10 ms, 1 day].
    absl::Duration poll_interval = absl::Seconds(15);
    // Batching settings for models whose config leaves them unset (and for the
    // built-in model). `clock` and `observer` are ignored here (see below).
    BatchingOptions batching;
    // OpenMP threads per batcher instance; 0 = the cores divided by the model's
    // instances (at least 1).
    int intra_op_threads = 0;
    // Longest sequence accepted unless a config says otherwise. Range
    // [1, kMaxSequenceLengthCeiling] (a config's value too).
    int64_t max_sequence_length = 8192;
    // An encoder's auto_truncate unless its config says otherwise.
    bool auto_truncate = false;
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
    // empty. Called once per model load (again when a model is replaced).
    std::function<BatcherObserver(const v1::ModelInfo& model)> make_observer;
    // Told of every load, failed load, unload and free after Create; may be empty.
    // Called on the loading thread or the registry's own, never under its locks.
    std::function<void(const ModelEvent& event)> on_event;
  };

  // One row of the repository index: every model folder and every served model.
  struct IndexEntry {
    std::string name, version;
    std::string state;   // "READY" or "UNAVAILABLE"
    std::string reason;  // why not ready, or why its last load failed
  };

  // Loads every model and starts its batcher. Errors name the file and the problem:
  // NotFound (missing repository, config or weights), InvalidArgument (unparsable or
  // invalid config, weights not matching it), Unavailable (no such device),
  // FailedPrecondition (bf16 on a CPU without AVX512_BF16 or AMX).
  static absl::StatusOr<std::unique_ptr<ModelRegistry>> Create(const Options& options);

  // Shuts down, then waits until every model it handed out has been let go and freed
  // (a request still holding a replaced version lets go when its callback returns).
  ~ModelRegistry();

  // The model called `name`; the default model when `name` is empty; null if unknown.
  std::shared_ptr<ServedModel> Find(absl::string_view name) const;

  // All models, sorted by name.
  std::vector<std::shared_ptr<const ServedModel>> models() const;

  // The repository's model folders and the served models, sorted by name.
  std::vector<IndexEntry> Index() const;

  // kExplicit: loads model `name` from its repository folder (its highest version),
  // warms it, and only then switches new requests to it; requests already given to the
  // model it replaces finish there. `config_json`, when set, replaces the folder's
  // config.pbtxt: the same ModelConfig in protobuf's JSON mapping. The model served
  // before keeps serving when the load fails. FailedPrecondition outside kExplicit;
  // InvalidArgument for a bad name or config; else Create's errors. Loads run one at
  // a time.
  absl::Status Load(absl::string_view name,
                    const std::optional<std::string>& config_json = std::nullopt);
  // kExplicit: stops sending new requests to model `name`; its queued requests are
  // computed, then its memory is freed (ModelEvent::kFreed). NotFound when not
  // served; FailedPrecondition outside kExplicit.
  absl::Status Unload(absl::string_view name);
  // Load and Unload on the registry's control thread, for a caller that must not block
  // (a gRPC callback handler): each runs after those posted before it, and `done` is
  // called on that thread with what Load / Unload returns, or with UNAVAILABLE once
  // Shutdown began (then on the calling thread when the thread has stopped). Do not
  // block.
  void LoadInBackground(std::string name, std::optional<std::string> config_json,
                        std::function<void(absl::Status)> done);
  void UnloadInBackground(std::string name, std::function<void(absl::Status)> done);
  // One rescan of the repository as kPoll does it (tests call it directly): folders
  // whose files have not changed since the previous scan and differ from what is
  // served are loaded, vanished folders unloaded. Returns the number of changes.
  int Poll();
  // The name an empty request model resolves to; empty when there is none.
  const std::string& default_model() const { return default_model_; }

  // Every batcher dispatches without waiting for company from now on (see
  // Batcher::Flush). Does not block.
  void Flush();

  // Stops polling, drains every batcher (queued work is computed) and joins their
  // workers. Blocks.
  void Shutdown();

 private:
  // Frees retired models on its own thread (see ServedModel).
  class Reaper;
  // A model folder's files as last seen (kPoll): names, sizes and modification times.
  using Fingerprint = std::string;
  struct Folder {
    Fingerprint served;  // the files of the model served from it ("" if none)
    Fingerprint seen;    // at the previous scan
    Fingerprint failed;  // the files of its last failed load
  };

  explicit ModelRegistry(const Options& options);
  std::shared_ptr<ServedModel> Adopt(std::unique_ptr<ServedModel> model);
  absl::Status LoadLocked(absl::string_view name,
                          const std::optional<std::string>& config_json)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_);
  absl::Status UnloadLocked(absl::string_view name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(load_mu_);
  void Tell(const ModelEvent& event) const;
  // OK under kExplicit; else FailedPrecondition saying models are not `done` ("loaded",
  // "unloaded") through the API in this mode.
  absl::Status CheckExplicitControl(absl::string_view done) const;
  void PollLoop();
  // Runs `job` then `done` with its status on the control thread (started by the first
  // post); `done` alone with UNAVAILABLE once stopping.
  void PostControl(std::function<absl::Status()> job,
                   std::function<void(absl::Status)> done);
  void ControlLoop();

  const Options options_;
  std::shared_ptr<Reaper> reaper_;
  // Serializes loads, unloads and scans (each may take seconds: no lookup waits on it).
  absl::Mutex load_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<std::string, Folder, std::less<>> folders_ ABSL_GUARDED_BY(load_mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<ServedModel>, std::less<>> models_
      ABSL_GUARDED_BY(mu_);
  // Why each model's last load failed, until one succeeds.
  std::map<std::string, std::string, std::less<>> load_errors_ ABSL_GUARDED_BY(mu_);
  std::string default_model_;  // set by Create
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread poller_;
  absl::Mutex control_mu_;  // never held with the others
  std::deque<std::function<void()>> control_jobs_ ABSL_GUARDED_BY(control_mu_);
  bool control_closed_ ABSL_GUARDED_BY(control_mu_) = false;
  std::thread control_thread_;  // started under control_mu_; joined by Shutdown
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_MODELS_MODEL_REGISTRY_H_
