// attnserve: the multi-head attention gRPC server.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "cli/help.h"
#include "core/base/device.h"
#include "server/attention_server.h"
#include "server/batching/thread_scheduling.h"
#include "server/models/host_resources.h"
#include "server/observability/event_log.h"
#include "transport/transport.h"

ABSL_FLAG(
    std::string, host, "0.0.0.0",
    "Address to listen on for gRPC: 0.0.0.0 (all IPv4), [::] (all IPv6), 127.0.0.1.");
ABSL_FLAG(int, port, 50051, "gRPC port; 0 picks a free port (printed at start-up).");
ABSL_FLAG(std::string, model_repository, "",
          "Folder with <name>/config.pbtxt + <name>/weights.safetensors per model. The "
          "built-in model mha-base (d_model=512, 8 heads, fp32, seed 0) is always served "
          "unless the repository has its own mha-base.");
ABSL_FLAG(
    std::string, model_control_mode, "none",
    "none: the models loaded at start are served until exit; explicit: the "
    "repository API (KServe gRPC and HTTP, attnctl load/unload) loads, replaces and "
    "unloads them; poll: the server follows --model_repository's folders.");
ABSL_FLAG(absl::Duration, repository_poll_interval, absl::Seconds(15),
          "--model_control_mode=poll: how often the repository is rescanned; a folder "
          "loads once its files were unchanged for one whole interval.");
ABSL_FLAG(int, max_batch_size, 32, "Most requests per batch (models may override).");
ABSL_FLAG(int64_t, max_batch_tokens, 8192,
          "Most query tokens per batch; a longer single request runs alone.");
ABSL_FLAG(
    absl::Duration, max_queue_delay, absl::Milliseconds(2),
    "How long the oldest queued request waits for company before its batch runs, and "
    "only while its batch is smaller than the last one (a lone caller's requests run at "
    "once); a request that came while the worker computed waits from the end of that "
    "batch. 0 runs at once with whatever is queued.");
ABSL_FLAG(int, max_queue_size, 1024,
          "Queued requests per model beyond which new ones get RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_queue_bytes, 0,
          "Bytes that queued and computing requests of one model may hold (inputs and "
          "results); beyond it new ones get RESOURCE_EXHAUSTED, and one that needs more "
          "alone gets INVALID_ARGUMENT. 0 = a quarter of physical memory.");
ABSL_FLAG(int64_t, grpc_memory_bytes, 0,
          "Memory gRPC may use for connections and messages in flight (ResourceQuota); "
          "beyond it, reading from clients pauses. 0 = a quarter of physical memory.");
ABSL_FLAG(int, max_concurrent_streams, 256,
          "Concurrent calls (HTTP/2 streams) per client connection.");
ABSL_FLAG(int, instances, 2,
          "Parallel compute workers per model, each with its own copy of the weights.");
ABSL_FLAG(int, answer_threads, 0,
          "Threads per model that build, serialize and send responses, so that a "
          "compute worker starts its next batch at once; 0 = the worker answers its own "
          "batch first.");
ABSL_FLAG(bool, compute_first, false,
          "Run the I/O threads (gRPC, HTTP, metrics) under Linux's SCHED_BATCH and the "
          "compute workers under SCHED_OTHER, so that a packet or timer waking an I/O "
          "thread does not preempt a batch computing on the same core (lower p99 under "
          "load where they share cores; but the I/O threads no longer preempt other "
          "processes either); false: every thread SCHED_OTHER.");
ABSL_FLAG(int, intra_op_threads, 0,
          "OpenMP threads per worker; 0 = the cores divided by the instances.");
ABSL_FLAG(int64_t, max_sequence_length, 8192,
          "Longest query or memory sequence accepted (models may override); at most "
          "1048576.");
ABSL_FLAG(bool, auto_truncate, false,
          "Encoders: cut every text over the model's max_text_tokens (as a request's "
          "truncate does; OpenAI's body cannot ask) instead of refusing it; a model's "
          "encoder.auto_truncate overrides it.");
ABSL_FLAG(int, max_message_bytes, 64 << 20,
          "Largest gRPC message, both directions, in bytes.");
ABSL_FLAG(
    int64_t, max_concurrent_requests, 0,
    "Calls in flight (every door; stream messages aside) beyond which a new one is "
    "refused at once: HTTP 429 with Retry-After: 1, gRPC RESOURCE_EXHAUSTED, counted "
    "in attnserve_requests_overloaded_total; 0: no limit (the queues' byte budgets "
    "still hold).");
