// KServeHttp: the KServe v2 / Open Inference Protocol's HTTP/REST front door on its own
// port (civetweb, which prometheus-cpp's /metrics server already brings). A thin
// adapter: the body becomes an infer request (server/frontends/kserve_http_request.h),
// then an AttendRequest (server/frontends/kserve_convert.h), and goes through the
// RequestPipeline as every door's requests do.
//
//   GET  /v2                                   server metadata
//   GET  /v2/health/live, /v2/health/ready     {"live": true} / {"ready": bool}; 503
//                                              when not ready
//   GET  /v2/models/{m}[/versions/1]           model metadata
//   GET  /v2/models/{m}[/versions/1]/ready     {"name", "ready"}; 503 when not ready
//   GET  /v2/models/{m}[/versions/1]/config    Triton's ModelConfig as JSON
//   GET  /v2/models/{m}[/versions/1]/stats     Triton's ModelStatistics as JSON
//   POST /v2/models/{m}[/versions/1]/infer     JSON tensors (or Triton's binary tensor
//                                              extension) in and out
//   POST /v1/embeddings                        OpenAI's embeddings API
//   POST /embed                                text-embeddings-inference's /embed
//   POST /rerank, /predict                     text-embeddings-inference's rerank and
//                                              sequence classification
//   POST /v1/rerank, /v2/rerank                Jina's and Cohere's rerank APIs
// Errors are {"error": "..."} with the HTTP status of the gRPC code (400, 401, 404,
// 413, 429, 499, 503, 504, 500), and the same message text as the gRPC doors; the
// embedding APIs send the same text in their own error shapes (embeddings_api.h).
#ifndef ATTNSERVE_SERVER_FRONTENDS_KSERVE_HTTP_H_
#define ATTNSERVE_SERVER_FRONTENDS_KSERVE_HTTP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/frontends/embeddings_api.h"
#include "server/observability/server_metrics.h"
#include "server/pipeline/request_pipeline.h"

struct mg_connection;
struct mg_context;
struct mg_request_info;

namespace attnserve::server {

// Thread-safe: civetweb's worker threads call Handle concurrently.
class KServeHttp {
 public:
  struct Options {
    std::string host = "0.0.0.0";
    // 0 picks a free port.
    int port = 8000;
    // Largest request body accepted (bytes, JSON or binary); larger ones get 413
    // before they are read.
    int64_t max_body_bytes = 256 << 20;
    // Connections served at once: civetweb gives each open connection a thread while
    // it is kept alive, and a connection beyond this waits for one to close.
    // perf_analyzer at concurrency 32 opens 33 (one for statistics). Each waits for its
    // answer on its thread.
    int threads = 64;
    // How long an infer request may take when it sets no "timeout" parameter (the
    // HTTP door has no gRPC deadline to inherit). Range (0, inf].
    absl::Duration default_timeout = absl::Seconds(60);
    // How long a kept-alive connection may stay idle between requests before the
    // server closes it; every answer says so (`Keep-Alive: timeout=N`, whole seconds).
    // Longer than the pools of common clients keep an idle connection (httpx, so the
    // openai client: 5 s; undici: 4 s; aiohttp: 15 s), so they close first and never
    // write into a connection the server closed; and longer than the 60 s idle timeout
    // of common load balancers in front. An idle connection holds one of `threads`.
    // Range [1 s, 1 h].
    absl::Duration keep_alive_timeout = absl::Seconds(75);
    // The most calls in flight before new ones get 429, as /info reports it (the
    // pipeline enforces it); 0: no limit.
    int64_t max_concurrent_requests = 0;
    // Called on the HTTP thread with each request's URI before it is routed: a seam
    // for tests to inject faults (an exception thrown here is answered 500, counted
    // and logged, like any other that reaches the door's boundary). Optional.
    std::function<void(absl::string_view uri)> on_request;
  };

  // Listens and serves until Stop. `pipeline` and `metrics` (which answers .../stats)
  // are not owned and must outlive this object. Unavailable when the port cannot be
  // bound; InvalidArgument for a bad option.
  static absl::StatusOr<std::unique_ptr<KServeHttp>> Start(const Options& options,
                                                           RequestPipeline* pipeline,
                                                           const ServerMetrics* metrics);
  ~KServeHttp();

  int port() const { return port_; }
  // "Keep-Alive: timeout=N\r\n", the header line every answer carries.
  const std::string& keep_alive_header() const { return keep_alive_header_; }
  // Closes the port and waits for requests in flight. Idempotent.
  void Stop();

  // The civetweb handler; public for its C callbacks: the /v2 routes, or one of the
  // embedding APIs (`api`). Never throws: an exception from the routes is answered 500,
  // logged, and counted (ServiceObserver::on_internal_error).
  int Handle(mg_connection* connection,
             std::optional<EmbeddingsCall::Api> api = std::nullopt) noexcept;

 private:
  KServeHttp(const Options& options, RequestPipeline* pipeline,
             const ServerMetrics* metrics)
      : options_(options),
        pipeline_(pipeline),
        metrics_(metrics),
        keep_alive_header_(absl::StrCat(
            "Keep-Alive: timeout=", absl::ToInt64Seconds(options.keep_alive_timeout),
            "\r\n")) {}

  // The routes; may throw (Handle catches).
  void Route(mg_connection* connection);
  // The repository extension: index, load and unload.
  void Repository(mg_connection* connection, const std::vector<absl::string_view>& parts);
  void Infer(mg_connection* connection, const std::string& model,
             const std::string& version);
  void Embeddings(mg_connection* connection, EmbeddingsCall::Api api);
  // OpenAI's GET /v1/models and /v1/models/{model}: the ready models.
  void Models(mg_connection* connection);
  // TEI's GET /info: the default model's (or ?model=NAME's) description and limits.
  void Info(mg_connection* connection);
  // TEI's POST /tokenize and POST /decode (`decode`), on the default model's (or
  // ?model=NAME's) tokenizer, answered on this thread.
  void Tokenizer(mg_connection* connection, bool decode);
  // What every JSON API call starts with: POST only, the pipeline's Begin (auth,
  // drain) and the whole body into `body`. On a refusal it answers in `api`'s error
  // shape and returns null. REQUIRES: the caller holds an OpenCall.
  std::shared_ptr<Request> BeginPost(mg_connection* connection, EmbeddingsCall::Api api,
                                     std::string* body);
  // The whole body into `body`; OutOfRange (answered 413) past max_body_bytes, checked
  // against Content-Length before a byte is read.
  absl::Status ReadBody(mg_connection* connection, std::string* body) const;
  // Blocks until `done`; cancels the call if the client hangs up first.
  void AwaitAnswer(const mg_request_info* request, absl::Notification& done,
                   Cancellation& cancellation) const;

  const Options options_;
  RequestPipeline* const pipeline_;
  const ServerMetrics* const metrics_;
  const std::string keep_alive_header_;
  mg_context* context_ = nullptr;
  int port_ = 0;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FRONTENDS_KSERVE_HTTP_H_
