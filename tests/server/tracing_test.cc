// The tracing library: W3C traceparent / tracestate parsing and formatting, the
// parent-based ratio sampler, and span export over OTLP/gRPC to an in-process collector
// on loopback (accepting, holding its answer, refusing spans) or to a port nobody
// listens on. Tests wait on the collector's events, never on time.
#include "server/observability/tracing.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "opentelemetry/proto/collector/trace/v1/trace_service.grpc.pb.h"
#include "prometheus/registry.h"

namespace attnserve::server {
namespace {

namespace otlp_collector = ::opentelemetry::proto::collector::trace::v1;
namespace otlp_common = ::opentelemetry::proto::common::v1;
namespace otlp_trace = ::opentelemetry::proto::trace::v1;

using ::testing::HasSubstr;

constexpr char kTraceIdHex[] = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr char kSpanIdHex[] = "00f067aa0ba902b7";

template <size_t N>
std::array<uint8_t, N> IdFromHex(absl::string_view hex) {
  const std::string bytes = absl::HexStringToBytes(hex);
  std::array<uint8_t, N> id{};
  std::copy(bytes.begin(), bytes.end(), id.begin());
  return id;
}

template <size_t N>
std::string IdBytes(const std::array<uint8_t, N>& id) {
  return std::string(id.begin(), id.end());
}

std::string Traceparent(absl::string_view version, absl::string_view flags) {
  return absl::StrCat(version, "-", kTraceIdHex, "-", kSpanIdHex, "-", flags);
}

// ---------------------------------------------------------------------------------------
// traceparent and tracestate

TEST(TracingTest, ParsesAVersion00Traceparent) {
  absl::StatusOr<SpanContext> sampled = ParseTraceContext(Traceparent("00", "01"), "");
  ASSERT_TRUE(sampled.ok()) << sampled.status();
  EXPECT_EQ(IdBytes(sampled->trace_id), absl::HexStringToBytes(kTraceIdHex));
  EXPECT_EQ(IdBytes(sampled->span_id), absl::HexStringToBytes(kSpanIdHex));
  EXPECT_TRUE(sampled->sampled);
  EXPECT_TRUE(sampled->IsValid());
  EXPECT_EQ(sampled->trace_state, "");

  absl::StatusOr<SpanContext> unsampled = ParseTraceContext(Traceparent("00", "00"), "");
  ASSERT_TRUE(unsampled.ok()) << unsampled.status();
  EXPECT_FALSE(unsampled->sampled);
  // Flags other than bit 0 are not ours to judge; bit 0 alone decides.
  absl::StatusOr<SpanContext> other_flags =
      ParseTraceContext(Traceparent("00", "fe"), "");
  ASSERT_TRUE(other_flags.ok()) << other_flags.status();
  EXPECT_FALSE(other_flags->sampled);
}

TEST(TracingTest, IgnoresBlanksAroundTheHeader) {
  absl::StatusOr<SpanContext> context =
      ParseTraceContext(absl::StrCat(" \t", Traceparent("00", "01"), " "), "");
  ASSERT_TRUE(context.ok()) << context.status();
  EXPECT_TRUE(context->sampled);
}

TEST(TracingTest, ReadsTheFirstFourFieldsOfAFutureVersion) {
  absl::StatusOr<SpanContext> exact = ParseTraceContext(Traceparent("cc", "01"), "");
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_TRUE(exact->sampled);
  absl::StatusOr<SpanContext> longer = ParseTraceContext(
      absl::StrCat(Traceparent("cc", "01"), "-what-the-future-holds"), "");
  ASSERT_TRUE(longer.ok()) << longer.status();
  EXPECT_EQ(IdBytes(longer->trace_id), absl::HexStringToBytes(kTraceIdHex));
  EXPECT_EQ(IdBytes(longer->span_id), absl::HexStringToBytes(kSpanIdHex));
  EXPECT_TRUE(longer->sampled);
}

struct BadTraceparent {
  std::string name;
  std::string header;
  std::string message;  // a key phrase of the InvalidArgument message
};

class TraceparentRefusalTest : public ::testing::TestWithParam<BadTraceparent> {};

TEST_P(TraceparentRefusalTest, RefusesWithTheFieldNamed) {
  absl::StatusOr<SpanContext> context = ParseTraceContext(GetParam().header, "rojo=1");
  ASSERT_FALSE(context.ok());
  EXPECT_EQ(context.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(context.status().message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, TraceparentRefusalTest,
    ::testing::Values(
        BadTraceparent{"Empty", "", "length 0 is below 55"},
        BadTraceparent{"Short", Traceparent("00", "0"), "length 54 is below 55"},
        BadTraceparent{"Version00TooLong", Traceparent("00", "01") + "-00",
                       "length 58 is not 55 for version 00"},
        BadTraceparent{"UppercaseVersion", Traceparent("0A", "01"),
                       "version '0A' is not 2 lowercase hex"},
        BadTraceparent{"NonHexVersion", Traceparent("0g", "01"), "version '0g'"},
        BadTraceparent{"VersionFf", Traceparent("ff", "01"), "version ff is invalid"},
        BadTraceparent{"FutureVersionFlagsRunOn", Traceparent("cc", "01") + "x",
                       "trace-flags longer than 2 digits"},
        BadTraceparent{
            "UppercaseTraceId", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "trace-id '4BF92F3577B34DA6A3CE929D0E0E4736' is not 32 lowercase hex"},
        BadTraceparent{"NonHexTraceId",
                       "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01",
                       "trace-id '4bf92f3577b34da6a3ce929d0e0e473z'"},
        BadTraceparent{"ZeroTraceId",
                       "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                       "trace-id is all zeros"},
        BadTraceparent{"UppercaseParentId",
                       "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
                       "parent-id '00F067AA0BA902B7' is not 16 lowercase hex"},
        BadTraceparent{"ZeroParentId",
                       "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                       "parent-id is all zeros"},
        BadTraceparent{"UppercaseFlags", Traceparent("00", "0A"),
                       "trace-flags '0A' is not 2 lowercase hex"},
        BadTraceparent{"NonHexFlags", Traceparent("00", "x1"), "trace-flags 'x1'"},
        BadTraceparent{"ShortTraceIdShiftsTheDash",
                       "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-011",
                       "no '-' at offset 35"},
        BadTraceparent{"UnderscoreForDash",
                       "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                       "no '-' at offset 2"},
        BadTraceparent{"ControlCharacterEscaped",
                       "00-4bf92f3577b34da6a3ce929d0e0e473\x01-00f067aa0ba902b7-01",
                       "trace-id '4bf92f3577b34da6a3ce929d0e0e473\\x01'"}),
    [](const ::testing::TestParamInfo<BadTraceparent>& info) { return info.param.name; });

TEST(TracingTest, CarriesAValidTracestateUnchanged) {
  const std::string header = Traceparent("00", "01");
  const std::string tracestate = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
  EXPECT_EQ(ParseTraceContext(header, tracestate)->trace_state, tracestate);
  // Multi-tenant keys, empty members and blanks around members are all valid.
  const std::string tenants = "fw529a3039@dt=FfN,, 7x@vendor-1=a b ,c/d*e_f-g=v";
  EXPECT_EQ(ParseTraceContext(header, tenants)->trace_state, tenants);
}

TEST(TracingTest, DropsAMalformedOrOversizedTracestate) {
  const std::string header = Traceparent("00", "01");
  std::string members;
  for (int i = 0; i < 33; ++i) {
    absl::StrAppend(&members, i == 0 ? "" : ",", "k", i, "=v");
  }
  const std::vector<std::string> dropped = {
      "rojo",                                     // no '='
      "Rojo=1",                                   // uppercase key
      "1rojo=1",                                  // a simple key starts with a letter
      "rojo=a,rojo=b",                            // repeated key
      "rojo=a=b",                                 // '=' in a value
      "rojo=",                                    // empty value
      "t@Sys=1",                                  // system id not lowercase
      "t@systemistoolong=1",                      // system id over 14
      "rojo=\x7f",                                // not printable
      members,                                    // 33 members
      absl::StrCat("k=", std::string(257, 'v')),  // value over 256
      absl::StrCat("a=", std::string(250, 'v'), ",b=", std::string(250, 'v'),
                   ",c=vvvvvv"),
  };
  for (const std::string& tracestate : dropped) {
    absl::StatusOr<SpanContext> context = ParseTraceContext(header, tracestate);
    ASSERT_TRUE(context.ok()) << context.status();
    EXPECT_EQ(context->trace_state, "") << tracestate;
  }
  // 512 bytes exactly are kept.
  const std::string at_limit =
      absl::StrCat("a=", std::string(250, 'v'), ",b=", std::string(250, 'v'), ",c=vvvv");
  ASSERT_EQ(at_limit.size(), kMaxTraceStateBytes);
  EXPECT_EQ(ParseTraceContext(header, at_limit)->trace_state, at_limit);
}

TEST(TracingTest, FormatsATraceparentThatParsesBack) {
  SpanContext context;
  context.trace_id = IdFromHex<16>(kTraceIdHex);
  context.span_id = IdFromHex<8>(kSpanIdHex);
  context.sampled = true;
  EXPECT_EQ(FormatTraceparent(context), Traceparent("00", "01"));
  context.sampled = false;
  EXPECT_EQ(FormatTraceparent(context), Traceparent("00", "00"));

  auto tracer = Tracer::Create({.otlp_endpoint = "127.0.0.1:1"});
  ASSERT_TRUE(tracer.ok()) << tracer.status();
  for (int i = 0; i < 100; ++i) {
    const SpanContext fresh = (*tracer)->NewSpanContext(nullptr);
    absl::StatusOr<SpanContext> parsed = ParseTraceContext(FormatTraceparent(fresh), "");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->trace_id, fresh.trace_id);
    EXPECT_EQ(parsed->span_id, fresh.span_id);
    EXPECT_EQ(parsed->sampled, fresh.sampled);
  }
}

// ---------------------------------------------------------------------------------------
// Sampling and ids

TraceId TraceIdWithLowBytes(uint64_t low, uint64_t high = 0x0123456789abcdefULL) {
  TraceId id{};
  for (int i = 7; i >= 0; --i) {
    id[i] = static_cast<uint8_t>(high & 0xff);
    id[8 + i] = static_cast<uint8_t>(low & 0xff);
    high >>= 8;
    low >>= 8;
  }
  return id;
}

TEST(SamplerTest, RatioZeroSamplesNoRootAndRatioOneEvery) {
  const Sampler none(0.0);
  const Sampler all(1.0);
  for (const uint64_t low : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 63,
                             std::numeric_limits<uint64_t>::max()}) {
    EXPECT_FALSE(none.ShouldSample(nullptr, TraceIdWithLowBytes(low))) << low;
    EXPECT_TRUE(all.ShouldSample(nullptr, TraceIdWithLowBytes(low))) << low;
  }
  EXPECT_FALSE(Sampler(std::nan("")).ShouldSample(nullptr, TraceIdWithLowBytes(0)));
}

TEST(SamplerTest, RootIsSampledBelowRatioTimesTwoToThe64) {
  // OpenTelemetry's TraceIdRatioBased: sampled iff low 8 bytes < round(ratio * 2^64).
  const Sampler half(0.5);
  EXPECT_TRUE(half.ShouldSample(nullptr, TraceIdWithLowBytes(0x7fffffffffffffffULL)));
  EXPECT_FALSE(half.ShouldSample(nullptr, TraceIdWithLowBytes(0x8000000000000000ULL)));
  // The high 8 bytes play no part.
  EXPECT_TRUE(half.ShouldSample(nullptr, TraceIdWithLowBytes(0, ~uint64_t{0})));
  const Sampler quarter(0.25);
  EXPECT_TRUE(quarter.ShouldSample(nullptr, TraceIdWithLowBytes(0x3fffffffffffffffULL)));
  EXPECT_FALSE(quarter.ShouldSample(nullptr, TraceIdWithLowBytes(0x4000000000000000ULL)));
}

TEST(SamplerTest, FollowsAValidParent) {
  SpanContext parent;
  parent.trace_id = IdFromHex<16>(kTraceIdHex);
  parent.span_id = IdFromHex<8>(kSpanIdHex);
  parent.sampled = true;
  EXPECT_TRUE(Sampler(0.0).ShouldSample(&parent, parent.trace_id));
  parent.sampled = false;
  EXPECT_FALSE(Sampler(1.0).ShouldSample(&parent, parent.trace_id));
  // An invalid parent (zero span id) is no parent: the ratio decides.
  parent.span_id = {};
  EXPECT_TRUE(Sampler(1.0).ShouldSample(&parent, parent.trace_id));
}

TEST(TracerTest, NewSpanContextStartsATraceOrContinuesTheParents) {
  auto tracer = Tracer::Create({.otlp_endpoint = "127.0.0.1:1"});
  ASSERT_TRUE(tracer.ok()) << tracer.status();
  std::set<TraceId> trace_ids;
  std::set<SpanId> span_ids;
  for (int i = 0; i < 1000; ++i) {
    const SpanContext root = (*tracer)->NewSpanContext(nullptr);
    EXPECT_TRUE(root.IsValid());
    EXPECT_TRUE(root.sampled);
    EXPECT_EQ(root.trace_state, "");
    trace_ids.insert(root.trace_id);
    span_ids.insert(root.span_id);
  }
  EXPECT_EQ(trace_ids.size(), 1000u);
  EXPECT_EQ(span_ids.size(), 1000u);

  absl::StatusOr<SpanContext> remote =
      ParseTraceContext(Traceparent("00", "00"), "rojo=1");
  ASSERT_TRUE(remote.ok()) << remote.status();
  const SpanContext child = (*tracer)->NewSpanContext(&*remote);
  EXPECT_EQ(child.trace_id, remote->trace_id);
  EXPECT_NE(child.span_id, remote->span_id);
  EXPECT_FALSE(child.sampled);  // the parent's decision, though the ratio is 1
  EXPECT_EQ(child.trace_state, "rojo=1");

  auto never = Tracer::Create({.otlp_endpoint = "127.0.0.1:1", .sampler_ratio = 0.0});
  ASSERT_TRUE(never.ok()) << never.status();
  EXPECT_FALSE((*never)->NewSpanContext(nullptr).sampled);
}

// ---------------------------------------------------------------------------------------
// Options

struct BadOptions {
  std::string name;
  std::function<void(Tracer::Options&)> change;
  std::string message;
};

class TracerOptionsTest : public ::testing::TestWithParam<BadOptions> {};

TEST_P(TracerOptionsTest, RefusesWithTheFieldNamed) {
  Tracer::Options options{.otlp_endpoint = "localhost:4317"};
  GetParam().change(options);
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Create(options);
  ASSERT_FALSE(tracer.ok());
  EXPECT_EQ(tracer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tracer.status().message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Each, TracerOptionsTest,
    ::testing::Values(
        BadOptions{"EmptyEndpoint", [](Tracer::Options& o) { o.otlp_endpoint = ""; },
                   "otlp_endpoint '' is not host:port"},
        BadOptions{"NoPort", [](Tracer::Options& o) { o.otlp_endpoint = "collector"; },
                   "otlp_endpoint 'collector' is not host:port"},
        BadOptions{"NoHost", [](Tracer::Options& o) { o.otlp_endpoint = ":4317"; },
                   "is not host:port"},
        BadOptions{"PortZero",
                   [](Tracer::Options& o) { o.otlp_endpoint = "collector:0"; },
                   "otlp_endpoint 'collector:0' has no port in [1, 65535]"},
        BadOptions{"PortTooLarge",
                   [](Tracer::Options& o) { o.otlp_endpoint = "collector:65536"; },
                   "no port in [1, 65535]"},
        BadOptions{"Https",
                   [](Tracer::Options& o) { o.otlp_endpoint = "https://collector:4317"; },
                   "scheme other than http://; TLS is not supported"},
        BadOptions{"BareIpv6", [](Tracer::Options& o) { o.otlp_endpoint = "::1:4317"; },
                   "IPv6 host without brackets"},
        BadOptions{"NegativeRatio", [](Tracer::Options& o) { o.sampler_ratio = -0.1; },
                   "sampler_ratio -0.1 is outside [0, 1]"},
        BadOptions{"RatioAboveOne", [](Tracer::Options& o) { o.sampler_ratio = 1.5; },
                   "sampler_ratio 1.5 is outside [0, 1]"},
        BadOptions{"NanRatio", [](Tracer::Options& o) { o.sampler_ratio = std::nan(""); },
                   "sampler_ratio nan is outside [0, 1]"},
        BadOptions{"EmptyServiceName", [](Tracer::Options& o) { o.service_name = ""; },
                   "service_name is empty"},
        BadOptions{"QueueZero", [](Tracer::Options& o) { o.max_queue_spans = 0; },
                   "max_queue_spans 0 is outside [1, 1048576]"},
        BadOptions{"QueueTooLarge",
                   [](Tracer::Options& o) { o.max_queue_spans = (1 << 20) + 1; },
                   "max_queue_spans 1048577 is outside [1, 1048576]"},
        BadOptions{"BatchZero", [](Tracer::Options& o) { o.max_export_batch = 0; },
                   "max_export_batch 0 is outside [1, max_queue_spans = 2048]"},
        BadOptions{"BatchAboveQueue",
                   [](Tracer::Options& o) {
                     o.max_queue_spans = 10;
                     o.max_export_batch = 11;
                   },
                   "max_export_batch 11 is outside [1, max_queue_spans = 10]"},
        BadOptions{"IntervalZero",
                   [](Tracer::Options& o) { o.export_interval = absl::ZeroDuration(); },
                   "export_interval 0 must be positive and finite"},
        BadOptions{
            "IntervalInfinite",
            [](Tracer::Options& o) { o.export_interval = absl::InfiniteDuration(); },
            "export_interval inf must be positive and finite"},
        BadOptions{"TimeoutNegative",
                   [](Tracer::Options& o) { o.export_timeout = absl::Seconds(-1); },
                   "export_timeout -1s must be positive and finite"}),
    [](const ::testing::TestParamInfo<BadOptions>& info) { return info.param.name; });

TEST(TracerTest, AcceptsHttpPrefixTrailingSlashAndBracketedIpv6) {
  for (const char* endpoint : {"collector:4317", "http://collector:4317",
                               "http://collector:4317/", "[::1]:4317"}) {
    absl::StatusOr<std::unique_ptr<Tracer>> tracer =
        Tracer::Create({.otlp_endpoint = endpoint});
    EXPECT_TRUE(tracer.ok()) << endpoint << ": " << tracer.status();
  }
}

// ---------------------------------------------------------------------------------------
// Export over loopback

// An OTLP collector: keeps every request, can hold its answers until Release, and can
// report some spans of each request as rejected (a partial success).
class FakeCollector final : public otlp_collector::TraceService::Service {
 public:
  explicit FakeCollector(bool hold = false, int64_t reject_per_request = 0)
      : reject_per_request_(reject_per_request), released_(!hold) {}

  grpc::Status Export(grpc::ServerContext* /*context*/,
                      const otlp_collector::ExportTraceServiceRequest* request,
                      otlp_collector::ExportTraceServiceResponse* response) override {
    absl::MutexLock lock(&mu_);
    requests_.push_back(*request);
    for (const auto& resource_spans : request->resource_spans()) {
      for (const auto& scope_spans : resource_spans.scope_spans()) {
        spans_ += scope_spans.spans_size();
      }
    }
    mu_.Await(absl::Condition(&released_));
    if (reject_per_request_ > 0) {
      response->mutable_partial_success()->set_rejected_spans(reject_per_request_);
      response->mutable_partial_success()->set_error_message("test rejects some");
    }
    return grpc::Status::OK;
  }

  // Blocks until at least `spans` spans have arrived.
  void WaitForSpans(int spans) {
    absl::MutexLock lock(&mu_);
    const auto arrived = [this, spans]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return spans_ >= spans;
    };
    mu_.Await(absl::Condition(&arrived));
  }

  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }

  std::vector<otlp_collector::ExportTraceServiceRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  const int64_t reject_per_request_;
  absl::Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_);
  int spans_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<otlp_collector::ExportTraceServiceRequest> requests_ ABSL_GUARDED_BY(mu_);
};

// The collector served on 127.0.0.1 at a free port.
class CollectorServer {
 public:
  explicit CollectorServer(bool hold = false, int64_t reject_per_request = 0)
      : collector_(hold, reject_per_request) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&collector_);
    server_ = builder.BuildAndStart();
  }
  ~CollectorServer() {
    collector_.Release();
    server_->Shutdown();
  }

