#include "server/models/model_registry.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/attention_backend.h"
#include "core/attention_weights.h"
#include "core/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "server/models/encoder_config.h"
#include "server/models/host_resources.h"

namespace attnserve::server {

namespace {

// Keeps the first parse error with its position.
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (error_.empty())
      error_ = absl::StrCat("line ", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

}  // namespace

core::Precision ToCorePrecision(v1::Precision precision) {
  switch (precision) {
    case v1::PRECISION_BF16:
      return core::Precision::kBf16;
    case v1::PRECISION_INT8:
      return core::Precision::kInt8;
    default:
      return core::Precision::kFp32;
  }
}

namespace {

core::ModelSpec SpecFromConfig(const v1::ModelConfig& config) {
  core::ModelSpec spec;
  spec.d_model = config.d_model();
  spec.num_heads = config.num_heads();
  spec.precision = ToCorePrecision(config.precision());
  spec.pruned_heads.assign(config.pruned_heads().begin(), config.pruned_heads().end());
  return spec;
}

v1::Precision ToProtoPrecision(core::Precision precision) {
  switch (precision) {
    case core::Precision::kBf16:
      return v1::PRECISION_BF16;
    case core::Precision::kInt8:
      return v1::PRECISION_INT8;
    case core::Precision::kFp32:
      break;
  }
  return v1::PRECISION_FP32;
}

// Fills unset (zero) batching fields of `config` from the server defaults.
BatchingOptions MergeBatching(const v1::BatchingConfig& config,
                              const BatchingOptions& defaults, int default_threads,
                              int& intra_op_threads) {
  BatchingOptions options = defaults;
  if (config.max_batch_size() != 0) options.max_batch_size = config.max_batch_size();
  if (config.max_batch_tokens() != 0)
    options.max_batch_tokens = config.max_batch_tokens();
  if (config.max_queue_delay_us() != 0) {
    options.max_queue_delay = absl::Microseconds(config.max_queue_delay_us());
  }
  if (config.max_queue_size() != 0) options.max_queue_size = config.max_queue_size();
  if (config.instances() != 0) options.instances = config.instances();
  intra_op_threads =
      config.intra_op_threads() != 0 ? config.intra_op_threads() : default_threads;
  if (intra_op_threads == 0) {
    // The cores (a container's CPU limit, where one is set), shared out between the
    // instances (make bench-grid chose this).
    const int cores = DetectHostResources().cores;
    intra_op_threads = std::max(1, cores / std::max(1, options.instances));
  }
  return options;
}

void FillBatchingInfo(const BatchingOptions& batching, int intra_op_threads,
                      v1::BatchingConfig* info) {
  info->set_max_batch_size(batching.max_batch_size);
  info->set_max_batch_tokens(batching.max_batch_tokens);
  info->set_max_queue_delay_us(absl::ToInt64Microseconds(batching.max_queue_delay));
  info->set_max_queue_size(batching.max_queue_size);
  info->set_instances(batching.instances);
  info->set_intra_op_threads(intra_op_threads);
}

absl::Status WarmUp(core::AttentionBackend& attention, int64_t max_sequence_length) {
  const int64_t d = attention.spec().d_model;
  for (int64_t length : {int64_t{1}, int64_t{128}}) {
    if (length > max_sequence_length) break;
    const std::vector<int64_t> lengths = {length};
    std::vector<float> query(length * d, 0.0f), output(length * d);
    ATTN_RETURN_IF_ERROR(
        attention.Forward({query, lengths}, {}, absl::MakeSpan(output), {}));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ServedModel>> MakeModel(
    const std::string& name, const core::ModelSpec& spec,
    const core::AttentionWeights& weights, int64_t max_sequence_length,
    BatchingOptions batching, int intra_op_threads,
    const ModelRegistry::Options& options) {
  auto model = std::make_unique<ServedModel>();
  model->name = name;
  model->spec = spec;
  model->max_sequence_length = max_sequence_length;
  model->max_queue_bytes = batching.max_queue_bytes;

  v1::ModelInfo& info = model->info;
  info.set_name(name);
  info.set_kind(v1::MODEL_KIND_ATTENTION);
  info.set_d_model(spec.d_model);
  info.set_num_heads(spec.num_heads);
  info.mutable_pruned_heads()->Add(spec.pruned_heads.begin(), spec.pruned_heads.end());
  info.set_precision(ToProtoPrecision(spec.precision));
  info.set_max_sequence_length(max_sequence_length);
  info.add_input_dtypes(v1::DATA_TYPE_FP32);
  info.add_input_dtypes(v1::DATA_TYPE_BF16);
  info.set_device(core::DeviceName(options.device));
  FillBatchingInfo(batching, intra_op_threads, info.mutable_batching());

  batching.clock = options.clock;
  if (options.make_observer) batching.observer = options.make_observer(info);
  core::BackendOptions backend_options;
  backend_options.intra_op_threads = intra_op_threads;
  backend_options.allow_tf32 = options.allow_tf32;
  const auto make_attention =
      [&]() -> absl::StatusOr<std::unique_ptr<core::AttentionBackend>> {
    ATTN_ASSIGN_OR_RETURN(
        auto attention,
        core::CreateBackend(spec, weights, options.device, backend_options));
    // The first forward pays oneDNN's one-time set-up (~60 ms measured here; on a GPU,
    // cuBLAS's and the kernels' loading); a
    // warm-up keeps that off the first client's latency.
    if (options.warm_up) ATTN_RETURN_IF_ERROR(WarmUp(*attention, max_sequence_length));
    return attention;
  };
  ATTN_ASSIGN_OR_RETURN(model->attention_batcher,
                        MakeAttentionBatcher(batching, make_attention));
  return model;
}

// The text of `path`, or "" when it does not exist.
absl::StatusOr<std::string> ReadOptionalFile(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return std::string();
  std::ifstream stream(path, std::ios::binary);
  if (!stream) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::stringstream text;
  text << stream.rdbuf();
  return text.str();
}

absl::Status WarmUpEncoder(core::TransformerEncoder& encoder) {
  const core::EncoderSpec& spec = encoder.spec();
  for (int64_t length : {int64_t{8}, int64_t{128}}) {
    length = std::min(length, spec.max_positions);
    const std::vector<int64_t> ids(static_cast<size_t>(length), 0), lengths = {length};
    std::vector<float> pooled(spec.pools() ? spec.pooled_width() : 0);
    ATTN_RETURN_IF_ERROR(encoder.Forward({ids, {}, lengths}, absl::MakeSpan(pooled), {}));
  }
  return absl::OkStatus();
}

// An encoder model from its folder: config.pbtxt's `encoder` section completed from
// config.json (and sentence-transformers' modules.json, 1_Pooling/config.json), the
// weights from model.safetensors under their Hugging Face names.
absl::StatusOr<std::unique_ptr<ServedModel>> LoadEncoderModel(
    const std::string& name, const std::filesystem::path& folder, v1::ModelConfig config,
    const ModelRegistry::Options& options) {
  if (options.device.kind != core::DeviceKind::kCpu) {
    return absl::InvalidArgumentError(
        absl::StrCat("encoder models run on the CPU in this version, not on ",
                     core::DeviceName(options.device)));
  }
  EncoderFiles files;
  ATTN_ASSIGN_OR_RETURN(files.config_json, ReadOptionalFile(folder / "config.json"));
  ATTN_ASSIGN_OR_RETURN(files.modules_json, ReadOptionalFile(folder / "modules.json"));
  ATTN_ASSIGN_OR_RETURN(files.pooling_json,
                        ReadOptionalFile(folder / "1_Pooling" / "config.json"));
  ATTN_ASSIGN_OR_RETURN(files.sentence_bert_json,
                        ReadOptionalFile(folder / "sentence_bert_config.json"));
  ATTN_ASSIGN_OR_RETURN(files.sentence_transformers_json,
                        ReadOptionalFile(folder / "config_sentence_transformers.json"));
  ATTN_RETURN_IF_ERROR(ResolveEncoderConfig(files, &config));
  ATTN_ASSIGN_OR_RETURN(core::EncoderSpec spec, EncoderSpecFromConfig(config));
  spec.precision = ToCorePrecision(config.precision());
  if (config.max_sequence_length() > spec.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_sequence_length (", config.max_sequence_length(),
        ") must not exceed the encoder's max_positions (", spec.max_positions, ")"));
  }
  const std::string weights_file = config.encoder().weights_file().empty()
                                       ? "model.safetensors"
                                       : config.encoder().weights_file();
  if (weights_file.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "encoder.weights_file \"", weights_file, "\" must name a file in the folder"));
  }
  std::string prefix = config.encoder().weights_prefix();
  core::EncoderWeights weights;
  {
    // The file's bytes go as soon as the weights are read out of them.
    ATTN_ASSIGN_OR_RETURN(core::SafetensorsFile file,
                          core::SafetensorsFile::Read((folder / weights_file).string()));
    if (prefix.empty() && file.Find("embeddings.word_embeddings.weight") == nullptr &&
        file.Find("bert.embeddings.word_embeddings.weight") != nullptr) {
      prefix = "bert.";  // saved from a task model (BertForSequenceClassification, ...)
    }
    ATTN_ASSIGN_OR_RETURN(weights, core::LoadBertWeights(file, spec, prefix));
  }
  config.mutable_encoder()->set_weights_prefix(prefix);
  config.mutable_encoder()->set_weights_file(weights_file);
  // Text in when the folder has a tokenizer; a tokenizer that is there but cannot be
  // served fails the load, naming its file.
  std::shared_ptr<const core::WordPieceTokenizer> tokenizer;
  if (auto loaded = core::WordPieceTokenizer::FromFolder(folder.string()); loaded.ok()) {
    if ((*loaded)->max_id() >= spec.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tokenizer's largest id ", (*loaded)->max_id(),
                       " is outside the model's vocab_size ", spec.vocab_size));
    }
    tokenizer = *std::move(loaded);
  } else if (!absl::IsNotFound(loaded.status())) {
    return loaded.status();
  }

