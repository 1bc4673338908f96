#include "core/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/bfloat16.h"
#include "core/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace attnserve::core {

namespace {

// Headers larger than this are refused before anything is allocated for them; the
// reference implementation uses the same 100 MB bound.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr int kMaxJsonDepth = 16;

using Json = nlohmann::json;

// A SAX pass over the header for what nlohmann's DOM parser leaves to its user: nesting
// depth and duplicate keys (the DOM keeps the last one silently). It builds nothing;
// key sets are per open object, so the pass is O(n log n). (nlohmann's callback parser
// would do the same checks but rescans the parent object at every child's end: O(n^2).)
class HeaderChecker : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open_objects_.emplace_back();
    return Enter();
  }
  bool key(string_t& key) override {
    if (!open_objects_.back().insert(key).second) {
      error_ = absl::StrCat("malformed JSON header: duplicate key '", key, "'");
      return false;
    }
    return true;
  }
  bool end_object() override {
    open_objects_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return Enter(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& error) override {
    error_ = position > input_size_
                 ? absl::StrCat("malformed JSON header: unexpected end of header (",
                                input_size_, " bytes)")
                 : absl::StrCat("malformed JSON header at byte ", position, ": ",
                                error.what());
    return false;
  }

  explicit HeaderChecker(size_t input_size) : input_size_(input_size) {}
  const std::string& error() const { return error_; }

 private:
  bool Enter() {
    if (++depth_ > kMaxJsonDepth) {
      error_ = absl::StrCat("malformed JSON header: nesting too deep (over ",
                            kMaxJsonDepth, " levels)");
      return false;
    }
    return true;
  }

  const size_t input_size_;
  int depth_ = 0;
  std::vector<std::set<std::string>> open_objects_;
  std::string error_;
};

// Parses the header with nlohmann::json (Debian's nlohmann-json3) after HeaderChecker
// accepted it.
absl::StatusOr<Json> ParseHeader(absl::string_view text) {
  HeaderChecker checker(text.size());
  if (!Json::sax_parse(text.begin(), text.end(), &checker)) {
    return absl::InvalidArgumentError(checker.error());
  }
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed JSON header: ", error.what()));
  }
}

