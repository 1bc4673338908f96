// NumPy .npy files of float32 (dtype '<f4', C order), so Python users can hand arrays to
// attnctl and read its results with numpy.load.
#ifndef ATTNSERVE_CLIENT_NPY_H_
#define ATTNSERVE_CLIENT_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace attnserve::client {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major, product(shape) entries
};

// Parses .npy bytes (format versions 1.0, 2.0 and 3.0). InvalidArgument, naming the
// problem, for: a bad magic string, an unsupported version, a malformed header, a dtype
// other than little-endian float32 ('<f4'), Fortran order, or data shorter or longer
// than the shape needs.
absl::StatusOr<NpyArray> ParseNpy(const std::string& bytes);

// Reads `path`; NotFound when it cannot be opened, else as ParseNpy with the path named.
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// Version 1.0 '<f4' C-order bytes of `values` with `shape`. REQUIRES: product(shape) ==
// values.size().
std::string SerializeNpy(absl::Span<const int64_t> shape, absl::Span<const float> values);

// Writes SerializeNpy(...) to `path`; Internal (naming the path) when it cannot.
absl::Status WriteNpy(const std::string& path, absl::Span<const int64_t> shape,
                      absl::Span<const float> values);

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_NPY_H_
