// AttentionServer: a running attnserve gRPC server: the models and their batchers, the
// AttentionService, gRPC health (overall and per model) and server reflection.
#ifndef ATTNSERVE_SERVER_ATTENTION_SERVER_H_
#define ATTNSERVE_SERVER_ATTENTION_SERVER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/frontends/attention_service.h"
#include "server/frontends/kserve_http.h"
#include "server/frontends/kserve_service.h"
#include "server/models/model_registry.h"
#include "server/observability/metrics_http.h"
#include "server/observability/server_metrics.h"
#include "server/observability/tracing.h"

namespace attnserve::server {

// Thread-safe. Owns the gRPC server, the service and the models.
class AttentionServer {
 public:
  struct Options {
    // Address to listen on: "0.0.0.0" (all IPv4), "[::]", "127.0.0.1", ...
    std::string host = "0.0.0.0";
    // TCP port; 0 picks a free one (see port()). Range [0, 65535].
    int port = 50051;
    // TLS on the gRPC port: PEM certificate chain and private key files (both or
    // neither). With tls_client_ca, clients must present a certificate signed by it
    // (mTLS). The files are re-read every tls_refresh, so certificates rotate without
    // dropping connections (replace them atomically, e.g. by rename).
    std::string tls_cert, tls_key, tls_client_ca;
    absl::Duration tls_refresh = absl::Seconds(5);
    // Bearer tokens, one per line (see TokenAuthenticator); empty: no authentication.
    std::string auth_token_file;
    // Serve gRPC server reflection.
    bool reflection = true;
    // Largest request or response message, bytes, both directions. Range >= 1024.
    int max_message_bytes = 64 << 20;
    // Refuse float inputs holding NaN or an infinity (INVALID_ARGUMENT naming the
    // element) instead of computing them through, as PyTorch, ONNX Runtime and Triton
    // do (NaN in, NaN out).
    bool reject_non_finite = false;
    // Calls in flight beyond which a new one is refused at once with
    // RESOURCE_EXHAUSTED (HTTP 429, Retry-After: 1) and counted
    // (RequestPipeline::Options::max_concurrent_requests); 0: no limit. Range [0, 2^31).
    int64_t max_concurrent_requests = 0;
    // Connections are closed (with GOAWAY) after this age so that clients re-resolve
    // DNS and spread onto new replicas; zero or infinite keeps them open.
    absl::Duration max_connection_age = absl::ZeroDuration();
    // On Shutdown, how long queued and running calls may take to finish before they
    // are cancelled. Range >= 0.
    absl::Duration grace_period = absl::Seconds(30);
    // Memory gRPC itself may use for connections and messages in flight
    // (grpc::ResourceQuota): beyond it, reads from clients pause. Range >= 1 MiB.
    int64_t grpc_memory_bytes = int64_t{1} << 30;
    // Concurrent calls (HTTP/2 streams) per client connection. Range >= 1.
    int max_concurrent_streams = 256;
    // The models.
    ModelRegistry::Options models;
    // Where /metrics (Prometheus text format) and the status page (/) are served:
    // port 0 picks a free one (see metrics_port()); -1 serves none (the metrics are
    // still recorded).
    std::string metrics_host = "0.0.0.0";
    int metrics_port = -1;
    // How often the status page samples the histograms it draws. > 0.
    absl::Duration status_interval = absl::Seconds(10);
    // The flags the status page lists (name, value); main fills it.
    std::vector<std::pair<std::string, std::string>> status_flags;
    // KServe v2 HTTP/REST endpoints (KServeHttp) on this port; 0 picks a free one (see
    // http_port()); -1 serves none. They listen on `host`.
    int http_port = -1;
    // How long an HTTP infer request may take when it sets no "timeout" parameter.
    absl::Duration http_timeout = absl::Seconds(60);
    // How long an idle kept-alive HTTP connection stays open (KServeHttp::Options).
    absl::Duration http_keep_alive_timeout = absl::Seconds(75);
    // OpenTelemetry tracing (server/observability/request_tracing.h): every request's
    // spans to the OTLP/gRPC collector at tracing.otlp_endpoint, sampled by
    // tracing.sampler_ratio (a caller's sampled traceparent is always followed); an
    // empty endpoint traces nothing. service_version is the server's.
    Tracer::Options tracing;
    // Let another process bind the same gRPC port beside this one (SO_REUSEPORT), and
    // share its connections. Off: a second server on a taken port fails at start.
    bool reuse_grpc_port = false;
    // Extra integer gRPC channel arguments for the server (name -> value), e.g.
    // {"grpc.http2.max_frame_size", 16777215}; applied after the ones above.
    std::vector<std::pair<std::string, int>> grpc_arguments;
  };

  // Loads the models, binds the port and starts serving. Errors: those of
  // ModelRegistry::Create; InvalidArgument for a bad option; Unavailable when the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<AttentionServer>> Create(const Options& options);

  // Shuts down if still running.
  ~AttentionServer();

  // The bound port (the chosen one when Options::port was 0).
  int port() const { return port_; }
  const ModelRegistry& registry() const { return *registry_; }
  // The bound /metrics port, or -1 when not served.
  int metrics_port() const { return metrics_port_; }
  // The bound KServe HTTP port, or -1 when not served.
  int http_port() const { return http_ != nullptr ? http_->port() : -1; }
  ServerMetrics& metrics() { return *metrics_; }

  // Re-reads the token file now (SIGHUP); OK when there is none. Thread-safe.
  absl::Status ReloadCredentials();

  // Drains: health turns NOT_SERVING, new calls get UNAVAILABLE, queued and running
  // calls finish (up to grace_period, then they are cancelled), batchers stop. Blocks
  // until done. Idempotent and thread-safe.
  void Shutdown();

 private:
  AttentionServer() = default;

  // Create's steps, in order; each error is Create's. The model registry, with its
  // events feeding the metrics, the event log and gRPC health.
  absl::Status LoadModels();
  // /metrics and the status page on the metrics port, when it is >= 0.
  absl::Status StartMetricsHttp();
  // The gRPC server with both services: credentials, limits, channel arguments.
  absl::Status StartGrpc();
  // The KServe HTTP door and the JSON APIs, when the HTTP port is >= 0.
  absl::Status StartHttp();
  // Overall and per-model gRPC health, kept current by registry events from now on.
  void StartHealth();

  // Sets `model`'s grpc.health.v1 status to what the pipeline says of it now; called
  // on each registry load and unload, on the thread that made it. A no-op before the
  // gRPC server runs and once it has begun shutting down.
  void SyncModelHealth(const std::string& model);

  Options options_;
  int port_ = 0;
  int metrics_port_ = -1;
  // Declared before what reports into it, so it is destroyed after them.
  std::unique_ptr<ServerMetrics> metrics_;
  // The gRPC server's health service while it serves (registry events update it);
  // declared before the registry, whose events lock it.
  absl::Mutex health_mu_;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(health_mu_) = nullptr;
  std::unique_ptr<ModelRegistry> registry_;
  // Outlives the doors and the pipeline, whose requests submit spans to it.
  std::unique_ptr<Tracer> tracer_;
  std::unique_ptr<TokenAuthenticator> auth_;
  std::unique_ptr<MetricsHttp> metrics_http_;
  std::unique_ptr<RequestPipeline> pipeline_;
  std::unique_ptr<AttentionService> service_;
  std::unique_ptr<KServeService> kserve_;
  std::unique_ptr<KServeHttp> http_;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_ATTENTION_SERVER_H_