  int intra_op_threads = 0;
  BatchingOptions batching = MergeBatching(config.batching(), options.batching,
                                           options.intra_op_threads, intra_op_threads);
  auto model = std::make_unique<ServedModel>();
  model->name = name;
  model->spec.d_model = spec.d_model;
  model->spec.num_heads = spec.num_heads;
  model->spec.precision = spec.precision;
  model->encoder_spec = spec;
  model->tokenizer = std::move(tokenizer);
  switch (config.encoder().score_activation()) {
    case v1::EncoderConfig::SCORE_ACTIVATION_SIGMOID:
      model->score_activation = EncoderWork::ScoreActivation::kSigmoid;
      break;
    case v1::EncoderConfig::SCORE_ACTIVATION_SOFTMAX:
      model->score_activation = EncoderWork::ScoreActivation::kSoftmax;
      break;
    default:
      model->score_activation = EncoderWork::ScoreActivation::kNone;
  }
  model->max_sequence_length = config.max_sequence_length() != 0
                                   ? config.max_sequence_length()
                                   : spec.max_positions;
  model->max_text_tokens =
      std::min(config.encoder().max_text_tokens(), model->max_sequence_length);
  config.mutable_encoder()->set_max_text_tokens(model->max_text_tokens);
  model->max_queue_bytes = batching.max_queue_bytes;
  v1::ModelInfo& info = model->info;
  info.set_name(name);
  info.set_kind(v1::MODEL_KIND_ENCODER);
  info.set_d_model(spec.d_model);
  info.set_num_heads(spec.num_heads);
  info.set_precision(ToProtoPrecision(spec.precision));
  info.set_max_sequence_length(model->max_sequence_length);
  info.add_input_dtypes(v1::DATA_TYPE_INT64);
  info.add_input_dtypes(v1::DATA_TYPE_INT32);
  info.add_input_dtypes(v1::DATA_TYPE_FP32);
  info.add_input_dtypes(v1::DATA_TYPE_BF16);
  info.set_device(core::DeviceName(options.device));
  *info.mutable_encoder() = config.encoder();
  info.set_accepts_text(model->tokenizer != nullptr);
  FillBatchingInfo(batching, intra_op_threads, info.mutable_batching());

