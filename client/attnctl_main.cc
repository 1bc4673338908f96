// attnctl: call attnserve from a shell.
//
//   attnctl health [--model=M]
//   attnctl models
//   attnctl model M
//   attnctl infer [--model=M] (--input=x.npy | --random --seq_len=L [--batch=n])
//                 [--memory=m.npy] [--causal] [--head_mask=1,1,0,...]
//                 [--output=y.npy] [--attention_out=a.npy]
//   attnctl encode [--model=M] [--truncate] [--token_ids] [--output=e.npy] TEXT...
//   attnctl rerank [--model=M] [--truncate] [--top_n=N] [--raw_scores] QUERY DOC...
//   attnctl classify [--model=M] [--truncate] [--pairs] [--raw_scores] TEXT...
//
// Exit codes: 0 ok; 1 the call failed (gRPC code name and message printed); 2 usage.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/help.h"
#include "client/attention_client.h"
#include "client/npy.h"
#include "client/security_flags.h"
#include "transport/transport.h"

ABSL_FLAG(std::string, target, "localhost:50051",
          "gRPC target: host:port, dns:///name:port, ipv4:a:p,b:p, unix:path.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30), "Deadline of each call.");
ABSL_FLAG(std::string, lb, "pick_first",
          "Load balancing over resolved addresses: pick_first or round_robin.");
ABSL_FLAG(std::string, model, "",
          "Model name (infer, heads, encode, health); empty = server default.");
ABSL_FLAG(std::string, input, "", "infer: query .npy, float32 [L, d] or [n, L, d].");
ABSL_FLAG(bool, random, false, "infer: send a random query instead of --input.");
ABSL_FLAG(int64_t, seq_len, 128, "infer --random: sequence length L.");
ABSL_FLAG(int64_t, batch, 0,
          "infer --random: n sequences (query [n, L, d]); 0 = [L, d].");
ABSL_FLAG(int64_t, seed, 1, "infer --random: random seed.");
ABSL_FLAG(std::string, memory, "", "infer: cross-attention keys/values .npy.");
ABSL_FLAG(bool, causal, false, "infer: causal mask (self-attention only).");
ABSL_FLAG(std::string, head_mask, "",
          "infer: comma-separated factor per head, e.g. 1,1,0,1.");
ABSL_FLAG(std::string, output, "",
          "infer: write the output here (.npy); encode: the embeddings [n, d].");
ABSL_FLAG(bool, truncate, false,
          "encode, rerank, classify: cut texts longer than the model's max_text_tokens "
          "instead of failing.");
ABSL_FLAG(bool, token_ids, false, "encode: also print the token ids of each text.");
ABSL_FLAG(int64_t, top_n, 0, "rerank: print the best N documents only; 0 = all.");
ABSL_FLAG(bool, raw_scores, false,
          "rerank, classify: the head's logits, without the model's activation.");
ABSL_FLAG(bool, pairs, false,
          "classify: the texts are pairs, taken two at a time (first, second).");
ABSL_FLAG(std::string, config, "",
          "load: the model's ModelConfig as JSON, replacing its config.pbtxt.");
ABSL_FLAG(std::string, attention_out, "",
          "infer: also ask for per-head attention weights and write them here (.npy).");

namespace {

using attnserve::client::AttentionClient;

constexpr int kOk = 0;
constexpr int kCallFailed = 1;
constexpr int kUsage = 2;

const char* PrecisionName(attnserve::v1::Precision precision) {
  switch (precision) {
    case attnserve::v1::PRECISION_BF16:
      return "bf16";
    case attnserve::v1::PRECISION_INT8:
      return "int8";
    default:
      return "fp32";
  }
}

int Usage(const std::string& problem) {
  std::fprintf(stderr, "attnctl: %s\nRun 'attnctl --help' for usage.\n", problem.c_str());
  return kUsage;
}

int Failed(const absl::Status& status) {
  std::fprintf(stderr, "attnctl: %s: %s\n",
               std::string(absl::StatusCodeToString(status.code())).c_str(),
               std::string(status.message()).c_str());
  return kCallFailed;
}

// absl::ParseCommandLine exits with 1 on a bad flag; attnctl promises 2 for usage
// errors, so flags are checked against the registry first.
bool CheckFlags(int argc, char** argv, std::string& problem) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::StartsWith(arg, "-")) continue;
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    const size_t equals = arg.find('=');
    const absl::string_view name = arg.substr(0, equals);
    if (name == "help" || name == "helpfull" || name == "version") continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && flag->IsOfType<bool>()) continue;
      flag = nullptr;
    }
    if (flag == nullptr) {
      problem = absl::StrCat("unknown flag --", name);
      return false;
    }
    std::string value;
    if (equals != absl::string_view::npos) {
      value = std::string(arg.substr(equals + 1));
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      problem = absl::StrCat("flag --", name, " needs a value");
      return false;
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      problem = absl::StrCat("bad value for --", name, ": ", error);
      return false;
    }
  }
  return true;
}

