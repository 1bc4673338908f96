// Tracing: W3C Trace Context (traceparent / tracestate) parsing and formatting, the
// parent-based ratio sampler, span records, and a Tracer that sends finished spans to an
// OpenTelemetry collector over OTLP/gRPC from a background thread.
//
// A request's spans are built after the fact: the door parses the caller's headers
// (ParseTraceContext), asks the Tracer for the server span's context (NewSpanContext),
// answers with FormatTraceparent of it, and once the request is answered, when the
// context is sampled, fills one SpanRecord per step (times it measured) and Submits them.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_TRACING_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_TRACING_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "opentelemetry/proto/collector/trace/v1/trace_service.grpc.pb.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace attnserve::server {

// Ids as their wire bytes (the order of their hex form). All zero is invalid.
using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

// The propagated part of a span: what traceparent and tracestate carry.
struct SpanContext {
  TraceId trace_id{};
  SpanId span_id{};
  // Trace flags bit 0: the trace is recorded and exported.
  bool sampled = false;
  // The tracestate header value, carried unchanged; "" when absent or dropped.
  std::string trace_state;

  // Both ids are non-zero.
  bool IsValid() const;
};

// Longest tracestate carried, in bytes; a longer one is dropped (W3C asks vendors to
// propagate at least 512).
inline constexpr size_t kMaxTraceStateBytes = 512;

// Parses a traceparent header value (version 00 rules; a later version's first four
// fields are read and the rest ignored, as W3C Trace Context says) and attaches
// `tracestate` (several tracestate headers joined with ","). Surrounding blanks are
// ignored. A tracestate longer than kMaxTraceStateBytes, or not a list of at most 32
// `key=value` members with valid keys and values and no repeated key, is dropped (""):
// it never fails the parse. The views are read during the call only.
// Returns the caller's context (span_id is the caller's span, the remote parent), or
// InvalidArgument naming the field (length, version, trace-id, parent-id, trace-flags)
// when traceparent is malformed: uppercase or non-hex digits, a wrong length or dash,
// version ff, an all-zero id. The caller then starts a new trace.
absl::StatusOr<SpanContext> ParseTraceContext(absl::string_view traceparent,
                                              absl::string_view tracestate);

// The traceparent header value of `context`: "00-<trace-id>-<span-id>-<flags>" in
// lowercase hex, flags "01" when sampled, else "00". tracestate is context.trace_state.
std::string FormatTraceparent(const SpanContext& context);

// Parent-based sampling: a span with a valid parent follows the parent's sampled flag; a
// new root is sampled when the low 8 bytes of its trace id, read big-endian, are below
// ratio · 2^64 (OpenTelemetry's TraceIdRatioBased). Immutable, thread-safe.
class Sampler {
 public:
  // `ratio` is the share of new traces sampled; REQUIRES: 0 <= ratio <= 1 (outside is
  // clamped; NaN samples nothing).
  explicit Sampler(double ratio);

  // Whether the span with `trace_id` and `parent` (nullptr or invalid: a root) is
  // sampled.
  bool ShouldSample(const SpanContext* parent, const TraceId& trace_id) const;

 private:
  bool sample_all_;          // ratio >= 1: the bound 2^64 does not fit 64 bits
  uint64_t trace_id_bound_;  // ratio · 2^64, rounded
};

enum class SpanKind { kInternal, kServer, kClient, kProducer, kConsumer };

enum class SpanStatusCode { kUnset, kOk, kError };

// One attribute. The value type picks the OTLP value (string, int, double, bool); a
// string literal is a string and a plain int an int64.
struct SpanAttribute {
  std::string key;
  std::variant<std::string, int64_t, double, bool> value;
};

// A reference to a span in this or another trace (e.g. the requests of one batch).
struct SpanLink {
  TraceId trace_id{};
  SpanId span_id{};
  std::vector<SpanAttribute> attributes;
};

// One finished span, as the caller measured it. Exported as is: no limit is applied to
// names, attributes or links here.
struct SpanRecord {
  // Trace id, span id, sampled flag and tracestate (from NewSpanContext).
  SpanContext context;
  // The parent's span id; all zero for a root span.
  SpanId parent_span_id{};
  std::string name;
  SpanKind kind = SpanKind::kInternal;
  absl::Time start_time;
  absl::Time end_time;
  std::vector<SpanAttribute> attributes;
  std::vector<SpanLink> links;
  SpanStatusCode status_code = SpanStatusCode::kUnset;
  // Sent only with kError, as OTLP asks.
  std::string status_message;
};

// Why a span was counted as dropped instead of exported.
enum class DropReason {
  kQueueFull,     // Submit found max_queue_spans waiting ("queue_full")
  kExportFailed,  // the RPC failed, or the collector rejected the span ("export_failed")
  kShutdown,      // after Shutdown, or left when the final flush ran out ("shutdown")
};