  batching.clock = options.clock;
  if (options.make_observer) batching.observer = options.make_observer(info);
  core::TransformerEncoder::Options encoder_options;
  encoder_options.intra_op_threads = intra_op_threads;
  int made = 0;
  const auto make_encoder =
      [&]() -> absl::StatusOr<std::unique_ptr<core::TransformerEncoder>> {
    // The last instance takes the loaded weights themselves: no copy at the peak.
    const bool last = ++made == batching.instances;
    ATTN_ASSIGN_OR_RETURN(
        auto encoder, core::TransformerEncoder::Create(
                          spec, last ? std::move(weights) : weights, encoder_options));
    if (options.warm_up) ATTN_RETURN_IF_ERROR(WarmUpEncoder(*encoder));
    return encoder;
  };
  ATTN_ASSIGN_OR_RETURN(model->encoder_batcher,
                        MakeEncoderBatcher(batching, make_encoder));
  return model;
}

// The primitives the warm-up chose for `model`'s f32 projections (its d x d matrices at
// its thread count), into its ModelInfo. None for int8, native bf16 or a GPU.
void FillProjectionChoices(ServedModel& model) {
  if (model.info.device() != "cpu") return;
  const std::string path = core::ComputePath(model.spec, core::Device{});
  if (path != "fp32" && !absl::StrContains(path, "f32 compute")) return;
  const int64_t d = model.spec.d_model;
  for (const core::CpuProjectionChoice& choice : core::CpuProjectionChoiceList()) {
    if (choice.in_features != d || choice.out_features != d ||
        choice.intra_op_threads != model.info.batching().intra_op_threads()) {
      continue;
    }
    v1::ProjectionChoice* entry = model.info.add_projection_choices();
    entry->set_in_features(choice.in_features);
    entry->set_out_features(choice.out_features);
    entry->set_primitive(choice.runtime_rows ? "runtime_rows" : "per_shape");
    entry->set_timed_rows(choice.timed_rows);
    entry->set_per_shape_ms(choice.per_shape_ms);
    entry->set_runtime_rows_ms(choice.runtime_rows_ms);
  }
}

