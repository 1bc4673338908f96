#include "server/observability/tracing.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "opentelemetry/proto/trace/v1/trace.pb.h"

namespace attnserve::server {

namespace {

namespace otlp_collector = ::opentelemetry::proto::collector::trace::v1;
namespace otlp_common = ::opentelemetry::proto::common::v1;
namespace otlp_trace = ::opentelemetry::proto::trace::v1;

constexpr int kMaxQueueSpans = 1 << 20;
// W3C Trace Context: at most 32 tracestate members.
constexpr int kMaxTraceStateMembers = 32;
// A version 00 traceparent: "vv-" + 32 + "-" + 16 + "-" + "ff".
constexpr size_t kTraceparentLength = 55;
// While the collector is down gRPC backs off reconnecting up to 120 s by default; a
// collector that comes back is used again within this.
constexpr int kMaxReconnectBackoffMs = 10000;

constexpr std::array<const char*, 3> kDropReasonLabels = {"queue_full", "export_failed",
                                                          "shutdown"};

bool IsLowerHex(absl::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

template <size_t N>
bool IsAllZero(const std::array<uint8_t, N>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

// Reads the lowercase hex `field` of traceparent into `bytes`, refusing all zeros.
template <size_t N>
absl::Status ParseIdField(absl::string_view name, absl::string_view field,
                          std::array<uint8_t, N>& bytes) {
  if (!IsLowerHex(field)) {
    return absl::InvalidArgumentError(absl::StrCat("traceparent ", name, " '",
                                                   absl::CHexEscape(field), "' is not ",
                                                   2 * N, " lowercase hex digits"));
  }
  const std::string raw = absl::HexStringToBytes(field);
  std::copy(raw.begin(), raw.end(), bytes.begin());
  if (IsAllZero(bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("traceparent ", name, " is all zeros, which W3C makes invalid"));
  }
  return absl::OkStatus();
}

bool IsKeyChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '*' || c == '/';
}

bool IsLowerAlpha(char c) { return c >= 'a' && c <= 'z'; }

// key = lcalpha 0*255(keychar), or tenant "@" system with tenant = (lcalpha / DIGIT)
// 0*240(keychar) and system = lcalpha 0*13(keychar).
bool IsTraceStateKey(absl::string_view key) {
  const size_t at = key.find('@');
  if (at == absl::string_view::npos) {
    return !key.empty() && key.size() <= 256 && IsLowerAlpha(key[0]) &&
           std::all_of(key.begin(), key.end(), IsKeyChar);
  }
  const absl::string_view tenant = key.substr(0, at);
  const absl::string_view system = key.substr(at + 1);
  return !tenant.empty() && tenant.size() <= 241 &&
         (IsLowerAlpha(tenant[0]) || (tenant[0] >= '0' && tenant[0] <= '9')) &&
         std::all_of(tenant.begin(), tenant.end(), IsKeyChar) && !system.empty() &&
         system.size() <= 14 && IsLowerAlpha(system[0]) &&
         std::all_of(system.begin(), system.end(), IsKeyChar);
}

// value = 0*255(chr) nblk-chr: printable ASCII without ',' and '=', not ending in ' '.
bool IsTraceStateValue(absl::string_view value) {
  return !value.empty() && value.size() <= 256 && value.back() != ' ' &&
         std::all_of(value.begin(), value.end(), [](char c) {
           return c >= 0x20 && c <= 0x7e && c != ',' && c != '=';
         });
}

// `tracestate` when it is a valid W3C list within kMaxTraceStateBytes, else "".
std::string ValidTraceState(absl::string_view tracestate) {
  tracestate = absl::StripAsciiWhitespace(tracestate);
  if (tracestate.size() > kMaxTraceStateBytes) {
    return "";
  }
  std::vector<absl::string_view> keys;
  for (absl::string_view member : absl::StrSplit(tracestate, ',')) {
    // Empty members (",,") are allowed; blanks around members are optional whitespace.
    member = absl::StripAsciiWhitespace(member);
    if (member.empty()) {
      continue;
    }
    const size_t equals = member.find('=');
    if (equals == absl::string_view::npos) {
      return "";
    }
    const absl::string_view key = member.substr(0, equals);
    if (!IsTraceStateKey(key) || !IsTraceStateValue(member.substr(equals + 1)) ||
        std::find(keys.begin(), keys.end(), key) != keys.end()) {
      return "";
    }
    keys.push_back(key);
    if (keys.size() > kMaxTraceStateMembers) {
      return "";
    }
  }
  return std::string(tracestate);
}

template <size_t N>
void FillRandomNonZero(std::array<uint8_t, N>& bytes) {
  static_assert(N % 8 == 0, "ids are whole 64-bit words");
  // One generator per thread: no lock, and absl::BitGen is not thread-safe.
  thread_local absl::BitGen generator;
  do {
    for (size_t word = 0; word < N; word += 8) {
      uint64_t random = absl::Uniform<uint64_t>(generator);
      for (size_t i = 0; i < 8; ++i) {
        bytes[word + 7 - i] = static_cast<uint8_t>(random & 0xff);
        random >>= 8;
      }
    }
  } while (IsAllZero(bytes));
}

// The gRPC target of otlp_endpoint: "host:port" with an optional "http://" and "/".
absl::StatusOr<std::string> ChannelTarget(absl::string_view endpoint) {
  const std::string quoted =
      absl::StrCat("otlp_endpoint '", absl::CHexEscape(endpoint), "'");
  absl::string_view address = endpoint;
  absl::ConsumePrefix(&address, "http://");
  absl::ConsumeSuffix(&address, "/");
  if (absl::StrContains(address, "://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        quoted, " has a scheme other than http://; TLS is not supported: use host:port"));
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted, " is not host:port (e.g. localhost:4317)"));
  }
  const absl::string_view host = address.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted, " has no port in [1, 65535] after the last ':'"));
  }
  if (absl::StrContains(host, ':') && !(host.front() == '[' && host.back() == ']')) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted, " has an IPv6 host without brackets; write [addr]:port"));
  }
  return std::string(address);
}

