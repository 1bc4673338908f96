#include "server/observability/server_metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "attnserve/v1/attention.pb.h"
#include "core/attention/model_spec.h"
#include "google/protobuf/descriptor.h"
#include "inference/grpc_service.pb.h"
#include "prometheus/collectable.h"
#include "prometheus/text_serializer.h"
#include "server/models/model_loader.h"
#include "server/models/model_registry.h"

namespace attnserve::server {

namespace {

constexpr int kCodes = 17;

// attnserve_requests_total{code}: gRPC's own upper-case code names.
constexpr std::array<const char*, kCodes> kCodeNames = {"OK",
                                                        "CANCELLED",
                                                        "UNKNOWN",
                                                        "INVALID_ARGUMENT",
                                                        "DEADLINE_EXCEEDED",
                                                        "NOT_FOUND",
                                                        "ALREADY_EXISTS",
                                                        "PERMISSION_DENIED",
                                                        "RESOURCE_EXHAUSTED",
                                                        "FAILED_PRECONDITION",
                                                        "ABORTED",
                                                        "OUT_OF_RANGE",
                                                        "UNIMPLEMENTED",
                                                        "INTERNAL",
                                                        "UNAVAILABLE",
                                                        "DATA_LOSS",
                                                        "UNAUTHENTICATED"};

// grpc_server_handled_total{grpc_code}: the spelling go-grpc-prometheus exports, so
// existing gRPC dashboards and alerts match.
constexpr std::array<const char*, kCodes> kGoCodeNames = {"OK",
                                                          "Canceled",
                                                          "Unknown",
                                                          "InvalidArgument",
                                                          "DeadlineExceeded",
                                                          "NotFound",
                                                          "AlreadyExists",
                                                          "PermissionDenied",
                                                          "ResourceExhausted",
                                                          "FailedPrecondition",
                                                          "Aborted",
                                                          "OutOfRange",
                                                          "Unimplemented",
                                                          "Internal",
                                                          "Unavailable",
                                                          "DataLoss",
                                                          "Unauthenticated"};

size_t CodeIndex(absl::StatusCode code) {
  const int value = static_cast<int>(code);
  return value >= 0 && value < kCodes ? static_cast<size_t>(value)
                                      : static_cast<size_t>(absl::StatusCode::kUnknown);
}

double Seconds(absl::Duration duration) { return absl::ToDoubleSeconds(duration); }

// process_* metrics every Prometheus client library exports, read from /proc at
// scrape time.
class ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families;
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    std::ifstream stat_file("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)),
                     std::istreambuf_iterator<char>());
    // Fields after the parenthesised command name, which may itself hold spaces.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return families;
    const std::vector<std::string> fields =
        absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
    // fields[0] is field 3 (state) of proc(5); field N is fields[N - 3].
    const auto field = [&](int number) {
      double value = 0;
      if (number - 3 < static_cast<int>(fields.size())) {
        (void)absl::SimpleAtod(fields[number - 3], &value);
      }
      return value;
    };
    Add(families, "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        prometheus::MetricType::Counter, (field(14) + field(15)) / ticks);
    Add(families, "process_resident_memory_bytes", "Resident memory size in bytes.",
        prometheus::MetricType::Gauge, field(24) * page);
    Add(families, "process_virtual_memory_bytes", "Virtual memory size in bytes.",
        prometheus::MetricType::Gauge, field(23));
    Add(families, "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        prometheus::MetricType::Gauge, BootTime() + field(22) / ticks);
    Add(families, "process_open_fds", "Number of open file descriptors.",
        prometheus::MetricType::Gauge, OpenFds());
    return families;
  }

 private:
  static void Add(std::vector<prometheus::MetricFamily>& families,
                  const std::string& name, const std::string& help,
                  prometheus::MetricType type, double value) {
    prometheus::MetricFamily family;
    family.name = name;
    family.help = help;
    family.type = type;
    prometheus::ClientMetric metric;
    if (type == prometheus::MetricType::Counter) {
      metric.counter.value = value;
    } else {
      metric.gauge.value = value;
    }
    family.metric.push_back(std::move(metric));
    families.push_back(std::move(family));
  }

  static double BootTime() {
    std::ifstream stat("/proc/stat");
    std::string key;
    while (stat >> key) {
      if (key == "btime") {
        double value = 0;
        stat >> value;
        return value;
      }
      stat.ignore(1 << 20, '\n');
    }
    return 0;
  }

  static double OpenFds() {
    DIR* dir = opendir("/proc/self/fd");
    if (dir == nullptr) return 0;
    double count = 0;
    while (const dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') ++count;
    }
    closedir(dir);
    return count - 1;  // the descriptor opendir itself holds
  }
};

}  // namespace

const std::vector<double>& DurationBuckets() {
  static const std::vector<double>* const buckets = new std::vector<double>{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
      0.1,    0.25,    0.5,    1,     2.5,    5,     10,   25};
  return *buckets;
}

std::vector<double> PowerOfTwoBuckets(int64_t max) {
  std::vector<double> buckets;
  for (int64_t edge = 1;; edge *= 2) {
    buckets.push_back(static_cast<double>(edge));
    if (edge >= max) break;
  }
  return buckets;
}

ServerMetrics::ServerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  requests_total_ =
      &prometheus::BuildCounter()
           .Name("attnserve_requests_total")
           .Help("Requests finished (every door and model kind), by model and gRPC code.")
           .Register(*registry_);
  request_duration_ = &prometheus::BuildHistogram()
                           .Name("attnserve_request_duration_seconds")
                           .Help("Time from receiving a request to answering it.")
                           .Register(*registry_);
  refusal_duration_ =
      &prometheus::BuildHistogram()
           .Name("attnserve_refusal_duration_seconds")
           .Help(
               "Time from receiving a request to refusing it with RESOURCE_EXHAUSTED "
               "(queue full by count or bytes): how fast excess load is shed.")
           .Register(*registry_);
  queue_duration_ = &prometheus::BuildHistogram()
                         .Name("attnserve_queue_duration_seconds")
                         .Help("Time requests waited in the batcher queue.")
                         .Register(*registry_);
  compute_duration_ = &prometheus::BuildHistogram()
                           .Name("attnserve_compute_duration_seconds")
                           .Help("Time one batch took in the attention core.")
                           .Register(*registry_);
  batch_size_ = &prometheus::BuildHistogram()
                     .Name("attnserve_batch_size")
                     .Help("Requests per executed batch.")
                     .Register(*registry_);
  batch_tokens_ = &prometheus::BuildHistogram()
                       .Name("attnserve_batch_tokens")
                       .Help("Query tokens per executed batch.")
                       .Register(*registry_);
  tokens_total_ = &prometheus::BuildCounter()
                       .Name("attnserve_tokens_total")
                       .Help("Query tokens computed.")
                       .Register(*registry_);
  request_tokens_ = &prometheus::BuildHistogram()
                         .Name("attnserve_request_tokens")
                         .Help(
                             "Tokens per answered request (query tokens; an encoder's "
                             "tokens after tokenizing its text).")
                         .Register(*registry_);
  truncated_texts_ = &prometheus::BuildCounter()
                          .Name("attnserve_truncated_texts_total")
                          .Help(
                              "Texts cut to the model's max_text_tokens because the "
                              "request asked to truncate.")
                          .Register(*registry_);
  scored_sequences_ = &prometheus::BuildCounter()
                           .Name("attnserve_scored_sequences_total")
                           .Help(
                               "Texts or pairs a classification model answered with "
                               "scores (a rerank's documents).")
                           .Register(*registry_);
  queue_depth_ = &prometheus::BuildGauge()
                      .Name("attnserve_queue_depth")
                      .Help("Requests waiting in the batcher queue now.")
                      .Register(*registry_);
  device_memory_ = &prometheus::BuildGauge()
                        .Name("attnserve_device_memory_bytes")
                        .Help(
                            "GPU memory each model instance holds (weights and "
                            "scratch); 0 on the CPU.")
                        .Register(*registry_);
  queue_capacity_ = &prometheus::BuildGauge()
                         .Name("attnserve_queue_capacity")
                         .Help(
                             "Queued requests beyond which new ones are rejected "
                             "(max_queue_size).")
                         .Register(*registry_);
  inflight_ = &prometheus::BuildGauge()
                   .Name("attnserve_inflight_requests")
                   .Help("Requests received and not yet answered.")
                   .Register(*registry_);
  model_info_ = &prometheus::BuildGauge()
                     .Name("attnserve_model_info")
                     .Help("Served models (always 1); labels describe the model.")
                     .Register(*registry_);
  model_version_ = &prometheus::BuildGauge()
                        .Name("attnserve_model_version")
                        .Help("The version each served model answers with.")
                        .Register(*registry_);
  projection_info_ =
      &prometheus::BuildGauge()
           .Name("attnserve_projection_primitive_info")
           .Help(
               "The oneDNN primitive the warm-up timed fastest for each f32 "
               "weight matrix (always 1).")
           .Register(*registry_);
  attention_kernel_info_ =
      &prometheus::BuildGauge()
           .Name("attnserve_attention_kernel_info")
           .Help(
               "The attention kernel the warm-up timed fastest for long f32 sequences, "
               "per head size and thread count (always 1).")
           .Register(*registry_);
  model_loads_ = &prometheus::BuildCounter()
                      .Name("attnserve_model_loads_total")
                      .Help(
                          "Model loads by outcome (ok, failed): at start and through "
                          "the repository API or polling.")
                      .Register(*registry_);
  model_unloads_ = &prometheus::BuildCounter()
                        .Name("attnserve_model_unloads_total")
                        .Help("Models unloaded while the server ran.")
                        .Register(*registry_);
  rpc_started_ = &prometheus::BuildCounter()
                      .Name("grpc_server_started_total")
                      .Help("Total number of RPCs started on the server.")
                      .Register(*registry_);
  rpc_handled_ = &prometheus::BuildCounter()
                      .Name("grpc_server_handled_total")
                      .Help(
                          "Total number of RPCs completed on the server, regardless of "
                          "success or failure.")
                      .Register(*registry_);
  rpc_handling_ = &prometheus::BuildHistogram()
                       .Name("grpc_server_handling_seconds")
                       .Help(
                           "Histogram of response latency (seconds) of gRPC that had "
                           "been application-level handled by the server.")
                       .Register(*registry_);
  internal_errors_ =
      &prometheus::BuildCounter()
           .Name("attnserve_internal_errors_total")
           .Help(
               "Exceptions a front door caught at its boundary and answered as an "
               "internal error (500 / INTERNAL), by door: each is a bug to report.")
           .Register(*registry_);
  // Exported at 0 from the start, so that an alert can tell "none" from "not scraped".
  internal_errors_->Add({{"door", "kserve_http"}});
  overloaded_ = &prometheus::BuildCounter()
                     .Name("attnserve_requests_overloaded_total")
                     .Help(
                         "Calls refused at once (RESOURCE_EXHAUSTED, HTTP 429) because "
                         "--max_concurrent_requests calls were in flight.")
                     .Register(*registry_)
                     .Add({});
  // Every method of both services, read from their descriptors: an RPC added to a
  // .proto is counted without a list here to forget it in.
  AddRpcs(
      *v1::AttendRequest::descriptor()->file()->FindServiceByName("AttentionService"));
  AddRpcs(*inference::ModelInferRequest::descriptor()->file()->FindServiceByName(
      "GRPCInferenceService"));
  {
    absl::MutexLock lock(&models_mu_);
    RequestSide(kUnknownModelLabel);
  }
  process_metrics_ = std::make_shared<ProcessCollector>();
}

