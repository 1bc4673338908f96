#include "server/kserve_http.h"

#include <civetweb.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "core/bfloat16.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/kserve_service.h"

namespace attnserve::server {

namespace {

using Json = nlohmann::json;

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Internal Server Error";
  }
}

void Send(mg_connection* connection, int status, const std::string& body,
          const std::string& extra_headers = "",
          const char* content_type = "application/json") {
  mg_printf(connection,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
            "Connection: keep-alive\r\n\r\n",
            status, Reason(status), content_type, body.size(), extra_headers.c_str());
  if (!body.empty()) mg_write(connection, body.data(), body.size());
}

void SendError(mg_connection* connection, int status, absl::string_view message) {
  Send(connection, status, Json{{"error", std::string(message)}}.dump());
}

// Appends the numbers of a (possibly nested) JSON array, row-major.
absl::Status Flatten(const Json& data, std::vector<float>& out,
                     const std::string& field) {
  if (data.is_array()) {
    for (const Json& item : data) ATTN_RETURN_IF_ERROR(Flatten(item, out, field));
    return absl::OkStatus();
  }
  if (!data.is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must hold numbers, got ", data.type_name()));
  }
  out.push_back(data.get<float>());
  return absl::OkStatus();
}

absl::Status ToParameter(const Json& value, const std::string& field,
                         inference::InferParameter* parameter) {
  if (value.is_boolean()) {
    parameter->set_bool_param(value.get<bool>());
  } else if (value.is_number_integer()) {
    parameter->set_int64_param(value.get<int64_t>());
  } else if (value.is_string()) {
    parameter->set_string_param(value.get<std::string>());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be a bool, an integer or a string"));
  }
  return absl::OkStatus();
}

// The JSON body (and, with the binary tensor extension, the bytes after its header) as
// a ModelInferRequest whose inputs are all raw contents.
absl::StatusOr<inference::ModelInferRequest> InferFromJson(const std::string& model,
                                                           const std::string& version,
                                                           absl::string_view body,
                                                           int64_t header_length,
                                                           bool& binary_outputs) {
  if (header_length > static_cast<int64_t>(body.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("Inference-Header-Content-Length ", header_length,
                     " is more than the body's ", body.size(), " bytes"));
  }
  const absl::string_view header =
      header_length >= 0 ? body.substr(0, static_cast<size_t>(header_length)) : body;
  absl::string_view binary =
      header_length >= 0 ? body.substr(static_cast<size_t>(header_length)) : "";
  const Json json = Json::parse(header.begin(), header.end(), nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("the body must be a JSON object");
  }
  inference::ModelInferRequest infer;
  infer.set_model_name(model);
  infer.set_model_version(version);
  if (json.contains("id"))
    infer.set_id(json["id"].is_string() ? json["id"].get<std::string>()
                                        : json["id"].dump());
  binary_outputs = false;
  if (json.contains("parameters")) {
    for (const auto& [name, value] : json["parameters"].items()) {
      if (name == "binary_data_output") {
        binary_outputs = value.is_boolean() && value.get<bool>();
        continue;
      }
      ATTN_RETURN_IF_ERROR(ToParameter(value, absl::StrCat("parameters[\"", name, "\"]"),
                                       &(*infer.mutable_parameters())[name]));
    }
  }
  if (!json.contains("inputs") || !json["inputs"].is_array()) {
    return absl::InvalidArgumentError("inputs must be an array");
  }
  for (size_t i = 0; i < json["inputs"].size(); ++i) {
    const Json& input = json["inputs"][i];
    const std::string field = absl::StrCat("inputs[", i, "]");
    auto* tensor = infer.add_inputs();
    tensor->set_name(input.value("name", ""));
    tensor->set_datatype(input.value("datatype", ""));
    if (!input.contains("shape") || !input["shape"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape must be an array"));
    }
    for (const Json& dim : input["shape"]) {
      if (!dim.is_number_integer()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".shape must hold integers"));
      }
      tensor->add_shape(dim.get<int64_t>());
    }
    std::string* raw = infer.add_raw_input_contents();
    const Json parameters = input.value("parameters", Json::object());
    if (parameters.contains("binary_data_size")) {
      const int64_t size = parameters["binary_data_size"].get<int64_t>();
      if (size < 0 || size > static_cast<int64_t>(binary.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".parameters.binary_data_size ", size,
                         " is more than the ", binary.size(), " binary bytes left"));
      }
      raw->assign(binary.data(), static_cast<size_t>(size));
      binary.remove_prefix(static_cast<size_t>(size));
      continue;
    }
    if (!input.contains("data")) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " needs data or parameters.binary_data_size"));
    }
    std::vector<float> values;
    ATTN_RETURN_IF_ERROR(Flatten(input["data"], values, absl::StrCat(field, ".data")));
    if (tensor->datatype() == "BF16") {
      raw->resize(values.size() * 2);
      for (size_t j = 0; j < values.size(); ++j) {
        const uint16_t bits = core::FloatToBf16(values[j]);
        std::memcpy(raw->data() + 2 * j, &bits, 2);
      }
    } else {
      raw->assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    }
  }
  if (json.contains("outputs")) {
    for (const Json& output : json["outputs"]) {
      auto* requested = infer.add_outputs();
      requested->set_name(output.value("name", ""));
      const Json parameters = output.value("parameters", Json::object());
      if (parameters.value("binary_data", false)) binary_outputs = true;
    }
  }
  return infer;
}

