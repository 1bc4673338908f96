// Request tracing: each answered request (the pipeline's RequestTrace) as OpenTelemetry
// spans on a Tracer. One SERVER span per request, named as its door names it and the
// child of the caller's traceparent (a new trace without one), with a child per phase
// the request reached, in order: "validate" (decoding and, for text, tokenizing),
// "queue" (waiting for its batch), "compute" (its batch's forward pass, shared with the
// other requests of the batch, which carry the same attnserve.batch.id) and "respond"
// (from the batch's end to the answer handed to the door). Attributes follow
// OpenTelemetry's conventions where they fit (gen_ai.request.model,
// gen_ai.usage.input_tokens, rpc.* / http.*), attnserve.* for the rest.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_REQUEST_TRACING_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_REQUEST_TRACING_H_

#include <functional>
#include <vector>

#include "server/observability/tracing.h"
#include "server/pipeline/request_pipeline.h"

namespace attnserve::server {

// The spans of one answered request, or none when the sampler leaves its trace out.
// A traceparent that does not parse starts a new trace, as W3C asks.
std::vector<SpanRecord> RequestSpans(const RequestTrace& trace, const Tracer& tracer);

// The observer hook (ServiceObserver::on_request_traced) that Submits each request's
// spans to `tracer`, which must outlive the pipeline's calls. Never blocks.
std::function<void(const RequestTrace&)> TraceRequests(Tracer* tracer);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_REQUEST_TRACING_H_
