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

// Hooks for metrics; every member optional. Called on gRPC or batcher threads, never
// under the service's locks; they must be thread-safe and quick.
struct ServiceObserver {
  // An RPC began / ended. `method` is the RPC's name ("Attend", "AttendStream",
  // "ListModels", "GetModel"); `elapsed` runs from the handler's start to Finish.
  std::function<void(absl::string_view method)> on_rpc_started;
  std::function<void(absl::string_view method, absl::StatusCode code,
                     absl::Duration elapsed)>
      on_rpc_handled;
  // One attention request (an Attend call or one stream message) was received /
  // answered. `model` is the served model's name, or "" when the request named an
  // unknown model; `tokens` counts computed query tokens (0 unless OK).
  std::function<void(const std::string& model)> on_request_started;
  std::function<void(const std::string& model, const absl::Status& status,
                     absl::Duration elapsed, int64_t tokens)>
      on_request_finished;
};

// Thread-safe. Does not own the registry, which must outlive every call.
class AttentionService final : public v1::AttentionService::CallbackService {
 public:
  explicit AttentionService(ModelRegistry* registry, ServiceObserver observer = {});

  // From now on new calls and stream messages are answered UNAVAILABLE; calls already
  // queued are computed. Idempotent.
  void StartDraining() { draining_.store(true, std::memory_order_release); }

  const ServiceObserver& observer() const { return observer_; }

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
  const ServiceObserver observer_;
  std::atomic<bool> draining_{false};
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