ABSL_FLAG(bool, reject_non_finite, false,
          "Refuse float inputs holding NaN or an infinity (INVALID_ARGUMENT naming the "
          "element); false computes them through, as PyTorch, ONNX Runtime and Triton do "
          "(NaN in, NaN out).");
ABSL_FLAG(absl::Duration, grace_period, absl::Seconds(30),
          "On SIGTERM/SIGINT, how long queued and running calls may take to finish.");
ABSL_FLAG(absl::Duration, max_connection_age, absl::ZeroDuration(),
          "Close client connections after this age (GOAWAY) so clients re-resolve DNS "
          "and spread onto new replicas; 0 = never. 5m suits Kubernetes.");
ABSL_FLAG(
    int, metrics_port, 8080,
    "HTTP port serving /metrics (Prometheus text format) and the status page (/); 0 "
    "picks a free port "
    "(printed at start-up); -1 turns it off.");
ABSL_FLAG(absl::Duration, status_interval, absl::Seconds(10),
          "How often the status page (GET / on the metrics port) samples the latency and "
          "batch-size histograms; its charts show the last 30 intervals.");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0",
          "Address the /metrics server listens on.");
ABSL_FLAG(std::string, grpc_args, "",
          "Extra integer gRPC server channel arguments, name=value,..., e.g. "
          "grpc.http2.max_frame_size=16777215.");
ABSL_FLAG(
    std::string, device, "cpu",
    "Compute device: cpu, or cuda:N for the N-th NVIDIA GPU (builds made with nvcc).");
ABSL_FLAG(bool, cuda_tf32, false,
          "With --device=cuda:N, let fp32 models' products run on TF32 tensor cores "
          "(faster, about 1e-3 relative error instead of 1e-6).");
ABSL_FLAG(
    bool, reflection, true,
    "Serve gRPC server reflection (grpcurl, buf curl); turn off where the API should "
    "not be discoverable.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain for TLS on the gRPC port (with --tls_key); re-read when "
          "the file changes.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed (mTLS).");
ABSL_FLAG(std::string, auth_token_file, "",
          "Bearer tokens, one per line: every call but health checks needs "
          "\"authorization: Bearer <token>\"; re-read when the file changes.");
ABSL_FLAG(
    int, http_port, 8000,
    "KServe v2 HTTP/REST port (/v2/...); 0 picks a free port (printed at start-up), "
    "-1 serves none.");
ABSL_FLAG(absl::Duration, http_timeout, absl::Seconds(60),
          "How long a KServe HTTP infer request may take when it sets no \"timeout\" "
          "parameter (microseconds, as Triton defines it); then 504.");
ABSL_FLAG(absl::Duration, http_keep_alive_timeout, absl::Seconds(75),
          "How long an idle kept-alive HTTP connection stays open (said in each "
          "answer's Keep-Alive header); each open connection holds an HTTP thread. "
          "Range [1s, 1h].");
ABSL_FLAG(
    std::string, otlp_endpoint, "",
    "OpenTelemetry collector (host:port) to send each request's trace spans to over "
    "OTLP/gRPC (plaintext); empty: no tracing. Callers' W3C traceparent headers "
    "and metadata are followed.");
ABSL_FLAG(double, otlp_sample_ratio, 1.0,
          "Share of new traces sampled, in [0, 1]; a caller's traceparent decides for "
          "its own trace (parent-based).");
ABSL_FLAG(std::string, otlp_service_name, "attnserve",
          "The service.name resource attribute of the exported spans.");
ABSL_FLAG(bool, reuse_grpc_port, false,
          "Let other processes bind the same gRPC port (SO_REUSEPORT) and share its "
          "connections; off, a second server on a taken port fails at start.");
ABSL_FLAG(
    std::string, port_file, "",
    "After binding, write the gRPC port to this file (for health checks and scripts, "
    "e.g. with --port=0).");
ABSL_FLAG(
    bool, builtin_model, true,
    "Serve the built-in model mha-base (seeded random weights, for trying the server "
    "and benchmarks); false serves only --model_repository.");
ABSL_FLAG(std::string, default_model, "",
          "Model for requests that name none; empty: the repository's model when it "
          "holds exactly one, else mha-base when served, else none (such requests get "
          "NOT_FOUND).");
ABSL_FLAG(bool, warm_up, true,
          "Run each model instance's first forward passes before the port opens, so "
          "readiness waits for them and no client pays the one-time set-up.");
