#include "client/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnserve::client {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("invalid .npy file: ", what));
}

// The value text of `key` in the header's Python dict literal, e.g. "'<f4'", "False",
// "(3, 4)".
absl::StatusOr<std::string> DictValue(absl::string_view header, absl::string_view key) {
  const std::string quoted = absl::StrCat("'", key, "'");
  const size_t at = header.find(quoted);
  if (at == absl::string_view::npos) {
    return Invalid(absl::StrCat("header has no '", key, "' entry"));
  }
  size_t start = header.find(':', at + quoted.size());
  if (start == absl::string_view::npos) return Invalid("malformed header dict");
  ++start;
  while (start < header.size() && header[start] == ' ') ++start;
  size_t end = start;
  if (end < header.size() && header[end] == '(') {
    end = header.find(')', end);
    if (end == absl::string_view::npos) return Invalid("unterminated shape tuple");
    ++end;
  } else if (end < header.size() && header[end] == '\'') {
    end = header.find('\'', end + 1);
    if (end == absl::string_view::npos) return Invalid("unterminated string in header");
    ++end;
  } else {
    while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  }
  return std::string(absl::StripAsciiWhitespace(header.substr(start, end - start)));
}

}  // namespace

absl::StatusOr<NpyArray> ParseNpy(const std::string& bytes) {
  if (bytes.size() < kMagicSize + 4 || bytes.compare(0, kMagicSize, kMagic) != 0) {
    return Invalid("bad magic (expected \\x93NUMPY at the start)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_size = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_size = static_cast<unsigned char>(bytes[8]) |
                  (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Invalid("truncated header");
    for (int i = 3; i >= 0; --i) {
      header_size = (header_size << 8) | static_cast<unsigned char>(bytes[8 + i]);
    }
    header_start = 12;
  } else {
    return Invalid(absl::StrCat("unsupported format version ", major));
  }
  if (header_start + header_size > bytes.size()) {
    return Invalid(absl::StrCat("truncated header: ", header_size, " bytes announced, ",
                                bytes.size() - header_start, " present"));
  }
  const absl::string_view header(bytes.data() + header_start, header_size);

  absl::StatusOr<std::string> descr = DictValue(header, "descr");
  if (!descr.ok()) return descr.status();
  if (*descr != "'<f4'") {
    return Invalid(absl::StrCat("dtype ", *descr,
                                " is not supported; expected little-endian float32 '<f4' "
                                "(numpy: array.astype('<f4'))"));
  }
  absl::StatusOr<std::string> fortran = DictValue(header, "fortran_order");
  if (!fortran.ok()) return fortran.status();
  if (*fortran != "False") {
    return Invalid(
        "Fortran-order arrays are not supported; save a C-order array "
        "(numpy: np.ascontiguousarray(array))");
  }
  absl::StatusOr<std::string> shape_text = DictValue(header, "shape");
  if (!shape_text.ok()) return shape_text.status();
  NpyArray array;
  const absl::string_view inner =
      absl::StripSuffix(absl::StripPrefix(*shape_text, "("), ")");
  int64_t elements = 1;
  for (absl::string_view part : absl::StrSplit(inner, ',', absl::SkipWhitespace())) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0 ||
        dim > (int64_t{1} << 40)) {
      return Invalid(absl::StrCat("bad shape ", *shape_text));
    }
    array.shape.push_back(dim);
    // Checked before multiplying: two dimensions of 2^40 would overflow int64.
    if (dim != 0 && elements > (int64_t{1} << 40) / dim)
      return Invalid("shape too large");
    elements *= dim;
  }
  const size_t data_start = header_start + header_size;
  const size_t expected = static_cast<size_t>(elements) * sizeof(float);
  if (bytes.size() - data_start != expected) {
    return Invalid(absl::StrCat(
        bytes.size() - data_start < expected ? "truncated: " : "", "shape ", *shape_text,
        " needs ", expected, " bytes of data, the file has ", bytes.size() - data_start));
  }
  array.values.resize(elements);
  // An empty array has no buffer: memcpy from or to null is undefined even for 0 bytes.
  if (expected > 0) std::memcpy(array.values.data(), bytes.data() + data_start, expected);
  return array;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << stream.rdbuf();
  absl::StatusOr<NpyArray> array = ParseNpy(contents.str());
  if (!array.ok()) {
    return absl::Status(array.status().code(),
                        absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

std::string SerializeNpy(absl::Span<const int64_t> shape,
                         absl::Span<const float> values) {
  std::string dict =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (",
                   absl::StrJoin(shape, ", "), shape.size() == 1 ? ",)" : ")", ", }");
  // Magic (6) + version (2) + length (2) + dict + padding + '\n' is a multiple of 64.
  const size_t unpadded = kMagicSize + 2 + 2 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string bytes(kMagic, kMagicSize);
  bytes.push_back('\x01');
  bytes.push_back('\x00');
  bytes.push_back(static_cast<char>(dict.size() & 0xFF));
  bytes.push_back(static_cast<char>(dict.size() >> 8));
  bytes += dict;
  bytes.append(reinterpret_cast<const char*>(values.data()),
               values.size() * sizeof(float));
  return bytes;
}

absl::Status WriteNpy(const std::string& path, absl::Span<const int64_t> shape,
                      absl::Span<const float> values) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  const std::string bytes = SerializeNpy(shape, values);
  stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!stream) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace attnserve::client
