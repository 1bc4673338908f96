#include "core/cuda/staging.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace attnserve::core::cuda {
namespace {

size_t Align(size_t offset) {
  return (offset + StagingLayout::kAlignment - 1) / StagingLayout::kAlignment *
         StagingLayout::kAlignment;
}

void WriteCumulative(absl::Span<const int64_t> lengths, uint8_t* out) {
  int32_t total = 0;
  std::memcpy(out, &total, sizeof(total));
  for (size_t i = 0; i < lengths.size(); ++i) {
    total += static_cast<int32_t>(lengths[i]);
    std::memcpy(out + (i + 1) * sizeof(total), &total, sizeof(total));
  }
}

}  // namespace

absl::StatusOr<StagingLayout> PlanStaging(const AttentionBatch& batch, int64_t d_model,
                                          int64_t computed_heads) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  StagingLayout layout;
  if (static_cast<int64_t>(batch.query_lengths.size()) >= kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("query_lengths holds ", batch.query_lengths.size(),
                     " sequences; the CUDA backend takes at most ", kMax - 1));
  }
  const bool cross = !batch.memory_lengths.empty();
  const absl::Span<const int64_t> key_lengths =
      cross ? batch.memory_lengths : batch.query_lengths;
  layout.sequences = static_cast<int>(batch.query_lengths.size());
  for (size_t i = 0; i < batch.query_lengths.size(); ++i) {
    layout.query_tokens += batch.query_lengths[i];
    layout.key_tokens += key_lengths[i];
    layout.max_query_length = std::max(layout.max_query_length, batch.query_lengths[i]);
    layout.max_key_length = std::max(layout.max_key_length, key_lengths[i]);
  }
  if (layout.query_tokens > kMax || layout.key_tokens > kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch holds ", std::max(layout.query_tokens, layout.key_tokens),
                     " tokens; the CUDA backend takes at most ", kMax));
  }
  layout.query_bf16 = !batch.query_bf16.empty();
  layout.query_bytes =
      static_cast<size_t>(layout.query_tokens * d_model) * (layout.query_bf16 ? 2 : 4);
  size_t offset = Align(layout.query_bytes);
  if (cross) {
    layout.memory_bf16 = !batch.memory_bf16.empty();
    layout.memory = offset;
    layout.memory_bytes =
        static_cast<size_t>(layout.key_tokens * d_model) * (layout.memory_bf16 ? 2 : 4);
    offset = Align(offset + layout.memory_bytes);
  }
  const size_t cumulative_bytes = (batch.query_lengths.size() + 1) * sizeof(int32_t);
  layout.cu_query = offset;
  offset = Align(offset + cumulative_bytes);
  layout.cu_key = offset;
  offset = Align(offset + cumulative_bytes);
  layout.factors = offset;
  layout.total_bytes =
      Align(offset + static_cast<size_t>(computed_heads) * sizeof(float));
  return layout;
}

void PackStaging(const AttentionBatch& batch, const StagingLayout& layout,
                 absl::Span<const float> factors, uint8_t* staging) {
  if (layout.query_bf16) {
    std::memcpy(staging + layout.query, batch.query_bf16.data(), layout.query_bytes);
  } else {
    std::memcpy(staging + layout.query, batch.query.data(), layout.query_bytes);
  }
  if (layout.memory_bytes > 0) {
    std::memcpy(staging + layout.memory,
                layout.memory_bf16 ? static_cast<const void*>(batch.memory_bf16.data())
                                   : static_cast<const void*>(batch.memory.data()),
                layout.memory_bytes);
  }
  WriteCumulative(batch.query_lengths, staging + layout.cu_query);
  WriteCumulative(
      batch.memory_lengths.empty() ? batch.query_lengths : batch.memory_lengths,
      staging + layout.cu_key);
  std::memcpy(staging + layout.factors, factors.data(), factors.size() * sizeof(float));
}

absl::StatusOr<EncoderStagingLayout> PlanEncoderStaging(const EncoderBatch& batch,
                                                        int64_t d_model,
                                                        int64_t factor_count) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  EncoderStagingLayout layout;
  for (const int64_t length : batch.lengths) {
    layout.tokens += length;
    layout.max_length = std::max(layout.max_length, length);
  }
  if (layout.tokens > kMax || static_cast<int64_t>(batch.lengths.size()) >= kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("the batch has ", layout.tokens, " tokens in ", batch.lengths.size(),
                     " sequences; the CUDA encoder takes at most ", kMax, " tokens and ",
                     kMax - 1, " sequences"));
  }
  layout.sequences = static_cast<int>(batch.lengths.size());
  layout.from_hidden = !batch.hidden_states.empty();
  const size_t index_bytes = layout.from_hidden ? 0 : layout.tokens * sizeof(int32_t);
  size_t offset = 0;
  const auto take = [&](size_t bytes) {
    const size_t at = offset;
    offset = Align(offset + bytes);
    return at;
  };
  layout.ids = take(index_bytes);
  layout.types = take(index_bytes);
  layout.positions = take(index_bytes);
  layout.cu = take((layout.sequences + 1) * sizeof(int32_t));
  layout.factors = take(static_cast<size_t>(factor_count) * sizeof(float));
  layout.hidden_bytes = layout.from_hidden
                            ? static_cast<size_t>(layout.tokens * d_model) * sizeof(float)
                            : 0;
  layout.hidden = take(layout.hidden_bytes);
  layout.total_bytes = offset;
  return layout;
}

void PackEncoderStaging(const EncoderBatch& batch, const EncoderStagingLayout& layout,
                        absl::Span<const float> factors, uint8_t* staging) {
  if (!layout.from_hidden) {
    auto* ids = reinterpret_cast<int32_t*>(staging + layout.ids);
    auto* types = reinterpret_cast<int32_t*>(staging + layout.types);
    auto* positions = reinterpret_cast<int32_t*>(staging + layout.positions);
    int64_t t = 0;
    for (const int64_t length : batch.lengths) {
      for (int64_t position = 0; position < length; ++position, ++t) {
        ids[t] = static_cast<int32_t>(batch.token_ids[t]);
        types[t] =
            batch.token_types.empty() ? 0 : static_cast<int32_t>(batch.token_types[t]);
        positions[t] = static_cast<int32_t>(position);
      }
    }
  } else {
    std::memcpy(staging + layout.hidden, batch.hidden_states.data(), layout.hidden_bytes);
  }
  WriteCumulative(batch.lengths, staging + layout.cu);
  std::memcpy(staging + layout.factors, factors.data(), factors.size() * sizeof(float));
}

}  // namespace attnserve::core::cuda
