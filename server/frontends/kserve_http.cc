#include "server/frontends/kserve_http.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "nlohmann/json.hpp"
#include "server/frontends/kserve_convert.h"
#include "server/frontends/kserve_http_request.h"
#include "server/frontends/tokenize_api.h"
#include "server/observability/event_log.h"
#include "transport/listen_error.h"

namespace attnserve::server {

namespace {

using Json = nlohmann::json;

// How often a request waiting for its answer checks whether its client hung up.
constexpr absl::Duration kHangUpCheckInterval = absl::Milliseconds(50);

void Send(mg_connection* connection, int status, const std::string& body,
          const std::string& extra_headers = "",
          const char* content_type = "application/json") {
  const auto* http =
      static_cast<const KServeHttp*>(mg_get_user_data(mg_get_context(connection)));
  // A 429 (a full queue, or --max_concurrent_requests) says when to try again.
  std::string answer = absl::StrCat(
      "HTTP/1.1 ", status, " ", HttpReason(status), "\r\nContent-Type: ", content_type,
      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
      status == 429 ? "Retry-After: 1\r\n" : "", "Connection: keep-alive\r\n",
      http->keep_alive_header(), "\r\n");
  // Head and a small body leave in one write (one segment, one wake-up of the client);
  // a large body is written from where it is rather than copied.
  constexpr size_t kCopiedBodyBytes = 64 << 10;
  if (body.size() <= kCopiedBodyBytes) {
    answer += body;
    mg_write(connection, answer.data(), answer.size());
    return;
  }
  mg_write(connection, answer.data(), answer.size());
  mg_write(connection, body.data(), body.size());
}

void SendError(mg_connection* connection, int status, absl::string_view message) {
  Send(connection, status, ErrorBody(message));
}

void SendStatus(mg_connection* connection, const absl::Status& status) {
  SendError(connection, HttpStatusFor(status.code()), status.message());
}

// The connection's socket. civetweb 1.15 has no call that returns it, so it is the
// open socket whose peer is the request's remote address and port; -1 if none is.
int FindSocket(const mg_request_info* request) {
  int found = -1;
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return -1;
  while (dirent* entry = readdir(fds)) {
    int fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(fds)) continue;
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) continue;
    char address[INET6_ADDRSTRLEN] = {};
    int port = 0;
    if (peer.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&peer);
      inet_ntop(AF_INET, &in->sin_addr, address, sizeof(address));
      port = ntohs(in->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      const auto* in = reinterpret_cast<const sockaddr_in6*>(&peer);
      inet_ntop(AF_INET6, &in->sin6_addr, address, sizeof(address));
      port = ntohs(in->sin6_port);
    } else {
      continue;
    }
    if (port == request->remote_port && std::strcmp(address, request->remote_addr) == 0) {
      found = fd;
      break;
    }
  }
  closedir(fds);
  return found;
}

