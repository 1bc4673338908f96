// AttentionService: the gRPC callback implementation of attnserve.v1.AttentionService.
// Handlers validate, enqueue into the model's batcher and return at once; the batch's
// completion finishes the call. No handler blocks a gRPC thread on compute.
#ifndef ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_ATTENTION_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/auth.h"
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

// An open bidirectional stream, as the service tracks it for draining
// (server/stream_reactor.h). Thread-safe.
class OpenStream {
 public:
  virtual ~OpenStream() = default;
  // Keeps the stream alive until the matching Unref.
  virtual void Ref() = 0;
  virtual void Unref() = 0;
  // Stops reading; the stream answers what it holds and ends with UNAVAILABLE.
  virtual void Drain() = 0;
};

// The call's deadline (InfiniteFuture when it has none).
absl::Time CallDeadline(const grpc::CallbackServerContext* context);

// Thread-safe. Does not own the registry, which must outlive every call.
class AttentionService final : public v1::AttentionService::CallbackService {
 public:
  struct Options {
    // Largest message the server sends (its gRPC max send size); a request whose
    // response could be larger is refused with INVALID_ARGUMENT before any work.
    // Range [1024, 2^31 - 1].
    int64_t max_response_bytes = 64 << 20;
    // When set, every call but health checks needs "authorization: Bearer <token>"
    // metadata with a valid token (else UNAUTHENTICATED). Not owned.
    TokenAuthenticator* auth = nullptr;
  };

  AttentionService(ModelRegistry* registry, const Options& options,
                   ServiceObserver observer = {});
  ~AttentionService() override;

  // Open streams stop reading, answer the messages they already hold, and end with
  // UNAVAILABLE; streams opened later end at once. Unary calls are not affected (see
  // StartDraining). Does not block. Idempotent.
  void DrainStreams();

  // From now on new calls are answered UNAVAILABLE, before any work; calls already
  // queued, and messages that open streams have read, are computed. Also drains
  // streams. Idempotent.
  void StartDraining();

  // Open calls: every call of this server's services (this one's and the KServe
  // service's) counts from its handler's start until gRPC's OnDone, by which time its
  // answer has been handed to the transport. CallOpened/CallClosed are for reactors;
  // every reactor this server returns calls each once.
  void CallOpened();
  void CallClosed();
  // Blocks until no call is open or `deadline` passes; true when none is open.
  bool AwaitNoOpenCalls(absl::Time deadline);
  int64_t open_calls() const;
  // A reactor for a unary call that is finished from elsewhere (a batcher callback) or
  // at once: it counts as an open call until its OnDone, then deletes itself.
  grpc::ServerUnaryReactor* NewUnaryReactor();

  const ServiceObserver& observer() const { return observer_; }
  // OK when the call carries a valid token (or no tokens are configured).
  absl::Status Authorize(const grpc::CallbackServerContext* context) const;

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
  grpc::ServerUnaryReactor* HeadStatistics(grpc::CallbackServerContext* context,
                                           const v1::HeadStatisticsRequest* request,
                                           v1::HeadStatisticsResponse* response) override;

  // Validates `request` and enqueues it; `done` gets the status and, when OK, the
  // filled response; it runs on a batcher thread, or inline when the request is
  // rejected before queueing. `cancelled` may be null. `request` must stay alive until
  // `done` has run: the queued work reads its tensor bytes in place.
  // With `statistics` (kept alive by the caller until `done`), the request measures the
  // model's heads (AttentionWork::head_statistics) into it instead, and `done` gets an
  // empty response.
  // Once draining has begun (StartDraining) a call's request is refused UNAVAILABLE,
  // while a message of an open stream is still computed: the stream was accepted
  // before, and it stops reading instead (DrainStreams).
  enum class Origin { kCall, kStreamMessage };
  void Submit(const v1::AttendRequest& request, absl::Time deadline,
              std::shared_ptr<const std::atomic<bool>> cancelled,
              std::function<void(absl::Status, v1::AttendResponse)> done,
              v1::HeadStatisticsResponse* statistics = nullptr,
              Origin origin = Origin::kCall);

  // The models the service serves (not owned).
  ModelRegistry* registry() const { return registry_; }

  // Streams register while gRPC holds them (until their OnDone), so that draining
  // reaches them. Returns false when streams are draining: the stream must end at
  // once.
  bool RegisterStream(OpenStream* stream);
  void UnregisterStream(OpenStream* stream);

  // The grpc_server_* bookkeeping every unary method of this server does (the KServe
  // service's too): StartRpc counts the call and returns its start time; EndRpc
  // counts its outcome; FinishNow does EndRpc and finishes a call answered at once.
  absl::Time StartRpc(absl::string_view method) const;
  void EndRpc(absl::string_view method, absl::StatusCode code, absl::Time start) const;
  grpc::ServerUnaryReactor* FinishNow(absl::string_view method, absl::Time start,
                                      const absl::Status& status);

 private:
  ModelRegistry* const registry_;
  const Options options_;
  const ServiceObserver observer_;
  std::atomic<bool> draining_{false};
  absl::Mutex streams_mu_;
  absl::flat_hash_set<OpenStream*> streams_ ABSL_GUARDED_BY(streams_mu_);
  bool streams_draining_ ABSL_GUARDED_BY(streams_mu_) = false;
  mutable absl::Mutex calls_mu_;
  int64_t open_calls_ ABSL_GUARDED_BY(calls_mu_) = 0;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
