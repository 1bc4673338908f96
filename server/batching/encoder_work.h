// EncoderWork: one encoder request's work as the batcher and the encoder's executor see
// it (validated, packed token ids or hidden states, serving options, deadline, results).
#ifndef ATTNSERVE_SERVER_BATCHING_ENCODER_WORK_H_
#define ATTNSERVE_SERVER_BATCHING_ENCODER_WORK_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "core/encoder/transformer_encoder.h"

namespace attnserve::server {

// One request's work. Owned by the batcher from Enqueue until its callback.
struct EncoderWork {
  // Inputs, already validated against the model, padding removed: the sequences'
  // tokens one after another. Either token ids (with optional types) or hidden states.
  std::vector<int64_t> token_ids;    // [sum(lengths)], or empty
  std::vector<int64_t> token_types;  // empty (all 0) or [sum(lengths)]
  std::vector<float> hidden_states;  // [sum(lengths), d_model], or empty
  std::vector<int64_t> lengths;      // n sequences
  // Empty, or [num_layers * num_heads] factors in [0, 1] (EncoderBatch::head_mask).
  std::vector<float> head_mask;
  // Measure the heads (EncoderBackend::Forward's statistics) into `statistics`,
  // [num_layers * num_heads]; always runs alone.
  bool head_statistics = false;
  // With head_statistics: also the first sequence's attention weights into
  // `attention`, [num_layers, num_heads, L0, L0].
  bool return_attention = false;
  // Return the pooled embedding (the model pools) / the last hidden state.
  bool pooled = true;
  bool return_hidden = false;
  // The embedding as served: its first `dimensions` values (0: all d_model), then
  // L2-normalized when `normalize` (the one rule: divided by max(norm, 1e-12), as the
  // core and sentence-transformers normalize).
  int64_t dimensions = 0;
  bool normalize = false;
  // A classification model's scores: its logits through this activation (over each
  // sequence's labels for softmax), into `scores` instead of `embedding`.
  enum class ScoreActivation { kNone, kSigmoid, kSoftmax };
  ScoreActivation score_activation = ScoreActivation::kNone;
  // Text in: return the token ids; how many texts were truncated.
  bool return_token_ids = false;
  int64_t truncated = 0;
  absl::Time deadline = absl::InfiniteFuture();
  std::shared_ptr<const std::atomic<bool>> cancelled;  // may be null
  // Bytes held from Enqueue until the callback returns (inputs and results).
  int64_t reserved_bytes = 0;

  // Results, float32 bytes: [n, d] (or a classifier's [n, num_labels] scores) and,
  // when asked, [sum(lengths), d].
  std::string embedding;
  std::string scores;
  std::string hidden;
  std::vector<core::EncoderHeadStatistic> statistics;
  std::string attention;  // float32 bytes [num_layers, num_heads, L0, L0]
  absl::Duration queue_time;
  absl::Duration compute_time;
  int batch_size = 0;
  int64_t batch_id = 0;  // the batch it ran in (Batcher numbers them)

  int64_t tokens() const;
  // Token-id requests batch together, and hidden-state requests together, each with
  // the same head mask only; a head-statistics request shares with none.
  bool SharesBatchWith(const EncoderWork& other) const;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCHING_ENCODER_WORK_H_
