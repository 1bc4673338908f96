// Reading and writing the safetensors format: an 8-byte little-endian header length,
// a JSON header mapping tensor names to {dtype, shape, data_offsets}, then raw bytes.
// Every offset and size is checked before use, so a hostile file yields a Status,
// never an out-of-bounds read.
#ifndef ATTNSERVE_CORE_IO_SAFETENSORS_H_
#define ATTNSERVE_CORE_IO_SAFETENSORS_H_

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

// A parsed safetensors file: its bytes in memory (Parse) or an open file read per
// tensor (Read). Immutable after Parse/Read; safe to read from many threads.
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

  // Reads and parses the header of the file at `path`, which stays open: each tensor
  // is read from it when asked for, so that loading never holds the whole file beside
  // the weights. NotFound when it cannot be opened; DataLoss for what is not a regular
  // file or cannot be read; otherwise as Parse, with the path prefixed to the message.
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);

  // The tensor called `name`, or nullptr.
  const Tensor* Find(absl::string_view name) const;

  // Tensor names in sorted order.
  std::vector<std::string> Names() const;

  // A copy of the raw bytes of `tensor`; DataLoss when the file no longer holds them.
  // REQUIRES: `tensor` came from this object's Find().
  absl::StatusOr<std::string> Data(const Tensor& tensor) const;

  // Copies tensor `name` as float32, converting from F32 or BF16. `expected_shape`, when
  // not empty, must match exactly. NotFound (naming the tensor) when absent;
  // InvalidArgument for another dtype or a different shape (expected vs found);
  // DataLoss when a file from Read no longer holds the bytes (changed while loading).
  absl::StatusOr<std::vector<float>> ReadFloat32(
      absl::string_view name, absl::Span<const int64_t> expected_shape = {}) const;
  // The same as bfloat16 bits: BF16 copied, F32 rounded to nearest even through a
  // bounded staging buffer (never a float32 copy of the whole tensor). Errors as
  // ReadFloat32's.
  absl::StatusOr<std::vector<uint16_t>> ReadBfloat16(
      absl::string_view name, absl::Span<const int64_t> expected_shape = {}) const;

  // The "__metadata__" string map (empty when absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  // An open file, closed with its last holder.
  struct OpenFile {
    int fd = -1;
    std::string path;
    ~OpenFile();
    // Exactly `size` bytes at `offset` into `out`; DataLoss naming the range when the
    // file ends before them (changed while loading).
    absl::Status ReadAt(uint64_t offset, uint64_t size, char* out) const;
  };
  SafetensorsFile() = default;
  // The header's length from the file's first bytes (`head`, at least 8 of them) and its
  // size; InvalidArgument as Parse's.
  static absl::StatusOr<uint64_t> HeaderSize(absl::string_view head, uint64_t total);
  // Parse's checks, on `head` (the length field and the whole header) of a file of
  // `total` bytes.
  static absl::StatusOr<SafetensorsFile> ParseView(absl::string_view head,
                                                   uint64_t total);
  // The tensor `name` when present, of that shape (when given) and F32 or BF16;
  // ReadFloat32's errors otherwise.
  absl::StatusOr<const Tensor*> FindReadable(absl::string_view name,
                                             absl::Span<const int64_t> shape) const;
  // `tensor`'s values, stored as `Stored` (little-endian, as every dtype here), each
  // made an `Out` by `convert`: read straight into the values when the types are the
  // same, else through 8 MiB chunks (never a whole copy in the stored type).
  template <typename Stored, typename Out, typename Convert>
  absl::StatusOr<std::vector<Out>> ReadConverted(const Tensor& tensor,
                                                 Convert convert) const;
  // `size` bytes of the data section from `offset` into `out`.
  absl::Status ReadBytes(uint64_t offset, uint64_t size, char* out) const;

  // The file's bytes: owned (Parse), or read from the open file when asked for (Read).
  std::string owned_;
  std::shared_ptr<const OpenFile> file_;
  uint64_t data_offset_ = 0;  // where the data section starts in the bytes
  std::map<std::string, Tensor, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Bytes per element of a safetensors dtype name, or 0 when unknown.
int64_t SafetensorsDtypeSize(absl::string_view dtype);

// "[3, 4]"-style rendering of a shape, for messages.
std::string ShapeString(absl::Span<const int64_t> shape);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_IO_SAFETENSORS_H_
