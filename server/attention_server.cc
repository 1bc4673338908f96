#include "server/attention_server.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "core/attention/attention_backend.h"
#include "core/base/status_macros.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "server/observability/event_log.h"
#include "server/observability/request_tracing.h"
#include "transport/listen_error.h"
#include "transport/transport.h"

namespace attnserve::server {

namespace {

// Drops gRPC's reflection plugin from one server's builder.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(
      std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const auto& plugin) {
                                    return plugin->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

// Readable and not empty, or InvalidArgument naming the flag.
absl::Status CheckPemFile(absl::string_view flag, const std::string& path) {
  std::ifstream stream(path);
  std::string first_line;
  if (!stream || !std::getline(stream, first_line) || first_line.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": cannot read a PEM file there"));
  }
  return absl::OkStatus();
}

// Insecure, TLS or mTLS credentials for the gRPC port; the files are watched by
// gRPC's own FileWatcherCertificateProvider (no crypto of ours).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const AttentionServer::Options& options) {
  if (options.tls_cert.empty() && options.tls_key.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert.empty() || options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  ATTN_RETURN_IF_ERROR(CheckPemFile("tls_cert", options.tls_cert));
  ATTN_RETURN_IF_ERROR(CheckPemFile("tls_key", options.tls_key));
  if (!options.tls_client_ca.empty()) {
    ATTN_RETURN_IF_ERROR(CheckPemFile("tls_client_ca", options.tls_client_ca));
  }
  const auto refresh = static_cast<unsigned int>(
      std::max<int64_t>(1, absl::ToInt64Seconds(options.tls_refresh)));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.tls_key, options.tls_cert, options.tls_client_ca, refresh);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (!options.tls_client_ca.empty()) {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

}  // namespace

namespace {

// InvalidArgument naming the first field of `options` out of its range.
absl::Status CheckOptions(const AttentionServer::Options& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port must be in [0, 65535], got ", options.port));
  }
  if (options.max_concurrent_requests < 0 ||
      options.max_concurrent_requests > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_concurrent_requests must be in [0, 2^31 - 1], got ",
                     options.max_concurrent_requests));
  }
  if (options.max_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes must be >= 1024, got ", options.max_message_bytes));
  }
  if (options.grpc_memory_bytes < (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grpc_memory_bytes must be >= 1048576, got ", options.grpc_memory_bytes));
  }
  if (options.max_concurrent_streams < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_concurrent_streams must be >= 1, got ", options.max_concurrent_streams));
  }
  if (options.grace_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("grace_period must be >= 0");
  }
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_port must be in [-1, 65535], got ", options.metrics_port));
  }
  return absl::OkStatus();
}

