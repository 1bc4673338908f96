// Reading and writing the safetensors format: an 8-byte little-endian header length,
// a JSON header mapping tensor names to {dtype, shape, data_offsets}, then raw bytes.
// Every offset and size is checked before use, so a hostile file yields a Status,
// never an out-of-bounds read.
#ifndef ATTNSERVE_CORE_SAFETENSORS_H_
#define ATTNSERVE_CORE_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace attnserve::core {

// One tensor to write.
struct SafetensorsEntry {
  std::string name;
  // A safetensors dtype name: "F32", "BF16", "F16", "F64", "I64", "I32", "U8", ...
  std::string dtype;
  std::vector<int64_t> shape;
  // product(shape) * element size bytes, little-endian.
  std::string data;
};

// Serializes `entries` (names must be unique) into safetensors bytes. The header is
// padded with spaces to a multiple of 8 bytes, as the reference implementation does.
// Returns InvalidArgument on a duplicate name, an unknown dtype or a size mismatch.
absl::StatusOr<std::string> SerializeSafetensors(
    absl::Span<const SafetensorsEntry> entries);

// A parsed safetensors file held in memory. Immutable after Parse/Read; safe to read
// from many threads.
class SafetensorsFile {
 public:
  struct Tensor {
    std::string dtype;
    std::vector<int64_t> shape;
    // Byte range in the data section (already checked against its size).
    uint64_t data_begin = 0;
    uint64_t data_end = 0;
  };

  // Parses `bytes` (ownership taken). Errors (all InvalidArgument, message naming the
  // problem): fewer than 8 bytes, header length past end of file, malformed JSON, an
  // entry without dtype/shape/data_offsets, an unknown dtype, a negative dimension,
  // offsets out of range (a truncated file) or not matching shape*dtype, overlapping
  // offsets.
  static absl::StatusOr<SafetensorsFile> Parse(std::string bytes);

  // Maps and parses the file at `path` (read-only; the pages are read as tensors are).
  // NotFound when it cannot be opened; otherwise as Parse, with the path prefixed to
  // the message.
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);

  // The tensor called `name`, or nullptr.
  const Tensor* Find(absl::string_view name) const;

  // Tensor names in sorted order.
  std::vector<std::string> Names() const;

  // The raw bytes of `tensor`. REQUIRES: `tensor` came from this object's Find().
  absl::string_view Data(const Tensor& tensor) const;

  // Copies tensor `name` as float32, converting from F32 or BF16. `expected_shape`, when
  // not empty, must match exactly. NotFound (naming the tensor) when absent;
  // InvalidArgument for another dtype or a different shape (expected vs found). A
  // mapped file's pages of the tensor are released as they are converted (read again
  // from the file if the tensor is read again).
  absl::StatusOr<std::vector<float>> ReadFloat32(
      absl::string_view name, absl::Span<const int64_t> expected_shape = {}) const;

  // The "__metadata__" string map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  // A read-only private mapping of the file, unmapped with its last holder.
  struct Mapping {
    void* address;
    size_t size;
    ~Mapping();
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
  };
  SafetensorsFile() = default;
  // Parse's checks on `bytes`, which the caller then keeps alive in owned_ or mapping_.
  static absl::StatusOr<SafetensorsFile> ParseView(absl::string_view bytes);
  // Drops the mapped pages wholly inside `range` (nothing for owned bytes).
  void Release(absl::string_view range) const;

  // The file's bytes: owned (Parse) or mapped (Read).
  std::string owned_;
  std::shared_ptr<const Mapping> mapping_;
  uint64_t data_offset_ = 0;  // where the data section starts in the bytes
  std::map<std::string, Tensor, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Bytes per element of a safetensors dtype name, or 0 when unknown.
int64_t SafetensorsDtypeSize(absl::string_view dtype);

// "[3, 4]"-style rendering of a shape, for messages.
std::string ShapeString(absl::Span<const int64_t> shape);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_SAFETENSORS_H_