// The attention kernel the load timed for `model`'s head size and thread count, into its
// ModelInfo. None for native bf16 or a GPU (their attention has no choice).
void FillAttentionChoice(ServedModel& model) {
  if (model.info.device() != "cpu") return;
  const std::string path = core::ComputePath(model.spec, core::Device{});
  if (absl::StartsWith(path, "bf16 (native")) return;
  for (const core::CpuAttentionChoice& choice : core::CpuAttentionChoiceList()) {
    if (choice.head_dim != model.spec.head_dim() ||
        choice.intra_op_threads != model.info.batching().intra_op_threads()) {
      continue;
    }
    v1::AttentionKernelChoice* entry = model.info.mutable_attention_kernel();
    entry->set_kernel(choice.kernel);
    entry->set_flash_tiles(choice.flash_tiles);
    entry->set_timed_heads(choice.timed_heads);
    entry->set_timed_length(choice.timed_length);
    entry->set_blocks_ms(choice.blocks_ms);
    entry->set_flash_ms(choice.flash_ms);
  }
}

// Where a model folder's files are: its highest numbered version folder holding a
// file, else the folder itself (version kModelVersion).
struct ModelFiles {
  std::filesystem::path folder;
  std::string version = kModelVersion;
};

ModelFiles FindModelFiles(const std::filesystem::path& model_folder) {
  ModelFiles files{model_folder};
  int64_t highest = -1;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(model_folder, error)) {
    const std::string name = entry.path().filename().string();
    int64_t number = 0;
    if (!entry.is_directory() || name.size() > 18 ||
        !std::all_of(name.begin(), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; }) ||
        !absl::SimpleAtoi(name, &number) || number <= highest) {
      continue;
    }
    std::error_code inner;
    bool has_file = false;
    for (const auto& file : std::filesystem::directory_iterator(entry.path(), inner)) {
      has_file = has_file || file.is_regular_file();
    }
    if (!has_file) continue;
    highest = number;
    files.folder = entry.path();
    files.version = absl::StrCat(number);
  }
  return files;
}

// Prefixes `status` with the model (and its folder).
absl::Status ForModelFolder(const absl::Status& status, const std::string& name,
                            const std::filesystem::path& folder) {
  return absl::Status(
      status.code(),
      absl::StrCat("model \"", name, "\" (", folder.string(), "): ", status.message()));
}

// The model of `model_folder`, from `files` (FindModelFiles of it).
absl::StatusOr<std::unique_ptr<ServedModel>> LoadRepositoryModel(
    const std::filesystem::path& model_folder, const ModelFiles& files,
    const ModelRegistry::Options& options,
    const std::optional<std::string>& config_json = std::nullopt) {
  const std::string name = model_folder.filename().string();
  const std::filesystem::path& folder = files.folder;
  v1::ModelConfig config;
  if (config_json.has_value()) {
    // The same ModelConfig as config.pbtxt, in protobuf's JSON mapping (what the
    // repository API's "config" parameter carries).
    const auto parsed =
        google::protobuf::util::JsonStringToMessage(*config_json, &config);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config is not a ModelConfig in JSON: ", parsed.message().as_string()));
    }
    ATTN_RETURN_IF_ERROR(CheckModelConfig(config, name));
  } else {
    std::filesystem::path config_path = folder / "config.pbtxt";
    std::error_code error;
    if (!std::filesystem::exists(config_path, error)) {
      config_path = model_folder / "config.pbtxt";
    }
    std::ifstream stream(config_path);
    if (!stream) {
      return absl::NotFoundError(absl::StrCat(config_path.string(), ": cannot open"));
    }
    std::stringstream text;
    text << stream.rdbuf();
    absl::StatusOr<v1::ModelConfig> parsed = ParseModelConfig(text.str(), name);
    if (!parsed.ok()) {
      return absl::Status(
          parsed.status().code(),
          absl::StrCat(config_path.string(), ": ", parsed.status().message()));
    }
    config = *std::move(parsed);
  }
  absl::StatusOr<std::unique_ptr<ServedModel>> model;
  if (config.has_encoder()) {
    model = LoadEncoderModel(name, folder, config, options);
  } else {
    const core::ModelSpec spec = SpecFromConfig(config);
    const int64_t max_sequence_length = config.max_sequence_length() != 0
                                            ? config.max_sequence_length()
                                            : options.max_sequence_length;
    core::AttentionWeights weights;
    if (config.generated_weights()) {
      weights = core::GenerateAttentionWeights(spec, config.seed());
    } else {
      absl::StatusOr<core::AttentionWeights> loaded =
          core::LoadAttentionWeightsFile((folder / "weights.safetensors").string(), spec);
      if (!loaded.ok()) return ForModelFolder(loaded.status(), name, folder);
      weights = *std::move(loaded);
    }
    int intra_op_threads = 0;
    const BatchingOptions batching = MergeBatching(
        config.batching(), options.batching, options.intra_op_threads, intra_op_threads);
    model = MakeModel(name, spec, weights, max_sequence_length, batching,
                      intra_op_threads, options);
  }
  if (!model.ok()) return ForModelFolder(model.status(), name, folder);
  (*model)->version = files.version;
  (*model)->info.set_version(files.version);
  FillProjectionChoices(**model);
  FillAttentionChoice(**model);
  return model;
}

