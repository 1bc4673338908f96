#include "server/batching/attention_executor.h"

#include <cstdint>
#include <cstring>
#include <utility>

namespace attnserve::server {
namespace {

absl::Span<const float> PackFloats(const InputTensor& input,
                                   std::unique_ptr<float[]>& buffer) {
  buffer.reset(new float[static_cast<size_t>(input.elements())]);
  input.CopyTo(buffer.get());
  return absl::MakeConstSpan(buffer.get(), static_cast<size_t>(input.elements()));
}

absl::Span<const uint16_t> PackBits(const InputTensor& input,
                                    std::unique_ptr<uint16_t[]>& buffer) {
  buffer.reset(new uint16_t[static_cast<size_t>(input.elements())]);
  input.CopyBf16To(buffer.get());
  return absl::MakeConstSpan(buffer.get(), static_cast<size_t>(input.elements()));
}

}  // namespace

absl::Status AttentionExecutor::Pack(absl::Span<AttentionWork* const> batch) {
  const int64_t heads = attention_->spec().num_heads;
  const int64_t d_model = attention_->spec().d_model;
  packed_ = Packed();
  Packed& packed = packed_;
  int64_t tokens = 0, memory_tokens = 0, weights_size = 0;
  bool all_bf16 = true;
  for (AttentionWork* each : batch) {
    AttentionWork& work = *each;
    tokens += work.tokens();
    memory_tokens += work.memory.elements() / d_model;
    all_bf16 &= work.query.bf16() && (work.memory.empty() || work.memory.bf16());
    if (work.head_statistics) {
      // Alone in its batch (SharesBatchWith); the core keeps the weights it needs.
      packed.statistics_work = &work;
      work.output.clear();
      work.attention.clear();
      work.statistics.assign(static_cast<size_t>(heads), core::HeadStatistic());
    } else {
      work.output.resize(static_cast<size_t>(work.query.elements()) * sizeof(float));
    }
    if (work.return_attention) {
      const int64_t size =
          core::AttentionWeightsSize(heads, work.query_lengths, work.memory_lengths);
      work.attention.resize(static_cast<size_t>(size) * sizeof(float));
      weights_size += size;
    }
    packed.query_lengths.insert(packed.query_lengths.end(), work.query_lengths.begin(),
                                work.query_lengths.end());
    packed.memory_lengths.insert(packed.memory_lengths.end(), work.memory_lengths.begin(),
                                 work.memory_lengths.end());
  }
  const AttentionWork& first = *batch.front();
  packed.batch.query_lengths = packed.query_lengths;
  packed.batch.memory_lengths = packed.memory_lengths;
  packed.options.causal = first.causal;
  packed.options.head_mask = first.head_mask;

  if (batch.size() == 1) {
    AttentionWork& work = *batch.front();
    if (all_bf16) {
      packed.batch.query_bf16 = work.query.InPlaceBf16();
      if (packed.batch.query_bf16.empty()) {
        packed.batch.query_bf16 = PackBits(work.query, packed.query_bits);
      }
      if (!work.memory.empty()) {
        packed.batch.memory_bf16 = work.memory.InPlaceBf16();
        if (packed.batch.memory_bf16.empty()) {
          packed.batch.memory_bf16 = PackBits(work.memory, packed.memory_bits);
        }
      }
    } else {
      packed.batch.query = work.query.InPlace();
      if (packed.batch.query.empty()) {
        packed.batch.query = PackFloats(work.query, packed.query);
      }
      packed.batch.memory = work.memory.InPlace();
      if (packed.batch.memory.empty() && !work.memory.empty()) {
        packed.batch.memory = PackFloats(work.memory, packed.memory);
      }
    }
    packed.output = work.output_values();
    packed.weights = work.attention_values();
    return absl::OkStatus();
  }

  const auto query_count = static_cast<size_t>(tokens * d_model);
  const auto memory_count = static_cast<size_t>(memory_tokens * d_model);
  if (all_bf16) {
    packed.query_bits.reset(new uint16_t[query_count]);
    if (memory_count > 0) packed.memory_bits.reset(new uint16_t[memory_count]);
  } else {
    packed.query.reset(new float[query_count]);
    if (memory_count > 0) packed.memory.reset(new float[memory_count]);
  }
  int64_t query_offset = 0, memory_offset = 0;
  for (const AttentionWork* each : batch) {
    const AttentionWork& work = *each;
    if (all_bf16) {
      work.query.CopyBf16To(packed.query_bits.get() + query_offset);
      if (!work.memory.empty()) {
        work.memory.CopyBf16To(packed.memory_bits.get() + memory_offset);
      }
    } else {
      work.query.CopyTo(packed.query.get() + query_offset);
      if (!work.memory.empty()) work.memory.CopyTo(packed.memory.get() + memory_offset);
    }
    query_offset += work.query.elements();
    memory_offset += work.memory.elements();
  }
  if (all_bf16) {
    packed.batch.query_bf16 = absl::MakeConstSpan(packed.query_bits.get(), query_count);
    packed.batch.memory_bf16 =
        absl::MakeConstSpan(packed.memory_bits.get(), memory_count);
  } else {
    packed.batch.query = absl::MakeConstSpan(packed.query.get(), query_count);
    packed.batch.memory = absl::MakeConstSpan(packed.memory.get(), memory_count);
  }
  packed.output_buffer.reset(new float[query_count]);
  packed.output = absl::MakeSpan(packed.output_buffer.get(), query_count);
  if (weights_size > 0) {
    packed.weights_buffer.reset(new float[static_cast<size_t>(weights_size)]);
    packed.weights =
        absl::MakeSpan(packed.weights_buffer.get(), static_cast<size_t>(weights_size));
  }
  return absl::OkStatus();
}

absl::Status AttentionExecutor::Run() {
  if (AttentionWork* work = packed_.statistics_work; work != nullptr) {
    return attention_->HeadStatistics(packed_.batch, packed_.options.causal,
                                      absl::MakeSpan(work->statistics));
  }
  return attention_->Forward(packed_.batch, packed_.options, packed_.output,
                             packed_.weights);
}

void AttentionExecutor::Scatter(absl::Span<AttentionWork* const> batch, bool computed) {
  // A lone request was computed into its own buffers.
  if (computed && batch.size() > 1) {
    int64_t output_offset = 0, weights_offset = 0;
    for (AttentionWork* each : batch) {
      AttentionWork& work = *each;
      std::memcpy(work.output.data(), packed_.output.data() + output_offset,
                  work.output.size());
      if (!work.attention.empty()) {
        std::memcpy(work.attention.data(), packed_.weights.data() + weights_offset,
                    work.attention.size());
      }
      output_offset += static_cast<int64_t>(work.output.size() / sizeof(float));
      weights_offset += static_cast<int64_t>(work.attention.size() / sizeof(float));
    }
  }
  packed_ = Packed();
}

absl::StatusOr<std::unique_ptr<AttentionBatcher>> MakeAttentionBatcher(
    const BatchingOptions& options,
    const std::function<absl::StatusOr<std::unique_ptr<core::AttentionBackend>>()>&
        make_attention) {
  return AttentionBatcher::Create(
      options, [&]() -> absl::StatusOr<std::unique_ptr<BatchExecutor<AttentionWork>>> {
        absl::StatusOr<std::unique_ptr<core::AttentionBackend>> attention =
            make_attention();
        if (!attention.ok()) return attention.status();
        return std::make_unique<AttentionExecutor>(std::move(attention).value());
      });
}

}  // namespace attnserve::server
