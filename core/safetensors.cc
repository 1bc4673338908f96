#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/bfloat16.h"
#include "core/status_macros.h"
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

absl::StatusOr<SafetensorsFile> SafetensorsFile::ParseView(absl::string_view bytes) {
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
  ATTN_ASSIGN_OR_RETURN(const Json header,
                        ParseHeader(absl::string_view(bytes).substr(8, header_size)));
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        "malformed JSON header: top level is not an object");
  }

  SafetensorsFile file;
  file.data_offset_ = 8 + header_size;
  const uint64_t data_size = bytes.size() - file.data_offset_;
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
  ATTN_ASSIGN_OR_RETURN(SafetensorsFile file, ParseView(bytes));
  file.owned_ = std::move(bytes);
  return file;
}

SafetensorsFile::Mapping::~Mapping() { munmap(address, size); }

void SafetensorsFile::Release(absl::string_view range) const {
  if (mapping_ == nullptr || range.empty()) return;
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(range.data());
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + range.size()) / page * page;
  // Pages of a private read-only mapping: dropped, they are read from the file again
  // if ever touched.
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  struct stat info;
  if (fstat(fd, &info) != 0 || info.st_size < 0) {
    close(fd);
    return absl::DataLossError(absl::StrCat(path, ": cannot tell its size"));
  }
  const auto size = static_cast<size_t>(info.st_size);
  // Mapped, not read: the file's pages are the page cache's, read as the tensors are
  // converted and dropped once they have been (Release), so that loading does not hold
  // the file and the weights at once.
  void* address =
      size == 0 ? MAP_FAILED : mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (address == MAP_FAILED) {
    if (size == 0) return Parse(std::string());
    return absl::DataLossError(absl::StrCat(path, ": cannot map its ", size, " bytes"));
  }
  // Owned from here on (no temporary Mapping, whose destructor would unmap).
  std::shared_ptr<const Mapping> mapping(new Mapping{address, size});
  absl::StatusOr<SafetensorsFile> file =
      ParseView(absl::string_view(static_cast<const char*>(address), size));
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat(path, ": ", file.status().message()));
  }
  file->mapping_ = std::move(mapping);
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
  const absl::string_view bytes =
      mapping_ != nullptr
          ? absl::string_view(static_cast<const char*>(mapping_->address), mapping_->size)
          : absl::string_view(owned_);
  return bytes.substr(data_offset_ + tensor.data_begin,
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
  if (tensor->dtype != "F32" && tensor->dtype != "BF16") {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' has wrong dtype: expected F32 or BF16, found ",
                     tensor->dtype));
  }
  const size_t element = tensor->dtype == "F32" ? 4 : 2;
  std::vector<float> values(data.size() / element);
  // In chunks, each chunk's source pages released once converted: a big tensor (an
  // embedding table) is never held twice.
  constexpr size_t kChunk = size_t{8} << 20;
  for (size_t at = 0; at < data.size(); at += kChunk) {
    const absl::string_view chunk = data.substr(at, kChunk);
    float* out = values.data() + at / element;
    if (element == 4) {
      std::memcpy(out, chunk.data(), chunk.size());
    } else {
      for (size_t i = 0; i < chunk.size() / 2; ++i) {
        const uint16_t bits =
            static_cast<uint16_t>(static_cast<unsigned char>(chunk[2 * i]) |
                                  (static_cast<unsigned char>(chunk[2 * i + 1]) << 8));
        out[i] = Bf16ToFloat(bits);
      }
    }
    Release(chunk);
  }
  return values;
}

}  // namespace attnserve::core
