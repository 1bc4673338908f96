#include "server/models/model_loader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/attention/attention_backend.h"
#include "core/attention/attention_weights.h"
#include "core/base/status_macros.h"
#include "core/encoder/encoder_backend.h"
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

absl::Status WarmUpEncoder(core::EncoderBackend& encoder) {
  const core::EncoderSpec& spec = encoder.spec();
  for (int64_t length : {int64_t{8}, int64_t{128}}) {
    length = std::min(length, spec.max_positions);
    const std::vector<int64_t> ids(static_cast<size_t>(length), 0), lengths = {length};
    std::vector<float> pooled(spec.pools() ? spec.pooled_width() : 0);
    ATTN_RETURN_IF_ERROR(encoder.Forward({ids, {}, lengths}, absl::MakeSpan(pooled), {}));
  }
  return absl::OkStatus();
}

// The weights of each Dense module, from its folder's model.safetensors (linear.weight
// [out, in], linear.bias [out] when it has one); any other tensor is an error naming it.
absl::StatusOr<std::vector<core::EncoderWeights::DenseWeights>> LoadDenseWeights(
    const std::filesystem::path& folder, const v1::EncoderConfig& encoder) {
  std::vector<core::EncoderWeights::DenseWeights> out;
  for (const v1::EncoderConfig::Dense& layer : encoder.dense()) {
    const std::filesystem::path path = folder / layer.folder() / "model.safetensors";
    std::error_code error;
    if (!std::filesystem::exists(path, error) &&
        std::filesystem::exists(folder / layer.folder() / "pytorch_model.bin", error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(layer.folder(),
                       "/pytorch_model.bin: only model.safetensors is read (save the "
                       "model with safe_serialization, or convert the file)"));
    }
    ATTN_ASSIGN_OR_RETURN(const core::SafetensorsFile file,
                          core::SafetensorsFile::Read(path.string()));
    core::EncoderWeights::DenseWeights weights;
    ATTN_ASSIGN_OR_RETURN(
        weights.weight,
        file.ReadFloat32("linear.weight", {layer.out_features(), layer.in_features()}));
    if (layer.bias()) {
      ATTN_ASSIGN_OR_RETURN(weights.bias,
                            file.ReadFloat32("linear.bias", {layer.out_features()}));
    } else {
      weights.bias.assign(static_cast<size_t>(layer.out_features()), 0.0f);
    }
    for (const std::string& name : file.Names()) {
      if (name != "linear.weight" && (name != "linear.bias" || !layer.bias())) {
        return absl::InvalidArgumentError(
            absl::StrCat(layer.folder(), "/model.safetensors: unexpected tensor ", name,
                         " (a Dense module holds linear.weight and linear.bias)"));
      }
    }
    out.push_back(std::move(weights));
  }
  return out;
}