int Health(const AttentionClient& client) {
  const std::string service = absl::GetFlag(FLAGS_model);
  absl::StatusOr<bool> serving = client.IsServing(service);
  if (!serving.ok()) return Failed(serving.status());
  std::printf("%s%s\n", service.empty() ? "" : absl::StrCat(service, ": ").c_str(),
              *serving ? "SERVING" : "NOT_SERVING");
  return *serving ? kOk : kCallFailed;
}

int Models(const AttentionClient& client) {
  absl::StatusOr<std::vector<attnserve::v1::ModelInfo>> models = client.ListModels();
  if (!models.ok()) return Failed(models.status());
  std::printf("%-24s %8s %6s %9s %8s %10s\n", "MODEL", "D_MODEL", "HEADS", "PRECISION",
              "MAX_LEN", "MAX_BATCH");
  for (const auto& model : *models) {
    // HEADS reads "6/8" when the model prunes 2 of its 8 heads.
    const std::string heads =
        model.pruned_heads().empty()
            ? absl::StrCat(model.num_heads())
            : absl::StrCat(model.num_heads() - model.pruned_heads_size(), "/",
                           model.num_heads());
    std::printf("%-24s %8lld %6s %9s %8lld %10d\n", model.name().c_str(),
                static_cast<long long>(model.d_model()), heads.c_str(),
                PrecisionName(model.precision()),
                static_cast<long long>(model.max_sequence_length()),
                model.batching().max_batch_size());
  }
  return kOk;
}

int Repository(const AttentionClient& client) {
  absl::StatusOr<inference::RepositoryIndexResponse> index = client.RepositoryIndex();
  if (!index.ok()) return Failed(index.status());
  std::printf("%-24s %8s %-12s %s\n", "MODEL", "VERSION", "STATE", "REASON");
  for (const auto& model : index->models()) {
    std::printf("%-24s %8s %-12s %s\n", model.name().c_str(), model.version().c_str(),
                model.state().c_str(), model.reason().c_str());
  }
  return kOk;
}

int Load(const AttentionClient& client, const std::string& name) {
  if (absl::Status status = client.LoadModel(name, absl::GetFlag(FLAGS_config));
      !status.ok()) {
    return Failed(status);
  }
  std::printf("%s: loaded\n", name.c_str());
  return kOk;
}

int Unload(const AttentionClient& client, const std::string& name) {
  if (absl::Status status = client.UnloadModel(name); !status.ok()) return Failed(status);
  std::printf("%s: unloaded\n", name.c_str());
  return kOk;
}

int Model(const AttentionClient& client, const std::string& name) {
  absl::StatusOr<attnserve::v1::ModelInfo> model = client.GetModel(name);
  if (!model.ok()) return Failed(model.status());
  std::printf("%s", model->DebugString().c_str());
  return kOk;
}

