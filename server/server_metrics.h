// ServerMetrics: attnserve's Prometheus metrics (the families in DESIGN.md, the
// go-grpc-prometheus RPC families, process metrics) and the /metrics HTTP exposer.
#ifndef ATTNSERVE_SERVER_SERVER_METRICS_H_
#define ATTNSERVE_SERVER_SERVER_METRICS_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/attention.pb.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/attention_service.h"
#include "server/dynamic_batcher.h"

namespace attnserve::server {

// Bucket edges, in seconds, of every duration histogram: 100 us to 25 s.
const std::vector<double>& DurationBuckets();
// 1, 2, 4, ... up to and including `max` (rounded up to a power of two).
std::vector<double> PowerOfTwoBuckets(int64_t max);

// Label value for requests naming a model the server does not serve (bounded
// cardinality: the name itself is never a label).
inline constexpr char kUnknownModelLabel[] = "_unknown";

// Thread-safe for recording. Models are added during start-up (AddModel), before any
// recording for them; every label child is created then, so recording allocates
// nothing and takes no lock of ours (prometheus-cpp's counters are atomics; its
// histograms take a per-child mutex).
class ServerMetrics {
 public:
  ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // Creates `info.name`'s label children and its attnserve_model_info sample; returns
  // the observer its batcher reports through. Call once per model, before serving.
  BatcherObserver AddModel(const v1::ModelInfo& info);

  // The observer the AttentionService reports calls through.
  ServiceObserver service_observer();

  // Serves GET /metrics on host:port (port 0 picks a free one). Returns the bound port;
  // Unavailable when it cannot bind. Call at most once.
  absl::StatusOr<int> StartExposer(const std::string& host, int port);

  // The text exposition /metrics serves.
  std::string Render() const;

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  struct ModelMetrics {
    std::array<prometheus::Counter*, 17> requests_by_code{};
    prometheus::Histogram* request_duration = nullptr;
    prometheus::Histogram* refusal_duration = nullptr;
    prometheus::Histogram* queue_duration = nullptr;
    prometheus::Histogram* compute_duration = nullptr;
    prometheus::Histogram* batch_size = nullptr;
    prometheus::Histogram* batch_tokens = nullptr;
    prometheus::Counter* tokens = nullptr;
    prometheus::Gauge* queue_depth = nullptr;
    prometheus::Gauge* inflight = nullptr;
    std::vector<prometheus::Gauge*> device_memory;  // per instance
  };

  struct RpcMetrics {
    prometheus::Counter* started = nullptr;
    std::array<prometheus::Counter*, 17> handled{};
    prometheus::Histogram* handling = nullptr;
  };

  ModelMetrics& RequestSide(const std::string& model);
  ModelMetrics* FindModel(const std::string& model);
  RpcMetrics* FindRpc(absl::string_view method);
  void AddRpc(const std::string& method, const std::string& type,
              const std::string& service = "attnserve.v1.AttentionService");

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_total_;
  prometheus::Family<prometheus::Histogram>* request_duration_;
  prometheus::Family<prometheus::Histogram>* refusal_duration_;
  prometheus::Family<prometheus::Histogram>* queue_duration_;
  prometheus::Family<prometheus::Histogram>* compute_duration_;
  prometheus::Family<prometheus::Histogram>* batch_size_;
  prometheus::Family<prometheus::Histogram>* batch_tokens_;
  prometheus::Family<prometheus::Counter>* tokens_total_;
  prometheus::Family<prometheus::Gauge>* queue_depth_;
  prometheus::Family<prometheus::Gauge>* device_memory_;
  prometheus::Family<prometheus::Gauge>* queue_capacity_;
  prometheus::Family<prometheus::Gauge>* inflight_;
  prometheus::Family<prometheus::Gauge>* model_info_;
  prometheus::Family<prometheus::Counter>* rpc_started_;
  prometheus::Family<prometheus::Counter>* rpc_handled_;
  prometheus::Family<prometheus::Histogram>* rpc_handling_;

  // Written during start-up only; read-only while serving.
  std::map<std::string, ModelMetrics, std::less<>> models_;
  std::map<std::string, RpcMetrics, std::less<>> rpcs_;
  std::shared_ptr<prometheus::Collectable> process_metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVER_METRICS_H_