void ServerMetrics::AddRpcs(const google::protobuf::ServiceDescriptor& service) {
  for (int i = 0; i < service.method_count(); ++i) {
    const google::protobuf::MethodDescriptor& method = *service.method(i);
    const char* type = method.client_streaming()
                           ? (method.server_streaming() ? "bidi_stream" : "client_stream")
                           : (method.server_streaming() ? "server_stream" : "unary");
    AddRpc(method.name(), type, service.full_name());
  }
}

void ServerMetrics::AddRpc(const std::string& method, const std::string& type,
                           const std::string& service) {
  const prometheus::Labels labels = {
      {"grpc_service", service}, {"grpc_method", method}, {"grpc_type", type}};
  RpcMetrics& rpc = rpcs_[method];
  rpc.started = &rpc_started_->Add(labels);
  for (int code = 0; code < kCodes; ++code) {
    prometheus::Labels with_code = labels;
    with_code["grpc_code"] = kGoCodeNames[code];
    rpc.handled[code] = &rpc_handled_->Add(with_code);
  }
  rpc.handling = &rpc_handling_->Add(labels, DurationBuckets());
}

ServerMetrics::ModelMetrics& ServerMetrics::RequestSide(const std::string& model) {
  ModelMetrics& metrics = models_[model];
  for (int code = 0; code < kCodes; ++code) {
    metrics.requests_by_code[code] =
        &requests_total_->Add({{"model", model}, {"code", kCodeNames[code]}});
  }
  metrics.request_duration =
      &request_duration_->Add({{"model", model}}, DurationBuckets());
  // Refusals take microseconds: finer buckets than requests.
  metrics.refusal_duration = &refusal_duration_->Add(
      {{"model", model}},
      prometheus::Histogram::BucketBoundaries{0.00001, 0.000025, 0.00005, 0.0001, 0.00025,
                                              0.0005, 0.001, 0.0025, 0.005, 0.01});
  metrics.inflight = &inflight_->Add({{"model", model}});
  return metrics;
}

