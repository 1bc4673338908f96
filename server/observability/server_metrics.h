// ServerMetrics: attnserve's Prometheus metrics (the families in DESIGN.md, the
// go-grpc-prometheus RPC families, process metrics), their text exposition and the
// snapshots the status page draws.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_SERVER_METRICS_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "attnserve/v1/attention.pb.h"
#include "core/attention/attention_backend.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/batching/attention_executor.h"
#include "server/pipeline/request_pipeline.h"

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

  // Creates `info.name`'s label children (or takes the ones a model of that name made
  // before) and its attnserve_model_info sample; returns the observer its batcher
  // reports through. Called once per model load, any time. Thread-safe.
  BatcherObserver AddModel(const v1::ModelInfo& info);

  // Counts a model load, failed load or unload (attnserve_model_loads_total,
  // attnserve_model_unloads_total) and keeps attnserve_model_info and
  // attnserve_model_version to the models served now. Thread-safe.
  void OnModelEvent(const ModelEvent& event);

  // attnserve_projection_primitive_info: one series per f32 weight matrix shape and
  // thread count, labelled with the primitive the warm-up chose. Thread-safe.
  void SetProjectionChoices(const std::vector<core::CpuProjectionChoice>& choices);
  // attnserve_attention_kernel_info: the attention kernel timed fastest per head size
  // and thread count.
  void SetAttentionChoices(const std::vector<core::CpuAttentionChoice>& choices);

  // The observer the AttentionService reports calls through.
  ServiceObserver service_observer();

  // The text exposition GET /metrics serves (MetricsHttp).
  std::string Render() const;

  // A model's cumulative figures as Triton's ModelStatistics reports them: requests
  // answered OK and not (count, summed end-to-end time), time waited in the queue, and
  // batches computed (each request is charged its batch's compute time).
  struct InferenceTotals {
    uint64_t success_count = 0, success_ns = 0;
    uint64_t fail_count = 0, fail_ns = 0;
    uint64_t queue_count = 0, queue_ns = 0;
    uint64_t compute_count = 0, compute_ns = 0;  // per request
    uint64_t inference_count = 0;                // requests computed in batches
    uint64_t execution_count = 0;                // batches
    uint64_t last_inference_ms = 0;  // Unix time of the last answer, 0 before any
  };
  // Nullopt for a model that AddModel has not seen. Thread-safe.
  std::optional<InferenceTotals> Totals(const std::string& model) const;

  // A histogram's counts now: its buckets' upper bounds (the last is +Inf) with the
  // cumulative count of each, the number of samples and their sum.
  struct HistogramCounts {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative;
    uint64_t count = 0;
    double sum = 0;
  };
  // What the status page draws of a model: end-to-end latency (answered requests) and
  // batch sizes, cumulative since start, and the queue depth and requests in flight
  // now. Nullopt for a model that AddModel has not seen. Thread-safe.
  struct ModelSnapshot {
    HistogramCounts request_duration;
    HistogramCounts batch_size;
    int64_t queue_depth = 0;
    int64_t inflight = 0;
  };
  std::optional<ModelSnapshot> Snapshot(const std::string& model) const;

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
    prometheus::Histogram* request_tokens = nullptr;
    prometheus::Counter* truncated_texts = nullptr;
    prometheus::Counter* scored_sequences = nullptr;
    prometheus::Gauge* queue_depth = nullptr;
    prometheus::Gauge* inflight = nullptr;
    // Totals (relaxed atomics: each field is a monotonic sum, read as a snapshot).
    struct AtomicTotals {
      std::atomic<uint64_t> success_count{0}, success_ns{0}, fail_count{0}, fail_ns{0},
          queue_count{0}, queue_ns{0}, compute_count{0}, compute_ns{0},
          inference_count{0}, execution_count{0}, last_inference_ms{0};
    };
    std::unique_ptr<AtomicTotals> totals = std::make_unique<AtomicTotals>();
  };

  struct RpcMetrics {
    prometheus::Counter* started = nullptr;
    std::array<prometheus::Counter*, 17> handled{};
    prometheus::Histogram* handling = nullptr;
  };

  ModelMetrics& RequestSide(const std::string& model)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(models_mu_);
  ModelMetrics* FindModel(const std::string& model);
  RpcMetrics* FindRpc(absl::string_view method);
  // grpc_server_* samples for each method of `service`.
  void AddRpcs(const google::protobuf::ServiceDescriptor& service);
  void AddRpc(const std::string& method, const std::string& type,
              const std::string& service);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_total_;
  prometheus::Family<prometheus::Histogram>* request_duration_;
  prometheus::Family<prometheus::Histogram>* refusal_duration_;
  prometheus::Family<prometheus::Histogram>* queue_duration_;
  prometheus::Family<prometheus::Histogram>* compute_duration_;
  prometheus::Family<prometheus::Histogram>* batch_size_;
  prometheus::Family<prometheus::Histogram>* batch_tokens_;
  prometheus::Family<prometheus::Counter>* tokens_total_;
  prometheus::Family<prometheus::Histogram>* request_tokens_;
  prometheus::Family<prometheus::Counter>* truncated_texts_;
  prometheus::Family<prometheus::Counter>* scored_sequences_;
  prometheus::Family<prometheus::Gauge>* queue_depth_;
  prometheus::Family<prometheus::Gauge>* device_memory_;
  prometheus::Family<prometheus::Gauge>* queue_capacity_;
  prometheus::Family<prometheus::Gauge>* inflight_;
  prometheus::Family<prometheus::Gauge>* model_info_;
  prometheus::Family<prometheus::Gauge>* model_version_;
  prometheus::Family<prometheus::Gauge>* projection_info_;
  prometheus::Family<prometheus::Gauge>* attention_kernel_info_;
  prometheus::Family<prometheus::Counter>* model_loads_;
  prometheus::Family<prometheus::Counter>* model_unloads_;
  prometheus::Family<prometheus::Counter>* internal_errors_;
  prometheus::Counter* overloaded_ = nullptr;
  prometheus::Family<prometheus::Counter>* rpc_started_;
  prometheus::Family<prometheus::Counter>* rpc_handled_;
  prometheus::Family<prometheus::Histogram>* rpc_handling_;

  // Grows when a model of a new name loads; an entry, once made, stays.
  mutable absl::Mutex models_mu_;
  std::map<std::string, ModelMetrics, std::less<>> models_ ABSL_GUARDED_BY(models_mu_);
  // Each served model's attnserve_model_info sample (its labels change with a reload).
  std::map<std::string, prometheus::Gauge*> info_samples_ ABSL_GUARDED_BY(models_mu_);
  // Written during start-up only; read-only while serving.
  std::map<std::string, RpcMetrics, std::less<>> rpcs_;
  std::shared_ptr<prometheus::Collectable> process_metrics_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_SERVER_METRICS_H_
