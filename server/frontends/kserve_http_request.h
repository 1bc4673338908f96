// The KServe v2 HTTP/REST infer body as a ModelInferRequest, and the answer as a body:
// JSON tensors, and Triton's binary tensor extension (Inference-Header-Content-Length).
// Nothing here throws, whatever the bytes: every mistake is a Status that names the JSON
// path of the field, the value and what was expected. Pure functions; the HTTP door
// (KServeHttp) and the fuzzer (tests/fuzz/http_request_fuzzer.cc) call them.
#ifndef ATTNSERVE_SERVER_FRONTENDS_KSERVE_HTTP_REQUEST_H_
#define ATTNSERVE_SERVER_FRONTENDS_KSERVE_HTTP_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention.pb.h"
#include "inference/grpc_service.pb.h"
#include "nlohmann/json.hpp"

namespace attnserve::server {

// Deepest nesting of arrays and objects a body may have. A tensor's data nests one
// level per dimension; the rest of the protocol needs four. Checked before parsing,
// so that neither the parser nor the destruction of the parsed value recurses deeply
// on the HTTP server's small thread stacks.
inline constexpr int kMaxJsonDepth = 32;

// An infer request read from HTTP.
struct HttpInferRequest {
  // Inputs all as raw_input_contents (little-endian bytes of the datatype).
  inference::ModelInferRequest infer;
  // The answer carries its tensors as binary data after the JSON header: the request's
  // parameters.binary_data_output, or an output's parameters.binary_data, was true.
  bool binary_outputs = false;
};

// The Inference-Header-Content-Length header: -1 when absent (`value` null), else the
// byte count. InvalidArgument for anything but a non-negative decimal integer.
absl::StatusOr<int64_t> ParseHeaderLength(const char* value);

// `body` (its first `header_length` bytes are JSON, the rest binary tensor data; all
// of it JSON when header_length is -1) as an infer request for `model` at `version`.
// InvalidArgument naming the JSON path for a body that is not JSON, nests deeper than
// kMaxJsonDepth, or has a field of the wrong type or value (`inputs[0].shape[1] must be
// a non-negative integer, got "a"`). The model's own checks (names, shapes, limits)
// come later, the same for every door.
absl::StatusOr<HttpInferRequest> ParseInferBody(absl::string_view model,
                                                absl::string_view version,
                                                absl::string_view body,
                                                int64_t header_length);

// `response` as an HTTP body: JSON with the tensors' values, or (binary) JSON followed
// by the tensors' bytes; `header_length` gets the JSON's size in binary mode, -1
// otherwise. Never throws: strings that are not UTF-8 are written with U+FFFD.
std::string InferResponseBody(const inference::ModelInferResponse& response, bool binary,
                              int64_t* header_length);

// `json` as compact text. Never throws: bytes that are not UTF-8 (a model name from the
// URL, say) become U+FFFD instead of a type_error exception. Every JSON the HTTP door
// sends goes through it.
std::string JsonText(const nlohmann::json& json);

// `text` parsed as JSON, after checking that it nests at most kMaxJsonDepth levels.
// InvalidArgument "the JSON body nests more than 32 levels deep" / "the body is not
// valid JSON". Never throws.
absl::StatusOr<nlohmann::json> ParseJsonBody(absl::string_view text);

// ParseJsonBody's, and InvalidArgument "the body must be a JSON object, got ..." for
// any other JSON value. Never throws.
absl::StatusOr<nlohmann::json> ParseJsonObjectBody(absl::string_view text);

// A JSON value as a short excerpt for an error message (at most 40 characters).
std::string JsonExcerpt(const nlohmann::json& value);

// A JSON body's head_mask, transformers' [layers][heads] factors or the same flattened,
// appended to encode->head_mask; the work checks their count and range. InvalidArgument
// naming the field for a value that is not a list of numbers (or of lists of numbers).
absl::Status HeadMaskAt(const nlohmann::json& value, v1::EncodeRequest* encode);

// {"error": message} (invalid UTF-8 replaced, so any message can be sent).
std::string ErrorBody(absl::string_view message);

// The body of POST /v2/repository/index: empty or {"ready": bool}. Returns `ready`.
absl::StatusOr<bool> ParseRepositoryIndexBody(absl::string_view body);

// The body of POST /v2/repository/models/{m}/load or /unload: empty or
// {"parameters": {...}}. For load, parameters["config"] (a string: the model's
// ModelConfig as JSON) replaces its config.pbtxt; unload takes only
// unload_dependents (a bool, ignored: attnserve's models have no dependents).
// InvalidArgument naming the field otherwise. Returns the config, if any.
absl::StatusOr<std::optional<std::string>> ParseRepositoryLoadBody(absl::string_view body,
                                                                   bool load);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FRONTENDS_KSERVE_HTTP_REQUEST_H_
