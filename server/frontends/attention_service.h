// AttentionService: the attnserve.v1.AttentionService front door (gRPC callback API).
// Each handler hands its request to the RequestPipeline and returns at once; the
// batch's completion finishes the call. No handler blocks a gRPC thread on compute.
#ifndef ATTNSERVE_SERVER_FRONTENDS_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_FRONTENDS_ATTENTION_SERVICE_H_

#include "attnserve/v1/attention.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/pipeline/request_pipeline.h"

namespace attnserve::server {

// Thread-safe.
class AttentionService final : public v1::AttentionService::CallbackService {
 public:
  // `pipeline` (not owned) must outlive every call.
  explicit AttentionService(RequestPipeline* pipeline) : pipeline_(pipeline) {}

  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* context,
                                   const v1::AttendRequest* request,
                                   v1::AttendResponse* response) override;
  grpc::ServerBidiReactor<v1::AttendStreamRequest, v1::AttendStreamResponse>*
  AttendStream(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* request,
                                     v1::GetModelResponse* response) override;
  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const v1::EncodeRequest* request,
                                   v1::EncodeResponse* response) override;
  grpc::ServerUnaryReactor* Rerank(grpc::CallbackServerContext* context,
                                   const v1::RerankRequest* request,
                                   v1::RerankResponse* response) override;
  grpc::ServerUnaryReactor* HeadStatistics(grpc::CallbackServerContext* context,
                                           const v1::HeadStatisticsRequest* request,
                                           v1::HeadStatisticsResponse* response) override;

 private:
  RequestPipeline* const pipeline_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FRONTENDS_ATTENTION_SERVICE_H_