// One registry event into the metrics and the event log.
void RecordModelEvent(ServerMetrics& metrics, const ModelEvent& event) {
  metrics.OnModelEvent(event);
  if (event.kind == ModelEvent::Kind::kLoaded) {
    metrics.SetProjectionChoices(core::CpuProjectionChoiceList());
    metrics.SetAttentionChoices(core::CpuAttentionChoiceList());
  }
  switch (event.kind) {
    case ModelEvent::Kind::kLoaded:
      LogEvent("model_loaded", {{"model", event.model}, {"version", event.version}});
      break;
    case ModelEvent::Kind::kLoadFailed:
      LogEvent(
          "model_load_failed",
          {{"model", event.model}, {"version", event.version}, {"error", event.reason}});
      break;
    case ModelEvent::Kind::kUnloaded:
      LogEvent("model_unloaded", {{"model", event.model}, {"version", event.version}});
      break;
    case ModelEvent::Kind::kFreed:
      LogEvent("model_freed", {{"model", event.model}, {"version", event.version}});
      break;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionServer>> AttentionServer::Create(
    const Options& options) {
  ATTN_RETURN_IF_ERROR(CheckOptions(options));
  // Every early return below destroys `server`, whose destructor (Shutdown) stops
  // whatever was started so far.
  std::unique_ptr<AttentionServer> server(new AttentionServer());
  server->options_ = options;
  server->metrics_ = std::make_unique<ServerMetrics>();
  ATTN_RETURN_IF_ERROR(server->LoadModels());
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth =
        TokenAuthenticator::Load(options.auth_token_file);
    if (!auth.ok()) return auth.status();
    server->auth_ = *std::move(auth);
  }
  RequestPipeline::Options pipeline_options;
  pipeline_options.auth = server->auth_.get();
  pipeline_options.max_response_bytes = options.max_message_bytes;
  pipeline_options.reject_non_finite = options.reject_non_finite;
  pipeline_options.max_concurrent_requests = options.max_concurrent_requests;
  ServiceObserver observer = server->metrics_->service_observer();
  if (!options.tracing.otlp_endpoint.empty()) {
    Tracer::Options tracing = options.tracing;
    tracing.service_version = kServerVersion;
    absl::StatusOr<std::unique_ptr<Tracer>> tracer =
        Tracer::Create(tracing, server->metrics_->registry().get());
    if (!tracer.ok()) {
      return absl::Status(tracer.status().code(),
                          absl::StrCat("tracing (--otlp_endpoint, --otlp_sample_ratio, "
                                       "--otlp_service_name): ",
                                       tracer.status().message()));
    }
    server->tracer_ = *std::move(tracer);
    observer.on_request_traced = TraceRequests(server->tracer_.get());
  }
  server->pipeline_ = std::make_unique<RequestPipeline>(server->registry_.get(),
                                                        pipeline_options, observer);
  server->service_ = std::make_unique<AttentionService>(server->pipeline_.get());
  server->kserve_ =
      std::make_unique<KServeService>(server->pipeline_.get(), server->metrics_.get());
  ATTN_RETURN_IF_ERROR(server->StartMetricsHttp());
  ATTN_RETURN_IF_ERROR(server->StartGrpc());
  ATTN_RETURN_IF_ERROR(server->StartHttp());
  server->StartHealth();
  return server;
}

absl::Status AttentionServer::LoadModels() {
  ServerMetrics* metrics = metrics_.get();
  ModelRegistry::Options model_options = options_.models;
  model_options.make_observer = [metrics](const v1::ModelInfo& info) {
    return metrics->AddModel(info);
  };
  model_options.on_event = [metrics, this](const ModelEvent& event) {
    RecordModelEvent(*metrics, event);
    if (event.kind == ModelEvent::Kind::kLoaded ||
        event.kind == ModelEvent::Kind::kUnloaded) {
      SyncModelHealth(event.model);
    }
  };
  absl::StatusOr<std::unique_ptr<ModelRegistry>> registry =
      ModelRegistry::Create(model_options);
  if (!registry.ok()) return registry.status();
  registry_ = std::move(registry).value();
  for (const auto& model : registry_->models()) {
    metrics->OnModelEvent({ModelEvent::Kind::kLoaded, model->name, model->version, ""});
    LogEvent("model_loaded",
             {{"model", model->name},
              {"version", model->version},
              {"d_model", absl::StrCat(model->spec.d_model)},
              {"num_heads", absl::StrCat(model->spec.num_heads)},
              {"max_sequence_length", absl::StrCat(model->max_sequence_length)},
              {"compute", core::ComputePath(model->spec, options_.models.device)},
              {"batching", model->info.batching().ShortDebugString()}});
  }
  // What the warm-up measured this CPU to prefer for the f32 projections (the core's
  // ProjectionPrimitives::kAuto), once for the process.
  if (const std::string choices = core::CpuProjectionChoices(); !choices.empty()) {
    LogEvent("projection_choices", {{"choices", choices}});
  }
  metrics->SetProjectionChoices(core::CpuProjectionChoiceList());
  // And for attention over long sequences (the core's AttentionKernel::kAuto).
  if (const std::string choices = core::CpuAttentionChoices(); !choices.empty()) {
    LogEvent("attention_choices", {{"choices", choices}});
  }
  metrics->SetAttentionChoices(core::CpuAttentionChoiceList());
  return absl::OkStatus();
}

namespace {

// The head view's measurement (MetricsHttp::Options::measure_heads): one text through
// the pipeline as HeadStatistics with return_attention, counted as every request is;
// truncated to the model's token limit; blocks until the answer (30 s at most).
absl::StatusOr<v1::HeadStatisticsResponse> MeasureHeads(RequestPipeline* pipeline,
                                                        const std::string& model,
                                                        const std::string& text) {
  const RequestPipeline::Rpc rpc(pipeline, "StatusPageHeads");
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  absl::StatusOr<std::shared_ptr<Request>> request =
      pipeline->Begin("", RequestPipeline::Origin::kAuthorized, deadline);
  absl::Status status = request.status();
  if (status.ok()) status = (*request)->Find(model);
  if (status.ok() && !(*request)->model()->is_encoder()) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "model \"", model, "\" is an attention layer: the head view shows encoders"));
    (*request)->Finish(status);
  }
  if (!status.ok()) {
    rpc.End(status.code());
    return status;
  }
  v1::EncodeRequest encode;
  encode.set_model(model);
  encode.add_text(text);
  encode.set_truncate(true);
  v1::HeadStatisticsResponse response;
  absl::Notification answered;
  pipeline->SubmitEncode(
      *request, encode, deadline, nullptr,
      [&status, &answered](absl::Status result, const v1::EncodeResponse&) {
        status = std::move(result);
        answered.Notify();
      },
      &response, /*statistics_attention=*/true);
  answered.WaitForNotification();
  rpc.End(status.code());
  if (!status.ok()) return status;
  return response;
}

}  // namespace