// The files under `folder` (recursively, links followed) as "path size mtime" lines:
// what kPoll compares between scans.
std::string FingerprintFolder(const std::filesystem::path& folder) {
  std::vector<std::string> lines;
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(
           folder, std::filesystem::directory_options::follow_directory_symlink, error);
       !error && it != std::filesystem::recursive_directory_iterator();
       it.increment(error)) {
    std::error_code stat_error;
    const auto status = std::filesystem::status(it->path(), stat_error);
    if (stat_error || !std::filesystem::is_regular_file(status)) continue;
    const auto size = std::filesystem::file_size(it->path(), stat_error);
    const auto modified = std::filesystem::last_write_time(it->path(), stat_error);
    if (stat_error) continue;
    lines.push_back(
        absl::StrCat(std::filesystem::relative(it->path(), folder, stat_error).string(),
                     " ", size, " ", modified.time_since_epoch().count()));
  }
  std::sort(lines.begin(), lines.end());
  return absl::StrJoin(lines, "\n");
}

// The model folders of the repository, sorted.
std::vector<std::filesystem::path> ModelFolders(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> folders;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    // Hidden folders are for staging (written there, then renamed into place).
    if (entry.is_directory() && entry.path().filename().string().rfind('.', 0) != 0) {
      folders.push_back(entry.path());
    }
  }
  std::sort(folders.begin(), folders.end());
  return folders;
}

}  // namespace

absl::StatusOr<v1::ModelConfig> ParseModelConfig(const std::string& text,
                                                 absl::string_view folder_name) {
  v1::ModelConfig config;
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a valid ModelConfig text proto: ", errors.error()));
  }
  ATTN_RETURN_IF_ERROR(CheckModelConfig(config, folder_name));
  return config;
}

absl::Status CheckModelConfig(const v1::ModelConfig& config,
                              absl::string_view folder_name) {
  if (!config.name().empty() && config.name() != folder_name) {
    return absl::InvalidArgumentError(absl::StrCat(
        "name \"", config.name(), "\" must equal the folder name \"", folder_name, "\""));
  }
  if (!v1::Precision_IsValid(config.precision())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "precision must be PRECISION_FP32, PRECISION_BF16 or PRECISION_INT8, got ",
        config.precision()));
  }
  if (config.has_encoder()) {
    if (config.generated_weights() || !config.pruned_heads().empty()) {
      return absl::InvalidArgumentError(
          "generated_weights and pruned_heads are for attention models, not encoders");
    }
  } else if (absl::Status status = SpecFromConfig(config).Validate(); !status.ok()) {
    return absl::InvalidArgumentError(status.message());
  }
  if (config.max_sequence_length() < 0 ||
      config.max_sequence_length() > kMaxSequenceLengthCeiling) {
    return absl::InvalidArgumentError(absl::StrCat("max_sequence_length must be in [0, ",
                                                   kMaxSequenceLengthCeiling, "], got ",
                                                   config.max_sequence_length()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelControlMode> ParseModelControlMode(absl::string_view text) {
  if (text == "none") return ModelControlMode::kNone;
  if (text == "explicit") return ModelControlMode::kExplicit;
  if (text == "poll") return ModelControlMode::kPoll;
  return absl::InvalidArgumentError(absl::StrCat(
      "model_control_mode must be none, explicit or poll, got \"", text, "\""));
}

class ModelRegistry::Reaper {
 public:
  explicit Reaper(std::function<void(const ModelEvent&)> tell)
      : tell_(std::move(tell)), thread_([this] { Loop(); }) {}

  // The last reference to `model` went (on any thread, a batcher's included).
  void Retire(ServedModel* model) {
    {
      absl::MutexLock lock(&mu_);
      if (!stopped_) {
        retired_.push_back(model);
        return;
      }
    }
    Free(model);  // the registry is gone: its batchers were joined already
  }

  // Frees what was retired, then joins the thread.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

 private:
  void Loop() {
    while (true) {
      ServedModel* model = nullptr;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Reaper* reaper) ABSL_EXCLUSIVE_LOCKS_REQUIRED(reaper->mu_) {
              return reaper->stopping_ || !reaper->retired_.empty();
            },
            this));
        if (retired_.empty()) {
          stopped_ = true;
          return;
        }
        model = retired_.front();
        retired_.erase(retired_.begin());
      }
      Free(model);
    }
  }

  void Free(ServedModel* model) {
    // Its queue is empty (every request held the model), so this only joins.
    model->queue()->Shutdown();
    ModelEvent event{ModelEvent::Kind::kFreed, model->name, model->version, ""};
    delete model;
#ifdef __GLIBC__
    // The server keeps freed memory for reuse (transport::KeepAllocatorMemory's
    // thresholds); an unloaded model's goes back to the system here.
    malloc_trim(0);
#endif
    if (tell_) tell_(event);
  }

  const std::function<void(const ModelEvent&)> tell_;
  absl::Mutex mu_;
  std::vector<ServedModel*> retired_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

