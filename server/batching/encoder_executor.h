// EncoderExecutor: an encoder model's batch executor (pack the requests' token ids or
// hidden states, run them on an EncoderBackend (CPU or GPU), serve each request's
// embedding, scores or hidden states), and EncoderBatcher, the batcher of an encoder
// model.
#ifndef ATTNSERVE_SERVER_BATCHING_ENCODER_EXECUTOR_H_
#define ATTNSERVE_SERVER_BATCHING_ENCODER_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/encoder/encoder_backend.h"
#include "server/batching/batcher.h"
#include "server/batching/encoder_work.h"

namespace attnserve::server {

// Budgets count tokens (max_batch_tokens).
using EncoderBatcher = Batcher<EncoderWork>;

// Runs encoder batches on the EncoderBackend it owns. A lone request is computed
// from its own vectors; several are copied once into one packed batch. Results are
// served as each request asked (dimensions, normalize, score activation). Not
// thread-safe: one worker's.
class EncoderExecutor final : public BatchExecutor<EncoderWork> {
 public:
  explicit EncoderExecutor(std::unique_ptr<core::EncoderBackend> encoder)
      : encoder_(std::move(encoder)) {}

  absl::Status Pack(absl::Span<EncoderWork* const> batch) override;
  absl::Status Run() override;
  void Scatter(absl::Span<EncoderWork* const> batch, bool computed) override;
  int64_t device_memory_bytes() const override { return encoder_->device_memory_bytes(); }

 private:
  // The batch as the encoder takes it, the buffers it views when it is not viewing a
  // lone request's own vectors, and the encoder's outputs.
  struct Packed {
    core::EncoderBatch batch;
    std::vector<int64_t> ids, types, lengths;
    std::vector<float> hidden_in;
    std::vector<float> pooled;  // [sequences, pooled_width] when the model pools
    std::vector<float> hidden;  // [tokens, d_model] when a request asked for it
    // A head-statistics request (always alone), or null.
    EncoderWork* statistics_work = nullptr;
  };

  const std::unique_ptr<core::EncoderBackend> encoder_;
  Packed packed_;
};

// An encoder model's batcher: one EncoderExecutor per instance over the encoder
// `make_encoder` returns. InvalidArgument naming a bad option; the factory's error.
absl::StatusOr<std::unique_ptr<EncoderBatcher>> MakeEncoderBatcher(
    const BatchingOptions& options,
    const std::function<absl::StatusOr<std::unique_ptr<core::EncoderBackend>>()>&
        make_encoder);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCHING_ENCODER_EXECUTOR_H_