// An encoder model from its folder: config.pbtxt's `encoder` section completed from
// config.json (and sentence-transformers' modules.json, 1_Pooling/config.json), the
// weights from model.safetensors under their Hugging Face names.
absl::StatusOr<std::unique_ptr<ServedModel>> LoadEncoderModel(
    const std::string& name, const std::filesystem::path& folder, v1::ModelConfig config,
    const ModelRegistry::Options& options) {
  EncoderFiles files;
  ATTN_ASSIGN_OR_RETURN(files.config_json, ReadOptionalFile(folder / "config.json"));
  ATTN_ASSIGN_OR_RETURN(files.modules_json, ReadOptionalFile(folder / "modules.json"));
  ATTN_ASSIGN_OR_RETURN(files.pooling_json,
                        ReadOptionalFile(folder / "1_Pooling" / "config.json"));
  ATTN_ASSIGN_OR_RETURN(files.sentence_bert_json,
                        ReadOptionalFile(folder / "sentence_bert_config.json"));
  ATTN_ASSIGN_OR_RETURN(files.sentence_transformers_json,
                        ReadOptionalFile(folder / "config_sentence_transformers.json"));
  ATTN_ASSIGN_OR_RETURN(files.tokenizer_config_json,
                        ReadOptionalFile(folder / "tokenizer_config.json"));
  if (!files.modules_json.empty()) {
    ATTN_ASSIGN_OR_RETURN(const ModuleFolders modules,
                          ModuleFoldersOf(files.modules_json));
    for (const std::string& name : modules.dense) {
      ATTN_ASSIGN_OR_RETURN(std::string text,
                            ReadOptionalFile(folder / name / "config.json"));
      files.dense_configs.emplace_back(name, std::move(text));
    }
    if (!modules.splade.empty()) {
      ATTN_ASSIGN_OR_RETURN(files.splade_json,
                            ReadOptionalFile(folder / modules.splade / "config.json"));
    }
  }
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
    // Saved from a task model (BertForSequenceClassification, DistilBertForMaskedLM,
    // ...): the encoder's tensors behind its base model's name.
    if (prefix.empty()) prefix = core::EncoderPrefix(file, spec);
    ATTN_ASSIGN_OR_RETURN(weights, core::LoadBertWeights(file, spec, prefix));
  }
  ATTN_ASSIGN_OR_RETURN(weights.dense, LoadDenseWeights(folder, config.encoder()));
  config.mutable_encoder()->set_weights_prefix(prefix);
  config.mutable_encoder()->set_weights_file(weights_file);
  // Text in when the folder has a tokenizer; a tokenizer that is there but cannot be
  // served fails the load, naming its file.
  std::shared_ptr<const core::Tokenizer> tokenizer;
  if (auto loaded = core::Tokenizer::FromFolder(folder.string()); loaded.ok()) {
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
  switch (config.encoder().auto_truncate()) {
    case v1::EncoderConfig::AUTO_TRUNCATE_ON:
      model->auto_truncate = true;
      break;
    case v1::EncoderConfig::AUTO_TRUNCATE_OFF:
      model->auto_truncate = false;
      break;
    default:
      model->auto_truncate = options.auto_truncate;
  }
  config.mutable_encoder()->set_auto_truncate(model->auto_truncate
                                                  ? v1::EncoderConfig::AUTO_TRUNCATE_ON
                                                  : v1::EncoderConfig::AUTO_TRUNCATE_OFF);
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
  core::EncoderBackendOptions encoder_options;
  encoder_options.intra_op_threads = intra_op_threads;
  encoder_options.allow_tf32 = options.allow_tf32;
  int made = 0;
  const auto make_encoder =
      [&]() -> absl::StatusOr<std::unique_ptr<core::EncoderBackend>> {
    // The last instance takes the loaded weights themselves: no copy at the peak.
    const bool last = ++made == batching.instances;
    ATTN_ASSIGN_OR_RETURN(auto encoder, core::CreateEncoderBackend(
                                            spec, last ? std::move(weights) : weights,
                                            options.device, encoder_options));
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

// Prefixes `status` with the model (and its folder).
absl::Status ForModelFolder(const absl::Status& status, const std::string& name,
                            const std::filesystem::path& folder) {
  return absl::Status(
      status.code(),
      absl::StrCat("model \"", name, "\" (", folder.string(), "): ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServedModel>> LoadRepositoryModel(
    const std::filesystem::path& model_folder, const ModelFiles& files,
    const ModelRegistry::Options& options,
    const std::optional<std::string>& config_json) {
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

absl::StatusOr<std::unique_ptr<ServedModel>> MakeBuiltinModel(
    const ModelRegistry::Options& options) {
  core::ModelSpec spec;  // d_model=512, num_heads=8
  spec.precision = options.builtin_precision;
  int intra_op_threads = 0;
  const BatchingOptions batching = MergeBatching(
      v1::BatchingConfig(), options.batching, options.intra_op_threads, intra_op_threads);
  absl::StatusOr<std::unique_ptr<ServedModel>> model =
      MakeModel(kDefaultModelName, spec, core::GenerateAttentionWeights(spec, 0),
                options.max_sequence_length, batching, intra_op_threads, options);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("built-in model \"", kDefaultModelName,
                                     "\": ", model.status().message()));
  }
  (*model)->info.set_version(kModelVersion);
  FillProjectionChoices(**model);
  FillAttentionChoice(**model);
  return model;
}

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
          "generated_weights and pruned_heads are for attention models, not encoders "
          "(an encoder removes heads per layer: encoder.pruned_heads)");
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

}  // namespace attnserve::server
