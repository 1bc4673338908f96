// libFuzzer target: the KServe v2 HTTP door's request path without the socket. Input:
// an optional first line "H:<Inference-Header-Content-Length value>\n", then the body.
// The body goes through ParseInferBody, then both model kinds' conversions:
// AttendFromInfer and WorkFromRequest, EncodeFromInfer and EncoderWorkFromRequest (what
// the door does before queueing), and an answer of the admitted shape back out; errors go
// through ErrorBody, as the door sends them. The same bytes also go through the
// repository extension's body parsers (index, load, unload), and, as protobuf wire
// bytes, the gRPC door's load and unload requests. Any input must give a Status
// or an answer: never a crash, an exception, a read out of bounds or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "core/attention/model_spec.h"
#include "core/encoder/transformer_encoder.h"
#include "google/protobuf/stubs/logging.h"
#include "server/frontends/kserve_convert.h"
#include "server/frontends/kserve_http_request.h"
#include "server/pipeline/proto_convert.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::string header_value;
  bool has_header = false;
  if (input.substr(0, 2) == "H:") {
    const size_t end = input.find('\n');
    if (end == absl::string_view::npos) return 0;
    header_value = std::string(input.substr(2, end - 2));
    input.remove_prefix(end + 1);
    has_header = true;
  }
  using namespace attnserve::server;  // NOLINT(build/namespaces): a fuzzer's one function
  const auto refuse = [](const absl::Status& status) {
    // The door answers every refusal this way; it must not throw on any message.
    if (ErrorBody(status.message()).empty()) __builtin_trap();
  };
  // The repository extension's bodies (index, load, unload) on the same bytes.
  if (absl::StatusOr<bool> ready = ParseRepositoryIndexBody(input); !ready.ok()) {
    refuse(ready.status());
  }
  for (const bool load : {true, false}) {
    if (auto config = ParseRepositoryLoadBody(input, load); !config.ok()) {
      refuse(config.status());
    }
  }
  // And the gRPC door's load and unload requests, as wire bytes.
  if (inference::RepositoryModelLoadRequest load;
      load.ParseFromArray(input.data(), static_cast<int>(input.size()))) {
    if (auto config = LoadConfigFromParameters(load); !config.ok())
      refuse(config.status());
  }
  if (inference::RepositoryModelUnloadRequest unload;
      unload.ParseFromArray(input.data(), static_cast<int>(input.size()))) {
    if (absl::Status checked = CheckUnloadParameters(unload); !checked.ok()) {
      refuse(checked);
    }
  }
  absl::StatusOr<int64_t> header_length =
      ParseHeaderLength(has_header ? header_value.c_str() : nullptr);
  if (!header_length.ok()) return refuse(header_length.status()), 0;
  // The model name comes from the URL: any bytes (here the body's first few).
  const std::string model(input.substr(0, 4));
  absl::StatusOr<HttpInferRequest> parsed =
      ParseInferBody(model, "", input, *header_length);
  if (!parsed.ok()) return refuse(parsed.status()), 0;
  inference::ModelInferRequest& infer = parsed->infer;
  {
    // An encoder model's path, on a copy (each conversion moves the raw inputs out).
    inference::ModelInferRequest copy = infer;
    absl::StatusOr<attnserve::v1::EncodeRequest> encode = EncodeFromInfer(&copy);
    if (!encode.ok()) {
      refuse(encode.status());
    } else {
      attnserve::core::EncoderSpec spec;
      spec.num_layers = 1;
      spec.d_model = 8;
      spec.num_heads = 2;
      spec.ffn_dim = 16;
      spec.vocab_size = 100;
      spec.max_positions = 64;
      AdmissionLimits limits;
      limits.max_sequence_length = 64;
      limits.max_response_bytes = 1 << 16;
      limits.max_work_bytes = 1 << 18;
      auto work = EncoderWorkFromRequest(*encode, spec, limits);
      if (!work.ok()) {
        refuse(work.status());
      } else {
        (*work)->embedding.assign((*work)->lengths.size() * spec.d_model * 4, '\0');
        if ((*work)->return_hidden) {
          (*work)->hidden.assign(
              static_cast<size_t>((*work)->tokens() * spec.d_model * 4), '\0');
        }
        attnserve::v1::EncodeResponse answer;
        FillEncodeResponse(**work, model, encode->request_id(), spec.d_model, &answer);
        inference::ModelInferResponse response;
        InferResponseFromEncode(copy, answer, &response);
        int64_t response_header_length = 0;
        const std::string body =
            InferResponseBody(response, parsed->binary_outputs, &response_header_length);
        if (response_header_length > static_cast<int64_t>(body.size())) __builtin_trap();
      }
    }
  }
  absl::StatusOr<attnserve::v1::AttendRequest> attend = AttendFromInfer(&infer);
  if (!attend.ok()) return refuse(attend.status()), 0;
  absl::StatusOr<absl::Time> deadline =
      DeadlineWithTimeout(infer, absl::InfiniteFuture());
  if (!deadline.ok()) return refuse(deadline.status()), 0;
  attnserve::core::ModelSpec spec;
  spec.d_model = 8;
  spec.num_heads = 2;
  AdmissionLimits limits;
  limits.max_sequence_length = 64;
  limits.max_response_bytes = 1 << 16;
  limits.max_work_bytes = 1 << 16;
  auto work = WorkFromRequest(*attend, spec, limits);
  if (!work.ok()) return refuse(work.status()), 0;
  // An answer of the admitted shape goes back out as the door writes it.
  attnserve::v1::AttendResponse answer;
  answer.set_model(model);
  answer.mutable_output()->set_dtype(attnserve::v1::DATA_TYPE_FP32);
  answer.mutable_output()->add_shape((*work)->tokens());
  answer.mutable_output()->add_shape(spec.d_model);
  answer.mutable_output()->mutable_raw()->assign(
      static_cast<size_t>((*work)->tokens() * spec.d_model * 4), '\0');
  inference::ModelInferResponse response;
  InferResponseFromAttend(infer, answer, &response);
  int64_t response_header_length = 0;
  const std::string body =
      InferResponseBody(response, parsed->binary_outputs, &response_header_length);
  if (response_header_length > static_cast<int64_t>(body.size())) __builtin_trap();
  return 0;
}