BatcherObserver ServerMetrics::AddModel(const v1::ModelInfo& info) {
  absl::MutexLock lock(&models_mu_);
  const auto found = models_.find(info.name());
  const bool seen = found != models_.end();
  ModelMetrics& metrics = seen ? found->second : RequestSide(info.name());
  const prometheus::Labels labels = {{"model", info.name()}};
  if (!seen) {
    // A reloaded model keeps its series: the buckets are the first load's.
    metrics.queue_duration = &queue_duration_->Add(labels, DurationBuckets());
    metrics.compute_duration = &compute_duration_->Add(labels, DurationBuckets());
    metrics.batch_size =
        &batch_size_->Add(labels, PowerOfTwoBuckets(info.batching().max_batch_size()));
    metrics.batch_tokens = &batch_tokens_->Add(
        labels, PowerOfTwoBuckets(info.batching().max_batch_tokens()));
    metrics.tokens = &tokens_total_->Add(labels);
    metrics.request_tokens = &request_tokens_->Add(
        labels, PowerOfTwoBuckets(info.batching().max_batch_tokens()));
    // Every model has the series (0 where no text comes in), so that dashboards and
    // the documented list do not depend on which models are loaded.
    metrics.truncated_texts = &truncated_texts_->Add(labels);
    metrics.scored_sequences = &scored_sequences_->Add(labels);
    metrics.queue_depth = &queue_depth_->Add(labels);
  }
  queue_capacity_->Add(labels).Set(info.batching().max_queue_size());
  if (auto it = info_samples_.find(info.name()); it != info_samples_.end()) {
    model_info_->Remove(it->second);
  }
  prometheus::Gauge& sample = model_info_->Add(
      {{"model", info.name()},
       {"d_model", absl::StrCat(info.d_model())},
       {"heads", absl::StrCat(info.num_heads())},
       {"precision", std::string(core::PrecisionName(ToCorePrecision(info.precision())))},
       {"device", info.device()}});
  sample.Set(1);
  info_samples_[info.name()] = &sample;

  std::vector<prometheus::Gauge*> device_memory;  // per instance
  for (int i = 0; i < std::max(1, info.batching().instances()); ++i) {
    device_memory.push_back(&device_memory_->Add({{"model", info.name()},
                                                  {"device", info.device()},
                                                  {"instance", absl::StrCat(i)}}));
  }

  ModelMetrics* model = &metrics;
  BatcherObserver observer;
  observer.on_batch = [model](int batch_size, int64_t tokens, absl::Duration compute) {
    auto& totals = *model->totals;
    const auto nanoseconds = static_cast<uint64_t>(absl::ToInt64Nanoseconds(compute));
    totals.execution_count.fetch_add(1, std::memory_order_relaxed);
    totals.inference_count.fetch_add(batch_size, std::memory_order_relaxed);
    totals.compute_count.fetch_add(batch_size, std::memory_order_relaxed);
    totals.compute_ns.fetch_add(nanoseconds * batch_size, std::memory_order_relaxed);
    model->batch_size->Observe(batch_size);
    model->batch_tokens->Observe(static_cast<double>(tokens));
    model->tokens->Increment(static_cast<double>(tokens));
    model->compute_duration->Observe(Seconds(compute));
  };
  observer.on_dequeue = [model](absl::Duration queued) {
    model->totals->queue_count.fetch_add(1, std::memory_order_relaxed);
    model->totals->queue_ns.fetch_add(
        static_cast<uint64_t>(absl::ToInt64Nanoseconds(queued)),
        std::memory_order_relaxed);
    model->queue_duration->Observe(Seconds(queued));
  };
  observer.on_queue_depth = [model](int64_t depth) {
    model->queue_depth->Set(static_cast<double>(depth));
  };
  observer.on_device_memory = [device_memory](int instance, int64_t bytes) {
    if (instance >= 0 && static_cast<size_t>(instance) < device_memory.size()) {
      device_memory[instance]->Set(static_cast<double>(bytes));
    }
  };
  return observer;
}

