// MetricsHttp: the metrics port. GET /metrics is the Prometheus text exposition
// (ServerMetrics::Render); GET / is the status page (status_page.h), drawn from samples
// of the server's own histograms that a background thread takes every sample_interval;
// GET /heads is its head view (heads_page.h).
// civetweb, as the KServe HTTP door.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_METRICS_HTTP_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_METRICS_HTTP_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/models/model_registry.h"
#include "server/observability/heads_page.h"
#include "server/observability/server_metrics.h"
#include "server/observability/status_page.h"
#include "server/pipeline/auth.h"

struct mg_connection;
struct mg_context;

namespace attnserve::server {

// Thread-safe: civetweb's threads serve requests while the sampler runs.
class MetricsHttp {
 public:
  struct Options {
    // Address and port to listen on; port 0 picks a free one.
    std::string host = "0.0.0.0";
    int port = 8080;
    // How often the status page's histograms are sampled, and how many samples it
    // keeps: the charts cover interval * (samples - 1). interval > 0, samples >= 2.
    absl::Duration sample_interval = absl::Seconds(10);
    int samples = 31;
    // Shown on the status page.
    std::string version;
    std::vector<std::pair<std::string, std::string>> flags;
    // Measures an encoder's heads on one text for the head view (GET /heads,
    // heads_page.h): HeadStatistics with return_attention, through the request
    // pipeline. Called on a civetweb thread, which it may block until the answer; one
    // measurement at a time (another meanwhile is answered 429), so that the view
    // never holds more than one of the port's threads from /metrics.
    // Unset: /heads says the view is off.
    std::function<absl::StatusOr<v1::HeadStatisticsResponse>(const std::string& model,
                                                             const std::string& text)>
        measure_heads;
  };

  // Serves until Stop. `metrics` and `registry` are not owned and must outlive this
  // object; `auth` (may be null: no authentication) guards the status page, which
  // accepts "Authorization: Bearer <token>" or HTTP Basic with the token as the
  // password (what a browser sends after the 401's prompt). /metrics stays open, as
  // Prometheus scrapes it. Unavailable when the port cannot be bound; InvalidArgument
  // for a bad option.
  static absl::StatusOr<std::unique_ptr<MetricsHttp>> Start(const Options& options,
                                                            const ServerMetrics* metrics,
                                                            const ModelRegistry* registry,
                                                            TokenAuthenticator* auth);
  ~MetricsHttp();
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;

  int port() const { return port_; }
  // Closes the port and joins the sampler. Idempotent.
  void Stop();

  // The civetweb handler; public for its C callback. Never throws.
  int Handle(mg_connection* connection) noexcept;

 private:
  MetricsHttp(const Options& options, const ServerMetrics* metrics,
              const ModelRegistry* registry, TokenAuthenticator* auth)
      : options_(options), metrics_(metrics), registry_(registry), auth_(auth) {}
  StatusSample TakeSample() const;
  void Sample();
  std::string StatusPage();
  // GET /heads: the status code and the page.
  std::pair<int, std::string> HeadsPage(const mg_connection* connection);

  const Options options_;
  const ServerMetrics* const metrics_;
  const ModelRegistry* const registry_;
  TokenAuthenticator* const auth_;
  const absl::Time started_ = absl::Now();
  std::atomic<bool> measuring_{false};  // a head-view measurement is running
  mg_context* context_ = nullptr;
  int port_ = 0;
  absl::Notification stop_;
  std::thread sampler_;
  absl::Mutex mu_;
  std::deque<StatusSample> samples_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_METRICS_HTTP_H_