absl::Status AttentionServer::StartMetricsHttp() {
  if (options_.metrics_port >= 0) {
    MetricsHttp::Options metrics_options;
    metrics_options.host = options_.metrics_host;
    metrics_options.port = options_.metrics_port;
    metrics_options.version = kServerVersion;
    metrics_options.flags = options_.status_flags;
    metrics_options.sample_interval = options_.status_interval;
    metrics_options.measure_heads =
        [pipeline = pipeline_.get()](const std::string& model, const std::string& text) {
          return MeasureHeads(pipeline, model, text);
        };
    absl::StatusOr<std::unique_ptr<MetricsHttp>> metrics_http =
        MetricsHttp::Start(metrics_options, metrics_.get(), registry_.get(), auth_.get());
    if (!metrics_http.ok()) return metrics_http.status();
    metrics_http_ = *std::move(metrics_http);
    metrics_port_ = metrics_http_->port();
  }
  return absl::OkStatus();
}

absl::Status AttentionServer::StartGrpc() {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ServerCredentialsFor(options_);
  if (!credentials.ok()) return credentials.status();
  grpc::EnableDefaultHealthCheckService(true);
  // gRPC's built-in health service does not use protobuf, so reflection would list
  // grpc.health.v1.Health without being able to describe it (buf curl and grpcurl then
  // fail). Touching the descriptor links health.proto's and registers it in the pool.
  grpc::health::v1::HealthCheckRequest::descriptor();
  // Linking grpc++_reflection registers its plugin for every server of the process;
  // a server without reflection removes it from its own builder.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options_.host, ":", options_.port);
  builder.AddListeningPort(address, *credentials, &port_);
  if (!options_.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  builder.RegisterService(service_.get());
  builder.RegisterService(kserve_.get());
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  grpc::ResourceQuota quota("attnserve");
  quota.Resize(static_cast<size_t>(options_.grpc_memory_bytes));
  builder.SetResourceQuota(quota);
  transport::ApplyTransportDefaults(builder);
  // gRPC sets SO_REUSEPORT by default: a second server on the same port then binds
  // silently beside the first and takes half its connections. Only when asked.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, options_.reuse_grpc_port ? 1 : 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             options_.max_concurrent_streams);
  if (options_.max_connection_age > absl::ZeroDuration() &&
      options_.max_connection_age < absl::InfiniteDuration()) {
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_AGE_MS,
        static_cast<int>(absl::ToInt64Milliseconds(options_.max_connection_age)));
    // In-flight calls on an aged connection get this long to finish.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                               static_cast<int>(absl::ToInt64Milliseconds(
                                   std::max(options_.grace_period, absl::Seconds(1)))));
  }
  for (const auto& [name, value] : options_.grpc_arguments) {
    builder.AddChannelArgument(name, value);
  }
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return transport::ListenError("gRPC", "--port", options_.host, options_.port);
  }
  return absl::OkStatus();
}