ABSL_FLAG(std::string, precision, "fp32",
          "Precision of the built-in model: fp32; bf16 (native where the CPU has "
          "AVX512_BF16 or AMX, else bf16 weights computed in f32); or int8 (dynamic "
          "quantization of the projections, CPU only). Repository models set theirs in "
          "config.pbtxt.");

namespace {

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

// The server's options from the flags; InvalidArgument naming the flag for a value that
// does not parse (the process then exits 2).
absl::StatusOr<attnserve::server::AttentionServer::Options> OptionsFromFlags() {
  namespace server = attnserve::server;
  const absl::StatusOr<attnserve::core::Device> device =
      attnserve::core::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return device.status();
  const std::string precision = absl::GetFlag(FLAGS_precision);
  if (precision != "fp32" && precision != "bf16" && precision != "int8") {
    return absl::InvalidArgumentError(
        absl::StrCat("--precision must be fp32, bf16 or int8, got \"", precision, "\""));
  }
  server::AttentionServer::Options options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.reject_non_finite = absl::GetFlag(FLAGS_reject_non_finite);
  options.max_concurrent_requests = absl::GetFlag(FLAGS_max_concurrent_requests);
  options.grace_period = absl::GetFlag(FLAGS_grace_period);
  options.max_connection_age = absl::GetFlag(FLAGS_max_connection_age);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.http_port = absl::GetFlag(FLAGS_http_port);
  options.http_timeout = absl::GetFlag(FLAGS_http_timeout);
  options.http_keep_alive_timeout = absl::GetFlag(FLAGS_http_keep_alive_timeout);
  options.tracing.otlp_endpoint = absl::GetFlag(FLAGS_otlp_endpoint);
  options.tracing.sampler_ratio = absl::GetFlag(FLAGS_otlp_sample_ratio);
  options.tracing.service_name = absl::GetFlag(FLAGS_otlp_service_name);
  options.reuse_grpc_port = absl::GetFlag(FLAGS_reuse_grpc_port);
  options.reflection = absl::GetFlag(FLAGS_reflection);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  if (!ParseGrpcArguments(absl::GetFlag(FLAGS_grpc_args), options.grpc_arguments)) {
    return absl::InvalidArgumentError(
        "--grpc_args must be name=integer,name=integer,...");
  }
  options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  options.status_interval = absl::GetFlag(FLAGS_status_interval);
  // The status page lists this binary's flags as they are set now.
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), "server/main.cc")) {
      options.status_flags.emplace_back(std::string(name), flag->CurrentValue());
    }
  }
  std::sort(options.status_flags.begin(), options.status_flags.end());
  options.models.model_repository = absl::GetFlag(FLAGS_model_repository);
  const absl::StatusOr<server::ModelControlMode> control_mode =
      server::ParseModelControlMode(absl::GetFlag(FLAGS_model_control_mode));
  if (!control_mode.ok()) return control_mode.status();
  options.models.control_mode = *control_mode;
  options.models.poll_interval = absl::GetFlag(FLAGS_repository_poll_interval);
  options.models.max_sequence_length = absl::GetFlag(FLAGS_max_sequence_length);
  options.models.auto_truncate = absl::GetFlag(FLAGS_auto_truncate);
  options.models.intra_op_threads = absl::GetFlag(FLAGS_intra_op_threads);
  options.models.device = *device;
  options.models.allow_tf32 = absl::GetFlag(FLAGS_cuda_tf32);
  options.models.builtin_model = absl::GetFlag(FLAGS_builtin_model);
  options.models.default_model = absl::GetFlag(FLAGS_default_model);
  options.models.warm_up = absl::GetFlag(FLAGS_warm_up);
  options.models.builtin_precision =
      precision == "bf16"   ? attnserve::core::Precision::kBf16
      : precision == "int8" ? attnserve::core::Precision::kInt8
                            : attnserve::core::Precision::kFp32;
  options.models.batching.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  options.models.batching.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.models.batching.max_queue_delay = absl::GetFlag(FLAGS_max_queue_delay);
  options.models.batching.max_queue_size = absl::GetFlag(FLAGS_max_queue_size);
  options.models.batching.instances = absl::GetFlag(FLAGS_instances);
  options.models.batching.answer_threads = absl::GetFlag(FLAGS_answer_threads);
  // A container's limit, where one is set (on Kubernetes: the pod's memory limit).
  const int64_t quarter_of_memory =
      attnserve::server::DetectHostResources().memory_bytes / 4;
  options.models.batching.max_queue_bytes = absl::GetFlag(FLAGS_max_queue_bytes) != 0
                                                ? absl::GetFlag(FLAGS_max_queue_bytes)
                                                : quarter_of_memory;
  options.grpc_memory_bytes = absl::GetFlag(FLAGS_grpc_memory_bytes) != 0
                                  ? absl::GetFlag(FLAGS_grpc_memory_bytes)
                                  : quarter_of_memory;
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  return options;
}