// The query (--input or --random) and, with --memory, the memory tensor for `model`.
// kOk, or the exit code to return.
int ReadInputs(const AttentionClient& client, const std::string& model_name,
               const std::string& command, attnserve::v1::Tensor* query,
               attnserve::v1::Tensor* memory, bool* has_memory) {
  const std::string input = absl::GetFlag(FLAGS_input);
  if (input.empty() == !absl::GetFlag(FLAGS_random)) {
    return Usage(command + " needs exactly one of --input=FILE.npy and --random");
  }
  std::vector<int64_t> shape;
  std::vector<float> values;
  if (!input.empty()) {
    absl::StatusOr<attnserve::client::NpyArray> array = attnserve::client::ReadNpy(input);
    if (!array.ok()) return Usage(std::string(array.status().message()));
    shape = array->shape;
    values = std::move(array->values);
  } else {
    // The model's width comes from the server.
    absl::StatusOr<attnserve::v1::ModelInfo> model =
        client.GetModel(model_name.empty() ? "mha-base" : model_name);
    if (!model.ok()) return Failed(model.status());
    const int64_t length = absl::GetFlag(FLAGS_seq_len);
    const int64_t batch = absl::GetFlag(FLAGS_batch);
    if (length < 1 || batch < 0) return Usage("--seq_len must be >= 1 and --batch >= 0");
    if (batch > 0) shape.push_back(batch);
    shape.push_back(length);
    shape.push_back(model->d_model());
    values.resize((batch > 0 ? batch : 1) * length * model->d_model());
    std::mt19937 generator(static_cast<uint32_t>(absl::GetFlag(FLAGS_seed)));
    std::uniform_real_distribution<float> distribution(-1.0f, 1.0f);
    for (float& value : values) value = distribution(generator);
  }
  *query = attnserve::client::Float32Tensor(values, shape);
  *has_memory = false;
  if (const std::string path = absl::GetFlag(FLAGS_memory); !path.empty()) {
    absl::StatusOr<attnserve::client::NpyArray> array = attnserve::client::ReadNpy(path);
    if (!array.ok()) return Usage(std::string(array.status().message()));
    *memory = attnserve::client::Float32Tensor(array->values, array->shape);
    *has_memory = true;
  }
  return kOk;
}

int Infer(const AttentionClient& client) {
  attnserve::v1::AttendRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  attnserve::v1::Tensor memory;
  bool has_memory = false;
  if (const int code = ReadInputs(client, request.model(), "infer",
                                  request.mutable_query(), &memory, &has_memory);
      code != kOk) {
    return code;
  }
  if (has_memory) *request.mutable_memory() = std::move(memory);
  request.set_causal(absl::GetFlag(FLAGS_causal));
  if (const std::string mask = absl::GetFlag(FLAGS_head_mask); !mask.empty()) {
    for (absl::string_view part : absl::StrSplit(mask, ',')) {
      float factor = 0;
      if (!absl::SimpleAtof(part, &factor)) {
        return Usage(absl::StrCat("--head_mask: '", part, "' is not a number"));
      }
      request.add_head_mask(factor);
    }
  }
  const std::string attention_out = absl::GetFlag(FLAGS_attention_out);
  request.set_return_attention(!attention_out.empty());

  absl::StatusOr<attnserve::v1::AttendResponse> response = client.Attend(request);
  if (!response.ok()) return Failed(response.status());
  absl::StatusOr<std::vector<float>> output =
      attnserve::client::Float32Values(response->output());
  if (!output.ok()) return Failed(output.status());
  const std::vector<int64_t> output_shape(response->output().shape().begin(),
                                          response->output().shape().end());
  std::printf("model=%s output_shape=[%s] queue_us=%lld compute_us=%lld batch_size=%d\n",
              response->model().c_str(), absl::StrJoin(output_shape, ", ").c_str(),
              static_cast<long long>(response->queue_time_us()),
              static_cast<long long>(response->compute_time_us()),
              response->batch_size());
  if (const std::string path = absl::GetFlag(FLAGS_output); !path.empty()) {
    if (absl::Status status = attnserve::client::WriteNpy(path, output_shape, *output);
        !status.ok()) {
      return Failed(status);
    }
  } else {
    std::vector<float> head(output->begin(),
                            output->begin() + std::min<size_t>(8, output->size()));
    std::printf("output[0, :8] = [%s]\n", absl::StrJoin(head, ", ").c_str());
  }
  if (!attention_out.empty()) {
    absl::StatusOr<std::vector<float>> weights =
        attnserve::client::Float32Values(response->attention());
    if (!weights.ok()) return Failed(weights.status());
    const std::vector<int64_t> weights_shape(response->attention().shape().begin(),
                                             response->attention().shape().end());
    if (absl::Status status =
            attnserve::client::WriteNpy(attention_out, weights_shape, *weights);
        !status.ok()) {
      return Failed(status);
    }
  }
  return kOk;
}

