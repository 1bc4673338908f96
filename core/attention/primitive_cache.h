// PrimitiveCache: a bounded least-recently-used map from a shape key to a oneDNN
// primitive, so that each shape's primitive is created once and reused.
#ifndef ATTNSERVE_CORE_ATTENTION_PRIMITIVE_CACHE_H_
#define ATTNSERVE_CORE_ATTENTION_PRIMITIVE_CACHE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <unordered_map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "dnnl.hpp"

namespace attnserve::core {

// What a primitive computes; part of the key.
enum class PrimitiveKind : int32_t {
  kProjection,      // [rows, in] x [in, out] + bias, out in the compute precision
  kOutProjection,   // the same, out in f32
  kScores,          // per head group and row block: Q K^T
  kSoftmax,         // per head group and row block: softmax over keys
  kContext,         // per head group and row block: P V
  kConvert,         // f32 to the compute precision
  kInt8Projection,  // [rows, in] u8 x packed [in, out] s8 -> [rows, out] s32
  // The encoder's (TransformerEncoder):
  kLinear,       // [rows, in] x packed [in, out] + bias (+ activation, + sum)
  kLayerNorm,    // [rows, width] layer normalization with scale and shift
  kAdd,          // [rows, width] + [rows, width]
  kActivation,   // an activation in place over [rows, width] (int8 feed-forward)
  kGateProduct,  // a gated feed-forward's act(gate) * input, dense [rows, width]
};

// A primitive's shape: what each kind's values mean is its creator's.
using PrimitiveDims = std::array<int64_t, 7>;

struct PrimitiveKey {
  PrimitiveKind kind = PrimitiveKind::kProjection;
  PrimitiveDims dims = {};

  bool operator==(const PrimitiveKey& other) const {
    return kind == other.kind && dims == other.dims;
  }
  template <typename H>
  friend H AbslHashValue(H state, const PrimitiveKey& key) {
    return H::combine(std::move(state), key.kind, key.dims);
  }
};

// A created primitive, the user scratchpad it needs, and its execution arguments:
// memory objects made on its first run and re-pointed (set_data_handle) on every later
// one, so that running a cached primitive allocates nothing.
struct CachedPrimitive {
  dnnl::primitive primitive;
  size_t scratchpad_bytes = 0;
  // Projections: the weights layout the primitive chose (format_tag::any).
  dnnl::memory::desc weights_desc;
  std::unordered_map<int, dnnl::memory> args;
};

// Not thread-safe: owned by one MultiHeadAttention (or TransformerEncoder), used by one
// thread at a time.
class PrimitiveCache {
 public:
  // REQUIRES: capacity >= 1.
  explicit PrimitiveCache(size_t capacity) : capacity_(capacity) {}

  // The primitive for `key`, calling `create` on a miss (and evicting the least
  // recently used entry when full). A failed `create` is returned and not cached.
  // The returned pointer is valid until the next call.
  absl::StatusOr<CachedPrimitive*> GetOrCreate(
      const PrimitiveKey& key,
      absl::FunctionRef<absl::StatusOr<CachedPrimitive>()> create);

  size_t size() const { return entries_.size(); }
  // Number of `create` calls so far (misses), for tests and metrics.
  int64_t creations() const { return creations_; }

 private:
  using Entry = std::pair<PrimitiveKey, CachedPrimitive>;

  size_t capacity_;
  int64_t creations_ = 0;
  std::list<Entry> entries_;  // most recently used first
  absl::flat_hash_map<PrimitiveKey, std::list<Entry>::iterator> index_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ATTENTION_PRIMITIVE_CACHE_H_
