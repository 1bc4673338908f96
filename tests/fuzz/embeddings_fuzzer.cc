// libFuzzer target: the JSON APIs' bodies as the HTTP door takes them, input byte 0 % 10
// choosing the API: OpenAI's /v1/embeddings, TEI's /embed, TEI's /rerank, TEI's
// /predict, the Cohere/Jina /v1/rerank, Cohere's /v2/embed, TEI's /embed_all, TEI's
// /embed_sparse, and TEI's /tokenize and /decode (answered on the small tokenizer).
// Parsed, checked against a small encoder that takes text (its tokenizer a small
// vocabulary: an embedder, a one-label reranker, a three-label classifier or a sparse
// (SPLADE) embedder, as the API needs), validated as an EncodeRequest, and answered with
// an embedding or scores of the admitted shape in the API's own JSON; refusals go through
// EmbeddingsError. Any input must give a Status or an answer: never a crash, an
// exception, a read out of bounds or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/text/wordpiece_tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "server/frontends/embeddings_api.h"
#include "server/frontends/tokenize_api.h"
#include "server/pipeline/proto_convert.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnserve::server;  // NOLINT(build/namespaces): a fuzzer's one function
  if (size == 0) return 0;
  using Api = EmbeddingsCall::Api;
  constexpr Api kApis[] = {Api::kOpenAi,      Api::kTei,           Api::kTeiRerank,
                           Api::kTeiPredict,  Api::kRerank,        Api::kCohereEmbed,
                           Api::kTeiEmbedAll, Api::kTeiEmbedSparse};
  const absl::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  static const auto* const tokenizer =
      attnserve::core::WordPieceTokenizer::FromVocab(
          "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\n!\n\xc3\xa9\n", {})
          ->release();
  if (data[0] % 10 >= 8) {
    // /tokenize and /decode: parsed, then answered by the tokenizer, or refused.
    static ServedModel* const texts = [] {
      auto* served = new ServedModel();
      served->name = "tiny";
      served->tokenizer = std::shared_ptr<const attnserve::core::Tokenizer>(
          tokenizer, [](const attnserve::core::Tokenizer*) {});
      (*served->info.mutable_encoder()->mutable_prompts())["query"] = "query: ";
      return served;
    }();
    absl::StatusOr<std::string> answer;
    if (data[0] % 10 == 8) {
      absl::StatusOr<TokenizeCall> call = ParseTeiTokenize(body);
      answer = call.ok() ? TokenizeBody(*call, *texts) : call.status();
    } else {
      absl::StatusOr<DecodeCall> call = ParseTeiDecode(body);
      answer = call.ok() ? DecodeBody(*call, *texts) : call.status();
    }
    if (answer.ok() ? answer->empty() : answer.status().message().empty()) {
      __builtin_trap();
    }
    return 0;
  }
  const Api api = kApis[data[0] % 10];
  const auto make_model = [](int64_t labels, bool sparse) {
    auto* served = new ServedModel();
    served->name = "tiny";
    served->encoder_spec.num_layers = 1;
    served->encoder_spec.d_model = 8;
    served->encoder_spec.num_heads = 2;
    served->encoder_spec.ffn_dim = 16;
    served->encoder_spec.vocab_size = 10;
    served->encoder_spec.max_positions = 32;
    served->max_text_tokens = 16;
    served->encoder_spec.num_labels = labels;
    if (sparse) served->encoder_spec.sparse = attnserve::core::EncoderSpec::Sparse::kMax;
    for (int64_t i = 0; i < labels; ++i)
      served->info.mutable_encoder()->add_labels("L" + std::to_string(i));
    served->info.set_kind(attnserve::v1::MODEL_KIND_ENCODER);
    served->info.mutable_encoder()->set_normalization(
        sparse ? attnserve::v1::EncoderConfig::NORMALIZATION_NONE
               : attnserve::v1::EncoderConfig::NORMALIZATION_L2);
    return served;
  };
  static ServedModel* const embedder = make_model(0, false);
  static ServedModel* const reranker = make_model(1, false);
  static ServedModel* const classifier = make_model(3, false);
  static ServedModel* const sparse = make_model(0, true);
  const auto refuse = [api](const absl::Status& status) {
    const auto answer = EmbeddingsError(api, status, 400);
    if (answer.second.empty()) __builtin_trap();
  };
  absl::StatusOr<EmbeddingsCall> call =
      api == Api::kOpenAi           ? ParseOpenAiEmbeddings(body)
      : api == Api::kTei            ? ParseTeiEmbed(body)
      : api == Api::kTeiRerank      ? ParseTeiRerank(body)
      : api == Api::kRerank         ? ParseRerank(body)
      : api == Api::kCohereEmbed    ? ParseCohereEmbed(body)
      : api == Api::kTeiEmbedAll    ? ParseTeiEmbedAll(body)
      : api == Api::kTeiEmbedSparse ? ParseTeiEmbedSparse(body)
                                    : ParseTeiPredict(body);
  if (!call.ok()) return refuse(call.status()), 0;
  const ServedModel* model = api == Api::kTeiEmbedSparse ? sparse
                             : !call->classifies()       ? embedder
                             : api == Api::kTeiPredict   ? classifier
                                                         : reranker;
  // The fuzzed models are encoders (their batchers unused) of the kind each API needs.
  if (absl::Status fits = CheckEmbeddingsCall(*call, *model); !fits.ok()) {
    // Only TEI's normalize=false and a max_tokens_per_doc below the model's limit may be
    // refused.
    if (api != Api::kTei && call->max_tokens_per_doc == 0) __builtin_trap();
    return refuse(fits), 0;
  }
  AdmissionLimits limits;
  limits.max_sequence_length = 32;
  limits.max_text_tokens = 16;
  limits.max_response_bytes = 1 << 16;
  limits.max_work_bytes = 1 << 18;
  auto work = EncoderWorkFromRequest(call->encode, model->encoder_spec, limits, tokenizer,
                                     EncoderWork::ScoreActivation::kSigmoid);
  if (!work.ok()) return refuse(work.status()), 0;
  attnserve::v1::EncodeResponse response;
  const auto count = static_cast<int64_t>((*work)->lengths.size());
  const int64_t width = model->encoder_spec.pooled_width();
  auto* result =
      call->classifies() ? response.mutable_scores() : response.mutable_embedding();
  result->add_shape(count);
  result->add_shape(width);
  std::vector<float> values(static_cast<size_t>(count * width));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = 0.25f * static_cast<float>(i % 7);
  result->set_raw(std::string(reinterpret_cast<const char*>(values.data()),
                              values.size() * sizeof(float)));
  response.mutable_lengths()->Add((*work)->lengths.begin(), (*work)->lengths.end());
  if (call->encode.return_hidden()) {
    // What the work returns: every token's hidden state, [sum(lengths), d_model].
    int64_t tokens = 0;
    for (const int64_t length : (*work)->lengths) tokens += length;
    const int64_t d = model->encoder_spec.d_model;
    std::vector<float> hidden(static_cast<size_t>(tokens * d), 0.5f);
    response.mutable_hidden()->add_shape(tokens);
    response.mutable_hidden()->add_shape(d);
    response.mutable_hidden()->set_raw(std::string(
        reinterpret_cast<const char*>(hidden.data()), hidden.size() * sizeof(float)));
  }
  if (EmbeddingsBody(*call, response, *model).empty()) __builtin_trap();
  return 0;
}
