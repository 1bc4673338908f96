// KServeService: the KServe v2 / Open Inference Protocol's gRPC service
// (inference.GRPCInferenceService) on attnserve's port, over the same models and
// batchers as attnserve's own API: ModelInfer becomes an AttendRequest and goes through
// AttentionService::Submit (same validation, admission, batching and metrics).
#ifndef ATTNSERVE_SERVER_KSERVE_SERVICE_H_
#define ATTNSERVE_SERVER_KSERVE_SERVICE_H_

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "inference/grpc_service.grpc.pb.h"
#include "server/attention_service.h"
#include "server/model_registry.h"
#include "server/server_metrics.h"

namespace attnserve::server {

// The version attnserve reports (ServerMetadata; the image's label says the same).
inline constexpr char kServerVersion[] = "0.1.0";
// The protocol extensions attnserve implements, as ServerMetadata lists them
// (Triton's names): ModelConfig, ModelStatistics, request parameters.
inline constexpr const char* kExtensions[] = {"model_configuration", "statistics",
                                              "parameters"};
// The one version each model is served as.
inline constexpr char kModelVersion[] = "1";

// A ModelInferRequest as attnserve's AttendRequest: inputs "query" (and "memory"),
// FP32 or BF16, raw or typed (FP32) contents; parameters "causal", "return_attention"
// (bool) and "head_mask" (string "1,0,0.5,..."); requesting output "attention" asks for
// the weights. InvalidArgument naming the field for anything else; NotFound for a
// model version other than kModelVersion.
absl::StatusOr<v1::AttendRequest> AttendFromInfer(
    const inference::ModelInferRequest& infer);

// The answer as a ModelInferResponse: "output" (and "attention" when computed), in the
// requested subset when the request listed outputs, as raw_output_contents. Moves the
// tensors' bytes out of `attend`.
void InferResponseFromAttend(const inference::ModelInferRequest& infer,
                             v1::AttendResponse& attend,
                             inference::ModelInferResponse* response);

// The model's metadata as the protocol states it (ModelMetadata, and HTTP GET
// /v2/models/{m}): inputs query and memory, outputs output and attention.
void FillModelMetadata(const ServedModel& model,
                       inference::ModelMetadataResponse* response);

// The model's configuration as Triton's ModelConfig (minimal): inputs query and memory
// (optional), outputs output and attention, FP32 with -1 for free dimensions,
// max_batch_size 0, backend "attnserve".
void FillModelConfig(const ServedModel& model, inference::ModelConfig* config);

// Thread-safe. Does not own the registry or the attention service, which must outlive
// every call. With tokens configured (AttentionService::Options::auth), ModelMetadata
// and ModelInfer need one; the health and readiness RPCs stay open for probes.
class KServeService final : public inference::GRPCInferenceService::CallbackService {
 public:
  // `metrics` (not owned, outliving every call) answers ModelStatistics.
  KServeService(ModelRegistry* registry, AttentionService* attention,
                const ServerMetrics* metrics);

  // ServerReady and ModelReady answer false from now on. Idempotent.
  void StartDraining() { draining_.store(true, std::memory_order_release); }

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const inference::ServerLiveRequest* request,
                                       inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(
      grpc::CallbackServerContext* context, const inference::ServerReadyRequest* request,
      inference::ServerReadyResponse* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(
      grpc::CallbackServerContext* context,
      const inference::ServerMetadataRequest* request,
      inference::ServerMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(
      grpc::CallbackServerContext* context,
      const inference::ModelMetadataRequest* request,
      inference::ModelMetadataResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override;
  // The models' cumulative figures (all models when the name is empty); NOT_FOUND for
  // a model or version not served.
  grpc::ServerUnaryReactor* ModelStatistics(
      grpc::CallbackServerContext* context,
      const inference::ModelStatisticsRequest* request,
      inference::ModelStatisticsResponse* response) override;
  // FillModelConfig for one model; NOT_FOUND for a model or version not served.
  grpc::ServerUnaryReactor* ModelConfig(
      grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
      inference::ModelConfigResponse* response) override;
  // Every served model, version 1, READY (UNAVAILABLE while draining; none when
  // `ready` is asked for then).
  grpc::ServerUnaryReactor* RepositoryIndex(
      grpc::CallbackServerContext* context,
      const inference::RepositoryIndexRequest* request,
      inference::RepositoryIndexResponse* response) override;
  // Each request as ModelInfer, answered in order on the stream: a response holds the
  // result, or error_message ("INVALID_ARGUMENT: ..."); the stream itself ends OK, or
  // UNAVAILABLE when the server drains (every request read before is answered).
  grpc::ServerBidiReactor<inference::ModelInferRequest,
                          inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* context) override;

 private:
  // The served model `name` at `version` (empty: the current one); NOT_FOUND naming
  // both otherwise.
  absl::StatusOr<const ServedModel*> FindServed(const std::string& name,
                                                const std::string& version) const;

  ModelRegistry* const registry_;
  AttentionService* const attention_;
  const ServerMetrics* const metrics_;
  std::atomic<bool> draining_{false};
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_KSERVE_SERVICE_H_