absl::Status CheckDuration(absl::string_view field, absl::Duration duration) {
  if (duration <= absl::ZeroDuration() || duration == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " ", absl::FormatDuration(duration), " must be positive and finite"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const Tracer::Options& options) {
  if (!(options.sampler_ratio >= 0.0 && options.sampler_ratio <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler_ratio ", options.sampler_ratio, " is outside [0, 1]"));
  }
  if (options.service_name.empty()) {
    return absl::InvalidArgumentError(
        "service_name is empty; collectors group spans by it (e.g. attnserve)");
  }
  if (options.max_queue_spans < 1 || options.max_queue_spans > kMaxQueueSpans) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_queue_spans ", options.max_queue_spans, " is outside [1, ",
                     kMaxQueueSpans, "]"));
  }
  if (options.max_export_batch < 1 ||
      options.max_export_batch > options.max_queue_spans) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_export_batch ", options.max_export_batch,
                     " is outside [1, max_queue_spans = ", options.max_queue_spans, "]"));
  }
  absl::Status status = CheckDuration("export_interval", options.export_interval);
  if (!status.ok()) {
    return status;
  }
  return CheckDuration("export_timeout", options.export_timeout);
}

// Sets an OTLP AnyValue from the attribute's alternative.
struct AnyValueSetter {
  otlp_common::AnyValue* value;
  void operator()(std::string& text) const { value->set_string_value(std::move(text)); }
  void operator()(int64_t number) const { value->set_int_value(number); }
  void operator()(double number) const { value->set_double_value(number); }
  void operator()(bool flag) const { value->set_bool_value(flag); }
};

void AddAttributes(std::vector<SpanAttribute>& attributes,
                   google::protobuf::RepeatedPtrField<otlp_common::KeyValue>* out) {
  out->Reserve(static_cast<int>(attributes.size()));
  for (SpanAttribute& attribute : attributes) {
    otlp_common::KeyValue* key_value = out->Add();
    key_value->set_key(std::move(attribute.key));
    std::visit(AnyValueSetter{key_value->mutable_value()}, attribute.value);
  }
}

void AddStringAttribute(absl::string_view key, absl::string_view value,
                        google::protobuf::RepeatedPtrField<otlp_common::KeyValue>* out) {
  otlp_common::KeyValue* key_value = out->Add();
  key_value->set_key(std::string(key));
  key_value->mutable_value()->set_string_value(std::string(value));
}

template <size_t N>
std::string Bytes(const std::array<uint8_t, N>& id) {
  return std::string(id.begin(), id.end());
}

// OTLP times are unsigned: anything before the epoch is sent as 0.
uint64_t UnixNanos(absl::Time time) {
  return time <= absl::UnixEpoch() ? 0 : static_cast<uint64_t>(absl::ToUnixNanos(time));
}

