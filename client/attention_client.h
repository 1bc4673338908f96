// AttentionClient: a small C++ client for attnserve: Attend (blocking and async),
// Encode, Rerank, health checks, model listing and head statistics over one gRPC channel.
#ifndef ATTNSERVE_CLIENT_ATTENTION_CLIENT_H_
#define ATTNSERVE_CLIENT_ATTENTION_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "inference/grpc_service.grpc.pb.h"

namespace attnserve::client {

// Thread-safe: one client may be shared by many threads (gRPC channels are).
class AttentionClient {
 public:
  struct Options {
    // Any gRPC target: "localhost:50051", "dns:///svc.ns.svc:50051", "ipv4:a:p,b:p".
    std::string target = "localhost:50051";
    // "pick_first" or "round_robin" (spreads calls over every resolved address).
    std::string load_balancing = "pick_first";
    // Largest message, both directions, bytes.
    int max_message_bytes = 64 << 20;
    // Deadline of each call unless the call gives its own.
    absl::Duration timeout = absl::Seconds(30);
    // Attempts per call for calls that fail with UNAVAILABLE or a server-sent
    // CANCELLED (a replica draining or gone): 1 = no retry; up to 5. Attend is
    // idempotent, so retrying is safe.
    int max_attempts = 1;
    // Extra integer gRPC channel arguments (name -> value).
    std::vector<std::pair<std::string, int>> grpc_arguments;
    // TLS: a PEM CA bundle to verify the server with (setting it turns TLS on), and
    // for mTLS this client's PEM certificate chain and private key (both or neither).
    std::string tls_ca, tls_cert, tls_key;
    // Sent as "authorization: Bearer <token>" with every call; empty sends none.
    std::string token;
  };

  // Creates the channel (connects lazily). InvalidArgument for an unknown
  // load_balancing policy, an empty target, or a TLS file that cannot be read.
  static absl::StatusOr<std::unique_ptr<AttentionClient>> Create(const Options& options);

  // Blocking Attend. The server's status (code and message) on failure.
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& request) const;
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& request,
                                            absl::Duration timeout) const;

  // Non-blocking Attend: `done` runs once on a gRPC thread with the result. The
  // request is taken by value (move a temporary in to avoid copying its tensors);
  // `context`, if not null, lets the caller cancel (context->TryCancel()) and must
  // outlive the call.
  void AttendAsync(v1::AttendRequest request, absl::Duration timeout,
                   std::function<void(absl::StatusOr<v1::AttendResponse>)> done,
                   grpc::ClientContext* context = nullptr) const;

  // Blocking Encode (an encoder model): token ids, hidden states or text in,
  // embeddings out. The server's status on failure.
  absl::StatusOr<v1::EncodeResponse> Encode(const v1::EncodeRequest& request) const;

  // Blocking Rerank (a one-label classification model): a query and documents in,
  // the documents best first with their scores out. The server's status on failure.
  absl::StatusOr<v1::RerankResponse> Rerank(const v1::RerankRequest& request) const;

  // grpc.health.v1 Check for `service` ("" = the server, or a model name, or
  // "attnserve.v1.AttentionService"): true when SERVING.
  absl::StatusOr<bool> IsServing(const std::string& service = "") const;

  absl::StatusOr<std::vector<v1::ModelInfo>> ListModels() const;
  absl::StatusOr<v1::ModelInfo> GetModel(const std::string& name) const;
  // Per-head figures of a model over the request's inputs, to choose heads to prune.
  absl::StatusOr<v1::HeadStatisticsResponse> HeadStatistics(
      const v1::HeadStatisticsRequest& request) const;

  // Sets `timeout` as the deadline and adds the token: what every call of this client
  // does; for calls made through stub().
  void PrepareContext(grpc::ClientContext& context, absl::Duration timeout) const;

  // Triton's repository extension on the same port (KServe gRPC): the server's models
  // folders with their state; loading (or replacing) and unloading a model, which needs
  // a server run with --model_control_mode=explicit. `config_json`, when not empty,
  // replaces the model's config.pbtxt (its ModelConfig in protobuf's JSON mapping).
  absl::StatusOr<inference::RepositoryIndexResponse> RepositoryIndex() const;
  absl::Status LoadModel(const std::string& name,
                         const std::string& config_json = "") const;
  absl::Status UnloadModel(const std::string& name) const;

  // For callers that need the raw stubs (streams, custom metadata).
  v1::AttentionService::Stub* stub() const { return stub_.get(); }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  AttentionClient() = default;
  void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) const;

  Options options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> kserve_;
};

// A float32 tensor with `shape` holding `values` (row-major).
v1::Tensor Float32Tensor(absl::Span<const float> values, std::vector<int64_t> shape);

// The float32 values of `tensor`; InvalidArgument if it is not DATA_TYPE_FP32 or its
// byte count does not match its shape.
absl::StatusOr<std::vector<float>> Float32Values(const v1::Tensor& tensor);

// grpc::Status -> absl::Status with the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_ATTENTION_CLIENT_H_
