#include "client/bench_report.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace attnserve::client {

namespace {

std::string Errors(const StepResult& step) {
  std::vector<std::string> parts;
  for (const auto& [code, count] : step.errors)
    parts.push_back(absl::StrCat(code, ":", count));
  std::string out = parts.empty() ? "-" : absl::StrJoin(parts, ",");
  if (step.streams_reopened > 0) {
    absl::StrAppend(&out, " (", step.streams_reopened, " streams reopened)");
  }
  return out;
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

std::string FormatTable(const BenchRun& run) {
  std::string out = absl::StrFormat("target=%s model=%s seq_len=%s%s\n", run.target,
                                    run.model.empty() ? "(default)" : run.model,
                                    run.lengths, run.stream ? " stream" : "");
  const bool server =
      std::any_of(run.steps.begin(), run.steps.end(),
                  [](const BenchStep& s) { return s.server.has_value(); });
  absl::StrAppend(&out, absl::StrFormat("%-12s %9s %10s %8s %8s %8s %8s %8s %8s %6s",
                                        "step", "req/s", "tokens/s", "p50ms", "p90ms",
                                        "p95ms", "p99ms", "p99.9ms", "maxms", "stable"));
  if (server) {
    absl::StrAppend(&out,
                    absl::StrFormat(" %9s %9s %7s", "srv_q_ms", "srv_c_ms", "batch"));
  }
  absl::StrAppend(&out, "  errors\n");
  for (const BenchStep& step : run.steps) {
    const StepResult& c = step.client;
    absl::StrAppend(
        &out,
        absl::StrFormat("%-12s %9.1f %10.0f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %6s",
                        absl::StrCat(c.mode == "rate" ? "rate=" : "conc=", c.level),
                        c.requests_per_second(), c.tokens_per_second(), c.p50, c.p90,
                        c.p95, c.p99, c.p999, c.max, c.stable ? "yes" : "no"));
    if (server) {
      if (step.server) {
        absl::StrAppend(
            &out,
            absl::StrFormat(" %9.3f %9.3f %7.2f", step.server->mean_queue_ms,
                            step.server->mean_compute_ms, step.server->mean_batch_size));
      } else {
        absl::StrAppend(&out, absl::StrFormat(" %9s %9s %7s", "-", "-", "-"));
      }
    }
    absl::StrAppend(&out, "  ", Errors(c), "\n");
  }
  return out;
}

std::string FormatJson(const BenchRun& run) {
  std::string out = absl::StrCat(
      "{\"target\": ", JsonString(run.target), ", \"model\": ", JsonString(run.model),
      ", \"seq_len\": ", JsonString(run.lengths),
      ", \"stream\": ", run.stream ? "true" : "false", ", \"steps\": [");
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const StepResult& c = run.steps[i].client;
    std::vector<std::string> errors;
    for (const auto& [code, count] : c.errors) {
      errors.push_back(absl::StrCat(JsonString(code), ": ", count));
    }
    absl::StrAppend(&out, i > 0 ? ", " : "", "{\"mode\": ", JsonString(c.mode),
                    ", \"level\": ", c.level, ", \"seconds\": ", c.seconds,
                    ", \"requests\": ", c.requests, ", \"sent\": ", c.sent,
                    ", \"tokens\": ", c.tokens,
                    ", \"requests_per_second\": ", c.requests_per_second(),
                    ", \"tokens_per_second\": ", c.tokens_per_second(),
                    ", \"latency_ms\": {\"p50\": ", c.p50, ", \"p90\": ", c.p90,
                    ", \"p95\": ", c.p95, ", \"p99\": ", c.p99, ", \"p99.9\": ", c.p999,
                    ", \"max\": ", c.max, ", \"mean\": ", c.mean,
                    "}, \"error_latency_ms\": {\"p50\": ", c.error_p50,
                    ", \"p99\": ", c.error_p99, "}, \"windows\": ", c.windows,
                    ", \"stable\": ", c.stable ? "true" : "false",
                    ", \"interrupted\": ", c.interrupted ? "true" : "false",
                    ", \"streams_reopened\": ", c.streams_reopened, ", \"errors\": {",
                    absl::StrJoin(errors, ", "), "}");
    if (const auto& server = run.steps[i].server) {
      absl::StrAppend(&out, ", \"server\": {\"requests\": ", server->requests,
                      ", \"mean_queue_ms\": ", server->mean_queue_ms,
                      ", \"mean_compute_ms\": ", server->mean_compute_ms,
                      ", \"mean_batch_size\": ", server->mean_batch_size,
                      ", \"completed_during_scrapes\": ", c.completed_during_hooks, "}");
    }
    out += "}";
  }
  return out + "]}\n";
}

std::string FormatCsv(const BenchRun& run) {
  std::string out =
      "mode,level,seconds,requests,tokens,requests_per_second,tokens_per_second,p50_ms,"
      "p90_ms,p95_ms,p99_ms,p999_ms,max_ms,stable,errors,server_mean_queue_ms,"
      "server_mean_compute_ms,server_mean_batch_size\n";
  for (const BenchStep& step : run.steps) {
    const StepResult& c = step.client;
    absl::StrAppend(&out, c.mode, ",", c.level, ",", c.seconds, ",", c.requests, ",",
                    c.tokens, ",", c.requests_per_second(), ",", c.tokens_per_second(),
                    ",", c.p50, ",", c.p90, ",", c.p95, ",", c.p99, ",", c.p999, ",",
                    c.max, ",", c.stable ? 1 : 0, ",", Errors(c) == "-" ? "" : Errors(c));
    if (step.server) {
      absl::StrAppend(&out, ",", step.server->mean_queue_ms, ",",
                      step.server->mean_compute_ms, ",", step.server->mean_batch_size);
    } else {
      out += ",,,";
    }
    out += "\n";
  }
  return out;
}

std::string FormatSvg(const BenchRun& run) {
  constexpr double kWidth = 720, kHeight = 440, kLeft = 70, kRight = 150, kTop = 40,
                   kBottom = 60;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  double max_x = 1, max_y = 1;
  for (const BenchStep& step : run.steps) {
    max_x = std::max(max_x, step.client.requests_per_second());
    max_y = std::max(max_y, step.client.p99);
  }
  max_x *= 1.1;
  max_y *= 1.1;
  const auto x = [&](double v) { return kLeft + v / max_x * plot_w; };
  const auto y = [&](double v) { return kTop + plot_h - v / max_y * plot_h; };
  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"22\" font-size=\"15\">attnserve latency vs throughput "
      "(seq_len %s)</text>\n",
      kWidth, kHeight, kWidth, kHeight, kLeft, run.lengths);
  // Axes with five ticks each.
  absl::StrAppend(&svg,
                  absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                                  "stroke=\"black\"/>\n",
                                  kLeft, kTop + plot_h, kLeft + plot_w, kTop + plot_h));
  absl::StrAppend(&svg,
                  absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                                  "stroke=\"black\"/>\n",
                                  kLeft, kTop, kLeft, kTop + plot_h));
  for (int i = 0; i <= 5; ++i) {
    const double vx = max_x * i / 5, vy = max_y * i / 5;
    absl::StrAppend(
        &svg,
        absl::StrFormat(
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", x(vx),
            kTop + plot_h + 18, vx),
        absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.1f</text>\n",
                        kLeft - 6, y(vy) + 4, vy),
        absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                        "stroke=\"#ddd\"/>\n",
                        kLeft, y(vy), kLeft + plot_w, y(vy)));
  }
  absl::StrAppend(
      &svg,
      absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">"
                      "throughput (requests/s)</text>\n",
                      kLeft + plot_w / 2, kHeight - 18),
      absl::StrFormat("<text x=\"16\" y=\"%.1f\" transform=\"rotate(-90 16 %.1f)\" "
                      "text-anchor=\"middle\">latency (ms)</text>\n",
                      kTop + plot_h / 2, kTop + plot_h / 2));
  struct Series {
    const char* name;
    const char* color;
    double StepResult::*field;
  };
  const Series series[] = {{"p50", "#1f77b4", &StepResult::p50},
                           {"p90", "#ff7f0e", &StepResult::p90},
                           {"p99", "#d62728", &StepResult::p99}};
  int legend = 0;
  for (const Series& s : series) {
    std::vector<std::string> points;
    for (const BenchStep& step : run.steps) {
      points.push_back(absl::StrFormat("%.1f,%.1f", x(step.client.requests_per_second()),
                                       y(step.client.*(s.field))));
    }
    absl::StrAppend(
        &svg, absl::StrFormat("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
                              "points=\"%s\"/>\n",
                              s.color, absl::StrJoin(points, " ")));
    for (const std::string& point : points) {
      const std::vector<std::string> xy = absl::StrSplit(point, ',');
      absl::StrAppend(
          &svg, absl::StrFormat("<circle cx=\"%s\" cy=\"%s\" r=\"3\" fill=\"%s\"/>\n",
                                xy[0], xy[1], s.color));
    }
    absl::StrAppend(
        &svg, absl::StrFormat("<text x=\"%.1f\" y=\"%d\" fill=\"%s\">%s</text>\n",
                              kLeft + plot_w + 16, 60 + 18 * legend++, s.color, s.name));
  }
  // Label each step by its level.
  for (const BenchStep& step : run.steps) {
    absl::StrAppend(
        &svg,
        absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" "
                        "fill=\"#555\">%s%g</text>\n",
                        x(step.client.requests_per_second()) + 4, y(step.client.p99) - 6,
                        step.client.mode == "rate" ? "r=" : "c=", step.client.level));
  }
  return svg + "</svg>\n";
}