  FakeCollector& collector() { return collector_; }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  FakeCollector collector_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// A loopback port bound but not listening while this lives: connecting is refused, and
// no one else can take the port meanwhile.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      ADD_FAILURE() << "cannot bind a loopback port";
      return;
    }
    port_ = ntohs(address.sin_port);
  }
  ~RefusingPort() {
    if (fd_ >= 0) {
      close(fd_);
    }
  }
  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A sampled span named `name` in a fixed trace.
SpanRecord MakeSpan(absl::string_view name) {
  SpanRecord span;
  span.context.trace_id = IdFromHex<16>(kTraceIdHex);
  span.context.span_id = IdFromHex<8>(kSpanIdHex);
  span.context.sampled = true;
  span.name = std::string(name);
  span.start_time = absl::FromUnixNanos(1'700'000'000'000'000'000);
  span.end_time = span.start_time + absl::Milliseconds(1);
  return span;
}

std::vector<SpanRecord> MakeSpans(int count) {
  std::vector<SpanRecord> spans;
  spans.reserve(count);
  for (int i = 0; i < count; ++i) {
    spans.push_back(MakeSpan(absl::StrCat("span ", i)));
  }
  return spans;
}

std::unique_ptr<Tracer> CreateTracer(const Tracer::Options& options,
                                     prometheus::Registry* registry = nullptr) {
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Create(options, registry);
  EXPECT_TRUE(tracer.ok()) << tracer.status();
  return tracer.ok() ? *std::move(tracer) : nullptr;
}

