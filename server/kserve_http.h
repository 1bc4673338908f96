// KServeHttp: the KServe v2 / Open Inference Protocol's HTTP/REST endpoints on their own
// port (civetweb, which prometheus-cpp's /metrics server already brings), over the same
// models and batchers: a JSON infer request becomes a ModelInferRequest, then goes the
// way of the gRPC ModelInfer (AttendFromInfer, AttentionService::Submit).
//
//   GET  /v2                                   server metadata
//   GET  /v2/health/live, /v2/health/ready     200, or 503 when not ready
//   GET  /v2/models/{m}[/versions/1]           model metadata
//   GET  /v2/models/{m}[/versions/1]/ready     200, or 503
//   POST /v2/models/{m}[/versions/1]/infer     JSON tensors in and out
// Errors are {"error": "..."} with the HTTP status of the gRPC code (400, 404, 429,
// 503, 504, 500).
#ifndef ATTNSERVE_SERVER_KSERVE_HTTP_H_
#define ATTNSERVE_SERVER_KSERVE_HTTP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/attention_service.h"
#include "server/auth.h"
#include "server/model_registry.h"

struct mg_connection;
struct mg_context;

namespace attnserve::server {

class KServeHttp {
 public:
  struct Options {
    std::string host = "0.0.0.0";
    // 0 picks a free port.
    int port = 8000;
    // Largest request body accepted (bytes of JSON); larger ones get 413.
    int64_t max_body_bytes = 256 << 20;
    // Requests served at once (each waits for its answer on its own thread).
    int threads = 16;
    // When set, /v2/models/{m} and .../infer need "Authorization: Bearer <token>" (401
    // otherwise); /v2 and the health and readiness endpoints stay open. Not owned.
    TokenAuthenticator* auth = nullptr;
  };

  // Listens and serves until Stop. Unavailable when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<KServeHttp>> Start(const Options& options,
                                                           ModelRegistry* registry,
                                                           AttentionService* attention);
  ~KServeHttp();

  int port() const { return port_; }
  // Readiness endpoints answer 503 from now on.
  void StartDraining() { draining_.store(true, std::memory_order_release); }
  // Closes the port and waits for requests in flight. Idempotent.
  void Stop();

  // The civetweb handler; public for its C callback.
  int Handle(mg_connection* connection);

 private:
  KServeHttp(const Options& options, ModelRegistry* registry, AttentionService* attention)
      : options_(options), registry_(registry), attention_(attention) {}

  Options options_;
  ModelRegistry* const registry_;
  AttentionService* const attention_;
  mg_context* context_ = nullptr;
  int port_ = 0;
  std::atomic<bool> draining_{false};
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_KSERVE_HTTP_H_