otlp_trace::Span::SpanKind ToProto(SpanKind kind) {
  switch (kind) {
    case SpanKind::kInternal:
      return otlp_trace::Span::SPAN_KIND_INTERNAL;
    case SpanKind::kServer:
      return otlp_trace::Span::SPAN_KIND_SERVER;
    case SpanKind::kClient:
      return otlp_trace::Span::SPAN_KIND_CLIENT;
    case SpanKind::kProducer:
      return otlp_trace::Span::SPAN_KIND_PRODUCER;
    case SpanKind::kConsumer:
      return otlp_trace::Span::SPAN_KIND_CONSUMER;
  }
  return otlp_trace::Span::SPAN_KIND_UNSPECIFIED;
}

otlp_trace::Status::StatusCode ToProto(SpanStatusCode code) {
  switch (code) {
    case SpanStatusCode::kUnset:
      return otlp_trace::Status::STATUS_CODE_UNSET;
    case SpanStatusCode::kOk:
      return otlp_trace::Status::STATUS_CODE_OK;
    case SpanStatusCode::kError:
      return otlp_trace::Status::STATUS_CODE_ERROR;
  }
  return otlp_trace::Status::STATUS_CODE_UNSET;
}

// Moves `record`'s strings into `span`.
void ToProto(SpanRecord& record, otlp_trace::Span* span) {
  span->set_trace_id(Bytes(record.context.trace_id));
  span->set_span_id(Bytes(record.context.span_id));
  span->set_trace_state(std::move(record.context.trace_state));
  if (!IsAllZero(record.parent_span_id)) {
    span->set_parent_span_id(Bytes(record.parent_span_id));
  }
  // The low byte is the W3C trace flags; only sampled spans are exported.
  span->set_flags(record.context.sampled ? 1 : 0);
  span->set_name(std::move(record.name));
  span->set_kind(ToProto(record.kind));
  span->set_start_time_unix_nano(UnixNanos(record.start_time));
  span->set_end_time_unix_nano(UnixNanos(record.end_time));
  AddAttributes(record.attributes, span->mutable_attributes());
  for (SpanLink& link : record.links) {
    otlp_trace::Span::Link* out = span->add_links();
    out->set_trace_id(Bytes(link.trace_id));
    out->set_span_id(Bytes(link.span_id));
    AddAttributes(link.attributes, out->mutable_attributes());
  }
  if (record.status_code != SpanStatusCode::kUnset) {
    span->mutable_status()->set_code(ToProto(record.status_code));
    if (record.status_code == SpanStatusCode::kError) {
      span->mutable_status()->set_message(std::move(record.status_message));
    }
  }
}

// One ResourceSpans (this service) with one ScopeSpans ("attnserve") holding `batch`.
otlp_collector::ExportTraceServiceRequest BuildRequest(const Tracer::Options& options,
                                                       std::vector<SpanRecord>& batch) {
  otlp_collector::ExportTraceServiceRequest request;
  otlp_trace::ResourceSpans* resource_spans = request.add_resource_spans();
  auto* resource = resource_spans->mutable_resource()->mutable_attributes();
  AddStringAttribute("service.name", options.service_name, resource);
  if (!options.service_version.empty()) {
    AddStringAttribute("service.version", options.service_version, resource);
  }
  AddStringAttribute("telemetry.sdk.language", "cpp", resource);
  AddStringAttribute("telemetry.sdk.name", "attnserve", resource);
  otlp_trace::ScopeSpans* scope_spans = resource_spans->add_scope_spans();
  scope_spans->mutable_scope()->set_name("attnserve");
  scope_spans->mutable_spans()->Reserve(static_cast<int>(batch.size()));
  for (SpanRecord& record : batch) {
    ToProto(record, scope_spans->add_spans());
  }
  return request;
}

}  // namespace

bool SpanContext::IsValid() const { return !IsAllZero(trace_id) && !IsAllZero(span_id); }

