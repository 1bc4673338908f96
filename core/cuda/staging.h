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
#include "core/attention/attention_backend.h"
#include "core/encoder/encoder_spec.h"

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

// Where one encoder batch's inputs sit in the CUDA encoder's staging buffer (byte
// offsets, each a multiple of StagingLayout::kAlignment).
struct EncoderStagingLayout {
  // int32 [tokens] each: the token ids, their types (0 when the batch has none) and
  // positions (from 0 in each sequence); no bytes with hidden states.
  size_t ids = 0, types = 0, positions = 0;
  size_t cu = 0;       // int32 [sequences + 1]: cumulative lengths
  size_t factors = 0;  // f32 [factor_count]: each layer's kept heads' factors
  size_t hidden = 0, hidden_bytes = 0;  // f32 [tokens, d] when the batch has them
  size_t total_bytes = 0;

  int sequences = 0;
  int64_t tokens = 0;
  int64_t max_length = 0;
  bool from_hidden = false;
};

// The layout for `batch` (already checked by CheckEncoderForward) and `factor_count`
// head factors. InvalidArgument when a count does not fit the kernels' 32-bit indexes
// (more than 2^31 - 1 tokens), naming it.
absl::StatusOr<EncoderStagingLayout> PlanEncoderStaging(const EncoderBatch& batch,
                                                        int64_t d_model,
                                                        int64_t factor_count);

// Writes `batch` into `staging` (at least layout.total_bytes) as `layout` says, ids,
// types and positions narrowed to int32; `factors` has factor_count values.
void PackEncoderStaging(const EncoderBatch& batch, const EncoderStagingLayout& layout,
                        absl::Span<const float> factors, uint8_t* staging);

}  // namespace attnserve::core::cuda

#endif  // ATTNSERVE_CORE_CUDA_STAGING_H_
