#include "server/observability/status_page.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/attention/model_spec.h"
#include "server/models/model_loader.h"
#include "server/models/model_registry.h"

namespace attnserve::server {
namespace {

// What a model does, as the models table shows it: an attention layer, an encoder that
// embeds, or one that scores (a reranker has one label, a classifier more).
std::string KindName(const v1::ModelInfo& model) {
  if (model.kind() != v1::MODEL_KIND_ENCODER) return "attention";
  if (model.encoder().task() == v1::EncoderConfig::TASK_SPARSE_EMBED) {
    return "sparse encoder (SPLADE)";
  }
  if (model.encoder().task() != v1::EncoderConfig::TASK_CLASSIFY) return "encoder";
  if (model.encoder().labels_size() == 1) return "reranker";
  return absl::StrCat("classifier (", model.encoder().labels_size(), " labels)");
}

// The counts that fell between two snapshots, per bucket (not cumulative).
std::vector<uint64_t> BucketDeltas(const ServerMetrics::HistogramCounts& before,
                                   const ServerMetrics::HistogramCounts& after) {
  std::vector<uint64_t> deltas(after.cumulative.size(), 0);
  uint64_t previous = 0;
  for (size_t i = 0; i < after.cumulative.size(); ++i) {
    const uint64_t then = i < before.cumulative.size() ? before.cumulative[i] : 0;
    const uint64_t cumulative =
        after.cumulative[i] >= then ? after.cumulative[i] - then : 0;
    deltas[i] = cumulative >= previous ? cumulative - previous : 0;
    previous = std::max(previous, cumulative);
  }
  return deltas;
}

constexpr int kChartWidth = 560;
constexpr int kChartHeight = 150;
constexpr int kMargin = 40;

// A line chart of one or two series over the samples' intervals (x: time, y: values;
// a negative value is a gap). Each series is a <polyline class="series NAME"
// data-points="N"> so that the page can be checked for data.
std::string LineChart(
    const std::string& title, const std::string& unit,
    const std::vector<std::pair<std::string, std::vector<double>>>& series) {
  double top = 0;
  size_t length = 0;
  for (const auto& [name, values] : series) {
    length = std::max(length, values.size());
    for (const double value : values) top = std::max(top, value);
  }
  if (top <= 0) top = 1;
  std::string svg = absl::StrFormat(
      "<figure><figcaption>%s</figcaption><svg class=\"chart\" width=\"%d\" "
      "height=\"%d\" "
      "viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"%s\">",
      HtmlEscape(title), kChartWidth, kChartHeight, kChartWidth, kChartHeight,
      HtmlEscape(title));
  const int plot_width = kChartWidth - 2 * kMargin;
  const int plot_height = kChartHeight - 2 * 20;
  absl::StrAppendFormat(
      &svg,
      "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"axis\"/>"
      "<line x1=\"%d\" y1=\"20\" x2=\"%d\" y2=\"%d\" class=\"axis\"/>"
      "<text x=\"2\" y=\"24\">%.3g %s</text><text x=\"2\" y=\"%d\">0</text>",
      kMargin, 20 + plot_height, kMargin + plot_width, 20 + plot_height, kMargin, kMargin,
      20 + plot_height, top, HtmlEscape(unit), 24 + plot_height);
  static const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c"};
  for (size_t s = 0; s < series.size(); ++s) {
    const auto& [name, values] = series[s];
    std::string points, dots;
    int count = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] < 0) continue;
      const double x = kMargin + (length > 1 ? plot_width * static_cast<double>(i) /
                                                   static_cast<double>(length - 1)
                                             : plot_width / 2.0);
      const double y = 20 + plot_height * (1 - values[i] / top);
      absl::StrAppendFormat(&points, "%.1f,%.1f ", x, y);
      absl::StrAppendFormat(&dots,
                            "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>", x,
                            y, kColors[s % 3]);
      ++count;
    }
    absl::StrAppendFormat(
        &svg,
        "<polyline class=\"series %s\" data-points=\"%d\" points=\"%s\" "
        "fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>%s"
        "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>",
        HtmlEscape(name), count, points, kColors[s % 3], dots,
        kMargin + 8 + 60 * static_cast<int>(s), 14, kColors[s % 3], HtmlEscape(name));
  }
  svg += "</svg></figure>";
  return svg;
}