// The answer as JSON, with the outputs' bytes appended (binary extension) or as numbers.
std::string ResponseToBody(const inference::ModelInferResponse& response, bool binary,
                           int64_t& header_length) {
  Json json = {{"model_name", response.model_name()},
               {"model_version", response.model_version()},
               {"outputs", Json::array()}};
  if (!response.id().empty()) json["id"] = response.id();
  std::string blobs;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& output = response.outputs(i);
    const std::string& raw = response.raw_output_contents(i);
    Json entry = {
        {"name", output.name()},
        {"datatype", output.datatype()},
        {"shape", std::vector<int64_t>(output.shape().begin(), output.shape().end())}};
    if (binary) {
      entry["parameters"] = {{"binary_data_size", raw.size()}};
      blobs += raw;
    } else if (output.datatype() == "BF16") {
      std::vector<float> values(raw.size() / 2);
      for (size_t j = 0; j < values.size(); ++j) {
        uint16_t bits;
        std::memcpy(&bits, raw.data() + 2 * j, 2);
        values[j] = core::Bf16ToFloat(bits);
      }
      entry["data"] = values;
    } else {
      std::vector<float> values(raw.size() / 4);
      std::memcpy(values.data(), raw.data(), values.size() * 4);
      entry["data"] = values;
    }
    json["outputs"].push_back(std::move(entry));
  }
  std::string body = json.dump();
  header_length = binary ? static_cast<int64_t>(body.size()) : -1;
  return body + blobs;
}

int Dispatch(mg_connection* connection, void* self) {
  return static_cast<KServeHttp*>(self)->Handle(connection);
}

}  // namespace

absl::StatusOr<std::unique_ptr<KServeHttp>> KServeHttp::Start(
    const Options& options, ModelRegistry* registry, AttentionService* attention) {
  std::unique_ptr<KServeHttp> http(new KServeHttp(options, registry, attention));
  const bool ipv6 = absl::StrContains(options.host, ':');
  const std::string address = ipv6 ? absl::StrCat("[", options.host, "]:", options.port)
                                   : absl::StrCat(options.host, ":", options.port);
  const std::string threads = absl::StrCat(options.threads);
  const char* civet_options[] = {"listening_ports", address.c_str(), "num_threads",
                                 threads.c_str(), nullptr};
  mg_callbacks callbacks;
  std::memset(&callbacks, 0, sizeof(callbacks));
  http->context_ = mg_start(&callbacks, http.get(), civet_options);
  if (http->context_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, " (HTTP)"));
  }
  mg_set_request_handler(http->context_, "/v2", Dispatch, http.get());
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