// The attributes of `key_values` as "key=value" text, in order.
std::vector<std::string> AttributeText(
    const google::protobuf::RepeatedPtrField<otlp_common::KeyValue>& key_values) {
  std::vector<std::string> text;
  for (const otlp_common::KeyValue& key_value : key_values) {
    const otlp_common::AnyValue& value = key_value.value();
    std::string shown;
    switch (value.value_case()) {
      case otlp_common::AnyValue::kStringValue:
        shown = absl::StrCat("'", value.string_value(), "'");
        break;
      case otlp_common::AnyValue::kIntValue:
        shown = absl::StrCat("int ", value.int_value());
        break;
      case otlp_common::AnyValue::kDoubleValue:
        shown = absl::StrCat("double ", value.double_value());
        break;
      case otlp_common::AnyValue::kBoolValue:
        shown = value.bool_value() ? "true" : "false";
        break;
      default:
        shown = "other";
    }
    text.push_back(absl::StrCat(key_value.key(), "=", shown));
  }
  return text;
}

TEST(TracerExportTest, SendsSpansWithEveryFieldToTheCollector) {
  CollectorServer server;
  std::unique_ptr<Tracer> tracer =
      CreateTracer({.otlp_endpoint = absl::StrCat("http://", server.endpoint()),
                    .service_name = "attnserve-test",
                    .service_version = "1.2.3"});
  ASSERT_NE(tracer, nullptr);

  absl::StatusOr<SpanContext> remote =
      ParseTraceContext(Traceparent("00", "01"), "rojo=1");
  ASSERT_TRUE(remote.ok()) << remote.status();
  const SpanContext request_context = tracer->NewSpanContext(&*remote);
  const SpanContext compute_context = tracer->NewSpanContext(&request_context);
  const SpanContext other_request = tracer->NewSpanContext(nullptr);
  const absl::Time start = absl::FromUnixNanos(1'700'000'000'123'456'789);

  SpanRecord request;
  request.context = request_context;
  request.parent_span_id = remote->span_id;
  request.name = "POST /v1/embeddings";
  request.kind = SpanKind::kServer;
  request.start_time = start;
  request.end_time = start + absl::Milliseconds(5);
  request.attributes = {{"http.route", "/v1/embeddings"},
                        {"attnserve.tokens", 42},
                        {"attnserve.share", 0.5},
                        {"attnserve.cached", true}};
  request.status_code = SpanStatusCode::kError;
  request.status_message = "model not ready";
  SpanRecord compute;
  compute.context = compute_context;
  compute.parent_span_id = request_context.span_id;
  compute.name = "compute";
  compute.start_time = start + absl::Milliseconds(1);
  compute.end_time = start + absl::Milliseconds(4);
  compute.links = {{other_request.trace_id, other_request.span_id, {{"batch.index", 1}}}};
  compute.status_code = SpanStatusCode::kOk;
  compute.status_message = "not sent: only errors carry a message";
  std::vector<SpanRecord> spans;
  spans.push_back(request);
  spans.push_back(compute);
  tracer->Submit(std::move(spans));
  tracer->Shutdown();  // the final flush sends what the interval has not

  EXPECT_EQ(tracer->exported_spans(), 2);
  const auto requests = server.collector().requests();
  ASSERT_EQ(requests.size(), 1u);
  ASSERT_EQ(requests[0].resource_spans_size(), 1);
  const otlp_trace::ResourceSpans& resource_spans = requests[0].resource_spans(0);
  EXPECT_THAT(AttributeText(resource_spans.resource().attributes()),
              ::testing::ElementsAre(
                  "service.name='attnserve-test'", "service.version='1.2.3'",
                  "telemetry.sdk.language='cpp'", "telemetry.sdk.name='attnserve'"));
  ASSERT_EQ(resource_spans.scope_spans_size(), 1);
  EXPECT_EQ(resource_spans.scope_spans(0).scope().name(), "attnserve");
  ASSERT_EQ(resource_spans.scope_spans(0).spans_size(), 2);

  const otlp_trace::Span& sent_request = resource_spans.scope_spans(0).spans(0);
  EXPECT_EQ(sent_request.trace_id(), absl::HexStringToBytes(kTraceIdHex));
  EXPECT_EQ(sent_request.span_id(), IdBytes(request_context.span_id));
  EXPECT_EQ(sent_request.parent_span_id(), absl::HexStringToBytes(kSpanIdHex));
  EXPECT_EQ(sent_request.trace_state(), "rojo=1");
  EXPECT_EQ(sent_request.flags(), 1u);
  EXPECT_EQ(sent_request.name(), "POST /v1/embeddings");
  EXPECT_EQ(sent_request.kind(), otlp_trace::Span::SPAN_KIND_SERVER);
  EXPECT_EQ(sent_request.start_time_unix_nano(), 1'700'000'000'123'456'789u);
  EXPECT_EQ(sent_request.end_time_unix_nano(), 1'700'000'000'128'456'789u);
  EXPECT_THAT(
      AttributeText(sent_request.attributes()),
      ::testing::ElementsAre("http.route='/v1/embeddings'", "attnserve.tokens=int 42",
                             "attnserve.share=double 0.5", "attnserve.cached=true"));
  EXPECT_EQ(sent_request.links_size(), 0);
  EXPECT_EQ(sent_request.status().code(), otlp_trace::Status::STATUS_CODE_ERROR);
  EXPECT_EQ(sent_request.status().message(), "model not ready");

  const otlp_trace::Span& sent_compute = resource_spans.scope_spans(0).spans(1);
  EXPECT_EQ(sent_compute.trace_id(), absl::HexStringToBytes(kTraceIdHex));
  EXPECT_EQ(sent_compute.span_id(), IdBytes(compute_context.span_id));
  EXPECT_EQ(sent_compute.parent_span_id(), IdBytes(request_context.span_id));
  EXPECT_EQ(sent_compute.kind(), otlp_trace::Span::SPAN_KIND_INTERNAL);
  EXPECT_EQ(sent_compute.start_time_unix_nano(), 1'700'000'000'124'456'789u);
  EXPECT_EQ(sent_compute.end_time_unix_nano(), 1'700'000'000'127'456'789u);
  ASSERT_EQ(sent_compute.links_size(), 1);
  EXPECT_EQ(sent_compute.links(0).trace_id(), IdBytes(other_request.trace_id));
  EXPECT_EQ(sent_compute.links(0).span_id(), IdBytes(other_request.span_id));
  EXPECT_THAT(AttributeText(sent_compute.links(0).attributes()),
              ::testing::ElementsAre("batch.index=int 1"));
  EXPECT_EQ(sent_compute.status().code(), otlp_trace::Status::STATUS_CODE_OK);
  EXPECT_EQ(sent_compute.status().message(), "");
}