void ServerMetrics::OnModelEvent(const ModelEvent& event) {
  switch (event.kind) {
    case ModelEvent::Kind::kLoaded: {
      model_loads_->Add({{"model", event.model}, {"outcome", "ok"}}).Increment();
      model_unloads_->Add({{"model", event.model}});  // 0 until one is
      double version = 0;
      if (absl::SimpleAtod(event.version, &version)) {
        model_version_->Add({{"model", event.model}}).Set(version);
      }
      break;
    }
    case ModelEvent::Kind::kLoadFailed:
      model_loads_->Add({{"model", event.model}, {"outcome", "failed"}}).Increment();
      break;
    case ModelEvent::Kind::kUnloaded: {
      model_unloads_->Add({{"model", event.model}}).Increment();
      absl::MutexLock lock(&models_mu_);
      if (auto it = info_samples_.find(event.model); it != info_samples_.end()) {
        model_info_->Remove(it->second);
        info_samples_.erase(it);
      }
      model_version_->Remove(&model_version_->Add({{"model", event.model}}));
      break;
    }
    case ModelEvent::Kind::kFreed:
      break;
  }
}

void ServerMetrics::SetProjectionChoices(
    const std::vector<core::CpuProjectionChoice>& choices) {
  for (const core::CpuProjectionChoice& choice : choices) {
    projection_info_
        ->Add({{"in_features", absl::StrCat(choice.in_features)},
               {"out_features", absl::StrCat(choice.out_features)},
               {"threads", absl::StrCat(choice.intra_op_threads)},
               {"primitive", choice.runtime_rows ? "runtime_rows" : "per_shape"}})
        .Set(1);
  }
}

