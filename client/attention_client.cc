#include "client/attention_client.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "transport/transport.h"

namespace attnserve::client {

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

namespace {

// The whole file, or InvalidArgument naming the option.
absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view option) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    return absl::InvalidArgumentError(absl::StrCat(option, "=", path, ": cannot read"));
  }
  std::stringstream text;
  text << stream.rdbuf();
  return text.str();
}

}  // namespace

#define ATTN_CLIENT_ASSIGN_OR_RETURN(lhs, expression) \
  do {                                                \
    auto value_or = (expression);                     \
    if (!value_or.ok()) return value_or.status();     \
    lhs = *std::move(value_or);                       \
  } while (false)

absl::StatusOr<std::unique_ptr<AttentionClient>> AttentionClient::Create(
    const Options& options) {
  if (options.target.empty())
    return absl::InvalidArgumentError("target must not be empty");
  if (options.load_balancing != "pick_first" && options.load_balancing != "round_robin") {
    return absl::InvalidArgumentError(
        absl::StrCat("load_balancing must be pick_first or round_robin, got ",
                     options.load_balancing));
  }
  if (options.max_attempts < 1 || options.max_attempts > 5) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts must be in [1, 5], got ", options.max_attempts));
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(options.max_message_bytes);
  arguments.SetMaxSendMessageSize(options.max_message_bytes);
  // The default service config: the balancing policy, and a retry policy so that a
  // draining or vanished replica costs a retry, not an error: UNAVAILABLE (refused,
  // connection lost) and CANCELLED, which a server shutting down sends for calls it had
  // received but not yet handed to the service (seen in tests/deploy/scale_out_test.py);
  // those never ran. A call the caller cancels itself is never retried by gRPC.
  std::string config =
      absl::StrCat("{\"loadBalancingConfig\": [{\"", options.load_balancing, "\": {}}]");
  if (options.max_attempts > 1) {
    absl::StrAppend(
        &config,
        ", \"methodConfig\": [{\"name\": [{\"service\": "
        "\"attnserve.v1.AttentionService\"}], \"retryPolicy\": {\"maxAttempts\": ",
        options.max_attempts,
        ", \"initialBackoff\": \"0.02s\", \"maxBackoff\": \"0.5s\", "
        "\"backoffMultiplier\": 2, \"retryableStatusCodes\": [\"UNAVAILABLE\", "
        "\"CANCELLED\"]}}]");
  }
  config += "}";
  arguments.SetServiceConfigJSON(config);
  transport::ApplyTransportDefaults(arguments);
  for (const auto& [name, value] : options.grpc_arguments) arguments.SetInt(name, value);
  std::unique_ptr<AttentionClient> client(new AttentionClient());
  client->options_ = options;
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (!options.tls_ca.empty() || !options.tls_cert.empty() || !options.tls_key.empty()) {
    if (options.tls_ca.empty() || options.tls_cert.empty() != options.tls_key.empty()) {
      return absl::InvalidArgumentError(
          "TLS needs tls_ca, and tls_cert and tls_key go together");
    }
    grpc::SslCredentialsOptions ssl;
    ATTN_CLIENT_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(options.tls_ca, "tls_ca"));
    if (!options.tls_cert.empty()) {
      ATTN_CLIENT_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                                   ReadFile(options.tls_cert, "tls_cert"));
      ATTN_CLIENT_ASSIGN_OR_RETURN(ssl.pem_private_key,
                                   ReadFile(options.tls_key, "tls_key"));
    }
    credentials = grpc::SslCredentials(ssl);
  }
  client->channel_ = grpc::CreateCustomChannel(options.target, credentials, arguments);
  client->stub_ = v1::AttentionService::NewStub(client->channel_);
  client->health_ = grpc::health::v1::Health::NewStub(client->channel_);
  client->kserve_ = inference::GRPCInferenceService::NewStub(client->channel_);
  return client;
}

void AttentionClient::SetDeadline(grpc::ClientContext& context,
                                  absl::Duration timeout) const {
  PrepareContext(context, timeout);
}