// Prints each head's figures, and the heads whose output term is smallest (the first
// candidates to prune).
int Heads(const AttentionClient& client) {
  attnserve::v1::HeadStatisticsRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  attnserve::v1::Tensor memory;
  bool has_memory = false;
  if (const int code = ReadInputs(client, request.model(), "heads",
                                  request.mutable_query(), &memory, &has_memory);
      code != kOk) {
    return code;
  }
  if (has_memory) *request.mutable_memory() = std::move(memory);
  request.set_causal(absl::GetFlag(FLAGS_causal));
  absl::StatusOr<attnserve::v1::HeadStatisticsResponse> response =
      client.HeadStatistics(request);
  if (!response.ok()) return Failed(response.status());
  std::printf("model=%s tokens=%lld\n", response->model().c_str(),
              static_cast<long long>(response->tokens()));
  std::printf("%4s %12s %15s %17s\n", "HEAD", "MEAN_ENTROPY", "MEAN_MAX_WEIGHT",
              "MEAN_OUTPUT_NORM");
  std::vector<const attnserve::v1::HeadStatistic*> kept;
  for (const auto& head : response->heads()) {
    if (head.pruned()) {
      std::printf("%4lld %12s %15s %17s\n", static_cast<long long>(head.head()), "pruned",
                  "-", "-");
      continue;
    }
    std::printf("%4lld %12.4f %15.4f %17.4f\n", static_cast<long long>(head.head()),
                head.mean_entropy(), head.mean_max_weight(), head.mean_output_norm());
    kept.push_back(&head);
  }
  std::sort(kept.begin(), kept.end(), [](const auto* a, const auto* b) {
    return a->mean_output_norm() < b->mean_output_norm();
  });
  std::vector<int64_t> order;
  for (const auto* head : kept) order.push_back(head->head());
  std::printf("smallest output term first: %s\n", absl::StrJoin(order, ", ").c_str());
  return kOk;
}

// An encoder's heads over `texts`: one line per layer and head.
int EncoderHeads(const AttentionClient& client, const std::vector<char*>& texts) {
  attnserve::v1::HeadStatisticsRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  for (const char* text : texts) request.mutable_encode()->add_text(text);
  request.mutable_encode()->set_truncate(absl::GetFlag(FLAGS_truncate));
  absl::StatusOr<attnserve::v1::HeadStatisticsResponse> response =
      client.HeadStatistics(request);
  if (!response.ok()) return Failed(response.status());
  std::printf("model=%s tokens=%lld\n", response->model().c_str(),
              static_cast<long long>(response->tokens()));
  std::printf("%5s %4s %8s %10s %8s %6s %6s %6s %6s\n", "LAYER", "HEAD", "ENTROPY",
              "MAX_WEIGHT", "DISTANCE", "FIRST", "LAST", "SELF", "PREV");
  for (const auto& head : response->heads()) {
    if (head.pruned()) {
      std::printf("%5lld %4lld %8s\n", static_cast<long long>(head.layer()),
                  static_cast<long long>(head.head()), "pruned");
      continue;
    }
    std::printf("%5lld %4lld %8.4f %10.4f %8.3f %6.3f %6.3f %6.3f %6.3f\n",
                static_cast<long long>(head.layer()), static_cast<long long>(head.head()),
                head.mean_entropy(), head.mean_max_weight(), head.mean_distance(),
                head.share_first(), head.share_last(), head.share_self(),
                head.share_previous());
  }
  return kOk;
}

}  // namespace