// With --compute_first: SCHED_BATCH for this thread, and so for every thread started
// after it, but the batch workers, which the batchers set back to SCHED_OTHER.
void ApplyComputeFirst(attnserve::server::AttentionServer::Options& options) {
  namespace server = attnserve::server;
  if (absl::GetFlag(FLAGS_compute_first)) {
    const absl::Status status =
        server::SetSchedulingPolicy(pthread_self(), server::SchedulingPolicy::kBatch);
    options.models.batching.compute_first = status.ok();
    if (!status.ok()) {
      server::LogEvent("compute_first_off", {{"error", status.ToString()}});
    }
  }
}

// Where the server listens, for whoever started it: --port_file (written whole, then
// renamed, so a reader never sees a partial number) and the lines on stdout that tests
// and scripts read. False when the port file cannot be written.
bool Announce(const attnserve::server::AttentionServer& server,
              const attnserve::server::AttentionServer::Options& options) {
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    const std::string partial = path + ".partial";
    std::FILE* file = std::fopen(partial.c_str(), "w");
    const bool written =
        file != nullptr && std::fprintf(file, "%d\n", server.port()) > 0 &&
        std::fclose(file) == 0 && std::rename(partial.c_str(), path.c_str()) == 0;
    if (!written) {
      attnserve::server::LogEvent(
          "startup_failed", {{"error", absl::StrCat("cannot write --port_file=", path)}});
      return false;
    }
  }
  std::printf("attnserve listening on %s:%d\n", options.host.c_str(), server.port());
  if (server.metrics_port() >= 0) {
    std::printf("attnserve metrics on %s:%d\n", options.metrics_host.c_str(),
                server.metrics_port());
  }
  if (server.http_port() >= 0) {
    std::printf("attnserve http on %s:%d\n", options.host.c_str(), server.http_port());
  }
  std::fflush(stdout);
  return true;
}

// Serves until SIGTERM or SIGINT (then drains); SIGHUP re-reads the token file now (it
// is also re-read when it changes; the TLS files are watched by gRPC every 5 s).
void ServeUntilSignalled(attnserve::server::AttentionServer& attention_server,
                         const sigset_t& signals) {
  namespace server = attnserve::server;
  int signal_number = 0;
  while (sigwait(&signals, &signal_number) == 0 && signal_number == SIGHUP) {
    const absl::Status reloaded = attention_server.ReloadCredentials();
    server::LogEvent(
        "signal",
        {{"signal", "SIGHUP"},
         {"tokens", reloaded.ok() ? "reloaded" : std::string(reloaded.message())}});
  }
  server::LogEvent("signal",
                   {{"signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT"}});
  attention_server.Shutdown();
}

int Run() {
  namespace server = attnserve::server;
  absl::StatusOr<server::AttentionServer::Options> options = OptionsFromFlags();
  if (!options.ok()) {
    server::LogEvent("startup_failed", {{"error", options.status().ToString()}});
    return 2;
  }
  // Signals are taken synchronously by this thread; every thread started below
  // inherits the blocked mask, so none of them is interrupted.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ApplyComputeFirst(*options);
  absl::StatusOr<std::unique_ptr<server::AttentionServer>> attention_server =
      server::AttentionServer::Create(*options);
  if (!attention_server.ok()) {
    server::LogEvent("startup_failed", {{"error", attention_server.status().ToString()}});
    return 1;
  }
  attnserve::transport::ReturnFreedMemory();
  server::LogEvent("serving", {{"host", options->host},
                               {"port", absl::StrCat((*attention_server)->port())},
                               {"device", absl::GetFlag(FLAGS_device)}});
  if (!Announce(**attention_server, *options)) return 1;
  ServeUntilSignalled(**attention_server, signals);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  // --help lists this binary's own flags (defined in this file).
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "multi-head attention inference over gRPC.\n"
      "Usage: attnserve [--port=50051] [--model_repository=DIR] [batcher flags]");
  if (attnserve::cli::PrintHelpIfAsked(argc, argv, {"server/main.cc"})) return 0;
  absl::ParseCommandLine(argc, argv);
  attnserve::transport::KeepAllocatorMemory();
  return Run();
}
