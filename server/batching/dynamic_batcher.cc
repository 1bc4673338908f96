#include "server/batching/dynamic_batcher.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/bfloat16.h"

namespace attnserve::server {

absl::StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(
    const Options& options,
    const std::function<absl::StatusOr<std::unique_ptr<core::AttentionBackend>>()>&
        make_attention) {
  if (absl::Status status = CheckBatchingOptions(options); !status.ok()) return status;
  std::unique_ptr<DynamicBatcher> batcher(new DynamicBatcher(options));
  for (int i = 0; i < options.instances; ++i) {
    absl::StatusOr<std::unique_ptr<core::AttentionBackend>> attention = make_attention();
    if (!attention.ok()) return attention.status();
    batcher->attention_.push_back(std::move(attention).value());
    if (options.observer.on_device_memory) {
      options.observer.on_device_memory(
          i, batcher->attention_.back()->device_memory_bytes());
    }
  }
  DynamicBatcher* self = batcher.get();
  absl::StatusOr<std::unique_ptr<BatchScheduler<AttentionWork>>> scheduler =
      BatchScheduler<AttentionWork>::Create(
          options, [self](int instance, absl::Span<AttentionWork* const> batch) {
            core::AttentionBackend* attention = self->attention_[instance].get();
            const absl::Status status = self->RunBatch(attention, batch);
            if (self->options_.observer.on_device_memory) {
              self->options_.observer.on_device_memory(instance,
                                                       attention->device_memory_bytes());
            }
            return status;
          });
  if (!scheduler.ok()) return scheduler.status();
  batcher->scheduler_ = std::move(scheduler).value();
  return batcher;
}

DynamicBatcher::~DynamicBatcher() { Shutdown(); }

absl::Status DynamicBatcher::RunBatch(core::AttentionBackend* attention,
                                      absl::Span<AttentionWork* const> batch) {
  const int batch_size = static_cast<int>(batch.size());
  const AttentionWork& first = *batch.front();
  const int64_t heads = attention->spec().num_heads;
  const int64_t d_model = attention->spec().d_model;

  // Each input is read once: a lone request is computed straight from its message's
  // bytes and into its own result buffers; otherwise the inputs are copied into one
  // packed buffer, never zero-filled first, and the packed results are copied once
  // into each request's result buffers. A batch whose inputs are all bf16 stays bf16
  // (a bf16 model computes on it as it is, an fp32 one widens it inside the core);
  // a mixed batch is widened to f32 while packing.
  std::vector<int64_t> query_lengths, memory_lengths;
  int64_t tokens = 0, memory_tokens = 0, weights_size = 0;
  bool all_bf16 = true;
  for (AttentionWork* each : batch) {
    AttentionWork& work = *each;
    work.batch_size = batch_size;
    tokens += work.tokens();
    memory_tokens += work.memory.elements() / d_model;
    all_bf16 &= work.query.bf16() && (work.memory.empty() || work.memory.bf16());
    if (!work.head_statistics) {
      work.output.resize(static_cast<size_t>(work.query.elements()) * sizeof(float));
    }
    if (work.return_attention) {
      const int64_t size =
          core::AttentionWeightsSize(heads, work.query_lengths, work.memory_lengths);
      work.attention.resize(static_cast<size_t>(size) * sizeof(float));
      weights_size += size;
    }
    query_lengths.insert(query_lengths.end(), work.query_lengths.begin(),
                         work.query_lengths.end());
    memory_lengths.insert(memory_lengths.end(), work.memory_lengths.begin(),
                          work.memory_lengths.end());
  }

  core::AttentionBatch packed{{}, query_lengths, {}, memory_lengths};
  core::AttentionOptions attention_options;
  attention_options.causal = first.causal;
  attention_options.head_mask = first.head_mask;
  absl::Span<float> output_span, weights_span;
  // Packed buffers, not zero-filled.
  std::unique_ptr<float[]> query, memory, output, weights;
  std::unique_ptr<uint16_t[]> query_bits, memory_bits;
  const auto pack = [](const InputTensor& input, std::unique_ptr<float[]>& buffer) {
    buffer.reset(new float[static_cast<size_t>(input.elements())]);
    input.CopyTo(buffer.get());
    return absl::MakeConstSpan(buffer.get(), static_cast<size_t>(input.elements()));
  };
  const auto pack_bits = [](const InputTensor& input,
                            std::unique_ptr<uint16_t[]>& buffer) {
    buffer.reset(new uint16_t[static_cast<size_t>(input.elements())]);
    input.CopyBf16To(buffer.get());
    return absl::MakeConstSpan(buffer.get(), static_cast<size_t>(input.elements()));
  };
  if (batch_size == 1) {
    AttentionWork& work = *batch.front();
    if (all_bf16) {
      packed.query_bf16 = work.query.InPlaceBf16();
      if (packed.query_bf16.empty())
        packed.query_bf16 = pack_bits(work.query, query_bits);
      if (!work.memory.empty()) {
        packed.memory_bf16 = work.memory.InPlaceBf16();
        if (packed.memory_bf16.empty()) {
          packed.memory_bf16 = pack_bits(work.memory, memory_bits);
        }
      }
    } else {
      packed.query = work.query.InPlace();
      if (packed.query.empty()) packed.query = pack(work.query, query);
      packed.memory = work.memory.InPlace();
      if (packed.memory.empty() && !work.memory.empty()) {
        packed.memory = pack(work.memory, memory);
      }
    }
    output_span = work.output_values();
    weights_span = work.attention_values();
  } else {
    const auto query_count = static_cast<size_t>(tokens * d_model);
    const auto memory_count = static_cast<size_t>(memory_tokens * d_model);
    if (all_bf16) {
      query_bits.reset(new uint16_t[query_count]);
      if (memory_count > 0) memory_bits.reset(new uint16_t[memory_count]);
    } else {
      query.reset(new float[query_count]);
      if (memory_count > 0) memory.reset(new float[memory_count]);
    }
    int64_t query_offset = 0, memory_offset = 0;
    for (const AttentionWork* each : batch) {
      const AttentionWork& work = *each;
      if (all_bf16) {
        work.query.CopyBf16To(query_bits.get() + query_offset);
        if (!work.memory.empty())
          work.memory.CopyBf16To(memory_bits.get() + memory_offset);
      } else {
        work.query.CopyTo(query.get() + query_offset);
        if (!work.memory.empty()) work.memory.CopyTo(memory.get() + memory_offset);
      }
      query_offset += work.query.elements();
      memory_offset += work.memory.elements();
    }
    if (all_bf16) {
      packed.query_bf16 = absl::MakeConstSpan(query_bits.get(), query_count);
      packed.memory_bf16 = absl::MakeConstSpan(memory_bits.get(), memory_count);
    } else {
      packed.query = absl::MakeConstSpan(query.get(), query_count);
      packed.memory = absl::MakeConstSpan(memory.get(), memory_count);
    }
    output.reset(new float[query_count]);
    output_span = absl::MakeSpan(output.get(), query_count);
    if (weights_size > 0) {
      weights.reset(new float[static_cast<size_t>(weights_size)]);
      weights_span = absl::MakeSpan(weights.get(), static_cast<size_t>(weights_size));
    }
  }
  const absl::Time compute_start = absl::Now();
  absl::Status status;
  if (first.head_statistics) {
    // Alone in its batch (SharesBatchWith); its inputs are viewed or packed as above,
    // and the core keeps the weights it needs to itself.
    AttentionWork& work = *batch.front();
    work.output.clear();
    work.attention.clear();
    work.statistics.assign(static_cast<size_t>(heads), core::HeadStatistic());
    status =
        attention->HeadStatistics(packed, first.causal, absl::MakeSpan(work.statistics));
  } else {
    status = attention->Forward(packed, attention_options, output_span, weights_span);
  }
  const absl::Duration compute_time = absl::Now() - compute_start;
  if (status.ok() && options_.observer.on_batch) {
    options_.observer.on_batch(batch_size, tokens, compute_time);
  }
  int64_t output_offset = 0, weights_offset = 0;
  for (AttentionWork* each : batch) {
    AttentionWork& work = *each;
    work.compute_time = compute_time;
    if (status.ok() && batch_size > 1) {
      std::memcpy(work.output.data(), output.get() + output_offset, work.output.size());
      if (!work.attention.empty()) {
        std::memcpy(work.attention.data(), weights.get() + weights_offset,
                    work.attention.size());
      }
    }
    output_offset += static_cast<int64_t>(work.output.size() / sizeof(float));
    weights_offset += static_cast<int64_t>(work.attention.size() / sizeof(float));
  }
  return status;
}

}  // namespace attnserve::server