// Texts in, embeddings out: one line per text (its tokens and first values), or the
// embeddings [n, d] as .npy with --output.
int Encode(const AttentionClient& client, const std::vector<char*>& texts) {
  attnserve::v1::EncodeRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  for (const char* text : texts) request.add_text(text);
  request.set_truncate(absl::GetFlag(FLAGS_truncate));
  request.set_return_token_ids(absl::GetFlag(FLAGS_token_ids));
  absl::StatusOr<attnserve::v1::EncodeResponse> response = client.Encode(request);
  if (!response.ok()) return Failed(response.status());
  absl::StatusOr<std::vector<float>> embedding =
      attnserve::client::Float32Values(response->embedding());
  if (!embedding.ok()) return Failed(embedding.status());
  const std::vector<int64_t> shape(response->embedding().shape().begin(),
                                   response->embedding().shape().end());
  std::printf(
      "model=%s embedding_shape=[%s] truncated=%d queue_us=%lld compute_us=%lld\n",
      response->model().c_str(), absl::StrJoin(shape, ", ").c_str(),
      response->truncated(), static_cast<long long>(response->queue_time_us()),
      static_cast<long long>(response->compute_time_us()));
  const int64_t d = shape.size() == 2 ? shape[1] : 0;
  int64_t first_id = 0;
  for (int i = 0; i < response->lengths_size(); ++i) {
    std::printf("text[%d]: %lld tokens", i, static_cast<long long>(response->lengths(i)));
    if (request.return_token_ids()) {
      const auto begin = response->token_ids().begin() + first_id;
      std::printf(" ids=[%s]",
                  absl::StrJoin(begin, begin + response->lengths(i), ", ").c_str());
      first_id += response->lengths(i);
    }
    if (absl::GetFlag(FLAGS_output).empty() && d > 0) {
      const auto row = embedding->begin() + i * d;
      std::printf(" embedding[:8]=[%s]",
                  absl::StrJoin(row, row + std::min<int64_t>(8, d), ", ").c_str());
    }
    std::printf("\n");
  }
  if (const std::string path = absl::GetFlag(FLAGS_output); !path.empty()) {
    if (absl::Status status = attnserve::client::WriteNpy(path, shape, *embedding);
        !status.ok()) {
      return Failed(status);
    }
  }
  return kOk;
}

// A classification model's scores [n, labels] from one Encode of texts (and pairs).
absl::StatusOr<std::vector<float>> Scores(const AttentionClient& client,
                                          attnserve::v1::EncodeRequest& request,
                                          int64_t* labels) {
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_truncate(absl::GetFlag(FLAGS_truncate));
  request.set_raw_scores(absl::GetFlag(FLAGS_raw_scores));
  absl::StatusOr<attnserve::v1::EncodeResponse> response = client.Encode(request);
  if (!response.ok()) return response.status();
  const attnserve::v1::Tensor& scores = response->scores();
  if (scores.shape_size() != 2) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model \"", response->model(),
        "\" answered no scores: it is not a classification model (a cross-encoder)"));
  }
  *labels = scores.shape(1);
  std::printf("model=%s scores_shape=[%lld, %lld] truncated=%d compute_us=%lld\n",
              response->model().c_str(), static_cast<long long>(scores.shape(0)),
              static_cast<long long>(*labels), response->truncated(),
              static_cast<long long>(response->compute_time_us()));
  return attnserve::client::Float32Values(scores);
}

// A query and its documents in (the Rerank RPC), the documents best first out: one
// line each with its index in the command line and its score.
int Rerank(const AttentionClient& client, const std::vector<char*>& words) {
  attnserve::v1::RerankRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_query(words[0]);
  for (size_t i = 1; i < words.size(); ++i) request.add_documents(words[i]);
  request.set_top_n(
      static_cast<int32_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_top_n))));
  request.set_truncate(absl::GetFlag(FLAGS_truncate));
  request.set_raw_scores(absl::GetFlag(FLAGS_raw_scores));
  absl::StatusOr<attnserve::v1::RerankResponse> response = client.Rerank(request);
  if (!response.ok()) return Failed(response.status());
  std::printf("model=%s documents=%d tokens=%lld truncated=%d compute_us=%lld\n",
              response->model().c_str(), request.documents_size(),
              static_cast<long long>(response->tokens()), response->truncated(),
              static_cast<long long>(response->compute_time_us()));
  int rank = 0;
  for (const attnserve::v1::RerankResult& result : response->results()) {
    std::printf("%d. document[%d] score=%.6f %s\n", ++rank, result.index(),
                result.score(), words[static_cast<size_t>(result.index()) + 1]);
  }
  return kOk;
}

