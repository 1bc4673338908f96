// attnbench: load generator for attnserve (closed-loop concurrency sweep or open-loop
// Poisson rates), reporting throughput, latency percentiles, errors by code and, with
// --metrics_url, the server's own queue/compute time and batch size.
//
//   attnbench --target=127.0.0.1:50051 --concurrency=1,4,16,64 --seq_len=128
//   attnbench --rate=100,200,400 --seq_len=16:512 --json=out.json --plot=out.svg
//
// Every step stops by itself: when three consecutive windows agree within 10%, or after
// --max_duration, or after --max_requests.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/help.h"
#include "client/attention_client.h"
#include "client/bench_report.h"
#include "client/load_generator.h"
#include "client/security_flags.h"
#include "transport/transport.h"

ABSL_FLAG(std::string, target, "localhost:50051", "gRPC target of the server.");
ABSL_FLAG(std::string, lb, "pick_first", "pick_first or round_robin.");
ABSL_FLAG(std::string, model, "", "Model name; empty = the server's default.");
ABSL_FLAG(std::string, concurrency, "",
          "Closed loop: comma-separated numbers of calls in flight, e.g. 1,4,16,64.");
ABSL_FLAG(std::string, rate, "",
          "Open loop: comma-separated request rates (requests/s), Poisson arrivals.");
ABSL_FLAG(std::string, seq_len, "128",
          "Sequence lengths: 128, 16:512 (uniform) or 64*3,512*1 (weighted list).");
ABSL_FLAG(std::string, dtype, "fp32", "Query dtype: fp32 or bf16.");
ABSL_FLAG(bool, stream, false, "Use AttendStream (closed loop only).");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1), "Warm-up before each step.");
ABSL_FLAG(absl::Duration, window, absl::Seconds(2), "Measurement window.");
ABSL_FLAG(
    absl::Duration, max_duration, absl::Seconds(20),
    "Longest measurement per step (also the fixed duration when windows disagree).");
ABSL_FLAG(int64_t, max_requests, 1000000, "Most measured requests per step.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30), "Deadline of each call.");
ABSL_FLAG(
    std::string, metrics_url, "",
    "The server's /metrics URL (http://host:port/metrics) for server-side figures.");
ABSL_FLAG(
    std::string, grpc_args, "",
    "Extra integer gRPC channel arguments, name=value,... (e.g. flow-control tuning).");
ABSL_FLAG(int, max_attempts, 1,
          "Attempts per call on UNAVAILABLE (retry policy in the service config), 1-5; "
          "with --stream, attempts per message: a stream that ends UNAVAILABLE (a "
          "draining server) is reopened and its unanswered message sent again.");
ABSL_FLAG(std::string, json, "", "Write results as JSON here.");
ABSL_FLAG(std::string, csv, "", "Write results as CSV here.");
ABSL_FLAG(std::string, plot, "",
          "Write an SVG of latency percentiles vs throughput here.");

namespace {

// Set by SIGINT/SIGTERM (lock-free, so safe to store from a signal handler).
std::atomic<bool> interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

using namespace attnserve::client;  // NOLINT: a main over the client library

bool ParseList(const std::string& text, std::vector<double>& values) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    double value = 0;
    if (!absl::SimpleAtod(part, &value) || !(value > 0)) return false;
    values.push_back(value);
  }
  return !values.empty();
}

// "name=value,name=value" -> integer gRPC channel arguments.
bool ParseGrpcArguments(const std::string& text,
                        std::vector<std::pair<std::string, int>>& arguments) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::vector<std::string> parts = absl::StrSplit(item, '=');
    int value = 0;
    if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &value)) {
      return false;
    }
    arguments.emplace_back(parts[0], value);
  }
  return true;
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

