#include "server/frontends/attention_service.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/frontends/embeddings_api.h"
#include "server/frontends/rerank_api.h"
#include "server/frontends/stream_reactor.h"
#include "server/pipeline/proto_convert.h"

namespace attnserve::server {

namespace {

// A call's request with its model looked up (auth, drain, then `model`), or the
// refusal, already counted, to finish the call with.
absl::StatusOr<std::shared_ptr<Request>> BeginCall(
    const RequestPipeline& pipeline, const grpc::CallbackServerContext* context,
    absl::string_view method, const std::string& model) {
  absl::StatusOr<std::shared_ptr<Request>> request =
      pipeline.Begin(context, absl::StrCat("attnserve.v1.AttentionService/", method));
  if (!request.ok()) return request.status();
  if (absl::Status found = (*request)->Find(model); !found.ok()) return found;
  return request;
}

// A rerank's answer from its pairs' scores [n, 1]: best first, cut to top_n.
void FillRerankResponse(const v1::RerankRequest& request,
                        const v1::EncodeResponse& result, v1::RerankResponse* response) {
  std::vector<float> scores(result.scores().raw().size() / sizeof(float));
  if (!scores.empty()) {
    std::memcpy(scores.data(), result.scores().raw().data(),
                scores.size() * sizeof(float));
  }
  for (const int64_t index : RankScores(scores, request.top_n())) {
    v1::RerankResult* ranked = response->add_results();
    ranked->set_index(static_cast<int32_t>(index));
    ranked->set_score(scores[static_cast<size_t>(index)]);
    if (request.return_documents()) {
      ranked->set_document(request.documents(static_cast<int>(index)));
    }
  }
  response->set_model(result.model());
  response->set_model_version(result.model_version());
  response->set_request_id(result.request_id());
  int64_t tokens = 0;
  for (const int64_t length : result.lengths()) tokens += length;
  response->set_tokens(tokens);
  response->set_truncated(result.truncated());
  response->set_queue_time_us(result.queue_time_us());
  response->set_compute_time_us(result.compute_time_us());
}

}  // namespace

grpc::ServerUnaryReactor* AttentionService::Attend(grpc::CallbackServerContext* context,
                                                   const v1::AttendRequest* request,
                                                   v1::AttendResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "Attend");
  absl::StatusOr<std::shared_ptr<Request>> begun =
      BeginCall(*pipeline_, context, "Attend", request->model());
  if (!begun.ok()) return rpc.FinishNow(begun.status());
  auto cancellation = std::make_shared<Cancellation>();
  grpc::ServerUnaryReactor* reactor = pipeline_->NewUnaryReactor(cancellation);
  pipeline_->Submit(
      *begun, *request, CallDeadline(context), cancellation,
      [rpc, reactor, response](const absl::Status& status, v1::AttendResponse result) {
        if (status.ok()) response->Swap(&result);
        rpc.End(status.code());
        reactor->Finish(ToGrpcStatus(status));
      });
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::Encode(grpc::CallbackServerContext* context,
                                                   const v1::EncodeRequest* request,
                                                   v1::EncodeResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "Encode");
  absl::StatusOr<std::shared_ptr<Request>> begun =
      BeginCall(*pipeline_, context, "Encode", request->model());
  if (!begun.ok()) return rpc.FinishNow(begun.status());
  auto cancellation = std::make_shared<Cancellation>();
  grpc::ServerUnaryReactor* reactor = pipeline_->NewUnaryReactor(cancellation);
  pipeline_->SubmitEncode(
      *begun, *request, CallDeadline(context), cancellation,
      [rpc, reactor, response](const absl::Status& status, v1::EncodeResponse result) {
        if (status.ok()) response->Swap(&result);
        rpc.End(status.code());
        reactor->Finish(ToGrpcStatus(status));
      });
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::Rerank(grpc::CallbackServerContext* context,
                                                   const v1::RerankRequest* request,
                                                   v1::RerankResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "Rerank");
  absl::StatusOr<std::shared_ptr<Request>> begun =
      BeginCall(*pipeline_, context, "Rerank", request->model());
  if (!begun.ok()) return rpc.FinishNow(begun.status());
  const auto refuse = [&](const absl::Status& status) {
    (*begun)->Finish(status);
    return rpc.FinishNow(status);
  };
  // What the rerank doors check, with the same words: the model ranks, the documents
  // fit the limit, top_n is not negative.
  if (absl::Status ranks = CheckReranker(*(*begun)->model(), "Encode with text_pair");
      !ranks.ok()) {
    return refuse(ranks);
  }
  const int documents = request->documents_size();
  if (documents == 0) {
    return refuse(absl::InvalidArgumentError("documents must not be empty"));
  }
  if (documents > kMaxRerankDocuments) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("documents holds ", documents, " entries, over the limit of ",
                     kMaxRerankDocuments, " per request: send fewer")));
  }
  if (request->top_n() < 0) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "top_n must be 0 (every document) or positive, got ", request->top_n())));
  }
  // The pairs, as every rerank door makes them: (query, documents[i]).
  v1::EncodeRequest encode;
  encode.set_model(request->model());
  encode.set_request_id(request->request_id());
  encode.set_truncate(request->truncate());
  encode.set_raw_scores(request->raw_scores());
  for (const std::string& document : request->documents()) {
    encode.add_text(request->query());
    encode.add_text_pair(document);
  }
  auto cancellation = std::make_shared<Cancellation>();
  grpc::ServerUnaryReactor* reactor = pipeline_->NewUnaryReactor(cancellation);
  pipeline_->SubmitEncode(
      *begun, encode, CallDeadline(context), cancellation,
      [rpc, reactor, request, response](const absl::Status& status,
                                        const v1::EncodeResponse& result) {
        if (status.ok()) {
          FillRerankResponse(*request, result, response);
        }
        rpc.End(status.code());
        reactor->Finish(ToGrpcStatus(status));
      });
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::HeadStatistics(
    grpc::CallbackServerContext* context, const v1::HeadStatisticsRequest* request,
    v1::HeadStatisticsResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "HeadStatistics");
  absl::StatusOr<std::shared_ptr<Request>> begun =
      BeginCall(*pipeline_, context, "HeadStatistics", request->model());
  if (!begun.ok()) return rpc.FinishNow(begun.status());
  auto cancellation = std::make_shared<Cancellation>();
  // An encoder measures its heads over Encode's inputs, admitted as Encode's are.
  if ((*begun)->model()->is_encoder() || request->has_encode()) {
    grpc::ServerUnaryReactor* reactor = pipeline_->NewUnaryReactor(cancellation);
    v1::EncodeRequest encode = request->encode();
    encode.set_model(request->model());
    pipeline_->SubmitEncode(
        *begun, encode, CallDeadline(context), cancellation,
        [rpc, reactor, response](const absl::Status& status, const v1::EncodeResponse&) {
          if (!status.ok()) response->Clear();
          rpc.End(status.code());
          reactor->Finish(ToGrpcStatus(status));
        },
        response, request->return_attention());
    return reactor;
  }
  if (request->return_attention()) {
    const absl::Status refused = absl::InvalidArgumentError(absl::StrCat(
        "return_attention is an encoder's option; model \"", (*begun)->model()->name,
        "\" is an attention layer: Attend with return_attention gives its weights"));
    (*begun)->Finish(refused);
    return rpc.FinishNow(refused);
  }
  grpc::ServerUnaryReactor* reactor = pipeline_->NewUnaryReactor(cancellation);
  // The same inputs as an Attend with return_attention, so that validation and
  // admission (field names, limits, budgets) are the same. Copied: this is an
  // analysis call, not the serving path.
  auto attend = std::make_shared<v1::AttendRequest>();
  attend->set_model(request->model());
  *attend->mutable_query() = request->query();
  if (request->has_memory()) *attend->mutable_memory() = request->memory();
  attend->set_causal(request->causal());
  attend->set_return_attention(true);
  pipeline_->Submit(
      *begun, *attend, CallDeadline(context), cancellation,
      [rpc, reactor, response, attend](const absl::Status& status,
                                       const v1::AttendResponse&) {
        if (!status.ok()) response->Clear();
        rpc.End(status.code());
        reactor->Finish(ToGrpcStatus(status));
      },
      response);
  return reactor;
}

