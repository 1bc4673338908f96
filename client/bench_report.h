// attnbench's outputs: a human table, JSON, CSV, an SVG plot of latency percentiles
// against throughput, and server-side figures from /metrics deltas.
#ifndef ATTNSERVE_CLIENT_BENCH_REPORT_H_
#define ATTNSERVE_CLIENT_BENCH_REPORT_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/load_generator.h"

namespace attnserve::client {

// What the server's /metrics said about one step (deltas between two scrapes).
struct ServerSide {
  double requests = 0;
  double mean_queue_ms = 0;
  double mean_compute_ms = 0;  // per batch
  double mean_batch_size = 0;
};

struct BenchStep {
  StepResult client;
  std::optional<ServerSide> server;
};

struct BenchRun {
  std::string target;
  std::string model;
  std::string lengths;
  bool stream = false;
  std::vector<BenchStep> steps;
};

std::string FormatTable(const BenchRun& run);
std::string FormatJson(const BenchRun& run);
std::string FormatCsv(const BenchRun& run);
// Latency p50/p90/p99 (ms) against throughput (req/s), one point per step.
std::string FormatSvg(const BenchRun& run);

// GET http://HOST:PORT/PATH over plain HTTP/1.0. Unavailable when the connection
// fails; InvalidArgument for another URL form.
absl::StatusOr<std::string> HttpGet(const std::string& url);

// Sums of the samples named `name` in Prometheus text `text` (all label sets).
double SumSamples(const std::string& text, const std::string& name);

// The step's server-side figures from two /metrics texts.
ServerSide ServerDelta(const std::string& before, const std::string& after);

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_BENCH_REPORT_H_
