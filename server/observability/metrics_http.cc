#include "server/observability/metrics_http.h"

#include <civetweb.h>

#include <cstring>
#include <exception>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/pipeline/proto_convert.h"
#include "transport/listen_error.h"

namespace attnserve::server {
namespace {

int Dispatch(mg_connection* connection, void* self) {
  return static_cast<MetricsHttp*>(self)->Handle(connection);
}

void Send(mg_connection* connection, int status, const char* reason,
          const std::string& body, const char* content_type,
          const std::string& extra_headers = "") {
  mg_printf(connection,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
            "Cache-Control: no-store\r\nConnection: keep-alive\r\n\r\n",
            status, reason, content_type, body.size(), extra_headers.c_str());
  if (!body.empty()) mg_write(connection, body.data(), body.size());
}

// The header as TokenAuthenticator reads it: "Bearer <token>" as sent, or the
// password of HTTP Basic as a bearer token (browsers send Basic after a 401).
std::string BearerOf(const char* header) {
  if (header == nullptr) return "";
  absl::string_view value = header;
  if (absl::ConsumePrefix(&value, "Basic ")) {
    std::string decoded;
    if (!absl::Base64Unescape(value, &decoded)) return "";
    const size_t colon = decoded.find(':');
    return colon == std::string::npos ? "" : "Bearer " + decoded.substr(colon + 1);
  }
  return std::string(value);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttp>> MetricsHttp::Start(
    const Options& options, const ServerMetrics* metrics, const ModelRegistry* registry,
    TokenAuthenticator* auth) {
  if (!(options.sample_interval > absl::ZeroDuration()) || options.samples < 2) {
    return absl::InvalidArgumentError("sample_interval must be > 0 and samples >= 2");
  }
  std::unique_ptr<MetricsHttp> http(new MetricsHttp(options, metrics, registry, auth));
  const bool ipv6 = absl::StrContains(options.host, ':');
  const std::string address = ipv6 ? absl::StrCat("[", options.host, "]:", options.port)
                                   : absl::StrCat(options.host, ":", options.port);
  const char* civet_options[] = {"listening_ports",
                                 address.c_str(),
                                 "num_threads",
                                 "4",
                                 "request_timeout_ms",
                                 "10000",
                                 "enable_keep_alive",
                                 "yes",
                                 "tcp_nodelay",
                                 "1",
                                 nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  http->context_ = mg_start(&callbacks, http.get(), civet_options);
  if (http->context_ == nullptr) {
    return transport::ListenError("metrics", "--metrics_port", options.host,
                                  options.port);
  }
  mg_set_request_handler(http->context_, "/", Dispatch, http.get());
  mg_server_port ports[1];
  if (mg_get_server_ports(http->context_, 1, ports) < 1) {
    http->Stop();
    return absl::UnavailableError(absl::StrCat("no metrics port bound on ", address));
  }
  http->port_ = ports[0].port;
  http->Sample();
  http->sampler_ = std::thread([raw = http.get()] {
    while (!raw->stop_.WaitForNotificationWithTimeout(raw->options_.sample_interval)) {
      raw->Sample();
    }
  });
  return http;
}

MetricsHttp::~MetricsHttp() { Stop(); }

void MetricsHttp::Stop() {
  if (context_ != nullptr) {
    mg_stop(context_);
    context_ = nullptr;
  }
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (sampler_.joinable()) sampler_.join();
}

StatusSample MetricsHttp::TakeSample() const {
  StatusSample sample;
  sample.time = absl::Now();
  for (const auto& model : registry_->models()) {
    if (auto snapshot = metrics_->Snapshot(model->name)) {
      sample.models.emplace(model->name, *std::move(snapshot));
    }
  }
  return sample;
}

void MetricsHttp::Sample() {
  StatusSample sample = TakeSample();
  absl::MutexLock lock(&mu_);
  samples_.push_back(std::move(sample));
  while (static_cast<int>(samples_.size()) > options_.samples - 1) samples_.pop_front();
}

std::string MetricsHttp::StatusPage() {
  StatusView view;
  view.version = options_.version;
  view.started = started_;
  view.flags = options_.flags;
  for (const auto& model : registry_->models()) view.models.push_back(model->info);
  {
    absl::MutexLock lock(&mu_);
    view.samples.assign(samples_.begin(), samples_.end());
  }
  view.samples.push_back(TakeSample());  // now, as the last point
  return RenderStatusPage(view);
}

std::pair<int, std::string> MetricsHttp::HeadsPage(const mg_connection* connection) {
  HeadsView view;
  for (const auto& model : registry_->models()) {
    if (model->is_encoder()) view.encoders.push_back(model->name);
  }
  const mg_request_info* request = mg_get_request_info(connection);
  absl::StatusOr<HeadsQuery> query =
      ParseHeadsQuery(request->query_string != nullptr ? request->query_string : "");
  if (!query.ok()) {
    view.measured = query.status();
    return {400, RenderHeadsPage(view)};
  }
  view.query = *std::move(query);
  if (view.query.model.empty() && !view.encoders.empty()) {
    view.query.model = view.encoders.front();
  }
  if (view.query.text.empty()) return {200, RenderHeadsPage(view)};
  if (!options_.measure_heads) {
    view.measured = absl::UnimplementedError("the head view is off on this server");
  } else if (measuring_.exchange(true)) {
    view.measured = absl::ResourceExhaustedError(
        "the head view measures one text at a time, and another is being measured; try "
        "again when it is done");
  } else {
    const absl::Cleanup done = [this] { measuring_ = false; };
    view.measured = options_.measure_heads(view.query.model, view.query.text);
  }
  const int code = HttpStatusFor(view.measured->status().code());
  return {code, RenderHeadsPage(view)};
}

int MetricsHttp::Handle(mg_connection* connection) noexcept {
  try {
    const mg_request_info* request = mg_get_request_info(connection);
    const std::string method = request->request_method;
    const std::string uri = request->local_uri != nullptr ? request->local_uri : "";
    if (method != "GET" && method != "HEAD") {
      Send(connection, 405, "Method Not Allowed", "use GET\n", "text/plain");
      return 1;
    }
    if (uri == "/metrics") {
      Send(connection, 200, "OK", metrics_->Render(),
           "text/plain; version=0.0.4; charset=utf-8");
      return 1;
    }
    if (uri != "/" && uri != "/heads") {
      Send(connection, 404, "Not Found",
           "no such page: /metrics, / and /heads are served\n", "text/plain");
      return 1;
    }
    if (auth_ != nullptr &&
        !auth_->Check(BearerOf(mg_get_header(connection, "Authorization"))).ok()) {
      Send(connection, 401, "Unauthorized",
           "a token is needed: Authorization: Bearer <token>, or any user name with the "
           "token as the password\n",
           "text/plain", "WWW-Authenticate: Basic realm=\"attnserve\"\r\n");
      return 1;
    }
    if (uri == "/heads") {
      const auto [code, page] = HeadsPage(connection);
      Send(connection, code, HttpReason(code), page, "text/html; charset=utf-8");
      return 1;
    }
    Send(connection, 200, "OK", StatusPage(), "text/html; charset=utf-8");
  } catch (const std::exception& error) {
    Send(connection, 500, "Internal Server Error", error.what(), "text/plain");
  } catch (...) {
    Send(connection, 500, "Internal Server Error", "unknown exception", "text/plain");
  }
  return 1;
}

}  // namespace attnserve::server