absl::StatusOr<int64_t> NonNegativeInteger(const Json& value, absl::string_view what) {
  // Integers parse as unsigned when non-negative; anything else (negative, fractional,
  // beyond 2^64, not a number) is refused.
  if (!value.is_number_unsigned() ||
      value.get<uint64_t>() >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a non-negative integer"));
  }
  return static_cast<int64_t>(value.get<uint64_t>());
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

absl::StatusOr<uint64_t> SafetensorsFile::HeaderSize(absl::string_view head,
                                                     uint64_t total) {
  if (total < 8 || head.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncated file: ", total,
                     " bytes is shorter than the 8-byte header length field"));
  }
  const uint64_t header_size = ReadLittleEndian64(head.data());
  if (header_size > total - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", header_size, " runs past the end of the file (",
                     total - 8, " bytes follow the length field)"));
  }
  if (header_size > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header length ", header_size, " exceeds the limit of ", kMaxHeaderBytes));
  }
  return header_size;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::ParseView(absl::string_view head,
                                                           uint64_t total) {
  ATTN_ASSIGN_OR_RETURN(const uint64_t header_size, HeaderSize(head, total));
  if (head.size() < 8 + header_size) {
    return absl::InternalError("the header was not read whole");  // callers read it
  }
  ATTN_ASSIGN_OR_RETURN(const Json header, ParseHeader(head.substr(8, header_size)));
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        "malformed JSON header: top level is not an object");
  }

  SafetensorsFile file;
  file.data_offset_ = 8 + header_size;
  const uint64_t data_size = total - file.data_offset_;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError("__metadata__ must be an object of strings");
      }
      for (const auto& [key, entry] : value.items()) {
        if (!entry.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("__metadata__ value for '", key, "' must be a string"));
        }
        file.metadata_[key] = entry.get<std::string>();
      }
      continue;
    }
    // A structured binding cannot be captured in C++17; name it first.
    const std::string& tensor_name = name;
    const auto invalid = [&tensor_name](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensor_name, "': ", what));
    };
    if (!value.is_object()) return invalid("entry is not an object");
    const auto dtype = value.find("dtype");
    const auto shape = value.find("shape");
    const auto offsets = value.find("data_offsets");
    if (dtype == value.end() || !dtype->is_string()) {
      return invalid("missing string field 'dtype'");
    }
    if (shape == value.end() || !shape->is_array()) {
      return invalid("missing array field 'shape'");
    }
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2) {
      return invalid("missing field 'data_offsets' of two integers");
    }
    Tensor tensor;
    tensor.dtype = dtype->get<std::string>();
    const int64_t element_size = SafetensorsDtypeSize(tensor.dtype);
    if (element_size == 0) {
      return invalid(absl::StrCat("unknown dtype '", tensor.dtype, "'"));
    }
    // Element count with overflow checks: a hostile shape must not wrap around.
    uint64_t elements = 1;
    for (const Json& dim : *shape) {
      ATTN_ASSIGN_OR_RETURN(const int64_t size, NonNegativeInteger(dim, "shape entry"));
      tensor.shape.push_back(size);
      if (size != 0 && elements > std::numeric_limits<uint64_t>::max() / 16 /
                                      static_cast<uint64_t>(size)) {
        return invalid("shape too large");
      }
      elements *= static_cast<uint64_t>(size);
    }
    ATTN_ASSIGN_OR_RETURN(const int64_t begin,
                          NonNegativeInteger((*offsets)[0], "data_offsets[0]"));
    ATTN_ASSIGN_OR_RETURN(const int64_t end,
                          NonNegativeInteger((*offsets)[1], "data_offsets[1]"));
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

  // As the format requires: the tensors, in offset order, tile the data section exactly
  // (no overlap, no gap, no trailing bytes).
  std::vector<std::pair<const std::string*, const Tensor*>> by_offset;
  for (const auto& [name, tensor] : file.tensors_) by_offset.emplace_back(&name, &tensor);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second->data_begin, a.second->data_end) <
           std::make_pair(b.second->data_begin, b.second->data_end);
  });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const auto& [name, tensor] : by_offset) {
    if (tensor->data_begin < covered) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data_offsets of tensors '", *previous, "' and '", *name, "' overlap"));
    }
    if (tensor->data_begin > covered) {
      return absl::InvalidArgumentError(
          absl::StrCat("data_offsets leave bytes [", covered, ", ", tensor->data_begin,
                       ") before tensor '", *name, "' unused"));
    }
    covered = tensor->data_end;
    previous = name;
  }
  if (covered != data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the data section has ", data_size - covered,
                     " trailing bytes that no tensor's data_offsets cover"));
  }
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes) {
  ATTN_ASSIGN_OR_RETURN(SafetensorsFile file, ParseView(bytes, bytes.size()));
  file.owned_ = std::move(bytes);
  return file;
}

SafetensorsFile::OpenFile::~OpenFile() { close(fd); }

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  }
  auto file = std::make_shared<OpenFile>();
  file->fd = fd;
  file->path = path;
  struct stat info;
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    return absl::DataLossError(absl::StrCat(path, ": not a regular file"));
  }
  const auto total = static_cast<uint64_t>(info.st_size);
  // Only the header is read here; each tensor is read from the file when asked for
  // (ReadFloat32), so that loading never holds the file and the weights at once. A
  // file changed meanwhile is an error, never a crash (as a mapping's SIGBUS would be).
  const auto prefixed = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  };
  std::string head(static_cast<size_t>(std::min<uint64_t>(total, 8)), '\0');
  if (absl::Status read = file->ReadAt(0, head.size(), head.data()); !read.ok()) {
    return read;
  }
  absl::StatusOr<uint64_t> header_size = HeaderSize(head, total);
  if (!header_size.ok()) return prefixed(header_size.status());
  head.resize(static_cast<size_t>(8 + *header_size));
  if (absl::Status read = file->ReadAt(8, *header_size, head.data() + 8); !read.ok()) {
    return read;
  }
  absl::StatusOr<SafetensorsFile> parsed = ParseView(head, total);
  if (!parsed.ok()) return prefixed(parsed.status());
  parsed->file_ = std::move(file);
  return parsed;
}