TEST(TracerExportTest, ARootSpanHasNoParentId) {
  CollectorServer server;
  std::unique_ptr<Tracer> tracer = CreateTracer({.otlp_endpoint = server.endpoint()});
  ASSERT_NE(tracer, nullptr);
  SpanRecord root = MakeSpan("root");
  root.context = tracer->NewSpanContext(nullptr);
  std::vector<SpanRecord> spans;
  spans.push_back(std::move(root));
  tracer->Submit(std::move(spans));
  tracer->Shutdown();
  const auto requests = server.collector().requests();
  ASSERT_EQ(requests.size(), 1u);
  const otlp_trace::Span& sent = requests[0].resource_spans(0).scope_spans(0).spans(0);
  EXPECT_EQ(sent.parent_span_id(), "");
  EXPECT_EQ(sent.trace_id().size(), 16u);
  EXPECT_EQ(sent.status().code(), otlp_trace::Status::STATUS_CODE_UNSET);
}

TEST(TracerExportTest, SendsAFullBatchWithoutWaitingForTheInterval) {
  CollectorServer server;
  std::unique_ptr<Tracer> tracer = CreateTracer({.otlp_endpoint = server.endpoint(),
                                                 .max_export_batch = 3,
                                                 .export_interval = absl::Hours(1)});
  ASSERT_NE(tracer, nullptr);
  tracer->Submit(MakeSpans(2));
  tracer->Submit(MakeSpans(1));
  // Only a full batch can wake the exporter before an hour has passed.
  server.collector().WaitForSpans(3);
  tracer->Shutdown();
  EXPECT_EQ(tracer->exported_spans(), 3);
  const auto requests = server.collector().requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].resource_spans(0).scope_spans(0).spans_size(), 3);
}