absl::Status AttentionServer::StartHttp() {
  if (options_.http_port >= 0) {
    KServeHttp::Options http_options;
    http_options.host = options_.host;
    http_options.port = options_.http_port;
    http_options.default_timeout = options_.http_timeout;
    http_options.keep_alive_timeout = options_.http_keep_alive_timeout;
    http_options.max_concurrent_requests = options_.max_concurrent_requests;
    // JSON text of a tensor is several times its bytes; binary requests are smaller.
    http_options.max_body_bytes = 4 * static_cast<int64_t>(options_.max_message_bytes);
    absl::StatusOr<std::unique_ptr<KServeHttp>> http =
        KServeHttp::Start(http_options, pipeline_.get(), metrics_.get());
    if (!http.ok()) return http.status();
    http_ = *std::move(http);
  }
  return absl::OkStatus();
}

void AttentionServer::StartHealth() {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus(v1::AttentionService::service_full_name(), true);
  {
    // From here on, loads and unloads keep each model's status current; a model the
    // registry changes meanwhile is set twice, the same way.
    absl::MutexLock lock(&health_mu_);
    health_ = health;
  }
  for (const auto& model : registry_->models()) {
    SyncModelHealth(model->name);
  }
}

void AttentionServer::SyncModelHealth(const std::string& model) {
  absl::MutexLock lock(&health_mu_);
  if (health_ == nullptr) return;
  health_->SetServingStatus(model, pipeline_->ModelReady(model));
}

AttentionServer::~AttentionServer() { Shutdown(); }

absl::Status AttentionServer::ReloadCredentials() {
  return auth_ != nullptr ? auth_->Reload() : absl::OkStatus();
}

void AttentionServer::Shutdown() {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ == nullptr) {
    // Create failed part-way; whatever exists stops with its own destructor.
    if (registry_ != nullptr) registry_->Shutdown();
    return;
  }
  const absl::Time start = absl::Now();
  LogEvent("shutdown_started",
           {{"grace_period", absl::FormatDuration(options_.grace_period)}});
  // Registry events stop touching health; then every service turns NOT_SERVING (and
  // the service ignores later updates).
  {
    absl::MutexLock lock(&health_mu_);
    health_ = nullptr;
  }
  server_->GetHealthCheckService()->Shutdown();
  // One drain state for every door: new calls are answered UNAVAILABLE from now on,
  // before any work (clients with a retry policy retry them elsewhere), and readiness
  // answers false; open streams stop reading, compute and answer what they have read,
  // and end with UNAVAILABLE, so their clients reopen elsewhere.
  pipeline_->StartDraining();
  // Queued work runs now instead of waiting for company.
  registry_->Flush();
  // Every accepted call finishes and hands its answer to the transport before gRPC's
  // Shutdown sends GOAWAY. gRPC closes a connection the moment its last call ends after
  // a GOAWAY; when a client had not yet read the tail of an answer, that tail was still
  // in the kernel's send queue, and the client's next window update then reset the
  // connection and lost the answer. With nothing left in flight, the ping that follows
  // the GOAWAY comes after every answer, so its ack means the client has read them all.
  const bool all_answered = pipeline_->AwaitNoOpenCalls(start + options_.grace_period);
  LogEvent("calls_answered", {{"all", all_answered ? "true" : "false"},
                              {"open", absl::StrCat(pipeline_->open_calls())},
                              {"elapsed", absl::FormatDuration(absl::Now() - start)}});
  // Stops accepting calls: the listener closes and clients get GOAWAY, so their next
  // calls go to other replicas; a call that raced the GOAWAY is refused by gRPC itself,
  // which clients retry transparently. Calls still open (only when the grace period ran
  // out above) are cancelled.
  server_->Shutdown(absl::ToChronoTime(start + options_.grace_period));
  // HTTP requests in flight finish (new ones are refused UNAVAILABLE) before the
  // batchers stop.
  if (http_ != nullptr) http_->Stop();
  registry_->Shutdown();
  server_->Wait();
  // Every request has submitted its spans: what is queued goes out (bounded by the
  // export timeout).
  if (tracer_ != nullptr) tracer_->Shutdown();
  LogEvent("shutdown_finished", {{"elapsed", absl::FormatDuration(absl::Now() - start)}});
}

}  // namespace attnserve::server