// Samples new spans and exports submitted ones to an OTLP/gRPC collector.
//
// Submit only moves spans onto a bounded queue; one background thread, owned and joined
// by the Tracer, takes batches of up to max_export_batch spans (as soon as a batch is
// full, or every export_interval) and sends each in one Export RPC with a deadline of
// export_timeout. A collector that is down or slow costs only dropped spans: a failed
// batch is dropped and counted, never retried, and a full queue drops new spans.
// Counters: exported_spans(), dropped_spans(reason), and when a registry is given
// attnserve_trace_spans_exported_total and attnserve_trace_spans_dropped_total{reason}.
//
// Thread-safe: every method may be called from any thread, except that Shutdown and the
// destructor run once, from one thread.
class Tracer {
 public:
  struct Options {
    // Required. The collector, "host:port" or "http://host:port" (plaintext gRPC; no
    // TLS; IPv6 as "[addr]:port"). Any OTLP/gRPC receiver: the OpenTelemetry
    // Collector, Jaeger, Tempo (their OTLP/gRPC port is 4317).
    std::string otlp_endpoint;
    // Share of new traces (no sampled or unsampled parent) sampled, in [0, 1].
    double sampler_ratio = 1.0;
    // The resource's service.name and service.version. service_name must not be empty.
    std::string service_name = "attnserve";
    std::string service_version;
    // Spans waiting for export, in [1, 1048576]; more are dropped (queue_full).
    int max_queue_spans = 2048;
    // Spans per Export RPC, in [1, max_queue_spans].
    int max_export_batch = 512;
    // Longest a span waits before a batch that is not full is sent; positive, finite.
    absl::Duration export_interval = absl::Seconds(1);
    // Deadline of one Export RPC, and the bound on Shutdown's final flush; positive,
    // finite.
    absl::Duration export_timeout = absl::Seconds(5);
  };

  // Validates `options`, creates the gRPC channel (which connects lazily: nothing
  // blocks on the collector) and starts the export thread. `registry`, when not null,
  // gets the two counter families and must outlive the Tracer.
  // Returns InvalidArgument naming the field, its value and the allowed range when an
  // option is out of range: an empty or unparsable otlp_endpoint (or one with a scheme
  // other than http://), sampler_ratio outside [0, 1], an empty service_name,
  // max_queue_spans or max_export_batch out of range, a non-positive or infinite
  // export_interval or export_timeout.
  static absl::StatusOr<std::unique_ptr<Tracer>> Create(
      const Options& options, prometheus::Registry* registry = nullptr);

  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;
  // Shutdown().
  ~Tracer();

  // A new span's context: a child of `parent` when it is valid (its trace id, sampled
  // flag and tracestate, a new span id), else the root of a new trace (new ids, sampled
  // by sampler_ratio, no tracestate). `parent` may be null; it is read during the call
  // only. Never blocks on I/O.
  SpanContext NewSpanContext(const SpanContext* parent) const;

  // Queues the sampled spans of `spans` for export and returns; spans whose
  // context.sampled is false are ignored (build them only for sampled contexts).
  // Never blocks on the network: takes the queue's lock only. Spans that do not fit in
  // max_queue_spans are dropped (queue_full); after Shutdown all are dropped (shutdown).
  void Submit(std::vector<SpanRecord> spans);

  // Stops taking spans, exports what is queued within export_timeout (an Export RPC
  // still running then is cancelled; spans left are dropped as shutdown), and joins the
  // export thread. Blocks for at most about export_timeout. Idempotent.
  void Shutdown();

  // Spans the collector accepted, and spans dropped for `reason`, since Create.
  int64_t exported_spans() const;
  int64_t dropped_spans(DropReason reason) const;

 private:
  using TraceServiceStub =
      opentelemetry::proto::collector::trace::v1::TraceService::StubInterface;
  static constexpr int kDropReasons = 3;

  Tracer(const Options& options, std::unique_ptr<TraceServiceStub> stub,
         prometheus::Registry* registry);

  // The export thread: waits for a full batch, the interval or Shutdown, and exports.
  void ExportLoop();
  // Sends one batch in `context` (its deadline set, published as in_flight_) and counts
  // the outcome.
  void Export(std::vector<SpanRecord> batch, grpc::ClientContext* context);
  void CountExported(int64_t spans);
  void CountDropped(DropReason reason, int64_t spans);
  bool BatchReadyOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const Sampler sampler_;
  const std::unique_ptr<TraceServiceStub> stub_;

  std::atomic<int64_t> exported_spans_{0};
  std::array<std::atomic<int64_t>, kDropReasons> dropped_spans_{};
  // Prometheus children (null without a registry); counters are atomic.
  prometheus::Counter* exported_counter_ = nullptr;
  std::array<prometheus::Counter*, kDropReasons> dropped_counters_{};

  absl::Mutex mu_;
  std::deque<SpanRecord> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // When the final flush must end; set by Shutdown.
  absl::Time flush_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The running Export RPC's context, so that Shutdown can cancel it at its deadline.
  grpc::ClientContext* in_flight_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool export_thread_done_ ABSL_GUARDED_BY(mu_) = false;

  std::thread export_thread_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_TRACING_H_
