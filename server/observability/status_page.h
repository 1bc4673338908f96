// The status page an operator opens in a browser on the metrics port (GET /): the served
// models with their devices, precisions and batching, the live queue, latency
// percentiles and batch sizes over the last minutes as inline SVG charts drawn from the
// server's own histograms, and the build and flags. Server-rendered HTML: no JavaScript,
// nothing fetched from elsewhere.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_STATUS_PAGE_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_STATUS_PAGE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "attnserve/v1/attention.pb.h"
#include "server/observability/server_metrics.h"

namespace attnserve::server {

// The models' figures at one moment.
struct StatusSample {
  absl::Time time;
  std::map<std::string, ServerMetrics::ModelSnapshot> models;
};

// Everything the page shows.
struct StatusView {
  std::string version;
  absl::Time started;
  // The server's flags as given (name, value).
  std::vector<std::pair<std::string, std::string>> flags;
  // The served models, as GetModel describes them.
  std::vector<v1::ModelInfo> models;
  // Samples of the last minutes, oldest first; the last is now. Charts draw the
  // intervals between consecutive samples.
  std::vector<StatusSample> samples;
};

// The q-quantile (0 < q < 1) of the samples that fell between `before` and `after`
// (two snapshots of one histogram), interpolated linearly inside the bucket it falls in
// as Prometheus's histogram_quantile does; -1 when no sample fell between them.
double QuantileBetween(const ServerMetrics::HistogramCounts& before,
                       const ServerMetrics::HistogramCounts& after, double q);

// The page. Every text from the models and flags is HTML-escaped.
std::string RenderStatusPage(const StatusView& view);

// `text` with & < > " ' as HTML character references.
std::string HtmlEscape(const std::string& text);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_STATUS_PAGE_H_