ModelRegistry::ModelRegistry(const Options& options)
    : options_(options), reaper_(std::make_shared<Reaper>(options.on_event)) {}

ModelRegistry::~ModelRegistry() {
  Shutdown();
  {
    absl::MutexLock lock(&mu_);
    models_.clear();
  }
  reaper_->Stop();
}

std::shared_ptr<ServedModel> ModelRegistry::Adopt(std::unique_ptr<ServedModel> model) {
  // The deleter runs wherever the last request lets go: the reaper frees it.
  return std::shared_ptr<ServedModel>(
      model.release(),
      [reaper = reaper_](ServedModel* retired) { reaper->Retire(retired); });
}

void ModelRegistry::Tell(const ModelEvent& event) const {
  if (options_.on_event) options_.on_event(event);
}

absl::StatusOr<std::unique_ptr<ModelRegistry>> ModelRegistry::Create(
    const Options& options) {
  if (options.max_sequence_length < 1 ||
      options.max_sequence_length > kMaxSequenceLengthCeiling) {
    return absl::InvalidArgumentError(absl::StrCat("max_sequence_length must be in [1, ",
                                                   kMaxSequenceLengthCeiling, "], got ",
                                                   options.max_sequence_length));
  }
  if (options.control_mode != ModelControlMode::kNone &&
      options.model_repository.empty()) {
    return absl::InvalidArgumentError(
        "model_control_mode explicit or poll needs a --model_repository to load from");
  }
  if (options.control_mode == ModelControlMode::kPoll &&
      (options.poll_interval < absl::Milliseconds(10) ||
       options.poll_interval > absl::Hours(24))) {
    return absl::InvalidArgumentError(
        absl::StrCat("repository_poll_interval must be in [10ms, 24h], got ",
                     absl::FormatDuration(options.poll_interval)));
  }
#ifdef __GLIBC__
  if (options.control_mode != ModelControlMode::kNone) {
    // Models come and go: their memory must go back to the system when they do. The
    // server keeps freed memory for reuse (transport::KeepAllocatorMemory), and
    // malloc_trim returns only the main arena's free top: with glibc's default of 8
    // arenas per core, 20-25 MiB of an unloaded d=1024 model stayed resident in the
    // others (RSS after unloading rose from 33 to 59 MiB over a few load cycles); with
    // one arena it stayed at 33. Small allocations still come from each thread's own
    // cache without the arena's lock.
    mallopt(M_ARENA_MAX, 1);
  }
#endif
  std::unique_ptr<ModelRegistry> registry(new ModelRegistry(options));
  absl::MutexLock load_lock(&registry->load_mu_);
  absl::MutexLock lock(&registry->mu_);
  std::string only_repository_model;  // set when the repository holds exactly one
  if (!options.model_repository.empty()) {
    const std::filesystem::path root(options.model_repository);
    std::error_code error;
    if (!std::filesystem::is_directory(root, error)) {
      return absl::NotFoundError(absl::StrCat(
          "model repository \"", options.model_repository, "\" is not a directory"));
    }
    const std::vector<std::filesystem::path> folders = ModelFolders(root);
    for (const auto& folder : folders) {
      Folder& seen = registry->folders_[folder.filename().string()];
      seen.seen = FingerprintFolder(folder);
      ATTN_ASSIGN_OR_RETURN(std::unique_ptr<ServedModel> model,
                            LoadRepositoryModel(folder, FindModelFiles(folder), options));
      seen.served = seen.seen;
      if (folders.size() == 1) only_repository_model = model->name;
      const std::string name = model->name;
      registry->models_.emplace(name, registry->Adopt(std::move(model)));
    }
  }
  if (options.builtin_model && registry->models_.count(kDefaultModelName) == 0) {
    core::ModelSpec spec;  // d_model=512, num_heads=8
    spec.precision = options.builtin_precision;
    int intra_op_threads = 0;
    absl::StatusOr<std::unique_ptr<ServedModel>> model =
        MakeModel(kDefaultModelName, spec, core::GenerateAttentionWeights(spec, 0),
                  options.max_sequence_length,
                  MergeBatching(v1::BatchingConfig(), options.batching,
                                options.intra_op_threads, intra_op_threads),
                  intra_op_threads, options);
    if (!model.ok()) {
      return absl::Status(model.status().code(),
                          absl::StrCat("built-in model \"", kDefaultModelName,
                                       "\": ", model.status().message()));
    }
    (*model)->info.set_version(kModelVersion);
    FillProjectionChoices(**model);
    FillAttentionChoice(**model);
    registry->models_.emplace(kDefaultModelName, registry->Adopt(*std::move(model)));
  }
  if (registry->models_.empty() && options.control_mode == ModelControlMode::kNone) {
    return absl::InvalidArgumentError(
        "no models to serve: --builtin_model=false needs a --model_repository with at "
        "least one model");
  }
  if (!options.default_model.empty()) {
    if (registry->models_.count(options.default_model) == 0) {
      std::vector<std::string> names;
      for (const auto& [name, model] : registry->models_) names.push_back(name);
      return absl::InvalidArgumentError(
          absl::StrCat("default_model \"", options.default_model,
                       "\" is not served; models: ", absl::StrJoin(names, ", ")));
    }
    registry->default_model_ = options.default_model;
  } else if (!only_repository_model.empty()) {
    // A repository of one model is what its operator means to serve: the built-in
    // model beside it is for trying the server.
    registry->default_model_ = only_repository_model;
  } else if (registry->models_.count(kDefaultModelName) != 0) {
    registry->default_model_ = kDefaultModelName;
  }
  if (options.control_mode == ModelControlMode::kPoll) {
    registry->poller_ = std::thread([raw = registry.get()] { raw->PollLoop(); });
  }
  return registry;
}