// True when the client closed its side or the connection broke.
bool HungUp(int socket) {
  pollfd watched{socket, POLLRDHUP, 0};
  return poll(&watched, 1, 0) == 1 &&
         (watched.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

// Triton's JSON for a ModelConfig (model configuration extension over HTTP): field
// names as in model_config.proto, enums by name, dims as numbers.
Json ModelConfigJson(const inference::ModelConfig& config) {
  Json inputs = Json::array();
  for (const inference::ModelInput& input : config.input()) {
    inputs.push_back(
        {{"name", input.name()},
         {"data_type", inference::DataType_Name(input.data_type())},
         {"dims", std::vector<int64_t>(input.dims().begin(), input.dims().end())},
         {"optional", input.optional()}});
  }
  Json outputs = Json::array();
  for (const inference::ModelOutput& output : config.output()) {
    outputs.push_back(
        {{"name", output.name()},
         {"data_type", inference::DataType_Name(output.data_type())},
         {"dims", std::vector<int64_t>(output.dims().begin(), output.dims().end())}});
  }
  return {{"name", config.name()},       {"platform", config.platform()},
          {"backend", config.backend()}, {"max_batch_size", config.max_batch_size()},
          {"input", std::move(inputs)},  {"output", std::move(outputs)}};
}

// Triton's JSON for ModelStatistics (statistics extension over HTTP).
Json StatisticsJson(const inference::ModelStatisticsResponse& response) {
  const auto duration = [](const inference::StatisticDuration& figure) {
    return Json{{"count", figure.count()}, {"ns", figure.ns()}};
  };
  Json models = Json::array();
  for (const inference::ModelStatistics& stats : response.model_stats()) {
    const inference::InferStatistics& infer = stats.inference_stats();
    models.push_back({{"name", stats.name()},
                      {"version", stats.version()},
                      {"last_inference", stats.last_inference()},
                      {"inference_count", stats.inference_count()},
                      {"execution_count", stats.execution_count()},
                      {"inference_stats",
                       {{"success", duration(infer.success())},
                        {"fail", duration(infer.fail())},
                        {"queue", duration(infer.queue())},
                        {"compute_input", duration(infer.compute_input())},
                        {"compute_infer", duration(infer.compute_infer())},
                        {"compute_output", duration(infer.compute_output())}}},
                      {"batch_stats", Json::array()}});
  }
  return {{"model_stats", std::move(models)}};
}

// A call counted as open from its construction until its answer is written, so that a
// drain waits for it.
class OpenCall {
 public:
  explicit OpenCall(RequestPipeline* pipeline) : pipeline_(pipeline) {
    pipeline_->CallOpened();
  }
  ~OpenCall() { pipeline_->CallClosed(); }
  OpenCall(const OpenCall&) = delete;
  OpenCall& operator=(const OpenCall&) = delete;

 private:
  RequestPipeline* const pipeline_;
};

int Dispatch(mg_connection* connection, void* self) {
  return static_cast<KServeHttp*>(self)->Handle(connection);
}

// The JSON APIs on the HTTP port: each path and the parser of the body it takes. TEI's
// /rerank takes "texts"; the Cohere and Jina shape ("documents") is served at their
// paths (/v2/rerank lies under KServe's /v2, and Route sends it here too).
struct ApiRoute {
  const char* path;
  EmbeddingsCall::Api api;
  absl::StatusOr<EmbeddingsCall> (*parse)(absl::string_view body);
};
constexpr ApiRoute kApiRoutes[] = {
    {"/v1/embeddings", EmbeddingsCall::Api::kOpenAi, ParseOpenAiEmbeddings},
    {"/embed", EmbeddingsCall::Api::kTei, ParseTeiEmbed},
    {"/embed_all", EmbeddingsCall::Api::kTeiEmbedAll, ParseTeiEmbedAll},
    {"/embed_sparse", EmbeddingsCall::Api::kTeiEmbedSparse, ParseTeiEmbedSparse},
    {"/rerank", EmbeddingsCall::Api::kTeiRerank, ParseTeiRerank},
    {"/predict", EmbeddingsCall::Api::kTeiPredict, ParseTeiPredict},
    {"/v1/rerank", EmbeddingsCall::Api::kRerank, ParseRerank},
    // Cohere's embed lies under /v2 (Route sends it here); the route names its parser.
    {"/v2/embed", EmbeddingsCall::Api::kCohereEmbed, ParseCohereEmbed},
};

// One handler for every path of kApiRoutes (civetweb matched the path exactly).
int DispatchApi(mg_connection* connection, void* self) {
  const absl::string_view uri = mg_get_request_info(connection)->local_uri;
  for (const ApiRoute& route : kApiRoutes) {
    if (uri == route.path) {
      return static_cast<KServeHttp*>(self)->Handle(connection, route.api);
    }
  }
  return 0;  // not ours: civetweb answers 404
}

// The parser of each API's body.
absl::StatusOr<EmbeddingsCall> ParseCall(EmbeddingsCall::Api api,
                                         absl::string_view body) {
  for (const ApiRoute& route : kApiRoutes) {
    if (route.api == api) return route.parse(body);
  }
  return absl::InternalError("no parser for this API");  // every Api has a route
}

// The `model` query parameter (empty when absent), or InvalidArgument when it is over
// 255 bytes.
absl::StatusOr<std::string> QueryModel(const mg_request_info* request) {
  if (request->query_string == nullptr) return std::string();
  char name[256] = {};
  const int found = mg_get_var(request->query_string, std::strlen(request->query_string),
                               "model", name, sizeof(name));
  if (found == -2) {
    return absl::InvalidArgumentError("the model query parameter is over 255 bytes");
  }
  return std::string(found > 0 ? name : "");
}

// The request's trace name ("POST /v1/embeddings") and the caller's trace context
// headers.
void SetTraceOf(mg_connection* connection, Request* request) {
  const mg_request_info* info = mg_get_request_info(connection);
  const char* traceparent = mg_get_header(connection, "traceparent");
  const char* tracestate = mg_get_header(connection, "tracestate");
  request->SetTrace(absl::StrCat(info->request_method, " ", info->local_uri),
                    traceparent != nullptr ? traceparent : "",
                    tracestate != nullptr ? tracestate : "");
}

// The parts of a /v2 URI: /v2/models/{model}[/versions/{version}][/{action}].
struct ModelRoute {
  std::string model;
  std::string version;
  std::string action;  // "", "ready", "config", "stats" or "infer"
};

bool ParseModelRoute(const std::vector<absl::string_view>& parts, ModelRoute* route) {
  if (parts.size() < 3 || parts[1] != "models") return false;
  route->model = std::string(parts[2]);
  size_t next = 3;
  if (parts.size() >= 5 && parts[3] == "versions") {
    route->version = std::string(parts[4]);
    next = 5;
  }
  if (next < parts.size()) route->action = std::string(parts[next++]);
  return next == parts.size() && (route->action.empty() || route->action == "ready" ||
                                  route->action == "config" || route->action == "stats" ||
                                  route->action == "infer");
}

}  // namespace

absl::StatusOr<std::unique_ptr<KServeHttp>> KServeHttp::Start(
    const Options& options, RequestPipeline* pipeline, const ServerMetrics* metrics) {
  if (!(options.default_timeout > absl::ZeroDuration())) {
    return absl::InvalidArgumentError("default_timeout must be > 0");
  }
  if (options.keep_alive_timeout < absl::Seconds(1) ||
      options.keep_alive_timeout > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("http_keep_alive_timeout must be in [1s, 1h], got ",
                     absl::FormatDuration(options.keep_alive_timeout)));
  }
  std::unique_ptr<KServeHttp> http(new KServeHttp(options, pipeline, metrics));
  const bool ipv6 = absl::StrContains(options.host, ':');
  const std::string address = ipv6 ? absl::StrCat("[", options.host, "]:", options.port)
                                   : absl::StrCat(options.host, ":", options.port);
  const std::string threads = absl::StrCat(options.threads);
  const std::string keep_alive_ms =
      absl::StrCat(absl::ToInt64Milliseconds(options.keep_alive_timeout));
  // A client that stops sending or reading mid-request gives its thread back after
  // request_timeout_ms (the wait for an answer is bounded by the request's deadline
  // instead). Keep-alive on: every answer says "Connection: keep-alive", and clients
  // that reuse connections (libcurl in perf_analyzer and tritonclient) fail their next
  // request when civetweb's default closes them after each answer. TCP_NODELAY: without
  // it a kept-alive connection lost about 40 ms per request, Nagle's algorithm holding
  // back the answer's last segment until the client's delayed ACK came.
  const char* civet_options[] = {"listening_ports",
                                 address.c_str(),
                                 "num_threads",
                                 threads.c_str(),
                                 "request_timeout_ms",
                                 "30000",
                                 "enable_keep_alive",
                                 "yes",
                                 "keep_alive_timeout_ms",
                                 keep_alive_ms.c_str(),
                                 "tcp_nodelay",
                                 "1",
                                 nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  http->context_ = mg_start(&callbacks, http.get(), civet_options);
  if (http->context_ == nullptr) {
    return transport::ListenError("HTTP", "--http_port", options.host, options.port);
  }
  mg_set_request_handler(http->context_, "/v2", Dispatch, http.get());
  // The GET routes beside the APIs (Route sends them on).
  mg_set_request_handler(http->context_, "/v1/models", Dispatch, http.get());
  mg_set_request_handler(http->context_, "/info$", Dispatch, http.get());
  mg_set_request_handler(http->context_, "/tokenize$", Dispatch, http.get());
  mg_set_request_handler(http->context_, "/decode$", Dispatch, http.get());
  for (const ApiRoute& route : kApiRoutes) {
    // "$": the path itself, nothing below it.
    mg_set_request_handler(http->context_, absl::StrCat(route.path, "$").c_str(),
                           DispatchApi, http.get());
  }
  mg_server_port ports[1];
  if (mg_get_server_ports(http->context_, 1, ports) < 1) {
    http->Stop();
    return absl::UnavailableError(absl::StrCat("no HTTP port bound on ", address));
  }
  http->port_ = ports[0].port;
  return http;
}

KServeHttp::~KServeHttp() { Stop(); }

void KServeHttp::Stop() {
  if (context_ != nullptr) {
    mg_stop(context_);
    context_ = nullptr;
  }
}

int KServeHttp::Handle(mg_connection* connection,
                       std::optional<EmbeddingsCall::Api> api) noexcept {
  // Nothing may unwind into civetweb's C code: that would end the process.
  const auto fail = [&](const char* what) {
    const mg_request_info* request = mg_get_request_info(connection);
    LogEvent(
        "internal_error",
        {{"door", "kserve_http"},
         {"uri",
          request != nullptr && request->local_uri != nullptr ? request->local_uri : ""},
         {"what", what}});
    if (pipeline_->observer().on_internal_error) {
      pipeline_->observer().on_internal_error("kserve_http");
    }
    SendError(connection, 500, absl::StrCat("internal error: ", what));
  };
  try {
    if (api.has_value()) {
      Embeddings(connection, *api);
    } else {
      Route(connection);
    }
  } catch (const std::exception& error) {
    fail(error.what());
  } catch (...) {
    fail("unknown exception");
  }
  return 1;
}

namespace {

const char* DtypeName(v1::Precision precision) {
  switch (precision) {
    case v1::PRECISION_BF16:
      return "bfloat16";
    case v1::PRECISION_INT8:
      return "int8";
    default:
      return "float32";
  }
}

// The most tokens one input may have: an encoder's per text, else per sequence.
int64_t MaxInputLength(const ServedModel& model) {
  return model.max_text_tokens > 0 ? model.max_text_tokens : model.max_sequence_length;
}

// What OpenAI's model object says of a served model.
Json OpenAiModel(const ServedModel& model) {
  return {{"id", model.name},
          {"object", "model"},
          {"created", absl::ToUnixSeconds(model.loaded_at)},
          {"owned_by", "attnserve"},
          {"max_model_len", MaxInputLength(model)}};
}

}  // namespace

void KServeHttp::Models(mg_connection* connection) {
  const mg_request_info* request = mg_get_request_info(connection);
  const std::string uri = request->local_uri;
  const auto fail = [&](const absl::Status& status, int http_status) {
    const auto [code, body] =
        EmbeddingsError(EmbeddingsCall::Api::kOpenAi, status, http_status);
    Send(connection, code, body);
  };
  if (std::string(request->request_method) != "GET") {
    return fail(absl::InvalidArgumentError(
                    absl::StrCat(request->request_method, " ", uri, ": use GET")),
                405);
  }
  const char* authorization = mg_get_header(connection, "Authorization");
  if (absl::Status allowed =
          pipeline_->Authorize(authorization != nullptr ? authorization : "");
      !allowed.ok()) {
    return fail(allowed, HttpStatusFor(allowed.code()));
  }
  if (uri == "/v1/models") {
    Json data = Json::array();
    for (const ModelRegistry::IndexEntry& entry : pipeline_->RepositoryIndex(true)) {
      absl::StatusOr<std::shared_ptr<ServedModel>> model =
          pipeline_->FindModel(entry.name, entry.version);
      if (model.ok()) data.push_back(OpenAiModel(**model));
    }
    return Send(connection, 200, JsonText({{"object", "list"}, {"data", data}}));
  }
  constexpr absl::string_view kPrefix = "/v1/models/";
  if (!absl::StartsWith(uri, kPrefix) || uri.size() == kPrefix.size()) {
    return fail(absl::NotFoundError(absl::StrCat("no such endpoint: ", uri)), 404);
  }
  absl::StatusOr<std::shared_ptr<ServedModel>> model =
      pipeline_->FindModel(uri.substr(kPrefix.size()));
  if (!model.ok()) return fail(model.status(), 404);
  Send(connection, 200, JsonText(OpenAiModel(**model)));
}

std::shared_ptr<Request> KServeHttp::BeginPost(mg_connection* connection,
                                               EmbeddingsCall::Api api,
                                               std::string* body) {
  const mg_request_info* request = mg_get_request_info(connection);
  const auto fail = [&](const absl::Status& status, int http_status) {
    const auto [code, text] = EmbeddingsError(api, status, http_status);
    Send(connection, code, text);
  };
  if (std::string(request->request_method) != "POST") {
    fail(absl::InvalidArgumentError(absl::StrCat(request->request_method, " ",
                                                 request->local_uri, ": use POST")),
         405);
    return nullptr;
  }
  const char* authorization = mg_get_header(connection, "Authorization");
  absl::StatusOr<std::shared_ptr<Request>> begun =
      pipeline_->Begin(authorization != nullptr ? authorization : "");
  if (!begun.ok()) {
    fail(begun.status(), HttpStatusFor(begun.status().code()));
    return nullptr;
  }
  SetTraceOf(connection, begun->get());
  if (absl::Status read = ReadBody(connection, body); !read.ok()) {
    (*begun)->Finish(read);
    fail(read, 413);
    return nullptr;
  }
  return *std::move(begun);
}

void KServeHttp::Tokenizer(mg_connection* connection, bool decode) {
  const mg_request_info* request = mg_get_request_info(connection);
  // TEI's error shape, as /embed's.
  const auto fail = [&](const absl::Status& status, int http_status) {
    const auto [code, body] =
        EmbeddingsError(EmbeddingsCall::Api::kTei, status, http_status);
    Send(connection, code, body);
  };
  const OpenCall open_call(pipeline_);
  std::string body;
  const std::shared_ptr<Request> counted =
      BeginPost(connection, EmbeddingsCall::Api::kTei, &body);
  if (counted == nullptr) return;
  const auto refuse = [&](const absl::Status& status) {
    counted->Finish(status);
    fail(status, HttpStatusFor(status.code()));
  };
  absl::StatusOr<std::string> name = QueryModel(request);
  if (!name.ok()) return refuse(name.status());
  if (absl::Status found = counted->Find(*name); !found.ok()) {
    return fail(found, HttpStatusFor(found.code()));
  }
  const ServedModel& model = *counted->model();
  absl::StatusOr<std::string> answer;
  if (decode) {
    absl::StatusOr<DecodeCall> call = ParseTeiDecode(body);
    answer = call.ok() ? DecodeBody(*call, model) : call.status();
  } else {
    absl::StatusOr<TokenizeCall> call = ParseTeiTokenize(body);
    answer = call.ok() ? TokenizeBody(*call, model) : call.status();
  }
  if (!answer.ok()) return refuse(answer.status());
  counted->Finish(absl::OkStatus());
  Send(connection, 200, *answer);
}

void KServeHttp::Info(mg_connection* connection) {
  const mg_request_info* request = mg_get_request_info(connection);
  if (std::string(request->request_method) != "GET") {
    return SendError(connection, 405,
                     absl::StrCat(request->request_method, " /info: use GET"));
  }
  const char* authorization = mg_get_header(connection, "Authorization");
  if (absl::Status allowed =
          pipeline_->Authorize(authorization != nullptr ? authorization : "");
      !allowed.ok()) {
    return SendStatus(connection, allowed);
  }
  absl::StatusOr<std::string> name = QueryModel(request);
  if (!name.ok()) return SendError(connection, 400, std::string(name.status().message()));
  absl::StatusOr<std::shared_ptr<ServedModel>> served = pipeline_->FindModel(*name);
  if (!served.ok()) return SendStatus(connection, served.status());
  const ServedModel& model = **served;
  const v1::ModelInfo& info = model.info;
  Json type;
  if (!model.is_encoder()) {
    type = {
        {"attention", {{"d_model", info.d_model()}, {"num_heads", info.num_heads()}}}};
  } else if (model.encoder_spec.num_labels > 0) {
    Json id2label = Json::object(), label2id = Json::object();
    for (int i = 0; i < info.encoder().labels_size(); ++i) {
      id2label[std::to_string(i)] = info.encoder().labels(i);
      label2id[info.encoder().labels(i)] = i;
    }
    type = {{"classifier", {{"id2label", id2label}, {"label2id", label2id}}}};
  } else if (model.encoder_spec.sparse != core::EncoderSpec::Sparse::kNone) {
    type = {{"embedding", {{"pooling", "splade"}}}};  // TEI's name
  } else {
    std::string pooling = v1::EncoderConfig::Pooling_Name(info.encoder().pooling());
    pooling = absl::AsciiStrToLower(absl::StripPrefix(pooling, "POOLING_"));
    type = {{"embedding", {{"pooling", pooling}}}};
  }
  Send(connection, 200,
       JsonText({{"model_id", model.name},
                 {"model_version", model.version},
                 {"model_sha", nullptr},
                 {"model_dtype", DtypeName(info.precision())},
                 {"model_type", type},
                 {"device", info.device()},
                 {"max_concurrent_requests", options_.max_concurrent_requests},
                 {"max_input_length", MaxInputLength(model)},
                 {"max_batch_tokens", info.batching().max_batch_tokens()},
                 {"max_batch_requests", info.batching().max_batch_size()},
                 {"max_client_batch_size", nullptr},
                 {"auto_truncate", model.auto_truncate},
                 {"tokenization_workers", nullptr},
                 {"version", kServerVersion},
                 {"sha", nullptr},
                 {"docker_label", nullptr}}));
}

void KServeHttp::Route(mg_connection* connection) {
  const mg_request_info* request = mg_get_request_info(connection);
  const std::string method = request->request_method;
  const std::string uri = request->local_uri;
  // Cohere's v2 rerank path lies under KServe's /v2 prefix, whichever handler civetweb
  // matched it to.
  if (uri == "/v2/rerank") return Embeddings(connection, EmbeddingsCall::Api::kRerank);
  if (uri == "/v2/embed") {
    return Embeddings(connection, EmbeddingsCall::Api::kCohereEmbed);
  }
  if (options_.on_request) options_.on_request(uri);
  if (uri == "/info") return Info(connection);
  if (uri == "/tokenize" || uri == "/decode") {
    return Tokenizer(connection, uri == "/decode");
  }
  if (absl::StartsWith(uri, "/v1/models")) return Models(connection);
  const std::vector<absl::string_view> parts =
      absl::StrSplit(uri, '/', absl::SkipEmpty());  // parts[0] == "v2"
  const auto not_found = [&] {
    SendError(connection, 404, absl::StrCat("no such endpoint: ", uri));
  };
  const auto wrong_method = [&](const char* allowed) {
    SendError(connection, 405, absl::StrCat(method, " ", uri, ": use ", allowed));
  };
  if (parts.size() == 1) {
    if (method != "GET") return wrong_method("GET");
    return Send(
        connection, 200,
        JsonText({{"name", "attnserve"},
                  {"version", kServerVersion},
                  {"extensions", std::vector<std::string>(std::begin(kExtensions),
                                                          std::end(kExtensions))}}));
  }
  if (parts.size() == 3 && parts[1] == "health") {
    if (method != "GET") return wrong_method("GET");
    if (parts[2] == "live") return Send(connection, 200, JsonText({{"live", true}}));
    if (parts[2] != "ready") return not_found();
    const bool serving = pipeline_->Ready();
    return Send(connection, serving ? 200 : 503, JsonText({{"ready", serving}}));
  }
  if (parts.size() >= 3 && parts[1] == "repository") {
    return Repository(connection, parts);
  }
  ModelRoute route;
  if (!ParseModelRoute(parts, &route)) return not_found();
  if (route.action == "ready") {
    if (method != "GET") return wrong_method("GET");
    const bool serving = pipeline_->ModelReady(route.model, route.version);
    return Send(connection, serving ? 200 : 503,
                JsonText({{"name", route.model}, {"ready", serving}}));
  }
  if (route.action == "infer") {
    if (method != "POST") return wrong_method("POST");
    return Infer(connection, route.model, route.version);
  }
  // Metadata needs a token when tokens are configured (inference:
  // RequestPipeline::Begin).
  const char* authorization = mg_get_header(connection, "Authorization");
  if (absl::Status allowed =
          pipeline_->Authorize(authorization != nullptr ? authorization : "");
      !allowed.ok()) {
    return SendStatus(connection, allowed);
  }
  if (route.action == "config" || route.action == "stats") {
    if (method != "GET") return wrong_method("GET");
    absl::StatusOr<std::shared_ptr<ServedModel>> model =
        pipeline_->FindModel(route.model, route.version);
    if (!model.ok()) return SendStatus(connection, model.status());
    if (route.action == "config") {
      inference::ModelConfig config;
      FillModelConfig(**model, &config);
      return Send(connection, 200, JsonText(ModelConfigJson(config)));
    }
    inference::ModelStatisticsResponse statistics;
    const std::shared_ptr<const ServedModel> served = *model;
    FillModelStatistics(*metrics_, absl::MakeConstSpan(&served, 1), &statistics);
    return Send(connection, 200, JsonText(StatisticsJson(statistics)));
  }
  if (route.action.empty()) {
    if (method != "GET") return wrong_method("GET");
    absl::StatusOr<std::shared_ptr<ServedModel>> model =
        pipeline_->FindModel(route.model, route.version);
    if (!model.ok()) return SendStatus(connection, model.status());
    inference::ModelMetadataResponse metadata;
    FillModelMetadata(**model, &metadata);
    const auto tensors = [](const auto& list) {
      Json json = Json::array();
      for (const auto& tensor : list) {
        json.push_back({{"name", tensor.name()},
                        {"datatype", tensor.datatype()},
                        {"shape", std::vector<int64_t>(tensor.shape().begin(),
                                                       tensor.shape().end())}});
      }
      return json;
    };
    return Send(
        connection, 200,
        JsonText({{"name", metadata.name()},
                  {"versions", std::vector<std::string>(metadata.versions().begin(),
                                                        metadata.versions().end())},
                  {"platform", metadata.platform()},
                  {"inputs", tensors(metadata.inputs())},
                  {"outputs", tensors(metadata.outputs())}}));
  }
  return not_found();
}

void KServeHttp::Repository(mg_connection* connection,
                            const std::vector<absl::string_view>& parts) {
  const mg_request_info* request = mg_get_request_info(connection);
  const std::string uri = request->local_uri;
  // POST /v2/repository/index, /v2/repository/models/{m}/load and .../unload.
  const bool index = parts.size() == 3 && parts[2] == "index";
  const bool model_action = parts.size() == 5 && parts[2] == "models" &&
                            (parts[4] == "load" || parts[4] == "unload");
  if (!index && !model_action) {
    return SendError(connection, 404, absl::StrCat("no such endpoint: ", uri));
  }
  if (std::string(request->request_method) != "POST") {
    return SendError(connection, 405,
                     absl::StrCat(request->request_method, " ", uri, ": use POST"));
  }
  const char* authorization = mg_get_header(connection, "Authorization");
  if (absl::Status allowed =
          pipeline_->Authorize(authorization != nullptr ? authorization : "");
      !allowed.ok()) {
    return SendStatus(connection, allowed);
  }
  std::string body;
  if (absl::Status read = ReadBody(connection, &body); !read.ok()) {
    return SendError(connection, 413, read.message());
  }
  ModelRegistry* registry = pipeline_->registry();
  if (index) {
    absl::StatusOr<bool> ready = ParseRepositoryIndexBody(body);
    if (!ready.ok()) return SendStatus(connection, ready.status());
    Json models = Json::array();
    for (const ModelRegistry::IndexEntry& entry : pipeline_->RepositoryIndex(*ready)) {
      Json row = {
          {"name", entry.name}, {"version", entry.version}, {"state", entry.state}};
      if (!entry.reason.empty()) row["reason"] = entry.reason;
      models.push_back(std::move(row));
    }
    return Send(connection, 200, JsonText(models));
  }
  const bool load = parts[4] == "load";
  absl::StatusOr<std::optional<std::string>> config = ParseRepositoryLoadBody(body, load);
  if (!config.ok()) return SendStatus(connection, config.status());
  const std::string model(parts[3]);
  // On the registry's control thread, as the gRPC door does: a load's warm-up runs the
  // model, deeper than a civetweb thread's stack allows under the sanitizers. This
  // thread waits; shared with the callback, which may outlive the wait's return.
  struct Answer {
    absl::Status status;
    absl::Notification done;
  };
  auto answer = std::make_shared<Answer>();
  const auto finish = [answer](const absl::Status& status) {
    answer->status = status;
    answer->done.Notify();
  };
  if (load) {
    registry->LoadInBackground(model, *std::move(config), finish);
  } else {
    registry->UnloadInBackground(model, finish);
  }
  answer->done.WaitForNotification();
  if (!answer->status.ok()) return SendStatus(connection, answer->status);
  return Send(connection, 200, "{}");
}

void KServeHttp::Infer(mg_connection* connection, const std::string& model,
                       const std::string& version) {
  const absl::Time start = absl::Now();
  const mg_request_info* request = mg_get_request_info(connection);
  const OpenCall call(pipeline_);
  const char* authorization = mg_get_header(connection, "Authorization");
  absl::StatusOr<std::shared_ptr<Request>> begun =
      pipeline_->Begin(authorization != nullptr ? authorization : "");
  if (!begun.ok()) return SendStatus(connection, begun.status());
  const std::shared_ptr<Request>& counted = *begun;
  SetTraceOf(connection, counted.get());
  const auto refuse = [&](const absl::Status& status, int http_status) {
    counted->Finish(status);
    SendError(connection, http_status, status.message());
  };
  absl::StatusOr<int64_t> header_length =
      ParseHeaderLength(mg_get_header(connection, "Inference-Header-Content-Length"));
  if (!header_length.ok()) {
    return refuse(header_length.status(), HttpStatusFor(header_length.status().code()));
  }
  std::string body;
  if (absl::Status read = ReadBody(connection, &body); !read.ok()) {
    return refuse(read, 413);
  }
  // The model first, then the body: every door looks a model up before it decodes.
  if (absl::Status found = counted->Find(model, version); !found.ok()) {
    return SendStatus(connection, found);
  }
  absl::StatusOr<HttpInferRequest> parsed =
      ParseInferBody(model, version, body, *header_length);
  if (!parsed.ok()) return refuse(parsed.status(), HttpStatusFor(parsed.status().code()));
  body = std::string();  // the inputs' bytes now live in the request
  // The outputs' names and the id stay in the request; the raw input bytes move.
  auto infer = std::make_shared<inference::ModelInferRequest>(std::move(parsed->infer));
  // This thread waits for the batcher's answer, watching for the client to hang up,
  // which cancels the request.
  absl::Notification done;
  absl::Status status;
  inference::ModelInferResponse response;
  auto cancellation = std::make_shared<Cancellation>();
  SubmitInfer(*pipeline_, counted, infer, absl::Now() + options_.default_timeout,
              cancellation,
              [&](absl::Status result_status, inference::ModelInferResponse result) {
                status = std::move(result_status);
                if (status.ok()) response.Swap(&result);
                done.Notify();
              });
  AwaitAnswer(request, done, *cancellation);
  if (!status.ok()) return SendStatus(connection, status);
  int64_t response_header_length = -1;
  const std::string out =
      InferResponseBody(response, parsed->binary_outputs, &response_header_length);
  const std::string timing =
      absl::StrCat("x-total-time: ", absl::ToInt64Milliseconds(absl::Now() - start),
                   "\r\n", TimingHeaders(response));
  if (response_header_length >= 0) {
    Send(connection, 200, out,
         absl::StrCat("Inference-Header-Content-Length: ", response_header_length, "\r\n",
                      timing),
         "application/octet-stream");
  } else {
    Send(connection, 200, out, timing);
  }
}

absl::Status KServeHttp::ReadBody(mg_connection* connection, std::string* body) const {
  const mg_request_info* request = mg_get_request_info(connection);
  // The size is checked before a byte of the body is read.
  if (request->content_length > options_.max_body_bytes) {
    return absl::OutOfRangeError(absl::StrCat("the body is ", request->content_length,
                                              " bytes, over the limit of ",
                                              options_.max_body_bytes));
  }
  body->reserve(request->content_length > 0 ? static_cast<size_t>(request->content_length)
                                            : 0);
  // civetweb's worker threads have small stacks (fixed at its build; Debian's cannot
  // be changed at run time): nothing large lives on them.
  std::vector<char> chunk(65536);
  int read = 0;
  while ((read = mg_read(connection, chunk.data(), chunk.size())) > 0) {
    if (static_cast<int64_t>(body->size()) + read > options_.max_body_bytes) {
      return absl::OutOfRangeError(absl::StrCat("the body is over the limit of ",
                                                options_.max_body_bytes, " bytes"));
    }
    body->append(chunk.data(), static_cast<size_t>(read));
  }
  return absl::OkStatus();
}

void KServeHttp::AwaitAnswer(const mg_request_info* request, absl::Notification& done,
                             Cancellation& cancellation) const {
  int socket = -2;  // not looked for yet
  while (!done.WaitForNotificationWithTimeout(kHangUpCheckInterval)) {
    if (socket == -2) socket = FindSocket(request);
    if (socket >= 0 && HungUp(socket)) {
      cancellation.Cancel();
      done.WaitForNotification();  // the batcher answers CANCELLED now
      return;
    }
  }
}

void KServeHttp::Embeddings(mg_connection* connection, EmbeddingsCall::Api api) {
  const absl::Time start = absl::Now();
  const mg_request_info* request = mg_get_request_info(connection);
  const auto fail = [&](const absl::Status& status, int http_status) {
    const auto [code, body] = EmbeddingsError(api, status, http_status);
    Send(connection, code, body);
  };
  const auto refuse = [&](const absl::Status& status) {
    fail(status, HttpStatusFor(status.code()));
  };
  const OpenCall open_call(pipeline_);
  std::string body;
  const std::shared_ptr<Request> counted = BeginPost(connection, api, &body);
  if (counted == nullptr) return;
  absl::StatusOr<EmbeddingsCall> call = ParseCall(api, body);
  body = std::string();
  if (!call.ok()) {
    counted->Finish(call.status());
    return refuse(call.status());
  }
  // TEI's bodies name no model: the `model` query parameter may (else the default).
  if (call->encode.model().empty()) {
    absl::StatusOr<std::string> name = QueryModel(request);
    if (!name.ok()) {
      counted->Finish(name.status());
      return refuse(name.status());
    }
    call->encode.set_model(*std::move(name));
  }
  // The body names the model: it is looked up once, and that model validates, computes
  // and describes the answer.
  if (absl::Status found = counted->Find(call->encode.model()); !found.ok()) {
    return refuse(found);
  }
  const std::shared_ptr<ServedModel>& model = counted->model();
  if (absl::Status fits = CheckEmbeddingsCall(*call, *model); !fits.ok()) {
    counted->Finish(fits);
    return refuse(fits);
  }
  // This thread waits for the batcher's answer, watching for the client to hang up.
  absl::Notification done;
  absl::Status status;
  v1::EncodeResponse response;
  auto cancellation = std::make_shared<Cancellation>();
  pipeline_->SubmitEncode(counted, call->encode, absl::Now() + options_.default_timeout,
                          cancellation,
                          [&](absl::Status result_status, v1::EncodeResponse result) {
                            status = std::move(result_status);
                            if (status.ok()) response.Swap(&result);
                            done.Notify();
                          });
  AwaitAnswer(request, done, *cancellation);
  if (!status.ok()) return refuse(status);
  const std::string body_text = EmbeddingsBody(*call, response, *model);
  // TEI's timing headers, whole milliseconds as TEI writes them.
  int64_t tokens = 0;
  for (const int64_t length : response.lengths()) tokens += length;
  Send(connection, 200, body_text,
       absl::StrCat(
           "x-compute-type: ", model->info.device(), "\r\nx-compute-tokens: ", tokens,
           "\r\nx-total-time: ", absl::ToInt64Milliseconds(absl::Now() - start), "\r\n",
           TimingHeaders(response.tokenize_time_us(), response.queue_time_us(),
                         response.compute_time_us())));
}

}  // namespace attnserve::server
