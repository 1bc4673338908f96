// Row counts split into a bounded set of sizes.
//
// oneDNN primitives are made per shape, and a served batch has a new token count almost
// every time: made per exact count, the primitives of a minute of mixed traffic held
// tens of MiB of generated code and grew with the traffic. Row-wise operations (a
// matmul's rows, a layer norm, an elementwise add, a conversion) give the same result
// computed in consecutive chunks, so they run in chunks of a few sizes: powers of two
// from kRowChunkFloor up, then the rest (fewer than kRowChunkFloor rows) at once. The
// sizes are at most 2 log2(max rows) + kRowChunkFloor, and a chunk is never smaller than
// what was left when it was cut, halved.
#ifndef ATTNSERVE_CORE_BASE_ROW_CHUNKS_H_
#define ATTNSERVE_CORE_BASE_ROW_CHUNKS_H_

#include <cstdint>

#include "absl/numeric/bits.h"
#include "absl/status/status.h"

namespace attnserve::core {

inline constexpr int64_t kRowChunkFloor = 64;

// The next chunk's size when `left` rows remain (>= 1).
inline int64_t NextRowChunk(int64_t left) {
  if (left < kRowChunkFloor) return left;
  return static_cast<int64_t>(absl::bit_floor(static_cast<uint64_t>(left)));
}

// Calls fn(first_row, rows) over consecutive chunks covering [0, total), stopping at
// the first error.
template <typename Fn>
absl::Status ForEachRowChunk(int64_t total, Fn&& fn) {
  for (int64_t first = 0; first < total;) {
    const int64_t rows = NextRowChunk(total - first);
    absl::Status status = fn(first, rows);
    if (!status.ok()) return status;
    first += rows;
  }
  return absl::OkStatus();
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_BASE_ROW_CHUNKS_H_