grpc::ServerBidiReactor<v1::AttendStreamRequest, v1::AttendStreamResponse>*
AttentionService::AttendStream(grpc::CallbackServerContext* context) {
  if (absl::Status allowed = pipeline_->Authorize(context); !allowed.ok()) {
    RequestPipeline::Rpc(pipeline_, "AttendStream").End(allowed.code());
    return new RefusedStream<v1::AttendStreamRequest, v1::AttendStreamResponse>(
        pipeline_, ToGrpcStatus(allowed));
  }
  return new StreamReactor<AttendStreamProtocol>(pipeline_, context);
}

grpc::ServerUnaryReactor* AttentionService::ListModels(
    grpc::CallbackServerContext* context, const v1::ListModelsRequest* /*request*/,
    v1::ListModelsResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "ListModels");
  if (absl::Status allowed = pipeline_->Authorize(context); !allowed.ok()) {
    return rpc.FinishNow(allowed);
  }
  for (const auto& model : pipeline_->registry()->models()) {
    *response->add_models() = model->info;
  }
  return rpc.FinishNow(absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::GetModel(grpc::CallbackServerContext* context,
                                                     const v1::GetModelRequest* request,
                                                     v1::GetModelResponse* response) {
  const RequestPipeline::Rpc rpc(pipeline_, "GetModel");
  if (absl::Status allowed = pipeline_->Authorize(context); !allowed.ok()) {
    return rpc.FinishNow(allowed);
  }
  // GetModel names its model: no default.
  if (request->name().empty()) {
    return rpc.FinishNow(absl::InvalidArgumentError("name must be set"));
  }
  absl::StatusOr<std::shared_ptr<ServedModel>> model =
      pipeline_->FindModel(request->name());
  if (!model.ok()) return rpc.FinishNow(model.status());
  *response->mutable_model() = (*model)->info;
  return rpc.FinishNow(absl::OkStatus());
}

}  // namespace attnserve::server