TEST(TracerExportTest, SendsAPartialBatchAfterTheInterval) {
  CollectorServer server;
  std::unique_ptr<Tracer> tracer = CreateTracer(
      {.otlp_endpoint = server.endpoint(), .export_interval = absl::Milliseconds(10)});
  ASSERT_NE(tracer, nullptr);
  tracer->Submit(MakeSpans(1));
  server.collector().WaitForSpans(1);
  tracer->Submit(MakeSpans(1));
  server.collector().WaitForSpans(2);
}

TEST(TracerExportTest, SplitsTheQueueIntoBatches) {
  CollectorServer server;
  std::unique_ptr<Tracer> tracer = CreateTracer({.otlp_endpoint = server.endpoint(),
                                                 .max_export_batch = 4,
                                                 .export_interval = absl::Hours(1)});
  ASSERT_NE(tracer, nullptr);
  tracer->Submit(MakeSpans(10));
  tracer->Shutdown();
  EXPECT_EQ(tracer->exported_spans(), 10);
  std::vector<int> sizes;
  for (const auto& request : server.collector().requests()) {
    sizes.push_back(request.resource_spans(0).scope_spans(0).spans_size());
  }
  EXPECT_THAT(sizes, ::testing::ElementsAre(4, 4, 2));
}

TEST(TracerExportTest, IgnoresUnsampledSpans) {
  CollectorServer server;
  std::unique_ptr<Tracer> tracer = CreateTracer({.otlp_endpoint = server.endpoint()});
  ASSERT_NE(tracer, nullptr);
  std::vector<SpanRecord> spans = MakeSpans(3);
  spans[1].context.sampled = false;
  tracer->Submit(std::move(spans));
  tracer->Shutdown();
  EXPECT_EQ(tracer->exported_spans(), 2);
  EXPECT_EQ(tracer->dropped_spans(DropReason::kQueueFull), 0);
  EXPECT_EQ(tracer->dropped_spans(DropReason::kShutdown), 0);
  EXPECT_EQ(tracer->dropped_spans(DropReason::kExportFailed), 0);
}