int KServeHttp::Handle(mg_connection* connection) {
  const mg_request_info* request = mg_get_request_info(connection);
  const std::string method = request->request_method;
  const std::string uri = request->local_uri;
  const bool ready = !draining_.load(std::memory_order_acquire);
  std::vector<std::string> parts = absl::StrSplit(uri, '/', absl::SkipEmpty());
  // parts[0] == "v2"
  if (parts.size() == 1 && method == "GET") {
    Send(connection, 200,
         Json{{"name", "attnserve"},
              {"version", kServerVersion},
              {"extensions",
               std::vector<std::string>(std::begin(kExtensions), std::end(kExtensions))}}
             .dump());
    return 1;
  }
  if (parts.size() == 3 && parts[1] == "health" && method == "GET") {
    if (parts[2] == "live") {
      Send(connection, 200, "");
    } else if (parts[2] == "ready") {
      Send(connection, ready && !registry_->models().empty() ? 200 : 503, "");
    } else {
      SendError(connection, 404, absl::StrCat("no such endpoint: ", uri));
    }
    return 1;
  }
  if (parts.size() < 3 || parts[1] != "models") {
    SendError(connection, 404, absl::StrCat("no such endpoint: ", uri));
    return 1;
  }
  const std::string model_name = parts[2];
  std::string version;
  size_t next = 3;
  if (parts.size() >= 5 && parts[3] == "versions") {
    version = parts[4];
    next = 5;
  }
  const std::string action = next < parts.size() ? parts[next] : "";
  if (next + (action.empty() ? 0 : 1) != parts.size()) {
    SendError(connection, 404, absl::StrCat("no such endpoint: ", uri));
    return 1;
  }
  if (options_.auth != nullptr && action != "ready") {
    const char* authorization = mg_get_header(connection, "Authorization");
    if (absl::Status allowed =
            options_.auth->Check(authorization != nullptr ? authorization : "");
        !allowed.ok()) {
      SendError(connection, 401, allowed.message());
      return 1;
    }
  }
  const ServedModel* model = registry_->Find(model_name);
  const bool known = model != nullptr && (version.empty() || version == kModelVersion);
  if (action.empty() || action == "ready") {
    if (method != "GET") {
      SendError(connection, 405, absl::StrCat(method, " ", uri, ": use GET"));
    } else if (action == "ready") {
      Send(connection, known && ready ? 200 : 503, "");
    } else if (!known) {
      SendError(connection, 404,
                absl::StrCat("model \"", model_name, "\" version \"", version,
                             "\" is not served"));
    } else {
      inference::ModelMetadataResponse metadata;
      FillModelMetadata(*model, &metadata);
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
      Send(connection, 200,
           Json{{"name", metadata.name()},
                {"versions", std::vector<std::string>(metadata.versions().begin(),
                                                      metadata.versions().end())},
                {"platform", metadata.platform()},
                {"inputs", tensors(metadata.inputs())},
                {"outputs", tensors(metadata.outputs())}}
               .dump());
    }
    return 1;
  }
  if (action != "infer") {
    SendError(connection, 404, absl::StrCat("no such endpoint: ", uri));
    return 1;
  }
  if (method != "POST") {
    SendError(connection, 405, absl::StrCat(method, " ", uri, ": use POST"));
    return 1;
  }
  // The body, bounded.
  if (request->content_length > options_.max_body_bytes) {
    SendError(connection, 413,
              absl::StrCat("the body is ", request->content_length,
                           " bytes, over the limit of ", options_.max_body_bytes));
    return 1;
  }
  std::string body;
  body.reserve(request->content_length > 0 ? static_cast<size_t>(request->content_length)
                                           : 0);
  // civetweb's worker threads have small stacks (fixed at its build; Debian's cannot
  // be changed at run time): nothing large lives on them.
  std::vector<char> chunk(65536);
  int read = 0;
  while ((read = mg_read(connection, chunk.data(), chunk.size())) > 0) {
    body.append(chunk.data(), static_cast<size_t>(read));
    if (static_cast<int64_t>(body.size()) > options_.max_body_bytes) {
      SendError(connection, 413,
                absl::StrCat("the body is over the limit of ", options_.max_body_bytes,
                             " bytes"));
      return 1;
    }
  }
  int64_t header_length = -1;
  if (const char* header = mg_get_header(connection, "Inference-Header-Content-Length")) {
    if (!absl::SimpleAtoi(header, &header_length) || header_length < 0) {
      SendError(
          connection, 400,
          absl::StrCat("Inference-Header-Content-Length must be a byte count, got \"",
                       header, "\""));
      return 1;
    }
  }
  bool binary_outputs = false;
  absl::StatusOr<inference::ModelInferRequest> infer =
      InferFromJson(model_name, version, body, header_length, binary_outputs);
  absl::StatusOr<v1::AttendRequest> attend =
      infer.ok() ? AttendFromInfer(*infer)
                 : absl::StatusOr<v1::AttendRequest>(infer.status());
  if (!attend.ok()) {
    SendError(connection, HttpStatus(attend.status().code()), attend.status().message());
    return 1;
  }
  // This thread waits for the batcher's answer (the work views `attend`'s bytes).
  absl::Notification done;
  absl::Status status;
  inference::ModelInferResponse response;
  attention_->Submit(*attend, absl::InfiniteFuture(), nullptr,
                     [&](absl::Status result_status, v1::AttendResponse result) {
                       status = std::move(result_status);
                       if (status.ok())
                         InferResponseFromAttend(*infer, result, &response);
                       done.Notify();
                     });
  done.WaitForNotification();
  if (!status.ok()) {
    SendError(connection, HttpStatus(status.code()), status.message());
    return 1;
  }
  int64_t response_header_length = -1;
  const std::string out =
      ResponseToBody(response, binary_outputs, response_header_length);
  if (response_header_length >= 0) {
    Send(
        connection, 200, out,
        absl::StrCat("Inference-Header-Content-Length: ", response_header_length, "\r\n"),
        "application/octet-stream");
  } else {
    Send(connection, 200, out);
  }
  return 1;
}

}  // namespace attnserve::server
