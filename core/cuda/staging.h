// Where one batch's inputs sit in the CUDA backend's pinned staging buffer, which one
// host-to-device copy moves to the GPU as a whole. Plain C++ (no CUDA): the packing is
// tested on machines without a GPU.
#ifndef ATTNSERVE_CORE_CUDA_STAGING_H_
#define ATTNSERVE_CORE_CUDA_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/attention_backend.h"

namespace attnserve::core::cuda {

// Byte offsets into the staging buffer (and into its device copy), each a multiple of
// kStagingAlignment, and what the batch holds.
struct StagingLayout {
  static constexpr size_t kAlignment = 256;
  // Tokens as given (f32, or bf16 when the batch's *_bf16 spans are set).
  size_t query = 0, query_bytes = 0;
  bool query_bf16 = false;
  size_t memory = 0, memory_bytes = 0;  // memory_bytes 0 for self-attention
  bool memory_bf16 = false;
  // int32 [sequences + 1]: cumulative query lengths, and key lengths (the query's for
  // self-attention).
  size_t cu_query = 0, cu_key = 0;
  // f32 [computed heads]: each computed head's factor (1 without a head mask).
  size_t factors = 0;
  size_t total_bytes = 0;

  int sequences = 0;
  int64_t query_tokens = 0, key_tokens = 0;
  int64_t max_query_length = 0, max_key_length = 0;
};

// The layout for `batch` (already checked by CheckForwardArguments) with
// `computed_heads` heads. InvalidArgument when a count does not fit the kernels' 32-bit
// indexes (more than 2^31 - 1 tokens or sequences), naming it.
absl::StatusOr<StagingLayout> PlanStaging(const AttentionBatch& batch, int64_t d_model,
                                          int64_t computed_heads);

// Writes `batch` into `staging` (at least layout.total_bytes) as `layout` says;
// `factors` has one value per computed head.
void PackStaging(const AttentionBatch& batch, const StagingLayout& layout,
                 absl::Span<const float> factors, uint8_t* staging);

}  // namespace attnserve::core::cuda

#endif  // ATTNSERVE_CORE_CUDA_STAGING_H_
