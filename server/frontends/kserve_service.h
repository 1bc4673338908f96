// KServeService: the KServe v2 / Open Inference Protocol's gRPC front door
// (inference.GRPCInferenceService) on attnserve's port: ModelInfer becomes an
// AttendRequest (server/frontends/kserve_convert.h) and goes through the RequestPipeline,
// as every door's requests do.
#ifndef ATTNSERVE_SERVER_FRONTENDS_KSERVE_SERVICE_H_
#define ATTNSERVE_SERVER_FRONTENDS_KSERVE_SERVICE_H_

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "inference/grpc_service.grpc.pb.h"
#include "server/frontends/kserve_convert.h"
#include "server/observability/server_metrics.h"
#include "server/pipeline/request_pipeline.h"

namespace attnserve::server {

// Thread-safe. With tokens configured (RequestPipeline::Options::auth), every RPC but
// the health and readiness ones needs one; those stay open for probes.
class KServeService final : public inference::GRPCInferenceService::CallbackService {
 public:
  // `pipeline` and `metrics` (which answers ModelStatistics) are not owned and must
  // outlive every call. Readiness answers false once the pipeline drains.
  KServeService(RequestPipeline* pipeline, const ServerMetrics* metrics)
      : pipeline_(pipeline), metrics_(metrics) {}

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
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* context,
      const inference::RepositoryModelLoadRequest* request,
      inference::RepositoryModelLoadResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* context,
      const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse* response) override;
  // Each request as ModelInfer, answered in order on the stream: a response holds the
  // result, or error_message ("INVALID_ARGUMENT: ..."); the stream itself ends OK, or
  // UNAVAILABLE when the server drains (every request read before is answered).
  grpc::ServerBidiReactor<inference::ModelInferRequest,
                          inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* context) override;

 private:
  // The served model `name` (which must be set) at `version` (empty: the current
  // one); NOT_FOUND in the pipeline's words otherwise.
  absl::StatusOr<std::shared_ptr<ServedModel>> FindServed(
      const std::string& name, const std::string& version) const;
  // A call about one model (`method` a string literal): checks the token, finds the
  // model, lets `fill` write the response, and finishes the call.
  grpc::ServerUnaryReactor* AnswerForModel(
      absl::string_view method, grpc::CallbackServerContext* context,
      const std::string& name, const std::string& version,
      absl::FunctionRef<void(const ServedModel&)> fill);

  RequestPipeline* const pipeline_;
  const ServerMetrics* const metrics_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FRONTENDS_KSERVE_SERVICE_H_
