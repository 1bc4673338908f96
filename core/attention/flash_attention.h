// FlashAttention on the CPU: softmax(Q K^T) V for every head of a list of sequences,
// one block of query rows against one block of keys at a time, with the softmax kept
// online (a running maximum and sum per row, the partial context rescaled as the maximum
// grows). The scores of one (query block, key block) pair live in a small per-thread
// buffer sized to the caches; no [L_q, L_k] matrix is ever formed.
//
// The work is split into (sequence, head, query block) items spread over OpenMP's
// threads, so two threads share the work at every length and every batch size. With a
// causal mask a query block reads only the key blocks up to its last row: the masked
// upper triangle costs nothing but the one diagonal block per query block. With a
// sliding window a query block reads only the key blocks that meet some row's window:
// a sequence of L tokens costs O(L (window + tile)) instead of O(L^2).
//
// The matrix products run through oneDNN's sgemm (one thread each; no primitive to
// create per shape), the exponentials through the widest vector unit the CPU has.
#ifndef ATTNSERVE_CORE_ATTENTION_FLASH_ATTENTION_H_
#define ATTNSERVE_CORE_ATTENTION_FLASH_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/attention/relative_bias.h"
#include "core/base/scratch_buffer.h"

namespace attnserve::core {

// Rows of Q and keys of K, V computed together. query_rows x keys floats of scores are
// one thread's working set beside its query rows and one key block of K and V.
struct FlashTiles {
  int64_t query_rows = 64;
  int64_t keys = 256;
};

// One sequence's f32 planes, row-major with `width` columns (the heads' head_dim-wide
// column slices side by side): q and context [query_length, width], k and v
// [key_length, width] (or FlashKv's kv_width). The 1/sqrt(head_dim) scale is already
// in q.
struct FlashSequence {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* context = nullptr;
  int64_t query_length = 0;
  int64_t key_length = 0;
};

// Grouped-query attention: K and V hold kv_width columns, and head p reads their
// column block kv_of[p]. Empty kv_of: head p reads block p of `width` columns.
struct FlashKv {
  absl::Span<const int64_t> kv_of;
  int64_t kv_width = 0;
};

// Per-thread buffers, kept between calls. Not thread-safe: one FlashAttention call at a
// time per object.
class FlashScratch {
 public:
  FlashScratch() = default;
  FlashScratch(const FlashScratch&) = delete;
  FlashScratch& operator=(const FlashScratch&) = delete;

 private:
  friend absl::Status FlashAttention(absl::Span<const FlashSequence>, int64_t, int64_t,
                                     int64_t, bool, const FlashTiles&, int, FlashScratch&,
                                     const RelativeBias&, absl::Span<const int64_t>,
                                     int64_t, const FlashKv&);
  std::vector<std::unique_ptr<ScratchBuffer>> per_thread_;
  ScratchBuffer
      packed_;  // every key/value head's keys and values, packed for the kernels
};

// Writes every sequence's context: for head p (columns [p head_dim, (p+1) head_dim)),
// softmax(q_p k_p^T) v_p, with key j > query i left out when `causal` (which then
// requires query_length == key_length). `threads` >= 1 OpenMP threads. `bias` (empty,
// or validated for the model's heads) is added to the scores, head p reading the table
// of model head bias_heads[p] (bias_heads: one per head; REQUIRES: each a head of the
// table). `window` > 0 leaves key j out of query i's softmax where |j - i| > window
// (with causal too: keys i - window..i), and skips the key blocks no row of a query
// block sees; 0: every key. InvalidArgument for tiles or dimensions < 1, heads *
// head_dim > width, a causal or windowed sequence whose lengths differ, a bias without a
// model head per head, or a window < 0, or a `kv` whose kv_of is not one block of
// kv_width per head; Internal when oneDNN's sgemm fails. With `kv` a key/value head is
// packed once for all the query heads that read it.
absl::Status FlashAttention(absl::Span<const FlashSequence> sequences, int64_t heads,
                            int64_t head_dim, int64_t width, bool causal,
                            const FlashTiles& tiles, int threads, FlashScratch& scratch,
                            const RelativeBias& bias = {},
                            absl::Span<const int64_t> bias_heads = {}, int64_t window = 0,
                            const FlashKv& kv = {});

// The vector unit the exponentials run on: "avx512f", "avx2" or "scalar".
std::string FlashVectorUnit();

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ATTENTION_FLASH_ATTENTION_H_