std::shared_ptr<ServedModel> ModelRegistry::Find(absl::string_view name) const {
  if (name.empty() && default_model_.empty()) return nullptr;
  absl::MutexLock lock(&mu_);
  const auto it = models_.find(name.empty() ? absl::string_view(default_model_) : name);
  return it == models_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const ServedModel>> ModelRegistry::models() const {
  std::vector<std::shared_ptr<const ServedModel>> result;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, model] : models_) result.push_back(model);
  return result;
}

std::vector<ModelRegistry::IndexEntry> ModelRegistry::Index() const {
  std::map<std::string, IndexEntry> entries;
  if (!options_.model_repository.empty()) {
    for (const auto& folder : ModelFolders(options_.model_repository)) {
      const std::string name = folder.filename().string();
      entries[name] = {name, FindModelFiles(folder).version, "UNAVAILABLE", "unloaded"};
    }
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [name, model] : models_) {
    entries[name] = {name, model->version, "READY", ""};
  }
  for (const auto& [name, reason] : load_errors_) {
    IndexEntry& entry = entries[name];
    entry.name = name;
    if (entry.state.empty()) entry.state = "UNAVAILABLE";
    entry.reason = reason;
  }
  std::vector<IndexEntry> result;
  for (auto& [name, entry] : entries) result.push_back(std::move(entry));
  return result;
}

absl::Status ModelRegistry::CheckExplicitControl(absl::string_view done) const {
  if (options_.control_mode == ModelControlMode::kExplicit) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "models are ", done,
      " by the repository API only under --model_control_mode=explicit (this server: ",
      options_.control_mode == ModelControlMode::kNone ? "none" : "poll", ")"));
}

absl::Status ModelRegistry::Load(absl::string_view name,
                                 const std::optional<std::string>& config_json) {
  ATTN_RETURN_IF_ERROR(CheckExplicitControl("loaded"));
  absl::MutexLock lock(&load_mu_);
  return LoadLocked(name, config_json);
}

