#include "core/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/bfloat16.h"
#include "core/status_macros.h"

namespace attnserve::core {

namespace {

// Headers larger than this are refused before anything is allocated for them; the
// reference implementation uses the same 100 MB bound.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr int kMaxJsonDepth = 16;

// A minimal JSON value: enough for a safetensors header (objects, arrays, strings,
// integers, and the literals, which are parsed and then rejected where not expected).
struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;  // string contents, or the number's literal text
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;
};

// Recursive-descent parser over a bounded string; positions in errors are header bytes.
class JsonParser {
 public:
  explicit JsonParser(absl::string_view input) : input_(input) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    ATTN_RETURN_IF_ERROR(ParseValue(0, value));
    SkipSpace();
    if (pos_ != input_.size()) return Error("trailing characters after the value");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed JSON header at byte ", pos_, ": ", what));
  }

  void SkipSpace() {
    while (pos_ < input_.size() && (input_[pos_] == ' ' || input_[pos_] == '\t' ||
                                    input_[pos_] == '\n' || input_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(absl::string_view literal) {
    if (input_.substr(pos_, literal.size()) == literal) {
      pos_ += literal.size();
      return true;
    }
    return false;
  }

  absl::Status ParseValue(int depth, JsonValue& out) {
    if (depth > kMaxJsonDepth) return Error("nesting too deep");
    SkipSpace();
    if (pos_ >= input_.size()) return Error("unexpected end of header");
    const char c = input_[pos_];
    if (c == '{') return ParseObject(depth, out);
    if (c == '[') return ParseArray(depth, out);
    if (c == '"') {
      out.kind = JsonValue::Kind::kString;
      return ParseString(out.text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    if (Consume("true")) {
      out.kind = JsonValue::Kind::kBool;
      out.boolean = true;
      return absl::OkStatus();
    }
    if (Consume("false")) {
      out.kind = JsonValue::Kind::kBool;
      return absl::OkStatus();
    }
    if (Consume("null")) {
      out.kind = JsonValue::Kind::kNull;
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  absl::Status ParseObject(int depth, JsonValue& out) {
    out.kind = JsonValue::Kind::kObject;
    ++pos_;  // '{'
    SkipSpace();
    if (Consume("}")) return absl::OkStatus();
    while (true) {
      SkipSpace();
      if (pos_ >= input_.size() || input_[pos_] != '"') {
        return Error("expected a string key");
      }
      std::string key;
      ATTN_RETURN_IF_ERROR(ParseString(key));
      for (const auto& [existing, unused] : out.object) {
        if (existing == key) return Error(absl::StrCat("duplicate key \"", key, "\""));
      }
      SkipSpace();
      if (!Consume(":")) return Error("expected ':'");
      JsonValue value;
      ATTN_RETURN_IF_ERROR(ParseValue(depth + 1, value));
      out.object.emplace_back(std::move(key), std::move(value));
      SkipSpace();
      if (Consume(",")) continue;
      if (Consume("}")) return absl::OkStatus();
      return Error("expected ',' or '}'");
    }
  }

  absl::Status ParseArray(int depth, JsonValue& out) {
    out.kind = JsonValue::Kind::kArray;
    ++pos_;  // '['
    SkipSpace();
    if (Consume("]")) return absl::OkStatus();
    while (true) {
      JsonValue value;
      ATTN_RETURN_IF_ERROR(ParseValue(depth + 1, value));
      out.array.push_back(std::move(value));
      SkipSpace();
      if (Consume(",")) continue;
      if (Consume("]")) return absl::OkStatus();
      return Error("expected ',' or ']'");
    }
  }

  absl::Status ParseString(std::string& out) {
    ++pos_;  // opening quote
    while (pos_ < input_.size()) {
      const char c = input_[pos_++];
      if (c == '"') return absl::OkStatus();
      if (static_cast<unsigned char>(c) < 0x20) {
        return Error("control character in string");
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= input_.size()) break;
      const char escaped = input_[pos_++];
      switch (escaped) {
        case '"':
        case '\\':
        case '/':
          out.push_back(escaped);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          // Names in practice are ASCII; a \u escape is kept as its code point in UTF-8
          // for the basic plane, which is all a tensor name needs.
          if (pos_ + 4 > input_.size()) return Error("truncated \\u escape");
          uint32_t code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = input_[pos_++];
            code <<= 4;
            if (h >= '0' && h <= '9') {
              code |= h - '0';
            } else if (h >= 'a' && h <= 'f') {
              code |= h - 'a' + 10;
            } else if (h >= 'A' && h <= 'F') {
              code |= h - 'A' + 10;
            } else {
              return Error("bad hex digit in \\u escape");
            }
          }
          if (code < 0x80) {
            out.push_back(static_cast<char>(code));
          } else if (code < 0x800) {
            out.push_back(static_cast<char>(0xC0 | (code >> 6)));
            out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
          } else {
            out.push_back(static_cast<char>(0xE0 | (code >> 12)));
            out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
            out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
          }
          break;
        }
        default:
          return Error("unknown escape in string");
      }
    }
    return Error("unterminated string");
  }

  absl::Status ParseNumber(JsonValue& out) {
    const size_t start = pos_;
    while (pos_ < input_.size() &&
           (input_[pos_] == '-' || input_[pos_] == '+' || input_[pos_] == '.' ||
            input_[pos_] == 'e' || input_[pos_] == 'E' ||
            (input_[pos_] >= '0' && input_[pos_] <= '9'))) {
      ++pos_;
    }
    out.kind = JsonValue::Kind::kNumber;
    out.text = std::string(input_.substr(start, pos_ - start));
    double unused;
    if (!absl::SimpleAtod(out.text, &unused)) {
      pos_ = start;
      return Error("bad number");
    }
    return absl::OkStatus();
  }

  absl::string_view input_;
  size_t pos_ = 0;
};

absl::StatusOr<int64_t> NonNegativeInteger(const JsonValue& value,
                                           absl::string_view what) {
  int64_t result = 0;
  if (value.kind != JsonValue::Kind::kNumber || !absl::SimpleAtoi(value.text, &result) ||
      result < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a non-negative integer"));
  }
  return result;
}

uint64_t ReadLittleEndian64(const char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return value;
}

}  // namespace

int64_t SafetensorsDtypeSize(absl::string_view dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" ||
      dtype == "F8_E5M2") {
    return 1;
  }
  return 0;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<std::string> SerializeSafetensors(
    absl::Span<const SafetensorsEntry> entries) {
  std::vector<const SafetensorsEntry*> sorted;
  for (const auto& entry : entries) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
              return a->name < b->name;
            });
  std::string header = "{";
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const SafetensorsEntry& entry = *sorted[i];
    if (i > 0 && sorted[i - 1]->name == entry.name) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name '", entry.name, "'"));
    }
    const int64_t element_size = SafetensorsDtypeSize(entry.dtype);
    if (element_size == 0) {
      return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", entry.dtype,
                                                     "' for tensor '", entry.name, "'"));
    }
    int64_t elements = 1;
    for (int64_t dim : entry.shape) elements *= dim;
    if (static_cast<uint64_t>(elements * element_size) != entry.data.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", entry.name, "' has ", entry.data.size(),
                       " bytes, shape ", ShapeString(entry.shape), " of ", entry.dtype,
                       " needs ", elements * element_size));
    }
    if (i > 0) header += ",";
    absl::StrAppend(&header, "\"", entry.name, "\":{\"dtype\":\"", entry.dtype,
                    "\",\"shape\":[", absl::StrJoin(entry.shape, ","),
                    "],\"data_offsets\":[", offset, ",", offset + entry.data.size(),
                    "]}");
    offset += entry.data.size();
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  std::string out;
  out.reserve(8 + header.size() + offset);
  const uint64_t header_size = header.size();
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>((header_size >> (8 * i)) & 0xFF));
  out += header;
  for (const SafetensorsEntry* entry : sorted) out += entry->data;
  return out;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes) {
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated file: ", bytes.size(),
                     " bytes is shorter than the 8-byte header length field"));
  }
  const uint64_t header_size = ReadLittleEndian64(bytes.data());
  if (header_size > bytes.size() - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", header_size, " runs past the end of the file (",
                     bytes.size() - 8, " bytes follow the length field)"));
  }
  if (header_size > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header length ", header_size, " exceeds the limit of ", kMaxHeaderBytes));
  }
  JsonParser parser(absl::string_view(bytes).substr(8, header_size));
  ATTN_ASSIGN_OR_RETURN(JsonValue header, parser.ParseDocument());
  if (header.kind != JsonValue::Kind::kObject) {
    return absl::InvalidArgumentError(
        "malformed JSON header: top level is not an object");
  }

  SafetensorsFile file;
  file.data_offset_ = 8 + header_size;
  const uint64_t data_size = bytes.size() - file.data_offset_;
  for (auto& [name, value] : header.object) {
    if (name == "__metadata__") {
      if (value.kind != JsonValue::Kind::kObject) {
        return absl::InvalidArgumentError("__metadata__ must be an object of strings");
      }
      for (auto& [key, entry] : value.object) {
        if (entry.kind != JsonValue::Kind::kString) {
          return absl::InvalidArgumentError(
              absl::StrCat("__metadata__ value for '", key, "' must be a string"));
        }
        file.metadata_[key] = entry.text;
      }
      continue;
    }
    // A structured binding cannot be captured in C++17; name it first.
    const std::string& tensor_name = name;
    const auto invalid = [&tensor_name](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensor_name, "': ", what));
    };
    if (value.kind != JsonValue::Kind::kObject) return invalid("entry is not an object");
    const JsonValue* dtype = nullptr;
    const JsonValue* shape = nullptr;
    const JsonValue* offsets = nullptr;
    for (const auto& [key, field] : value.object) {
      if (key == "dtype") dtype = &field;
      if (key == "shape") shape = &field;
      if (key == "data_offsets") offsets = &field;
    }
    if (dtype == nullptr || dtype->kind != JsonValue::Kind::kString) {
      return invalid("missing string field 'dtype'");
    }
    if (shape == nullptr || shape->kind != JsonValue::Kind::kArray) {
      return invalid("missing array field 'shape'");
    }
    if (offsets == nullptr || offsets->kind != JsonValue::Kind::kArray ||
        offsets->array.size() != 2) {
      return invalid("missing field 'data_offsets' of two integers");
    }
    Tensor tensor;
    tensor.dtype = dtype->text;
    const int64_t element_size = SafetensorsDtypeSize(tensor.dtype);
    if (element_size == 0) {
      return invalid(absl::StrCat("unknown dtype '", tensor.dtype, "'"));
    }
    // Element count with overflow checks: a hostile shape must not wrap around.
    uint64_t elements = 1;
    for (const JsonValue& dim : shape->array) {
      ATTN_ASSIGN_OR_RETURN(const int64_t size, NonNegativeInteger(dim, "shape entry"));
      tensor.shape.push_back(size);
      if (size != 0 && elements > std::numeric_limits<uint64_t>::max() / 16 /
                                      static_cast<uint64_t>(size)) {
        return invalid("shape too large");
      }
      elements *= static_cast<uint64_t>(size);
    }
    ATTN_ASSIGN_OR_RETURN(const int64_t begin,
                          NonNegativeInteger(offsets->array[0], "data_offsets[0]"));
    ATTN_ASSIGN_OR_RETURN(const int64_t end,
                          NonNegativeInteger(offsets->array[1], "data_offsets[1]"));
    tensor.data_begin = static_cast<uint64_t>(begin);
    tensor.data_end = static_cast<uint64_t>(end);
    if (tensor.data_begin > tensor.data_end) {
      return invalid(absl::StrCat("data_offsets [", begin, ", ", end,
                                  ") are out of range: begin is past end"));
    }
    if (tensor.data_end > data_size) {
      return invalid(absl::StrCat("data_offsets [", begin, ", ", end,
                                  ") are out of range: the data section has only ",
                                  data_size, " bytes (truncated file?)"));
    }
    const uint64_t expected_bytes = elements * static_cast<uint64_t>(element_size);
    if (tensor.data_end - tensor.data_begin != expected_bytes) {
      return invalid(absl::StrCat("data_offsets [", begin, ", ", end, ") span ",
                                  tensor.data_end - tensor.data_begin,
                                  " bytes but shape ", ShapeString(tensor.shape), " of ",
                                  tensor.dtype, " needs ", expected_bytes));
    }
    file.tensors_.emplace(name, std::move(tensor));
  }

  // No two tensors may share bytes.
  std::vector<std::pair<const std::string*, const Tensor*>> by_offset;
  for (const auto& [name, tensor] : file.tensors_) {
    if (tensor.data_end > tensor.data_begin) by_offset.emplace_back(&name, &tensor);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return a.second->data_begin < b.second->data_begin;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i].second->data_begin < by_offset[i - 1].second->data_end) {
      return absl::InvalidArgumentError(absl::StrCat("data_offsets of tensors '",
                                                     *by_offset[i - 1].first, "' and '",
                                                     *by_offset[i].first, "' overlap"));
    }
  }
  file.bytes_ = std::move(bytes);
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  }
  std::ostringstream contents;
  contents << stream.rdbuf();
  absl::StatusOr<SafetensorsFile> file = Parse(std::move(contents).str());
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat(path, ": ", file.status().message()));
  }
  return file;
}

