// libFuzzer target: the embedding APIs' bodies (OpenAI's /v1/embeddings when input byte
// 0 is even, TEI's /embed when odd) as the HTTP door takes them: parsed, checked against
// a small encoder that takes text (its tokenizer a small vocabulary), validated as an
// EncodeRequest, and answered with an embedding of the admitted shape in the API's own
// JSON; refusals go through EmbeddingsError. Any input must give a Status or an answer:
// never a crash, an exception, a read out of bounds or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/wordpiece_tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "server/frontends/embeddings_api.h"
#include "server/pipeline/proto_convert.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnserve::server;  // NOLINT(build/namespaces): a fuzzer's one function
  if (size == 0) return 0;
  const auto api =
      data[0] % 2 == 0 ? EmbeddingsCall::Api::kOpenAi : EmbeddingsCall::Api::kTei;
  const absl::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  static const auto* const tokenizer =
      attnserve::core::WordPieceTokenizer::FromVocab(
          "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\n!\n\xc3\xa9\n", {})
          ->release();
  static ServedModel* const model = [] {
    auto* served = new ServedModel();
    served->name = "tiny";
    served->encoder_spec.num_layers = 1;
    served->encoder_spec.d_model = 8;
    served->encoder_spec.num_heads = 2;
    served->encoder_spec.ffn_dim = 16;
    served->encoder_spec.vocab_size = 10;
    served->encoder_spec.max_positions = 32;
    served->info.mutable_encoder()->set_normalization(
        attnserve::v1::EncoderConfig::NORMALIZATION_L2);
    return served;
  }();
  const auto refuse = [api](const absl::Status& status) {
    const auto answer = EmbeddingsError(api, status, 400);
    if (answer.second.empty()) __builtin_trap();
  };
  absl::StatusOr<EmbeddingsCall> call = api == EmbeddingsCall::Api::kOpenAi
                                            ? ParseOpenAiEmbeddings(body)
                                            : ParseTeiEmbed(body);
  if (!call.ok()) return refuse(call.status()), 0;
  // CheckEmbeddingsCall wants an encoder: the fuzzed model is one (its batcher unused).
  if (api == EmbeddingsCall::Api::kTei && !call->normalize) return 0;
  AdmissionLimits limits;
  limits.max_sequence_length = 32;
  limits.max_text_tokens = 16;
  limits.max_response_bytes = 1 << 16;
  limits.max_work_bytes = 1 << 18;
  auto work =
      EncoderWorkFromRequest(call->encode, model->encoder_spec, limits, tokenizer);
  if (!work.ok()) return refuse(work.status()), 0;
  attnserve::v1::EncodeResponse response;
  const auto count = static_cast<int64_t>((*work)->lengths.size());
  auto* embedding = response.mutable_embedding();
  embedding->add_shape(count);
  embedding->add_shape(8);
  std::vector<float> values(static_cast<size_t>(count * 8), 0.25f);
  embedding->set_raw(std::string(reinterpret_cast<const char*>(values.data()),
                                 values.size() * sizeof(float)));
  response.mutable_lengths()->Add((*work)->lengths.begin(), (*work)->lengths.end());
  if (EmbeddingsBody(*call, response).empty()) __builtin_trap();
  return 0;
}
