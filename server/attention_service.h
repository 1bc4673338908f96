// AttentionService: the gRPC callback implementation of attnserve.v1.AttentionService.
// Handlers validate, enqueue into the model's batcher and return at once; the batch's
// completion finishes the call. No handler blocks a gRPC thread on compute.
#ifndef ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_ATTENTION_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/model_registry.h"

namespace attnserve::server {

// Called once per finished Attend call or stream message (for metrics): the model
// name ("" when unknown), the final status and the time since the handler started.
using CallObserver =
    std::function<void(const std::string& model, const absl::Status& status,
                       absl::Duration elapsed, int64_t tokens)>;

// Thread-safe. Does not own the registry, which must outlive every call.
class AttentionService final : public v1::AttentionService::CallbackService {
 public:
  explicit AttentionService(ModelRegistry* registry, CallObserver observer = nullptr);

  // From now on new calls and stream messages are answered UNAVAILABLE; calls already
  // queued are computed. Idempotent.
  void StartDraining() { draining_.store(true, std::memory_order_release); }

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

  // Validates `request` and enqueues it; `done` gets the status and, when OK, the
  // filled response; it runs on a batcher thread, or inline when the request is
  // rejected before queueing. `cancelled` may be null.
  void Submit(const v1::AttendRequest& request, absl::Time deadline,
              std::shared_ptr<const std::atomic<bool>> cancelled,
              std::function<void(absl::Status, v1::AttendResponse)> done);

 private:
  ModelRegistry* const registry_;
  CallObserver observer_;
  std::atomic<bool> draining_{false};
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