const SafetensorsFile::Tensor* SafetensorsFile::Find(absl::string_view name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, unused] : tensors_) names.push_back(name);
  return names;
}

absl::string_view SafetensorsFile::Data(const Tensor& tensor) const {
  return absl::string_view(bytes_).substr(data_offset_ + tensor.data_begin,
                                          tensor.data_end - tensor.data_begin);
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadFloat32(
    absl::string_view name, absl::Span<const int64_t> expected_shape) const {
  const Tensor* tensor = Find(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat("missing tensor '", name, "'"));
  }
  if (!expected_shape.empty() &&
      absl::Span<const int64_t>(tensor->shape) != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", name, "' has wrong shape: expected ", ShapeString(expected_shape),
        ", found ", ShapeString(tensor->shape)));
  }
  const absl::string_view data = Data(*tensor);
  std::vector<float> values;
  if (tensor->dtype == "F32") {
    values.resize(data.size() / 4);
    std::memcpy(values.data(), data.data(), data.size());
  } else if (tensor->dtype == "BF16") {
    values.resize(data.size() / 2);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t bits =
          static_cast<uint16_t>(static_cast<unsigned char>(data[2 * i]) |
                                (static_cast<unsigned char>(data[2 * i + 1]) << 8));
      values[i] = Bf16ToFloat(bits);
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' has wrong dtype: expected F32 or BF16, found ",
                     tensor->dtype));
  }
  return values;
}

}  // namespace attnserve::core
