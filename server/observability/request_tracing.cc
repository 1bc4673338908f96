#include "server/observability/request_tracing.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"

namespace attnserve::server {

std::vector<SpanRecord> RequestSpans(const RequestTrace& trace, const Tracer& tracer) {
  absl::StatusOr<SpanContext> remote =
      trace.traceparent.empty()
          ? absl::StatusOr<SpanContext>(absl::NotFoundError("no traceparent"))
          : ParseTraceContext(trace.traceparent, trace.tracestate);
  const SpanContext* parent = remote.ok() ? &*remote : nullptr;
  const SpanContext server = tracer.NewSpanContext(parent);
  std::vector<SpanRecord> spans;
  if (!server.sampled) return spans;

  SpanRecord root;
  root.context = server;
  if (parent != nullptr) root.parent_span_id = parent->span_id;
  root.name = trace.name.empty() ? "attnserve request" : trace.name;
  root.kind = SpanKind::kServer;
  root.start_time = trace.start;
  root.end_time = trace.end;
  // The door: an HTTP route ("POST /embed") or a gRPC method ("package.Service/Method").
  const size_t space = trace.name.find(' ');
  if (space != std::string::npos) {
    root.attributes.push_back({"http.request.method", trace.name.substr(0, space)});
    root.attributes.push_back({"url.path", trace.name.substr(space + 1)});
  } else if (const size_t slash = trace.name.find('/'); slash != std::string::npos) {
    root.attributes.push_back({"rpc.system", std::string("grpc")});
    root.attributes.push_back({"rpc.service", trace.name.substr(0, slash)});
    root.attributes.push_back({"rpc.method", trace.name.substr(slash + 1)});
  }
  if (!trace.model.empty()) {
    root.attributes.push_back({"gen_ai.request.model", trace.model});
    root.attributes.push_back({"attnserve.model.version", trace.version});
  }
  root.attributes.push_back({"gen_ai.usage.input_tokens", trace.tokens});
  root.attributes.push_back({"attnserve.status_code",
                             std::string(absl::StatusCodeToString(trace.status.code()))});
  if (!trace.status.ok()) {
    root.status_code = SpanStatusCode::kError;
    root.status_message = std::string(trace.status.message().substr(0, 512));
  }

  // The phases, each a child of the request's span, in the order they ran.
  const auto phase = [&](const char* name, absl::Time start, absl::Time end) {
    SpanRecord span;
    span.context = tracer.NewSpanContext(&server);
    span.parent_span_id = server.span_id;
    span.name = name;
    span.start_time = start;
    span.end_time = std::max(start, end);
    spans.push_back(std::move(span));
    return &spans.back();
  };
  spans.push_back(std::move(root));
  if (trace.validate_start != absl::Time()) {
    phase("validate", trace.validate_start, trace.validate_start + trace.validate);
  }
  if (trace.enqueued != absl::Time() && trace.batch_size > 0) {
    const absl::Time batch_start = trace.enqueued + trace.queue;
    const absl::Time batch_end = batch_start + trace.compute;
    phase("queue", trace.enqueued, batch_start);
    SpanRecord* compute = phase("compute", batch_start, batch_end);
    compute->attributes.push_back(
        {"attnserve.batch.size", static_cast<int64_t>(trace.batch_size)});
    compute->attributes.push_back({"attnserve.batch.id", trace.batch_id});
    phase("respond", batch_end, std::max(batch_end, trace.end));
  }
  return spans;
}

std::function<void(const RequestTrace&)> TraceRequests(Tracer* tracer) {
  return [tracer](const RequestTrace& trace) {
    std::vector<SpanRecord> spans = RequestSpans(trace, *tracer);
    if (!spans.empty()) tracer->Submit(std::move(spans));
  };
}

}  // namespace attnserve::server
