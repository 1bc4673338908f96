// AttentionWork: one attention request's work as the batcher and the core's executor
// see it (validated inputs viewed in place, options, deadline, results), and
// InputTensor, a request tensor's bytes as they arrived.
#ifndef ATTNSERVE_SERVER_BATCHING_ATTENTION_WORK_H_
#define ATTNSERVE_SERVER_BATCHING_ATTENTION_WORK_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/attention/attention_backend.h"

namespace attnserve::server {

// A request tensor's values as they arrived: little-endian float32 or bfloat16 bytes,
// already validated (shape and finiteness). They are read once, by the batcher: the core
// uses float32 bytes in place when a request runs alone; otherwise they are copied (or
// widened, for bf16) straight into the batch's packed buffer.
class InputTensor {
 public:
  InputTensor() = default;
  // Views `bytes`, which must outlive this tensor (the server views the request message,
  // which lives until the call's answer is sent).
  InputTensor(absl::string_view bytes, bool bf16) : bytes_(bytes), bf16_(bf16) {}
  // Owns a copy of `values` (tests, tools).
  static InputTensor FromFloats(absl::Span<const float> values);
  InputTensor(const InputTensor&) = delete;
  InputTensor& operator=(const InputTensor&) = delete;
  InputTensor(InputTensor&& other) noexcept { *this = std::move(other); }
  InputTensor& operator=(InputTensor&& other) noexcept;

  int64_t elements() const {
    return static_cast<int64_t>(bytes_.size()) / (bf16_ ? 2 : 4);
  }
  bool empty() const { return bytes_.empty(); }
  bool bf16() const { return bf16_; }
  // Writes elements() float32 values to `out`: one copy, or one widening for bf16.
  void CopyTo(float* out) const;
  // Writes elements() bf16 values to `out`, a copy. REQUIRES: bf16().
  void CopyBf16To(uint16_t* out) const;
  // The values as float32 without a copy: float32 bytes aligned to 4; else empty.
  absl::Span<const float> InPlace() const;
  // The values as bf16 bits without a copy: bf16 bytes aligned to 2; else empty.
  absl::Span<const uint16_t> InPlaceBf16() const;

 private:
  absl::string_view bytes_;
  bool bf16_ = false;
  std::string owned_;  // FromFloats only; bytes_ views it
};

// One request's work: validated inputs in, results out. Owned by the batcher from
// Enqueue until its callback, which receives it back.
struct AttentionWork {
  // Inputs, already validated against the model.
  InputTensor query;                    // [sum(query_lengths), d_model]
  std::vector<int64_t> query_lengths;   // n sequences
  InputTensor memory;                   // cross-attention: [sum(memory_lengths), d]
  std::vector<int64_t> memory_lengths;  // empty for self-attention
  bool causal = false;
  std::vector<float> head_mask;  // empty or num_heads factors
  bool return_attention = false;
  // Measure the heads (AttentionBackend::HeadStatistics) instead of answering:
  // fills `head_statistics`, leaves `output`/`attention` empty; always runs alone.
  bool head_statistics = false;
  // The caller's deadline; the request is dropped (DEADLINE_EXCEEDED) if still queued
  // when it passes.
  absl::Time deadline = absl::InfiniteFuture();
  // Set by the caller when its call was cancelled; the request is then dropped
  // (CANCELLED) if still queued. May be null.
  std::shared_ptr<const std::atomic<bool>> cancelled;
  // Bytes this request holds from Enqueue until its callback returns (inputs and
  // results), counted against Options::max_queue_bytes. Set at validation.
  int64_t reserved_bytes = 0;

  // Results, filled in before the callback: float32 bytes, so that a float32 answer
  // moves into the response message without another copy.
  std::string output;                           // [sum(query_lengths), d_model]
  std::string attention;                        // per sequence [h, L_q, L_k], when asked
  std::vector<core::HeadStatistic> statistics;  // num_heads, when head_statistics
  absl::Duration queue_time;
  absl::Duration compute_time;
  int batch_size = 0;
  int64_t batch_id = 0;  // the batch it ran in (Batcher numbers them)

  int64_t tokens() const;
  // Requests share a batch only when the core can run them in one call: the same
  // self/cross kind, causal flag, head mask and return_attention; a head-statistics
  // request shares with none.
  bool SharesBatchWith(const AttentionWork& other) const;
  int64_t output_elements() const { return static_cast<int64_t>(output.size()) / 4; }
  // The results as float32 values (views of `output` / `attention`).
  absl::Span<float> output_values();
  absl::Span<float> attention_values();
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_BATCHING_ATTENTION_WORK_H_