void ServerMetrics::SetAttentionChoices(
    const std::vector<core::CpuAttentionChoice>& choices) {
  for (const core::CpuAttentionChoice& choice : choices) {
    attention_kernel_info_
        ->Add({{"head_dim", absl::StrCat(choice.head_dim)},
               {"threads", absl::StrCat(choice.intra_op_threads)},
               {"kernel", choice.kernel},
               {"flash_tiles", choice.flash_tiles}})
        .Set(1);
  }
}

ServerMetrics::ModelMetrics* ServerMetrics::FindModel(const std::string& model) {
  absl::ReaderMutexLock lock(&models_mu_);
  const auto it = models_.find(model.empty() ? kUnknownModelLabel : model);
  return it == models_.end() ? &models_.find(kUnknownModelLabel)->second : &it->second;
}

ServerMetrics::RpcMetrics* ServerMetrics::FindRpc(absl::string_view method) {
  const auto it = rpcs_.find(method);
  return it == rpcs_.end() ? nullptr : &it->second;
}

ServiceObserver ServerMetrics::service_observer() {
  ServiceObserver observer;
  observer.on_rpc_started = [this](absl::string_view method) {
    if (RpcMetrics* rpc = FindRpc(method)) rpc->started->Increment();
  };
  observer.on_rpc_handled = [this](absl::string_view method, absl::StatusCode code,
                                   absl::Duration elapsed) {
    if (RpcMetrics* rpc = FindRpc(method)) {
      rpc->handled[CodeIndex(code)]->Increment();
      rpc->handling->Observe(Seconds(elapsed));
    }
  };
  observer.on_overloaded = [this] { overloaded_->Increment(); };
  observer.on_internal_error = [this](absl::string_view door) {
    internal_errors_->Add({{"door", std::string(door)}}).Increment();
  };
  observer.on_texts_truncated = [this](const std::string& model, int64_t texts) {
    ModelMetrics* metrics = FindModel(model);
    if (metrics->truncated_texts != nullptr) {
      metrics->truncated_texts->Increment(static_cast<double>(texts));
    }
  };
  observer.on_sequences_scored = [this](const std::string& model, int64_t sequences) {
    ModelMetrics* metrics = FindModel(model);
    if (metrics->scored_sequences != nullptr) {
      metrics->scored_sequences->Increment(static_cast<double>(sequences));
    }
  };
  observer.on_request_started = [this](const std::string& model) {
    FindModel(model)->inflight->Increment();
  };
  observer.on_request_finished = [this](const std::string& model,
                                        const absl::Status& status,
                                        absl::Duration elapsed, int64_t tokens) {
    ModelMetrics* metrics = FindModel(model);
    if (status.ok() && tokens > 0 && metrics->request_tokens != nullptr) {
      metrics->request_tokens->Observe(static_cast<double>(tokens));
    }
    // Counted as finished before it leaves in-flight, so that a scrape never sees the
    // request in neither (in flight + finished never dips).
    metrics->requests_by_code[CodeIndex(status.code())]->Increment();
    metrics->inflight->Decrement();
    metrics->request_duration->Observe(Seconds(elapsed));
    auto& totals = *metrics->totals;
    const auto nanoseconds = static_cast<uint64_t>(absl::ToInt64Nanoseconds(elapsed));
    if (status.ok()) {
      totals.success_count.fetch_add(1, std::memory_order_relaxed);
      totals.success_ns.fetch_add(nanoseconds, std::memory_order_relaxed);
      totals.last_inference_ms.store(
          static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())),
          std::memory_order_relaxed);
    } else {
      totals.fail_count.fetch_add(1, std::memory_order_relaxed);
      totals.fail_ns.fetch_add(nanoseconds, std::memory_order_relaxed);
    }
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      metrics->refusal_duration->Observe(Seconds(elapsed));
    }
  };
  return observer;
}