void AttentionClient::PrepareContext(grpc::ClientContext& context,
                                     absl::Duration timeout) const {
  if (timeout < absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  if (!options_.token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
  }
}

absl::StatusOr<v1::AttendResponse> AttentionClient::Attend(
    const v1::AttendRequest& request) const {
  return Attend(request, options_.timeout);
}

absl::StatusOr<v1::AttendResponse> AttentionClient::Attend(
    const v1::AttendRequest& request, absl::Duration timeout) const {
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  v1::AttendResponse response;
  const grpc::Status status = stub_->Attend(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

void AttentionClient::AttendAsync(
    v1::AttendRequest request, absl::Duration timeout,
    std::function<void(absl::StatusOr<v1::AttendResponse>)> done,
    grpc::ClientContext* context) const {
  struct Call {
    std::unique_ptr<grpc::ClientContext> owned_context;
    grpc::ClientContext* context;
    v1::AttendRequest request;
    v1::AttendResponse response;
    std::function<void(absl::StatusOr<v1::AttendResponse>)> done;
  };
  auto* call = new Call();
  if (context == nullptr) {
    call->owned_context = std::make_unique<grpc::ClientContext>();
    context = call->owned_context.get();
  }
  call->context = context;
  SetDeadline(*context, timeout);
  call->request = std::move(request);
  call->done = std::move(done);
  stub_->async()->Attend(
      context, &call->request, &call->response, [call](grpc::Status status) {
        // Everything the call owns is released before `done` runs:
        // the caller may destroy this client as soon as it returns.
        auto done = std::move(call->done);
        absl::StatusOr<v1::AttendResponse> result =
            status.ok() ? absl::StatusOr<v1::AttendResponse>(std::move(call->response))
                        : FromGrpcStatus(status);
        delete call;
        done(std::move(result));
      });
}

absl::StatusOr<bool> AttentionClient::IsServing(const std::string& service) const {
  grpc::ClientContext context;
  SetDeadline(context, options_.timeout);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = health_->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

absl::StatusOr<std::vector<v1::ModelInfo>> AttentionClient::ListModels() const {
  grpc::ClientContext context;
  SetDeadline(context, options_.timeout);
  v1::ListModelsResponse response;
  const grpc::Status status =
      stub_->ListModels(&context, v1::ListModelsRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::vector<v1::ModelInfo>(response.models().begin(), response.models().end());
}

absl::StatusOr<v1::ModelInfo> AttentionClient::GetModel(const std::string& name) const {
  grpc::ClientContext context;
  SetDeadline(context, options_.timeout);
  v1::GetModelRequest request;
  request.set_name(name);
  v1::GetModelResponse response;
  const grpc::Status status = stub_->GetModel(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.model();
}

absl::StatusOr<inference::RepositoryIndexResponse> AttentionClient::RepositoryIndex()
    const {
  grpc::ClientContext context;
  PrepareContext(context, options_.timeout);
  inference::RepositoryIndexResponse response;
  const grpc::Status status =
      kserve_->RepositoryIndex(&context, inference::RepositoryIndexRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::Status AttentionClient::LoadModel(const std::string& name,
                                        const std::string& config_json) const {
  grpc::ClientContext context;
  PrepareContext(context, options_.timeout);
  inference::RepositoryModelLoadRequest request;
  request.set_model_name(name);
  if (!config_json.empty()) {
    (*request.mutable_parameters())["config"].set_string_param(config_json);
  }
  inference::RepositoryModelLoadResponse response;
  return FromGrpcStatus(kserve_->RepositoryModelLoad(&context, request, &response));
}

absl::Status AttentionClient::UnloadModel(const std::string& name) const {
  grpc::ClientContext context;
  PrepareContext(context, options_.timeout);
  inference::RepositoryModelUnloadRequest request;
  request.set_model_name(name);
  inference::RepositoryModelUnloadResponse response;
  return FromGrpcStatus(kserve_->RepositoryModelUnload(&context, request, &response));
}

absl::StatusOr<v1::EncodeResponse> AttentionClient::Encode(
    const v1::EncodeRequest& request) const {
  grpc::ClientContext context;
  PrepareContext(context, options_.timeout);
  v1::EncodeResponse response;
  const grpc::Status status = stub_->Encode(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::RerankResponse> AttentionClient::Rerank(
    const v1::RerankRequest& request) const {
  grpc::ClientContext context;
  PrepareContext(context, options_.timeout);
  v1::RerankResponse response;
  const grpc::Status status = stub_->Rerank(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::HeadStatisticsResponse> AttentionClient::HeadStatistics(
    const v1::HeadStatisticsRequest& request) const {
  grpc::ClientContext context;
  SetDeadline(context, options_.timeout);
  v1::HeadStatisticsResponse response;
  const grpc::Status status = stub_->HeadStatistics(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

v1::Tensor Float32Tensor(absl::Span<const float> values, std::vector<int64_t> shape) {
  v1::Tensor tensor;
  tensor.set_dtype(v1::DATA_TYPE_FP32);
  tensor.mutable_shape()->Add(shape.begin(), shape.end());
  tensor.set_raw(reinterpret_cast<const char*>(values.data()),
                 values.size() * sizeof(float));
  return tensor;
}

absl::StatusOr<std::vector<float>> Float32Values(const v1::Tensor& tensor) {
  if (tensor.dtype() != v1::DATA_TYPE_FP32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected a DATA_TYPE_FP32 tensor, got ", v1::DataType_Name(tensor.dtype())));
  }
  int64_t elements = 1;
  for (int64_t dim : tensor.shape()) elements *= dim;
  if (static_cast<int64_t>(tensor.raw().size()) != elements * 4) {
    return absl::InvalidArgumentError(absl::StrCat("tensor raw has ", tensor.raw().size(),
                                                   " bytes, shape needs ", elements * 4));
  }
  std::vector<float> values(elements);
  std::memcpy(values.data(), tensor.raw().data(), tensor.raw().size());
  return values;
}

}  // namespace attnserve::client