absl::Status SafetensorsFile::OpenFile::ReadAt(uint64_t offset, uint64_t size,
                                               char* out) const {
  uint64_t done = 0;
  while (done < size) {
    const ssize_t got = pread(fd, out + done, static_cast<size_t>(size - done),
                              static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::DataLossError(absl::StrCat(
          path, ": could not read bytes [", offset + done, ", ", offset + size, ") (",
          got < 0 ? std::strerror(errno) : "the file ended there",
          "; was it changed while it was loading?)"));
    }
    done += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

absl::Status SafetensorsFile::ReadBytes(uint64_t offset, uint64_t size, char* out) const {
  if (file_ == nullptr) {
    std::memcpy(out, owned_.data() + data_offset_ + offset, static_cast<size_t>(size));
    return absl::OkStatus();
  }
  ATTN_RETURN_IF_ERROR(file_->ReadAt(data_offset_ + offset, size, out));
  // Read once: the page cache need not keep them.
  posix_fadvise(file_->fd, static_cast<off_t>(data_offset_ + offset),
                static_cast<off_t>(size), POSIX_FADV_DONTNEED);
  return absl::OkStatus();
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

absl::StatusOr<std::string> SafetensorsFile::Data(const Tensor& tensor) const {
  std::string bytes(static_cast<size_t>(tensor.data_end - tensor.data_begin), '\0');
  ATTN_RETURN_IF_ERROR(ReadBytes(tensor.data_begin, bytes.size(), bytes.data()));
  return bytes;
}

absl::StatusOr<const SafetensorsFile::Tensor*> SafetensorsFile::FindReadable(
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
  if (tensor->dtype != "F32" && tensor->dtype != "BF16") {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' has wrong dtype: expected F32 or BF16, found ",
                     tensor->dtype));
  }
  return tensor;
}

template <typename Stored, typename Out, typename Convert>
absl::StatusOr<std::vector<Out>> SafetensorsFile::ReadConverted(const Tensor& tensor,
                                                                Convert convert) const {
  const uint64_t bytes = tensor.data_end - tensor.data_begin;
  std::vector<Out> values(static_cast<size_t>(bytes / sizeof(Stored)));
  if constexpr (std::is_same_v<Stored, Out>) {
    // Straight into the values: no second copy of a big tensor (an embedding table).
    ATTN_RETURN_IF_ERROR(
        ReadBytes(tensor.data_begin, bytes, reinterpret_cast<char*>(values.data())));
  } else {
    // Through a bounded staging buffer, never a whole copy in the stored type.
    constexpr uint64_t kChunk = uint64_t{8} << 20;
    std::vector<Stored> chunk;
    for (uint64_t at = 0; at < bytes; at += kChunk) {
      const uint64_t size = std::min(kChunk, bytes - at);
      chunk.resize(static_cast<size_t>(size / sizeof(Stored)));
      ATTN_RETURN_IF_ERROR(
          ReadBytes(tensor.data_begin + at, size, reinterpret_cast<char*>(chunk.data())));
      Out* out = values.data() + at / sizeof(Stored);
      for (size_t i = 0; i < chunk.size(); ++i) out[i] = convert(chunk[i]);
    }
  }
  return values;
}

absl::StatusOr<std::vector<uint16_t>> SafetensorsFile::ReadBfloat16(
    absl::string_view name, absl::Span<const int64_t> expected_shape) const {
  ATTN_ASSIGN_OR_RETURN(const Tensor* tensor, FindReadable(name, expected_shape));
  if (tensor->dtype == "BF16") {
    return ReadConverted<uint16_t, uint16_t>(*tensor, [](uint16_t bits) { return bits; });
  }
  return ReadConverted<float, uint16_t>(*tensor, FloatToBf16);
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadFloat32(
    absl::string_view name, absl::Span<const int64_t> expected_shape) const {
  ATTN_ASSIGN_OR_RETURN(const Tensor* tensor, FindReadable(name, expected_shape));
  if (tensor->dtype == "F32") {
    return ReadConverted<float, float>(*tensor, [](float value) { return value; });
  }
  return ReadConverted<uint16_t, float>(*tensor, Bf16ToFloat);
}

}  // namespace attnserve::core
