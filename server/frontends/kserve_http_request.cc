#include "server/frontends/kserve_http_request.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/base/bfloat16.h"
#include "core/base/json_values.h"
#include "core/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace attnserve::server {

namespace {

using Json = nlohmann::json;

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(message);
}

// The member `key` of `object` (an object), or null when absent.
const Json* Member(const Json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// Values are read only through get_ptr (core/base/json_values.h), which answers null for
// another type: nothing here can throw (nlohmann's converting accessors do on a wrong
// type).

absl::StatusOr<std::string> StringAt(const Json& value, const std::string& path) {
  if (const auto* text = value.get_ptr<const Json::string_t*>()) return *text;
  return Invalid(absl::StrCat(path, " must be a string, got ", JsonExcerpt(value)));
}

absl::StatusOr<bool> BoolAt(const Json& value, const std::string& path) {
  if (const auto* flag = value.get_ptr<const Json::boolean_t*>()) return *flag;
  return Invalid(absl::StrCat(path, " must be true or false, got ", JsonExcerpt(value)));
}

// A non-negative integer that fits int64.
absl::StatusOr<int64_t> CountAt(const Json& value, const std::string& path) {
  if (const std::optional<int64_t> count = core::JsonInt64(value); count && *count >= 0) {
    return *count;
  }
  return Invalid(
      absl::StrCat(path, " must be a non-negative integer, got ", JsonExcerpt(value)));
}

absl::Status ObjectAt(const Json& value, const std::string& path) {
  if (!value.is_object()) {
    return Invalid(absl::StrCat(path, " must be an object, got ", JsonExcerpt(value)));
  }
  return absl::OkStatus();
}

absl::Status ArrayAt(const Json& value, const std::string& path) {
  if (!value.is_array()) {
    return Invalid(absl::StrCat(path, " must be an array, got ", JsonExcerpt(value)));
  }
  return absl::OkStatus();
}

// Appends the numbers of a (possibly nested) JSON array, row-major. Depth is bounded
// by kMaxJsonDepth (checked before parsing).
absl::Status Flatten(const Json& data, const std::string& path, std::vector<float>& out) {
  if (data.is_array()) {
    for (size_t i = 0; i < data.size(); ++i) {
      ATTN_RETURN_IF_ERROR(Flatten(data[i], absl::StrCat(path, "[", i, "]"), out));
    }
    return absl::OkStatus();
  }
  const std::optional<double> number = core::JsonNumber(data);
  if (!number) {
    return Invalid(absl::StrCat(path, " must be a number, got ", JsonExcerpt(data)));
  }
  const double value = *number;
  // A double beyond float's range has no float32 value (converting it is undefined).
  if (!(std::fabs(value) <= std::numeric_limits<float>::max())) {
    return Invalid(absl::StrCat(path, " is ", JsonExcerpt(data),
                                ", beyond float32's range (3.4e38)"));
  }
  out.push_back(static_cast<float>(value));
  return absl::OkStatus();
}

// `data` (nested arrays of integers) flattened in row-major order, each checked to fit
// `bits` (64 or 32) and written little-endian.
absl::Status FlattenIntegers(const Json& data, const std::string& path, int bits,
                             std::string& out) {
  if (data.is_array()) {
    for (size_t i = 0; i < data.size(); ++i) {
      ATTN_RETURN_IF_ERROR(
          FlattenIntegers(data[i], absl::StrCat(path, "[", i, "]"), bits, out));
    }
    return absl::OkStatus();
  }
  const std::optional<int64_t> value = core::JsonInt64(data);
  if (!value || (bits == 32 && (*value < std::numeric_limits<int32_t>::min() ||
                                *value > std::numeric_limits<int32_t>::max()))) {
    return Invalid(
        absl::StrCat(path, " must be an INT", bits, " integer, got ", JsonExcerpt(data)));
  }
  if (bits == 64) {
    out.append(reinterpret_cast<const char*>(&*value), sizeof(int64_t));
  } else {
    const auto narrow = static_cast<int32_t>(*value);
    out.append(reinterpret_cast<const char*>(&narrow), sizeof(int32_t));
  }
  return absl::OkStatus();
}

// `data` (nested arrays of strings) flattened in row-major order into Triton's BYTES
// layout: each element a 4-byte little-endian length, then its bytes.
absl::Status FlattenStrings(const Json& data, const std::string& path, std::string& out) {
  if (data.is_array()) {
    for (size_t i = 0; i < data.size(); ++i) {
      ATTN_RETURN_IF_ERROR(FlattenStrings(data[i], absl::StrCat(path, "[", i, "]"), out));
    }
    return absl::OkStatus();
  }
  const auto* text = data.get_ptr<const Json::string_t*>();
  if (text == nullptr) {
    return Invalid(
        absl::StrCat(path, " must be a BYTES string, got ", JsonExcerpt(data)));
  }
  const auto length = static_cast<uint32_t>(text->size());  // bounded by the body
  out.append(reinterpret_cast<const char*>(&length), sizeof(length));
  out += *text;
  return absl::OkStatus();
}

// A JSON parameter as an InferParameter: bool, integer or string.
absl::Status ToParameter(const Json& value, const std::string& path,
                         inference::InferParameter* parameter) {
  if (const auto* flag = value.get_ptr<const Json::boolean_t*>()) {
    parameter->set_bool_param(*flag);
  } else if (const std::optional<int64_t> integer = core::JsonInt64(value)) {
    parameter->set_int64_param(*integer);
  } else if (const auto* text = value.get_ptr<const Json::string_t*>()) {
    parameter->set_string_param(*text);
  } else {
    return Invalid(absl::StrCat(path, " must be a bool, an int64 or a string, got ",
                                JsonExcerpt(value)));
  }
  return absl::OkStatus();
}

// One element of "inputs"; `binary` is what is left of the binary section.
absl::Status ReadInput(const Json& input, const std::string& path,
                       absl::string_view& binary, inference::ModelInferRequest& infer) {
  ATTN_RETURN_IF_ERROR(ObjectAt(input, path));
  auto* tensor = infer.add_inputs();
  std::string* raw = infer.add_raw_input_contents();
  if (const Json* name = Member(input, "name")) {
    ATTN_ASSIGN_OR_RETURN(*tensor->mutable_name(), StringAt(*name, path + ".name"));
  } else {
    return Invalid(absl::StrCat(path, ".name is missing"));
  }
  if (const Json* datatype = Member(input, "datatype")) {
    ATTN_ASSIGN_OR_RETURN(*tensor->mutable_datatype(),
                          StringAt(*datatype, path + ".datatype"));
  } else {
    return Invalid(absl::StrCat(path, ".datatype is missing"));
  }
  const Json* shape = Member(input, "shape");
  if (shape == nullptr) return Invalid(absl::StrCat(path, ".shape is missing"));
  ATTN_RETURN_IF_ERROR(ArrayAt(*shape, path + ".shape"));
  for (size_t i = 0; i < shape->size(); ++i) {
    ATTN_ASSIGN_OR_RETURN(const int64_t dim,
                          CountAt((*shape)[i], absl::StrCat(path, ".shape[", i, "]")));
    tensor->add_shape(dim);
  }
  if (const Json* parameters = Member(input, "parameters")) {
    ATTN_RETURN_IF_ERROR(ObjectAt(*parameters, path + ".parameters"));
    if (const Json* size = Member(*parameters, "binary_data_size")) {
      const std::string field = path + ".parameters.binary_data_size";
      ATTN_ASSIGN_OR_RETURN(const int64_t bytes, CountAt(*size, field));
      if (bytes > static_cast<int64_t>(binary.size())) {
        return Invalid(absl::StrCat(field, " is ", bytes, ", more than the ",
                                    binary.size(), " binary bytes left in the body"));
      }
      if (Member(input, "data") != nullptr) {
        return Invalid(absl::StrCat(path, " has both data and binary_data_size"));
      }
      // The one copy of a binary input: body -> request.
      raw->assign(binary.data(), static_cast<size_t>(bytes));
      binary.remove_prefix(static_cast<size_t>(bytes));
      return absl::OkStatus();
    }
  }
  const Json* data = Member(input, "data");
  if (data == nullptr) {
    return Invalid(absl::StrCat(path, " needs data or parameters.binary_data_size"));
  }
  if (tensor->datatype() == "BYTES") return FlattenStrings(*data, path + ".data", *raw);
  if (tensor->datatype() == "INT64" || tensor->datatype() == "INT32") {
    return FlattenIntegers(*data, path + ".data", tensor->datatype() == "INT64" ? 64 : 32,
                           *raw);
  }
  std::vector<float> values;
  ATTN_RETURN_IF_ERROR(Flatten(*data, path + ".data", values));
  if (tensor->datatype() == "BF16") {
    raw->resize(values.size() * 2);
    for (size_t j = 0; j < values.size(); ++j) {
      const uint16_t bits = core::FloatToBf16(values[j]);
      std::memcpy(raw->data() + 2 * j, &bits, 2);
    }
  } else {
    // FP32, or a datatype the model's checks refuse later with the same words as the
    // other doors.
    raw->assign(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  }
  return absl::OkStatus();
}

// One element of "outputs".
absl::Status ReadOutput(const Json& output, const std::string& path,
                        HttpInferRequest& request) {
  ATTN_RETURN_IF_ERROR(ObjectAt(output, path));
  auto* requested = request.infer.add_outputs();
  const Json* name = Member(output, "name");
  if (name == nullptr) return Invalid(absl::StrCat(path, ".name is missing"));
  ATTN_ASSIGN_OR_RETURN(*requested->mutable_name(), StringAt(*name, path + ".name"));
  if (const Json* parameters = Member(output, "parameters")) {
    ATTN_RETURN_IF_ERROR(ObjectAt(*parameters, path + ".parameters"));
    if (const Json* binary = Member(*parameters, "binary_data")) {
      ATTN_ASSIGN_OR_RETURN(const bool wanted,
                            BoolAt(*binary, path + ".parameters.binary_data"));
      request.binary_outputs |= wanted;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> ParseHeaderLength(const char* value) {
  if (value == nullptr) return -1;
  int64_t length = -1;
  if (!absl::SimpleAtoi(value, &length) || length < 0) {
    return Invalid(absl::StrCat(
        "Inference-Header-Content-Length must be a non-negative byte count, got \"",
        absl::CHexEscape(value), "\""));
  }
  return length;
}

absl::StatusOr<HttpInferRequest> ParseInferBody(absl::string_view model,
                                                absl::string_view version,
                                                absl::string_view body,
                                                int64_t header_length) {
  if (header_length > static_cast<int64_t>(body.size())) {
    return Invalid(absl::StrCat("Inference-Header-Content-Length ", header_length,
                                " is more than the body's ", body.size(), " bytes"));
  }
  const absl::string_view header =
      header_length >= 0 ? body.substr(0, static_cast<size_t>(header_length)) : body;
  absl::string_view binary =
      header_length >= 0 ? body.substr(static_cast<size_t>(header_length)) : "";
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseJsonBody(header));
  ATTN_RETURN_IF_ERROR(ObjectAt(json, "the body"));

  HttpInferRequest request;
  inference::ModelInferRequest& infer = request.infer;
  infer.set_model_name(std::string(model));
  infer.set_model_version(std::string(version));
  if (const Json* id = Member(json, "id")) {
    ATTN_ASSIGN_OR_RETURN(*infer.mutable_id(), StringAt(*id, "id"));
  }
  if (const Json* parameters = Member(json, "parameters")) {
    ATTN_RETURN_IF_ERROR(ObjectAt(*parameters, "parameters"));
    for (const auto& [name, value] : parameters->items()) {
      const std::string path = absl::StrCat("parameters.", name);
      if (name == "binary_data_output") {
        ATTN_ASSIGN_OR_RETURN(const bool wanted, BoolAt(value, path));
        request.binary_outputs |= wanted;
        continue;
      }
      ATTN_RETURN_IF_ERROR(
          ToParameter(value, path, &(*infer.mutable_parameters())[name]));
    }
  }
  const Json* inputs = Member(json, "inputs");
  if (inputs == nullptr) return Invalid("inputs is missing");
  ATTN_RETURN_IF_ERROR(ArrayAt(*inputs, "inputs"));
  for (size_t i = 0; i < inputs->size(); ++i) {
    ATTN_RETURN_IF_ERROR(
        ReadInput((*inputs)[i], absl::StrCat("inputs[", i, "]"), binary, infer));
  }
  if (const Json* outputs = Member(json, "outputs")) {
    ATTN_RETURN_IF_ERROR(ArrayAt(*outputs, "outputs"));
    for (size_t i = 0; i < outputs->size(); ++i) {
      ATTN_RETURN_IF_ERROR(
          ReadOutput((*outputs)[i], absl::StrCat("outputs[", i, "]"), request));
    }
  }
  if (!binary.empty()) {
    return Invalid(absl::StrCat("the body has ", binary.size(),
                                " binary bytes that no input's binary_data_size claims"));
  }
  return request;
}

std::string InferResponseBody(const inference::ModelInferResponse& response, bool binary,
                              int64_t* header_length) {
  Json json = {{"model_name", response.model_name()},
               {"model_version", response.model_version()},
               {"outputs", Json::array()}};
  if (!response.id().empty()) json["id"] = response.id();
  size_t blob_bytes = 0;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& output = response.outputs(i);
    const std::string& raw = response.raw_output_contents(i);
    Json entry = {
        {"name", output.name()},
        {"datatype", output.datatype()},
        {"shape", std::vector<int64_t>(output.shape().begin(), output.shape().end())}};
    if (binary) {
      entry["parameters"] = {{"binary_data_size", raw.size()}};
      blob_bytes += raw.size();
    } else if (output.datatype() == "INT64") {
      std::vector<int64_t> values(raw.size() / 8);
      if (!values.empty()) std::memcpy(values.data(), raw.data(), values.size() * 8);
      entry["data"] = std::move(values);
    } else if (output.datatype() == "INT8" || output.datatype() == "UINT8") {
      std::vector<int> values(raw.size());
      const bool is_signed = output.datatype() == "INT8";
      for (size_t j = 0; j < raw.size(); ++j) {
        values[j] = is_signed ? static_cast<int>(static_cast<int8_t>(raw[j]))
                              : static_cast<int>(static_cast<uint8_t>(raw[j]));
      }
      entry["data"] = std::move(values);
    } else if (output.datatype() == "BF16") {
      std::vector<float> values(raw.size() / 2);
      for (size_t j = 0; j < values.size(); ++j) {
        uint16_t bits;
        std::memcpy(&bits, raw.data() + 2 * j, 2);
        values[j] = core::Bf16ToFloat(bits);
      }
      entry["data"] = std::move(values);
    } else {
      std::vector<float> values(raw.size() / 4);
      if (!values.empty()) std::memcpy(values.data(), raw.data(), values.size() * 4);
      entry["data"] = std::move(values);
    }
    json["outputs"].push_back(std::move(entry));
  }
  std::string body = JsonText(json);
  *header_length = binary ? static_cast<int64_t>(body.size()) : -1;
  if (binary) {
    body.reserve(body.size() + blob_bytes);
    for (int i = 0; i < response.outputs_size(); ++i) {
      body += response.raw_output_contents(i);
    }
  }
  return body;
}

std::string JsonText(const nlohmann::json& json) {
  return json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string JsonExcerpt(const Json& value) {
  std::string text = JsonText(value);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

absl::Status HeadMaskAt(const Json& value, v1::EncodeRequest* encode) {
  const auto add = [&](const Json& factor) {
    const std::optional<double> number = core::JsonNumber(factor);
    if (!number) {
      return Invalid(absl::StrCat("head_mask must hold numbers ([layers][heads]), got ",
                                  JsonExcerpt(factor)));
    }
    encode->add_head_mask(static_cast<float>(*number));
    return absl::OkStatus();
  };
  if (!value.is_array()) {
    return Invalid(
        absl::StrCat("head_mask must be a list of one list of factors per layer, got ",
                     JsonExcerpt(value)));
  }
  for (const Json& row : value) {
    if (!row.is_array()) {
      ATTN_RETURN_IF_ERROR(add(row));
      continue;
    }
    for (const Json& factor : row) ATTN_RETURN_IF_ERROR(add(factor));
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> ParseJsonBody(absl::string_view text) {
  if (const int depth = core::JsonNestingDepth(text, kMaxJsonDepth);
      depth > kMaxJsonDepth) {
    return Invalid(
        absl::StrCat("the JSON body nests more than ", kMaxJsonDepth, " levels deep"));
  }
  Json json = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return Invalid("the body is not valid JSON");
  return json;
}

absl::StatusOr<Json> ParseJsonObjectBody(absl::string_view text) {
  ATTN_ASSIGN_OR_RETURN(Json json, ParseJsonBody(text));
  if (!json.is_object()) {
    return Invalid(
        absl::StrCat("the body must be a JSON object, got ", JsonExcerpt(json)));
  }
  return json;
}

std::string ErrorBody(absl::string_view message) {
  return JsonText(Json{{"error", std::string(message)}});
}

namespace {

// A repository request's body: a JSON object, or {} when empty.
absl::StatusOr<Json> ParseObjectBody(absl::string_view body) {
  if (body.empty()) return Json::object();
  return ParseJsonObjectBody(body);
}

}  // namespace

absl::StatusOr<bool> ParseRepositoryIndexBody(absl::string_view body) {
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseObjectBody(body));
  bool ready = false;
  for (const auto& [key, value] : json.items()) {
    if (key != "ready") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown field \"", key, "\" in the index request (fields: ready)"));
    }
    const auto* flag = value.get_ptr<const Json::boolean_t*>();
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("ready must be a boolean, got ", JsonExcerpt(value)));
    }
    ready = *flag;
  }
  return ready;
}

absl::StatusOr<std::optional<std::string>> ParseRepositoryLoadBody(absl::string_view body,
                                                                   bool load) {
  ATTN_ASSIGN_OR_RETURN(const Json json, ParseObjectBody(body));
  std::optional<std::string> config;
  for (const auto& [key, value] : json.items()) {
    if (key != "parameters") {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown field \"", key, "\" in the request (fields: parameters)"));
    }
    if (!value.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameters must be a JSON object, got ", JsonExcerpt(value)));
    }
    for (const auto& [name, parameter] : value.items()) {
      // tritonclient sends unload_dependents; attnserve's models have none.
      if (!load && name == "unload_dependents" && parameter.is_boolean()) continue;
      if (!load || name != "config") {
        return absl::InvalidArgumentError(absl::StrCat(
            "unknown parameter \"", name, "\" (",
            load ? "load takes: config" : "unload takes: unload_dependents, a bool",
            ")"));
      }
      const auto* text = parameter.get_ptr<const Json::string_t*>();
      if (text == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameters.config must be a string holding the ModelConfig as JSON, got ",
            JsonExcerpt(parameter)));
      }
      config = *text;
    }
  }
  return config;
}

}  // namespace attnserve::server