absl::StatusOr<std::string> HttpGet(const std::string& url) {
  absl::string_view rest = url;
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics URL must start with http://: ", url));
  }
  const size_t slash = rest.find('/');
  const std::string host_port(rest.substr(0, slash));
  const std::string path =
      slash == absl::string_view::npos ? "/" : std::string(rest.substr(slash));
  const size_t colon = host_port.rfind(':');
  const std::string host = host_port.substr(0, colon);
  const std::string port =
      colon == std::string::npos ? "80" : host_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &addresses) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host_port));
  }
  int fd = -1;
  for (addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    if (fd >= 0) close(fd);
    fd = -1;
  }
  freeaddrinfo(addresses);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("cannot connect to ", host_port));
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("write to the metrics server failed");
  }
  std::string response;
  char buffer[65536];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || body == std::string::npos ||
      response.find(" 200 ") > response.find("\r\n")) {
    return absl::UnavailableError(absl::StrCat("bad HTTP response from ", url));
  }
  return response.substr(body + 4);
}

double SumSamples(const std::string& text, const std::string& name) {
  double total = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t end = line.find_first_of("{ ");
    if (end == absl::string_view::npos || line.substr(0, end) != name) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) total += value;
  }
  return total;
}

ServerSide ServerDelta(const std::string& before, const std::string& after) {
  const auto delta = [&](const std::string& name) {
    return SumSamples(after, name) - SumSamples(before, name);
  };
  ServerSide server;
  server.requests = delta("attnserve_request_duration_seconds_count");
  const double queued = delta("attnserve_queue_duration_seconds_count");
  const double batches = delta("attnserve_compute_duration_seconds_count");
  if (queued > 0)
    server.mean_queue_ms = delta("attnserve_queue_duration_seconds_sum") / queued * 1e3;
  if (batches > 0) {
    server.mean_compute_ms =
        delta("attnserve_compute_duration_seconds_sum") / batches * 1e3;
  }
  // Sum and count of one histogram: the server observes each batch's size and compute
  // time in two histograms, one after the other, so a scrape between the two would skew a
  // ratio taken across them (seen as a mean batch size of 0.9985 with batches of 1).
  const double sized_batches = delta("attnserve_batch_size_count");
  if (sized_batches > 0) {
    server.mean_batch_size = delta("attnserve_batch_size_sum") / sized_batches;
  }
  return server;
}

}  // namespace attnserve::client