absl::StatusOr<SpanContext> ParseTraceContext(absl::string_view traceparent,
                                              absl::string_view tracestate) {
  traceparent = absl::StripAsciiWhitespace(traceparent);
  if (traceparent.size() < kTraceparentLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        "traceparent length ", traceparent.size(), " is below ", kTraceparentLength));
  }
  const absl::string_view version = traceparent.substr(0, 2);
  if (!IsLowerHex(version)) {
    return absl::InvalidArgumentError(absl::StrCat("traceparent version '",
                                                   absl::CHexEscape(version),
                                                   "' is not 2 lowercase hex digits"));
  }
  if (version == "ff") {
    return absl::InvalidArgumentError("traceparent version ff is invalid");
  }
  // Version 00 is exactly its four fields. A later version may append fields after a
  // '-'; W3C says to read its first four with version 00's rules.
  if (version == "00" && traceparent.size() != kTraceparentLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("traceparent length ", traceparent.size(), " is not ",
                     kTraceparentLength, " for version 00"));
  }
  if (traceparent.size() > kTraceparentLength && traceparent[kTraceparentLength] != '-') {
    return absl::InvalidArgumentError(absl::StrCat(
        "traceparent version ", version, " has trace-flags longer than 2 digits"));
  }
  for (const size_t dash : {size_t{2}, size_t{35}, size_t{52}}) {
    if (traceparent[dash] != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("traceparent has no '-' at offset ", dash,
                       " (version-trace_id-parent_id-flags of 2, 32, 16, 2 hex digits)"));
    }
  }
  SpanContext context;
  absl::Status status =
      ParseIdField("trace-id", traceparent.substr(3, 32), context.trace_id);
  if (!status.ok()) {
    return status;
  }
  status = ParseIdField("parent-id", traceparent.substr(36, 16), context.span_id);
  if (!status.ok()) {
    return status;
  }
  const absl::string_view flags = traceparent.substr(53, 2);
  if (!IsLowerHex(flags)) {
    return absl::InvalidArgumentError(absl::StrCat("traceparent trace-flags '",
                                                   absl::CHexEscape(flags),
                                                   "' is not 2 lowercase hex digits"));
  }
  context.sampled = (absl::HexStringToBytes(flags)[0] & 0x01) != 0;
  context.trace_state = ValidTraceState(tracestate);
  return context;
}

std::string FormatTraceparent(const SpanContext& context) {
  return absl::StrCat("00-", absl::BytesToHexString(Bytes(context.trace_id)), "-",
                      absl::BytesToHexString(Bytes(context.span_id)),
                      context.sampled ? "-01" : "-00");
}

Sampler::Sampler(double ratio)
    : sample_all_(ratio >= 1.0),
      trace_id_bound_(ratio > 0.0 && ratio < 1.0
                          ? static_cast<uint64_t>(std::round(std::ldexp(ratio, 64)))
                          : 0) {}

bool Sampler::ShouldSample(const SpanContext* parent, const TraceId& trace_id) const {
  if (parent != nullptr && parent->IsValid()) {
    return parent->sampled;
  }
  if (sample_all_) {
    return true;
  }
  uint64_t low_bytes = 0;
  for (size_t i = 8; i < 16; ++i) {
    low_bytes = (low_bytes << 8) | trace_id[i];
  }
  return low_bytes < trace_id_bound_;
}

absl::StatusOr<std::unique_ptr<Tracer>> Tracer::Create(const Options& options,
                                                       prometheus::Registry* registry) {
  absl::StatusOr<std::string> target = ChannelTarget(options.otlp_endpoint);
  if (!target.ok()) {
    return target.status();
  }
  absl::Status status = CheckOptions(options);
  if (!status.ok()) {
    return status;
  }
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  // Creating a channel never blocks: it connects on the first RPC, on the export thread.
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(*target, grpc::InsecureChannelCredentials(), arguments);
  return absl::WrapUnique(
      new Tracer(options, otlp_collector::TraceService::NewStub(channel), registry));
}

Tracer::Tracer(const Options& options, std::unique_ptr<TraceServiceStub> stub,
               prometheus::Registry* registry)
    : options_(options), sampler_(options.sampler_ratio), stub_(std::move(stub)) {
  if (registry != nullptr) {
    exported_counter_ = &prometheus::BuildCounter()
                             .Name("attnserve_trace_spans_exported_total")
                             .Help("Trace spans the OTLP collector accepted.")
                             .Register(*registry)
                             .Add({});
    auto& dropped = prometheus::BuildCounter()
                        .Name("attnserve_trace_spans_dropped_total")
                        .Help(
                            "Trace spans not exported, by reason (queue_full, "
                            "export_failed, shutdown).")
                        .Register(*registry);
    for (int reason = 0; reason < kDropReasons; ++reason) {
      dropped_counters_[reason] = &dropped.Add({{"reason", kDropReasonLabels[reason]}});
    }
  }
  export_thread_ = std::thread([this] { ExportLoop(); });
}

