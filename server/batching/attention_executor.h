// AttentionExecutor: the attention layer's batch executor (pack the requests' Q and
// memory, run them on an AttentionBackend, scatter outputs and weights), and
// AttentionBatcher, the batcher of an attention model.
#ifndef ATTNSERVE_SERVER_BATCHING_ATTENTION_EXECUTOR_H_
#define ATTNSERVE_SERVER_BATCHING_ATTENTION_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/attention/attention_backend.h"
#include "server/batching/attention_work.h"
#include "server/batching/batcher.h"

namespace attnserve::server {

using AttentionBatcher = Batcher<AttentionWork>;
// Called exactly once per enqueued request, on a batcher thread, with OK and the
// results, or with the error (DEADLINE_EXCEEDED, CANCELLED, UNAVAILABLE on shutdown,
// INTERNAL from the core). Must not block for long: it delays the next batch.
using WorkCallback = AttentionBatcher::Callback;

// Runs attention batches on the backend it owns. Each input is read once: a lone
// request is computed straight from its message's bytes into its own result buffers;
// otherwise the inputs are copied into one packed buffer, never zero-filled first, and
// the packed results are copied once into each request's buffers. A batch whose inputs
// are all bf16 stays bf16 (a bf16 model computes on it as it is, an fp32 one widens it
// inside the core); a mixed batch is widened to f32 while packing. Not thread-safe: one
// worker's.
class AttentionExecutor final : public BatchExecutor<AttentionWork> {
 public:
  explicit AttentionExecutor(std::unique_ptr<core::AttentionBackend> attention)
      : attention_(std::move(attention)) {}

  absl::Status Pack(absl::Span<AttentionWork* const> batch) override;
  absl::Status Run() override;
  void Scatter(absl::Span<AttentionWork* const> batch, bool computed) override;
  int64_t device_memory_bytes() const override {
    return attention_->device_memory_bytes();
  }

 private:
  // The batch as the core takes it, and the buffers it views when it is not viewing
  // a lone request's own bytes.
  struct Packed {
    std::vector<int64_t> query_lengths, memory_lengths;
    core::AttentionBatch batch;
    core::AttentionOptions options;
    absl::Span<float> output, weights;
    std::unique_ptr<float[]> query, memory, output_buffer, weights_buffer;
    std::unique_ptr<uint16_t[]> query_bits, memory_bits;
    // A head-statistics request (always alone), or null.
    AttentionWork* statistics_work = nullptr;
  };

  const std::unique_ptr<core::AttentionBackend> attention_;
  Packed packed_;
};

// An attention model's batcher: one AttentionExecutor per instance over the backend
// `make_attention` returns. InvalidArgument naming a bad option; the factory's error.
absl::StatusOr<std::unique_ptr<AttentionBatcher>> MakeAttentionBatcher(
    const BatchingOptions& options,
    const std::function<absl::StatusOr<std::unique_ptr<core::AttentionBackend>>()>&
        make_attention);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCHING_ATTENTION_EXECUTOR_H_
