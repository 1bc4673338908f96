#include "server/frontends/kserve_service.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/base/status_macros.h"
#include "server/frontends/stream_reactor.h"
#include "server/pipeline/proto_convert.h"

namespace attnserve::server {
namespace {

// The answer of a call that another thread finishes: ends `rpc`, then `reactor`.
std::function<void(const absl::Status&)> FinishLater(const RequestPipeline::Rpc& rpc,
                                                     grpc::ServerUnaryReactor* reactor) {
  return [rpc, reactor](const absl::Status& status) {
    rpc.End(status.code());
    reactor->Finish(ToGrpcStatus(status));
  };
}

}  // namespace

grpc::ServerUnaryReactor* KServeService::ServerLive(
    grpc::CallbackServerContext* /*context*/, const inference::ServerLiveRequest*,
    inference::ServerLiveResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "ServerLive");
  response->set_live(true);
  return rpc.FinishNow(absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ServerReady(
    grpc::CallbackServerContext* /*context*/, const inference::ServerReadyRequest*,
    inference::ServerReadyResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "ServerReady");
  response->set_ready(pipeline_->Ready());
  return rpc.FinishNow(absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ModelReady(
    grpc::CallbackServerContext* /*context*/, const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "ModelReady");
  // The protocol's model endpoints name their model: no default.
  response->set_ready(!request->name().empty() &&
                      pipeline_->ModelReady(request->name(), request->version()));
  return rpc.FinishNow(absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ServerMetadata(
    grpc::CallbackServerContext* /*context*/, const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "ServerMetadata");
  response->set_name("attnserve");
  response->set_version(kServerVersion);
  for (const char* extension : kExtensions) response->add_extensions(extension);
  return rpc.FinishNow(absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ModelMetadata(
    grpc::CallbackServerContext* context, const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  return AnswerForModel(
      "ModelMetadata", context, request->name(), request->version(),
      [response](const ServedModel& model) { FillModelMetadata(model, response); });
}

grpc::ServerUnaryReactor* KServeService::AnswerForModel(
    absl::string_view method, grpc::CallbackServerContext* context,
    const std::string& name, const std::string& version,
    absl::FunctionRef<void(const ServedModel&)> fill) {
  const RequestPipeline::Rpc rpc(pipeline_, method);
  if (absl::Status allowed = pipeline_->Authorize(context); !allowed.ok()) {
    return rpc.FinishNow(allowed);
  }
  const absl::StatusOr<std::shared_ptr<ServedModel>> model = FindServed(name, version);
  if (!model.ok()) return rpc.FinishNow(model.status());
  fill(**model);
  return rpc.FinishNow(absl::OkStatus());
}

absl::StatusOr<std::shared_ptr<ServedModel>> KServeService::FindServed(
    const std::string& name, const std::string& version) const {
  // The protocol's model endpoints name their model: no default.
  if (name.empty()) return absl::InvalidArgumentError("name must be set");
  return pipeline_->FindModel(name, version);
}

grpc::ServerUnaryReactor* KServeService::ModelConfig(
    grpc::CallbackServerContext* context, const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  return AnswerForModel("ModelConfig", context, request->name(), request->version(),
                        [response](const ServedModel& model) {
                          FillModelConfig(model, response->mutable_config());
                        });
}

grpc::ServerUnaryReactor* KServeService::RepositoryIndex(
    grpc::CallbackServerContext* context,
    const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "RepositoryIndex");
  if (absl::Status allowed = pipeline_->Authorize(context); !allowed.ok()) {
    return rpc.FinishNow(allowed);
  }
  for (const ModelRegistry::IndexEntry& model :
       pipeline_->RepositoryIndex(request->ready())) {
    inference::RepositoryIndexResponse::ModelIndex* entry = response->add_models();
    entry->set_name(model.name);
    entry->set_version(model.version);
    entry->set_state(model.state);
    entry->set_reason(model.reason);
  }
  return rpc.FinishNow(absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::RepositoryModelLoad(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse* /*response*/) {
  const RequestPipeline::Rpc rpc(pipeline_, "RepositoryModelLoad");
  if (absl::Status allowed = pipeline_->Authorize(context); !allowed.ok()) {
    return rpc.FinishNow(allowed);
  }
  absl::StatusOr<std::optional<std::string>> config = LoadConfigFromParameters(*request);
  if (!config.ok()) return rpc.FinishNow(config.status());
  // Loading reads files and warms the model: seconds, on the registry's control thread,
  // not this gRPC thread (other calls keep it).
  grpc::ServerUnaryReactor* reactor = pipeline_->NewUnaryReactor();
  pipeline_->registry()->LoadInBackground(request->model_name(), *std::move(config),
                                          FinishLater(rpc, reactor));
  return reactor;
}

grpc::ServerUnaryReactor* KServeService::RepositoryModelUnload(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse* /*response*/) {
  const RequestPipeline::Rpc rpc(pipeline_, "RepositoryModelUnload");
  if (absl::Status allowed = pipeline_->Authorize(context); !allowed.ok()) {
    return rpc.FinishNow(allowed);
  }
  if (absl::Status checked = CheckUnloadParameters(*request); !checked.ok()) {
    return rpc.FinishNow(checked);
  }
  // Waits for a load in progress: on the control thread too.
  grpc::ServerUnaryReactor* reactor = pipeline_->NewUnaryReactor();
  pipeline_->registry()->UnloadInBackground(request->model_name(),
                                            FinishLater(rpc, reactor));
  return reactor;
}

grpc::ServerUnaryReactor* KServeService::ModelStatistics(
    grpc::CallbackServerContext* context,
    const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "ModelStatistics");
  if (absl::Status allowed = pipeline_->Authorize(context); !allowed.ok()) {
    return rpc.FinishNow(allowed);
  }
  std::vector<std::shared_ptr<const ServedModel>> models;
  if (request->name().empty() && request->version().empty()) {
    models = pipeline_->registry()->models();
  } else {
    const absl::StatusOr<std::shared_ptr<ServedModel>> model =
        FindServed(request->name(), request->version());
    if (!model.ok()) {
      return rpc.FinishNow(model.status());
    }
    models.push_back(*model);
  }
  FillModelStatistics(*metrics_, models, response);
  return rpc.FinishNow(absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeService::ModelInfer(
    grpc::CallbackServerContext* context, const inference::ModelInferRequest* request,
    inference::ModelInferResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "ModelInfer");
  absl::StatusOr<std::shared_ptr<Request>> begun =
      pipeline_->Begin(context, "inference.GRPCInferenceService/ModelInfer");
  if (!begun.ok()) return rpc.FinishNow(begun.status());
  if (absl::Status found =
          (*begun)->Find(request->model_name(), request->model_version());
      !found.ok()) {
    return rpc.FinishNow(found);
  }
  // One copy of the request (gRPC owns `request`): its raw inputs then move on.
  auto infer = std::make_shared<inference::ModelInferRequest>(*request);
  auto cancellation = std::make_shared<Cancellation>();
  grpc::ServerUnaryReactor* reactor = pipeline_->NewUnaryReactor(cancellation);
  SubmitInfer(
      *pipeline_, *begun, infer, CallDeadline(context), cancellation,
      [rpc, response, reactor, context](const absl::Status& status,
                                        inference::ModelInferResponse result) {
        if (status.ok()) {
          response->Swap(&result);
          // The same figures as trailing metadata, in microseconds.
          for (const char* name : {kTokenizeTimeUs, kQueueTimeUs, kComputeTimeUs}) {
            const auto it = response->parameters().find(name);
            if (it == response->parameters().end()) continue;
            std::string key = absl::StrCat("x-", name);
            std::replace(key.begin(), key.end(), '_', '-');
            context->AddTrailingMetadata(key, std::to_string(it->second.int64_param()));
          }
        }
        rpc.End(status.code());
        reactor->Finish(ToGrpcStatus(status));
      });
  return reactor;
}

namespace {

// inference.GRPCInferenceService/ModelStreamInfer on the shared stream reactor.
struct ModelStreamInferProtocol {
  using Read = inference::ModelInferRequest;
  using Write = inference::ModelStreamInferResponse;
  static constexpr char kMethod[] = "ModelStreamInfer";
  static void Submit(RequestPipeline& pipeline, const std::shared_ptr<Request>& request,
                     const std::shared_ptr<Read>& read, absl::Time call_deadline,
                     const std::shared_ptr<Cancellation>& cancellation,
                     const std::function<void(absl::Status, Write)>& answer) {
    const auto reply = [read, answer](absl::Status status,
                                      inference::ModelInferResponse response) {
      Write message;
      if (status.ok()) {
        *message.mutable_infer_response() = std::move(response);
      } else {
        message.set_error_message(absl::StrCat(absl::StatusCodeToString(status.code()),
                                               ": ", status.message()));
        message.mutable_infer_response()->set_model_name(read->model_name());
        message.mutable_infer_response()->set_id(read->id());
      }
      answer(std::move(status), std::move(message));
    };
    if (absl::Status found = request->Find(read->model_name(), read->model_version());
        !found.ok()) {
      return reply(found, {});
    }
    // SubmitInfer moves only the raw inputs out of `read`: its name and id stay for an
    // error's answer.
    SubmitInfer(pipeline, request, read, call_deadline, cancellation, reply);
  }
};

}  // namespace

grpc::ServerBidiReactor<inference::ModelInferRequest,
                        inference::ModelStreamInferResponse>*
KServeService::ModelStreamInfer(grpc::CallbackServerContext* context) {
  if (absl::Status allowed = pipeline_->Authorize(context); !allowed.ok()) {
    RequestPipeline::Rpc(pipeline_, "ModelStreamInfer").End(allowed.code());
    return new RefusedStream<inference::ModelInferRequest,
                             inference::ModelStreamInferResponse>(pipeline_,
                                                                  ToGrpcStatus(allowed));
  }
  return new StreamReactor<ModelStreamInferProtocol>(pipeline_, context);
}

}  // namespace attnserve::server