// Texts (or pairs) in, each one's scores per label out.
int Classify(const AttentionClient& client, const std::vector<char*>& words) {
  attnserve::v1::EncodeRequest request;
  const bool pairs = absl::GetFlag(FLAGS_pairs);
  if (pairs && words.size() % 2 != 0) {
    return Usage(
        absl::StrCat("classify --pairs takes texts two at a time, got ", words.size()));
  }
  for (size_t i = 0; i < words.size(); i += pairs ? 2 : 1) {
    request.add_text(words[i]);
    if (pairs) request.add_text_pair(words[i + 1]);
  }
  int64_t labels = 0;
  absl::StatusOr<std::vector<float>> scores = Scores(client, request, &labels);
  if (!scores.ok()) return Failed(scores.status());
  for (int i = 0; i < request.text_size(); ++i) {
    const auto row = scores->begin() + i * labels;
    std::printf("input[%d] scores=[%s]\n", i,
                absl::StrJoin(row, row + labels, ", ").c_str());
  }
  return kOk;
}

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "client/attnctl_main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "call attnserve from a shell.\n"
      "  attnctl health [--model=M]\n"
      "  attnctl models\n"
      "  attnctl model M\n"
      "  attnctl repository   (the repository's models, their versions and state)\n"
      "  attnctl load M [--config=JSON] | attnctl unload M\n"
      "                (a server run with --model_control_mode=explicit)\n"
      "  attnctl infer [--model=M] (--input=x.npy | --random --seq_len=L [--batch=n])\n"
      "                [--memory=m.npy] [--causal] [--head_mask=1,1,0,...]\n"
      "                [--output=y.npy] [--attention_out=a.npy]\n"
      "  attnctl heads [--model=M] (--input=x.npy | --random --seq_len=L [--batch=n])\n"
      "                [--memory=m.npy] [--causal]   (per-head figures, to prune by)\n"
      "  attnctl heads [--model=M] [--truncate] TEXT...   (an encoder's heads)\n"
      "  attnctl encode [--model=M] [--truncate] [--token_ids] [--output=e.npy] TEXT...\n"
      "                (an encoder: texts in, embeddings out)\n"
      "  attnctl rerank [--model=M] [--truncate] [--top_n=N] [--raw_scores] QUERY "
      "DOC...\n"
      "                (a cross-encoder: the documents best first, with scores)\n"
      "  attnctl classify [--model=M] [--truncate] [--pairs] [--raw_scores] TEXT...\n"
      "                (a classification model: scores per label)\n"
      "Exit codes: 0 ok, 1 the call failed, 2 usage.");
  std::string problem;
  if (attnserve::cli::PrintHelpIfAsked(
          argc, argv, {"client/attnctl_main.cc", attnserve::client::kSecurityFlagsFile}))
    return 0;
  if (!CheckFlags(argc, argv, problem)) return Usage(problem);
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  attnserve::transport::KeepAllocatorMemory();
  if (positional.size() < 2)
    return Usage(
        "missing command: health, models, model, repository, load, unload, infer, heads, "
        "encode, rerank or classify");
  const std::string command = positional[1];

  AttentionClient::Options options;
  options.target = absl::GetFlag(FLAGS_target);
  if (absl::Status status = attnserve::client::ApplySecurityFlags(options);
      !status.ok()) {
    return Usage(std::string(status.message()));
  }
  options.timeout = absl::GetFlag(FLAGS_timeout);
  options.load_balancing = absl::GetFlag(FLAGS_lb);
  absl::StatusOr<std::unique_ptr<AttentionClient>> client =
      AttentionClient::Create(options);
  if (!client.ok()) return Usage(std::string(client.status().message()));

  if (command == "health" && positional.size() == 2) return Health(**client);
  if (command == "models" && positional.size() == 2) return Models(**client);
  if (command == "model" && positional.size() == 3) return Model(**client, positional[2]);
  if (command == "repository" && positional.size() == 2) return Repository(**client);
  if (command == "load" && positional.size() == 3) return Load(**client, positional[2]);
  if (command == "unload" && positional.size() == 3)
    return Unload(**client, positional[2]);
  if (command == "infer" && positional.size() == 2) return Infer(**client);
  if (command == "heads" && positional.size() == 2) return Heads(**client);
  if (command == "heads" && positional.size() >= 3) {
    return EncoderHeads(**client,
                        std::vector<char*>(positional.begin() + 2, positional.end()));
  }
  if (command == "encode" && positional.size() >= 3) {
    return Encode(**client, std::vector<char*>(positional.begin() + 2, positional.end()));
  }
  if (command == "rerank" && positional.size() >= 4) {
    return Rerank(**client, std::vector<char*>(positional.begin() + 2, positional.end()));
  }
  if (command == "classify" && positional.size() >= 3) {
    return Classify(**client,
                    std::vector<char*>(positional.begin() + 2, positional.end()));
  }
  return Usage(absl::StrCat("bad command line for '", command, "'"));
}