int Run() {
  std::vector<double> levels;
  const std::string concurrency = absl::GetFlag(FLAGS_concurrency);
  const std::string rate = absl::GetFlag(FLAGS_rate);
  if (concurrency.empty() == rate.empty()) {
    std::fprintf(stderr, "attnbench: give exactly one of --concurrency and --rate\n");
    return 2;
  }
  const bool open_loop = !rate.empty();
  if (!ParseList(open_loop ? rate : concurrency, levels)) {
    std::fprintf(stderr,
                 "attnbench: --%s must be a comma-separated list of numbers > 0\n",
                 open_loop ? "rate" : "concurrency");
    return 2;
  }
  absl::StatusOr<LengthMix> lengths = LengthMix::Parse(absl::GetFlag(FLAGS_seq_len));
  if (!lengths.ok()) {
    std::fprintf(stderr, "attnbench: %s\n",
                 std::string(lengths.status().message()).c_str());
    return 2;
  }
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype != "fp32" && dtype != "bf16") {
    std::fprintf(stderr, "attnbench: --dtype must be fp32 or bf16\n");
    return 2;
  }

  AttentionClient::Options client_options;
  client_options.target = absl::GetFlag(FLAGS_target);
  client_options.load_balancing = absl::GetFlag(FLAGS_lb);
  client_options.timeout = absl::GetFlag(FLAGS_timeout);
  client_options.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  if (absl::Status status = attnserve::client::ApplySecurityFlags(client_options);
      !status.ok()) {
    std::fprintf(stderr, "attnbench: %s\n", std::string(status.message()).c_str());
    return 2;
  }
  if (!ParseGrpcArguments(absl::GetFlag(FLAGS_grpc_args),
                          client_options.grpc_arguments)) {
    std::fprintf(stderr, "attnbench: --grpc_args must be name=integer,...\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<AttentionClient>> client =
      AttentionClient::Create(client_options);
  if (!client.ok()) {
    std::fprintf(stderr, "attnbench: %s\n",
                 std::string(client.status().message()).c_str());
    return 2;
  }
  const std::string model_name = absl::GetFlag(FLAGS_model);
  absl::StatusOr<attnserve::v1::ModelInfo> model =
      (*client)->GetModel(model_name.empty() ? "mha-base" : model_name);
  if (!model.ok()) {
    std::fprintf(stderr, "attnbench: cannot describe the model: %s\n",
                 model.status().ToString().c_str());
    return 1;
  }

  LoadGenerator::Options options;
  options.model = model_name;
  options.d_model = model->d_model();
  options.lengths = *lengths;
  options.bf16 = dtype == "bf16";
  options.stream = absl::GetFlag(FLAGS_stream);
  options.warmup = absl::GetFlag(FLAGS_warmup);
  options.window = absl::GetFlag(FLAGS_window);
  options.max_duration = absl::GetFlag(FLAGS_max_duration);
  options.max_requests = absl::GetFlag(FLAGS_max_requests);
  options.timeout = absl::GetFlag(FLAGS_timeout);
  options.stream_attempts = client_options.max_attempts;
  // SIGINT/SIGTERM end the step being measured at once; its figures are reported and
  // no further step runs.
  std::signal(SIGINT, [](int) { interrupted.store(true); });
  std::signal(SIGTERM, [](int) { interrupted.store(true); });
  options.stop = &interrupted;
  const std::string metrics_url = absl::GetFlag(FLAGS_metrics_url);
  std::string before, after;
  bool scraped = false;
  if (!metrics_url.empty()) {
    options.on_measure_start = [&] {
      absl::StatusOr<std::string> text = HttpGet(metrics_url);
      scraped = text.ok();
      if (scraped) before = *text;
    };
    options.on_measure_end = [&] {
      absl::StatusOr<std::string> text = HttpGet(metrics_url);
      scraped = scraped && text.ok();
      if (scraped) after = *text;
    };
  }
  LoadGenerator generator(client->get(), options);

  BenchRun run;
  run.target = client_options.target;
  run.model = model->name();
  run.lengths = absl::GetFlag(FLAGS_seq_len);
  run.stream = options.stream;
  for (double level : levels) {
    absl::StatusOr<StepResult> step =
        open_loop ? generator.RunOpenLoop(level)
                  : generator.RunClosedLoop(static_cast<int>(level));
    if (!step.ok()) {
      std::fprintf(stderr, "attnbench: %s\n",
                   std::string(step.status().message()).c_str());
      return 2;
    }
    BenchStep bench_step{*step, std::nullopt};
    if (scraped) bench_step.server = ServerDelta(before, after);
    run.steps.push_back(bench_step);
    std::fprintf(stderr, "attnbench: %s=%g done: %.1f req/s%s\n", step->mode.c_str(),
                 level, step->requests_per_second(),
                 step->interrupted ? " (interrupted)" : "");
    if (step->interrupted) break;
  }
  std::printf("%s", FormatTable(run).c_str());
  bool written = true;
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    written &= WriteFile(path, FormatJson(run));
  }
  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    written &= WriteFile(path, FormatCsv(run));
  }
  if (const std::string path = absl::GetFlag(FLAGS_plot); !path.empty()) {
    written &= WriteFile(path, FormatSvg(run));
  }
  if (!written) {
    std::fprintf(stderr, "attnbench: could not write an output file\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "client/attnbench_main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "load generator for attnserve.\n"
      "  attnbench --concurrency=1,4,16,64 [--seq_len=128] [--metrics_url=URL]\n"
      "  attnbench --rate=100,200,400 [--seq_len=16:512] [--json=F] [--csv=F] "
      "[--plot=F.svg]");
  if (attnserve::cli::PrintHelpIfAsked(
          argc, argv,
          {"client/attnbench_main.cc", attnserve::client::kSecurityFlagsFile}))
    return 0;
  absl::ParseCommandLine(argc, argv);
  attnserve::transport::KeepAllocatorMemory();
  return Run();
}