// A bar chart of a histogram's counts over the window, one <rect class="bar"
// data-count="N"> per bucket that holds any.
std::string BarChart(const std::string& title,
                     const ServerMetrics::HistogramCounts& before,
                     const ServerMetrics::HistogramCounts& after) {
  const std::vector<uint64_t> deltas = BucketDeltas(before, after);
  uint64_t top = 1;
  for (const uint64_t delta : deltas) top = std::max(top, delta);
  std::string svg = absl::StrFormat(
      "<figure><figcaption>%s</figcaption><svg class=\"chart\" width=\"%d\" "
      "height=\"%d\" "
      "viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"%s\">",
      HtmlEscape(title), kChartWidth, kChartHeight, kChartWidth, kChartHeight,
      HtmlEscape(title));
  const int plot_height = kChartHeight - 40;
  const size_t buckets = std::max<size_t>(deltas.size(), 1);
  const double width = static_cast<double>(kChartWidth - 2 * kMargin) / buckets;
  for (size_t i = 0; i < deltas.size(); ++i) {
    const double x = kMargin + width * static_cast<double>(i);
    const double height =
        plot_height * static_cast<double>(deltas[i]) / static_cast<double>(top);
    const double bound = after.upper_bounds[i];
    const std::string label = std::isinf(bound) ? "more" : absl::StrFormat("%g", bound);
    if (deltas[i] > 0) {
      absl::StrAppendFormat(
          &svg,
          "<rect class=\"bar\" data-count=\"%d\" x=\"%.1f\" y=\"%.1f\" "
          "width=\"%.1f\" height=\"%.1f\" fill=\"#1f77b4\"><title>&le; %s: "
          "%d</title></rect>",
          deltas[i], x + 1, 20 + plot_height - height, width - 2, height, label,
          deltas[i]);
    }
    absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%d\" font-size=\"9\">%s</text>",
                          x + 2, kChartHeight - 6, label);
  }
  svg += "</svg></figure>";
  return svg;
}

std::string Duration(absl::Duration duration) {
  return absl::FormatDuration(absl::Trunc(duration, absl::Seconds(1)));
}

}  // namespace

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

double QuantileBetween(const ServerMetrics::HistogramCounts& before,
                       const ServerMetrics::HistogramCounts& after, double q) {
  const std::vector<uint64_t> deltas = BucketDeltas(before, after);
  uint64_t total = 0;
  for (const uint64_t delta : deltas) total += delta;
  if (total == 0) return -1;
  const double rank = q * static_cast<double>(total);
  double seen = 0;
  for (size_t i = 0; i < deltas.size(); ++i) {
    const double lower = i == 0 ? 0 : after.upper_bounds[i - 1];
    const double upper = after.upper_bounds[i];
    if (seen + static_cast<double>(deltas[i]) >= rank && deltas[i] > 0) {
      if (std::isinf(upper)) return lower;  // past the last bound: its lower edge
      return lower + (upper - lower) * (rank - seen) / static_cast<double>(deltas[i]);
    }
    seen += static_cast<double>(deltas[i]);
  }
  return after.upper_bounds.size() > 1 ? after.upper_bounds[after.upper_bounds.size() - 2]
                                       : -1;
}

namespace {

// The kind cell: an encoder's links to its head view.
std::string Kind(const v1::ModelInfo& model) {
  std::string kind = KindName(model);
  if (model.kind() == v1::MODEL_KIND_ENCODER) {
    absl::StrAppend(&kind,
                    " (<a class=\"heads\" href=\"/heads?model=", HtmlEscape(model.name()),
                    "\">heads</a>)");
  }
  return kind;
}

}  // namespace