TEST(TracerExportTest, CountsBatchesThatCannotReachTheCollectorAsExportFailed) {
  RefusingPort port;
  std::unique_ptr<Tracer> tracer =
      CreateTracer({.otlp_endpoint = port.endpoint(),
                    .max_export_batch = 5,
                    // Refused connections fail at once; the long timeout keeps a loaded
                    // machine from turning them into shutdown drops.
                    .export_timeout = absl::Minutes(1)});
  ASSERT_NE(tracer, nullptr);
  for (int i = 0; i < 20; ++i) {
    tracer->Submit(MakeSpans(5));  // returns whatever the exporter is doing
  }
  tracer->Shutdown();
  EXPECT_EQ(tracer->exported_spans(), 0);
  EXPECT_EQ(tracer->dropped_spans(DropReason::kExportFailed), 100);
  EXPECT_EQ(tracer->dropped_spans(DropReason::kQueueFull), 0);
  EXPECT_EQ(tracer->dropped_spans(DropReason::kShutdown), 0);
}

TEST(TracerExportTest, DropsSpansBeyondTheQueueWhileTheCollectorHoldsABatch) {
  CollectorServer server(/*hold=*/true);
  prometheus::Registry registry;
  std::unique_ptr<Tracer> tracer = CreateTracer({.otlp_endpoint = server.endpoint(),
                                                 .max_queue_spans = 4,
                                                 .max_export_batch = 2,
                                                 .export_interval = absl::Hours(1),
                                                 .export_timeout = absl::Minutes(1)},
                                                &registry);
  ASSERT_NE(tracer, nullptr);
  tracer->Submit(MakeSpans(2));
  // The exporter now waits on the collector, with the queue empty.
  server.collector().WaitForSpans(2);
  tracer->Submit(MakeSpans(3));
  tracer->Submit(MakeSpans(3));  // one fits, two do not
  EXPECT_EQ(tracer->dropped_spans(DropReason::kQueueFull), 2);
  server.collector().Release();
  server.collector().WaitForSpans(6);
  tracer->Shutdown();
  EXPECT_EQ(tracer->exported_spans(), 6);
  EXPECT_EQ(tracer->dropped_spans(DropReason::kQueueFull), 2);

  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::string name = family.name;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        absl::StrAppend(&name, "{", label.name, "=", label.value, "}");
      }
      values[name] = metric.counter.value;
    }
  }
  EXPECT_EQ(values["attnserve_trace_spans_exported_total"], 6);
  EXPECT_EQ(values["attnserve_trace_spans_dropped_total{reason=queue_full}"], 2);
  EXPECT_EQ(values["attnserve_trace_spans_dropped_total{reason=export_failed}"], 0);
  EXPECT_EQ(values["attnserve_trace_spans_dropped_total{reason=shutdown}"], 0);
}