absl::Status ModelRegistry::LoadLocked(absl::string_view name,
                                       const std::optional<std::string>& config_json) {
  if (name.empty() || name == "." || name == ".." || name[0] == '.' ||
      name.find('/') != absl::string_view::npos ||
      name.find('\\') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("model name \"", name, "\" must name a folder of the repository"));
  }
  const std::filesystem::path folder =
      std::filesystem::path(options_.model_repository) / std::string(name);
  std::error_code error;
  if (!std::filesystem::is_directory(folder, error)) {
    return absl::NotFoundError(absl::StrCat("model \"", name, "\" has no folder in the ",
                                            "repository ", options_.model_repository));
  }
  const Fingerprint files = FingerprintFolder(folder);
  const ModelFiles model_files = FindModelFiles(folder);
  const std::string& version = model_files.version;
  absl::StatusOr<std::unique_ptr<ServedModel>> loaded =
      LoadRepositoryModel(folder, model_files, options_, config_json);
  if (!loaded.ok()) {
    folders_[std::string(name)].failed = files;
    {
      absl::MutexLock lock(&mu_);
      load_errors_[std::string(name)] = absl::StrCat(
          "version ", version, " failed to load: ", loaded.status().message());
    }
    Tell({ModelEvent::Kind::kLoadFailed, std::string(name), version,
          std::string(loaded.status().message())});
    return loaded.status();
  }
  folders_[std::string(name)].served = files;
  const std::string loaded_version = (*loaded)->version;
  std::shared_ptr<ServedModel> replaced = Adopt(*std::move(loaded));
  {
    absl::MutexLock lock(&mu_);
    models_[std::string(name)].swap(replaced);
    load_errors_.erase(std::string(name));
  }
  Tell({ModelEvent::Kind::kLoaded, std::string(name), loaded_version, ""});
  // `replaced` (the model served before, if any) goes here; its last request frees it.
  return absl::OkStatus();
}

absl::Status ModelRegistry::Unload(absl::string_view name) {
  ATTN_RETURN_IF_ERROR(CheckExplicitControl("unloaded"));
  absl::MutexLock lock(&load_mu_);
  return UnloadLocked(name);
}

absl::Status ModelRegistry::UnloadLocked(absl::string_view name) {
  std::shared_ptr<ServedModel> unloaded;
  {
    absl::MutexLock lock(&mu_);
    const auto it = models_.find(name);
    if (it == models_.end()) {
      return absl::NotFoundError(absl::StrCat("model \"", name, "\" is not loaded"));
    }
    unloaded = std::move(it->second);
    models_.erase(it);
  }
  if (auto it = folders_.find(name); it != folders_.end()) it->second.served.clear();
  // New requests no longer find it; the queued ones are computed before it is freed.
  unloaded->queue()->Flush();
  Tell({ModelEvent::Kind::kUnloaded, unloaded->name, unloaded->version, ""});
  return absl::OkStatus();
}

int ModelRegistry::Poll() {
  absl::MutexLock lock(&load_mu_);
  // A repository that is not there now (a volume remounting) unloads nothing.
  std::error_code error;
  if (!std::filesystem::is_directory(options_.model_repository, error)) return 0;
  int changes = 0;
  std::set<std::string> present;
  for (const auto& folder : ModelFolders(options_.model_repository)) {
    const std::string name = folder.filename().string();
    present.insert(name);
    Folder& state = folders_[name];
    const Fingerprint files = FingerprintFolder(folder);
    // Unchanged for one whole interval: not being written any more.
    const bool settled = files == state.seen;
    state.seen = files;
    if (!settled || files == state.served || files == state.failed) continue;
    (void)LoadLocked(name, std::nullopt);  // a failure is told, and the old one stays
    ++changes;
  }
  for (auto it = folders_.begin(); it != folders_.end();) {
    if (present.count(it->first) != 0) {
      ++it;
      continue;
    }
    if (!it->second.served.empty() && UnloadLocked(it->first).ok()) ++changes;
    {
      absl::MutexLock errors_lock(&mu_);
      load_errors_.erase(it->first);
    }
    it = folders_.erase(it);
  }
  return changes;
}

void ModelRegistry::PollLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Wakes early only for Shutdown.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.poll_interval);
    if (stopping_) break;
    mu_.Unlock();
    Poll();
    mu_.Lock();
  }
}

void ModelRegistry::Flush() {
  for (const auto& model : models()) model->queue()->Flush();
}

void ModelRegistry::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (poller_.joinable()) poller_.join();
  for (const auto& model : models()) model->queue()->Shutdown();
}

}  // namespace attnserve::server