Tracer::~Tracer() { Shutdown(); }

SpanContext Tracer::NewSpanContext(const SpanContext* parent) const {
  SpanContext context;
  FillRandomNonZero(context.span_id);
  if (parent != nullptr && parent->IsValid()) {
    context.trace_id = parent->trace_id;
    context.trace_state = parent->trace_state;
  } else {
    FillRandomNonZero(context.trace_id);
  }
  context.sampled = sampler_.ShouldSample(parent, context.trace_id);
  return context;
}

void Tracer::Submit(std::vector<SpanRecord> spans) {
  int64_t dropped = 0;
  bool stopping = false;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
    for (SpanRecord& span : spans) {
      if (!span.context.sampled) {
        continue;
      }
      if (stopping_ || queue_.size() >= static_cast<size_t>(options_.max_queue_spans)) {
        ++dropped;
      } else {
        queue_.push_back(std::move(span));
      }
    }
    // Releasing the lock lets the export thread's Await see a full batch.
  }
  if (dropped > 0) {
    CountDropped(stopping ? DropReason::kShutdown : DropReason::kQueueFull, dropped);
  }
}

void Tracer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      flush_deadline_ = absl::Now() + options_.export_timeout;
    }
    // A batch taken during the flush has an RPC deadline within flush_deadline_; only
    // one taken before Shutdown can outlive it, so cancel that one.
    if (!mu_.AwaitWithDeadline(absl::Condition(&export_thread_done_), flush_deadline_) &&
        in_flight_ != nullptr) {
      in_flight_->TryCancel();
    }
  }
  if (export_thread_.joinable()) {
    export_thread_.join();
  }
}

int64_t Tracer::exported_spans() const { return exported_spans_.load(); }

int64_t Tracer::dropped_spans(DropReason reason) const {
  return dropped_spans_[static_cast<int>(reason)].load();
}

bool Tracer::BatchReadyOrStopping() const {
  return stopping_ || queue_.size() >= static_cast<size_t>(options_.max_export_batch);
}

void Tracer::ExportLoop() {
  while (true) {
    std::vector<SpanRecord> batch;
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(this, &Tracer::BatchReadyOrStopping),
                           options_.export_interval);
      if (queue_.empty()) {
        if (stopping_) {
          break;
        }
        continue;
      }
      const absl::Time now = absl::Now();
      if (now >= flush_deadline_) {
        CountDropped(DropReason::kShutdown, static_cast<int64_t>(queue_.size()));
        queue_.clear();
        break;
      }
      const size_t size =
          std::min(queue_.size(), static_cast<size_t>(options_.max_export_batch));
      batch.reserve(size);
      std::move(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(size),
                std::back_inserter(batch));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(size));
      context.set_deadline(
          absl::ToChronoTime(std::min(now + options_.export_timeout, flush_deadline_)));
      // Published under the same lock that took the batch, so that Shutdown can cancel
      // the RPC even before it starts.
      in_flight_ = &context;
    }
    Export(std::move(batch), &context);
  }
  absl::MutexLock lock(&mu_);
  export_thread_done_ = true;
}

void Tracer::Export(std::vector<SpanRecord> batch, grpc::ClientContext* context) {
  const int64_t spans = static_cast<int64_t>(batch.size());
  const otlp_collector::ExportTraceServiceRequest request = BuildRequest(options_, batch);
  otlp_collector::ExportTraceServiceResponse response;
  const grpc::Status status = stub_->Export(context, request, &response);
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = nullptr;
  }
  if (!status.ok()) {
    CountDropped(DropReason::kExportFailed, spans);
    return;
  }
  // A partial success names how many spans the collector refused.
  const int64_t rejected =
      std::clamp<int64_t>(response.partial_success().rejected_spans(), 0, spans);
  CountExported(spans - rejected);
  if (rejected > 0) {
    CountDropped(DropReason::kExportFailed, rejected);
  }
}

void Tracer::CountExported(int64_t spans) {
  exported_spans_.fetch_add(spans);
  if (exported_counter_ != nullptr) {
    exported_counter_->Increment(static_cast<double>(spans));
  }
}

void Tracer::CountDropped(DropReason reason, int64_t spans) {
  const int index = static_cast<int>(reason);
  dropped_spans_[index].fetch_add(spans);
  if (dropped_counters_[index] != nullptr) {
    dropped_counters_[index]->Increment(static_cast<double>(spans));
  }
}

}  // namespace attnserve::server