std::optional<ServerMetrics::InferenceTotals> ServerMetrics::Totals(
    const std::string& model) const {
  absl::ReaderMutexLock lock(&models_mu_);
  const auto it = models_.find(model);
  if (it == models_.end() || model == kUnknownModelLabel) return std::nullopt;
  const ModelMetrics::AtomicTotals& totals = *it->second.totals;
  const auto read = [](const std::atomic<uint64_t>& value) {
    return value.load(std::memory_order_relaxed);
  };
  InferenceTotals snapshot;
  snapshot.success_count = read(totals.success_count);
  snapshot.success_ns = read(totals.success_ns);
  snapshot.fail_count = read(totals.fail_count);
  snapshot.fail_ns = read(totals.fail_ns);
  snapshot.queue_count = read(totals.queue_count);
  snapshot.queue_ns = read(totals.queue_ns);
  snapshot.compute_count = read(totals.compute_count);
  snapshot.compute_ns = read(totals.compute_ns);
  snapshot.inference_count = read(totals.inference_count);
  snapshot.execution_count = read(totals.execution_count);
  snapshot.last_inference_ms = read(totals.last_inference_ms);
  return snapshot;
}

namespace {

ServerMetrics::HistogramCounts CountsOf(const prometheus::Histogram* histogram) {
  ServerMetrics::HistogramCounts counts;
  if (histogram == nullptr) return counts;
  const prometheus::ClientMetric metric = histogram->Collect();
  counts.count = metric.histogram.sample_count;
  counts.sum = metric.histogram.sample_sum;
  for (const auto& bucket : metric.histogram.bucket) {
    counts.upper_bounds.push_back(bucket.upper_bound);
    counts.cumulative.push_back(bucket.cumulative_count);
  }
  return counts;
}

}  // namespace

std::optional<ServerMetrics::ModelSnapshot> ServerMetrics::Snapshot(
    const std::string& model) const {
  absl::ReaderMutexLock lock(&models_mu_);
  const auto it = models_.find(model);
  if (it == models_.end() || model == kUnknownModelLabel) return std::nullopt;
  const ModelMetrics& metrics = it->second;
  ModelSnapshot snapshot;
  snapshot.request_duration = CountsOf(metrics.request_duration);
  snapshot.batch_size = CountsOf(metrics.batch_size);
  if (metrics.queue_depth != nullptr) {
    snapshot.queue_depth = static_cast<int64_t>(metrics.queue_depth->Value());
  }
  if (metrics.inflight != nullptr) {
    snapshot.inflight = static_cast<int64_t>(metrics.inflight->Value());
  }
  return snapshot;
}

std::string ServerMetrics::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (auto& family : process_metrics_->Collect()) families.push_back(std::move(family));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace attnserve::server