TEST(TracerExportTest, CountsSpansTheCollectorRejectsAsExportFailed) {
  CollectorServer server(/*hold=*/false, /*reject_per_request=*/1);
  std::unique_ptr<Tracer> tracer = CreateTracer({.otlp_endpoint = server.endpoint()});
  ASSERT_NE(tracer, nullptr);
  tracer->Submit(MakeSpans(3));
  tracer->Shutdown();
  EXPECT_EQ(tracer->exported_spans(), 2);
  EXPECT_EQ(tracer->dropped_spans(DropReason::kExportFailed), 1);
}

TEST(TracerExportTest, ShutdownGivesUpOnACollectorThatNeverAnswers) {
  CollectorServer server(/*hold=*/true);
  std::unique_ptr<Tracer> tracer =
      CreateTracer({.otlp_endpoint = server.endpoint(),
                    .max_export_batch = 2,
                    .export_interval = absl::Hours(1),
                    .export_timeout = absl::Milliseconds(100)});
  ASSERT_NE(tracer, nullptr);
  tracer->Submit(MakeSpans(5));
  tracer->Shutdown();  // returns although the collector answers nothing
  EXPECT_EQ(tracer->exported_spans(), 0);
  // How many batches were sent before the flush deadline depends on the machine's load;
  // every span is counted once either way.
  EXPECT_EQ(tracer->dropped_spans(DropReason::kExportFailed) +
                tracer->dropped_spans(DropReason::kShutdown),
            5);
}

TEST(TracerExportTest, DropsSpansSubmittedAfterShutdown) {
  CollectorServer server;
  std::unique_ptr<Tracer> tracer = CreateTracer({.otlp_endpoint = server.endpoint()});
  ASSERT_NE(tracer, nullptr);
  tracer->Shutdown();
  tracer->Submit(MakeSpans(4));
  tracer->Shutdown();  // idempotent
  EXPECT_EQ(tracer->dropped_spans(DropReason::kShutdown), 4);
  EXPECT_EQ(tracer->exported_spans(), 0);
  EXPECT_TRUE(server.collector().requests().empty());
}

}  // namespace
}  // namespace attnserve::server