std::string RenderStatusPage(const StatusView& view) {
  const absl::Time now = view.samples.empty() ? absl::Now() : view.samples.back().time;
  const absl::Duration window =
      view.samples.size() > 1 ? now - view.samples.front().time : absl::ZeroDuration();
  std::string html = absl::StrCat(
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta http-equiv=\"refresh\" content=\"10\"><title>attnserve status</title><style>"
      "body{font-family:sans-serif;margin:1.5em;color:#222}"
      "table{border-collapse:collapse;margin:.5em 0 1.5em}"
      "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
      "th{background:#f3f3f3}figure{display:inline-block;margin:.5em 1em .5em 0}"
      "figcaption{font-size:.9em;color:#555}.axis{stroke:#999}svg text{font-size:11px}"
      "</style></head><body><h1>attnserve</h1><p>version ",
      HtmlEscape(view.version), ", up ", Duration(now - view.started),
      ", charts over the last ", Duration(window),
      " (the page reloads every 10 s). <a href=\"/metrics\">/metrics</a></p>");

  html +=
      "<h2>Models</h2><table "
      "id=\"models\"><tr><th>model</th><th>kind</th><th>version</th>"
      "<th>device</th><th>precision</th><th>d_model / heads</th><th>batching</th>"
      "<th>queue now</th><th>in flight</th><th>answered</th><th>p50 / p99 (ms)</th></tr>";
  const StatusSample* first = view.samples.empty() ? nullptr : &view.samples.front();
  const StatusSample* last = view.samples.empty() ? nullptr : &view.samples.back();
  const auto find = [](const StatusSample* sample,
                       const std::string& name) -> const ServerMetrics::ModelSnapshot* {
    if (sample == nullptr) return nullptr;
    const auto it = sample->models.find(name);
    return it == sample->models.end() ? nullptr : &it->second;
  };
  for (const v1::ModelInfo& model : view.models) {
    const v1::BatchingConfig& batching = model.batching();
    const ServerMetrics::ModelSnapshot* then = find(first, model.name());
    const ServerMetrics::ModelSnapshot* current = find(last, model.name());
    std::string percentiles = "-";
    if (then != nullptr && current != nullptr) {
      const double p50 =
          QuantileBetween(then->request_duration, current->request_duration, 0.5);
      const double p99 =
          QuantileBetween(then->request_duration, current->request_duration, 0.99);
      if (p50 >= 0) percentiles = absl::StrFormat("%.2f / %.2f", 1e3 * p50, 1e3 * p99);
    }
    absl::StrAppendFormat(
        &html,
        "<tr class=\"model\" "
        "data-model=\"%s\"><td>%s</td><td>%s</td><td>%s</td><td>%s</td>"
        "<td>%s</td><td>%d / %d</td><td>max_batch_size %d, max_batch_tokens %d, "
        "max_queue_delay %d us, max_queue_size %d, instances "
        "%d</td><td>%d</td><td>%d</td>"
        "<td>%d</td><td>%s</td></tr>",
        HtmlEscape(model.name()), HtmlEscape(model.name()), Kind(model),
        HtmlEscape(model.version()), HtmlEscape(model.device()),
        core::PrecisionName(ToCorePrecision(model.precision())), model.d_model(),
        model.num_heads(), batching.max_batch_size(), batching.max_batch_tokens(),
        batching.max_queue_delay_us(), batching.max_queue_size(), batching.instances(),
        current != nullptr ? current->queue_depth : 0,
        current != nullptr ? current->inflight : 0,
        current != nullptr ? static_cast<int64_t>(current->request_duration.count) : 0,
        percentiles);
  }
  html += "</table>";

  for (const v1::ModelInfo& model : view.models) {
    std::vector<double> p50, p99, rate;
    for (size_t i = 1; i < view.samples.size(); ++i) {
      const auto* before = find(&view.samples[i - 1], model.name());
      const auto* after = find(&view.samples[i], model.name());
      if (before == nullptr || after == nullptr) continue;
      const double seconds =
          absl::ToDoubleSeconds(view.samples[i].time - view.samples[i - 1].time);
      const double a =
          QuantileBetween(before->request_duration, after->request_duration, 0.5);
      const double b =
          QuantileBetween(before->request_duration, after->request_duration, 0.99);
      p50.push_back(a < 0 ? -1 : 1e3 * a);
      p99.push_back(b < 0 ? -1 : 1e3 * b);
      rate.push_back(seconds > 0 ? static_cast<double>(after->request_duration.count -
                                                       before->request_duration.count) /
                                       seconds
                                 : 0);
    }
    absl::StrAppend(&html, "<section class=\"charts\" data-model=\"",
                    HtmlEscape(model.name()), "\"><h3>", HtmlEscape(model.name()),
                    "</h3>");
    html += LineChart("latency (ms) per interval", "ms", {{"p50", p50}, {"p99", p99}});
    html += LineChart("answered requests per second", "/s", {{"rate", rate}});
    const auto* then = find(first, model.name());
    const auto* current = find(last, model.name());
    if (then != nullptr && current != nullptr) {
      html += BarChart("batch sizes (requests per batch) over the window",
                       then->batch_size, current->batch_size);
    }
    html += "</section>";
  }

  html +=
      "<h2>Build and flags</h2><table id=\"flags\"><tr><th>flag</th><th>value</th></tr>";
  for (const auto& [name, value] : view.flags) {
    absl::StrAppend(&html, "<tr><td>--", HtmlEscape(name), "</td><td>", HtmlEscape(value),
                    "</td></tr>");
  }
  html += "</table></body></html>";
  return html;
}

}  // namespace attnserve::server
