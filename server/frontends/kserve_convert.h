// The KServe v2 / Open Inference Protocol's messages as attnserve's, shared by both
// KServe doors (gRPC: KServeService; HTTP: KServeHttp): an infer request as an
// AttendRequest, the answer as an infer response, a model's metadata and config.
#ifndef ATTNSERVE_SERVER_FRONTENDS_KSERVE_CONVERT_H_
#define ATTNSERVE_SERVER_FRONTENDS_KSERVE_CONVERT_H_

#include <functional>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "attnserve/v1/attention.pb.h"
#include "inference/grpc_service.pb.h"
#include "server/models/model_registry.h"
#include "server/observability/server_metrics.h"
#include "server/pipeline/request_pipeline.h"

namespace attnserve::server {

// The version attnserve reports (ServerMetadata; the image's label says the same).
inline constexpr char kServerVersion[] = "0.1.0";
// Response parameters every infer answer carries (int64_param, microseconds): decoding
// and tokenizing, waiting in the queue, the batch's compute.
inline constexpr char kTokenizeTimeUs[] = "tokenize_time_us";
inline constexpr char kQueueTimeUs[] = "queue_time_us";
inline constexpr char kComputeTimeUs[] = "compute_time_us";
// The protocol extensions attnserve implements, as ServerMetadata lists them
// (Triton's names): ModelConfig, ModelStatistics, request parameters.
inline constexpr const char* kExtensions[] = {"model_configuration", "statistics",
                                              "parameters", "model_repository"};

// A ModelInferRequest as attnserve's AttendRequest: inputs "query" (and "memory"),
// FP32 or BF16, raw or typed (FP32) contents; parameters "causal", "return_attention"
// (bool), "head_mask" (string "1,0,0.5,...") and "timeout" (see DeadlineWithTimeout);
// requesting output "attention" asks for the weights. InvalidArgument naming the field
// for anything else. The model name and version are the caller's to check
// (RequestPipeline::FindModel; SubmitInfer does). The raw input bytes move out of
// `*infer`; the rest of it (id, outputs) stays.
absl::StatusOr<v1::AttendRequest> AttendFromInfer(inference::ModelInferRequest* infer);

// A ModelInferRequest for an encoder model as an EncodeRequest: inputs "input_ids",
// "attention_mask", "token_type_ids" (INT64 or INT32, raw or typed contents),
// "hidden_states" (FP32 or BF16), or BYTES texts: "text" [n] (with "text_pair" [n] for
// a classification model's pairs), or a rerank's "query" [1] and "documents" [n] (n
// pairs, at most kMaxRerankDocuments); requesting output "hidden" asks for the last
// hidden state. Parameters: "timeout", "truncate", "normalize", "raw_scores" (bool),
// "dimensions" (int64), "head_mask", "prompt_name", "embedding_type" (string: the
// embedding's levels, see InferResponseFromEncode). InvalidArgument naming the field
// for anything else. Raw input bytes move out of `*infer`.
absl::StatusOr<v1::EncodeRequest> EncodeFromInfer(inference::ModelInferRequest* infer);

// The answer of an encoder as a ModelInferResponse: "embedding" FP32 [n, d] (with the
// "embedding_type" parameter Cohere's levels, as /v2/embed quantizes them: "int8" INT8
// and "uint8" UINT8 [n, d], "binary" INT8 and "ubinary" UINT8 bit-packed [n,
// ceil(d / 8)]), or a
// classification model's "scores" FP32 [n, num_labels] ([n] for ranked "documents")
// (when no outputs are listed, or it is), "hidden" FP32 [tokens, d] when asked,
// "lengths" INT64 [n] when listed. Moves the tensors' bytes out of `encode`.
void InferResponseFromEncode(const inference::ModelInferRequest& infer,
                             v1::EncodeResponse& encode,
                             inference::ModelInferResponse* response);

// One KServe infer request through the pipeline, whatever the model's kind, for
// `request`, whose model the door looked up (Request::Find with the request's name and
// version): the "timeout" parameter, the conversion (AttendFromInfer or
// EncodeFromInfer; raw input bytes move out of `*infer`), and the submission to that
// same model. `done` gets the status and the
// response, exactly once: on a batcher thread, or inline when refused before queueing;
// every refusal is counted as the request's answer. `infer` is kept alive until then.
// REQUIRES: request->Find returned OK.
void SubmitInfer(
    RequestPipeline& pipeline, const std::shared_ptr<Request>& request,
    const std::shared_ptr<inference::ModelInferRequest>& infer, absl::Time call_deadline,
    const std::shared_ptr<Cancellation>& cancellation,
    const std::function<void(absl::Status, inference::ModelInferResponse)>& done);

// Sets the three timing parameters on `response`.
void SetTimingParameters(int64_t tokenize_us, int64_t queue_us, int64_t compute_us,
                         inference::ModelInferResponse* response);
// TEI's timing header lines, whole milliseconds as TEI writes them:
// "x-tokenization-time: 0\r\nx-queue-time: 3\r\nx-inference-time: 11\r\n".
std::string TimingHeaders(int64_t tokenize_us, int64_t queue_us, int64_t compute_us);
// The same from `response`'s timing parameters (0 for one it lacks).
std::string TimingHeaders(const inference::ModelInferResponse& response);

// `deadline`, or sooner when the request's "timeout" parameter (Triton's schedule
// policy: int64 microseconds from now, 0 = none) ends first. InvalidArgument for a
// timeout that is not a non-negative int64_param.
absl::StatusOr<absl::Time> DeadlineWithTimeout(const inference::ModelInferRequest& infer,
                                               absl::Time deadline);

// The answer as a ModelInferResponse: "output" (and "attention" when computed), in the
// requested subset when the request listed outputs, as raw_output_contents. Moves the
// tensors' bytes out of `attend`.
void InferResponseFromAttend(const inference::ModelInferRequest& infer,
                             v1::AttendResponse& attend,
                             inference::ModelInferResponse* response);

// The model's metadata as the protocol states it (ModelMetadata, and HTTP GET
// /v2/models/{m}): inputs query and memory, outputs output and attention; an
// encoder's inputs input_ids, attention_mask, token_type_ids, hidden_states and outputs
// embedding, hidden, lengths.
void FillModelMetadata(const ServedModel& model,
                       inference::ModelMetadataResponse* response);

// The models' cumulative figures as Triton's ModelStatistics states them (both KServe
// doors answer with them; perf_analyzer reads them for its server-side figures).
void FillModelStatistics(const ServerMetrics& metrics,
                         absl::Span<const std::shared_ptr<const ServedModel>> models,
                         inference::ModelStatisticsResponse* response);

// RepositoryModelLoad's parameters: "config" (a string_param, the model's ModelConfig as
// JSON, returned) or none; InvalidArgument naming any other or a wrong type.
absl::StatusOr<std::optional<std::string>> LoadConfigFromParameters(
    const inference::RepositoryModelLoadRequest& request);
// RepositoryModelUnload's parameters: only "unload_dependents" (a bool_param, which
// tritonclient always sends; attnserve's models have no dependents).
absl::Status CheckUnloadParameters(
    const inference::RepositoryModelUnloadRequest& request);

// The model's configuration as Triton's ModelConfig (minimal): inputs query and memory
// (optional), outputs output and attention, FP32 with -1 for free dimensions,
// max_batch_size 0, backend "attnserve"; an encoder's tensors as FillModelMetadata's,
// every input optional (input_ids or hidden_states is needed).
void FillModelConfig(const ServedModel& model, inference::ModelConfig* config);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FRONTENDS_KSERVE_CONVERT_H_
